/* flight_recorder/verdict.c: the analyzer's verdict -- pick the finding
 * the trouble started with (the earliest in time; informational ones last)
 * and write the paragraph naming the culprit rank, op, sequence number and
 * process group, since when the others wait, and the culprit's last
 * completed op.
 */
#include "config.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h> /* ssize_t */

#include "core/buf.h"
#include "flight_recorder/internal.h"
#include "trainrun/error.h"

static void pg_label(const tr_fra_t* a, const tr_fra_finding_t* f,
                     tr__buf_t* b) {
  if (strcmp(f->pg_desc, "undefined") != 0 && f->pg_desc[0] &&
      strcmp(f->pg_desc, f->pg_name) != 0)
    tr__buf_addf(b, "pg '%s' (%s) [ranks ", f->pg_desc, f->pg_name);
  else
    tr__buf_addf(b, "pg '%s' [ranks ", f->pg_name);
  tr__fra_add_ranks(b, f->pg_ranks, f->pg_size);
  tr__buf_addstr(b, "]");
  (void)a;
}

static void ent_label(const tr_fra_t* a, const tr__fra_ent_t* e, tr__buf_t* b,
                      int with_pg) {
  tr__buf_addf(b, "%s #%" PRId64, tr__fra_str(a, e->op),
               e->is_p2p ? e->p2p_seq : e->seq);
  if (with_pg) {
    const tr__fra_group_t* g = &a->g[e->group];
    const char* desc = tr__fra_str(a, g->desc);
    tr__buf_addf(b, " on pg '%s'",
                 strcmp(desc, "undefined") != 0 && desc[0]
                     ? desc
                     : tr__fra_str(a, g->name));
  }
}

/* "rank 5's last completed op was X at T, and its last entry is Y (state
 * since T)" */
static void last_ops(const tr_fra_t* a, int rank, tr__buf_t* b) {
  if (rank < 0 || rank > a->max_rank || a->rank_to_d[rank] < 0) {
    tr__buf_addf(b, "rank %d left no dump", rank);
    return;
  }
  const tr__fra_dump_t* d = &a->d[a->rank_to_d[rank]];
  if (d->n == 0) {
    tr__buf_addf(b, "rank %d recorded no collective", rank);
    return;
  }
  ssize_t lc = -1;
  for (size_t i = d->n; i-- > 0;)
    if (d->e[i].state == TR__FRA_COMPLETED) {
      lc = (ssize_t)i;
      break;
    }
  if (lc >= 0) {
    tr__buf_addf(b, "rank %d's last completed op was ", rank);
    ent_label(a, &d->e[lc], b, 1);
    int64_t t =
        d->e[lc].t_completed ? d->e[lc].t_completed : d->e[lc].t_created;
    if (t) {
      tr__buf_addstr(b, " at ");
      tr__fra_add_time(b, t);
    }
  } else {
    tr__buf_addf(b, "rank %d completed no recorded op", rank);
  }
  if ((size_t)(lc + 1) < d->n) {
    const tr__fra_ent_t* e = &d->e[d->n - 1];
    tr__buf_addstr(
        b, lc >= 0 ? ", and its last entry is " : "; its last entry is ");
    ent_label(a, e, b, 1);
    int64_t t = e->t_started ? e->t_started : e->t_created;
    tr__buf_addf(b, " (%s", tr__fra_state_names[e->state]);
    if (t) {
      tr__buf_addstr(b, " since ");
      tr__fra_add_time(b, t);
    }
    tr__buf_addstr(b, ")");
  }
}

static void since_text(const tr_fra_t* a, int64_t since, tr__buf_t* b) {
  if (!since) return;
  tr__buf_addstr(b, " since ");
  tr__fra_add_time(b, since);
  if (a->t_max - since >= 1000000000) {
    tr__buf_addstr(b, " (");
    tr__fra_add_duration(b, a->t_max - since);
    tr__buf_addstr(b, " before the last recorded event)");
  }
}

