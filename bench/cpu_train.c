/* bench/cpu_train.c: training throughput of a model on the CPU kernels —
 * forward, backward and AdamW per step, fp32 — printed as one table row.
 *
 *   cpu_train [-m gpt2] [-f 124M] [-B 4] [-T 64] [-n 10] [-t threads]
 *             [-g auto|blas|blocked] [-s seed] [--llmc DIR]
 *
 * Tokens are pseudo-random (a fixed function of the seed); step 0 warms up
 * (first allocations) and is not timed. --llmc DIR writes the same weights
 * and tokens in llm.c's formats (with -n 0, only that) (DIR/gpt2_124M.bin, version 3 with the vocab
 * padded to 50304, and DIR/dev/data/tinyshakespeare/tiny_shakespeare_*.bin)
 * so that llm.c's train_gpt2 can run the identical workload beside us; see
 * bench/llmc_compare.sh. AdamW uses llm.c's settings (lr 1e-4, betas 0.9 /
 * 0.999, eps 1e-8, no weight decay). */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "trainrun/error.h"
#include "trainrun/kernels.h"
#include "trainrun/model.h"
#include "trainrun/tensor.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint32_t tok_at(uint64_t seed, uint64_t i, int V) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 31)) * 0x94d049bb133111ebull;
  z ^= z >> 29;
  return (uint32_t)(z % (uint64_t)V);
}

static int mkdirs(const char* path) {
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", path);
  for (char* p = buf + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(buf, 0755) < 0 && errno != EEXIST) return -1;
      *p = '/';
    }
  return mkdir(buf, 0755) < 0 && errno != EEXIST ? -1 : 0;
}

/* llm.c's data shard: 256 int32 header (20240520, 1, count), uint16. */
static int write_tokens(const char* path, uint64_t seed, uint64_t first, int n,
                        int V) {
  FILE* f = fopen(path, "wb");
  if (!f) return -1;
  int32_t hdr[256] = {20240520, 1, n};
  fwrite(hdr, sizeof hdr, 1, f);
  for (int i = 0; i < n; i++) {
    uint16_t t = (uint16_t)tok_at(seed, first + (uint64_t)i, V);
    fwrite(&t, 2, 1, f);
  }
  return fclose(f);
}

static void put(FILE* f, const tr_model_t* m, const char* fmt, int layer,
                int64_t pad_rows) {
  char name[96];
  snprintf(name, sizeof name, fmt, layer);
  int i = tr_model_find_param(m, name);
  if (i < 0) {
    fprintf(stderr, "cpu_train: no parameter %s\n", name);
    exit(1);
  }
  const tr_tensor_t* t = &m->params[i].data;
  fwrite(tr_tensor_data(t), tr_tensor_nbytes(t), 1, f);
  int64_t row = t->ndim == 2 ? t->shape[1] : 1;
  float zero = 0.0f;
  for (int64_t k = 0; k < pad_rows * row; k++) fwrite(&zero, 4, 1, f);
}

/* llm.c checkpoint version 3: header, then the parameters in its order,
 * each layer-stacked; wte padded to Vp rows of zeros. */
