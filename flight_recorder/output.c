/* flight_recorder/output.c: the analyzer's output -- the findings as
 * torchfrtrace reports them with a summary and the verdict, the -j table
 * of entries, the JSON object, the accessors; and the text pieces the
 * other files share (rank lists "0-3,5", times, durations).
 *
 * The printers build text in memory first, so that out of memory is an
 * error return (TR_ENOMEM) and never half a line.
 */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h> /* gmtime_r */

#include "core/buf.h"
#include "flight_recorder/internal.h"
#include "trainrun/error.h"
#include "trainrun/fr_analyze.h"

/* ----------------------------------------------------------------- text */

void tr__fra_add_int(tr__buf_t* b, int64_t v) {
  char t[24];
  int i = 23;
  t[i] = '\0';
  uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
  do {
    t[--i] = (char)('0' + u % 10);
    u /= 10;
  } while (u);
  if (v < 0) t[--i] = '-';
  tr__buf_add(b, t + i, (size_t)(23 - i));
}

void tr__fra_add_ranks(tr__buf_t* b, const int* r, size_t n) {
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j + 1 < n && r[j + 1] == r[j] + 1) j++;
    if (i) tr__buf_addstr(b, ",");
    tr__fra_add_int(b, r[i]);
    if (j > i) {
      tr__buf_addstr(b, j == i + 1 ? "," : "-");
      tr__fra_add_int(b, r[j]);
    }
    i = j + 1;
  }
}

void tr__fra_add_time(tr__buf_t* b, int64_t ns) {
  time_t t = (time_t)(ns / 1000000000);
  struct tm tm;
  gmtime_r(&t, &tm);
  tr__buf_addf(b, "%02d:%02d:%02d UTC", tm.tm_hour, tm.tm_min, tm.tm_sec);
}

void tr__fra_add_duration(tr__buf_t* b, int64_t ns) {
  int64_t s = ns / 1000000000;
  if (s >= 3600)
    tr__buf_addf(b, "%" PRId64 "h %" PRId64 "m", s / 3600, (s / 60) % 60);
  else if (s >= 60)
    tr__buf_addf(b, "%" PRId64 "m %" PRId64 "s", s / 60, s % 60);
  else
    tr__buf_addf(b, "%" PRId64 ".%01" PRId64 "s", s, (ns / 100000000) % 10);
}

/* ------------------------------------------------------------- accessors */

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

/* ---- the report ---- */

int tr_fra_print_report(const tr_fra_t* a, FILE* out) {
  tr__buf_t missing = TR__BUF_INIT;
  if (a->nmissing) {
    tr__fra_add_ranks(&missing, a->missing, a->nmissing);
    if (missing.oom) return TR_ENOMEM;
  }
  if (a->mixed_versions)
    fprintf(out, "warning: the dumps have different versions\n");
  for (size_t i = 0; i < a->nf; i++) {
    const tr__fra_finding_t* F = &a->f[i];
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
      const tr__fra_ent_t* e = &a->d[a->rank_to_d[F->ref_rank]].e[F->ref_ent];
      fprintf(out, "input sizes: %s\noutput sizes: %s\n",
              tr__fra_str(a, e->in_sizes), tr__fra_str(a, e->out_sizes));
    }
    if (f->pg_size) {
      fprintf(out, "world size: %zu\nexpected ranks: ", f->pg_size);
      print_ranks_set(out, f->pg_ranks, f->pg_size);
      fputc('\n', out);
    }
    if (F->state >= 0)
      fprintf(out, "collective state: %s\n", tr__fra_state_names[F->state]);
    if (f->n_culprits && f->kind != TR_FRA_NOT_JOINED) {
      fprintf(out, "error msg: ");
      for (size_t j = 0; j < f->n_culprits; j++)
        fprintf(out, "%sCulprit rank %d; Error type: %s", j ? ", " : "",
                f->culprits[j], f->kind_name);
      fputc('\n', out);
    }
    fprintf(out, "detail: %s\n", f->detail);
    if (F->ref_rank >= 0 && F->ref_ent >= 0) {
      const tr__fra_ent_t* e = &a->d[a->rank_to_d[F->ref_rank]].e[F->ref_ent];
      if (e->frames >= 0)
        fprintf(out, "collective stack trace: \n %s\n",
                tr__fra_str(a, e->frames));
    }
    fputc('\n', out);
  }
  fputs(tr__buf_str(&a->notes), out);
  fprintf(out,
          "summary: %zu rank%s, %zu entries, %zu process group%s, %zu "
          "matched collective%s, %zu finding%s",
          a->nd, a->nd == 1 ? "" : "s", a->n_entries, a->ng,
          a->ng == 1 ? "" : "s", a->n_collectives,
          a->n_collectives == 1 ? "" : "s", a->nf, a->nf == 1 ? "" : "s");
  if (a->nmissing) {
    fprintf(out, "; no dump from rank%s ", a->nmissing == 1 ? "" : "s");
    fputs(missing.buf, out);
    tr__buf_release(&missing);
  }
  fprintf(out, "\nverdict: %s\n", tr_fra_verdict(a));
  return 0;
}

