/* tests/check_recompute.c: activation checkpointing of the transformer
 * layers (model/recompute.c).
 *
 * Full, selective every-Nth-layer and selective "op" checkpointing give
 * losses and gradients bit-identical to keeping every activation, for the
 * GPT-2 and Llama-3 debug models over three SGD steps of two accumulated
 * micro-batches each (both forwards before both backwards, so records of
 * two micro-batches are alive at once); hooks still run once per block and
 * pass (the recomputation runs no forward hooks); eval (no_grad) is
 * unchanged. The peak host memory of a training step falls by about the
 * activations a layer saves, times the layers that drop them. The policy's
 * config strings and their errors. With FSDP over 2 ranks (through the
 * launcher, as tests/check_fsdp2_train.c runs it) full checkpointing gives
 * the same losses and final weights, bit for bit, as none. */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/procs.h"
#include "trainrun/error.h"
#include "trainrun/kernels.h"
#include "trainrun/model.h"
#include "trainrun/tensor.h"

static uint64_t rng_state = 7;
static int32_t rand_token(int V) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (int32_t)(z % (uint64_t)V);
}

typedef struct {
  tr_model_ac_mode_t mode;
  int every;
  const char* name;
} policy_t;

static const policy_t policies[] = {
    {TR_AC_NONE, 0, "none"},
    {TR_AC_FULL, 0, "full"},
    {TR_AC_LAYERS, 2, "selective 2"},
    {TR_AC_LAYERS, 3, "selective 3"},
    {TR_AC_OPS, 0, "selective op"},
};
enum { NPOL = sizeof policies / sizeof policies[0] };

static void make_model(tr_model_t* m, const char* name, const policy_t* p) {
  tr_model_config_t c;
  ck_assert_int_eq(tr_model_config_get(name, "debugmodel", &c), 0);
  ck_assert_int_eq(tr_model_init(m, &c), 0);
  ck_assert_int_eq(tr_model_alloc(m, TR_DEVICE_CPU), 0);
  ck_assert_int_eq(tr_model_init_weights(m, 1234), 0);
  ck_assert_int_eq(tr_model_set_activation_checkpoint(m, p->mode, p->every), 0);
}

/* hooks: count calls per point */
typedef struct {
  int n[TR_HOOK__COUNT];
} counts_t;
#define COUNTER(point)                                               \
  static int count_##point(void* a, tr_model_t* m, int b,            \
                           tr_model_mb_t* mb) {                      \
    (void)m;                                                         \
    (void)b;                                                         \
    (void)mb;                                                        \
    ((counts_t*)a)->n[point]++;                                      \
    return 0;                                                        \
  }
COUNTER(TR_HOOK_PRE_FORWARD)
COUNTER(TR_HOOK_POST_FORWARD)
COUNTER(TR_HOOK_PRE_BACKWARD)
COUNTER(TR_HOOK_POST_BACKWARD)

enum { STEPS = 3, NMB = 2, B = 2, T = 24 };

typedef struct {
  double loss[STEPS];
  float* grads[STEPS]; /* every parameter's grad, concatenated */
  size_t ngrad;
  float* weights; /* after the last step */
  counts_t hooks;
} run_t;

static void run_release(run_t* r) {
  for (int s = 0; s < STEPS; s++) free(r->grads[s]);
  free(r->weights);
}

static size_t total_numel(const tr_model_t* m) {
  size_t n = 0;
  for (int i = 0; i < m->n_params; i++)
    n += (size_t)tr_tensor_numel(&m->params[i].data);
  return n;
}

static void gather(const tr_model_t* m, int grads, float* out) {
  size_t off = 0;
  for (int i = 0; i < m->n_params; i++) {
    const tr_tensor_t* t = grads ? &m->params[i].grad : &m->params[i].data;
    size_t n = (size_t)tr_tensor_numel(t);
    memcpy(out + off, tr_tensor_data(t), n * sizeof(float));
    off += n;
  }
}

