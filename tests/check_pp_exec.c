/* tests/check_pp_exec.c: pipeline parallelism end to end — the model split
 * over stages (tr_pp_split_init), every generator's schedule lowered with
 * its sends and receives (tr_pp_lower), and each rank's list run by the
 * executor (tr_pp_exec_step) on 2 and 4 forked Gloo ranks
 * (tests/pg_suite.h), against one rank running the same micro-batches as
 * a plain loop of forward and backward (rank 0 runs it and broadcasts its
 * gradients, loss and token count).
 *
 * An 8-layer debug model of each family (GPT-2 with its tied embedding,
 * Llama with GQA); every generator (GPipe, 1F1B, Interleaved1F1B,
 * LoopedBFS, InterleavedZeroBubble with v = 2, ZBVZeroBubble and
 * DualPipeV on the V), m in {p, 2p, 8} where the class allows it; 20
 * steps with AdamW between them: the loss every rank gets from the
 * executor and the squared gradient norm (summed over the stages' ranks,
 * each parameter once, the tied table's gradient summed between the end
 * stages) within 1e-6 (relative) of the one rank's, every gradient within
 * 1e-6; the gradients byte-identical to the one rank's where the
 * accumulation order is the same (every stage running its backwards in
 * micro-batch order; not LoopedBFS, whose backwards run in reverse), but
 * for GPT-2's tied table, whose two halves add up in another order. Where
 * the order differs, the one rank takes the pipeline's weights so summed
 * after each AdamW step — the tied table, or every weight under
 * LoopedBFS — as AdamW would carry that rounding into every weight (GPT-2
 * drifts 1.3e-6 apart in the gradient norm after 16 steps otherwise), so
 * each step compares the pipeline's step, not the drift;
 * the FSDP callback sees each
 * stage's REDUCE_GRAD once a step. The flight recorder's hooks see each
 * send and receive of a ZBVZeroBubble step as PyTorch records p2p
 * (is_p2p, p2p_seq_id 1, 2, ..., "gloo:send 0->1"), then the loss
 * broadcast as the group's first collective. Stage 0's activation peak
 * (allocator counters) under 1F1B holds at most p micro-batches' forward
 * records (plus one micro-batch's worth of a backward's transients), under
 * GPipe all m, as the simulator's peak in-flight counts say. Locally: the executor's refusals of a
 * computation before its input arrived and of a list that never sends,
 * and the bad input that stops a pipeline before it starts (too few
 * micro-batches, layers that do not split, an unknown action in a CSV),
 * and tr_pp_build_init: the generator's or a CSV's schedule lowered, and
 * each thing a CSV can get wrong in words naming the file;
 * tr_pp_build_eval's forward-only lists on the loop and the V. */
#include "config.h"

#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/pg_suite.h"
#include "tests/train_steps.h"
#include "trainrun/dp.h" /* tr_dp_sum_over */
#include "trainrun/error.h"
#include "trainrun/kernels.h"
#include "trainrun/model.h"
#include "trainrun/pipelining.h"

#define LAYERS 8
#define STEPS 20
#define MMAX 8
static const int B = 2, T = 8;

static int small_config(int llama, tr_model_config_t* c) {
  int rc = tr_model_config_get(llama ? "llama3" : "gpt2", "debugmodel", c);
  c->n_layers = LAYERS;
  c->vocab_size = 96;
  c->max_seq_len = 16;
  c->dim = 64;
  c->n_heads = 4;
  c->head_dim = 16;
  if (llama) {
    c->n_kv_heads = 2;
    c->ffn_dim = 192;
  } else {
    c->n_kv_heads = 4;
    c->ffn_dim = 256;
  }
  return rc;
}

/* micro-batch i of a step: tokens and targets, a few ignored */
static int32_t g_tok[MMAX][2 * 8], g_tgt[MMAX][2 * 8];
static int64_t g_valid; /* valid targets of the step */

static void make_batch(int V, int step, int64_t m) {
  g_valid = 0;
  for (int64_t i = 0; i < m; i++)
    for (int j = 0; j < B * T; j++) {
      g_tok[i][j] = (int32_t)((j * 7 + step * 13 + (int)i * 5 + 3) % V);
      int ignore = (j + (int)i + step) % 11 == 0;
      g_tgt[i][j] =
          ignore ? TR_IGNORE_INDEX : (int32_t)((j * 11 + step * 5 + (int)i) % V);
      g_valid += !ignore;
    }
}

typedef struct {
  tr_model_t* m;
  int reduce_grads, unshards, reshards;
} cb_t;

static int cb_begin(void* arg, int64_t micro, tr_model_mb_t* mb) {
  cb_t* c = arg;
  TR_CHECK(tr_model_mb_init(c->m, mb, B, T, g_tok[micro], g_tgt[micro]));
  mb->loss_scale = (float)(1.0 / (double)g_valid);
  return 0;
}

static int cb_fsdp(void* arg, const tr_pp_action_t* a) {
  cb_t* c = arg;
  if (a->type == TR_PP_REDUCE_GRAD) c->reduce_grads++;
  if (a->type == TR_PP_UNSHARD) c->unshards++;
  if (a->type == TR_PP_RESHARD) c->reshards++;
  return 0;
}

static double sq(const tr_tensor_t* t) {
  const float* g = tr_tensor_data(t);
  double s = 0;
  for (int64_t k = 0; k < tr_tensor_numel(t); k++) s += (double)g[k] * g[k];
  return s;
}

static double rel(double a, double b) { return fabs(a - b) / fabs(b); }

static int body_llama;
static int g_identical; /* the last schedule's gradients were bit-identical */

/* Whether every stage runs its B (or its I, and its W) in micro-batch
 * order 0, 1, ... as the one-rank loop accumulates them. */
