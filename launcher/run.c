/* launcher/run.c: `trainrun [flags] JOB.toml [overrides]`, the default
 * command: load and resolve the job config for the world it will run in,
 * report it in one line, then train (trainer/train.c: one rank until the
 * launcher spreads the job over devices and nodes). */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "launcher/commands.h"
#include "launcher/launch.h"
#include "trainrun/config.h"
#include "trainrun/error.h"
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

int tr_launch_job(int argc, char** argv) {
  /* torchrun's flags, the node daemon and the worker side of a process it
   * spawned (launcher/launch.c): -1 means "train here" */
  tr_launch_t launch;
  int lrc = tr__launch_prepare(&argc, argv, &launch);
  if (lrc >= 0) return lrc;
  const char* path = NULL;
  int n = 0, rc;
  char** overrides = calloc((size_t)argc + 1, sizeof *overrides);
  if (!overrides) {
    fprintf(stderr, "trainrun: %s\n", tr_strerror(TR_ENOMEM));
    return 1;
  }
  for (int i = 0; i < argc;) {
    const char* a = argv[i];
    int span = tr_config_arg_span(argc, argv, i);
    if (span > 0) {
      for (int j = 0; j < span; j++) overrides[n++] = argv[i + j];
      i += span;
      continue;
    }
    if (a[0] == '-' && a[1]) {
      fprintf(stderr, "trainrun: unknown flag '%s' (see trainrun --help)\n", a);
      rc = 2;
      goto out;
    }
    if (path) {
      fprintf(stderr, "trainrun: more than one job file ('%s', '%s')\n", path,
              a);
      rc = 2;
      goto out;
    }
    struct stat st;
    if (!strchr(a, '.') && !strchr(a, '/') && stat(a, &st) != 0) {
      /* a word that is no file: most likely a mistyped command */
      fprintf(stderr, "trainrun: unknown command '%s' (see trainrun --help)\n",
              a);
      rc = 2;
      goto out;
    }
    path = a;
    i++;
  }
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
  tr_config_error_t err;
  /* the world this process is one rank of (1 unless a daemon spawned it) */
  if (tr_config_load(&cfg, path, n, overrides, &err) < 0 ||
      tr_config_resolve(&cfg, launch.world_size, &err) < 0) {
    fprintf(stderr, "trainrun: %s\n", err.message);
    rc = 2;
  } else {
    if (cfg.job.print_config) tr_config_print_toml(&cfg, stdout);
    print_summary(&cfg, stdout);
    fflush(stdout);
    tr_errmsg_t terr;
    int stopped = 0;
    int trc = tr_train(&cfg, NULL, &stopped, &terr);
    if (trc < 0) {
      fprintf(stderr, "trainrun: %s\n", terr.message);
      rc = tr__cmd_exit_code(trc);
    } else {
      rc = fflush(stdout) == 0 ? 0 : 1;
    }
  }
  tr_config_release(&cfg);
out:
  free(overrides);
  return rc;
}