static int write_llmc(const char* dir, const tr_model_t* m, uint64_t seed,
                      int B, int T) {
  const tr_model_config_t* c = &m->cfg;
  char path[1024];
  int Vp = (c->vocab_size + 127) / 128 * 128;
  snprintf(path, sizeof path, "%s/dev/data/tinyshakespeare", dir);
  if (mkdirs(path) < 0) return -1;
  snprintf(path, sizeof path, "%s/gpt2_124M.bin", dir);
  FILE* f = fopen(path, "wb");
  if (!f) return -1;
  int32_t hdr[256] = {20240326,    3,          c->max_seq_len, c->vocab_size,
                      c->n_layers, c->n_heads, c->dim,         Vp};
  fwrite(hdr, sizeof hdr, 1, f);
  put(f, m, "transformer.wte.weight", 0, Vp - c->vocab_size);
  put(f, m, "transformer.wpe.weight", 0, 0);
  static const char* per_layer[] = {"transformer.h.%d.ln_1.weight",
                                    "transformer.h.%d.ln_1.bias",
                                    "transformer.h.%d.attn.c_attn.weight",
                                    "transformer.h.%d.attn.c_attn.bias",
                                    "transformer.h.%d.attn.c_proj.weight",
                                    "transformer.h.%d.attn.c_proj.bias",
                                    "transformer.h.%d.ln_2.weight",
                                    "transformer.h.%d.ln_2.bias",
                                    "transformer.h.%d.mlp.c_fc.weight",
                                    "transformer.h.%d.mlp.c_fc.bias",
                                    "transformer.h.%d.mlp.c_proj.weight",
                                    "transformer.h.%d.mlp.c_proj.bias"};
  for (int k = 0; k < 12; k++)
    for (int l = 0; l < c->n_layers; l++) put(f, m, per_layer[k], l, 0);
  put(f, m, "transformer.ln_f.weight", 0, 0);
  put(f, m, "transformer.ln_f.bias", 0, 0);
  if (fclose(f) != 0) return -1;
  /* train: the batches we run (llm.c reads B*T+1 tokens per batch); val:
   * the first tokens again */
  int n = 64 * B * T + 1;
  snprintf(path, sizeof path,
           "%s/dev/data/tinyshakespeare/tiny_shakespeare_train.bin", dir);
  if (write_tokens(path, seed, 0, n, c->vocab_size) < 0) return -1;
  snprintf(path, sizeof path,
           "%s/dev/data/tinyshakespeare/tiny_shakespeare_val.bin", dir);
  return write_tokens(path, seed, 0, 8 * B * T + 1, c->vocab_size);
}

static void usage(void) {
  fprintf(stderr,
          "usage: cpu_train [-m gpt2|llama3] [-f flavor] [-B batch] [-T seq]\n"
          "                 [-n steps] [-t threads] [-g auto|blas|blocked]\n"
          "                 [-s seed] [--llmc DIR] [--header]\n");
  exit(2);
}

