/* trainer/pipeline.c: the trainer under pipeline parallelism -- the
 * schedule built from the settings (trainrun/pipelining.h), this rank's
 * stages allocated, a step's micro-batches read and run by the executor
 * over the pipeline group (the data-parallel layer's UNSHARD, RESHARD and
 * REDUCE_GRAD on the stages' blocks), the gradient of a table tied
 * between the end stages summed between them, validation batches run
 * forward only through the stages, and the weights gathered to rank 0 at
 * the end (trainer/internal.h). */
#include "config.h"

#include <inttypes.h>
#include <math.h> /* NAN */
#include <stdlib.h>
#include <string.h>

#include "trainer/internal.h"
#include "trainrun/error.h"
#include "trainrun/param.h" /* TRAINRUN_PP_TRACE */
#include "trainrun/trainer.h"

/* The pipeline rank of the first stage that uses parameter i. */
static int owner(const tr_trainer_t* t, int i) {
  for (int r = 0; r < t->ppb->split.pp; r++)
    if (tr_pp_param_counted(&t->model, &t->ppb->split, r, i)) return r;
  return 0;
}

int tr__trainer_pp_init(tr_trainer_t* t, tr_errmsg_t* err) {
  tr_trainer_pp_t* pp = &t->pp;
  if (pp->microbatch_size < 1 || t->B % pp->microbatch_size)
    return tr_errmsg_set(err, TR_ECONFIG,
                         "training.local_batch_size %" PRId64
                         " is not a multiple of "
                         "parallelism.pipeline_parallel_microbatch_size %" PRId64,
                         t->B, pp->microbatch_size);
  if (t->settings.validation.enable &&
      t->settings.validation.local_batch_size % pp->microbatch_size)
    return tr_errmsg_set(
        err, TR_ECONFIG,
        "validation.local_batch_size %" PRId64
        " is not a multiple of "
        "parallelism.pipeline_parallel_microbatch_size %" PRId64,
        t->settings.validation.local_batch_size, pp->microbatch_size);
  t->ppb = calloc(1, sizeof *t->ppb);
  if (!t->ppb) return TR_ENOMEM;
  tr_pp_build_opts_t o = pp->build;
  o.n_layers = t->model.cfg.n_layers;
  o.pp = tr_pg_size(pp->pg);
  o.n_micro = t->grad_accum * (t->B / pp->microbatch_size);
  /* FSDP's stages: UNSHARD / RESHARD in the lists (REDUCE_GRAD always) */
  o.unshard_reshard = t->dist.stage_op != NULL;
  t->dist.pipelined = 1; /* one reduction a step (trainrun/dp.h) */
  char msg[sizeof err->message];
  int rc = tr_pp_build_init(t->ppb, &o, msg, sizeof msg);
  if (rc < 0) {
    free(t->ppb);
    t->ppb = NULL;
    return tr_errmsg_set(err, rc, "%s", msg);
  }
  t->pp_rank = tr_pg_rank(pp->pg);
  /* this rank's stages, before FSDP groups the blocks it runs */
  const tr_pp_split_t* sp = &t->ppb->split;
  for (int s = 0; s < sp->n_stages; s++)
    if (sp->stage_rank[s] == t->pp_rank)
      TR_CHECK(tr_model_hold_blocks(&t->model, sp->blocks[s].first,
                                    sp->blocks[s].last));
  /* a tied table's gradient counts once: on the first stage's rank */
  tr_model_t* m = &t->model;
  t->norm_skip = calloc((size_t)m->n_params + 1, 1);
  if (!t->norm_skip) return TR_ENOMEM;
  for (int i = 0; i < m->n_params; i++)
    t->norm_skip[i] = !tr_pp_param_counted(m, &t->ppb->split, t->pp_rank, i);
  return 0;
}

int tr__trainer_pp_alloc(tr_trainer_t* t) {
  const tr_pp_split_t* sp = &t->ppb->split;
  for (int s = 0; s < sp->n_stages; s++)
    if (sp->stage_rank[s] == t->pp_rank)
      TR_CHECK(tr_model_alloc_blocks(&t->model, t->device, sp->blocks[s].first,
                                     sp->blocks[s].last));
  return 0;
}

void tr__trainer_pp_release(tr_trainer_t* t) {
  if (t->ppb) tr_pp_build_release(t->ppb);
  free(t->ppb);
  free(t->norm_skip);
  free(t->pp_tokens);
  free(t->pp_targets);
  if (t->pp_eval) tr_pp_schedule_release(t->pp_eval);
  free(t->pp_eval);
  t->pp_eval = NULL;
  t->ppb = NULL;
  t->norm_skip = NULL;
  t->pp_tokens = t->pp_targets = NULL;
}

