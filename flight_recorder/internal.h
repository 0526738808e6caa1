/* flight_recorder/internal.h: the analyzer's internals (`trainrun fr
 * analyze`, include/trainrun/fr_analyze.h), shared by its files:
 *
 *   unpickle.c  a dump file -> a small value tree allocated in an arena
 *   load.c      the folder's dumps -> one compact record per entry (ent_t),
 *               process groups; the analyzer's lifecycle
 *   match.c     entries -> findings: collectives by sequence number,
 *               send/recv by peer, torchfrtrace's checks
 *   verdict.c   findings -> the verdict paragraph
 *   output.c    the report, the -j table, JSON; rank lists and times
 *
 * Both dump formats become the value tree: the pickle reader builds it
 * directly (fast: no per-node malloc, freed at once), the JSON loader
 * converts jansson's tree into it, and one loader (load.c) reads entries
 * from it. A dump of 2000 entries is ~60k nodes; the analyzer keeps only a
 * compact record per entry (strings interned) and drops each file's tree
 * after reading it.
 *
 * Out of memory: the analyzer runs inside the daemon (the verdict after an
 * automatic dump), so it never aborts. A failed allocation sets a->oom; the
 * phase (load, analyze, print) stops at its next check and returns
 * TR_ENOMEM, and the half-built results are never read.
 *
 * The ring's layout in shared memory (recorder.c, ring.c, dump.c) is in
 * flight_recorder/ring.h.
 */
#ifndef TRAINRUN_FLIGHT_RECORDER_INTERNAL_H
#define TRAINRUN_FLIGHT_RECORDER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "core/buf.h"
#include "trainrun/errmsg.h"
#include "trainrun/fr_analyze.h"

/* ---- the value tree (unpickle.c) ---- */

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

/* ---- the analyzer's model (load.c) ---- */

/* Interned strings: id -> string, and a hash of them. */
typedef struct {
  char** str;
  uint32_t* len;
  size_t n, cap;
  int32_t* slots; /* open addressing: id or -1 */
  size_t nslots;
} tr__fra_intern_t;

enum { TR__FRA_SCHEDULED = 0, TR__FRA_STARTED = 1, TR__FRA_COMPLETED = 2 };
/* "scheduled", "started", "completed" */
extern const char* const tr__fra_state_names[3];

/* One entry of a dump. */
typedef struct {
  int64_t record_id, seq, p2p_seq, op_id;
  int64_t t_created, t_started, t_completed; /* 0: none */
  int64_t timeout_ms;                        /* -1: none */
  int64_t in_numel, out_numel; /* of the first tensor; -1: no tensor */
  double duration_ms;          /* < 0: none */
  int32_t group;               /* index in a->g */
  int32_t pname, op;           /* interned profiling name, op type */
  int32_t in_sizes, out_sizes, in_dt, out_dt, frames; /* interned; -1 */
  int32_t pg_name;                                    /* interned */
  int32_t self_l, peer_l; /* p2p: group-local ranks from the name */
  uint8_t state, retired, is_p2p, has_is_p2p, in0, out0, coalesced;
} tr__fra_ent_t;

/* One rank's dump. */
typedef struct {
  int rank;
  char* path;
  char* version;
  int vmaj, vmin;
  tr__fra_ent_t* e;
  size_t n;
  int wrapped;     /* first record_id > 0: older entries were evicted */
  int64_t t_first; /* earliest time_created */
  int64_t t_last;  /* latest timestamp of any kind */
} tr__fra_dump_t;

/* A process group: name and member set. */
typedef struct {
  int32_t name, desc;
  int* ranks;
  size_t n, rcap;
  int inferred; /* not in any pg_config: members = ranks using it */
  /* per member position: entry indices into that rank's dump (match.c) */
  uint32_t** coll;
  size_t* ncoll;
  size_t* ccap;
} tr__fra_group_t;

/* A finding and what the verdict needs to know about it. */
typedef struct {
  tr_fra_finding_t pub;
  int64_t t_ref; /* for picking the primary: when the problem began */
  int ref_rank;  /* rank and entry the finding describes */
  int64_t ref_ent;
  int state; /* of the waiting ranks: TR__FRA_* (-1 unknown) */
} tr__fra_finding_t;

struct tr_fra {
  tr_fra_opts_t o;
  char* dir;
  tr__fra_intern_t in;
  tr__fra_dump_t* d;
  size_t nd;
  int* ranks;     /* sorted ranks with a dump */
  int* rank_to_d; /* rank -> index in d, -1; size max_rank + 1 */
  int max_rank;
  tr__fra_group_t* g;
  size_t ng, gcap;
  int* missing; /* member ranks without a dump */
  size_t nmissing;
  tr__fra_finding_t* f;
  size_t nf, fcap;
  tr__fra_finding_t spill; /* add_finding's answer when out of memory */
  int primary;
  char* verdict;
  size_t n_collectives; /* matched calls */
  size_t n_entries;
  int64_t t_max;
  int mixed_versions;
  tr__buf_t notes; /* lines such as "Too many mismatches" */
  /* memory owned by findings (culprit lists, details) */
  void** owned;
  size_t nowned, owncap;
  int32_t id_send, id_recv, id_coalesced, id_empty, id_completed, id_started;
  /* profiling name id -> op id, self, peer (parsed once; op -2: not yet) */
  struct {
    int32_t op, self, peer;
  } * pn;
  size_t pn_cap;
  uint8_t* opc; /* op id -> op class bits (0xff: not computed) */
  size_t opc_cap;
  tr__arena_t arena; /* one file's value tree at a time */
  int oom;           /* an allocation failed (see above) */
};

/* The interned string id ("" for -1). */
static inline const char* tr__fra_str(const tr_fra_t* a, int32_t id) {
  return id >= 0 ? a->in.str[id] : "";
}

/* The entry a finding describes. */
static inline const tr__fra_ent_t* tr__fra_ref(const tr_fra_t* a,
                                               const tr__fra_finding_t* f) {
  return f->ref_rank >= 0 && f->ref_ent >= 0
             ? &a->d[a->rank_to_d[f->ref_rank]].e[f->ref_ent]
             : NULL;
}

int tr__fra_cmp_int(const void* x, const void* y);

/* ---- the verdict (verdict.c) ---- */

/* Pick the primary finding and write a->verdict; TR_ENOMEM. */
int tr__fra_build_verdict(tr_fra_t* a);

/* ---- text (output.c) ---- */

/* "0-3,5,7-9" */
void tr__fra_add_ranks(tr__buf_t* b, const int* r, size_t n);
/* "12:00:03 UTC" of a CLOCK_REALTIME ns */
void tr__fra_add_time(tr__buf_t* b, int64_t ns);
/* "1h 5m", "2m 3s", "4.5s" */
void tr__fra_add_duration(tr__buf_t* b, int64_t ns);
/* Decimal, faster than printf (the loader writes millions of sizes). */
void tr__fra_add_int(tr__buf_t* b, int64_t v);

#endif /* TRAINRUN_FLIGHT_RECORDER_INTERNAL_H */
