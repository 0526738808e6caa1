/* daemon/spawn.c: starting one worker -- its environment, the program
 * found in PATH, fork and exec with the worker in a process group of its
 * own, killed with the daemon, stdout and stderr on pipes, CPU affinity set
 * before exec, and exec failures reported to the daemon through a
 * close-on-exec pipe -- and killing what workers leave behind. Everything the child needs is prepared before fork:
 * the daemon may host the store on a thread, so the child calls only
 * async-signal-safe functions until it execs. */
#include "core/buf.h" /* TR_GROW */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/internal.h"
#include "trainrun/error.h"
#include "trainrun/param.h"

extern char** environ;

/* ---- the environment ---- */

static int env_push(tr__env_t* e, char* kv) {
  if (TR_GROW(e->v, e->n + 2, e->cap) < 0) return TR_ENOMEM;
  e->v[e->n++] = kv;
  e->v[e->n] = NULL;
  return 0;
}

int tr__env_copy(tr__env_t* e, char* const* from) {
  memset(e, 0, sizeof *e);
  e->cap = 16;
  e->v = calloc(e->cap, sizeof *e->v); /* NULL-terminated even when empty */
  if (!e->v) return TR_ENOMEM;
  for (char* const* p = from; p && *p; p++) {
    char* c = strdup(*p);
    if (!c || env_push(e, c) < 0) {
      free(c);
      tr__env_release(e);
      return TR_ENOMEM;
    }
  }
  return 0;
}

int tr__env_init(tr__env_t* e) { return tr__env_copy(e, environ); }

static ssize_t env_find(const tr__env_t* e, const char* name) {
  size_t nl = strlen(name);
  for (size_t i = 0; i < e->n; i++)
    if (strncmp(e->v[i], name, nl) == 0 && e->v[i][nl] == '=')
      return (ssize_t)i;
  return -1;
}

int tr__env_set(tr__env_t* e, const char* name, const char* fmt, ...) {
  char val[4096];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(val, sizeof val, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof val) return TR_ENAMETOOLONG;
  size_t len = strlen(name) + 1 + (size_t)n + 1;
  char* kv = malloc(len);
  if (!kv) return TR_ENOMEM;
  snprintf(kv, len, "%s=%s", name, val);
  ssize_t i = env_find(e, name);
  if (i >= 0) {
    free(e->v[i]);
    e->v[i] = kv;
    return 0;
  }
  if (env_push(e, kv) < 0) {
    free(kv);
    return TR_ENOMEM;
  }
  return 0;
}

const char* tr__env_get(const tr__env_t* e, const char* name) {
  ssize_t i = env_find(e, name);
  return i >= 0 ? e->v[i] + strlen(name) + 1 : NULL;
}

void tr__env_release(tr__env_t* e) {
  for (size_t i = 0; i < e->n; i++) free(e->v[i]);
  free(e->v);
  memset(e, 0, sizeof *e);
}

/* ---- the program ---- */

static int runnable(const char* path) {
  struct stat st;
  if (stat(path, &st) != 0) return -errno;
  if (S_ISDIR(st.st_mode)) return TR_EACCES;
  return access(path, X_OK) == 0 ? 0 : -errno;
}

int tr__spawn_resolve(const char* name, char** path, tr_errmsg_t* err) {
  *path = NULL;
  if (!*name) return tr_errmsg_set(err, TR_ENOENT, "no program to run");
  if (strchr(name, '/')) {
    int rc = runnable(name);
    if (rc < 0)
      return tr_errmsg_set(err, rc, "cannot run '%s': %s", name,
                           tr_strerror(rc));
    *path = strdup(name);
    return *path ? 0 : TR_ENOMEM;
  }
  const char* p = tr_param_str(TR_PARAM_PATH);
  int first_err = TR_ENOENT;
  while (1) {
    size_t len = strcspn(p, ":");
    char buf[4096];
    /* an empty PATH entry is the current folder */
    int n = len ? snprintf(buf, sizeof buf, "%.*s/%s", (int)len, p, name)
                : snprintf(buf, sizeof buf, "./%s", name);
    if (n > 0 && (size_t)n < sizeof buf) {
      int rc = runnable(buf);
      if (rc == 0) {
        *path = strdup(buf);
        return *path ? 0 : TR_ENOMEM;
      }
      if (rc == TR_EACCES) first_err = rc;
    }
    if (!p[len]) break;
    p += len + 1;
  }
  return tr_errmsg_set(
      err, first_err, "cannot run '%s': %s", name,
      first_err == TR_ENOENT ? "not found in PATH" : tr_strerror(first_err));
}

/* ---- what workers leave behind ---- */

/* The parent pid in /proc/<pid>/stat (after the command's closing
 * parenthesis, which may itself hold spaces and parentheses); -1. */
