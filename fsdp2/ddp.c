/* fsdp2/ddp.c: DDP, the replicate-only case of data parallelism --
 * bucketed gradient all-reduce SUM, started from the model's post-backward
 * hooks of the last micro-step as each bucket's gradients become final,
 * and exact scalar sums over a process group (trainrun/ddp.h). The grads
 * are views of their buckets' flat buffers (PyTorch's
 * gradient_as_bucket_view): each all-reduce sums them in place. It shares
 * FSDP's scalar sum (reduce.c) and the compute's waits and their stall
 * timer (collectives/waits.c, trainrun/pg_waits.h).
 *
 * How the step waits for the all-reduces (post_backward, through
 * tr_pg_waits_wait):
 *  - CPU tensors (Gloo, MPI): the host waits for each bucket in turn and
 *    frees the work; an error fails post_backward.
 *  - CUDA tensors (NCCL): no host wait. The legacy default stream (where
 *    the tensor copies run) and the kernels' stream (tr_kern_get_stream)
 *    wait for each bucket's op on the device, so the host goes on to the
 *    gradient norm and the device reads the sums as they arrive.
 * A grad the model replaced after the layout (no longer a view) is copied
 * into its flat before the op and back after the wait. The works are
 *    held (at most one per bucket) until the step's end (dist->step_end,
 *    after the trainer read the norm, so the device has run them): the
 *    host then sees them complete, frees them and returns the first error;
 *    works a failed step left held are settled at the next step's start
 *    at the latest.
 *
 * [metrics] comm_overlap (opts.comm_timing; dist->comm_take): op
 * timing is on for the group, each bucket's all-reduce duration adds to
 * the step's communication, and the time the compute waited adds to the
 * exposed part: on the CPU the host's time in the waits, on CUDA the
 * kernels' stream's stall, between two events recorded around each
 * stream wait. Timing adds events and clock reads, never a wait the
 * computation depends on, so the results are the same bits. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainrun/ddp.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/pg_waits.h" /* the waits and their stall timer */

typedef struct {
  tr_tensor_t flat; /* 1-D, numel = the sum of its params' numel */
  int first, n;     /* order[first .. first+n) are its params */
  int ready_block;  /* its grads are final after this block's backward */
  char name[16];    /* its index, for messages */
} ddp_bucket_t;

struct tr_ddp {
  tr_pg_t* pg;
  int64_t bucket_bytes, train_timeout_ms;
  int overlap;
  int (*sync_fault)(tr_pg_t*, tr_tensor_t*, int64_t);
  int rank, size;
  const tr_model_t* hooked; /* the model setup_model hooked; NULL: none */
  /* the buckets, laid out for one model */
  const tr_model_t* laid; /* NULL: no layout */
  int nparams;
  int* order;   /* parameter indices, reverse model order */
  int64_t* off; /* each param's first element in its bucket's flat */
  ddp_bucket_t* buckets;
  /* works[b]: bucket b's all-reduce, issued and not yet handed to the
   * waits (non-NULL): in flight */
  tr_pg_work_t** works;
  int nbuckets;
  /* the works post_backward handed over: (CUDA) waited for by the streams
   * and held until the host sees them complete; their stall timer */
  tr_pg_waits_t waits;
  /* the optimizer step in progress */
  int in_step;       /* pre_micro_step began it; post_backward ends it */
  int64_t step;      /* its number, from 1 */
  int armed;         /* last micro-step: the hooks issue ready buckets */
  int next;          /* buckets [0, next) are issued this step */
  int fault_checked; /* opts.sync_fault was asked this step */
  int faulted;       /* a debug fault took the collectives' place */
  int held;          /* post_backward left works held for step_end */
  int64_t reduces, overlapped, syncs;
  /* [metrics] comm_overlap */
  int timing;          /* opts.comm_timing: op timing is on for pg */
  int64_t timed_steps; /* step_end calls since the take */
};

void tr_ddp_opts_init(tr_ddp_opts_t* opts) {
  memset(opts, 0, sizeof *opts);
  opts->bucket_bytes = 25LL << 20;
  opts->overlap = 1;
}

