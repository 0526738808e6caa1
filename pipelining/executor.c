/* pipelining/executor.c: runs one rank's lowered action list over the
 * stages it holds (each a range of the model's blocks), owning the step's
 * micro-batches from their first forward to their last backward, the
 * activations and gradients that travel between stages (send / receive
 * over the pipeline's process group, or handed over in place between two
 * stages of this rank), and the step's loss made known to every rank
 * (trainrun/pipelining.h). */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "pipelining/internal.h" /* the executed actions' times */
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/pg.h"
#include "trainrun/pipelining.h"

typedef enum {
  MB_NONE = 0,         /* not begun */
  MB_FORWARD_DONE = 1, /* forward ran: a backward (B or I) may follow */
  MB_INPUT_DONE = 2,   /* I ran: its W is owed */
  MB_DONE = 3          /* released */
} mb_state_t;

/* A tensor on its way into or out of a (stage, micro-batch): received
 * (work pending until waited), or handed over by a stage of this rank. */
typedef struct {
  tr_tensor_t t;
  tr_pg_work_t* work; /* a posted receive not yet waited */
  int held;           /* t holds the tensor (or will, once work completes) */
} slot_t;

typedef struct {
  tr_model_mb_t mb;
  unsigned char state;
  slot_t in;   /* the forward's input (stage > 0) */
  slot_t gin;  /* the gradient of the output (stage < last) */
  slot_t out;  /* the forward's output, for SEND_F */
  slot_t gout; /* the gradient of the input, for SEND_B */
} cell_t;

typedef struct {
  const tr_pp_exec_t* x;
  tr_model_t* m;
  int n_stages, rank, B, T;
  const tr_pp_range_t* blocks;
  const int* stage_rank;
  tr_pp_range_t one_block; /* the one-stage form's range */
  int one_rank;
  cell_t* cells; /* [stage][micro] */
  tr_pg_work_t** sends;
  int64_t n_sends, cap_sends;
  double loss_sum;
  int64_t n_valid;
  tr__pp_stamps_t* stamps; /* NULL unless x->times */
  int64_t k;               /* the action running: its index in the list */
} run_t;

static cell_t* cell(run_t* r, int stage, int64_t micro) {
  return &r->cells[(size_t)stage * (size_t)r->x->n_micro + (size_t)micro];
}

static void slot_clear(slot_t* s) {
  if (s->work) { /* a receive that no action waited for: the op keeps its
                    own reference to the buffer */
    tr_pg_work_free(s->work);
    s->work = NULL;
  }
  tr_tensor_release(&s->t);
  s->held = 0;
}

/* Move src's tensor into slot s. */
static void slot_put(slot_t* s, tr_tensor_t* src) {
  s->t = *src;
  memset(src, 0, sizeof *src);
  s->held = 1;
}

/* Wait for a slot's receive, then move its tensor into *dst. */
static int slot_take(slot_t* s, tr_tensor_t* dst) {
  int rc = 0;
  if (s->work) {
    rc = tr_pg_work_wait(s->work, 0);
    tr_pg_work_free(s->work);
    s->work = NULL;
  }
  if (rc < 0) {
    slot_clear(s);
    return rc;
  }
  tr_tensor_release(dst);
  *dst = s->t;
  memset(&s->t, 0, sizeof s->t);
  s->held = 0;
  return 0;
}

static int bad(const tr_pp_action_t* a, const char* why) {
  char name[TR_PP_ACTION_STRLEN];
  TR_LOG_ERROR(PP, "action %s: %s", tr_pp_action_str(a, name, sizeof name),
               why);
  return TR_EINVAL;
}

/* The tag of what goes into stage `to` for micro-batch i (dir 0 forward,
 * 1 backward): unique per (stage, micro-batch, direction) below MPI's
 * smallest tag bound; pairs of ranks see their sends and receives in the
 * same order anyway (tr_pp_add_send_recv), so a wrap is harmless. */