/* STEPS steps of NMB accumulated micro-batches and plain SGD */
static void train(const char* name, const policy_t* p, run_t* r) {
  memset(r, 0, sizeof *r);
  tr_model_t m;
  make_model(&m, name, p);
  tr_model_hook_fn fns[TR_HOOK__COUNT] = {
      count_TR_HOOK_PRE_FORWARD, count_TR_HOOK_POST_FORWARD,
      count_TR_HOOK_PRE_BACKWARD, count_TR_HOOK_POST_BACKWARD};
  for (int k = 0; k < TR_HOOK__COUNT; k++)
    ck_assert_int_eq(
        tr_model_add_hook(&m, (tr_hook_point_t)k, fns[k], &r->hooks), 0);
  int V = m.cfg.vocab_size;
  r->ngrad = total_numel(&m);
  rng_state = 7;
  for (int s = 0; s < STEPS; s++) {
    int32_t tok[NMB][B * T], tgt[NMB][B * T];
    for (int j = 0; j < NMB; j++)
      for (int i = 0; i < B * T; i++) {
        tok[j][i] = rand_token(V);
        tgt[j][i] = rand_token(V);
      }
    tr_model_mb_t mb[NMB];
    ck_assert_int_eq(tr_model_zero_grad(&m), 0);
    double sum = 0;
    for (int j = 0; j < NMB; j++) {
      ck_assert_int_eq(tr_model_mb_init(&m, &mb[j], B, T, tok[j], tgt[j]), 0);
      mb[j].loss_scale = 1.0f / (NMB * B * T);
      ck_assert_int_eq(tr_model_forward(&m, &mb[j], 0, m.n_blocks), 0);
      sum += mb[j].loss_sum;
    }
    for (int j = NMB - 1; j >= 0; j--) {
      ck_assert_int_eq(tr_model_backward(&m, &mb[j], 0, m.n_blocks), 0);
      tr_model_mb_release(&m, &mb[j]);
    }
    r->loss[s] = sum / (NMB * B * T);
    r->grads[s] = malloc(r->ngrad * sizeof(float));
    ck_assert_ptr_nonnull(r->grads[s]);
    gather(&m, 1, r->grads[s]);
    for (int i = 0; i < m.n_params; i++) {
      float* w = tr_tensor_data(&m.params[i].data);
      const float* g = tr_tensor_data(&m.params[i].grad);
      for (int64_t k = 0; k < tr_tensor_numel(&m.params[i].data); k++)
        w[k] -= 0.5f * g[k];
    }
  }
  r->weights = malloc(r->ngrad * sizeof(float));
  ck_assert_ptr_nonnull(r->weights);
  gather(&m, 0, r->weights);
  /* eval under the policy: no record, the same loss as a fresh forward */
  int32_t tok[B * T], tgt[B * T];
  for (int i = 0; i < B * T; i++) {
    tok[i] = rand_token(V);
    tgt[i] = rand_token(V);
  }
  tr_model_mb_t mb;
  ck_assert_int_eq(tr_model_mb_init(&m, &mb, B, T, tok, tgt), 0);
  mb.no_grad = 1;
  ck_assert_int_eq(tr_model_forward(&m, &mb, 0, m.n_blocks), 0);
  ck_assert_int_eq(tr_model_backward(&m, &mb, 0, m.n_blocks), TR_EINVAL);
  tr_model_mb_release(&m, &mb);
  tr_model_clear_hooks(&m);
  tr_model_release(&m);
}

static void bit_identical(const char* name) {
  run_t ref;
  train(name, &policies[0], &ref);
  /* the steps moved the loss: the comparison is not of constants */
  ck_assert(fabs(ref.loss[STEPS - 1] - ref.loss[0]) > 1e-3);
  tr_model_t probe;
  make_model(&probe, name, &policies[0]);
  int nb = probe.n_blocks;
  tr_model_release(&probe);
  for (int p = 1; p < NPOL; p++) {
    run_t r;
    train(name, &policies[p], &r);
    for (int s = 0; s < STEPS; s++) {
      ck_assert_msg(memcmp(&r.loss[s], &ref.loss[s], sizeof(double)) == 0,
                    "%s %s step %d: loss %.17g, none %.17g", name,
                    policies[p].name, s + 1, r.loss[s], ref.loss[s]);
      size_t bad = r.ngrad;
      for (size_t k = 0; k < r.ngrad && bad == r.ngrad; k++)
        if (memcmp(&r.grads[s][k], &ref.grads[s][k], sizeof(float)) != 0)
          bad = k;
      ck_assert_msg(bad == r.ngrad,
                    "%s %s step %d: grad element %zu is %.9g, none %.9g", name,
                    policies[p].name, s + 1, bad, r.grads[s][bad],
                    ref.grads[s][bad]);
    }
    ck_assert(memcmp(r.weights, ref.weights, r.ngrad * sizeof(float)) == 0);
    /* each block's hooks ran once per pass: (STEPS x NMB + 1 eval)
     * forwards and STEPS x NMB backwards; none during recomputation */
    int fw = (STEPS * NMB + 1) * nb, bw = STEPS * NMB * nb;
    ck_assert_int_eq(r.hooks.n[TR_HOOK_PRE_FORWARD], fw);
    ck_assert_int_eq(r.hooks.n[TR_HOOK_POST_FORWARD], fw);
    ck_assert_int_eq(r.hooks.n[TR_HOOK_PRE_BACKWARD], bw);
    ck_assert_int_eq(r.hooks.n[TR_HOOK_POST_BACKWARD], bw);
    run_release(&r);
  }
  run_release(&ref);
}