static pid_t parent_of(pid_t pid, char* comm, size_t cap) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = '\0';
  char* open_p = strchr(buf, '(');
  char* close_p = strrchr(buf, ')');
  if (!open_p || !close_p || close_p < open_p) return -1;
  snprintf(comm, cap, "%.*s", (int)(close_p - open_p - 1), open_p + 1);
  char state;
  int ppid;
  if (sscanf(close_p + 1, " %c %d", &state, &ppid) != 2) return -1;
  return (pid_t)ppid;
}

int tr__spawn_reap_orphans(char* what, size_t cap) {
  pid_t me = getpid();
  int killed = 0;
  size_t used = 0;
  if (cap) what[0] = '\0';
  /* a killed orphan's own children come to us next: a few rounds */
  for (int round = 0; round < 64; round++) {
    DIR* d = opendir("/proc");
    if (!d) break;
    int found = 0;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
      char* end;
      long v = strtol(e->d_name, &end, 10);
      if (*end || v <= 0 || (pid_t)v == me) continue;
      char comm[64];
      if (parent_of((pid_t)v, comm, sizeof comm) != me) continue;
      found++;
      /* its group too: the processes it started and left running */
      kill(-(pid_t)v, SIGKILL);
      kill((pid_t)v, SIGKILL);
      int st;
      if (waitpid((pid_t)v, &st, 0) != (pid_t)v) continue;
      if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) {
        killed++;
        if (used + 80 < cap)
          used += (size_t)snprintf(what + used, cap - used, "%s%d '%s'",
                                   used ? ", " : "", (int)v, comm);
      }
    }
    closedir(d);
    if (!found) break;
  }
  return killed;
}

/* ---- fork and exec ---- */

/* In the child: report errno to the daemon and end. */
static void child_fail(int fd, int code) {
  int e = code;
  ssize_t w = write(fd, &e, sizeof e);
  (void)w;
  _exit(127);
}

int tr__spawn(const tr__spawn_req_t* req, pid_t* pid, int* out_fd, int* err_fd,
              tr_errmsg_t* err) {
  int po[2] = {-1, -1}, pe[2] = {-1, -1}, px[2] = {-1, -1};
  int rc;
  if (pipe2(po, O_CLOEXEC) < 0 || pipe2(pe, O_CLOEXEC) < 0 ||
      pipe2(px, O_CLOEXEC) < 0) {
    rc = tr_err_from_errno();
    tr_errmsg_set(err, rc, "cannot create pipes: %s", tr_strerror(rc));
    goto out_close;
  }
  pid_t parent = getpid();
  /* the child starts with no signal blocked and default handlers */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pid_t p = fork();
  if (p == 0) {
    close(px[0]);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int s = 1; s < NSIG; s++) sigaction(s, &dfl, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (setpgid(0, 0) < 0) child_fail(px[1], errno);
    /* die with the daemon; if it died before this line, go now */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0) child_fail(px[1], errno);
    if (getppid() != parent) _exit(128 + SIGKILL);
    if (dup2(po[1], 1) < 0 || dup2(pe[1], 2) < 0) child_fail(px[1], errno);
    if (req->keep_fd >= 0 && fcntl(req->keep_fd, F_SETFD, 0) < 0)
      child_fail(px[1], errno);
    if (req->cpus && sched_setaffinity(0, sizeof *req->cpus, req->cpus) < 0)
      child_fail(px[1], errno);
    execve(req->path, req->argv, req->envp);
    child_fail(px[1], errno);
  }
  int fork_errno = errno;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (p < 0) {
    rc = -fork_errno;
    tr_errmsg_set(err, rc, "cannot fork: %s", tr_strerror(rc));
    goto out_close;
  }
  close(po[1]);
  close(pe[1]);
  close(px[1]);
  po[1] = pe[1] = px[1] = -1;
  /* the exec result: EOF when exec succeeded (the pipe closes on exec) */
  int code = 0;
  ssize_t r;
  do {
    r = read(px[0], &code, sizeof code);
  } while (r < 0 && errno == EINTR);
  close(px[0]);
  px[0] = -1;
  if (r == (ssize_t)sizeof code) {
    int st;
    while (waitpid(p, &st, 0) < 0 && errno == EINTR) {
    }
    rc = -code;
    tr_errmsg_set(err, rc, "cannot run '%s': %s", req->path, tr_strerror(rc));
    goto out_close;
  }
  fcntl(po[0], F_SETFL, fcntl(po[0], F_GETFL) | O_NONBLOCK);
  fcntl(pe[0], F_SETFL, fcntl(pe[0], F_GETFL) | O_NONBLOCK);
  *pid = p;
  *out_fd = po[0];
  *err_fd = pe[0];
  return 0;
out_close:
  for (int i = 0; i < 2; i++) {
    if (po[i] >= 0) close(po[i]);
    if (pe[i] >= 0) close(pe[i]);
    if (px[i] >= 0) close(px[i]);
  }
  return rc;
}
