/* tests/check_tp.c: tensor parallelism (dtensor/tp.c, trainrun/dtensor.h).
 *
 * Local: the strided Shard(0, parts=3) placement's arithmetic and its
 * refusals, the plan's placement of every parameter of GPT-2 and Llama
 * debug models (the vocabulary tables split where tp divides the
 * vocabulary, whole and said so where not) and its divisibility errors,
 * the sequence-parallel refusal of a T that tp does not divide, and the
 * strided init of a c_attn piece against the one-rank values, and of every
 * parameter under FSDP over TP (dp_shard cutting the q|k|v piece across
 * part boundaries, the rows as runs of the global tensor); the bytes a
 * rank allocates for parameters and gradients under TP 4 (host
 * allocator); a one-rank safetensors file loaded into TP pieces. On 2 and
 * 4 forked Gloo ranks (tests/pg_suite.h): a whole trainer's bytes
 * (weights, gradients, AdamW moments) against one rank's, less by
 * (tp-1)/tp of the split parameters'; a small GPT-2 and a small Llama
 * (heads divisible by 4, GQA for Llama) under the TP plan, four models per
 * run (sequence parallel on/off x loss parallel on/off), against the same
 * model on one rank: the gathered shards equal the one-rank init byte for
 * byte; no_grad losses and the gathered logits of a forward without
 * targets; at each of 20 steps with AdamW steps between (the even ones
 * with full or selective "op" activation checkpointing, step 3 with the
 * backward split into I and W) the loss and the gradient norm within 1e-5
 * relative, each pair of modes within 1e-6 of each other, the gathered
 * gradients within 1e-5 max-abs, and every block's collectives, per point
 * and op, those the plan implies (2 all-reduces per layer forward and
 * backward without SP; 2 all-gathers + 2 reduce-scatters with SP, the
 * backward's mirror plus the norms' gradient sums, the norm outputs
 * gathered again where "op" checkpointing refills them; the embedding's
 * and the head's); the final weights
 * within 1e-4 max-abs (but GPT-2's key bias, whose gradient is 0:
 * body_tp); the activation peak of a forward lower with SP; a vocabulary
 * that tp 4 does not divide. */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/fixtures.h" /* the trainer's settings of a config */
#include "tests/pg_suite.h"
#include "tests/procs.h" /* tp_srcdir */
#include "tests/train_steps.h"
#include "trainrun/config.h"
#include "trainrun/dtensor.h"
#include "trainrun/error.h"
#include "trainrun/kernels.h"
#include "trainrun/model.h"
#include "trainrun/safetensors.h"
#include "trainrun/trainer.h"

/* ---- models ---- */

/* GPT-2: debugmodel cut to 2 layers (4 heads); Llama: 8 heads, 4 KV heads,
 * dim 64, 2 layers. */
static int small_config(int llama, tr_model_config_t* c) {
  int rc = tr_model_config_get(llama ? "llama3" : "gpt2", "debugmodel", c);
  c->n_layers = 2;
  c->vocab_size = 96;
  c->max_seq_len = 16;
  if (llama) {
    c->dim = 64;
    c->n_heads = 8;
    c->n_kv_heads = 4;
    c->head_dim = 8;
    c->ffn_dim = 192;
  }
  return rc;
}

static tr_mesh_shape_t tp_shape(int k, int coord) {
  tr_mesh_shape_t s;
  const char* names[] = {"tp"};
  ck_assert_int_eq(tr_mesh_shape_init(&s, 1, names, &k, &coord), 0);
  return s;
}

/* ---- local ---- */

START_TEST(test_strided_placement) {
  /* [12, 2] as 3 parts of 4 rows over 2 ranks: rank 1 holds rows 2,3 of
   * each part, offset 2, 6 rows */
  tr_placement_t pl = tr_placement_shard_parts(0, 3);
  int sizes[1] = {2}, coords[1] = {1};
  int64_t g[2] = {12, 2}, ls[2], off[2];
  ck_assert_int_eq(
      tr_placement_local_layout(1, sizes, coords, &pl, 2, g, ls, off), 0);
  ck_assert_int_eq(ls[0], 6);
  ck_assert_int_eq(ls[1], 2);
  ck_assert_int_eq(off[0], 2);
  char buf[48];
  ck_assert_str_eq(tr_placement_str(pl, buf, sizeof buf), "Shard(0, parts=3)");
  ck_assert(!tr_placement_eq(pl, tr_placement_shard(0)));
  ck_assert(tr_placement_eq(pl, tr_placement_shard_parts(0, 3)));
  tr_placement_t back;
  ck_assert_int_eq(tr_placement_parse(buf, &back), 0);
  ck_assert(tr_placement_eq(back, pl));
  ck_assert_int_eq(tr_placement_parse("Shard(0)", &back), 0);
  ck_assert(tr_placement_eq(back, tr_placement_shard(0)));
  ck_assert_int_eq(tr_placement_parse("Shard(0, parts=)", &back), TR_EINVAL);
  ck_assert_int_eq(tr_placement_parse("Shard(0, parts=3", &back), TR_EINVAL);
  /* a part that does not split evenly */
  int64_t g2[2] = {9, 2};
  ck_assert_int_eq(
      tr_placement_local_layout(1, sizes, coords, &pl, 2, g2, ls, off),
      TR_EINVAL);
  /* another mesh dim cutting the same tensor dim, after (no box) or before
   * (refused) */
  tr_placement_t two[2] = {pl, tr_placement_shard(0)};
  int s2[2] = {2, 2}, c2[2] = {0, 1};
  int64_t g3[2] = {24, 2};
  ck_assert_int_eq(tr_placement_local_layout(2, s2, c2, two, 2, g3, ls, off),
                   TR_EINVAL);
  /* ... which as a layout is rows 6..11 of the piece of 3 x 4 rows (global
   * rows 0..3, 8..11, 16..19): rows 2, 3 of part 1 and all of part 2 */
  tr_param_layout_t l;
  ck_assert_int_eq(tr_placement_local_piece(2, s2, c2, two, NULL, 2, g3, &l),
                   0);
  ck_assert_int_eq(l.parts, 3);
  ck_assert_int_eq(l.part_rows, 4);
  ck_assert_int_eq(l.skip, 6);
  ck_assert_int_eq(l.shape[0], 6);
  ck_assert_int_eq(l.offset[0], 0);
  tr_param_run_t runs[TR_PARAM_MAX_RUNS];
  ck_assert_int_eq(tr_param_layout_runs(&l, 24, runs), 2);
  ck_assert_int_eq(runs[0].local, 0);
  ck_assert_int_eq(runs[0].global, 10);
  ck_assert_int_eq(runs[0].rows, 2);
  ck_assert_int_eq(runs[1].local, 2);
  ck_assert_int_eq(runs[1].global, 16);
  ck_assert_int_eq(runs[1].rows, 4);
  /* coordinate 0 of a cut in 5: rows 0..2 of part 0 */
  int s5[2] = {2, 5}, c5[2] = {1, 0};
  ck_assert_int_eq(tr_placement_local_piece(2, s5, c5, two, NULL, 2, g3, &l),
                   0);
  ck_assert_int_eq(tr_param_layout_runs(&l, 24, runs), 1);
  ck_assert_int_eq(runs[0].global, 4);
  ck_assert_int_eq(runs[0].rows, 3);
  tr_placement_t rev[2] = {tr_placement_shard(0), pl};
  ck_assert_int_eq(tr_placement_local_layout(2, s2, c2, rev, 2, g3, ls, off),
                   TR_EINVAL);
  /* another tensor dim is fine */
  tr_placement_t other[2] = {pl, tr_placement_shard(1)};
  ck_assert_int_eq(tr_placement_local_layout(2, s2, c2, other, 2, g3, ls, off),
                   0);
  ck_assert_int_eq(ls[0], 12);
  ck_assert_int_eq(ls[1], 1);
  ck_assert_int_eq(off[1], 1);
}
END_TEST

