/* flight_recorder/load.c: the analyzer's loading -- walk a folder of
 * per-rank flight-recorder dumps (ours or PyTorch's, pickle or JSON,
 * versions 2.2-2.10), read each file's value tree (unpickle.c) into one
 * compact record per entry, and collect the process groups; the analyzer's
 * lifecycle (tr_fra_load_dir, tr_fra_free).
 *
 * Loading keeps one compact record per entry (strings interned: op names,
 * shapes, dtype sets, stacks), so 1024 ranks x 2000 entries fit in a few
 * hundred MB and each file's value tree is freed right after it is read.
 */
#include "config.h"

#include <dirent.h> /* opendir: walking the dump folder */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/buf.h"
#include "core/internal.h" /* tr__read_file */
#include "flight_recorder/internal.h"
#include "trainrun/error.h"
#include "trainrun/fr_analyze.h"

const char* const tr__fra_state_names[3] = {"scheduled", "started",
                                            "completed"};

int tr__fra_cmp_int(const void* x, const void* y) {
  int p = *(const int*)x, q = *(const int*)y;
  return p < q ? -1 : p > q;
}

/* ------------------------------------------------------------- interning */

static uint64_t fnv(const char* s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
  return h;
}

/* The id of s[0, n); -1 and a->oom set when out of memory. */
static int32_t intern(tr_fra_t* a, const char* s, size_t n) {
  tr__fra_intern_t* t = &a->in;
  if (a->oom) return -1;
  if (t->n * 2 >= t->nslots) {
    size_t ns = t->nslots ? t->nslots * 2 : 1024;
    int32_t* sl = malloc(ns * sizeof *sl);
    if (!sl) goto out_oom;
    for (size_t i = 0; i < ns; i++) sl[i] = -1;
    for (size_t i = 0; i < t->n; i++) {
      size_t h = fnv(t->str[i], t->len[i]) & (ns - 1);
      while (sl[h] >= 0) h = (h + 1) & (ns - 1);
      sl[h] = (int32_t)i;
    }
    free(t->slots);
    t->slots = sl;
    t->nslots = ns;
  }
  size_t h = fnv(s, n) & (t->nslots - 1);
  while (t->slots[h] >= 0) {
    int32_t id = t->slots[h];
    if (t->len[id] == n && memcmp(t->str[id], s, n) == 0) return id;
    h = (h + 1) & (t->nslots - 1);
  }
  size_t lcap = t->cap;
  if (TR_GROW(t->str, t->n + 1, t->cap) < 0 ||
      TR_GROW(t->len, t->n + 1, lcap) < 0)
    goto out_oom;
  char* c = malloc(n + 1);
  if (!c) goto out_oom;
  memcpy(c, s, n);
  c[n] = '\0';
  t->str[t->n] = c;
  t->len[t->n] = (uint32_t)n;
  t->slots[h] = (int32_t)t->n;
  return (int32_t)t->n++;
out_oom:
  a->oom = 1;
  return -1;
}

static void intern_release(tr__fra_intern_t* t) {
  for (size_t i = 0; i < t->n; i++) free(t->str[i]);
  free(t->str);
  free(t->len);
  free(t->slots);
}

/* ---------------------------------------------------------------- loading */

enum {
  F_UNKNOWN = 0,
  F_RECORD_ID,
  F_PG_ID,
  F_PROCESS_GROUP,
  F_COLL_SEQ,
  F_SEQ_ID,
  F_P2P_SEQ,
  F_OP_ID,
  F_PNAME,
  F_TCREATED,
  F_DURATION,
  F_IN_SIZES,
  F_IN_DT,
  F_OUT_SIZES,
  F_OUT_DT,
  F_STATE,
  F_TSTART,
  F_TDONE,
  F_RETIRED,
  F_TIMEOUT,
  F_IS_P2P,
  F_FRAMES
};

static const struct {
  const char* k;
  int id;
} fields[] = {
    {"record_id", F_RECORD_ID},
    {"pg_id", F_PG_ID},
    {"process_group", F_PROCESS_GROUP},
    {"collective_seq_id", F_COLL_SEQ},
    {"seq_id", F_SEQ_ID},
    {"p2p_seq_id", F_P2P_SEQ},
    {"op_id", F_OP_ID},
    {"profiling_name", F_PNAME},
    {"time_created_ns", F_TCREATED},
    {"duration_ms", F_DURATION},
    {"input_sizes", F_IN_SIZES},
    {"input_dtypes", F_IN_DT},
    {"output_sizes", F_OUT_SIZES},
    {"output_dtypes", F_OUT_DT},
    {"state", F_STATE},
    {"time_discovered_started_ns", F_TSTART},
    {"time_discovered_completed_ns", F_TDONE},
    {"retired", F_RETIRED},
    {"timeout_ms", F_TIMEOUT},
    {"is_p2p", F_IS_P2P},
    {"frames", F_FRAMES},
};

