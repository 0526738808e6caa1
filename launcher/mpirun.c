/* launcher/mpirun.c: jobs that train over MPI ([comm] backend serving CPU
 * tensors with mpi). MPI's world is made by mpirun, so its processes are
 * the ranks:
 *
 *   - under mpirun (OMPI_COMM_WORLD_SIZE set), each process trains as rank
 *     OMPI_COMM_WORLD_RANK of OMPI_COMM_WORLD_SIZE, with no daemon and no
 *     store (`mpirun -np 4 trainrun job.toml --comm.backend mpi`);
 *   - `trainrun --nproc-per-node N job.toml` on one node runs
 *     `mpirun -np N trainrun job.toml ...` in its place, so the same job
 *     trains over MPI under trainrun too.
 *
 * The daemon's features (restarts, log files, the metrics port) need
 * workers the daemon spawns: they are refused with the MPI backend. */
#include "config.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launcher/commands.h"
#include "launcher/launch.h"
#include "trainrun/daemon.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/param.h"

/* The daemon flag o holds that mpirun's ranks cannot honour, or NULL. */
static const char* daemon_only(const tr_daemon_opts_t* o) {
  if (o->max_restarts > 0) return "--max-restarts";
  if (o->log_dir) return "--log-dir";
  if (o->redirects.def || o->redirects.n) return "--redirects";
  if (o->tee.def || o->tee.n) return "--tee";
  if (o->metrics_port >= 0) return "--metrics-port";
  return NULL;
}

int tr__launch_mpi(const tr_daemon_opts_t* o, int argc, char** argv,
                   tr_launch_t* l) {
  const char* flag = daemon_only(o);
  if (flag) {
    fprintf(stderr,
            "trainrun: %s needs workers that the daemon starts, and "
            "comm.backend mpi trains in mpirun's processes; drop %s or use "
            "cpu:gloo\n",
            flag, flag);
    return 2;
  }
  if (tr_param_is_set(TR_PARAM_OMPI_SIZE)) { /* under mpirun: a rank */
    if (o->nproc_per_node != 1) {
      fprintf(stderr,
              "trainrun: under mpirun with comm.backend mpi every process "
              "is one rank; drop --nproc-per-node (mpirun -np sets the "
              "ranks)\n");
      return 2;
    }
    l->worker = 1;
    l->world_size = (int)tr_param_int(TR_PARAM_OMPI_SIZE);
    l->rank = (int)tr_param_int(TR_PARAM_OMPI_RANK);
    l->local_rank = 0; /* a CPU job */
    tr_log_set_rank(l->rank);
    return -1;
  }
  if (o->nnodes_max > 1) {
    fprintf(stderr,
            "trainrun: comm.backend mpi on %d nodes: start the job with "
            "mpirun across them (mpirun -np N --host ... trainrun "
            "job.toml), whose processes are the ranks\n",
            o->nnodes_max);
    return 2;
  }
  /* mpirun -np N <this program> <the job's arguments> */
  char self[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) {
    fprintf(stderr, "trainrun: cannot find this program: %s\n",
            tr_strerror(tr_err_from_errno()));
    return 1;
  }
  self[len] = '\0';
  char np[16];
  snprintf(np, sizeof np, "%d", o->nproc_per_node);
  char** mv = calloc((size_t)argc + 8, sizeof *mv);
  if (!mv) {
    fprintf(stderr, "trainrun: %s\n", tr_strerror(TR_ENOMEM));
    return 1;
  }
  int k = 0;
  mv[k++] = "mpirun";
  mv[k++] = "-np";
  mv[k++] = np;
  mv[k++] = "--oversubscribe"; /* a CPU job may have more ranks than cores */
  mv[k++] = "--bind-to";
  mv[k++] = "none";
  mv[k++] = self;
  for (int i = 0; i < argc; i++) mv[k++] = argv[i];
  mv[k] = NULL;
  fflush(NULL);
  execvp("mpirun", mv);
  fprintf(stderr,
          "trainrun: comm.backend mpi: cannot run mpirun (%s); install Open "
          "MPI's mpirun, or use cpu:gloo\n",
          tr_strerror(tr_err_from_errno()));
  free(mv);
  return 1;
}
