/* flight_recorder/match.c: the analyzer's matching -- group each rank's
 * collectives by process group, align them by sequence number, pair
 * send/recv by peer, and turn what disagrees into findings
 * (tr_fra_analyze).
 *
 * The checks are torchfrtrace's (fr_trace.py, components/types.py
 * Op.match); the alignment differs on purpose: instead of dropping every
 * entry whose record_id is below the largest first record_id of any rank
 * (which loses matches when ranks record different numbers of entries), a
 * rank counts as missing from collective #s only when its ring shows it
 * never got that far; a sequence number older than its ring is "unknown".
 * The -j table (output.c) keeps torchfrtrace's record_id alignment.
 */
#include "config.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/buf.h"
#include "flight_recorder/internal.h"
#include "trainrun/error.h"
#include "trainrun/fr_analyze.h"

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
    size_t old = a->opc_cap;
    if (TR_GROW(a->opc, (size_t)op + 1, a->opc_cap) < 0) {
      a->oom = 1;
      return 0;
    }
    memset(a->opc + old, 0xff, a->opc_cap - old);
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

/* ------------------------------------------------------------- findings */

/* Memory the findings point to lives until tr_fra_free: p, or NULL (p
 * freed, a->oom set) when it cannot be recorded. */
static void* own(tr_fra_t* a, void* p) {
  if (p && TR_GROW(a->owned, a->nowned + 1, a->owncap) == 0) {
    a->owned[a->nowned++] = p;
    return p;
  }
  free(p);
  a->oom = 1;
  return NULL;
}

static const int* own_ints(tr_fra_t* a, const int* r, size_t n) {
  int* c = malloc((n ? n : 1) * sizeof *c);
  if (c && n) memcpy(c, r, n * sizeof *c);
  return own(a, c);
}

/* The text built in b, which is emptied. */
static const char* own_text(tr_fra_t* a, tr__buf_t* b) {
  const char* s = own(a, tr__buf_detach(b, NULL));
  return s ? s : "";
}