static int ascending_backwards(const tr_pp_schedule_t* s, int n_stages) {
  int64_t next[16][2];
  memset(next, 0, sizeof next);
  for (int r = 0; r < s->n_ranks; r++)
    for (int64_t k = 0; k < s->len[r]; k++) {
      const tr_pp_action_t* a = &s->acts[r][k];
      for (int h = 0; h < (a->type == TR_PP_OVERLAP_F_B ? 2 : 1); h++) {
        int st = a->type == TR_PP_OVERLAP_F_B ? a->sub[h].stage : a->stage;
        tr_pp_type_t t = a->type == TR_PP_OVERLAP_F_B ? a->sub[h].type : a->type;
        int64_t mi = a->type == TR_PP_OVERLAP_F_B ? a->sub[h].micro : a->micro;
        if (t != TR_PP_B && t != TR_PP_I && t != TR_PP_W) continue;
        if (st < 0 || st >= n_stages || st >= 16) return 0;
        int w = t == TR_PP_W;
        if (mi != next[st][w]) return 0;
        next[st][w]++;
      }
    }
  return 1;
}
static double g_worst_loss, g_worst_norm; /* over a body, rank 0 prints */

/* The one rank's gradients, computed on rank 0 only, to every rank as
 * one flat broadcast (flat: fp32, their numel), bit for bit. */
static int bcast_grads(tr_model_t* ref, tr_tensor_t* flat, tr_pg_t* pg) {
  char* at = tr_tensor_data(flat);
  int root = tr_pg_rank(pg) == 0;
  for (int i = 0; i < ref->n_params; i++) {
    size_t n = tr_tensor_nbytes(&ref->params[i].grad);
    if (root) memcpy(at, tr_tensor_data(&ref->params[i].grad), n);
    at += n;
  }
  int rc = tr_pg_broadcast(pg, flat, 0, NULL);
  if (rc < 0 || root) return rc;
  at = tr_tensor_data(flat);
  for (int i = 0; i < ref->n_params; i++) {
    size_t n = tr_tensor_nbytes(&ref->params[i].grad);
    memcpy(tr_tensor_data(&ref->params[i].grad), at, n);
    at += n;
  }
  return 0;
}

