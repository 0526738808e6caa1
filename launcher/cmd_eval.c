/* launcher/cmd_eval.c: `trainrun eval JOB.toml --weights FILE`, the mean
 * loss of a safetensors checkpoint over the job's validation data. */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launcher/commands.h"
#include "trainrun/config.h"
#include "trainrun/error.h"
#include "trainrun/safetensors.h"
#include "trainrun/trainer.h"

static void eval_usage(FILE* out) {
  fprintf(out,
          "usage: trainrun eval JOB.toml --weights FILE [--section.key value "
          "...]\n"
          "\n"
          "Load FILE (safetensors with Hugging Face names, e.g. the "
          "model.safetensors a\n"
          "run writes) into the job's [model] and print the mean loss over "
          "its validation\n"
          "data: validation.dataset_path, or the last "
          "validation.split_fraction of\n"
          "training.dataset_path; validation.steps batches of "
          "validation.local_batch_size\n"
          "x validation.seq_len (-1: all of it).\n");
}

int tr_cmd_eval(int argc, char** argv) {
  const char* path = NULL;
  const char* weights = NULL;
  int n = 0, rc = 0;
  char** overrides = calloc((size_t)argc + 1, sizeof *overrides);
  if (!overrides) {
    fprintf(stderr, "trainrun: %s\n", tr_strerror(TR_ENOMEM));
    return 1;
  }
  for (int i = 1; i < argc;) {
    const char* a = argv[i];
    if (strcmp(a, "--weights") == 0) {
      if (i + 1 >= argc) {
        fprintf(stderr, "trainrun: eval: --weights needs a file\n");
        rc = 2;
        goto out;
      }
      weights = argv[i + 1];
      i += 2;
      continue;
    }
    if (strncmp(a, "--weights=", 10) == 0) {
      weights = a + 10;
      i++;
      continue;
    }
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      eval_usage(stdout);
      goto out;
    }
    int span = tr_config_arg_span(argc, argv, i);
    if (span > 0) {
      for (int j = 0; j < span; j++) overrides[n++] = argv[i + j];
      i += span;
      continue;
    }
    if (a[0] == '-' && a[1]) {
      fprintf(stderr, "trainrun: eval: unknown flag '%s'\n", a);
      rc = 2;
      goto out;
    }
    if (path) {
      fprintf(stderr, "trainrun: eval: more than one job file ('%s', '%s')\n",
              path, a);
      rc = 2;
      goto out;
    }
    path = a;
    i++;
  }
  if (!weights || !path) {
    fprintf(stderr, "trainrun: eval: %s\n",
            !path ? "no job file given" : "no --weights FILE given");
    eval_usage(stderr);
    rc = 2;
    goto out;
  }
  tr_config_t cfg;
  tr_config_error_t cerr;
  if (tr_config_load(&cfg, path, n, overrides, &cerr) < 0 ||
      tr_config_resolve(&cfg, 1, &cerr) < 0) {
    fprintf(stderr, "trainrun: %s\n", cerr.message);
    tr_config_release(&cfg);
    rc = 2;
    goto out;
  }
  tr_errmsg_t err;
  tr_errmsg_clear(&err);
  tr_model_config_t mc;
  tr_model_t m;
  memset(&m, 0, sizeof m);
  int r = tr_trainer_model_config(&cfg, &mc, &err);
  if (r == 0) {
    r = tr_model_init(&m, &mc);
    if (r == 0) r = tr_model_alloc(&m, TR_DEVICE_CPU);
    if (r < 0)
      tr_errmsg_set(&err, r, "cannot build the model: %s", tr_strerror(r));
  }
  if (r == 0) r = tr_st_import_model(&m, weights, &err);
  double loss = 0;
  int64_t ntok = 0;
  if (r == 0) r = tr_eval_loss(&m, &cfg, &loss, &ntok, &err);
  if (r < 0) {
    fprintf(stderr, "trainrun: %s\n", err.message);
    rc = tr__cmd_exit_code(r);
  } else {
    printf("val_loss %.4f (%" PRId64 " tokens, %s)\n", loss, ntok, weights);
    rc = fflush(stdout) == 0 ? 0 : 1;
  }
  tr_model_release(&m);
  tr_config_release(&cfg);
out:
  free(overrides);
  return rc;
}
