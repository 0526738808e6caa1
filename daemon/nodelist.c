/* daemon/nodelist.c: Slurm's compressed host lists ("node[01-04,07]",
 * "rack[1-2]-gpu[1-2]", "a,b[3-4]") expanded into host names, so the first
 * host of SLURM_STEP_NODELIST can be the rendezvous endpoint. */
#include "core/buf.h" /* TR_GROW */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainrun/daemon.h"
#include "trainrun/error.h"

#define MAX_HOSTS (1u << 20)
#define MAX_NAME 255

typedef struct {
  char** v;
  size_t n, cap;
} names_t;

static int names_push(names_t* l, const char* s, size_t len) {
  if (l->n >= MAX_HOSTS) return TR_ELIMIT;
  if (TR_GROW(l->v, l->n + 1, l->cap) < 0) return TR_ENOMEM;
  char* c = strndup(s, len);
  if (!c) return TR_ENOMEM;
  l->v[l->n++] = c;
  return 0;
}

/* A decimal bound inside brackets: digits only. */
static int parse_bound(const char* s, size_t len, unsigned long* v) {
  if (len == 0 || len > 9) return TR_EINVAL;
  unsigned long x = 0;
  for (size_t i = 0; i < len; i++) {
    if (s[i] < '0' || s[i] > '9') return TR_EINVAL;
    x = x * 10 + (unsigned long)(s[i] - '0');
  }
  *v = x;
  return 0;
}

/* Expand one name (no top-level commas) whose text is prefix (already
 * expanded, plen bytes in buf) followed by rest. */
static int expand(names_t* out, char* buf, size_t plen, const char* rest,
                  size_t rlen) {
  const char* open = memchr(rest, '[', rlen);
  if (!open) {
    if (memchr(rest, ']', rlen)) return TR_EINVAL;
    if (plen + rlen > MAX_NAME) return TR_EINVAL;
    memcpy(buf + plen, rest, rlen);
    if (plen + rlen == 0) return TR_EINVAL;
    return names_push(out, buf, plen + rlen);
  }
  size_t head = (size_t)(open - rest);
  if (memchr(rest, ']', head)) return TR_EINVAL;
  const char* close = memchr(open, ']', rlen - head);
  if (!close || close == open + 1) return TR_EINVAL;
  if (memchr(open + 1, '[', (size_t)(close - open - 1))) return TR_EINVAL;
  if (plen + head > MAX_NAME) return TR_EINVAL;
  memcpy(buf + plen, rest, head);
  size_t base = plen + head;
  const char* after = close + 1;
  size_t alen = rlen - (size_t)(after - rest);
  /* the ranges: "01-04,07" */
  const char* p = open + 1;
  while (p < close) {
    const char* comma = memchr(p, ',', (size_t)(close - p));
    const char* end = comma ? comma : close;
    const char* dash = memchr(p, '-', (size_t)(end - p));
    unsigned long lo, hi;
    size_t width;
    if (dash) {
      width = (size_t)(dash - p);
      TR_CHECK(parse_bound(p, width, &lo));
      TR_CHECK(parse_bound(dash + 1, (size_t)(end - dash - 1), &hi));
      if (hi < lo) return TR_EINVAL;
    } else {
      width = (size_t)(end - p);
      TR_CHECK(parse_bound(p, width, &lo));
      hi = lo;
    }
    if (hi - lo >= MAX_HOSTS) return TR_ELIMIT;
    for (unsigned long x = lo; x <= hi; x++) {
      char num[32];
      int n = snprintf(num, sizeof num, "%0*lu", (int)width, x);
      if (base + (size_t)n > MAX_NAME) return TR_EINVAL;
      memcpy(buf + base, num, (size_t)n);
      TR_CHECK(expand(out, buf, base + (size_t)n, after, alen));
    }
    p = comma ? comma + 1 : close;
    if (comma && comma + 1 == close) return TR_EINVAL;
  }
  return 0;
}

void tr_nodelist_free(char** hosts, size_t n) {
  if (!hosts) return;
  for (size_t i = 0; i < n; i++) free(hosts[i]);
  free(hosts);
}

int tr_nodelist_expand(const char* list, char*** hosts, size_t* n) {
  names_t out = {0};
  char buf[MAX_NAME + 1];
  int rc = 0;
  *hosts = NULL;
  *n = 0;
  if (!list || !*list) return TR_EINVAL;
  const char* p = list;
  while (*p) {
    /* the next top-level item ends at a comma outside brackets */
    const char* q = p;
    int depth = 0;
    while (*q && !(*q == ',' && depth == 0)) {
      if (*q == '[') depth++;
      if (*q == ']' && --depth < 0) break;
      q++;
    }
    if (depth != 0 || q == p) {
      rc = TR_EINVAL;
      goto out_free;
    }
    TR_CHECK_GOTO(expand(&out, buf, 0, p, (size_t)(q - p)), rc, out_free);
    p = *q == ',' ? q + 1 : q;
    if (*q == ',' && !*p) {
      rc = TR_EINVAL; /* trailing comma */
      goto out_free;
    }
  }
  *hosts = out.v;
  *n = out.n;
  return 0;
out_free:
  tr_nodelist_free(out.v, out.n);
  return rc;
}

int tr_nodelist_first(const char* list, char* out, size_t cap) {
  char** hosts;
  size_t n;
  TR_CHECK(tr_nodelist_expand(list, &hosts, &n));
  int rc = 0;
  if (strlen(hosts[0]) >= cap)
    rc = TR_ERANGE;
  else
    strcpy(out, hosts[0]);
  tr_nodelist_free(hosts, n);
  return rc;
}