/* One schedule: kind on pp = world size ranks with m micro-batches. */
static int run_schedule(tr_pg_t* pg, tr_pp_kind_t kind, int64_t m) {
  int pp = tr_pg_size(pg), rank = tr_pg_rank(pg);
  tr_model_config_t c;
  PCHECK_RC(small_config(body_llama, &c));
  tr_pp_split_t sp;
  char err[4096];
  int rc = tr_pp_split_init(&sp, LAYERS, pp, kind, 0, 1, 1, err, sizeof err);
  if (rc < 0) fprintf(stderr, "rank %d: %s\n", rank, err);
  PCHECK_RC(rc);
  tr_pp_schedule_t compute, low;
  rc = tr_pp_generate(&compute, kind, pp, m, sp.v, err, sizeof err);
  if (kind == TR_PP_DUALPIPEV && m < 2 * pp) { /* the class refuses it */
    PCHECK(rc == TR_EINVAL);
    tr_pp_split_release(&sp);
    return 0;
  }
  PCHECK_RC(rc);
  int map[8];
  rc = tr_pp_lower(&compute, pp, sp.n_stages, m, 1, &low, map, err, sizeof err);
  if (rc < 0) fprintf(stderr, "rank %d: %s\n", rank, err);
  PCHECK_RC(rc);
  for (int s = 0; s < sp.n_stages; s++) PCHECK(map[s] == sp.stage_rank[s]);
  /* this rank's stages, and the span of blocks it allocates */
  int mine[4], nmine = tr_pp_split_rank_stages(&sp, rank, mine);
  PCHECK(nmine == sp.v);
  int lo = sp.blocks[mine[0]].first, hi = sp.blocks[mine[nmine - 1]].last;
  const uint64_t seed = 99;
  tr_model_t ref, mod;
  PCHECK_RC(tr_model_init(&ref, &c));
  PCHECK_RC(tr_model_alloc(&ref, TR_DEVICE_CPU));
  PCHECK_RC(tr_model_init_weights(&ref, seed));
  PCHECK_RC(tr_model_init(&mod, &c));
  PCHECK_RC(tr_model_alloc_blocks(&mod, TR_DEVICE_CPU, lo, hi));
  PCHECK_RC(tr_model_init_weights(&mod, seed));
  /* the parameters this rank's stages use; the tied table (GPT-2) is in
   * both end stages, counted in norms on stage 0's rank */
  unsigned char* own = calloc((size_t)mod.n_params, 1);
  PCHECK(own);
  for (int i = 0; i < mod.n_params; i++)
    own[i] = (unsigned char)tr_pp_param_used(&mod, &sp, rank, i);
  int tied = -1;
  for (int i = 0; i < mod.n_params; i++)
    if (tr_model_param_in_blocks(&mod, i, 0, 1) &&
        tr_model_param_in_blocks(&mod, i, mod.n_blocks - 1, mod.n_blocks))
      tied = i;
  PCHECK((tied >= 0) == (c.tie_embeddings != 0));
  tr_tensor_t *rm, *rv, *pm, *pv;
  ts_moments(&ref, NULL, &rm, &rv);
  ts_moments(&mod, own, &pm, &pv);
  cb_t cb = {.m = &mod};
  tr_pp_exec_t x = {.model = &mod,
                    .n_micro = m,
                    .mb_begin = cb_begin,
                    .arg = &cb,
                    .n_stages = sp.n_stages,
                    .stage_blocks = sp.blocks,
                    .stage_rank = sp.stage_rank,
                    .pg = pg,
                    .B = B,
                    .T = T,
                    .fsdp_action = cb_fsdp};
  int identical = 1;
  int ordered = ascending_backwards(&compute, sp.n_stages);
  /* the one rank runs on rank 0 alone (every rank running it cost a fifth
   * of this test's CPU); its gradients, loss and count go to the others */
  int64_t ref_numel = 0;
  for (int i = 0; i < ref.n_params; i++)
    ref_numel += tr_tensor_numel(&ref.params[i].grad);
  tr_tensor_t flat;
  PCHECK_RC(tr_tensor_empty(&flat, TR_F32, TR_DEVICE_CPU, 1, &ref_numel));
  for (int step = 1; step <= STEPS; step++) {
    make_batch(c.vocab_size, step, m);
    /* the one rank: a plain loop over the same micro-batches */
    if (rank == 0) PCHECK_RC(tr_model_zero_grad(&ref));
    double ref_loss = 0;
    int64_t ref_valid = 0;
    for (int64_t i = 0; i < m && rank == 0; i++) {
      tr_model_mb_t mb;
      PCHECK_RC(tr_model_mb_init(&ref, &mb, B, T, g_tok[i], g_tgt[i]));
      mb.loss_scale = (float)(1.0 / (double)g_valid);
      PCHECK_RC(tr_model_forward(&ref, &mb, 0, ref.n_blocks));
      PCHECK_RC(tr_model_backward(&ref, &mb, 0, ref.n_blocks));
      ref_loss += mb.loss_sum;
      ref_valid += mb.n_valid;
      tr_model_mb_release(&ref, &mb);
    }
    PCHECK_RC(bcast_grads(&ref, &flat, pg));
    double got[2] = {ref_loss, (double)ref_valid}; /* zeros but on rank 0 */
    PCHECK_RC(tr_dp_sum_over(pg, got, 2));
    ref_loss = got[0];
    ref_valid = (int64_t)got[1];
    /* the pipeline */
    PCHECK_RC(tr_model_zero_grad(&mod));
    cb.reduce_grads = cb.unshards = cb.reshards = 0;
    tr_pp_result_t res;
    rc = tr_pp_exec_step(&x, low.acts[rank], low.len[rank], &res);
    PCHECK_RC(rc);
    PCHECK(cb.reduce_grads == nmine);
    PCHECK(cb.unshards == cb.reshards && cb.unshards >= nmine);
    PCHECK(res.n_valid == ref_valid && ref_valid == g_valid);
    double dl = rel(res.loss_sum, ref_loss);
    PCHECK(dl < 1e-6);
    if (dl > g_worst_loss) g_worst_loss = dl;
    /* the tied table's gradient summed between the end stages */
    PCHECK_RC(tr_pp_sum_tied_grads(&mod, &sp, pg, rank));
    /* gradients: byte-identical but for the tied table */
    for (int i = 0; i < mod.n_params; i++) {
      if (!own[i]) continue;
      const tr_tensor_t *a = &mod.params[i].grad, *b = &ref.params[i].grad;
      const float* fa = tr_tensor_data(a);
      const float* fb = tr_tensor_data(b);
      int same = memcmp(fa, fb, tr_tensor_nbytes(a)) == 0;
      if (i != tied) identical &= same;
      double d = 0;
      for (int64_t k = 0; k < tr_tensor_numel(a); k++)
        if (fabs((double)fa[k] - fb[k]) > d) d = fabs((double)fa[k] - fb[k]);
      PCHECK(d < 1e-6);
    }
    /* the squared norm, each parameter once */
    double mine_sq = 0, ref_sq = 0;
    for (int i = 0; i < mod.n_params; i++) {
      ref_sq += sq(&ref.params[i].grad);
      if (tr_pp_param_counted(&mod, &sp, rank, i))
        mine_sq += sq(&mod.params[i].grad);
    }
    double tot = mine_sq; /* every rank's, in rank order */
    PCHECK_RC(tr_dp_sum_over(pg, &tot, 1));
    double dn = rel(tot, ref_sq);
    if (dn >= 1e-6)
      fprintf(stderr, "rank %d: %s m %lld step %d: grad sq norm %.9g vs %.9g\n",
              rank, tr_pp_kind_name(kind), (long long)m, step, tot, ref_sq);
    PCHECK(dn < 1e-6);
    if (dn > g_worst_norm) g_worst_norm = dn;
    if (step == STEPS) break;
    if (rank == 0) ts_adamw(&ref, rm, rv, NULL, step);
    ts_adamw(&mod, pm, pv, own, step);
    /* the one rank takes the pipeline's weights that were summed in
     * another order: the tied table, or all where the stages' backwards
     * run in another order (LoopedBFS) */
    for (int i = 0; i < mod.n_params; i++) {
      if (i != tied && ordered) continue;
      int root = -1;
      for (int st = 0; st < sp.n_stages && root < 0; st++)
        if (tr_model_param_in_blocks(&mod, i, sp.blocks[st].first,
                                     sp.blocks[st].last))
          root = sp.stage_rank[st];
      tr_param_t* p = &mod.params[i];
      tr_tensor_t t = {0};
      PCHECK_RC(tr_tensor_zeros(&t, TR_F32, TR_DEVICE_CPU, p->ndim,
                                p->layout.shape));
      if (rank == root) PCHECK_RC(tr_tensor_copy(&t, &p->data));
      PCHECK_RC(tr_pg_broadcast(pg, &t, root, NULL));
      /* the end stages updated the tied table to the same bits */
      if (own[i])
        PCHECK(memcmp(tr_tensor_data(&t), tr_tensor_data(&p->data),
                      tr_tensor_nbytes(&t)) == 0);
      PCHECK_RC(tr_tensor_copy(&ref.params[i].data, &t));
      tr_tensor_release(&t);
    }
  }
  /* bit for bit where the accumulation order is the one rank's: every
   * stage's backwards in micro-batch order (the tied table aside) */
  if (ordered) PCHECK(identical);
  g_identical = identical;
  tr_tensor_release(&flat);
  ts_free_moments(&ref, rm, rv);
  ts_free_moments(&mod, pm, pv);
  free(own);
  tr_model_release(&ref);
  tr_model_release(&mod);
  tr_pp_schedule_release(&low);
  tr_pp_schedule_release(&compute);
  tr_pp_split_release(&sp);
  return 1;
}

