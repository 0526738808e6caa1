/* tests/check_pipelining.c: the schedule IR, the schedules and the
 * executor.
 *
 * The text form of actions both ways (PyTorch's `0F1`, `1UNSHARD`,
 * `3SEND_F1`, `(0F3;3B1)OVERLAP_F_B`) and what it refuses; the one-stage
 * schedule (1F1B on one stage); the generators' lists equal PyTorch's
 * own pipeline_order (tests/pipelining/fixtures, written by torch 2.11 with
 * tests/pipelining/gen_fixtures.py) for p in {2, 4}, m in {p, 2p, 8}, and
 * what they refuse; the validator's faults, each in PyTorch's words with
 * its Step x Rank grid; the simulator's bubble ((p-1)/(m+p-1), and
 * (p-1)/(vm+p-1) interleaved, the zero-bubble ones below), peak in-flight
 * micro-batches and deadlock;
 * PyTorch's compute_only CSV both ways, a bad cell as file:row:col;
 * torchtitan's stage split and the loop/V placement, and the layers that
 * do not split; the lowering (PyTorch's _add_unshard_reshard,
 * _add_reduce_grad, _add_send_recv, worked by hand on small cases; for
 * every generator the sends between two ranks in the receiver's order),
 * its deadlock and format errors; the Chrome trace of a simulated
 * timeline as PyTorch's _dump_chrometrace writes it; the
 * executor running the one-stage schedule equals the plain loop of
 * forward and backward per micro-batch bit for bit (gradients and losses,
 * both families), also with the split backward (I, and every W deferred
 * to the end as zero-bubble schedules do); malformed lists and
 * unsupported actions are refused and leave no micro-batch behind
 * (allocator counters). */
#include "config.h"

#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trainrun/error.h"
#include "trainrun/model.h"
#include "trainrun/pipelining.h"
#include "trainrun/tensor.h"

/* ---- the IR ---- */

