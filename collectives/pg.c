/* collectives/pg.c: process groups -- the world and its sub-groups (rank
 * lists, split by color), backend specs and dispatch by tensor device,
 * lazy backend set-up, argument checks, staging of non-contiguous tensors,
 * sequence numbers, coalesced groups, the flight-recorder enqueue hooks and
 * the blocking / async submission of every op. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "collectives/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/param.h"

static const tr__pg_backend_vt_t* vt_of(tr_pg_backend_t b) {
  switch (b) {
    case TR_PG_BACKEND_FAKE:
      return &tr__pg_fake_vt;
#ifdef HAVE_GLOO
    case TR_PG_BACKEND_GLOO:
      return &tr__pg_gloo_vt;
#endif
#ifdef HAVE_MPI
    case TR_PG_BACKEND_MPI:
      return &tr__pg_mpi_vt;
#endif
#ifdef HAVE_NCCL
    case TR_PG_BACKEND_NCCL:
      return &tr__pg_nccl_vt;
#endif
    default:
      return NULL;
  }
}

int tr_pg_backend_available(tr_pg_backend_t b) { return vt_of(b) != NULL; }

/* ---- backend specs ---- */

static int parse_backend_name(const char* s, size_t n, tr_pg_backend_t* out) {
  static const struct {
    const char* name;
    tr_pg_backend_t b;
  } names[] = {{"gloo", TR_PG_BACKEND_GLOO},
               {"nccl", TR_PG_BACKEND_NCCL},
               {"mpi", TR_PG_BACKEND_MPI},
               {"fake", TR_PG_BACKEND_FAKE}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strlen(names[i].name) == n && !strncmp(names[i].name, s, n)) {
      *out = names[i].b;
      return 0;
    }
  return TR_EINVAL;
}

static int backend_fits(tr_device_type_t d, tr_pg_backend_t b) {
  if (b == TR_PG_BACKEND_FAKE) return 1;
  if (d == TR_DEV_CPU) return b == TR_PG_BACKEND_GLOO || b == TR_PG_BACKEND_MPI;
  return b == TR_PG_BACKEND_NCCL;
}

int tr_pg_backend_parse(const char* spec, tr_pg_backend_spec_t* out,
                        tr_errmsg_t* err) {
  tr_pg_backend_t kinds[TR__PG_NDEV] = {TR_PG_BACKEND_NONE, TR_PG_BACKEND_NONE};
  if (!strchr(spec, ':')) {
    tr_pg_backend_t b;
    if (parse_backend_name(spec, strlen(spec), &b) < 0)
      return tr_errmsg_set(err, TR_EINVAL,
                           "expected gloo, nccl, mpi, fake or a list of "
                           "device:backend pairs like 'cpu:gloo,cuda:nccl', "
                           "got '%s'",
                           spec);
    for (int d = 0; d < TR__PG_NDEV; d++)
      if (backend_fits((tr_device_type_t)d, b)) kinds[d] = b;
  } else {
    const char* p = spec;
    for (;;) {
      size_t len = strcspn(p, ",");
      const char* colon = memchr(p, ':', len);
      size_t dl = colon ? (size_t)(colon - p) : 0;
      tr_device_type_t d = TR_DEV_CPU;
      tr_pg_backend_t b = TR_PG_BACKEND_NONE;
      int ok = colon != NULL;
      if (ok && dl == 3 && !strncmp(p, "cpu", 3))
        d = TR_DEV_CPU;
      else if (ok && dl == 4 && !strncmp(p, "cuda", 4))
        d = TR_DEV_CUDA;
      else
        ok = 0;
      if (ok) ok = parse_backend_name(colon + 1, len - dl - 1, &b) == 0;
      if (!ok)
        return tr_errmsg_set(err, TR_EINVAL,
                             "'%.*s' is not device:backend with device cpu "
                             "or cuda and backend gloo, nccl, mpi or fake",
                             (int)len, p);
      if (!backend_fits(d, b))
        return tr_errmsg_set(err, TR_EINVAL, "%s cannot serve %s tensors",
                             tr_pg_backend_name(b),
                             d == TR_DEV_CPU ? "cpu" : "cuda");
      if (kinds[d] != TR_PG_BACKEND_NONE)
        return tr_errmsg_set(err, TR_EINVAL, "'%s' names %s twice", spec,
                             d == TR_DEV_CPU ? "cpu" : "cuda");
      kinds[d] = b;
      if (!p[len]) break;
      p += len + 1;
    }
  }
  out->cpu = kinds[TR_DEV_CPU];
  out->cuda = kinds[TR_DEV_CUDA];
  return 0;
}

/* "gloo" | "cpu:gloo,cuda:nccl" -> one backend per device slot, less the
 * backends this build lacks. */
static int parse_spec(const char* spec, tr_pg_backend_t kinds[TR__PG_NDEV]) {
  tr_pg_backend_spec_t bs;
  tr_errmsg_t err;
  int rc = tr_pg_backend_parse(spec, &bs, &err);
  if (rc < 0) {
    TR_LOG_ERROR(COLL, "backend '%s': %s", spec, err.message);
    return rc;
  }
  kinds[TR_DEV_CPU] = bs.cpu;
  kinds[TR_DEV_CUDA] = bs.cuda;
  /* A device whose backend this build lacks has none ("cpu:gloo,cuda:nccl"
   * works in a build without NCCL until a CUDA tensor shows up); a spec
   * left with no backend at all is an error. */
  int left = 0;
  for (int d = 0; d < TR__PG_NDEV; d++) {
    if (kinds[d] != TR_PG_BACKEND_NONE && !vt_of(kinds[d])) {
      TR_LOG_DEBUG(COLL, "backend '%s': this build has no %s", spec,
                   tr_pg_backend_name(kinds[d]));
      kinds[d] = TR_PG_BACKEND_NONE;
    }
    left += kinds[d] != TR_PG_BACKEND_NONE;
  }
  if (!left) {
    TR_LOG_ERROR(COLL, "backend '%s': this build has none of its backends",
                 spec);
    return TR_EUNSUPPORTED;
  }
  return 0;
}

/* ---- the world and groups ---- */

void tr_pg_opts_init(tr_pg_opts_t* o) {
  memset(o, 0, sizeof *o);
  o->rank = -1;
  o->world_size = -1;
  o->store_prefix = "trpg";
  o->backend = "cpu:gloo,cuda:nccl";
  o->group_desc = "default_pg";
  o->timeout_ms = 300000;
  o->cuda_device = -1;
}

static char* xstrdup(const char* s) { return strdup(s ? s : ""); }