static int field_id(const tr__frv_t* k) {
  if (k->kind != TR__FRV_STR) return F_UNKNOWN;
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
    if (strlen(fields[i].k) == k->n && memcmp(fields[i].k, k->u.s, k->n) == 0)
      return fields[i].id;
  return F_UNKNOWN;
}

/* Keys are memoized strings in a pickle: the same node for every entry. */
typedef struct {
  const tr__frv_t* k[64];
  int id[64];
} keycache_t;

static int field_id_cached(keycache_t* c, const tr__frv_t* k) {
  size_t h = ((uintptr_t)k >> 4) & 63;
  if (c->k[h] == k) return c->id[h];
  int id = field_id(k);
  c->k[h] = k;
  c->id[h] = id;
  return id;
}

static int64_t v_int(const tr__frv_t* v, int64_t dflt) {
  if (!v) return dflt;
  if (v->kind == TR__FRV_INT || v->kind == TR__FRV_BOOL) return v->u.i;
  if (v->kind == TR__FRV_FLOAT && isfinite(v->u.f)) return (int64_t)v->u.f;
  if (v->kind == TR__FRV_STR && v->n > 0 && v->n < 24) {
    char* end;
    long long x = strtoll(v->u.s, &end, 10);
    if (*end == '\0') return x;
  }
  return dflt;
}

static int32_t v_str(tr_fra_t* a, const tr__frv_t* v) {
  if (!v || v->kind != TR__FRV_STR) return -1;
  return intern(a, v->u.s, v->n);
}

/* Python's repr of a list of shapes: "[[4, 8], []]"; numel of the first. */
static int32_t sizes_text(tr_fra_t* a, const tr__frv_t* v, tr__buf_t* b,
                          int64_t* numel0, uint8_t* nonempty0) {
  tr__buf_reset(b);
  *numel0 = -1;
  *nonempty0 = 0;
  if (!v || v->kind != TR__FRV_LIST) return -1;
  tr__buf_addstr(b, "[");
  for (uint32_t i = 0; i < v->n; i++) {
    const tr__frv_t* s = v->u.items[i];
    if (i) tr__buf_addstr(b, ", ");
    tr__buf_addstr(b, "[");
    int64_t numel = 1;
    if (s->kind == TR__FRV_LIST)
      for (uint32_t j = 0; j < s->n; j++) {
        if (j) tr__buf_addstr(b, ", ");
        int64_t d = v_int(s->u.items[j], 0);
        tr__fra_add_int(b, d);
        numel *= d;
      }
    if (i == 0) {
      *numel0 = numel;
      *nonempty0 = s->kind == TR__FRV_LIST && s->n > 0;
    }
    tr__buf_addstr(b, "]");
  }
  tr__buf_addstr(b, "]");
  if (b->oom) a->oom = 1;
  return intern(a, b->buf, b->len);
}

/* The set of dtype names, sorted: "BFloat16, Float". */
static int32_t dtypes_text(tr_fra_t* a, const tr__frv_t* v, tr__buf_t* b) {
  tr__buf_reset(b);
  if (!v || v->kind != TR__FRV_LIST) return -1;
  const char* names[64];
  size_t n = 0;
  for (uint32_t i = 0; i < v->n && n < 64; i++) {
    const tr__frv_t* s = v->u.items[i];
    if (s->kind != TR__FRV_STR) continue;
    size_t j = 0;
    while (j < n && strcmp(names[j], s->u.s) != 0) j++;
    if (j == n) names[n++] = s->u.s;
  }
  for (size_t i = 1; i < n; i++)
    for (size_t j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
      const char* t = names[j];
      names[j] = names[j - 1];
      names[j - 1] = t;
    }
  tr__buf_add(b, "", 0);
  for (size_t i = 0; i < n; i++) {
    if (i) tr__buf_addstr(b, ", ");
    tr__buf_addstr(b, names[i]);
  }
  if (b->oom) a->oom = 1;
  return intern(a, tr__buf_str(b), b->len);
}

static int32_t frames_text(tr_fra_t* a, const tr__frv_t* v, tr__buf_t* b) {
  tr__buf_reset(b);
  if (!v || v->kind != TR__FRV_LIST || v->n == 0) return -1;
  for (uint32_t i = 0; i < v->n && i < 64; i++) {
    const tr__frv_t* f = v->u.items[i];
    const tr__frv_t* nm = tr__frv_get(f, "name");
    const tr__frv_t* fn = tr__frv_get(f, "filename");
    if (i) tr__buf_addstr(b, "\n");
    tr__buf_addstr(b, nm && nm->kind == TR__FRV_STR ? nm->u.s : "?");
    tr__buf_addstr(b, " at ");
    tr__buf_addstr(b, fn && fn->kind == TR__FRV_STR ? fn->u.s : "?");
    tr__buf_addstr(b, ":");
    tr__fra_add_int(b, v_int(tr__frv_get(f, "line"), 0));
  }
  if (b->oom) a->oom = 1;
  return intern(a, b->buf, b->len);
}

