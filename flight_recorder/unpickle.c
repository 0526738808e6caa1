/* flight_recorder/unpickle.c: a safe pickle reader for flight-recorder dumps.
 *
 * Reads the opcodes that Python's pickle (protocols 2-5) and PyTorch's c10
 * pickler (protocol 2) write for plain data — dicts, lists, tuples, str,
 * int, float, bool, None, the memo, frames — into the arena value tree of
 * internal.h. It never calls anything: GLOBAL/STACK_GLOBAL are accepted
 * only for torch.jit._pickle's build_intlist/build_doublelist/build_boollist
 * (c10's spelling of a typed list; REDUCE then yields the list itself), and
 * everything else — other globals, objects, persistent ids, unknown opcodes
 * — is an error naming the file and the byte offset.
 *
 * Safety on hostile input: every length is checked against the bytes left
 * before use; the memo only grows by one index at a time (picklers number
 * it sequentially); nesting is capped; and a container may only be filled
 * until a memo fetch returns it (that freezes it, every copy at once), which
 * makes reference cycles impossible, so consumers may recurse over the
 * tree.
 */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/buf.h" /* TR_GROW */
#include "flight_recorder/internal.h"
#include "trainrun/error.h"
#include "trainrun/fr_analyze.h"

#define MAX_DEPTH 256 /* nesting of containers */

/* ---- arena ---- */

struct tr__arena_chunk {
  tr__arena_chunk_t* next;
  size_t cap, used;
  max_align_t data[];
};

void tr__arena_init(tr__arena_t* a, size_t limit) {
  a->head = NULL;
  a->spare = NULL;
  a->used_total = 0;
  a->limit = limit;
}

void* tr__arena_alloc(tr__arena_t* a, size_t n) {
  n = (n + 15) & ~(size_t)15;
  if (a->limit && a->used_total + n > a->limit) return NULL;
  tr__arena_chunk_t* c = a->head;
  if (!c || c->cap - c->used < n) {
    if (a->spare && a->spare->cap >= n) {
      c = a->spare;
      a->spare = c->next;
    } else {
      size_t cap = n > (size_t)1 << 20 ? n : (size_t)1 << 20;
      c = malloc(sizeof *c + cap);
      if (!c) return NULL;
      c->cap = cap;
    }
    c->used = 0;
    c->next = a->head;
    a->head = c;
  }
  void* p = (char*)c->data + c->used;
  c->used += n;
  a->used_total += n;
  return p;
}

void tr__arena_reset(tr__arena_t* a, size_t limit) {
  while (a->head) {
    tr__arena_chunk_t* next = a->head->next;
    a->head->next = a->spare;
    a->spare = a->head;
    a->head = next;
  }
  a->used_total = 0;
  a->limit = limit;
}

void tr__arena_release(tr__arena_t* a) {
  tr__arena_reset(a, 0);
  tr__arena_chunk_t* c = a->spare;
  while (c) {
    tr__arena_chunk_t* next = c->next;
    free(c);
    c = next;
  }
  a->spare = NULL;
}

/* ---- the machine ---- */

/* Every node is a node_t: the value plus its nesting depth and whether it
 * may still be filled. */
typedef struct {
  tr__frv_t v;
  uint16_t depth;
  uint8_t frozen; /* may not be filled: fetched from the memo, a tuple */
} node_t;

typedef struct {
  tr__frv_t* v;
} slot_t;

enum { G_INTLIST = 1, G_DOUBLELIST, G_BOOLLIST };
#define KIND_GLOBAL 100 /* internal: a whitelisted list builder */

typedef struct {
  const uint8_t* buf;
  size_t len, pos, op_at;
  const char* name;
  tr__arena_t* arena;
  tr_errmsg_t* err;
  slot_t* stack;
  size_t sp, scap;
  size_t* marks;
  size_t nmarks, mcap;
  tr__frv_t** memo;
  size_t nmemo, memocap;
} up_t;

static int fail(up_t* u, const char* fmt, const char* what) {
  char m[320];
  snprintf(m, sizeof m, fmt, what);
  return tr_errmsg_set(u->err, TR_EFORMAT, "'%s': %s at byte offset %zu",
                       u->name, m, u->op_at);
}