static int tag_of(const run_t* r, int to, int64_t i, int dir) {
  return (int)(((i * r->n_stages + to) * 2 + dir) % 32768);
}

/* After the micro-batch's last backward on stage s: the last stage's
 * losses to the step's sum and the caller, then release. */
static int finish(run_t* r, int s, int64_t i, int rc) {
  cell_t* c = cell(r, s, i);
  if (s == r->n_stages - 1) {
    r->loss_sum += c->mb.loss_sum;
    r->n_valid += c->mb.n_valid;
    if (rc == 0 && r->x->mb_end) rc = r->x->mb_end(r->x->arg, i, &c->mb);
  }
  tr_model_mb_release(r->m, &c->mb);
  c->state = MB_DONE;
  return rc;
}

/* The running action's computation starts now (after its wait for its
 * input; the first half of an OVERLAP_F_B marks the pair's start). */
static void computing(run_t* r) {
  if (!tr__pp_stamps_is_marked(r->stamps, r->k, 0))
    tr__pp_stamps_mark(r->stamps, r->k, 0);
}

static int stage_local(const run_t* r, int s) {
  return r->stage_rank[s] == r->rank;
}

static int forward(run_t* r, const tr_pp_action_t* a) {
  const tr_pp_exec_t* x = r->x;
  int s = a->stage;
  int64_t i = a->micro;
  cell_t* c = cell(r, s, i);
  if (c->state != MB_NONE) return bad(a, "a second forward");
  int first = s == 0, last = s == r->n_stages - 1;
  if (!first && !c->in.held)
    return bad(a, stage_local(r, s - 1) ? "forward before its input stage's"
                                        : "forward before receiving its input");
  /* the data: tokens (a middle stage's blocks read them too: the
   * attention's document mask and positions), targets, loss scale */
  int rc = x->mb_begin(x->arg, i, &c->mb);
  if (rc < 0) return rc;
  c->state = MB_FORWARD_DONE;
  if (x->forward_only) c->mb.no_grad = 1;
  if (!first) TR_CHECK(slot_take(&c->in, &c->mb.hidden));
  computing(r);
  const tr_pp_range_t* b = &r->blocks[s];
  TR_CHECK(tr_model_forward(r->m, &c->mb, b->first, b->last));
  if (!last) { /* the output: to the next stage here, or kept for SEND_F */
    if (stage_local(r, s + 1))
      slot_put(&cell(r, s + 1, i)->in, &c->mb.hidden);
    else
      slot_put(&c->out, &c->mb.hidden);
  }
  return x->forward_only ? finish(r, s, i, 0) : 0;
}

/* B or I: the output gradient in, the input gradient out. */
static int backward(run_t* r, const tr_pp_action_t* a) {
  int s = a->stage;
  int64_t i = a->micro;
  cell_t* c = cell(r, s, i);
  int first = s == 0, last = s == r->n_stages - 1;
  if (c->state != MB_FORWARD_DONE)
    return bad(a, c->state == MB_INPUT_DONE ? "a backward after its input "
                                              "gradient"
                                            : "a backward without its forward");
  if (!last && !c->gin.held)
    return bad(a, stage_local(r, s + 1)
                      ? "backward before its output stage's"
                      : "backward before receiving its output gradient");
  if (!last) TR_CHECK(slot_take(&c->gin, &c->mb.dhidden));
  computing(r);
  const tr_pp_range_t* b = &r->blocks[s];
  int rc;
  if (a->type == TR_PP_B) {
    rc = tr_model_backward(r->m, &c->mb, b->first, b->last);
  } else {
    rc = tr_model_backward_input(r->m, &c->mb, b->first, b->last);
    c->state = MB_INPUT_DONE;
  }
  if (rc == 0 && !first) {
    if (stage_local(r, s - 1))
      slot_put(&cell(r, s - 1, i)->gin, &c->mb.dhidden);
    else
      slot_put(&c->gout, &c->mb.dhidden);
  }
  if (a->type == TR_PP_B) rc = finish(r, s, i, rc);
  return rc;
}

