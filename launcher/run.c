/* launcher/run.c: `trainrun [flags] JOB.toml [overrides]`, the default
 * command: load and resolve the job config for the world it will run in,
 * report it in one line, then train (trainer/train.c); a worker of a world
 * of several ranks trains data parallel over the default process group,
 * through the daemon's store: FSDP / HSDP (trainrun/fsdp2.h) when
 * [parallelism] data_parallel_shard_degree > 1, else DDP (trainrun/ddp.h). */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#ifdef __GLIBC__ /* defined by the headers above */
#include <malloc.h> /* mallopt */
#endif

#include "launcher/commands.h"
#include "launcher/launch.h"
#include "trainrun/config.h"
#include "trainrun/ddp.h" /* the gradient all-reduce of a worker */
#include "trainrun/error.h"
#include "trainrun/flight_recorder.h" /* every collective, in shared memory */
#include "trainrun/fsdp2.h" /* FSDP / HSDP when dp_shard > 1 */
#include "trainrun/param.h" /* MASTER_ADDR, MASTER_PORT, restart count */
#include "trainrun/pg.h"    /* the world's process group */
#include "trainrun/store.h" /* the daemon's store */
#include "trainrun/trainer.h"

/* One line naming what the job would do. */
static void print_summary(const tr_config_t* cfg, FILE* out) {
  const typeof(cfg->parallelism)* p = &cfg->parallelism;
  fprintf(out,
          "job '%s': %s %s, %lld steps, batch %lld x %lld tokens per rank "
          "(global %lld, %lld accumulation step%s), lr %g, device %s, "
          "world %lld (dp %lld x %lld, tp %lld, pp %lld, cp %lld)\n",
          cfg->job.description, cfg->model.name, cfg->model.flavor,
          (long long)cfg->training.steps,
          (long long)cfg->training.local_batch_size,
          (long long)cfg->training.seq_len,
          (long long)cfg->training.global_batch_size,
          (long long)cfg->derived.grad_accum_steps,
          cfg->derived.grad_accum_steps == 1 ? "" : "s", cfg->optimizer.lr,
          cfg->training.device, (long long)cfg->derived.world_size,
          (long long)p->data_parallel_replicate_degree,
          (long long)p->data_parallel_shard_degree,
          (long long)p->tensor_parallel_degree,
          (long long)p->pipeline_parallel_degree,
          (long long)p->context_parallel_degree);
}

/* The data-parallel side of a worker of a world of several ranks: a
 * client of the daemon's store (MASTER_ADDR:MASTER_PORT), the default
 * process group (Gloo for CPU tensors, NCCL for CUDA ones) under [comm]
 * init_timeout_seconds, and the trainer's gradient sync over it. */
typedef struct {
  tr_store_client_t* store;
  tr_pg_t* pg;
  tr_ddp_t* ddp;
  tr_fsdp_t* fsdp;
  tr_fr_t* fr; /* the flight recorder's ring (trainrun/flight_recorder.h) */
  tr_trainer_dist_t dist;
} worker_dist_t;

static void worker_dist_release(worker_dist_t* w) {
  tr_ddp_free(w->ddp);
  tr_fsdp_free(w->fsdp);
  tr_pg_free(w->pg);
  tr_fr_free(w->fr); /* after the groups: their last ops still record */
  tr_store_client_free(w->store);
  memset(w, 0, sizeof *w);
}

static int worker_dist_init(worker_dist_t* w, const tr_launch_t* l,
                            const tr_config_t* cfg) {
  memset(w, 0, sizeof *w);
  const typeof(cfg->parallelism)* p = &cfg->parallelism;
  if (p->tensor_parallel_degree > 1 || p->pipeline_parallel_degree > 1 ||
      p->context_parallel_degree > 1) {
    fprintf(stderr,
            "trainrun: rank %d: tensor, pipeline and context parallelism "
            "are not built yet: train with data parallelism only\n",
            l->rank);
    return TR_EUNSUPPORTED;
  }
  const char* host = tr_param_str(TR_PARAM_MASTER_ADDR);
  if (!host[0]) {
    fprintf(stderr, "trainrun: rank %d: MASTER_ADDR is not set\n", l->rank);
    return TR_EINVAL;
  }
  int64_t init_ms = cfg->comm.init_timeout_seconds * 1000;
  tr_store_client_opts_t so;
  tr_store_client_opts_init(&so);
  so.host = host;
  so.port = (int)tr_param_int(TR_PARAM_MASTER_PORT);
  so.timeout_ms = init_ms;
  int rc = tr_store_client_connect(&so, &w->store);
  if (rc < 0) {
    fprintf(stderr, "trainrun: rank %d: cannot reach the store at %s:%d: %s\n",
            l->rank, so.host, so.port, tr_strerror(rc));
    return rc;
  }
  char prefix[64];
  snprintf(prefix, sizeof prefix, "trpg/%lld",
           (long long)tr_param_int(TR_PARAM_RESTART_COUNT));
  tr_pg_opts_t po;
  tr_pg_opts_init(&po);
  po.rank = l->rank;
  po.world_size = l->world_size;
  po.store = w->store;
  po.store_prefix = prefix;
  po.backend = "cpu:gloo,cuda:nccl";
  po.timeout_ms = init_ms;
  po.cuda_device = l->local_rank;
  po.failure_key = tr_param_str(TR_PARAM_FAILURE_KEY);
  rc = tr_pg_init(&po, &w->pg);
  if (rc < 0) {
    fprintf(stderr, "trainrun: rank %d: cannot create the process group: %s\n",
            l->rank, tr_strerror(rc));
    worker_dist_release(w);
    return rc;
  }
  rc = tr_fr_init_from_config(cfg, w->pg, prefix, &w->fr);
  if (rc < 0) /* the job runs on without a recorder */
    fprintf(stderr, "trainrun: rank %d: no flight recorder: %s\n", l->rank,
            tr_strerror(rc));
  if (p->data_parallel_shard_degree > 1) { /* FSDP, HSDP */
    tr_errmsg_t err;
    rc = tr_fsdp_from_config(cfg, w->pg, &w->fsdp, &err);
    if (rc < 0) {
      fprintf(stderr, "trainrun: rank %d: %s\n", l->rank, err.message);
      worker_dist_release(w);
      return rc;
    }
    tr_fsdp_dist(w->fsdp, &w->dist);
    return 0;
  }
  tr_ddp_opts_t dopts; /* dp_replicate = the world: DDP */
  tr_ddp_opts_init(&dopts);
  dopts.pg = w->pg;
  dopts.train_timeout_ms = cfg->comm.train_timeout_seconds * 1000;
  dopts.comm_timing = cfg->metrics.comm_overlap;
  rc = tr_ddp_init(&dopts, &w->ddp);
  if (rc < 0) {
    fprintf(stderr, "trainrun: rank %d: %s\n", l->rank, tr_strerror(rc));
    worker_dist_release(w);
    return rc;
  }
  tr_ddp_dist(w->ddp, &w->dist);
  return 0;
}