static int oom(up_t* u) {
  return tr_errmsg_set(u->err, TR_ENOMEM,
                       "'%s': out of memory decoding the pickle at byte "
                       "offset %zu",
                       u->name, u->op_at);
}

static uint16_t depth_of(const tr__frv_t* v) {
  return (v->kind == TR__FRV_LIST || v->kind == TR__FRV_DICT)
             ? ((const node_t*)v)->depth
             : 0;
}

static tr__frv_t* new_node(up_t* u, uint8_t kind) {
  node_t* n = tr__arena_alloc(u->arena, sizeof *n);
  if (!n) return NULL;
  memset(n, 0, sizeof *n);
  n->v.kind = kind;
  n->depth = 1;
  return &n->v;
}

static int push(up_t* u, tr__frv_t* v, uint8_t frozen) {
  if (!v) return oom(u);
  if (TR_GROW(u->stack, u->sp + 1, u->scap) < 0) return oom(u);
  if (frozen) ((node_t*)v)->frozen = 1;
  u->stack[u->sp].v = v;
  u->sp++;
  return 0;
}

/* The bottom of the topmost mark frame. */
static int pop_mark(up_t* u, size_t* base) {
  if (u->nmarks == 0) return fail(u, "%s without MARK", "opcode");
  *base = u->marks[--u->nmarks];
  if (*base > u->sp) return fail(u, "%s", "stack underflow");
  return 0;
}

static int need(up_t* u, size_t n) {
  if (u->len - u->pos < n) return fail(u, "%s", "truncated pickle");
  return 0;
}

static uint64_t rd_le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static int push_int(up_t* u, int64_t i) {
  tr__frv_t* v = new_node(u, TR__FRV_INT);
  if (v) v->u.i = i;
  return push(u, v, 0);
}

static int push_str(up_t* u, size_t n) {
  TR_CHECK(need(u, n));
  if (n > UINT32_MAX) return fail(u, "%s", "string too long");
  tr__frv_t* v = new_node(u, TR__FRV_STR);
  char* s = v ? tr__arena_alloc(u->arena, n + 1) : NULL;
  if (!s) return oom(u);
  memcpy(s, u->buf + u->pos, n);
  s[n] = '\0';
  u->pos += n;
  v->u.s = s;
  v->n = (uint32_t)n;
  return push(u, v, 0);
}

/* Append items [from, sp) of the stack to container slot at index t. */
static int fill(up_t* u, size_t t, size_t from, int dict) {
  slot_t* s = &u->stack[t];
  tr__frv_t* c = s->v;
  if (c->kind != (dict ? TR__FRV_DICT : TR__FRV_LIST) || c->is_tuple)
    return fail(u, "%s into a value of the wrong type",
                dict ? "SETITEMS" : "APPENDS");
  if (((node_t*)c)->frozen)
    return fail(u, "%s into a container fetched from the memo",
                dict ? "SETITEMS" : "APPENDS");
  size_t k = u->sp - from;
  if (dict && k % 2) return fail(u, "%s", "odd number of dict items");
  size_t add = dict ? k / 2 : k;
  if (add == 0) return 0;
  size_t n = c->n;
  size_t tot = (n + add) * (dict ? 2 : 1);
  if (n + add > UINT32_MAX / 2) return fail(u, "%s", "container too large");
  tr__frv_t** items = tr__arena_alloc(u->arena, tot * sizeof *items);
  if (!items) return oom(u);
  if (n) memcpy(items, c->u.items, n * (dict ? 2 : 1) * sizeof *items);
  uint16_t d = ((node_t*)c)->depth;
  for (size_t i = 0; i < k; i++) {
    tr__frv_t* it = u->stack[from + i].v;
    if (it->kind == KIND_GLOBAL) return fail(u, "%s", "misplaced GLOBAL");
    items[n * (dict ? 2 : 1) + i] = it;
    uint16_t cd = depth_of(it);
    if (cd + 1 > d) d = (uint16_t)(cd + 1);
  }
  if (d > MAX_DEPTH) return fail(u, "%s", "nesting deeper than 256");
  ((node_t*)c)->depth = d;
  c->u.items = items;
  c->n = (uint32_t)(n + add);
  u->sp = from;
  return 0;
}

