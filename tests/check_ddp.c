/* tests/check_ddp.c: data-parallel training (trainrun/ddp.h) on forked
 * ranks over Gloo: the bucketed all-reduce issued from the backward hooks
 * of the last micro-step gives the same bits as issuing it after the
 * backward, every replica holds the same weights, and two ranks train like
 * one rank with the same global batch. With [metrics] comm_overlap a
 * whole run (tr_train) reports the all-reduce time per step and the
 * fraction hidden, on the step line and in metrics.jsonl, and trains to
 * the same bits as without it. The grads are views of the buckets. */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/fixtures.h" /* temporary folder, corpus, tiny models */
#include "tests/pg_suite.h" /* forked ranks around a store */
#include "trainrun/ddp.h"
#include "trainrun/error.h"
#include "trainrun/trainer.h"

enum { STEPS = 3 };

/* What a rank trains; set by the parent before pg_spawn (the forks inherit
 * it). */
static tr_config_t g_cfg;
static tr_model_config_t g_model;
static int g_overlap;
static const char* g_out; /* results go to <g_out>.r<rank> */

static void setup(void) { fx_tmpdir_make("check_ddp"); }

/* A config for world size `world`: a global batch of 8 sequences of 16
 * tokens, 2 per micro-step (2 ranks: 2 accumulation steps each). */
static void make_cfg(int world) {
  static const char* const kv[] = {"training.local_batch_size",
                                   "2",
                                   "training.global_batch_size",
                                   "8",
                                   "training.seq_len",
                                   "16",
                                   "training.steps",
                                   "3",
                                   "lr_scheduler.warmup_steps",
                                   "0",
                                   "validation.enable",
                                   "false",
                                   NULL};
  fx_make_cfg_world(&g_cfg, world, kv);
}

/* One rank: STEPS steps with 4 KiB buckets (many of them), then the
 * losses and every parameter's bytes into <g_out>.r<rank>. */
static void ddp_body(tr_pg_t* world, pg_ctx_t* ctx) {
  tr_ddp_opts_t o;
  tr_ddp_opts_init(&o);
  PCHECK(o.overlap == 1);
  o.pg = world;
  o.bucket_bytes = 4096;
  o.overlap = g_overlap;
  tr_ddp_t* d;
  PCHECK_RC(tr_ddp_new(&o, &d));
  tr_dp_t dist;
  tr_ddp_dp(d, &dist);
  PCHECK(dist.dp_rank == ctx->rank && dist.dp_size == ctx->size);
  tr_trainer_settings_t ts;
  PCHECK_RC(fx_settings(&g_cfg, &g_model, &ts));
  tr_trainer_opts_t to = {.dist = &dist, .quiet = 1};
  tr_trainer_t t;
  tr_errmsg_t err;
  int rc = tr_trainer_init(&t, &ts, &to, &err);
  if (rc < 0) fprintf(stderr, "rank %d: %s\n", ctx->rank, err.message);
  PCHECK(rc == 0);
  PCHECK(t.grad_accum == 4 / ctx->size);
  double loss[STEPS];
  for (int s = 0; s < STEPS; s++) {
    tr_step_stats_t st;
    rc = tr_trainer_step(&t, &st, &err);
    if (rc < 0) fprintf(stderr, "rank %d: %s\n", ctx->rank, err.message);
    PCHECK(rc == 0);
    loss[s] = st.loss;
  }
  /* every bucket once a step; with overlap, all from the hooks (the last
   * one, holding the embedding, after the embedding's backward) */
  int nb = tr_ddp_nbuckets(d);
  PCHECK(nb > 4);
  PCHECK(tr_ddp_reduces(d) == (int64_t)STEPS * nb);
  PCHECK(tr_ddp_overlapped(d) == (g_overlap ? (int64_t)STEPS * nb : 0));
  /* the grads are views of the buckets (no second copy of them): as many
   * storages among them as buckets, each grad 16-byte aligned */
  const tr_storage_t* seen[256];
  int nseen = 0;
  for (int i = 0; i < t.model.n_params; i++) {
    const tr_tensor_t* g = &t.model.params[i].grad;
    if (!g->storage) continue;
    PCHECK(((uintptr_t)tr_tensor_data(g) & 15) == 0);
    int k = 0;
    while (k < nseen && seen[k] != g->storage) k++;
    if (k == nseen) {
      PCHECK(nseen < 256);
      seen[nseen++] = g->storage;
    }
  }
  PCHECK(nseen == nb);
  char path[600];
  snprintf(path, sizeof path, "%s.r%d", g_out, ctx->rank);
  FILE* f = fopen(path, "wb");
  PCHECK(f != NULL);
  PCHECK(fwrite(loss, sizeof loss, 1, f) == 1);
  for (int i = 0; i < t.model.n_params; i++) {
    const tr_tensor_t* p = &t.model.params[i].data;
    PCHECK(fwrite(tr_tensor_data(p), tr_tensor_nbytes(p), 1, f) == 1);
  }
  PCHECK(fclose(f) == 0);
  tr_trainer_release(&t);
  tr_ddp_free(d);
}