static void body_pp(tr_pg_t* world, pg_ctx_t* ctx) {
  int pp = ctx->size;
  for (int k = 0; k <= TR_PP_DUALPIPEV; k++)
    for (int mi = 0; mi < 3; mi++) {
      int64_t m = mi == 0 ? pp : mi == 1 ? 2 * pp : 8;
      if (mi == 2 && m == 2 * pp) continue; /* pp 4: 8 is 2p */
      g_worst_loss = g_worst_norm = 0;
      g_identical = 0;
      int ran = run_schedule(world, (tr_pp_kind_t)k, m);
      if (ctx->rank == 0 && !ran)
        fprintf(stderr, "%s pp %d %s m %lld: refused (m < 2p)\n",
                body_llama ? "llama3" : "gpt2", pp,
                tr_pp_kind_name((tr_pp_kind_t)k), (long long)m);
      if (ctx->rank == 0 && ran)
        fprintf(stderr,
                "%s pp %d %s m %lld: %d steps, loss rel diff max %.3g, "
                "grad sq norm rel diff max %.3g, gradients %s\n",
                body_llama ? "llama3" : "gpt2", pp,
                tr_pp_kind_name((tr_pp_kind_t)k), (long long)m, STEPS,
                g_worst_loss, g_worst_norm,
                g_identical ? "bit-identical" : "differ in the last bits");
    }
}

static void spawn(int n, int llama) {
  body_llama = llama;
  int st[4];
  ck_assert_int_eq(
      pg_spawn(n, "gloo", TR_DEV_CPU, 1, 60000, body_pp, 600, st), 0);
  for (int r = 0; r < n; r++)
    ck_assert_msg(st[r] == 0, "rank %d of %d exited with %d", r, n, st[r]);
}

/* _i: 1 -> 2 ranks, 2 -> 4 ranks */
START_TEST(t_gpt2_pp) { spawn(2 * _i, 0); }
END_TEST

START_TEST(t_llama_pp) { spawn(2 * _i, 1); }
END_TEST

/* ---- the flight recorder's view of a pipeline step ---- */

#define NREC 256
static struct {
  tr_pg_record_t rec;
  char name[64];
} g_recs[NREC];
static int g_nrec;
static pthread_mutex_t g_rec_mu = PTHREAD_MUTEX_INITIALIZER;

static int64_t h_enqueue(void* arg, const tr_pg_record_t* r) {
  (void)arg;
  pthread_mutex_lock(&g_rec_mu);
  if (g_nrec < NREC) {
    g_recs[g_nrec].rec = *r;
    snprintf(g_recs[g_nrec].name, sizeof g_recs[g_nrec].name, "%s",
             r->profiling_name);
    g_nrec++;
  }
  pthread_mutex_unlock(&g_rec_mu);
  return 0;
}

/* One ZBVZeroBubble step on a group made with the recorder's hooks on:
 * each SEND_* / RECV_* of the rank's list is one p2p record, in the list's
 * order, named "gloo:send 0->1" / "gloo:recv 1<-0" as PyTorch names them,
 * is_p2p with p2p_seq_id 1, 2, ... and the group's collective_seq_id
 * untouched; then the loss broadcast, the group's first collective. */