static int post_recv(run_t* r, const tr_pp_action_t* a) {
  int s = a->stage, fwd = a->type == TR_PP_RECV_F;
  int64_t i = a->micro;
  int from = fwd ? s - 1 : s + 1;
  if (from < 0 || from >= r->n_stages || stage_local(r, from))
    return bad(a, "a receive from no stage of another rank");
  cell_t* c = cell(r, s, i);
  slot_t* sl = fwd ? &c->in : &c->gin;
  if (sl->held || (fwd ? c->state != MB_NONE : c->state != MB_FORWARD_DONE))
    return bad(a, "a receive twice, or at the wrong time");
  if (r->B < 1 || r->T < 1)
    return bad(a, "a receive without the micro-batch shape (B, T)");
  int64_t shape[3] = {r->B, r->T, r->m->cfg.dim};
  TR_CHECK(tr_tensor_empty(&sl->t, r->m->compute_dtype, r->m->device, 3,
                           shape));
  sl->held = 1;
  int rc = tr_pg_recv(r->x->pg, &sl->t, r->stage_rank[from],
                      tag_of(r, s, i, !fwd), &sl->work);
  if (rc < 0) slot_clear(sl);
  return rc;
}

static int post_send(run_t* r, const tr_pp_action_t* a) {
  int s = a->stage, fwd = a->type == TR_PP_SEND_F;
  int64_t i = a->micro;
  int to = fwd ? s + 1 : s - 1;
  if (to < 0 || to >= r->n_stages || stage_local(r, to))
    return bad(a, "a send to no stage of another rank");
  cell_t* c = cell(r, s, i);
  slot_t* sl = fwd ? &c->out : &c->gout;
  if (!sl->held) return bad(a, "a send before the computation it sends");
  if (r->n_sends == r->cap_sends) {
    int64_t cap = r->cap_sends ? 2 * r->cap_sends : 16;
    tr_pg_work_t** p = realloc(r->sends, (size_t)cap * sizeof *p);
    if (!p) return TR_ENOMEM;
    r->sends = p;
    r->cap_sends = cap;
  }
  tr_pg_work_t* w = NULL;
  /* the op holds its own reference to the tensor: ours goes at once */
  int rc = tr_pg_send(r->x->pg, &sl->t, r->stage_rank[to], tag_of(r, to, i, !fwd),
                      &w);
  slot_clear(sl);
  if (rc < 0) return rc;
  r->sends[r->n_sends++] = w;
  return 0;
}

static int is_computation(tr_pp_type_t t) {
  return t == TR_PP_F || t == TR_PP_B || t == TR_PP_I || t == TR_PP_W ||
         t == TR_PP_OVERLAP_F_B;
}

