/* launcher/launch.c: the multi-process path of `trainrun [flags] JOB.toml`.
 *
 * tr_launch_job (launcher/run.c) calls tr__launch_prepare first. It takes
 * torchrun's flags (daemon/opts.c parses them) out of the arguments, fills
 * what they leave open from Slurm's or Open MPI's environment, and picks
 * where the job runs:
 *
 *   - in a process the daemon spawned (TRAINRUN_WORKER=1): here, as rank
 *     RANK of WORLD_SIZE;
 *   - one rank on one node and no flag that needs supervision: here, with
 *     no daemon (the fastest start);
 *   - otherwise through the node daemon in this process (daemon/): the job
 *     config is checked once for the whole world, then every worker runs
 *     this same program with the job's arguments and the worker
 *     environment. `--exec PROGRAM ARGS...` runs any program instead (a
 *     PyTorch script: torchrun's environment is there).
 *
 * --dry-run checks the job for the world the flags describe and prints the
 * layout without starting anything. */
#include "config.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launcher/commands.h"
#include "launcher/launch.h"
#include "trainrun/config.h"
#include "trainrun/daemon.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/param.h"

/* "trainrun: first line", then the other lines as they are. */
static void print_report(const char* msg) {
  const char* p = msg;
  int first = 1;
  while (*p) {
    size_t n = strcspn(p, "\n");
    fprintf(stderr, "%s%.*s\n", first ? "trainrun: " : "", (int)n, p);
    first = 0;
    p += n;
    if (*p) p++;
  }
}

/* The job file and overrides among args (after the launcher flags are
 * out): NULL path when none. What tr_launch_job would refuse (another flag,
 * a second file) is refused here too, in its words, before any worker
 * starts: -1 with the message in msg. */
static int split_job(int argc, char** argv, const char** path, int* nover,
                     char** over, char* msg, size_t cap) {
  *path = NULL;
  *nover = 0;
  for (int i = 0; i < argc;) {
    int span = tr_config_arg_span(argc, argv, i);
    if (span > 0) {
      for (int j = 0; j < span; j++) over[(*nover)++] = argv[i + j];
      i += span;
      continue;
    }
    if (argv[i][0] == '-' && argv[i][1]) {
      snprintf(msg, cap, "unknown flag '%s' (see trainrun --help)", argv[i]);
      return -1;
    }
    if (*path) {
      snprintf(msg, cap, "more than one job file ('%s', '%s')", *path, argv[i]);
      return -1;
    }
    *path = argv[i];
    i++;
  }
  return 0;
}

static void print_layout(const tr_daemon_opts_t* o, FILE* out) {
  int world = o->nnodes_max * o->nproc_per_node;
  if (o->nnodes_min != o->nnodes_max)
    fprintf(out, "layout: %d to %d nodes x %d worker%s = %d to %d ranks",
            o->nnodes_min, o->nnodes_max, o->nproc_per_node,
            o->nproc_per_node == 1 ? "" : "s",
            o->nnodes_min * o->nproc_per_node, world);
  else
    fprintf(out, "layout: %d node%s x %d worker%s = %d rank%s", o->nnodes_max,
            o->nnodes_max == 1 ? "" : "s", o->nproc_per_node,
            o->nproc_per_node == 1 ? "" : "s", world, world == 1 ? "" : "s");
  if (o->rdzv_host)
    fprintf(out, "; rendezvous %s:%d, run '%s'", o->rdzv_host, o->rdzv_port,
            o->run_id);
  else
    fprintf(out, "; a private store on this node");
  if (o->nnodes_max > 1) {
    if (o->node_rank >= 0)
      fprintf(out, "; this is node %d", o->node_rank);
    else
      fprintf(out, "; node ranks by order of arrival");
  }
  if (o->env_source)
    fprintf(out, " (from %s)",
            strcmp(o->env_source, "slurm") == 0 ? "Slurm" : "Open MPI");
  fprintf(out, "; max restarts %d\n", o->max_restarts);
}

static void print_job(const tr_config_t* cfg, FILE* out) {
  const typeof(cfg->parallelism)* p = &cfg->parallelism;
  fprintf(out,
          "job '%s': %s %s, %lld steps; world %lld = dp replicate %lld x "
          "shard %lld x tp %lld x pp %lld x cp %lld; global batch %lld "
          "(%lld per rank x %lld accumulation step%s)\n",
          cfg->job.description, cfg->model.name, cfg->model.flavor,
          (long long)cfg->training.steps, (long long)cfg->derived.world_size,
          (long long)p->data_parallel_replicate_degree,
          (long long)p->data_parallel_shard_degree,
          (long long)p->tensor_parallel_degree,
          (long long)p->pipeline_parallel_degree,
          (long long)p->context_parallel_degree,
          (long long)cfg->training.global_batch_size,
          (long long)cfg->training.local_batch_size,
          (long long)cfg->derived.grad_accum_steps,
          cfg->derived.grad_accum_steps == 1 ? "" : "s");
}