/* "nccl:send 0->1" -> op "send", self 0, peer 1; "nccl:recv 1<-0" -> op
 * "recv", self 1, peer 0. e->pname >= 0. */
static void parse_pname(tr_fra_t* a, tr__fra_ent_t* e) {
  if ((size_t)e->pname < a->pn_cap && a->pn[e->pname].op != -2) {
    e->op = a->pn[e->pname].op;
    e->self_l = a->pn[e->pname].self;
    e->peer_l = a->pn[e->pname].peer;
    return;
  }
  const char* p = tr__fra_str(a, e->pname);
  const char* c = strchr(p, ':');
  const char* t = c ? c + 1 : p;
  const char* sp = strchr(t, ' ');
  size_t tl = sp ? (size_t)(sp - t) : strlen(t);
  e->op = intern(a, t, tl);
  e->self_l = e->peer_l = -1;
  if (sp) {
    char* end;
    long x = strtol(sp + 1, &end, 10);
    if ((end[0] == '-' && end[1] == '>') || (end[0] == '<' && end[1] == '-')) {
      long y = strtol(end + 2, NULL, 10);
      if (x >= 0 && x < 1 << 24 && y >= 0 && y < 1 << 24) {
        e->self_l = (int32_t)x;
        e->peer_l = (int32_t)y;
      }
    }
  }
  if ((size_t)e->pname >= a->pn_cap) {
    size_t old = a->pn_cap;
    if (TR_GROW(a->pn, (size_t)e->pname + 1, a->pn_cap) < 0) {
      a->oom = 1;
      return;
    }
    for (size_t i = old; i < a->pn_cap; i++) a->pn[i].op = -2;
  }
  a->pn[e->pname].op = e->op;
  a->pn[e->pname].self = e->self_l;
  a->pn[e->pname].peer = e->peer_l;
}

/* Interned id of a string node, cached by node: memoized strings of a
 * pickle are one node used by every entry. Valid for one tree only. */
typedef struct {
  const tr__frv_t* k[256];
  int32_t id[256];
} strcache_t;

static int32_t v_str_c(tr_fra_t* a, strcache_t* c, const tr__frv_t* v) {
  if (!v || v->kind != TR__FRV_STR) return -1;
  size_t h = ((uintptr_t)v >> 4) & 255;
  if (c->k[h] == v) return c->id[h];
  int32_t id = intern(a, v->u.s, v->n);
  c->k[h] = v;
  c->id[h] = id;
  return id;
}

/* ranks: "[0, 1, 2]" (a string, as PyTorch writes) or a list; TR_EFORMAT,
 * TR_ENOMEM. */
static int parse_ranks(const tr__frv_t* v, int** out, size_t* n) {
  *out = NULL;
  *n = 0;
  size_t cap = 0;
  int* r = NULL;
  if (v && v->kind == TR__FRV_STR) {
    const char* s = v->u.s;
    while (*s) {
      if (*s >= '0' && *s <= '9') {
        long x = strtol(s, (char**)&s, 10);
        if (TR_GROW(r, *n + 1, cap) < 0) {
          free(r);
          return TR_ENOMEM;
        }
        r[(*n)++] = (int)(x > 1 << 24 ? 1 << 24 : x);
      } else {
        s++;
      }
    }
  } else if (v && v->kind == TR__FRV_LIST) {
    r = malloc((v->n ? v->n : 1) * sizeof *r);
    if (!r) return TR_ENOMEM;
    for (uint32_t i = 0; i < v->n; i++) {
      int64_t x = v_int(v->u.items[i], 0);
      r[(*n)++] = (int)(x < 0 ? 0 : x > 1 << 24 ? 1 << 24 : x);
    }
  } else {
    return TR_EFORMAT;
  }
  if (*n) qsort(r, *n, sizeof *r, tr__fra_cmp_int);
  size_t k = 0; /* dedupe */
  for (size_t i = 0; i < *n; i++)
    if (k == 0 || r[k - 1] != r[i]) r[k++] = r[i];
  *n = k;
  *out = r;
  return 0;
}

static int find_group(tr_fra_t* a, int32_t name, const int* ranks, size_t n,
                      int inferred) {
  for (size_t i = 0; i < a->ng; i++) {
    tr__fra_group_t* g = &a->g[i];
    if (g->name != name || g->inferred != inferred) continue;
    if (inferred) return (int)i;
    if (g->n == n &&
        (n == 0 || memcmp(g->ranks, ranks, n * sizeof *ranks) == 0))
      return (int)i;
  }
  return -1;
}

/* The new group's index (it owns ranks); -1 and a->oom set when out of
 * memory (ranks freed). */