static int run_one(run_t* r, const tr_pp_action_t* a) {
  const tr_pp_exec_t* x = r->x;
  if (a->type == TR_PP_NONE) return 0;
  if (a->type == TR_PP_OVERLAP_F_B) { /* its forward, then its backward */
    for (int h = 0; h < 2; h++) {
      tr_pp_action_t sub = {.stage = a->sub[h].stage,
                            .type = a->sub[h].type,
                            .micro = a->sub[h].micro};
      if (sub.type == TR_PP_OVERLAP_F_B) return bad(a, "a nested overlap");
      TR_CHECK(run_one(r, &sub));
    }
    return 0;
  }
  int fsdp = a->type == TR_PP_UNSHARD || a->type == TR_PP_RESHARD ||
             a->type == TR_PP_REDUCE_GRAD;
  if (a->stage < 0 || a->stage >= r->n_stages || !stage_local(r, a->stage))
    return bad(a, "a stage this rank does not hold");
  if (fsdp) return x->fsdp_action ? x->fsdp_action(x->arg, a) : 0;
  if (a->micro < 0 || a->micro >= x->n_micro)
    return bad(a, "micro-batch out of range");
  int comm = a->type == TR_PP_SEND_F || a->type == TR_PP_RECV_F ||
             a->type == TR_PP_SEND_B || a->type == TR_PP_RECV_B;
  if (comm && !x->pg) {
    char name[TR_PP_ACTION_STRLEN];
    TR_LOG_ERROR(PP, "action %s: communication needs the pipeline's group",
                 tr_pp_action_str(a, name, sizeof name));
    return TR_EUNSUPPORTED;
  }
  cell_t* c = cell(r, a->stage, a->micro);
  switch (a->type) {
    case TR_PP_F:
      return forward(r, a);
    case TR_PP_B:
    case TR_PP_I:
      return backward(r, a);
    case TR_PP_W: {
      if (c->state != MB_INPUT_DONE)
        return bad(a, "a weight gradient without its input gradient");
      computing(r);
      const tr_pp_range_t* b = &r->blocks[a->stage];
      int rc = tr_model_backward_weight(r->m, &c->mb, b->first, b->last);
      return finish(r, a->stage, a->micro, rc);
    }
    case TR_PP_RECV_F:
    case TR_PP_RECV_B:
      return post_recv(r, a);
    case TR_PP_SEND_F:
    case TR_PP_SEND_B:
      return post_send(r, a);
    default:
      return bad(a, "an unknown action");
  }
}

/* The last stage's loss and token count from its rank to every rank. */
static int share_loss(run_t* r) {
  int64_t v[2];
  memcpy(&v[0], &r->loss_sum, sizeof v[0]);
  v[1] = r->n_valid;
  int64_t two = 2;
  tr_tensor_t host = {0}, dev = {0};
  TR_CHECK(tr_tensor_wrap(&host, v, TR_I64, TR_DEVICE_CPU, 1, &two));
  tr_tensor_t* t = &host;
  int rc = 0;
  if (r->m->device.type != TR_DEV_CPU) {
    rc = tr_tensor_empty(&dev, TR_I64, r->m->device, 1, &two);
    if (rc == 0) rc = tr_tensor_copy(&dev, &host);
    t = &dev;
  }
  if (rc == 0)
    rc = tr_pg_broadcast(r->x->pg, t, r->stage_rank[r->n_stages - 1], NULL);
  if (rc == 0 && t != &host) rc = tr_tensor_copy(&host, &dev);
  tr_tensor_release(&dev);
  tr_tensor_release(&host);
  if (rc < 0) return rc;
  memcpy(&r->loss_sum, &v[0], sizeof v[0]);
  r->n_valid = v[1];
  return 0;
}

static const char* state_owed(unsigned char st) {
  return st == MB_NONE         ? "forward"
         : st == MB_INPUT_DONE ? "weight gradient"
                               : "backward";
}