/* Train on n ranks; the result files are <fx_path(tag)>.r<rank>. */
static void train(int n, const char* family, int overlap, const char* tag) {
  make_cfg(n);
  g_model = fx_tiny_model(family);
  g_overlap = overlap;
  g_out = fx_path(tag);
  int st[2];
  ck_assert_int_eq(pg_spawn(n, "gloo", TR_DEV_CPU, 1, 30000, ddp_body, 60, st),
                   0);
  for (int r = 0; r < n; r++)
    ck_assert_msg(st[r] == 0, "%s: rank %d of %d exited with %d", tag, r, n,
                  st[r]);
  tr_config_release(&g_cfg);
}

static uint8_t* result(const char* tag, int rank, size_t* n) {
  char name[64];
  snprintf(name, sizeof name, "%s.r%d", tag, rank);
  return fx_slurp(fx_path(name), n);
}

static const char* const families[] = {"gpt2", "llama3"};

START_TEST(test_overlap_same_bits) {
  /* gpt2: tied embeddings (the table's bucket is final only after the
   * embedding's backward); llama3: grouped-query attention, untied */
  const char* fam = families[_i];
  fx_write_corpus(fx_path("corpus.txt"), 20000);
  train(2, fam, 1, "overlap");
  train(2, fam, 0, "after");
  size_t n0, n1, m0;
  uint8_t* a0 = result("overlap", 0, &n0);
  uint8_t* a1 = result("overlap", 1, &n1);
  uint8_t* b0 = result("after", 0, &m0);
  ck_assert_uint_eq(n0, n1);
  ck_assert_uint_eq(n0, m0);
  ck_assert_msg(memcmp(a0, a1, n0) == 0, "%s: the replicas differ", fam);
  ck_assert_msg(memcmp(a0, b0, n0) == 0,
                "%s: overlapped all-reduce changed the results", fam);
  /* the weights moved: the comparison is not of untouched tensors */
  double loss[STEPS];
  memcpy(loss, a0, sizeof loss);
  ck_assert(isfinite(loss[0]) && loss[STEPS - 1] < loss[0]);
  free(a0);
  free(a1);
  free(b0);
}
END_TEST

START_TEST(test_two_ranks_like_one) {
  /* the same global batch of 8: 2 ranks x 2 micro-steps of 2 against 1 rank
   * x 4 micro-steps of 2 (sums in another order: close, not equal) */
  const char* fam = families[_i];
  fx_write_corpus(fx_path("corpus.txt"), 20000);
  train(2, fam, 1, "two");
  train(1, fam, 1, "one");
  size_t n2, n1;
  uint8_t* two = result("two", 0, &n2);
  uint8_t* one = result("one", 0, &n1);
  ck_assert_uint_eq(n1, n2);
  const double* l2 = (const double*)two;
  const double* l1 = (const double*)one;
  for (int s = 0; s < STEPS; s++) {
    double rel = fabs(l2[s] - l1[s]) / fabs(l1[s]);
    ck_assert_msg(rel <= 1e-5,
                  "%s step %d: loss %.12g on 2 ranks, %.12g on 1 (relative "
                  "difference %.3g)",
                  fam, s + 1, l2[s], l1[s], rel);
  }
  const float* w2 = (const float*)(two + STEPS * sizeof(double));
  const float* w1 = (const float*)(one + STEPS * sizeof(double));
  size_t nw = (n1 - STEPS * sizeof(double)) / sizeof(float);
  double worst = 0;
  for (size_t i = 0; i < nw; i++) {
    double dlt = fabs((double)w2[i] - (double)w1[i]);
    if (dlt > worst) worst = dlt;
  }
  /* lr 3e-3: three AdamW steps move a weight by up to ~1e-2 */
  ck_assert_msg(worst <= 1e-5, "%s: weights differ by up to %.3g", fam, worst);
  free(two);
  free(one);
}
END_TEST

