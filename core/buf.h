/* core/buf.h: growable memory (not public) -- a byte/string buffer and
 * growth of plain arrays, after Git's strbuf and ALLOC_GROW.
 *
 * The buffer:
 *
 *     tr__buf_t b = TR__BUF_INIT;
 *     tr__buf_addstr(&b, "rank ");
 *     tr__buf_addf(&b, "%d", rank);
 *     if (b.oom) ...;              // one check for the whole sequence
 *     use(b.buf, b.len);           // NUL-terminated text
 *     tr__buf_release(&b);
 *
 * Every function that adds returns 0 or TR_ENOMEM. A failed growth also
 * sets b.oom, after which every add fails at once and changes nothing, so a
 * sequence of adds can be checked once at its end (as a pickle or a message
 * is built) and never yields a text with a hole in it. tr__buf_reset and
 * tr__buf_release clear oom.
 *
 * b.buf is NULL until something is added (tr__buf_str() gives "" then);
 * after any add, b.buf[b.len] is '\0', so text can be used as a C string
 * and binary data gets a harmless extra byte. Code that writes into the
 * room made by tr__buf_grow itself sets the length with tr__buf_setlen.
 * The buffer owns b.buf: tr__buf_release frees it, tr__buf_detach hands it
 * to the caller.
 *
 * Arrays:
 *
 *     item_t* v = NULL;
 *     size_t n = 0, cap = 0;
 *     if (TR_GROW(v, n + 1, cap) < 0) return TR_ENOMEM;
 *     v[n++] = item;
 *
 * TR_GROW(p, need, cap) makes room for at least need elements in the array
 * p of cap elements (cap a size_t lvalue, updated), growing geometrically
 * so that n pushes cost O(n). On failure p and cap are unchanged and
 * TR_ENOMEM is returned; the elements beyond the old cap are uninitialized.
 */
#ifndef CORE_BUF_H
#define CORE_BUF_H

#include <stdarg.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  char* buf;  /* the bytes; NULL until the first add */
  size_t len; /* bytes used */
  size_t cap; /* bytes allocated (room for len + 1) */
  int oom;    /* a growth failed: adds fail until reset */
} tr__buf_t;

#define TR__BUF_INIT \
  { NULL, 0, 0, 0 }

void tr__buf_init(tr__buf_t* b);

/* Room for extra more bytes and the NUL after them. */
int tr__buf_grow(tr__buf_t* b, size_t extra);

/* Append n bytes (n may be 0: then the buffer holds at least ""). */
int tr__buf_add(tr__buf_t* b, const void* p, size_t n);
int tr__buf_addstr(tr__buf_t* b, const char* s);
int tr__buf_addch(tr__buf_t* b, char c);

/* printf-style append. */
__attribute__((format(printf, 2, 3))) int tr__buf_addf(tr__buf_t* b,
                                                       const char* fmt, ...);
__attribute__((format(printf, 2, 0))) int tr__buf_vaddf(tr__buf_t* b,
                                                        const char* fmt,
                                                        va_list ap);

/* Set the length to len (<= the room made by tr__buf_grow) and write the
 * NUL after it: for code that wrote the bytes itself, or truncates. */
void tr__buf_setlen(tr__buf_t* b, size_t len);

/* Length 0, storage kept, oom cleared. */
void tr__buf_reset(tr__buf_t* b);

/* When empty and holding more than keep bytes, give the storage back (a
 * connection's buffer after a large request). */
void tr__buf_shrink(tr__buf_t* b, size_t keep);

/* The text, "" when nothing was added. */
static inline const char* tr__buf_str(const tr__buf_t* b) {
  return b->buf ? b->buf : "";
}

/* Hand the storage to the caller (free() it) and empty the buffer: a
 * NUL-terminated string, "" when nothing was added; NULL (and the buffer
 * released) when a growth had failed or "" cannot be allocated. *len gets
 * the length when len is not NULL. */
char* tr__buf_detach(tr__buf_t* b, size_t* len);

/* Free the storage; the buffer is empty and usable again. */
void tr__buf_release(tr__buf_t* b);

/* Array growth behind TR_GROW: pp points at the array pointer. */
int tr__grow(void* pp, size_t* cap, size_t need, size_t elem);

#define TR_GROW(p, need, cap) tr__grow(&(p), &(cap), (need), sizeof *(p))

#ifdef __cplusplus
}
#endif
#endif /* CORE_BUF_H */
