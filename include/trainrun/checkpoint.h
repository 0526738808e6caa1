/* trainrun/checkpoint.h: sharded checkpoints with global metadata,
 * asynchronous saves, and loading into any other layout (resharding).
 *
 * On disk a checkpoint is one folder per step inside a checkpoint folder:
 *
 *     <folder>/step-<N>/rank-00000.bin    data written by rank 0
 *     <folder>/step-<N>/rank-00000.json   rank 0's chunk list (input of the
 *                                        metadata; ignored by readers)
 *     ...                                one pair per rank that wrote data
 *     <folder>/step-<N>/metadata.json    written last by rank 0
 *
 * A step is complete exactly when metadata.json exists: rank 0 writes it
 * (temporary name, fsync, rename, fsync of the folder) only after every
 * rank has reported through the communicator that its data file and chunk
 * list are on disk (fsynced). Readers skip, with a warning, a step folder
 * that has no metadata.json. Rank 0 reads the other ranks' chunk lists from
 * the step folder, so the folder must be one every rank sees (a local disk
 * on one node, a shared filesystem across nodes).
 *
 * metadata.json ("format": "trainrun-checkpoint", "version": 1) describes
 * every saved tensor as a global tensor (DTensor style): name, dtype, global
 * shape, and chunks. A chunk is a box of the global tensor (per-dim
 * "offsets" and "sizes") stored contiguously (row-major) in "file" at byte
 * "offset", "length" bytes long, with the CRC-32C (tr_crc32c of
 * trainrun/crc32c.h) of each TR_CKPT_CRC_BLOCK bytes of it ("crc32c", a
 * list; the last block may be short), so a reader that needs part of a
 * chunk (resharding) reads and checks only the blocks it touches. The
 * chunks of a tensor never overlap and cover it exactly. Besides the tensors the metadata holds "step", "world_size",
 * "layout" (JSON the caller gives: how the ranks were laid out) and
 * "train_state" (JSON the caller gives: step, tokens, data-loader position,
 * RNG and LR-scheduler state). Data files start with the 8 bytes
 * "TRCKPT01" and a little-endian uint32 version; chunks start 64-byte
 * aligned.
 *
 * Saving: every rank passes the chunks it holds (tr_ckpt_item_t: a local
 * tensor and where it sits in the global one). Chunks several ranks hold
 * identically (data parallel: every rank holds the whole tensor; mark them
 * `replicated`) are written once, by one rank, spread so that every rank
 * writes about the same number of bytes. Typical use, on every rank:
 *
 *     tr_ckpt_saver_opts_t o = {.folder = "outputs/checkpoint",
 *                               .comm = comm, .mode = TR_CKPT_ASYNC,
 *                               .keep_latest_k = 3};
 *     tr_ckpt_saver_t* s;
 *     tr_ckpt_saver_new(&o, &s, &err);
 *     ...after an optimizer step:
 *     tr_ckpt_save(s, step, items, n, state_json, NULL, &err);
 *     ...the next step: forward, backward, then before the optimizer:
 *     tr_ckpt_wait_staged(s);
 *     ...every following step (collective while a save is in flight):
 *     tr_ckpt_poll(s, &err);
 *     ...at the end:
 *     tr_ckpt_wait(s, &err);
 *     tr_ckpt_saver_free(s);
 *
 * In TR_CKPT_SYNC mode tr_ckpt_save writes and commits before it returns.
 * In the async modes the chunks go to host staging buffers (reused
 * across saves while a chunk fits; tr_ckpt_reserve makes them before the
 * first save) and a thread writes them from there; tr_ckpt_save returns
 * once the copies are under way:
 *   - host chunks are copied by that thread;
 *   - device chunks into page-locked buffers (TR_CKPT_ASYNC_PINNED) are
 *     copied on a copy stream of their own, ordered after the kernels
 *     enqueued so far on the calling thread's stream (tr_kern_get_stream),
 *     the copies enqueued by that thread (enqueueing hundreds blocks) and
 *     each followed by an event: they overlap the caller's next step, and
 *     the thread writes each chunk once its copy is done;
 *   - device chunks into pageable buffers (TR_CKPT_ASYNC) are copied by
 *     that thread on the copy stream.
 * The caller may read its tensors at once but must call
 * tr_ckpt_wait_staged before it changes them (the trainer: before its next
 * optimizer step): it waits on the host for the thread's copies, and makes
 * the calling thread's stream wait on the device, without blocking the
 * host, for the copy stream's. The write to disk is never waited for. A
 * new save first waits for the previous one to be written and committed.
 *
 * The writer hands each piece of its data file to the disk as it writes it
 * and drops what is on disk from the page cache, so a save of many GB
 * never fills the page cache with dirty pages (the kernel would otherwise
 * make the trainer's own threads wait for the disk when they allocate or
 * write). TRAINRUN_CKPT_TEST_WRITE_BPS (tests only) caps the writer's
 * bytes per second, to check that training does not wait for it.
 *
 * Loading: tr_ckpt_open reads and checks a step's metadata;
 * tr_ckpt_load fills the caller's local chunks, whatever layout the
 * checkpoint was saved with, from every saved chunk that overlaps them,
 * checking each chunk's length and CRC-32C as it reads it (errors name the
 * file and byte offset).
 */
