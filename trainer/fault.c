/* trainer/fault.c: `--debug.fault` -- parsing fault specs and making this
 * rank fail as they say, at the trainer's step and gradient-sync points
 * (trainrun/fault.h). */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "trainrun/error.h"
#include "trainrun/fault.h"

static const char* const kind_names[] = {
    "kill", "hang", "exit", "slow", "skip_collective", "mismatch"};
enum { NKINDS = sizeof kind_names / sizeof kind_names[0] };

/* ---- parsing ---- */

/* A whole decimal number in [lo, hi]; 0 or -1. */
static int parse_num(const char* s, size_t n, int64_t lo, int64_t hi,
                     int64_t* out) {
  if (n == 0 || n > 19) return -1;
  int64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    v = v * 10 + (s[i] - '0');
  }
  if (v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

int tr_fault_parse(const char* spec, tr_fault_t* f, tr_errmsg_t* err) {
  memset(f, 0, sizeof *f);
  f->rank = -1;
  f->step = -1;
  f->code = 1;
  f->ms = -1;
  f->restart = 0;
  snprintf(f->spec, sizeof f->spec, "%s", spec);
  size_t kl = strcspn(spec, ":");
  int kind = -1;
  for (int k = 0; k < NKINDS; k++)
    if (strlen(kind_names[k]) == kl && memcmp(spec, kind_names[k], kl) == 0)
      kind = k;
  if (kind < 0)
    return tr_errmsg_set(err, TR_EINVAL,
                         "debug.fault '%s': unknown kind '%.*s' (kill, hang, "
                         "exit, slow, skip_collective or mismatch)",
                         spec, (int)kl, spec);
  f->kind = (tr_fault_kind_t)kind;
  const char* p = spec + kl;
  while (*p == ':') {
    p++;
    size_t fl = strcspn(p, ":");
    const char* eq = memchr(p, '=', fl);
    if (!eq)
      return tr_errmsg_set(err, TR_EINVAL,
                           "debug.fault '%s': expected name=value, got "
                           "'%.*s'",
                           spec, (int)fl, p);
    size_t nl = (size_t)(eq - p);
    const char* v = eq + 1;
    size_t vl = fl - nl - 1;
    int64_t x = 0;
#define FIELD(name) (nl == strlen(name) && memcmp(p, name, nl) == 0)
#define BAD(what)                                                         \
  return tr_errmsg_set(err, TR_EINVAL,                                    \
                       "debug.fault '%s': %.*s: expected %s, got '%.*s'", \
                       spec, (int)nl, p, what, (int)vl, v)
    if (FIELD("rank")) {
      if (parse_num(v, vl, 0, INT32_MAX, &x) < 0) BAD("a number >= 0");
      f->rank = (int)x;
    } else if (FIELD("step")) {
      if (parse_num(v, vl, 1, INT64_MAX / 2, &x) < 0) BAD("a number >= 1");
      f->step = x;
    } else if (FIELD("code") && kind == TR_FAULT_EXIT) {
      if (parse_num(v, vl, 0, 255, &x) < 0) BAD("an exit code 0 to 255");
      f->code = (int)x;
    } else if (FIELD("ms") && kind == TR_FAULT_SLOW) {
      if (parse_num(v, vl, 0, 86400000, &x) < 0)
        BAD("milliseconds 0 to 86400000");
      f->ms = x;
    } else if (FIELD("restart")) {
      if (parse_num(v, vl, 0, INT32_MAX, &x) < 0) BAD("a restart count >= 0");
      f->restart = (int)x;
    } else {
      return tr_errmsg_set(err, TR_EINVAL,
                           "debug.fault '%s': '%.*s' is no field of %s (rank, "
                           "step%s, restart)",
                           spec, (int)nl, p, kind_names[kind],
                           kind == TR_FAULT_EXIT   ? ", code"
                           : kind == TR_FAULT_SLOW ? ", ms"
                                                   : "");
    }
#undef FIELD
#undef BAD
    p += fl;
  }
  if (*p)
    return tr_errmsg_set(err, TR_EINVAL, "debug.fault '%s': bad spec", spec);
  if (kind == TR_FAULT_SLOW && f->ms < 0)
    return tr_errmsg_set(err, TR_EINVAL,
                         "debug.fault '%s': slow needs ms=MILLISECONDS", spec);
  if (kind != TR_FAULT_SLOW && f->step < 0)
    return tr_errmsg_set(err, TR_EINVAL, "debug.fault '%s': %s needs step=N",
                         spec, kind_names[kind]);
  return 0;
}

/* ---- the armed faults of this process ---- */

static tr_fault_t* armed;
static int narmed;
static int my_rank;

int tr_fault_arm(const char* const* specs, int n, int rank, int restart,
                 tr_errmsg_t* err) {
  tr_fault_t* list = NULL;
  int k = 0;
  if (n > 0) {
    list = calloc((size_t)n, sizeof *list);
    if (!list) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  }
  for (int i = 0; i < n; i++) {
    tr_fault_t f;
    int rc = tr_fault_parse(specs[i], &f, err);
    if (rc < 0) {
      free(list);
      return rc;
    }
    if ((f.rank < 0 || f.rank == rank) &&
        (f.restart < 0 || f.restart == restart))
      list[k++] = f;
  }
  free(armed);
  armed = list;
  narmed = k;
  my_rank = rank;
  return 0;
}

int tr_fault_armed(void) { return narmed; }

static void announce(const tr_fault_t* f, const char* what) {
  fprintf(stderr, "trainrun: rank %d: debug.fault '%s': %s\n", my_rank, f->spec,
          what);
  fflush(stderr);
  fflush(stdout);
}

static void sleep_ms(int64_t ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
  }
}

