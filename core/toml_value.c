/* core/toml_value.c: the TOML value tree — the arena that holds a document,
 * tables (entries in document order plus a hash index once they grow),
 * arrays, and the public accessors of trainrun/toml.h. The parser is in
 * core/toml.c. */
#include "config.h"

#include <stdalign.h> /* alignof */
#include <stddef.h>   /* max_align_t, offsetof */
#include <stdlib.h>
#include <string.h>

#include "core/toml_internal.h"
#include "trainrun/error.h"

/* ---- arena ---- */

struct tr__toml_chunk {
  tr__toml_chunk_t* next;
  max_align_t data[];
};

/* Nothing in a tree needs more than 8-byte alignment (pointers, int64_t,
 * double); chunks themselves are max_align_t aligned. */
#define ARENA_ALIGN 8
_Static_assert(alignof(tr_toml_value_t) <= ARENA_ALIGN &&
                   alignof(tr__toml_entry_t) <= ARENA_ALIGN &&
                   alignof(tr__toml_doc_t) <= ARENA_ALIGN,
               "arena alignment too small");
_Static_assert(sizeof(tr_toml_value_t) <= 48, "TOML nodes grew");
#define ARENA_FIRST_CHUNK 8192
#define ARENA_MAX_CHUNK (1u << 20)

static size_t round_up(size_t n) {
  return (n + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
}

static tr__toml_chunk_t* chunk_new(size_t bytes) {
  if (bytes > SIZE_MAX - sizeof(tr__toml_chunk_t)) return NULL;
  tr__toml_chunk_t* c = malloc(sizeof(tr__toml_chunk_t) + bytes);
  if (c) c->next = NULL;
  return c;
}

void* tr__toml_alloc(tr__toml_arena_t* a, size_t size) {
  if (size > SIZE_MAX / 2) return NULL;
  size_t need = round_up(size ? size : 1);
  if ((size_t)(a->limit - a->top) >= need) {
    a->last = a->top;
    a->top += need;
    return a->last;
  }
  if (need > a->next_size / 4) {
    /* A large block gets a chunk of its own, linked behind the head so
     * the head's free space stays in use. */
    tr__toml_chunk_t* c = chunk_new(need);
    if (!c) return NULL;
    if (a->head) {
      c->next = a->head->next;
      a->head->next = c;
    } else {
      a->head = c;
      a->top = a->limit = (char*)c->data + need;
    }
    return c->data;
  }
  tr__toml_chunk_t* c = chunk_new(a->next_size);
  if (!c) return NULL;
  c->next = a->head;
  a->head = c;
  a->top = (char*)c->data;
  a->limit = a->top + a->next_size;
  if (a->next_size < ARENA_MAX_CHUNK) a->next_size *= 2;
  a->last = a->top;
  a->top += need;
  return a->last;
}

void* tr__toml_grow(tr__toml_arena_t* a, void* old, size_t old_size,
                    size_t new_size) {
  if (old && (char*)old == a->last && a->last + round_up(old_size) == a->top &&
      new_size <= SIZE_MAX / 2 &&
      (size_t)(a->limit - a->last) >= round_up(new_size)) {
    a->top = a->last + round_up(new_size);
    return old;
  }
  void* p = tr__toml_alloc(a, new_size);
  if (p && old) memcpy(p, old, old_size < new_size ? old_size : new_size);
  return p;
}

char* tr__toml_strdup(tr__toml_arena_t* a, const char* s, size_t len) {
  char* p = tr__toml_alloc(a, len + 1);
  if (!p) return NULL;
  if (len) memcpy(p, s, len);
  p[len] = '\0';
  return p;
}

static void arena_release(tr__toml_arena_t* a) {
  tr__toml_chunk_t* c = a->head;
  while (c) {
    tr__toml_chunk_t* next = c->next;
    free(c);
    c = next;
  }
}

tr__toml_doc_t* tr__toml_doc_new(void) {
  tr__toml_arena_t a = {.next_size = ARENA_FIRST_CHUNK};
  tr__toml_doc_t* doc = tr__toml_alloc(&a, sizeof *doc);
  if (!doc) {
    arena_release(&a);
    return NULL;
  }
  memset(doc, 0, sizeof *doc);
  doc->arena = a;
  doc->root.type = TR_TOML_TABLE;
  doc->root.flags = TR__TOML_F_ROOT | TR__TOML_F_HEADER;
  doc->root.line = 1;
  doc->root.col = 1;
  return doc;
}

void tr__toml_doc_free(tr__toml_doc_t* doc) {
  if (!doc) return;
  tr__toml_arena_t a = doc->arena; /* doc lives inside the arena */
  arena_release(&a);
}

void tr_toml_free(tr_toml_value_t* root) {
  if (!root || !(root->flags & TR__TOML_F_ROOT)) return;
  tr__toml_doc_free(
      (tr__toml_doc_t*)((char*)root - offsetof(tr__toml_doc_t, root)));
}

/* ---- tables and arrays ---- */

tr_toml_value_t* tr__toml_value_new(tr__toml_arena_t* a, tr_toml_type_t t,
                                    int line, int col) {
  tr_toml_value_t* v = tr__toml_alloc(a, sizeof *v);
  if (!v) return NULL;
  memset(v, 0, sizeof *v);
  v->type = (uint8_t)t;
  v->line = line;
  v->col = col;
  return v;
}

/* FNV-1a: keys are short, this is fast and spreads well enough. */
static uint32_t key_hash(const char* k, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)k[i];
    h *= 16777619u;
  }
  return h;
}