static size_t others(const tr_fra_t* a, const tr_fra_finding_t* f,
                     tr__buf_t* b) {
  int* o = malloc((f->pg_size ? f->pg_size : 1) * sizeof *o);
  if (!o) {
    b->oom = 1; /* the text is incomplete */
    return 0;
  }
  size_t k = 0;
  for (size_t i = 0; i < f->pg_size; i++) {
    int r = f->pg_ranks[i], c = 0;
    for (size_t j = 0; j < f->n_culprits; j++)
      if (f->culprits[j] == r) c = 1;
    /* only ranks whose dumps say where they are */
    if (!c && r <= a->max_rank && a->rank_to_d[r] >= 0) o[k++] = r;
  }
  tr__buf_addf(b, "rank%s ", k == 1 ? "" : "s");
  tr__fra_add_ranks(b, o, k);
  free(o);
  return k;
}

static void culprit_text(const tr_fra_finding_t* f, tr__buf_t* b) {
  tr__buf_addf(b, "rank%s ", f->n_culprits == 1 ? "" : "s");
  tr__fra_add_ranks(b, f->culprits, f->n_culprits);
}

int tr__fra_build_verdict(tr_fra_t* a) {
  tr__buf_t b = TR__BUF_INIT;
  /* primary: the earliest problem in time; informational ones last */
  int p = -1;
  for (size_t i = 0; i < a->nf; i++) {
    if (p < 0 || a->f[i].t_ref < a->f[p].t_ref) p = (int)i;
  }
  a->primary = p;
  if (p < 0) {
    tr__buf_addf(&b,
                 "no divergence found: %zu collective%s matched on %zu process "
                 "group%s over %zu rank%s, every recorded send has its recv, "
                 "and nothing is left waiting",
                 a->n_collectives, a->n_collectives == 1 ? "" : "s", a->ng,
                 a->ng == 1 ? "" : "s", a->nd, a->nd == 1 ? "" : "s");
    a->verdict = tr__buf_detach(&b, NULL);
    return a->verdict ? 0 : TR_ENOMEM;
  }
  const tr__fra_finding_t* F = &a->f[p];
  const tr_fra_finding_t* f = &F->pub;
  const tr__fra_ent_t* ref = NULL;
  if (F->ref_rank >= 0 && F->ref_ent >= 0)
    ref = &a->d[a->rank_to_d[F->ref_rank]].e[F->ref_ent];
  int c0 = f->n_culprits ? f->culprits[0] : -1;
  switch (f->kind) {
    case TR_FRA_NOT_JOINED:
      culprit_text(f, &b);
      tr__buf_addf(&b, " never entered %s #%" PRId64 " on ", f->op, f->seq);
      pg_label(a, f, &b);
      tr__buf_addstr(&b, "; ");
      {
        size_t k = others(a, f, &b);
        tr__buf_addf(&b, " %s",
                     F->state == TR__FRA_COMPLETED ? "completed it"
                     : k == 1                      ? "waits in it"
                                                   : "wait in it");
      }
      if (F->state != TR__FRA_COMPLETED) since_text(a, f->since_ns, &b);
      tr__buf_addstr(&b, "; ");
      last_ops(a, c0, &b);
      break;
    case TR_FRA_TYPE_MISMATCH:
    case TR_FRA_SIZE_MISMATCH:
    case TR_FRA_DTYPE_MISMATCH:
      tr__buf_addf(&b, "%s #%" PRId64 " on ", f->op, f->seq);
      pg_label(a, f, &b);
      tr__buf_addf(&b, " does not match across ranks (%s): %s; ", f->kind_name,
                   f->detail);
      culprit_text(f, &b);
      tr__buf_addf(&b, " %s the odd one out",
                   f->n_culprits == 1 ? "is" : "are");
      if (F->state != TR__FRA_COMPLETED) {
        tr__buf_addstr(&b, ", and the group waits in it");
        since_text(a, f->since_ns, &b);
      }
      tr__buf_addstr(&b, "; ");
      last_ops(a, c0, &b);
      break;
    case TR_FRA_STATE_MISMATCH:
      culprit_text(f, &b);
      tr__buf_addf(&b, " %s stuck in %s #%" PRId64 " on ",
                   f->n_culprits == 1 ? "is" : "are", f->op, f->seq);
      pg_label(a, f, &b);
      tr__buf_addf(&b, " (%s", f->detail);
      if (ref && ref->t_started) {
        tr__buf_addstr(&b, "; started ");
        tr__fra_add_time(&b, ref->t_started);
      }
      tr__buf_addstr(&b, ")");
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
          const tr__fra_dump_t* d = &a->d[a->rank_to_d[o]];
          const tr__fra_ent_t* e = d->n ? &d->e[d->n - 1] : NULL;
          if (e && e->state != TR__FRA_COMPLETED) {
            tr__buf_addstr(&b, "; ");
            tr__buf_addstr(
                &b, others(a, f, &b) == 1 ? " now waits in " : " now wait in ");
            ent_label(a, e, &b, 1);
            since_text(a, e->t_started ? e->t_started : e->t_created, &b);
          }
        }
      }
      tr__buf_addstr(&b, "; ");
      last_ops(a, c0, &b);
      break;
    case TR_FRA_SEND_NO_RECV:
    case TR_FRA_RECV_NO_SEND:
    case TR_FRA_P2P_SIZE_MISMATCH:
      tr__buf_addf(&b, "%s on ", f->detail);
      pg_label(a, f, &b);
      tr__buf_addf(&b, " (%s #%" PRId64 ")", f->op, f->seq);
      if (F->state != TR__FRA_COMPLETED) {
        tr__buf_addstr(&b, "; it waits");
        since_text(a, f->since_ns, &b);
      }
      tr__buf_addstr(&b, "; ");
      last_ops(a, c0, &b);
      break;
    case TR_FRA_ALLTOALL_MISMATCH:
      tr__buf_addf(&b, "%s #%" PRId64 " on ", f->op, f->seq);
      pg_label(a, f, &b);
      tr__buf_addf(&b, ": %s", f->detail);
      break;
    case TR_FRA_MISSING_DUMP:
      culprit_text(f, &b);
      tr__buf_addstr(&b,
                     " left no dump (killed, or crashed before its ring could "
                     "be read) and ");
      tr__buf_addstr(&b, f->n_culprits == 1 ? "is" : "are");
      tr__buf_addstr(&b, " the likely culprit");
      if (f->op[0]) {
        tr__buf_addstr(&b, ": ");
        tr__buf_addf(&b, " %s in %s #%" PRId64 " on ",
                     others(a, f, &b) == 1 ? "waits" : "wait", f->op, f->seq);
        pg_label(a, f, &b);
        since_text(a, f->since_ns, &b);
      }
      break;
    case TR_FRA_ALL_WAITING:
      tr__buf_addf(&b, "all %zu ranks of ", f->pg_size);
      pg_label(a, f, &b);
      tr__buf_addf(&b, " entered %s #%" PRId64 " and none completed it", f->op,
                   f->seq);
      since_text(a, f->since_ns, &b);
      tr__buf_addstr(&b,
                     "; the calls match and no rank is missing, so look below "
                     "the collective order: the network, the transport "
                     "(NCCL/Gloo) or a device");
      break;
  }
  if (ref && ref->frames >= 0 && f->kind != TR_FRA_ALL_WAITING) {
    const char* fr = tr__fra_str(a, ref->frames);
    const char* nl = strchr(fr, '\n');
    tr__buf_addf(&b, "; called from %.*s",
                 nl ? (int)(nl - fr) : (int)strlen(fr), fr);
  }
  size_t real = 0;
  for (size_t i = 0; i < a->nf; i++)
    if (a->f[i].pub.kind != TR_FRA_ALL_WAITING) real++;
  if (real > 1)
    tr__buf_addf(&b, " (%zu findings in all; this is the earliest)", real);
  a->verdict = tr__buf_detach(&b, NULL);
  return a->verdict ? 0 : TR_ENOMEM;
}