static void world_unref(tr__pg_world_t* wd) {
  pthread_mutex_lock(&wd->mu);
  int last = --wd->refs == 0;
  pthread_mutex_unlock(&wd->mu);
  if (!last) return;
  tr__watchdog_stop(wd);
  tr_store_client_free(wd->store);
  tr_store_client_free(wd->wd_store);
#ifdef HAVE_MPI
  if (wd->kinds[TR_DEV_CPU] == TR_PG_BACKEND_MPI)
    tr__mpi_world_release(wd->mpi_we_initialised, !wd->mpi_unclean);
#endif
  pthread_mutex_destroy(&wd->store_mu);
  pthread_mutex_destroy(&wd->mu);
  pthread_cond_destroy(&wd->cv);
  free(wd->store_prefix);
  free(wd->gloo_host);
  free(wd->failure_key);
  free(wd->first_error);
  free(wd);
}

static void group_release(tr_pg_t* pg) {
  if (pg->world->store) tr_store_prefix_release(&pg->wd_sp);
  pthread_mutex_destroy(&pg->mu);
  pthread_mutex_destroy(&pg->bmu);
  pthread_cond_destroy(&pg->cv);
  free(pg->name);
  free(pg->desc);
  free(pg->granks);
  free(pg->prefix);
  free(pg->error);
  free(pg);
}

/* A group of wd: rank/size/granks are copied; registers it with the world
 * and announces it to the hooks. */
static int group_new(tr__pg_world_t* wd, const char* name, const char* desc,
                     const char* prefix, int rank, int size, const int* granks,
                     const tr_pg_backend_t kinds[TR__PG_NDEV],
                     int64_t timeout_ms, tr_pg_t** out) {
  tr_pg_t* pg = calloc(1, sizeof *pg);
  if (!pg) return TR_ENOMEM;
  pg->world = wd;
  pg->rank = rank;
  pg->size = size;
  pg->name = xstrdup(name);
  pg->desc = xstrdup(desc && *desc ? desc : "undefined");
  pg->prefix = xstrdup(prefix);
  pg->granks = malloc(sizeof(int) * (size_t)size);
  pg->timeout_ms = timeout_ms;
  pthread_mutex_init(&pg->mu, NULL);
  pthread_mutex_init(&pg->bmu, NULL);
  pthread_cond_init(&pg->cv, NULL);
  if (!pg->name || !pg->desc || !pg->prefix || !pg->granks) {
    group_release(pg);
    return TR_ENOMEM;
  }
  memcpy(pg->granks, granks, sizeof(int) * (size_t)size);
  memcpy(pg->kinds, kinds, sizeof pg->kinds);
  if (wd->store) {
    int rc = tr_store_prefix_init(&pg->wd_sp, wd->wd_store, prefix);
    if (rc < 0) {
      group_release(pg);
      return rc;
    }
  }
  pthread_mutex_lock(&wd->mu);
  pg->uid = wd->next_uid++;
  wd->refs++;
  pg->w_next = wd->groups;
  wd->groups = pg;
  pthread_mutex_unlock(&wd->mu);
  const tr_pg_hooks_t* h = tr__pg_hooks();
  if (h->group) h->group(h->arg, pg->uid, pg->name, pg->desc, pg->granks, size);
  *out = pg;
  return 0;
}

int tr_pg_new(const tr_pg_opts_t* o, tr_pg_t** out) {
  *out = NULL;
  tr_pg_backend_t kinds[TR__PG_NDEV];
  TR_CHECK(parse_spec(o->backend ? o->backend : "cpu:gloo,cuda:nccl", kinds));
  int rank = o->rank, size = o->world_size, we_init = 0;
  int uses_mpi = kinds[TR_DEV_CPU] == TR_PG_BACKEND_MPI;
  int needs_store = 0;
  for (int d = 0; d < TR__PG_NDEV; d++)
    needs_store |=
        kinds[d] == TR_PG_BACKEND_GLOO || kinds[d] == TR_PG_BACKEND_NCCL;
  if (needs_store && !o->store) {
    TR_LOG_ERROR(COLL, "backend '%s' needs a store", o->backend);
    return TR_EINVAL;
  }
#ifdef HAVE_MPI
  if (uses_mpi) {
    int mr, ms;
    TR_CHECK(tr__mpi_world_init(&mr, &ms, &we_init));
    if ((rank >= 0 && rank != mr) || (size >= 0 && size != ms)) {
      TR_LOG_ERROR(COLL, "rank %d of %d disagrees with MPI's rank %d of %d",
                   rank, size, mr, ms);
      tr__mpi_world_release(we_init, 1);
      return TR_EINVAL;
    }
    rank = mr;
    size = ms;
  }
#else
  (void)uses_mpi;
#endif
  if (size < 1 || rank < 0 || rank >= size) {
    TR_LOG_ERROR(COLL, "bad rank %d of world size %d", rank, size);
    return TR_EINVAL;
  }
  if (o->timeout_ms <= 0) return TR_EINVAL;

  int rc;
  tr__pg_world_t* wd = calloc(1, sizeof *wd);
  if (!wd) return TR_ENOMEM;
  wd->rank = rank;
  wd->size = size;
  wd->mpi_we_initialised = we_init;
  wd->cuda_device = o->cuda_device;
  memcpy(wd->kinds, kinds, sizeof kinds);
  wd->store_prefix = xstrdup(o->store_prefix ? o->store_prefix : "trpg");
  wd->gloo_host = o->gloo_host ? strdup(o->gloo_host) : NULL;
  wd->failure_key =
      o->failure_key && *o->failure_key ? strdup(o->failure_key) : NULL;
  pthread_mutex_init(&wd->store_mu, NULL);
  pthread_mutex_init(&wd->mu, NULL);
  pthread_cond_init(&wd->cv, NULL);
  wd->refs = 1; /* held by this function until the world group exists */
  if (o->store) {
    TR_CHECK_GOTO(tr_store_client_clone(o->store, &wd->store), rc, out_world);
    TR_CHECK_GOTO(tr_store_client_clone(o->store, &wd->wd_store), rc,
                  out_world);
    /* The watchdog must never block long on the store. */
    tr_store_client_set_timeout(wd->wd_store, 10000);
  }
  TR_CHECK_GOTO(tr__watchdog_start(wd), rc, out_world);

  int* granks = malloc(sizeof(int) * (size_t)size);
  if (!granks) {
    rc = TR_ENOMEM;
    goto out_world;
  }
  for (int i = 0; i < size; i++) granks[i] = i;
  char prefix[512];
  snprintf(prefix, sizeof prefix, "%s/0", wd->store_prefix);
  rc = group_new(wd, "0", o->group_desc ? o->group_desc : "default_pg", prefix,
                 rank, size, granks, kinds, o->timeout_ms, out);
  free(granks);
#ifdef HAVE_MPI
  if (rc == 0 && uses_mpi) {
    rc = tr__mpi_comm_world(*out);
    if (rc < 0) {
      tr_pg_free(*out);
      *out = NULL;
    }
  }
#endif
out_world:
  world_unref(wd);
  return rc;
}