/* Build a tuple/list from stack items [from, sp), replacing them. */
static int build_seq(up_t* u, size_t from, int tuple) {
  size_t k = u->sp - from;
  tr__frv_t* c = new_node(u, TR__FRV_LIST);
  if (!c) return oom(u);
  c->is_tuple = (uint8_t)tuple;
  if (k) {
    c->u.items = tr__arena_alloc(u->arena, k * sizeof(tr__frv_t*));
    if (!c->u.items) return oom(u);
    uint16_t d = 1;
    for (size_t i = 0; i < k; i++) {
      tr__frv_t* it = u->stack[from + i].v;
      if (it->kind == KIND_GLOBAL) return fail(u, "%s", "misplaced GLOBAL");
      c->u.items[i] = it;
      if (depth_of(it) + 1 > d) d = (uint16_t)(depth_of(it) + 1);
    }
    if (d > MAX_DEPTH) return fail(u, "%s", "nesting deeper than 256");
    ((node_t*)c)->depth = d;
    c->n = (uint32_t)k;
  }
  u->sp = from;
  return push(u, c, (uint8_t)tuple);
}

static int global(up_t* u, const char* mod, size_t ml, const char* nm,
                  size_t nl) {
  int which = 0;
  if (ml == 17 && memcmp(mod, "torch.jit._pickle", 17) == 0) {
    if (nl == 13 && memcmp(nm, "build_intlist", 13) == 0) which = G_INTLIST;
    if (nl == 16 && memcmp(nm, "build_doublelist", 16) == 0)
      which = G_DOUBLELIST;
    if (nl == 14 && memcmp(nm, "build_boollist", 14) == 0) which = G_BOOLLIST;
  }
  if (!which) {
    char what[160];
    snprintf(what, sizeof what, "%.*s.%.*s", (int)(ml > 60 ? 60 : ml), mod,
             (int)(nl > 60 ? 60 : nl), nm);
    return fail(u, "refusing to load global '%s' (not plain data)", what);
  }
  tr__frv_t* v = new_node(u, KIND_GLOBAL);
  if (v) v->u.i = which;
  return push(u, v, 1);
}

static int memo_put(up_t* u, uint64_t idx) {
  if (u->sp == 0) return fail(u, "%s", "memo store on an empty stack");
  if (idx > u->nmemo) return fail(u, "%s", "memo index out of sequence");
  if (idx == u->nmemo) {
    if (TR_GROW(u->memo, u->nmemo + 1, u->memocap) < 0) return oom(u);
    u->nmemo++;
  }
  u->memo[idx] = u->stack[u->sp - 1].v;
  return 0;
}

static int memo_get(up_t* u, uint64_t idx) {
  if (idx >= u->nmemo) return fail(u, "%s", "memo index not stored");
  /* freezes the value itself, so every copy on the stack too */
  return push(u, u->memo[idx], 1);
}

