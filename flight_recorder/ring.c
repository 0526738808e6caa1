/* flight_recorder/ring.c: the reader side of a flight-recorder ring --
 * map a rank's segment read-only (another process: the daemon, `trainrun
 * fr`), read its live counters, and copy it out as a consistent snapshot
 * while the writer runs or after it died. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flight_recorder/ring.h"
#include "trainrun/error.h"
#include "trainrun/log.h"

struct tr_fr_ring_s {
  const tr__fr_shm_hdr_t* h;
  size_t size;
};

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

size_t tr__fr_pool_off(void) { return align64(sizeof(tr__fr_shm_hdr_t)); }

size_t tr__fr_entries_off(uint32_t rank_pool_cap) {
  return align64(tr__fr_pool_off() + sizeof(int32_t) * (size_t)rank_pool_cap);
}

size_t tr__fr_shm_size(uint32_t rank_pool_cap, uint32_t capacity) {
  return tr__fr_entries_off(rank_pool_cap) +
         sizeof(tr__fr_shm_entry_t) * (size_t)capacity;
}

const char* tr_fr_state_name(tr_fr_state_t s) {
  switch (s) {
    case TR_FR_STARTED:
      return "started";
    case TR_FR_COMPLETED:
      return "completed";
    default:
      return "scheduled";
  }
}

int tr_fr_ring_unlink(const char* shm_name) {
  return shm_unlink(shm_name) == 0 ? 0 : tr_err_from_errno();
}

int tr_fr_ring_open(const char* shm_name, tr_fr_ring_t** out) {
  *out = NULL;
  int fd = shm_open(shm_name, O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return tr_err_from_errno();
  struct stat st;
  int rc = fstat(fd, &st) == 0 ? 0 : tr_err_from_errno();
  size_t size = rc == 0 ? (size_t)st.st_size : 0;
  /* the writer sizes the segment before it writes the magic */
  if (rc == 0 && size < sizeof(tr__fr_shm_hdr_t)) rc = TR_ENOENT;
  void* p = MAP_FAILED;
  if (rc == 0) {
    p = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) rc = tr_err_from_errno();
  }
  close(fd);
  if (rc < 0) return rc;
  const tr__fr_shm_hdr_t* h = p;
  uint64_t magic = __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE);
  if (magic != TR__FR_MAGIC) rc = magic == 0 ? TR_ENOENT : TR_EPROTO;
  if (rc == 0 && (h->layout != TR__FR_LAYOUT || h->capacity == 0 ||
                  h->entry_size != sizeof(tr__fr_shm_entry_t) ||
                  h->header_size != sizeof(tr__fr_shm_hdr_t) ||
                  tr__fr_shm_size(h->rank_pool_cap, h->capacity) > size)) {
    TR_LOG_WARN(FR, "'%s' is not a flight-recorder ring of layout %d", shm_name,
                TR__FR_LAYOUT);
    rc = TR_EPROTO;
  }
  tr_fr_ring_t* r = rc == 0 ? calloc(1, sizeof *r) : NULL;
  if (rc == 0 && !r) rc = TR_ENOMEM;
  if (rc < 0) {
    munmap(p, size);
    return rc;
  }
  r->h = h;
  r->size = size;
  *out = r;
  return 0;
}

void tr_fr_ring_close(tr_fr_ring_t* r) {
  if (!r) return;
  munmap((void*)r->h, r->size);
  free(r);
}

void tr_fr_ring_info(const tr_fr_ring_t* r, tr_fr_ring_info_t* out) {
  const tr__fr_shm_hdr_t* h = r->h;
  memset(out, 0, sizeof *out);
  out->rank = h->rank;
  out->world_size = h->world_size;
  out->pid = h->pid;
  out->next_record = __atomic_load_n(&h->next, __ATOMIC_ACQUIRE);
  out->progress = __atomic_load_n(&h->progress, __ATOMIC_ACQUIRE);
  out->dump_req = __atomic_load_n(&h->dump_req, __ATOMIC_ACQUIRE);
  out->dump_scope = __atomic_load_n(&h->dump_scope, __ATOMIC_RELAXED);
  int64_t inflight = __atomic_load_n(&h->inflight, __ATOMIC_RELAXED);
  out->in_flight = inflight < 0 ? 0 : (int)inflight;
  out->hang_timeout_s = h->hang_timeout_s;
  memcpy(out->store_prefix, h->store_prefix, sizeof out->store_prefix);
  out->store_prefix[sizeof out->store_prefix - 1] = '\0';
}