int tr_ddp_new(const tr_ddp_opts_t* opts, tr_ddp_t** out) {
  *out = NULL;
  if (!opts || !opts->pg || opts->bucket_bytes < 1 ||
      opts->train_timeout_ms < 0)
    return TR_EINVAL;
  tr_ddp_t* d = calloc(1, sizeof *d);
  if (!d) return TR_ENOMEM;
  d->pg = opts->pg;
  d->bucket_bytes = opts->bucket_bytes;
  d->train_timeout_ms = opts->train_timeout_ms;
  d->overlap = opts->overlap != 0;
  d->sync_fault = opts->sync_fault;
  if (opts->comm_timing) {
    int rc = tr_pg_set_op_timing(opts->pg, 1); /* ops issued from now on */
    if (rc < 0) {
      free(d);
      return rc;
    }
    d->timing = 1;
  }
  int rc = tr_pg_waits_init(&d->waits, 1);
  if (rc < 0) {
    if (d->timing) tr_pg_set_op_timing(opts->pg, 0);
    free(d);
    return rc;
  }
  d->rank = tr_pg_rank(opts->pg);
  d->size = tr_pg_size(opts->pg);
  *out = d;
  return 0;
}

/* Host-wait for every work post_backward left held and settle it, then
 * read the stalls; the first error. */
static int reap(tr_ddp_t* d) {
  d->held = 0;
  return tr_pg_waits_drain(&d->waits);
}

/* Wait for every all-reduce still in flight (a step that failed between
 * issuing and post_backward) and drop the handles; the first error. */
static int drain(tr_ddp_t* d) {
  int rc = 0;
  for (int b = 0; b < d->nbuckets; b++) {
    if (!d->works || !d->works[b]) continue;
    int wrc = tr_pg_work_wait(d->works[b], 0);
    if (rc == 0) rc = wrc;
    tr_pg_work_free(d->works[b]);
    d->works[b] = NULL;
  }
  return rc;
}

static void drop_buckets(tr_ddp_t* d) {
  if (d->held) reap(d);
  drain(d);
  for (int b = 0; b < d->nbuckets; b++) tr_tensor_release(&d->buckets[b].flat);
  free(d->buckets);
  free(d->works);
  free(d->order);
  free(d->off);
  d->buckets = NULL;
  d->works = NULL;
  d->order = NULL;
  d->off = NULL;
  d->nbuckets = 0;
  d->nparams = 0;
  d->laid = NULL;
}

void tr_ddp_free(tr_ddp_t* d) {
  if (!d) return;
  drop_buckets(d);
  tr_pg_waits_release(&d->waits);
  if (d->timing) tr_pg_set_op_timing(d->pg, 0); /* the group outlives d */
  free(d);
}

int tr_ddp_nbuckets(const tr_ddp_t* d) { return d->nbuckets; }
int64_t tr_ddp_reduces(const tr_ddp_t* d) { return d->reduces; }
int64_t tr_ddp_overlapped(const tr_ddp_t* d) { return d->overlapped; }
static int same_kind(const tr_tensor_t* a, const tr_tensor_t* b) {
  return a->dtype == b->dtype && a->device.type == b->device.type &&
         a->device.index == b->device.index;
}

/* Param i of bucket k's place in its flat, shaped as grad g. */
static int bucket_part(const tr_ddp_t* d, ddp_bucket_t* k, int i,
                       const tr_tensor_t* g, tr_tensor_t* view) {
  tr_tensor_t part = {0};
  int rc = tr_tensor_narrow(&part, &k->flat, 0, d->off[i], tr_tensor_numel(g));
  if (rc == 0) rc = tr_tensor_reshape(view, &part, g->ndim, g->shape);
  tr_tensor_release(&part);
  return rc;
}

/* Reverse parameter order, a new bucket when the next grad would pass
 * bucket_bytes (a bucket holds at least one) or differs in dtype or
 * device. A parameter's grad is final after the backward of the first
 * block that uses it (backward runs the blocks last to first; a tied table
 * is used by the embedding and the head); a bucket's, after the smallest
 * such block of its parameters. Grads without memory (another pipeline
 * stage's parameters) are left out. */