int main(int argc, char** argv) {
  const char* name = "gpt2";
  const char* flavor = "124M";
  const char* gemm = "auto";
  const char* llmc = NULL;
  int B = 4, T = 64, steps = 10, threads = 0, header = 0;
  uint64_t seed = 1337;
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--header")) {
      header = 1;
      continue;
    }
    if (!v) usage();
    if (!strcmp(a, "-m"))
      name = v;
    else if (!strcmp(a, "-f"))
      flavor = v;
    else if (!strcmp(a, "-B"))
      B = atoi(v);
    else if (!strcmp(a, "-T"))
      T = atoi(v);
    else if (!strcmp(a, "-n"))
      steps = atoi(v);
    else if (!strcmp(a, "-t"))
      threads = atoi(v);
    else if (!strcmp(a, "-g"))
      gemm = v;
    else if (!strcmp(a, "-s"))
      seed = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--llmc"))
      llmc = v;
    else
      usage();
    i++;
  }
  if (B < 1 || T < 1 || steps < 0 || (steps == 0 && !llmc)) usage();
  tr_gemm_impl_t impl = !strcmp(gemm, "blas")      ? TR_GEMM_BLAS
                        : !strcmp(gemm, "blocked") ? TR_GEMM_BLOCKED
                                                   : TR_GEMM_AUTO;
  if (tr_kern_cpu_set_gemm(impl) < 0) {
    fprintf(stderr, "cpu_train: gemm '%s' not available in this build\n", gemm);
    return 1;
  }
  if (threads > 0) tr_kern_cpu_set_num_threads(threads);

  tr_model_config_t cfg;
  if (tr_model_config_get(name, flavor, &cfg) < 0) return 1;
  tr_model_t m;
  int rc = tr_model_init(&m, &cfg);
  if (rc == 0) rc = tr_model_alloc(&m, TR_DEVICE_CPU);
  if (rc == 0) rc = tr_model_init_weights(&m, seed);
  if (rc < 0) {
    fprintf(stderr, "cpu_train: model: %s\n", tr_strerror(rc));
    return 1;
  }
  if (llmc && write_llmc(llmc, &m, seed, B, T) < 0) {
    fprintf(stderr, "cpu_train: cannot write llm.c files under '%s': %s\n",
            llmc, strerror(errno));
    return 1;
  }
  if (steps == 0) { /* --llmc with -n 0: only write the files */
    tr_model_release(&m);
    return 0;
  }
  tr_tensor_t* mom = calloc((size_t)m.n_params, sizeof *mom);
  tr_tensor_t* vel = calloc((size_t)m.n_params, sizeof *vel);
  for (int i = 0; i < m.n_params; i++) {
    tr_param_t* p = &m.params[i];
    if (tr_tensor_zeros(&mom[i], TR_F32, TR_DEVICE_CPU, p->ndim, p->shape) <
            0 ||
        tr_tensor_zeros(&vel[i], TR_F32, TR_DEVICE_CPU, p->ndim, p->shape) <
            0) {
      fprintf(stderr, "cpu_train: out of memory for optimizer state\n");
      return 1;
    }
  }
  int32_t* tok = malloc(sizeof(int32_t) * (size_t)B * T);
  int32_t* tgt = malloc(sizeof(int32_t) * (size_t)B * T);
  double t_total = 0, first_loss = 0, last_loss = 0;
  for (int step = 0; step <= steps; step++) {
    /* llm.c's loader: batch k covers tokens [k*B*T, (k+1)*B*T] */
    uint64_t base = (uint64_t)step * B * T;
    for (int i = 0; i < B * T; i++) {
      tok[i] = (int32_t)tok_at(seed, base + (uint64_t)i, cfg.vocab_size);
      tgt[i] = (int32_t)tok_at(seed, base + (uint64_t)i + 1, cfg.vocab_size);
    }
    double t0 = now();
    tr_model_mb_t mb;
    rc = tr_model_mb_init(&m, &mb, B, T, tok, tgt);
    if (rc == 0) rc = tr_model_forward(&m, &mb, 0, m.n_blocks);
    if (rc == 0) rc = tr_model_zero_grad(&m);
    if (rc == 0) rc = tr_model_backward(&m, &mb, 0, m.n_blocks);
    double loss = tr_model_mb_loss(&mb);
    tr_model_mb_release(&m, &mb);
    tr_adamw_args_t a = {1e-4f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f, step + 1};
    for (int i = 0; rc == 0 && i < m.n_params; i++)
      rc = tr_kern_adamw(&m.params[i].data, &m.params[i].grad, &mom[i], &vel[i],
                         &a);
    if (rc < 0) {
      fprintf(stderr, "cpu_train: step %d: %s\n", step, tr_strerror(rc));
      return 1;
    }
    double dt = now() - t0;
    if (step == 0)
      first_loss = loss;
    else
      t_total += dt;
    last_loss = loss;
    if (getenv("CPU_TRAIN_VERBOSE"))
      fprintf(stderr, "step %d: loss %.6f (%.1f ms)\n", step, loss, dt * 1e3);
  }
  double ms = t_total / steps * 1e3;
  double tps = (double)B * T * steps / t_total;
  double tflops = tr_model_flops_per_token(&cfg, T) * tps / 1e12;
  tr_mem_stats_t st;
  tr_mem_stats(TR_MEM_HOST, 0, &st);
  if (header)
    printf("%-8s %-10s %3s %5s %3s %-7s %10s %10s %8s %9s %9s %9s\n", "model",
           "flavor", "B", "T", "thr", "gemm", "ms/step", "tokens/s", "TFLOP/s",
           "peak GiB", "loss0", "lossN");
  printf("%-8s %-10s %3d %5d %3d %-7s %10.1f %10.1f %8.4f %9.2f %9.4f %9.4f\n",
         name, flavor, B, T, tr_kern_cpu_num_threads(),
         tr_kern_cpu_gemm() == TR_GEMM_BLAS ? "openblas" : "blocked", ms, tps,
         tflops, st.peak_bytes / 1073741824.0, first_loss, last_loss);
  for (int i = 0; i < m.n_params; i++) {
    tr_tensor_release(&mom[i]);
    tr_tensor_release(&vel[i]);
  }
  free(mom);
  free(vel);
  free(tok);
  free(tgt);
  tr_model_release(&m);
  return 0;
}