/* The step's micro-batches to the executor, from the samples read at the
 * step's start (validation: the batch's, forward only). */
typedef struct {
  tr_trainer_t* t;
  const int32_t *tokens, *targets; /* micro-batch-major */
  int64_t T;
  int no_grad;
  float scale;
  int (*mb_end)(void* arg, int64_t micro, tr_model_mb_t* mb);
  void* end_arg;
  tr_errmsg_t* err;
} pp_ctx_t;

static int pp_mb_begin(void* arg, int64_t micro, tr_model_mb_t* mb) {
  pp_ctx_t* c = arg;
  tr_trainer_t* t = c->t;
  int64_t n = t->pp.microbatch_size * c->T;
  int rc =
      tr_model_mb_init(&t->model, mb, (int)t->pp.microbatch_size, (int)c->T,
                       c->tokens + micro * n, c->targets + micro * n);
  if (rc < 0)
    return tr_errmsg_set(c->err, rc, "%s%" PRId64 ": bad batch: %s",
                         c->no_grad ? "validation after step " : "step ",
                         t->step + (c->no_grad ? 0 : 1), tr_strerror(rc));
  mb->no_grad = c->no_grad;
  mb->loss_scale = c->scale;
  mb->defer_loss = !c->no_grad && t->model.device.type != TR_DEV_CPU;
  return 0;
}

static int pp_mb_end(void* arg, int64_t micro, tr_model_mb_t* mb) {
  pp_ctx_t* c = arg;
  return c->mb_end ? c->mb_end(c->end_arg, micro, mb) : 0;
}

/* UNSHARD, RESHARD, REDUCE_GRAD: the data-parallel layer's stage action
 * on the stage's blocks. */
static int pp_fsdp_action(void* arg, const tr_pp_action_t* a) {
  pp_ctx_t* c = arg;
  tr_trainer_t* t = c->t;
  tr_dp_stage_op_t op = a->type == TR_PP_UNSHARD   ? TR_DP_UNSHARD
                        : a->type == TR_PP_RESHARD ? TR_DP_RESHARD
                                                   : TR_DP_REDUCE_GRAD;
  const tr_pp_range_t* r = &t->ppb->split.blocks[a->stage];
  int rc = t->dist.stage_op(t->dist.arg, &t->model, op, r->first, r->last);
  if (rc < 0)
    return tr_errmsg_set(c->err, rc, "step %" PRId64 ": %s of stage %d: %s",
                         t->step + 1, tr_pp_type_name(a->type), a->stage,
                         tr_strerror(rc));
  return 0;
}

/* The traced step's idle fraction per pipeline rank, measured and as the
 * simulator predicts it with the step's own costs. */
static void report_idle(tr_trainer_t* t, const double* const* per, FILE* con) {
  tr_pp_idle_t st;
  char why[256];
  int rc = tr_pp_idle_measure(&t->ppb->lowered, t->ppb->split.n_stages, per,
                              &st, why, sizeof why);
  if (rc < 0) {
    fprintf(con, "the pipeline's idle time: %s\n",
            why[0] ? why : tr_strerror(rc));
    return;
  }
  fprintf(con,
          "pipeline step %" PRId64
          ": %.1f ms, simulated with its costs %.1f "
          "ms; idle per rank, measured / simulated:",
          t->step + 1, st.span * 1e3, st.sim_span * 1e3);
  for (int r = 0; r < st.n_ranks; r++)
    fprintf(con, " %d: %.1f%% / %.1f%%", r, 100 * st.idle[r],
            100 * st.sim_idle[r]);
  fprintf(con, "\n");
  tr_pp_idle_release(&st);
}

/* TRAINRUN_PP_TRACE: every pipeline rank's action times of this step
 * (n doubles each, padded to the longest list) gathered over the pp
 * group; the run's rank 0 writes them as a Chrome trace. */