static int layout(tr_ddp_t* d, tr_model_t* m) {
  int n = m->n_params;
  int* final_block = malloc((size_t)(n > 0 ? n : 1) * sizeof *final_block);
  d->order = malloc((size_t)(n > 0 ? n : 1) * sizeof *d->order);
  d->off = malloc((size_t)(n > 0 ? n : 1) * sizeof *d->off);
  d->buckets = calloc((size_t)(n > 0 ? n : 1), sizeof *d->buckets);
  if (!final_block || !d->order || !d->off || !d->buckets) goto out_nomem;
  for (int i = 0; i < n; i++) final_block[i] = m->params[i].block;
  for (int b = 0; b < m->n_blocks; b++)
    for (int j = 0; j < m->blocks[b].n_params; j++) {
      int p = m->blocks[b].params[j];
      if (p >= 0 && p < n && b < final_block[p]) final_block[p] = b;
    }
  /* the grads this rank holds (under pipeline parallelism, its stages') */
  int held = 0;
  for (int i = n - 1; i >= 0; i--)
    if (m->params[i].grad.storage) d->order[held++] = i;
  n = held;
  int64_t used = 0;
  for (int i = 0; i < n; i++) {
    int p = d->order[i];
    const tr_tensor_t* g = &m->params[p].grad;
    int64_t bytes = (int64_t)tr_tensor_nbytes(g);
    ddp_bucket_t* cur = d->nbuckets ? &d->buckets[d->nbuckets - 1] : NULL;
    const tr_tensor_t* prev =
        cur ? &m->params[d->order[cur->first]].grad : NULL;
    if (!cur || used + bytes > d->bucket_bytes || !same_kind(prev, g)) {
      cur = &d->buckets[d->nbuckets++];
      cur->first = i;
      cur->ready_block = final_block[p];
      used = 0;
    }
    if (final_block[p] < cur->ready_block) cur->ready_block = final_block[p];
    used = (used + 15) & ~(int64_t)15; /* each grad 16-byte aligned */
    d->off[i] = used / (int64_t)tr_dtype_size(g->dtype);
    cur->n++;
    used += bytes;
  }
  free(final_block);
  final_block = NULL;
  /* every bucket's work may be held at once (CUDA): no host wait before
   * the step's end */
  tr_pg_waits_release(&d->waits);
  if (tr_pg_waits_init(&d->waits, d->nbuckets) < 0) goto out_nomem;
  for (int b = 0; b < d->nbuckets; b++) {
    ddp_bucket_t* k = &d->buckets[b];
    snprintf(k->name, sizeof k->name, "%d", b);
    int last = k->first + k->n - 1;
    const tr_tensor_t* g = &m->params[d->order[last]].grad;
    int64_t numel = d->off[last] + tr_tensor_numel(g);
    int rc = tr_tensor_zeros(&k->flat, g->dtype, g->device, 1, &numel);
    /* every grad becomes a view of its place in the flat (PyTorch's
     * gradient_as_bucket_view): the all-reduce sums the grads in place,
     * no copy in or out; their memory is the flats' */
    for (int i = k->first; i < k->first + k->n && rc == 0; i++) {
      tr_tensor_t* pg = &m->params[d->order[i]].grad;
      tr_tensor_t view = {0};
      rc = bucket_part(d, k, i, pg, &view);
      if (rc == 0) rc = tr_tensor_copy(&view, pg);
      if (rc == 0) {
        tr_tensor_release(pg);
        *pg = view;
      } else {
        tr_tensor_release(&view);
      }
    }
    if (rc < 0) {
      drop_buckets(d);
      return rc;
    }
  }
  d->works =
      calloc((size_t)(d->nbuckets > 0 ? d->nbuckets : 1), sizeof *d->works);
  if (!d->works) goto out_nomem;
  d->nparams = m->n_params; /* the table laid out */
  d->laid = m;
  TR_LOG_INFO(TRAIN, "ddp: %d gradients in %d bucket%s of up to %lld bytes%s",
              n, d->nbuckets, d->nbuckets == 1 ? "" : "s",
              (long long)d->bucket_bytes,
              d->overlap ? ", all-reduced during backward" : "");
  return 0;
out_nomem:
  free(final_block);
  drop_buckets(d);
  return TR_ENOMEM;
}