START_TEST(test_bit_identical_gpt2) { bit_identical("gpt2"); }
END_TEST

START_TEST(test_bit_identical_llama) { bit_identical("llama3"); }
END_TEST

/* ---- memory ---- */

static int step_peak_warm;

/* Peak host bytes of one forward + backward over the model, counted from
 * the micro-batch's creation. */
static int64_t step_peak(tr_model_t* m, int Bm, int Tm) {
  int32_t* tok = malloc(sizeof(int32_t) * (size_t)(Bm * Tm));
  int32_t* tgt = malloc(sizeof(int32_t) * (size_t)(Bm * Tm));
  ck_assert(tok && tgt);
  rng_state = 3;
  for (int i = 0; i < Bm * Tm; i++) {
    tok[i] = rand_token(m->cfg.vocab_size);
    tgt[i] = rand_token(m->cfg.vocab_size);
  }
  tr_mem_stats_t st;
  tr_mem_stats(TR_MEM_HOST, 0, &st);
  int64_t base = st.current_bytes;
  tr_mem_reset_peak(TR_MEM_HOST, 0);
  tr_model_mb_t mb;
  ck_assert_int_eq(tr_model_mb_init(m, &mb, Bm, Tm, tok, tgt), 0);
  ck_assert_int_eq(tr_model_forward(m, &mb, 0, m->n_blocks), 0);
  ck_assert_int_eq(tr_model_backward(m, &mb, 0, m->n_blocks), 0);
  tr_model_mb_release(m, &mb);
  tr_mem_stats(TR_MEM_HOST, 0, &st);
  if (!step_peak_warm) /* nothing left behind */
    ck_assert_int_eq(st.current_bytes, base);
  free(tok);
  free(tgt);
  return st.peak_bytes - base;
}

static void memory(const char* name) {
  tr_model_t m;
  make_model(&m, name, &policies[0]);
  const tr_model_config_t* c = &m.cfg;
  int Bm = 4, Tm = 64, L = c->n_layers;
  int64_t N = (int64_t)Bm * Tm, C = c->dim, F = c->ffn_dim;
  int64_t kv = (int64_t)c->n_kv_heads * c->head_dim;
  /* what a layer's record holds besides its input (fp32): the whole of it
   * goes under full checkpointing; the norm outputs and the GELU / SwiGLU
   * product under "op" */
  int64_t drop_full, drop_op;
  if (c->family == TR_MODEL_GPT2) {
    /* ln1, qkv, atty, x2, ln2 (C each, qkv 3C), fc, gelu (F each), the
     * norms' means and rstds, the attention's lse per head */
    drop_full = 4 * N * (7 * C + 2 * F + 4 + c->n_heads);
    drop_op = 4 * N * (2 * C + F);
  } else {
    /* h, q, atty, x2, h2 (C each), k, v, g, u, sw, rstd1, rstd2, lse */
    drop_full = 4 * N * (5 * C + 2 * kv + 3 * F + 2 + c->n_heads);
    drop_op = 4 * N * (2 * C + F);
  }
  int64_t peak[NPOL];
  step_peak_warm = 1; /* the RoPE tables are grown once, then kept */
  step_peak(&m, Bm, Tm);
  step_peak_warm = 0;
  for (int p = 0; p < NPOL; p++) {
    ck_assert_int_eq(
        tr_model_set_activation_checkpoint(&m, policies[p].mode,
                                           policies[p].every),
        0);
    peak[p] = step_peak(&m, Bm, Tm);
    fprintf(stderr, "%s %-12s peak %lld bytes (none - this: %lld)\n", name,
            policies[p].name, (long long)peak[p],
            (long long)(peak[0] - peak[p]));
  }
  /* full: all but the layer being recomputed drop their records */
  int64_t saved_full = peak[0] - peak[1];
  ck_assert_msg(saved_full >= (L - 1) * drop_full &&
                    saved_full <= (L + 1) * drop_full,
                "%s full saves %lld bytes; a layer drops %lld, %d layers",
                name, (long long)saved_full, (long long)drop_full, L);
  /* selective 2: half of the layers drop theirs */
  int64_t saved_2 = peak[0] - peak[2];
  ck_assert_msg(saved_2 >= (L / 2 - 1) * drop_full && saved_2 < saved_full,
                "%s selective 2 saves %lld bytes (full %lld)", name,
                (long long)saved_2, (long long)saved_full);
  /* op: every layer drops its norm outputs and MLP product */
  int64_t saved_op = peak[0] - peak[4];
  ck_assert_msg(saved_op >= (L - 1) * drop_op && saved_op <= (L + 1) * drop_op,
                "%s op saves %lld bytes; a layer drops %lld", name,
                (long long)saved_op, (long long)drop_op);
  tr_model_release(&m);
}