/* ---- [metrics] comm_overlap ---- */

enum { TIMED_STEPS = 20 };

/* One rank of a whole run (tr_train) into g_out/: 4 KiB buckets; rank 0's
 * console lines go to g_out/console.txt. */
static void run_body(tr_pg_t* world, pg_ctx_t* ctx) {
  tr_ddp_opts_t o;
  tr_ddp_opts_init(&o);
  o.pg = world;
  o.bucket_bytes = 4096;
  o.comm_timing = g_cfg.metrics.comm_overlap; /* as the launcher does */
  tr_ddp_t* d;
  PCHECK_RC(tr_ddp_new(&o, &d));
  tr_dp_t dist;
  tr_ddp_dp(d, &dist);
  FILE* con = NULL;
  if (ctx->rank == 0) {
    char path[600];
    snprintf(path, sizeof path, "%s/console.txt", g_out);
    con = fopen(path, "w");
    PCHECK(con != NULL);
  }
  tr_trainer_settings_t ts;
  PCHECK_RC(fx_settings(&g_cfg, &g_model, &ts));
  tr_trainer_opts_t to = {.dist = &dist, .console = con, .quiet = con == NULL};
  tr_errmsg_t err;
  int stopped = -1;
  int rc = tr_train(&ts, &to, &stopped, &err);
  if (rc < 0) fprintf(stderr, "rank %d: %s\n", ctx->rank, err.message);
  PCHECK(rc == 0 && stopped == 0);
  PCHECK(tr_ddp_reduces(d) == (int64_t)TIMED_STEPS * tr_ddp_nbuckets(d));
  /* the trainer took the figures at every step's line */
  tr_pg_comm_t left;
  dist.comm_take(dist.arg, &left);
  PCHECK(left.steps == 0 && left.comm_ms == 0 && left.exposed_ms == 0);
  if (con) PCHECK(fclose(con) == 0);
  tr_ddp_free(d);
}

/* Run TIMED_STEPS steps on 2 ranks into fx_path(tag)/, logging every
 * step to metrics.jsonl, with or without [metrics] comm_overlap. */
static void run(const char* tag, int timed) {
  static char dump[600], steps[16];
  snprintf(dump, sizeof dump, "%s", fx_path(tag));
  snprintf(steps, sizeof steps, "%d", TIMED_STEPS);
  const char* const kv[] = {"training.local_batch_size",
                            "2",
                            "training.global_batch_size",
                            "8",
                            "training.seq_len",
                            "16",
                            "training.steps",
                            steps,
                            "validation.enable",
                            "false",
                            "metrics.log_freq",
                            "1",
                            "metrics.enable_jsonl",
                            "true",
                            "metrics.comm_overlap",
                            timed ? "true" : "false",
                            "job.dump_folder",
                            dump,
                            NULL};
  fx_make_cfg_world(&g_cfg, 2, kv);
  g_model = fx_tiny_model("gpt2");
  g_out = dump;
  ck_assert_int_eq(mkdir(dump, 0755), 0); /* rank 0's console.txt */
  int st[2];
  ck_assert_int_eq(pg_spawn(2, "gloo", TR_DEV_CPU, 1, 30000, run_body, 120, st),
                   0);
  for (int r = 0; r < 2; r++)
    ck_assert_msg(st[r] == 0, "%s: rank %d exited with %d", tag, r, st[r]);
  tr_config_release(&g_cfg);
}

/* The number after "key": in step's line of the text of a metrics.jsonl;
 * NaN when the line has no such key. */
static double jsonl_at(const char* text, int step, const char* key) {
  char k[64];
  snprintf(k, sizeof k, "{\"step\":%d,", step);
  const char* at = strstr(text, k);
  ck_assert_msg(at != NULL, "no step %d in:\n%s", step, text);
  const char* eol = strchr(at, '\n');
  ck_assert_ptr_nonnull(eol);
  snprintf(k, sizeof k, "\"%s\":", key);
  const char* v = strstr(at, k);
  return v && v < eol ? strtod(v + strlen(k), NULL) : NAN;
}

/* The tensor bytes of a safetensors file (after its header). */
static uint8_t* weights(const char* dump, size_t* n) {
  char p[600];
  snprintf(p, sizeof p, "%s/model.safetensors", dump);
  size_t len;
  uint8_t* b = fx_slurp(p, &len);
  uint64_t h;
  ck_assert_uint_ge(len, 8);
  memcpy(&h, b, 8);
  ck_assert_uint_le(8 + h, len);
  *n = len - 8 - (size_t)h;
  memmove(b, b + 8 + h, *n);
  return b;
}

