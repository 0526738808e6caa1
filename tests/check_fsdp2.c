/* tests/check_fsdp2.c: fully sharded data parallel (trainrun/fsdp2.h).
 *
 * Local: torch.chunk rows and padding, the reshard names, the memory plan
 * of a table. On 2 and 4 forked Gloo ranks (tests/pg_suite.h): a tiny
 * Llama whose sizes give uneven and empty shards (dim 6 over 4 ranks: 2,
 * 2, 2, 0 rows; vocab 7: 2, 2, 2, 1) is sharded; every rank checks its
 * shards against the one-rank model, the copy-in buffer (shards padded
 * with zeros), forward losses and reduced gradients (accumulated over two
 * micro-batches) against a one-rank forward and backward of the global
 * batch, the all-gather / prefetch / reduce-scatter counts and group
 * states of each reshard policy and prefetch depth, HSDP 2 x 2, a bfloat16
 * reduce, a tied table, the full gather for export, and the bfloat16 cast
 * of a mixed-precision copy-in. As a pipeline stage's step
 * (tr_dp_t.pipelined, the seam's stage_op): UNSHARD gathers every group
 * once, the groups stay gathered and reduce nothing between the two
 * micro-batches, a REDUCE_GRAD of the later blocks leaves the root group
 * (tied table: embedding and head) to the earlier blocks' REDUCE_GRAD, so
 * each group is one all-gather and one reduce-scatter (and under HSDP one
 * all-reduce) for the step, with the same gradients; with
 * reshard_after_forward always, each forward frees the groups and each
 * backward gathers them again, the reduce-scatters still one a group.
 * Memory: the
 * trainer's per-rank peak under FSDP on 4 ranks against the unsharded
 * size, from the host allocator's counters. [parallelism]
 * fsdp_prefetch_depth 0, 1, 2 through the trainer: the same losses bit for
 * bit, and exactly `depth` layer groups gathered ahead of the one
 * computing. */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launcher/compose.h" /* FSDP from a job config, as the launcher */
#include "tests/fixtures.h"   /* the trainer's settings of a config */
#include "tests/pg_suite.h"
#include "trainrun/config.h"
#include "trainrun/dtensor.h" /* FSDP's mesh */
#include "trainrun/error.h"
#include "trainrun/fsdp2.h"
#include "trainrun/model.h"
#include "trainrun/trainer.h"

/* ---- local ---- */

