/* pipelining/schedule.c: PyTorch's schedule IR — action types, their text
 * form (`0F1`) both ways — and the one-stage schedule the trainer runs
 * without pipeline parallelism (trainrun/pipelining.h). */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainrun/error.h"
#include "trainrun/pipelining.h"

static const char* const type_names[] = {[TR_PP_F] = "F",
                                         [TR_PP_I] = "I",
                                         [TR_PP_W] = "W",
                                         [TR_PP_B] = "B",
                                         [TR_PP_UNSHARD] = "UNSHARD",
                                         [TR_PP_RESHARD] = "RESHARD",
                                         [TR_PP_SEND_F] = "SEND_F",
                                         [TR_PP_RECV_F] = "RECV_F",
                                         [TR_PP_SEND_B] = "SEND_B",
                                         [TR_PP_RECV_B] = "RECV_B",
                                         [TR_PP_REDUCE_GRAD] = "REDUCE_GRAD",
                                         [TR_PP_NONE] = ""};
enum { NTYPES = sizeof type_names / sizeof type_names[0] };

const char* tr_pp_type_name(tr_pp_type_t t) {
  return (unsigned)t < NTYPES ? type_names[t] : "?";
}

/* FSDP's actions carry no micro-batch; every other one does. */
static int has_micro(tr_pp_type_t t) {
  return t != TR_PP_UNSHARD && t != TR_PP_RESHARD && t != TR_PP_REDUCE_GRAD;
}

const char* tr_pp_action_str(const tr_pp_action_t* a, char* buf, size_t n) {
  if (a->type == TR_PP_NONE) {
    if (n) buf[0] = 0;
  } else if (has_micro(a->type)) {
    snprintf(buf, n, "%d%s%" PRId64, a->stage, tr_pp_type_name(a->type),
             a->micro);
  } else {
    snprintf(buf, n, "%d%s", a->stage, tr_pp_type_name(a->type));
  }
  return buf;
}

/* A run of decimal digits at *p (at least one, at most 9 for a stage and
 * 18 for a micro-batch, so no overflow) into *out; advances *p. */
static int digits(const char** p, int max, int64_t* out) {
  const char* s = *p;
  int64_t v = 0;
  int k = 0;
  while (*s >= '0' && *s <= '9') {
    if (++k > max) return TR_EINVAL;
    v = v * 10 + (*s++ - '0');
  }
  if (k == 0) return TR_EINVAL;
  *out = v;
  *p = s;
  return 0;
}

int tr_pp_action_parse(const char* s, tr_pp_action_t* out) {
  if (!s) return TR_EINVAL;
  const char* p = s;
  int64_t stage;
  TR_CHECK(digits(&p, 9, &stage));
  /* the longest name that matches: SEND_F before a bare F is not an
   * issue (names differ in their first letter except F/…), but RESHARD
   * and REDUCE_GRAD share "RE" */
  int best = -1;
  size_t best_len = 0;
  for (int t = 0; t < (int)NTYPES; t++) {
    size_t len = strlen(type_names[t]); /* NONE's "" never wins */
    if (strncmp(p, type_names[t], len) == 0 && len > best_len) {
      best = t;
      best_len = len;
    }
  }
  if (best < 0) return TR_EINVAL;
  p += best_len;
  int64_t micro = -1;
  if (*p) TR_CHECK(digits(&p, 18, &micro));
  if (*p) return TR_EINVAL;
  if (has_micro((tr_pp_type_t)best) != (micro >= 0)) return TR_EINVAL;
  out->stage = (int)stage;
  out->type = (tr_pp_type_t)best;
  out->micro = micro;
  return 0;
}

int tr_pp_schedule_one_stage(int64_t n_micro, tr_pp_action_t* out) {
  if (n_micro < 1 || !out) return TR_EINVAL;
  for (int64_t i = 0; i < n_micro; i++) {
    out[2 * i] = (tr_pp_action_t){.stage = 0, .type = TR_PP_F, .micro = i};
    out[2 * i + 1] = (tr_pp_action_t){.stage = 0, .type = TR_PP_B, .micro = i};
  }
  return 0;
}
