/* tests/parity/tr_parity.c: trainrun's side of the PyTorch parity check
 * (tests/parity/parity.py). Two commands:
 *
 *   tr_parity init --model NAME --flavor F [--n-kv-heads N] [--n-layers N]
 *                  [--tie 0|1] [--seed S] -o DIR
 *       build the model, initialise it from the seed and write
 *       DIR/model.safetensors (F32, Hugging Face names and layouts) and
 *       DIR/config.json, which transformers' from_pretrained loads;
 *
 *   tr_parity grad WEIGHTS BATCH OUT
 *       load WEIGHTS (a safetensors file whose metadata records the model
 *       config, as `init` writes it), read BATCH (safetensors with I32
 *       tensors "tokens" and "targets", both [B, T]; targets equal to -100
 *       are ignored), run one forward and backward in fp32 on the CPU and
 *       write OUT: every parameter's gradient of the mean loss under its
 *       Hugging Face name and layout (F32), with the loss ("loss", %.17g)
 *       and the count of scored targets ("n_valid") in the metadata.
 *
 * Exit codes: 0 success, 1 failure, 2 bad usage. Built by `make check`,
 * never installed. */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainrun/error.h"       /* TR_E*, tr_strerror */
#include "trainrun/errmsg.h"      /* tr_errmsg_t */
#include "trainrun/model.h"       /* tr_model_* */
#include "trainrun/safetensors.h" /* tr_st_*, tr_hf_write_config */
#include "trainrun/tensor.h"      /* tr_tensor_* */

static void usage(FILE* out) {
  fprintf(out,
          "usage: tr_parity init --model NAME --flavor F [--n-kv-heads N] "
          "[--n-layers N]\n"
          "                      [--tie 0|1] [--seed S] -o DIR\n"
          "       tr_parity grad WEIGHTS BATCH OUT\n");
}

static int parse_int(const char* flag, const char* s, long lo, long hi,
                     long* out) {
  char* end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) {
    fprintf(stderr,
            "tr_parity: %s: expected an integer in [%ld, %ld], got "
            "'%s'\n",
            flag, lo, hi, s);
    return -1;
  }
  *out = v;
  return 0;
}

static int cmd_init(int argc, char** argv) {
  const char *model = NULL, *flavor = NULL, *dir = NULL;
  long kv = 0, layers = 0, tie = -1, seed = 1234;
  for (int i = 1; i < argc; i += 2) {
    const char* a = argv[i];
    if (i + 1 >= argc) {
      fprintf(stderr, "tr_parity: init: %s needs a value\n", a);
      return 2;
    }
    const char* v = argv[i + 1];
    int bad = 0;
    if (strcmp(a, "--model") == 0)
      model = v;
    else if (strcmp(a, "--flavor") == 0)
      flavor = v;
    else if (strcmp(a, "-o") == 0)
      dir = v;
    else if (strcmp(a, "--n-kv-heads") == 0)
      bad = parse_int(a, v, 1, 4096, &kv);
    else if (strcmp(a, "--n-layers") == 0)
      bad = parse_int(a, v, 1, 4096, &layers);
    else if (strcmp(a, "--tie") == 0)
      bad = parse_int(a, v, 0, 1, &tie);
    else if (strcmp(a, "--seed") == 0)
      bad = parse_int(a, v, 0, LONG_MAX, &seed);
    else {
      fprintf(stderr, "tr_parity: init: unknown flag '%s'\n", a);
      return 2;
    }
    if (bad) return 2;
  }
  if (!model || !flavor || !dir) {
    fprintf(stderr, "tr_parity: init: --model, --flavor and -o are needed\n");
    return 2;
  }
  tr_model_config_t cfg;
  if (tr_model_config_get(model, flavor, &cfg) < 0) return 2;
  if (kv > 0) cfg.n_kv_heads = (int)kv;
  if (layers > 0) cfg.n_layers = (int)layers;
  if (tie >= 0) cfg.tie_embeddings = (int)tie;
  char msg[256] = "";
  if (tr_model_config_check(&cfg, msg, sizeof msg) < 0) {
    fprintf(stderr, "tr_parity: init: bad model config: %s\n", msg);
    return 2;
  }
  tr_model_t m;
  memset(&m, 0, sizeof m);
  tr_errmsg_t err;
  tr_errmsg_clear(&err);
  char path[4096];
  int rc = tr_model_init(&m, &cfg);
  if (rc == 0) rc = tr_model_alloc(&m, TR_DEVICE_CPU);
  if (rc == 0) rc = tr_model_init_weights(&m, (uint64_t)seed);
  if (rc < 0) {
    tr_errmsg_set(&err, rc, "cannot build the model: %s", tr_strerror(rc));
    goto out;
  }
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  rc = tr_st_export_model(&m, path, TR_F32, &err);
  if (rc < 0) goto out;
  snprintf(path, sizeof path, "%s/config.json", dir);
  rc = tr_hf_write_config(&cfg, path, &err);
out:
  tr_model_release(&m);
  if (rc < 0) {
    fprintf(stderr, "tr_parity: %s\n", err.message);
    return 1;
  }
  return 0;
}

