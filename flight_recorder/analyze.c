/* flight_recorder/analyze.c: `trainrun fr analyze` — load a folder of
 * per-rank flight-recorder dumps (ours or PyTorch's, pickle or JSON,
 * versions 2.2-2.10), group entries by process group, match collectives by
 * sequence number and send/recv by peer, and say which rank diverged.
 *
 * Loading keeps one compact record per entry (strings interned: op names,
 * shapes, dtype sets, stacks), so 1024 ranks x 2000 entries fit in a few
 * hundred MB and each file's value tree is freed right after it is read.
 * The checks are torchfrtrace's (fr_trace.py, components/types.py
 * Op.match); the alignment differs on purpose: instead of dropping every
 * entry whose record_id is below the largest first record_id of any rank
 * (which loses matches when ranks record different numbers of entries), a
 * rank counts as missing from collective #s only when its ring shows it
 * never got that far; a sequence number older than its ring is "unknown".
 * The -j table keeps torchfrtrace's record_id alignment.
 */
#include "config.h"

#include <dirent.h> /* opendir: walking the dump folder */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "flight_recorder/fra_internal.h"
#include "trainrun/error.h"
#include "trainrun/fr_analyze.h"

/* ---------------------------------------------------------------- utils */

typedef struct {
  char* s;
  size_t n, cap;
} sbuf_t;

static void sb_grow(sbuf_t* b, size_t add) {
  if (b->n + add + 1 <= b->cap) return;
  size_t nc = b->cap ? b->cap * 2 : 256;
  while (nc < b->n + add + 1) nc *= 2;
  char* s = realloc(b->s, nc);
  if (!s) abort(); /* out of memory while formatting text */
  b->s = s;
  b->cap = nc;
}

static void sb_add(sbuf_t* b, const char* s, size_t n) {
  sb_grow(b, n);
  memcpy(b->s + b->n, s, n);
  b->n += n;
  b->s[b->n] = '\0';
}

static void sb_puts(sbuf_t* b, const char* s) { sb_add(b, s, strlen(s)); }

__attribute__((format(printf, 2, 3))) static void sb_printf(sbuf_t* b,
                                                            const char* fmt,
                                                            ...) {
  va_list ap;
  va_start(ap, fmt);
  char tmp[512];
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n < sizeof tmp) {
    sb_add(b, tmp, (size_t)n);
    return;
  }
  sb_grow(b, (size_t)n);
  va_start(ap, fmt);
  vsnprintf(b->s + b->n, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->n += (size_t)n;
}

static void sb_int(sbuf_t* b, int64_t v) {
  char t[24];
  int i = 23;
  t[i] = '\0';
  uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
  do {
    t[--i] = (char)('0' + u % 10);
    u /= 10;
  } while (u);
  if (v < 0) t[--i] = '-';
  sb_add(b, t + i, (size_t)(23 - i));
}

static int cmp_int(const void* a, const void* b) {
  int x = *(const int*)a, y = *(const int*)b;
  return x < y ? -1 : x > y;
}

/* "0-3,5,7-9" */
static void sb_ranks(sbuf_t* b, const int* r, size_t n) {
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j + 1 < n && r[j + 1] == r[j] + 1) j++;
    if (i) sb_puts(b, ",");
    sb_int(b, r[i]);
    if (j > i) {
      sb_puts(b, j == i + 1 ? "," : "-");
      sb_int(b, r[j]);
    }
    i = j + 1;
  }
}

static void sb_time(sbuf_t* b, int64_t ns) {
  time_t t = (time_t)(ns / 1000000000);
  struct tm tm;
  gmtime_r(&t, &tm);
  sb_printf(b, "%02d:%02d:%02d UTC", tm.tm_hour, tm.tm_min, tm.tm_sec);
}

static void sb_duration(sbuf_t* b, int64_t ns) {
  int64_t s = ns / 1000000000;
  if (s >= 3600)
    sb_printf(b, "%" PRId64 "h %" PRId64 "m", s / 3600, (s / 60) % 60);
  else if (s >= 60)
    sb_printf(b, "%" PRId64 "m %" PRId64 "s", s / 60, s % 60);
  else
    sb_printf(b, "%" PRId64 ".%01" PRId64 "s", s, (ns / 100000000) % 10);
}

/* ------------------------------------------------------------- interning */

typedef struct {
  char** str;
  uint32_t* len;
  size_t n, cap;
  int32_t* slots; /* open addressing: id or -1 */
  size_t nslots;
} intern_t;

static uint64_t fnv(const char* s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
  return h;
}

static int32_t intern(intern_t* t, const char* s, size_t n) {
  if (t->n * 2 >= t->nslots) {
    size_t ns = t->nslots ? t->nslots * 2 : 1024;
    int32_t* sl = malloc(ns * sizeof *sl);
    if (!sl) abort();
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
  if (t->n == t->cap) {
    size_t nc = t->cap ? t->cap * 2 : 256;
    t->str = realloc(t->str, nc * sizeof *t->str);
    t->len = realloc(t->len, nc * sizeof *t->len);
    if (!t->str || !t->len) abort();
    t->cap = nc;
  }
  char* c = malloc(n + 1);
  if (!c) abort();
  memcpy(c, s, n);
  c[n] = '\0';
  t->str[t->n] = c;
  t->len[t->n] = (uint32_t)n;
  t->slots[h] = (int32_t)t->n;
  return (int32_t)t->n++;
}

static void intern_release(intern_t* t) {
  for (size_t i = 0; i < t->n; i++) free(t->str[i]);
  free(t->str);
  free(t->len);
  free(t->slots);
}

/* ------------------------------------------------------------ the model */

enum { ST_SCHEDULED = 0, ST_STARTED = 1, ST_COMPLETED = 2 };
static const char* const state_names[] = {"scheduled", "started", "completed"};

typedef struct {
  int64_t record_id, seq, p2p_seq, op_id;
  int64_t t_created, t_started, t_completed; /* 0: none */
  int64_t timeout_ms;                        /* -1: none */
  int64_t in_numel, out_numel; /* of the first tensor; -1: no tensor */
  double duration_ms;          /* < 0: none */
  int32_t group;               /* index in a->groups */
  int32_t pname, op;           /* interned profiling name, op type */
  int32_t in_sizes, out_sizes, in_dt, out_dt, frames; /* interned; -1 */
  int32_t pg_name;                                    /* interned */
  int32_t self_l, peer_l; /* p2p: group-local ranks from the name */
  uint8_t state, retired, is_p2p, has_is_p2p, in0, out0, coalesced;
} ent_t;

typedef struct {
  int rank;
  char* path;
  char* version;
  int vmaj, vmin;
  ent_t* e;
  size_t n, cap;
  int wrapped;     /* first record_id > 0: older entries were evicted */
  int64_t t_first; /* earliest time_created */
  int64_t t_last;  /* latest timestamp of any kind */
} rdump_t;

typedef struct {
  int32_t name, desc;
  int* ranks;
  size_t n;
  int inferred; /* not in any pg_config: members = ranks using it */
  /* per member position: entry indices into that rank's dump */
  uint32_t** coll;
  size_t* ncoll;
  size_t* ccap;
} group_t;

typedef struct {
  tr_fra_finding_t pub;
  int64_t t_ref; /* for picking the primary: when the problem began */
  int ref_rank;  /* rank and entry the finding describes */
  int64_t ref_ent;
  int state; /* of the waiting ranks: ST_* (-1 unknown) */
  int n_errors;
} finding_t;

struct tr_fra {
  tr_fra_opts_t o;
  char* dir;
  intern_t in;
  rdump_t* d;
  size_t nd, dcap;
  int* ranks;     /* sorted ranks with a dump */
  int* rank_to_d; /* rank -> index in d, -1; size max_rank + 1 */
  int max_rank;
  group_t* g;
  size_t ng, gcap;
  int* missing; /* member ranks without a dump */
  size_t nmissing;
  finding_t* f;
  size_t nf, fcap;
  int primary;
  char* verdict;
  size_t n_collectives; /* matched calls */
  size_t n_entries;
  int64_t t_max;
  int mixed_versions;
  char* notes; /* lines such as "Too many mismatches" */
  sbuf_t notes_b;
  /* int arrays owned by findings */
  int** owned;
  size_t nowned, owncap;
  int32_t id_send, id_recv, id_coalesced, id_empty, id_completed, id_started;
  /* profiling name id -> op id, self, peer (parsed once); -2 unknown */
  int32_t* pn;
  size_t pn_cap;
  uint8_t* opc; /* op id -> OPC_* bits (-1 byte: not computed) */
  size_t opc_cap;
  tr__arena_t arena; /* one file's value tree at a time */
};

void tr_fra_opts_init(tr_fra_opts_t* o) {
  memset(o, 0, sizeof *o);
  o->mismatch_cap = 10;
}

static const char* S(const tr_fra_t* a, int32_t id) {
  return id >= 0 ? a->in.str[id] : "";
}

/* ----------------------------------------------------------- op classes */

static int op_is(const tr_fra_t* a, int32_t op, const char* name) {
  return op >= 0 && strcmp(a->in.str[op], name) == 0;
}

static int op_in(const tr_fra_t* a, int32_t op, const char* const* names) {
  for (; *names; names++)
    if (op_is(a, op, *names)) return 1;
  return 0;
}

enum {
  OPC_ALLGATHER = 1,
  OPC_REDSCAT = 2,
  OPC_ALLREDUCE = 4,
  OPC_A2A = 8,
  OPC_SCATTER = 16,
  OPC_GATHER = 32,
  OPC_BROADCAST = 64
};

static const char* const ALLGATHER[] = {
    "all_gather", "all_gather_base", "_all_gather_base",
    "all_gather_into_tensor_coalesced", NULL};
static const char* const REDSCAT[] = {"reduce_scatter", "_reduce_scatter_base",
                                      "reduce_scatter_tensor_coalesced", NULL};
static const char* const ALLREDUCE[] = {"all_reduce", "allreduce_coalesced",
                                        NULL};
static const char* const A2A[] = {"all_to_all", "all_to_all_single",
                                  "all_to_all_v_single", NULL};

static unsigned opclass(tr_fra_t* a, int32_t op) {
  if (op < 0) return 0;
  if ((size_t)op >= a->opc_cap) {
    size_t nc = a->opc_cap ? a->opc_cap : 64;
    while (nc <= (size_t)op) nc *= 2;
    uint8_t* t = realloc(a->opc, nc);
    if (!t) abort();
    memset(t + a->opc_cap, 0xff, nc - a->opc_cap);
    a->opc = t;
    a->opc_cap = nc;
  }
  if (a->opc[op] == 0xff)
    a->opc[op] = (uint8_t)((op_in(a, op, ALLGATHER) ? OPC_ALLGATHER : 0) |
                           (op_in(a, op, REDSCAT) ? OPC_REDSCAT : 0) |
                           (op_in(a, op, ALLREDUCE) ? OPC_ALLREDUCE : 0) |
                           (op_in(a, op, A2A) ? OPC_A2A : 0) |
                           (op_is(a, op, "scatter") ? OPC_SCATTER : 0) |
                           (op_is(a, op, "gather") ? OPC_GATHER : 0) |
                           (op_is(a, op, "broadcast") ? OPC_BROADCAST : 0));
  return a->opc[op];
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
  return intern(&a->in, v->u.s, v->n);
}

/* Python's repr of a list of shapes: "[[4, 8], []]"; numel of the first. */
static int32_t sizes_text(tr_fra_t* a, const tr__frv_t* v, sbuf_t* b,
                          int64_t* numel0, uint8_t* nonempty0) {
  b->n = 0;
  *numel0 = -1;
  *nonempty0 = 0;
  if (!v || v->kind != TR__FRV_LIST) return -1;
  sb_puts(b, "[");
  for (uint32_t i = 0; i < v->n; i++) {
    const tr__frv_t* s = v->u.items[i];
    if (i) sb_puts(b, ", ");
    sb_puts(b, "[");
    int64_t numel = 1;
    if (s->kind == TR__FRV_LIST)
      for (uint32_t j = 0; j < s->n; j++) {
        if (j) sb_puts(b, ", ");
        int64_t d = v_int(s->u.items[j], 0);
        sb_int(b, d);
        numel *= d;
      }
    if (i == 0) {
      *numel0 = numel;
      *nonempty0 = s->kind == TR__FRV_LIST && s->n > 0;
    }
    sb_puts(b, "]");
  }
  sb_puts(b, "]");
  return intern(&a->in, b->s, b->n);
}

/* The set of dtype names, sorted: "BFloat16, Float". */
static int32_t dtypes_text(tr_fra_t* a, const tr__frv_t* v, sbuf_t* b) {
  b->n = 0;
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
  sb_add(b, "", 0);
  for (size_t i = 0; i < n; i++) {
    if (i) sb_puts(b, ", ");
    sb_puts(b, names[i]);
  }
  return intern(&a->in, b->s ? b->s : "", b->n);
}

static int32_t frames_text(tr_fra_t* a, const tr__frv_t* v, sbuf_t* b) {
  b->n = 0;
  if (!v || v->kind != TR__FRV_LIST || v->n == 0) return -1;
  for (uint32_t i = 0; i < v->n && i < 64; i++) {
    const tr__frv_t* f = v->u.items[i];
    const tr__frv_t* nm = tr__frv_get(f, "name");
    const tr__frv_t* fn = tr__frv_get(f, "filename");
    if (i) sb_puts(b, "\n");
    sb_puts(b, nm && nm->kind == TR__FRV_STR ? nm->u.s : "?");
    sb_puts(b, " at ");
    sb_puts(b, fn && fn->kind == TR__FRV_STR ? fn->u.s : "?");
    sb_puts(b, ":");
    sb_int(b, v_int(tr__frv_get(f, "line"), 0));
  }
  return intern(&a->in, b->s, b->n);
}

/* "nccl:send 0->1" -> op "send", self 0, peer 1; "nccl:recv 1<-0" -> op
 * "recv", self 1, peer 0. */
static void parse_pname(tr_fra_t* a, ent_t* e) {
  if ((size_t)e->pname < a->pn_cap && a->pn[3 * e->pname] != -2) {
    e->op = a->pn[3 * e->pname];
    e->self_l = a->pn[3 * e->pname + 1];
    e->peer_l = a->pn[3 * e->pname + 2];
    return;
  }
  const char* p = S(a, e->pname);
  const char* c = strchr(p, ':');
  const char* t = c ? c + 1 : p;
  const char* sp = strchr(t, ' ');
  size_t tl = sp ? (size_t)(sp - t) : strlen(t);
  e->op = intern(&a->in, t, tl);
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
    size_t nc = a->pn_cap ? a->pn_cap : 64;
    while (nc <= (size_t)e->pname) nc *= 2;
    int32_t* pn = realloc(a->pn, 3 * nc * sizeof *pn);
    if (!pn) abort();
    for (size_t i = 3 * a->pn_cap; i < 3 * nc; i++) pn[i] = -2;
    a->pn = pn;
    a->pn_cap = nc;
  }
  a->pn[3 * e->pname] = e->op;
  a->pn[3 * e->pname + 1] = e->self_l;
  a->pn[3 * e->pname + 2] = e->peer_l;
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
  int32_t id = intern(&a->in, v->u.s, v->n);
  c->k[h] = v;
  c->id[h] = id;
  return id;
}