#ifndef TRAINRUN_CHECKPOINT_H
#define TRAINRUN_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "trainrun/errmsg.h"
#include "trainrun/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TR_CKPT_VERSION 1
#define TR_CKPT_METADATA "metadata.json"
/* The index of a Hugging Face (safetensors) export inside a step folder. */
#define TR_CKPT_HF_INDEX "model.safetensors.index.json"
#define TR_CKPT_CRC_BLOCK (1u << 20) /* bytes per checksum */

/* How the ranks of a save agree. all_reduce_sum sums n doubles over the
 * ranks, in place, identically on every rank (the trainer's data-parallel
 * sum fits); NULL with world 1. Only the thread that calls tr_ckpt_save,
 * tr_ckpt_poll and tr_ckpt_wait calls it. */
typedef struct {
  int rank, world;
  int (*all_reduce_sum)(void* arg, double* vals, int n);
  void* arg;
} tr_ckpt_comm_t;

/* One local chunk of a global tensor. */
typedef struct {
  const char* name; /* global tensor name */
  int ndim;
  int64_t shape[TR_MAX_DIMS];  /* the global shape */
  int64_t offset[TR_MAX_DIMS]; /* first global index this chunk holds */
  /* The chunk (its shape is the chunk's extent; may hold 0 elements),
   * contiguous, on the host or a device. Saving reads it; loading writes
   * it (converting from the saved dtype). */
  tr_tensor_t* tensor;
  /* Saving: every rank passes this same chunk (same name, offsets and
   * bytes, in the same position of items); one rank writes it. */
  int replicated;
} tr_ckpt_item_t;

/* ---- saving ---- */

typedef enum {
  TR_CKPT_SYNC = 0,        /* write and commit inside tr_ckpt_save */
  TR_CKPT_ASYNC = 1,       /* stage to host memory, write in a thread */
  TR_CKPT_ASYNC_PINNED = 2 /* same, staging buffers page-locked */
} tr_ckpt_mode_t;

/* "disabled", "async", "async_with_pinned_mem" ([checkpoint] async_mode);
 * TR_EINVAL for others. */
int tr_ckpt_mode_parse(const char* s, tr_ckpt_mode_t* out);

typedef struct {
  const char* folder; /* holds the step-N folders; created when missing */
  tr_ckpt_comm_t comm;
  tr_ckpt_mode_t mode;
  /* After each commit rank 0 removes, in a background thread, the oldest
   * complete steps beyond the newest keep_latest_k, and every incomplete
   * step folder (no metadata.json: a save that never finished) older than
   * the step just committed — never a newer one, which may be a save in
   * progress, nor a Hugging Face export alone (tr_ckpt_entry_t.hf). Each
   * removal is logged (incomplete ones as warnings). 0 keeps all. */
  int keep_latest_k;
  /* JSON object recorded as "layout" (e.g. {"dp":4}); NULL: {}. Copied. */
  const char* layout_json;
} tr_ckpt_saver_opts_t;

