/* trainrun/dtensor.h: device meshes, placements and distributed tensors
 * (PyTorch's DeviceMesh, Shard/Replicate/Partial and DTensor, with
 * redistribute).
 *
 * A mesh arranges the ranks of a process group as an n-d grid, row-major
 * (the last dim varies fastest), with a name per dim. For every dim, the
 * ranks that differ only in that dim's coordinate form one process group
 * (one per slice); tr_mesh_dim_pg() returns this rank's. A group's ranks are
 * ordered by coordinate: group rank == this rank's coordinate on that dim.
 *
 * A DTensor is a global tensor of which each rank holds a local part: the
 * placement on each mesh dim says how the dim splits it:
 *
 *   Shard(d)       the tensor's dim d is cut in torch.chunk pieces along the
 *                  mesh dim: with n elements over k ranks every piece has
 *                  ceil(n/k) except the last ones, which may be short or
 *                  empty (5 rows over 4 ranks: 2,2,1,0; 2 rows: 1,1,0,0);
 *   Replicate      every rank of the mesh dim holds the same values;
 *   Partial(op)    every rank holds a partial value; the tensor is the
 *                  reduction (sum, avg, max, min) over the mesh dim.
 *
 * Several mesh dims may shard the same tensor dim: the first (leftmost)
 * mesh dim cuts it, the next one cuts that piece again (PyTorch's default,
 * not _StridedShard).
 *
 * Typical use (what the trainer does for FSDP / HSDP / TP):
 *
 *   tr_mesh_degrees_t d;
 *   tr_mesh_degrees_init(&d);
 *   d.dp_shard = 4;                               // resolved [parallelism]
 *   d.tp = 2;                                     // degrees (the launcher's)
 *   tr_mesh_t* mesh;
 *   tr_errmsg_t err;
 *   if (tr_mesh_from_degrees(world, &d, &mesh, &err) < 0) ... err.message
 *   tr_pg_t* fsdp_pg = tr_mesh_dim_pg(mesh, "dp_shard");
 *
 *   tr_mesh_t* dp;                               // 2-d (dp_replicate, dp_shard)
 *   const char* names[] = {"dp_replicate", "dp_shard"};
 *   TR_CHECK(tr_mesh_sub(mesh, names, 2, &dp, NULL));
 *   tr_placement_t hsdp[2] = {tr_placement_replicate(), tr_placement_shard(0)};
 *   tr_dtensor_t w;
 *   TR_CHECK(tr_dtensor_distribute(&w, &full, dp, hsdp));  // no communication
 *   tr_placement_t rep[2] = {tr_placement_replicate(), tr_placement_replicate()};
 *   tr_dtensor_t g;
 *   tr_dtensor_work_t* wk;
 *   TR_CHECK(tr_dtensor_redistribute(&w, rep, &g, &wk));    // all-gather
 *   ... overlap ...
 *   TR_CHECK(tr_dtensor_work_wait(wk));     // g.local is the full tensor
 *   tr_dtensor_work_free(wk);
 *   tr_dtensor_release(&g);
 *   tr_dtensor_release(&w);
 *   tr_mesh_free(dp);
 *   tr_mesh_free(mesh);                      // the groups go with the last
 *
 * Redistribute
 * ------------
 * tr_dtensor_redistribute() changes placements mesh dim by mesh dim, as
 * PyTorch's redistribute_local_tensor does; every rank of the mesh must call
 * it with the same placements (it issues the same collectives everywhere):
 *
 *   Shard(d)    -> Replicate    all-gather on the dim's group; uneven pieces
 *                               are padded to ceil(n/k) on d, gathered and
 *                               cut back; d != 0 is moved to the front for
 *                               the collective and back after
 *   Partial(op) -> Replicate    all-reduce(op)
 *   Partial(op) -> Shard(d)     reduce-scatter(op), padded like all-gather
 *   Replicate   -> Shard(d)     a copy of the local torch.chunk piece
 *   Shard(d)    -> Shard(d')    all-to-all (both dims padded), or all-gather
 *                               and a local chunk when nesting with other
 *                               mesh dims forbids the direct exchange
 *   Replicate   -> Partial(op)  sum: coordinate 0 keeps the values, the
 *                               others hold zeros (exact, where PyTorch
 *                               divides by k); avg/max/min: every rank keeps
 *                               the values (their reduction is the value)
 *   Shard(d)    -> Partial(op)  all-gather, then as Replicate -> Partial
 *   Partial(a)  -> Partial(b)   a != b: TR_EUNSUPPORTED
 *
 * Mesh dims whose shards must be undone are handled first, last mesh dim
 * first (all-gather, all-to-all); then the mesh dims that gain a shard or
 * lose a Partial, first mesh dim first. Mesh dims that keep their
 * placement cost nothing; when none changes, the result's local tensor is
 * another reference to the source's (no copy). Each step allocates its
 * result; the source is never written. Collectives whose pieces hold no
 * element (every piece is empty) are skipped on every rank alike.
 *
 * Devices: CPU tensors take every transition. CUDA tensors take the
 * all-reduce, and the all-gather, reduce-scatter and local steps on tensor
 * dim 0 (or on a dim whose leading dims all have size 1); the others
 * (all-to-all, other dims) need strided device copies, which
 * tr_tensor_copy lacks: TR_EUNSUPPORTED.
 *
 * Async: with a non-NULL work argument the first collective is issued and
 * the call returns; tr_dtensor_work_wait() completes it, runs the steps
 * left (blocking) and fills the output. A one-collective redistribute (the
 * FSDP and TP cases) thus overlaps whatever the caller does before waiting.
 *
 * Lifetimes: a DTensor borrows its mesh (keep the mesh until the DTensors
 * on it are released); a sub-mesh keeps the groups of its parent alive. A
 * mesh is not thread-safe to build; lookups are (read-only).
 */
