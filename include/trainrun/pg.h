/* trainrun/pg.h: process groups -- collectives over Gloo, NCCL and MPI.
 *
 * A process group is a set of ranks that run collectives together. Every
 * parallel feature (DDP, FSDP2, tensor and pipeline parallel, checkpoints)
 * speaks through it. The API follows torch.distributed's semantics:
 *
 *   tr_pg_opts_t o;
 *   tr_pg_opts_init(&o);
 *   o.rank = rank; o.world_size = n; o.store = client;  // a connected store
 *   o.backend = "cpu:gloo,cuda:nccl";                    // dispatch by device
 *   o.timeout_ms = 300000;                               // init timeout
 *   tr_pg_t* world;
 *   TR_CHECK(tr_pg_new(&o, &world));
 *   TR_CHECK(tr_pg_all_reduce(world, &grad, TR_PG_SUM, NULL));   // blocking
 *   tr_pg_work_t* w;
 *   TR_CHECK(tr_pg_all_gather(world, &full, &shard, &w));        // async
 *   ... compute ...
 *   TR_CHECK(tr_pg_work_wait(w, 0));
 *   tr_pg_work_free(w);
 *   tr_pg_set_timeout(world, 100000);   // train timeout after the first step
 *   ...
 *   tr_pg_free(world);
 *
 * Ranks
 * -----
 * Every group numbers its members 0..size-1 ("group ranks"); roots and peers
 * passed to ops are group ranks. The world group's ranks are the global
 * ranks; tr_pg_global_rank() translates.
 *
 * Backends and dispatch
 * ---------------------
 * opts.backend names one backend for every device ("gloo", "nccl", "mpi",
 * "fake") or a comma list of device:backend pairs ("cpu:gloo,cuda:nccl",
 * PyTorch 2.0's dispatchable form). An op runs on the backend of its
 * tensors' device; tensors of one op share a device. A backend is set up
 * (rendezvous, communicator creation) on the first op that needs it, so a
 * CPU-only run with the default "cpu:gloo,cuda:nccl" never touches NCCL
 * (nor fails in a build without it); tr_pg_connect() sets one up eagerly.
 * Set-up is collective: every member reaches it through the same op. Gloo
 * sets up on the group's thread, so groups may be first used in any order;
 * NCCL sets up on the issuing thread (and connects the peers of its first
 * collective, and of a pair's first send/recv, inside that call): first use
 * NCCL groups, and pairs, in the same order on every rank, or connect them
 * first. MPI communicators are made with the groups (program order).
 *
 *   gloo  CPU tensors. TCP on the interface that routes to the store (or
 *         TRAINRUN_GLOO_SOCKET_IFNAME), rendezvous through the store.
 *   nccl  CUDA tensors. Unique id through the store, one communicator and
 *         one high-priority comm stream per group, ordered after the
 *         group's user stream by events (tr_pg_set_cuda_stream); no host
 *         synchronisation. Sub-groups use ncclCommSplit when the parent's
 *         communicator exists.
 *   mpi   CPU tensors over Open MPI (ranks and size must equal MPI's
 *         COMM_WORLD; the store is optional and used for error reports).
 *         Ops are MPI's nonblocking calls; one that times out is abandoned
 *         (MPI cannot cancel it) and the process then skips MPI_Finalize.
 *   fake  No data moves: one process plays one rank of an N-rank world,
 *         every op checks its shapes, counts and completes at once
 *         (outputs are left as they were). For `trainrun plan` and config
 *         checks of large layouts. No store needed.
 *
 * Dtypes: every tr_dtype_t works with every op. Reductions of bf16/f16 on
 * CPU backends accumulate in float (the tensor is reduced as float32 and
 * rounded once); NCCL reduces them natively (float math per step, as NCCL
 * does). Integer sums wrap; integer AVG is the wrapped SUM divided by the
 * group size, rounded toward zero.
 *
 * Blocking and async
 * ------------------
 * Every op takes a tr_pg_work_t** last argument. NULL: the call blocks until
 * the op completes (CPU) or, for CUDA tensors, until the op is ordered
 * before later work on the group's user stream (the host does not wait;
 * errors surface through the watchdog and later calls). Non-NULL: the op is
 * queued and *work receives a handle; the caller must free it.
 *
 * Ops of one group run in the order they were issued; ops of different
 * groups run concurrently (each group has its own communication thread on
 * CPU, its own stream on GPU). Tensors are referenced (not copied) until
 * the op completes: do not write an input or read an output before then.
 * Non-contiguous CPU tensors are staged through contiguous copies; CUDA
 * tensors must be contiguous.
 *
 * Timeouts, errors and the watchdog
 * ---------------------------------
 * Every op has a deadline: the group timeout when it was issued
 * (opts.timeout_ms, then tr_pg_set_timeout). One watchdog thread per world
 * checks the ops in flight every TRAINRUN_PG_WATCHDOG_MS. An op past its
 * deadline, or one whose backend failed, is completed with an error and a
 * message naming the group, the op, its sequence number and its peers:
 *
 *   process group '0' (default_pg) rank 0/2: gloo:all_reduce seq 3 timed
 *   out after 500 ms; peers: 1
 *
 * The group is then broken: its communicators are aborted (peers blocked in
 * the same op see their connections close), the message is written to the
 * store under "<store_prefix>/<group name>/error" (split groups:
 * ".../<group name>/c<color>/error"; value "<rank>\n<message>", the first
 * report stays), "<store_prefix>/exception_dump" is set to this
 * rank (4 bytes, native int, PyTorch's exception_dump key; the first stays)
 * and the flight recorder's dump hook runs. Ranks whose ops in that group
 * have been in flight for a while find the report and fail them with
 * TR_EABORTED ("... aborted after an earlier error: rank 0 reported: ...").
 * A failure that is not a timeout (a connection closed) is reported a
 * moment later, and not at all when a peer's report arrives first: it is
 * usually the echo of that peer's abort. Later ops on a broken group fail
 * at once with TR_EABORTED.
 *
 * Flight-recorder hooks
 * ---------------------
 * tr_pg_set_hooks() registers callbacks (enqueue / start / complete /
 * group / dump) that receive every op with its sequence ids, sizes and
 * dtypes; see tr_pg_hooks_t below.
 *
 * Thread-safety: a group may be used from several threads, but ops that
 * must match across ranks have to be issued in the same order everywhere,
 * so a group is normally driven by one thread. Work handles may be waited
 * on from any thread.
 */
