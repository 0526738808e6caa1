/* dtensor/placement.c: Shard(d), Replicate and Partial(op) -- constructors,
 * names, checks, and which piece of a global tensor a mesh coordinate holds
 * (PyTorch's compute_local_shape_and_global_offset, torch.chunk
 * arithmetic through core's tr_chunk_range). */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "dtensor/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"

tr_placement_t tr_placement_shard(int dim) {
  tr_placement_t p = {TR_PLACEMENT_SHARD, dim, TR_PG_SUM, 1};
  return p;
}

tr_placement_t tr_placement_shard_parts(int dim, int parts) {
  tr_placement_t p = {TR_PLACEMENT_SHARD, dim, TR_PG_SUM, parts};
  return p;
}

/* Parts of a Shard (0 counts as 1). */
static int parts_of(tr_placement_t p) { return p.parts > 1 ? p.parts : 1; }

tr_placement_t tr_placement_replicate(void) {
  tr_placement_t p = {TR_PLACEMENT_REPLICATE, 0, TR_PG_SUM, 0};
  return p;
}

tr_placement_t tr_placement_partial(tr_pg_reduce_op_t op) {
  tr_placement_t p = {TR_PLACEMENT_PARTIAL, 0, op, 0};
  return p;
}

int tr_placement_eq(tr_placement_t a, tr_placement_t b) {
  if (a.kind != b.kind) return 0;
  if (a.kind == TR_PLACEMENT_SHARD)
    return a.dim == b.dim && parts_of(a) == parts_of(b);
  if (a.kind == TR_PLACEMENT_PARTIAL) return a.op == b.op;
  return 1;
}

const char* tr_placement_str(tr_placement_t p, char* buf, size_t n) {
  switch (p.kind) {
    case TR_PLACEMENT_SHARD:
      if (parts_of(p) > 1)
        snprintf(buf, n, "Shard(%d, parts=%d)", p.dim, p.parts);
      else
        snprintf(buf, n, "Shard(%d)", p.dim);
      break;
    case TR_PLACEMENT_REPLICATE:
      snprintf(buf, n, "Replicate()");
      break;
    case TR_PLACEMENT_PARTIAL:
      snprintf(buf, n, "Partial(%s)", tr_pg_reduce_op_name(p.op));
      break;
    default:
      snprintf(buf, n, "?");
  }
  return buf;
}

static int partial_op_ok(tr_pg_reduce_op_t op) {
  return op == TR_PG_SUM || op == TR_PG_AVG || op == TR_PG_MAX ||
         op == TR_PG_MIN;
}

/* s starts with word (case-insensitive); *rest gets what follows. */
static int word(const char* s, const char* w, const char** rest) {
  size_t n = strlen(w);
  if (strncasecmp(s, w, n)) return 0;
  *rest = s + n;
  return 1;
}

int tr_placement_parse(const char* s, tr_placement_t* out) {
  const char* r;
  if (!s) return TR_EINVAL;
  if (word(s, "Shard(", &r) || word(s, "S(", &r)) {
    char* end;
    long d = strtol(r, &end, 10), parts = 1;
    if (end == r || d < -TR_MAX_DIMS || d >= TR_MAX_DIMS) return TR_EINVAL;
    if (!strncmp(end, ", parts=", 8)) { /* the strided variant */
      const char* q = end + 8;
      parts = strtol(q, &end, 10);
      if (end == q || parts < 1 || parts > 1024) return TR_EINVAL;
    }
    if (strcmp(end, ")")) return TR_EINVAL;
    *out = tr_placement_shard_parts((int)d, (int)parts);
    return 0;
  }
  if (!strcasecmp(s, "Replicate()") || !strcasecmp(s, "Replicate") ||
      !strcmp(s, "R")) {
    *out = tr_placement_replicate();
    return 0;
  }
  if (!strcasecmp(s, "Partial") || !strcasecmp(s, "Partial()") ||
      !strcmp(s, "P")) {
    *out = tr_placement_partial(TR_PG_SUM);
    return 0;
  }
  if (word(s, "Partial(", &r) || word(s, "P(", &r)) {
    static const tr_pg_reduce_op_t ops[] = {TR_PG_SUM, TR_PG_AVG, TR_PG_MAX,
                                            TR_PG_MIN};
    for (int i = 0; i < 4; i++) {
      const char* name = tr_pg_reduce_op_name(ops[i]);
      size_t n = strlen(name);
      if (!strncmp(r, name, n) && !strcmp(r + n, ")")) {
        *out = tr_placement_partial(ops[i]);
        return 0;
      }
    }
  }
  return TR_EINVAL;
}

int tr_placement_normalize(int mesh_ndim, const tr_placement_t* in, int ndim,
                           tr_placement_t* out) {
  if (mesh_ndim < 0 || mesh_ndim > TR_MESH_MAX_DIMS || ndim < 0 ||
      ndim > TR_MAX_DIMS)
    return TR_EINVAL;
  for (int i = 0; i < mesh_ndim; i++) {
    tr_placement_t p = in[i];
    switch (p.kind) {
      case TR_PLACEMENT_SHARD: {
        int d = p.dim < 0 ? p.dim + ndim : p.dim;
        if (d < 0 || d >= ndim) {
          TR_LOG_ERROR(DT,
                       "placement Shard(%d) on mesh dim %d: a tensor of %d "
                       "dims has no dim %d",
                       p.dim, i, ndim, p.dim);
          return TR_EINVAL;
        }
        out[i] = tr_placement_shard_parts(d, parts_of(p));
        break;
      }
      case TR_PLACEMENT_REPLICATE:
        out[i] = tr_placement_replicate();
        break;
      case TR_PLACEMENT_PARTIAL:
        if (!partial_op_ok(p.op)) {
          TR_LOG_ERROR(DT,
                       "placement Partial on mesh dim %d: reduce op %d is "
                       "not sum, avg, max or min",
                       i, (int)p.op);
          return TR_EINVAL;
        }
        out[i] = tr_placement_partial(p.op);
        break;
      default:
        TR_LOG_ERROR(DT, "placement on mesh dim %d: unknown kind %d", i,
                     (int)p.kind);
        return TR_EINVAL;
    }
  }
  return 0;
}