/* ---- -j ---- */

static int selected(const tr_fra_t* a, int rank) {
  if (!a->o.selected_ranks) return 1;
  for (size_t i = 0; i < a->o.n_selected_ranks; i++)
    if (a->o.selected_ranks[i] == rank) return 1;
  return 0;
}

static int pg_passes(const tr_fra_t* a, const tr__fra_ent_t* e) {
  if (!a->o.pg_filters) return 1;
  const tr__fra_group_t* g = &a->g[e->group];
  for (size_t i = 0; i < a->o.n_pg_filters; i++)
    if (strcmp(a->o.pg_filters[i], tr__fra_str(a, g->name)) == 0 ||
        strcmp(a->o.pg_filters[i], tr__fra_str(a, g->desc)) == 0)
      return 1;
  return 0;
}

static void op_repr(const tr_fra_t* a, const tr__fra_ent_t* e, tr__buf_t* b) {
  const tr__fra_group_t* g = &a->g[e->group];
  tr__buf_addf(b, "%s(", tr__fra_str(a, e->op));
  if (e->op == a->id_send || e->op == a->id_recv) {
    int s = -1, d = -1;
    int sl = e->op == a->id_send ? e->self_l : e->peer_l;
    int dl = e->op == a->id_send ? e->peer_l : e->self_l;
    if (sl >= 0 && (size_t)sl < g->n) s = g->ranks[sl];
    if (dl >= 0 && (size_t)dl < g->n) d = g->ranks[dl];
    tr__buf_addf(b, "s=%d d=%d, ", s, d);
  }
  if (a->o.verbose) {
    tr__buf_addf(b,
                 "timestamp_created=%" PRId64
                 ", input_sizes=%s, "
                 "output_sizes=%s, input_dtypes=%s, output_dtypes=%s, "
                 "collective_seq_id | p2p_seq_id=%" PRId64
                 ", pg_name=%s, "
                 "pg_description=%s, pg_size=%zu, state=%s)",
                 e->t_created, tr__fra_str(a, e->in_sizes),
                 tr__fra_str(a, e->out_sizes), tr__fra_str(a, e->in_dt),
                 tr__fra_str(a, e->out_dt), e->is_p2p ? e->p2p_seq : e->seq,
                 tr__fra_str(a, g->name), tr__fra_str(a, g->desc), g->n,
                 tr__fra_state_names[e->state]);
  } else {
    tr__buf_addf(b, "input_sizes=%s, state=%s)", tr__fra_str(a, e->in_sizes),
                 tr__fra_state_names[e->state]);
  }
}

int tr_fra_print_entries(const tr_fra_t* a, FILE* out) {
  /* torchfrtrace's align_trace_from_beginning */
  int64_t start = 0;
  for (size_t i = 0; i < a->nd; i++)
    if (a->d[i].n && a->d[i].e[0].record_id > start)
      start = a->d[i].e[0].record_id;
  size_t nc = 0;
  size_t* col = malloc((a->nd ? a->nd : 1) * sizeof *col);
  size_t* cur = malloc((a->nd ? a->nd : 1) * sizeof *cur);
  size_t* w = malloc((a->nd ? a->nd : 1) * sizeof *w);
  int rc = 0;
  tr__buf_t b = TR__BUF_INIT, h = TR__BUF_INIT, line = TR__BUF_INIT;
  if (!col || !cur || !w) goto out_oom;
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
  for (size_t c = 0; c < nc; c++) {
    const tr__fra_dump_t* d = &a->d[col[c]];
    for (size_t k = cur[c]; k < d->n; k++) {
      if (!pg_passes(a, &d->e[k])) continue;
      tr__buf_setlen(&b, 0);
      op_repr(a, &d->e[k], &b);
      if (b.oom) goto out_oom;
      if (b.len > w[c]) w[c] = b.len;
    }
  }
  for (size_t c = 0; c < nc; c++) {
    char t[32];
    snprintf(t, sizeof t, "Rank %d", a->d[col[c]].rank);
    tr__buf_addf(&h, "%s%-*s", c ? "  " : "", (int)w[c], t);
  }
  if (h.oom) goto out_oom;
  while (h.len && h.buf[h.len - 1] == ' ') tr__buf_setlen(&h, h.len - 1);
  fprintf(out, "%s\n", tr__buf_str(&h));
  for (size_t c = 0; c < nc; c++) {
    fprintf(out, "%s", c ? "  " : "");
    for (size_t k = 0; k < w[c]; k++) fputc('-', out);
  }
  fputc('\n', out);
  for (;;) {
    int progress = 0;
    tr__buf_setlen(&line, 0);
    for (size_t c = 0; c < nc; c++) {
      const tr__fra_dump_t* d = &a->d[col[c]];
      tr__buf_setlen(&b, 0);
      tr__buf_add(&b, "", 0);
      if (cur[c] < d->n) {
        const tr__fra_ent_t* e = &d->e[cur[c]++];
        if (pg_passes(a, e)) op_repr(a, e, &b);
        progress = 1;
      }
      if (b.oom) goto out_oom;
      tr__buf_addf(&line, "%s%-*s", c ? "  " : "", (int)w[c], b.buf);
    }
    if (line.oom) goto out_oom;
    if (progress) {
      /* strip trailing blanks */
      while (line.len && line.buf[line.len - 1] == ' ')
        tr__buf_setlen(&line, line.len - 1);
      fprintf(out, "%s\n", tr__buf_str(&line));
    }
    if (!progress) break;
  }
  goto out;
out_oom:
  rc = TR_ENOMEM;
out:
  tr__buf_release(&line);
  tr__buf_release(&h);
  tr__buf_release(&b);
  free(col);
  free(cur);
  free(w);
  return rc;
}