int tr_pg_rank(const tr_pg_t* pg) { return pg->rank; }
int tr_pg_size(const tr_pg_t* pg) { return pg->size; }
int tr_pg_global_rank(const tr_pg_t* pg, int r) {
  return r >= 0 && r < pg->size ? pg->granks[r] : -1;
}
int tr_pg_group_rank(const tr_pg_t* pg, int g) {
  for (int i = 0; i < pg->size; i++)
    if (pg->granks[i] == g) return i;
  return -1;
}
const char* tr_pg_name(const tr_pg_t* pg) { return pg->name; }
const char* tr_pg_desc(const tr_pg_t* pg) { return pg->desc; }
int64_t tr_pg_uid(const tr_pg_t* pg) { return pg->uid; }
tr_pg_backend_t tr_pg_backend(const tr_pg_t* pg, tr_device_type_t d) {
  return (unsigned)d < TR__PG_NDEV ? pg->kinds[d] : TR_PG_BACKEND_NONE;
}

void tr_pg_set_timeout(tr_pg_t* pg, int64_t ms) {
  if (ms <= 0) return;
  pthread_mutex_lock(&pg->mu);
  pg->timeout_ms = ms;
  pthread_mutex_unlock(&pg->mu);
}

void tr_pg_set_timeout_all(tr_pg_t* pg, int64_t ms) {
  tr__pg_world_t* wd = pg->world;
  pthread_mutex_lock(&wd->mu);
  for (tr_pg_t* g = wd->groups; g; g = g->w_next) tr_pg_set_timeout(g, ms);
  pthread_mutex_unlock(&wd->mu);
}

int tr_pg_set_op_timing(tr_pg_t* pg, int on) {
  if (!pg) return TR_EINVAL;
  __atomic_store_n(&pg->op_timing, on != 0, __ATOMIC_RELAXED);
  return 0;
}

void tr_pg_set_cuda_stream(tr_pg_t* pg, void* stream) {
  pg->cuda_stream = stream;
}

const char* tr_pg_error(const tr_pg_t* pg) {
  tr_pg_t* p = (tr_pg_t*)pg;
  pthread_mutex_lock(&p->mu);
  const char* e = p->error;
  pthread_mutex_unlock(&p->mu);
  return e;
}

void tr_pg_stats(const tr_pg_t* pg, tr_pg_stats_t* out) {
  tr_pg_t* p = (tr_pg_t*)pg;
  pthread_mutex_lock(&p->mu);
  *out = p->stats;
  pthread_mutex_unlock(&p->mu);
}

/* ---- backends ---- */

/* The backend serving device d, set up on first use. */
static int get_backend(tr_pg_t* pg, tr_device_type_t d, tr__pg_backend_t** out,
                       char* err, size_t errlen) {
  if ((unsigned)d >= TR__PG_NDEV || pg->kinds[d] == TR_PG_BACKEND_NONE) {
    snprintf(err, errlen, "group '%s' has no backend for %s tensors", pg->name,
             d == TR_DEV_CPU ? "cpu" : "cuda");
    return TR_EDEVICE;
  }
  pthread_mutex_lock(&pg->bmu);
  tr__pg_backend_t* be = pg->be[d];
  if (be) {
    pthread_mutex_unlock(&pg->bmu);
    *out = be;
    return 0;
  }
  int rc;
  be = calloc(1, sizeof *be);
  if (!be) {
    pthread_mutex_unlock(&pg->bmu);
    return TR_ENOMEM;
  }
  be->vt = vt_of(pg->kinds[d]);
  be->pg = pg;
  be->dev = d;
  /* Threaded backends set up on their own thread (so that set-ups of
   * different groups overlap); the others here. */
  if (be->vt->threaded)
    rc = tr__queue_start(be);
  else
    rc = be->vt->create(be, err, errlen);
  if (rc < 0) goto out_free;
  pthread_mutex_lock(&pg->mu);
  pg->be[d] = be;
  pthread_mutex_unlock(&pg->mu);
  pthread_mutex_unlock(&pg->bmu);
  TR_LOG_DEBUG(COLL, "group '%s' rank %d/%d: %s ready", pg->name, pg->rank,
               pg->size, be->vt->name);
  *out = be;
  return 0;
out_free:
  free(be);
  pthread_mutex_unlock(&pg->bmu);
  return rc;
}

int tr_pg_connect(tr_pg_t* pg, tr_device_type_t d) {
  char err[512] = "";
  tr__pg_backend_t* be;
  int rc = get_backend(pg, d, &be, err, sizeof err);
  if (rc == 0 && be->vt->threaded)
    rc = tr__queue_wait_ready(be, err, sizeof err);
  if (rc < 0)
    TR_LOG_ERROR(COLL, "group '%s' rank %d/%d: cannot set up: %s", pg->name,
                 pg->rank, pg->size, err[0] ? err : tr_strerror(rc));
  return rc;
}

/* ---- sub-groups ---- */

static int cmp_int(const void* a, const void* b) {
  int x = *(const int*)a, y = *(const int*)b;
  return (x > y) - (x < y);
}

static void child_name(tr_pg_t* parent, int64_t k, char* buf, size_t n) {
  if (strcmp(parent->name, "0") == 0)
    snprintf(buf, n, "%lld", (long long)k);
  else
    snprintf(buf, n, "%s.%lld", parent->name, (long long)k);
}

static int64_t next_child(tr_pg_t* parent) {
  pthread_mutex_lock(&parent->mu);
  int64_t k = ++parent->children;
  pthread_mutex_unlock(&parent->mu);
  return k;
}

/* Make the child group from parent ranks prank[0..n) (in group order);
 * me = this rank's index or -1. Splits NCCL eagerly when the parent has a
 * communicator. */
static int make_child(tr_pg_t* parent, const char* name, const char* prefix,
                      const char* desc, const int* prank, int n, int me,
                      int color, int key, tr_pg_t** out) {
  int rc = 0;
  tr_pg_t* child = NULL;
  *out = NULL;
  if (me >= 0) {
    int* g = malloc(sizeof(int) * (size_t)n);
    if (!g) return TR_ENOMEM;
    for (int i = 0; i < n; i++) g[i] = parent->granks[prank[i]];
    pthread_mutex_lock(&parent->mu);
    int64_t t = parent->timeout_ms;
    pthread_mutex_unlock(&parent->mu);
    rc = group_new(parent->world, name, desc, prefix, me, n, g, parent->kinds,
                   t, &child);
    free(g);
    if (rc < 0) return rc;
    child->cuda_stream = parent->cuda_stream;
  }
#ifdef HAVE_MPI
  if (parent->mpi_comm) {
    rc = tr__mpi_comm_split(parent, child, me >= 0 ? color : -1, key);
    if (rc < 0) {
      if (child) tr_pg_free(child);
      return rc;
    }
  }
#endif
#ifdef HAVE_NCCL
  tr__pg_backend_t* pbe = parent->be[TR_DEV_CUDA];
  if (pbe && parent->kinds[TR_DEV_CUDA] == TR_PG_BACKEND_NCCL) {
    char err[512] = "";
    rc = tr__nccl_split(pbe, child, me >= 0 ? color : -1, key, err, sizeof err);
    if (rc < 0) {
      TR_LOG_ERROR(COLL, "group '%s': ncclCommSplit for group '%s' failed: %s",
                   parent->name, name, err);
      if (child) tr_pg_free(child);
      return rc;
    }
  }
#else
  (void)color;
  (void)key;
#endif
  *out = child;
  return 0;
}