START_TEST(test_plan_placements) {
  tr_model_config_t c;
  ck_assert_int_eq(small_config(_i, &c), 0);
  tr_model_t m;
  ck_assert_int_eq(tr_model_init(&m, &c), 0);
  tr_mesh_shape_t s = tp_shape(4, 3);
  tr_errmsg_t err;
  ck_assert_int_eq(tr_tp_plan_apply(&m, &s, &err), 0);
  int64_t C = c.dim;
  for (int i = 0; i < m.n_params; i++) {
    const tr_param_t* p = &m.params[i];
    const tr_param_placement_t* pp = tr_dtensor_param_placement(p);
    if (p->tp_style == TR_TP_COLWISE) {
      ck_assert_ptr_nonnull(pp);
      ck_assert_int_eq(pp->placements[0].kind, TR_PLACEMENT_SHARD);
      ck_assert_int_eq(pp->placements[0].dim, 0);
      ck_assert_int_eq(p->layout.shape[0], p->shape[0] / 4);
      ck_assert_int_eq(p->layout.parts, p->tp_parts);
      if (strstr(p->name, "c_attn")) {
        ck_assert_int_eq(p->tp_parts, 3);
        ck_assert_int_eq(p->layout.offset[0], 3 * (C / 4)); /* rank 3 */
      }
    } else if (p->tp_style == TR_TP_ROWWISE) {
      ck_assert_ptr_nonnull(pp);
      ck_assert(tr_placement_eq(pp->placements[0], tr_placement_shard(1)));
      ck_assert_int_eq(p->layout.shape[1], p->shape[1] / 4);
      ck_assert_int_eq(p->layout.offset[1], 3 * (p->shape[1] / 4));
      ck_assert_int_eq(p->layout.shape[0], p->shape[0]);
    } else if (p->tp_style == TR_TP_VOCAB || p->tp_style == TR_TP_OUTPUT) {
      /* 4 divides the vocabulary (96): its rows split */
      ck_assert_ptr_nonnull(pp);
      ck_assert(tr_placement_eq(pp->placements[0], tr_placement_shard(0)));
      ck_assert_int_eq(p->layout.shape[0], c.vocab_size / 4);
      ck_assert_int_eq(p->layout.offset[0], 3 * (c.vocab_size / 4));
    } else { /* norms, row biases, positions: whole */
      ck_assert_ptr_null(pp);
      ck_assert_int_eq(p->layout.shape[0], p->shape[0]);
    }
  }
  /* the printout names the styles and placements */
  char* text = NULL;
  size_t len = 0;
  FILE* f = open_memstream(&text, &len);
  ck_assert_int_eq(tr_tp_plan_describe(&m, f), 0);
  fclose(f);
  ck_assert_ptr_nonnull(strstr(text, _i ? "Shard(1)" : "Shard(0, parts=3)"));
  ck_assert_ptr_nonnull(strstr(text, "rowwise"));
  ck_assert_ptr_nonnull(strstr(text, "vocab (rows split)"));
  if (_i) ck_assert_ptr_nonnull(strstr(text, "output (rows split)"));
  /* the summary: the whole table, less 3/4 of the split parameters */
  int64_t whole = tr_model_num_params(&m), split = 0;
  for (int i = 0; i < m.n_params; i++) {
    const tr_param_t* p = &m.params[i];
    tr_placement_t pl;
    if (tr_tp_placement(p, 4, &pl))
      split += p->shape[0] * (p->ndim > 1 ? p->shape[1] : 1);
  }
  int64_t held = whole - split + split / 4;
  char line[160];
  snprintf(line, sizeof line,
           "  per rank: %lld of %lld parameter elements, %.1f MiB of fp32 "
           "weights, gradients and AdamW moments\n",
           (long long)held, (long long)whole,
           16.0 * (double)held / (1024.0 * 1024.0));
  ck_assert_ptr_nonnull(strstr(text, line));
  free(text);
  /* a second plan (or one after allocation) is refused */
  ck_assert_int_eq(tr_tp_plan_apply(&m, &s, &err), TR_EINVAL);
  tr_model_release(&m);
  /* a vocabulary 4 does not divide: the tables stay whole, and say why */
  c.vocab_size = 98;
  ck_assert_int_eq(tr_model_init(&m, &c), 0);
  ck_assert_int_eq(tr_tp_plan_apply(&m, &s, &err), 0);
  for (int i = 0; i < m.n_params; i++)
    if (m.params[i].tp_style == TR_TP_VOCAB ||
        m.params[i].tp_style == TR_TP_OUTPUT)
      ck_assert_ptr_null(tr_dtensor_param_placement(&m.params[i]));
  f = open_memstream(&text, &len);
  ck_assert_int_eq(tr_tp_plan_describe(&m, f), 0);
  fclose(f);
  ck_assert_ptr_nonnull(strstr(text, "vocab (replicated: V % tp != 0)"));
  if (_i)
    ck_assert_ptr_nonnull(strstr(text, "output (replicated: V % tp != 0)"));
  free(text);
  tr_model_release(&m);
  c.vocab_size = 96;
  /* size 1: nothing placed */
  ck_assert_int_eq(tr_model_init(&m, &c), 0);
  s = tp_shape(1, 0);
  ck_assert_int_eq(tr_tp_plan_apply(&m, &s, &err), 0);
  for (int i = 0; i < m.n_params; i++)
    ck_assert_ptr_null(tr_dtensor_param_placement(&m.params[i]));
  tr_model_release(&m);
}
END_TEST