#ifndef TRAINRUN_PG_H
#define TRAINRUN_PG_H

#include <stddef.h>
#include <stdint.h>

#include "trainrun/errmsg.h"
#include "trainrun/store.h"
#include "trainrun/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tr_pg_s tr_pg_t;
typedef struct tr_pg_work_s tr_pg_work_t;

/* ---- enums ---- */

typedef enum {
  TR_PG_SUM = 0,
  TR_PG_AVG = 1,
  TR_PG_MAX = 2,
  TR_PG_MIN = 3,
  TR_PG_PRODUCT = 4,
  TR_PG_REDUCE_OP__COUNT
} tr_pg_reduce_op_t;

/* XX(enum suffix, name used in profiling names and messages) */
#define TR_PG_OP_MAP(XX)                     \
  XX(ALL_REDUCE, "all_reduce")               \
  XX(ALL_GATHER, "_all_gather_base")         \
  XX(REDUCE_SCATTER, "_reduce_scatter_base") \
  XX(BROADCAST, "broadcast")                 \
  XX(REDUCE, "reduce")                       \
  XX(ALL_TO_ALL, "all_to_all")               \
  XX(SEND, "send")                           \
  XX(RECV, "recv")                           \
  XX(BARRIER, "barrier")                     \
  XX(COALESCED, "coalesced")

typedef enum {
#define TR__PG_OP_ENUM(name, str) TR_PG_OP_##name,
  TR_PG_OP_MAP(TR__PG_OP_ENUM)
#undef TR__PG_OP_ENUM
      TR_PG_OP__COUNT
} tr_pg_op_t;