/* Step lines of a console file, and how many carry the comm figures. */
static int step_lines(const char* dump, int* with_comm) {
  char p[600];
  snprintf(p, sizeof p, "%s/console.txt", dump);
  size_t len;
  char* text = (char*)fx_slurp(p, &len);
  int n = 0;
  *with_comm = 0;
  for (char* line = text; line && *line;) {
    char* eol = strchr(line, '\n');
    if (eol) *eol = '\0';
    if (strncmp(line, "step ", 5) == 0) {
      n++;
      *with_comm += strstr(line, " | comm ") && strstr(line, " ms hidden ");
    }
    line = eol ? eol + 1 : NULL;
  }
  free(text);
  return n;
}

START_TEST(test_comm_overlap) {
  fx_write_corpus(fx_path("corpus.txt"), 20000);
  run("timed", 1);
  run("plain", 0);
  size_t len;
  char* timed = (char*)fx_slurp(fx_path("timed/metrics.jsonl"), &len);
  char* plain = (char*)fx_slurp(fx_path("plain/metrics.jsonl"), &len);
  double hidden_sum = 0, first = 0, last = 0;
  for (int i = 1; i <= TIMED_STEPS; i++) {
    /* timing changes nothing the model computes */
    double loss = jsonl_at(timed, i, "loss");
    double want_loss = jsonl_at(plain, i, "loss");
    ck_assert_msg(loss == want_loss, "step %d: loss %.17g, untimed %.17g", i,
                  loss, want_loss);
    if (i == 1) first = loss;
    last = loss;
    double comm = jsonl_at(timed, i, "comm_ms");
    double exposed = jsonl_at(timed, i, "comm_exposed_ms");
    double hidden = jsonl_at(timed, i, "comm_hidden");
    ck_assert_msg(comm > 0, "step %d: comm_ms %g", i, comm);
    ck_assert_msg(exposed >= 0, "step %d: comm_exposed_ms %g", i, exposed);
    ck_assert_msg(hidden >= 0 && hidden <= 1, "step %d: comm_hidden %g", i,
                  hidden);
    /* hidden is what the waits did not cover */
    double want = 1 - exposed / comm;
    want = want < 0 ? 0 : want > 1 ? 1 : want;
    ck_assert_msg(fabs(hidden - want) < 1e-9, "step %d: hidden %g, want %g", i,
                  hidden, want);
    hidden_sum += hidden;
    ck_assert_msg(isnan(jsonl_at(plain, i, "comm_ms")) &&
                      isnan(jsonl_at(plain, i, "comm_hidden")),
                  "step %d: an untimed run reports comm figures", i);
  }
  /* training moved: the comparison is not of two constants */
  ck_assert(isfinite(first) && last < first);
  free(timed);
  free(plain);
  /* the step lines carry the figures exactly when asked for */
  int with_comm;
  ck_assert_int_eq(step_lines(fx_path("timed"), &with_comm), TIMED_STEPS);
  ck_assert_int_eq(with_comm, TIMED_STEPS);
  ck_assert_int_eq(step_lines(fx_path("plain"), &with_comm), TIMED_STEPS);
  ck_assert_int_eq(with_comm, 0);
  /* the final weights, bit for bit */
  size_t n0, n1;
  uint8_t* w0 = weights(fx_path("timed"), &n0);
  uint8_t* w1 = weights(fx_path("plain"), &n1);
  ck_assert_uint_eq(n0, n1);
  ck_assert_uint_gt(n0, 0);
  ck_assert_msg(memcmp(w0, w1, n0) == 0, "comm_overlap changed the weights");
  free(w0);
  free(w1);
  fprintf(stderr, "ddp comm overlap: mean hidden fraction %.3f over %d steps\n",
          hidden_sum / TIMED_STEPS, TIMED_STEPS);
}
END_TEST

static Suite* ddp_suite(void) {
  Suite* s = suite_create("ddp");
  TCase* tc = tcase_create("train");
  tcase_add_checked_fixture(tc, setup, fx_tmpdir_remove);
  tcase_set_timeout(tc, 180);
  tcase_add_loop_test(tc, test_overlap_same_bits, 0, 2);
  tcase_add_loop_test(tc, test_two_ranks_like_one, 0, 2);
  tcase_add_test(tc, test_comm_overlap);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(ddp_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