START_TEST(test_plan_errors) {
  tr_model_config_t c;
  tr_model_t m;
  tr_errmsg_t err;
  /* sequence parallel: tp must divide the sequence length */
  tr_tp_opts_t o;
  tr_tp_opts_init(&o);
  ck_assert_int_eq(tr_tp_check_seq_len(4, 10, &o, &err), TR_ECONFIG);
  ck_assert_str_eq(err.message,
                   "tensor_parallel_degree 4 does not divide the sequence "
                   "length 10 (sequence parallel)");
  ck_assert_int_eq(tr_tp_check_seq_len(4, 12, NULL, &err), 0);
  o.sequence_parallel = 0;
  ck_assert_int_eq(tr_tp_check_seq_len(4, 10, &o, &err), 0);
  ck_assert_int_eq(small_config(0, &c), 0); /* 4 heads */
  ck_assert_int_eq(tr_model_init(&m, &c), 0);
  tr_mesh_shape_t s = tp_shape(3, 0);
  ck_assert_int_eq(tr_tp_plan_apply(&m, &s, &err), TR_ECONFIG);
  ck_assert_str_eq(err.message,
                   "tensor_parallel_degree 3 does not divide the 4 attention "
                   "heads");
  tr_model_release(&m);
  ck_assert_int_eq(small_config(1, &c), 0); /* 8 heads, 4 KV heads */
  ck_assert_int_eq(tr_model_init(&m, &c), 0);
  s = tp_shape(8, 0);
  ck_assert_int_eq(tr_tp_plan_apply(&m, &s, &err), TR_ECONFIG);
  ck_assert_str_eq(err.message,
                   "tensor_parallel_degree 8 does not divide the 4 key/value "
                   "heads");
  tr_model_release(&m);
  c.ffn_dim = 190; /* 4 divides the heads, not the FFN width */
  ck_assert_int_eq(tr_model_init(&m, &c), 0);
  s = tp_shape(4, 0);
  ck_assert_int_eq(tr_tp_plan_apply(&m, &s, &err), TR_ECONFIG);
  ck_assert_str_eq(err.message,
                   "tensor_parallel_degree 4 does not divide dim 0 (190 in 1 "
                   "part) of 'model.layers.0.mlp.gate_proj.weight'");
  tr_model_release(&m);
}
END_TEST

/* Every rank's piece of c_attn (weight and bias) under the plan, made by
 * tr_model_init_weights, is the one-rank table's rows q_r | k_r | v_r. */
START_TEST(test_strided_init) {
  tr_model_config_t c;
  ck_assert_int_eq(small_config(0, &c), 0);
  tr_model_t ref;
  ck_assert_int_eq(tr_model_init(&ref, &c), 0);
  ck_assert_int_eq(tr_model_alloc(&ref, TR_DEVICE_CPU), 0);
  ck_assert_int_eq(tr_model_init_weights(&ref, 7), 0);
  /* c_attn's init is N(0, 0.02); the bias is zeros: give it a rule */
  int w = tr_model_find_param(&ref, "transformer.h.1.attn.c_attn.weight");
  int b = tr_model_find_param(&ref, "transformer.h.1.attn.c_attn.bias");
  ck_assert_int_ge(w, 0);
  ref.params[b].init = ref.params[w].init;
  ck_assert_int_eq(tr_model_init_weights(&ref, 7), 0);
  int64_t C = c.dim;
  for (int r = 0; r < 4; r++) {
    tr_model_t m;
    ck_assert_int_eq(tr_model_init(&m, &c), 0);
    tr_mesh_shape_t s = tp_shape(4, r);
    ck_assert_int_eq(tr_tp_plan_apply(&m, &s, NULL), 0);
    m.params[b].init = m.params[w].init;
    ck_assert_int_eq(tr_model_alloc(&m, TR_DEVICE_CPU), 0);
    ck_assert_int_eq(tr_model_init_weights(&m, 7), 0);
    int64_t q = C / 4; /* rows of each part on a rank */
    const float* lw = tr_tensor_data(&m.params[w].data);
    const float* gw = tr_tensor_data(&ref.params[w].data);
    const float* lb = tr_tensor_data(&m.params[b].data);
    const float* gb = tr_tensor_data(&ref.params[b].data);
    for (int part = 0; part < 3; part++) {
      int64_t grow = part * C + r * q;
      ck_assert(memcmp(lw + part * q * C, gw + grow * C,
                       sizeof(float) * (size_t)(q * C)) == 0);
      ck_assert(memcmp(lb + part * q, gb + grow, sizeof(float) * (size_t)q) ==
                0);
    }
    tr_model_release(&m);
  }
  tr_model_release(&ref);
}
END_TEST

/* The one-rank model of c, every parameter drawn from N(0, 0.02) (no
 * all-zero biases) with seed. */
static void one_rank_normal(tr_model_t* ref, const tr_model_config_t* c,
                            uint64_t seed) {
  ck_assert_int_eq(tr_model_init(ref, c), 0);
  ck_assert_int_eq(tr_model_alloc(ref, TR_DEVICE_CPU), 0);
  for (int i = 0; i < ref->n_params; i++)
    ref->params[i].init = (tr_init_rule_t){TR_INIT_NORMAL, 0.02f, 0, 0};
  ck_assert_int_eq(tr_model_init_weights(ref, seed), 0);
}

/* p's local data holds the rows of ref (a one-rank table's parameter)
 * its layout's runs say, in the columns of its box; the runs cover the
 * local rows in order. */
static void assert_runs_equal(const tr_param_t* p, const tr_param_t* ref,
                              const char* what) {
  tr_param_run_t runs[TR_PARAM_MAX_RUNS];
  int n = tr_param_layout_runs(&p->layout, p->shape[0], runs);
  ck_assert_int_ge(n, 1);
  int64_t cols = p->ndim > 1 ? p->layout.shape[1] : 1;
  int64_t gcols = p->ndim > 1 ? p->shape[1] : 1;
  int64_t c0 = p->ndim > 1 ? p->layout.offset[1] : 0, next = 0;
  const float* l = tr_tensor_data(&p->data);
  const float* g = tr_tensor_data(&ref->data);
  for (int j = 0; j < n; j++) {
    ck_assert_int_eq(runs[j].local, next);
    next += runs[j].rows;
    for (int64_t r = 0; r < runs[j].rows; r++)
      ck_assert_msg(memcmp(l + (runs[j].local + r) * cols,
                           g + (runs[j].global + r) * gcols + c0,
                           sizeof(float) * (size_t)cols) == 0,
                    "%s: '%s' local row %lld is not global row %lld", what,
                    p->name, (long long)(runs[j].local + r),
                    (long long)(runs[j].global + r));
  }
  ck_assert_int_eq(next, p->layout.shape[0]);
}

/* FSDP over the TP plan (dp_shard composed onto tp, cutting last, as
 * fsdp2 does): GPT-2's c_attn [384, 128] under tp 2 is a q|k|v piece of 3
 * x 64 rows a rank; dp_shard 2 cuts it at row 96, so shard 0 holds all of
 * q and half of k, shard 1 the rest of k and all of v (each straddles a
 * part boundary); dp_shard 5 cuts at 39, 78, 117, 156. Every parameter's
 * runs of rows, initialised on the composed layout, are the one-rank
 * values byte for byte; the rows cut in run order are the ones the
 * placement arithmetic gives. */
