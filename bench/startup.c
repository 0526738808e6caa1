/* bench/startup.c: how fast a job starts on loopback.
 *
 *   1. N nodes x 1 rank (N `trainrun` processes with --nnodes N and one
 *      endpoint, the debug model on the CPU): wall time from starting them
 *      to the end of the first step (rank 0 prints its "step 1/1" line),
 *      and to every process's exit;
 *   2. M daemons (`trainrund --nnodes M`, one worker of /bin/true each):
 *      wall time from starting them to the last one's "round 0: node ..."
 *      line (the rendezvous closed for every node), and to every exit.
 *
 *   bench/startup [--nodes N] [--rdzv-nodes M] [--runs R] [--builddir D]
 *                 [--srcdir S] [--wrapper]
 *
 * Defaults: N 8, M 64, R 5, D ".", S ".." (run from the build folder).
 * Prints the best and the median of R runs. A figure, not a test.
 *
 * In a build folder `trainrun` and `trainrund` are libtool's wrapper
 * scripts (a shell that finds the uninstalled library, some 30 processes
 * and 12 ms of CPU each): the bench runs the programs they wrap, in
 * D/.libs, with D/.libs on LD_LIBRARY_PATH, as an installed trainrun runs.
 * --wrapper times the scripts instead. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int free_port(void) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (s < 0 || bind(s, (struct sockaddr*)&a, sizeof a) != 0) {
    perror("bind");
    exit(1);
  }
  socklen_t l = sizeof a;
  getsockname(s, (struct sockaddr*)&a, &l);
  close(s);
  return ntohs(a.sin_port);
}

/* Start argv with its stdout (watch_fd 1) or stderr (2) into a pipe whose
 * read end goes to *rd (non-blocking); the other stream to /dev/null. */
static pid_t spawn(char* const* argv, int watch_fd, int* rd) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) {
    perror("pipe");
    exit(1);
  }
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    exit(1);
  }
  if (pid == 0) {
    int null = open("/dev/null", O_WRONLY);
    dup2(watch_fd == 1 ? p[1] : null, 1);
    dup2(watch_fd == 2 ? p[1] : null, 2);
    execv(argv[0], argv);
    _exit(127);
  }
  close(p[1]);
  fcntl(p[0], F_SETFL, O_NONBLOCK);
  *rd = p[0];
  return pid;
}

typedef struct {
  int fd;
  char buf[1 << 16];
  size_t len;
  double seen; /* when the needle appeared; 0 not yet */
} watch_t;

/* Read what fd holds; note the time the needle first appears. 1 at EOF. */
static int watch_read(watch_t* w, const char* needle, double now) {
  for (;;) {
    char tmp[4096];
    ssize_t r = read(w->fd, tmp, sizeof tmp);
    if (r == 0) return 1;
    if (r < 0) return errno == EAGAIN ? 0 : 1;
    /* keep the tail only: enough to find a needle split over reads */
    if (w->len + (size_t)r >= sizeof w->buf) {
      size_t keep = 256 < w->len ? 256 : w->len;
      memmove(w->buf, w->buf + w->len - keep, keep);
      w->len = keep;
    }
    memcpy(w->buf + w->len, tmp, (size_t)r);
    w->len += (size_t)r;
    w->buf[w->len] = '\0';
    if (!w->seen && strstr(w->buf, needle)) w->seen = now;
  }
}

/* Start n processes (argv_of(k) each), watch each one's stream for
 * needle; *seen = time until every stream showed it (any: until one did),
 * *exit_all = until all exited. 0 on success. */