static int add_group(tr_fra_t* a, int32_t name, int32_t desc, int* ranks,
                     size_t n, int inferred) {
  if (a->oom || TR_GROW(a->g, a->ng + 1, a->gcap) < 0) {
    free(ranks);
    a->oom = 1;
    return -1;
  }
  tr__fra_group_t* g = &a->g[a->ng];
  memset(g, 0, sizeof *g);
  g->name = name;
  g->desc = desc;
  g->ranks = ranks;
  g->n = g->rcap = n;
  g->inferred = inferred;
  return (int)a->ng++;
}

/* Per-rank map: pg name -> group. */
typedef struct {
  int32_t name;
  int group;
} pgmap_t;

static int load_tree(tr_fra_t* a, tr__fra_dump_t* d, const tr__frv_t* root,
                     tr_errmsg_t* err) {
  if (!root || root->kind != TR__FRV_DICT)
    return tr_errmsg_set(err, TR_EFORMAT,
                         "'%s': the dump is not a dict (not a flight-recorder "
                         "dump)",
                         d->path);
  const tr__frv_t* ver = tr__frv_get(root, "version");
  if (!ver || ver->kind != TR__FRV_STR)
    return tr_errmsg_set(err, TR_EFORMAT,
                         "'%s': no \"version\" string (not a flight-recorder "
                         "dump)",
                         d->path);
  d->version = strdup(ver->u.s);
  if (!d->version) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  if (sscanf(d->version, "%d.%d", &d->vmaj, &d->vmin) != 2)
    return tr_errmsg_set(err, TR_EFORMAT, "'%s': invalid version '%s'", d->path,
                         d->version);

  int rc = 0;
  tr__buf_t b = TR__BUF_INIT;
  pgmap_t* pm = NULL;
  size_t npm = 0;
  struct {
    int64_t pg_id, started, done;
  }* ps = NULL;
  size_t nps = 0;
  strcache_t* sc = NULL;
  const tr__frv_t* cfg = tr__frv_get(root, "pg_config");
  if (cfg && cfg->kind == TR__FRV_DICT) {
    pm = malloc((cfg->n + 1) * sizeof *pm);
    if (!pm) goto out_oom;
    for (uint32_t i = 0; i < cfg->n; i++) {
      const tr__frv_t* k = cfg->u.items[2 * i];
      const tr__frv_t* v = cfg->u.items[2 * i + 1];
      const tr__frv_t* nm = tr__frv_get(v, "name");
      int32_t name = v_str(a, nm ? nm : k);
      if (name < 0 && k->kind == TR__FRV_INT) {
        char t[24];
        snprintf(t, sizeof t, "%" PRId64, k->u.i);
        name = intern(a, t, strlen(t));
      }
      int32_t desc = v_str(a, tr__frv_get(v, "desc"));
      int* ranks;
      size_t nr;
      if (a->oom) goto out_oom;
      if (name < 0 ||
          (rc = parse_ranks(tr__frv_get(v, "ranks"), &ranks, &nr)) < 0) {
        if (rc == TR_ENOMEM) goto out_oom;
        rc = tr_errmsg_set(err, TR_EFORMAT,
                           "'%s': pg_config entry %u lacks name or ranks",
                           d->path, i);
        goto out;
      }
      int gi = find_group(a, name, ranks, nr, 0);
      if (gi < 0)
        gi = add_group(a, name, desc < 0 ? intern(a, "undefined", 9) : desc,
                       ranks, nr, 0);
      else
        free(ranks);
      if (gi < 0) goto out_oom;
      pm[npm].name = name;
      pm[npm].group = gi;
      npm++;
    }
  }

  /* pg_status: pg id -> last started/completed collective (ints in the
     pickle, decimal strings in JSON; since 2.4) */
  const tr__frv_t* pst = tr__frv_get(root, "pg_status");
  if (pst && pst->kind == TR__FRV_DICT && pst->n) {
    ps = calloc(pst->n, sizeof *ps);
    if (!ps) goto out_oom;
    for (uint32_t i = 0; i < pst->n; i++) {
      const tr__frv_t* v = pst->u.items[2 * i + 1];
      ps[nps].pg_id = v_int(pst->u.items[2 * i], -1);
      ps[nps].started = v_int(tr__frv_get(v, "last_started_collective"), -1);
      ps[nps].done = v_int(tr__frv_get(v, "last_completed_collective"), -1);
      nps++;
    }
  }
  const tr__frv_t* ents = tr__frv_get(root, "entries");
  if (ents && ents->kind != TR__FRV_LIST) {
    rc = tr_errmsg_set(err, TR_EFORMAT, "'%s': \"entries\" is not a list",
                       d->path);
    goto out;
  }
  size_t n = ents ? ents->n : 0;
  d->e = calloc(n ? n : 1, sizeof *d->e);
  keycache_t kc;
  memset(&kc, 0, sizeof kc);
  sc = calloc(1, sizeof *sc);
  if (!d->e || !sc) goto out_oom;
  int32_t last_pg_name = -2;
  int last_group = -1;
  d->t_first = INT64_MAX;
  for (size_t i = 0; i < n; i++) {
    const tr__frv_t* ev = ents->u.items[i];
    if (ev->kind != TR__FRV_DICT) continue;
    tr__fra_ent_t* e = &d->e[d->n];
    memset(e, 0, sizeof *e);
    e->record_id = (int64_t)i;
    e->seq = -1;
    e->timeout_ms = -1;
    e->duration_ms = -1;
    e->pname = e->op = e->in_sizes = e->out_sizes = -1;
    e->in_dt = e->out_dt = e->frames = e->pg_name = -1;
    e->in_numel = e->out_numel = -1;
    int has_state = 0, coll_seen = 0;
    int32_t pg_desc = -1;
    int64_t pg_id = -1;
    for (uint32_t k = 0; k < ev->n; k++) {
      const tr__frv_t* v = ev->u.items[2 * k + 1];
      switch (field_id_cached(&kc, ev->u.items[2 * k])) {
        case F_RECORD_ID:
          e->record_id = v_int(v, e->record_id);
          break;
        case F_PG_ID:
          pg_id = v_int(v, -1);
          break;
        case F_PROCESS_GROUP:
          if (v->kind == TR__FRV_LIST && v->n >= 1) {
            e->pg_name = v_str_c(a, sc, v->u.items[0]);
            if (v->n >= 2) pg_desc = v_str_c(a, sc, v->u.items[1]);
          }
          break;
        case F_COLL_SEQ:
          e->seq = v_int(v, -1);
          coll_seen = 1;
          break;
        case F_SEQ_ID:
          if (!coll_seen) e->seq = v_int(v, -1);
          break;
        case F_P2P_SEQ:
          e->p2p_seq = v_int(v, 0);
          break;
        case F_OP_ID:
          e->op_id = v_int(v, 0);
          break;
        case F_PNAME:
          e->pname = v_str_c(a, sc, v);
          break;
        case F_TCREATED:
          e->t_created = v_int(v, 0);
          break;
        case F_DURATION:
          if (v->kind == TR__FRV_FLOAT) e->duration_ms = v->u.f;
          if (v->kind == TR__FRV_INT) e->duration_ms = (double)v->u.i;
          break;
        case F_IN_SIZES:
          e->in_sizes = sizes_text(a, v, &b, &e->in_numel, &e->in0);
          break;
        case F_OUT_SIZES:
          e->out_sizes = sizes_text(a, v, &b, &e->out_numel, &e->out0);
          break;
        case F_IN_DT:
          e->in_dt = v->kind == TR__FRV_LIST && v->n == 1 &&
                             v->u.items[0]->kind == TR__FRV_STR
                         ? v_str_c(a, sc, v->u.items[0])
                         : dtypes_text(a, v, &b);
          break;
        case F_OUT_DT:
          e->out_dt = v->kind == TR__FRV_LIST && v->n == 1 &&
                              v->u.items[0]->kind == TR__FRV_STR
                          ? v_str_c(a, sc, v->u.items[0])
                          : dtypes_text(a, v, &b);
          break;
        case F_STATE:
          if (v->kind == TR__FRV_STR) {
            int32_t id = v_str_c(a, sc, v);
            has_state = 1;
            e->state = id == a->id_completed ? TR__FRA_COMPLETED
                       : id == a->id_started ? TR__FRA_STARTED
                                             : TR__FRA_SCHEDULED;
          }
          break;
        case F_TSTART:
          e->t_started = v_int(v, 0);
          break;
        case F_TDONE:
          e->t_completed = v_int(v, 0);
          break;
        case F_RETIRED:
          e->retired = v_int(v, 0) != 0;
          break;
        case F_TIMEOUT:
          e->timeout_ms = v_int(v, -1);
          break;
        case F_IS_P2P:
          e->is_p2p = v_int(v, 0) != 0;
          e->has_is_p2p = 1;
          break;
        case F_FRAMES:
          e->frames = frames_text(a, v, &b);
          break;
        default:
          break;
      }
    }
    if (a->oom) goto out_oom;
    if (e->pname < 0 || e->pg_name < 0) {
      rc = tr_errmsg_set(err, TR_EFORMAT,
                         "'%s': entry %zu lacks profiling_name or "
                         "process_group",
                         d->path, i);
      goto out;
    }
    if (!has_state)
      e->state = e->t_completed ? TR__FRA_COMPLETED
                 : e->t_started ? TR__FRA_STARTED
                                : TR__FRA_SCHEDULED;
    parse_pname(a, e);
    if (e->op == a->id_coalesced) e->coalesced = 1;
    /* pg_status: collectives up to last_completed_collective completed
       (PyTorch's Gloo recorder retires them without discovery times) */
    for (size_t j = 0; j < nps && e->state != TR__FRA_COMPLETED; j++) {
      if (ps[j].pg_id != pg_id || e->seq < 0) continue;
      if (e->seq <= ps[j].done)
        e->state = TR__FRA_COMPLETED;
      else if (e->seq <= ps[j].started && e->state < TR__FRA_STARTED)
        e->state = TR__FRA_STARTED;
    }
    if (!e->has_is_p2p) {
      /* before is_p2p existed: send/recv by name; a coalesced marker is
         p2p when the entry before it (same group) is */
      e->is_p2p = e->op == a->id_send || e->op == a->id_recv;
      if (e->coalesced && d->n > 0 && d->e[d->n - 1].pg_name == e->pg_name)
        e->is_p2p = d->e[d->n - 1].is_p2p;
    }
    /* group */
    if (e->pg_name != last_pg_name) {
      last_group = -1;
      for (size_t j = 0; j < npm; j++)
        if (pm[j].name == e->pg_name) last_group = pm[j].group;
      if (last_group < 0) {
        last_group = find_group(a, e->pg_name, NULL, 0, 1);
        if (last_group < 0)
          last_group = add_group(
              a, e->pg_name, pg_desc >= 0 ? pg_desc : intern(a, "undefined", 9),
              NULL, 0, 1);
        if (last_group < 0) goto out_oom;
        tr__fra_group_t* g = &a->g[last_group];
        size_t j = 0;
        while (j < g->n && g->ranks[j] != d->rank) j++;
        if (j == g->n) {
          if (TR_GROW(g->ranks, g->n + 1, g->rcap) < 0) goto out_oom;
          g->ranks[g->n++] = d->rank;
        }
      }
      last_pg_name = e->pg_name;
    }
    e->group = last_group;
    if (e->t_created && e->t_created < d->t_first) d->t_first = e->t_created;
    int64_t tl = e->t_completed > e->t_started ? e->t_completed : e->t_started;
    if (e->t_created > tl) tl = e->t_created;
    if (tl > d->t_last) d->t_last = tl;
    d->n++;
  }
  if (d->n > 0 && d->e[0].record_id > 0) d->wrapped = 1;
  if (d->t_first == INT64_MAX) d->t_first = 0;
  if (!a->oom) goto out;
out_oom:
  a->oom = 1;
  rc = tr_errmsg_set(err, TR_ENOMEM, "'%s': out of memory", d->path);
out:
  free(sc);
  free(ps);
  free(pm);
  tr__buf_release(&b);
  return rc;
}

