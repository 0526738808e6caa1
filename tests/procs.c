/* tests/procs.c: the process helpers of tests/procs.h, shared by the test
 * programs that run trainrun processes. */
#include "config.h"

#include <check.h>
#include <fcntl.h>
#include <netinet/in.h>
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