START_TEST(test_strided_fsdp) {
  tr_model_config_t c;
  ck_assert_int_eq(small_config(0, &c), 0);
  tr_model_t ref;
  one_rank_normal(&ref, &c, 9);
  int w = tr_model_find_param(&ref, "transformer.h.1.attn.c_attn.weight");
  ck_assert_int_ge(w, 0);
  ck_assert_int_eq(ref.params[w].shape[0], 3 * c.dim);
  static const int dps[2] = {2, 5};
  for (int k = 0; k < 2; k++)
    for (int r = 0; r < 2 * dps[k]; r++) {
      tr_model_t m;
      ck_assert_int_eq(tr_model_init(&m, &c), 0);
      const char* names[] = {"dp_shard", "tp"};
      int sz[2] = {dps[k], 2}, co[2] = {r / 2, r % 2};
      tr_mesh_shape_t s;
      ck_assert_int_eq(tr_mesh_shape_init(&s, 2, names, sz, co), 0);
      ck_assert_int_eq(tr_tp_plan_apply(&m, &s, NULL), 0);
      for (int i = 0; i < m.n_params; i++) {
        m.params[i].init = ref.params[i].init;
        ck_assert_int_eq(
            tr_dtensor_param_shard(&m.params[i], &s, "dp_shard", 0), 0);
      }
      const tr_param_layout_t* l = &m.params[w].layout;
      int64_t piece = 3 * (c.dim / 2), start, rows;
      tr_chunk_range(piece, dps[k], r / 2, &start, &rows);
      ck_assert_int_eq(l->parts, 3);
      ck_assert_int_eq(l->part_rows, c.dim / 2);
      ck_assert_int_eq(l->skip, start);
      ck_assert_int_eq(l->shape[0], rows);
      ck_assert_int_eq(l->offset[0], (r % 2) * (c.dim / 2));
      ck_assert_int_eq(tr_model_alloc(&m, TR_DEVICE_CPU), 0);
      ck_assert_int_eq(tr_model_init_weights(&m, 9), 0);
      char what[48];
      snprintf(what, sizeof what, "dp_shard %d of %d, tp %d", r / 2, dps[k],
               r % 2);
      for (int i = 0; i < m.n_params; i++)
        assert_runs_equal(&m.params[i], &ref.params[i], what);
      if (dps[k] == 2) { /* the straddling runs, spelled out */
        tr_param_run_t runs[TR_PARAM_MAX_RUNS];
        int64_t h = c.dim / 2, o = (r % 2) * h, C = c.dim;
        ck_assert_int_eq(tr_param_layout_runs(l, 3 * C, runs), 2);
        if (r / 2 == 0) { /* q, then the first half of k */
          ck_assert_int_eq(runs[0].global, o);
          ck_assert_int_eq(runs[0].rows, h);
          ck_assert_int_eq(runs[1].global, C + o);
          ck_assert_int_eq(runs[1].rows, h / 2);
        } else { /* the second half of k, then v */
          ck_assert_int_eq(runs[0].global, C + o + h / 2);
          ck_assert_int_eq(runs[0].rows, h / 2);
          ck_assert_int_eq(runs[1].global, 2 * C + o);
          ck_assert_int_eq(runs[1].rows, h);
        }
      }
      /* FSDP gives the dp_shard cut back: the tp piece again */
      ck_assert_int_eq(tr_dtensor_param_unshard(&m.params[w], "dp_shard"), 0);
      ck_assert_int_eq(l->skip, 0);
      ck_assert_int_eq(l->shape[0], piece);
      tr_model_release(&m);
    }
  tr_model_release(&ref);
}
END_TEST

/* A GPT-2 file of the one-rank model (safetensors) loads into every TP 4
 * rank as the pieces the init gives that rank, strided c_attn included. */
