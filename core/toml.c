/* core/toml.c: the TOML 1.0 parser.
 *
 * One pass over the bytes, no separate tokenizer: the statement loop reads
 * key/value lines and table headers; values are read by recursive descent
 * (only arrays and inline tables recurse, bounded by TR__TOML_MAX_DEPTH).
 * Values go straight into the tree of core/toml_value.c.
 *
 * Which tables may be extended is decided by flags on the table nodes
 * (core/toml_internal.h):
 *   - [a.b.c] creates a and a.b as IMPLICIT tables; a later [a] may define
 *     an IMPLICIT table once (it becomes HEADER); a HEADER table is never
 *     defined again;
 *   - dotted keys create (or walk through) DOTTED tables; they may walk
 *     through IMPLICIT and DOTTED tables but not HEADER ones, and a header
 *     may not define a DOTTED table (it may add sub-tables to it);
 *   - inline tables are FROZEN once their '}' is read; static arrays are
 *     never extended; [[a]] appends to an AOT array, and headers and keys
 *     below a walk into its last element.
 * Dotted keys can only ever reach DOTTED tables of their own section, so no
 * per-section bookkeeping is needed.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>  /* open */
#include <limits.h> /* INT_MAX */
#include <locale.h> /* newlocale, strtod_l: floats never see LC_NUMERIC */
#include <math.h>   /* INFINITY, NAN */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/buf.h" /* TR_GROW */
#include "core/toml_internal.h"
#include "trainrun/error.h"

typedef struct {
  const char* s; /* decoded key, in the arena */
  size_t len;
  const char* at; /* where it is written */
  int line, col;
} key_part_t;

typedef struct {
  const char* base; /* the document */
  const char* p;    /* next byte to read */
  const char* end;
  const char* line_start; /* first byte of the line p is on */
  int line;
  tr_toml_error_t* err;
  tr__toml_arena_t* arena;
  tr_toml_value_t* root;
  tr_toml_value_t* cur; /* table of the current [section] */
  char* buf;            /* string being decoded */
  size_t buf_len, buf_cap;
  /* Keys from the root to the value being read: the section header's, then
   * each key/value's (inline tables nest further). Names keys in errors. */
  key_part_t* path;
  size_t path_n, path_cap;
} parser_t;

/* ---- errors ---- */

static int col_of(const parser_t* P, const char* at) {
  return (int)(at - P->line_start) + 1;
}