/* Read the I32 [B, T] tensor `name` of f into a new array. */
static int read_tokens(const tr_st_file_t* f, const char* name, int64_t* B,
                       int64_t* T, int32_t** out, tr_errmsg_t* err) {
  *out = NULL;
  const tr_st_tensor_t* e = tr_st_find(f, name);
  if (!e)
    return tr_errmsg_set(err, TR_EFORMAT, "'%s': no tensor '%s'", f->path,
                         name);
  if (e->dtype != TR_I32 || e->ndim != 2 || e->shape[0] < 1 ||
      e->shape[1] < 1 || e->shape[0] * e->shape[1] > INT32_MAX)
    return tr_errmsg_set(err, TR_EFORMAT,
                         "'%s': tensor '%s' must be a non-empty I32 [B, T]",
                         f->path, name);
  if (*B && (e->shape[0] != *B || e->shape[1] != *T))
    return tr_errmsg_set(err, TR_ESHAPE,
                         "'%s': tensor '%s' is [%" PRId64 ", %" PRId64
                         "], the tokens [%" PRId64 ", %" PRId64 "]",
                         f->path, name, e->shape[0], e->shape[1], *B, *T);
  *B = e->shape[0];
  *T = e->shape[1];
  int32_t* buf = malloc((size_t)(*B * *T) * sizeof *buf);
  if (!buf) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  tr_tensor_t dst;
  int rc = tr_tensor_wrap(&dst, buf, TR_I32, TR_DEVICE_CPU, 2, e->shape);
  if (rc < 0) {
    free(buf);
    return tr_errmsg_set(err, rc, "'%s': %s", f->path, tr_strerror(rc));
  }
  rc = tr_st_read(f, e, &dst, err);
  tr_tensor_release(&dst);
  if (rc < 0) {
    free(buf);
    return rc;
  }
  *out = buf;
  return 0;
}

static int cmd_grad(int argc, char** argv) {
  if (argc != 4) {
    usage(stderr);
    return 2;
  }
  const char *weights = argv[1], *batch = argv[2], *out = argv[3];
  tr_errmsg_t err;
  tr_errmsg_clear(&err);
  tr_model_config_t cfg;
  tr_model_t m;
  memset(&m, 0, sizeof m);
  tr_st_file_t wf, bf;
  memset(&wf, 0, sizeof wf);
  memset(&bf, 0, sizeof bf);
  int32_t *tokens = NULL, *targets = NULL;
  int64_t B = 0, T = 0;
  tr_st_item_t* items = NULL;
  tr_model_mb_t mb;
  int have_mb = 0;

  int rc = tr_st_open(&wf, weights, &err);
  if (rc == 0) rc = tr_st_model_config(&wf, &cfg, &err);
  tr_st_release(&wf);
  if (rc < 0) goto out;
  rc = tr_model_init(&m, &cfg);
  if (rc == 0) rc = tr_model_alloc(&m, TR_DEVICE_CPU);
  if (rc < 0) {
    tr_errmsg_set(&err, rc, "cannot build the model: %s", tr_strerror(rc));
    goto out;
  }
  TR_CHECK_GOTO(tr_st_import_model(&m, weights, &err), rc, out);
  TR_CHECK_GOTO(tr_st_open(&bf, batch, &err), rc, out);
  TR_CHECK_GOTO(read_tokens(&bf, "tokens", &B, &T, &tokens, &err), rc, out);
  TR_CHECK_GOTO(read_tokens(&bf, "targets", &B, &T, &targets, &err), rc, out);

  rc = tr_model_mb_init(&m, &mb, (int)B, (int)T, tokens, targets);
  if (rc < 0) {
    tr_errmsg_set(&err, rc, "'%s': bad batch: %s", batch, tr_strerror(rc));
    goto out;
  }
  have_mb = 1;
  rc = tr_model_zero_grad(&m);
  if (rc == 0) rc = tr_model_forward(&m, &mb, 0, m.n_blocks);
  if (rc == 0) rc = tr_model_backward(&m, &mb, 0, m.n_blocks);
  if (rc < 0) {
    tr_errmsg_set(&err, rc, "forward/backward: %s", tr_strerror(rc));
    goto out;
  }

  items = calloc((size_t)m.n_params + 1, sizeof *items);
  if (!items) {
    rc = tr_errmsg_set(&err, TR_ENOMEM, "out of memory");
    goto out;
  }
  for (int i = 0; i < m.n_params; i++) {
    items[i].name = m.params[i].name;
    items[i].tensor = &m.params[i].grad;
    items[i].transpose = m.params[i].hf_layout == TR_HF_TRANSPOSED;
  }
  char loss[64], nvalid[32];
  snprintf(loss, sizeof loss, "%.17g", tr_model_mb_loss(&mb));
  snprintf(nvalid, sizeof nvalid, "%" PRId64, mb.n_valid);
  const char* meta[] = {"format", "pt", "loss", loss, "n_valid", nvalid};
  rc = tr_st_write(out, items, (size_t)m.n_params, TR_F32, meta, 3, &err);
out:
  if (have_mb) tr_model_mb_release(&m, &mb);
  free(items);
  free(tokens);
  free(targets);
  tr_st_release(&bf);
  tr_model_release(&m);
  if (rc < 0) {
    fprintf(stderr, "tr_parity: %s\n", err.message);
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc >= 2 && strcmp(argv[1], "init") == 0)
    return cmd_init(argc - 1, argv + 1);
  if (argc >= 2 && strcmp(argv[1], "grad") == 0)
    return cmd_grad(argc - 1, argv + 1);
  usage(stderr);
  return 2;
}