START_TEST(test_import_pieces) {
  tr_model_config_t c;
  ck_assert_int_eq(small_config(0, &c), 0);
  char dir[] = "/tmp/check_tp.XXXXXX", path[64];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  tr_model_t ref;
  one_rank_normal(&ref, &c, 5);
  tr_errmsg_t err;
  ck_assert_int_eq(tr_st_export_model(&ref, path, TR_F32, &err), 0);
  for (int r = 0; r < 4; r++) {
    tr_model_t a, b;
    tr_mesh_shape_t s = tp_shape(4, r);
    ck_assert_int_eq(tr_model_init(&a, &c), 0);
    ck_assert_int_eq(tr_model_init(&b, &c), 0);
    ck_assert_int_eq(tr_tp_plan_apply(&a, &s, NULL), 0);
    ck_assert_int_eq(tr_tp_plan_apply(&b, &s, NULL), 0);
    for (int i = 0; i < b.n_params; i++) b.params[i].init = ref.params[i].init;
    ck_assert_int_eq(tr_model_alloc(&a, TR_DEVICE_CPU), 0);
    ck_assert_int_eq(tr_model_alloc(&b, TR_DEVICE_CPU), 0);
    ck_assert_int_eq(tr_st_import_model(&a, path, &err), 0);
    ck_assert_int_eq(tr_model_init_weights(&b, 5), 0);
    for (int i = 0; i < a.n_params; i++)
      ck_assert_msg(memcmp(tr_tensor_data(&a.params[i].data),
                           tr_tensor_data(&b.params[i].data),
                           sizeof(float) *
                               (size_t)tr_tensor_numel(&a.params[i].data)) == 0,
                    "rank %d: '%s' differs", r, a.params[i].name);
    tr_model_release(&a);
    tr_model_release(&b);
  }
  tr_model_release(&ref);
  ck_assert_int_eq(unlink(path), 0);
  ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

/* Bytes of parameters and gradients a rank allocates (host allocator's
 * counters) under TP 4: the one-rank bytes less 3/4 of the split
 * parameters' (up to the allocator's alignment per tensor). */
static int64_t alloc_bytes(const tr_model_config_t* c, int k) {
  tr_model_t m;
  tr_mem_stats_t a, b;
  ck_assert_int_eq(tr_model_init(&m, c), 0);
  tr_mesh_shape_t s = tp_shape(k, k - 1);
  ck_assert_int_eq(tr_tp_plan_apply(&m, &s, NULL), 0);
  tr_mem_stats(TR_MEM_HOST, 0, &a);
  ck_assert_int_eq(tr_model_alloc(&m, TR_DEVICE_CPU), 0);
  tr_mem_stats(TR_MEM_HOST, 0, &b);
  tr_model_release(&m);
  return b.current_bytes - a.current_bytes;
}

START_TEST(test_memory) {
  tr_model_config_t c;
  ck_assert_int_eq(small_config(_i, &c), 0);
  tr_model_t m;
  ck_assert_int_eq(tr_model_init(&m, &c), 0);
  int64_t split = 0; /* elements of the colwise and rowwise parameters */
  for (int i = 0; i < m.n_params; i++) {
    tr_placement_t pl;
    if (tr_tp_placement(&m.params[i], 4, &pl))
      split += m.params[i].shape[0] *
               (m.params[i].ndim > 1 ? m.params[i].shape[1] : 1);
  }
  int64_t one = alloc_bytes(&c, 1), four = alloc_bytes(&c, 4);
  int64_t want = one - 2 * (int64_t)sizeof(float) * split * 3 / 4;
  ck_assert_int_gt(split, 0);
  ck_assert_msg(llabs(four - want) <= 2 * 64 * m.n_params,
                "tp 4 allocates %lld bytes, expected %lld (1 rank: %lld)",
                (long long)four, (long long)want, (long long)one);
  tr_model_release(&m);
}
END_TEST

START_TEST(test_spec_refuses_parts) {
  /* a DTensor spec has no strided redistribute (parameter layouts only) */
  tr_pg_t* pg;
  tr_pg_opts_t o;
  tr_pg_opts_init(&o);
  o.backend = "fake";
  o.rank = 0;
  o.world_size = 2;
  ck_assert_int_eq(tr_pg_new(&o, &pg), 0);
  tr_mesh_t* mesh;
  int k = 2;
  const char* names[] = {"tp"};
  ck_assert_int_eq(tr_mesh_init(pg, 1, &k, names, &mesh, NULL), 0);
  tr_dtensor_spec_t spec;
  tr_placement_t pl = tr_placement_shard_parts(0, 3);
  int64_t shape[2] = {12, 2};
  ck_assert_int_eq(tr_dtensor_spec_init(&spec, mesh, &pl, 2, shape),
                   TR_EUNSUPPORTED);
  tr_mesh_free(mesh);
  tr_pg_free(pg);
}
END_TEST

/* ---- on forked ranks ---- */

static int body_llama; /* the family the bodies build */
static int body_vocab; /* its vocabulary (96: split by 2 and 4; 98: not 4) */

static const int B = 2, T = 8;
#define STEPS 20 /* forward and backward passes, AdamW steps between */
/* the four TP models of a run: bit 0 sequence parallel, bit 1 loss
 * parallel */
#define MODES 4
#define MODE_SP(i) ((i)&1)
#define MODE_LP(i) (((i) >> 1) & 1)

static void batch(int32_t* tok, int32_t* tgt, int V, int step) {
  for (int i = 0; i < B * T; i++) {
    tok[i] = (int32_t)((i * 7 + step * 13 + 3) % V);
    tgt[i] = (int32_t)((i * 11 + step * 5 + 1) % V);
  }
  if (step % 3 == 0) tgt[5] = TR_IGNORE_INDEX; /* ignored targets too */
}

/* The hook's calls, counted per point and op, then tr_tp_collective's
 * work. */
typedef struct {
  tr_pg_t* tp;
  int n[TR_TP__POINTS][TR_TP__OPS];
} count_t;

static int counting_hook(void* arg, tr_tp_point_t pt, tr_tp_op_t op,
                         tr_tensor_t* t) {
  count_t* c = arg;
  c->n[pt][op]++;
  return tr_tp_collective(c->tp, pt, op, t);
}

/* Whether the plan split the token table and the output projection. */
static int vocab_split(const tr_model_t* m, int out) {
  const char* name =
      body_llama ? (out ? "lm_head.weight" : "model.embed_tokens.weight")
                 : "transformer.wte.weight";
  return tr_tp_sharded(&m->params[tr_model_find_param(m, name)]);
}

/* Activation checkpointing by step: none on the odd ones, full on 2, 6,
 * ..., selective "op" on 4, 8, ... */
static tr_model_ac_mode_t ac_of(int step) {
  return step % 2 ? TR_AC_NONE : step % 4 ? TR_AC_FULL : TR_AC_OPS;
}

/* The collectives block blk must issue, [point][op] (what the plan and the
 * seam imply): bwd 0 the forward, 1 the backward (or its I pass), with the
 * layer's forward again where it recomputes (recompute 1) or, under SP, the
 * norm outputs gathered again where "op" checkpointing refills them
 * (recompute 2). */
static void expected(const tr_model_t* m, int blk, int bwd, int recompute,
                     int want[TR_TP__POINTS][TR_TP__OPS]) {
  int sp = m->tp.sequence_parallel;
  tr_tp_op_t red = sp ? TR_TP_SCATTER : TR_TP_SUM;
  memset(want, 0, sizeof(int) * TR_TP__POINTS * TR_TP__OPS);
  switch (m->blocks[blk].kind) {
    case TR_BLOCK_LAYER: /* 2 all-reduces; SP: 2 all-gathers + 2 scatters */
      if (!bwd || recompute == 1) {
        want[TR_TP_FWD_OUT][red] = 2;
        want[TR_TP_FWD_IN][TR_TP_GATHER] = sp ? 2 : 0;
      }
      if (bwd && recompute == 2) want[TR_TP_FWD_IN][TR_TP_GATHER] = sp ? 2 : 0;
      if (bwd) {
        want[TR_TP_BWD_IN][red] = 2;
        want[TR_TP_BWD_OUT][TR_TP_GATHER] = sp ? 2 : 0;
        want[TR_TP_GRAD][TR_TP_SUM] = sp ? 2 : 0; /* the two norms */
      }
      break;
    case TR_BLOCK_EMBED:
      if (!bwd && vocab_split(m, 0)) want[TR_TP_EMBED_OUT][red] = 1;
      if (bwd && sp) want[TR_TP_BWD_OUT][TR_TP_GATHER] = 1;
      break;
    case TR_BLOCK_HEAD:
      if (!bwd) {
        want[TR_TP_FWD_IN][TR_TP_GATHER] = sp;
        if (vocab_split(m, 1) && m->tp.loss_parallel)
          want[TR_TP_LOSS][TR_TP_MAX] = want[TR_TP_LOSS][TR_TP_SUM] = 1;
        else if (vocab_split(m, 1))
          want[TR_TP_LOSS][TR_TP_GATHER_LAST] = 1;
      } else {
        want[TR_TP_BWD_IN][red] = vocab_split(m, 1);
        want[TR_TP_GRAD][TR_TP_SUM] = sp; /* the final norm */
      }
      break;
  }
}

static void check_counts(const tr_model_t* m, count_t* c, int blk, int bwd,
                         int recompute) {
  int want[TR_TP__POINTS][TR_TP__OPS];
  expected(m, blk, bwd, recompute, want);
  for (int p = 0; p < TR_TP__POINTS; p++)
    for (int o = 0; o < TR_TP__OPS; o++)
      if (c->n[p][o] != want[p][o]) {
        fprintf(stderr, "block %s %s: point %d op %d called %d times, not %d\n",
                m->blocks[blk].name, bwd ? "backward" : "forward", p, o,
                c->n[p][o], want[p][o]);
        PCHECK(0);
      }
  memset(c->n, 0, sizeof c->n);
}

/* One forward and backward of the step's batch, block by block (step 3:
 * the backward as its input and weight halves, all I then all W); with c,
 * every block's collectives are checked against expected(). */
static double fwd_bwd(tr_model_t* m, int step, count_t* c) {
  int32_t tok[B * T], tgt[B * T];
  batch(tok, tgt, m->cfg.vocab_size, step);
  tr_model_mb_t mb;
  if (c) memset(c->n, 0, sizeof c->n);
  PCHECK_RC(tr_model_zero_grad(m));
  PCHECK_RC(tr_model_mb_init(m, &mb, B, T, tok, tgt));
  for (int b = 0; b < m->n_blocks; b++) {
    PCHECK_RC(tr_model_block_forward(m, &mb, b));
    if (c) check_counts(m, c, b, 0, 0);
  }
  double loss = tr_model_mb_loss(&mb);
  for (int b = m->n_blocks - 1; b >= 0; b--) {
    int rec = m->blocks[b].kind != TR_BLOCK_LAYER             ? 0
              : tr_model_ac_recomputes(m, m->blocks[b].layer) ? 1
              : ac_of(step) == TR_AC_OPS                      ? 2
                                                              : 0;
    if (step == 3)
      PCHECK_RC(tr_model_block_backward_input(m, &mb, b));
    else
      PCHECK_RC(tr_model_block_backward(m, &mb, b));
    if (c) check_counts(m, c, b, 1, rec);
  }
  if (step == 3) { /* W: no collective */
    PCHECK_RC(tr_model_backward_weight(m, &mb, 0, m->n_blocks));
    if (c)
      for (int p = 0; p < TR_TP__POINTS; p++)
        for (int o = 0; o < TR_TP__OPS; o++) PCHECK(c->n[p][o] == 0);
  }
  tr_model_mb_release(m, &mb);
  return loss;
}

/* Under no_grad: the mean loss of the step's batch, and (targets NULL)
 * the logits [B, T, V] on the host in *logits. */
static double eval_fwd(tr_model_t* m, int step, int with_targets,
                       tr_tensor_t* logits) {
  int32_t tok[B * T], tgt[B * T];
  batch(tok, tgt, m->cfg.vocab_size, step);
  tr_model_mb_t mb;
  PCHECK_RC(tr_model_mb_init(m, &mb, B, T, tok, with_targets ? tgt : NULL));
  mb.no_grad = 1;
  PCHECK_RC(tr_model_forward(m, &mb, 0, m->n_blocks));
  double loss = tr_model_mb_loss(&mb);
  if (logits) {
    PCHECK(mb.logits.ndim == 3 && mb.logits.shape[2] == m->cfg.vocab_size);
    PCHECK_RC(tr_tensor_contiguous(logits, &mb.logits));
  }
  tr_model_mb_release(m, &mb);
  return loss;
}

/* Max |a - b| over p's whole tensor, from this rank's piece local; with
 * skip, GPT-2's key bias (the middle third of c_attn.bias) is left out
 * (see body_tp). */
static double gathered_diff(const tr_param_t* p, const tr_tensor_t* local,
                            tr_pg_t* tp, const tr_tensor_t* ref, int bytes,
                            int skip) {
  tr_tensor_t full = {0};
  PCHECK_RC(tr_tp_gather(p, local, tp, &full));
  const float* a = tr_tensor_data(&full);
  const float* b = tr_tensor_data(ref);
  int64_t n = tr_tensor_numel(ref);
  PCHECK(tr_tensor_numel(&full) == n);
  double d = 0;
  if (bytes)
    d = memcmp(a, b, sizeof(float) * (size_t)n) ? 1 : 0;
  else
    for (int64_t i = 0; i < n; i++) {
      if (skip && strstr(p->name, "c_attn.bias") && i >= n / 3 && i < 2 * n / 3)
        continue;
      if (fabs((double)a[i] - b[i]) > d) d = fabs((double)a[i] - b[i]);
    }
  tr_tensor_release(&full);
  return d;
}

static double rel(double a, double b) { return fabs(a - b) / fabs(b); }

/* Host bytes a training forward of 8 x T tokens holds at its peak above
 * what was held before it (the activations), the median of three (and,
 * under SP, what it holds at its end checked against
 * tr_model_activation_bytes), for c
 * with 8 layers (so that what the layers keep outweighs the collectives'
 * temporaries) under the TP plan of shape, sequence parallel sp. The
 * counters are the process's: the median keeps a background thread's
 * allocations out. */
static int64_t forward_peak(tr_model_config_t c, const tr_mesh_shape_t* shape,
                            tr_pg_t* tp, int sp) {
  enum { PB = 8 };
  tr_model_t m;
  tr_tp_opts_t o;
  tr_tp_opts_init(&o);
  o.sequence_parallel = sp;
  c.n_layers = 8;
  PCHECK_RC(tr_model_init(&m, &c));
  PCHECK_RC(tr_tp_plan_apply(&m, shape, NULL));
  PCHECK_RC(tr_model_alloc(&m, TR_DEVICE_CPU));
  PCHECK_RC(tr_model_init_weights(&m, 1));
  tr_tp_install(&m, tp, &o);
  int32_t tok[PB * T], tgt[PB * T];
  for (int i = 0; i < PB * T; i++) {
    tok[i] = (int32_t)((i * 7 + 3) % c.vocab_size);
    tgt[i] = (int32_t)((i * 11 + 1) % c.vocab_size);
  }
  int64_t peak[3], held = 0;
  for (int r = 0; r < 3; r++) {
    tr_model_mb_t mb;
    tr_mem_stats_t a, b;
    PCHECK_RC(tr_model_mb_init(&m, &mb, PB, T, tok, tgt));
    tr_mem_stats(TR_MEM_HOST, 0, &a);
    tr_mem_reset_peak(TR_MEM_HOST, 0);
    PCHECK_RC(tr_model_forward(&m, &mb, 0, m.n_blocks));
    tr_mem_stats(TR_MEM_HOST, 0, &b);
    tr_model_mb_release(&m, &mb);
    peak[r] = b.peak_bytes - a.current_bytes;
    held = b.current_bytes - a.current_bytes; /* the last: caches made */
  }
  /* under SP what the forward holds at its end is, byte for byte, what
   * tr_model_activation_bytes says for this rank */
  if (sp) {
    int64_t want = tr_model_activation_bytes(&c, 0, c.n_layers + 2, PB * T,
                                             tr_pg_size(tp), 4);
    if (held != want)
      fprintf(stderr,
              "%s tp %d: the forward holds %lld bytes, "
              "tr_model_activation_bytes says %lld\n",
              c.family == TR_MODEL_GPT2 ? "gpt2" : "llama3", tr_pg_size(tp),
              (long long)held, (long long)want);
    PCHECK(held == want);
  }
  tr_model_release(&m);
  int64_t lo = peak[0] < peak[1] ? peak[0] : peak[1];
  int64_t hi = peak[0] < peak[1] ? peak[1] : peak[0];
  return peak[2] < lo ? lo : peak[2] > hi ? hi : peak[2];
}

static void body_tp(tr_pg_t* world, pg_ctx_t* ctx) {
  tr_model_config_t c;
  PCHECK_RC(small_config(body_llama, &c));
  c.vocab_size = body_vocab;
  const uint64_t seed = 1234;
  const char* fam = body_llama ? "llama3" : "gpt2";
  /* the one-rank model */
  tr_model_t ref;
  PCHECK_RC(tr_model_init(&ref, &c));
  PCHECK_RC(tr_model_alloc(&ref, TR_DEVICE_CPU));
  PCHECK_RC(tr_model_init_weights(&ref, seed));
  /* the TP models on a 1-d mesh "tp" over every rank, one per mode */
  tr_mesh_t* mesh;
  int k = ctx->size;
  const char* names[] = {"tp"};
  PCHECK_RC(tr_mesh_init(world, 1, &k, names, &mesh, NULL));
  tr_pg_t* tp = tr_mesh_dim_pg(mesh, "tp");
  tr_mesh_shape_t shape;
  tr_mesh_get_shape(mesh, &shape);
  tr_model_t m[MODES];
  count_t calls[MODES];
  tr_errmsg_t err;
  for (int i = 0; i < MODES; i++) {
    PCHECK_RC(tr_model_init(&m[i], &c));
    PCHECK_RC(tr_tp_plan_apply(&m[i], &shape, &err));
    PCHECK_RC(tr_model_alloc(&m[i], TR_DEVICE_CPU));
    PCHECK_RC(tr_model_init_weights(&m[i], seed));
    tr_tp_opts_t o;
    tr_tp_opts_init(&o);
    PCHECK(o.sequence_parallel == 1 && o.loss_parallel == 1); /* defaults */
    o.sequence_parallel = MODE_SP(i);
    o.loss_parallel = MODE_LP(i);
    tr_tp_install(&m[i], NULL, &o); /* none: the bits of no seam */
    PCHECK(m[i].tp.fn == NULL);
    tr_tp_install(&m[i], tp, &o);
    PCHECK(m[i].tp.fn == tr_tp_collective && m[i].tp.arg == tp &&
           m[i].tp.size == k && m[i].tp.rank == ctx->rank &&
           m[i].tp.sequence_parallel == MODE_SP(i) &&
           m[i].tp.loss_parallel == MODE_LP(i));
    calls[i].tp = tp;
    m[i].tp.fn = counting_hook;
    m[i].tp.arg = &calls[i];
  }
  /* init: the gathered pieces are the one-rank tensors, byte for byte */
  int nsharded = 0, vsplit = c.vocab_size % k == 0;
  for (int i = 0; i < m[0].n_params; i++) {
    nsharded += tr_tp_sharded(&m[0].params[i]);
    PCHECK(gathered_diff(&m[0].params[i], &m[0].params[i].data, tp,
                         &ref.params[i].data, 1, 0) == 0);
  }
  /* GPT-2: c_attn weight and bias, c_proj, c_fc weight and bias, the MLP's
   * c_proj, and the tied wte; Llama: q, k, v, o, gate, up, down, and the
   * embedding and the output */
  PCHECK(nsharded == c.n_layers * (body_llama ? 7 : 6) +
                         (vsplit ? (body_llama ? 2 : 1) : 0));
  PCHECK(vocab_split(&m[0], 0) == vsplit && vocab_split(&m[0], 1) == vsplit);
  /* SP needs tp to divide T: refused before any collective */
  {
    int32_t tok[6] = {1, 2, 3, 4, 5, 6};
    tr_model_mb_t mb;
    PCHECK_RC(tr_model_mb_init(&m[1], &mb, 1, 6, tok, tok));
    PCHECK(tr_model_forward(&m[1], &mb, 0, m[1].n_blocks) ==
           (6 % k ? TR_ECONFIG : 0));
    tr_model_mb_release(&m[1], &mb);
  }
  /* evaluation: no_grad losses, and logits whole without targets */
  {
    tr_tensor_t lr = {0}, lt = {0};
    double er = eval_fwd(&ref, 1, 1, NULL);
    eval_fwd(&ref, 1, 0, &lr);
    for (int i = 0; i < MODES; i++) {
      double et = eval_fwd(&m[i], 1, 1, NULL);
      PCHECK(rel(et, er) < 1e-5);
      PCHECK(isnan(eval_fwd(&m[i], 1, 0, &lt)));
      double d = 0;
      const float* a = tr_tensor_data(&lt);
      const float* b = tr_tensor_data(&lr);
      for (int64_t j = 0; j < tr_tensor_numel(&lr); j++)
        d = fmax(d, fabs((double)a[j] - b[j]));
      PCHECK(d < 1e-5);
      tr_tensor_release(&lt);
    }
    tr_tensor_release(&lr);
  }
  tr_tensor_t *rm, *rv, *tm[MODES], *tv[MODES];
  ts_moments(&ref, NULL, &rm, &rv);
  for (int i = 0; i < MODES; i++) ts_moments(&m[i], NULL, &tm[i], &tv[i]);
  double worst = 0, worst_pair = 0;
  for (int step = 1; step <= STEPS; step++) {
    double lr = fwd_bwd(&ref, step, NULL), sr = 0, lt[MODES], st[MODES];
    PCHECK_RC(tr_tp_grad_sq_norm(&ref, NULL, NULL, &sr));
    PCHECK(sr > 0);
    for (int i = 0; i < MODES; i++) {
      /* the even steps recompute every layer in backward, or its norm
       * outputs (the forward's collectives run again there) */
      PCHECK_RC(tr_model_set_activation_checkpoint(&m[i], ac_of(step), 1));
      lt[i] = fwd_bwd(&m[i], step, &calls[i]);
      PCHECK(isfinite(lt[i]));
      double gmax = 0;
      for (int j = 0; j < m[i].n_params; j++) {
        double d = gathered_diff(&m[i].params[j], &m[i].params[j].grad, tp,
                                 &ref.params[j].grad, 0, 0);
        if (d > gmax) gmax = d;
      }
      PCHECK(gmax < 1e-5);
      PCHECK_RC(tr_tp_grad_sq_norm(&m[i], tp, NULL, &st[i]));
      worst = fmax(worst, fmax(rel(lt[i], lr), rel(sqrt(st[i]), sqrt(sr))));
      PCHECK(rel(lt[i], lr) < 1e-5 && rel(sqrt(st[i]), sqrt(sr)) < 1e-5);
    }
    /* SP on vs off, loss parallel on vs off */
    static const int pairs[4][2] = {{0, 1}, {2, 3}, {0, 2}, {1, 3}};
    for (int q = 0; q < 4; q++) {
      int a = pairs[q][0], b = pairs[q][1];
      double d = fmax(rel(lt[a], lt[b]), rel(sqrt(st[a]), sqrt(st[b])));
      worst_pair = fmax(worst_pair, d);
      PCHECK(d < 1e-6);
    }
    if (ctx->rank == 0 && (step == 1 || step == STEPS))
      fprintf(stderr,
              "%s V %d tp %d step %d: loss %.9g, worst relative difference "
              "of loss and grad norm against 1 rank %.3g, between modes "
              "%.3g\n",
              fam, c.vocab_size, k, step, lr, worst, worst_pair);
    if (step == STEPS) break; /* the last one only compares */
    ts_adamw(&ref, rm, rv, NULL, step);
    for (int i = 0; i < MODES; i++) ts_adamw(&m[i], tm[i], tv[i], NULL, step);
  }
  /* the weights after 19 steps. GPT-2's key bias has an exact gradient of
   * 0 (softmax ignores a shift of every score of a row): AdamW's
   * m / sqrt(v) turns its rounding noise into lr-sized steps that differ
   * with the summation order (1.3e-4 after 19 steps at lr 1e-3, in the
   * one-rank run a random walk as well), and the loss does not see it; it
   * is left out. Every other weight is held to 1e-4: the same
   * normalization lets elements with gradients near 0 drift (1.6e-5 seen
   * in GPT-2's c_attn with a whole vocabulary under SP, 7e-6 without) */
  for (int i = 0; i < MODES; i++) {
    double wmax = 0;
    int at = 0;
    for (int j = 0; j < m[i].n_params; j++) {
      double d = gathered_diff(&m[i].params[j], &m[i].params[j].data, tp,
                               &ref.params[j].data, 0, 1);
      if (d > wmax) wmax = d, at = j;
    }
    if (ctx->rank == 0)
      fprintf(stderr,
              "%s V %d tp %d sp %d lp %d: weights after %d AdamW steps "
              "max-abs %.3g (%s)\n",
              fam, c.vocab_size, k, MODE_SP(i), MODE_LP(i), STEPS - 1, wmax,
              m[i].params[at].name);
    PCHECK(wmax < 1e-4);
  }
  /* sequence parallel lowers the activations' peak of a forward */
  int64_t off = forward_peak(c, &shape, tp, 0);
  int64_t on = forward_peak(c, &shape, tp, 1);
  if (ctx->rank == 0)
    fprintf(stderr, "%s V %d tp %d: forward peak %lld bytes, %lld with SP\n",
            fam, c.vocab_size, k, (long long)off, (long long)on);
  PCHECK(on < off);
  ts_free_moments(&ref, rm, rv);
  for (int i = 0; i < MODES; i++) {
    ts_free_moments(&m[i], tm[i], tv[i]);
    tr_model_release(&m[i]);
  }
  tr_model_release(&ref);
  tr_mesh_free(mesh);
}

/* Bytes the host allocator holds once a trainer for cfg exists (its
 * parameters, gradients, AdamW moments and the rest of its state), above
 * what it held before; tp NULL: one rank. */
static int64_t trainer_state(const tr_config_t* cfg,
                             const tr_model_config_t* mc,
                             const tr_trainer_tp_t* tp) {
  tr_trainer_opts_t to = {.tp = tp, .quiet = 1};
  int64_t state;
  PCHECK_RC(fx_trainer_bytes(cfg, mc, &to, 0, &state, NULL));
  return state;
}

/* A trainer under TP over every rank holds, per rank, the one-rank
 * trainer's bytes less (tp - 1)/tp of the split parameters' four fp32
 * copies: the weights, their gradients and both AdamW moments. */
static void body_trainer_memory(tr_pg_t* world, pg_ctx_t* ctx) {
  int k = ctx->size;
  char tpk[8], data[1024];
  snprintf(tpk, sizeof tpk, "%d", k);
  snprintf(data, sizeof data, "%s/examples/data/tinytales.txt", tp_srcdir());
  const char* ov[] = {"--training.dataset_path",
                      data,
                      "--training.local_batch_size",
                      "1",
                      "--training.seq_len",
                      "16",
                      "--validation.enable=false",
                      "--model.name",
                      "llama3",
                      "--parallelism.tensor_parallel_degree",
                      tpk};
  int nov = (int)(sizeof ov / sizeof ov[0]);
  tr_config_t c1, ck;
  tr_errmsg_t err;
  PCHECK_RC(tr_config_load(&c1, NULL, nov - 2, (char**)ov, &err));
  PCHECK_RC(tr_config_resolve(&c1, 1, &err));
  PCHECK_RC(tr_config_load(&ck, NULL, nov, (char**)ov, &err));
  PCHECK_RC(tr_config_resolve(&ck, k, &err));
  tr_model_config_t mc;
  PCHECK_RC(small_config(1, &mc));
  mc.vocab_size = 256; /* the text's bytes; tp 2 and 4 divide it */
  tr_model_t m;
  PCHECK_RC(tr_model_init(&m, &mc));
  int64_t split = 0; /* elements of the parameters the plan splits */
  for (int i = 0; i < m.n_params; i++) {
    tr_placement_t pl;
    if (tr_tp_placement(&m.params[i], k, &pl))
      split += m.params[i].shape[0] *
               (m.params[i].ndim > 1 ? m.params[i].shape[1] : 1);
  }
  int np = m.n_params;
  tr_model_release(&m);
  PCHECK(split > 0);
  int64_t one = trainer_state(&c1, &mc, NULL);
  tr_mesh_t* mesh;
  const char* names[] = {"tp"};
  PCHECK_RC(tr_mesh_init(world, 1, &k, names, &mesh, NULL));
  tr_trainer_tp_t tp = {.pg = tr_mesh_dim_pg(mesh, "tp"),
                        .loss_parallel = 1,
                        .sequence_parallel = 1};
  tr_mesh_get_shape(mesh, &tp.mesh);
  int64_t got = trainer_state(&ck, &mc, &tp);
  int64_t want = one - 4 * (int64_t)sizeof(float) * split * (k - 1) / k;
  /* the allocator rounds each tensor up to 64 bytes */
  int64_t slack = 4 * 64 * (int64_t)np;
  if (llabs(got - want) > slack)
    fprintf(stderr,
            "rank %d: tp %d trainer holds %lld bytes, expected %lld +- %lld "
            "(one rank: %lld, split elements %lld)\n",
            ctx->rank, k, (long long)got, (long long)want, (long long)slack,
            (long long)one, (long long)split);
  PCHECK(llabs(got - want) <= slack);
  tr_mesh_free(mesh);
  tr_config_release(&c1);
  tr_config_release(&ck);
}

START_TEST(test_trainer_memory) {
  int n = 2 * _i, st[4];
  ck_assert_int_eq(
      pg_spawn(n, "gloo", TR_DEV_CPU, 1, 30000, body_trainer_memory, 120, st),
      0);
  for (int r = 0; r < n; r++)
    ck_assert_msg(st[r] == 0, "rank %d of %d exited with %d", r, n, st[r]);
}
END_TEST

static void spawn(int n, int llama, int vocab) {
  body_llama = llama;
  body_vocab = vocab;
  int st[4];
  ck_assert_int_eq(pg_spawn(n, "gloo", TR_DEV_CPU, 1, 30000, body_tp, 240, st),
                   0);
  for (int r = 0; r < n; r++)
    ck_assert_msg(st[r] == 0, "rank %d of %d exited with %d", r, n, st[r]);
}

START_TEST(test_gpt2_tp) { spawn(2 * _i, 0, 96); }
END_TEST

START_TEST(test_llama_tp) { spawn(2 * _i, 1, 96); }
END_TEST

/* a vocabulary tp 4 does not divide: the tables stay whole (the one-rank
 * embedding and head), the layers split as before */
START_TEST(test_tp_whole_vocab) { spawn(4, _i, 98); }
END_TEST

static Suite* tp_suite(void) {
  Suite* s = suite_create("tp");
  TCase* tc = tcase_create("local");
  tcase_add_test(tc, test_strided_placement);
  tcase_add_loop_test(tc, test_plan_placements, 0, 2);
  tcase_add_test(tc, test_plan_errors);
  tcase_add_test(tc, test_strided_init);
  tcase_add_test(tc, test_strided_fsdp);
  tcase_add_test(tc, test_spec_refuses_parts);
  tcase_add_test(tc, test_import_pieces);
  tcase_add_loop_test(tc, test_memory, 0, 2);
  suite_add_tcase(s, tc);
  tc = tcase_create("ranks");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, test_gpt2_tp, 1, 3); /* 2, 4 ranks */
  tcase_add_loop_test(tc, test_llama_tp, 1, 3);
  tcase_add_loop_test(tc, test_tp_whole_vocab, 0, 2); /* gpt2, llama3 */
  tcase_add_loop_test(tc, test_trainer_memory, 1, 3); /* 2, 4 ranks */
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(tp_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