static int write_trace(tr_trainer_t* t, const double* times, int64_t n,
                       const char* path, tr_errmsg_t* err) {
  tr_pp_build_t* b = t->ppb;
  int pp = tr_pg_size(t->pp.pg);
  int64_t one[1] = {n * (int64_t)sizeof(double)}, all[1] = {one[0] * pp};
  tr_tensor_t a = {0}, g = {0};
  int rc = tr_tensor_empty(&a, TR_U8, TR_DEVICE_CPU, 1, one);
  if (rc == 0) rc = tr_tensor_empty(&g, TR_U8, TR_DEVICE_CPU, 1, all);
  if (rc == 0) {
    memcpy(tr_tensor_data(&a), times, (size_t)one[0]);
    rc = tr_pg_all_gather(t->pp.pg, &g, &a, NULL);
  }
  const double** per = calloc((size_t)pp, sizeof *per);
  if (rc == 0 && !per) rc = TR_ENOMEM;
  if (rc == 0 && t->rank == 0) {
    const double* d = tr_tensor_data(&g);
    for (int r = 0; r < pp; r++) per[r] = d + (size_t)r * (size_t)n;
    rc = tr_pp_trace_write_timed(&b->lowered, per, path);
    FILE* con = t->opts.console ? t->opts.console : stdout;
    if (rc == 0 && !t->opts.quiet)
      fprintf(con, "wrote the pipeline's step %" PRId64 " as a Chrome trace to %s\n",
              t->step + 1, path);
    if (rc == 0 && !t->opts.quiet) report_idle(t, per, con);
  }
  free(per);
  tr_tensor_release(&a);
  tr_tensor_release(&g);
  if (rc < 0)
    return tr_errmsg_set(err, rc, "TRAINRUN_PP_TRACE '%s': %s", path,
                         tr_strerror(rc));
  return 0;
}

/* The executor over this rank's stages for micro-batches of c. */
static void exec_init(tr_trainer_t* t, pp_ctx_t* c, tr_pp_exec_t* x) {
  memset(x, 0, sizeof *x);
  tr_pp_build_exec(t->ppb, x);
  x->model = &t->model;
  x->pg = t->pp.pg;
  /* a stage sends [B, T, C] of this rank's rows: T / cp (its chunks
   * under context parallelism), / tp under SP */
  x->B = (int)t->pp.microbatch_size;
  int64_t rows = tr__trainer_cp_rows(t, c->T);
  x->T = (int)(t->tp.pg && t->tp.sequence_parallel ? rows / tr_pg_size(t->tp.pg)
                                                   : rows);
  x->mb_begin = pp_mb_begin;
  x->mb_end = pp_mb_end;
  x->arg = c;
}

int tr__trainer_pp_run(tr_trainer_t* t, float scale,
                       int (*mb_end)(void* arg, int64_t micro,
                                     tr_model_mb_t* mb),
                       void* end_arg, tr_errmsg_t* err) {
  tr_pp_build_t* b = t->ppb;
  int64_t mbs = t->pp.microbatch_size, n = mbs * t->T;
  if (!t->pp_tokens) {
    t->pp_tokens = malloc((size_t)(b->n_micro * n) * sizeof *t->pp_tokens);
    t->pp_targets = malloc((size_t)(b->n_micro * n) * sizeof *t->pp_targets);
    if (!t->pp_tokens || !t->pp_targets) return TR_ENOMEM;
  }
  /* every rank reads the step's samples, so every loader is at the same
   * place (checkpoints); the end stages use them */
  for (int64_t k = 0; k < b->n_micro; k++)
    TR_CHECK(tr_loader_next(&t->train, mbs, t->dist.dp_rank, t->dist.dp_size,
                            t->pp_tokens + k * n, t->pp_targets + k * n,
                            err));
  pp_ctx_t c = {.t = t,
                .tokens = t->pp_tokens,
                .targets = t->pp_targets,
                .T = t->T,
                .scale = scale,
                .mb_end = mb_end,
                .end_arg = end_arg,
                .err = err};
  tr_pp_exec_t x;
  exec_init(t, &c, &x);
  if (t->dist.stage_op) x.fsdp_action = pp_fsdp_action;
  const char* trace = tr_param_str(TR_PARAM_PP_TRACE);
  int64_t longest = 0;
  for (int q = 0; q < b->lowered.n_ranks; q++)
    if (b->lowered.len[q] > longest) longest = b->lowered.len[q];
  if (trace[0] && t->step + 1 == tr_param_int(TR_PARAM_PP_TRACE_STEP)) {
    x.times = calloc((size_t)(2 * longest + 1), sizeof *x.times);
    if (!x.times) return TR_ENOMEM;
  }
  int r = t->pp_rank;
  int rc = tr_pp_exec_step(&x, b->lowered.acts[r], b->lowered.len[r], NULL);
  if (rc < 0) {
    free(x.times);
    return err && err->code ? err->code
                            : tr_errmsg_set(err, rc,
                                            "step %" PRId64 ": pipeline: %s",
                                            t->step + 1, tr_strerror(rc));
  }
  if (x.times) rc = write_trace(t, x.times, 2 * longest, trace, err);
  free(x.times);
  return rc;
}

