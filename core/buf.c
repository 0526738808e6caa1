/* core/buf.c: the growable buffer and array growth of core/buf.h. */
#include "config.h"

#include "core/buf.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainrun/error.h"

/* Capacity for need units, from cap: doubling, starting at first. */
static int next_cap(size_t cap, size_t need, size_t first, size_t max,
                    size_t* out) {
  if (need > max) return TR_ENOMEM;
  size_t c = cap ? cap : first;
  while (c < need) c = c > max / 2 ? max : c * 2;
  *out = c;
  return 0;
}

int tr__grow(void* pp, size_t* cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t nc;
  if (elem == 0 || next_cap(*cap, need, 16, SIZE_MAX / elem, &nc) < 0)
    return TR_ENOMEM;
  void* p;
  memcpy(&p, pp, sizeof p); /* pp is a T**: read and write it bytewise */
  void* np = realloc(p, nc * elem);
  if (!np) return TR_ENOMEM;
  memcpy(pp, &np, sizeof np);
  *cap = nc;
  return 0;
}

void tr__buf_init(tr__buf_t* b) { memset(b, 0, sizeof *b); }

int tr__buf_grow(tr__buf_t* b, size_t extra) {
  if (b->oom) return TR_ENOMEM;
  if (b->buf && extra < b->cap - b->len) return 0;
  size_t nc;
  if (extra > SIZE_MAX / 2 - b->len ||
      next_cap(b->cap, b->len + extra + 1, 256, SIZE_MAX / 2, &nc) < 0) {
    b->oom = 1;
    return TR_ENOMEM;
  }
  char* p = realloc(b->buf, nc);
  if (!p) {
    b->oom = 1;
    return TR_ENOMEM;
  }
  if (!b->buf) p[0] = '\0';
  b->buf = p;
  b->cap = nc;
  return 0;
}

int tr__buf_add(tr__buf_t* b, const void* p, size_t n) {
  TR_CHECK(tr__buf_grow(b, n));
  if (n) memcpy(b->buf + b->len, p, n);
  b->len += n;
  b->buf[b->len] = '\0';
  return 0;
}

int tr__buf_addstr(tr__buf_t* b, const char* s) {
  return tr__buf_add(b, s, strlen(s));
}

int tr__buf_addch(tr__buf_t* b, char c) { return tr__buf_add(b, &c, 1); }

int tr__buf_vaddf(tr__buf_t* b, const char* fmt, va_list ap) {
  TR_CHECK(tr__buf_grow(b, 64));
  va_list aq;
  va_copy(aq, ap);
  int n = vsnprintf(b->buf + b->len, b->cap - b->len, fmt, aq);
  va_end(aq);
  if (n < 0) {
    b->buf[b->len] = '\0';
    return TR_EINVAL;
  }
  if ((size_t)n >= b->cap - b->len) {
    int rc = tr__buf_grow(b, (size_t)n);
    if (rc < 0) {
      b->buf[b->len] = '\0'; /* the truncated attempt overwrote it */
      return rc;
    }
    vsnprintf(b->buf + b->len, b->cap - b->len, fmt, ap);
  }
  b->len += (size_t)n;
  return 0;
}

int tr__buf_addf(tr__buf_t* b, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = tr__buf_vaddf(b, fmt, ap);
  va_end(ap);
  return rc;
}

void tr__buf_setlen(tr__buf_t* b, size_t len) {
  b->len = len;
  if (b->buf) b->buf[len] = '\0';
}

void tr__buf_reset(tr__buf_t* b) {
  b->oom = 0;
  tr__buf_setlen(b, 0);
}

void tr__buf_shrink(tr__buf_t* b, size_t keep) {
  if (b->len == 0 && b->cap > keep) tr__buf_release(b);
}

char* tr__buf_detach(tr__buf_t* b, size_t* len) {
  if (!b->oom && !b->buf) tr__buf_add(b, "", 0);
  char* s = b->oom ? NULL : b->buf;
  if (len) *len = s ? b->len : 0;
  if (!s) free(b->buf);
  tr__buf_init(b);
  return s;
}

void tr__buf_release(tr__buf_t* b) {
  free(b->buf);
  tr__buf_init(b);
}
