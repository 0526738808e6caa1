/* tests/check_pipelining.c: the schedule IR and the executor.
 *
 * The text form of actions both ways (PyTorch's `0F1`, `1UNSHARD`,
 * `3SEND_F1`) and what it refuses; the one-stage schedule (1F1B on one
 * stage); the executor running it equals the plain loop of forward and
 * backward per micro-batch bit for bit (gradients and losses, both
 * families), also with the split backward (I, and every W deferred to the
 * end as zero-bubble schedules do); malformed lists and unsupported actions are refused and leave
 * no micro-batch behind (allocator counters). */
#include "config.h"

#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "trainrun/error.h"
#include "trainrun/model.h"
#include "trainrun/pipelining.h"
#include "trainrun/tensor.h"

/* ---- the IR ---- */

START_TEST(t_action_text) {
  static const char* const ok[] = {
      "0F1",      "2I0", "1UNSHARD", "3SEND_F1", "0REDUCE_GRAD", "12RECV_B345",
      "0RESHARD", "1W7", "4B0",      "0SEND_B2", "5RECV_F9"};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    tr_pp_action_t a;
    ck_assert_msg(tr_pp_action_parse(ok[i], &a) == 0, "%s", ok[i]);
    char buf[48];
    ck_assert_str_eq(tr_pp_action_str(&a, buf, sizeof buf), ok[i]);
  }
  tr_pp_action_t a;
  ck_assert_int_eq(tr_pp_action_parse("3SEND_F1", &a), 0);
  ck_assert_int_eq(a.stage, 3);
  ck_assert_int_eq(a.type, TR_PP_SEND_F);
  ck_assert_int_eq(a.micro, 1);
  ck_assert_int_eq(tr_pp_action_parse("0REDUCE_GRAD", &a), 0);
  ck_assert_int_eq(a.type, TR_PP_REDUCE_GRAD);
  ck_assert_int_eq(a.micro, -1);
  static const char* const bad[] = {
      "",     "F1",   "0X1", "0F",     "0UNSHARD1",
      "0F1x", "-1F0", "0f1", "0SEND1", "0F99999999999999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    ck_assert_msg(tr_pp_action_parse(bad[i], &a) == TR_EINVAL, "'%s'", bad[i]);
}
END_TEST

START_TEST(t_one_stage_schedule) {
  tr_pp_action_t acts[6];
  ck_assert_int_eq(tr_pp_schedule_one_stage(3, acts), 0);
  char line[128] = "", buf[16];
  for (int i = 0; i < 6; i++) {
    if (i) strcat(line, " ");
    strcat(line, tr_pp_action_str(&acts[i], buf, sizeof buf));
  }
  ck_assert_str_eq(line, "0F0 0B0 0F1 0B1 0F2 0B2");
  ck_assert_int_eq(tr_pp_schedule_one_stage(0, acts), TR_EINVAL);
}
END_TEST

/* ---- the executor against the plain loop ---- */

enum { NMICRO = 3, B = 2, T = 8 };

static void tiny(tr_model_config_t* c, int llama) {
  ck_assert_int_eq(
      tr_model_config_get(llama ? "llama3" : "gpt2", "debugmodel", c), 0);
  c->vocab_size = 31;
  c->max_seq_len = 16;
  c->dim = 32;
  c->n_layers = 2;
  c->n_heads = 4;
  c->n_kv_heads = llama ? 2 : 4;
  c->head_dim = 8;
  c->ffn_dim = llama ? 64 : 128;
}

static int32_t g_tok[NMICRO][B * T], g_tgt[NMICRO][B * T];

/* A fresh model; a forward without gradients has built what a model keeps
 * for later passes (Llama's RoPE tables), so allocator counts taken after
 * it see only what a pass holds. */
static void make(tr_model_t* m, int llama) {
  tr_model_config_t c;
  tiny(&c, llama);
  ck_assert_int_eq(tr_model_init(m, &c), 0);
  ck_assert_int_eq(tr_model_alloc(m, TR_DEVICE_CPU), 0);
  ck_assert_int_eq(tr_model_init_weights(m, 7), 0);
  ck_assert_int_eq(tr_model_zero_grad(m), 0);
  tr_model_mb_t mb;
  ck_assert_int_eq(tr_model_mb_init(m, &mb, B, T, g_tok[0], g_tgt[0]), 0);
  mb.no_grad = 1;
  ck_assert_int_eq(tr_model_forward(m, &mb, 0, m->n_blocks), 0);
  tr_model_mb_release(m, &mb);
}

static void make_data(void) {
  uint32_t x = 12345;
  for (int i = 0; i < NMICRO; i++)
    for (int j = 0; j < B * T; j++) {
      x = x * 1103515245u + 12345u;
      g_tok[i][j] = (int32_t)((x >> 16) % 31);
      x = x * 1103515245u + 12345u;
      g_tgt[i][j] = (int32_t)((x >> 16) % 31);
    }
}

typedef struct {
  tr_model_t* m;
  double loss;
  int begins, ends;
} ctx_t;

static int cb_begin(void* arg, int64_t micro, tr_model_mb_t* mb) {
  ctx_t* c = arg;
  c->begins++;
  return tr_model_mb_init(c->m, mb, B, T, g_tok[micro], g_tgt[micro]);
}

static int cb_end(void* arg, int64_t micro, tr_model_mb_t* mb) {
  (void)micro;
  ctx_t* c = arg;
  c->ends++;
  c->loss += mb->loss_sum;
  return 0;
}