static int ensure_layout(tr_ddp_t* d, tr_model_t* m) {
  if (d->laid == m && d->nparams == m->n_params) return 0;
  drop_buckets(d);
  return layout(d, m);
}

/* Copy each grad of bucket b into its flat (in = 1) or back (in = 0), but
 * for the grads that are views of it (layout made every grad one; a grad
 * the model has since replaced is copied). */
static int bucket_copy(tr_ddp_t* d, const tr_model_t* m, int b, int in) {
  ddp_bucket_t* k = &d->buckets[b];
  int rc = 0;
  for (int i = k->first; i < k->first + k->n && rc == 0; i++) {
    tr_tensor_t* g = &m->params[d->order[i]].grad;
    tr_tensor_t view = {0};
    rc = bucket_part(d, k, i, g, &view);
    if (rc == 0 && tr_tensor_data(&view) != tr_tensor_data(g))
      rc = in ? tr_tensor_copy(&view, g) : tr_tensor_copy(g, &view);
    tr_tensor_release(&view);
  }
  return rc;
}

/* The group's timeout becomes the training one after the first complete
 * gradient sync. */
static void synced(tr_ddp_t* d) {
  if (d->syncs++ == 0 && d->train_timeout_ms > 0)
    tr_pg_set_timeout_all(d->pg, d->train_timeout_ms);
}

/* Start the next step's bookkeeping (buckets laid out for m). */
static int begin_step(tr_ddp_t* d, tr_model_t* m, int64_t step) {
  /* works the last step's post_backward left held when its step_end did
   * not come (the step failed after it): their errors fail this step */
  int hrc = d->held ? reap(d) : 0;
  int rc = drain(d); /* a failed step's leftovers */
  if (rc < 0)
    TR_LOG_WARN(TRAIN, "ddp: an all-reduce of a failed step ended with %s",
                tr_err_name(rc));
  if (hrc < 0) return hrc;
  TR_CHECK(ensure_layout(d, m));
  d->in_step = 1;
  d->step = step;
  d->armed = 0;
  d->next = 0;
  d->fault_checked = 0;
  d->faulted = 0;
  return 0;
}

/* Issue, in bucket order, the buckets whose grads are final once block
 * `block` has finished its backward (block < 0: all that are left). Every
 * rank issues the same buckets in the same order. */
static int issue_ready(tr_ddp_t* d, tr_model_t* m, int block) {
  if (!d->fault_checked) {
    /* --debug.fault skip_collective / mismatch take the collectives'
     * place: asked once, before the step's first all-reduce */
    d->fault_checked = 1;
    int frc =
        !d->sync_fault
            ? 0
            : d->sync_fault(d->pg, d->nbuckets ? &d->buckets[0].flat : NULL,
                            d->step);
    if (frc < 0) return frc;
    d->faulted = frc > 0;
  }
  if (d->faulted) return 0;
  while (d->next < d->nbuckets &&
         (block < 0 || d->buckets[d->next].ready_block >= block)) {
    int b = d->next;
    TR_CHECK(bucket_copy(d, m, b, 1));
    TR_CHECK(
        tr_pg_all_reduce(d->pg, &d->buckets[b].flat, TR_PG_SUM, &d->works[b]));
    d->reduces++;
    d->next++;
  }
  return 0;
}

/* The model's post-backward hook: during the last micro-step's backward,
 * start the buckets that block `block` made final. */
static int block_done(void* arg, struct tr_model* m, int block,
                      struct tr_model_mb* mb) {
  (void)mb;
  tr_ddp_t* d = arg;
  if (!d->armed || d->laid != m) return 0;
  int before = d->next;
  int rc = issue_ready(d, m, block);
  d->overlapped += d->next - before;
  if (rc < 0) d->armed = 0;
  return rc;
}

/* A new model (a trainer being set up): lay the buckets out again at its
 * first step, and hook its backward. */
