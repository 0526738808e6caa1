/* launcher/cmd_eval.c: `trainrun eval JOB.toml --weights FILE`, the mean
 * loss of a safetensors checkpoint over the job's validation data. */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launcher/commands.h"
#include "launcher/compose.h" /* the model and validation data of the job */
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

/* eval's own flags (launcher/jobargs.c asks): --weights FILE. */
static int eval_flag(void* arg, int argc, char** argv, int i, int* code) {
  const char** weights = arg;
  const char* a = argv[i];
  if (strcmp(a, "--weights") == 0) {
    if (i + 1 >= argc) {
      fprintf(stderr, "trainrun: eval: --weights needs a file\n");
      *code = 2;
      return -1;
    }
    *weights = argv[i + 1];
    return 2;
  }
  if (strncmp(a, "--weights=", 10) == 0) {
    *weights = a + 10;
    return 1;
  }
  if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
    eval_usage(stdout);
    *code = 0;
    return -1;
  }
  return 0;
}

int tr_cmd_eval(int argc, char** argv) {
  const char* weights = NULL;
  tr__jobargs_opts_t o = {
      .cmd = "eval", .first = 1, .flag = eval_flag, .arg = &weights};
  tr__jobargs_t ja;
  int rc = tr__jobargs_parse(&ja, argc, argv, &o);
  if (rc >= 0) return rc;
  const char* path = ja.path;
  rc = 0;
  if (!weights || !path) {
    fprintf(stderr, "trainrun: eval: %s\n",
            !path ? "no job file given" : "no --weights FILE given");
    eval_usage(stderr);
    rc = 2;
    goto out;
  }
  tr_config_t cfg;
  tr_errmsg_t cerr;
  if (tr_config_load(&cfg, path, ja.n, ja.overrides, &cerr) < 0 ||
      tr_config_resolve(&cfg, 1, &cerr) < 0) {
    fprintf(stderr, "trainrun: %s\n", cerr.message);
    tr_config_release(&cfg);
    rc = 2;
    goto out;
  }
  tr_errmsg_t err;
  tr_errmsg_clear(&err);
  tr_model_t m;
  memset(&m, 0, sizeof m);
  tr_trainer_settings_t ts; /* the model and the validation data */
  int r = tr_compose_trainer(&cfg, -1, &ts, &err); /* on the CPU */
  if (r == 0) {
    r = tr_model_init(&m, &ts.model);
    if (r == 0) r = tr_model_alloc(&m, TR_DEVICE_CPU);
    if (r < 0)
      tr_errmsg_set(&err, r, "cannot build the model: %s", tr_strerror(r));
  }
  if (r == 0) r = tr_st_import_model(&m, weights, &err);
  double loss = 0;
  int64_t ntok = 0;
  if (r == 0) r = tr_eval_loss(&m, &ts, &loss, &ntok, &err);
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
  tr__jobargs_release(&ja);
  return rc;
}