/* ---- --json ---- */

/* NULL when out of memory. */
static json_t* ints_json(const int* r, size_t n) {
  json_t* j = json_array();
  for (size_t i = 0; j && i < n; i++)
    if (json_array_append_new(j, json_integer(r[i])) < 0) {
      json_decref(j);
      return NULL;
    }
  return j;
}

/* json_object_set_new and json_array_append_new take NULL values and fail;
 * *bad remembers that one failed. */
static void set(json_t* o, const char* k, json_t* v, int* bad) {
  if (json_object_set_new(o, k, v) < 0) *bad = 1;
}

static void append(json_t* arr, json_t* v, int* bad) {
  if (json_array_append_new(arr, v) < 0) *bad = 1;
}

json_t* tr_fra_to_json(const tr_fra_t* a) {
  int bad = 0;
  json_t* o = json_object();
  set(o, "version", json_string(a->nd ? a->d[0].version : ""), &bad);
  set(o, "ranks", ints_json(a->ranks, a->nd), &bad);
  set(o, "missing_dumps", ints_json(a->missing, a->nmissing), &bad);
  set(o, "entries", json_integer((json_int_t)a->n_entries), &bad);
  set(o, "matched_collectives", json_integer((json_int_t)a->n_collectives),
      &bad);
  json_t* dumps = json_array();
  for (size_t i = 0; i < a->nd; i++)
    append(dumps,
           json_pack("{s:i, s:s, s:s, s:I, s:b}", "rank", a->d[i].rank, "file",
                     a->d[i].path, "version", a->d[i].version, "entries",
                     (json_int_t)a->d[i].n, "wrapped", a->d[i].wrapped),
           &bad);
  set(o, "dumps", dumps, &bad);
  json_t* groups = json_array();
  for (size_t i = 0; i < a->ng; i++)
    append(
        groups,
        json_pack("{s:s, s:s, s:o, s:b}", "name", tr__fra_str(a, a->g[i].name),
                  "desc", tr__fra_str(a, a->g[i].desc), "ranks",
                  ints_json(a->g[i].ranks, a->g[i].n), "inferred",
                  a->g[i].inferred),
        &bad);
  set(o, "groups", groups, &bad);
  json_t* fs = json_array();
  for (size_t i = 0; i < a->nf; i++) {
    const tr__fra_finding_t* F = &a->f[i];
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
      set(j, "state", json_string(tr__fra_state_names[F->state]), &bad);
    if (f->since_ns)
      set(j, "since_ns", json_integer((json_int_t)f->since_ns), &bad);
    if (F->ref_rank >= 0 && F->ref_ent >= 0) {
      const tr__fra_ent_t* e = &a->d[a->rank_to_d[F->ref_rank]].e[F->ref_ent];
      set(j, "input_sizes", json_string(tr__fra_str(a, e->in_sizes)), &bad);
      set(j, "output_sizes", json_string(tr__fra_str(a, e->out_sizes)), &bad);
    }
    append(fs, j, &bad);
  }
  set(o, "findings", fs, &bad);
  set(o, "primary", json_integer(a->primary), &bad);
  set(o, "verdict", json_string(tr_fra_verdict(a)), &bad);
  if (bad || !o) {
    json_decref(o);
    return NULL;
  }
  return o;
}

int tr_fra_print_json(const tr_fra_t* a, FILE* out) {
  json_t* j = tr_fra_to_json(a);
  char* s = j ? json_dumps(j, JSON_INDENT(2)) : NULL;
  json_decref(j);
  if (!s) return TR_ENOMEM;
  fprintf(out, "%s\n", s);
  free(s);
  return 0;
}
