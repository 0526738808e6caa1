/* trainer/ddp.c: data parallelism for the trainer -- bucketed gradient
 * all-reduce SUM and exact scalar sums over a process group
 * (trainrun/ddp.h). */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "trainrun/ddp.h"
#include "trainrun/error.h"
#include "trainrun/log.h"

typedef struct {
  tr_tensor_t flat; /* 1-D, numel = the sum of its params' numel */
  int first, n;     /* order[first .. first+n) are its params */
} ddp_bucket_t;

struct tr_ddp {
  tr_pg_t* pg;
  int64_t bucket_bytes, train_timeout_ms;
  int rank, size;
  int nparams;  /* of the model the buckets were laid out for; 0: none */
  int* order;   /* parameter indices, reverse model order */
  int64_t* off; /* each param's first element in its bucket's flat */
  ddp_bucket_t* buckets;
  tr_pg_work_t** works;
  int nbuckets;
  int64_t reduces, syncs;
};

void tr_ddp_opts_init(tr_ddp_opts_t* opts) {
  memset(opts, 0, sizeof *opts);
  opts->bucket_bytes = 25LL << 20;
}

int tr_ddp_init(const tr_ddp_opts_t* opts, tr_ddp_t** out) {
  *out = NULL;
  if (!opts || !opts->pg || opts->bucket_bytes < 1 ||
      opts->train_timeout_ms < 0)
    return TR_EINVAL;
  tr_ddp_t* d = calloc(1, sizeof *d);
  if (!d) return TR_ENOMEM;
  d->pg = opts->pg;
  d->bucket_bytes = opts->bucket_bytes;
  d->train_timeout_ms = opts->train_timeout_ms;
  d->rank = tr_pg_rank(opts->pg);
  d->size = tr_pg_size(opts->pg);
  *out = d;
  return 0;
}

static void drop_buckets(tr_ddp_t* d) {
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
}

void tr_ddp_free(tr_ddp_t* d) {
  if (!d) return;
  drop_buckets(d);
  free(d);
}

int tr_ddp_nbuckets(const tr_ddp_t* d) { return d->nbuckets; }
int64_t tr_ddp_reduces(const tr_ddp_t* d) { return d->reduces; }

static int same_kind(const tr_tensor_t* a, const tr_tensor_t* b) {
  return a->dtype == b->dtype && a->device.type == b->device.type &&
         a->device.index == b->device.index;
}

/* Reverse parameter order, a new bucket when the next grad would pass
 * bucket_bytes (a bucket holds at least one) or differs in dtype or
 * device. */
static int layout(tr_ddp_t* d, const tr_model_t* m) {
  int n = m->n_params;
  d->order = malloc((size_t)(n > 0 ? n : 1) * sizeof *d->order);
  d->off = malloc((size_t)(n > 0 ? n : 1) * sizeof *d->off);
  d->buckets = calloc((size_t)(n > 0 ? n : 1), sizeof *d->buckets);
  if (!d->order || !d->off || !d->buckets) goto out_nomem;
  for (int i = 0; i < n; i++) d->order[i] = n - 1 - i;
  int64_t used = 0;
  for (int i = 0; i < n; i++) {
    const tr_tensor_t* g = &m->params[d->order[i]].grad;
    int64_t bytes = (int64_t)tr_tensor_nbytes(g);
    ddp_bucket_t* cur = d->nbuckets ? &d->buckets[d->nbuckets - 1] : NULL;
    const tr_tensor_t* prev =
        cur ? &m->params[d->order[cur->first]].grad : NULL;
    if (!cur || used + bytes > d->bucket_bytes || !same_kind(prev, g)) {
      cur = &d->buckets[d->nbuckets++];
      cur->first = i;
      used = 0;
    }
    d->off[i] = used / (int64_t)tr_dtype_size(g->dtype);
    cur->n++;
    used += bytes;
  }
  for (int b = 0; b < d->nbuckets; b++) {
    ddp_bucket_t* k = &d->buckets[b];
    int last = k->first + k->n - 1;
    const tr_tensor_t* g = &m->params[d->order[last]].grad;
    int64_t numel = d->off[last] + tr_tensor_numel(g);
    int rc = tr_tensor_empty(&k->flat, g->dtype, g->device, 1, &numel);
    if (rc < 0) {
      drop_buckets(d);
      return rc;
    }
  }
  d->works =
      calloc((size_t)(d->nbuckets > 0 ? d->nbuckets : 1), sizeof *d->works);
  if (!d->works) goto out_nomem;
  d->nparams = n;
  TR_LOG_INFO(TRAIN, "ddp: %d gradients in %d bucket%s of up to %lld bytes", n,
              d->nbuckets, d->nbuckets == 1 ? "" : "s",
              (long long)d->bucket_bytes);
  return 0;
out_nomem:
  drop_buckets(d);
  return TR_ENOMEM;
}