typedef enum {
  TR_PG_BACKEND_NONE = 0,
  TR_PG_BACKEND_GLOO = 1,
  TR_PG_BACKEND_NCCL = 2,
  TR_PG_BACKEND_MPI = 3,
  TR_PG_BACKEND_FAKE = 4
} tr_pg_backend_t;

/* "sum", "avg", "max", "min", "product". */
const char* tr_pg_reduce_op_name(tr_pg_reduce_op_t op);
/* The op's name as PyTorch's flight recorder writes it ("all_reduce",
 * "_all_gather_base", ...). */
const char* tr_pg_op_name(tr_pg_op_t op);
/* "gloo", "nccl", "mpi", "fake", "none". */
const char* tr_pg_backend_name(tr_pg_backend_t b);
/* 1 when this build has the backend (Gloo, NCCL and MPI are optional). */
int tr_pg_backend_available(tr_pg_backend_t b);

/* The backend of each device that a backend spec names (opts.backend's
 * grammar: "gloo", "nccl", "mpi", "fake", or device:backend pairs such as
 * "cpu:gloo,cuda:nccl"); TR_PG_BACKEND_NONE for a device it leaves out. */
typedef struct {
  tr_pg_backend_t cpu, cuda;
} tr_pg_backend_spec_t;

/* Parse spec into *out, whether or not this build has the backends. The
 * one parser of the grammar: tr_pg_new uses it, and the launcher checks
 * [comm] backend with it. TR_EINVAL with a message that says what is
 * wrong ("nccl cannot serve cpu tensors"); the caller says where the spec
 * came from. */
int tr_pg_backend_parse(const char* spec, tr_pg_backend_spec_t* out,
                        tr_errmsg_t* err);

/* ---- creating groups ---- */

typedef struct {
  int rank;       /* this process's global rank; -1 with mpi: MPI's */
  int world_size; /* -1 with mpi: MPI's */
  /* Connected store client, used for rendezvous and error reports. The
   * group clones it (two extra connections) and does not keep this one, so
   * the caller may free it after tr_pg_new. Required except for fake (and
   * optional for mpi). */
  tr_store_client_t* store;
  /* Namespace of every key the groups write; give each restart its own
   * (the daemon uses "trpg/<restart count>") so stale keys never match. */
  const char* store_prefix; /* default "trpg" */
  const char* backend;      /* default "cpu:gloo,cuda:nccl" */
  const char* group_desc;   /* default "default_pg" */
  int64_t timeout_ms;       /* op and set-up timeout; default 300000 */
  int cuda_device;          /* CUDA ordinal for nccl; -1: the global rank
                               modulo the device count */
  /* Address Gloo binds: NULL picks TRAINRUN_GLOO_SOCKET_IFNAME's address,
   * else the local address that routes to the store. */
  const char* gloo_host;
  /* Full store key (not under store_prefix) of a job-level failure report,
   * or NULL. Once it exists, ops that have waited on a peer for a while
   * fail with TR_EABORTED and its first line, and their groups break: the
   * daemon writes the round's failure there ($TRAINRUN_FAILURE_KEY) when a
   * worker dies, so survivors blocked on the dead rank (NCCL never notices
   * a dead peer) exit within about a second instead of at the op timeout. */
  const char* failure_key;
} tr_pg_opts_t;

/* Fill opts with the defaults above (rank and world_size -1). */
void tr_pg_opts_init(tr_pg_opts_t* opts);

/* Create the world group (name "0", desc opts->group_desc) and start its
 * watchdog. Does not communicate (backends are set up on first use), except
 * that mpi initialises MPI when nobody has. *out is owned by the caller
 * (tr_pg_free). Errors: TR_EINVAL (bad rank/size, missing store, unknown
 * backend), TR_EUNSUPPORTED (a backend this build lacks), store errors. */
int tr_pg_new(const tr_pg_opts_t* opts, tr_pg_t** out);

/* Set up the backend serving `device` now (collective over the group). */
int tr_pg_connect(tr_pg_t* pg, tr_device_type_t device);

