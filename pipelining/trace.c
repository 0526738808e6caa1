/* pipelining/trace.c: a schedule as a Chrome trace (PyTorch's
 * _dump_chrometrace): one event per action at its step
 * (trainrun/pipelining.h). */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainrun/error.h"
#include "trainrun/pipelining.h"

/* Every rank's actions as complete events: at unit time steps (times
 * NULL), or at their measured times in microseconds from the earliest. */
static char* format(const tr_pp_schedule_t* s, const double* const* times) {
  double t0 = 0;
  int have = 0;
  for (int r = 0; times && r < s->n_ranks; r++)
    for (int64_t t = 0; t < s->len[r]; t++)
      if (times[r] && times[r][2 * t + 1] > 0 &&
          (!have || times[r][2 * t] < t0)) {
        t0 = times[r][2 * t];
        have = 1;
      }
  size_t cap = 32, len = 0;
  for (int r = 0; r < s->n_ranks; r++)
    cap += (size_t)s->len[r] * (TR_PP_ACTION_STRLEN + 160);
  char* b = malloc(cap);
  if (!b) return NULL;
  len += (size_t)snprintf(b, cap, "{\"traceEvents\": [");
  int first = 1;
  char name[TR_PP_ACTION_STRLEN];
  for (int r = 0; r < s->n_ranks; r++)
    for (int64_t t = 0; t < s->len[r]; t++) {
      const tr_pp_action_t* a = &s->acts[r][t];
      if (a->type == TR_PP_NONE) continue;
      if (times && (!times[r] || !(times[r][2 * t + 1] > 0))) continue;
      /* PyTorch counts F, B and W as computation, everything else (I and
       * OVERLAP_F_B included) as communication */
      int comp = a->type == TR_PP_F || a->type == TR_PP_B || a->type == TR_PP_W;
      char when[64];
      if (times)
        snprintf(when, sizeof when, "\"ts\": %.3f, \"dur\": %.3f",
                 (times[r][2 * t] - t0) * 1e6,
                 (times[r][2 * t + 1] - times[r][2 * t]) * 1e6);
      else
        snprintf(when, sizeof when, "\"ts\": %lld, \"dur\": 1", (long long)t);
      len += (size_t)snprintf(
          b + len, cap - len,
          "%s{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": %d, "
          "\"tid\": %d, %s}",
          first ? "" : ", ", tr_pp_action_str(a, name, sizeof name),
          comp ? "computation" : "communication", r, r, when);
      first = 0;
    }
  snprintf(b + len, cap - len, "]}");
  return b;
}

char* tr_pp_trace_format(const tr_pp_schedule_t* s) { return format(s, NULL); }

char* tr_pp_trace_format_timed(const tr_pp_schedule_t* s,
                               const double* const* times) {
  return format(s, times);
}

/* text into path (created or truncated); frees text */
static int write_text(char* text, const char* path) {
  if (!text) return TR_ENOMEM;
  FILE* f = fopen(path, "wb");
  if (!f) {
    int rc = tr_err_from_errno();
    free(text);
    return rc;
  }
  size_t n = strlen(text);
  int rc = fwrite(text, 1, n, f) == n ? 0 : TR_EIO;
  if (fclose(f) != 0 && rc == 0) rc = TR_EIO;
  free(text);
  return rc;
}

int tr_pp_trace_write(const tr_pp_schedule_t* s, const char* path) {
  return write_text(tr_pp_trace_format(s), path);
}

int tr_pp_trace_write_timed(const tr_pp_schedule_t* s,
                            const double* const* times, const char* path) {
  return write_text(tr_pp_trace_format_timed(s, times), path);
}