/* The piece of every tensor dim (see tr_param_layout_t): shape, global
 * offset, and for a dim cut in parts its parts, rows per part and rows
 * skipped by the cuts after the one in parts. */
typedef struct {
  int64_t shape[TR_MAX_DIMS], offset[TR_MAX_DIMS];
  int parts[TR_MAX_DIMS];
  int64_t part_rows[TR_MAX_DIMS], skip[TR_MAX_DIMS];
} piece_t;

static int cut_piece(int mesh_ndim, const int* mesh_sizes, const int* coords,
                     const tr_placement_t* pl, const int* order, int ndim,
                     const int64_t* gshape, piece_t* out) {
  tr_placement_t norm[TR_MESH_MAX_DIMS];
  TR_CHECK(tr_placement_normalize(mesh_ndim, pl, ndim, norm));
  if (order) { /* a permutation of the mesh dims */
    unsigned seen = 0;
    for (int k = 0; k < mesh_ndim; k++) {
      if (order[k] < 0 || order[k] >= mesh_ndim || (seen >> order[k]) & 1)
        return TR_EINVAL;
      seen |= 1u << order[k];
    }
  }
  memset(out, 0, sizeof *out);
  for (int d = 0; d < ndim; d++) {
    if (gshape[d] < 0) return TR_EINVAL;
    out->shape[d] = gshape[d];
    out->parts[d] = 1;
  }
  unsigned cut = 0; /* tensor dims cut so far */
  for (int k = 0; k < mesh_ndim; k++) {
    int i = order ? order[k] : k;
    if (mesh_sizes[i] < 1 || coords[i] < 0 || coords[i] >= mesh_sizes[i])
      return TR_EINVAL;
    if (norm[i].kind != TR_PLACEMENT_SHARD) continue;
    int d = norm[i].dim, P = parts_of(norm[i]);
    int64_t start, len;
    if (P > 1 && ((cut >> d) & 1)) {
      TR_LOG_ERROR(DT,
                   "placement Shard(%d, parts=%d) on mesh dim %d: another "
                   "mesh dim cut the tensor dim before",
                   d, P, i);
      return TR_EINVAL;
    }
    cut |= 1u << d;
    if (out->parts[d] > 1) { /* rows of the piece in parts, in run order */
      tr_chunk_range(out->shape[d], mesh_sizes[i], coords[i], &start, &len);
      out->skip[d] += start;
      out->shape[d] = len;
      continue;
    }
    if (P > 1 && (out->shape[d] % P || (out->shape[d] / P) % mesh_sizes[i])) {
      TR_LOG_ERROR(DT,
                   "placement Shard(%d, parts=%d): %lld elements do not "
                   "split evenly into %d parts over %d ranks",
                   d, P, (long long)out->shape[d], P, mesh_sizes[i]);
      return TR_EINVAL;
    }
    tr_chunk_range(out->shape[d] / P, mesh_sizes[i], coords[i], &start, &len);
    out->offset[d] += start;
    out->shape[d] = len * P;
    if (P > 1) {
      out->parts[d] = P;
      out->part_rows[d] = len;
    }
  }
  return 0;
}

int tr_placement_local_piece(int mesh_ndim, const int* mesh_sizes,
                             const int* coords, const tr_placement_t* pl,
                             const int* order, int ndim, const int64_t* gshape,
                             tr_param_layout_t* out) {
  piece_t c;
  TR_CHECK(
      cut_piece(mesh_ndim, mesh_sizes, coords, pl, order, ndim, gshape, &c));
  for (int d = 1; d < ndim; d++)
    if (c.parts[d] > 1) return TR_EINVAL; /* a layout has parts on dim 0 */
  memset(out, 0, sizeof *out);
  memcpy(out->offset, c.offset, sizeof out->offset);
  memcpy(out->shape, c.shape, sizeof out->shape);
  out->parts = ndim > 0 ? c.parts[0] : 1;
  out->part_rows = c.part_rows[0];
  out->skip = c.skip[0];
  return 0;
}

int tr_placement_local_layout_ordered(
    int mesh_ndim, const int* mesh_sizes, const int* coords,
    const tr_placement_t* pl, const int* order, int ndim, const int64_t* gshape,
    int64_t* local_shape, int64_t* global_offset) {
  piece_t c;
  TR_CHECK(
      cut_piece(mesh_ndim, mesh_sizes, coords, pl, order, ndim, gshape, &c));
  for (int d = 0; d < ndim; d++) {
    if (c.parts[d] > 1 &&
        (c.skip[d] || c.shape[d] != c.parts[d] * c.part_rows[d]))
      return TR_EINVAL; /* rows of parts: no shape and offset say them */
    local_shape[d] = c.shape[d];
    global_offset[d] = c.offset[d];
  }
  return 0;
}

int tr_placement_local_layout(int mesh_ndim, const int* mesh_sizes,
                              const int* coords, const tr_placement_t* pl,
                              int ndim, const int64_t* gshape,
                              int64_t* local_shape, int64_t* global_offset) {
  return tr_placement_local_layout_ordered(mesh_ndim, mesh_sizes, coords, pl,
                                           NULL, ndim, gshape, local_shape,
                                           global_offset);
}