static void body_fr(tr_pg_t* world, pg_ctx_t* ctx) {
  int pp = ctx->size, rank = ctx->rank;
  tr_pg_hooks_t hooks = {.enqueue = h_enqueue};
  tr_pg_set_hooks(&hooks);
  int all[4];
  for (int i = 0; i < pp; i++) all[i] = i;
  tr_pg_t* g = NULL;
  PCHECK_RC(tr_pg_new_group(world, all, pp, "pp", &g));
  tr_model_config_t c;
  PCHECK_RC(small_config(1, &c));
  tr_pp_split_t sp;
  PCHECK_RC(tr_pp_split_init(&sp, LAYERS, pp, TR_PP_ZBV, 0, 1, 1, NULL, 0));
  int64_t m = 4;
  tr_pp_schedule_t compute, low;
  PCHECK_RC(tr_pp_generate(&compute, TR_PP_ZBV, pp, m, 2, NULL, 0));
  PCHECK_RC(tr_pp_lower(&compute, pp, sp.n_stages, m, 0, &low, NULL, NULL, 0));
  int mine[2];
  PCHECK(tr_pp_split_rank_stages(&sp, rank, mine) == 2);
  tr_model_t mod;
  PCHECK_RC(tr_model_init(&mod, &c));
  PCHECK_RC(tr_model_alloc_blocks(&mod, TR_DEVICE_CPU, sp.blocks[mine[0]].first,
                                  sp.blocks[mine[1]].last));
  PCHECK_RC(tr_model_init_weights(&mod, 7));
  make_batch(c.vocab_size, 1, m);
  cb_t cb = {.m = &mod};
  tr_pp_exec_t x = {.model = &mod,
                    .n_micro = m,
                    .mb_begin = cb_begin,
                    .arg = &cb,
                    .n_stages = sp.n_stages,
                    .stage_blocks = sp.blocks,
                    .stage_rank = sp.stage_rank,
                    .pg = g,
                    .B = B,
                    .T = T};
  pthread_mutex_lock(&g_rec_mu);
  g_nrec = 0;
  pthread_mutex_unlock(&g_rec_mu);
  tr_pp_result_t res;
  PCHECK_RC(tr_pp_exec_step(&x, low.acts[rank], low.len[rank], &res));
  PCHECK(res.n_valid == g_valid);
  tr_pg_set_hooks(NULL);
  pthread_mutex_lock(&g_rec_mu);
  int64_t uid = tr_pg_uid(g), p2p = 0, k = 0;
  for (int64_t i = 0; i < low.len[rank]; i++) {
    const tr_pp_action_t* a = &low.acts[rank][i];
    int send = a->type == TR_PP_SEND_F || a->type == TR_PP_SEND_B;
    int recv = a->type == TR_PP_RECV_F || a->type == TR_PP_RECV_B;
    if (!send && !recv) continue;
    int fwd = a->type == TR_PP_SEND_F || a->type == TR_PP_RECV_F;
    int other = send ? (fwd ? a->stage + 1 : a->stage - 1)
                     : (fwd ? a->stage - 1 : a->stage + 1);
    int peer = sp.stage_rank[other];
    while (k < g_nrec && g_recs[k].rec.pg_id != uid) k++;
    PCHECK(k < g_nrec);
    const tr_pg_record_t* r = &g_recs[k].rec;
    char want[64];
    snprintf(want, sizeof want, send ? "gloo:send %d->%d" : "gloo:recv %d<-%d",
             rank, peer);
    PCHECK(!strcmp(g_recs[k].name, want));
    PCHECK(r->op == (send ? TR_PG_OP_SEND : TR_PG_OP_RECV));
    PCHECK(r->is_p2p && r->p2p_seq_id == ++p2p && r->collective_seq_id == 0);
    const tr_pg_tensor_meta_t* t = send ? &r->inputs[0] : &r->outputs[0];
    PCHECK((send ? r->n_inputs : r->n_outputs) == 1);
    PCHECK(t->ndim == 3 && t->shape[0] == B && t->shape[1] == T &&
           t->shape[2] == c.dim && t->dtype == TR_F32);
    k++;
  }
  PCHECK(p2p > 0);
  while (k < g_nrec && g_recs[k].rec.pg_id != uid) k++;
  PCHECK(k < g_nrec);
  PCHECK(g_recs[k].rec.op == TR_PG_OP_BROADCAST && !g_recs[k].rec.is_p2p);
  PCHECK(g_recs[k].rec.collective_seq_id == 1 &&
         g_recs[k].rec.p2p_seq_id == p2p);
  pthread_mutex_unlock(&g_rec_mu);
  if (rank == 0)
    fprintf(stderr, "pp %d ZBVZeroBubble m %lld: %lld p2p records on rank 0\n",
            pp, (long long)m, (long long)p2p);
  tr_model_release(&mod);
  tr_pp_schedule_release(&low);
  tr_pp_schedule_release(&compute);
  tr_pp_split_release(&sp);
  tr_pg_free(g);
}

START_TEST(t_flight_record) {
  int st[4], n = 2 * _i;
  ck_assert_int_eq(pg_spawn(n, "gloo", TR_DEV_CPU, 1, 60000, body_fr, 120, st),
                   0);
  for (int r = 0; r < n; r++)
    ck_assert_msg(st[r] == 0, "rank %d of %d exited with %d", r, n, st[r]);
}
END_TEST

/* ---- stage 0's activation peak ---- */

/* GPipe and 1F1B with m = 8 on pp ranks: the most bytes stage 0 holds
 * during a step (allocator counters, from before the step) against what
 * one micro-batch's forward keeps there: 1F1B holds at most pp
 * micro-batches, GPipe all m (the simulator's peak in-flight counts). */