int tr_pg_new_group(tr_pg_t* parent, const int* ranks, int n, const char* desc,
                    tr_pg_t** out) {
  *out = NULL;
  if (!parent || !ranks || n < 1 || n > parent->size) return TR_EINVAL;
  int* r = malloc(sizeof(int) * (size_t)n);
  if (!r) return TR_ENOMEM;
  memcpy(r, ranks, sizeof(int) * (size_t)n);
  qsort(r, (size_t)n, sizeof(int), cmp_int);
  int me = -1;
  for (int i = 0; i < n; i++) {
    if (r[i] < 0 || r[i] >= parent->size || (i && r[i] == r[i - 1])) {
      TR_LOG_ERROR(COLL,
                   "new group of '%s': rank %d is out of range or "
                   "repeated",
                   parent->name, r[i]);
      free(r);
      return TR_EINVAL;
    }
    if (r[i] == parent->rank) me = i;
  }
  int64_t k = next_child(parent);
  char name[128], prefix[640];
  child_name(parent, k, name, sizeof name);
  snprintf(prefix, sizeof prefix, "%s/%s", parent->world->store_prefix, name);
  int rc = make_child(parent, name, prefix, desc, r, n, me, me >= 0 ? 0 : -1,
                      me, out);
  free(r);
  return rc;
}

typedef struct {
  int color, key, prank;
} split_ent_t;

static int cmp_split(const void* a, const void* b) {
  const split_ent_t* x = a;
  const split_ent_t* y = b;
  if (x->key != y->key) return (x->key > y->key) - (x->key < y->key);
  return (x->prank > y->prank) - (x->prank < y->prank);
}

int tr_pg_split(tr_pg_t* parent, int color, int key, const char* desc,
                tr_pg_t** out) {
  *out = NULL;
  if (!parent) return TR_EINVAL;
  tr__pg_world_t* wd = parent->world;
  if (!wd->store && !parent->mpi_comm) {
    TR_LOG_ERROR(COLL,
                 "split of group '%s' needs every rank's color through "
                 "the store (the %s backend has none): use tr_pg_new_group",
                 parent->name, tr_pg_backend_name(parent->kinds[TR_DEV_CPU]));
    return TR_EUNSUPPORTED;
  }
  if (color < 0) color = -1;
  int64_t k = next_child(parent);
  int n = parent->size, rc;
  char** keys = calloc((size_t)n, sizeof *keys);
  void** vals = calloc((size_t)n, sizeof *vals);
  size_t* lens = calloc((size_t)n, sizeof *lens);
  split_ent_t* ents = calloc((size_t)n, sizeof *ents);
  int* members = calloc((size_t)n, sizeof *members);
  if (!keys || !vals || !lens || !ents || !members) {
    rc = TR_ENOMEM;
    goto out;
  }
  for (int i = 0; i < n; i++) {
    char buf[64];
    snprintf(buf, sizeof buf, "split/%lld/%d", (long long)k, i);
    if (!(keys[i] = strdup(buf))) {
      rc = TR_ENOMEM;
      goto out;
    }
  }
  char mine[64];
  int mlen = snprintf(mine, sizeof mine, "%d %d", color, key);
  if (wd->store) {
    tr_store_client_t* sc = NULL;
    tr_store_prefix_t sp;
    rc = tr__pg_store_open(parent, &sc, &sp);
    char why[512] = "";
    if (rc == 0)
      rc = tr_store_prefix_set(&sp, keys[parent->rank], mine, (size_t)mlen);
    if (rc == 0)
      rc = tr__pg_store_wait(parent, NULL, sc, &sp, (const char* const*)keys,
                             (size_t)n, tr_pg_timeout(parent), why, sizeof why);
    if (rc == TR_EABORTED)
      TR_LOG_ERROR(COLL, "split of group '%s': gave up: %s", parent->name, why);
    if (rc == 0)
      rc = tr_store_prefix_multi_get(&sp, (const char* const*)keys, (size_t)n,
                                     vals, lens);
    tr__pg_store_close(sc, &sp);
  } else {
#ifdef HAVE_MPI
    int pair[2] = {color, key};
    int* all = malloc(sizeof(int) * 2 * (size_t)n);
    rc = all ? tr__mpi_exchange(parent, pair, all) : TR_ENOMEM;
    for (int i = 0; rc == 0 && i < n; i++) {
      char buf[64];
      snprintf(buf, sizeof buf, "%d %d", all[2 * i], all[2 * i + 1]);
      if (!(vals[i] = strdup(buf))) rc = TR_ENOMEM;
    }
    free(all);
#else
    rc = TR_EUNSUPPORTED;
#endif
  }
  if (rc < 0) {
    TR_LOG_ERROR(COLL,
                 "split of group '%s': cannot exchange colors through "
                 "the store: %s",
                 parent->name, tr_strerror(rc));
    goto out;
  }
  int m = 0, me = -1;
  for (int i = 0; i < n; i++) {
    int c, kk;
    if (sscanf(vals[i], "%d %d", &c, &kk) != 2) {
      TR_LOG_ERROR(COLL, "split of group '%s': bad color entry from rank %d",
                   parent->name, i);
      rc = TR_EPROTO;
      goto out;
    }
    if (c == color && color >= 0) ents[m++] = (split_ent_t){c, kk, i};
  }
  if (color >= 0) {
    qsort(ents, (size_t)m, sizeof *ents, cmp_split);
    for (int i = 0; i < m; i++) {
      members[i] = ents[i].prank;
      if (ents[i].prank == parent->rank) me = i;
    }
  }
  char name[128], prefix[700];
  child_name(parent, k, name, sizeof name);
  snprintf(prefix, sizeof prefix, "%s/%s/c%d", wd->store_prefix, name,
           color < 0 ? 0 : color);
  rc = make_child(parent, name, prefix, desc, members, m, me, color, key, out);
out:
  if (keys)
    for (int i = 0; i < n; i++) free(keys[i]);
  if (vals)
    for (int i = 0; i < n; i++) free(vals[i]);
  free(keys);
  free(vals);
  free(lens);
  free(ents);
  free(members);
  return rc;
}

/* ---- freeing ---- */

static int has_live_work(tr_pg_t* pg) {
  for (tr_pg_work_t* w = pg->inflight; w; w = w->if_next)
    if (!tr__work_is_done(w)) return 1;
  return 0;
}