#ifndef TRAINRUN_DTENSOR_H
#define TRAINRUN_DTENSOR_H

#include <stdint.h>
#include <stdio.h>

#include "trainrun/errmsg.h" /* tr_errmsg_t */
#include "trainrun/model.h"  /* tr_param_t, the parameter layout seam */
#include "trainrun/pg.h"     /* process groups */
#include "trainrun/pg_waits.h" /* tr_pg_comm_t: the timed hook's totals */
#include "trainrun/tensor.h" /* tr_tensor_t, tr_chunk_range */

#ifdef __cplusplus
extern "C" {
#endif

#define TR_MESH_MAX_DIMS 8  /* dims of a mesh; also flattened dims */
#define TR_MESH_NAME_MAX 32 /* bytes of a dim name, NUL included */

/* ===================================================================== */
/* ---- device meshes ---- */

typedef struct tr_mesh_s tr_mesh_t;

/* One dim of a mesh, as this rank sees it. */
typedef struct {
  char name[TR_MESH_NAME_MAX];
  int size;    /* ranks along the dim */
  int coord;   /* this rank's coordinate, 0 <= coord < size */
  int stride;  /* difference of the group ranks (in the mesh's base
                  group) of neighbours along the dim */
  tr_pg_t* pg; /* this rank's group along the dim (group rank == coord);
                  owned by the mesh */
  int flat;    /* 1 for a flattened dim (tr_mesh_flatten) */
} tr_mesh_dim_t;

/* The [parallelism] degrees, in torchtitan's mesh order. */
typedef struct {
  int pp;           /* pipeline_parallel_degree */
  int dp_replicate; /* data_parallel_replicate_degree */
  int dp_shard;     /* data_parallel_shard_degree; -1: the ranks left */
  int cp;           /* context_parallel_degree */
  int tp;           /* tensor_parallel_degree */
  /* 1 (default): every dim is in the mesh, size-1 dims included (their
   * groups hold one rank, and their collectives are local copies);
   * 0: size-1 dims are left out, as torchtitan's ParallelDims does. */
  int keep_size1;
  /* 1 (default): add the flattened dims torchtitan uses: "dp"
   * (dp_replicate x dp_shard: data loading, the loss), "dp_shard_cp"
   * (FSDP's shard group under context parallel) and "dp_cp" (gradient
   * sums under HSDP + cp). A flattened dim with one non-trivial part shares
   * that part's groups (no new group). */
  int flatten;
} tr_mesh_degrees_t;

/* Mesh dim names in order: "pp", "dp_replicate", "dp_shard", "cp", "tp". */
extern const char* const tr_mesh_dim_names[5];

/* All degrees 1 except dp_shard = -1; keep_size1 = flatten = 1. */
void tr_mesh_degrees_init(tr_mesh_degrees_t* d);

/* Check d against world_size and resolve dp_shard = -1 (for tools that
 * show a layout from unresolved degrees; a job's degrees come resolved
 * from its config). Every degree must
 * be >= 1 (dp_shard may be -1) and their product must equal world_size.
 * TR_ECONFIG with a message like
 *   parallelism degrees pp 2 * dp_replicate 1 * dp_shard 3 * cp 1 * tp 2 =
 *   12 do not match the world size 8
 *   data_parallel_shard_degree -1: the world size 6 is not divisible by
 *   pp 1 * dp_replicate 1 * cp 1 * tp 4 = 4
 * in err (may be NULL). */
int tr_mesh_degrees_resolve(tr_mesh_degrees_t* d, int world_size,
                            tr_errmsg_t* err);

/* A mesh over every rank of pg: ndim dims of the given sizes (product ==
 * tr_pg_size(pg)) and distinct non-empty names, laid out row-major over
 * pg's group ranks (init_device_mesh). Collective over pg: every member
 * calls it with the same arguments, in the same order as its other group
 * creations; it creates one group per slice of every dim with
 * tr_pg_new_group (works with every backend, fake included; nothing is
 * communicated until a group's first op). pg must outlive the mesh. *out is
 * the caller's (tr_mesh_free). Errors: TR_EINVAL / TR_ECONFIG with a
 * message in err (may be NULL), group creation errors. */
int tr_mesh_init(tr_pg_t* pg, int ndim, const int* sizes,
                 const char* const* names, tr_mesh_t** out, tr_errmsg_t* err);

/* The torchtitan mesh of resolved degrees d: dims pp, dp_replicate,
 * dp_shard, cp, tp (size-1 dims dropped unless keep_size1), then the
 * flattened dims of d->flatten. The degrees are not solved again: every one
 * must be >= 1 (TR_EINVAL for dp_shard -1: tr_mesh_degrees_resolve first)
 * and their product tr_pg_size(pg) (TR_ECONFIG, messages as
 * tr_mesh_degrees_resolve's). */
int tr_mesh_from_degrees(tr_pg_t* pg, const tr_mesh_degrees_t* d,
                         tr_mesh_t** out, tr_errmsg_t* err);

/* Add a flattened dim new_name covering the named dims of the root mesh
 * (the one tr_mesh_init made), which must be consecutive in the root's
 * order and adjacent in rank space (each stride equal to the next dim's
 * size x stride; size-1 dims left out do not matter). Its coordinate is
 * the row-major index over the named dims; its groups are new unless only
 * one named dim has size > 1 (that dim's groups are shared). Visible from
 * the root and every sub-mesh (tr_mesh_find, tr_mesh_dim_pg, tr_mesh_sub),
 * not a dim of any existing mesh. Collective over the root's group, like
 * tr_mesh_init; mesh may be the root or a sub-mesh of it. TR_EINVAL with a
 * message for unknown or repeated names, a name already in use, dims not
 * consecutive. */
int tr_mesh_flatten(tr_mesh_t* mesh, const char* const* names, int n,
                    const char* new_name, tr_errmsg_t* err);

/* A mesh of n named dims of mesh (or flattened dims of its root), in the
 * order they have in the root (e.g. {"dp_replicate", "dp_shard"}): the
 * slice through this rank (mesh["a", "b"] in PyTorch). Local: no
 * communication, no new group; it shares the groups (and keeps them alive).
 * Dims that overlap (a flattened dim and one of its parts) or are out of
 * order are refused (TR_EINVAL, message in err). *out is the caller's. */
int tr_mesh_sub(const tr_mesh_t* mesh, const char* const* names, int n,
                tr_mesh_t** out, tr_errmsg_t* err);

/* Free a mesh; the groups are freed with the last mesh sharing them (the
 * root and its sub-meshes). NULL is a no-op. */
void tr_mesh_free(tr_mesh_t* mesh);

/* ---- looking at a mesh ---- */

int tr_mesh_ndim(const tr_mesh_t* mesh);
/* Ranks in the mesh (product of the dim sizes). */
int tr_mesh_size(const tr_mesh_t* mesh);
/* Dim i (0 <= i < ndim), or NULL when out of range. Owned by the mesh. */
const tr_mesh_dim_t* tr_mesh_dim(const tr_mesh_t* mesh, int i);
/* Index of the named dim of this mesh, or -1. */
int tr_mesh_dim_index(const tr_mesh_t* mesh, const char* name);
/* A dim of this mesh or a flattened dim of its root, by name; NULL when
 * none (e.g. a size-1 dim left out by keep_size1 = 0). */
const tr_mesh_dim_t* tr_mesh_find(const tr_mesh_t* mesh, const char* name);
/* tr_mesh_find(mesh, name)->pg, or NULL. */
tr_pg_t* tr_mesh_dim_pg(const tr_mesh_t* mesh, const char* name);
/* Size of the named dim; 1 for a torchtitan dim left out because its size
 * is 1; TR_ENOTFOUND for a name the mesh never had. */
int tr_mesh_dim_size(const tr_mesh_t* mesh, const char* name);
/* This rank's coordinate on the named dim (0 for a left-out size-1 dim);
 * TR_ENOTFOUND for a name the mesh never had. */
int tr_mesh_dim_coord(const tr_mesh_t* mesh, const char* name);
/* The group the mesh was built over (the root's pg). */
tr_pg_t* tr_mesh_pg(const tr_mesh_t* mesh);
/* This rank's coordinates, one per dim (coords has tr_mesh_ndim entries). */
void tr_mesh_coords(const tr_mesh_t* mesh, int* coords);
/* Global rank at coords in this mesh (the slice through this rank), or
 * TR_EINVAL for coordinates out of range. */
int tr_mesh_global_rank(const tr_mesh_t* mesh, const int* coords);
/* Coordinates of global rank g in this mesh: 0, or TR_ENOTFOUND when g is
 * not in it (another slice, or outside the base group). */
int tr_mesh_coords_of(const tr_mesh_t* mesh, int g, int* coords);

/* Print the mesh to f: its dims (sizes, strides) and, for each dim and
 * flattened dim, the global ranks of every group (up to 16 groups of a dim,
 * then a count); one line per dim, e.g. (lines cut here)
 *
 *   mesh: 4 ranks as pp 1 x dp_replicate 1 x dp_shard 2 x cp 1 x tp 2
 *     pp            size 1  stride 4  groups [0] [1] [2] [3]
 *     ...
 *     dp_shard      size 2  stride 2  groups [0 2] [1 3]
 *     tp            size 2  stride 1  groups [0 1] [2 3]
 *     dp            size 2  stride 2  groups [0 2] [1 3]  (flattened: ...
 *
 * Strides are in ranks of the mesh's group. For a sub-mesh: its dims, with
 * every group of the root that slices the same way, under
 * "mesh: 2 of 4 ranks as tp 2". Returns 0 or TR_EIO when f fails. */
int tr_mesh_describe(const tr_mesh_t* mesh, FILE* f);

/* The same from degrees alone (no groups: for `trainrun plan`): resolves d
 * against world_size first (errors as tr_mesh_degrees_resolve); global rank
 * g of the printout is group rank g of a world. */
int tr_mesh_describe_degrees(const tr_mesh_degrees_t* d, int world_size,
                             FILE* f, tr_errmsg_t* err);

/* ===================================================================== */
/* ---- placements ---- */

typedef enum {
  TR_PLACEMENT_REPLICATE = 0,
  TR_PLACEMENT_SHARD = 1,
  TR_PLACEMENT_PARTIAL = 2
} tr_placement_kind_t;

/* A small value; build it with the constructors below. */
typedef struct {
  tr_placement_kind_t kind;
  int dim;              /* Shard: tensor dim (negative: from the end) */
  tr_pg_reduce_op_t op; /* Partial: TR_PG_SUM, _AVG, _MAX or _MIN */
  /* Shard: 0 or 1, a plain torch.chunk cut; P > 1, the strided variant
   * for fused projections (GPT-2's q|k|v): the dim is P equal parts, each
   * cut in torch.chunk pieces on its own, and a rank holds its piece of
   * every part, in part order (rank r of 2 over q|k|v rows: q_r|k_r|v_r).
   * Each part must divide evenly over the mesh dim, and no mesh dim may
   * cut the same tensor dim before it; one cutting it after cuts the
   * rank's piece in run order (FSDP over tensor parallelism; the rows held
   * may straddle parts: tr_param_layout_t). Only parameter layouts take it
   * (tr_dtensor_param_place; a DTensor spec refuses it: TR_EUNSUPPORTED). */
  int parts;
} tr_placement_t;

tr_placement_t tr_placement_shard(int dim);
/* Shard(dim) of `parts` equal parts, each cut on its own (see parts). */
tr_placement_t tr_placement_shard_parts(int dim, int parts);
tr_placement_t tr_placement_replicate(void);
tr_placement_t tr_placement_partial(tr_pg_reduce_op_t op);

/* 1 when a and b are the same placement (Shard dims compared as given). */
int tr_placement_eq(tr_placement_t a, tr_placement_t b);
/* "Shard(0)", "Shard(0, parts=3)", "Replicate()", "Partial(sum)" into
 * buf; returns buf. */
const char* tr_placement_str(tr_placement_t p, char* buf, size_t n);
/* The inverse of tr_placement_str ("S(1)", "R", "P" and "P(max)" too;
 * "Shard(0, parts=3)" for the strided variant);
 * TR_EINVAL when s is none of them. */
int tr_placement_parse(const char* s, tr_placement_t* out);

/* Check placements for a tensor of ndim dims and mesh_ndim mesh dims and
 * normalise negative Shard dims into [0, ndim): TR_EINVAL (logged) for a
 * Shard dim out of range, a Partial op other than sum/avg/max/min, or an
 * unknown kind. out may equal in. */
int tr_placement_normalize(int mesh_ndim, const tr_placement_t* in, int ndim,
                           tr_placement_t* out);

/* compute_local_shape_and_global_offset: the local shape and the global
 * offset of the piece held at mesh coordinates coords, for a tensor of
 * global shape gshape (ndim dims) with placements (normalised or not) over
 * a mesh of mesh_ndim dims of sizes mesh_sizes. Mesh dims are applied in
 * order, each cutting the piece left by the previous ones with torch.chunk
 * arithmetic (tr_chunk_range). Replicate and Partial leave the shape.
 * Errors: TR_EINVAL (bad placements or coordinates). */
int tr_placement_local_layout(int mesh_ndim, const int* mesh_sizes,
                              const int* coords, const tr_placement_t* pl,
                              int ndim, const int64_t* gshape,
                              int64_t* local_shape, int64_t* global_offset);
/* The same with the mesh dims applied in the given order (order[k] is the
 * k-th mesh dim to cut; a permutation of 0 .. mesh_ndim - 1; NULL: mesh
 * order). Cutting a dim later is PyTorch's _StridedShard: FSDP2 over a
 * tensor-parallel parameter shards the piece TP left, although dp_shard
 * comes before tp in the mesh. TR_EINVAL for an order that is not a
 * permutation. A Shard of P > 1 parts gives the shape of the whole piece
 * (P pieces of the parts) and the offset of its piece of part 0 (part j's
 * is j x shape[d] / P further); TR_EINVAL when a part does not divide
 * evenly, another mesh dim cuts the same tensor dim before it, or one cuts
 * it after (the rows held are no piece of every part:
 * tr_placement_local_piece says which they are). */
int tr_placement_local_layout_ordered(
    int mesh_ndim, const int* mesh_sizes, const int* coords,
    const tr_placement_t* pl, const int* order, int ndim, const int64_t* gshape,
    int64_t* local_shape, int64_t* global_offset);
/* The same as a parameter layout (trainrun/model.h; placement NULL), which
 * also says the rows held of a piece in parts that later mesh dims cut
 * again (parts, part_rows, skip): GPT-2's c_attn [384, 128] as Shard(0,
 * parts=3) on tp 2 then Shard(0) on dp_shard 2 cutting last gives tp rank
 * 0, dp_shard rank 1 rows 96..191 of its q0|k0|v0 piece of 3 x 64 rows:
 * offset 0, shape [96, 128], parts 3, part_rows 64, skip 96 (global rows
 * 160..191 of k and 256..319 of v). TR_EINVAL as above, and for parts on a
 * tensor dim other than 0. */
int tr_placement_local_piece(int mesh_ndim, const int* mesh_sizes,
                             const int* coords, const tr_placement_t* pl,
                             const int* order, int ndim, const int64_t* gshape,
                             tr_param_layout_t* out);

/* ===================================================================== */
/* ---- distributed tensors ---- */

/* Where a global tensor lives: DTensorSpec. */
typedef struct {
  tr_mesh_t* mesh; /* borrowed */
  int mesh_ndim;
  tr_placement_t placements[TR_MESH_MAX_DIMS]; /* normalised */
  int ndim;
  int64_t shape[TR_MAX_DIMS]; /* global */
} tr_dtensor_spec_t;

/* A caller-allocated value: the spec and this rank's local tensor. */
typedef struct {
  tr_dtensor_spec_t spec;
  tr_tensor_t local; /* this rank's piece, shaped by the spec */
} tr_dtensor_t;

typedef struct tr_dtensor_work_s tr_dtensor_work_t;

/* Fill spec (placements normalised; TR_EINVAL for bad ones, or when
 * placements do not match the mesh). */
int tr_dtensor_spec_init(tr_dtensor_spec_t* spec, tr_mesh_t* mesh,
                         const tr_placement_t* placements, int ndim,
                         const int64_t* shape);

/* Local shape and global offset for this rank (coords NULL) or for the
 * rank at mesh coordinates coords (tr_placement_local_layout on the
 * spec's mesh). */
int tr_dtensor_local_layout(const tr_dtensor_spec_t* spec, const int* coords,
                            int64_t* local_shape, int64_t* global_offset);

/* A zeroed DTensor: the spec from the arguments, local allocated with this
 * rank's local shape on dev. Release with tr_dtensor_release. */
int tr_dtensor_zeros(tr_dtensor_t* dt, tr_mesh_t* mesh,
                     const tr_placement_t* placements, int ndim,
                     const int64_t* shape, tr_dtype_t dtype, tr_device_t dev);

/* DTensor.from_local: dt takes a reference to local (no copy) as this
 * rank's piece of a tensor of global shape `shape` (NULL: computed as
 * PyTorch does, assuming even shards: local size x mesh size on sharded
 * dims). TR_ESHAPE (logged) when local's shape is not the piece the spec
 * gives this rank. */
int tr_dtensor_from_local(tr_dtensor_t* dt, const tr_tensor_t* local,
                          tr_mesh_t* mesh, const tr_placement_t* placements,
                          const int64_t* shape);

/* distribute_tensor without communication: full is the whole tensor, the
 * same on every rank; dt gets a new contiguous copy of this rank's piece
 * (Partial(sum): coordinate 0 of that mesh dim holds the values, the
 * others zeros). */
int tr_dtensor_distribute(tr_dtensor_t* dt, const tr_tensor_t* full,
                          tr_mesh_t* mesh, const tr_placement_t* placements);

/* full_tensor(): redistribute to Replicate on every mesh dim and give the
 * local result (the whole tensor) in *out (a new tensor). Collective. */
int tr_dtensor_full_tensor(const tr_dtensor_t* dt, tr_tensor_t* out);

/* Release dt's local tensor (the spec stays readable). */
void tr_dtensor_release(tr_dtensor_t* dt);

/* Redistribute src to placements (one per mesh dim; normalised here) as
 * the top of this file describes; out gets the spec and a new local tensor
 * (out may be src: its local is replaced when the result is ready; any
 * other out must hold no tensor). Collective over the mesh: every rank calls
 * it with the same placements. work NULL: blocks until done. Non-NULL:
 * *work receives a handle (out stays as it is until tr_dtensor_work_wait
 * returns 0; keep src, out and their memory untouched until then).
 * Errors: TR_EINVAL (placements), TR_EUNSUPPORTED (Partial(a) ->
 * Partial(b), device copies the device lacks), the group's errors. */
int tr_dtensor_redistribute(const tr_dtensor_t* src,
                            const tr_placement_t* placements, tr_dtensor_t* out,
                            tr_dtensor_work_t** work);

/* Complete a redistribute: wait for the collective in flight, run the
 * steps left and fill out. Returns 0 or the first error (out then holds
 * no new tensor). A second wait returns the same result at once. */
int tr_dtensor_work_wait(tr_dtensor_work_t* w);

/* Free a handle; one never waited on is waited on first (its result
 * logged when an error), since the steps it owes are collectives the other
 * ranks run too. NULL is a no-op. */
void tr_dtensor_work_free(tr_dtensor_work_t* w);

/* ===================================================================== */
/* ---- mesh shapes: a mesh as layout arithmetic sees it ---- */

/* The names, sizes and this rank's coordinates of a mesh's dims, without
 * its groups: what a placement needs to say which piece a rank holds.
 * From a mesh (tr_mesh_get_shape), or built for ranks that have no groups
 * (`trainrun plan`, a layer over bare process groups). */
typedef struct {
  int ndim;
  char names[TR_MESH_MAX_DIMS][TR_MESH_NAME_MAX];
  int sizes[TR_MESH_MAX_DIMS];
  int coords[TR_MESH_MAX_DIMS];
} tr_mesh_shape_t;

/* TR_EINVAL for ndim out of [1, TR_MESH_MAX_DIMS], empty, long or
 * repeated names, sizes < 1 or coordinates out of range. */
int tr_mesh_shape_init(tr_mesh_shape_t* s, int ndim, const char* const* names,
                       const int* sizes, const int* coords);
/* The dims of mesh (not its flattened dims) and this rank's coordinates. */
void tr_mesh_get_shape(const tr_mesh_t* mesh, tr_mesh_shape_t* out);
/* Index of the named dim, or -1. */
int tr_mesh_shape_index(const tr_mesh_shape_t* s, const char* name);

/* ===================================================================== */
/* ---- the parameter table's placements: the one truth about sharding ----
 *
 * Every parameter of a model (trainrun/model.h) that is not whole on
 * every rank carries a tr_param_placement_t in p->layout.placement: the
 * mesh shape, its placement on every mesh dim, and the order in which the
 * dims cut it; p->layout.offset / shape are this rank's piece, derived
 * from it here and nowhere else. A parameter without one is Replicate on
 * every dim (a one-rank run is the mesh of size 1). Tensor parallelism
 * places a parameter first (Shard on tp); FSDP then composes Shard(0) on
 * dp_shard onto whatever is there, cutting last (FSDP2's strided shard),
 * and reads its rows from the result; the optimizer, clipping and the
 * checkpoint read the layout. */

typedef struct {
  tr_mesh_shape_t mesh;
  tr_placement_t placements[TR_MESH_MAX_DIMS]; /* normalised */
  int order[TR_MESH_MAX_DIMS]; /* mesh dims in the order they cut */
} tr_param_placement_t;

/* Compose: out = in (NULL: Replicate on every dim of mesh) with the mesh
 * dim named `dim` set to Shard(tensor_dim) and moved to the end of the
 * order (it cuts the piece the other dims leave). When in is given its
 * mesh is kept and must have `dim`. TR_EINVAL when the dim is missing or
 * already not Replicate there, or tensor_dim is out of [0, ndim). */
int tr_param_placement_compose(const tr_param_placement_t* in,
                               const tr_mesh_shape_t* mesh, const char* dim,
                               int tensor_dim, int ndim,
                               tr_param_placement_t* out);

/* The piece of a tensor of global shape gshape (ndim dims) that placement
 * pl gives the rank at this rank's coordinates, except on mesh dim `dim`
 * (may be NULL): there the coordinate is `coord`, or, with skip, the dim
 * does not cut at all (the piece before its cut), as a layout in *out
 * (tr_placement_local_piece; its placement NULL). TR_EINVAL for an unknown
 * dim or a coordinate out of range. */
int tr_param_placement_layout(const tr_param_placement_t* pl, int ndim,
                              const int64_t* gshape, const char* dim, int coord,
                              int skip, tr_param_layout_t* out);

/* Give parameter p (global shape p->shape) a placement over mesh with the
 * dims cutting in `order` (NULL: mesh order): a heap copy goes to
 * p->layout.placement and p->layout.offset / shape get this rank's piece.
 * Replaces a placement set before (kept on error). Call before
 * tr_model_alloc (which allocates layout.shape). TR_EINVAL for bad
 * placements or order. */
int tr_dtensor_param_place(tr_param_t* p, const tr_mesh_shape_t* mesh,
                           const tr_placement_t* placements, const int* order);
/* tr_dtensor_param_place over a mesh's shape, in mesh order. */
int tr_dtensor_param_set_layout(tr_param_t* p, tr_mesh_t* mesh,
                                const tr_placement_t* placements);
/* Compose Shard(tensor_dim) on mesh dim `dim` onto p's placement
 * (tr_param_placement_compose; mesh is used when p has none yet) and set
 * p's layout from the result. */
int tr_dtensor_param_shard(tr_param_t* p, const tr_mesh_shape_t* mesh,
                           const char* dim, int tensor_dim);
/* p's placement, or NULL for a whole tensor. */
const tr_param_placement_t* tr_dtensor_param_placement(const tr_param_t* p);
/* How many ranks along the named mesh dims hold the same piece of p: the
 * product of the sizes of those dims on which p is not sharded (dims p's
 * mesh lacks count 1; no placement: every size). */
int64_t tr_dtensor_param_replicas(const tr_param_t* p,
                                  const tr_mesh_shape_t* mesh,
                                  const char* const* dims, int n);
/* Undo a shard: p's placement on mesh dim `dim` becomes Replicate and the
 * layout follows (the whole tensor, placement freed, when no dim cuts it
 * any more). No-op without a placement or when dim does not shard it. */
int tr_dtensor_param_unshard(tr_param_t* p, const char* dim);
/* Free the placement and make the layout the whole tensor again. */
void tr_dtensor_param_clear_layout(tr_param_t* p);

/* ===================================================================== */
/* ---- tensor parallelism (dtensor/tp.c) ----
 *
 * Megatron-style TP as torchtitan plans it (parallelize_module with
 * ColwiseParallel / RowwiseParallel / SequenceParallel and loss_parallel).
 * The plan reads each parameter's declared tp style (trainrun/model.h) and
 * places it on the mesh dim "tp":
 *
 *   colwise    Shard(0): output features split (q, k, v by heads, w1, w3,
 *              GPT-2's c_fc and its bias); GPT-2's fused c_attn weight and
 *              bias are Shard(0, parts=3), each of q, k and v cut by heads,
 *              so a rank holds q|k|v of its heads as one tensor
 *   rowwise    Shard(1): input features split (wo, w2, GPT-2's c_proj); the
 *              output is a partial sum
 *   replicate  norms, GPT-2's position table, the biases of row-parallel
 *              layers (the families add them once, after the reduction)
 *   vocab, output
 *              Shard(0) over the vocabulary rows where tp divides the
 *              vocabulary ("vocab (rows split)" in the plan), else whole
 *              on every rank ("vocab (replicated: V % tp != 0)"), the
 *              one-rank behaviour. GPT-2's tied table is one tensor with
 *              one placement, read by the embedding and the head alike.
 *
 * The model's tp hook (tr_tp_install) then runs the seam's collectives
 * over the tp group (trainrun/model.h, tr_model_tp_t, has the points):
 *
 *   - without sequence parallel: an all-reduce of every row-parallel
 *     output before the residual add and of every column-parallel input
 *     gradient (two per layer forward, two backward);
 *   - with sequence parallel (the default, torchtitan's): the residual
 *     stream, norms and residual adds hold [B, T/tp, C]; an all-gather
 *     along T before each column-parallel input and a reduce-scatter after
 *     each row-parallel output, the mirrors in backward, and an all-reduce
 *     of each norm's weight (and bias) gradient of the rank's tokens;
 *   - a vocabulary-split embedding looks up the tokens of its rows (0 for
 *     the others) and sums over tp (reduce-scatters under SP), its
 *     backward adds to its rows only; a whole one under SP keeps its rows
 *     of T;
 *   - loss parallel (the default) with a vocabulary-split output: logits
 *     [B, T, V/tp] and a vocabulary-sharded cross-entropy (all-reduce max,
 *     then one all-reduce sum of the sums of exponentials and the target
 *     logits), the head's input gradient then a partial sum (all-reduced,
 *     reduce-scattered under SP); disable_loss_parallel gathers the
 *     logits instead (host tensors only: the column reorder is a strided
 *     copy) and keeps the rank's columns of the dlogits. Losses are the
 *     same on every tp rank;
 *   - async tensor parallel (opts.async, with SP): the layers' SP
 *     all-gathers and reduce-scatters run as rings of chunk transfers
 *     (tr_model_tp_t.overlap) overlapped with the GEMMs of the chunk a
 *     rank holds, forward and backward; the same results within rounding.
 *
 * Every tp rank runs the same batch.
 *
 *   tr_mesh_shape_t s;
 *   tr_mesh_get_shape(mesh, &s);             // a mesh with a "tp" dim
 *   tr_tp_plan_apply(&m, &s, &err);          // after tr_model_init,
 *   tr_model_alloc(&m, dev);                 // before the allocation
 *   tr_model_init_weights(&m, seed);         // the 1-rank values, sliced
 *   tr_tp_opts_t o;
 *   tr_tp_opts_init(&o);                     // SP and loss parallel on
 *   o.loss_parallel = !disable_loss_parallel;
 *   tr_tp_check_seq_len(tp, seq_len, &o, &err);   // before any worker
 *   tr_tp_install(&m, tr_mesh_dim_pg(mesh, "tp"), &o);
 *   ... forward / backward as on one rank ...
 *   tr_tp_grad_sq_norm(&m, tp_pg, NULL, &sq); // the global squared norm
 *
 * Gradient norm: the gradient of a tp-sharded parameter is that rank's
 * piece, of a tp-replicated one the whole (the same on every tp rank, SP's
 * norm gradients included), so the squared norm is sum over tp of the
 * sharded squares plus the replicated squares once; a trainer reduces the
 * sharded part over tp (and over the data-parallel dims as it does today)
 * and the replicated part over the data-parallel dims only. FSDP over a TP
 * layout (2-D) composes Shard(0) on dp_shard (tr_dtensor_param_shard),
 * cutting last: over GPT-2's strided c_attn an FSDP shard holds rows of
 * the rank's q|k|v piece, which may straddle two parts (PyTorch's
 * _StridedShard; tr_param_layout_t). A safetensors import
 * (tr_st_import_model), the initialisation and the distributed checkpoint
 * take such a layout as its runs of rows (tr_param_layout_runs), each a
 * box of the global tensor. */

/* The placement on "tp" that p's style asks for under a tp degree in
 * *out: 1 when it is a Shard (colwise, rowwise, and vocab / output where
 * tp > 1 divides the vocabulary), 0 for Replicate. */
int tr_tp_placement(const tr_param_t* p, int tp, tr_placement_t* out);

/* Place every parameter of m on the mesh dim "tp" of mesh as above
 * (Replicate on the other dims; FSDP composes onto it after). No-op
 * without a "tp" dim or when its size is 1. Before tr_model_alloc and
 * before any other placement: TR_EINVAL otherwise. TR_ECONFIG with a
 * message in err when the tp degree does not divide the heads, the KV
 * heads or a split dim ("tensor_parallel_degree 3 does not divide the 4
 * attention heads"). */
int tr_tp_plan_apply(tr_model_t* m, const tr_mesh_shape_t* mesh,
                     tr_errmsg_t* err);

/* One line per parameter: name, style, placement on tp, global and local
 * shape, e.g.
 *   transformer.h.0.attn.c_attn.weight  colwise  Shard(0, parts=3)
 *   [384, 128]     local [192, 128]
 *   transformer.wte.weight  vocab (rows split)  Shard(0)  [256, 128]
 *   local [128, 128]
 * (one line each in the output), then what a rank holds:
 *   per rank: 180736 of 296192 parameter elements, 2.8 MiB of fp32
 *   weights, gradients and AdamW moments
 * (16 bytes an element). TR_EIO when f fails. */
int tr_tp_plan_describe(const tr_model_t* m, FILE* f);

/* The hook's collectives timed ([metrics] comm_overlap): with one, the
 * hook issues each op with a work handle and the compute waits for it
 * through trainrun/pg_waits.h (the host on the CPU; on CUDA the compute
 * stream, between the stall timer's two events, the handle held until the
 * host sees the op complete, at most 8 of them), adding the op's duration
 * and the compute's wait; the bits computed are the same as with the
 * blocking ops of a hook without one (no events, no handles: no cost).
 * On CUDA every blocking TP op sits on the critical path (the next kernel
 * needs its result), so the hidden fraction is ~0 by construction: exposed
 * is the compute stream's stall, which covers the op. Under async tensor
 * parallel the ring's steps are the ops counted (one coalesced group of
 * transfers each), and a step's transfers are waited for after the GEMMs
 * of the chunk held, so what they overlap counts as hidden. */
typedef struct tr_tp_comm tr_tp_comm_t;
/* timed 1: turns op timing on for tp (off again at the free) and counts;
 * 0: only the waits, what async tensor parallel needs on CUDA (its ring
 * transfers waited for by the compute stream, no host wait), nothing
 * counted. TR_EINVAL, TR_ENOMEM. */
int tr_tp_comm_new(tr_pg_t* tp, int timed, tr_tp_comm_t** out);
/* Settles what is held; NULL is a no-op. */
void tr_tp_comm_free(tr_tp_comm_t* c);
/* on 0: the ops from now on go uncounted (validation), 1: counted again
 * (when timed). */
void tr_tp_comm_measure(tr_tp_comm_t* c, int on);
/* The step's end (after the device ran it): settle the held works, read
 * the stall events, count a step; the first error of an op. */
int tr_tp_comm_step_end(tr_tp_comm_t* c);
/* The totals since the last take (steps: tr_tp_comm_step_end calls) into
 * *out, and start new ones. */
void tr_tp_comm_take(tr_tp_comm_t* c, tr_pg_comm_t* out);

/* What the hook does besides the plan. */
typedef struct {
  int sequence_parallel; /* residual stream sharded along T (default 1) */
  int loss_parallel;     /* vocabulary-sharded cross-entropy (default 1);
                            0 = [parallelism] disable_loss_parallel */
  int async;             /* async tensor parallel (default 0), sequence
                            parallel only: tr_model_tp_t.overlap set, the
                            SP all-gathers and reduce-scatters of the
                            layers cut into a ring of chunk transfers
                            overlapped with the chunks' GEMMs; give it a
                            comm on CUDA (its waits keep the host from
                            waiting for each transfer) */
  tr_tp_comm_t* comm;    /* the hook's ops through it (made over the same
                            group; outlives its use): issued without a
                            host wait and waited for on the compute
                            stream, timed when it was made with timing
                            ([metrics] comm_overlap); default NULL: the
                            blocking collectives, untimed */
} tr_tp_opts_t;
void tr_tp_opts_init(tr_tp_opts_t* o);

/* The hook (tr_model_tp_t.fn) over the tp group arg (a tr_pg_t*): the op
 * as trainrun/model.h defines it (all-reduce SUM or MAX; all-gather or
 * reduce-scatter along dim 1 with the [tp][B][T/tp] <-> [B][T] reorder;
 * all-gather along the last dim: host tensors only, TR_EUNSUPPORTED on a
 * device, where the column reorder would need a strided device copy). */
int tr_tp_collective(void* arg, tr_tp_point_t point, tr_tp_op_t op,
                     tr_tensor_t* t);
/* Set m's tp hook to tr_tp_collective over tp with opts (NULL: the
 * defaults), or with opts->comm to the timed hook over comm's group;
 * tp NULL or of size 1 clears it (the bits of a model without the seam).
 * tp must outlive its use. */
void tr_tp_install(tr_model_t* m, tr_pg_t* tp, const tr_tp_opts_t* opts);
/* TR_ECONFIG, with "tensor_parallel_degree 4 does not divide the sequence
 * length 10 (sequence parallel)" in err, when sequence parallel is on and
 * tp does not divide seq_len (what a forward would refuse); else 0. */
int tr_tp_check_seq_len(int tp, int seq_len, const tr_tp_opts_t* opts,
                        tr_errmsg_t* err);

/* 1 when p is sharded on the mesh dim "tp", else 0. */
int tr_tp_sharded(const tr_param_t* p);

/* The whole tensor of which local (contiguous, shaped like
 * p->layout.shape: p's data or grad) is this rank's tp piece, into *out (a
 * new CPU tensor of p->shape), strided parts included. Collective over tp
 * (an all-gather where local is: a device tensor over NCCL, then copied to
 * the host and reordered there) for a tp-sharded p; a copy otherwise.
 * TR_EUNSUPPORTED when another mesh dim also shards p or the tp pieces
 * differ in size (the plan never makes such), TR_ESHAPE when local is not
 * p's piece. */
int tr_tp_gather(const tr_param_t* p, const tr_tensor_t* local, tr_pg_t* tp,
                 tr_tensor_t* out);

/* The squared norm of m's gradients (float32, on any device: one
 * multi-tensor sum for each kind) over the tp group: the
 * tp-sharded parameters' squares summed over tp (all-gathered and added in
 * rank order, so every rank gets the same double), the others' once;
 * gradients without memory (another pipeline stage's) and those with
 * skip[i] set (skip may be NULL: a table a pipeline holds twice) left out.
 * Collective over tp (NULL or size 1: local). */
int tr_tp_grad_sq_norm(const tr_model_t* m, tr_pg_t* tp,
                       const unsigned char* skip, double* out);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_DTENSOR_H */
