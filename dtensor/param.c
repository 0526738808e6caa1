/* dtensor/param.c: the one truth about sharding — every parameter's
 * placement on the mesh (tr_param_placement_t in the model's parameter
 * table), composing placements (FSDP's Shard(0) on dp_shard over what
 * tensor parallelism placed), the piece a rank holds, and mesh shapes, the
 * group-free view of a mesh the arithmetic needs (trainrun/dtensor.h). */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "dtensor/internal.h"
#include "trainrun/dtensor.h"
#include "trainrun/error.h"

/* ---- mesh shapes ---- */

int tr_mesh_shape_init(tr_mesh_shape_t* s, int ndim, const char* const* names,
                       const int* sizes, const int* coords) {
  memset(s, 0, sizeof *s);
  if (ndim < 1 || ndim > TR_MESH_MAX_DIMS) return TR_EINVAL;
  for (int i = 0; i < ndim; i++) {
    size_t len = names[i] ? strlen(names[i]) : 0;
    if (len == 0 || len >= TR_MESH_NAME_MAX || sizes[i] < 1 || coords[i] < 0 ||
        coords[i] >= sizes[i])
      return TR_EINVAL;
    for (int j = 0; j < i; j++)
      if (strcmp(names[i], names[j]) == 0) return TR_EINVAL;
    memcpy(s->names[i], names[i], len + 1);
    s->sizes[i] = sizes[i];
    s->coords[i] = coords[i];
  }
  s->ndim = ndim;
  return 0;
}

void tr_mesh_get_shape(const tr_mesh_t* mesh, tr_mesh_shape_t* out) {
  memset(out, 0, sizeof *out);
  out->ndim = tr_mesh_ndim(mesh);
  for (int i = 0; i < out->ndim; i++) {
    const tr_mesh_dim_t* d = tr_mesh_dim(mesh, i);
    memcpy(out->names[i], d->name, sizeof out->names[i]);
    out->sizes[i] = d->size;
    out->coords[i] = d->coord;
  }
}

int tr_mesh_shape_index(const tr_mesh_shape_t* s, const char* name) {
  for (int i = 0; name && i < s->ndim; i++)
    if (strcmp(s->names[i], name) == 0) return i;
  return -1;
}

/* ---- placements of parameters ---- */

static void replicated(const tr_mesh_shape_t* mesh, tr_param_placement_t* out) {
  memset(out, 0, sizeof *out);
  out->mesh = *mesh;
  for (int i = 0; i < mesh->ndim; i++) {
    out->placements[i] = tr_placement_replicate();
    out->order[i] = i;
  }
}

int tr_param_placement_compose(const tr_param_placement_t* in,
                               const tr_mesh_shape_t* mesh, const char* dim,
                               int tensor_dim, int ndim,
                               tr_param_placement_t* out) {
  tr_param_placement_t r;
  if (in)
    r = *in;
  else if (mesh)
    replicated(mesh, &r);
  else
    return TR_EINVAL;
  int i = tr_mesh_shape_index(&r.mesh, dim);
  if (i < 0 || tensor_dim < 0 || tensor_dim >= ndim ||
      r.placements[i].kind != TR_PLACEMENT_REPLICATE)
    return TR_EINVAL;
  r.placements[i] = tr_placement_shard(tensor_dim);
  /* i cuts last: the others keep their relative order */
  int k = 0;
  for (int j = 0; j < r.mesh.ndim; j++)
    if (r.order[j] != i) r.order[k++] = r.order[j];
  r.order[k] = i;
  *out = r;
  return 0;
}

int tr_param_placement_layout(const tr_param_placement_t* pl, int ndim,
                              const int64_t* gshape, const char* dim, int coord,
                              int skip, tr_param_layout_t* out) {
  int coords[TR_MESH_MAX_DIMS];
  tr_placement_t place[TR_MESH_MAX_DIMS];
  memcpy(coords, pl->mesh.coords, sizeof coords);
  memcpy(place, pl->placements, sizeof place);
  if (dim) {
    int i = tr_mesh_shape_index(&pl->mesh, dim);
    if (i < 0) return TR_EINVAL;
    if (skip)
      place[i] = tr_placement_replicate();
    else
      coords[i] = coord;
  }
  return tr_placement_local_piece(pl->mesh.ndim, pl->mesh.sizes, coords, place,
                                  pl->order, ndim, gshape, out);
}