static int run(up_t* u, tr__frv_t** out) {
  for (;;) {
    u->op_at = u->pos;
    if (u->pos >= u->len)
      return fail(u, "%s", "truncated pickle (no STOP opcode)");
    uint8_t op = u->buf[u->pos++];
    switch (op) {
      case 0x80: /* PROTO */
        TR_CHECK(need(u, 1));
        if (u->buf[u->pos] < 2 || u->buf[u->pos] > 5)
          return fail(u, "unsupported pickle protocol%s", "");
        u->pos++;
        break;
      case 0x95: /* FRAME: a length hint */
        TR_CHECK(need(u, 8));
        if (rd_le(u->buf + u->pos, 8) > u->len - u->pos - 8)
          return fail(u, "%s", "frame longer than the file");
        u->pos += 8;
        break;
      case '.': /* STOP */
        if (u->sp != 1 || u->nmarks)
          return fail(u, "%s", "STOP with an unbalanced stack");
        if (u->stack[0].v->kind == KIND_GLOBAL)
          return fail(u, "%s", "misplaced GLOBAL");
        *out = u->stack[0].v;
        return 0;
      case '(': /* MARK */
        if (TR_GROW(u->marks, u->nmarks + 1, u->mcap) < 0) return oom(u);
        u->marks[u->nmarks++] = u->sp;
        break;
      case '}': /* EMPTY_DICT */
        TR_CHECK(push(u, new_node(u, TR__FRV_DICT), 0));
        break;
      case ']': /* EMPTY_LIST */
        TR_CHECK(push(u, new_node(u, TR__FRV_LIST), 0));
        break;
      case ')': /* EMPTY_TUPLE */
        TR_CHECK(build_seq(u, u->sp, 1));
        break;
      case 't': { /* TUPLE */
        size_t base;
        TR_CHECK(pop_mark(u, &base));
        TR_CHECK(build_seq(u, base, 1));
        break;
      }
      case 'l': { /* LIST */
        size_t base;
        TR_CHECK(pop_mark(u, &base));
        TR_CHECK(build_seq(u, base, 0));
        break;
      }
      case 'd': { /* DICT */
        size_t base;
        TR_CHECK(pop_mark(u, &base));
        TR_CHECK(push(u, new_node(u, TR__FRV_DICT), 0));
        /* move the new dict below its items, then fill */
        slot_t d = u->stack[u->sp - 1];
        memmove(&u->stack[base + 1], &u->stack[base],
                (u->sp - 1 - base) * sizeof(slot_t));
        u->stack[base] = d;
        TR_CHECK(fill(u, base, base + 1, 1));
        break;
      }
      case 0x85: /* TUPLE1..3 */
      case 0x86:
      case 0x87: {
        size_t k = (size_t)(op - 0x84);
        if (u->sp < k || (u->nmarks && u->marks[u->nmarks - 1] > u->sp - k))
          return fail(u, "%s", "stack underflow");
        TR_CHECK(build_seq(u, u->sp - k, 1));
        break;
      }
      case 'a': /* APPEND */
        if (u->sp < 2) return fail(u, "%s", "stack underflow");
        TR_CHECK(fill(u, u->sp - 2, u->sp - 1, 0));
        break;
      case 'e': { /* APPENDS */
        size_t base;
        TR_CHECK(pop_mark(u, &base));
        if (base == 0) return fail(u, "%s", "stack underflow");
        TR_CHECK(fill(u, base - 1, base, 0));
        break;
      }
      case 's': /* SETITEM */
        if (u->sp < 3) return fail(u, "%s", "stack underflow");
        TR_CHECK(fill(u, u->sp - 3, u->sp - 2, 1));
        break;
      case 'u': { /* SETITEMS */
        size_t base;
        TR_CHECK(pop_mark(u, &base));
        if (base == 0) return fail(u, "%s", "stack underflow");
        TR_CHECK(fill(u, base - 1, base, 1));
        break;
      }
      case '0': /* POP */
        if (u->sp == 0 || (u->nmarks && u->marks[u->nmarks - 1] >= u->sp))
          return fail(u, "%s", "stack underflow");
        u->sp--;
        break;
      case '1': { /* POP_MARK */
        size_t base;
        TR_CHECK(pop_mark(u, &base));
        u->sp = base;
        break;
      }
      case 'N': { /* NONE */
        TR_CHECK(push(u, new_node(u, TR__FRV_NONE), 0));
        break;
      }
      case 0x88: /* NEWTRUE, NEWFALSE */
      case 0x89: {
        tr__frv_t* v = new_node(u, TR__FRV_BOOL);
        if (v) v->u.i = op == 0x88;
        TR_CHECK(push(u, v, 0));
        break;
      }
      case 'K': /* BININT1 */
        TR_CHECK(need(u, 1));
        TR_CHECK(push_int(u, u->buf[u->pos]));
        u->pos += 1;
        break;
      case 'M': /* BININT2 */
        TR_CHECK(need(u, 2));
        TR_CHECK(push_int(u, (int64_t)rd_le(u->buf + u->pos, 2)));
        u->pos += 2;
        break;
      case 'J': /* BININT */
        TR_CHECK(need(u, 4));
        TR_CHECK(push_int(u, (int32_t)(uint32_t)rd_le(u->buf + u->pos, 4)));
        u->pos += 4;
        break;
      case 0x8a:   /* LONG1 */
      case 0x8b: { /* LONG4 */
        size_t w = op == 0x8a ? 1 : 4;
        TR_CHECK(need(u, w));
        uint64_t n = rd_le(u->buf + u->pos, (int)w);
        u->pos += w;
        TR_CHECK(need(u, n));
        if (n > 8) return fail(u, "%s", "integer wider than 64 bits");
        uint64_t v = n ? rd_le(u->buf + u->pos, (int)n) : 0;
        if (n && n < 8 && (u->buf[u->pos + n - 1] & 0x80))
          v |= ~(uint64_t)0 << (8 * n); /* sign-extend */
        u->pos += n;
        TR_CHECK(push_int(u, (int64_t)v));
        break;
      }
      case 'G': { /* BINFLOAT: big-endian double */
        TR_CHECK(need(u, 8));
        uint64_t b = 0;
        for (int i = 0; i < 8; i++) b = (b << 8) | u->buf[u->pos + i];
        u->pos += 8;
        double d;
        memcpy(&d, &b, sizeof d);
        tr__frv_t* v = new_node(u, TR__FRV_FLOAT);
        if (v) v->u.f = d;
        TR_CHECK(push(u, v, 0));
        break;
      }
      case 0x8c: /* SHORT_BINUNICODE */
      case 'U':  /* SHORT_BINSTRING */
        TR_CHECK(need(u, 1));
        u->pos += 1;
        TR_CHECK(push_str(u, u->buf[u->pos - 1]));
        break;
      case 'X': /* BINUNICODE */
      case 'T': /* BINSTRING */
        TR_CHECK(need(u, 4));
        u->pos += 4;
        TR_CHECK(push_str(u, rd_le(u->buf + u->pos - 4, 4)));
        break;
      case 0x8d: /* BINUNICODE8 */
        TR_CHECK(need(u, 8));
        u->pos += 8;
        TR_CHECK(push_str(u, rd_le(u->buf + u->pos - 8, 8)));
        break;
      case 0x94: /* MEMOIZE */
        TR_CHECK(memo_put(u, u->nmemo));
        break;
      case 'q': /* BINPUT */
        TR_CHECK(need(u, 1));
        u->pos += 1;
        TR_CHECK(memo_put(u, u->buf[u->pos - 1]));
        break;
      case 'r': /* LONG_BINPUT */
        TR_CHECK(need(u, 4));
        u->pos += 4;
        TR_CHECK(memo_put(u, rd_le(u->buf + u->pos - 4, 4)));
        break;
      case 'h': /* BINGET */
        TR_CHECK(need(u, 1));
        u->pos += 1;
        TR_CHECK(memo_get(u, u->buf[u->pos - 1]));
        break;
      case 'j': /* LONG_BINGET */
        TR_CHECK(need(u, 4));
        u->pos += 4;
        TR_CHECK(memo_get(u, rd_le(u->buf + u->pos - 4, 4)));
        break;
      case 'c': { /* GLOBAL "module\nname\n" */
        const char* mod = (const char*)u->buf + u->pos;
        const char* e1 = memchr(mod, '\n', u->len - u->pos);
        if (!e1) return fail(u, "%s", "truncated GLOBAL");
        const char* nm = e1 + 1;
        const char* e2 =
            memchr(nm, '\n', u->len - (size_t)(nm - (const char*)u->buf));
        if (!e2) return fail(u, "%s", "truncated GLOBAL");
        u->pos = (size_t)(e2 + 1 - (const char*)u->buf);
        TR_CHECK(global(u, mod, (size_t)(e1 - mod), nm, (size_t)(e2 - nm)));
        break;
      }
      case 0x93: { /* STACK_GLOBAL */
        if (u->sp < 2) return fail(u, "%s", "stack underflow");
        tr__frv_t* m = u->stack[u->sp - 2].v;
        tr__frv_t* n = u->stack[u->sp - 1].v;
        if (m->kind != TR__FRV_STR || n->kind != TR__FRV_STR)
          return fail(u, "%s", "STACK_GLOBAL of non-strings");
        u->sp -= 2;
        TR_CHECK(global(u, m->u.s, m->n, n->u.s, n->n));
        break;
      }
      case 'R': { /* REDUCE: only builder(([...],)) */
        if (u->sp < 2) return fail(u, "%s", "stack underflow");
        tr__frv_t* f = u->stack[u->sp - 2].v;
        tr__frv_t* args = u->stack[u->sp - 1].v;
        if (f->kind != KIND_GLOBAL)
          return fail(u, "%s", "REDUCE of something not callable");
        if (args->kind != TR__FRV_LIST || !args->is_tuple || args->n != 1 ||
            args->u.items[0]->kind != TR__FRV_LIST)
          return fail(u, "%s", "list builder called without one list");
        tr__frv_t* l = args->u.items[0];
        int want = f->u.i == G_INTLIST      ? TR__FRV_INT
                   : f->u.i == G_DOUBLELIST ? TR__FRV_FLOAT
                                            : TR__FRV_BOOL;
        for (uint32_t i = 0; i < l->n; i++)
          if (l->u.items[i]->kind != want)
            return fail(u, "%s", "typed list holding another type");
        u->sp -= 2;
        TR_CHECK(push(u, l, 1));
        break;
      }
      default: {
        char what[8];
        snprintf(what, sizeof what, "0x%02x", op);
        return fail(u, "unsupported pickle opcode %s", what);
      }
    }
  }
}