static int load_file(tr_fra_t* a, tr__fra_dump_t* d, tr_errmsg_t* err) {
  tr__buf_t fb = TR__BUF_INIT;
  int rc = tr__read_file(d->path, &fb);
  if (rc < 0)
    return tr_errmsg_set(err, rc, "cannot read '%s': %s", d->path,
                         tr_strerror(rc));
  const uint8_t* buf = (const uint8_t*)fb.buf;
  size_t len = fb.len;
  tr__arena_t* ar = &a->arena; /* reused from file to file */
  tr__arena_reset(ar, 64 * len + (1u << 20));
  tr__frv_t* root = NULL;
  size_t i = 0;
  while (i < len &&
         (buf[i] == ' ' || buf[i] == '\n' || buf[i] == '\t' || buf[i] == '\r'))
    i++;
  if (len > 0 && buf[0] == 0x80) {
    rc = tr__fr_unpickle(buf, len, d->path, ar, &root, err);
  } else if (i < len && buf[i] == '{') {
    json_error_t je;
    json_t* j = json_loadb((const char*)buf, len, JSON_ALLOW_NUL, &je);
    if (!j) {
      rc = tr_errmsg_set(err, TR_EPARSE,
                         "'%s': invalid JSON at line %d column %d (byte "
                         "offset %d): %s",
                         d->path, je.line, je.column, je.position, je.text);
    } else {
      rc = tr__frv_from_json(j, ar, &root);
      json_decref(j);
      if (rc < 0) rc = tr_errmsg_set(err, rc, "'%s': out of memory", d->path);
    }
  } else {
    rc = tr_errmsg_set(err, TR_EFORMAT,
                       "'%s': neither a pickle nor a JSON dump (first byte "
                       "0x%02x at byte offset 0)",
                       d->path, len ? buf[0] : 0);
  }
  tr__buf_release(&fb);
  if (rc == 0) rc = load_tree(a, d, root, err);
  return rc;
}