int tr__trainer_pp_sum_tied(tr_trainer_t* t, tr_errmsg_t* err) {
  int rc = tr_pp_sum_tied_grads(&t->model, &t->ppb->split, t->pp.pg,
                                t->pp_rank);
  if (rc < 0)
    return tr_errmsg_set(err, rc,
                         "step %" PRId64 ": the tied table's gradient: %s",
                         t->step + 1, tr_strerror(rc));
  return 0;
}

int tr__trainer_pp_gather(tr_trainer_t* t, tr_errmsg_t* err) {
  tr_model_t* m = &t->model;
  for (int i = 0; i < m->n_params; i++) {
    tr_param_t* p = &m->params[i];
    int from = owner(t, i);
    if (from == 0) continue; /* rank 0 holds it */
    int rc = 0;
    tr_tensor_t h = {0}; /* through the host (the CPU backend) */
    if (t->pp_rank == from) {
      rc = tr_tensor_empty(&h, TR_F32, TR_DEVICE_CPU, p->ndim, p->data.shape);
      if (rc == 0) rc = tr_tensor_copy(&h, &p->data);
      if (rc == 0) rc = tr_pg_send(t->pp.pg, &h, 0, i, NULL);
    } else if (t->pp_rank == 0) {
      rc = tr_tensor_empty(&h, TR_F32, TR_DEVICE_CPU, p->ndim, p->shape);
      if (rc == 0) rc = tr_pg_recv(t->pp.pg, &h, from, i, NULL);
      if (rc == 0) { /* whole: the sender gathered it over tp */
        tr_tensor_release(&p->data);
        p->data = h;
        memset(&h, 0, sizeof h);
        tr_dtensor_param_clear_layout(p);
      }
    }
    tr_tensor_release(&h);
    if (rc < 0)
      return tr_errmsg_set(err, rc, "gathering '%s' over pp: %s", p->name,
                           tr_strerror(rc));
  }
  return 0;
}

int tr__trainer_pp_validate(tr_trainer_t* t, double* loss, int64_t* ntokens,
                            tr_errmsg_t* err) {
  int64_t B = t->val_B, T = t->val_T, mbs = t->pp.microbatch_size;
  int rank = t->dist.dp_rank, dp = t->dist.dp_size;
  tr_errmsg_clear(err); /* a callback's message, if one fails, is news */
  if (!t->pp_eval) {    /* the lists of a batch, once */
    char msg[sizeof err->message];
    t->pp_eval = calloc(1, sizeof *t->pp_eval);
    if (!t->pp_eval) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
    int rc = tr_pp_build_eval(t->ppb, B / mbs, t->pp_eval, msg, sizeof msg);
    if (rc < 0) {
      free(t->pp_eval);
      t->pp_eval = NULL;
      return tr_errmsg_set(err, rc, "validation: pipeline: %s", msg);
    }
  }
  pp_ctx_t c = {.t = t,
                .tokens = t->inputs,
                .targets = t->targets,
                .T = T,
                .no_grad = 1,
                .scale = 1,
                .err = err};
  tr_pp_exec_t x;
  exec_init(t, &c, &x);
  x.n_micro = B / mbs;
  x.forward_only = 1;
  const tr_pp_schedule_t* s = t->pp_eval;
  double sums[2] = {0, 0};
  for (int64_t k = 0; k < t->val_steps; k++) {
    /* every pipeline rank of a replica reads the batch (eval_loop's
     * samples); the end stages use it */
    int64_t first = k * B * dp + (int64_t)rank * B;
    for (int64_t b = 0; b < B; b++)
      TR_CHECK(tr_loader_sample(&t->val, first + b, t->inputs + b * T,
                                t->targets + b * T, err));
    tr_pp_result_t res;
    int rc = tr_pp_exec_step(&x, s->acts[t->pp_rank], s->len[t->pp_rank], &res);
    if (rc < 0)
      return err && err->code
                 ? err->code
                 : tr_errmsg_set(err, rc, "validation: pipeline: %s",
                                 tr_strerror(rc));
    sums[0] += res.loss_sum;
    sums[1] += (double)res.n_valid;
  }
  if (t->dist.dp_size > 1 && t->dist.all_reduce_sum) {
    int rc = t->dist.all_reduce_sum(t->dist.arg, sums, 2);
    if (rc < 0)
      return tr_errmsg_set(err, rc, "validation: all-reduce: %s",
                           tr_strerror(rc));
  }
  *loss = sums[1] > 0 ? sums[0] / sums[1] : NAN;
  *ntokens = (int64_t)sums[1];
  return 0;
}