typedef struct tr_ckpt_saver tr_ckpt_saver_t;

int tr_ckpt_saver_new(const tr_ckpt_saver_opts_t* o, tr_ckpt_saver_t** out,
                      tr_errmsg_t* err);
/* Wait for a write in flight (without committing it) and for the purge
 * thread, then free. NULL is a no-op. */
void tr_ckpt_saver_free(tr_ckpt_saver_t* s);

/* Save items as step `step` (collective: every rank calls it with its
 * items, in the same order for replicated ones). train_state_json: a JSON
 * object recorded as "train_state" (rank 0's is used; NULL: {}).
 * as_dtype: convert every chunk to this float dtype (model-only exports in
 * bf16); NULL keeps each tensor's dtype. Waits for the previous save.
 * Errors come back on every rank: a failed write (or staging) on any rank
 * fails the save everywhere and leaves the step without metadata — in the
 * async modes from the tr_ckpt_poll or tr_ckpt_wait that commits it. */
int tr_ckpt_save(tr_ckpt_saver_t* s, int64_t step, const tr_ckpt_item_t* items,
                 size_t n, const char* train_state_json,
                 const tr_dtype_t* as_dtype, tr_errmsg_t* err);
/* While an async save is in flight: ask every rank whether it finished
 * writing (collective: all ranks call it at the same points), and commit
 * when all have. No-op (no collective) when nothing is in flight. */
int tr_ckpt_poll(tr_ckpt_saver_t* s, tr_errmsg_t* err);
/* Before the caller changes the tensors of the save in flight (not
 * collective; no-op when none is in flight, and after the first call for
 * a save): wait until the writer thread has copied its host chunks and
 * enqueued the device ones, and make the calling thread's stream wait on
 * the device for the copy streams' copies. The time the host waited counts
 * in the save's blocked_s. */
int tr_ckpt_wait_staged(tr_ckpt_saver_t* s);
/* Allocate now the staging buffers a save of these items would use (the
 * async modes; nothing in TR_CKPT_SYNC), so the first save does not pay
 * for them: page-locking GBs of host memory takes seconds. Not
 * collective, before the first save. *bytes: the bytes of staging buffers
 * held. */
int tr_ckpt_reserve(tr_ckpt_saver_t* s, const tr_ckpt_item_t* items, size_t n,
                    int64_t* bytes, tr_errmsg_t* err);
/* Wait for the save in flight and commit it (collective). */
int tr_ckpt_wait(tr_ckpt_saver_t* s, tr_errmsg_t* err);
/* 1 while an async save is in flight. */
int tr_ckpt_pending(const tr_ckpt_saver_t* s);

typedef struct {
  int64_t step;           /* of the last save started; -1: none */
  int64_t committed_step; /* of the last save committed; -1: none */
  /* the last save: time tr_ckpt_save and tr_ckpt_wait_staged held the
   * calling thread (waiting for the previous save, planning, enqueueing
   * the copies, waiting for the writer's copies; sync: all). Not the whole
   * cost to training: copies that overlap the next step slow it (the
   * trainer measures that, trainrun/trainer.h). */
  double blocked_s;
  double write_s; /* the last committed save: seconds its write took */
  int64_t bytes;  /* bytes this rank wrote in the last save */
  /* the last committed save: bytes this rank copied from devices to its
   * staging buffers, and the seconds the copy streams took for them */
  int64_t copy_bytes;
  double copy_s;
} tr_ckpt_stats_t;

void tr_ckpt_saver_stats(const tr_ckpt_saver_t* s, tr_ckpt_stats_t* st);

/* ---- reading ---- */

typedef struct {
  int64_t offsets[TR_MAX_DIMS], sizes[TR_MAX_DIMS];
  char* file; /* name inside the step folder */
  uint64_t offset, length;
  size_t ncrc;      /* ceil(length / TR_CKPT_CRC_BLOCK) */
  uint32_t* crc32c; /* CRC-32C of each block */
} tr_ckpt_chunk_t;

