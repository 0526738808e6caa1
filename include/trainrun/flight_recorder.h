/* trainrun/flight_recorder.h: the flight recorder -- every collective of a
 * rank, in a ring in POSIX shared memory, dumped in PyTorch's format.
 *
 * The worker side records; any process of the same user reads:
 *
 *   tr_fr_opts_t o;
 *   tr_fr_opts_init(&o);                  // entries, stacks, timing...
 *   o.shm_name = "/trainrun-job-123-r0-3"; o.rank = 3; o.world_size = 8;
 *   o.dump_dir = "outputs/comm_traces"; o.dump_prefix = "rank_";
 *   tr_fr_t* fr;
 *   TR_CHECK(tr_fr_init(&o, &fr));        // hooks into every process group
 *   TR_CHECK(tr_fr_add_group(fr, world)); // groups made before tr_fr_init
 *   ... collectives are recorded ...
 *   tr_fr_free(fr);                       // unregisters, unlinks the ring
 *
 *   tr_fr_ring_t* ring;                   // in the daemon, even after the
 *   TR_CHECK(tr_fr_ring_open(name, &ring)); // worker hung or died
 *   tr_fr_snapshot_t s;
 *   TR_CHECK(tr_fr_snapshot(ring, &s));
 *   TR_CHECK(tr_fr_dump_write(&s, NULL, NULL, path, sizeof path));
 *   tr_fr_snapshot_release(&s);
 *   tr_fr_ring_close(ring);
 *
 * The ring
 * --------
 * One segment per rank: a header (layout version, rank, world, pid, the
 * dump folder and prefix, the hang timeout, a progress counter, a dump
 * request counter), a table of process groups (name, desc, ranks, and
 * last enqueued / started / completed collective sequence number), a symbol
 * table for stack frames, and `capacity` fixed-size entries. A collective
 * takes the next record id with one atomic add and writes its slot under a
 * per-entry sequence counter (odd while written); start and completion
 * update the slot the same way. No locks, no system calls: a reader copies
 * a slot and keeps it only when the counter was even and unchanged, so it
 * sees whole entries while the writer runs, and after it died (a slot left
 * half written is skipped). Recording one collective costs well under a
 * microsecond without stacks (bench/fr_bench).
 *
 * Dumps
 * -----
 * tr_fr_dump_write writes <dir>/<prefix><rank> as PyTorch's flight-recorder
 * pickle (protocol 2, the dict torchfrtrace loads, version "2.10": version,
 * comm_lib_version, pg_config, pg_status, entries) and <dir>/<prefix><rank>
 * .json with the same keys as PyTorch's JSON dump. Both are written to a
 * temporary name, fsynced and renamed.
 */
#ifndef TRAINRUN_FLIGHT_RECORDER_H
#define TRAINRUN_FLIGHT_RECORDER_H

#include <stddef.h>
#include <stdint.h>

#include "trainrun/pg.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TR_FR_DUMP_VERSION "2.10" /* PyTorch's dump schema */
#define TR_FR_MAX_FRAMES 8        /* stack frames kept per entry */
#define TR_FR_NAME_MAX 64         /* group names, descs, profiling names */

typedef struct tr_fr_s tr_fr_t;
typedef struct tr_fr_ring_s tr_fr_ring_t;

/* ---- recording (the worker) ---- */

typedef struct {
  /* Segment name ("/name", at most 250 bytes); NULL: TRAINRUN_FR_SHM, else
   * "/trainrun-<pid>-<rank>". */
  const char* shm_name;
  int rank, world_size, local_rank;
  int64_t capacity;         /* entries ([comm] trace_buf_size); 0: off */
  const char* dump_dir;     /* where dumps go; NULL: "comm_traces" */
  const char* dump_prefix;  /* file prefix; NULL: "rank_" */
  int hang_timeout_s;       /* [comm] hang_timeout_seconds, 0: off (the
                              daemon reads it from the header) */
  const char* store_prefix; /* the groups' store prefix: the daemon watches
                               "<store_prefix>/exception_dump"; NULL: none */
  int stacks;               /* capture native frames (TRAINRUN_FR_STACK) */
  int timing;               /* write duration_ms (TRAINRUN_FR_TIMING) */
  int sigusr1; /* SIGUSR1 asks the daemon to dump this rank's ring */
} tr_fr_opts_t;

/* Defaults: capacity 20000, stacks and timing from the environment,
 * sigusr1 on, rank 0 of 1. */
void tr_fr_opts_init(tr_fr_opts_t* o);

/* Create the ring (replacing a stale segment of the same name) and
 * register the process-group hooks. One recorder per process: TR_EEXIST for
 * a second. With capacity 0, *out = NULL and nothing is recorded. */
int tr_fr_init(const tr_fr_opts_t* o, tr_fr_t** out);

/* Record a group created before tr_fr_init (the world group). */
int tr_fr_add_group(tr_fr_t* fr, const tr_pg_t* pg);

