/* tests/check_ddp.c: data-parallel training (trainrun/ddp.h) on forked
 * ranks over Gloo: the bucketed all-reduce issued from the backward hooks
 * of the last micro-step gives the same bits as issuing it after the
 * backward, every replica holds the same weights, and two ranks train like
 * one rank with the same global batch. */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
  PCHECK_RC(tr_ddp_init(&o, &d));
  tr_trainer_dist_t dist;
  tr_ddp_dist(d, &dist);
  PCHECK(dist.dp_rank == ctx->rank && dist.dp_size == ctx->size);
  tr_trainer_opts_t to = {
      .model_override = &g_model, .dist = &dist, .quiet = 1};
  tr_trainer_t t;
  tr_errmsg_t err;
  int rc = tr_trainer_init(&t, &g_cfg, &to, &err);
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

static Suite* ddp_suite(void) {
  Suite* s = suite_create("ddp");
  TCase* tc = tcase_create("train");
  tcase_add_checked_fixture(tc, setup, fx_tmpdir_remove);
  tcase_set_timeout(tc, 180);
  tcase_add_loop_test(tc, test_overlap_same_bits, 0, 2);
  tcase_add_loop_test(tc, test_two_ranks_like_one, 0, 2);
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