static double children_cpu(void) {
  struct rusage ru;
  getrusage(RUSAGE_CHILDREN, &ru);
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
         (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* CPU seconds (user + sys) of the last group's processes and their
 * workers, start to exit: on a loaded machine the wall time grows, this
 * does not. */
static double group_cpu;

static int run_group(int n, char** (*argv_of)(int k, void* arg), void* arg,
                     int watch_fd, const char* needle, int any, double* seen,
                     double* exit_all) {
  double cpu0 = children_cpu();
  pid_t* pid = calloc((size_t)n, sizeof *pid);
  watch_t* w = calloc((size_t)n, sizeof *w);
  struct pollfd* fds = calloc((size_t)n, sizeof *fds);
  int* open_ = calloc((size_t)n, sizeof *open_);
  double t0 = now_s();
  for (int k = 0; k < n; k++) {
    pid[k] = spawn(argv_of(k, arg), watch_fd, &w[k].fd);
    open_[k] = 1;
  }
  int nopen = n, rc = 0;
  while (nopen > 0) {
    int m = 0;
    int idx[4096];
    for (int k = 0; k < n && m < 4096; k++)
      if (open_[k]) {
        fds[m].fd = w[k].fd;
        fds[m].events = POLLIN;
        idx[m++] = k;
      }
    if (poll(fds, (nfds_t)m, 60000) <= 0) {
      fprintf(stderr, "startup: no output for 60 s: giving up\n");
      rc = -1;
      break;
    }
    double now = now_s();
    for (int i = 0; i < m; i++)
      if (fds[i].revents) {
        int k = idx[i];
        if (watch_read(&w[k], needle, now)) {
          close(w[k].fd);
          open_[k] = 0;
          nopen--;
        }
      }
  }
  double last = 0, first = 0;
  int nseen = 0;
  for (int k = 0; k < n; k++) {
    int st;
    waitpid(pid[k], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "startup: process %d ended with status %d\n", k, st);
      rc = -1;
    }
    if (!w[k].seen) continue;
    double t = w[k].seen - t0;
    if (!nseen || t < first) first = t;
    if (t > last) last = t;
    nseen++;
  }
  if (any ? nseen == 0 : nseen < n) {
    fprintf(stderr, "startup: %d of %d processes printed '%s'\n", nseen, n,
            needle);
    rc = -1;
  }
  *seen = any ? first : last;
  group_cpu = children_cpu() - cpu0;
  *exit_all = now_s() - t0;
  free(pid);
  free(w);
  free(fds);
  free(open_);
  return rc;
}

/* ---- the two jobs ---- */

typedef struct {
  const char* builddir;
  const char* srcdir;
  int nodes;
  char ep[64], nn[16];
  char bin[1024], job[1024], data[1024], dump[64][1100];
  char* argv[64][40];
} job_t;

/* The node flags every process of a run shares; returns how many. */
static int node_argv(const job_t* j, char** a) {
  int n = 0;
  a[n++] = (char*)j->bin;
  a[n++] = "--nnodes";
  a[n++] = (char*)j->nn;
  a[n++] = "--nproc-per-node";
  a[n++] = "1";
  a[n++] = "--rdzv-endpoint";
  a[n++] = (char*)j->ep;
  return n;
}

static char** train_argv(int k, void* arg) {
  job_t* j = arg;
  char** a = j->argv[k];
  int n = node_argv(j, a);
  a[n++] = j->job;
  a[n++] = "--training.steps";
  a[n++] = "1";
  a[n++] = "--training.local_batch_size";
  a[n++] = "1";
  a[n++] = "--training.seq_len";
  a[n++] = "32";
  a[n++] = "--lr_scheduler.warmup_steps";
  a[n++] = "0";
  a[n++] = "--validation.enable=false";
  a[n++] = "--debug.seed";
  a[n++] = "42";
  a[n++] = "--training.dataset_path";
  a[n++] = j->data;
  a[n++] = j->dump[k];
  a[n] = NULL;
  return a;
}

static char** rdzv_argv(int k, void* arg) {
  job_t* j = arg;
  char** a = j->argv[k];
  int n = node_argv(j, a);
  a[n++] = "/bin/true";
  a[n] = NULL;
  return a;
}

/* D/name, or the program libtool's wrapper D/name runs (D/.libs/name)
 * unless wrapper is set; the library folder goes on LD_LIBRARY_PATH. */
static void program_path(char* out, size_t size, const char* builddir,
                         const char* name, int wrapper) {
  snprintf(out, size, "%s/%s", builddir, name);
  char head[2] = {0, 0};
  FILE* f = fopen(out, "rb");
  if (f) {
    if (fread(head, 1, 2, f) != 2) head[0] = 0;
    fclose(f);
  }
  char real[1024];
  snprintf(real, sizeof real, "%s/.libs/%s", builddir, name);
  if (wrapper || head[0] != '#' || head[1] != '!' || access(real, X_OK) != 0)
    return;
  snprintf(out, size, "%s", real);
  char abs[PATH_MAX], lib[PATH_MAX + 1200];
  if (!realpath(builddir, abs)) snprintf(abs, sizeof abs, "%s", builddir);
  const char* old = getenv("LD_LIBRARY_PATH");
  snprintf(lib, sizeof lib, "%s/.libs%s%s", abs, old && *old ? ":" : "",
           old && *old ? old : "");
  setenv("LD_LIBRARY_PATH", lib, 1);
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static void report(const char* what, double* v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  printf("%-58s best %7.1f ms, median %7.1f ms\n", what, v[0] * 1e3,
         v[n / 2] * 1e3);
}

int main(int argc, char** argv) {
  int nodes = 8, rnodes = 64, runs = 5, wrapper = 0;
  const char* builddir = ".";
  const char* srcdir = "..";
  for (int i = 1; i < argc; i++) {
    if (i + 1 < argc && strcmp(argv[i], "--nodes") == 0)
      nodes = atoi(argv[++i]);
    else if (i + 1 < argc && strcmp(argv[i], "--rdzv-nodes") == 0)
      rnodes = atoi(argv[++i]);
    else if (i + 1 < argc && strcmp(argv[i], "--runs") == 0)
      runs = atoi(argv[++i]);
    else if (i + 1 < argc && strcmp(argv[i], "--builddir") == 0)
      builddir = argv[++i];
    else if (i + 1 < argc && strcmp(argv[i], "--srcdir") == 0)
      srcdir = argv[++i];
    else if (strcmp(argv[i], "--wrapper") == 0)
      wrapper = 1;
    else {
      fprintf(stderr,
              "usage: startup [--nodes N] [--rdzv-nodes M] [--runs R] "
              "[--builddir D] [--srcdir S] [--wrapper]\n");
      return 2;
    }
  }
  if (nodes < 1 || nodes > 64 || rnodes < 1 || rnodes > 64 || runs < 1 ||
      runs > 100) {
    fprintf(stderr, "startup: nodes 1 to 64, runs 1 to 100\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  char tmp[] = "/tmp/trainrun_startup.XXXXXX";
  if (!mkdtemp(tmp)) {
    perror("mkdtemp");
    return 1;
  }
  setenv("TMPDIR", tmp, 1);
  unsetenv("SLURM_STEP_NUM_NODES");
  unsetenv("OMPI_COMM_WORLD_SIZE");
  static job_t j;
  j.builddir = builddir;
  j.srcdir = srcdir;
  double* first = calloc((size_t)runs, sizeof *first);
  double* done = calloc((size_t)runs, sizeof *done);
  double* cpu = calloc((size_t)runs, sizeof *cpu);
  int rc = 0;

  /* 1. N nodes x 1 rank to the end of the first step */
  program_path(j.bin, sizeof j.bin, builddir, "trainrun", wrapper);
  snprintf(j.job, sizeof j.job, "%s/examples/debug.toml", srcdir);
  snprintf(j.data, sizeof j.data, "%s/examples/data/tinytales.txt", srcdir);
  snprintf(j.nn, sizeof j.nn, "%d", nodes);
  for (int k = 0; k < nodes; k++)
    snprintf(j.dump[k], sizeof j.dump[k], "--job.dump_folder=%s/out%d", tmp, k);
  for (int r = 0; r < runs && rc == 0; r++) {
    snprintf(j.ep, sizeof j.ep, "127.0.0.1:%d", free_port());
    /* rank 0's metric line comes out of the node that runs it */
    rc = run_group(nodes, train_argv, &j, 1, "]:step 1/1 ", 1, &first[r],
                   &done[r]);
    cpu[r] = group_cpu;
  }
  if (rc == 0) {
    char what[128];
    snprintf(what, sizeof what,
             "%d nodes x 1 rank, debug model: start to end of step 1", nodes);
    report(what, first, runs);
    snprintf(what, sizeof what, "%d nodes x 1 rank: start to every exit",
             nodes);
    report(what, done, runs);
    snprintf(what, sizeof what, "%d nodes x 1 rank: CPU time of all processes",
             nodes);
    report(what, cpu, runs);
  }

  /* 2. M daemons rendezvousing */
  program_path(j.bin, sizeof j.bin, builddir, "trainrund", wrapper);
  snprintf(j.nn, sizeof j.nn, "%d", rnodes);
  setenv("TRAINRUN_LOG_LEVEL", "info", 1);
  setenv("TRAINRUN_LOG_SUBSYS", "daemon", 1);
  for (int r = 0; r < runs && rc == 0; r++) {
    snprintf(j.ep, sizeof j.ep, "127.0.0.1:%d", free_port());
    rc = run_group(rnodes, rdzv_argv, &j, 2, "round 0: node ", 0, &first[r],
                   &done[r]);
    cpu[r] = group_cpu;
  }
  if (rc == 0) {
    char what[128];
    snprintf(what, sizeof what, "%d daemons: start to rendezvous closed",
             rnodes);
    report(what, first, runs);
    snprintf(what, sizeof what, "%d daemons (/bin/true): start to every exit",
             rnodes);
    report(what, done, runs);
    snprintf(what, sizeof what, "%d daemons: CPU time of all processes",
             rnodes);
    report(what, cpu, runs);
  }
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  if (system(cmd) != 0) fprintf(stderr, "startup: cannot remove %s\n", tmp);
  free(first);
  free(done);
  free(cpu);
  return rc == 0 ? 0 : 1;
}