/* File name -> (prefix length, rank): the digits at the end of the name,
 * without a .json/.pkl/.pickle suffix. */
static int name_rank(const char* name, size_t* plen, int* rank) {
  size_t n = strlen(name);
  static const char* const sfx[] = {".json", ".pkl", ".pickle", NULL};
  for (int i = 0; sfx[i]; i++) {
    size_t l = strlen(sfx[i]);
    if (n > l && strcmp(name + n - l, sfx[i]) == 0) {
      n -= l;
      break;
    }
  }
  size_t e = n;
  while (e > 0 && name[e - 1] >= '0' && name[e - 1] <= '9') e--;
  if (e == n || n - e > 7) return -1;
  *plen = e;
  *rank = atoi(name + e);
  return 0;
}

typedef struct {
  char* path;
  char* base;
  int rank;
  int is_json;
} cand_t;

/* The regular files under dir, into *c; TR_ENOMEM. */
static int walk(const char* dir, cand_t** c, size_t* n, size_t* cap,
                int depth) {
  DIR* dd = opendir(dir);
  if (!dd) return errno == ENOMEM ? TR_ENOMEM : 0;
  if (depth > 8) {
    closedir(dd);
    return 0;
  }
  int rc = 0;
  struct dirent* de;
  while (rc == 0 && (de = readdir(dd))) {
    if (de->d_name[0] == '.') continue;
    size_t pl = strlen(dir) + strlen(de->d_name) + 2;
    char* p = malloc(pl);
    if (!p) {
      rc = TR_ENOMEM;
      break;
    }
    snprintf(p, pl, "%s/%s", dir, de->d_name);
    struct stat st;
    if (stat(p, &st) != 0) {
      free(p);
      continue;
    }
    if (S_ISDIR(st.st_mode)) {
      rc = walk(p, c, n, cap, depth + 1);
      free(p);
      continue;
    }
    if (!S_ISREG(st.st_mode)) {
      free(p);
      continue;
    }
    if (TR_GROW(*c, *n + 1, *cap) < 0) {
      free(p);
      rc = TR_ENOMEM;
      break;
    }
    (*c)[*n].path = p;
    (*c)[*n].base = p + strlen(dir) + 1;
    (*c)[*n].rank = -1;
    size_t bl = strlen(de->d_name);
    (*c)[*n].is_json = bl > 5 && strcmp(de->d_name + bl - 5, ".json") == 0;
    (*n)++;
  }
  closedir(dd);
  return rc;
}

