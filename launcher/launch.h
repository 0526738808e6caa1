/* launcher/launch.h: the launcher's part of `trainrun [flags] JOB.toml`
 * (launcher/launch.c) -- torchrun's flags, the cluster's environment, the
 * choice between training in this process and running the node daemon,
 * --dry-run, and the worker side of a process the daemon spawned. */
#ifndef TRAINRUN_LAUNCHER_LAUNCH_H
#define TRAINRUN_LAUNCHER_LAUNCH_H

#include "trainrun/daemon.h" /* tr_daemon_opts_t */
#include "trainrun/config.h"
#include "trainrun/errmsg.h"

/* Where and as what this process trains. */
typedef struct {
  int world_size; /* ranks of the job: WORLD_SIZE in a worker, else 1 */
  int rank;       /* this process's rank: RANK in a worker, else 0 */
  int local_rank; /* LOCAL_RANK in a worker, else 0 */
  int worker;     /* 1: spawned by a daemon (TRAINRUN_WORKER) */
} tr_launch_t;

/* Called first by tr_launch_job with its arguments (job file, overrides
 * and launcher flags, in any order). Takes the launcher flags out of argv
 * (*argc shrinks; the order of the rest is kept) and decides:
 *  - a worker spawned by a daemon, or a one-rank job with no flag that
 *    needs the daemon: returns -1 and fills *l; the caller trains here;
 *  - otherwise it runs the job -- through the node daemon (several ranks or
 *    nodes, restarts, log files, --exec), or --dry-run -- and returns the
 *    exit code, having printed its messages ("trainrun: ..."). */
int tr__launch_prepare(int* argc, char** argv, tr_launch_t* l);

/* A job that trains over MPI (tr__job_uses_mpi, launcher/mpirun.c): under
 * mpirun, fills *l as rank OMPI_COMM_WORLD_RANK and returns -1 (train
 * here); otherwise runs `mpirun -np <nproc-per-node> <this program> argv`
 * in place of this process, or returns the exit code of a refusal (2:
 * several nodes, or a daemon flag such as --max-restarts) after printing
 * why. argv holds the job file and overrides (argc of them). */
int tr__launch_mpi(const tr_daemon_opts_t* o, int argc, char** argv,
                   tr_launch_t* l);

/* ---- launcher/preflight.c: checks before any work starts ---- */

/* What needs no file system and tr__job_check does not check:
 * job.dump_folder is set. Messages name where the key involved was set;
 * TR_ECONFIG (exit code 2). */
int tr__preflight_config(const tr_config_t* cfg, tr_errmsg_t* err);

/* Creates job.dump_folder (and the checkpoint folder when checkpoints are
 * saved) and proves a file can be written in each; checks that the data
 * paths name regular files that can be read (tr_dataset_check). Messages
 * name where the key involved was set. */
int tr__preflight_files(const tr_config_t* cfg, tr_errmsg_t* err);

/* ---- launcher/dumplock.c: one job per dump folder ---- */

typedef struct {
  char* path; /* the lock file this job owns; NULL: none */
} tr__dumplock_t;

/* Lock the dump folder (it exists: tr__preflight_files) for this job,
 * recorded as run_id at endpoint ("host:port"; NULL or "": a private store,
 * never shared). A lock of the same run id and endpoint is another node's
 * of this job: 0, not owned. A stale lock (its process on this host is
 * gone) is taken over with a warning. Held by another job: TR_EEXIST with
 * a message naming it (run, pid, host, start) and the lock file. */
int tr__dumplock_acquire(tr__dumplock_t* l, const char* dump,
                         const char* run_id, const char* endpoint,
                         tr_errmsg_t* err);
/* Remove the lock when this job owns it. */
void tr__dumplock_release(tr__dumplock_t* l);

#endif /* TRAINRUN_LAUNCHER_LAUNCH_H */