/* Keep freed host memory for the next allocation of the process. A step
 * frees and allocates the same buffers again (FSDP's gathered weights,
 * activations, gradients); by default glibc unmaps each buffer over its
 * 128 KiB mmap threshold when it is freed, and returns the top of the heap
 * over 128 KiB, so every step faults its buffers in again page by page:
 * the 16 processes of bench/startup's 8-rank job took 240,000 page faults
 * from start to exit, 130,000 with these settings, and about 0.3 s less
 * CPU time (docs/PERFORMANCE.md). Memory stays at the peak a step
 * reached, as with a caching allocator. */
static void keep_freed_memory(void) {
#if defined(__GLIBC__) && defined(M_MMAP_THRESHOLD) && defined(M_TRIM_THRESHOLD)
  mallopt(M_MMAP_THRESHOLD, 32 << 20); /* glibc's largest: 32 MiB */
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

/* A bare word that names no file is most likely a mistyped command. */
static int check_job_word(const char* a) {
  struct stat st;
  if (strchr(a, '.') || strchr(a, '/') || stat(a, &st) == 0) return 0;
  fprintf(stderr, "trainrun: unknown command '%s' (see trainrun --help)\n", a);
  return 2;
}

int tr_launch_job(int argc, char** argv) {
  /* torchrun's flags, the node daemon and the worker side of a process it
   * spawned (launcher/launch.c): -1 means "train here" */
  tr_launch_t launch;
  int lrc = tr__launch_prepare(&argc, argv, &launch);
  if (lrc >= 0) return lrc;
  tr__jobargs_opts_t o = {.check_path = check_job_word};
  tr__jobargs_t ja;
  int rc = tr__jobargs_parse(&ja, argc, argv, &o);
  if (rc >= 0) return rc;
  const char* path = ja.path;
  int n = ja.n;
  char** overrides = ja.overrides;
  if (!path) {
    int has_file = 0;
    for (int i = 0; i < n; i++)
      has_file |= strncmp(overrides[i], "--job.config", 12) == 0;
    if (!has_file) {
      fprintf(stderr,
              "trainrun: no job file given (trainrun JOB.toml, or "
              "--job.config_file PATH)\n");
      rc = 2;
      goto out;
    }
  }

  tr_config_t cfg;
  tr_errmsg_t err;
  tr__dumplock_t lock = {0};
  /* the world this process is one rank of (1 unless a daemon spawned it) */
  /* a worker's daemon checked the job before it started the workers */
  if (tr_config_load(&cfg, path, n, overrides, &err) < 0 ||
      tr_config_resolve(&cfg, launch.world_size, &err) < 0 ||
      (!launch.worker && (tr__preflight_config(&cfg, &err) < 0 ||
                          tr__preflight_files(&cfg, &err) < 0))) {
    fprintf(stderr, "trainrun: %s\n", err.message);
    rc = 2;
  } else if (!launch.worker && tr__dumplock_acquire(&lock, cfg.job.dump_folder,
                                                    NULL, NULL, &err) < 0) {
    /* a worker's daemon holds the dump folder's lock for the job */
    fprintf(stderr, "trainrun: %s\n", err.message);
    rc = 2;
  } else {
    if (cfg.job.print_config) tr_config_print_toml(&cfg, stdout);
    print_summary(&cfg, stdout);
    fflush(stdout);
    keep_freed_memory();
    tr_errmsg_t terr;
    int stopped = 0;
    worker_dist_t wd = {0};
    tr_trainer_opts_t topts = {0};
    int trc = 0;
    if (launch.world_size > 1) {
      trc = worker_dist_init(&wd, &launch, &cfg);
      topts.dist = &wd.dist;
    }
    if (trc < 0) {
      rc = tr__cmd_exit_code(trc);
    } else {
      trc = tr_train(&cfg, &topts, &stopped, &terr);
      if (trc < 0) {
        fprintf(stderr, "trainrun: %s\n", terr.message);
        rc = tr__cmd_exit_code(trc);
      } else {
        rc = fflush(stdout) == 0 ? 0 : 1;
      }
    }
    worker_dist_release(&wd);
  }
  tr__dumplock_release(&lock);
  tr_config_release(&cfg);
out:
  tr__jobargs_release(&ja);
  return rc;
}