int tr__fr_unpickle(const uint8_t* buf, size_t len, const char* name,
                    tr__arena_t* arena, tr__frv_t** out, tr_errmsg_t* err) {
  up_t u;
  memset(&u, 0, sizeof u);
  u.buf = buf;
  u.len = len;
  u.name = name ? name : "<pickle>";
  u.arena = arena;
  u.err = err;
  *out = NULL;
  int rc = run(&u, out);
  free(u.stack);
  free(u.marks);
  free(u.memo);
  return rc;
}

/* ---- conversions ---- */

static tr__frv_t* json_node(tr__arena_t* a, uint8_t kind) {
  node_t* n = tr__arena_alloc(a, sizeof *n);
  if (!n) return NULL;
  memset(n, 0, sizeof *n);
  n->v.kind = kind;
  n->depth = 1;
  return &n->v;
}

int tr__frv_from_json(json_t* j, tr__arena_t* a, tr__frv_t** out) {
  tr__frv_t* v = NULL;
  switch (json_typeof(j)) {
    case JSON_NULL:
      v = json_node(a, TR__FRV_NONE);
      break;
    case JSON_TRUE:
    case JSON_FALSE:
      v = json_node(a, TR__FRV_BOOL);
      if (v) v->u.i = json_is_true(j);
      break;
    case JSON_INTEGER:
      v = json_node(a, TR__FRV_INT);
      if (v) v->u.i = (int64_t)json_integer_value(j);
      break;
    case JSON_REAL:
      v = json_node(a, TR__FRV_FLOAT);
      if (v) v->u.f = json_real_value(j);
      break;
    case JSON_STRING: {
      size_t n = json_string_length(j);
      v = json_node(a, TR__FRV_STR);
      char* s = v ? tr__arena_alloc(a, n + 1) : NULL;
      if (!s) return TR_ENOMEM;
      memcpy(s, json_string_value(j), n + 1);
      v->u.s = s;
      v->n = (uint32_t)n;
      break;
    }
    case JSON_ARRAY: {
      size_t n = json_array_size(j);
      v = json_node(a, TR__FRV_LIST);
      if (!v) return TR_ENOMEM;
      if (n) {
        v->u.items = tr__arena_alloc(a, n * sizeof(tr__frv_t*));
        if (!v->u.items) return TR_ENOMEM;
      }
      for (size_t i = 0; i < n; i++)
        TR_CHECK(tr__frv_from_json(json_array_get(j, i), a, &v->u.items[i]));
      v->n = (uint32_t)n;
      break;
    }
    case JSON_OBJECT: {
      size_t n = json_object_size(j), i = 0;
      v = json_node(a, TR__FRV_DICT);
      if (!v) return TR_ENOMEM;
      if (n) {
        v->u.items = tr__arena_alloc(a, 2 * n * sizeof(tr__frv_t*));
        if (!v->u.items) return TR_ENOMEM;
      }
      const char* k;
      json_t* val;
      json_object_foreach(j, k, val) {
        json_t* ks = json_string(k);
        if (!ks) return TR_ENOMEM;
        int rc = tr__frv_from_json(ks, a, &v->u.items[2 * i]);
        json_decref(ks);
        TR_CHECK(rc);
        TR_CHECK(tr__frv_from_json(val, a, &v->u.items[2 * i + 1]));
        i++;
      }
      v->n = (uint32_t)n;
      break;
    }
  }
  if (!v) return TR_ENOMEM;
  *out = v;
  return 0;
}

