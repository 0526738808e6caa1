/* flight_recorder/fra_internal.h: the analyzer's internals shared by
 * unpickle.c and analyze.c — a small value tree allocated in an arena.
 *
 * Both dump formats become this tree: the pickle reader builds it directly
 * (fast: no per-node malloc, freed at once), the JSON loader converts
 * jansson's tree into it, and one loader (analyze.c) reads entries from it.
 * A dump of 2000 entries is ~60k nodes; the analyzer keeps only a compact
 * record per entry and drops each file's tree after reading it.
 */
#ifndef TRAINRUN_FR_FRA_INTERNAL_H
#define TRAINRUN_FR_FRA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "trainrun/errmsg.h"

typedef enum {
  TR__FRV_NONE = 0,
  TR__FRV_BOOL,
  TR__FRV_INT,
  TR__FRV_FLOAT,
  TR__FRV_STR,
  TR__FRV_LIST, /* lists and tuples */
  TR__FRV_DICT  /* items[2k] key, items[2k+1] value, in insertion order */
} tr__frv_kind_t;

typedef struct tr__frv tr__frv_t;
struct tr__frv {
  uint8_t kind;
  uint8_t is_tuple;
  uint32_t n; /* string bytes, list items, dict pairs */
  union {
    int64_t i; /* INT, BOOL */
    double f;
    const char* s; /* NUL-terminated; may hold NULs inside (n counts) */
    tr__frv_t** items;
  } u;
};

/* Bump allocator in chunks; tr__arena_release frees everything at once. */
typedef struct tr__arena_chunk tr__arena_chunk_t;
typedef struct {
  tr__arena_chunk_t* head;  /* chunks in use, newest first */
  tr__arena_chunk_t* spare; /* chunks kept by tr__arena_reset */
  size_t used_total;        /* bytes handed out (for the limit) */
  size_t limit;             /* 0: none */
} tr__arena_t;

void tr__arena_init(tr__arena_t* a, size_t limit);
void* tr__arena_alloc(tr__arena_t* a, size_t n); /* NULL: out of memory or
                                                    over the limit */
/* Forget every allocation but keep the chunks for reuse; new limit. */
void tr__arena_reset(tr__arena_t* a, size_t limit);
void tr__arena_release(tr__arena_t* a);

/* Decode a pickle into a tree in arena. name is for messages. */
int tr__fr_unpickle(const uint8_t* buf, size_t len, const char* name,
                    tr__arena_t* arena, tr__frv_t** out, tr_errmsg_t* err);

/* Copy a jansson tree into the arena. */
int tr__frv_from_json(json_t* j, tr__arena_t* arena, tr__frv_t** out);

/* The tree as jansson values (new reference; NULL on out of memory). */
json_t* tr__frv_to_json(const tr__frv_t* v);

/* Dict lookup by key (linear); NULL when absent or v is not a dict. */
const tr__frv_t* tr__frv_get(const tr__frv_t* v, const char* key);

#endif /* TRAINRUN_FR_FRA_INTERNAL_H */