/* Copy each grad of bucket b into its flat (in = 1) or back (in = 0). */
static int bucket_copy(tr_ddp_t* d, const tr_model_t* m, int b, int in) {
  ddp_bucket_t* k = &d->buckets[b];
  int rc = 0;
  for (int i = k->first; i < k->first + k->n && rc == 0; i++) {
    tr_tensor_t* g = &m->params[d->order[i]].grad;
    tr_tensor_t part = {0}, view = {0};
    rc = tr_tensor_narrow(&part, &k->flat, 0, d->off[i], tr_tensor_numel(g));
    if (rc == 0) rc = tr_tensor_reshape(&view, &part, g->ndim, g->shape);
    if (rc == 0) rc = in ? tr_tensor_copy(&view, g) : tr_tensor_copy(g, &view);
    tr_tensor_release(&view);
    tr_tensor_release(&part);
  }
  return rc;
}

static int post_backward(void* arg, struct tr_trainer* t) {
  tr_ddp_t* d = arg;
  const tr_model_t* m = &t->model;
  if (d->nparams != m->n_params) {
    drop_buckets(d);
    TR_CHECK(layout(d, m));
  }
  int rc = 0, issued = 0;
  for (int b = 0; b < d->nbuckets && rc == 0; b++) {
    rc = bucket_copy(d, m, b, 1);
    if (rc == 0)
      rc =
          tr_pg_all_reduce(d->pg, &d->buckets[b].flat, TR_PG_SUM, &d->works[b]);
    if (rc == 0) issued++;
  }
  d->reduces += issued;
  for (int b = 0; b < issued; b++) {
    int wrc = tr_pg_work_wait(d->works[b], 0);
    if (wrc < 0) {
      const char* msg = tr_pg_work_error(d->works[b]);
      TR_LOG_ERROR(TRAIN, "ddp: gradient all-reduce of bucket %d: %s", b,
                   msg ? msg : tr_strerror(wrc));
    }
    if (wrc == 0 && rc == 0) wrc = bucket_copy(d, m, b, 0);
    if (rc == 0) rc = wrc;
    tr_pg_work_free(d->works[b]);
    d->works[b] = NULL;
  }
  if (rc == 0 && d->syncs++ == 0 && d->train_timeout_ms > 0)
    tr_pg_set_timeout_all(d->pg, d->train_timeout_ms);
  return rc;
}

/* Gather every rank's n doubles (as bytes) and sum them in rank order. */
static int all_reduce_sum(void* arg, double* vals, int n) {
  tr_ddp_t* d = arg;
  if (n <= 0) return 0;
  int64_t len = (int64_t)n * (int64_t)sizeof(double);
  int64_t all_len = len * d->size;
  double* all = malloc((size_t)all_len);
  if (!all) return TR_ENOMEM;
  tr_tensor_t in = {0}, out = {0};
  int rc = tr_tensor_wrap(&in, vals, TR_U8, TR_DEVICE_CPU, 1, &len);
  if (rc == 0)
    rc = tr_tensor_wrap(&out, all, TR_U8, TR_DEVICE_CPU, 1, &all_len);
  if (rc == 0) rc = tr_pg_all_gather(d->pg, &out, &in, NULL);
  if (rc == 0) {
    for (int j = 0; j < n; j++) {
      double s = 0;
      for (int r = 0; r < d->size; r++) s += all[(int64_t)r * n + j];
      vals[j] = s;
    }
  }
  tr_tensor_release(&in);
  tr_tensor_release(&out);
  free(all);
  return rc;
}

void tr_ddp_dist(tr_ddp_t* d, tr_trainer_dist_t* dist) {
  memset(dist, 0, sizeof *dist);
  dist->dp_rank = d->rank;
  dist->dp_size = d->size;
  dist->post_backward = post_backward;
  dist->all_reduce_sum = all_reduce_sum;
  dist->grads_sharded = 0;
  dist->arg = d;
}