START_TEST(test_shard_rows) {
  static const struct {
    int64_t dim0;
    int n;
    int64_t pad;
    int64_t rows[4];
  } cases[] = {
      {10, 4, 3, {3, 3, 3, 1}}, {6, 4, 2, {2, 2, 2, 0}},
      {5, 4, 2, {2, 2, 1, 0}},  {3, 4, 1, {1, 1, 1, 0}},
      {2, 4, 1, {1, 1, 0, 0}},  {8, 2, 4, {4, 4}},
      {7, 2, 4, {4, 3}},        {1, 2, 1, {1, 0}},
      {9, 1, 9, {9}},           {0, 2, 0, {0, 0}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ck_assert_int_eq(tr_fsdp_padded_rows(cases[i].dim0, cases[i].n),
                     cases[i].pad);
    int64_t next = 0;
    for (int r = 0; r < cases[i].n; r++) {
      int64_t s, n;
      tr_fsdp_shard_rows(cases[i].dim0, cases[i].n, r, &s, &n);
      ck_assert_msg(n == cases[i].rows[r] && s == (n ? next : s),
                    "dim0 %lld over %d: rank %d got [%lld, +%lld)",
                    (long long)cases[i].dim0, cases[i].n, r, (long long)s,
                    (long long)n);
      ck_assert_int_le(s, cases[i].dim0);
      next = s + n;
    }
    ck_assert_int_eq(next, cases[i].dim0);
  }
}
END_TEST

START_TEST(test_reshard_names) {
  tr_fsdp_reshard_t r;
  ck_assert_int_eq(tr_fsdp_reshard_parse("always", &r), 0);
  ck_assert_int_eq(r, TR_FSDP_RESHARD_ALWAYS);
  ck_assert_int_eq(tr_fsdp_reshard_parse("never", &r), 0);
  ck_assert_int_eq(r, TR_FSDP_RESHARD_NEVER);
  ck_assert_int_eq(tr_fsdp_reshard_parse("default", &r), 0);
  ck_assert_int_eq(r, TR_FSDP_RESHARD_DEFAULT);
  ck_assert_int_eq(tr_fsdp_reshard_parse("sometimes", &r), TR_EINVAL);
  ck_assert_str_eq(tr_fsdp_reshard_name(TR_FSDP_RESHARD_NEVER), "never");
  tr_fsdp_opts_t o;
  tr_fsdp_opts_init(&o);
  tr_fsdp_t* f = (tr_fsdp_t*)1;
  ck_assert_int_eq(tr_fsdp_new(&o, &f), TR_EINVAL); /* no shard group */
  ck_assert_ptr_null(f);
}
END_TEST

/* dim 6 (2,2,2,0 rows on 4 ranks), vocab 7, ffn 10, 3 layers */
static void odd_llama(tr_model_config_t* c, int tied) {
  ck_assert_int_eq(tr_model_config_get("llama3", "debugmodel", c), 0);
  c->vocab_size = 7;
  c->max_seq_len = 8;
  c->dim = 6;
  c->n_layers = 3;
  c->n_heads = 1;
  c->n_kv_heads = 1;
  c->head_dim = 6;
  c->ffn_dim = 10;
  c->tie_embeddings = tied;
}

START_TEST(test_plan) {
  tr_model_config_t c;
  odd_llama(&c, 0);
  tr_model_t m;
  ck_assert_int_eq(tr_model_init(&m, &c), 0);
  int64_t total = tr_model_num_params(&m);
  /* rank 0's rows of every parameter, by hand */
  int64_t want = 0, layer_pad = 0;
  for (int i = 0; i < m.n_params; i++) {
    const tr_param_t* p = &m.params[i];
    int64_t rn = 1;
    for (int d = 1; d < p->ndim; d++) rn *= p->shape[d];
    int64_t s, rows;
    tr_fsdp_shard_rows(p->shape[0], 4, 0, &s, &rows);
    want += rows * rn;
    if (p->block == 1) layer_pad += tr_fsdp_padded_rows(p->shape[0], 4) * rn;
  }
  tr_fsdp_plan_t pl;
  ck_assert_int_eq(tr_fsdp_plan(&m, 1, 4, TR_F32, TR_BF16, &pl), 0);
  ck_assert_int_eq(pl.params, want);
  ck_assert_int_eq(pl.param_bytes, 4 * want);
  ck_assert_int_eq(pl.grad_bytes, 4 * want);
  ck_assert_int_eq(pl.optim_bytes, 8 * want);
  ck_assert_int_eq(pl.unsharded_bytes, 16 * total);
  /* a layer (6x6 x4 + 10x6 x3 + norms) outweighs the root (7x6 x2 + 6) */
  ck_assert_str_eq(pl.group_name, "layers.0");
  ck_assert_int_eq(pl.group_bytes, 2 * 2 * 4 * layer_pad); /* bf16, x2 */
  ck_assert_int_eq(tr_fsdp_plan(&m, 2, 1, TR_F32, TR_F32, &pl), 0);
  ck_assert_int_eq(pl.params, total);
  ck_assert_int_eq(tr_fsdp_plan(&m, 0, 1, TR_F32, TR_F32, &pl), TR_EINVAL);
  tr_model_release(&m);
}
END_TEST

/* ---- on forked ranks ---- */

/* What a body does; set before pg_spawn (the forks inherit it). */
static struct {
  int hsdp; /* 4 ranks as 2 replicas x 2 shards */
  tr_fsdp_reshard_t reshard;
  int prefetch;
  tr_dtype_t reduce;
  int tied;
  /* the step as a pipeline's (tr_dp_t.pipelined): UNSHARD first,
   * REDUCE_GRAD of the head's half, then of the rest, then RESHARD */
  int pipelined;
} job;

static int64_t nelem(const tr_tensor_t* t) { return tr_tensor_numel(t); }

/* Recorded by the observer hooks (added after FSDP's). */
static struct {
  int next_state[16];  /* at pre_forward of layer block b: block b+1's group */
  int head_states[16]; /* at post_forward of the head: every group */
} seen;

static tr_fsdp_t* obs_f;

static int obs_pre_forward(void* arg, tr_model_t* m, int b, tr_model_mb_t* mb) {
  (void)arg;
  (void)mb;
  if (m->blocks[b].kind == TR_BLOCK_LAYER && b + 1 < m->n_blocks - 1) {
    tr_fsdp_group_info_t gi;
    tr_fsdp_group_info(obs_f, tr_fsdp_group_of_block(obs_f, b + 1), &gi);
    seen.next_state[b] = (int)gi.state;
  }
  return 0;
}

static int obs_post_forward(void* arg, tr_model_t* m, int b,
                            tr_model_mb_t* mb) {
  (void)arg;
  (void)mb;
  if (b == m->n_blocks - 1 && !mb->no_grad)
    for (int g = 0; g < tr_fsdp_ngroups(obs_f); g++) {
      tr_fsdp_group_info_t gi;
      tr_fsdp_group_info(obs_f, g, &gi);
      seen.head_states[g] = (int)gi.state;
    }
  return 0;
}

/* The dp_shard and dp_replicate groups of a world of size R x S (rank =
 * replica * S + shard), built by every rank in the same order. */
static void make_groups(tr_pg_t* world, int R, int S, tr_pg_t** shard,
                        tr_pg_t** rep) {
  *shard = *rep = NULL;
  int ranks[8];
  for (int i = 0; i < R; i++) {
    for (int s = 0; s < S; s++) ranks[s] = i * S + s;
    tr_pg_t* g = NULL;
    PCHECK_RC(tr_pg_new_group(world, ranks, S, "dp_shard", &g));
    if (g) *shard = g;
  }
  if (R == 1) return;
  for (int s = 0; s < S; s++) {
    for (int i = 0; i < R; i++) ranks[i] = i * S + s;
    tr_pg_t* g = NULL;
    PCHECK_RC(tr_pg_new_group(world, ranks, R, "dp_replicate", &g));
    if (g) *rep = g;
  }
}

/* Element (global flat index) of the whole tensor ref at local index k of
 * a shard starting at row `start` with row_numel elements per row. */
static float ref_at(const tr_tensor_t* ref, int64_t start, int64_t rn,
                    int64_t k) {
  return ((const float*)tr_tensor_data(ref))[start * rn + k];
}

static void body_grads(tr_pg_t* world, pg_ctx_t* ctx) {
  int R = job.hsdp ? 2 : 1, S = ctx->size / R;
  tr_pg_t *shard, *rep;
  make_groups(world, R, S, &shard, &rep);
  tr_fsdp_opts_t o;
  tr_fsdp_opts_init(&o);
  o.shard_pg = shard;
  o.replicate_pg = rep;
  o.reshard_after_forward = job.reshard;
  o.prefetch_depth = job.prefetch;
  o.reduce_dtype = job.reduce;
  o.divide_factor = 1; /* the loss below is scaled by the global batch */
  tr_fsdp_t* f;
  PCHECK_RC(tr_fsdp_new(&o, &f));
  obs_f = f;

  tr_model_config_t c;
  odd_llama(&c, job.tied);
  tr_model_t ref, m;
  PCHECK_RC(tr_model_init(&ref, &c));
  PCHECK_RC(tr_model_alloc(&ref, TR_DEVICE_CPU));
  PCHECK_RC(tr_model_init_weights(&ref, 7));
  PCHECK_RC(tr_model_init(&m, &c));
  tr_dp_t dist;
  tr_fsdp_dp(f, &dist);
  dist.pipelined = job.pipelined;
  PCHECK_RC(dist.setup_model(dist.arg, &m, &dist)); /* shards m */
  PCHECK(tr_fsdp_shard_model(f, &m) == TR_EINVAL); /* once */
  PCHECK_RC(tr_model_alloc(&m, TR_DEVICE_CPU));
  PCHECK_RC(tr_model_init_weights(&m, 7));
  PCHECK_RC(tr_model_add_hook(&m, TR_HOOK_PRE_FORWARD, obs_pre_forward, NULL));
  PCHECK_RC(
      tr_model_add_hook(&m, TR_HOOK_POST_FORWARD, obs_post_forward, NULL));
  int L = c.n_layers;
  PCHECK(tr_fsdp_ngroups(f) == L + 1);
  PCHECK(dist.dp_size == ctx->size && dist.dp_rank == ctx->rank);
  PCHECK(dist.grads_sharded == R);
  int r = tr_pg_rank(shard);

  /* shards: this rank's rows of the one-rank weights, bit for bit */
  int saw_empty = 0, saw_uneven = 0;
  for (int i = 0; i < m.n_params; i++) {
    tr_param_t* p = &m.params[i];
    int64_t s, rows, rn = 1;
    for (int d = 1; d < p->ndim; d++) rn *= p->shape[d];
    tr_fsdp_shard_rows(p->shape[0], S, r, &s, &rows);
    PCHECK(p->layout.offset[0] == s && p->layout.shape[0] == rows);
    PCHECK(p->data.shape[0] == rows && nelem(&p->grad) == rows * rn);
    saw_empty |= rows == 0;
    saw_uneven |= rows > 0 && rows < tr_fsdp_padded_rows(p->shape[0], S);
    for (int64_t k = 0; k < rows * rn; k++)
      PCHECK(((float*)tr_tensor_data(&p->data))[k] ==
             ref_at(&ref.params[i].data, s, rn, k));
  }
  if (S == 4 && r == S - 1) PCHECK(saw_empty && saw_uneven);

  /* copy-in: every param's rows, then zeros to ceil(dim0 / S) rows */
  for (int g = 0; g < tr_fsdp_ngroups(f); g++) {
    tr_tensor_t in;
    PCHECK_RC(tr_fsdp_copy_in(f, g, &in));
    tr_fsdp_group_info_t gi;
    PCHECK_RC(tr_fsdp_group_info(f, g, &gi));
    PCHECK(gi.state == TR_FSDP_SHARDED && nelem(&in) == gi.shard_numel);
    const float* x = tr_tensor_data(&in);
    int64_t off = 0, n = 0;
    for (int i = 0; i < m.n_params; i++) {
      tr_param_t* p = &m.params[i];
      int blk = p->block;
      if (tr_fsdp_group_of_block(f, blk) != g) continue;
      int64_t s, rows, rn = 1;
      for (int d = 1; d < p->ndim; d++) rn *= p->shape[d];
      tr_fsdp_shard_rows(p->shape[0], S, r, &s, &rows);
      int64_t pad = tr_fsdp_padded_rows(p->shape[0], S) * rn;
      for (int64_t k = 0; k < pad; k++)
        PCHECK(x[off + k] ==
               (k < rows * rn ? ref_at(&ref.params[i].data, s, rn, k) : 0.0f));
      off += pad;
      n++;
    }
    PCHECK(off == gi.shard_numel && n == gi.n_params);
    tr_tensor_release(&in);
  }

  /* the global batch: dp x B sequences; this rank takes its B */
  enum { B = 2, T = 5 };
  int dp = ctx->size, G = dp * B;
  int32_t tok[8 * B * T], tgt[8 * B * T];
  for (int i = 0; i < G * T; i++) {
    tok[i] = (i * 5 + 3) % c.vocab_size;
    tgt[i] = (i * 3 + 1 + i / 7) % c.vocab_size;
  }
  float scale = 1.0f / (float)(G * T);
  /* one rank: two backwards of the whole batch */
  tr_model_mb_t mb;
  PCHECK_RC(tr_model_zero_grad(&ref));
  double ref_loss = 0;
  for (int a = 0; a < 2; a++) {
    PCHECK_RC(tr_model_mb_init(&ref, &mb, G, T, tok, tgt));
    mb.loss_scale = scale;
    PCHECK_RC(tr_model_forward(&ref, &mb, 0, ref.n_blocks));
    ref_loss = mb.loss_sum;
    PCHECK_RC(tr_model_backward(&ref, &mb, 0, ref.n_blocks));
    tr_model_mb_release(&ref, &mb);
  }
  /* sharded: the same, each rank on its slice */
  int drank = dist.dp_rank;
  PCHECK_RC(tr_model_zero_grad(&m));
  double sums[2] = {0, 0};
  tr_fsdp_stats_t st0, st1;
  tr_fsdp_stats(f, &st0);
  int nb = m.n_blocks, mid = nb / 2;
  if (job.pipelined) /* the stage's UNSHARD: every group's all-gather */
    PCHECK_RC(dist.stage_op(dist.arg, &m, TR_DP_UNSHARD, 0, nb));
  for (int a = 0; a < 2; a++) {
    if (job.pipelined && a == 1) { /* no reduction, nothing freed yet
                                      (always: the backward gathered the
                                      groups again) */
      int again = job.reshard == TR_FSDP_RESHARD_ALWAYS;
      tr_fsdp_stats(f, &st1);
      PCHECK(st1.reduce_scatters == st0.reduce_scatters &&
             st1.all_gathers - st0.all_gathers == (1 + again) * (L + 1));
      for (int g = 0; g <= L; g++) {
        tr_fsdp_group_info_t gi;
        PCHECK_RC(tr_fsdp_group_info(f, g, &gi));
        PCHECK(gi.state == TR_FSDP_UNSHARDED);
      }
    }
    PCHECK_RC(tr_model_mb_init(&m, &mb, B, T, tok + drank * B * T,
                               tgt + drank * B * T));
    mb.loss_scale = scale;
    memset(&seen, 0xff, sizeof seen);
    PCHECK_RC(tr_model_forward(&m, &mb, 0, m.n_blocks));
    sums[0] = mb.loss_sum;
    sums[1] = (double)mb.n_valid;
    /* reshard_after_forward: who is still whole after the forward */
    for (int g = 0; g <= L; g++) {
      int whole = seen.head_states[g] == TR_FSDP_UNSHARDED;
      int want = job.reshard == TR_FSDP_RESHARD_ALWAYS ? 0
                 : job.pipelined || job.reshard == TR_FSDP_RESHARD_NEVER
                     ? 1
                     : g == 0;
      PCHECK(whole == want);
    }
    /* prefetch: the next layer's all-gather was issued before this one
     * computed (depth >= 1), or not at all (0) */
    for (int b = 1; b < L; b++)
      PCHECK(job.prefetch ? seen.next_state[b] != TR_FSDP_SHARDED
                          : seen.next_state[b] == TR_FSDP_SHARDED);
    PCHECK_RC(tr_model_backward(&m, &mb, 0, m.n_blocks));
    tr_model_mb_release(&m, &mb);
  }
  if (job.pipelined) {
    /* the later stage's REDUCE_GRAD: its layers' groups, not the root's,
     * which the earlier stage (the embedding) still uses */
    PCHECK_RC(dist.stage_op(dist.arg, &m, TR_DP_REDUCE_GRAD, mid, nb));
    tr_fsdp_stats(f, &st1);
    PCHECK(st1.reduce_scatters - st0.reduce_scatters == nb - 1 - mid);
    tr_fsdp_group_info_t gi;
    PCHECK_RC(tr_fsdp_group_info(f, 0, &gi));
    PCHECK(gi.state == TR_FSDP_UNSHARDED);
    PCHECK_RC(dist.stage_op(dist.arg, &m, TR_DP_REDUCE_GRAD, 0, mid));
    PCHECK_RC(dist.stage_op(dist.arg, &m, TR_DP_RESHARD, 0, nb));
    tr_fsdp_stats(f, &st1);
    PCHECK(st1.reduce_scatters - st0.reduce_scatters == L + 1);
  }
  PCHECK_RC(tr_fsdp_sync_grads(f));
  tr_fsdp_stats(f, &st1);
  /* communication per forward + backward (pipelined: per step) */
  int64_t ag = st1.all_gathers - st0.all_gathers;
  if (job.pipelined) { /* one all-gather and one reduction a group
                          (always: again in each backward, the layers'
                          prefetched) */
    int again = job.reshard == TR_FSDP_RESHARD_ALWAYS;
    PCHECK(ag == (L + 1) * (1 + 2 * again));
    PCHECK(st1.prefetches - st0.prefetches == L + 1 + again * 2 * L);
    PCHECK(st1.reduce_scatters - st0.reduce_scatters == L + 1);
    PCHECK(st1.all_reduces - st0.all_reduces == (R > 1 ? L + 1 : 0));
  } else {
  int64_t want_ag = job.reshard == TR_FSDP_RESHARD_NEVER    ? L + 1
                    : job.reshard == TR_FSDP_RESHARD_ALWAYS ? 2 * L + 2
                                                            : 2 * L + 1;
  PCHECK(ag == 2 * want_ag);
  int64_t want_pf = job.prefetch == 0                      ? 0
                    : job.reshard == TR_FSDP_RESHARD_NEVER ? L
                                                           : 2 * L;
  PCHECK(st1.prefetches - st0.prefetches == 2 * want_pf);
  PCHECK(st1.reduce_scatters - st0.reduce_scatters == 2 * (L + 1));
  PCHECK(st1.all_reduces - st0.all_reduces == (R > 1 ? 2 * (L + 1) : 0));
  }
  for (int g = 0; g <= L; g++) {
    tr_fsdp_group_info_t gi;
    PCHECK_RC(tr_fsdp_group_info(f, g, &gi));
    PCHECK(gi.state == TR_FSDP_SHARDED);
  }
  /* the loss of the last micro-batch, summed over ranks */
  PCHECK_RC(tr_fsdp_all_reduce_sum(f, sums, 2));
  PCHECK(sums[1] == G * T);
  PCHECK(fabs(sums[0] - ref_loss) <= 1e-5 * fabs(ref_loss));
  /* the reduced grads: this rank's rows of the one-rank grads */
  double tol = job.reduce == TR_BF16 ? 1e-2 : 2e-5;
  double worst = 0;
  for (int i = 0; i < m.n_params; i++) {
    tr_param_t* p = &m.params[i];
    int64_t s, rows, rn = 1;
    for (int d = 1; d < p->ndim; d++) rn *= p->shape[d];
    tr_fsdp_shard_rows(p->shape[0], S, r, &s, &rows);
    PCHECK(p->grad.shape[0] == rows);
    const tr_tensor_t* rg = &ref.params[i].grad;
    double mx = 0;
    for (int64_t k = 0; k < nelem(rg); k++)
      mx = fmax(mx, fabs(((float*)tr_tensor_data(rg))[k]));
    for (int64_t k = 0; k < rows * rn; k++) {
      double a = ((float*)tr_tensor_data(&p->grad))[k];
      double b = ref_at(rg, s, rn, k);
      double d = fabs(a - b) / (mx + 1e-12);
      if (d > worst) worst = d;
      if (d > tol) {
        fprintf(stderr, "rank %d: %s[%lld]: %.9g, one rank %.9g\n", ctx->rank,
                p->name, (long long)(s * rn + k), a, b);
        PCHECK(d <= tol);
      }
    }
  }
  if (ctx->rank == 0)
    fprintf(stderr,
            "fsdp %dx%d reshard %s prefetch %d reduce %s%s%s: max "
            "grad difference %.3g of the largest\n",
            R, S, tr_fsdp_reshard_name(job.reshard), job.prefetch,
            tr_dtype_name(job.reduce), job.tied ? " tied" : "",
            job.pipelined ? " pipelined" : "", worst);

  /* a forward without grads (eval) leaves every group sharded */
  PCHECK_RC(tr_model_mb_init(&m, &mb, B, T, tok, tgt));
  mb.no_grad = 1;
  PCHECK_RC(tr_model_forward(&m, &mb, 0, m.n_blocks));
  tr_model_mb_release(&m, &mb);
  for (int g = 0; g <= L; g++) {
    tr_fsdp_group_info_t gi;
    PCHECK_RC(tr_fsdp_group_info(f, g, &gi));
    PCHECK(gi.state == TR_FSDP_SHARDED);
  }

  /* the whole weights for export: equal to the one-rank init */
  PCHECK_RC(tr_fsdp_gather_full(f));
  for (int i = 0; i < m.n_params; i++) {
    tr_param_t* p = &m.params[i];
    PCHECK(p->layout.offset[0] == 0 && p->layout.shape[0] == p->shape[0]);
    PCHECK(tr_tensor_same_shape(&p->data, &ref.params[i].data));
    PCHECK(memcmp(tr_tensor_data(&p->data), tr_tensor_data(&ref.params[i].data),
                  tr_tensor_nbytes(&p->data)) == 0);
  }
  tr_model_release(&m);
  tr_model_release(&ref);
  tr_fsdp_free(f);
  tr_pg_free(rep);
  tr_pg_free(shard);
}

/* Mixed precision: the copy-in casts the fp32 shards to the all-gather
 * dtype (bfloat16, rounded to nearest even), padding included. */
static void body_bf16_copy_in(tr_pg_t* world, pg_ctx_t* ctx) {
  tr_fsdp_opts_t o;
  tr_fsdp_opts_init(&o);
  o.shard_pg = world;
  o.param_dtype = TR_BF16;
  tr_fsdp_t* f;
  PCHECK_RC(tr_fsdp_new(&o, &f));
  tr_model_config_t c;
  odd_llama(&c, 0);
  tr_model_t m;
  PCHECK_RC(tr_model_init(&m, &c));
  PCHECK_RC(tr_fsdp_shard_model(f, &m));
  PCHECK_RC(tr_model_alloc(&m, TR_DEVICE_CPU));
  PCHECK_RC(tr_model_init_weights(&m, 7));
  for (int g = 0; g < tr_fsdp_ngroups(f); g++) {
    tr_tensor_t in;
    PCHECK_RC(tr_fsdp_copy_in(f, g, &in));
    PCHECK(in.dtype == TR_BF16);
    const uint16_t* x = tr_tensor_data(&in);
    int64_t off = 0;
    for (int i = 0; i < m.n_params; i++) {
      tr_param_t* p = &m.params[i];
      if (tr_fsdp_group_of_block(f, p->block) != g) continue;
      int64_t s, rows, rn = 1;
      for (int d = 1; d < p->ndim; d++) rn *= p->shape[d];
      tr_fsdp_shard_rows(p->shape[0], ctx->size, ctx->rank, &s, &rows);
      int64_t pad = tr_fsdp_padded_rows(p->shape[0], ctx->size) * rn;
      const float* w = tr_tensor_data(&p->data);
      for (int64_t k = 0; k < pad; k++)
        PCHECK(x[off + k] == (k < rows * rn ? tr_f32_to_bf16(w[k]) : 0));
      off += pad;
    }
    tr_tensor_release(&in);
  }
  tr_model_release(&m);
  tr_fsdp_free(f);
}

/* FSDP reads its rows from the parameters' placements: a parameter that
 * something placed before FSDP (here Shard(0) on a mesh dim "ep" whose
 * coordinate is 0 on both ranks: the first half of its rows) is sharded
 * within that piece, and what FSDP gathers is that piece -- the same rows
 * of the one-rank init -- not the whole tensor; the other parameters are
 * gathered whole. */
static void body_rows_from_placements(tr_pg_t* world, pg_ctx_t* ctx) {
  static const char* const names[2] = {"ep", "dp_shard"};
  int sizes[2] = {2, ctx->size}, coords[2] = {0, ctx->rank};
  tr_mesh_shape_t shape;
  PCHECK_RC(tr_mesh_shape_init(&shape, 2, names, sizes, coords));
  tr_fsdp_opts_t o;
  tr_fsdp_opts_init(&o);
  o.shard_pg = world;
  o.mesh = &shape;
  tr_fsdp_t* f;
  PCHECK_RC(tr_fsdp_new(&o, &f));
  tr_model_config_t c;
  odd_llama(&c, 0);
  tr_model_t m, ref;
  PCHECK_RC(tr_model_init(&ref, &c));
  PCHECK_RC(tr_model_alloc(&ref, TR_DEVICE_CPU));
  PCHECK_RC(tr_model_init_weights(&ref, 7));
  PCHECK_RC(tr_model_init(&m, &c));
  int w = tr_model_find_param(&m, "model.layers.0.mlp.down_proj.weight");
  PCHECK(w >= 0);
  tr_param_t* pw = &m.params[w];
  tr_placement_t pl[2] = {tr_placement_shard(0), tr_placement_replicate()};
  PCHECK_RC(tr_dtensor_param_place(pw, &shape, pl, NULL));
  int64_t rows0 = pw->shape[0], half = (rows0 + 1) / 2;
  PCHECK(pw->layout.shape[0] == half);
  PCHECK_RC(tr_fsdp_shard_model(f, &m));
  /* this rank's rows: its chunk of the first half */
  int64_t s, rows;
  tr_fsdp_shard_rows(half, ctx->size, ctx->rank, &s, &rows);
  PCHECK(pw->layout.offset[0] == s && pw->layout.shape[0] == rows);
  const tr_param_placement_t* at = tr_dtensor_param_placement(pw);
  PCHECK(at && at->order[1] == 1); /* dp_shard cuts last */
  PCHECK_RC(tr_model_alloc(&m, TR_DEVICE_CPU));
  PCHECK_RC(tr_model_init_weights(&m, 7));
  PCHECK_RC(tr_fsdp_gather_full(f));
  for (int i = 0; i < m.n_params; i++) {
    tr_param_t* p = &m.params[i];
    int64_t n = i == w ? half : p->shape[0];
    PCHECK(p->layout.offset[0] == 0 && p->layout.shape[0] == n);
    PCHECK(p->data.shape[0] == n);
    PCHECK(memcmp(tr_tensor_data(&p->data), tr_tensor_data(&ref.params[i].data),
                  tr_tensor_nbytes(&p->data)) == 0);
  }
  /* the gathered piece keeps its own placement (ep), FSDP's is gone */
  at = tr_dtensor_param_placement(pw);
  PCHECK(at && at->placements[0].kind == TR_PLACEMENT_SHARD &&
         at->placements[1].kind == TR_PLACEMENT_REPLICATE);
  tr_model_release(&m);
  tr_model_release(&ref);
  tr_fsdp_free(f);
}

static void spawn(int n, pg_body_fn body) {
  int st[8];
  ck_assert_int_eq(pg_spawn(n, "gloo", TR_DEV_CPU, 1, 30000, body, 60, st), 0);
  for (int r = 0; r < n; r++)
    ck_assert_msg(st[r] == 0, "rank %d of %d exited with %d", r, n, st[r]);
}

static void set_job(int hsdp, tr_fsdp_reshard_t rs, int prefetch,
                    tr_dtype_t reduce, int tied) {
  memset(&job, 0, sizeof job);
  job.hsdp = hsdp;
  job.reshard = rs;
  job.prefetch = prefetch;
  job.reduce = reduce;
  job.tied = tied;
}

START_TEST(test_fsdp2_default) {
  set_job(0, TR_FSDP_RESHARD_DEFAULT, 1, TR_F32, 0);
  spawn(2, body_grads);
}
END_TEST

START_TEST(test_fsdp4_policies) {
  /* _i: default / always / never, each with prefetch 1, 0, 2 */
  static const tr_fsdp_reshard_t rs[] = {
      TR_FSDP_RESHARD_DEFAULT, TR_FSDP_RESHARD_ALWAYS, TR_FSDP_RESHARD_NEVER};
  set_job(0, rs[_i], _i == 0 ? 1 : _i == 1 ? 0 : 2, TR_F32, 0);
  spawn(4, body_grads);
}
END_TEST

START_TEST(test_hsdp_2x2) {
  set_job(1, TR_FSDP_RESHARD_DEFAULT, 1, TR_F32, 0);
  spawn(4, body_grads);
}
END_TEST

/* as a pipeline stage's step: gathered once, reduced once (the tied
 * table's root group at the embedding's REDUCE_GRAD); HSDP too; with
 * reshard_after_forward always, freed after each forward and gathered
 * again by the backward, still reduced once */
START_TEST(test_pipelined) {
  set_job(_i == 1, _i == 2 ? TR_FSDP_RESHARD_ALWAYS : TR_FSDP_RESHARD_DEFAULT,
          1, TR_F32, _i != 1);
  job.pipelined = 1;
  spawn(_i == 1 ? 4 : 2, body_grads);
}
END_TEST

START_TEST(test_bf16_copy_in) { spawn(4, body_bf16_copy_in); }
END_TEST

START_TEST(test_bf16_reduce_tied) {
  set_job(0, TR_FSDP_RESHARD_ALWAYS, 1, TR_BF16, 1);
  spawn(4, body_grads);
}
END_TEST

/* ---- memory through the trainer ---- */

static const char* data_path(void) {
  static char buf[1024];
  const char* s = getenv("top_srcdir");
  snprintf(buf, sizeof buf, "%s/examples/data/tinytales.txt",
           s && *s ? s : ".");
  return buf;
}

/* 8 layers of width 64 and a 256-token vocab: the parameters dominate
 * the activations of a 1 x 16 micro-batch */
static void mem_model(tr_model_config_t* c) {
  ck_assert_int_eq(tr_model_config_get("llama3", "debugmodel", c), 0);
  c->vocab_size = 256;
  c->max_seq_len = 16;
  c->dim = 64;
  c->n_layers = 8;
  c->n_heads = 4;
  c->n_kv_heads = 4;
  c->head_dim = 16;
  c->ffn_dim = 192;
}

/* Bytes the host allocator holds at the peak of two steps above what it
 * held before the trainer existed. */
static int64_t trainer_peak(const tr_config_t* cfg, const tr_dp_t* dist,
                            int64_t* state) {
  tr_model_config_t mc;
  mem_model(&mc);
  tr_trainer_opts_t to = {.dist = dist, .quiet = 1};
  int64_t peak;
  PCHECK_RC(fx_trainer_bytes(cfg, &mc, &to, 2, state, &peak));
  return peak;
}

static void body_memory(tr_pg_t* world, pg_ctx_t* ctx) {
  int S = ctx->size;
  const char* ov[] = {"--training.dataset_path",
                      data_path(),
                      "--training.local_batch_size",
                      "1",
                      "--training.seq_len",
                      "16",
                      "--validation.enable=false",
                      "--debug.seed",
                      "3",
                      "--model.name",
                      "llama3"};
  int nov = (int)(sizeof ov / sizeof ov[0]);
  tr_config_t c1, cn;
  tr_errmsg_t cerr;
  if (tr_config_load(&c1, NULL, nov, (char**)ov, &cerr) < 0)
    fprintf(stderr, "config: %s\n", cerr.message);
  PCHECK_RC(tr_config_load(&c1, NULL, nov, (char**)ov, &cerr));
  PCHECK_RC(tr_config_resolve(&c1, 1, &cerr));
  PCHECK_RC(tr_config_load(&cn, NULL, nov, (char**)ov, &cerr));
  PCHECK_RC(tr_config_resolve(&cn, S, &cerr));
  /* one rank, no sharding: the reference figures */
  int64_t state1, peak1 = trainer_peak(&c1, NULL, &state1);
  tr_pg_t *shard, *rep;
  make_groups(world, 1, S, &shard, &rep);
  tr_fsdp_opts_t o;
  tr_fsdp_opts_init(&o);
  o.shard_pg = shard;
  o.divide_factor = 1;
  tr_fsdp_t* f;
  PCHECK_RC(tr_fsdp_new(&o, &f));
  tr_dp_t dist;
  tr_fsdp_dp(f, &dist);
  int64_t staten, peakn = trainer_peak(&cn, &dist, &staten);
  /* the model's figures */
  tr_model_config_t mc;
  mem_model(&mc);
  tr_model_t m;
  PCHECK_RC(tr_model_init(&m, &mc));
  tr_fsdp_plan_t pl;
  PCHECK_RC(tr_fsdp_plan(&m, 1, S, TR_F32, TR_F32, &pl));
  int64_t unsharded = 16 * tr_model_num_params(&m); /* p, g, m, v */
  int64_t group = pl.group_bytes / 2;               /* params of one group */
  tr_model_release(&m);
  /* state after init: params + grads + moments, exactly the shard
   * (rank 0 holds the most) */
  if (tr_pg_rank(shard) == 0) PCHECK(staten == pl.param_bytes * 4);
  PCHECK(staten <= unsharded / S + unsharded / 64);
  PCHECK(state1 == unsharded);
  /* the peak: what one rank needs beyond its state (activations) is the
   * same; sharding adds a few unsharded groups in flight: in backward the
   * root (kept whole, with its grads), this group's params and grads, the
   * next group's all-gather and the last reduce-scatter's buffers — about
   * 5.5 groups of parameters here, up to 2 more when a communication
   * thread still holds a finished op's buffers (their free is timed by
   * that thread) */
  int64_t act = peak1 - state1;
  int64_t extra = peakn - staten - act;
  if (ctx->rank == 0)
    fprintf(stderr,
            "memory on %d ranks: unsharded state %lld, sharded %lld (1/%.2f), "
            "peak %lld = state + activations %lld + %lld (%.2f unsharded "
            "groups of %lld); one rank peak %lld\n",
            S, (long long)unsharded, (long long)staten,
            (double)unsharded / (double)staten, (long long)peakn,
            (long long)act, (long long)extra, (double)extra / (double)group,
            (long long)group, (long long)peak1);
  PCHECK(extra <= 8 * group);
  PCHECK(peakn <= unsharded / S + act + 8 * group);
  PCHECK(peakn < peak1 / 2);
  tr_fsdp_free(f);
  tr_pg_free(shard);
  tr_config_release(&c1);
  tr_config_release(&cn);
}

START_TEST(test_memory_fsdp4) { spawn(4, body_memory); }
END_TEST

/* ---- [parallelism] fsdp_prefetch_depth through the trainer ---- */

/* At each layer's pre_forward / pre_backward (after FSDP's hooks): how
 * many of the following layer groups (in the pass's order) are gathered or
 * gathering, and whether the count is what the depth says. */
static struct {
  int depth;
  int checked, wrong, max_ahead;
} ahead;

static int count_ahead(tr_model_t* m, int b, int dir) {
  if (m->blocks[b].kind != TR_BLOCK_LAYER) return 0;
  int left = 0;
  for (int k = b + dir; k >= 0 && k < m->n_blocks; k += dir)
    if (m->blocks[k].kind == TR_BLOCK_LAYER) left++;
  int n = 0, k = b + dir, i = 1;
  for (; k >= 0 && k < m->n_blocks; k += dir) {
    if (m->blocks[k].kind != TR_BLOCK_LAYER) continue;
    tr_fsdp_group_info_t gi;
    tr_fsdp_group_info(obs_f, tr_fsdp_group_of_block(obs_f, k), &gi);
    int live = gi.state != TR_FSDP_SHARDED;
    /* exactly the next `depth` layers, in order */
    if (live != (i <= ahead.depth)) ahead.wrong++;
    n += live;
    i++;
  }
  ahead.checked++;
  if (n != (left < ahead.depth ? left : ahead.depth)) ahead.wrong++;
  if (n > ahead.max_ahead) ahead.max_ahead = n;
  return 0;
}

static int obs_ahead_fwd(void* arg, tr_model_t* m, int b, tr_model_mb_t* mb) {
  (void)arg;
  return mb->no_grad ? 0 : count_ahead(m, b, +1);
}

static int obs_ahead_bwd(void* arg, tr_model_t* m, int b, tr_model_mb_t* mb) {
  (void)arg;
  (void)mb;
  return count_ahead(m, b, -1);
}

/* Three training steps of the 8-layer model over 2 FSDP ranks with
 * fsdp_prefetch_depth 0, 1 and 2 (the job config through
 * the launcher's tr_compose_fsdp): the losses and grad norms are the same bit for bit,
 * and the depth is how many layer groups are gathered ahead of the one
 * computing (forward and backward); the host allocator's peak grows with
 * it (printed). */
static void body_prefetch_depth(tr_pg_t* world, pg_ctx_t* ctx) {
  enum { STEPS = 3 };
  double loss[3][STEPS], gnorm[3][STEPS];
  int64_t peak[3];
  for (int depth = 0; depth <= 2; depth++) {
    char dv[8];
    snprintf(dv, sizeof dv, "%d", depth);
    const char* ov[] = {"--training.dataset_path",
                        data_path(),
                        "--training.local_batch_size",
                        "1",
                        "--training.seq_len",
                        "16",
                        "--validation.enable=false",
                        "--training.device",
                        "cpu",
                        "--debug.seed",
                        "3",
                        "--model.name",
                        "llama3",
                        "--parallelism.fsdp_prefetch_depth",
                        dv};
    int nov = (int)(sizeof ov / sizeof ov[0]);
    tr_config_t cfg;
    tr_errmsg_t err;
    PCHECK_RC(tr_config_load(&cfg, NULL, nov, (char**)ov, &err));
    PCHECK(cfg.parallelism.fsdp_prefetch_depth == depth);
    PCHECK_RC(tr_config_resolve(&cfg, ctx->size, &err));
    tr_fsdp_t* f;
    tr_mesh_t* mesh;
    int rc = tr_compose_mesh(&cfg, world, &mesh, &err);
    if (rc == 0) rc = tr_compose_fsdp(&cfg, mesh, &f, &err);
    if (rc < 0) fprintf(stderr, "fsdp: %s\n", err.message);
    PCHECK_RC(rc);
    obs_f = f;
    tr_dp_t dist;
    tr_fsdp_dp(f, &dist);
    tr_model_config_t mc;
    mem_model(&mc);
    tr_trainer_settings_t ts;
    PCHECK_RC(fx_settings(&cfg, &mc, &ts));
    tr_trainer_opts_t to = {.dist = &dist, .quiet = 1};
    tr_trainer_t t;
    tr_mem_stats_t s0, s1;
    tr_mem_stats(TR_MEM_HOST, 0, &s0);
    rc = tr_trainer_init(&t, &ts, &to, &err);
    if (rc < 0) fprintf(stderr, "trainer: %s\n", err.message);
    PCHECK_RC(rc);
    PCHECK_RC(
        tr_model_add_hook(&t.model, TR_HOOK_PRE_FORWARD, obs_ahead_fwd, NULL));
    PCHECK_RC(
        tr_model_add_hook(&t.model, TR_HOOK_PRE_BACKWARD, obs_ahead_bwd, NULL));
    memset(&ahead, 0, sizeof ahead);
    ahead.depth = depth;
    tr_mem_reset_peak(TR_MEM_HOST, 0);
    tr_fsdp_stats_t st0, st1;
    tr_fsdp_stats(f, &st0);
    for (int k = 0; k < STEPS; k++) {
      tr_step_stats_t st;
      rc = tr_trainer_step(&t, &st, &err);
      if (rc < 0) fprintf(stderr, "step: %s\n", err.message);
      PCHECK_RC(rc);
      loss[depth][k] = st.loss;
      gnorm[depth][k] = st.grad_norm;
    }
    tr_fsdp_stats(f, &st1);
    tr_mem_stats(TR_MEM_HOST, 0, &s1);
    peak[depth] = s1.peak_bytes - s0.current_bytes;
    /* 8 layers, forward and backward, every step */
    PCHECK(ahead.checked == STEPS * 2 * mc.n_layers);
    PCHECK(ahead.wrong == 0);
    PCHECK(ahead.max_ahead == depth);
    PCHECK(depth > 0 ? st1.prefetches > st0.prefetches
                     : st1.prefetches == st0.prefetches);
    tr_trainer_release(&t);
    tr_fsdp_free(f);
    tr_mesh_free(mesh);
    tr_config_release(&cfg);
  }
  for (int depth = 1; depth <= 2; depth++)
    for (int k = 0; k < STEPS; k++) {
      PCHECK(memcmp(&loss[depth][k], &loss[0][k], sizeof(double)) == 0);
      PCHECK(memcmp(&gnorm[depth][k], &gnorm[0][k], sizeof(double)) == 0);
    }
  /* training moved: not a comparison of constants */
  PCHECK(loss[0][STEPS - 1] != loss[0][0]);
  if (ctx->rank == 0)
    fprintf(stderr,
            "fsdp_prefetch_depth 0 / 1 / 2: losses %.9g %.9g %.9g the same; "
            "host peak %lld / %lld / %lld bytes\n",
            loss[0][0], loss[0][1], loss[0][2], (long long)peak[0],
            (long long)peak[1], (long long)peak[2]);
}

START_TEST(test_prefetch_depth) { spawn(2, body_prefetch_depth); }
END_TEST

START_TEST(test_rows_from_placements) { spawn(2, body_rows_from_placements); }
END_TEST

static Suite* fsdp2_suite(void) {
  Suite* s = suite_create("fsdp2");
  TCase* tc = tcase_create("local");
  tcase_add_test(tc, test_shard_rows);
  tcase_add_test(tc, test_reshard_names);
  tcase_add_test(tc, test_plan);
  suite_add_tcase(s, tc);
#ifdef HAVE_GLOO
  tc = tcase_create("gloo");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_fsdp2_default);
  tcase_add_loop_test(tc, test_fsdp4_policies, 0, 3);
  tcase_add_test(tc, test_hsdp_2x2);
  tcase_add_loop_test(tc, test_pipelined, 0, 3);
  tcase_add_test(tc, test_bf16_copy_in);
  tcase_add_test(tc, test_bf16_reduce_tied);
  tcase_add_test(tc, test_memory_fsdp4);
  tcase_add_test(tc, test_prefetch_depth);
  tcase_add_test(tc, test_rows_from_placements);
  suite_add_tcase(s, tc);
#endif
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(fsdp2_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
