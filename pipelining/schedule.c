/* pipelining/schedule.c: PyTorch's schedule IR — action types, their text
 * form (`0F1`, `(0F3;3B1)OVERLAP_F_B`) both ways — and the one-stage
 * schedule the trainer runs without pipeline parallelism
 * (trainrun/pipelining.h). */
#include "config.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipelining/internal.h"
#include "trainrun/error.h"
#include "trainrun/pipelining.h"

int tr__pp_fail(char* err, size_t errlen, int rc, const char* fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return rc;
}

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
                                         [TR_PP_NONE] = "",
                                         [TR_PP_OVERLAP_F_B] = "OVERLAP_F_B"};
enum { NTYPES = sizeof type_names / sizeof type_names[0] };

const char* tr_pp_type_name(tr_pp_type_t t) {
  return (unsigned)t < NTYPES ? type_names[t] : "?";
}

/* FSDP's actions and OVERLAP_F_B carry no micro-batch; every other one
 * does. */
static int has_micro(tr_pp_type_t t) {
  return t != TR_PP_UNSHARD && t != TR_PP_RESHARD && t != TR_PP_REDUCE_GRAD &&
         t != TR_PP_OVERLAP_F_B;
}

const char* tr_pp_action_str(const tr_pp_action_t* a, char* buf, size_t n) {
  if (a->type == TR_PP_NONE) {
    if (n) buf[0] = 0;
  } else if (a->type == TR_PP_OVERLAP_F_B) {
    const struct tr_pp_sub* f = &a->sub[0];
    const struct tr_pp_sub* b = &a->sub[1];
    snprintf(buf, n, "(%d%s%" PRId64 ";%d%s%" PRId64 ")OVERLAP_F_B", f->stage,
             tr_pp_type_name(f->type), f->micro, b->stage,
             tr_pp_type_name(b->type), b->micro);
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

/* One plain action, [p, end): `<stage><TYPE><micro>`. */
static int parse_plain(const char* p, const char* end, tr_pp_action_t* out) {
  int64_t stage;
  TR_CHECK(digits(&p, 9, &stage));
  /* the longest name that matches: SEND_F before a bare F is not an
   * issue (names differ in their first letter except F/…), but RESHARD
   * and REDUCE_GRAD share "RE" */
  int best = -1;
  size_t best_len = 0;
  for (int t = 0; t < (int)NTYPES; t++) {
    size_t len = strlen(type_names[t]); /* NONE's "" never wins */
    if ((size_t)(end - p) >= len && strncmp(p, type_names[t], len) == 0 &&
        len > best_len) {
      best = t;
      best_len = len;
    }
  }
  if (best < 0 || best == TR_PP_OVERLAP_F_B) return TR_EINVAL;
  p += best_len;
  int64_t micro = -1;
  if (p < end) TR_CHECK(digits(&p, 18, &micro));
  if (p != end) return TR_EINVAL;
  if (has_micro((tr_pp_type_t)best) != (micro >= 0)) return TR_EINVAL;
  *out = (tr_pp_action_t){
      .stage = (int)stage, .type = (tr_pp_type_t)best, .micro = micro};
  return 0;
}

int tr_pp_action_parse(const char* s, tr_pp_action_t* out) {
  if (!s) return TR_EINVAL;
  const char* end = s + strlen(s);
  if (*s != '(') return parse_plain(s, end, out);
  /* (<F>;<B or I>)OVERLAP_F_B */
  const char* semi = strchr(s, ';');
  const char* close = strchr(s, ')');
  if (!semi || !close || semi > close || strcmp(close + 1, "OVERLAP_F_B"))
    return TR_EINVAL;
  tr_pp_action_t f, b;
  TR_CHECK(parse_plain(s + 1, semi, &f));
  TR_CHECK(parse_plain(semi + 1, close, &b));
  if (f.type != TR_PP_F || (b.type != TR_PP_B && b.type != TR_PP_I))
    return TR_EINVAL;
  *out = (tr_pp_action_t){
      .stage = -1,
      .type = TR_PP_OVERLAP_F_B,
      .micro = -1,
      .sub = {{f.stage, f.type, f.micro}, {b.stage, b.type, b.micro}}};
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