static void grads_equal(const tr_model_t* a, const tr_model_t* b) {
  for (int i = 0; i < a->n_params; i++) {
    const tr_tensor_t* ga = &a->params[i].grad;
    const tr_tensor_t* gb = &b->params[i].grad;
    ck_assert_msg(
        memcmp(tr_tensor_data((tr_tensor_t*)ga),
               tr_tensor_data((tr_tensor_t*)gb), tr_tensor_nbytes(ga)) == 0,
        "grad of %s differs", a->params[i].name);
  }
}

/* _i: bit 0 the family (Llama), bit 1 the split backward (I, then every W
 * at the end) instead of B */
START_TEST(t_executor_equals_loop) {
  int llama = _i & 1, split = (_i >> 1) & 1;
  make_data();
  tr_model_t ref, run;
  make(&ref, llama);
  make(&run, llama);
  /* the plain loop */
  double ref_loss = 0;
  for (int i = 0; i < NMICRO; i++) {
    tr_model_mb_t mb;
    ck_assert_int_eq(tr_model_mb_init(&ref, &mb, B, T, g_tok[i], g_tgt[i]), 0);
    ck_assert_int_eq(tr_model_forward(&ref, &mb, 0, ref.n_blocks), 0);
    ck_assert_int_eq(tr_model_backward(&ref, &mb, 0, ref.n_blocks), 0);
    ref_loss += mb.loss_sum;
    tr_model_mb_release(&ref, &mb);
  }
  /* the executor on the one-stage schedule */
  tr_mem_stats_t before, after;
  tr_mem_stats(TR_MEM_HOST, 0, &before);
  ctx_t fc = {.m = &run};
  tr_pp_action_t acts[3 * NMICRO];
  int nacts = 2 * NMICRO;
  if (split) { /* zero-bubble style: every W deferred to the end */
    static const char* const zb[] = {"0F0", "0I0", "0F1", "0I1", "0F2",
                                     "0I2", "0W0", "0W1", "0W2"};
    nacts = 3 * NMICRO;
    for (int k = 0; k < nacts; k++)
      ck_assert_int_eq(tr_pp_action_parse(zb[k], &acts[k]), 0);
  } else {
    ck_assert_int_eq(tr_pp_schedule_one_stage(NMICRO, acts), 0);
  }
  tr_pp_exec_t x = {.model = &run,
                    .first_block = 0,
                    .last_block = run.n_blocks,
                    .n_micro = NMICRO,
                    .mb_begin = cb_begin,
                    .mb_end = cb_end,
                    .arg = &fc};
  ck_assert_int_eq(tr_pp_exec_run(&x, acts, nacts), 0);
  tr_mem_stats(TR_MEM_HOST, 0, &after);
  ck_assert_int_eq(fc.begins, NMICRO);
  ck_assert_int_eq(fc.ends, NMICRO);
  ck_assert(fc.loss == ref_loss); /* the same sums, bit for bit */
  grads_equal(&ref, &run);
  /* every micro-batch's memory went back */
  ck_assert_int_eq(after.live_allocs, before.live_allocs);
  tr_model_release(&ref);
  tr_model_release(&run);
}
END_TEST

START_TEST(t_executor_refuses) {
  make_data();
  tr_model_t m;
  make(&m, 1);
  ctx_t fc = {.m = &m};
  tr_pp_exec_t x = {.model = &m,
                    .first_block = 0,
                    .last_block = m.n_blocks,
                    .n_micro = 2,
                    .mb_begin = cb_begin,
                    .mb_end = cb_end,
                    .arg = &fc};
  tr_mem_stats_t before, after;
  tr_mem_stats(TR_MEM_HOST, 0, &before);
  static const char* const lists[][3] = {
      {"0B0", NULL, NULL},        /* backward before forward */
      {"0F0", "0F0", NULL},       /* a second forward */
      {"0F2", NULL, NULL},        /* micro-batch out of range */
      {"1F0", NULL, NULL},        /* a second stage */
      {"0F0", "0F1", "0SEND_F0"}, /* communication: multi-stage only */
      {"0F0", "0W0", NULL},       /* W before its I */
      {"0F0", "0I0", "0B0"},      /* B after an I */
      {"0F0", "0I0", "0F1"},      /* ends with a W and a B owed */
  };
  static const int want[] = {TR_EINVAL,       TR_EINVAL, TR_EINVAL, TR_EINVAL,
                             TR_EUNSUPPORTED, TR_EINVAL, TR_EINVAL, TR_EINVAL};
  for (size_t l = 0; l < sizeof lists / sizeof lists[0]; l++) {
    tr_pp_action_t acts[3];
    int n = 0;
    for (; n < 3 && lists[l][n]; n++)
      ck_assert_int_eq(tr_pp_action_parse(lists[l][n], &acts[n]), 0);
    ck_assert_int_eq(tr_pp_exec_run(&x, acts, n), want[l]);
  }
  /* the forwards that ran were released with the failed lists */
  tr_mem_stats(TR_MEM_HOST, 0, &after);
  ck_assert_int_eq(after.live_allocs, before.live_allocs);
  ck_assert_int_eq(fc.ends, 0);
  tr_model_release(&m);
}
END_TEST

int main(void) {
  Suite* s = suite_create("pipelining");
  TCase* tc = tcase_create("ir");
  tcase_add_test(tc, t_action_text);
  tcase_add_test(tc, t_one_stage_schedule);
  suite_add_tcase(s, tc);
  tc = tcase_create("executor");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, t_executor_equals_loop, 0, 4);
  tcase_add_test(tc, t_executor_refuses);
  suite_add_tcase(s, tc);
  SRunner* r = srunner_create(s);
  srunner_run_all(r, CK_NORMAL);
  int nf = srunner_ntests_failed(r);
  srunner_free(r);
  return nf == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
