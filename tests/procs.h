/* tests/procs.h: helpers for test programs that run trainrun processes.
 *
 * The suites that start trainrun, trainrund or tests/fake_worker as real
 * processes (check_daemon, check_super, check_fsdp2_train) share these:
 * the clock, paths under the build and source folders, a free port on
 * loopback, the test's temporary folder, starting a program with its
 * output in files and waiting for it (failing the test when it takes too
 * long), reading files back, waiting for a file or a text in it, and the
 * losses a job wrote to metrics.jsonl. Every function fails the running
 * Check test on an error rather than returning one.
 *
 * Processes started with tp_proc_start() and not yet waited for are killed
 * by tp_cleanup(), which also removes tp_tmpdir; tp_tmpdir_make() arranges
 * for tp_cleanup() to run at exit too, so a failed assertion leaves no
 * process or folder behind. */
#ifndef TRAINRUN_TESTS_PROCS_H
#define TRAINRUN_TESTS_PROCS_H

#include <sys/types.h>

/* Seconds on the monotonic clock. */
double tp_now_s(void);

/* $top_builddir and $top_srcdir (set by the test harness), or ".". */
const char* tp_builddir(void);
const char* tp_srcdir(void);

/* "<builddir>/<name>" in a static ring of 8 buffers: the 8 latest results
 * stay valid. */
const char* tp_bin(const char* name);

/* A free TCP port on 127.0.0.1, found by binding port 0. With listen_too
 * the socket stays open and listening in *fd (the caller closes it), so the
 * port stays taken; otherwise it is closed again (fd may be NULL). */
int tp_port_on_loopback(int listen_too, int* fd);
/* tp_port_on_loopback(0, NULL). */
int tp_free_port(void);

/* The test's temporary folder, "$TMPDIR/<prefix>.XXXXXX" (TMPDIR unset:
 * /tmp) once made; "" when there is none. */
extern char tp_tmpdir[256];

/* Make a new tp_tmpdir named after prefix (the program's name). */
void tp_tmpdir_make(const char* prefix);

/* Remove path and everything under it (rm -rf). */
void tp_rm_tree(const char* path);

/* Kill (SIGKILL) and reap the processes started and not yet waited for,
 * remove tp_tmpdir and forget it. For the teardown; also runs at exit. */
void tp_cleanup(void);

/* "NAME=value" entries (NULL-terminated; NULL: none) put into the
 * environment of every process tp_proc_start() starts, before the entries
 * of its own env. A suite sets it once, e.g. to quieten the log. */
extern char* const* tp_env_defaults;

/* A process started by tp_proc_start(): its pid, the files its stdout and
 * stderr go to, and when it started (tp_now_s()). */
typedef struct {
  pid_t pid;
  char out[512], err[512];
  double t0;
  char mark[48]; /* TP_JOB in its environment (tp_assert_job_gone) */
} tp_proc_t;

/* Start argv (NULL-terminated; argv[0] a path) with stdout and stderr in
 * <tp_tmpdir>/<tag>.out and .err. Its environment: ours without the cluster
 * variables (SLURM_STEP_NUM_NODES, OMPI_COMM_WORLD_SIZE, TRAINRUN_WORKER,
 * TRAINRUN_HEARTBEAT_FD), TMPDIR=tp_tmpdir, then tp_env_defaults, then env
 * (NULL-terminated "NAME=value" entries; may be NULL). */
void tp_proc_start(tp_proc_t* p, const char* tag, char* const* argv,
                   char* const* env);

/* Wait for p: its exit code, or 128 + the signal that ended it. Still
 * running timeout seconds after it started: kill it and fail the test,
 * showing its stderr. */
int tp_proc_finish(tp_proc_t* p, double timeout);

/* tp_proc_start() and tp_proc_finish(); what it printed in *out and *err
 * (malloc()ed, the caller frees them). */
int tp_run(const char* tag, char* const* argv, char* const* env, char** out,
           char** err, double timeout);

/* Fail the test when anything of the job p started is left once it ended,
 * after a grace of up to 3 s: a process whose environment holds p's mark
 * (TP_JOB=<p->mark>, which tp_proc_start() sets: p's process and all its
 * descendants, orphans included), a shared-memory segment of p's
 * flight-recorder rings (/dev/shm/trainrun-*-<pid>-r*), a status socket of
 * p's pid under tp_tmpdir, or, when port > 0, a listener on
 * 127.0.0.1:port. */
void tp_assert_job_gone(const tp_proc_t* p, int port);
/* tp_assert_job_gone(p, 0) for every process tp_proc_start() started since
 * tp_tmpdir_make(): for a suite's teardown, once its jobs have ended. */
void tp_assert_all_gone(void);

/* The whole file, NUL-terminated, malloc()ed; "" when it cannot be read. */
char* tp_slurp(const char* path);

/* Wait until path exists (fail after timeout seconds). */
void tp_wait_file(const char* path, double timeout);
/* Wait until the file at path holds needle (fail after timeout seconds). */
void tp_wait_text(const char* path, const char* needle, double timeout);

/* The loss of step `step` in <dump>/metrics.jsonl: the last record of that
 * step (a restarted run writes its steps again). Fails when there is none. */
double tp_loss_at(const char* dump, int step);
/* The losses of steps 1..n (tp_loss_at()) into loss[0..n-1]. */
void tp_read_losses(const char* dump, double* loss, int n);

#endif /* TRAINRUN_TESTS_PROCS_H */