static void body_peak(tr_pg_t* world, pg_ctx_t* ctx) {
  int pp = ctx->size, rank = ctx->rank;
  tr_model_config_t c;
  PCHECK_RC(small_config(1, &c));
  int64_t m = 8;
  double held[2] = {0, 0}, one = 0;
  int64_t want[2] = {0, 0};
  for (int k = 0; k < 2; k++) {
    tr_pp_kind_t kind = k ? TR_PP_1F1B : TR_PP_GPIPE;
    tr_pp_split_t sp;
    PCHECK_RC(tr_pp_split_init(&sp, LAYERS, pp, kind, 0, 1, 1, NULL, 0));
    tr_pp_schedule_t compute, low;
    PCHECK_RC(tr_pp_generate(&compute, kind, pp, m, 1, NULL, 0));
    tr_pp_sim_t sim;
    PCHECK_RC(tr_pp_simulate(&compute, sp.n_stages, &sim, NULL, NULL, 0));
    want[k] = sim.peak_inflight[0];
    tr_pp_sim_release(&sim);
    PCHECK_RC(tr_pp_lower(&compute, pp, sp.n_stages, m, 0, &low, NULL, NULL, 0));
    tr_model_t mod;
    PCHECK_RC(tr_model_init(&mod, &c));
    PCHECK_RC(tr_model_alloc_blocks(&mod, TR_DEVICE_CPU, sp.blocks[rank].first,
                                    sp.blocks[rank].last));
    PCHECK_RC(tr_model_init_weights(&mod, 3));
    make_batch(c.vocab_size, 1, m);
    cb_t cb = {.m = &mod};
    tr_pp_exec_t x = {.model = &mod,
                      .n_micro = m,
                      .mb_begin = cb_begin,
                      .arg = &cb,
                      .n_stages = sp.n_stages,
                      .stage_blocks = sp.blocks,
                      .stage_rank = sp.stage_rank,
                      .pg = world,
                      .B = B,
                      .T = T};
    tr_mem_stats_t st0, st1;
    for (int rep = 0; rep < 2; rep++) { /* the first grows the RoPE tables */
      tr_mem_stats(TR_MEM_HOST, 0, &st0);
      tr_mem_reset_peak(TR_MEM_HOST, 0);
      PCHECK_RC(tr_pp_exec_step(&x, low.acts[rank], low.len[rank], NULL));
      tr_mem_stats(TR_MEM_HOST, 0, &st1);
    }
    held[k] = (double)(st1.peak_bytes - st0.current_bytes);
    if (k == 0 && rank == 0) { /* one micro-batch's forward on stage 0 */
      tr_model_mb_t mb;
      tr_mem_stats(TR_MEM_HOST, 0, &st0);
      PCHECK_RC(cb_begin(&cb, 0, &mb));
      PCHECK_RC(tr_model_forward(&mod, &mb, sp.blocks[0].first,
                                 sp.blocks[0].last));
      tr_mem_stats(TR_MEM_HOST, 0, &st1);
      one = (double)(st1.current_bytes - st0.current_bytes);
      tr_model_mb_release(&mod, &mb);
    }
    tr_model_release(&mod);
    tr_pp_schedule_release(&low);
    tr_pp_schedule_release(&compute);
    tr_pp_split_release(&sp);
  }
  if (rank == 0) {
    fprintf(stderr,
            "pp %d m %lld stage 0: one micro-batch %.0f bytes; peak GPipe "
            "%.0f (%.2f micro-batches, simulator %lld), 1F1B %.0f (%.2f, "
            "simulator %lld)\n",
            pp, (long long)m, one, held[0], held[0] / one, (long long)want[0],
            held[1], held[1] / one, (long long)want[1]);
    PCHECK(want[0] == m && want[1] == pp);
    /* the in-flight micro-batches, and at most one more's worth of a
     * backward's transients */
    PCHECK(held[1] <= (double)(pp + 1) * one);
    PCHECK(held[0] >= (double)(m - 1) * one && held[0] <= (double)(m + 1) * one);
  }
}

START_TEST(t_activation_peak) {
  int st[4], n = 2 * _i;
  ck_assert_int_eq(
      pg_spawn(n, "gloo", TR_DEV_CPU, 1, 60000, body_peak, 120, st), 0);
  for (int r = 0; r < n; r++)
    ck_assert_msg(st[r] == 0, "rank %d of %d exited with %d", r, n, st[r]);
}
END_TEST

/* ---- local ---- */

/* A rank's list missing its receive, or its send: refused, nothing held
 * afterwards (allocator counters). A forward-only list (validation) gives
 * the loss the training list's forward gave, and refuses a backward. */
START_TEST(t_exec_refuses) {
  tr_model_config_t c;
  ck_assert_int_eq(small_config(1, &c), 0);
  tr_model_t m;
  ck_assert_int_eq(tr_model_init(&m, &c), 0);
  ck_assert_int_eq(tr_model_alloc(&m, TR_DEVICE_CPU), 0);
  ck_assert_int_eq(tr_model_init_weights(&m, 5), 0);
  make_batch(c.vocab_size, 1, 2);
  cb_t cb = {.m = &m};
  tr_pp_range_t blocks[2] = {{0, 5}, {5, 10}};
  int ranks[2] = {0, 1}; /* stage 1 is elsewhere: rank 0 without a group */
  int one[2] = {0, 0};   /* both stages here */
  tr_pp_exec_t x = {.model = &m,
                    .n_micro = 1,
                    .mb_begin = cb_begin,
                    .arg = &cb,
                    .n_stages = 2,
                    .stage_blocks = blocks,
                    .stage_rank = one,
                    .B = B,
                    .T = T};
  tr_mem_stats_t before, after;
  struct {
    const char* acts[4];
    const int* ranks;
    int want;
    int forward_only;
  } cases[] = {
      /* both stages here: handed over in place, and the loss comes back */
      {{"0F0", "1F0", "1B0", "0B0"}, one, 0, 0},
      /* stage 1 before stage 0 gave it its input */
      {{"1F0", "0F0", "1B0", "0B0"}, one, TR_EINVAL, 0},
      /* stage 0's backward before stage 1's gave it its gradient */
      {{"0F0", "1F0", "0B0", "1B0"}, one, TR_EINVAL, 0},
      /* stage 1 elsewhere and no group: a send is refused */
      {{"0F0", "0SEND_F0", NULL, NULL}, ranks, TR_EUNSUPPORTED, 0},
      /* ... and a list that never sends its output ends with it held */
      {{"0F0", NULL, NULL, NULL}, ranks, TR_EINVAL, 0},
      /* a stage rank 0 does not hold */
      {{"1F0", NULL, NULL, NULL}, ranks, TR_EINVAL, 0},
      /* forward only: each micro-batch done at its F, no backward */
      {{"0F0", "1F0", NULL, NULL}, one, 0, 1},
      {{"0F0", "1F0", "1B0", NULL}, one, TR_EINVAL, 1},
  };
  double loss0 = 0;
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    tr_pp_action_t acts[4];
    int n = 0;
    for (; n < 4 && cases[k].acts[n]; n++)
      ck_assert_int_eq(tr_pp_action_parse(cases[k].acts[n], &acts[n]), 0);
    x.stage_rank = cases[k].ranks;
    x.forward_only = cases[k].forward_only;
    tr_pp_result_t res;
    ck_assert_int_eq(tr_pp_exec_step(&x, acts, n, &res), cases[k].want);
    if (x.forward_only && cases[k].want == 0)
      ck_assert(res.loss_sum == loss0);
    if (k == 0) { /* micro-batch 0's valid targets and their loss */
      loss0 = res.loss_sum;
      int64_t valid = 0;
      for (int j = 0; j < B * T; j++) valid += g_tgt[0][j] != TR_IGNORE_INDEX;
      ck_assert_int_eq(res.n_valid, valid);
      ck_assert(res.loss_sum > 0 && isfinite(res.loss_sum));
      /* counted from here: the first forward grew the RoPE tables */
      tr_mem_stats(TR_MEM_HOST, 0, &before);
    }
  }
  tr_mem_stats(TR_MEM_HOST, 0, &after);
  ck_assert_int_eq(after.live_allocs, before.live_allocs);
  tr_model_release(&m);
}
END_TEST

