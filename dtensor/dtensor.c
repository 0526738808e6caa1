/* dtensor/dtensor.c: distributed tensors -- specs, local pieces for any
 * rank, constructors (zeros, from_local). distribute and full_tensor are
 * redistributes (redistribute.c); parameters' placements are param.c's. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "dtensor/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"

int tr_dtensor_spec_init(tr_dtensor_spec_t* spec, tr_mesh_t* mesh,
                         const tr_placement_t* placements, int ndim,
                         const int64_t* shape) {
  memset(spec, 0, sizeof *spec);
  if (!mesh || ndim < 0 || ndim > TR_MAX_DIMS) return TR_EINVAL;
  int m = tr_mesh_ndim(mesh);
  TR_CHECK(tr_placement_normalize(m, placements, ndim, spec->placements));
  for (int i = 0; i < m; i++)
    if (spec->placements[i].parts > 1) return TR_EUNSUPPORTED; /* layouts */
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0) return TR_EINVAL;
    spec->shape[d] = shape[d];
  }
  spec->mesh = mesh;
  spec->mesh_ndim = m;
  spec->ndim = ndim;
  return 0;
}

int tr_dtensor_local_layout(const tr_dtensor_spec_t* spec, const int* coords,
                            int64_t* local_shape, int64_t* global_offset) {
  int sizes[TR_MESH_MAX_DIMS], mine[TR_MESH_MAX_DIMS];
  tr__mesh_sizes(spec->mesh, sizes);
  if (!coords) {
    tr_mesh_coords(spec->mesh, mine);
    coords = mine;
  }
  return tr_placement_local_layout(spec->mesh_ndim, sizes, coords,
                                   spec->placements, spec->ndim, spec->shape,
                                   local_shape, global_offset);
}

int tr_dtensor_zeros(tr_dtensor_t* dt, tr_mesh_t* mesh,
                     const tr_placement_t* placements, int ndim,
                     const int64_t* shape, tr_dtype_t dtype, tr_device_t dev) {
  memset(&dt->local, 0, sizeof dt->local);
  TR_CHECK(tr_dtensor_spec_init(&dt->spec, mesh, placements, ndim, shape));
  int64_t ls[TR_MAX_DIMS], off[TR_MAX_DIMS];
  TR_CHECK(tr_dtensor_local_layout(&dt->spec, NULL, ls, off));
  return tr_tensor_zeros(&dt->local, dtype, dev, ndim, ls);
}

int tr_dtensor_from_local(tr_dtensor_t* dt, const tr_tensor_t* local,
                          tr_mesh_t* mesh, const tr_placement_t* placements,
                          const int64_t* shape) {
  memset(&dt->local, 0, sizeof dt->local);
  int ndim = local->ndim;
  int64_t gs[TR_MAX_DIMS];
  if (shape) {
    memcpy(gs, shape, sizeof(int64_t) * (size_t)ndim);
  } else {
    tr_placement_t pl[TR_MESH_MAX_DIMS];
    TR_CHECK(tr_placement_normalize(tr_mesh_ndim(mesh), placements, ndim, pl));
    memcpy(gs, local->shape, sizeof(int64_t) * (size_t)ndim);
    for (int i = 0; i < tr_mesh_ndim(mesh); i++)
      if (pl[i].kind == TR_PLACEMENT_SHARD)
        gs[pl[i].dim] *= tr_mesh_dim(mesh, i)->size;
  }
  TR_CHECK(tr_dtensor_spec_init(&dt->spec, mesh, placements, ndim, gs));
  int64_t ls[TR_MAX_DIMS], off[TR_MAX_DIMS];
  TR_CHECK(tr_dtensor_local_layout(&dt->spec, NULL, ls, off));
  for (int d = 0; d < ndim; d++)
    if (ls[d] != local->shape[d]) {
      char got[96];
      TR_LOG_ERROR(DT,
                   "from_local: local tensor %s, but this rank's piece has "
                   "%lld on dim %d",
                   tr_tensor_shape_str(local, got, sizeof got),
                   (long long)ls[d], d);
      return TR_ESHAPE;
    }
  tr_tensor_view(&dt->local, local);
  return 0;
}

void tr_dtensor_release(tr_dtensor_t* dt) { tr_tensor_release(&dt->local); }