/* A sub-group of parent holding the parent ranks `ranks` (n of them, any
 * order, no duplicates; sorted, so group rank i is the i-th smallest).
 * Every member of parent must call this, in the same order as its other
 * group creations, even ranks outside the list; those get *out = NULL and
 * return 0. The group's backends are set up on first use (NCCL: split from
 * the parent's communicator when it exists). desc may be NULL. */
int tr_pg_new_group(tr_pg_t* parent, const int* ranks, int n, const char* desc,
                    tr_pg_t** out);

/* Split parent by color (PyTorch's split_group, NCCL's ncclCommSplit): every
 * member of parent calls it; ranks with the same color >= 0 form a group
 * ordered by (key, parent rank); color < 0 gives *out = NULL. Colors are
 * exchanged through the store (the fake backend cannot: TR_EUNSUPPORTED;
 * use tr_pg_new_group). */
int tr_pg_split(tr_pg_t* parent, int color, int key, const char* desc,
                tr_pg_t** out);

/* Wait for the group's ops in flight (each ends by its deadline), stop its
 * threads, free its communicators and free pg. The world's watchdog and
 * store clients live until the last group of the world is freed. A work
 * handle stays valid after its group is freed. NULL is a no-op. */
void tr_pg_free(tr_pg_t* pg);

/* ---- group properties ---- */

int tr_pg_rank(const tr_pg_t* pg);
int tr_pg_size(const tr_pg_t* pg);
/* Global rank of group rank r; -1 when out of range. */
int tr_pg_global_rank(const tr_pg_t* pg, int r);
/* Group rank of global rank g; -1 when g is not a member. */
int tr_pg_group_rank(const tr_pg_t* pg, int g);
const char* tr_pg_name(const tr_pg_t* pg); /* "0", "1", "2.1", ... */
const char* tr_pg_desc(const tr_pg_t* pg);
/* Process-local id (0 for the first world), as the flight recorder's pg_id. */
int64_t tr_pg_uid(const tr_pg_t* pg);
/* Backend that serves a device in this group (TR_PG_BACKEND_NONE: none). */
tr_pg_backend_t tr_pg_backend(const tr_pg_t* pg, tr_device_type_t device);

/* Timeout of ops issued from now on (ms > 0): the switch from
 * [comm] init_timeout_seconds to train_timeout_seconds. _all changes every
 * group of pg's world. */
void tr_pg_set_timeout(tr_pg_t* pg, int64_t ms);
void tr_pg_set_timeout_all(tr_pg_t* pg, int64_t ms);
int64_t tr_pg_timeout(const tr_pg_t* pg);

/* CUDA stream (a cudaStream_t; NULL: the legacy default stream) that the
 * group's CUDA ops wait for before starting, and that blocking CUDA ops make
 * wait for their completion. Per group; set before issuing ops. */
void tr_pg_set_cuda_stream(tr_pg_t* pg, void* stream);

/* The first fatal error of the group (the message above), or NULL while
 * it is healthy. Owned by pg. */
const char* tr_pg_error(const tr_pg_t* pg);

typedef struct {
  int64_t calls[TR_PG_OP__COUNT]; /* ops issued, by kind */
  int64_t bytes[TR_PG_OP__COUNT]; /* their input bytes (recv: output) */
} tr_pg_stats_t;

/* Counters of the ops issued on pg (any backend, fake included). */
void tr_pg_stats(const tr_pg_t* pg, tr_pg_stats_t* out);

/* ---- collectives ----
 *
 * All return 0 or a negative TR_E* code: TR_EINVAL / TR_ESHAPE / TR_EDTYPE /
 * TR_EDEVICE for bad arguments (nothing is issued), TR_ETIMEDOUT,
 * TR_EABORTED (another rank failed), TR_EGLOO / TR_ENCCL / TR_EMPI (the
 * backend failed; tr_pg_work_error or tr_pg_error has the message). */

/* Reduce t across the group in place; every rank gets the result. */
int tr_pg_all_reduce(tr_pg_t* pg, tr_tensor_t* t, tr_pg_reduce_op_t op,
                     tr_pg_work_t** work);