static int cmp_cand(const void* x, const void* y) {
  const cand_t* a = x;
  const cand_t* b = y;
  if (a->rank != b->rank) return a->rank < b->rank ? -1 : 1;
  return a->is_json - b->is_json; /* the pickle first */
}

int tr_fra_load_dir(tr_fra_t** out, const char* dir, const tr_fra_opts_t* opts,
                    tr_errmsg_t* err) {
  *out = NULL;
  struct stat st;
  if (stat(dir, &st) != 0) {
    int rc = tr_err_from_errno();
    return tr_errmsg_set(err, rc, "cannot open '%s': %s", dir, tr_strerror(rc));
  }
  if (!S_ISDIR(st.st_mode))
    return tr_errmsg_set(err, TR_ENOTDIR, "'%s' is not a folder", dir);
  tr_fra_t* a = calloc(1, sizeof *a);
  if (!a) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  if (opts)
    a->o = *opts;
  else
    tr_fra_opts_init(&a->o);
  if (a->o.mismatch_cap <= 0) a->o.mismatch_cap = 10;
  a->dir = strdup(dir);
  a->primary = -1;
  a->id_send = intern(a, "send", 4);
  a->id_recv = intern(a, "recv", 4);
  a->id_coalesced = intern(a, "coalesced", 9);
  a->id_empty = intern(a, "", 0);
  a->id_completed = intern(a, "completed", 9);
  a->id_started = intern(a, "started", 7);

  cand_t* c = NULL;
  size_t nc = 0, cc = 0;
  int rc = walk(dir, &c, &nc, &cc, 0);
  if (rc < 0 || !a->dir || a->oom)
    rc = tr_errmsg_set(err, TR_ENOMEM, "'%s': out of memory", dir);
  /* keep the files named <prefix><rank>[.json] */
  const char* prefix = a->o.prefix;
  char* inferred = NULL;
  size_t keep = 0;
  for (size_t i = 0; i < nc; i++) {
    if (rc < 0) goto drop;
    size_t pl;
    int r;
    const char* base = strrchr(c[i].path, '/') + 1;
    if (prefix) {
      const char* at = strstr(base, prefix);
      if (!at) goto drop;
      if (name_rank(base, &pl, &r) < 0 ||
          pl != (size_t)(at - base) + strlen(prefix))
        goto drop;
    } else {
      if (name_rank(base, &pl, &r) < 0) goto drop;
      if (!inferred) {
        inferred = strndup(base, pl);
        if (!inferred) {
          rc = tr_errmsg_set(err, TR_ENOMEM, "'%s': out of memory", dir);
          goto drop;
        }
      } else if (strlen(inferred) != pl || strncmp(inferred, base, pl) != 0) {
        rc = tr_errmsg_set(err, TR_EINVAL,
                           "'%s': cannot infer the common file-name prefix "
                           "('%s' and '%.*s'); pass --prefix",
                           dir, inferred, (int)pl, base);
        goto drop;
      }
    }
    c[i].rank = r;
    c[keep++] = c[i];
    continue;
  drop:
    free(c[i].path);
  }
  nc = keep;
  free(inferred);
  if (rc == 0 && nc == 0)
    rc = tr_errmsg_set(err, TR_ENOENT,
                       "'%s': no flight-recorder dumps (files named "
                       "<prefix><rank>)",
                       dir);
  if (rc < 0) {
    for (size_t i = 0; i < nc; i++) free(c[i].path);
    free(c);
    tr_fra_free(a);
    return rc;
  }
  qsort(c, nc, sizeof *c, cmp_cand);
  a->d = calloc(nc, sizeof *a->d);
  if (!a->d) {
    for (size_t i = 0; i < nc; i++) free(c[i].path);
    free(c);
    tr_fra_free(a);
    return tr_errmsg_set(err, TR_ENOMEM, "'%s': out of memory", dir);
  }
  for (size_t i = 0; i < nc; i++) {
    if (a->nd && a->d[a->nd - 1].rank == c[i].rank) { /* the JSON twin */
      free(c[i].path);
      continue;
    }
    tr__fra_dump_t* d = &a->d[a->nd];
    memset(d, 0, sizeof *d);
    d->rank = c[i].rank;
    d->path = c[i].path;
    tr_errmsg_t e2;
    tr_errmsg_clear(&e2);
    rc = load_file(a, d, &e2);
    if (rc < 0) {
      if (a->o.allow_incomplete_ranks && rc != TR_ENOMEM) {
        fprintf(stderr, "trainrun: skipping rank %d: %s\n", d->rank,
                e2.message);
        free(d->e);
        free(d->version);
        free(d->path);
        memset(d, 0, sizeof *d);
        rc = 0;
        continue;
      }
      if (err) *err = e2;
      for (size_t j = i + 1; j < nc; j++) free(c[j].path);
      free(c);
      a->nd++;
      tr_fra_free(a);
      return rc;
    }
    a->n_entries += d->n;
    a->nd++;
  }
  free(c);
  tr__arena_release(&a->arena);
  if (a->nd == 0) {
    tr_fra_free(a);
    return tr_errmsg_set(err, TR_ENOENT, "'%s': no readable dump", dir);
  }
  a->max_rank = 0;
  a->ranks = malloc(a->nd * sizeof *a->ranks);
  if (!a->ranks) goto out_oom;
  for (size_t i = 0; i < a->nd; i++) {
    a->ranks[i] = a->d[i].rank;
    if (a->d[i].rank > a->max_rank) a->max_rank = a->d[i].rank;
    if (a->d[i].t_last > a->t_max) a->t_max = a->d[i].t_last;
    if (strcmp(a->d[i].version, a->d[0].version) != 0) a->mixed_versions = 1;
  }
  for (size_t gi = 0; gi < a->ng; gi++)
    for (size_t k = 0; k < a->g[gi].n; k++)
      if (a->g[gi].ranks[k] > a->max_rank) a->max_rank = a->g[gi].ranks[k];
  a->rank_to_d = malloc((size_t)(a->max_rank + 1) * sizeof(int));
  if (!a->rank_to_d) goto out_oom;
  for (int r = 0; r <= a->max_rank; r++) a->rank_to_d[r] = -1;
  for (size_t i = 0; i < a->nd; i++) a->rank_to_d[a->d[i].rank] = (int)i;
  for (size_t gi = 0; gi < a->ng; gi++)
    if (a->g[gi].inferred && a->g[gi].n)
      qsort(a->g[gi].ranks, a->g[gi].n, sizeof(int), tr__fra_cmp_int);
  *out = a;
  return 0;
out_oom:
  tr_fra_free(a);
  return tr_errmsg_set(err, TR_ENOMEM, "'%s': out of memory", dir);
}

/* ------------------------------------------------------------- lifecycle */

void tr_fra_opts_init(tr_fra_opts_t* o) {
  memset(o, 0, sizeof *o);
  o->mismatch_cap = 10;
}

void tr_fra_free(tr_fra_t* a) {
  if (!a) return;
  for (size_t i = 0; i < a->nd; i++) {
    free(a->d[i].e);
    free(a->d[i].path);
    free(a->d[i].version);
  }
  free(a->d);
  for (size_t i = 0; i < a->ng; i++) {
    tr__fra_group_t* g = &a->g[i];
    for (size_t m = 0; g->coll && m < g->n; m++) free(g->coll[m]);
    free(g->coll);
    free(g->ncoll);
    free(g->ccap);
    free(g->ranks);
  }
  free(a->g);
  for (size_t i = 0; i < a->nowned; i++) free(a->owned[i]);
  free(a->owned);
  free(a->f);
  free(a->missing);
  free(a->ranks);
  free(a->rank_to_d);
  free(a->verdict);
  tr__buf_release(&a->notes);
  free(a->dir);
  intern_release(&a->in);
  free(a->pn);
  free(a->opc);
  tr__arena_release(&a->arena);
  free(a);
}
