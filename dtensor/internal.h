/* dtensor/internal.h: what the dtensor files share -- the mesh's layout
 * (a root that owns the groups, meshes that view its dims) and the
 * placement helpers redistribute plans with. */
#ifndef TRAINRUN_DTENSOR_INTERNAL_H
#define TRAINRUN_DTENSOR_INTERNAL_H

#include "trainrun/dtensor.h"

/* What a root mesh and its sub-meshes share: the base group, the groups of
 * every dim and flattened dim, and the names left out as size 1. */
typedef struct {
  int refs; /* meshes pointing here (atomic) */
  tr_pg_t* pg;
  int rank, size; /* this rank's group rank in pg, pg's size */
  int ndim;       /* root dims */
  tr_mesh_dim_t dims[TR_MESH_MAX_DIMS];
  int nflat;
  tr_mesh_dim_t flats[TR_MESH_MAX_DIMS];
  unsigned flat_mask[TR_MESH_MAX_DIMS]; /* root dims each one covers */
  tr_pg_t** owned;                      /* groups to free */
  int nowned;
  size_t capowned;
  int ndropped;
  char dropped[TR_MESH_MAX_DIMS][TR_MESH_NAME_MAX];
} tr__mesh_root_t;

struct tr_mesh_s {
  tr__mesh_root_t* root;
  int ndim;
  tr_mesh_dim_t dims[TR_MESH_MAX_DIMS];
  unsigned mask[TR_MESH_MAX_DIMS]; /* root dims each dim covers */
  int base; /* group rank (in root->pg) at coordinates 0 */
};

/* Sizes of the mesh's dims into sizes[] (tr_mesh_ndim entries). */
void tr__mesh_sizes(const tr_mesh_t* mesh, int* sizes);

#endif /* TRAINRUN_DTENSOR_INTERNAL_H */