/* out (numel = size * numel(in), same dtype) receives every rank's in,
 * concatenated in rank order (all_gather_into_tensor). */
int tr_pg_all_gather(tr_pg_t* pg, tr_tensor_t* out, const tr_tensor_t* in,
                     tr_pg_work_t** work);

/* in (numel = size * numel(out)) is reduced across the group; rank r gets
 * chunk r in out (reduce_scatter_tensor). */
int tr_pg_reduce_scatter(tr_pg_t* pg, tr_tensor_t* out, const tr_tensor_t* in,
                         tr_pg_reduce_op_t op, tr_pg_work_t** work);

/* t of group rank root is copied into t on every rank. */
int tr_pg_broadcast(tr_pg_t* pg, tr_tensor_t* t, int root, tr_pg_work_t** work);

/* t is reduced into root's t; other ranks' t are left unchanged. */
int tr_pg_reduce(tr_pg_t* pg, tr_tensor_t* t, int root, tr_pg_reduce_op_t op,
                 tr_pg_work_t** work);

/* all_to_all_single: in is split along dim 0 into size pieces, piece j
 * goes to rank j, and out is the concatenation of the pieces received, in
 * rank order. in_splits / out_splits: dim-0 rows per rank (size entries
 * each); NULL means equal pieces (dim 0 divisible by size). */
int tr_pg_all_to_all(tr_pg_t* pg, tr_tensor_t* out, const tr_tensor_t* in,
                     const int64_t* out_splits, const int64_t* in_splits,
                     tr_pg_work_t** work);

/* Point to point: t goes to / comes from group rank peer. Sends and
 * receives between two ranks match in order per tag (tag >= 0). Issue a
 * rank's sends and receives with the same peer inside one coalesced group
 * (or async) when both sides send first. */
int tr_pg_send(tr_pg_t* pg, const tr_tensor_t* t, int peer, int tag,
               tr_pg_work_t** work);
int tr_pg_recv(tr_pg_t* pg, tr_tensor_t* t, int peer, int tag,
               tr_pg_work_t** work);

/* Every rank waits for every other (on the CPU backend when the group has
 * one, else a one-element all-reduce on the CUDA backend, host-waited). */
int tr_pg_barrier(tr_pg_t* pg, tr_pg_work_t** work);

/* ---- coalesced groups ----
 *
 * Ops issued between begin and end (with work = NULL) are held and
 * launched together at end as one unit: one NCCL group call, one task on
 * the Gloo/MPI thread; p2p ops inside are all posted before any is waited
 * on. They share one collective (or p2p) sequence number and complete
 * together through one work handle (NULL: block). All ops of a coalesced
 * group use one backend. Nesting is an error (TR_EINVAL). */
int tr_pg_coalesce_begin(tr_pg_t* pg);
int tr_pg_coalesce_end(tr_pg_t* pg, tr_pg_work_t** work);

/* ---- work handles ---- */

/* Wait for the op: 0, or its error. timeout_ms > 0 bounds this wait only:
 * TR_ETIMEDOUT is returned and the op goes on (its own deadline still
 * applies); timeout_ms <= 0 waits until the op ends, which it always does
 * by its deadline. CUDA works: the host waits for the op's completion. */
int tr_pg_work_wait(tr_pg_work_t* w, int64_t timeout_ms);

/* Make a CUDA stream wait for the op (no host wait). For CPU works this is
 * tr_pg_work_wait(w, 0). */
int tr_pg_work_wait_stream(tr_pg_work_t* w, void* stream);

/* 1 when the op has completed (successfully or not), 0 while pending. */
int tr_pg_work_test(tr_pg_work_t* w);

/* The op's result once complete: 0 or a negative code; 1 while pending. */
int tr_pg_work_status(tr_pg_work_t* w);

/* Its error message, NULL when none. Owned by w. */
const char* tr_pg_work_error(tr_pg_work_t* w);

/* Call cb(w, status, arg) once when the op completes, on an internal thread
 * (keep it short; do not issue ops from it), or at once on this thread when
 * it already has. One callback per work; TR_EINVAL for a second. */