void tr_pg_free(tr_pg_t* pg) {
  if (!pg) return;
  tr__pg_world_t* wd = pg->world;
  if (pg->coal) {
    tr__work_unref(pg->coal);
    pg->coal = NULL;
  }
  /* Drain the queues; ops still in flight end by their deadlines. */
  for (int d = 0; d < TR__PG_NDEV; d++)
    if (pg->be[d] && pg->be[d]->vt->threaded) tr__queue_stop(pg->be[d]);
  pthread_mutex_lock(&pg->mu);
  while (has_live_work(pg)) {
    struct timespec ts = tr__deadline_ms(10);
    pthread_cond_timedwait(&pg->cv, &pg->mu, &ts);
  }
  pthread_mutex_unlock(&pg->mu);

  /* Off the world's list, out of the watchdog's hands. */
  pthread_mutex_lock(&wd->mu);
  for (tr_pg_t** p = &wd->groups; *p; p = &(*p)->w_next)
    if (*p == pg) {
      *p = pg->w_next;
      break;
    }
  while (pg->wd_busy) pthread_cond_wait(&wd->cv, &wd->mu);
  pthread_mutex_unlock(&wd->mu);

  for (int d = 0; d < TR__PG_NDEV; d++)
    if (pg->be[d]) {
      pg->be[d]->vt->destroy(pg->be[d]);
      free(pg->be[d]);
      pg->be[d] = NULL;
    }
#ifdef HAVE_MPI
  if (pg->mpi_comm) tr__mpi_comm_release(pg);
#endif
  group_release(pg);
  world_unref(wd);
}

/* ---- ops ---- */

static int valid_rop(tr_pg_reduce_op_t op) {
  return (unsigned)op < TR_PG_REDUCE_OP__COUNT;
}

static int check_tensor(const tr_pg_t* pg, const tr_tensor_t* t,
                        const char* what) {
  if (!t || !t->storage || (unsigned)t->dtype >= TR_DTYPE__COUNT) {
    TR_LOG_ERROR(COLL, "group '%s': %s tensor holds nothing", pg->name, what);
    return TR_EINVAL;
  }
  if (t->device.type == TR_DEV_CUDA && !tr_tensor_is_contiguous(t)) {
    TR_LOG_ERROR(COLL, "group '%s': %s CUDA tensor must be contiguous",
                 pg->name, what);
    return TR_EINVAL;
  }
  return 0;
}

static void fill_meta(tr_pg_tensor_meta_t* m, const tr_tensor_t* t) {
  m->ndim = t->ndim;
  for (int i = 0; i < t->ndim; i++) m->shape[i] = t->shape[i];
  m->dtype = t->dtype;
}

/* Input: a contiguous reference (a copy when t is strided). */
static int stage_in(tr__pg_op_t* op, const tr_tensor_t* t) {
  return tr_tensor_contiguous(&op->in, t);
}

/* Output: t itself when contiguous, else a contiguous buffer copied back on
 * success (with t's contents first when the op reads it: in-place ops). */
static int stage_out(tr__pg_op_t* op, tr_tensor_t* t, int in_place) {
  if (tr_tensor_is_contiguous(t)) {
    tr_tensor_view(&op->out, t);
    return 0;
  }
  if (in_place) {
    TR_CHECK(tr_tensor_contiguous(&op->out, t));
  } else {
    TR_CHECK(tr_tensor_empty(&op->out, t->dtype, t->device, t->ndim, t->shape));
  }
  tr_tensor_view(&op->user, t);
  return 0;
}

/* "<backend>:<op>" for every backend and op, so that issuing a collective
 * copies its name instead of formatting it (p2p names carry ranks). */
static const char* const k_prof_names[][TR_PG_OP__COUNT] = {
#define TR__PG_PROF(name, str) TR__PG_PROF_B ":" str,
#define TR__PG_PROF_B "none"
    {TR_PG_OP_MAP(TR__PG_PROF)},
#undef TR__PG_PROF_B
#define TR__PG_PROF_B "gloo"
    {TR_PG_OP_MAP(TR__PG_PROF)},
#undef TR__PG_PROF_B
#define TR__PG_PROF_B "nccl"
    {TR_PG_OP_MAP(TR__PG_PROF)},
#undef TR__PG_PROF_B
#define TR__PG_PROF_B "mpi"
    {TR_PG_OP_MAP(TR__PG_PROF)},
#undef TR__PG_PROF_B
#define TR__PG_PROF_B "fake"
    {TR_PG_OP_MAP(TR__PG_PROF)},
#undef TR__PG_PROF_B
#undef TR__PG_PROF
};

static void profiling_name(const tr_pg_t* pg, tr_pg_op_t type, int peer,
                           tr_pg_backend_t b, char* buf, size_t n) {
  if (type == TR_PG_OP_SEND)
    snprintf(buf, n, "%s:send %d->%d", tr_pg_backend_name(b), pg->rank, peer);
  else if (type == TR_PG_OP_RECV)
    snprintf(buf, n, "%s:recv %d<-%d", tr_pg_backend_name(b), pg->rank, peer);
  else if ((unsigned)b < sizeof k_prof_names / sizeof k_prof_names[0] &&
           (unsigned)type < TR_PG_OP__COUNT) {
    const char* s = k_prof_names[b][type]; /* a copy, not a printf */
    size_t len = strlen(s);
    if (len >= n) len = n - 1;
    memcpy(buf, s, len);
    buf[len] = '\0';
  } else
    snprintf(buf, n, "%s:%s", tr_pg_backend_name(b), tr_pg_op_name(type));
}

static int op_is_p2p(const tr__pg_op_t* op) {
  return op->type == TR_PG_OP_SEND || op->type == TR_PG_OP_RECV;
}

static size_t op_bytes(const tr__pg_op_t* op) {
  const tr_tensor_t* t = op->in.storage ? &op->in : &op->out;
  return t->storage ? tr_tensor_nbytes(t) : 0;
}

static tr_device_type_t op_device(const tr__pg_op_t* op) {
  const tr_tensor_t* t = op->out.storage ? &op->out : &op->in;
  return t->storage ? t->device.type : TR_DEV_CPU;
}