static int fail(parser_t* P, const char* at, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(parser_t* P, const char* at, const char* fmt, ...) {
  if (!P->err) return TR_EPARSE;
  int line = P->line;
  const char* ls = P->line_start;
  if (at < ls) { /* an earlier line, e.g. an unterminated string's quote */
    line = 1;
    ls = P->base;
    for (const char* q = P->base; q < at; q++)
      if (*q == '\n') {
        line++;
        ls = q + 1;
      }
  }
  P->err->line = line;
  P->err->col = (int)(at - ls) + 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(P->err->message, sizeof P->err->message, fmt, ap);
  va_end(ap);
  return TR_EPARSE;
}

static int nomem(parser_t* P) {
  if (P->err) {
    P->err->line = 0;
    P->err->col = 0;
    snprintf(P->err->message, sizeof P->err->message, "out of memory");
  }
  return TR_ENOMEM;
}

/* Length of the valid UTF-8 sequence at s (2 to 4), 0 if invalid. Rejects
 * overlong forms, surrogates and code points above U+10FFFF. */
static int utf8_seq(const char* s0, const char* end) {
  const unsigned char* s = (const unsigned char*)s0;
  unsigned c = s[0], lo = 0x80, hi = 0xBF;
  int n;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (end - s0 < n || s[1] < lo || s[1] > hi) return 0;
  for (int i = 2; i < n; i++)
    if (s[i] < 0x80 || s[i] > 0xBF) return 0;
  return n;
}

/* What is at `at`, for "found ..." in messages. */
static const char* describe(const parser_t* P, const char* at, char* buf,
                            size_t cap) {
  if (at >= P->end) return "end of file";
  unsigned char c = (unsigned char)*at;
  if (c == '\n' || (c == '\r' && at + 1 < P->end && at[1] == '\n'))
    return "newline";
  if (c == ' ') return "space";
  if (c == '\t') return "tab";
  if (c == '\'') {
    snprintf(buf, cap, "\"'\"");
  } else if (c > 0x20 && c < 0x7f) {
    snprintf(buf, cap, "'%c'", c);
  } else if (c < 0x80) {
    snprintf(buf, cap, "control character U+%04X", c);
  } else {
    int n = utf8_seq(at, P->end);
    if (n) {
      uint32_t cp = (uint32_t)(c & (0xFF >> (n + 1)));
      for (int i = 1; i < n; i++) cp = (cp << 6) | (at[i] & 0x3F);
      snprintf(buf, cap, "'%.*s' (U+%04X)", n, at, (unsigned)cp);
    } else
      snprintf(buf, cap, "invalid UTF-8 byte 0x%02x", c);
  }
  return buf;
}

static int is_bare(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '_' || c == '-';
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* Bytes that may follow a scalar value. */
static int is_delim(const parser_t* P, const char* q) {
  if (q >= P->end) return 1;
  switch (*q) {
    case ' ':
    case '\t':
    case '\n':
    case '\r':
    case '#':
    case ',':
    case ']':
    case '}':
      return 1;
    default:
      return 0;
  }
}

/* The token at `from` up to the next delimiter, quotable in a message:
 * text from `start` (on the same line), at most ~40 bytes. */
static const char* token(const parser_t* P, const char* start, const char* from,
                         char* buf, size_t cap) {
  const char* q = from;
  while (!is_delim(P, q)) q++;
  size_t n = (size_t)(q - start), max = cap - 4, o = 0;
  for (size_t i = 0; i < n && i < max; i++) {
    unsigned char c = (unsigned char)start[i];
    buf[o++] = (c < 0x20 || c >= 0x7f) ? '?' : (char)c;
  }
  if (n > max) {
    memcpy(buf + o, "...", 3);
    o += 3;
  }
  buf[o] = '\0';
  return buf;
}

/* parts[0..n) as "a.b.\"c d\"", for messages. */
static const char* key_text(const key_part_t* parts, size_t n, char* out,
                            size_t cap) {
  size_t o = 0, max = cap - 4;
  for (size_t i = 0; i < n && o < max; i++) {
    const key_part_t* k = &parts[i];
    int bare = k->len > 0;
    for (size_t j = 0; j < k->len && bare; j++)
      bare = is_bare((unsigned char)k->s[j]);
    if (i && o < max) out[o++] = '.';
    if (!bare && o < max) out[o++] = '"';
    for (size_t j = 0; j < k->len && o < max; j++) {
      unsigned char c = (unsigned char)k->s[j];
      if (c == '"' || c == '\\') {
        if (o + 2 > max) break;
        out[o++] = '\\';
        out[o++] = (char)c;
      } else if (c < 0x20 || c == 0x7f) {
        if (o + 6 > max) break;
        o += (size_t)snprintf(out + o, 7, "\\u%04X", c);
      } else {
        out[o++] = (char)c;
      }
    }
    if (!bare && o < max) out[o++] = '"';
  }
  if (o >= max) {
    memcpy(out + max, "...", 3);
    o = max + 3;
  }
  out[o] = '\0';
  return out;
}

/* The full key of path[0..n). */
static const char* key_path(const parser_t* P, size_t n, char* out,
                            size_t cap) {
  return key_text(P->path, n, out, cap);
}

#define PATH_BUF 160
#define DESC_BUF 40
#define TOKEN_BUF 48

/* ---- small readers ---- */

static void skip_ws(parser_t* P) {
  while (P->p < P->end && (*P->p == ' ' || *P->p == '\t')) P->p++;
}

static void note_newline(parser_t* P, const char* after) {
  P->line++;
  P->line_start = after;
}

static int bare_cr(parser_t* P, const char* at) {
  return fail(P, at, "carriage return without line feed");
}

/* At '#': read the comment up to (not including) its newline. */
static int skip_comment(parser_t* P) {
  const char* q = P->p + 1;
  while (q < P->end) {
    unsigned char c = (unsigned char)*q;
    if (c == '\t' || (c >= 0x20 && c < 0x7f)) {
      q++;
    } else if (c == '\n' || c == '\r') {
      break; /* the caller reads the newline (and rejects a bare CR) */
    } else if (c < 0x80) {
      return fail(P, q, "control character U+%04X in comment", c);
    } else {
      int n = utf8_seq(q, P->end);
      if (!n) return fail(P, q, "invalid UTF-8 byte 0x%02x in comment", c);
      q += n;
    }
  }
  P->p = q;
  return 0;
}

/* At a newline (or the end): consume it. */
static int eat_newline(parser_t* P) {
  const char* q = P->p;
  if (q >= P->end) return 0;
  if (*q == '\n') {
    P->p = q + 1;
  } else if (*q == '\r' && q + 1 < P->end && q[1] == '\n') {
    P->p = q + 2;
  } else if (*q == '\r') {
    return bare_cr(P, q);
  } else {
    char d[DESC_BUF];
    return fail(P, q, "expected newline, found %s",
                describe(P, q, d, sizeof d));
  }
  note_newline(P, P->p);
  return 0;
}

/* Whitespace, comments and newlines, as allowed inside arrays. */
static int skip_ws_lines(parser_t* P) {
  for (;;) {
    skip_ws(P);
    if (P->p >= P->end) return 0;
    char c = *P->p;
    if (c == '#')
      TR_CHECK(skip_comment(P));
    else if (c == '\n' || c == '\r')
      TR_CHECK(eat_newline(P));
    else
      return 0;
  }
}

/* After a statement: whitespace, an optional comment, then a newline. */
static int end_of_line(parser_t* P, const char* what) {
  skip_ws(P);
  if (P->p < P->end && *P->p == '#') TR_CHECK(skip_comment(P));
  if (P->p >= P->end || *P->p == '\n' || *P->p == '\r') return 0;
  char d[DESC_BUF];
  return fail(P, P->p, "expected end of line after %s, found %s", what,
              describe(P, P->p, d, sizeof d));
}

/* ---- the decode buffer ---- */

static int buf_put(parser_t* P, const char* s, size_t n) {
  if (n >= SIZE_MAX - P->buf_len ||
      TR_GROW(P->buf, P->buf_len + n + 1, P->buf_cap) < 0)
    return nomem(P);
  memcpy(P->buf + P->buf_len, s, n);
  P->buf_len += n;
  return 0;
}

static int buf_put_utf8(parser_t* P, uint32_t cp) {
  char u[4];
  size_t n;
  if (cp < 0x80) {
    u[0] = (char)cp;
    n = 1;
  } else if (cp < 0x800) {
    u[0] = (char)(0xC0 | (cp >> 6));
    u[1] = (char)(0x80 | (cp & 0x3F));
    n = 2;
  } else if (cp < 0x10000) {
    u[0] = (char)(0xE0 | (cp >> 12));
    u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    u[2] = (char)(0x80 | (cp & 0x3F));
    n = 3;
  } else {
    u[0] = (char)(0xF0 | (cp >> 18));
    u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    u[3] = (char)(0x80 | (cp & 0x3F));
    n = 4;
  }
  return buf_put(P, u, n);
}

/* ---- strings ---- */

static int hex_val(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* At '\\' in a basic string: decode one escape into the buffer. */
static int read_escape(parser_t* P, const char* open, const char** sp) {
  const char* e = *sp;
  if (e + 1 >= P->end) return fail(P, open, "unterminated string");
  char c = e[1], out;
  switch (c) {
    case 'b':
      out = '\b';
      break;
    case 't':
      out = '\t';
      break;
    case 'n':
      out = '\n';
      break;
    case 'f':
      out = '\f';
      break;
    case 'r':
      out = '\r';
      break;
    case '"':
      out = '"';
      break;
    case '\\':
      out = '\\';
      break;
    case 'u':
    case 'U': {
      int ndig = c == 'u' ? 4 : 8;
      uint32_t cp = 0;
      for (int i = 0; i < ndig; i++) {
        const char* h = e + 2 + i;
        if (h >= P->end || hex_val(*h) < 0)
          return fail(P, e,
                      "invalid escape sequence '%.*s': expected %d hex "
                      "digits",
                      (int)(h - e), e, ndig);
        cp = cp * 16 + (uint32_t)hex_val(*h);
      }
      if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return fail(P, e,
                    "invalid escape sequence '%.*s': not a unicode scalar "
                    "value",
                    ndig + 2, e);
      TR_CHECK(buf_put_utf8(P, cp));
      *sp = e + 2 + ndig;
      return 0;
    }
    default:
      if ((unsigned char)c > 0x20 && (unsigned char)c < 0x7f)
        return fail(P, e, "invalid escape sequence '\\%c'", c);
      char d[DESC_BUF];
      return fail(P, e, "invalid escape sequence: '\\' followed by %s",
                  describe(P, e + 1, d, sizeof d));
  }
  TR_CHECK(buf_put(P, &out, 1));
  *sp = e + 2;
  return 0;
}

/* A byte that is not plain string text: control, DEL or non-ASCII. Appends a
 * valid UTF-8 sequence and advances; fails on anything else. */
static int string_other(parser_t* P, const char** sp) {
  const char* s = *sp;
  unsigned char c = (unsigned char)*s;
  if (c == '\r') return bare_cr(P, s);
  if (c < 0x80) return fail(P, s, "control character U+%04X in string", c);
  int n = utf8_seq(s, P->end);
  if (!n) return fail(P, s, "invalid UTF-8 byte 0x%02x in string", c);
  TR_CHECK(buf_put(P, s, (size_t)n));
  *sp = s + n;
  return 0;
}

/* Plain text of a basic (quote '"') or literal (quote '\'') string. */
static int is_plain(unsigned char c, char quote) {
  return (c >= 0x20 && c < 0x7f && c != (unsigned char)quote &&
          (quote == '\'' || c != '\\')) ||
         c == '\t';
}

/* "..." or '...' (one line) into the buffer. */
static int read_line_string(parser_t* P) {
  const char* open = P->p;
  char quote = *open;
  const char* s = open + 1;
  for (;;) {
    const char* run = s;
    while (s < P->end && is_plain((unsigned char)*s, quote)) s++;
    if (s > run) TR_CHECK(buf_put(P, run, (size_t)(s - run)));
    if (s >= P->end) return fail(P, open, "unterminated string");
    if (*s == quote) break;
    if (*s == '\\' && quote == '"') {
      TR_CHECK(read_escape(P, open, &s));
    } else if (*s == '\n' || (*s == '\r' && s + 1 < P->end && s[1] == '\n')) {
      return fail(P, open, "unterminated string");
    } else {
      TR_CHECK(string_other(P, &s));
    }
  }
  P->p = s + 1;
  return 0;
}

/* """...""" or '''...''' into the buffer; newlines become LF. */
static int read_ml_string(parser_t* P) {
  const char* open = P->p;
  char quote = *open;
  const char* s = open + 3;
  if (s < P->end && *s == '\n') {
    note_newline(P, ++s);
  } else if (P->end - s >= 2 && s[0] == '\r' && s[1] == '\n') {
    s += 2;
    note_newline(P, s);
  }
  for (;;) {
    const char* run = s;
    while (s < P->end && is_plain((unsigned char)*s, quote)) s++;
    if (s > run) TR_CHECK(buf_put(P, run, (size_t)(s - run)));
    if (s >= P->end) return fail(P, open, "unterminated multi-line string");
    char c = *s;
    if (c == quote) {
      size_t n = 1;
      while (s + n < P->end && s[n] == quote && n < 5) n++;
      if (n < 3) {
        TR_CHECK(buf_put(P, s, n));
        s += n;
        continue;
      }
      /* up to two quotes may sit right before the closing three */
      TR_CHECK(buf_put(P, s, n - 3));
      P->p = s + n;
      return 0;
    }
    if (c == '\\' && quote == '"') {
      const char* t = s + 1;
      while (t < P->end && (*t == ' ' || *t == '\t')) t++;
      if (t < P->end && (*t == '\n' || *t == '\r')) {
        /* line-ending backslash: drop whitespace and newlines after it */
        s = t;
        for (;;) {
          if (s < P->end && (*s == ' ' || *s == '\t')) {
            s++;
          } else if (s < P->end && *s == '\n') {
            note_newline(P, ++s);
          } else if (s < P->end && *s == '\r') {
            if (s + 1 >= P->end || s[1] != '\n') return bare_cr(P, s);
            s += 2;
            note_newline(P, s);
          } else {
            break;
          }
        }
        continue;
      }
      if (t >= P->end) return fail(P, open, "unterminated multi-line string");
      if (t > s + 1)
        return fail(P, s,
                    "invalid escape sequence: '\\' followed by whitespace "
                    "must end the line");
      TR_CHECK(read_escape(P, open, &s));
      continue;
    }
    if (c == '\n') {
      TR_CHECK(buf_put(P, "\n", 1));
      note_newline(P, ++s);
      continue;
    }
    if (c == '\r' && s + 1 < P->end && s[1] == '\n') {
      TR_CHECK(buf_put(P, "\n", 1));
      s += 2;
      note_newline(P, s);
      continue;
    }
    TR_CHECK(string_other(P, &s));
  }
}

/* Any string form at P->p; the decoded bytes are copied into the arena. */
static int read_string(parser_t* P, int allow_ml, const char** out,
                       size_t* len) {
  const char* open = P->p;
  char quote = *open;
  int ml = P->end - open >= 3 && open[1] == quote && open[2] == quote;
  if (ml && !allow_ml)
    return fail(P, open, "a multi-line string cannot be a key");
  P->buf_len = 0;
  TR_CHECK(ml ? read_ml_string(P) : read_line_string(P));
  char* s = tr__toml_strdup(P->arena, P->buf ? P->buf : "", P->buf_len);
  if (!s) return nomem(P);
  *out = s;
  *len = P->buf_len;
  return 0;
}

/* ---- keys ---- */

static int push_part(parser_t* P, const char* s, size_t len, const char* at,
                     int col) {
  if (TR_GROW(P->path, P->path_n + 1, P->path_cap) < 0) return nomem(P);
  P->path[P->path_n++] = (key_part_t){s, len, at, P->line, col};
  return 0;
}

/* A simple or dotted key: its parts are pushed onto P->path. Leaves P->p
 * after the whitespace that follows the key. */
static int parse_key(parser_t* P) {
  size_t first = P->path_n;
  for (;;) {
    const char* at = P->p;
    const char* s;
    size_t len;
    unsigned char c = at < P->end ? (unsigned char)*at : 0;
    if (at < P->end && (c == '"' || c == '\'')) {
      TR_CHECK(read_string(P, 0, &s, &len));
    } else if (at < P->end && is_bare(c)) {
      const char* q = at;
      while (q < P->end && is_bare((unsigned char)*q)) q++;
      len = (size_t)(q - at);
      if (!(s = tr__toml_strdup(P->arena, at, len))) return nomem(P);
      P->p = q;
    } else {
      char d[DESC_BUF];
      return fail(P, at, "expected a key, found %s",
                  describe(P, at, d, sizeof d));
    }
    if (P->path_n - first >= TR__TOML_MAX_DEPTH)
      return fail(P, at, "nesting deeper than %d levels", TR__TOML_MAX_DEPTH);
    TR_CHECK(push_part(P, s, len, at, col_of(P, at)));
    skip_ws(P);
    if (P->p >= P->end || *P->p != '.') return 0;
    P->p++;
    skip_ws(P);
  }
}

/* ---- the tree, as keys and headers walk it ---- */

static const char* kind_name(const tr_toml_value_t* v) {
  if (v->type == TR_TOML_ARRAY && (v->flags & TR__TOML_F_AOT))
    return "array of tables";
  return tr_toml_type_name((tr_toml_type_t)v->type);
}

static tr__toml_entry_t* entry(tr_toml_value_t* t, long i) {
  return &t->u.tab.ents[i];
}

/* A new container below `parent`, its depth checked. */
static int new_child(parser_t* P, const tr_toml_value_t* parent,
                     tr_toml_type_t type, const char* at, int line, int col,
                     tr_toml_value_t** out) {
  if (parent->depth + 1 > TR__TOML_MAX_DEPTH)
    return fail(P, at, "nesting deeper than %d levels", TR__TOML_MAX_DEPTH);
  tr_toml_value_t* v = tr__toml_value_new(P->arena, type, line, col);
  if (!v) return nomem(P);
  v->depth = (uint16_t)(parent->depth + 1);
  *out = v;
  return 0;
}

/* Table path[i] in *t, created (flagged `flags`) when absent. */
static int add_table(parser_t* P, tr_toml_value_t* t, size_t i, int flags,
                     tr_toml_value_t** out) {
  const key_part_t* k = &P->path[i];
  tr_toml_value_t* v = NULL;
  TR_CHECK(new_child(P, t, TR_TOML_TABLE, k->at, k->line, k->col, &v));
  v->flags = (uint8_t)flags;
  if (tr__toml_table_add(P->arena, t, k->s, k->len, k->line, k->col, v) < 0)
    return nomem(P);
  *out = v;
  return 0;
}

/* One step of a dotted key (not its last part): into path[i] below *t. */
static int dotted_step(parser_t* P, tr_toml_value_t** t, size_t i) {
  const key_part_t* k = &P->path[i];
  long idx = tr__toml_find(*t, k->s, k->len);
  if (idx < 0) return add_table(P, *t, i, TR__TOML_F_DOTTED, t);
  tr_toml_value_t* v = entry(*t, idx)->val;
  char path[PATH_BUF];
  if (v->type != TR_TOML_TABLE)
    return fail(P, k->at, "key '%s' already defined as %s",
                key_path(P, i + 1, path, sizeof path), kind_name(v));
  if (v->flags & TR__TOML_F_FROZEN)
    return fail(P, k->at, "cannot extend inline table '%s'",
                key_path(P, i + 1, path, sizeof path));
  if (v->flags & TR__TOML_F_HEADER)
    return fail(P, k->at, "table '%s' already defined",
                key_path(P, i + 1, path, sizeof path));
  v->flags |= TR__TOML_F_DOTTED;
  *t = v;
  return 0;
}

/* One step of a header's key (not its last part). */
static int header_step(parser_t* P, tr_toml_value_t** t, size_t i) {
  const key_part_t* k = &P->path[i];
  long idx = tr__toml_find(*t, k->s, k->len);
  if (idx < 0) return add_table(P, *t, i, TR__TOML_F_IMPLICIT, t);
  tr_toml_value_t* v = entry(*t, idx)->val;
  char path[PATH_BUF];
  if (v->type == TR_TOML_ARRAY && (v->flags & TR__TOML_F_AOT)) {
    *t = v->u.arr.items[v->u.arr.n - 1];
    return 0;
  }
  if (v->type != TR_TOML_TABLE)
    return fail(P, k->at, "key '%s' already defined as %s",
                key_path(P, i + 1, path, sizeof path), kind_name(v));
  if (v->flags & TR__TOML_F_FROZEN)
    return fail(P, k->at, "cannot extend inline table '%s'",
                key_path(P, i + 1, path, sizeof path));
  *t = v;
  return 0;
}

/* ---- scalar values ---- */

static int digit_val(char c, int base) {
  int d = hex_val(c);
  return d >= 0 && d < base ? d : -1;
}

/* Digits of `base` with single underscores between them; returns q when no
 * digit is at q. */
static const char* scan_digits(const char* q, const char* end, int base) {
  if (q >= end || digit_val(*q, base) < 0) return q;
  q++;
  while (q < end) {
    if (digit_val(*q, base) >= 0)
      q++;
    else if (*q == '_' && q + 1 < end && digit_val(q[1], base) >= 0)
      q += 2;
    else
      break;
  }
  return q;
}

static locale_t c_locale;
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;

static void c_locale_init(void) {
  c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
}

static double c_strtod(const char* s) {
  pthread_once(&c_locale_once, c_locale_init);
  return c_locale ? strtod_l(s, NULL, c_locale) : strtod(s, NULL);
}

/* A byte that no value contains right after a value's valid prefix
 * [start, q): a control character or a non-ASCII byte. The error points at
 * it rather than quoting it inside a token. */
static int is_junk(const parser_t* P, const char* q) {
  if (q >= P->end || is_delim(P, q)) return 0;
  unsigned char c = (unsigned char)*q;
  return c < 0x20 || c >= 0x7f;
}

static int junk_after(parser_t* P, const char* start, const char* q) {
  char d[DESC_BUF];
  int n = (int)(q - start);
  return fail(P, q, "unexpected %s after '%.*s%s'", describe(P, q, d, sizeof d),
              n > 40 ? 40 : n, start, n > 40 ? "..." : "");
}

static int bad_number(parser_t* P, const char* start, const char* q,
                      const char* why) {
  char tok[TOKEN_BUF];
  if (!why && is_junk(P, q)) return junk_after(P, start, q);
  token(P, start, start, tok, sizeof tok);
  if (!why && q < P->end && *q == '_')
    why = "underscores must sit between digits";
  return fail(P, start, "invalid number '%s'%s%s", tok, why ? ": " : "",
              why ? why : "");
}

static int days_in_month(int y, int m) {
  static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (m == 2 && y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)) return 29;
  return days[m - 1];
}

static int two_digits(const char* q, const char* end, int* out) {
  if (end - q < 2 || !is_digit(q[0]) || !is_digit(q[1])) return 0;
  *out = (q[0] - '0') * 10 + (q[1] - '0');
  return 1;
}

/* Offset date-time, local date-time, local date or local time. */
static int parse_datetime(parser_t* P, tr_toml_value_t* v) {
  const char* start = P->p;
  const char* q = start;
  const char* end = P->end;
  tr_toml_datetime_t dt = {0};
  int has_date = 0, has_time = 0, has_off = 0, hi, lo;
  const char* kind = "time";
  const char* why = NULL;
  if (end - q >= 5 && is_digit(q[0]) && q[4] == '-') {
    kind = "date";
    if (!two_digits(q, end, &hi) || !two_digits(q + 2, end, &lo) ||
        !two_digits(q + 5, end, &dt.month) || end - q < 10 || q[7] != '-' ||
        !two_digits(q + 8, end, &dt.day))
      goto bad;
    dt.year = hi * 100 + lo;
    if (dt.month < 1 || dt.month > 12) {
      why = "month out of range";
      goto bad;
    }
    if (dt.day < 1 || dt.day > days_in_month(dt.year, dt.month)) {
      why = "day out of range";
      goto bad;
    }
    has_date = 1;
    q += 10;
    if (q < end && (*q == 'T' || *q == 't' ||
                    (*q == ' ' && q + 1 < end && is_digit(q[1])))) {
      kind = "date-time";
      q++;
    } else {
      goto done;
    }
  }
  if (!two_digits(q, end, &dt.hour) || end - q < 8 || q[2] != ':' ||
      !two_digits(q + 3, end, &dt.minute) || q[5] != ':' ||
      !two_digits(q + 6, end, &dt.second))
    goto bad;
  if (dt.hour > 23 || dt.minute > 59 || dt.second > 59) {
    why = dt.hour > 23     ? "hour out of range"
          : dt.minute > 59 ? "minute out of range"
                           : "second out of range";
    goto bad;
  }
  has_time = 1;
  q += 8;
  if (q < end && *q == '.') {
    q++;
    int scale = 100000000;
    while (q < end && is_digit(*q)) {
      dt.nanosecond += (*q - '0') * scale;
      scale /= 10;
      dt.frac_digits++;
      q++;
    }
    if (!dt.frac_digits) {
      why = "expected a digit after '.'";
      goto bad;
    }
  }
  if (has_date && q < end && (*q == 'Z' || *q == 'z')) {
    has_off = 1;
    q++;
  } else if (has_date && q < end && (*q == '+' || *q == '-')) {
    int oh, om;
    if (!two_digits(q + 1, end, &oh) || end - q < 6 || q[3] != ':' ||
        !two_digits(q + 4, end, &om))
      goto bad;
    if (oh > 23 || om > 59) {
      why = "offset out of range";
      goto bad;
    }
    dt.offset_minutes = (*q == '-' ? -1 : 1) * (oh * 60 + om);
    has_off = 1;
    q += 6;
  }
done:
  if (!is_delim(P, q)) goto bad;
  v->type = has_off ? TR_TOML_DATETIME
            : has_time
                ? (has_date ? TR_TOML_DATETIME_LOCAL : TR_TOML_TIME_LOCAL)
                : TR_TOML_DATE_LOCAL;
  size_t n = (size_t)(q - start);
  tr__toml_dt_t* d = tr__toml_alloc(P->arena, sizeof *d + n + 1);
  if (!d) return nomem(P);
  d->dt = dt;
  memcpy(d->text, start, n);
  d->text[n] = '\0';
  if (has_date && has_time) d->text[10] = 'T';
  if (has_off && d->text[n - 1] == 'z') d->text[n - 1] = 'Z';
  v->u.dt = d;
  P->p = q;
  return 0;
bad:
  if (!why && q > start && is_junk(P, q)) return junk_after(P, start, q);
  char tok[TOKEN_BUF];
  token(P, start, q < end ? q : end, tok, sizeof tok);
  return fail(P, start, "invalid %s '%s'%s%s", kind, tok, why ? ": " : "",
              why ? why : "");
}

/* Integer, float, inf/nan, or (by its shape) a date or time. */
static int parse_number(parser_t* P, tr_toml_value_t* v) {
  const char* start = P->p;
  const char* end = P->end;
  const char* q = start;
  if (end - q >= 5 && is_digit(q[0]) && is_digit(q[1]) && is_digit(q[2]) &&
      is_digit(q[3]) && q[4] == '-')
    return parse_datetime(P, v);
  if (end - q >= 3 && is_digit(q[0]) && is_digit(q[1]) && q[2] == ':')
    return parse_datetime(P, v);
  int neg = 0, sign = 0;
  if (*q == '+' || *q == '-') {
    neg = *q == '-';
    sign = 1;
    q++;
  }
  if (end - q >= 3 && (!memcmp(q, "inf", 3) || !memcmp(q, "nan", 3))) {
    if (!is_delim(P, q + 3)) return bad_number(P, start, q + 3, NULL);
    v->type = TR_TOML_FLOAT;
    v->u.f = *q == 'i' ? INFINITY : NAN;
    if (neg) v->u.f = -v->u.f;
    P->p = q + 3;
    return 0;
  }
  if (end - q >= 2 && q[0] == '0' &&
      (q[1] == 'x' || q[1] == 'o' || q[1] == 'b')) {
    int base = q[1] == 'x' ? 16 : q[1] == 'o' ? 8 : 2;
    if (sign)
      return bad_number(P, start, q,
                        "a sign is not allowed before a base prefix");
    const char* digits = q + 2;
    q = scan_digits(digits, end, base);
    if (q == digits || !is_delim(P, q)) return bad_number(P, start, q, NULL);
    uint64_t acc = 0;
    for (const char* d = digits; d < q; d++) {
      if (*d == '_') continue;
      uint64_t dv = (uint64_t)digit_val(*d, base);
      if (acc > ((uint64_t)INT64_MAX - dv) / (uint64_t)base) {
        char tok[TOKEN_BUF];
        return fail(P, start, "integer '%s' out of range",
                    token(P, start, start, tok, sizeof tok));
      }
      acc = acc * (uint64_t)base + dv;
    }
    v->type = TR_TOML_INTEGER;
    v->u.i = (int64_t)acc;
    P->p = q;
    return 0;
  }
  const char* ip = q;
  q = scan_digits(ip, end, 10);
  if (q == ip) return bad_number(P, start, q, NULL);
  if (*ip == '0' && q - ip > 1)
    return bad_number(P, start, q, "leading zeros are not allowed");
  int is_float = 0;
  if (q < end && *q == '.') {
    const char* f = q + 1;
    q = scan_digits(f, end, 10);
    if (q == f) return bad_number(P, start, q, "expected a digit after '.'");
    is_float = 1;
  }
  if (q < end && (*q == 'e' || *q == 'E')) {
    const char* x = q + 1;
    if (x < end && (*x == '+' || *x == '-')) x++;
    q = scan_digits(x, end, 10);
    if (q == x)
      return bad_number(P, start, q, "expected a digit in the exponent");
    is_float = 1;
  }
  if (!is_delim(P, q)) return bad_number(P, start, q, NULL);
  if (is_float) {
    P->buf_len = 0;
    for (const char* d = start; d < q; d++)
      if (*d != '_') TR_CHECK(buf_put(P, d, 1));
    TR_CHECK(buf_put(P, "", 1));
    v->type = TR_TOML_FLOAT;
    v->u.f = c_strtod(P->buf);
  } else {
    uint64_t acc = 0, limit = neg ? (uint64_t)INT64_MAX + 1 : INT64_MAX;
    for (const char* d = ip; d < q; d++) {
      if (*d == '_') continue;
      uint64_t dv = (uint64_t)(*d - '0');
      if (acc > (limit - dv) / 10) {
        char tok[TOKEN_BUF];
        return fail(P, start, "integer '%s' out of range",
                    token(P, start, start, tok, sizeof tok));
      }
      acc = acc * 10 + dv;
    }
    v->type = TR_TOML_INTEGER;
    v->u.i = neg ? (int64_t)(0 - acc) : (int64_t)acc;
  }
  P->p = q;
  return 0;
}

/* ---- values ---- */

static int parse_value(parser_t* P, const tr_toml_value_t* parent,
                       tr_toml_value_t** out);
static int parse_keyval(parser_t* P, tr_toml_value_t* table);

static int parse_array(parser_t* P, const tr_toml_value_t* parent,
                       tr_toml_value_t** out) {
  const char* open = P->p;
  tr_toml_value_t* arr = NULL;
  TR_CHECK(new_child(P, parent, TR_TOML_ARRAY, open, P->line, col_of(P, open),
                     &arr));
  P->p++;
  for (;;) {
    TR_CHECK(skip_ws_lines(P));
    if (P->p >= P->end) return fail(P, open, "unterminated array");
    if (*P->p == ']') break;
    tr_toml_value_t* item = NULL;
    TR_CHECK(parse_value(P, arr, &item));
    if (tr__toml_array_push(P->arena, arr, item) < 0) return nomem(P);
    TR_CHECK(skip_ws_lines(P));
    if (P->p >= P->end) return fail(P, open, "unterminated array");
    if (*P->p == ']') break;
    if (*P->p != ',') {
      char d[DESC_BUF];
      return fail(P, P->p, "expected ',' or ']' in array, found %s",
                  describe(P, P->p, d, sizeof d));
    }
    P->p++;
  }
  P->p++;
  *out = arr;
  return 0;
}

static int parse_inline_table(parser_t* P, const tr_toml_value_t* parent,
                              tr_toml_value_t** out) {
  const char* open = P->p;
  tr_toml_value_t* t = NULL;
  TR_CHECK(
      new_child(P, parent, TR_TOML_TABLE, open, P->line, col_of(P, open), &t));
  P->p++;
  skip_ws(P);
  if (P->p < P->end && *P->p == '}') goto close;
  for (;;) {
    if (P->p >= P->end) return fail(P, open, "unterminated inline table");
    if (*P->p == '\n' || *P->p == '\r')
      return fail(P, P->p, "newline in inline table");
    TR_CHECK(parse_keyval(P, t));
    skip_ws(P);
    if (P->p >= P->end) return fail(P, open, "unterminated inline table");
    if (*P->p == '}') break;
    if (*P->p == '\n' || *P->p == '\r')
      return fail(P, P->p, "newline in inline table");
    if (*P->p != ',') {
      char d[DESC_BUF];
      return fail(P, P->p, "expected ',' or '}' in inline table, found %s",
                  describe(P, P->p, d, sizeof d));
    }
    const char* comma = P->p++;
    skip_ws(P);
    if (P->p < P->end && *P->p == '}')
      return fail(P, comma, "trailing comma in inline table");
  }
close:
  P->p++;
  t->flags |= TR__TOML_F_FROZEN;
  *out = t;
  return 0;
}

static int parse_value(parser_t* P, const tr_toml_value_t* parent,
                       tr_toml_value_t** out) {
  const char* at = P->p;
  char d[DESC_BUF];
  if (at >= P->end) return fail(P, at, "expected a value, found end of file");
  char c = *at;
  if (c == '[') return parse_array(P, parent, out);
  if (c == '{') return parse_inline_table(P, parent, out);
  tr_toml_value_t* v =
      tr__toml_value_new(P->arena, TR_TOML_STRING, P->line, col_of(P, at));
  if (!v) return nomem(P);
  *out = v;
  if (c == '"' || c == '\'') {
    const char* s;
    TR_CHECK(read_string(P, 1, &s, &v->u.str.len));
    v->u.str.s = (char*)s;
    return 0;
  }
  if (c == 't' || c == 'f') {
    size_t n = c == 't' ? 4 : 5;
    if ((size_t)(P->end - at) >= n &&
        !memcmp(at, c == 't' ? "true" : "false", n) && is_delim(P, at + n)) {
      v->type = TR_TOML_BOOL;
      v->u.b = c == 't';
      P->p = at + n;
      return 0;
    }
    if ((size_t)(P->end - at) >= n &&
        !memcmp(at, c == 't' ? "true" : "false", n) && is_junk(P, at + n))
      return junk_after(P, at, at + n);
  } else if (is_digit(c) || c == '+' || c == '-' ||
             ((c == 'i' || c == 'n') && P->end - at >= 3 &&
              (!memcmp(at, "inf", 3) || !memcmp(at, "nan", 3)))) {
    return parse_number(P, v);
  }
  if (is_bare((unsigned char)c) || c == '.') {
    char tok[TOKEN_BUF];
    return fail(P, at, "invalid value '%s'", token(P, at, at, tok, sizeof tok));
  }
  return fail(P, at, "expected a value, found %s",
              describe(P, at, d, sizeof d));
}

/* ---- statements ---- */

/* key = value, into `table` (the section's, or an inline table). */
static int parse_keyval(parser_t* P, tr_toml_value_t* table) {
  size_t first = P->path_n;
  TR_CHECK(parse_key(P));
  size_t n = P->path_n;
  char path[PATH_BUF], d[DESC_BUF];
  if (P->p >= P->end || *P->p != '=') {
    /* name the key as written on this line */
    key_text(P->path + first, n - first, path, sizeof path);
    return fail(P, P->p, "expected '=' after key '%s', found %s", path,
                describe(P, P->p, d, sizeof d));
  }
  P->p++;
  skip_ws(P);
  tr_toml_value_t* t = table;
  for (size_t i = first; i + 1 < n; i++) TR_CHECK(dotted_step(P, &t, i));
  const key_part_t* k = &P->path[n - 1];
  if (tr__toml_find(t, k->s, k->len) >= 0)
    return fail(P, k->at, "duplicate key '%s'",
                key_path(P, n, path, sizeof path));
  tr_toml_value_t* v = NULL;
  TR_CHECK(parse_value(P, t, &v));
  k = &P->path[n - 1]; /* the path may have moved while reading the value */
  if (tr__toml_table_add(P->arena, t, k->s, k->len, k->line, k->col, v) < 0)
    return nomem(P);
  P->path_n = first;
  return 0;
}

/* [a.b] or [[a.b]]: makes the table the current section. */
static int parse_header(parser_t* P) {
  const char* open = P->p;
  int line = P->line, col = col_of(P, open);
  int aot = P->end - open >= 2 && open[1] == '[';
  char path[PATH_BUF], d[DESC_BUF];
  P->p += aot ? 2 : 1;
  skip_ws(P);
  P->path_n = 0;
  TR_CHECK(parse_key(P));
  if (aot) {
    if (P->end - P->p < 2 || P->p[0] != ']' || P->p[1] != ']')
      return fail(P, P->p, "expected ']]' after array of tables name, found %s",
                  describe(P, P->p, d, sizeof d));
    P->p += 2;
  } else {
    if (P->p >= P->end || *P->p != ']')
      return fail(P, P->p, "expected ']' after table name, found %s",
                  describe(P, P->p, d, sizeof d));
    P->p++;
  }
  size_t n = P->path_n;
  tr_toml_value_t* t = P->root;
  for (size_t i = 0; i + 1 < n; i++) TR_CHECK(header_step(P, &t, i));
  const key_part_t* k = &P->path[n - 1];
  long idx = tr__toml_find(t, k->s, k->len);
  tr_toml_value_t* v = idx < 0 ? NULL : entry(t, idx)->val;
  if (!aot) {
    if (!v) {
      TR_CHECK(add_table(P, t, n - 1, TR__TOML_F_HEADER, &v));
    } else if (v->type != TR_TOML_TABLE) {
      return fail(P, k->at, "key '%s' already defined as %s",
                  key_path(P, n, path, sizeof path), kind_name(v));
    } else if (v->flags & TR__TOML_F_FROZEN) {
      return fail(P, k->at, "cannot extend inline table '%s'",
                  key_path(P, n, path, sizeof path));
    } else if (v->flags & (TR__TOML_F_HEADER | TR__TOML_F_DOTTED)) {
      return fail(P, k->at, "table '%s' already defined",
                  key_path(P, n, path, sizeof path));
    } else {
      v->flags =
          (uint8_t)((v->flags & ~TR__TOML_F_IMPLICIT) | TR__TOML_F_HEADER);
      entry(t, idx)->line = k->line;
      entry(t, idx)->col = k->col;
    }
    v->line = line;
    v->col = col;
    P->cur = v;
    return 0;
  }
  if (!v) {
    TR_CHECK(new_child(P, t, TR_TOML_ARRAY, k->at, line, col, &v));
    v->flags = TR__TOML_F_AOT;
    if (tr__toml_table_add(P->arena, t, k->s, k->len, k->line, k->col, v) < 0)
      return nomem(P);
  } else if (v->type != TR_TOML_ARRAY) {
    return fail(P, k->at, "key '%s' already defined as %s",
                key_path(P, n, path, sizeof path), kind_name(v));
  } else if (!(v->flags & TR__TOML_F_AOT)) {
    return fail(P, k->at, "cannot append to static array '%s'",
                key_path(P, n, path, sizeof path));
  } else {
    entry(t, idx)->line = k->line;
    entry(t, idx)->col = k->col;
  }
  tr_toml_value_t* item = NULL;
  TR_CHECK(new_child(P, v, TR_TOML_TABLE, k->at, line, col, &item));
  item->flags = TR__TOML_F_HEADER;
  if (tr__toml_array_push(P->arena, v, item) < 0) return nomem(P);
  P->cur = item;
  return 0;
}

static int parse_document(parser_t* P) {
  if (P->end - P->p >= 3 && !memcmp(P->p, "\xEF\xBB\xBF", 3)) P->p += 3;
  for (;;) {
    skip_ws(P);
    if (P->p >= P->end) return 0;
    unsigned char c = (unsigned char)*P->p;
    if (c == '#') {
      TR_CHECK(skip_comment(P));
    } else if (c == '[') {
      TR_CHECK(parse_header(P));
      TR_CHECK(end_of_line(P, "table header"));
    } else if (is_bare(c) || c == '"' || c == '\'') {
      TR_CHECK(parse_keyval(P, P->cur));
      TR_CHECK(end_of_line(P, "value"));
    } else if (c != '\n' && c != '\r') {
      char d[DESC_BUF];
      return fail(P, P->p, "expected a key or table header, found %s",
                  describe(P, P->p, d, sizeof d));
    }
    TR_CHECK(eat_newline(P));
  }
}

/* ---- public entry points ---- */

int tr_toml_parse(const char* text, size_t len, tr_toml_value_t** root,
                  tr_toml_error_t* err) {
  *root = NULL;
  if (err) {
    err->line = err->col = 0;
    err->message[0] = '\0';
  }
  if (len > (size_t)INT_MAX) {
    if (err)
      snprintf(err->message, sizeof err->message,
               "document larger than %d bytes", INT_MAX);
    return TR_ELIMIT;
  }
  if (!text) text = ""; /* NULL with len 0: an empty document */
  tr__toml_doc_t* doc = tr__toml_doc_new();
  parser_t P = {.base = text,
                .p = text,
                .end = text + len,
                .line_start = text,
                .line = 1,
                .err = err};
  if (!doc) return nomem(&P);
  P.arena = &doc->arena;
  P.root = P.cur = &doc->root;
  int rc = parse_document(&P);
  free(P.buf);
  free(P.path);
  if (rc < 0) {
    tr__toml_doc_free(doc);
    return rc;
  }
  *root = &doc->root;
  return 0;
}

int tr_toml_parse_file(const char* path, tr_toml_value_t** root,
                       tr_toml_error_t* err) {
  *root = NULL;
  if (err) {
    err->line = err->col = 0;
    err->message[0] = '\0';
  }
  int rc;
  char* text = NULL;
  size_t len = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    rc = tr_err_from_errno();
    goto out_error;
  }
  struct stat st;
  if (fstat(fd, &st) < 0) {
    rc = tr_err_from_errno();
    goto out_close;
  }
  if (S_ISDIR(st.st_mode)) {
    rc = TR_EISDIR;
    goto out_close;
  }
  size_t cap = st.st_size > 0 ? (size_t)st.st_size + 1 : 4096;
  text = malloc(cap);
  if (!text) {
    rc = TR_ENOMEM;
    goto out_close;
  }
  for (;;) {
    if (len == cap && TR_GROW(text, cap + 1, cap) < 0) {
      rc = TR_ENOMEM;
      goto out_close;
    }
    ssize_t n = read(fd, text + len, cap - len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      rc = tr_err_from_errno();
      goto out_close;
    }
    if (n == 0) break;
    len += (size_t)n;
  }
  close(fd);
  rc = tr_toml_parse(text, len, root, err);
  free(text);
  return rc;
out_close:
  close(fd);
out_error:
  free(text);
  if (err)
    snprintf(err->message, sizeof err->message, "cannot read '%s': %s", path,
             tr_strerror(rc));
  return rc;
}