/* ranks: "[0, 1, 2]" (a string, as PyTorch writes) or a list. */
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
        if (*n == cap) {
          cap = cap ? cap * 2 : 16;
          int* t = realloc(r, cap * sizeof *t);
          if (!t) abort();
          r = t;
        }
        r[(*n)++] = (int)(x > 1 << 24 ? 1 << 24 : x);
      } else {
        s++;
      }
    }
  } else if (v && v->kind == TR__FRV_LIST) {
    r = malloc((v->n ? v->n : 1) * sizeof *r);
    if (!r) abort();
    for (uint32_t i = 0; i < v->n; i++) {
      int64_t x = v_int(v->u.items[i], 0);
      r[(*n)++] = (int)(x < 0 ? 0 : x > 1 << 24 ? 1 << 24 : x);
    }
  } else {
    return TR_EFORMAT;
  }
  if (*n) qsort(r, *n, sizeof *r, cmp_int);
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
    group_t* g = &a->g[i];
    if (g->name != name || g->inferred != inferred) continue;
    if (inferred) return (int)i;
    if (g->n == n &&
        (n == 0 || memcmp(g->ranks, ranks, n * sizeof *ranks) == 0))
      return (int)i;
  }
  return -1;
}

static int add_group(tr_fra_t* a, int32_t name, int32_t desc, int* ranks,
                     size_t n, int inferred) {
  if (a->ng == a->gcap) {
    size_t nc = a->gcap ? a->gcap * 2 : 16;
    group_t* g = realloc(a->g, nc * sizeof *g);
    if (!g) abort();
    a->g = g;
    a->gcap = nc;
  }
  group_t* g = &a->g[a->ng];
  memset(g, 0, sizeof *g);
  g->name = name;
  g->desc = desc;
  g->ranks = ranks;
  g->n = n;
  g->inferred = inferred;
  return (int)a->ng++;
}

/* Per-rank map: pg name -> group. */
typedef struct {
  int32_t name;
  int group;
} pgmap_t;