typedef struct {
  char* name;
  tr_dtype_t dtype;
  int ndim;
  int64_t shape[TR_MAX_DIMS];
  size_t nchunks;
  tr_ckpt_chunk_t* chunks;
} tr_ckpt_tensor_t;

typedef struct {
  char* dir; /* the step folder */
  int64_t step;
  int world_size;
  char* layout_json;      /* the "layout" object as JSON text */
  char* train_state_json; /* the "train_state" object as JSON text */
  size_t ntensors;
  tr_ckpt_tensor_t* tensors; /* in the metadata's order */
} tr_ckpt_t;

/* Read and check <dir>/metadata.json: format and version, dtypes, chunks
 * inside their tensor, not overlapping and covering it, file names without
 * '/'. TR_ENOTFOUND (message says the step is incomplete) when the file is
 * missing; TR_EFORMAT naming the file otherwise. *out is freed with
 * tr_ckpt_close. */
int tr_ckpt_open(tr_ckpt_t** out, const char* dir, tr_errmsg_t* err);
void tr_ckpt_close(tr_ckpt_t* ck);

/* The JSON text of member `key` of the train state (malloc'd, free() it),
 * or NULL when there is none. */
char* tr_ckpt_state_get(const tr_ckpt_t* ck, const char* key);

/* The tensor with that name, or NULL. */
const tr_ckpt_tensor_t* tr_ckpt_find(const tr_ckpt_t* ck, const char* name);

/* Fill every item's tensor from the saved chunks overlapping it (items'
 * `replicated` is ignored). Errors: TR_ENOTFOUND (tensor missing), TR_EINVAL
 * (global shape differs), TR_EFORMAT (file too short: names the file and
 * the offset), TR_ECHECKSUM (names the file, the byte offset and the
 * tensor). Reads each needed chunk once per item. */
int tr_ckpt_load(const tr_ckpt_t* ck, const tr_ckpt_item_t* items, size_t n,
                 tr_errmsg_t* err);

/* Check the data files against the metadata without reading them: each
 * file its chunks name exists and is at least as long as the last byte a
 * chunk needs. TR_EFORMAT ("'<file>' is truncated: N bytes, the metadata
 * needs M") or the file's open error (ENOENT: "'<file>' is missing"). */
int tr_ckpt_check_files(const tr_ckpt_t* ck, tr_errmsg_t* err);

/* Read every chunk and check its CRC-32C and the data files' headers;
 * *bytes (may be NULL) gets the bytes checked. Errors as tr_ckpt_load. */
int tr_ckpt_verify(const tr_ckpt_t* ck, int64_t* bytes, tr_errmsg_t* err);

/* ---- the checkpoint folder ---- */

typedef struct {
  int64_t step;
  int complete;  /* metadata.json exists */
  int64_t bytes; /* sum of the sizes of the files in the step folder */
  /* TR_CKPT_HF_INDEX exists: the folder holds a Hugging Face export
   * (checkpoint.last_save_in_hf; alone, without metadata.json, in a step
   * folder torchtitan wrote with last_save_in_hf) */
  int hf;
} tr_ckpt_entry_t;

/* The step-N folders of folder, ascending by N (other names are ignored).
 * *out is free()d by the caller; a missing folder gives 0 entries. */
int tr_ckpt_list(const char* folder, tr_ckpt_entry_t** out, size_t* n,
                 tr_errmsg_t* err);
/* The highest complete step of folder (warning about each incomplete step
 * folder above it); TR_ENOTFOUND when there is none. */
int tr_ckpt_latest(const char* folder, int64_t* step, tr_errmsg_t* err);
/* "<folder>/step-<N>" into buf. */
void tr_ckpt_step_dir(const char* folder, int64_t step, char* buf, size_t cap);
/* Remove the step folder (metadata first, so it is never half complete,
 * then the Hugging Face index, so it never looks like an export alone). */
int tr_ckpt_remove_step(const char* folder, int64_t step);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_CHECKPOINT_H */