/* What stops a pipeline before a worker starts, in the words the user
 * sees. */
START_TEST(t_bad_input) {
  tr_pp_schedule_t s;
  char err[512];
  /* a micro-batch count below what the schedule needs */
  ck_assert_int_eq(tr_pp_generate(&s, TR_PP_1F1B, 4, 2, 1, err, sizeof err),
                   TR_EINVAL);
  ck_assert_str_eq(err,
                   "Number of microbatches (2) must be greater than or equal "
                   "to the number of stages (4).");
  ck_assert_int_eq(
      tr_pp_generate(&s, TR_PP_DUALPIPEV, 4, 6, 2, err, sizeof err),
      TR_EINVAL);
  ck_assert_str_eq(err,
                   "DualPipeV requires at least as many microbatches as "
                   "stages, but got 6 microbatches and 8 stages.");
  /* layers that do not split */
  tr_pp_split_t sp;
  ck_assert_int_eq(tr_pp_split_init(&sp, 3, 4, TR_PP_INTERLEAVED_1F1B, 0, 1, 1,
                                    err, sizeof err),
                   TR_ECONFIG);
  ck_assert_str_eq(err,
                   "pipeline split: 8 stages (pipeline_parallel_degree 4 x 2 "
                   "per rank) but only 5 effective layers (3 layers + "
                   "first_stage_less_layers 1 + last_stage_less_layers 1)");
  /* a CSV with an unknown action */
  const char* csv = "0F0,0F1\n1F0,1X0\n";
  ck_assert_int_eq(
      tr_pp_csv_parse(csv, strlen(csv), "pp.csv", &s, err, sizeof err),
      TR_EPARSE);
  ck_assert_str_eq(err, "pp.csv:2:5: bad action '1X0'");
}
END_TEST

/* The set-up from the job's settings: the generator's or a CSV's
 * schedule, lowered; what does not fit, in words. */
static int build_csv(const char* text, tr_pp_kind_t kind, int pp, int64_t m,
                     tr_pp_build_t* b, char* path, char* err, size_t n) {
  strcpy(path, "/tmp/check_pp_exec_XXXXXX");
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  tr_pp_build_opts_t o = {.n_layers = LAYERS,
                          .pp = pp,
                          .kind = kind,
                          .n_micro = m,
                          .first_less = 1,
                          .last_less = 1,
                          .schedule_csv = path};
  int rc = tr_pp_build_init(b, &o, err, n);
  unlink(path);
  return rc;
}