static void enqueue_hooks(tr_pg_t* pg, tr_pg_work_t* w, tr_pg_backend_t b) {
  const tr_pg_hooks_t* h = tr__pg_hooks();
  if (!h->enqueue) return;
  tr_pg_record_t rec;
  int64_t now = tr__wall_ns();
  for (int i = 0; i <= w->n_ops; i++) {
    if (i == w->n_ops && !w->coalesced) break;
    memset(&rec, 0, sizeof rec);
    rec.pg_id = pg->uid;
    rec.pg_name = pg->name;
    rec.pg_desc = pg->desc;
    rec.collective_seq_id = w->seq;
    rec.p2p_seq_id = w->p2p_seq;
    rec.timeout_ms = w->timeout_ms;
    rec.time_created_ns = now;
    char pn[64];
    if (i < w->n_ops) {
      tr__pg_op_t* op = &w->ops[i];
      rec.op = op->type;
      rec.op_id = op->op_id;
      rec.is_p2p = op_is_p2p(op);
      /* a single op's name is the work's, formatted at issue */
      if (w->coalesced) {
        profiling_name(pg, op->type, op->peer, b, pn, sizeof pn);
        rec.profiling_name = pn;
      } else {
        rec.profiling_name = w->profiling_name;
      }
      const tr_tensor_t* in = op->in.storage ? &op->in : &op->out;
      const tr_tensor_t* out = op->user.storage ? &op->user : &op->out;
      if (op->type != TR_PG_OP_BARRIER) {
        if (op->type != TR_PG_OP_RECV && in->storage) {
          rec.n_inputs = 1;
          fill_meta(&rec.inputs[0], in);
        }
        if (op->type != TR_PG_OP_SEND && out->storage) {
          rec.n_outputs = 1;
          fill_meta(&rec.outputs[0], out);
        }
      }
      op->fr_id = h->enqueue(h->arg, &rec);
    } else {
      rec.op = TR_PG_OP_COALESCED;
      rec.op_id = w->op_id;
      rec.is_p2p = w->is_p2p;
      rec.profiling_name = w->profiling_name;
      w->fr_id = h->enqueue(h->arg, &rec);
    }
  }
}

/* Hand w (ops filled, the caller's reference) to its backend. With out ==
 * NULL, waits (CPU) or orders the group's stream after it (CUDA). */
static int submit(tr_pg_t* pg, tr_pg_work_t* w, tr_pg_work_t** out) {
  if (out) *out = NULL;
  tr_device_type_t dev = op_device(&w->ops[0]);
  pthread_mutex_lock(&pg->mu);
  if (pg->coalescing) {
    if (out) {
      pthread_mutex_unlock(&pg->mu);
      TR_LOG_ERROR(COLL,
                   "group '%s': ops inside a coalesced group take no "
                   "work handle (tr_pg_coalesce_end gives one)",
                   pg->name);
      tr__work_unref(w);
      return TR_EINVAL;
    }
    tr_pg_work_t* c = pg->coal;
    if (c->n_ops > 0 && op_device(&c->ops[0]) != dev) {
      pthread_mutex_unlock(&pg->mu);
      TR_LOG_ERROR(COLL,
                   "group '%s': a coalesced group mixes cpu and cuda "
                   "tensors",
                   pg->name);
      tr__work_unref(w);
      return TR_EDEVICE;
    }
    if (c->n_ops == pg->coal_cap) {
      int cap = pg->coal_cap ? pg->coal_cap * 2 : 8;
      /* the first op sits in c->op0, inside the work */
      int inside = c->ops == &c->op0;
      tr__pg_op_t* ops =
          realloc(inside ? NULL : c->ops, sizeof *ops * (size_t)cap);
      if (!ops) {
        pthread_mutex_unlock(&pg->mu);
        tr__work_unref(w);
        return TR_ENOMEM;
      }
      if (inside) ops[0] = c->op0;
      c->ops = ops;
      pg->coal_cap = cap;
    }
    c->ops[c->n_ops++] = w->ops[0];
    memset(&w->ops[0], 0, sizeof w->ops[0]); /* moved */
    pthread_mutex_unlock(&pg->mu);
    tr__work_unref(w);
    return 0;
  }
  if (pg->broken) {
    char* e = strdup(pg->error ? pg->error : "");
    pthread_mutex_unlock(&pg->mu);
    TR_LOG_DEBUG(COLL, "group '%s' is broken: %s", pg->name, e ? e : "");
    free(e);
    tr__work_unref(w);
    return TR_EABORTED;
  }
  int p2p = 1;
  for (int i = 0; i < w->n_ops; i++) p2p &= op_is_p2p(&w->ops[i]);
  w->is_p2p = p2p;
  if (p2p)
    pg->seq_p2p++;
  else
    pg->seq_coll++;
  w->seq = pg->seq_coll;
  w->p2p_seq = pg->seq_p2p;
  for (int i = 0; i < w->n_ops; i++) {
    w->ops[i].op_id = ++pg->op_id;
    pg->stats.calls[w->ops[i].type]++;
    pg->stats.bytes[w->ops[i].type] += (int64_t)op_bytes(&w->ops[i]);
  }
  if (w->coalesced) {
    w->op_id = ++pg->op_id;
    pg->stats.calls[TR_PG_OP_COALESCED]++;
  }
  w->timeout_ms = pg->timeout_ms;
  /* set up already (the steady state): no trip through get_backend */
  tr__pg_backend_t* be = (unsigned)dev < TR__PG_NDEV ? pg->be[dev] : NULL;
  pthread_mutex_unlock(&pg->mu);

  w->dev = dev;
  w->block_stream = out == NULL;
  w->timed = __atomic_load_n(&pg->op_timing, __ATOMIC_RELAXED);
  w->t_issue_ns = tr__now_ns();
  w->deadline_ns = w->t_issue_ns + w->timeout_ms * 1000000;
  tr_pg_backend_t kind =
      (unsigned)dev < TR__PG_NDEV ? pg->kinds[dev] : TR_PG_BACKEND_NONE;
  profiling_name(pg, w->coalesced ? TR_PG_OP_COALESCED : w->ops[0].type,
                 w->ops[0].peer, kind, w->profiling_name,
                 sizeof w->profiling_name);

  char err[1024];
  err[0] = '\0';
  int rc = be ? 0 : get_backend(pg, dev, &be, err, sizeof err);
  enqueue_hooks(pg, w, kind);
  w->be = be;
  /* In flight from here: the engine holds a reference until it retires w. */
  tr__work_ref(w);
  pthread_mutex_lock(&pg->mu);
  w->in_flight = 1;
  w->if_next = pg->inflight;
  if (pg->inflight) pg->inflight->if_prev = w;
  pg->inflight = w;
  pthread_mutex_unlock(&pg->mu);

  if (rc < 0) {
    tr__work_finish(w, rc, "failed: %s", err[0] ? err : tr_strerror(rc));
    tr__work_retire(w);
  } else if (be->vt->threaded) {
    tr__queue_push(be, w);
  } else {
    if (w->timed)
      __atomic_store_n(&w->t_start_ns, tr__now_ns(), __ATOMIC_RELAXED);
    rc = be->vt->start(be, w, err, sizeof err);
    if (rc == 0) {
      tr__work_started(w);
      tr__work_finish(w, 0, NULL);
      tr__work_retire(w);
    } else if (rc < 0) {
      tr__work_finish(w, rc, "failed: %s", err[0] ? err : tr_strerror(rc));
      tr__work_retire(w);
    }
  }

  if (out) {
    *out = w;
    return 0;
  }
  if (rc == 1 && w->block_stream) /* start made the stream wait for w */
    rc = 0;
  else if (be && be->vt->wait_stream && !tr__work_is_done(w))
    rc = be->vt->wait_stream(be, w, pg->cuda_stream);
  else
    rc = tr_pg_work_wait(w, 0);
  tr__work_unref(w);
  return rc;
}