typedef void (*tr_pg_work_cb)(tr_pg_work_t* w, int status, void* arg);
int tr_pg_work_on_complete(tr_pg_work_t* w, tr_pg_work_cb cb, void* arg);

/* Drop the caller's handle. The op goes on if pending. NULL is a no-op. */
void tr_pg_work_free(tr_pg_work_t* w);

/* Op timing. When on for a group, every op issued on it afterwards measures its
 * duration: CUDA ops with a start and an end event on the group's stream, CPU ops
 * with the wall clock on the communication thread. Off by default. */
int tr_pg_set_op_timing(tr_pg_t* pg, int on);
/* The op's duration in microseconds once it completed (tr_pg_work_test(w) == 1):
 * 0 and *us set. TR_EAGAIN while pending; TR_EINVAL when timing was off when the op
 * was issued or w is NULL. Does not wait, never synchronises a device. */
int tr_pg_work_duration_us(tr_pg_work_t* w, double* us);

/* ---- flight-recorder hooks ----
 *
 * One set of hooks per process, registered by the flight recorder before
 * groups are made. Calls may come from any thread (the issuing thread for
 * enqueue, a communication thread or the watchdog for start / complete);
 * they must be fast and must not call back into pg. */

typedef struct {
  int ndim;
  int64_t shape[TR_MAX_DIMS];
  tr_dtype_t dtype;
} tr_pg_tensor_meta_t;

typedef struct {
  int64_t pg_id;              /* tr_pg_uid */
  const char* pg_name;        /* tr_pg_name */
  const char* pg_desc;        /* tr_pg_desc */
  int64_t collective_seq_id;  /* per group: +1 per collective launch (one
                                per coalesced group) */
  int64_t p2p_seq_id;         /* per group: +1 per p2p launch */
  int64_t op_id;              /* per group: +1 per op (each op of a coalesced
                             group, then the coalesced entry itself) */
  const char* profiling_name; /* "gloo:all_reduce", "nccl:send 0->1",
                                 "nccl:coalesced" */
  tr_pg_op_t op;
  int n_inputs, n_outputs; /* 0 or 1 */
  tr_pg_tensor_meta_t inputs[1];
  tr_pg_tensor_meta_t outputs[1];
  int64_t timeout_ms;
  int is_p2p;
  int64_t time_created_ns; /* CLOCK_REALTIME */
} tr_pg_record_t;

typedef struct {
  void* arg;
  /* A group was created (its global ranks, in group order). */
  void (*group)(void* arg, int64_t pg_id, const char* name, const char* desc,
                const int* global_ranks, int n);
  /* An op was issued; returns an id passed to start/complete (any value). */
  int64_t (*enqueue)(void* arg, const tr_pg_record_t* rec);
  /* The backend began the op. CUDA ops: when a start event recorded before
   * it is seen complete, if tr_pg_set_cuda_start_events is on or the op is
   * timed (tr_pg_set_op_timing); otherwise start comes with complete, as
   * in PyTorch's recorder without TORCH_NCCL_ENABLE_TIMING. */
  void (*start)(void* arg, int64_t id, int64_t time_ns);
  /* The op ended; status 0 or its error (retired without completing). */
  void (*complete)(void* arg, int64_t id, int64_t time_ns, int status);
  /* A dump was requested: this rank's watchdog found a timeout or an error
   * (origin_rank = own global rank) or saw another rank's report (its
   * global rank). reason is the error message. Called once per world. */
  void (*dump)(void* arg, int origin_rank, const char* reason);
} tr_pg_hooks_t;

/* Register hooks (copied); NULL unregisters. Call while no op is issued. */
void tr_pg_set_hooks(const tr_pg_hooks_t* hooks);

/* On: every CUDA op records a start event on the device, so that the start
 * hook reports when it began there (what a recorder that writes durations
 * needs; costs an event record, ~1 us of host time, an op). Off (the
 * default): start comes with complete. Call while no op is issued. */
void tr_pg_set_cuda_start_events(int on);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_PG_H */