static int load_tree(tr_fra_t* a, rdump_t* d, const tr__frv_t* root,
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
  if (!d->version) abort();
  if (sscanf(d->version, "%d.%d", &d->vmaj, &d->vmin) != 2)
    return tr_errmsg_set(err, TR_EFORMAT, "'%s': invalid version '%s'", d->path,
                         d->version);

  sbuf_t b = {0};
  pgmap_t* pm = NULL;
  size_t npm = 0;
  const tr__frv_t* cfg = tr__frv_get(root, "pg_config");
  if (cfg && cfg->kind == TR__FRV_DICT) {
    pm = malloc((cfg->n + 1) * sizeof *pm);
    if (!pm) abort();
    for (uint32_t i = 0; i < cfg->n; i++) {
      const tr__frv_t* k = cfg->u.items[2 * i];
      const tr__frv_t* v = cfg->u.items[2 * i + 1];
      const tr__frv_t* nm = tr__frv_get(v, "name");
      int32_t name = v_str(a, nm ? nm : k);
      if (name < 0 && k->kind == TR__FRV_INT) {
        char t[24];
        snprintf(t, sizeof t, "%" PRId64, k->u.i);
        name = intern(&a->in, t, strlen(t));
      }
      int32_t desc = v_str(a, tr__frv_get(v, "desc"));
      int* ranks;
      size_t nr;
      if (name < 0 || parse_ranks(tr__frv_get(v, "ranks"), &ranks, &nr) < 0) {
        free(pm);
        free(b.s);
        return tr_errmsg_set(err, TR_EFORMAT,
                             "'%s': pg_config entry %u lacks name or ranks",
                             d->path, i);
      }
      int gi = find_group(a, name, ranks, nr, 0);
      if (gi < 0)
        gi =
            add_group(a, name, desc < 0 ? intern(&a->in, "undefined", 9) : desc,
                      ranks, nr, 0);
      else
        free(ranks);
      pm[npm].name = name;
      pm[npm].group = gi;
      npm++;
    }
  }

  /* pg_status: pg id -> last started/completed collective (ints in the
     pickle, decimal strings in JSON; since 2.4) */
  struct {
    int64_t pg_id, started, done;
  }* ps = NULL;
  size_t nps = 0;
  const tr__frv_t* pst = tr__frv_get(root, "pg_status");
  if (pst && pst->kind == TR__FRV_DICT && pst->n) {
    ps = calloc(pst->n, sizeof *ps);
    if (!ps) abort();
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
    free(ps);
    free(pm);
    free(b.s);
    return tr_errmsg_set(err, TR_EFORMAT, "'%s': \"entries\" is not a list",
                         d->path);
  }
  size_t n = ents ? ents->n : 0;
  d->e = calloc(n ? n : 1, sizeof *d->e);
  if (!d->e) abort();
  keycache_t kc;
  memset(&kc, 0, sizeof kc);
  strcache_t* sc = calloc(1, sizeof *sc);
  if (!sc) abort();
  int32_t last_pg_name = -2;
  int last_group = -1;
  d->t_first = INT64_MAX;
  for (size_t i = 0; i < n; i++) {
    const tr__frv_t* ev = ents->u.items[i];
    if (ev->kind != TR__FRV_DICT) continue;
    ent_t* e = &d->e[d->n];
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
            e->state = id == a->id_completed ? ST_COMPLETED
                       : id == a->id_started ? ST_STARTED
                                             : ST_SCHEDULED;
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
    if (e->pname < 0 || e->pg_name < 0) {
      free(pm);
      free(b.s);
      free(sc);
      free(ps);
      return tr_errmsg_set(err, TR_EFORMAT,
                           "'%s': entry %zu lacks profiling_name or "
                           "process_group",
                           d->path, i);
    }
    if (!has_state)
      e->state = e->t_completed ? ST_COMPLETED
                 : e->t_started ? ST_STARTED
                                : ST_SCHEDULED;
    parse_pname(a, e);
    if (e->op == a->id_coalesced) e->coalesced = 1;
    /* pg_status: collectives up to last_completed_collective completed
       (PyTorch's Gloo recorder retires them without discovery times) */
    for (size_t j = 0; j < nps && e->state != ST_COMPLETED; j++) {
      if (ps[j].pg_id != pg_id || e->seq < 0) continue;
      if (e->seq <= ps[j].done)
        e->state = ST_COMPLETED;
      else if (e->seq <= ps[j].started && e->state < ST_STARTED)
        e->state = ST_STARTED;
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
          last_group =
              add_group(a, e->pg_name,
                        pg_desc >= 0 ? pg_desc : intern(&a->in, "undefined", 9),
                        NULL, 0, 1);
        group_t* g = &a->g[last_group];
        size_t j = 0;
        while (j < g->n && g->ranks[j] != d->rank) j++;
        if (j == g->n) {
          int* r = realloc(g->ranks, (g->n + 1) * sizeof *r);
          if (!r) abort();
          g->ranks = r;
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
  free(sc);
  free(ps);
  free(pm);
  free(b.s);
  return 0;
}

static int read_file(const char* path, uint8_t** buf, size_t* len) {
  FILE* f = fopen(path, "rb");
  if (!f) return tr_err_from_errno();
  struct stat st;
  size_t cap = fstat(fileno(f), &st) == 0 && st.st_size > 0
                   ? (size_t)st.st_size + 1
                   : (size_t)1 << 16;
  size_t n = 0;
  uint8_t* b = malloc(cap);
  if (!b) abort();
  for (;;) {
    if (n == cap) {
      cap *= 2;
      uint8_t* t = realloc(b, cap);
      if (!t) abort();
      b = t;
    }
    size_t r = fread(b + n, 1, cap - n, f);
    n += r;
    if (r == 0) break;
  }
  int bad = ferror(f);
  fclose(f);
  if (bad) {
    free(b);
    return TR_EIO;
  }
  *buf = b;
  *len = n;
  return 0;
}

static int load_file(tr_fra_t* a, rdump_t* d, tr_errmsg_t* err) {
  uint8_t* buf = NULL;
  size_t len = 0;
  int rc = read_file(d->path, &buf, &len);
  if (rc < 0)
    return tr_errmsg_set(err, rc, "cannot read '%s': %s", d->path,
                         tr_strerror(rc));
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
  free(buf);
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

static void walk(const char* dir, cand_t** c, size_t* n, size_t* cap,
                 int depth) {
  DIR* dd = opendir(dir);
  if (!dd || depth > 8) {
    if (dd) closedir(dd);
    return;
  }
  struct dirent* de;
  while ((de = readdir(dd))) {
    if (de->d_name[0] == '.') continue;
    size_t pl = strlen(dir) + strlen(de->d_name) + 2;
    char* p = malloc(pl);
    if (!p) abort();
    snprintf(p, pl, "%s/%s", dir, de->d_name);
    struct stat st;
    if (stat(p, &st) != 0) {
      free(p);
      continue;
    }
    if (S_ISDIR(st.st_mode)) {
      walk(p, c, n, cap, depth + 1);
      free(p);
      continue;
    }
    if (!S_ISREG(st.st_mode)) {
      free(p);
      continue;
    }
    if (*n == *cap) {
      *cap = *cap ? *cap * 2 : 64;
      cand_t* t = realloc(*c, *cap * sizeof *t);
      if (!t) abort();
      *c = t;
    }
    (*c)[*n].path = p;
    (*c)[*n].base = p + strlen(dir) + 1;
    (*c)[*n].rank = -1;
    size_t bl = strlen(de->d_name);
    (*c)[*n].is_json = bl > 5 && strcmp(de->d_name + bl - 5, ".json") == 0;
    (*n)++;
  }
  closedir(dd);
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
  if (!a) return TR_ENOMEM;
  if (opts)
    a->o = *opts;
  else
    tr_fra_opts_init(&a->o);
  if (a->o.mismatch_cap <= 0) a->o.mismatch_cap = 10;
  a->dir = strdup(dir);
  a->primary = -1;
  a->id_send = intern(&a->in, "send", 4);
  a->id_recv = intern(&a->in, "recv", 4);
  a->id_coalesced = intern(&a->in, "coalesced", 9);
  a->id_empty = intern(&a->in, "", 0);
  a->id_completed = intern(&a->in, "completed", 9);
  a->id_started = intern(&a->in, "started", 7);

  cand_t* c = NULL;
  size_t nc = 0, cc = 0;
  walk(dir, &c, &nc, &cc, 0);
  /* keep the files named <prefix><rank>[.json] */
  const char* prefix = a->o.prefix;
  char* inferred = NULL;
  size_t keep = 0;
  int rc = 0;
  for (size_t i = 0; i < nc; i++) {
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
  if (!a->d) abort();
  for (size_t i = 0; i < nc; i++) {
    if (a->nd && a->d[a->nd - 1].rank == c[i].rank) { /* the JSON twin */
      free(c[i].path);
      continue;
    }
    rdump_t* d = &a->d[a->nd];
    memset(d, 0, sizeof *d);
    d->rank = c[i].rank;
    d->path = c[i].path;
    tr_errmsg_t e2;
    tr_errmsg_clear(&e2);
    rc = load_file(a, d, &e2);
    if (rc < 0) {
      if (a->o.allow_incomplete_ranks) {
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
  if (!a->ranks) abort();
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
  if (!a->rank_to_d) abort();
  for (int r = 0; r <= a->max_rank; r++) a->rank_to_d[r] = -1;
  for (size_t i = 0; i < a->nd; i++) a->rank_to_d[a->d[i].rank] = (int)i;
  for (size_t gi = 0; gi < a->ng; gi++)
    if (a->g[gi].inferred && a->g[gi].n)
      qsort(a->g[gi].ranks, a->g[gi].n, sizeof(int), cmp_int);
  *out = a;
  return 0;
}

/* ------------------------------------------------------------- findings */

static int* own_ints(tr_fra_t* a, const int* r, size_t n) {
  int* c = malloc((n ? n : 1) * sizeof *c);
  if (!c) abort();
  if (n) memcpy(c, r, n * sizeof *c);
  if (a->nowned == a->owncap) {
    a->owncap = a->owncap ? a->owncap * 2 : 64;
    a->owned = realloc(a->owned, a->owncap * sizeof *a->owned);
    if (!a->owned) abort();
  }
  a->owned[a->nowned++] = c;
  return c;
}

static char* own_str(tr_fra_t* a, const char* s) {
  char* c = strdup(s);
  if (!c) abort();
  if (a->nowned == a->owncap) {
    a->owncap = a->owncap ? a->owncap * 2 : 64;
    a->owned = realloc(a->owned, a->owncap * sizeof *a->owned);
    if (!a->owned) abort();
  }
  a->owned[a->nowned++] = (int*)(void*)c;
  return c;
}

static const char* kind_name(tr_fra_kind_t k) {
  switch (k) {
    case TR_FRA_NOT_JOINED:
      return "NOT_JOINED";
    case TR_FRA_TYPE_MISMATCH:
      return "COLLECTIVE_TYPE_MISMATCH";
    case TR_FRA_SIZE_MISMATCH:
      return "SIZE_OR_SYNTAX_MISMATCH";
    case TR_FRA_DTYPE_MISMATCH:
      return "COLLECTIVE_DTYPE_MISMATCH";
    case TR_FRA_STATE_MISMATCH:
      return "COLLECTIVE_STATE_MISMATCH";
    case TR_FRA_ALLTOALL_MISMATCH:
      return "ALLTOALL_INPUT_OUTPUT_MISMATCH";
    case TR_FRA_SEND_NO_RECV:
      return "SEND_WITHOUT_RECV";
    case TR_FRA_RECV_NO_SEND:
      return "RECV_WITHOUT_SEND";
    case TR_FRA_P2P_SIZE_MISMATCH:
      return "P2P_SIZE_MISMATCH";
    case TR_FRA_ALL_WAITING:
      return "ALL_RANKS_WAITING";
    case TR_FRA_MISSING_DUMP:
      return "MISSING_DUMP";
  }
  return "UNKNOWN";
}

static finding_t* add_finding(tr_fra_t* a, tr_fra_kind_t kind, int gi,
                              int ref_rank, int64_t ref_ent) {
  if (a->nf == a->fcap) {
    a->fcap = a->fcap ? a->fcap * 2 : 16;
    a->f = realloc(a->f, a->fcap * sizeof *a->f);
    if (!a->f) abort();
  }
  finding_t* f = &a->f[a->nf++];
  memset(f, 0, sizeof *f);
  f->pub.kind = kind;
  f->pub.kind_name = kind_name(kind);
  f->pub.seq = -1;
  f->pub.record_id = -1;
  f->pub.op = "";
  f->pub.profiling_name = "";
  f->pub.detail = "";
  f->state = -1;
  if (gi >= 0) {
    group_t* g = &a->g[gi];
    f->pub.pg_name = S(a, g->name);
    f->pub.pg_desc = S(a, g->desc);
    f->pub.pg_ranks = g->ranks;
    f->pub.pg_size = g->n;
  } else {
    f->pub.pg_name = f->pub.pg_desc = "";
  }
  f->ref_rank = ref_rank;
  f->ref_ent = ref_ent;
  if (ref_rank >= 0 && ref_ent >= 0) {
    const ent_t* e = &a->d[a->rank_to_d[ref_rank]].e[ref_ent];
    f->pub.seq = e->is_p2p ? e->p2p_seq : e->seq;
    f->pub.record_id = e->record_id;
    f->pub.op = S(a, e->op);
    f->pub.profiling_name = S(a, e->pname);
    f->t_ref = e->t_created;
  }
  return f;
}

/* ------------------------------------------------------------- matching */

typedef struct {
  int pos; /* member position */
  int rank;
  size_t lo, hi; /* call = coll[pos][lo, hi) */
  uint64_t tsig, ssig, dsig;
  int state;
} call_t;

static uint64_t mix(uint64_t h, int64_t v) {
  h ^= (uint64_t)v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h;
}

static const ent_t* call_ent(const tr_fra_t* a, const group_t* g,
                             const call_t* c, size_t k) {
  const rdump_t* d = &a->d[a->rank_to_d[c->rank]];
  return &d->e[g->coll[c->pos][c->lo + k]];
}

/* Majority class of a signature over calls; returns culprits (ranks whose
 * signature differs) in out[], count in *nout; ties go to the class of the
 * lowest rank (torchfrtrace compares against the first rank). */
typedef struct {
  uint64_t sig;
  size_t idx;
} sigidx_t;

static int cmp_sigidx(const void* x, const void* y) {
  const sigidx_t* a = x;
  const sigidx_t* b = y;
  if (a->sig != b->sig) return a->sig < b->sig ? -1 : 1;
  return a->idx < b->idx ? -1 : a->idx > b->idx;
}

static uint64_t sig_at(const call_t* c, size_t off) {
  uint64_t v;
  memcpy(&v, (const char*)c + off, sizeof v);
  return v;
}

static size_t minority(const call_t* c, size_t n, size_t off, int* out,
                       int* ref_idx) {
  *ref_idx = 0;
  size_t i = 1;
  uint64_t s0 = sig_at(&c[0], off);
  while (i < n && sig_at(&c[i], off) == s0) i++;
  if (i == n) return 0; /* all equal: the common case, O(n) */
  sigidx_t* v = malloc(n * sizeof *v);
  if (!v) abort();
  for (i = 0; i < n; i++) {
    v[i].sig = sig_at(&c[i], off);
    v[i].idx = i;
  }
  qsort(v, n, sizeof *v, cmp_sigidx);
  /* the largest class; ties go to the class holding the lowest index */
  size_t best_len = 0, best_first = 0;
  for (size_t a = 0; a < n;) {
    size_t b = a, lowest = v[a].idx;
    while (b < n && v[b].sig == v[a].sig) {
      if (v[b].idx < lowest) lowest = v[b].idx;
      b++;
    }
    if (b - a > best_len || (b - a == best_len && lowest < best_first)) {
      best_len = b - a;
      best_first = lowest;
    }
    a = b;
  }
  free(v);
  uint64_t s = sig_at(&c[best_first], off);
  size_t k = 0;
  for (i = 0; i < n; i++)
    if (sig_at(&c[i], off) != s) out[k++] = c[i].rank;
  *ref_idx = (int)best_first;
  return k;
}

static void describe_call(const tr_fra_t* a, const group_t* g, const call_t* c,
                          int what, sbuf_t* b) {
  size_t n = c->hi - c->lo;
  const ent_t* e = call_ent(a, g, c, 0);
  if (what == 0) {
    sb_puts(b, S(a, e->op));
    if (n > 1) sb_printf(b, " (coalesced, %zu ops)", n);
  } else if (what == 1) {
    sb_printf(b, "input sizes %s, output sizes %s", S(a, e->in_sizes),
              S(a, e->out_sizes));
  } else if (what == 2) {
    sb_printf(b, "dtypes %s -> %s", S(a, e->in_dt), S(a, e->out_dt));
  } else {
    sb_puts(b, state_names[c->state]);
  }
}

/* One finding for the mismatching classes of a signature. */
static finding_t* sig_finding(tr_fra_t* a, int gi, call_t* c, size_t n,
                              size_t off, tr_fra_kind_t kind, int what) {
  int* cul = malloc(n * sizeof *cul);
  if (!cul) abort();
  int ref;
  size_t k = minority(c, n, off, cul, &ref);
  if (k == 0) {
    free(cul);
    return NULL;
  }
  group_t* g = &a->g[gi];
  finding_t* f = add_finding(a, kind, gi, c[ref].rank,
                             (int64_t)g->coll[c[ref].pos][c[ref].lo]);
  f->pub.culprits = own_ints(a, cul, k);
  f->pub.n_culprits = k;
  sbuf_t b = {0};
  /* "rank 2 has X where ranks 0,1,3 have Y" */
  int* maj = malloc(n * sizeof *maj);
  size_t nm = 0;
  uint64_t s = sig_at(&c[ref], off);
  for (size_t i = 0; i < n; i++)
    if (sig_at(&c[i], off) == s) maj[nm++] = c[i].rank;
  for (size_t i = 0, shown = 0; i < n && shown < 3; i++) {
    if (sig_at(&c[i], off) == s) continue;
    if (shown++) sb_puts(&b, "; ");
    sb_printf(&b, "rank %d has ", c[i].rank);
    describe_call(a, g, &c[i], what, &b);
  }
  sb_printf(&b, " where rank%s ", nm > 1 ? "s" : "");
  sb_ranks(&b, maj, nm);
  sb_puts(&b, nm > 1 ? " have " : " has ");
  describe_call(a, g, &c[ref], what, &b);
  f->pub.detail = own_str(a, b.s);
  free(b.s);
  free(maj);
  free(cul);
  return f;
}

/* Per-entry syntax checks of torchfrtrace's Op.match. */
static finding_t* syntax_finding(tr_fra_t* a, int gi, call_t* c, size_t n) {
  group_t* g = &a->g[gi];
  int* cul = malloc(n * sizeof *cul);
  if (!cul) abort();
  size_t k = 0;
  sbuf_t b = {0};
  int ref = -1;
  for (size_t i = 0; i < n; i++) {
    int bad = 0;
    for (size_t j = 0; j < c[i].hi - c[i].lo && !bad; j++) {
      const ent_t* e = call_ent(a, g, &c[i], j);
      unsigned oc = opclass(a, e->op);
      if (oc & OPC_ALLREDUCE && e->in_sizes != e->out_sizes) {
        bad = 1;
        if (k < 3)
          sb_printf(&b,
                    "%srank %d: all_reduce input sizes %s != output "
                    "sizes %s",
                    b.n ? "; " : "", c[i].rank, S(a, e->in_sizes),
                    S(a, e->out_sizes));
      } else if (oc & OPC_ALLGATHER && e->in_numel >= 0 && e->out_numel >= 0 &&
                 e->out_numel != e->in_numel * (int64_t)g->n) {
        bad = 1;
        if (k < 3)
          sb_printf(&b,
                    "%srank %d: output numel %" PRId64
                    " != input numel %" PRId64 " * pg size %zu",
                    b.n ? "; " : "", c[i].rank, e->out_numel, e->in_numel,
                    g->n);
      } else if (oc & OPC_REDSCAT && e->in_numel >= 0 && e->out_numel >= 0 &&
                 e->in_numel != e->out_numel * (int64_t)g->n) {
        bad = 1;
        if (k < 3)
          sb_printf(&b,
                    "%srank %d: input numel %" PRId64
                    " != output numel %" PRId64 " * pg size %zu",
                    b.n ? "; " : "", c[i].rank, e->in_numel, e->out_numel,
                    g->n);
      }
    }
    if (bad) {
      cul[k++] = c[i].rank;
      if (ref < 0) ref = (int)i;
    }
  }
  finding_t* f = NULL;
  if (k) {
    f = add_finding(a, TR_FRA_SIZE_MISMATCH, gi, c[ref].rank,
                    (int64_t)g->coll[c[ref].pos][c[ref].lo]);
    f->pub.culprits = own_ints(a, cul, k);
    f->pub.n_culprits = k;
    f->pub.detail = own_str(a, b.s);
  }
  free(b.s);
  free(cul);
  return f;
}

static void add_note(tr_fra_t* a, const char* s) {
  sb_puts(&a->notes_b, s);
  sb_puts(&a->notes_b, "\n");
}

/* Is the rank (member with a dump) past its ring for seq s? */
enum { P_PRESENT, P_MISSING, P_UNKNOWN, P_NODUMP };

static void match_group(tr_fra_t* a, int gi) {
  group_t* g = &a->g[gi];
  size_t n = g->n;
  if (n == 0) return;
  size_t* cur = calloc(n, sizeof *cur);
  call_t* calls = malloc(n * sizeof *calls);
  int* cls = malloc(n * sizeof *cls);
  int* tmp = malloc(n * sizeof *tmp);
  int* tmp2 = malloc(n * sizeof *tmp2);
  if (!cur || !calls || !cls || !tmp || !tmp2) abort();
  int reported = 0, dump_note = 0, all_waiting = 0;
  int max_ver = 0;
  for (size_t m = 0; m < n; m++) {
    int di = a->rank_to_d[g->ranks[m]];
    if (di >= 0 && a->d[di].vmaj * 100 + a->d[di].vmin > max_ver)
      max_ver = a->d[di].vmaj * 100 + a->d[di].vmin;
  }
  for (;;) {
    /* the smallest sequence number under any cursor */
    int64_t s = INT64_MAX;
    for (size_t m = 0; m < n; m++) {
      int di = a->rank_to_d[g->ranks[m]];
      if (di < 0 || cur[m] >= g->ncoll[m]) continue;
      int64_t q = a->d[di].e[g->coll[m][cur[m]]].seq;
      if (q < s) s = q;
    }
    if (s == INT64_MAX) break;
    size_t nc = 0, nmiss = 0, nnodump = 0, nunk = 0;
    for (size_t m = 0; m < n; m++) {
      int r = g->ranks[m];
      int di = a->rank_to_d[r];
      if (di < 0) {
        cls[m] = P_NODUMP;
        nnodump++;
        continue;
      }
      const rdump_t* d = &a->d[di];
      if (cur[m] < g->ncoll[m] && d->e[g->coll[m][cur[m]]].seq == s) {
        call_t* c = &calls[nc++];
        c->pos = (int)m;
        c->rank = r;
        c->lo = cur[m];
        size_t hi = cur[m];
        while (hi < g->ncoll[m] && d->e[g->coll[m][hi]].seq == s) hi++;
        c->hi = hi;
        c->tsig = c->ssig = c->dsig = 1469598103934665603ull;
        c->state = ST_COMPLETED;
        for (size_t k = c->lo; k < hi; k++) {
          const ent_t* e = &d->e[g->coll[m][k]];
          unsigned oc = opclass(a, e->op);
          c->tsig = mix(c->tsig, e->op);
          c->ssig =
              mix(c->ssig, oc & (OPC_A2A | OPC_SCATTER) ? -2 : e->in_sizes);
          c->ssig =
              mix(c->ssig, oc & (OPC_A2A | OPC_GATHER) ? -2 : e->out_sizes);
          c->dsig = mix(c->dsig, oc & (OPC_SCATTER | OPC_BROADCAST) || !e->in0
                                     ? -2
                                     : e->in_dt);
          c->dsig = mix(c->dsig, oc & OPC_GATHER || !e->out0 ? -2 : e->out_dt);
          if (e->state < c->state) c->state = e->state;
        }
        cls[m] = P_PRESENT;
        continue;
      }
      /* not at s: beyond its last call (never got there), or unknown */
      int64_t last = g->ncoll[m] ? d->e[g->coll[m][g->ncoll[m] - 1]].seq : -1;
      int64_t first = g->ncoll[m] ? d->e[g->coll[m][0]].seq : INT64_MAX;
      if (g->ncoll[m] == 0 && !d->wrapped)
        cls[m] = P_MISSING;
      else if (g->ncoll[m] && s > last)
        cls[m] = P_MISSING;
      else if (s < first && !d->wrapped)
        cls[m] = P_UNKNOWN;
      else
        cls[m] = P_UNKNOWN;
      if (cls[m] == P_MISSING)
        nmiss++;
      else
        nunk++;
    }
    (void)nunk;
    finding_t* f = NULL;
    int waiting_state = ST_COMPLETED;
    for (size_t i = 0; i < nc; i++)
      if (calls[i].state < waiting_state) waiting_state = calls[i].state;
    if (nmiss) {
      size_t k = 0, kp = 0;
      for (size_t m = 0; m < n; m++)
        if (cls[m] == P_MISSING) tmp[k++] = g->ranks[m];
      for (size_t i = 0; i < nc; i++) tmp2[kp++] = calls[i].rank;
      f = add_finding(a, TR_FRA_NOT_JOINED, gi, calls[0].rank,
                      (int64_t)g->coll[calls[0].pos][calls[0].lo]);
      f->pub.culprits = own_ints(a, tmp, k);
      f->pub.n_culprits = k;
      f->pub.missing = f->pub.culprits;
      f->pub.n_missing = k;
      sbuf_t b = {0};
      sb_printf(&b, "rank%s ", k > 1 ? "s" : "");
      sb_ranks(&b, tmp, k);
      sb_printf(&b, " never entered it; rank%s ", kp > 1 ? "s" : "");
      sb_ranks(&b, tmp2, kp);
      sb_printf(&b, " %s in it (%s)", kp > 1 ? "are" : "is",
                state_names[waiting_state]);
      f->pub.detail = own_str(a, b.s);
      free(b.s);
    }
    if (!f && nc > 1)
      f = sig_finding(a, gi, calls, nc, offsetof(call_t, tsig),
                      TR_FRA_TYPE_MISMATCH, 0);
    if (!f && nc > 1)
      f = sig_finding(a, gi, calls, nc, offsetof(call_t, ssig),
                      TR_FRA_SIZE_MISMATCH, 1);
    if (!f) f = syntax_finding(a, gi, calls, nc);
    if (!f && nc > 1)
      f = sig_finding(a, gi, calls, nc, offsetof(call_t, dsig),
                      TR_FRA_DTYPE_MISMATCH, 2);
    if (!f && nc > 1) {
      /* state: the least advanced ranks are behind */
      int lo = ST_COMPLETED, hi = ST_SCHEDULED;
      for (size_t i = 0; i < nc; i++) {
        if (calls[i].state < lo) lo = calls[i].state;
        if (calls[i].state > hi) hi = calls[i].state;
      }
      if (lo != hi) {
        size_t k = 0, kp = 0;
        int ref = -1;
        for (size_t i = 0; i < nc; i++) {
          if (calls[i].state == lo) {
            tmp[k++] = calls[i].rank;
          } else {
            tmp2[kp++] = calls[i].rank;
            if (ref < 0 && calls[i].state == hi) ref = (int)i;
          }
        }
        int ci = 0;
        while (calls[ci].state != lo) ci++;
        f = add_finding(a, TR_FRA_STATE_MISMATCH, gi, calls[ci].rank,
                        (int64_t)g->coll[calls[ci].pos][calls[ci].lo]);
        f->pub.culprits = own_ints(a, tmp, k);
        f->pub.n_culprits = k;
        sbuf_t b = {0};
        sb_printf(&b, "rank%s ", k > 1 ? "s" : "");
        sb_ranks(&b, tmp, k);
        sb_printf(&b, " %s %s where rank%s ", k > 1 ? "are" : "is",
                  state_names[lo], kp > 1 ? "s" : "");
        sb_ranks(&b, tmp2, kp);
        sb_printf(&b, " %s",
                  hi == ST_COMPLETED ? "completed it" : "started it");
        f->pub.detail = own_str(a, b.s);
        free(b.s);
        (void)ref;
      }
    }
    if (!f && nc > 1 && nmiss == 0 && nnodump == 0 && max_ver > 203) {
      /* all_to_all: total input numel == total output numel */
      const ent_t* e0 = call_ent(a, g, &calls[0], 0);
      if (opclass(a, e0->op) & OPC_A2A && calls[0].hi - calls[0].lo == 1) {
        int64_t ti = 0, to = 0;
        for (size_t i = 0; i < nc; i++) {
          const ent_t* e = call_ent(a, g, &calls[i], 0);
          ti += e->in_numel > 0 ? e->in_numel : 0;
          to += e->out_numel > 0 ? e->out_numel : 0;
        }
        if (ti != to) {
          f = add_finding(a, TR_FRA_ALLTOALL_MISMATCH, gi, calls[0].rank,
                          (int64_t)g->coll[calls[0].pos][calls[0].lo]);
          char t[160];
          snprintf(t, sizeof t,
                   "total input numel %" PRId64
                   " != total output numel %" PRId64
                   " (the culprit cannot be told from the dumps)",
                   ti, to);
          f->pub.detail = own_str(a, t);
        }
      }
    }
    if (!f && nnodump && waiting_state != ST_COMPLETED && !dump_note) {
      size_t k = 0;
      for (size_t m = 0; m < n; m++)
        if (cls[m] == P_NODUMP) tmp[k++] = g->ranks[m];
      f = add_finding(a, TR_FRA_MISSING_DUMP, gi, calls[0].rank,
                      (int64_t)g->coll[calls[0].pos][calls[0].lo]);
      f->pub.culprits = own_ints(a, tmp, k);
      f->pub.n_culprits = k;
      sbuf_t b = {0};
      sb_printf(&b, "rank%s ", k > 1 ? "s" : "");
      sb_ranks(&b, tmp, k);
      sb_printf(&b, " left no dump; the others are in it (%s)",
                state_names[waiting_state]);
      f->pub.detail = own_str(a, b.s);
      free(b.s);
      dump_note = 1;
    }
    if (!f && nc == n && waiting_state != ST_COMPLETED && !all_waiting) {
      int all_same = 1;
      for (size_t i = 0; i < nc; i++)
        if (calls[i].state == ST_COMPLETED) all_same = 0;
      if (all_same) {
        f = add_finding(a, TR_FRA_ALL_WAITING, gi, calls[0].rank,
                        (int64_t)g->coll[calls[0].pos][calls[0].lo]);
        char t[160];
        snprintf(t, sizeof t, "all %zu ranks are in it (%s), none completed", n,
                 state_names[waiting_state]);
        f->pub.detail = own_str(a, t);
        f->t_ref = INT64_MAX - 1; /* informational: last resort verdict */
        all_waiting = 1;
      }
    }
    if (f) {
      f->state = waiting_state;
      int64_t since = 0;
      for (size_t i = 0; i < nc; i++) {
        const ent_t* e = call_ent(a, g, &calls[i], 0);
        int64_t t = e->t_started ? e->t_started : e->t_created;
        if (t && (!since || t < since)) since = t;
      }
      f->pub.since_ns = since;
      if (f->pub.kind != TR_FRA_ALL_WAITING &&
          f->pub.kind != TR_FRA_MISSING_DUMP &&
          ++reported > a->o.mismatch_cap) {
        a->nf--; /* over the cap: not reported */
        char t[300];
        snprintf(t, sizeof t,
                 "Too many mismatches for process_group %s:%s (more than "
                 "%d), stopped matching it",
                 S(a, g->name), S(a, g->desc), a->o.mismatch_cap);
        add_note(a, t);
        break;
      }
    } else if (nmiss == 0) {
      a->n_collectives++;
    }
    for (size_t i = 0; i < nc; i++) cur[calls[i].pos] = calls[i].hi;
  }
  free(cur);
  free(calls);
  free(cls);
  free(tmp);
  free(tmp2);
}

/* send/recv: per (src, dst) pair of global ranks, in order. */
typedef struct {
  int src, dst;
  int64_t* sends; /* entry indices in src's dump */
  size_t ns, cs;
  int64_t* recvs; /* entry indices in dst's dump */
  size_t nr, cr;
} pair_t;

static void push_i64(int64_t** v, size_t* n, size_t* c, int64_t x) {
  if (*n == *c) {
    *c = *c ? *c * 2 : 16;
    *v = realloc(*v, *c * sizeof **v);
    if (!*v) abort();
  }
  (*v)[(*n)++] = x;
}

static void match_p2p(tr_fra_t* a, int gi) {
  group_t* g = &a->g[gi];
  pair_t* pairs = NULL;
  size_t np = 0, cp = 0;
  for (size_t m = 0; m < g->n; m++) {
    int di = a->rank_to_d[g->ranks[m]];
    if (di < 0) continue;
    const rdump_t* d = &a->d[di];
    for (size_t i = 0; i < d->n; i++) {
      const ent_t* e = &d->e[i];
      if (e->group != gi || !e->is_p2p || e->coalesced) continue;
      if (e->op != a->id_send && e->op != a->id_recv) continue;
      if (e->peer_l < 0 || (size_t)e->peer_l >= g->n) continue;
      int peer = g->ranks[e->peer_l];
      int src = e->op == a->id_send ? d->rank : peer;
      int dst = e->op == a->id_send ? peer : d->rank;
      size_t k = 0;
      while (k < np && !(pairs[k].src == src && pairs[k].dst == dst)) k++;
      if (k == np) {
        if (np == cp) {
          cp = cp ? cp * 2 : 8;
          pairs = realloc(pairs, cp * sizeof *pairs);
          if (!pairs) abort();
        }
        memset(&pairs[np], 0, sizeof *pairs);
        pairs[np].src = src;
        pairs[np].dst = dst;
        np++;
      }
      if (e->op == a->id_send)
        push_i64(&pairs[k].sends, &pairs[k].ns, &pairs[k].cs, (int64_t)i);
      else
        push_i64(&pairs[k].recvs, &pairs[k].nr, &pairs[k].cr, (int64_t)i);
    }
  }
  int reported = 0;
  for (size_t k = 0; k < np && reported <= a->o.mismatch_cap; k++) {
    pair_t* p = &pairs[k];
    int ds = p->src <= a->max_rank ? a->rank_to_d[p->src] : -1;
    int dr = p->dst <= a->max_rank ? a->rank_to_d[p->dst] : -1;
    if (ds < 0 || dr < 0) continue; /* no dump: cannot tell */
    const rdump_t* S_ = &a->d[ds];
    const rdump_t* R_ = &a->d[dr];
    /* drop ops older than the partner's ring */
    size_t i0 = 0, j0 = 0;
    if (R_->wrapped)
      while (i0 < p->ns && S_->e[p->sends[i0]].t_created < R_->t_first) i0++;
    if (S_->wrapped)
      while (j0 < p->nr && R_->e[p->recvs[j0]].t_created < S_->t_first) j0++;
    size_t i = i0, j = j0;
    for (; i < p->ns && j < p->nr; i++, j++) {
      const ent_t* se = &S_->e[p->sends[i]];
      const ent_t* re = &R_->e[p->recvs[j]];
      if (se->in_sizes != re->out_sizes) {
        finding_t* f =
            add_finding(a, TR_FRA_P2P_SIZE_MISMATCH, gi, p->src, p->sends[i]);
        int cul[2] = {p->src < p->dst ? p->src : p->dst,
                      p->src < p->dst ? p->dst : p->src};
        f->pub.culprits = own_ints(a, cul, 2);
        f->pub.n_culprits = 2;
        sbuf_t b = {0};
        sb_printf(&b, "rank %d sends %s to rank %d, which receives %s", p->src,
                  S(a, se->in_sizes), p->dst, S(a, re->out_sizes));
        f->pub.detail = own_str(a, b.s);
        free(b.s);
        f->state = se->state;
        f->pub.since_ns = se->t_started ? se->t_started : se->t_created;
        reported++;
        break;
      }
    }
    if (i < p->ns && j >= p->nr) {
      const ent_t* se = &S_->e[p->sends[i]];
      finding_t* f =
          add_finding(a, TR_FRA_SEND_NO_RECV, gi, p->src, p->sends[i]);
      f->pub.culprits = own_ints(a, &p->dst, 1);
      f->pub.n_culprits = 1;
      f->pub.missing = f->pub.culprits;
      f->pub.n_missing = 1;
      sbuf_t b = {0};
      sb_printf(&b,
                "rank %d sends %s to rank %d (%s), which never posted the "
                "matching recv (%zu send%s, %zu recv%s recorded)",
                p->src, S(a, se->in_sizes), p->dst, state_names[se->state],
                p->ns - i0, p->ns - i0 == 1 ? "" : "s", p->nr - j0,
                p->nr - j0 == 1 ? "" : "s");
      f->pub.detail = own_str(a, b.s);
      free(b.s);
      f->state = se->state;
      f->pub.since_ns = se->t_started ? se->t_started : se->t_created;
      reported++;
    } else if (j < p->nr && i >= p->ns) {
      const ent_t* re = &R_->e[p->recvs[j]];
      finding_t* f =
          add_finding(a, TR_FRA_RECV_NO_SEND, gi, p->dst, p->recvs[j]);
      f->pub.culprits = own_ints(a, &p->src, 1);
      f->pub.n_culprits = 1;
      f->pub.missing = f->pub.culprits;
      f->pub.n_missing = 1;
      sbuf_t b = {0};
      sb_printf(&b,
                "rank %d waits to receive %s from rank %d (%s), which never "
                "posted the matching send",
                p->dst, S(a, re->out_sizes), p->src, state_names[re->state]);
      f->pub.detail = own_str(a, b.s);
      free(b.s);
      f->state = re->state;
      f->pub.since_ns = re->t_started ? re->t_started : re->t_created;
      reported++;
    }
  }
  for (size_t k = 0; k < np; k++) {
    free(pairs[k].sends);
    free(pairs[k].recvs);
  }
  free(pairs);
}

/* -------------------------------------------------------------- verdict */

static void pg_label(const tr_fra_t* a, const tr_fra_finding_t* f, sbuf_t* b) {
  if (strcmp(f->pg_desc, "undefined") != 0 && f->pg_desc[0] &&
      strcmp(f->pg_desc, f->pg_name) != 0)
    sb_printf(b, "pg '%s' (%s) [ranks ", f->pg_desc, f->pg_name);
  else
    sb_printf(b, "pg '%s' [ranks ", f->pg_name);
  sb_ranks(b, f->pg_ranks, f->pg_size);
  sb_puts(b, "]");
  (void)a;
}

static void ent_label(const tr_fra_t* a, const ent_t* e, sbuf_t* b,
                      int with_pg) {
  sb_printf(b, "%s #%" PRId64, S(a, e->op), e->is_p2p ? e->p2p_seq : e->seq);
  if (with_pg) {
    const group_t* g = &a->g[e->group];
    const char* desc = S(a, g->desc);
    sb_printf(b, " on pg '%s'",
              strcmp(desc, "undefined") != 0 && desc[0] ? desc : S(a, g->name));
  }
}

/* "rank 5's last completed op was X at T, and its last entry is Y (state
 * since T)" */
static void last_ops(const tr_fra_t* a, int rank, sbuf_t* b) {
  if (rank < 0 || rank > a->max_rank || a->rank_to_d[rank] < 0) {
    sb_printf(b, "rank %d left no dump", rank);
    return;
  }
  const rdump_t* d = &a->d[a->rank_to_d[rank]];
  if (d->n == 0) {
    sb_printf(b, "rank %d recorded no collective", rank);
    return;
  }
  ssize_t lc = -1;
  for (size_t i = d->n; i-- > 0;)
    if (d->e[i].state == ST_COMPLETED) {
      lc = (ssize_t)i;
      break;
    }
  if (lc >= 0) {
    sb_printf(b, "rank %d's last completed op was ", rank);
    ent_label(a, &d->e[lc], b, 1);
    int64_t t =
        d->e[lc].t_completed ? d->e[lc].t_completed : d->e[lc].t_created;
    if (t) {
      sb_puts(b, " at ");
      sb_time(b, t);
    }
  } else {
    sb_printf(b, "rank %d completed no recorded op", rank);
  }
  if ((size_t)(lc + 1) < d->n) {
    const ent_t* e = &d->e[d->n - 1];
    sb_puts(b, lc >= 0 ? ", and its last entry is " : "; its last entry is ");
    ent_label(a, e, b, 1);
    int64_t t = e->t_started ? e->t_started : e->t_created;
    sb_printf(b, " (%s", state_names[e->state]);
    if (t) {
      sb_puts(b, " since ");
      sb_time(b, t);
    }
    sb_puts(b, ")");
  }
}

static void since_text(const tr_fra_t* a, int64_t since, sbuf_t* b) {
  if (!since) return;
  sb_puts(b, " since ");
  sb_time(b, since);
  if (a->t_max - since >= 1000000000) {
    sb_puts(b, " (");
    sb_duration(b, a->t_max - since);
    sb_puts(b, " before the last recorded event)");
  }
}

static size_t others(const tr_fra_t* a, const tr_fra_finding_t* f, sbuf_t* b) {
  int* o = malloc((f->pg_size ? f->pg_size : 1) * sizeof *o);
  size_t k = 0;
  for (size_t i = 0; i < f->pg_size; i++) {
    int r = f->pg_ranks[i], c = 0;
    for (size_t j = 0; j < f->n_culprits; j++)
      if (f->culprits[j] == r) c = 1;
    /* only ranks whose dumps say where they are */
    if (!c && r <= a->max_rank && a->rank_to_d[r] >= 0) o[k++] = r;
  }
  sb_printf(b, "rank%s ", k == 1 ? "" : "s");
  sb_ranks(b, o, k);
  free(o);
  return k;
}

static void culprit_text(const tr_fra_finding_t* f, sbuf_t* b) {
  sb_printf(b, "rank%s ", f->n_culprits == 1 ? "" : "s");
  sb_ranks(b, f->culprits, f->n_culprits);
}

static void build_verdict(tr_fra_t* a) {
  sbuf_t b = {0};
  /* primary: the earliest problem in time; informational ones last */
  int p = -1;
  for (size_t i = 0; i < a->nf; i++) {
    if (p < 0 || a->f[i].t_ref < a->f[p].t_ref) p = (int)i;
  }
  a->primary = p;
  if (p < 0) {
    sb_printf(&b,
              "no divergence found: %zu collective%s matched on %zu process "
              "group%s over %zu rank%s, every recorded send has its recv, "
              "and nothing is left waiting",
              a->n_collectives, a->n_collectives == 1 ? "" : "s", a->ng,
              a->ng == 1 ? "" : "s", a->nd, a->nd == 1 ? "" : "s");
    a->verdict = b.s;
    return;
  }
  const finding_t* F = &a->f[p];
  const tr_fra_finding_t* f = &F->pub;
  const ent_t* ref = NULL;
  if (F->ref_rank >= 0 && F->ref_ent >= 0)
    ref = &a->d[a->rank_to_d[F->ref_rank]].e[F->ref_ent];
  int c0 = f->n_culprits ? f->culprits[0] : -1;
  switch (f->kind) {
    case TR_FRA_NOT_JOINED:
      culprit_text(f, &b);
      sb_printf(&b, " never entered %s #%" PRId64 " on ", f->op, f->seq);
      pg_label(a, f, &b);
      sb_puts(&b, "; ");
      {
        size_t k = others(a, f, &b);
        sb_printf(&b, " %s",
                  F->state == ST_COMPLETED ? "completed it"
                  : k == 1                 ? "waits in it"
                                           : "wait in it");
      }
      if (F->state != ST_COMPLETED) since_text(a, f->since_ns, &b);
      sb_puts(&b, "; ");
      last_ops(a, c0, &b);
      break;
    case TR_FRA_TYPE_MISMATCH:
    case TR_FRA_SIZE_MISMATCH:
    case TR_FRA_DTYPE_MISMATCH:
      sb_printf(&b, "%s #%" PRId64 " on ", f->op, f->seq);
      pg_label(a, f, &b);
      sb_printf(&b, " does not match across ranks (%s): %s; ", f->kind_name,
                f->detail);
      culprit_text(f, &b);
      sb_printf(&b, " %s the odd one out", f->n_culprits == 1 ? "is" : "are");
      if (F->state != ST_COMPLETED) {
        sb_puts(&b, ", and the group waits in it");
        since_text(a, f->since_ns, &b);
      }
      sb_puts(&b, "; ");
      last_ops(a, c0, &b);
      break;
    case TR_FRA_STATE_MISMATCH:
      culprit_text(f, &b);
      sb_printf(&b, " %s stuck in %s #%" PRId64 " on ",
                f->n_culprits == 1 ? "is" : "are", f->op, f->seq);
      pg_label(a, f, &b);
      sb_printf(&b, " (%s", f->detail);
      if (ref && ref->t_started) {
        sb_puts(&b, "; started ");
        sb_time(&b, ref->t_started);
      }
      sb_puts(&b, ")");
      {
        /* where the others are now */
        int o = -1;
        for (size_t i = 0; i < f->pg_size && o < 0; i++) {
          int r = f->pg_ranks[i], c = 0;
          for (size_t j = 0; j < f->n_culprits; j++)
            if (f->culprits[j] == r) c = 1;
          if (!c && a->rank_to_d[r] >= 0) o = r;
        }
        if (o >= 0) {
          const rdump_t* d = &a->d[a->rank_to_d[o]];
          const ent_t* e = d->n ? &d->e[d->n - 1] : NULL;
          if (e && e->state != ST_COMPLETED) {
            sb_puts(&b, "; ");
            sb_puts(&b,
                    others(a, f, &b) == 1 ? " now waits in " : " now wait in ");
            ent_label(a, e, &b, 1);
            since_text(a, e->t_started ? e->t_started : e->t_created, &b);
          }
        }
      }
      sb_puts(&b, "; ");
      last_ops(a, c0, &b);
      break;
    case TR_FRA_SEND_NO_RECV:
    case TR_FRA_RECV_NO_SEND:
    case TR_FRA_P2P_SIZE_MISMATCH:
      sb_printf(&b, "%s on ", f->detail);
      pg_label(a, f, &b);
      sb_printf(&b, " (%s #%" PRId64 ")", f->op, f->seq);
      if (F->state != ST_COMPLETED) {
        sb_puts(&b, "; it waits");
        since_text(a, f->since_ns, &b);
      }
      sb_puts(&b, "; ");
      last_ops(a, c0, &b);
      break;
    case TR_FRA_ALLTOALL_MISMATCH:
      sb_printf(&b, "%s #%" PRId64 " on ", f->op, f->seq);
      pg_label(a, f, &b);
      sb_printf(&b, ": %s", f->detail);
      break;
    case TR_FRA_MISSING_DUMP:
      culprit_text(f, &b);
      sb_puts(&b,
              " left no dump (killed, or crashed before its ring could "
              "be read) and ");
      sb_puts(&b, f->n_culprits == 1 ? "is" : "are");
      sb_puts(&b, " the likely culprit");
      if (f->op[0]) {
        sb_puts(&b, ": ");
        sb_printf(&b, " %s in %s #%" PRId64 " on ",
                  others(a, f, &b) == 1 ? "waits" : "wait", f->op, f->seq);
        pg_label(a, f, &b);
        since_text(a, f->since_ns, &b);
      }
      break;
    case TR_FRA_ALL_WAITING:
      sb_printf(&b, "all %zu ranks of ", f->pg_size);
      pg_label(a, f, &b);
      sb_printf(&b, " entered %s #%" PRId64 " and none completed it", f->op,
                f->seq);
      since_text(a, f->since_ns, &b);
      sb_puts(&b,
              "; the calls match and no rank is missing, so look below "
              "the collective order: the network, the transport "
              "(NCCL/Gloo) or a device");
      break;
  }
  if (ref && ref->frames >= 0 && f->kind != TR_FRA_ALL_WAITING) {
    const char* fr = S(a, ref->frames);
    const char* nl = strchr(fr, '\n');
    sb_printf(&b, "; called from %.*s", nl ? (int)(nl - fr) : (int)strlen(fr),
              fr);
  }
  size_t real = 0;
  for (size_t i = 0; i < a->nf; i++)
    if (a->f[i].pub.kind != TR_FRA_ALL_WAITING) real++;
  if (real > 1)
    sb_printf(&b, " (%zu findings in all; this is the earliest)", real);
  a->verdict = b.s;
}

int tr_fra_analyze(tr_fra_t* a, tr_errmsg_t* err) {
  /* distribute collective entries to (group, member) lists */
  for (size_t gi = 0; gi < a->ng; gi++) {
    group_t* g = &a->g[gi];
    g->coll = calloc(g->n ? g->n : 1, sizeof *g->coll);
    g->ncoll = calloc(g->n ? g->n : 1, sizeof *g->ncoll);
    g->ccap = calloc(g->n ? g->n : 1, sizeof *g->ccap);
    if (!g->coll || !g->ncoll || !g->ccap) abort();
  }
  for (size_t di = 0; di < a->nd; di++) {
    rdump_t* d = &a->d[di];
    for (size_t i = 0; i < d->n; i++) {
      ent_t* e = &d->e[i];
      if (e->is_p2p || e->seq < 0) continue;
      group_t* g = &a->g[e->group];
      int* pos = bsearch(&d->rank, g->ranks, g->n, sizeof(int), cmp_int);
      if (!pos) continue; /* not a member by its own pg_config */
      size_t m = (size_t)(pos - g->ranks);
      if (g->ncoll[m] == g->ccap[m]) {
        g->ccap[m] = g->ccap[m] ? g->ccap[m] * 2 : 64;
        g->coll[m] = realloc(g->coll[m], g->ccap[m] * sizeof **g->coll);
        if (!g->coll[m]) abort();
      }
      g->coll[m][g->ncoll[m]++] = (uint32_t)i;
    }
  }
  /* missing dumps */
  int* miss = NULL;
  size_t nmiss = 0;
  for (size_t gi = 0; gi < a->ng; gi++)
    for (size_t k = 0; k < a->g[gi].n; k++) {
      int r = a->g[gi].ranks[k];
      if (a->rank_to_d[r] >= 0) continue;
      size_t j = 0;
      while (j < nmiss && miss[j] != r) j++;
      if (j == nmiss) {
        miss = realloc(miss, (nmiss + 1) * sizeof *miss);
        if (!miss) abort();
        miss[nmiss++] = r;
      }
    }
  if (nmiss) qsort(miss, nmiss, sizeof *miss, cmp_int);
  a->missing = miss;
  a->nmissing = nmiss;
  int rc = 0;
  if (nmiss && !a->o.allow_incomplete_ranks) {
    /* torchfrtrace refuses; say which ranks, in the largest group */
    int best = -1;
    for (size_t gi = 0; gi < a->ng; gi++)
      if (best < 0 || a->g[gi].n > a->g[best].n) best = (int)gi;
    finding_t* f = add_finding(a, TR_FRA_MISSING_DUMP, best, -1, -1);
    f->pub.culprits = own_ints(a, miss, nmiss);
    f->pub.n_culprits = nmiss;
    sbuf_t b = {0};
    sb_puts(&b, "missing dump files from ranks ");
    sb_ranks(&b, miss, nmiss);
    f->pub.detail = own_str(a, b.s);
    rc = tr_errmsg_set(err, TR_ENOTFOUND,
                       "%s in '%s'; pass --allow-incomplete-ranks for a "
                       "best-effort analysis",
                       b.s, a->dir);
    free(b.s);
  } else {
    for (size_t gi = 0; gi < a->ng; gi++) {
      match_group(a, (int)gi);
      match_p2p(a, (int)gi);
    }
  }
  a->notes = a->notes_b.s;
  build_verdict(a);
  return rc < 0 ? rc : (int)a->nf;
}

/* --------------------------------------------------------------- output */

size_t tr_fra_n_findings(const tr_fra_t* a) { return a->nf; }

const tr_fra_finding_t* tr_fra_finding(const tr_fra_t* a, size_t i) {
  return i < a->nf ? &a->f[i].pub : NULL;
}

int tr_fra_primary(const tr_fra_t* a) { return a->primary; }

const char* tr_fra_verdict(const tr_fra_t* a) {
  return a->verdict ? a->verdict : "";
}

const int* tr_fra_ranks(const tr_fra_t* a, size_t* n) {
  *n = a->nd;
  return a->ranks;
}

size_t tr_fra_n_entries(const tr_fra_t* a) { return a->n_entries; }

static void print_ranks_set(FILE* out, const int* r, size_t n) {
  fputc('{', out);
  for (size_t i = 0; i < n; i++) fprintf(out, i ? ", %d" : "%d", r[i]);
  fputc('}', out);
}

void tr_fra_print_report(const tr_fra_t* a, FILE* out) {
  if (a->mixed_versions)
    fprintf(out, "warning: the dumps have different versions\n");
  for (size_t i = 0; i < a->nf; i++) {
    const finding_t* F = &a->f[i];
    const tr_fra_finding_t* f = &F->pub;
    switch (f->kind) {
      case TR_FRA_NOT_JOINED:
        fprintf(out,
                "Not all ranks joining collective, sequence number: %" PRId64
                "\n",
                f->seq);
        break;
      case TR_FRA_ALLTOALL_MISMATCH:
        fprintf(out,
                "Input/output mismatch in the collective sequence "
                "number: %" PRId64 "\n",
                f->seq);
        break;
      case TR_FRA_SEND_NO_RECV:
      case TR_FRA_RECV_NO_SEND:
      case TR_FRA_P2P_SIZE_MISMATCH:
        fprintf(out,
                "Point-to-point op without a matching partner, p2p "
                "sequence number: %" PRId64 "\n",
                f->seq);
        break;
      case TR_FRA_MISSING_DUMP:
        fprintf(out,
                "Missing dumps: we cannot decide what's wrong with this "
                "collective entry because FR dumps from ranks ");
        print_ranks_set(out, f->culprits, f->n_culprits);
        fprintf(out, " are missing\n");
        break;
      case TR_FRA_ALL_WAITING:
        fprintf(out,
                "All ranks waiting in collective, sequence number: %" PRId64
                "\n",
                f->seq);
        break;
      default:
        fprintf(out, "Collective sequence number: %" PRId64 " has errors\n",
                f->seq);
    }
    if (f->record_id >= 0)
      fprintf(out, "internal record id: %" PRId64 "\n", f->record_id);
    if (f->pg_name[0])
      fprintf(out, "group info: %s%s%s\n", f->pg_name,
              strcmp(f->pg_desc, "undefined") ? ":" : "",
              strcmp(f->pg_desc, "undefined") ? f->pg_desc : "");
    if (f->profiling_name[0])
      fprintf(out, "collective: %s\n", f->profiling_name);
    if (f->n_missing) {
      fprintf(out, "missing ranks: ");
      print_ranks_set(out, f->missing, f->n_missing);
      fputc('\n', out);
    }
    if (F->ref_rank >= 0 && F->ref_ent >= 0) {
      const ent_t* e = &a->d[a->rank_to_d[F->ref_rank]].e[F->ref_ent];
      fprintf(out, "input sizes: %s\noutput sizes: %s\n", S(a, e->in_sizes),
              S(a, e->out_sizes));
    }
    if (f->pg_size) {
      fprintf(out, "world size: %zu\nexpected ranks: ", f->pg_size);
      print_ranks_set(out, f->pg_ranks, f->pg_size);
      fputc('\n', out);
    }
    if (F->state >= 0)
      fprintf(out, "collective state: %s\n", state_names[F->state]);
    if (f->n_culprits && f->kind != TR_FRA_NOT_JOINED) {
      fprintf(out, "error msg: ");
      for (size_t j = 0; j < f->n_culprits; j++)
        fprintf(out, "%sCulprit rank %d; Error type: %s", j ? ", " : "",
                f->culprits[j], f->kind_name);
      fputc('\n', out);
    }
    fprintf(out, "detail: %s\n", f->detail);
    if (F->ref_rank >= 0 && F->ref_ent >= 0) {
      const ent_t* e = &a->d[a->rank_to_d[F->ref_rank]].e[F->ref_ent];
      if (e->frames >= 0)
        fprintf(out, "collective stack trace: \n %s\n", S(a, e->frames));
    }
    fputc('\n', out);
  }
  if (a->notes && a->notes[0]) fputs(a->notes, out);
  fprintf(out,
          "summary: %zu rank%s, %zu entries, %zu process group%s, %zu "
          "matched collective%s, %zu finding%s",
          a->nd, a->nd == 1 ? "" : "s", a->n_entries, a->ng,
          a->ng == 1 ? "" : "s", a->n_collectives,
          a->n_collectives == 1 ? "" : "s", a->nf, a->nf == 1 ? "" : "s");
  if (a->nmissing) {
    fprintf(out, "; no dump from rank%s ", a->nmissing == 1 ? "" : "s");
    sbuf_t b = {0};
    sb_ranks(&b, a->missing, a->nmissing);
    fputs(b.s, out);
    free(b.s);
  }
  fprintf(out, "\nverdict: %s\n", tr_fra_verdict(a));
}

/* ---- -j ---- */

static int selected(const tr_fra_t* a, int rank) {
  if (!a->o.selected_ranks) return 1;
  for (size_t i = 0; i < a->o.n_selected_ranks; i++)
    if (a->o.selected_ranks[i] == rank) return 1;
  return 0;
}

static int pg_passes(const tr_fra_t* a, const ent_t* e) {
  if (!a->o.pg_filters) return 1;
  const group_t* g = &a->g[e->group];
  for (size_t i = 0; i < a->o.n_pg_filters; i++)
    if (strcmp(a->o.pg_filters[i], S(a, g->name)) == 0 ||
        strcmp(a->o.pg_filters[i], S(a, g->desc)) == 0)
      return 1;
  return 0;
}

static void op_repr(const tr_fra_t* a, const ent_t* e, sbuf_t* b) {
  const group_t* g = &a->g[e->group];
  sb_printf(b, "%s(", S(a, e->op));
  if (e->op == a->id_send || e->op == a->id_recv) {
    int s = -1, d = -1;
    int sl = e->op == a->id_send ? e->self_l : e->peer_l;
    int dl = e->op == a->id_send ? e->peer_l : e->self_l;
    if (sl >= 0 && (size_t)sl < g->n) s = g->ranks[sl];
    if (dl >= 0 && (size_t)dl < g->n) d = g->ranks[dl];
    sb_printf(b, "s=%d d=%d, ", s, d);
  }
  if (a->o.verbose) {
    sb_printf(b,
              "timestamp_created=%" PRId64
              ", input_sizes=%s, "
              "output_sizes=%s, input_dtypes=%s, output_dtypes=%s, "
              "collective_seq_id | p2p_seq_id=%" PRId64
              ", pg_name=%s, "
              "pg_description=%s, pg_size=%zu, state=%s)",
              e->t_created, S(a, e->in_sizes), S(a, e->out_sizes),
              S(a, e->in_dt), S(a, e->out_dt), e->is_p2p ? e->p2p_seq : e->seq,
              S(a, g->name), S(a, g->desc), g->n, state_names[e->state]);
  } else {
    sb_printf(b, "input_sizes=%s, state=%s)", S(a, e->in_sizes),
              state_names[e->state]);
  }
}

void tr_fra_print_entries(const tr_fra_t* a, FILE* out) {
  /* torchfrtrace's align_trace_from_beginning */
  int64_t start = 0;
  for (size_t i = 0; i < a->nd; i++)
    if (a->d[i].n && a->d[i].e[0].record_id > start)
      start = a->d[i].e[0].record_id;
  size_t nc = 0;
  size_t* col = malloc((a->nd ? a->nd : 1) * sizeof *col);
  size_t* cur = malloc((a->nd ? a->nd : 1) * sizeof *cur);
  size_t* w = malloc((a->nd ? a->nd : 1) * sizeof *w);
  if (!col || !cur || !w) abort();
  for (size_t i = 0; i < a->nd; i++) {
    if (!selected(a, a->d[i].rank)) continue;
    col[nc] = i;
    size_t k = 0;
    while (k < a->d[i].n && a->d[i].e[k].record_id < start) k++;
    cur[nc] = k;
    char t[32];
    w[nc] = (size_t)snprintf(t, sizeof t, "Rank %d", a->d[i].rank);
    nc++;
  }
  /* widths */
  sbuf_t b = {0};
  for (size_t c = 0; c < nc; c++) {
    const rdump_t* d = &a->d[col[c]];
    for (size_t k = cur[c]; k < d->n; k++) {
      if (!pg_passes(a, &d->e[k])) continue;
      b.n = 0;
      op_repr(a, &d->e[k], &b);
      if (b.n > w[c]) w[c] = b.n;
    }
  }
  {
    sbuf_t h = {0};
    for (size_t c = 0; c < nc; c++) {
      char t[32];
      snprintf(t, sizeof t, "Rank %d", a->d[col[c]].rank);
      sb_printf(&h, "%s%-*s", c ? "  " : "", (int)w[c], t);
    }
    while (h.n && h.s[h.n - 1] == ' ') h.s[--h.n] = '\0';
    fprintf(out, "%s\n", h.s ? h.s : "");
    free(h.s);
  }
  for (size_t c = 0; c < nc; c++) {
    fprintf(out, "%s", c ? "  " : "");
    for (size_t k = 0; k < w[c]; k++) fputc('-', out);
  }
  fputc('\n', out);
  for (;;) {
    int progress = 0;
    sbuf_t line = {0};
    for (size_t c = 0; c < nc; c++) {
      const rdump_t* d = &a->d[col[c]];
      b.n = 0;
      sb_add(&b, "", 0);
      if (cur[c] < d->n) {
        const ent_t* e = &d->e[cur[c]++];
        if (pg_passes(a, e)) op_repr(a, e, &b);
        progress = 1;
      }
      sb_printf(&line, "%s%-*s", c ? "  " : "", (int)w[c], b.s);
    }
    if (progress) {
      /* strip trailing blanks */
      while (line.n && line.s[line.n - 1] == ' ') line.s[--line.n] = '\0';
      fprintf(out, "%s\n", line.s ? line.s : "");
    }
    free(line.s);
    if (!progress) break;
  }
  free(b.s);
  free(col);
  free(cur);
  free(w);
}

/* ---- --json ---- */

static json_t* ints_json(const int* r, size_t n) {
  json_t* j = json_array();
  for (size_t i = 0; i < n; i++) json_array_append_new(j, json_integer(r[i]));
  return j;
}

json_t* tr_fra_to_json(const tr_fra_t* a) {
  json_t* o = json_object();
  json_object_set_new(o, "version", json_string(a->nd ? a->d[0].version : ""));
  json_object_set_new(o, "ranks", ints_json(a->ranks, a->nd));
  json_object_set_new(o, "missing_dumps", ints_json(a->missing, a->nmissing));
  json_object_set_new(o, "entries", json_integer((json_int_t)a->n_entries));
  json_object_set_new(o, "matched_collectives",
                      json_integer((json_int_t)a->n_collectives));
  json_t* dumps = json_array();
  for (size_t i = 0; i < a->nd; i++)
    json_array_append_new(
        dumps,
        json_pack("{s:i, s:s, s:s, s:I, s:b}", "rank", a->d[i].rank, "file",
                  a->d[i].path, "version", a->d[i].version, "entries",
                  (json_int_t)a->d[i].n, "wrapped", a->d[i].wrapped));
  json_object_set_new(o, "dumps", dumps);
  json_t* groups = json_array();
  for (size_t i = 0; i < a->ng; i++)
    json_array_append_new(
        groups, json_pack("{s:s, s:s, s:o, s:b}", "name", S(a, a->g[i].name),
                          "desc", S(a, a->g[i].desc), "ranks",
                          ints_json(a->g[i].ranks, a->g[i].n), "inferred",
                          a->g[i].inferred));
  json_object_set_new(o, "groups", groups);
  json_t* fs = json_array();
  for (size_t i = 0; i < a->nf; i++) {
    const finding_t* F = &a->f[i];
    const tr_fra_finding_t* f = &F->pub;
    json_t* j = json_pack(
        "{s:s, s:s, s:s, s:o, s:I, s:I, s:s, s:s, s:o, s:o, s:s}", "kind",
        f->kind_name, "pg_name", f->pg_name, "pg_desc", f->pg_desc, "pg_ranks",
        ints_json(f->pg_ranks, f->pg_size), "seq", (json_int_t)f->seq,
        "record_id", (json_int_t)f->record_id, "op", f->op, "profiling_name",
        f->profiling_name, "culprits", ints_json(f->culprits, f->n_culprits),
        "missing_ranks", ints_json(f->missing, f->n_missing), "detail",
        f->detail);
    if (F->state >= 0)
      json_object_set_new(j, "state", json_string(state_names[F->state]));
    if (f->since_ns)
      json_object_set_new(j, "since_ns", json_integer((json_int_t)f->since_ns));
    if (F->ref_rank >= 0 && F->ref_ent >= 0) {
      const ent_t* e = &a->d[a->rank_to_d[F->ref_rank]].e[F->ref_ent];
      json_object_set_new(j, "input_sizes", json_string(S(a, e->in_sizes)));
      json_object_set_new(j, "output_sizes", json_string(S(a, e->out_sizes)));
    }
    json_array_append_new(fs, j);
  }
  json_object_set_new(o, "findings", fs);
  json_object_set_new(o, "primary", json_integer(a->primary));
  json_object_set_new(o, "verdict", json_string(tr_fra_verdict(a)));
  return o;
}

void tr_fra_print_json(const tr_fra_t* a, FILE* out) {
  json_t* j = tr_fra_to_json(a);
  char* s = j ? json_dumps(j, JSON_INDENT(2)) : NULL;
  if (s) fprintf(out, "%s\n", s);
  free(s);
  json_decref(j);
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
    group_t* g = &a->g[i];
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
  free(a->notes_b.s);
  free(a->dir);
  intern_release(&a->in);
  free(a->pn);
  free(a->opc);
  tr__arena_release(&a->arena);
  free(a);
}
