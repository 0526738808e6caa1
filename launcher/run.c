/* launcher/run.c: `trainrun [flags] JOB.toml [overrides]`, the default
 * command: load and resolve the job config for the world it will run in,
 * report it in one line, then train (trainer/train.c); a worker of a world
 * of several ranks trains data parallel over the default process group,
 * through the daemon's store: FSDP / HSDP (trainrun/fsdp2.h) when
 * [parallelism] data_parallel_shard_degree > 1, else DDP (trainrun/ddp.h),
 * over the mesh's data-parallel dims (FSDP over dp_shard x cp under
 * context parallelism), tensor parallelism over its dim "tp" when
 * tensor_parallel_degree > 1, and context parallelism over "cp".
 * Every module gets its options from the config through
 * launcher/compose.c. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h> /* getcwd */
#ifdef __GLIBC__    /* defined by the headers above */
#include <malloc.h> /* mallopt */
#endif

#include "launcher/commands.h"
#include "launcher/compose.h" /* config -> trainer, mesh, FSDP, DDP options */
#include "launcher/launch.h"
#include "trainrun/config.h"
#include "trainrun/ddp.h"     /* the gradient all-reduce of a worker */
#include "trainrun/dtensor.h" /* FSDP's mesh */
#include "trainrun/error.h"
#include "trainrun/flight_recorder.h" /* every collective, in shared memory */
#include "trainrun/fsdp2.h"           /* FSDP / HSDP when dp_shard > 1 */
#include "trainrun/log.h"
#include "trainrun/model.h" /* print_after_conversion */
#include "trainrun/param.h" /* MASTER_ADDR, MASTER_PORT, restart count */
#include "trainrun/pg.h"    /* the world's process group */
#include "trainrun/store.h" /* the daemon's store */
#include "trainrun/trainer.h"
#include "core/internal.h" /* tr__mkdir_p */
#ifdef HAVE_CUDA
#include "trainrun/kernels_cuda.h" /* deterministic kernels */
#endif

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
 * process group over [comm] backend (Gloo for CPU tensors and NCCL for
 * CUDA ones by default; MPI's world under mpirun, without a store) under
 * [comm] init_timeout_seconds, and the trainer's gradient sync over it.
 * Under [comm] mode = "fake_backend" the group is the fake backend's: this
 * one process plays comm.fake_rank of comm.fake_world_size ranks and no
 * data moves. */
typedef struct {
  tr_store_client_t* store;
  tr_pg_t* pg;
  tr_ddp_t* ddp;
  tr_fsdp_t* fsdp;
  tr_mesh_t* mesh; /* the job's mesh (FSDP, HSDP, TP), NULL for DDP alone */
  tr_fr_t* fr;     /* the flight recorder's ring (trainrun/flight_recorder.h) */
  tr_dp_t dist;
  tr_trainer_tp_t tp; /* pg NULL: no tensor parallelism */
  tr_trainer_pp_t pp; /* pg NULL: no pipeline parallelism */
  tr_cp_t cp;         /* pg NULL: no context parallelism */
} worker_dist_t;

static void worker_dist_release(worker_dist_t* w) {
  tr_ddp_free(w->ddp);
  tr_fsdp_free(w->fsdp);
  tr_mesh_free(w->mesh);
  tr_pg_free(w->pg);
  tr_fr_free(w->fr); /* after the groups: their last ops still record */
  tr_store_client_free(w->store);
  memset(w, 0, sizeof *w);
}

/* The worker's flight recorder: capacity [comm] trace_buf_size, dumps to
 * <job.dump_folder>/<comm.save_traces_folder>/<comm.save_traces_file_
 * prefix><rank> (made absolute: the daemon writes them), hang timeout
 * [comm] hang_timeout_seconds, the segment named by TRAINRUN_FR_SHM, and
 * world (already created) recorded. *out NULL when trace_buf_size is 0. */
static int start_recorder(const tr_config_t* cfg, tr_pg_t* world,
                          const char* store_prefix, tr_fr_t** out) {
  *out = NULL;
  char dir[1024], cwd[512];
  const char* base = cfg->job.dump_folder;
  if (base[0] == '/' || !getcwd(cwd, sizeof cwd))
    snprintf(dir, sizeof dir, "%s/%s", base, cfg->comm.save_traces_folder);
  else
    snprintf(dir, sizeof dir, "%s/%s/%s", cwd, base,
             cfg->comm.save_traces_folder);
  tr_fr_opts_t o;
  tr_fr_opts_init(&o);
  o.rank = tr_pg_rank(world);
  o.world_size = tr_pg_size(world);
  o.local_rank = (int)tr_param_int(TR_PARAM_LOCAL_RANK);
  o.capacity = cfg->comm.trace_buf_size;
  o.dump_dir = dir;
  o.dump_prefix = cfg->comm.save_traces_file_prefix;
  o.hang_timeout_s = (int)cfg->comm.hang_timeout_seconds;
  o.store_prefix = store_prefix;
  tr_fr_t* fr = NULL;
  TR_CHECK(tr_fr_init(&o, &fr));
  int rc = tr_fr_add_group(fr, world);
  if (rc < 0) {
    tr_fr_free(fr);
    return rc;
  }
  *out = fr;
  return 0;
}

static int worker_dist_init(worker_dist_t* w, const tr_launch_t* l,
                            const tr_config_t* cfg) {
  memset(w, 0, sizeof *w);
  const typeof(cfg->parallelism)* p = &cfg->parallelism;
  int64_t init_ms = cfg->comm.init_timeout_seconds * 1000;
  tr_pg_opts_t po;
  tr_pg_opts_init(&po);
  po.rank = l->rank;
  po.world_size = l->world_size;
  po.backend = cfg->comm.backend; /* checked by tr__job_check */
  po.timeout_ms = init_ms;
  po.cuda_device = l->local_rank;
  int rc;
  if (strcmp(cfg->comm.mode, "fake_backend") == 0) {
    po.backend = "fake";
  } else if (tr__job_uses_mpi(cfg)) {
    po.backend = "mpi"; /* MPI's world: no store, no CUDA backend */
  } else {
    const char* host = tr_param_str(TR_PARAM_MASTER_ADDR);
    if (!host[0]) {
      fprintf(stderr, "trainrun: rank %d: MASTER_ADDR is not set\n", l->rank);
      return TR_EINVAL;
    }
    tr_store_client_opts_t so;
    tr_store_client_opts_init(&so);
    so.host = host;
    so.port = (int)tr_param_int(TR_PARAM_MASTER_PORT);
    so.timeout_ms = init_ms;
    so.probe_auth = 1; /* the daemon's store: say when it wants a secret */
    rc = tr_store_client_connect(&so, &w->store);
    if (rc < 0) {
      fprintf(stderr, "trainrun: rank %d: %s at the store %s:%d: %s\n", l->rank,
              rc == TR_EAUTH ? "authentication failed" : "cannot connect",
              so.host, so.port,
              rc == TR_EAUTH ? "its secret (comm.key or TRAINRUN_STORE_TOKEN) "
                               "is missing here or differs"
                             : tr_strerror(rc));
      return rc;
    }
  }
  char prefix[64];
  snprintf(prefix, sizeof prefix, "trpg/%lld",
           (long long)tr_param_int(TR_PARAM_RESTART_COUNT));
  po.store = w->store;
  po.store_prefix = prefix;
  po.failure_key = tr_param_str(TR_PARAM_FAILURE_KEY);
  rc = tr_pg_new(&po, &w->pg);
  if (rc < 0) {
    fprintf(stderr, "trainrun: rank %d: cannot create the process group: %s\n",
            l->rank, tr_strerror(rc));
    worker_dist_release(w);
    return rc;
  }
  rc = start_recorder(cfg, w->pg, prefix, &w->fr);
  if (rc < 0) /* the job runs on without a recorder */
    fprintf(stderr, "trainrun: rank %d: no flight recorder: %s\n", l->rank,
            tr_strerror(rc));
  tr_errmsg_t err;
  int tp = p->tensor_parallel_degree > 1, pp = p->pipeline_parallel_degree > 1;
  int cp = p->context_parallel_degree > 1;
  /* FSDP over dp_shard x cp under context parallelism (torchtitan) */
  int fsdp = p->data_parallel_shard_degree > 1 || cp;
  if (fsdp || tp || pp) { /* the job's mesh */
    rc = tr_compose_mesh(cfg, w->pg, &w->mesh, &err);
    if (rc == 0 && tp) tr_compose_tp(cfg, w->mesh, &w->tp);
    if (rc == 0 && cp && tr_compose_cp(cfg, w->mesh, &w->cp) < 0)
      rc = tr_errmsg_set(&err, TR_ECONFIG,
                         "parallelism.context_parallel_rotate_method: "
                         "unknown '%s'",
                         p->context_parallel_rotate_method);
    if (rc == 0 && pp) {
      int prc = tr_compose_pp(cfg, w->mesh, &w->pp);
      if (prc < 0) rc = tr_errmsg_set(&err, prc, "pipeline: %s", tr_strerror(prc));
    }
    if (rc == 0 && fsdp) /* FSDP, HSDP */
      rc = tr_compose_fsdp(cfg, w->mesh, &w->fsdp, &err);
    if (rc < 0) {
      fprintf(stderr, "trainrun: rank %d: %s\n", l->rank, err.message);
      worker_dist_release(w);
      return rc;
    }
    if (w->fsdp) {
      tr_fsdp_dp(w->fsdp, &w->dist);
      /* its sums cover dp x cp; the data's replicas are dp alone (the cp
       * ranks of one replica, consecutive in its shard group, read the
       * same samples) */
      int k = (int)p->context_parallel_degree;
      w->dist.dp_rank /= k;
      w->dist.dp_size /= k;
      return 0;
    }
  }
  /* DDP over the replicas: the world, or under TP / PP the dp_replicate
   * dim */
  tr_pg_t* dp = w->mesh ? tr_mesh_dim_pg(w->mesh, "dp_replicate") : w->pg;
  if (!dp) { /* tensor / pipeline parallel only: one replica */
    w->dist.dp_size = 1;
    return 0;
  }
  tr_ddp_opts_t dopts;
  tr_compose_ddp_opts(cfg, dp, &dopts);
  rc = tr_ddp_new(&dopts, &w->ddp);
  if (rc < 0) {
    fprintf(stderr, "trainrun: rank %d: %s\n", l->rank, tr_strerror(rc));
    worker_dist_release(w);
    return rc;
  }
  tr_ddp_dp(w->ddp, &w->dist);
  return 0;
}

/* [job] save_config_file: the resolved config as TOML (what `trainrun
 * config` prints; the secret left out), in the dump folder. */
static int save_config(const tr_config_t* cfg, tr_errmsg_t* err) {
  const char* dir = cfg->job.dump_folder;
  const char* name = cfg->job.save_config_file;
  TR_CHECK(tr__mkdir_p(dir, err));
  char* path = NULL;
  if (asprintf(&path, "%s/%s", dir, name) < 0)
    return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  FILE* f = fopen(path, "w");
  int rc = f ? tr_config_print_toml(cfg, f) : tr_err_from_errno();
  if (f && fclose(f) != 0 && rc == 0) rc = tr_err_from_errno();
  if (rc < 0)
    tr_errmsg_set(err, rc, "job.save_config_file: cannot write '%s': %s", path,
                  tr_strerror(rc));
  else
    printf("wrote the resolved config to %s\n", path);
  free(path);
  return rc;
}

/* [model] print_after_conversion: the parameter table of the model the
 * job builds (trainrun has no converters, so it is the model as built):
 * name, shape, elements. */
static int print_params(const tr_config_t* cfg, FILE* out, tr_errmsg_t* err) {
  tr_model_config_t mc;
  TR_CHECK(tr_compose_model_config(cfg, &mc, err));
  tr_model_t m;
  int rc = tr_model_init(&m, &mc); /* the table only: no tensor memory */
  if (rc < 0)
    return tr_errmsg_set(err, rc, "cannot build the model: %s",
                         tr_strerror(rc));
  fprintf(out, "model parameters (%d tensors, %lld elements; no converters):\n",
          m.n_params, (long long)tr_model_num_params(&m));
  for (int i = 0; i < m.n_params; i++) {
    const tr_param_t* p = &m.params[i];
    int64_t n = 1;
    fprintf(out, "  %-48s [", p->name);
    for (int d = 0; d < p->ndim; d++) {
      fprintf(out, "%s%lld", d ? ", " : "", (long long)p->shape[d]);
      n *= p->shape[d];
    }
    fprintf(out, "] %lld\n", (long long)n);
  }
  tr_model_release(&m);
  return 0;
}

/* [debug] deterministic. The CPU kernels are deterministic already (fixed
 * reduction orders, no atomics, no algorithm search), so runs repeat bit
 * for bit with or without it; on GPUs it makes the kernels refuse their
 * non-deterministic choices (trainrun/kernels_cuda.h). */
static void deterministic_on(const tr_config_t* cfg, FILE* out) {
  tr_device_t dev;
  if (tr_config_device(cfg, 0, &dev, NULL) < 0 || dev.type == TR_DEV_CPU) {
    fprintf(out,
            "debug.deterministic: the CPU kernels are deterministic already "
            "(fixed reduction orders, no atomics): nothing to change\n");
    return;
  }
#ifdef HAVE_CUDA
  tr_kern_cuda_set_deterministic(1, cfg->debug.deterministic_warn_only);
  fprintf(out,
          "debug.deterministic: GEMMs take cuBLASLt's heuristic pick (no "
          "timed choice); cuDNN's attention backward writes dQ directly; "
          "where it cannot, %s\n",
          cfg->debug.deterministic_warn_only
              ? "its atomic form runs with a warning"
              : "the flash backward runs");
#endif
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
      tr__job_check(&cfg, launch.world_size, &err) < 0 ||
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
    if (strcmp(cfg.comm.mode, "fake_backend") == 0) {
      /* one process plays one rank of the fake world */
      launch.rank = (int)cfg.comm.fake_rank;
      launch.world_size = (int)cfg.comm.fake_world_size;
      tr_log_set_rank(launch.rank);
    }
    int first = launch.rank == 0;
    if (first) tr__job_notes(&cfg, stderr);
    if (cfg.job.print_config) tr_config_print_toml(&cfg, stdout);
    print_summary(&cfg, stdout);
    if (cfg.debug.deterministic) deterministic_on(&cfg, stdout);
    if (launch.world_size > 1 && strcmp(cfg.comm.mode, "fake_backend") == 0)
      printf(
          "comm.mode fake_backend: this process plays rank %d of %d; "
          "collectives complete without moving data: the step lines' mem "
          "is that rank's, the losses are not the job's\n",
          launch.rank, launch.world_size);
    fflush(stdout);
    keep_freed_memory();
    tr_errmsg_t terr;
    int stopped = 0;
    worker_dist_t wd = {0};
    tr_trainer_opts_t topts = {0};
    tr_trainer_settings_t ts;
    int trc = tr_compose_trainer(&cfg, (int)tr_param_int(TR_PARAM_LOCAL_RANK),
                                 &ts, &terr);
    if (trc == 0 && first && cfg.job.save_config_file)
      trc = save_config(&cfg, &terr);
    if (trc == 0 && first && cfg.model.print_after_conversion)
      trc = print_params(&cfg, stdout, &terr);
    if (trc < 0) fprintf(stderr, "trainrun: %s\n", terr.message);
    if (trc == 0 && launch.world_size > 1) {
      trc = worker_dist_init(&wd, &launch, &cfg);
      topts.dist = &wd.dist;
      if (wd.tp.pg) topts.tp = &wd.tp;
      if (wd.pp.pg) topts.pp = &wd.pp;
      if (wd.cp.pg) topts.cp = &wd.cp;
      topts.train_timeout_ms = cfg.comm.train_timeout_seconds * 1000;
    }
    if (trc < 0) {
      rc = tr__cmd_exit_code(trc);
    } else {
      trc = tr_train(&ts, &topts, &stopped, &terr);
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