static tr_daemon_device_t device_of(const char* d) {
  if (d && strcmp(d, "cpu") == 0) return TR_DAEMON_DEVICE_CPU;
  if (d && strcmp(d, "cuda") == 0) return TR_DAEMON_DEVICE_GPU;
  return TR_DAEMON_DEVICE_AUTO;
}

/* Does the job need the daemon (more than this one process)? */
static int needs_daemon(const tr_daemon_opts_t* o, int exec) {
  return exec || o->nnodes_max > 1 || o->nproc_per_node > 1 ||
         o->max_restarts > 0 || o->log_dir || o->standalone || o->rdzv_host ||
         o->redirects.def || o->redirects.n || o->tee.def || o->tee.n ||
         o->metrics_port >= 0;
}

int tr__launch_prepare(int* argc, char** argv, tr_launch_t* l) {
  memset(l, 0, sizeof *l);
  l->world_size = 1;
  if (tr_param_bool(TR_PARAM_WORKER)) {
    /* spawned by a daemon: one rank of the world it describes */
    l->worker = 1;
    l->world_size = (int)tr_param_int(TR_PARAM_WORLD_SIZE);
    l->rank = (int)tr_param_int(TR_PARAM_RANK);
    l->local_rank = (int)tr_param_int(TR_PARAM_LOCAL_RANK);
    if (l->rank >= l->world_size) {
      fprintf(stderr, "trainrun: RANK %d is not below WORLD_SIZE %d\n", l->rank,
              l->world_size);
      return 2;
    }
    tr_log_set_rank(l->rank);
    return -1;
  }

  tr_daemon_opts_t o;
  tr_daemon_opts_init(&o);
  tr_errmsg_t err;
  tr_errmsg_clear(&err);
  int n = *argc, kept = 0, dry_run = 0, nflags = 0, rc = 2;
  char** exec_argv = NULL;
  char** over = calloc((size_t)n + 1, sizeof *over);
  char** wargv = calloc((size_t)n + 2, sizeof *wargv);
  tr_config_t cfg;
  int have_cfg = 0;
  if (!over || !wargv) {
    fprintf(stderr, "trainrun: %s\n", tr_strerror(TR_ENOMEM));
    rc = 1;
    goto out;
  }
  /* take the launcher flags out; keep overrides and their values whole */
  for (int i = 0; i < n;) {
    int span = tr_config_arg_span(n, argv, i);
    if (span > 0) {
      for (int j = 0; j < span; j++) argv[kept++] = argv[i + j];
      i += span;
      continue;
    }
    if (strcmp(argv[i], "--dry-run") == 0) {
      dry_run = 1;
      nflags++;
      i++;
      continue;
    }
    if (strcmp(argv[i], "--exec") == 0) {
      if (i + 1 >= n) {
        fprintf(stderr, "trainrun: --exec: missing program\n");
        goto out;
      }
      exec_argv = argv + i + 1; /* the rest is the program's */
      break;
    }
    int used = tr_daemon_opts_flag(&o, n, argv, i, &err);
    if (used < 0) {
      fprintf(stderr, "trainrun: %s\n", err.message);
      goto out;
    }
    if (used == 0) {
      argv[kept++] = argv[i++];
      continue;
    }
    nflags++;
    i += used;
  }
  int nexec = exec_argv ? (int)(argv + n - exec_argv) : 0;
  /* exec_argv points past `kept`, so compacting never overwrote it */
  *argc = kept;
  if (exec_argv && kept > 0) {
    fprintf(stderr,
            "trainrun: --exec runs a program instead of a job: "
            "'%s' has no place before it\n",
            argv[0]);
    goto out;
  }
  if (tr_daemon_opts_from_env(&o, &err) < 0) {
    fprintf(stderr, "trainrun: %s\n", err.message);
    goto out;
  }

  /* the job's device picks the default --nproc-per-node */
  tr_daemon_device_t device = TR_DAEMON_DEVICE_AUTO;
  const char* path = NULL;
  int nover = 0;
  tr_errmsg_t cerr;
  if (!exec_argv) {
    char msg[512];
    if (split_job(kept, argv, &path, &nover, over, msg, sizeof msg) < 0) {
      if (nflags == 0 && !o.env_source)
        rc = -1; /* no flags: the one-process path reports it */
      else
        fprintf(stderr, "trainrun: %s\n", msg);
      goto out;
    }
    if (tr_config_load(&cfg, path, nover, over, &cerr) < 0) {
      tr_config_release(&cfg);
      if (nflags == 0 && !o.env_source) {
        rc = -1; /* no flags: the one-process path reports it */
        goto out;
      }
      fprintf(stderr, "trainrun: %s\n", cerr.message);
      goto out;
    }
    have_cfg = 1;
    device = device_of(cfg.training.device);
    if (cfg.comm.key) {
      /* [comm] key: the store this launch hosts requires it, and the
       * daemons and workers prove it (they read TRAINRUN_STORE_TOKEN) */
      if (setenv(tr_param_env_name(TR_PARAM_STORE_TOKEN), cfg.comm.key, 1)) {
        fprintf(stderr, "trainrun: %s\n", tr_strerror(tr_err_from_errno()));
        rc = 1;
        goto out;
      }
      tr_param_reset();
    }
  }
  if (tr_daemon_opts_finish(&o, device, &err) < 0) {
    fprintf(stderr, "trainrun: %s\n", err.message);
    goto out;
  }
  int world = o.nnodes_max * o.nproc_per_node;
  if (!dry_run && !needs_daemon(&o, exec_argv != NULL)) {
    rc = -1; /* one rank here, no daemon */
    goto out;
  }
  /* the job's checks, fault specs included: before any worker starts */
  if (have_cfg && tr__job_check(&cfg, world, &cerr) < 0) {
    fprintf(stderr, "trainrun: %s\n", cerr.message);
    goto out;
  }
  /* what the workers would find only at their start, or after the work:
   * checked once here, before any starts */
  if (have_cfg && (tr__preflight_config(&cfg, &cerr) < 0 ||
                   (!dry_run && tr__preflight_files(&cfg, &cerr) < 0))) {
    fprintf(stderr, "trainrun: %s\n", cerr.message);
    goto out;
  }
  if (dry_run) {
    print_layout(&o, stdout);
    if (have_cfg) print_job(&cfg, stdout);
    if (o.nnodes_min != o.nnodes_max && have_cfg) {
      /* an elastic job must fit every world it may run in */
      for (int nn = o.nnodes_min; nn < o.nnodes_max; nn++) {
        tr_config_t c2;
        int bad = tr_config_load(&c2, path, nover, over, &cerr) < 0 ||
                  tr__job_check(&c2, (int64_t)nn * o.nproc_per_node, &cerr) < 0;
        tr_config_release(&c2);
        if (bad) {
          fprintf(stderr, "trainrun: with %d nodes: %s\n", nn, cerr.message);
          goto out;
        }
      }
    }
    rc = fflush(stdout) == 0 ? 0 : 1;
    goto out;
  }

  if (have_cfg && !exec_argv && tr__job_uses_mpi(&cfg)) {
    rc = tr__launch_mpi(&o, kept, argv, l); /* -1: a rank of mpirun's */
    goto out;
  }

  /* the workers: this program with the job's arguments, or --exec's */
  char self[PATH_MAX];
  char* const* worker_argv;
  if (exec_argv) {
    for (int i = 0; i < nexec; i++) wargv[i] = exec_argv[i];
    wargv[nexec] = NULL;
    worker_argv = wargv;
  } else {
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
      fprintf(stderr, "trainrun: cannot find this program: %s\n",
              tr_strerror(tr_err_from_errno()));
      rc = 1;
      goto out;
    }
    self[len] = '\0';
    wargv[0] = self;
    for (int i = 0; i < kept; i++) wargv[1 + i] = argv[i];
    wargv[1 + kept] = NULL;
    worker_argv = wargv;
  }
  /* one job per dump folder, for the whole job (every restart) */
  tr__dumplock_t lock = {0};
  if (have_cfg) {
    char ep[320] = "";
    if (o.rdzv_host && !o.standalone)
      snprintf(ep, sizeof ep, "%s:%d", o.rdzv_host, o.rdzv_port);
    if (tr__dumplock_acquire(&lock, cfg.job.dump_folder, o.run_id, ep, &cerr) <
        0) {
      fprintf(stderr, "trainrun: %s\n", cerr.message);
      goto out;
    }
  }
  tr_daemon_report_t rep;
  tr_daemon_run(&o, worker_argv, &rep);
  if (rep.message) print_report(rep.message);
  rc = rep.exit_code;
  tr_daemon_report_release(&rep);
  tr__dumplock_release(&lock);
out:
  if (have_cfg) tr_config_release(&cfg);
  tr_daemon_opts_release(&o);
  free(over);
  free(wargv);
  return rc;
}