static tr_pg_work_t* one_op(tr_pg_t* pg, tr_pg_op_t type) {
  tr_pg_work_t* w = tr__work_new(pg, 1);
  if (w) w->ops[0].type = type;
  return w;
}

/* Every tensor of an op on one device. */
static int same_device(const tr_pg_t* pg, const tr_tensor_t* a,
                       const tr_tensor_t* b) {
  if (!tr_device_eq(a->device, b->device)) {
    TR_LOG_ERROR(COLL,
                 "group '%s': input and output are on different "
                 "devices",
                 pg->name);
    return TR_EDEVICE;
  }
  if (a->dtype != b->dtype) {
    TR_LOG_ERROR(COLL, "group '%s': input is %s but output is %s", pg->name,
                 tr_dtype_name(a->dtype), tr_dtype_name(b->dtype));
    return TR_EDTYPE;
  }
  return 0;
}

#define TR__BUILD(call)  \
  do {                   \
    int rc_ = (call);    \
    if (rc_ < 0) {       \
      tr__work_unref(w); \
      return rc_;        \
    }                    \
  } while (0)

int tr_pg_all_reduce(tr_pg_t* pg, tr_tensor_t* t, tr_pg_reduce_op_t op,
                     tr_pg_work_t** work) {
  TR_CHECK(check_tensor(pg, t, "all_reduce"));
  if (!valid_rop(op)) return TR_EINVAL;
  tr_pg_work_t* w = one_op(pg, TR_PG_OP_ALL_REDUCE);
  if (!w) return TR_ENOMEM;
  w->ops[0].rop = op;
  TR__BUILD(stage_out(&w->ops[0], t, 1));
  return submit(pg, w, work);
}

int tr_pg_all_gather(tr_pg_t* pg, tr_tensor_t* out, const tr_tensor_t* in,
                     tr_pg_work_t** work) {
  TR_CHECK(check_tensor(pg, out, "all_gather output"));
  TR_CHECK(check_tensor(pg, in, "all_gather input"));
  TR_CHECK(same_device(pg, in, out));
  if (tr_tensor_numel(out) != tr_tensor_numel(in) * pg->size) {
    TR_LOG_ERROR(COLL,
                 "group '%s': all_gather output has %lld elements, "
                 "expected %d x %lld",
                 pg->name, (long long)tr_tensor_numel(out), pg->size,
                 (long long)tr_tensor_numel(in));
    return TR_ESHAPE;
  }
  tr_pg_work_t* w = one_op(pg, TR_PG_OP_ALL_GATHER);
  if (!w) return TR_ENOMEM;
  TR__BUILD(stage_in(&w->ops[0], in));
  TR__BUILD(stage_out(&w->ops[0], out, 0));
  return submit(pg, w, work);
}

int tr_pg_reduce_scatter(tr_pg_t* pg, tr_tensor_t* out, const tr_tensor_t* in,
                         tr_pg_reduce_op_t op, tr_pg_work_t** work) {
  TR_CHECK(check_tensor(pg, out, "reduce_scatter output"));
  TR_CHECK(check_tensor(pg, in, "reduce_scatter input"));
  TR_CHECK(same_device(pg, in, out));
  if (!valid_rop(op)) return TR_EINVAL;
  if (tr_tensor_numel(in) != tr_tensor_numel(out) * pg->size) {
    TR_LOG_ERROR(COLL,
                 "group '%s': reduce_scatter input has %lld elements, "
                 "expected %d x %lld",
                 pg->name, (long long)tr_tensor_numel(in), pg->size,
                 (long long)tr_tensor_numel(out));
    return TR_ESHAPE;
  }
  tr_pg_work_t* w = one_op(pg, TR_PG_OP_REDUCE_SCATTER);
  if (!w) return TR_ENOMEM;
  w->ops[0].rop = op;
  TR__BUILD(stage_in(&w->ops[0], in));
  TR__BUILD(stage_out(&w->ops[0], out, 0));
  return submit(pg, w, work);
}

int tr_pg_broadcast(tr_pg_t* pg, tr_tensor_t* t, int root,
                    tr_pg_work_t** work) {
  TR_CHECK(check_tensor(pg, t, "broadcast"));
  if (root < 0 || root >= pg->size) return TR_EINVAL;
  tr_pg_work_t* w = one_op(pg, TR_PG_OP_BROADCAST);
  if (!w) return TR_ENOMEM;
  w->ops[0].peer = root;
  TR__BUILD(stage_out(&w->ops[0], t, pg->rank == root));
  return submit(pg, w, work);
}

int tr_pg_reduce(tr_pg_t* pg, tr_tensor_t* t, int root, tr_pg_reduce_op_t op,
                 tr_pg_work_t** work) {
  TR_CHECK(check_tensor(pg, t, "reduce"));
  if (root < 0 || root >= pg->size || !valid_rop(op)) return TR_EINVAL;
  tr_pg_work_t* w = one_op(pg, TR_PG_OP_REDUCE);
  if (!w) return TR_ENOMEM;
  w->ops[0].peer = root;
  w->ops[0].rop = op;
  TR__BUILD(stage_out(&w->ops[0], t, 1));
  return submit(pg, w, work);
}

/* Rows per rank -> elements per rank; checks they cover dim 0. */
static int split_counts(const tr_pg_t* pg, const tr_tensor_t* t,
                        const int64_t* splits, const char* what,
                        int64_t** out) {
  *out = NULL;
  if (!splits) return 0;
  if (t->ndim < 1) {
    TR_LOG_ERROR(COLL,
                 "group '%s': all_to_all %s splits need a tensor with "
                 "a dim 0",
                 pg->name, what);
    return TR_ESHAPE;
  }
  int64_t row = t->shape[0] ? tr_tensor_numel(t) / t->shape[0] : 0;
  int64_t sum = 0;
  int64_t* c = malloc(sizeof(int64_t) * (size_t)pg->size);
  if (!c) return TR_ENOMEM;
  for (int i = 0; i < pg->size; i++) {
    if (splits[i] < 0) {
      free(c);
      return TR_EINVAL;
    }
    sum += splits[i];
    c[i] = splits[i] * row;
  }
  if (sum != t->shape[0]) {
    TR_LOG_ERROR(COLL,
                 "group '%s': all_to_all %s splits sum to %lld rows "
                 "but dim 0 is %lld",
                 pg->name, what, (long long)sum, (long long)t->shape[0]);
    free(c);
    return TR_ESHAPE;
  }
  *out = c;
  return 0;
}

