/* pipelining/csv.c: PyTorch's compute_only CSV of a schedule (_dump_csv /
 * _load_csv): one row per rank, its actions comma-separated in text form,
 * an empty cell an idle slot (trainrun/pipelining.h). */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainrun/error.h"
#include "trainrun/pipelining.h"

static int blank(char c) { return c == ' ' || c == '\t'; }

/* One cell [p, e) of row `row` starting at column `col` into rank's list. */
static int put_cell(tr_pp_schedule_t* s, int rank, const char* p, const char* e,
                    const char* name, int row, int col, char* err,
                    size_t errlen) {
  const char* b = p;
  while (b < e && blank(*b)) b++;
  while (e > b && blank(e[-1])) e--;
  /* Python's csv.writer writes a lone empty cell as "" */
  if (e - b == 2 && b[0] == '"' && b[1] == '"') b = e;
  tr_pp_action_t a = {.type = TR_PP_NONE, .micro = -1};
  if (b < e) {
    char tok[TR_PP_ACTION_STRLEN];
    size_t n = (size_t)(e - b);
    int ok = n < sizeof tok;
    if (ok) {
      memcpy(tok, b, n);
      tok[n] = 0;
      ok = tr_pp_action_parse(tok, &a) == 0;
    }
    if (!ok) {
      if (err && errlen)
        snprintf(err, errlen, "%s:%d:%d: bad action '%.*s'", name, row, col,
                 (int)(n > 48 ? 48 : n), b);
      return TR_EPARSE;
    }
  }
  return tr_pp_schedule_push(s, rank, a);
}

int tr_pp_csv_parse(const char* text, size_t n, const char* name,
                    tr_pp_schedule_t* out, char* err, size_t errlen) {
  memset(out, 0, sizeof *out);
  /* rows: lines, the last one's newline optional */
  int rows = 0;
  for (size_t i = 0; i < n; i++)
    if (text[i] == '\n' || i == n - 1) rows++;
  if (rows == 0) {
    if (err && errlen) snprintf(err, errlen, "%s: no rows (no ranks)", name);
    return TR_EPARSE;
  }
  TR_CHECK(tr_pp_schedule_init(out, rows));
  const char* p = text;
  const char* end = text + n;
  for (int r = 0; r < rows; r++) {
    const char* eol = memchr(p, '\n', (size_t)(end - p));
    const char* next = eol ? eol + 1 : end;
    if (!eol) eol = end;
    if (eol > p && eol[-1] == '\r') eol--;
    if (eol > p) { /* an empty line is a rank with no actions */
      const char* c = p;
      for (;;) {
        const char* comma = memchr(c, ',', (size_t)(eol - c));
        const char* ce = comma ? comma : eol;
        int rc =
            put_cell(out, r, c, ce, name, r + 1, (int)(c - p) + 1, err, errlen);
        if (rc < 0) {
          tr_pp_schedule_release(out);
          return rc;
        }
        if (!comma) break;
        c = comma + 1;
      }
    }
    p = next;
  }
  return 0;
}

int tr_pp_csv_load(const char* path, tr_pp_schedule_t* out, char* err,
                   size_t errlen) {
  memset(out, 0, sizeof *out);
  FILE* f = fopen(path, "rb");
  if (!f) {
    int rc = tr_err_from_errno();
    if (err && errlen) snprintf(err, errlen, "%s: %s", path, tr_strerror(rc));
    return rc;
  }
  char* text = NULL;
  size_t len = 0, cap = 0;
  int rc = 0;
  for (;;) {
    if (len + 4096 > cap) {
      cap = cap ? 2 * cap : 8192;
      char* q = realloc(text, cap);
      if (!q) {
        rc = TR_ENOMEM;
        break;
      }
      text = q;
    }
    size_t got = fread(text + len, 1, cap - len, f);
    len += got;
    if (got == 0) {
      if (ferror(f)) {
        rc = TR_EIO;
        if (err && errlen) snprintf(err, errlen, "%s: read error", path);
      }
      break;
    }
  }
  fclose(f);
  if (rc == 0) rc = tr_pp_csv_parse(text, len, path, out, err, errlen);
  free(text);
  return rc;
}

char* tr_pp_csv_format(const tr_pp_schedule_t* s) {
  size_t cap = 64, len = 0;
  for (int r = 0; r < s->n_ranks; r++) cap += 4 + (size_t)s->len[r] * 40;
  char* b = malloc(cap);
  if (!b) return NULL;
  char buf[TR_PP_ACTION_STRLEN];
  for (int r = 0; r < s->n_ranks; r++) {
    /* Python's csv.writer quotes a lone empty cell */
    if (s->len[r] == 1 && s->acts[r][0].type == TR_PP_NONE) {
      memcpy(b + len, "\"\"", 2);
      len += 2;
    } else {
      for (int64_t t = 0; t < s->len[r]; t++) {
        if (t) b[len++] = ',';
        size_t n = strlen(tr_pp_action_str(&s->acts[r][t], buf, sizeof buf));
        memcpy(b + len, buf, n);
        len += n;
      }
    }
    memcpy(b + len, "\r\n", 2);
    len += 2;
  }
  b[len] = 0;
  return b;
}

int tr_pp_csv_save(const tr_pp_schedule_t* s, const char* path) {
  char* text = tr_pp_csv_format(s);
  if (!text) return TR_ENOMEM;
  FILE* f = fopen(path, "wb");
  int rc = f ? 0 : tr_err_from_errno();
  if (f) {
    size_t n = strlen(text);
    if (fwrite(text, 1, n, f) != n) rc = TR_EIO;
    if (fclose(f) != 0 && rc == 0) rc = tr_err_from_errno();
  }
  free(text);
  return rc;
}