/* Copy a slot guarded by *seq into dst; 1 when the copy is whole, with the
 * counter it had in *got; 0 when the slot is being written (or was left
 * half written). */
static int seq_copy(const uint64_t* seq, const void* src, void* dst, size_t n,
                    uint64_t* got) {
  for (int tries = 0; tries < 64; tries++) {
    uint64_t s1 = __atomic_load_n(seq, __ATOMIC_ACQUIRE);
    if (s1 & 1) {
      sched_yield();
      continue;
    }
    memcpy(dst, src, n);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    uint64_t s2 = __atomic_load_n(seq, __ATOMIC_RELAXED);
    if (s1 == s2) {
      *got = s1;
      return 1;
    }
  }
  return 0;
}

static void copy_str(char* dst, const char* src, size_t cap) {
  memcpy(dst, src, cap);
  dst[cap - 1] = '\0';
}

/* Symbol i of the table, when published. */
static const tr__fr_shm_sym_t* sym_at(const tr__fr_shm_hdr_t* h, unsigned i,
                                      uint32_t nsyms) {
  return i < nsyms && i < TR__FR_MAX_SYMS ? &h->syms[i] : NULL;
}

int tr__fr_snapshot_hdr(const tr__fr_shm_hdr_t* h, size_t map_size,
                        size_t max_entries, tr_fr_snapshot_t* out) {
  memset(out, 0, sizeof *out);
  if (h->capacity == 0 ||
      tr__fr_shm_size(h->rank_pool_cap, h->capacity) > map_size)
    return TR_EPROTO;
  out->rank = h->rank;
  out->world_size = h->world_size;
  out->pid = h->pid;
  out->timing = h->timing;
  copy_str(out->dump_dir, h->dump_dir, sizeof out->dump_dir);
  copy_str(out->dump_prefix, h->dump_prefix, sizeof out->dump_prefix);

  /* groups */
  uint32_t npgs = __atomic_load_n(&h->npgs, __ATOMIC_ACQUIRE);
  if (npgs > TR__FR_MAX_PGS) npgs = TR__FR_MAX_PGS;
  out->pgs = calloc(npgs ? npgs : 1, sizeof *out->pgs);
  if (!out->pgs) return TR_ENOMEM;
  const int32_t* pool = tr__fr_pool((tr__fr_shm_hdr_t*)h);
  for (uint32_t i = 0; i < npgs; i++) {
    tr__fr_shm_pg_t pg;
    uint64_t s;
    if (!seq_copy(&h->pgs[i].seq, &h->pgs[i], &pg, sizeof pg, &s) || s == 0)
      continue;
    tr_fr_pg_t* o = &out->pgs[out->npgs];
    o->pg_id = pg.pg_id;
    copy_str(o->name, pg.name, sizeof o->name);
    copy_str(o->desc, pg.desc, sizeof o->desc);
    o->last_enqueued =
        __atomic_load_n(&h->pgs[i].last_enqueued, __ATOMIC_RELAXED);
    o->last_started =
        __atomic_load_n(&h->pgs[i].last_started, __ATOMIC_RELAXED);
    o->last_completed =
        __atomic_load_n(&h->pgs[i].last_completed, __ATOMIC_RELAXED);
    if (pg.nranks > 0 && pg.ranks_off >= 0 &&
        (uint64_t)pg.ranks_off + (uint64_t)pg.nranks <= h->rank_pool_cap) {
      o->ranks = malloc(sizeof(int) * (size_t)pg.nranks);
      if (!o->ranks) {
        tr_fr_snapshot_release(out);
        return TR_ENOMEM;
      }
      for (int k = 0; k < pg.nranks; k++) o->ranks[k] = pool[pg.ranks_off + k];
      o->n = pg.nranks;
    }
    out->npgs++;
  }

  /* entries, oldest first */
  uint64_t next = __atomic_load_n(&h->next, __ATOMIC_ACQUIRE);
  uint64_t cap = h->capacity;
  uint64_t first = next > cap ? next - cap : 0;
  if (max_entries && next - first > max_entries) first = next - max_entries;
  size_t want = (size_t)(next - first);
  out->entries = calloc(want ? want : 1, sizeof *out->entries);
  if (!out->entries) {
    tr_fr_snapshot_release(out);
    return TR_ENOMEM;
  }
  uint32_t nsyms = __atomic_load_n(&h->nsyms, __ATOMIC_ACQUIRE);
  const tr__fr_shm_entry_t* ents = tr__fr_entries((tr__fr_shm_hdr_t*)h);
  for (uint64_t id = first; id < next; id++) {
    const tr__fr_shm_entry_t* slot = &ents[id % cap];
    tr__fr_shm_entry_t e;
    uint64_t s;
    if (!seq_copy(&slot->seq, slot, &e, sizeof e, &s) || (s >> 8) != id + 1) {
      out->torn++; /* being written, overwritten, or left half written */
      continue;
    }
    tr_fr_entry_t* o = &out->entries[out->nentries++];
    o->record_id = e.record_id;
    if (e.pg_slot >= 0 && (uint32_t)e.pg_slot < npgs) {
      const tr__fr_shm_pg_t* pg = &h->pgs[e.pg_slot];
      o->pg_id = pg->pg_id;
      copy_str(o->pg_name, pg->name, sizeof o->pg_name);
      copy_str(o->pg_desc, pg->desc, sizeof o->pg_desc);
    } else {
      o->pg_id = -1;
      strcpy(o->pg_name, "?");
      strcpy(o->pg_desc, "undefined");
    }
    o->collective_seq_id = e.collective_seq_id;
    o->p2p_seq_id = e.p2p_seq_id;
    o->op_id = e.op_id;
    copy_str(o->profiling_name, e.profiling_name, sizeof o->profiling_name);
    copy_str(o->thread_name, e.thread_name, sizeof o->thread_name);
    o->thread_id = e.thread_id;
    o->time_created_ns = e.time_created_ns;
    o->time_started_ns = e.time_started_ns;
    o->time_completed_ns = e.time_completed_ns;
    o->timeout_ms = e.timeout_ms;
    o->status = e.status;
    o->retired = e.retired;
    o->is_p2p = e.is_p2p;
    o->state = e.time_completed_ns && e.status == 0 ? TR_FR_COMPLETED
               : e.time_started_ns                  ? TR_FR_STARTED
                                                    : TR_FR_SCHEDULED;
    if (h->timing && o->state == TR_FR_COMPLETED && e.time_started_ns) {
      o->has_duration = 1;
      o->duration_ms = (double)(e.time_completed_ns - e.time_started_ns) / 1e6;
    }
    o->n_inputs = e.n_inputs > 1 ? 1 : e.n_inputs;
    o->n_outputs = e.n_outputs > 1 ? 1 : e.n_outputs;
    o->inputs[0].ndim = e.in_ndim > TR_MAX_DIMS ? TR_MAX_DIMS : e.in_ndim;
    o->inputs[0].dtype = (tr_dtype_t)e.in_dtype;
    memcpy(o->inputs[0].shape, e.in_shape, sizeof e.in_shape);
    o->outputs[0].ndim = e.out_ndim > TR_MAX_DIMS ? TR_MAX_DIMS : e.out_ndim;
    o->outputs[0].dtype = (tr_dtype_t)e.out_dtype;
    memcpy(o->outputs[0].shape, e.out_shape, sizeof e.out_shape);
    int nf = e.nframes > TR_FR_MAX_FRAMES ? TR_FR_MAX_FRAMES : e.nframes;
    for (int k = 0; k < nf; k++) {
      const tr__fr_shm_sym_t* sy = sym_at(h, e.frames[k], nsyms);
      if (!sy) continue;
      tr_fr_frame_t* f = &o->frames[o->nframes++];
      copy_str(f->name, sy->name, sizeof f->name);
      copy_str(f->file, sy->file, sizeof f->file);
    }
  }
  return 0;
}

int tr_fr_snapshot(const tr_fr_ring_t* r, tr_fr_snapshot_t* out) {
  return tr__fr_snapshot_hdr(r->h, r->size, 0, out);
}

int tr_fr_snapshot_last(const tr_fr_ring_t* r, size_t max,
                        tr_fr_snapshot_t* out) {
  return tr__fr_snapshot_hdr(r->h, r->size, max ? max : 1, out);
}

void tr_fr_snapshot_release(tr_fr_snapshot_t* s) {
  if (s->pgs)
    for (int i = 0; i < s->npgs; i++) free(s->pgs[i].ranks);
  free(s->pgs);
  free(s->entries);
  memset(s, 0, sizeof *s);
}