START_TEST(t_build) {
  char err[4096], path[64], want[512];
  tr_pp_build_t b;
  tr_pp_build_opts_t o = {.n_layers = LAYERS,
                          .pp = 2,
                          .kind = TR_PP_INTERLEAVED_1F1B,
                          .n_micro = 4,
                          .first_less = 1,
                          .last_less = 1,
                          .unshard_reshard = 1};
  ck_assert_int_eq(tr_pp_build_init(&b, &o, err, sizeof err), 0);
  ck_assert_int_eq(b.split.n_stages, 4);
  /* the lowering of the generator's lists */
  tr_pp_schedule_t g, low;
  ck_assert_int_eq(
      tr_pp_generate(&g, TR_PP_INTERLEAVED_1F1B, 2, 4, 2, NULL, 0), 0);
  ck_assert_int_eq(tr_pp_lower(&g, 2, 4, 4, 1, &low, NULL, NULL, 0), 0);
  char *x = tr_pp_csv_format(&low), *y = tr_pp_csv_format(&b.lowered);
  ck_assert_str_eq(x, y);
  free(x);
  free(y);
  tr_pp_exec_t e = {0};
  tr_pp_build_exec(&b, &e);
  ck_assert(e.n_micro == 4 && e.n_stages == 4 &&
            e.stage_blocks == b.split.blocks && e.stage_rank == b.split.stage_rank);
  /* forward-only lists (validation): each rank's stages in order, every
   * micro-batch on one before the next, the sends and receives lowered
   * (the V's turn on rank 1 handed over in place) */
  tr_pp_schedule_t ev;
  ck_assert_int_eq(tr_pp_build_eval(&b, 2, &ev, err, sizeof err), 0);
  x = tr_pp_csv_format(&ev);
  ck_assert_str_eq(x,
                   "0F0,0SEND_F0,2RECV_F0,0F1,0SEND_F1,2RECV_F1,2F0,2SEND_F0,"
                   "2F1,2SEND_F1\r\n"
                   "1RECV_F0,1F0,1SEND_F0,1RECV_F1,1F1,1SEND_F1,3RECV_F0,3F0,"
                   "3RECV_F1,3F1\r\n");
  free(x);
  tr_pp_schedule_release(&ev);
  tr_pp_build_release(&b);
  o.kind = TR_PP_ZBV;
  ck_assert_int_eq(tr_pp_build_init(&b, &o, err, sizeof err), 0);
  ck_assert_int_eq(tr_pp_build_eval(&b, 2, &ev, err, sizeof err), 0);
  x = tr_pp_csv_format(&ev);
  ck_assert_str_eq(x,
                   "0F0,0SEND_F0,0F1,0SEND_F1,3RECV_F0,3F0,3RECV_F1,3F1\r\n"
                   "1RECV_F0,1F0,1RECV_F1,1F1,2F0,2SEND_F0,2F1,2SEND_F1\r\n");
  free(x);
  tr_pp_schedule_release(&ev);
  ck_assert_int_eq(tr_pp_build_eval(&b, 0, &ev, err, sizeof err), TR_EINVAL);
  tr_pp_schedule_release(&g);
  tr_pp_build_release(&b);
  /* too few micro-batches for the class */
  o.kind = TR_PP_1F1B;
  o.n_micro = 1;
  ck_assert_int_eq(tr_pp_build_init(&b, &o, err, sizeof err), TR_ECONFIG);
  ck_assert_str_eq(err,
                   "Number of microbatches (1) must be greater than or equal "
                   "to the number of stages (2).");
  /* a CSV: the same lists as 1F1B's, lowered alike */
  ck_assert_int_eq(build_csv("0F0,0F1,,0B0,,0B1\n,1F0,1B0,1F1,1B1\n",
                             TR_PP_1F1B, 2, 2, &b, path, err, sizeof err),
                   0);
  ck_assert_int_eq(tr_pp_generate(&g, TR_PP_1F1B, 2, 2, 1, NULL, 0), 0);
  tr_pp_schedule_release(&low);
  ck_assert_int_eq(tr_pp_lower(&g, 2, 2, 2, 0, &low, NULL, NULL, 0), 0);
  x = tr_pp_csv_format(&low);
  y = tr_pp_csv_format(&b.lowered);
  ck_assert_str_eq(x, y);
  free(x);
  free(y);
  tr_pp_schedule_release(&g);
  tr_pp_schedule_release(&low);
  tr_pp_build_release(&b);
  /* what a CSV can get wrong */
  ck_assert_int_eq(build_csv("0F0,0B0\n1F0,1B0\n2F0,2B0\n", TR_PP_1F1B, 2, 1,
                             &b, path, err, sizeof err),
                   TR_ECONFIG);
  snprintf(want, sizeof want,
           "%s: 3 rows (ranks), but pipeline_parallel_degree is 2", path);
  ck_assert_str_eq(err, want);
  ck_assert_int_eq(build_csv("1F0,1B0\n0F0,0B0\n", TR_PP_1F1B, 2, 1, &b, path,
                             err, sizeof err),
                   TR_ECONFIG);
  snprintf(want, sizeof want,
           "%s: stage 0 runs on rank 1, but schedule 1F1B places it on rank "
           "0",
           path);
  ck_assert_str_eq(err, want);
  ck_assert_int_eq(build_csv("0B0,0F0\n1F0,1B0\n", TR_PP_1F1B, 2, 1, &b, path,
                             err, sizeof err),
                   TR_ECONFIG);
  snprintf(want, sizeof want,
           "%s: Rank 0, step 0: Running Full Backward for stage 0, "
           "microbatch 0 without first running Forward",
           path);
  ck_assert_msg(strncmp(err, want, strlen(want)) == 0, "%s", err);
  ck_assert_int_eq(build_csv("0F0,0SEND_F0,0B0\n1F0,1B0\n", TR_PP_1F1B, 2, 1,
                             &b, path, err, sizeof err),
                   TR_EPARSE);
  snprintf(want, sizeof want,
           "%s:1: cell 2: expected a compute-only schedule but found "
           "communication action '0SEND_F0' at rank 0, position 1",
           path);
  ck_assert_str_eq(err, want);
  ck_assert_int_eq(build_csv("0F0,0B0\n1F0,1Z0\n", TR_PP_1F1B, 2, 1, &b, path,
                             err, sizeof err),
                   TR_EPARSE);
  snprintf(want, sizeof want, "%s:2:5: bad action '1Z0'", path);
  ck_assert_str_eq(err, want);
  o.schedule_csv = "/nonexistent/pp.csv";
  o.n_micro = 2;
  ck_assert_int_eq(tr_pp_build_init(&b, &o, err, sizeof err), TR_ENOENT);
  ck_assert_msg(strncmp(err, "/nonexistent/pp.csv: ", 21) == 0, "%s", err);
  /* layers that do not split */
  o.schedule_csv = NULL;
  o.n_layers = 1;
  o.pp = 4;
  ck_assert_int_eq(tr_pp_build_init(&b, &o, err, sizeof err), TR_ECONFIG);
  ck_assert_str_eq(err,
                   "pipeline split: 4 stages (pipeline_parallel_degree 4 x 1 "
                   "per rank) but only 3 effective layers (1 layers + "
                   "first_stage_less_layers 1 + last_stage_less_layers 1)");
}
END_TEST

int main(void) {
  Suite* s = suite_create("pp_exec");
  TCase* tc = tcase_create("local");
  tcase_add_test(tc, t_exec_refuses);
  tcase_add_test(tc, t_bad_input);
  tcase_add_test(tc, t_build);
  suite_add_tcase(s, tc);
  tc = tcase_create("ranks");
  tcase_set_timeout(tc, 900);
  tcase_add_loop_test(tc, t_gpt2_pp, 1, 3);
  tcase_add_loop_test(tc, t_llama_pp, 1, 3);
  tcase_add_loop_test(tc, t_flight_record, 1, 3);
  tcase_add_loop_test(tc, t_activation_peak, 1, 3);
  suite_add_tcase(s, tc);
  SRunner* r = srunner_create(s);
  srunner_run_all(r, CK_NORMAL);
  int nf = srunner_ntests_failed(r);
  srunner_free(r);
  return nf == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