/* Set p's placement to a heap copy of *pl and its layout from it; p keeps
 * what it had on error. */
static int set_placement(tr_param_t* p, const tr_param_placement_t* pl) {
  tr_param_layout_t l; /* strided parts on dim 0 only */
  TR_CHECK(tr_param_placement_layout(pl, p->ndim, p->shape, NULL, 0, 0, &l));
  tr_param_placement_t* copy = malloc(sizeof *copy);
  if (!copy) return TR_ENOMEM;
  *copy = *pl;
  tr_dtensor_param_clear_layout(p);
  l.placement = copy;
  p->layout = l;
  return 0;
}

int tr_dtensor_param_place(tr_param_t* p, const tr_mesh_shape_t* mesh,
                           const tr_placement_t* placements, const int* order) {
  if (!mesh || mesh->ndim < 1 || mesh->ndim > TR_MESH_MAX_DIMS)
    return TR_EINVAL;
  tr_param_placement_t pl;
  replicated(mesh, &pl);
  TR_CHECK(
      tr_placement_normalize(mesh->ndim, placements, p->ndim, pl.placements));
  if (order) memcpy(pl.order, order, sizeof(int) * (size_t)mesh->ndim);
  return set_placement(p, &pl);
}

int tr_dtensor_param_set_layout(tr_param_t* p, tr_mesh_t* mesh,
                                const tr_placement_t* placements) {
  tr_mesh_shape_t s;
  tr_mesh_get_shape(mesh, &s);
  return tr_dtensor_param_place(p, &s, placements, NULL);
}

int tr_dtensor_param_shard(tr_param_t* p, const tr_mesh_shape_t* mesh,
                           const char* dim, int tensor_dim) {
  tr_param_placement_t pl;
  TR_CHECK(tr_param_placement_compose(tr_dtensor_param_placement(p), mesh, dim,
                                      tensor_dim, p->ndim, &pl));
  return set_placement(p, &pl);
}

const tr_param_placement_t* tr_dtensor_param_placement(const tr_param_t* p) {
  return p->layout.placement;
}

int64_t tr_dtensor_param_replicas(const tr_param_t* p,
                                  const tr_mesh_shape_t* mesh,
                                  const char* const* dims, int n) {
  const tr_param_placement_t* pl = tr_dtensor_param_placement(p);
  int64_t k = 1;
  for (int j = 0; j < n; j++) {
    if (pl) {
      int i = tr_mesh_shape_index(&pl->mesh, dims[j]);
      if (i >= 0 && pl->placements[i].kind != TR_PLACEMENT_SHARD)
        k *= pl->mesh.sizes[i];
    } else if (mesh) {
      int i = tr_mesh_shape_index(mesh, dims[j]);
      if (i >= 0) k *= mesh->sizes[i];
    }
  }
  return k;
}

int tr_dtensor_param_unshard(tr_param_t* p, const char* dim) {
  const tr_param_placement_t* at = tr_dtensor_param_placement(p);
  if (!at) return 0;
  int i = tr_mesh_shape_index(&at->mesh, dim);
  if (i < 0 || at->placements[i].kind != TR_PLACEMENT_SHARD) return 0;
  tr_param_placement_t pl = *at;
  pl.placements[i] = tr_placement_replicate();
  int cut = 0;
  for (int j = 0; j < pl.mesh.ndim; j++)
    cut |= pl.placements[j].kind == TR_PLACEMENT_SHARD;
  if (!cut) {
    tr_dtensor_param_clear_layout(p);
    return 0;
  }
  return set_placement(p, &pl);
}

void tr_dtensor_param_clear_layout(tr_param_t* p) {
  free(p->layout.placement);
  p->layout.placement = NULL;
  p->layout.parts = 1;
  p->layout.part_rows = p->layout.skip = 0;
  for (int d = 0; d < p->ndim; d++) {
    p->layout.offset[d] = 0;
    p->layout.shape[d] = p->shape[d];
  }
}