void tr_fault_step(int64_t step) {
  for (int i = 0; i < narmed; i++) {
    const tr_fault_t* f = &armed[i];
    char what[96];
    switch (f->kind) {
      case TR_FAULT_KILL:
        if (f->step != step) break;
        snprintf(what, sizeof what, "SIGKILL at step %" PRId64, step);
        announce(f, what);
        kill(getpid(), SIGKILL);
        for (;;) pause(); /* not reached */
      case TR_FAULT_EXIT:
        if (f->step != step) break;
        snprintf(what, sizeof what, "exit code %d at step %" PRId64, f->code,
                 step);
        announce(f, what);
        _exit(f->code);
      case TR_FAULT_SLOW:
        if (f->step >= 0 && f->step != step) break;
        sleep_ms(f->ms);
        break;
      default:
        break;
    }
  }
}

void tr_fault_before_sync(int64_t step) {
  for (int i = 0; i < narmed; i++) {
    const tr_fault_t* f = &armed[i];
    if (f->kind != TR_FAULT_HANG || f->step != step) continue;
    char what[96];
    snprintf(what, sizeof what,
             "hanging in step %" PRId64 " before the gradient collective",
             step);
    announce(f, what);
    for (;;) pause(); /* until a signal ends the process */
  }
}

int tr_fault_grad_sync(tr_pg_t* pg, tr_tensor_t* flat, int64_t step) {
  for (int i = 0; i < narmed; i++) {
    const tr_fault_t* f = &armed[i];
    if (f->step != step) continue;
    char what[128];
    if (f->kind == TR_FAULT_SKIP_COLLECTIVE) {
      snprintf(what, sizeof what,
               "skipping the gradient collectives of step %" PRId64, step);
      announce(f, what);
      return 1;
    }
    if (f->kind != TR_FAULT_MISMATCH || !flat) continue;
    int64_t n = tr_tensor_numel(flat);
    snprintf(what, sizeof what,
             "all-reduce of %" PRId64 " elements instead of %" PRId64
             " in step %" PRId64,
             n - 1, n, step);
    announce(f, what);
    tr_tensor_t part = {0};
    int rc = tr_tensor_narrow(&part, flat, 0, 0, n > 1 ? n - 1 : n);
    if (rc == 0) rc = tr_pg_all_reduce(pg, &part, TR_PG_SUM, NULL);
    tr_tensor_release(&part);
    return rc < 0 ? rc : 1;
  }
  return 0;
}

int tr_fault_sharded_sync(int64_t step) {
  for (int i = 0; i < narmed; i++) {
    const tr_fault_t* f = &armed[i];
    if (f->step != step) continue;
    char what[128];
    if (f->kind == TR_FAULT_SKIP_COLLECTIVE) {
      snprintf(what, sizeof what,
               "skipping the gradient-norm all-reduce of step %" PRId64, step);
      announce(f, what);
      return TR_FAULT_SYNC_SKIP;
    }
    if (f->kind == TR_FAULT_MISMATCH) {
      snprintf(what, sizeof what,
               "gradient-norm all-reduce of the wrong size in step %" PRId64,
               step);
      announce(f, what);
      return TR_FAULT_SYNC_MISMATCH;
    }
  }
  return TR_FAULT_SYNC_NONE;
}