#define INDEX_FROM 8 /* tables with more entries get a hash index */

static void index_insert(uint32_t* index, size_t cap, const char* key,
                         size_t len, uint32_t slot) {
  size_t mask = cap - 1;
  size_t i = key_hash(key, len) & mask;
  while (index[i]) i = (i + 1) & mask;
  index[i] = slot;
}

static int index_build(tr__toml_arena_t* a, tr_toml_value_t* t, size_t cap) {
  uint32_t* index = tr__toml_alloc(a, cap * sizeof *index);
  if (!index) return TR_ENOMEM;
  memset(index, 0, cap * sizeof *index);
  for (size_t i = 0; i < t->u.tab.n; i++) {
    const tr__toml_entry_t* e = &t->u.tab.ents[i];
    index_insert(index, cap, e->key, e->len, (uint32_t)(i + 1));
  }
  t->u.tab.index = index;
  t->u.tab.index_cap = (uint32_t)cap;
  return 0;
}

long tr__toml_find(const tr_toml_value_t* t, const char* key, size_t len) {
  const tr__toml_entry_t* ents = t->u.tab.ents;
  if (!t->u.tab.index) {
    for (size_t i = 0; i < t->u.tab.n; i++)
      if (ents[i].len == len && memcmp(ents[i].key, key, len) == 0)
        return (long)i;
    return -1;
  }
  size_t mask = t->u.tab.index_cap - 1;
  for (size_t i = key_hash(key, len) & mask;; i = (i + 1) & mask) {
    uint32_t slot = t->u.tab.index[i];
    if (!slot) return -1;
    const tr__toml_entry_t* e = &ents[slot - 1];
    if (e->len == len && memcmp(e->key, key, len) == 0) return (long)slot - 1;
  }
}

int tr__toml_table_add(tr__toml_arena_t* a, tr_toml_value_t* t, const char* key,
                       size_t len, int line, int col, tr_toml_value_t* val) {
  size_t n = t->u.tab.n;
  if (n >= UINT32_MAX / 4) return TR_ENOMEM;
  if (n == t->u.tab.cap) {
    size_t cap = n ? 2 * n : 4;
    tr__toml_entry_t* ents =
        tr__toml_grow(a, t->u.tab.ents, n * sizeof *ents, cap * sizeof *ents);
    if (!ents) return TR_ENOMEM;
    t->u.tab.ents = ents;
    t->u.tab.cap = (uint32_t)cap;
  }
  t->u.tab.ents[n] = (tr__toml_entry_t){key, len, line, col, val};
  t->u.tab.n = (uint32_t)(n + 1);
  if (t->u.tab.index) {
    if (2 * (n + 1) > t->u.tab.index_cap)
      return index_build(a, t, 2 * t->u.tab.index_cap);
    index_insert(t->u.tab.index, t->u.tab.index_cap, key, len,
                 (uint32_t)(n + 1));
  } else if (n + 1 > INDEX_FROM) {
    return index_build(a, t, 4 * INDEX_FROM);
  }
  return 0;
}

int tr__toml_array_push(tr__toml_arena_t* a, tr_toml_value_t* arr,
                        tr_toml_value_t* val) {
  size_t n = arr->u.arr.n;
  if (n >= UINT32_MAX / 2) return TR_ENOMEM;
  if (n == arr->u.arr.cap) {
    size_t cap = n ? 2 * n : 4;
    tr_toml_value_t** items = tr__toml_grow(
        a, arr->u.arr.items, n * sizeof *items, cap * sizeof *items);
    if (!items) return TR_ENOMEM;
    arr->u.arr.items = items;
    arr->u.arr.cap = (uint32_t)cap;
  }
  arr->u.arr.items[n] = val;
  arr->u.arr.n = (uint32_t)(n + 1);
  return 0;
}

