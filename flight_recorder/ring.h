/* flight_recorder/ring.h: the layout of a flight-recorder ring in shared
 * memory, shared by the writer (recorder.c), the reader (ring.c) and the
 * dumps (dump.c). Not installed.
 *
 * Every slot that other processes read is guarded by a sequence counter:
 * the writer makes it odd, writes, makes it even (release); a reader copies
 * between two loads of an even, unchanged counter. An entry's counter holds
 * (record_id + 1) << 8 | version, so a reader also knows which record a
 * slot holds. */
#ifndef TRAINRUN_FLIGHT_RECORDER_RING_H
#define TRAINRUN_FLIGHT_RECORDER_RING_H

#include <stddef.h>
#include <stdint.h>

#include "trainrun/flight_recorder.h"

#define TR__FR_MAGIC 0x31474e4952465254ull /* "TRFRING1" */
#define TR__FR_LAYOUT 1
#define TR__FR_MAX_PGS 256
#define TR__FR_MAX_SYMS 1024

typedef struct {
  uint64_t seq; /* 0 unused, odd being written, even published */
  int64_t pg_id;
  char name[TR_FR_NAME_MAX], desc[TR_FR_NAME_MAX];
  int32_t nranks;    /* -1: the rank pool was full */
  int32_t ranks_off; /* into the rank pool */
  /* collective sequence numbers, updated with atomic max; -1 none */
  int64_t last_enqueued, last_started, last_completed;
} tr__fr_shm_pg_t;

typedef struct {
  uint64_t addr;
  char name[96], file[96];
} tr__fr_shm_sym_t; /* published by the header's nsyms */

typedef struct {
  uint64_t seq;
  int64_t record_id;
  int32_t pg_slot;
  int32_t status;
  int64_t collective_seq_id, p2p_seq_id, op_id;
  int64_t time_created_ns, time_started_ns, time_completed_ns;
  int64_t timeout_ms;
  int64_t thread_id;
  uint8_t state, retired, is_p2p, n_inputs, n_outputs, nframes;
  uint8_t in_ndim, out_ndim, in_dtype, out_dtype;
  uint8_t pad[6];
  char profiling_name[TR_FR_NAME_MAX];
  char thread_name[16];
  int64_t in_shape[TR_MAX_DIMS], out_shape[TR_MAX_DIMS];
  uint16_t frames[TR_FR_MAX_FRAMES]; /* symbol table indices */
} tr__fr_shm_entry_t;

typedef struct {
  uint64_t magic;
  uint32_t layout, header_size;
  uint32_t entry_size, capacity;
  int32_t rank, world_size, local_rank, pid;
  int32_t hang_timeout_s, timing;
  uint32_t rank_pool_cap;
  int32_t pad0;
  int64_t created_ns;
  char dump_dir[512], dump_prefix[128], store_prefix[128];
  /* written while recording; each group on a cache line of its own */
  __attribute__((aligned(64))) uint64_t next; /* record ids handed out */
  __attribute__((aligned(64))) uint64_t progress;
  int64_t inflight;
  __attribute__((aligned(64))) uint64_t dump_req;
  int32_t dump_scope;
  uint32_t npgs;           /* slots claimed */
  uint32_t nsyms;          /* symbols published */
  uint32_t rank_pool_used; /* ints claimed */
  tr__fr_shm_pg_t pgs[TR__FR_MAX_PGS];
  tr__fr_shm_sym_t syms[TR__FR_MAX_SYMS];
  /* then: int32_t rank pool[rank_pool_cap], entries[capacity] (64-aligned) */
} tr__fr_shm_hdr_t;

/* Offsets of the rank pool and the entries, and the segment size. */
size_t tr__fr_pool_off(void);
size_t tr__fr_entries_off(uint32_t rank_pool_cap);
size_t tr__fr_shm_size(uint32_t rank_pool_cap, uint32_t capacity);

static inline int32_t* tr__fr_pool(tr__fr_shm_hdr_t* h) {
  return (int32_t*)((char*)h + tr__fr_pool_off());
}
static inline tr__fr_shm_entry_t* tr__fr_entries(tr__fr_shm_hdr_t* h) {
  return (tr__fr_shm_entry_t*)((char*)h + tr__fr_entries_off(h->rank_pool_cap));
}

/* Copy a mapped ring (reader side of every counter). */
int tr__fr_snapshot_hdr(const tr__fr_shm_hdr_t* h, size_t map_size,
                        size_t max_entries, tr_fr_snapshot_t* out);

#endif /* TRAINRUN_FLIGHT_RECORDER_RING_H */
