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

char* tr_pp_trace_format(const tr_pp_schedule_t* s) {
  size_t cap = 32, len = 0;
  for (int r = 0; r < s->n_ranks; r++)
    cap += (size_t)s->len[r] * (TR_PP_ACTION_STRLEN + 128);
  char* b = malloc(cap);
  if (!b) return NULL;
  len += (size_t)snprintf(b, cap, "{\"traceEvents\": [");
  int first = 1;
  char name[TR_PP_ACTION_STRLEN];
  for (int r = 0; r < s->n_ranks; r++)
    for (int64_t t = 0; t < s->len[r]; t++) {
      const tr_pp_action_t* a = &s->acts[r][t];
      if (a->type == TR_PP_NONE) continue;
      /* PyTorch counts F, B and W as computation, everything else (I and
       * OVERLAP_F_B included) as communication */
      int comp = a->type == TR_PP_F || a->type == TR_PP_B || a->type == TR_PP_W;
      len += (size_t)snprintf(
          b + len, cap - len,
          "%s{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": %d, "
          "\"tid\": %d, \"ts\": %lld, \"dur\": 1}",
          first ? "" : ", ", tr_pp_action_str(a, name, sizeof name),
          comp ? "computation" : "communication", r, r, (long long)t);
      first = 0;
    }
  snprintf(b + len, cap - len, "]}");
  return b;
}

int tr_pp_trace_write(const tr_pp_schedule_t* s, const char* path) {
  char* text = tr_pp_trace_format(s);
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