START_TEST(test_memory_gpt2) { memory("gpt2"); }
END_TEST

START_TEST(test_memory_llama) { memory("llama3"); }
END_TEST

/* ---- the policy ---- */

START_TEST(test_policy_config) {
  tr_model_t m;
  make_model(&m, "llama3", &policies[0]); /* 6 layers */
  tr_errmsg_t err;
  ck_assert_int_eq(
      tr_model_set_activation_checkpoint_config(&m, "selective", "2", &err), 0);
  ck_assert_int_eq(m.ac_mode, TR_AC_LAYERS);
  int want2[6] = {0, 1, 0, 1, 0, 1};
  for (int l = 0; l < 6; l++)
    ck_assert_int_eq(tr_model_ac_recomputes(&m, l), want2[l]);
  ck_assert_int_eq(
      tr_model_set_activation_checkpoint_config(&m, "Selective", "3", &err), 0);
  int want3[6] = {0, 0, 1, 0, 0, 1};
  for (int l = 0; l < 6; l++)
    ck_assert_int_eq(tr_model_ac_recomputes(&m, l), want3[l]);
  ck_assert_int_eq(
      tr_model_set_activation_checkpoint_config(&m, "full", "op", &err), 0);
  for (int l = 0; l < 6; l++) ck_assert_int_eq(tr_model_ac_recomputes(&m, l), 1);
  ck_assert_int_eq(
      tr_model_set_activation_checkpoint_config(&m, "selective", "op", &err),
      0);
  ck_assert_int_eq(m.ac_mode, TR_AC_OPS);
  ck_assert_int_eq(tr_model_ac_recomputes(&m, 0), 0);
  ck_assert_int_eq(
      tr_model_set_activation_checkpoint_config(&m, "none", "2", &err), 0);
  ck_assert_int_eq(m.ac_mode, TR_AC_NONE);
  /* errors name the key and leave the policy alone */
  static const struct {
    const char *mode, *opt, *msg;
  } bad[] = {
      {"selective", "0",
       "activation_checkpoint.selective_ac_option: expected 'op' or a "
       "positive number, got '0'"},
      {"selective", "2x",
       "activation_checkpoint.selective_ac_option: expected 'op' or a "
       "positive number, got '2x'"},
      {"selective", "-1",
       "activation_checkpoint.selective_ac_option: expected 'op' or a "
       "positive number, got '-1'"},
      {"memory_budget", "2",
       "activation_checkpoint.mode: memory_budget needs a compiler's graph "
       "partitioner, which trainrun does not have; use none, selective or "
       "full"},
      {"fully", "2",
       "activation_checkpoint.mode: expected selective, full, memory_budget "
       "or none, got 'fully'"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    tr_errmsg_clear(&err);
    ck_assert_int_eq(tr_model_set_activation_checkpoint_config(
                         &m, bad[i].mode, bad[i].opt, &err),
                     TR_ECONFIG);
    ck_assert_str_eq(err.message, bad[i].msg);
    ck_assert_int_eq(m.ac_mode, TR_AC_NONE);
  }
  ck_assert_int_eq(tr_model_set_activation_checkpoint(&m, TR_AC_LAYERS, 0),
                   TR_EINVAL);
  ck_assert_int_eq(
      tr_model_set_activation_checkpoint(&m, (tr_model_ac_mode_t)7, 1),
      TR_EINVAL);
  ck_assert_int_eq(m.ac_mode, TR_AC_NONE);
  tr_model_release(&m);
}
END_TEST

/* ---- FSDP over 2 ranks through the launcher ---- */

#ifdef HAVE_GLOO
enum { FSTEPS = 4 };

static float* fsdp_run(const char* tag, const char* mode, double* loss,
                       size_t* nbytes) {
  char job[600], data[600], dump[400], dumparg[440];
  snprintf(job, sizeof job, "%s/examples/debug.toml", tp_srcdir());
  snprintf(data, sizeof data, "%s/examples/data/tinytales.txt", tp_srcdir());
  snprintf(dump, sizeof dump, "%s/%s", tp_tmpdir, tag);
  snprintf(dumparg, sizeof dumparg, "--job.dump_folder=%s", dump);
  char* a[] = {(char*)tp_bin("trainrun"),
               "--nproc-per-node",
               "2",
               job,
               "--training.steps",
               "4",
               "--metrics.log_freq",
               "1",
               "--training.local_batch_size",
               "2",
               "--training.seq_len",
               "16",
               "--parallelism.data_parallel_shard_degree",
               "-1",
               "--activation_checkpoint.mode",
               (char*)mode,
               "--validation.enable=false",
               "--debug.seed",
               "42",
               "--metrics.enable_jsonl=true",
               "--training.dataset_path",
               data,
               dumparg,
               NULL};
  char* env[] = {"TRAINRUN_LOG_LEVEL=info", "OMP_NUM_THREADS=1",
                 "OPENBLAS_NUM_THREADS=1", NULL};
  char *out, *err;
  int rc = tp_run(tag, a, env, &out, &err, 120);
  ck_assert_msg(rc == 0, "%s: exit %d\nstdout:\n%s\nstderr:\n%s", tag, rc, out,
                err);
  ck_assert_msg(strstr(out, "fsdp: 7 groups over 2 shard ranks") ||
                    strstr(err, "fsdp: 7 groups over 2 shard ranks"),
                "%s: not FSDP over 2:\n%s\n%s", tag, out, err);
  if (strcmp(mode, "full") == 0)
    ck_assert_msg(
        strstr(err, "activation checkpointing: full, layers 0, 1, 2, 3, 4, 5 "
                    "recompute") ||
            strstr(out, "activation checkpointing: full, layers 0, 1, 2, 3, "
                        "4, 5 recompute"),
        "%s: no checkpointing line:\n%s\n%s", tag, out, err);
  free(out);
  free(err);
  tp_read_losses(dump, loss, FSTEPS);
  char p[600];
  snprintf(p, sizeof p, "%s/model.safetensors", dump);
  FILE* f = fopen(p, "rb");
  ck_assert_msg(f != NULL, "no %s", p);
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  float* w = malloc((size_t)len);
  ck_assert_ptr_nonnull(w);
  ck_assert_int_eq(fread(w, 1, (size_t)len, f), len);
  fclose(f);
  *nbytes = (size_t)len;
  return w;
}

START_TEST(test_fsdp2_full_matches_none) {
  tp_tmpdir_make("check_recompute");
  double l0[FSTEPS], l1[FSTEPS];
  size_t n0, n1;
  float* w0 = fsdp_run("none", "none", l0, &n0);
  float* w1 = fsdp_run("full", "full", l1, &n1);
  for (int s = 0; s < FSTEPS; s++)
    ck_assert_msg(l0[s] == l1[s], "step %d: loss %.17g with full, %.17g none",
                  s + 1, l1[s], l0[s]);
  ck_assert(l0[FSTEPS - 1] < l0[0]); /* it trained */
  ck_assert_int_eq(n0, n1);
  ck_assert_msg(memcmp(w0, w1, n0) == 0, "final weights differ");
  free(w0);
  free(w1);
  tp_cleanup();
}
END_TEST
#endif

static Suite* recompute_suite(void) {
  Suite* s = suite_create("recompute");
  TCase* tc = tcase_create("model");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_policy_config);
  tcase_add_test(tc, test_bit_identical_gpt2);
  tcase_add_test(tc, test_bit_identical_llama);
  tcase_add_test(tc, test_memory_gpt2);
  tcase_add_test(tc, test_memory_llama);
  suite_add_tcase(s, tc);
#ifdef HAVE_GLOO
  tc = tcase_create("fsdp2");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_fsdp2_full_matches_none);
  suite_add_tcase(s, tc);
#endif
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(recompute_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