static int setup_model(void* arg, tr_model_t* m, tr_dp_t* dp) {
  (void)dp; /* whole grads: grads_sharded stays 0 */
  tr_ddp_t* d = arg;
  drop_buckets(d);
  d->in_step = 0;
  d->hooked = NULL;
  if (!d->overlap) return 0;
  TR_CHECK(tr_model_add_hook(m, TR_HOOK_POST_BACKWARD, block_done, d));
  d->hooked = m;
  return 0;
}

static int pre_micro_step(void* arg, tr_model_t* m, int64_t step, int64_t micro,
                          int64_t n_micro) {
  tr_ddp_t* d = arg;
  if (micro == 0) TR_CHECK(begin_step(d, m, step));
  d->armed = d->overlap && d->hooked == m && micro == n_micro - 1;
  return 0;
}

/* Buffer lifetimes on CUDA: why neither the flats nor the grads need a
 * host wait. Device memory comes from the stream-ordered pool, allocated
 * and freed on the legacy default stream, where the tensor copies run
 * too (core/cuda.cu); NCCL starts an op on its own stream after an event
 * recorded on the legacy stream when the op was issued, so a bucket's op
 * comes after the backward kernels that made its grads. Both the legacy
 * stream and the kernels' stream wait for the op's done event before
 * anything after post_backward (the norm, AdamW, the next step's
 * zero_grad and backward, which write the grads = the flat): no op reads
 * a flat the next step is writing. A flat's memory lives as long as its
 * grads (views hold references); each NCCL work also holds a reference to
 * its tensor (collectives/work.c drops it with the last handle). */

/* The trainer's post_backward: issue what is left, then have the sums
 * copied back into the grads as they arrive (the host waits on the CPU,
 * the streams on CUDA; see the top of the file). */
static int post_backward(void* arg, tr_model_t* m, int64_t step) {
  tr_ddp_t* d = arg;
  d->armed = 0;
  if (!d->in_step || d->laid != m) TR_CHECK(begin_step(d, m, step));
  d->in_step = 0;
  int rc = issue_ready(d, m, -1);
  if (d->faulted) return rc;
  for (int b = 0; b < d->nbuckets; b++) {
    if (!d->works[b]) continue;
    int cuda = d->buckets[b].flat.device.type == TR_DEV_CUDA;
    tr_pg_work_t* w = d->works[b];
    d->works[b] = NULL; /* the waits have it now */
    int wrc = tr_pg_waits_wait(&d->waits, w, cuda, 1, d->timing, "all-reduce",
                               "gradient bucket", d->buckets[b].name);
    if (cuda && d->waits.nheld > 0) d->held = 1; /* until step_end */
    if (wrc == 0 && rc == 0) wrc = bucket_copy(d, m, b, 0);
    if (rc == 0) rc = wrc;
  }
  if (rc == 0 && !d->held) synced(d);
  return rc;
}

/* The trainer's step_end (the device has run the step: the norm was
 * read): settle the held works, their first error; count a timed step. */
static int step_end(void* arg) {
  tr_ddp_t* d = arg;
  int rc = 0;
  if (d->held) {
    rc = reap(d);
    if (rc == 0) synced(d);
  }
  if (d->timing) d->timed_steps++;
  return rc;
}

static void comm_take(void* arg, tr_pg_comm_t* out) {
  tr_ddp_t* d = arg;
  tr_pg_waits_take(&d->waits, &d->timed_steps, out);
}

static int all_reduce_sum(void* arg, double* vals, int n) {
  tr_ddp_t* d = arg;
  return tr_dp_sum_over(d->pg, vals, n);
}

void tr_ddp_dp(tr_ddp_t* d, tr_dp_t* dist) {
  memset(dist, 0, sizeof *dist);
  dist->dp_rank = d->rank;
  dist->dp_size = d->size;
  dist->setup_model = setup_model;
  dist->pre_micro_step = pre_micro_step;
  dist->post_backward = post_backward;
  dist->all_reduce_sum = all_reduce_sum;
  dist->grads_sharded = 0;
  dist->step_end = step_end;
  dist->comm_take = comm_take;
  dist->arg = d;
}