int tr_pp_exec_step(const tr_pp_exec_t* x, const tr_pp_action_t* acts,
                    int64_t n, tr_pp_result_t* out) {
  if (out) memset(out, 0, sizeof *out);
  if (!x || !x->model || !x->mb_begin || x->n_micro < 1 || n < 0 ||
      (n > 0 && !acts))
    return TR_EINVAL;
  run_t r;
  memset(&r, 0, sizeof r);
  r.x = x;
  r.m = x->model;
  r.B = x->B;
  r.T = x->T;
  if (x->n_stages == 0) { /* one stage: [first_block, last_block) */
    r.one_block.first = x->first_block;
    r.one_block.last = x->last_block;
    r.n_stages = 1;
    r.blocks = &r.one_block;
    r.stage_rank = &r.one_rank;
  } else {
    if (x->n_stages < 1 || !x->stage_blocks || !x->stage_rank) return TR_EINVAL;
    r.n_stages = x->n_stages;
    r.blocks = x->stage_blocks;
    r.stage_rank = x->stage_rank;
    r.rank = x->pg ? tr_pg_rank(x->pg) : 0;
  }
  for (int s = 0; s < r.n_stages; s++) {
    if (r.stage_rank[s] != r.rank) continue;
    if (r.blocks[s].first < 0 || r.blocks[s].last > r.m->n_blocks ||
        r.blocks[s].first >= r.blocks[s].last) {
      TR_LOG_ERROR(PP, "stage %d: blocks [%d, %d) outside the model's %d", s,
                   r.blocks[s].first, r.blocks[s].last, r.m->n_blocks);
      return TR_EINVAL;
    }
  }
  r.cells = calloc((size_t)r.n_stages * (size_t)x->n_micro, sizeof *r.cells);
  if (!r.cells) return TR_ENOMEM;
  int rc = 0;
  if (x->times)
    rc = tr__pp_stamps_new(&r.stamps, x->times, n,
                           r.m->device.type == TR_DEV_CUDA);
  for (int64_t k = 0; k < n && rc == 0; k++) {
    r.k = k;
    /* a computation marks its start after its input's wait */
    if (!is_computation(acts[k].type)) tr__pp_stamps_mark(r.stamps, k, 0);
    rc = run_one(&r, &acts[k]);
    tr__pp_stamps_mark(r.stamps, k, 1);
  }
  /* sends are waited last; after a failure they are left to their op
   * (a peer that never receives would hold this rank until the op's
   * timeout: the error goes up at once, and the job stops the peers) */
  for (int64_t k = 0; k < r.n_sends; k++) {
    int w = rc == 0 ? tr_pg_work_wait(r.sends[k], 0) : 0;
    if (rc == 0 && w < 0) rc = w;
    tr_pg_work_free(r.sends[k]);
  }
  int src = tr__pp_stamps_free(r.stamps);
  if (rc == 0) rc = src;
  /* what the list left behind: every local stage's micro-batches must be
   * done, every received or produced tensor used */
  for (int s = 0; s < r.n_stages; s++) {
    if (r.stage_rank[s] != r.rank) continue;
    for (int64_t i = 0; i < x->n_micro; i++) {
      cell_t* c = cell(&r, s, i);
      if (c->state != MB_DONE && rc == 0) {
        TR_LOG_ERROR(PP, "stage %d micro-batch %lld: the list ends before its %s",
                     s, (long long)i, state_owed(c->state));
        rc = TR_EINVAL;
      }
      const slot_t* sl[4] = {&c->in, &c->gin, &c->out, &c->gout};
      static const char* const what[4] = {
          "an input it never used", "an output gradient it never used",
          "an output it never sent", "an input gradient it never sent"};
      for (int q = 0; q < 4; q++)
        if (sl[q]->held && rc == 0) {
          TR_LOG_ERROR(PP, "stage %d micro-batch %lld: the list leaves %s", s,
                       (long long)i, what[q]);
          rc = TR_EINVAL;
        }
      if (c->state != MB_NONE && c->state != MB_DONE)
        tr_model_mb_release(r.m, &c->mb);
      slot_clear(&c->in);
      slot_clear(&c->gin);
      slot_clear(&c->out);
      slot_clear(&c->gout);
    }
  }
  /* the last stage's loss on every rank, when asked for (after a failure
   * the step is lost: the other ranks' receives and this broadcast time
   * out) */
  if (rc == 0 && out && x->pg && x->n_stages > 1 && tr_pg_size(x->pg) > 1)
    rc = share_loss(&r);
  if (out) {
    out->loss_sum = r.loss_sum;
    out->n_valid = r.n_valid;
  }
  free(r.cells);
  free(r.sends);
  return rc;
}

int tr_pp_exec_run(const tr_pp_exec_t* x, const tr_pp_action_t* acts,
                   int64_t n) {
  return tr_pp_exec_step(x, acts, n, NULL);
}