json_t* tr__frv_to_json(const tr__frv_t* v) {
  switch (v->kind) {
    case TR__FRV_NONE:
      return json_null();
    case TR__FRV_BOOL:
      return json_boolean(v->u.i);
    case TR__FRV_INT:
      return json_integer((json_int_t)v->u.i);
    case TR__FRV_FLOAT:
      return isfinite(v->u.f) ? json_real(v->u.f) : json_null();
    case TR__FRV_STR:
      return json_stringn(v->u.s, v->n);
    case TR__FRV_LIST: {
      json_t* a = json_array();
      for (uint32_t i = 0; a && i < v->n; i++) {
        json_t* it = tr__frv_to_json(v->u.items[i]);
        if (!it || json_array_append_new(a, it) < 0) {
          json_decref(a);
          return NULL;
        }
      }
      return a;
    }
    case TR__FRV_DICT: {
      json_t* o = json_object();
      for (uint32_t i = 0; o && i < v->n; i++) {
        const tr__frv_t* k = v->u.items[2 * i];
        char num[32];
        const char* ks;
        size_t kn;
        if (k->kind == TR__FRV_STR) {
          ks = k->u.s;
          kn = k->n;
        } else if (k->kind == TR__FRV_INT) {
          kn = (size_t)snprintf(num, sizeof num, "%lld", (long long)k->u.i);
          ks = num;
        } else {
          json_decref(o);
          return NULL;
        }
        json_t* it = tr__frv_to_json(v->u.items[2 * i + 1]);
        if (!it || json_object_setn_new(o, ks, kn, it) < 0) {
          json_decref(o);
          return NULL;
        }
      }
      return o;
    }
  }
  return NULL;
}

const tr__frv_t* tr__frv_get(const tr__frv_t* v, const char* key) {
  if (!v || v->kind != TR__FRV_DICT) return NULL;
  size_t kl = strlen(key);
  for (uint32_t i = 0; i < v->n; i++) {
    const tr__frv_t* k = v->u.items[2 * i];
    if (k->kind == TR__FRV_STR && k->n == kl && memcmp(k->u.s, key, kl) == 0)
      return v->u.items[2 * i + 1];
  }
  return NULL;
}

int tr_fra_unpickle(const void* buf, size_t len, const char* name, json_t** out,
                    tr_errmsg_t* err) {
  tr__arena_t a;
  tr__arena_init(&a, 64 * len + (1u << 20));
  tr__frv_t* v = NULL;
  *out = NULL;
  int rc = tr__fr_unpickle(buf, len, name, &a, &v, err);
  if (rc == 0) {
    *out = tr__frv_to_json(v);
    if (!*out)
      rc = tr_errmsg_set(err, TR_EFORMAT,
                         "'%s': value not representable as JSON (invalid "
                         "UTF-8 or a non-string dict key)",
                         name ? name : "<pickle>");
  }
  tr__arena_release(&a);
  return rc;
}
