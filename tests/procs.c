/* tests/procs.c: the process helpers of tests/procs.h, shared by the test
 * programs that run trainrun processes. */
#include "config.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/procs.h"

char tp_tmpdir[256];
char* const* tp_env_defaults;

/* Processes started and not yet waited for (0: a free slot). */
static pid_t live[64];
static int nlive;
/* Every job started since tp_tmpdir_make (tp_assert_all_gone). */
static tp_proc_t started[64];
static int nstarted;

double tp_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char* tp_builddir(void) {
  const char* b = getenv("top_builddir");
  return b && *b ? b : ".";
}

const char* tp_srcdir(void) {
  const char* s = getenv("top_srcdir");
  return s && *s ? s : ".";
}

const char* tp_bin(const char* name) {
  static char bufs[8][4096];
  static int k;
  char* b = bufs[k++ % 8];
  snprintf(b, 4096, "%s/%s", tp_builddir(), name);
  return b;
}

int tp_port_on_loopback(int listen_too, int* fd) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  ck_assert_int_ge(s, 0);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ck_assert_int_eq(bind(s, (struct sockaddr*)&a, sizeof a), 0);
  socklen_t l = sizeof a;
  ck_assert_int_eq(getsockname(s, (struct sockaddr*)&a, &l), 0);
  if (listen_too) {
    ck_assert_int_eq(listen(s, 4), 0);
    *fd = s;
  } else {
    close(s);
  }
  return ntohs(a.sin_port);
}

int tp_free_port(void) { return tp_port_on_loopback(0, NULL); }

void tp_rm_tree(const char* path) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
  int rc = system(cmd);
  (void)rc;
}

void tp_cleanup(void) {
  for (int i = 0; i < nlive; i++)
    if (live[i] > 0) {
      kill(live[i], SIGKILL);
      waitpid(live[i], NULL, 0);
    }
  nlive = 0;
  if (tp_tmpdir[0]) tp_rm_tree(tp_tmpdir);
  tp_tmpdir[0] = '\0';
}

void tp_tmpdir_make(const char* prefix) {
  static int registered;
  if (!registered) {
    atexit(tp_cleanup);
    registered = 1;
  }
  const char* t = getenv("TMPDIR");
  snprintf(tp_tmpdir, sizeof tp_tmpdir, "%s/%s.XXXXXX", t && *t ? t : "/tmp",
           prefix);
  nstarted = 0;
  ck_assert_ptr_nonnull(mkdtemp(tp_tmpdir));
}

static void forget(pid_t pid) {
  for (int i = 0; i < nlive; i++)
    if (live[i] == pid) live[i] = 0;
}