static const char* own_str(tr_fra_t* a, const char* s) {
  const char* c = own(a, strdup(s));
  return c ? c : "";
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

/* A new finding; when it cannot be stored (a->oom set), a scratch one that
 * is never reported, so that callers fill it in without checking. */
static tr__fra_finding_t* add_finding(tr_fra_t* a, tr_fra_kind_t kind, int gi,
                                      int ref_rank, int64_t ref_ent) {
  tr__fra_finding_t* f = &a->spill;
  if (TR_GROW(a->f, a->nf + 1, a->fcap) == 0)
    f = &a->f[a->nf++];
  else
    a->oom = 1;
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
    tr__fra_group_t* g = &a->g[gi];
    f->pub.pg_name = tr__fra_str(a, g->name);
    f->pub.pg_desc = tr__fra_str(a, g->desc);
    f->pub.pg_ranks = g->ranks;
    f->pub.pg_size = g->n;
  } else {
    f->pub.pg_name = f->pub.pg_desc = "";
  }
  f->ref_rank = ref_rank;
  f->ref_ent = ref_ent;
  if (ref_rank >= 0 && ref_ent >= 0) {
    const tr__fra_ent_t* e = &a->d[a->rank_to_d[ref_rank]].e[ref_ent];
    f->pub.seq = e->is_p2p ? e->p2p_seq : e->seq;
    f->pub.record_id = e->record_id;
    f->pub.op = tr__fra_str(a, e->op);
    f->pub.profiling_name = tr__fra_str(a, e->pname);
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

static const tr__fra_ent_t* call_ent(const tr_fra_t* a,
                                     const tr__fra_group_t* g, const call_t* c,
                                     size_t k) {
  const tr__fra_dump_t* d = &a->d[a->rank_to_d[c->rank]];
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

static size_t minority(tr_fra_t* a, const call_t* c, size_t n, size_t off,
                       int* out, int* ref_idx) {
  *ref_idx = 0;
  size_t i = 1;
  uint64_t s0 = sig_at(&c[0], off);
  while (i < n && sig_at(&c[i], off) == s0) i++;
  if (i == n) return 0; /* all equal: the common case, O(n) */
  sigidx_t* v = malloc(n * sizeof *v);
  if (!v) {
    a->oom = 1;
    return 0;
  }
  for (i = 0; i < n; i++) {
    v[i].sig = sig_at(&c[i], off);
    v[i].idx = i;
  }
  qsort(v, n, sizeof *v, cmp_sigidx);
  /* the largest class; ties go to the class holding the lowest index */
  size_t best_len = 0, best_first = 0;
  for (size_t x = 0; x < n;) {
    size_t y = x, lowest = v[x].idx;
    while (y < n && v[y].sig == v[x].sig) {
      if (v[y].idx < lowest) lowest = v[y].idx;
      y++;
    }
    if (y - x > best_len || (y - x == best_len && lowest < best_first)) {
      best_len = y - x;
      best_first = lowest;
    }
    x = y;
  }
  free(v);
  uint64_t s = sig_at(&c[best_first], off);
  size_t k = 0;
  for (i = 0; i < n; i++)
    if (sig_at(&c[i], off) != s) out[k++] = c[i].rank;
  *ref_idx = (int)best_first;
  return k;
}

static void describe_call(const tr_fra_t* a, const tr__fra_group_t* g,
                          const call_t* c, int what, tr__buf_t* b) {
  size_t n = c->hi - c->lo;
  const tr__fra_ent_t* e = call_ent(a, g, c, 0);
  if (what == 0) {
    tr__buf_addstr(b, tr__fra_str(a, e->op));
    if (n > 1) tr__buf_addf(b, " (coalesced, %zu ops)", n);
  } else if (what == 1) {
    tr__buf_addf(b, "input sizes %s, output sizes %s",
                 tr__fra_str(a, e->in_sizes), tr__fra_str(a, e->out_sizes));
  } else if (what == 2) {
    tr__buf_addf(b, "dtypes %s -> %s", tr__fra_str(a, e->in_dt),
                 tr__fra_str(a, e->out_dt));
  } else {
    tr__buf_addstr(b, tr__fra_state_names[c->state]);
  }
}

/* One finding for the mismatching classes of a signature. */
static tr__fra_finding_t* sig_finding(tr_fra_t* a, int gi, call_t* c, size_t n,
                                      size_t off, tr_fra_kind_t kind,
                                      int what) {
  int* cul = malloc(n * sizeof *cul);
  int* maj = malloc(n * sizeof *maj);
  int ref;
  size_t k = cul && maj ? minority(a, c, n, off, cul, &ref) : 0;
  if (k == 0) {
    if (!cul || !maj) a->oom = 1;
    free(cul);
    free(maj);
    return NULL;
  }
  tr__fra_group_t* g = &a->g[gi];
  tr__fra_finding_t* f = add_finding(a, kind, gi, c[ref].rank,
                                     (int64_t)g->coll[c[ref].pos][c[ref].lo]);
  f->pub.culprits = own_ints(a, cul, k);
  f->pub.n_culprits = k;
  tr__buf_t b = TR__BUF_INIT;
  /* "rank 2 has X where ranks 0,1,3 have Y" */
  size_t nm = 0;
  uint64_t s = sig_at(&c[ref], off);
  for (size_t i = 0; i < n; i++)
    if (sig_at(&c[i], off) == s) maj[nm++] = c[i].rank;
  for (size_t i = 0, shown = 0; i < n && shown < 3; i++) {
    if (sig_at(&c[i], off) == s) continue;
    if (shown++) tr__buf_addstr(&b, "; ");
    tr__buf_addf(&b, "rank %d has ", c[i].rank);
    describe_call(a, g, &c[i], what, &b);
  }
  tr__buf_addf(&b, " where rank%s ", nm > 1 ? "s" : "");
  tr__fra_add_ranks(&b, maj, nm);
  tr__buf_addstr(&b, nm > 1 ? " have " : " has ");
  describe_call(a, g, &c[ref], what, &b);
  f->pub.detail = own_text(a, &b);
  free(maj);
  free(cul);
  return f;
}

/* Per-entry syntax checks of torchfrtrace's Op.match. */
static tr__fra_finding_t* syntax_finding(tr_fra_t* a, int gi, call_t* c,
                                         size_t n) {
  tr__fra_group_t* g = &a->g[gi];
  int* cul = malloc(n * sizeof *cul);
  if (!cul) {
    a->oom = 1;
    return NULL;
  }
  size_t k = 0;
  tr__buf_t b = TR__BUF_INIT;
  int ref = -1;
  for (size_t i = 0; i < n; i++) {
    int bad = 0;
    for (size_t j = 0; j < c[i].hi - c[i].lo && !bad; j++) {
      const tr__fra_ent_t* e = call_ent(a, g, &c[i], j);
      unsigned oc = opclass(a, e->op);
      if (oc & OPC_ALLREDUCE && e->in_sizes != e->out_sizes) {
        bad = 1;
        if (k < 3)
          tr__buf_addf(&b,
                       "%srank %d: all_reduce input sizes %s != output "
                       "sizes %s",
                       b.len ? "; " : "", c[i].rank,
                       tr__fra_str(a, e->in_sizes),
                       tr__fra_str(a, e->out_sizes));
      } else if (oc & OPC_ALLGATHER && e->in_numel >= 0 && e->out_numel >= 0 &&
                 e->out_numel != e->in_numel * (int64_t)g->n) {
        bad = 1;
        if (k < 3)
          tr__buf_addf(&b,
                       "%srank %d: output numel %" PRId64
                       " != input numel %" PRId64 " * pg size %zu",
                       b.len ? "; " : "", c[i].rank, e->out_numel, e->in_numel,
                       g->n);
      } else if (oc & OPC_REDSCAT && e->in_numel >= 0 && e->out_numel >= 0 &&
                 e->in_numel != e->out_numel * (int64_t)g->n) {
        bad = 1;
        if (k < 3)
          tr__buf_addf(&b,
                       "%srank %d: input numel %" PRId64
                       " != output numel %" PRId64 " * pg size %zu",
                       b.len ? "; " : "", c[i].rank, e->in_numel, e->out_numel,
                       g->n);
      }
    }
    if (bad) {
      cul[k++] = c[i].rank;
      if (ref < 0) ref = (int)i;
    }
  }
  tr__fra_finding_t* f = NULL;
  if (k) {
    f = add_finding(a, TR_FRA_SIZE_MISMATCH, gi, c[ref].rank,
                    (int64_t)g->coll[c[ref].pos][c[ref].lo]);
    f->pub.culprits = own_ints(a, cul, k);
    f->pub.n_culprits = k;
    f->pub.detail = own_text(a, &b);
  }
  tr__buf_release(&b);
  free(cul);
  return f;
}

static void add_note(tr_fra_t* a, const char* s) {
  tr__buf_addstr(&a->notes, s);
  if (tr__buf_addstr(&a->notes, "\n") < 0) a->oom = 1;
}

/* Is the rank (member with a dump) past its ring for seq s? */
enum { P_PRESENT, P_MISSING, P_UNKNOWN, P_NODUMP };

static void match_group(tr_fra_t* a, int gi) {
  tr__fra_group_t* g = &a->g[gi];
  size_t n = g->n;
  if (n == 0) return;
  size_t* cur = calloc(n, sizeof *cur);
  call_t* calls = malloc(n * sizeof *calls);
  int* cls = malloc(n * sizeof *cls);
  int* tmp = malloc(n * sizeof *tmp);
  int* tmp2 = malloc(n * sizeof *tmp2);
  if (!cur || !calls || !cls || !tmp || !tmp2) a->oom = 1;
  int reported = 0, dump_note = 0, all_waiting = 0;
  int max_ver = 0;
  for (size_t m = 0; m < n; m++) {
    int di = a->rank_to_d[g->ranks[m]];
    if (di >= 0 && a->d[di].vmaj * 100 + a->d[di].vmin > max_ver)
      max_ver = a->d[di].vmaj * 100 + a->d[di].vmin;
  }
  while (!a->oom) {
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
      const tr__fra_dump_t* d = &a->d[di];
      if (cur[m] < g->ncoll[m] && d->e[g->coll[m][cur[m]]].seq == s) {
        call_t* c = &calls[nc++];
        c->pos = (int)m;
        c->rank = r;
        c->lo = cur[m];
        size_t hi = cur[m];
        while (hi < g->ncoll[m] && d->e[g->coll[m][hi]].seq == s) hi++;
        c->hi = hi;
        c->tsig = c->ssig = c->dsig = 1469598103934665603ull;
        c->state = TR__FRA_COMPLETED;
        for (size_t k = c->lo; k < hi; k++) {
          const tr__fra_ent_t* e = &d->e[g->coll[m][k]];
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
    tr__fra_finding_t* f = NULL;
    int waiting_state = TR__FRA_COMPLETED;
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
      tr__buf_t b = TR__BUF_INIT;
      tr__buf_addf(&b, "rank%s ", k > 1 ? "s" : "");
      tr__fra_add_ranks(&b, tmp, k);
      tr__buf_addf(&b, " never entered it; rank%s ", kp > 1 ? "s" : "");
      tr__fra_add_ranks(&b, tmp2, kp);
      tr__buf_addf(&b, " %s in it (%s)", kp > 1 ? "are" : "is",
                   tr__fra_state_names[waiting_state]);
      f->pub.detail = own_text(a, &b);
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
      int lo = TR__FRA_COMPLETED, hi = TR__FRA_SCHEDULED;
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
        tr__buf_t b = TR__BUF_INIT;
        tr__buf_addf(&b, "rank%s ", k > 1 ? "s" : "");
        tr__fra_add_ranks(&b, tmp, k);
        tr__buf_addf(&b, " %s %s where rank%s ", k > 1 ? "are" : "is",
                     tr__fra_state_names[lo], kp > 1 ? "s" : "");
        tr__fra_add_ranks(&b, tmp2, kp);
        tr__buf_addf(&b, " %s",
                     hi == TR__FRA_COMPLETED ? "completed it" : "started it");
        f->pub.detail = own_text(a, &b);
        (void)ref;
      }
    }
    if (!f && nc > 1 && nmiss == 0 && nnodump == 0 && max_ver > 203) {
      /* all_to_all: total input numel == total output numel */
      const tr__fra_ent_t* e0 = call_ent(a, g, &calls[0], 0);
      if (opclass(a, e0->op) & OPC_A2A && calls[0].hi - calls[0].lo == 1) {
        int64_t ti = 0, to = 0;
        for (size_t i = 0; i < nc; i++) {
          const tr__fra_ent_t* e = call_ent(a, g, &calls[i], 0);
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
    if (!f && nnodump && waiting_state != TR__FRA_COMPLETED && !dump_note) {
      size_t k = 0;
      for (size_t m = 0; m < n; m++)
        if (cls[m] == P_NODUMP) tmp[k++] = g->ranks[m];
      f = add_finding(a, TR_FRA_MISSING_DUMP, gi, calls[0].rank,
                      (int64_t)g->coll[calls[0].pos][calls[0].lo]);
      f->pub.culprits = own_ints(a, tmp, k);
      f->pub.n_culprits = k;
      tr__buf_t b = TR__BUF_INIT;
      tr__buf_addf(&b, "rank%s ", k > 1 ? "s" : "");
      tr__fra_add_ranks(&b, tmp, k);
      tr__buf_addf(&b, " left no dump; the others are in it (%s)",
                   tr__fra_state_names[waiting_state]);
      f->pub.detail = own_text(a, &b);
      dump_note = 1;
    }
    if (!f && nc == n && waiting_state != TR__FRA_COMPLETED && !all_waiting) {
      int all_same = 1;
      for (size_t i = 0; i < nc; i++)
        if (calls[i].state == TR__FRA_COMPLETED) all_same = 0;
      if (all_same) {
        f = add_finding(a, TR_FRA_ALL_WAITING, gi, calls[0].rank,
                        (int64_t)g->coll[calls[0].pos][calls[0].lo]);
        char t[160];
        snprintf(t, sizeof t, "all %zu ranks are in it (%s), none completed", n,
                 tr__fra_state_names[waiting_state]);
        f->pub.detail = own_str(a, t);
        f->t_ref = INT64_MAX - 1; /* informational: last resort verdict */
        all_waiting = 1;
      }
    }
    if (f) {
      f->state = waiting_state;
      int64_t since = 0;
      for (size_t i = 0; i < nc; i++) {
        const tr__fra_ent_t* e = call_ent(a, g, &calls[i], 0);
        int64_t t = e->t_started ? e->t_started : e->t_created;
        if (t && (!since || t < since)) since = t;
      }
      f->pub.since_ns = since;
      if (f->pub.kind != TR_FRA_ALL_WAITING &&
          f->pub.kind != TR_FRA_MISSING_DUMP &&
          ++reported > a->o.mismatch_cap) {
        if (!a->oom) a->nf--; /* over the cap: not reported */
        char t[300];
        snprintf(t, sizeof t,
                 "Too many mismatches for process_group %s:%s (more than "
                 "%d), stopped matching it",
                 tr__fra_str(a, g->name), tr__fra_str(a, g->desc),
                 a->o.mismatch_cap);
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

static void push_i64(tr_fra_t* a, int64_t** v, size_t* n, size_t* c,
                     int64_t x) {
  if (TR_GROW(*v, *n + 1, *c) < 0) {
    a->oom = 1;
    return;
  }
  (*v)[(*n)++] = x;
}

static void match_p2p(tr_fra_t* a, int gi) {
  tr__fra_group_t* g = &a->g[gi];
  pair_t* pairs = NULL;
  size_t np = 0, cp = 0;
  for (size_t m = 0; m < g->n; m++) {
    int di = a->rank_to_d[g->ranks[m]];
    if (di < 0) continue;
    const tr__fra_dump_t* d = &a->d[di];
    for (size_t i = 0; i < d->n; i++) {
      const tr__fra_ent_t* e = &d->e[i];
      if (e->group != gi || !e->is_p2p || e->coalesced) continue;
      if (e->op != a->id_send && e->op != a->id_recv) continue;
      if (e->peer_l < 0 || (size_t)e->peer_l >= g->n) continue;
      int peer = g->ranks[e->peer_l];
      int src = e->op == a->id_send ? d->rank : peer;
      int dst = e->op == a->id_send ? peer : d->rank;
      size_t k = 0;
      while (k < np && !(pairs[k].src == src && pairs[k].dst == dst)) k++;
      if (k == np) {
        if (TR_GROW(pairs, np + 1, cp) < 0) {
          a->oom = 1;
          goto out;
        }
        memset(&pairs[np], 0, sizeof *pairs);
        pairs[np].src = src;
        pairs[np].dst = dst;
        np++;
      }
      if (e->op == a->id_send)
        push_i64(a, &pairs[k].sends, &pairs[k].ns, &pairs[k].cs, (int64_t)i);
      else
        push_i64(a, &pairs[k].recvs, &pairs[k].nr, &pairs[k].cr, (int64_t)i);
    }
  }
  int reported = 0;
  for (size_t k = 0; k < np && reported <= a->o.mismatch_cap && !a->oom; k++) {
    pair_t* p = &pairs[k];
    int ds = p->src <= a->max_rank ? a->rank_to_d[p->src] : -1;
    int dr = p->dst <= a->max_rank ? a->rank_to_d[p->dst] : -1;
    if (ds < 0 || dr < 0) continue; /* no dump: cannot tell */
    const tr__fra_dump_t* S_ = &a->d[ds];
    const tr__fra_dump_t* R_ = &a->d[dr];
    /* drop ops older than the partner's ring */
    size_t i0 = 0, j0 = 0;
    if (R_->wrapped)
      while (i0 < p->ns && S_->e[p->sends[i0]].t_created < R_->t_first) i0++;
    if (S_->wrapped)
      while (j0 < p->nr && R_->e[p->recvs[j0]].t_created < S_->t_first) j0++;
    size_t i = i0, j = j0;
    for (; i < p->ns && j < p->nr; i++, j++) {
      const tr__fra_ent_t* se = &S_->e[p->sends[i]];
      const tr__fra_ent_t* re = &R_->e[p->recvs[j]];
      if (se->in_sizes != re->out_sizes) {
        tr__fra_finding_t* f =
            add_finding(a, TR_FRA_P2P_SIZE_MISMATCH, gi, p->src, p->sends[i]);
        int cul[2] = {p->src < p->dst ? p->src : p->dst,
                      p->src < p->dst ? p->dst : p->src};
        f->pub.culprits = own_ints(a, cul, 2);
        f->pub.n_culprits = 2;
        tr__buf_t b = TR__BUF_INIT;
        tr__buf_addf(&b, "rank %d sends %s to rank %d, which receives %s",
                     p->src, tr__fra_str(a, se->in_sizes), p->dst,
                     tr__fra_str(a, re->out_sizes));
        f->pub.detail = own_text(a, &b);
        f->state = se->state;
        f->pub.since_ns = se->t_started ? se->t_started : se->t_created;
        reported++;
        break;
      }
    }
    if (i < p->ns && j >= p->nr) {
      const tr__fra_ent_t* se = &S_->e[p->sends[i]];
      tr__fra_finding_t* f =
          add_finding(a, TR_FRA_SEND_NO_RECV, gi, p->src, p->sends[i]);
      f->pub.culprits = own_ints(a, &p->dst, 1);
      f->pub.n_culprits = 1;
      f->pub.missing = f->pub.culprits;
      f->pub.n_missing = 1;
      tr__buf_t b = TR__BUF_INIT;
      tr__buf_addf(&b,
                   "rank %d sends %s to rank %d (%s), which never posted the "
                   "matching recv (%zu send%s, %zu recv%s recorded)",
                   p->src, tr__fra_str(a, se->in_sizes), p->dst,
                   tr__fra_state_names[se->state], p->ns - i0,
                   p->ns - i0 == 1 ? "" : "s", p->nr - j0,
                   p->nr - j0 == 1 ? "" : "s");
      f->pub.detail = own_text(a, &b);
      f->state = se->state;
      f->pub.since_ns = se->t_started ? se->t_started : se->t_created;
      reported++;
    } else if (j < p->nr && i >= p->ns) {
      const tr__fra_ent_t* re = &R_->e[p->recvs[j]];
      tr__fra_finding_t* f =
          add_finding(a, TR_FRA_RECV_NO_SEND, gi, p->dst, p->recvs[j]);
      f->pub.culprits = own_ints(a, &p->src, 1);
      f->pub.n_culprits = 1;
      f->pub.missing = f->pub.culprits;
      f->pub.n_missing = 1;
      tr__buf_t b = TR__BUF_INIT;
      tr__buf_addf(&b,
                   "rank %d waits to receive %s from rank %d (%s), which never "
                   "posted the matching send",
                   p->dst, tr__fra_str(a, re->out_sizes), p->src,
                   tr__fra_state_names[re->state]);
      f->pub.detail = own_text(a, &b);
      f->state = re->state;
      f->pub.since_ns = re->t_started ? re->t_started : re->t_created;
      reported++;
    }
  }
out:
  for (size_t k = 0; k < np; k++) {
    free(pairs[k].sends);
    free(pairs[k].recvs);
  }
  free(pairs);
}

/* Collective entries to (group, member) lists. */
static void distribute(tr_fra_t* a) {
  for (size_t gi = 0; gi < a->ng; gi++) {
    tr__fra_group_t* g = &a->g[gi];
    g->coll = calloc(g->n ? g->n : 1, sizeof *g->coll);
    g->ncoll = calloc(g->n ? g->n : 1, sizeof *g->ncoll);
    g->ccap = calloc(g->n ? g->n : 1, sizeof *g->ccap);
    if (!g->coll || !g->ncoll || !g->ccap) {
      a->oom = 1;
      return;
    }
  }
  for (size_t di = 0; di < a->nd; di++) {
    tr__fra_dump_t* d = &a->d[di];
    for (size_t i = 0; i < d->n; i++) {
      tr__fra_ent_t* e = &d->e[i];
      if (e->is_p2p || e->seq < 0) continue;
      tr__fra_group_t* g = &a->g[e->group];
      int* pos =
          bsearch(&d->rank, g->ranks, g->n, sizeof(int), tr__fra_cmp_int);
      if (!pos) continue; /* not a member by its own pg_config */
      size_t m = (size_t)(pos - g->ranks);
      if (TR_GROW(g->coll[m], g->ncoll[m] + 1, g->ccap[m]) < 0) {
        a->oom = 1;
        return;
      }
      g->coll[m][g->ncoll[m]++] = (uint32_t)i;
    }
  }
}

/* Member ranks without a dump, sorted, into a->missing. */
static void find_missing(tr_fra_t* a) {
  size_t cap = 0;
  for (size_t gi = 0; gi < a->ng; gi++)
    for (size_t k = 0; k < a->g[gi].n; k++) {
      int r = a->g[gi].ranks[k];
      if (a->rank_to_d[r] >= 0) continue;
      size_t j = 0;
      while (j < a->nmissing && a->missing[j] != r) j++;
      if (j < a->nmissing) continue;
      if (TR_GROW(a->missing, a->nmissing + 1, cap) < 0) {
        a->oom = 1;
        return;
      }
      a->missing[a->nmissing++] = r;
    }
  if (a->nmissing)
    qsort(a->missing, a->nmissing, sizeof *a->missing, tr__fra_cmp_int);
}

int tr_fra_analyze(tr_fra_t* a, tr_errmsg_t* err) {
  distribute(a);
  if (!a->oom) find_missing(a);
  const int* miss = a->missing;
  size_t nmiss = a->nmissing;
  int rc = 0;
  if (a->oom) {
    /* nothing to match */
  } else if (nmiss && !a->o.allow_incomplete_ranks) {
    /* torchfrtrace refuses; say which ranks, in the largest group */
    int best = -1;
    for (size_t gi = 0; gi < a->ng; gi++)
      if (best < 0 || a->g[gi].n > a->g[best].n) best = (int)gi;
    tr__fra_finding_t* f = add_finding(a, TR_FRA_MISSING_DUMP, best, -1, -1);
    f->pub.culprits = own_ints(a, miss, nmiss);
    f->pub.n_culprits = nmiss;
    tr__buf_t b = TR__BUF_INIT;
    tr__buf_addstr(&b, "missing dump files from ranks ");
    tr__fra_add_ranks(&b, miss, nmiss);
    f->pub.detail = own_text(a, &b);
    rc = tr_errmsg_set(err, TR_ENOTFOUND,
                       "%s in '%s'; pass --allow-incomplete-ranks for a "
                       "best-effort analysis",
                       f->pub.detail, a->dir);
  } else {
    for (size_t gi = 0; gi < a->ng && !a->oom; gi++) {
      match_group(a, (int)gi);
      match_p2p(a, (int)gi);
    }
  }
  if (!a->oom && tr__fra_build_verdict(a) < 0) a->oom = 1;
  if (a->oom) {
    /* what was found is incomplete: report nothing of it */
    a->nf = 0;
    a->primary = -1;
    return tr_errmsg_set(err, TR_ENOMEM, "'%s': out of memory while analyzing",
                         a->dir);
  }
  return rc < 0 ? rc : (int)a->nf;
}