START_TEST(t_action_text) {
  static const char* const ok[] = {"0F1",
                                   "2I0",
                                   "1UNSHARD",
                                   "3SEND_F1",
                                   "0REDUCE_GRAD",
                                   "12RECV_B345",
                                   "0RESHARD",
                                   "1W7",
                                   "4B0",
                                   "0SEND_B2",
                                   "5RECV_F9",
                                   "(0F3;3B1)OVERLAP_F_B",
                                   "(12F0;1I2)OVERLAP_F_B"};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    tr_pp_action_t a;
    ck_assert_msg(tr_pp_action_parse(ok[i], &a) == 0, "%s", ok[i]);
    char buf[TR_PP_ACTION_STRLEN];
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
  ck_assert_int_eq(tr_pp_action_parse("(0F3;3B1)OVERLAP_F_B", &a), 0);
  ck_assert_int_eq(a.type, TR_PP_OVERLAP_F_B);
  ck_assert_int_eq(a.stage, -1);
  ck_assert_int_eq(a.sub[0].stage, 0);
  ck_assert_int_eq(a.sub[0].type, TR_PP_F);
  ck_assert_int_eq(a.sub[0].micro, 3);
  ck_assert_int_eq(a.sub[1].stage, 3);
  ck_assert_int_eq(a.sub[1].type, TR_PP_B);
  ck_assert_int_eq(a.sub[1].micro, 1);
  static const char* const bad[] = {"",
                                    "F1",
                                    "0X1",
                                    "0F",
                                    "0UNSHARD1",
                                    "0F1x",
                                    "-1F0",
                                    "0f1",
                                    "0SEND1",
                                    "0F99999999999999999999",
                                    "0OVERLAP_F_B",
                                    "(0F3;3B1)",
                                    "(0F3,3B1)OVERLAP_F_B",
                                    "(3B1;0F3)OVERLAP_F_B",
                                    "(0F3;3B1)OVERLAP_F_Bx",
                                    "(0F3)OVERLAP_F_B",
                                    "(;3B1)OVERLAP_F_B"};
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

/* ---- schedules of every rank ---- */

static const char* srcdir(void) {
  const char* d = getenv("top_srcdir");
  return d && *d ? d : ".";
}

static int act_eq(const tr_pp_action_t* a, const tr_pp_action_t* b) {
  if (a->type != b->type) return 0;
  if (a->type == TR_PP_OVERLAP_F_B)
    for (int k = 0; k < 2; k++)
      if (a->sub[k].stage != b->sub[k].stage ||
          a->sub[k].type != b->sub[k].type ||
          a->sub[k].micro != b->sub[k].micro)
        return 0;
  return a->type == TR_PP_NONE ||
         (a->stage == b->stage && a->micro == b->micro);
}

/* a schedule from CSV text (rows separated by \n) */
static void from_csv(const char* text, tr_pp_schedule_t* s) {
  char err[256];
  int rc = tr_pp_csv_parse(text, strlen(text), "t.csv", s, err, sizeof err);
  ck_assert_msg(rc == 0, "%s", err);
}

/* The fixtures PyTorch's own generators wrote
 * (tests/pipelining/gen_fixtures.py, torch 2.11): _i picks the schedule,
 * every p in {2, 4} and m in {p, 2p, 8}. */
static const struct {
  tr_pp_kind_t kind;
  const char* file;
  int v, vee; /* stages per rank; the V placement */
} fixtures[] = {{TR_PP_GPIPE, "gpipe", 1, 0},
                {TR_PP_1F1B, "1f1b", 1, 0},
                {TR_PP_INTERLEAVED_1F1B, "interleaved1f1b", 2, 0},
                {TR_PP_LOOPED_BFS, "loopedbfs", 2, 0},
                {TR_PP_INTERLEAVED_ZB, "interleavedzb", 2, 0},
                {TR_PP_ZBV, "zbvzerobubble", 2, 1},
                {TR_PP_DUALPIPEV, "dualpipev", 2, 1}};

START_TEST(t_generators_equal_pytorch) {
  tr_pp_kind_t kind = fixtures[_i].kind;
  int v = fixtures[_i].v, checked = 0;
  tr_pp_schedule_t s_refused;
  for (int pp = 2; pp <= 4; pp += 2) {
    const int ms[] = {pp, 2 * pp, 8};
    for (int k = 0; k < 3; k++) {
      int m = ms[k];
      if (k == 2 && m == 2 * pp) continue; /* p = 4: 2p is 8 */
      char path[512], err[512];
      snprintf(path, sizeof path, "%s/tests/pipelining/fixtures/%s_p%d_m%d.csv",
               srcdir(), fixtures[_i].file, pp, m);
      FILE* f = fopen(path, "rb");
      if (kind == TR_PP_DUALPIPEV && m < 2 * pp) {
        /* refused by both (the fixtures' MANIFEST) */
        ck_assert_msg(f == NULL, "%s", path);
        ck_assert_int_eq(
            tr_pp_generate(&s_refused, kind, pp, m, v, err, sizeof err),
            TR_EINVAL);
        ck_assert_msg(strstr(err,
                             "DualPipeV requires at least as many "
                             "microbatches as stages") != NULL,
                      "%s", err);
        checked++;
        continue;
      }
      ck_assert_msg(f != NULL, "%s", path);
      static char text[1 << 16];
      size_t n = fread(text, 1, sizeof text - 1, f);
      fclose(f);
      text[n] = 0;
      /* the first line records the torch version and the class */
      ck_assert_msg(strncmp(text, "# torch 2.", 10) == 0, "%s", path);
      const char* rows = strchr(text, '\n') + 1;
      tr_pp_schedule_t want, got;
      ck_assert_int_eq(
          tr_pp_csv_parse(rows, strlen(rows), path, &want, err, sizeof err), 0);
      ck_assert_msg(tr_pp_generate(&got, kind, pp, m, v, err, sizeof err) == 0,
                    "%s", err);
      ck_assert_int_eq(want.n_ranks, pp);
      ck_assert_int_eq(got.n_ranks, pp);
      for (int r = 0; r < pp; r++) {
        tr_pp_action_t* mine = got.acts[r];
        int64_t len = got.len[r];
        tr_pp_action_t* lowered = NULL;
        if (fixtures[_i].v == 1) {
          /* PyTorch's single-stage pipeline_order went through
           * _add_reduce_grad: no idle slots, REDUCE_GRAD at the end */
          lowered = malloc((size_t)(len + 1) * sizeof *lowered);
          ck_assert_int_eq(tr_pp_add_reduce_grad(mine, len, m, lowered, &len),
                           0);
          mine = lowered;
        }
        ck_assert_msg(want.len[r] == len, "%s rank %d: %lld actions, not %lld",
                      path, r, (long long)want.len[r], (long long)len);
        for (int64_t t = 0; t < len; t++) {
          tr_pp_action_t w = want.acts[r][t];
          /* torch 2.11's Schedule1F1B lists its last rank's forwards one
           * micro-batch late (F1 B0 F2 B1 ... F<m> B<m-1>): a plan it
           * does not run; ours is F0 B0 F1 B1 ... */
          if (kind == TR_PP_1F1B && r == pp - 1 && w.type == TR_PP_F) w.micro--;
          char a[TR_PP_ACTION_STRLEN], b[TR_PP_ACTION_STRLEN];
          ck_assert_msg(act_eq(&w, &mine[t]),
                        "%s rank %d step %lld: %s, not %s", path, r,
                        (long long)t, tr_pp_action_str(&w, a, sizeof a),
                        tr_pp_action_str(&mine[t], b, sizeof b));
        }
        free(lowered);
      }
      /* and what PyTorch's validator accepts, ours accepts */
      int map[8];
      ck_assert_msg(
          tr_pp_validate(&got, pp, pp * v, m, map, err, sizeof err) == 0, "%s",
          err);
      for (int st = 0; st < pp * v; st++)
        ck_assert_int_eq(
            map[st], fixtures[_i].vee && st >= pp ? 2 * pp - 1 - st : st % pp);
      tr_pp_schedule_release(&want);
      tr_pp_schedule_release(&got);
      checked++;
    }
  }
  ck_assert_int_eq(checked, 5);
}
END_TEST

START_TEST(t_generators_refuse) {
  tr_pp_schedule_t s;
  char err[256];
  ck_assert_int_eq(tr_pp_generate(&s, TR_PP_1F1B, 4, 3, 1, err, sizeof err),
                   TR_EINVAL);
  ck_assert_str_eq(err,
                   "Number of microbatches (3) must be greater than or equal "
                   "to the number of stages (4).");
  ck_assert_int_eq(tr_pp_generate(&s, TR_PP_GPIPE, 2, 4, 2, err, sizeof err),
                   TR_EINVAL);
  ck_assert_str_eq(err, "GPipe runs 1 stage per rank, not 2");
  /* flex PP: 10 micro-batches over 4 ranks is 2 rounds of 5; 9 is not */
  ck_assert_int_eq(
      tr_pp_generate(&s, TR_PP_INTERLEAVED_1F1B, 4, 10, 2, err, sizeof err), 0);
  ck_assert_int_eq(tr_pp_validate(&s, 4, 8, 10, NULL, err, sizeof err), 0);
  tr_pp_schedule_release(&s);
  ck_assert_int_eq(
      tr_pp_generate(&s, TR_PP_INTERLEAVED_1F1B, 4, 9, 2, err, sizeof err),
      TR_EINVAL);
  ck_assert_str_eq(err,
                   "Interleaved 1F1B requires the number of microbatches to be "
                   "a multiple of the number of rounds (2), but got 9.");
  ck_assert_int_eq(
      tr_pp_generate(&s, TR_PP_LOOPED_BFS, 0, 4, 2, err, sizeof err),
      TR_EINVAL);
  tr_pp_kind_t k;
  ck_assert_int_eq(tr_pp_kind_parse("interleaved1f1b", &k), 0);
  ck_assert_int_eq(k, TR_PP_INTERLEAVED_1F1B);
  ck_assert_int_eq(tr_pp_kind_parse("GPIPE", &k), 0);
  ck_assert_int_eq(k, TR_PP_GPIPE);
  ck_assert_str_eq(tr_pp_kind_name(TR_PP_LOOPED_BFS), "LoopedBFS");
  ck_assert_int_eq(tr_pp_kind_parse("zbvzerobubble", &k), 0);
  ck_assert_int_eq(k, TR_PP_ZBV);
  ck_assert_int_eq(tr_pp_kind_parse("dualpipev", &k), 0);
  ck_assert_int_eq(k, TR_PP_DUALPIPEV);
  ck_assert_int_eq(tr_pp_kind_parse("PipelineScheduleMulti", &k), TR_ENOTFOUND);
  ck_assert_int_eq(tr_pp_generate(&s, TR_PP_ZBV, 2, 4, 1, err, sizeof err),
                   TR_EINVAL);
  ck_assert_str_eq(err, "ZBV requires exactly 2 stages per rank, but got 1.");
  ck_assert_int_eq(
      tr_pp_generate(&s, TR_PP_INTERLEAVED_ZB, 4, 9, 2, err, sizeof err),
      TR_EINVAL);
  ck_assert_str_eq(err,
                   "Zero bubble requires the number of microbatches to be a "
                   "multiple of the number of rounds (2), but got 9.");
}
END_TEST

/* ---- the validator ---- */

/* validate `csv` (pp ranks, n_stages, m) and expect err to hold `want` */
static void invalid(const char* csv, int pp, int n_stages, int m,
                    const char* want) {
  tr_pp_schedule_t s;
  from_csv(csv, &s);
  char err[4096];
  ck_assert_int_eq(tr_pp_validate(&s, pp, n_stages, m, NULL, err, sizeof err),
                   TR_EINVAL);
  ck_assert_msg(strstr(err, want) != NULL, "'%s' lacks '%s'", err, want);
  tr_pp_schedule_release(&s);
}

START_TEST(t_validate_grid) {
  tr_pp_schedule_t s;
  from_csv("0F0,,,0B0\n,1B0,1F0\n", &s);
  char err[4096];
  ck_assert_int_eq(tr_pp_validate(&s, 2, 2, 1, NULL, err, sizeof err),
                   TR_EINVAL);
  /* PyTorch's message and its _format_pipeline_order grid, byte for byte */
  ck_assert_str_eq(err,
                   "Rank 1, step 1: Running Full Backward for stage 1, "
                   "microbatch 0 without first running Forward\n\n"
                   "Full pipeline schedule:\n"
                   "        Rank 0 Rank 1\n"
                   "Step 0: 0F0          \n"
                   "Step 1:        1B0    <-- ERROR HERE\n"
                   "Step 2:        1F0   \n"
                   "Step 3: 0B0          \n");
  tr_pp_schedule_release(&s);
  /* two-digit steps: labels zero-filled, columns as wide as their cells */
  from_csv("0F0,0F1,0F2,0F3,0F4,0F5,0F6,0F7,0F8,0F9,0F10\n1F0\n", &s);
  char* grid = tr_pp_schedule_format(&s, -1);
  ck_assert_str_eq(grid,
                   "         Rank 0  Rank 1 \n"
                   "Step 00: 0F0     1F0    \n"
                   "Step 01: 0F1            \n"
                   "Step 02: 0F2            \n"
                   "Step 03: 0F3            \n"
                   "Step 04: 0F4            \n"
                   "Step 05: 0F5            \n"
                   "Step 06: 0F6            \n"
                   "Step 07: 0F7            \n"
                   "Step 08: 0F8            \n"
                   "Step 09: 0F9            \n"
                   "Step 10: 0F10           \n");
  free(grid);
  tr_pp_schedule_release(&s);
}
END_TEST

START_TEST(t_validate_faults) {
  invalid("0F0,0B0\n", 2, 2, 1,
          "Schedule has incorrect number of ranks - expected 2, actual 1");
  invalid("0F0,0B0,0F1\n1F0,1B0,0B1\n", 2, 2, 2,
          "Rank 1, step 2: Stage 0 is assigned to both rank 1 and rank 0");
  invalid("0F0,0B0,0F1\n1F0,1B0,0B1\n", 2, 2, 2, " <-- ERROR HERE\n");
  invalid("0I0,0F0\n", 1, 1, 1,
          "Rank 0, step 0: Running Backward Input for stage 0, microbatch 0 "
          "without first running Forward");
  invalid("0F0,0W0,0I0\n", 1, 1, 1,
          "Rank 0, step 1: Running Backward Weight for stage 0, microbatch 0 "
          "without first running Backward Input");
  invalid("0F0,0B0\n", 1, 1, 2, "Got 1 F microbatches for stage 0, expected 2");
  invalid("0F0,0I0\n", 1, 1, 1,
          "Invalid backward microbatches for stage 0: I and W must have equal "
          "counts, but got I=1, W=0");
  invalid("0F0,0F1,0B0\n", 1, 1, 2,
          "Invalid backward microbatches for stage 0: expected 2 total "
          "backwards, but got B=1, I=0, W=0");
  invalid("0F0,2F0\n", 1, 2, 1,
          "Rank 0, step 1: 2F0: stage 2 is not one of the 2 stages");
  invalid("(0F1;0B0)OVERLAP_F_B,0F0\n", 1, 1, 2,
          "Rank 0, step 0: Running Full Backward for stage 0, microbatch 0 "
          "without first running Forward");
  invalid("0F0,0F5\n", 1, 1, 2,
          "Rank 0, step 1: 0F5: microbatch 5 is not one of the 2 microbatches");
  /* the split backward that is right, with comms that only map stages */
  tr_pp_schedule_t s;
  from_csv("0F0,0SEND_F0,0I0,0W0,0F1,0B1\n", &s);
  char err[256];
  int map[1] = {-1};
  ck_assert_int_eq(tr_pp_validate(&s, 1, 1, 2, map, err, sizeof err), 0);
  ck_assert_int_eq(map[0], 0);
  tr_pp_schedule_release(&s);
}
END_TEST

/* ---- the simulator ---- */

static void simulate(tr_pp_kind_t k, int pp, int m, int v, tr_pp_sim_t* sim) {
  tr_pp_schedule_t s;
  char err[512];
  ck_assert_msg(tr_pp_generate(&s, k, pp, m, v, err, sizeof err) == 0, "%s",
                err);
  ck_assert_msg(tr_pp_simulate(&s, pp * v, sim, NULL, err, sizeof err) == 0,
                "%s", err);
  tr_pp_schedule_release(&s);
}

START_TEST(t_simulate_bubble) {
  tr_pp_sim_t sim;
  char pct[16];
  /* GPipe and 1F1B: (p - 1) / (m + p - 1); p = 4, m = 8: 27.3% */
  for (int k = 0; k < 2; k++) {
    simulate(k ? TR_PP_1F1B : TR_PP_GPIPE, 4, 8, 1, &sim);
    ck_assert_int_eq(sim.steps, 2 * (8 + 4 - 1));
    ck_assert_int_eq(sim.busy, 4 * 2 * 8);
    ck_assert_double_eq_tol(sim.bubble, 3.0 / 11.0, 1e-12);
    snprintf(pct, sizeof pct, "%.1f%%", 100 * sim.bubble);
    ck_assert_str_eq(pct, "27.3%");
    /* stage 0 holds p micro-batches under 1F1B, m under GPipe */
    ck_assert_int_eq(sim.peak_inflight[0], k ? 4 : 8);
    ck_assert_int_eq(sim.peak_inflight[3], k ? 1 : 8);
    tr_pp_sim_release(&sim);
  }
  /* Interleaved1F1B, v = 2: (p - 1) / (v m + p - 1) = 15.8% */
  simulate(TR_PP_INTERLEAVED_1F1B, 4, 8, 2, &sim);
  ck_assert_double_eq_tol(sim.bubble, 3.0 / 19.0, 1e-12);
  snprintf(pct, sizeof pct, "%.1f%%", 100 * sim.bubble);
  ck_assert_str_eq(pct, "15.8%");
  tr_pp_sim_release(&sim);
  /* the zero-bubble schedules (I and W a step each): p = 4, m = 8, v = 2,
   * 51 steps of which 3 idle per rank, 5.9%, below 1F1B's 27.3% */
  for (int k = 0; k < 2; k++) {
    simulate(k ? TR_PP_ZBV : TR_PP_INTERLEAVED_ZB, 4, 8, 2, &sim);
    ck_assert_int_eq(sim.steps, 51);
    ck_assert_double_eq_tol(sim.bubble, 3.0 / 51.0, 1e-12);
    ck_assert(sim.bubble < 3.0 / 11.0);
    tr_pp_sim_release(&sim);
  }
  /* DualPipeV, an OVERLAP_F_B one step: 34 steps, 11 of 136 idle */
  simulate(TR_PP_DUALPIPEV, 4, 8, 2, &sim);
  ck_assert_int_eq(sim.steps, 34);
  ck_assert_double_eq_tol(sim.bubble, 11.0 / 136.0, 1e-12);
  ck_assert(sim.bubble < 3.0 / 11.0);
  tr_pp_sim_release(&sim);
  /* 1F1B, p = 2, m = 2: the timeline it ran, idle slots where it waited */
  tr_pp_schedule_t s, tl;
  ck_assert_int_eq(tr_pp_generate(&s, TR_PP_1F1B, 2, 2, 1, NULL, 0), 0);
  char* csv = tr_pp_csv_format(&s);
  ck_assert_str_eq(csv, "0F0,0F1,,0B0,,0B1\r\n,1F0,1B0,1F1,1B1\r\n");
  free(csv);
  ck_assert_int_eq(tr_pp_simulate(&s, 2, &sim, &tl, NULL, 0), 0);
  csv = tr_pp_csv_format(&tl);
  ck_assert_str_eq(csv, "0F0,0F1,,0B0,,0B1\r\n,1F0,1B0,1F1,1B1\r\n");
  free(csv);
  tr_pp_sim_release(&sim);
  tr_pp_schedule_release(&tl);
  tr_pp_schedule_release(&s);
}
END_TEST

START_TEST(t_simulate_deadlock) {
  tr_pp_schedule_t s;
  from_csv("0F0,0B0\n1B0,1F0\n", &s);
  tr_pp_sim_t sim;
  char err[256];
  ck_assert_int_eq(tr_pp_simulate(&s, 2, &sim, NULL, err, sizeof err),
                   TR_EINVAL);
  ck_assert_str_eq(err,
                   "schedule is not progressing at step 1: rank 0 waits at "
                   "0B0; rank 1 waits at 1B0;");
  tr_pp_schedule_release(&s);
  from_csv("0F0,3B0\n", &s);
  ck_assert_int_eq(tr_pp_simulate(&s, 2, &sim, NULL, err, sizeof err),
                   TR_EINVAL);
  ck_assert_str_eq(err, "rank 0, step 1: 3B0 is outside 2 stages");
  tr_pp_schedule_release(&s);
}
END_TEST

/* Times for every rank's computations of s: back to back from t0 (rank r
 * starting r * lag later), F f seconds, B b, I and W b / 2; an
 * OVERLAP_F_B f + b. Idle slots and comms get none. */
static double** back_to_back(const tr_pp_schedule_t* s, double f, double b,
                             double lag) {
  double** t = calloc((size_t)s->n_ranks, sizeof *t);
  for (int r = 0; r < s->n_ranks; r++) {
    t[r] = calloc((size_t)(2 * s->len[r] + 1), sizeof **t);
    double now = 100 + r * lag;
    for (int64_t i = 0; i < s->len[r]; i++) {
      tr_pp_type_t ty = s->acts[r][i].type;
      double d = ty == TR_PP_F                    ? f
                 : ty == TR_PP_B                  ? b
                 : ty == TR_PP_I || ty == TR_PP_W ? b / 2
                 : ty == TR_PP_OVERLAP_F_B        ? f + b
                                                  : -1;
      if (d < 0) continue;
      t[r][2 * i] = now;
      t[r][2 * i + 1] = now += d;
    }
  }
  return t;
}

static void free_times(double** t, int n) {
  for (int r = 0; r < n; r++) free(t[r]);
  free(t);
}

START_TEST(t_idle_measure) {
  /* GPipe and 1F1B, p = 2, m = 4, F 1 s, B 2 s: the simulated step is
   * (m + p - 1)(F + B) = 15 s, each rank busy 12 s: 20% idle, the
   * bubble; measured back to back with rank 1 starting 0.5 s late: a
   * 12.5 s step, 4% idle on rank 0 and 0% on rank 1 */
  for (int k = 0; k < 2; k++) {
    tr_pp_schedule_t s;
    ck_assert_int_eq(
        tr_pp_generate(&s, k ? TR_PP_1F1B : TR_PP_GPIPE, 2, 4, 1, NULL, 0), 0);
    double** t = back_to_back(&s, 1, 2, 0.5);
    tr_pp_idle_t st;
    ck_assert_int_eq(
        tr_pp_idle_measure(&s, 2, (const double* const*)t, &st, NULL, 0), 0);
    ck_assert_int_eq(st.n_ranks, 2);
    ck_assert_double_eq_tol(st.sim_span, 15, 1e-9);
    ck_assert_double_eq_tol(st.span, 12.5, 1e-9);
    for (int r = 0; r < 2; r++) {
      ck_assert_double_eq_tol(st.busy[r], 12, 1e-9);
      ck_assert_double_eq_tol(st.sim_idle[r], 0.2, 1e-9);
    }
    ck_assert_double_eq_tol(st.idle[0], 0.5 / 12.5, 1e-9);
    ck_assert_double_eq_tol(st.idle[1], 0.5 / 12.5, 1e-9);
    tr_pp_idle_release(&st);
    free_times(t, 2);
    tr_pp_schedule_release(&s);
  }
  /* ZBVZeroBubble with unit costs (F 1, I 1, W 1): the lock-step
   * simulator's timeline, so the same idle fraction */
  {
    tr_pp_schedule_t s;
    tr_pp_sim_t sim;
    ck_assert_int_eq(tr_pp_generate(&s, TR_PP_ZBV, 4, 8, 2, NULL, 0), 0);
    ck_assert_int_eq(tr_pp_simulate(&s, 8, &sim, NULL, NULL, 0), 0);
    double** t = back_to_back(&s, 1, 2, 0);
    tr_pp_idle_t st;
    ck_assert_int_eq(
        tr_pp_idle_measure(&s, 8, (const double* const*)t, &st, NULL, 0), 0);
    ck_assert_double_eq_tol(st.sim_span, (double)sim.steps, 1e-9);
    double idle = 0;
    for (int r = 0; r < 4; r++) idle += st.sim_idle[r] / 4;
    ck_assert_double_eq_tol(idle, sim.bubble, 1e-9);
    tr_pp_idle_release(&st);
    free_times(t, 4);
    tr_pp_sim_release(&sim);
    tr_pp_schedule_release(&s);
  }
  /* tr_pp_simulate_costs, unequal stages: 1F1B, p = 2, m = 4, stage 0 F 1
   * B 2, stage 1 F 2 B 4: rank 1 runs F0 [1, 3) B0 [3, 7) F1 [7, 9) B1
   * [9, 13) F2 [13, 15) B2 [15, 19) F3 [19, 21) B3 [21, 25); rank 0's B3
   * waits for it: [25, 27) */
  {
    tr_pp_schedule_t s;
    ck_assert_int_eq(tr_pp_generate(&s, TR_PP_1F1B, 2, 4, 1, NULL, 0), 0);
    const double cost[8] = {1, 2, 1, 1, 2, 4, 2, 2};
    double span = 0, busy[2];
    ck_assert_int_eq(tr_pp_simulate_costs(&s, 2, cost, &span, busy, NULL, 0),
                     0);
    ck_assert_double_eq_tol(span, 27, 1e-12);
    ck_assert_double_eq_tol(busy[0], 12, 1e-12);
    ck_assert_double_eq_tol(busy[1], 24, 1e-12);
    tr_pp_schedule_release(&s);
  }
  /* a computation without a time, and a list that cannot progress */
  {
    tr_pp_schedule_t s;
    from_csv("0F0,0B0\n1F0,1B0\n", &s);
    double** t = back_to_back(&s, 1, 2, 0);
    t[1][2] = 0;
    tr_pp_idle_t st;
    char err[128];
    ck_assert_int_eq(tr_pp_idle_measure(&s, 2, (const double* const*)t, &st,
                                        err, sizeof err),
                     TR_EINVAL);
    ck_assert_str_eq(err, "rank 1: 1B0 has no measured time");
    free_times(t, 2);
    tr_pp_schedule_release(&s);
    from_csv("0F0,0B0\n1B0,1F0\n", &s);
    t = back_to_back(&s, 1, 2, 0);
    ck_assert_int_eq(tr_pp_idle_measure(&s, 2, (const double* const*)t, &st,
                                        err, sizeof err),
                     TR_EINVAL);
    ck_assert_str_eq(err,
                     "the schedule does not progress: rank 0 waits at 0B0");
    free_times(t, 2);
    tr_pp_schedule_release(&s);
  }
}
END_TEST

/* ---- PyTorch's CSV ---- */

START_TEST(t_csv) {
  tr_pp_schedule_t s, back;
  char err[256];
  /* idle cells, blank cells, \r\n, a rank with no actions */
  from_csv("0F0, ,0B0\r\n\r\n1F0,,1B0", &s);
  ck_assert_int_eq(s.n_ranks, 3);
  ck_assert_int_eq(s.len[0], 3);
  ck_assert_int_eq(s.acts[0][1].type, TR_PP_NONE);
  ck_assert_int_eq(s.len[1], 0);
  ck_assert_int_eq(s.acts[2][2].type, TR_PP_B);
  char* text = tr_pp_csv_format(&s);
  ck_assert_str_eq(text, "0F0,,0B0\r\n\r\n1F0,,1B0\r\n");
  free(text);
  tr_pp_schedule_release(&s);
  /* a bad action: file:row:col of its cell */
  ck_assert_int_eq(
      tr_pp_csv_parse("0F0,0X1\n", 8, "a.csv", &s, err, sizeof err), TR_EPARSE);
  ck_assert_str_eq(err, "a.csv:1:5: bad action '0X1'");
  const char* two = "0F0\n1F0,, zz\n";
  ck_assert_int_eq(
      tr_pp_csv_parse(two, strlen(two), "b.csv", &s, err, sizeof err),
      TR_EPARSE);
  ck_assert_str_eq(err, "b.csv:2:6: bad action 'zz'");
  ck_assert_int_eq(tr_pp_csv_parse("", 0, "c.csv", &s, err, sizeof err),
                   TR_EPARSE);
  ck_assert_str_eq(err, "c.csv: no rows (no ranks)");
  /* a generated schedule through a file and back */
  ck_assert_int_eq(tr_pp_generate(&s, TR_PP_INTERLEAVED_1F1B, 2, 4, 2, NULL, 0),
                   0);
  char path[] = "/tmp/check_pipelining_XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  ck_assert_int_eq(tr_pp_csv_save(&s, path), 0);
  ck_assert_int_eq(tr_pp_csv_load(path, &back, err, sizeof err), 0);
  ck_assert_int_eq(back.n_ranks, s.n_ranks);
  for (int r = 0; r < s.n_ranks; r++) {
    ck_assert_int_eq(back.len[r], s.len[r]);
    for (int64_t t = 0; t < s.len[r]; t++)
      ck_assert(act_eq(&back.acts[r][t], &s.acts[r][t]));
  }
  text = tr_pp_csv_format(&back);
  ck_assert_str_eq(text,
                   "0F0,0F1,2F0,2F1,,,0F2,2B0,0F3,2B1,2F2,0B0,2F3,0B1,,2B2,,"
                   "2B3,,0B2,,0B3\r\n"
                   ",1F0,1F1,,3F0,3B0,3F1,3B1,1F2,1B0,1F3,1B1,3F2,3B2,3F3,3B3,,"
                   "1B2,,1B3\r\n");
  free(text);
  tr_pp_schedule_release(&back);
  tr_pp_schedule_release(&s);
  unlink(path);
  ck_assert_int_eq(tr_pp_csv_load(path, &s, err, sizeof err), TR_ENOENT);
  ck_assert_msg(strncmp(err, path, strlen(path)) == 0, "%s", err);
  /* a rank of one idle slot: Python's csv quotes the lone empty cell */
  from_csv("\"\"\n0F0\n", &s);
  ck_assert_int_eq(s.len[0], 1);
  ck_assert_int_eq(s.acts[0][0].type, TR_PP_NONE);
  text = tr_pp_csv_format(&s);
  ck_assert_str_eq(text, "\"\"\r\n0F0\r\n");
  free(text);
  tr_pp_schedule_release(&s);
}
END_TEST

/* ---- the split over stages ---- */

static void check_split(int L, int pp, tr_pp_kind_t k, int lps, int fl, int ll,
                        const char* want_blocks, const char* want_ranks) {
  tr_pp_split_t sp;
  char err[512], got[256] = "", rk[256] = "";
  ck_assert_int_eq(tr_pp_split_init(&sp, L, pp, k, lps, fl, ll, err, sizeof err),
                   0);
  for (int s = 0; s < sp.n_stages; s++) {
    snprintf(got + strlen(got), sizeof got - strlen(got), "%s[%d,%d)",
             s ? " " : "", sp.blocks[s].first, sp.blocks[s].last);
    snprintf(rk + strlen(rk), sizeof rk - strlen(rk), "%d", sp.stage_rank[s]);
  }
  ck_assert_str_eq(got, want_blocks);
  ck_assert_str_eq(rk, want_ranks);
  int st[8];
  for (int r = 0; r < pp; r++) {
    ck_assert_int_eq(tr_pp_split_rank_stages(&sp, r, st), sp.v);
    for (int i = 0; i < sp.v; i++) ck_assert_int_eq(sp.stage_rank[st[i]], r);
  }
  ck_assert_int_eq(tr_pp_split_rank_stages(&sp, pp, st), TR_EINVAL);
  tr_pp_split_release(&sp);
}

static void check_split_fails(int L, int pp, tr_pp_kind_t k, int lps, int fl,
                              int ll, const char* want) {
  tr_pp_split_t sp;
  char err[512];
  ck_assert_int_eq(tr_pp_split_init(&sp, L, pp, k, lps, fl, ll, err, sizeof err),
                   TR_ECONFIG);
  ck_assert_str_eq(err, want);
}

START_TEST(t_split) {
  /* torchtitan's defaults: embedding and output weigh a layer each */
  check_split(8, 2, TR_PP_1F1B, 0, 1, 1, "[0,5) [5,10)", "01");
  check_split(8, 4, TR_PP_GPIPE, 0, 1, 1, "[0,3) [3,6) [6,8) [8,10)", "0123");
  /* 10 effective layers over 8 stages: the first two get 2, the last only
   * the head */
  check_split(8, 4, TR_PP_INTERLEAVED_1F1B, 0, 1, 1,
              "[0,2) [2,4) [4,5) [5,6) [6,7) [7,8) [8,9) [9,10)", "01230123");
  check_split(8, 4, TR_PP_ZBV, 0, 1, 1,
              "[0,2) [2,4) [4,5) [5,6) [6,7) [7,8) [8,9) [9,10)", "01233210");
  check_split(8, 2, TR_PP_DUALPIPEV, 0, 1, 1, "[0,3) [3,6) [6,8) [8,10)",
              "0110");
  /* weights 0: every stage the same number of layers */
  check_split(8, 2, TR_PP_LOOPED_BFS, 0, 0, 0, "[0,3) [3,5) [5,7) [7,10)",
              "0101");
  check_split(6, 1, TR_PP_1F1B, 0, 1, 1, "[0,8)", "0");
  /* layers_per_stage: ceil(10 / 3) = 4 stages on 2 ranks */
  check_split(8, 2, TR_PP_INTERLEAVED_ZB, 3, 1, 1, "[0,3) [3,6) [6,8) [8,10)",
              "0101");
  check_split(8, 2, TR_PP_1F1B, 5, 1, 1, "[0,5) [5,10)", "01");
  /* what does not split */
  check_split_fails(
      8, 2, TR_PP_INTERLEAVED_1F1B, 2, 1, 1,
      "pipeline_parallel_layers_per_stage: 8 layers (+ 1 + 1 for the "
      "embedding and the output) at 2 per stage make 5 stages, not a "
      "multiple of pipeline_parallel_degree 2");
  check_split_fails(8, 2, TR_PP_1F1B, 3, 1, 1,
                    "pipeline_parallel_layers_per_stage: schedule 1F1B runs "
                    "one stage per rank, but 8 layers at 3 per stage make 4 "
                    "stages on 2 ranks (2 per rank); use 4 or more");
  check_split_fails(8, 2, TR_PP_INTERLEAVED_1F1B, 5, 1, 1,
                    "pipeline_parallel_layers_per_stage: schedule "
                    "Interleaved1F1B runs at least 2 stages per rank, but 8 "
                    "layers at 5 per stage make 2 stages on 2 ranks; use a "
                    "smaller value");
  check_split_fails(8, 2, TR_PP_ZBV, 1, 0, 0,
                    "schedule ZBVZeroBubble places 2 stages per rank (the V), "
                    "not 4");
  check_split_fails(2, 4, TR_PP_INTERLEAVED_1F1B, 0, 1, 1,
                    "pipeline split: 8 stages (pipeline_parallel_degree 4 x 2 "
                    "per rank) but only 4 effective layers (2 layers + "
                    "first_stage_less_layers 1 + last_stage_less_layers 1)");
  check_split_fails(8, 4, TR_PP_1F1B, 0, 4, 1,
                    "pipeline_parallel_first_stage_less_layers (4) exceeds "
                    "the fewest layers of a stage (3: 13 effective layers "
                    "over 4 stages)");
  check_split_fails(8, 4, TR_PP_1F1B, 0, 1, 4,
                    "pipeline_parallel_last_stage_less_layers (4) exceeds "
                    "the fewest layers of a stage (3: 13 effective layers "
                    "over 4 stages)");
  check_split_fails(8, 2, TR_PP_1F1B, 0, -1, 1,
                    "pipeline_parallel_first_stage_less_layers (-1) and "
                    "pipeline_parallel_last_stage_less_layers (1) must be >= "
                    "0");
  /* placement alone: V over 3 groups alternates */
  ck_assert_int_eq(tr_pp_stage_rank(5, 2, TR_PP_PLACE_V), 1);
  ck_assert_int_eq(tr_pp_stage_rank(6, 3, TR_PP_PLACE_V), 0);
  ck_assert_int_eq(tr_pp_stage_rank(7, 4, TR_PP_PLACE_LOOP), 3);
}
END_TEST

/* ---- lowering ---- */

static void check_lowered(const char* compute, int pp, int n_stages,
                          int64_t m, int fsdp, const char* want) {
  tr_pp_schedule_t s, o;
  char err[2048];
  from_csv(compute, &s);
  int rc = tr_pp_lower(&s, pp, n_stages, m, fsdp, &o, NULL, err, sizeof err);
  ck_assert_msg(rc == 0, "%s", err);
  char* text = tr_pp_csv_format(&o);
  ck_assert_str_eq(text, want);
  free(text);
  tr_pp_schedule_release(&o);
  tr_pp_schedule_release(&s);
}

/* the rank a communication action talks to, -1 for other actions */
static int peer_of(const tr_pp_action_t* a, const int* map) {
  switch (a->type) {
    case TR_PP_SEND_F:
      return map[a->stage + 1];
    case TR_PP_RECV_F:
      return map[a->stage - 1];
    case TR_PP_SEND_B:
      return map[a->stage - 1];
    case TR_PP_RECV_B:
      return map[a->stage + 1];
    default:
      return -1;
  }
}

START_TEST(t_lower) {
  /* GPipe p 2, m 2: the sender places the receive in the receiver's list
   * (worked by hand through PyTorch's _add_send_recv) */
  check_lowered("0F0,0F1,,,0B0,0B1\n,1F0,1F1,1B0,1B1\n", 2, 2, 2, 1,
                "0UNSHARD,0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,"
                "0B1,0REDUCE_GRAD,0RESHARD\r\n"
                "1UNSHARD,1RECV_F0,1F0,1RECV_F1,1F1,1B0,1SEND_B0,1B1,"
                "1SEND_B1,1REDUCE_GRAD,1RESHARD\r\n");
  check_lowered("0F0,0F1,,0B0,,0B1\n,1F0,1B0,1F1,1B1\n", 2, 2, 2, 0,
                "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1,"
                "0REDUCE_GRAD\r\n"
                "1RECV_F0,1F0,1RECV_F1,1B0,1SEND_B0,1F1,1B1,1SEND_B1,"
                "1REDUCE_GRAD\r\n");
  /* the V's turn (stages 1 and 2 on rank 1) passes nothing between ranks;
   * UNSHARD prefetches at most 3 stages, RESHARD what leaves the window */
  check_lowered("0F0,3F0,3B0,0B0\n1F0,2F0,2B0,1B0\n", 2, 4, 1, 1,
                "0UNSHARD,3UNSHARD,0F0,0SEND_F0,3RECV_F0,3F0,3B0,3SEND_B0,"
                "3REDUCE_GRAD,3RESHARD,0RECV_B0,0B0,0REDUCE_GRAD,0RESHARD\r\n"
                "1UNSHARD,2UNSHARD,1RECV_F0,1F0,2F0,2SEND_F0,2RECV_B0,2B0,"
                "2REDUCE_GRAD,2RESHARD,1B0,1SEND_B0,1REDUCE_GRAD,1RESHARD\r\n");
  /* eviction: before 1F0, stage 0 leaves the window of the next 3 stages
   * (1, 2, 3) and 3 comes in; before 2F0 1 leaves and 0 comes back */
  tr_pp_action_t in[5], *out;
  int64_t n;
  const char* ids[] = {"0F0", "1F0", "2F0", "3F0", "0B0"};
  for (int i = 0; i < 5; i++) ck_assert_int_eq(tr_pp_action_parse(ids[i], &in[i]), 0);
  ck_assert_int_eq(tr_pp_add_unshard_reshard(in, 5, 3, &out, &n), 0);
  char got[512] = "", b[TR_PP_ACTION_STRLEN];
  for (int64_t i = 0; i < n; i++)
    snprintf(got + strlen(got), sizeof got - strlen(got), "%s ",
             tr_pp_action_str(&out[i], b, sizeof b));
  ck_assert_str_eq(got,
                   "0UNSHARD 1UNSHARD 2UNSHARD 0F0 0RESHARD 3UNSHARD 1F0 "
                   "1RESHARD 0UNSHARD 2F0 2RESHARD 3F0 3RESHARD 0B0 "
                   "0RESHARD ");
  free(out);
  /* every generator: between two ranks, the sends and receives of both
   * directions come in one order on both, each with its pair, and the
   * lowered lists are a compute_comms schedule */
  for (int k = 0; k <= TR_PP_DUALPIPEV; k++)
    for (int p = 2; p <= 4; p += 2)
      for (int mi = 0; mi < 3; mi++) {
        int64_t m = mi == 0 ? p : mi == 1 ? 2 * p : 8;
        int v = tr_pp_kind_single_stage((tr_pp_kind_t)k) ? 1 : 2;
        tr_pp_schedule_t s, o;
        if (tr_pp_generate(&s, (tr_pp_kind_t)k, p, m, v, NULL, 0) != 0)
          continue; /* DualPipeV m < 2p */
        int map[8];
        char err[2048];
        int rc = tr_pp_lower(&s, p, p * v, m, 1, &o, map, err, sizeof err);
        ck_assert_msg(rc == 0, "%s p %d m %lld: %s",
                      tr_pp_kind_name((tr_pp_kind_t)k), p, (long long)m, err);
        ck_assert_int_eq(
            tr_pp_schedule_check_format(&o, TR_PP_COMPUTE_COMMS, "x", err,
                                        sizeof err),
            0);
        /* the compute_comms CSV (_dump_csv) reads back the same */
        char* text = tr_pp_csv_format(&o);
        tr_pp_schedule_t back;
        ck_assert_int_eq(
            tr_pp_csv_parse(text, strlen(text), "x", &back, err, sizeof err),
            0);
        ck_assert_int_eq(back.n_ranks, o.n_ranks);
        for (int r = 0; r < o.n_ranks; r++) {
          ck_assert_int_eq(back.len[r], o.len[r]);
          for (int64_t t = 0; t < o.len[r]; t++)
            ck_assert(act_eq(&back.acts[r][t], &o.acts[r][t]));
        }
        tr_pp_schedule_release(&back);
        free(text);
        for (int a = 0; a < p; a++)
          for (int c = a + 1; c < p; c++) {
            /* the ops between a and c, both directions, in each list's
             * order: the k-th of a's matches the k-th of c's (one stream
             * per pair, as NCCL runs them, cannot deadlock) */
            int64_t i = 0, j = 0;
            for (;;) {
              while (i < o.len[a] && peer_of(&o.acts[a][i], map) != c) i++;
              while (j < o.len[c] && peer_of(&o.acts[c][j], map) != a) j++;
              if (i == o.len[a] || j == o.len[c]) {
                ck_assert(i == o.len[a] && j == o.len[c]);
                break;
              }
              const tr_pp_action_t *x = &o.acts[a][i], *y = &o.acts[c][j];
              const tr_pp_action_t *snd = x, *rcv = y;
              if (x->type == TR_PP_RECV_F || x->type == TR_PP_RECV_B)
                snd = y, rcv = x;
              int fwd = snd->type == TR_PP_SEND_F;
              ck_assert(snd->type == TR_PP_SEND_F || snd->type == TR_PP_SEND_B);
              ck_assert_int_eq(rcv->type, fwd ? TR_PP_RECV_F : TR_PP_RECV_B);
              ck_assert_int_eq(rcv->stage, snd->stage + (fwd ? 1 : -1));
              ck_assert_int_eq(rcv->micro, snd->micro);
              i++, j++;
            }
          }
        tr_pp_schedule_release(&o);
        tr_pp_schedule_release(&s);
      }
}
END_TEST

START_TEST(t_lower_refuses) {
  tr_pp_schedule_t s, o;
  char err[2048];
  /* a deadlock: each rank's first backward waits on the other */
  from_csv("0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n", &s);
  ck_assert_int_eq(tr_pp_lower(&s, 2, 2, 2, 0, &o, NULL, err, sizeof err),
                   TR_EINVAL);
  ck_assert_str_eq(err,
                   "malformed compute schedule, can't schedule sends/recvs: "
                   "rank 0 waits at 0B0; rank 1 waits at 1F1;");
  tr_pp_schedule_release(&s);
  /* communication actions are not compute-only */
  from_csv("0F0,0SEND_F0,0B0\n1F0,1B0\n", &s);
  ck_assert_int_eq(tr_pp_lower(&s, 2, 2, 1, 0, &o, NULL, err, sizeof err),
                   TR_EPARSE);
  ck_assert_str_eq(err,
                   "schedule:1: cell 2: expected a compute-only schedule but "
                   "found communication action '0SEND_F0' at rank 0, "
                   "position 1");
  ck_assert_int_eq(tr_pp_schedule_check_format(&s, TR_PP_COMPUTE_COMMS,
                                               "s.csv", err, sizeof err),
                   0);
  tr_pp_schedule_release(&s);
  from_csv("0F0,,0B0\n", &s);
  ck_assert_int_eq(tr_pp_schedule_check_format(&s, TR_PP_COMPUTE_COMMS,
                                               "s.csv", err, sizeof err),
                   TR_EPARSE);
  ck_assert_str_eq(err,
                   "s.csv:1: cell 2: an idle slot at rank 0, position 1: a "
                   "compute_comms schedule lists only actions");
  /* the validator's fault comes through */
  ck_assert_int_eq(tr_pp_lower(&s, 2, 2, 1, 0, &o, NULL, err, sizeof err),
                   TR_EINVAL);
  ck_assert_str_eq(err,
                   "schedule has incorrect number of ranks - expected 2, "
                   "actual 1");
  tr_pp_schedule_release(&s);
  from_csv("0B0,0F0\n1F0,1B0\n", &s);
  ck_assert_int_eq(tr_pp_lower(&s, 2, 2, 1, 0, &o, NULL, err, sizeof err),
                   TR_EINVAL);
  ck_assert_msg(strncmp(err,
                        "Rank 0, step 0: Running Full Backward for stage 0, "
                        "microbatch 0 without first running Forward",
                        80) == 0,
                "%s", err);
  tr_pp_schedule_release(&s);
}
END_TEST

/* ---- Chrome trace ---- */

START_TEST(t_trace) {
  tr_pp_schedule_t s, tl;
  from_csv("0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n", &s);
  tr_pp_sim_t sim;
  char err[256];
  ck_assert_int_eq(tr_pp_simulate(&s, 2, &sim, &tl, err, sizeof err), 0);
  char* text = tr_pp_trace_format(&tl);
  /* the simulated timeline: rank 1 starts a step late, rank 0 waits for
   * 1B0 */
  ck_assert_str_eq(
      text,
      "{\"traceEvents\": ["
      "{\"name\": \"0F0\", \"cat\": \"computation\", \"ph\": \"X\", \"pid\": "
      "0, \"tid\": 0, \"ts\": 0, \"dur\": 1}, "
      "{\"name\": \"0F1\", \"cat\": \"computation\", \"ph\": \"X\", \"pid\": "
      "0, \"tid\": 0, \"ts\": 1, \"dur\": 1}, "
      "{\"name\": \"0B0\", \"cat\": \"computation\", \"ph\": \"X\", \"pid\": "
      "0, \"tid\": 0, \"ts\": 4, \"dur\": 1}, "
      "{\"name\": \"0B1\", \"cat\": \"computation\", \"ph\": \"X\", \"pid\": "
      "0, \"tid\": 0, \"ts\": 5, \"dur\": 1}, "
      "{\"name\": \"1F0\", \"cat\": \"computation\", \"ph\": \"X\", \"pid\": "
      "1, \"tid\": 1, \"ts\": 1, \"dur\": 1}, "
      "{\"name\": \"1F1\", \"cat\": \"computation\", \"ph\": \"X\", \"pid\": "
      "1, \"tid\": 1, \"ts\": 2, \"dur\": 1}, "
      "{\"name\": \"1B0\", \"cat\": \"computation\", \"ph\": \"X\", \"pid\": "
      "1, \"tid\": 1, \"ts\": 3, \"dur\": 1}, "
      "{\"name\": \"1B1\", \"cat\": \"computation\", \"ph\": \"X\", \"pid\": "
      "1, \"tid\": 1, \"ts\": 4, \"dur\": 1}]}");
  free(text);
  tr_pp_sim_release(&sim);
  tr_pp_schedule_release(&tl);
  tr_pp_schedule_release(&s);
  /* PyTorch's categories: I, OVERLAP_F_B and the comms are
   * "communication" */
  from_csv("0I0,(0F1;1B0)OVERLAP_F_B,0SEND_F1,\n", &s);
  text = tr_pp_trace_format(&s);
  ck_assert_str_eq(
      text,
      "{\"traceEvents\": ["
      "{\"name\": \"0I0\", \"cat\": \"communication\", \"ph\": \"X\", "
      "\"pid\": 0, \"tid\": 0, \"ts\": 0, \"dur\": 1}, "
      "{\"name\": \"(0F1;1B0)OVERLAP_F_B\", \"cat\": \"communication\", "
      "\"ph\": \"X\", \"pid\": 0, \"tid\": 0, \"ts\": 1, \"dur\": 1}, "
      "{\"name\": \"0SEND_F1\", \"cat\": \"communication\", \"ph\": \"X\", "
      "\"pid\": 0, \"tid\": 0, \"ts\": 2, \"dur\": 1}]}");
  /* to a file */
  char path[] = "/tmp/check_pipelining_trace_XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  ck_assert_int_eq(tr_pp_trace_write(&s, path), 0);
  FILE* f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  char buf[1024];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  ck_assert_str_eq(buf, text);
  unlink(path);
  ck_assert_int_eq(tr_pp_trace_write(&s, "/nonexistent/dir/t.json"), TR_ENOENT);
  free(text);
  tr_pp_schedule_release(&s);
}
END_TEST

int main(void) {
  Suite* s = suite_create("pipelining");
  TCase* tc = tcase_create("ir");
  tcase_add_test(tc, t_action_text);
  tcase_add_test(tc, t_one_stage_schedule);
  suite_add_tcase(s, tc);
  tc = tcase_create("schedules");
  tcase_add_loop_test(tc, t_generators_equal_pytorch, 0,
                      (int)(sizeof fixtures / sizeof fixtures[0]));
  tcase_add_test(tc, t_generators_refuse);
  tcase_add_test(tc, t_validate_grid);
  tcase_add_test(tc, t_validate_faults);
  tcase_add_test(tc, t_simulate_bubble);
  tcase_add_test(tc, t_simulate_deadlock);
  tcase_add_test(tc, t_idle_measure);
  tcase_add_test(tc, t_csv);
  tcase_add_test(tc, t_split);
  tcase_add_test(tc, t_lower);
  tcase_add_test(tc, t_lower_refuses);
  tcase_add_test(tc, t_trace);
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