/* Ask the daemon to dump: scope 0 this rank only, 1 every rank of the job.
 * Async-signal-safe (the SIGUSR1 handler calls it with scope 0). */
void tr_fr_request_dump(tr_fr_t* fr, int scope);

/* The ring's segment name. */
const char* tr_fr_shm_name(const tr_fr_t* fr);

/* Unregister the hooks, unmap and unlink the segment. NULL is a no-op. */
void tr_fr_free(tr_fr_t* fr);

/* ---- reading (any process of the same user) ---- */

/* Map an existing ring read-only. TR_ENOENT when there is none yet,
 * TR_EPROTO when it is not a ring of this layout version. */
int tr_fr_ring_open(const char* shm_name, tr_fr_ring_t** out);
void tr_fr_ring_close(tr_fr_ring_t* r);
/* shm_unlink(name); 0, or the negated errno. */
int tr_fr_ring_unlink(const char* shm_name);

/* Live counters of a ring (read without copying it). */
typedef struct {
  int rank, world_size, pid;
  uint64_t next_record; /* record ids handed out so far */
  uint64_t progress;    /* bumped on every start and completion */
  uint64_t dump_req;    /* bumped by tr_fr_request_dump */
  int dump_scope;       /* of the last request */
  int in_flight;        /* entries enqueued and not completed (approx.) */
  int hang_timeout_s;
  char store_prefix[128];
} tr_fr_ring_info_t;
void tr_fr_ring_info(const tr_fr_ring_t* r, tr_fr_ring_info_t* out);

typedef enum {
  TR_FR_SCHEDULED = 0,
  TR_FR_STARTED = 1,
  TR_FR_COMPLETED = 2
} tr_fr_state_t;

/* "scheduled", "started", "completed". */
const char* tr_fr_state_name(tr_fr_state_t s);

typedef struct {
  char name[96], file[96];
} tr_fr_frame_t;

/* One entry, copied out of the ring. */
typedef struct {
  int64_t record_id;
  int64_t pg_id;
  char pg_name[TR_FR_NAME_MAX], pg_desc[TR_FR_NAME_MAX];
  int64_t collective_seq_id, p2p_seq_id, op_id;
  char profiling_name[TR_FR_NAME_MAX];
  char thread_name[16];
  int64_t thread_id;
  int64_t time_created_ns;
  int64_t time_started_ns;   /* 0: not seen */
  int64_t time_completed_ns; /* 0: not seen */
  int64_t timeout_ms;
  int status; /* of the completion: 0 or a negative TR_E* code */
  tr_fr_state_t state;
  int retired; /* the op ended (completed, failed or timed out) */
  int is_p2p;
  int has_duration;
  double duration_ms;
  int n_inputs, n_outputs; /* 0 or 1 */
  tr_pg_tensor_meta_t inputs[1], outputs[1];
  int nframes;
  tr_fr_frame_t frames[TR_FR_MAX_FRAMES];
} tr_fr_entry_t;

typedef struct {
  int64_t pg_id;
  char name[TR_FR_NAME_MAX], desc[TR_FR_NAME_MAX];
  int* ranks; /* global ranks, n of them */
  int n;
  int64_t last_enqueued, last_started, last_completed; /* -1: none */
} tr_fr_pg_t;

/* A consistent copy of a ring: entries in recording order. */
typedef struct {
  int rank, world_size, pid;
  char dump_dir[512], dump_prefix[128];
  int timing;
  tr_fr_pg_t* pgs;
  int npgs;
  tr_fr_entry_t* entries;
  size_t nentries;
  size_t torn; /* slots skipped: being written, or left half written */
} tr_fr_snapshot_t;

/* Copy the ring out. The snapshot owns its arrays. */
int tr_fr_snapshot(const tr_fr_ring_t* r, tr_fr_snapshot_t* out);
/* Only the last max entries (max >= 1): cheap enough to poll. */
int tr_fr_snapshot_last(const tr_fr_ring_t* r, size_t max,
                        tr_fr_snapshot_t* out);
/* The same for a recorder of this process. */
int tr_fr_snapshot_self(const tr_fr_t* fr, tr_fr_snapshot_t* out);
void tr_fr_snapshot_release(tr_fr_snapshot_t* s);

/* ---- dumps ---- */

/* PyTorch's pickle of the snapshot (protocol 2), malloc()ed into *buf. */
int tr_fr_dump_pickle(const tr_fr_snapshot_t* s, char** buf, size_t* len);
/* PyTorch's JSON dump of the snapshot, malloc()ed NUL-terminated text. */
int tr_fr_dump_json(const tr_fr_snapshot_t* s, char** text);
/* Write <dir>/<prefix><rank> (pickle) and the same name + ".json"; dir and
 * prefix NULL: the snapshot's. The folder is created. The pickle's path
 * goes to path (cap bytes) when path is not NULL. */
int tr_fr_dump_write(const tr_fr_snapshot_t* s, const char* dir,
                     const char* prefix, char* path, size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_FLIGHT_RECORDER_H */