int tr_pg_all_to_all(tr_pg_t* pg, tr_tensor_t* out, const tr_tensor_t* in,
                     const int64_t* out_splits, const int64_t* in_splits,
                     tr_pg_work_t** work) {
  TR_CHECK(check_tensor(pg, out, "all_to_all output"));
  TR_CHECK(check_tensor(pg, in, "all_to_all input"));
  TR_CHECK(same_device(pg, in, out));
  if (!in_splits && tr_tensor_numel(in) % pg->size) {
    TR_LOG_ERROR(COLL,
                 "group '%s': all_to_all input of %lld elements does "
                 "not split evenly over %d ranks",
                 pg->name, (long long)tr_tensor_numel(in), pg->size);
    return TR_ESHAPE;
  }
  if (!out_splits && tr_tensor_numel(out) % pg->size) {
    TR_LOG_ERROR(COLL,
                 "group '%s': all_to_all output of %lld elements does "
                 "not split evenly over %d ranks",
                 pg->name, (long long)tr_tensor_numel(out), pg->size);
    return TR_ESHAPE;
  }
  if (!in_splits && !out_splits &&
      tr_tensor_numel(in) != tr_tensor_numel(out)) {
    TR_LOG_ERROR(COLL, "group '%s': all_to_all input and output sizes differ",
                 pg->name);
    return TR_ESHAPE;
  }
  tr_pg_work_t* w = one_op(pg, TR_PG_OP_ALL_TO_ALL);
  if (!w) return TR_ENOMEM;
  tr__pg_op_t* op = &w->ops[0];
  TR__BUILD(split_counts(pg, in, in_splits, "input", &op->in_counts));
  TR__BUILD(split_counts(pg, out, out_splits, "output", &op->out_counts));
  /* Equal pieces on one side, splits on the other: spell both out. */
  if (!!op->in_counts != !!op->out_counts) {
    int64_t** eq = op->in_counts ? &op->out_counts : &op->in_counts;
    const tr_tensor_t* t = op->in_counts ? out : in;
    *eq = malloc(sizeof(int64_t) * (size_t)pg->size);
    if (!*eq) {
      tr__work_unref(w);
      return TR_ENOMEM;
    }
    for (int i = 0; i < pg->size; i++) (*eq)[i] = tr_tensor_numel(t) / pg->size;
  }
  TR__BUILD(stage_in(op, in));
  TR__BUILD(stage_out(op, out, 0));
  return submit(pg, w, work);
}

static int p2p(tr_pg_t* pg, tr_pg_op_t type, tr_tensor_t* t, int peer, int tag,
               tr_pg_work_t** work) {
  TR_CHECK(check_tensor(pg, t, type == TR_PG_OP_SEND ? "send" : "recv"));
  if (peer < 0 || peer >= pg->size || peer == pg->rank || tag < 0) {
    TR_LOG_ERROR(COLL,
                 "group '%s' rank %d: bad %s peer %d (size %d) or tag "
                 "%d",
                 pg->name, pg->rank, tr_pg_op_name(type), peer, pg->size, tag);
    return TR_EINVAL;
  }
  tr_pg_work_t* w = one_op(pg, type);
  if (!w) return TR_ENOMEM;
  w->ops[0].peer = peer;
  w->ops[0].tag = tag;
  if (type == TR_PG_OP_SEND)
    TR__BUILD(stage_in(&w->ops[0], t));
  else
    TR__BUILD(stage_out(&w->ops[0], t, 0));
  return submit(pg, w, work);
}

int tr_pg_send(tr_pg_t* pg, const tr_tensor_t* t, int peer, int tag,
               tr_pg_work_t** work) {
  return p2p(pg, TR_PG_OP_SEND, (tr_tensor_t*)t, peer, tag, work);
}

int tr_pg_recv(tr_pg_t* pg, tr_tensor_t* t, int peer, int tag,
               tr_pg_work_t** work) {
  return p2p(pg, TR_PG_OP_RECV, t, peer, tag, work);
}

int tr_pg_barrier(tr_pg_t* pg, tr_pg_work_t** work) {
  /* The CPU backend when the group has one (unless only the CUDA one is
   * set up already), else a one-element all-reduce on the CUDA backend. */
  int cuda = pg->kinds[TR_DEV_CPU] == TR_PG_BACKEND_NONE ||
             (pg->be[TR_DEV_CUDA] && !pg->be[TR_DEV_CPU]);
  if (cuda && pg->kinds[TR_DEV_CUDA] == TR_PG_BACKEND_NCCL) {
    pthread_mutex_lock(&pg->mu);
    int coalescing = pg->coalescing;
    pthread_mutex_unlock(&pg->mu);
    if (coalescing) return TR_EINVAL;
    tr_tensor_t one;
    int dev = pg->world->cuda_device;
    if (dev < 0) {
      int n = tr_cuda_device_count();
      dev = n > 0 ? pg->world->rank % n : 0;
    }
    int64_t shape[1] = {1};
    TR_CHECK(tr_tensor_zeros(&one, TR_F32, (tr_device_t){TR_DEV_CUDA, dev}, 1,
                             shape));
    tr_pg_work_t* w = NULL;
    int rc = tr_pg_all_reduce(pg, &one, TR_PG_SUM, &w);
    tr_tensor_release(&one);
    if (rc < 0) return rc;
    if (work) {
      *work = w;
      return 0;
    }
    rc = tr_pg_work_wait(w, 0);
    tr_pg_work_free(w);
    return rc;
  }
  tr_pg_work_t* w = one_op(pg, TR_PG_OP_BARRIER);
  if (!w) return TR_ENOMEM;
  /* A barrier has no tensors: give it a zero-size one to carry the device. */
  int64_t shape[1] = {0};
  TR__BUILD(tr_tensor_empty(&w->ops[0].out, TR_U8, TR_DEVICE_CPU, 1, shape));
  return submit(pg, w, work);
}

int tr_pg_coalesce_begin(tr_pg_t* pg) {
  pthread_mutex_lock(&pg->mu);
  if (pg->coalescing) {
    pthread_mutex_unlock(&pg->mu);
    TR_LOG_ERROR(COLL, "group '%s': coalesced groups do not nest", pg->name);
    return TR_EINVAL;
  }
  tr_pg_work_t* c = tr__work_new(pg, 0);
  if (!c) {
    pthread_mutex_unlock(&pg->mu);
    return TR_ENOMEM;
  }
  c->coalesced = 1;
  pg->coal = c;
  pg->coal_cap = 1;
  pg->coalescing = 1;
  pthread_mutex_unlock(&pg->mu);
  return 0;
}

int tr_pg_coalesce_end(tr_pg_t* pg, tr_pg_work_t** work) {
  if (work) *work = NULL;
  pthread_mutex_lock(&pg->mu);
  if (!pg->coalescing) {
    pthread_mutex_unlock(&pg->mu);
    return TR_EINVAL;
  }
  tr_pg_work_t* c = pg->coal;
  pg->coal = NULL;
  pg->coal_cap = 0;
  pg->coalescing = 0;
  pthread_mutex_unlock(&pg->mu);
  if (c->n_ops == 0) {
    /* Nothing was issued: a work that is already complete (in no time). */
    c->done = 1;
    c->status = 0;
    c->timed = __atomic_load_n(&pg->op_timing, __ATOMIC_RELAXED);
    if (work)
      *work = c;
    else
      tr__work_unref(c);
    return 0;
  }
  return submit(pg, c, work);
}
