/* core/toml_internal.h: the TOML tree shared by the parser (core/toml.c) and
 * the tree code (core/toml_value.c: arena, tables, accessors). Not installed.
 *
 * A document's values, keys and strings live in one arena of chunks that
 * tr_toml_free() releases at once; the arena itself and the root table sit
 * in the first chunk (tr__toml_doc_t).
 */
#ifndef TRAINRUN_CORE_TOML_INTERNAL_H
#define TRAINRUN_CORE_TOML_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "trainrun/toml.h"

/* Deepest nesting of tables and arrays below the root (an error beyond). */
#define TR__TOML_MAX_DEPTH 256

typedef struct tr__toml_chunk tr__toml_chunk_t;

typedef struct {
  tr__toml_chunk_t* head; /* newest chunk; older ones follow ->next */
  char* top;              /* free space of head: [top, limit) */
  char* limit;
  char* last;       /* start of the newest allocation (for growing) */
  size_t next_size; /* size of the next ordinary chunk */
} tr__toml_arena_t;

/* Allocate size bytes aligned for any scalar; NULL when out of memory. */
void* tr__toml_alloc(tr__toml_arena_t* a, size_t size);
/* Grow old (old_size bytes, from this arena) to new_size, in place when it is
 * the newest allocation and fits; contents are kept. NULL when out of memory
 * (old stays valid). */
void* tr__toml_grow(tr__toml_arena_t* a, void* old, size_t old_size,
                    size_t new_size);
/* Copy len bytes and a NUL. */
char* tr__toml_strdup(tr__toml_arena_t* a, const char* s, size_t len);

/* How a table or array came to be; decides what may later extend it. */
enum {
  TR__TOML_F_ROOT = 1 << 0,     /* the document's root table */
  TR__TOML_F_HEADER = 1 << 1,   /* defined by [header] or a [[header]] item */
  TR__TOML_F_IMPLICIT = 1 << 2, /* created as the prefix of a header only */
  TR__TOML_F_DOTTED = 1 << 3,   /* created or extended by a dotted key */
  TR__TOML_F_FROZEN = 1 << 4,   /* inline table: complete when written */
  TR__TOML_F_AOT = 1 << 5       /* array of tables made by [[header]] */
};

typedef struct {
  const char* key; /* NUL-terminated, may contain NULs */
  size_t len;
  int line, col;
  tr_toml_value_t* val;
} tr__toml_entry_t;

/* A date-time value's fields and its normalised text. */
typedef struct {
  tr_toml_datetime_t dt;
  char text[];
} tr__toml_dt_t;

/* 48 bytes: a document's tree is about ten times its text, most of it
 * these nodes, so they stay small. */
struct tr_toml_value {
  uint8_t type;   /* tr_toml_type_t */
  uint8_t flags;  /* TR__TOML_F_* for tables and arrays */
  uint16_t depth; /* 0 for the root, parent's depth + 1 for containers */
  int line, col;
  union {
    struct {
      char* s;
      size_t len;
    } str;
    int64_t i;
    double f;
    int b;
    tr__toml_dt_t* dt;
    struct {
      tr_toml_value_t** items;
      uint32_t n, cap;
    } arr;
    struct {
      tr__toml_entry_t* ents;
      uint32_t* index; /* open addressing, entry index + 1; NULL if small */
      uint32_t n, cap, index_cap;
    } tab;
  } u;
};

/* One parsed document: freed by tr_toml_free(&doc->root). */
typedef struct {
  tr__toml_arena_t arena;
  tr_toml_value_t root;
} tr__toml_doc_t;

/* A new document with an empty root table at 1:1; NULL when out of memory. */
tr__toml_doc_t* tr__toml_doc_new(void);
void tr__toml_doc_free(tr__toml_doc_t* doc);

/* A zeroed value of type t at line:col; NULL when out of memory. */
tr_toml_value_t* tr__toml_value_new(tr__toml_arena_t* a, tr_toml_type_t t,
                                    int line, int col);
/* Index of key in table t, or -1. */
long tr__toml_find(const tr_toml_value_t* t, const char* key, size_t len);
/* Append an entry (key must not be present; key bytes are not copied).
 * 0 or TR_ENOMEM. */
int tr__toml_table_add(tr__toml_arena_t* a, tr_toml_value_t* t, const char* key,
                       size_t len, int line, int col, tr_toml_value_t* val);
/* Append an item to an array. 0 or TR_ENOMEM. */
int tr__toml_array_push(tr__toml_arena_t* a, tr_toml_value_t* arr,
                        tr_toml_value_t* val);

#endif /* TRAINRUN_CORE_TOML_INTERNAL_H */