void tp_proc_start(tp_proc_t* p, const char* tag, char* const* argv,
                   char* const* env) {
  snprintf(p->out, sizeof p->out, "%s/%s.out", tp_tmpdir, tag);
  snprintf(p->err, sizeof p->err, "%s/%s.err", tp_tmpdir, tag);
  fflush(stdout);
  fflush(stderr);
  static int jobs;
  snprintf(p->mark, sizeof p->mark, "%d-%d", (int)getpid(), ++jobs);
  p->t0 = tp_now_s();
  p->pid = fork();
  ck_assert_int_ge(p->pid, 0);
  if (p->pid == 0) {
    /* no cluster but the one a test describes */
    unsetenv("SLURM_STEP_NUM_NODES");
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("TRAINRUN_WORKER");
    unsetenv("TRAINRUN_HEARTBEAT_FD");
    setenv("TMPDIR", tp_tmpdir, 1); /* status sockets, log dirs */
    setenv("TP_JOB", p->mark, 1);   /* every process of the job has it */
    for (char* const* e = tp_env_defaults; e && *e; e++) putenv(*e);
    for (char* const* e = env; e && *e; e++) putenv(*e);
    int o = open(p->out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int er = open(p->err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || er < 0) _exit(126);
    dup2(o, 1);
    dup2(er, 2);
    execv(argv[0], argv);
    _exit(126);
  }
  if (nlive < 64) live[nlive++] = p->pid;
  if (nstarted < (int)(sizeof started / sizeof started[0]))
    started[nstarted++] = *p;
}

int tp_proc_finish(tp_proc_t* p, double timeout) {
  int st;
  for (;;) {
    pid_t r = waitpid(p->pid, &st, WNOHANG);
    if (r == p->pid) break;
    if (tp_now_s() - p->t0 > timeout) {
      kill(p->pid, SIGKILL);
      waitpid(p->pid, &st, 0);
      forget(p->pid);
      char* e = tp_slurp(p->err);
      ck_abort_msg("process %s did not end within %gs; stderr:\n%s", p->out,
                   timeout, e);
    }
    usleep(2000);
  }
  forget(p->pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int tp_run(const char* tag, char* const* argv, char* const* env, char** out,
           char** err, double timeout) {
  tp_proc_t p;
  tp_proc_start(&p, tag, argv, env);
  int rc = tp_proc_finish(&p, timeout);
  *out = tp_slurp(p.out);
  *err = tp_slurp(p.err);
  return rc;
}

char* tp_slurp(const char* path) {
  FILE* f = fopen(path, "rb");
  if (!f) {
    char* none = strdup("");
    ck_assert_ptr_nonnull(none);
    return none;
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char* s = malloc((size_t)(n > 0 ? n : 0) + 1);
  ck_assert_ptr_nonnull(s);
  size_t got = n > 0 ? fread(s, 1, (size_t)n, f) : 0;
  s[got] = '\0';
  fclose(f);
  return s;
}

void tp_wait_file(const char* path, double timeout) {
  double t0 = tp_now_s();
  struct stat st;
  while (stat(path, &st) != 0) {
    ck_assert_msg(tp_now_s() - t0 < timeout, "'%s' did not appear", path);
    usleep(2000);
  }
}

void tp_wait_text(const char* path, const char* needle, double timeout) {
  double t0 = tp_now_s();
  for (;;) {
    char* s = tp_slurp(path);
    int found = strstr(s, needle) != NULL;
    if (!found && tp_now_s() - t0 > timeout)
      ck_abort_msg("'%s' never showed '%s':\n%s", path, needle, s);
    free(s);
    if (found) return;
    usleep(20000);
  }
}

double tp_loss_at(const char* dump, int step) {
  char p[1600];
  snprintf(p, sizeof p, "%s/metrics.jsonl", dump);
  char* f = tp_slurp(p);
  char key[64];
  snprintf(key, sizeof key, "{\"step\":%d,\"loss\":", step);
  const char* at = NULL;
  for (const char* q = f; (q = strstr(q, key)); q++) at = q;
  ck_assert_msg(at != NULL, "%s has no step %d:\n%s", p, step, f);
  double v = strtod(at + strlen(key), NULL);
  free(f);
  return v;
}

void tp_read_losses(const char* dump, double* loss, int n) {
  for (int i = 1; i <= n; i++) loss[i - 1] = tp_loss_at(dump, i);
}

/* A process (not us) whose environment holds TP_JOB=mark: its pid and
 * command line in what (0: none). */
static pid_t job_process(const char* mark, char* what, size_t cap) {
  char want[80];
  int wl = snprintf(want, sizeof want, "TP_JOB=%s", mark);
  DIR* d = opendir("/proc");
  if (!d) return 0;
  struct dirent* e;
  pid_t found = 0;
  static char env[1 << 16];
  while (!found && (e = readdir(d)) != NULL) {
    pid_t p = (pid_t)atoi(e->d_name);
    if (p <= 0 || p == getpid()) continue;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/environ", (int)p);
    int fd = open(path, O_RDONLY);
    if (fd < 0) continue;
    ssize_t n = read(fd, env, sizeof env - 1);
    close(fd);
    for (ssize_t i = 0; n > 0 && i < n; i += (ssize_t)strlen(env + i) + 1) {
      env[n] = '\0';
      if (strncmp(env + i, want, (size_t)wl) == 0 && env[i + wl] == '\0') {
        found = p;
        break;
      }
    }
    if (!found) continue;
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)p);
    what[0] = '\0';
    fd = open(path, O_RDONLY);
    if (fd >= 0) {
      ssize_t m = read(fd, what, cap - 1);
      close(fd);
      for (ssize_t i = 0; i < m; i++)
        if (what[i] == '\0') what[i] = ' ';
      what[m > 0 ? m : 0] = '\0';
    }
  }
  closedir(d);
  return found;
}

/* A /dev/shm name of pid's rings ("trainrun-<run id>-<pid>-r<N>-<rank>"). */
static int job_segment(pid_t pid, char* what, size_t cap) {
  char mark[32];
  snprintf(mark, sizeof mark, "-%d-r", (int)pid);
  DIR* d = opendir("/dev/shm");
  if (!d) return 0;
  struct dirent* e;
  int found = 0;
  while (!found && (e = readdir(d)) != NULL)
    if (strncmp(e->d_name, "trainrun-", 9) == 0 && strstr(e->d_name, mark)) {
      snprintf(what, cap, "/dev/shm/%s", e->d_name);
      found = 1;
    }
  closedir(d);
  return found;
}

/* pid's status socket under tp_tmpdir/trainrun-<uid>/. */
static int job_socket(pid_t pid, char* what, size_t cap) {
  struct stat st;
  snprintf(what, cap, "%s/trainrun-%u/%d.sock", tp_tmpdir, (unsigned)getuid(),
           (int)pid);
  return stat(what, &st) == 0;
}

static int port_listens(int port) {
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons((uint16_t)port);
  int ok = connect(s, (struct sockaddr*)&a, sizeof a) == 0;
  close(s);
  return ok;
}

void tp_assert_job_gone(const tp_proc_t* job, int port) {
  char what[1024];
  pid_t pid = job->pid;
  double t0 = tp_now_s();
  for (;;) {
    pid_t p = job_process(job->mark, what, sizeof what);
    int left = p != 0;
    char desc[1200] = "";
    if (left)
      snprintf(desc, sizeof desc, "process %d (%s)", (int)p, what);
    else if ((left = job_segment(pid, what, sizeof what)))
      snprintf(desc, sizeof desc, "shared memory %s", what);
    else if ((left = job_socket(pid, what, sizeof what)))
      snprintf(desc, sizeof desc, "socket %s", what);
    else if ((left = port > 0 && port_listens(port)))
      snprintf(desc, sizeof desc, "a listener on 127.0.0.1:%d", port);
    if (!left) return;
    if (tp_now_s() - t0 > 3) {
      /* what a failed test leaves, tp_cleanup() would not find */
      for (int i = 0;
           i < 256 && (p = job_process(job->mark, what, sizeof what)); i++) {
        kill(p, SIGKILL);
        usleep(10000);
      }
      ck_abort_msg("the job of pid %d left %s behind", (int)pid, desc);
    }
    usleep(20000);
  }
}

void tp_assert_all_gone(void) {
  for (int i = 0; i < nstarted; i++) tp_assert_job_gone(&started[i], 0);
}