/* ---- public accessors ---- */

tr_toml_type_t tr_toml_type(const tr_toml_value_t* v) {
  return (tr_toml_type_t)v->type;
}

const char* tr_toml_type_name(tr_toml_type_t t) {
  switch (t) {
    case TR_TOML_STRING:
      return "string";
    case TR_TOML_INTEGER:
      return "integer";
    case TR_TOML_FLOAT:
      return "float";
    case TR_TOML_BOOL:
      return "bool";
    case TR_TOML_DATETIME:
      return "datetime";
    case TR_TOML_DATETIME_LOCAL:
      return "datetime-local";
    case TR_TOML_DATE_LOCAL:
      return "date-local";
    case TR_TOML_TIME_LOCAL:
      return "time-local";
    case TR_TOML_ARRAY:
      return "array";
    case TR_TOML_TABLE:
      return "table";
  }
  return "unknown";
}

int tr_toml_line(const tr_toml_value_t* v) { return v ? v->line : 0; }

int tr_toml_col(const tr_toml_value_t* v) { return v ? v->col : 0; }

const char* tr_toml_string(const tr_toml_value_t* v, size_t* len) {
  if (!v || v->type != TR_TOML_STRING) {
    if (len) *len = 0;
    return NULL;
  }
  if (len) *len = v->u.str.len;
  return v->u.str.s;
}

int64_t tr_toml_int(const tr_toml_value_t* v) {
  return v && v->type == TR_TOML_INTEGER ? v->u.i : 0;
}

double tr_toml_float(const tr_toml_value_t* v) {
  return v && v->type == TR_TOML_FLOAT ? v->u.f : 0.0;
}

int tr_toml_bool(const tr_toml_value_t* v) {
  return v && v->type == TR_TOML_BOOL ? v->u.b : 0;
}

static int is_datetime(const tr_toml_value_t* v) {
  return v &&
         (v->type == TR_TOML_DATETIME || v->type == TR_TOML_DATETIME_LOCAL ||
          v->type == TR_TOML_DATE_LOCAL || v->type == TR_TOML_TIME_LOCAL);
}

const tr_toml_datetime_t* tr_toml_datetime(const tr_toml_value_t* v) {
  return is_datetime(v) ? &v->u.dt->dt : NULL;
}

const char* tr_toml_datetime_text(const tr_toml_value_t* v) {
  return is_datetime(v) ? v->u.dt->text : NULL;
}

size_t tr_toml_count(const tr_toml_value_t* v) {
  if (!v) return 0;
  if (v->type == TR_TOML_ARRAY) return v->u.arr.n;
  if (v->type == TR_TOML_TABLE) return v->u.tab.n;
  return 0;
}

const tr_toml_value_t* tr_toml_at(const tr_toml_value_t* v, size_t i) {
  if (!v) return NULL;
  if (v->type == TR_TOML_ARRAY)
    return i < v->u.arr.n ? v->u.arr.items[i] : NULL;
  if (v->type == TR_TOML_TABLE)
    return i < v->u.tab.n ? v->u.tab.ents[i].val : NULL;
  return NULL;
}

static const tr__toml_entry_t* entry_at(const tr_toml_value_t* t, size_t i) {
  if (!t || t->type != TR_TOML_TABLE || i >= t->u.tab.n) return NULL;
  return &t->u.tab.ents[i];
}

const char* tr_toml_key_at(const tr_toml_value_t* table, size_t i) {
  const tr__toml_entry_t* e = entry_at(table, i);
  return e ? e->key : NULL;
}

size_t tr_toml_key_len(const tr_toml_value_t* table, size_t i) {
  const tr__toml_entry_t* e = entry_at(table, i);
  return e ? e->len : 0;
}

int tr_toml_key_line(const tr_toml_value_t* table, size_t i) {
  const tr__toml_entry_t* e = entry_at(table, i);
  return e ? e->line : 0;
}

int tr_toml_key_col(const tr_toml_value_t* table, size_t i) {
  const tr__toml_entry_t* e = entry_at(table, i);
  return e ? e->col : 0;
}

const tr_toml_value_t* tr_toml_get(const tr_toml_value_t* table,
                                   const char* key) {
  if (!table || table->type != TR_TOML_TABLE || !key) return NULL;
  long i = tr__toml_find(table, key, strlen(key));
  return i < 0 ? NULL : table->u.tab.ents[i].val;
}
