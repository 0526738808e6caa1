/* dtensor/mesh.c: device meshes -- torchtitan's degrees, the row-major
 * grid over a process group, one group per slice of every dim (and of
 * flattened dims), sub-meshes that share them, lookups and the printout
 * for `trainrun plan`. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/buf.h" /* TR_GROW */
#include "dtensor/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"

const char* const tr_mesh_dim_names[5] = {"pp", "dp_replicate", "dp_shard",
                                          "cp", "tp"};

/* torchtitan's flattened dims: name and parts (in mesh order). */
static const struct {
  const char* name;
  int nparts;
  const char* parts[3];
} k_flats[] = {
    {"dp", 2, {"dp_replicate", "dp_shard"}},
    {"dp_shard_cp", 2, {"dp_shard", "cp"}},
    {"dp_cp", 3, {"dp_replicate", "dp_shard", "cp"}},
};
#define N_FLATS ((int)(sizeof k_flats / sizeof k_flats[0]))

/* ---- degrees ---- */

void tr_mesh_degrees_init(tr_mesh_degrees_t* d) {
  d->pp = 1;
  d->dp_replicate = 1;
  d->dp_shard = -1;
  d->cp = 1;
  d->tp = 1;
  d->keep_size1 = 1;
  d->flatten = 1;
}

static void degrees_array(const tr_mesh_degrees_t* d, int out[5]) {
  out[0] = d->pp;
  out[1] = d->dp_replicate;
  out[2] = d->dp_shard;
  out[3] = d->cp;
  out[4] = d->tp;
}

int tr_mesh_degrees_resolve(tr_mesh_degrees_t* d, int world_size,
                            tr_errmsg_t* err) {
  int deg[5];
  degrees_array(d, deg);
  if (world_size < 1)
    return tr_errmsg_set(err, TR_EINVAL, "world size %d is not positive",
                         world_size);
  for (int i = 0; i < 5; i++)
    if (deg[i] < 1 && !(i == 2 && deg[i] == -1))
      return tr_errmsg_set(
          err, TR_ECONFIG, "parallelism degree %s %d is not positive%s",
          tr_mesh_dim_names[i], deg[i], i == 2 ? " (nor -1)" : "");
  for (int i = 0; i < 5; i++)
    if (deg[i] > world_size)
      return tr_errmsg_set(err, TR_ECONFIG,
                           "parallelism degree %s %d exceeds the world size %d",
                           tr_mesh_dim_names[i], deg[i], world_size);
  /* products in double cannot overflow; exact up to 2^53, and larger ones
   * differ from the world size anyway */
  double others = (double)deg[0] * deg[1] * deg[3] * deg[4];
  if (deg[2] == -1) {
    if (others > world_size || world_size % (int64_t)others)
      return tr_errmsg_set(
          err, TR_ECONFIG,
          "data_parallel_shard_degree -1: the world size %d is not divisible "
          "by pp %d * dp_replicate %d * cp %d * tp %d = %.0f",
          world_size, deg[0], deg[1], deg[3], deg[4], others);
    deg[2] = world_size / (int)others;
  }
  double prod = others * deg[2];
  if (prod != (double)world_size)
    return tr_errmsg_set(err, TR_ECONFIG,
                         "parallelism degrees pp %d * dp_replicate %d * "
                         "dp_shard %d * cp %d * tp %d = %.0f do not match "
                         "the world size %d",
                         deg[0], deg[1], deg[2], deg[3], deg[4], prod,
                         world_size);
  d->dp_shard = deg[2];
  return 0;
}

/* ---- the shared root ---- */

static int root_own(tr__mesh_root_t* r, tr_pg_t* g) {
  if (TR_GROW(r->owned, (size_t)r->nowned + 1, r->capowned) < 0)
    return TR_ENOMEM;
  r->owned[r->nowned++] = g;
  return 0;
}

static void root_unref(tr__mesh_root_t* r) {
  if (!r || __atomic_sub_fetch(&r->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  /* newest first: sub-groups before the groups made earlier */
  for (int i = r->nowned - 1; i >= 0; i--) tr_pg_free(r->owned[i]);
  free(r->owned);
  free(r);
}

/* Coordinate of group rank q on a dim of size `size` and `stride`. */
static int coord_of(int q, int size, int stride) { return (q / stride) % size; }

/* A dim (or flattened dim) with the same slices: same size and stride. */
static int same_slices(const tr_mesh_dim_t* d, int size, int stride) {
  /* size-1 dims all have this rank alone, whatever their stride */
  return d->size == size && (size == 1 || d->stride == stride);
}

static tr_pg_t* root_same_slices(const tr__mesh_root_t* r, int size,
                                 int stride) {
  for (int i = 0; i < r->ndim; i++)
    if (same_slices(&r->dims[i], size, stride)) return r->dims[i].pg;
  for (int i = 0; i < r->nflat; i++)
    if (same_slices(&r->flats[i], size, stride)) return r->flats[i].pg;
  return NULL;
}

/* Fill dim's pg: reuse the groups of a dim with the same slices, or make
 * one group per slice with tr_pg_new_group, every slice in order of its
 * first rank (the same calls on every rank). */
static int root_dim_groups(tr__mesh_root_t* r, tr_mesh_dim_t* dim) {
  dim->coord = coord_of(r->rank, dim->size, dim->stride);
  dim->pg = root_same_slices(r, dim->size, dim->stride);
  if (dim->pg) return 0;
  int* ranks = malloc(sizeof(int) * (size_t)dim->size);
  if (!ranks) return TR_ENOMEM;
  char desc[TR_MESH_NAME_MAX + 8];
  snprintf(desc, sizeof desc, "mesh_%s", dim->name);
  int rc = 0;
  for (int b = 0; b < r->size && rc == 0; b++) {
    if (coord_of(b, dim->size, dim->stride) != 0) continue;
    for (int c = 0; c < dim->size; c++) ranks[c] = b + c * dim->stride;
    tr_pg_t* g = NULL;
    rc = tr_pg_new_group(r->pg, ranks, dim->size, desc, &g);
    if (rc == 0 && g) {
      rc = root_own(r, g);
      if (rc < 0) {
        tr_pg_free(g);
        break;
      }
      dim->pg = g;
    }
  }
  free(ranks);
  if (rc == 0 && !dim->pg) {
    TR_LOG_ERROR(DT, "mesh dim '%s': rank %d is in none of its groups",
                 dim->name, r->rank);
    rc = TR_EINTERNAL;
  }
  return rc;
}

static int check_name(const char* name, tr_errmsg_t* err) {
  if (!name || !*name)
    return tr_errmsg_set(err, TR_EINVAL, "mesh dim names must not be empty");
  if (strlen(name) >= TR_MESH_NAME_MAX)
    return tr_errmsg_set(err, TR_EINVAL,
                         "mesh dim name '%s' is longer than %d bytes", name,
                         TR_MESH_NAME_MAX - 1);
  return 0;
}

/* Is name a dim, a flattened dim or a left-out dim of the root? */
static int root_has_name(const tr__mesh_root_t* r, const char* name) {
  for (int i = 0; i < r->ndim; i++)
    if (!strcmp(r->dims[i].name, name)) return 1;
  for (int i = 0; i < r->nflat; i++)
    if (!strcmp(r->flats[i].name, name)) return 1;
  for (int i = 0; i < r->ndropped; i++)
    if (!strcmp(r->dropped[i], name)) return 1;
  return 0;
}

static void mesh_set_base(tr_mesh_t* m) {
  int base = m->root->rank;
  for (int i = 0; i < m->ndim; i++)
    base -= m->dims[i].coord * m->dims[i].stride;
  m->base = base;
}

/* ---- building meshes ---- */

/* tr_mesh_init with names left out as size 1 recorded (for lookups). */
static int mesh_init(tr_pg_t* pg, int ndim, const int* sizes,
                     const char* const* names, int ndropped,
                     const char* const* dropped, tr_mesh_t** out,
                     tr_errmsg_t* err) {
  *out = NULL;
  if (!pg) return tr_errmsg_set(err, TR_EINVAL, "mesh without a group");
  if (ndim < 0 || ndim > TR_MESH_MAX_DIMS)
    return tr_errmsg_set(err, TR_EINVAL, "a mesh has 0 to %d dims, not %d",
                         TR_MESH_MAX_DIMS, ndim);
  int64_t prod = 1;
  for (int i = 0; i < ndim; i++) {
    TR_CHECK(check_name(names[i], err));
    for (int j = 0; j < i; j++)
      if (!strcmp(names[i], names[j]))
        return tr_errmsg_set(err, TR_EINVAL, "mesh dim name '%s' is repeated",
                             names[i]);
    if (sizes[i] < 1)
      return tr_errmsg_set(err, TR_EINVAL, "mesh dim '%s' has size %d",
                           names[i], sizes[i]);
    prod *= sizes[i];
    if (prod > tr_pg_size(pg)) break;
  }
  if (prod != tr_pg_size(pg)) {
    char shape[256];
    size_t off = 0;
    shape[0] = 0;
    for (int i = 0; i < ndim && off < sizeof shape; i++)
      off += (size_t)snprintf(shape + off, sizeof shape - off, "%s%s %d",
                              i ? " * " : "", names[i], sizes[i]);
    return tr_errmsg_set(
        err, TR_ECONFIG, "mesh %s has %lld ranks, but its group '%s' has %d",
        ndim ? shape : "()", (long long)prod, tr_pg_name(pg), tr_pg_size(pg));
  }
  tr__mesh_root_t* r = calloc(1, sizeof *r);
  tr_mesh_t* m = calloc(1, sizeof *m);
  if (!r || !m) {
    free(r);
    free(m);
    return TR_ENOMEM;
  }
  r->refs = 1;
  r->pg = pg;
  r->rank = tr_pg_rank(pg);
  r->size = tr_pg_size(pg);
  for (int i = 0; i < ndropped && i < TR_MESH_MAX_DIMS; i++)
    snprintf(r->dropped[r->ndropped++], TR_MESH_NAME_MAX, "%s", dropped[i]);
  int stride = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    snprintf(r->dims[i].name, TR_MESH_NAME_MAX, "%s", names[i]);
    r->dims[i].size = sizes[i];
    r->dims[i].stride = stride;
    stride *= sizes[i];
  }
  int rc = 0;
  for (int i = 0; i < ndim && rc == 0; i++) {
    rc = root_dim_groups(r, &r->dims[i]);
    r->ndim = i + 1; /* later dims may share this one's groups */
  }
  r->ndim = ndim;
  if (rc < 0) {
    free(m);
    root_unref(r);
    return tr_errmsg_set(err, rc, "cannot create the groups of the mesh: %s",
                         tr_strerror(rc));
  }
  m->root = r;
  m->ndim = ndim;
  for (int i = 0; i < ndim; i++) {
    m->dims[i] = r->dims[i];
    m->mask[i] = 1u << i;
  }
  mesh_set_base(m);
  *out = m;
  return 0;
}

int tr_mesh_init(tr_pg_t* pg, int ndim, const int* sizes,
                 const char* const* names, tr_mesh_t** out, tr_errmsg_t* err) {
  return mesh_init(pg, ndim, sizes, names, 0, NULL, out, err);
}

/* Flatten root dims given by index (consecutive, adjacent in rank space). */
static int root_flatten(tr__mesh_root_t* r, const int* idx, int n,
                        const char* new_name, tr_errmsg_t* err) {
  if (r->nflat == TR_MESH_MAX_DIMS)
    return tr_errmsg_set(err, TR_ELIMIT, "mesh has %d flattened dims already",
                         TR_MESH_MAX_DIMS);
  unsigned mask = 0;
  int size = 1;
  for (int k = 0; k < n; k++) {
    if (k && idx[k] != idx[k - 1] + 1)
      return tr_errmsg_set(err, TR_EINVAL,
                           "cannot flatten '%s': dims '%s' and '%s' are not "
                           "consecutive in the mesh",
                           new_name, r->dims[idx[k - 1]].name,
                           r->dims[idx[k]].name);
    mask |= 1u << idx[k];
    size *= r->dims[idx[k]].size;
  }
  tr_mesh_dim_t* f = &r->flats[r->nflat];
  memset(f, 0, sizeof *f);
  snprintf(f->name, TR_MESH_NAME_MAX, "%s", new_name);
  f->size = size;
  f->stride = r->dims[idx[n - 1]].stride;
  f->flat = 1;
  int rc = root_dim_groups(r, f);
  if (rc < 0)
    return tr_errmsg_set(err, rc, "cannot create the groups of '%s': %s",
                         new_name, tr_strerror(rc));
  r->flat_mask[r->nflat++] = mask;
  return 0;
}

int tr_mesh_flatten(tr_mesh_t* mesh, const char* const* names, int n,
                    const char* new_name, tr_errmsg_t* err) {
  tr__mesh_root_t* r = mesh->root;
  TR_CHECK(check_name(new_name, err));
  if (root_has_name(r, new_name))
    return tr_errmsg_set(err, TR_EINVAL, "mesh dim name '%s' is in use",
                         new_name);
  if (n < 1 || n > r->ndim)
    return tr_errmsg_set(err, TR_EINVAL, "cannot flatten %d dims into '%s'", n,
                         new_name);
  int idx[TR_MESH_MAX_DIMS];
  for (int k = 0; k < n; k++) {
    idx[k] = -1;
    for (int i = 0; i < r->ndim; i++)
      if (!strcmp(r->dims[i].name, names[k])) idx[k] = i;
    if (idx[k] < 0)
      return tr_errmsg_set(err, TR_EINVAL,
                           "cannot flatten '%s': the mesh has no dim '%s'",
                           new_name, names[k]);
  }
  return root_flatten(r, idx, n, new_name, err);
}

int tr_mesh_from_degrees(tr_pg_t* pg, const tr_mesh_degrees_t* d,
                         tr_mesh_t** out, tr_errmsg_t* err) {
  *out = NULL;
  if (!pg) return tr_errmsg_set(err, TR_EINVAL, "mesh without a group");
  if (d->dp_shard == -1)
    return tr_errmsg_set(err, TR_EINVAL,
                         "mesh degrees not resolved: dp_shard -1");
  tr_mesh_degrees_t rd = *d; /* resolved: this only checks them */
  TR_CHECK(tr_mesh_degrees_resolve(&rd, tr_pg_size(pg), err));
  int deg[5], sizes[5], n = 0, nd = 0;
  const char* names[5];
  const char* dropped[5 + N_FLATS];
  degrees_array(&rd, deg);
  for (int i = 0; i < 5; i++) {
    if (deg[i] == 1 && !rd.keep_size1) {
      dropped[nd++] = tr_mesh_dim_names[i];
      continue;
    }
    names[n] = tr_mesh_dim_names[i];
    sizes[n++] = deg[i];
  }
  if (rd.flatten && !rd.keep_size1)
    for (int f = 0; f < N_FLATS; f++) {
      int present = 0;
      for (int p = 0; p < k_flats[f].nparts; p++)
        for (int i = 0; i < n; i++)
          if (!strcmp(names[i], k_flats[f].parts[p])) present++;
      if (!present) dropped[nd++] = k_flats[f].name;
    }
  tr_mesh_t* m = NULL;
  TR_CHECK(mesh_init(pg, n, sizes, names, nd, dropped, &m, err));
  for (int f = 0; rd.flatten && f < N_FLATS; f++) {
    int idx[3], k = 0;
    for (int p = 0; p < k_flats[f].nparts; p++) {
      int i = tr_mesh_dim_index(m, k_flats[f].parts[p]);
      if (i >= 0) idx[k++] = i;
    }
    if (!k) continue;
    int rc = root_flatten(m->root, idx, k, k_flats[f].name, err);
    if (rc < 0) {
      tr_mesh_free(m);
      return rc;
    }
  }
  *out = m;
  return 0;
}

/* A dim of mesh, else a flattened dim of its root: its index into
 * mesh->dims (>= 0) or into root->flats (-2 - index); -1 when none. */
static int find_dim(const tr_mesh_t* m, const char* name) {
  for (int i = 0; i < m->ndim; i++)
    if (!strcmp(m->dims[i].name, name)) return i;
  for (int i = 0; i < m->root->nflat; i++)
    if (!strcmp(m->root->flats[i].name, name)) return -2 - i;
  return -1;
}

int tr_mesh_sub(const tr_mesh_t* mesh, const char* const* names, int n,
                tr_mesh_t** out, tr_errmsg_t* err) {
  *out = NULL;
  if (n < 0 || n > TR_MESH_MAX_DIMS)
    return tr_errmsg_set(err, TR_EINVAL, "a mesh has 0 to %d dims, not %d",
                         TR_MESH_MAX_DIMS, n);
  tr_mesh_t* m = calloc(1, sizeof *m);
  if (!m) return TR_ENOMEM;
  m->root = mesh->root;
  unsigned used = 0;
  for (int k = 0; k < n; k++) {
    int i = names[k] ? find_dim(mesh, names[k]) : -1;
    if (i == -1) {
      free(m);
      return tr_errmsg_set(err, TR_EINVAL, "the mesh has no dim '%s'",
                           names[k] ? names[k] : "(null)");
    }
    const tr_mesh_dim_t* d =
        i >= 0 ? &mesh->dims[i] : &mesh->root->flats[-2 - i];
    unsigned mask = i >= 0 ? mesh->mask[i] : mesh->root->flat_mask[-2 - i];
    if (mask & used) {
      free(m);
      return tr_errmsg_set(err, TR_EINVAL,
                           "mesh dim '%s' overlaps an earlier dim of the "
                           "sub-mesh",
                           names[k]);
    }
    if (k && d->stride >= m->dims[k - 1].stride) {
      free(m);
      return tr_errmsg_set(err, TR_EINVAL,
                           "sub-mesh dims must keep the mesh's order: '%s' "
                           "comes before '%s'",
                           names[k], names[k - 1]);
    }
    used |= mask;
    m->dims[k] = *d;
    m->mask[k] = mask;
  }
  m->ndim = n;
  mesh_set_base(m);
  __atomic_add_fetch(&m->root->refs, 1, __ATOMIC_RELAXED);
  *out = m;
  return 0;
}

void tr_mesh_free(tr_mesh_t* mesh) {
  if (!mesh) return;
  root_unref(mesh->root);
  free(mesh);
}

/* ---- lookups ---- */

int tr_mesh_ndim(const tr_mesh_t* mesh) { return mesh->ndim; }

int tr_mesh_size(const tr_mesh_t* mesh) {
  int n = 1;
  for (int i = 0; i < mesh->ndim; i++) n *= mesh->dims[i].size;
  return n;
}

void tr__mesh_sizes(const tr_mesh_t* mesh, int* sizes) {
  for (int i = 0; i < mesh->ndim; i++) sizes[i] = mesh->dims[i].size;
}

const tr_mesh_dim_t* tr_mesh_dim(const tr_mesh_t* mesh, int i) {
  return i >= 0 && i < mesh->ndim ? &mesh->dims[i] : NULL;
}

int tr_mesh_dim_index(const tr_mesh_t* mesh, const char* name) {
  for (int i = 0; i < mesh->ndim; i++)
    if (!strcmp(mesh->dims[i].name, name)) return i;
  return -1;
}

const tr_mesh_dim_t* tr_mesh_find(const tr_mesh_t* mesh, const char* name) {
  int i = find_dim(mesh, name);
  if (i == -1) return NULL;
  return i >= 0 ? &mesh->dims[i] : &mesh->root->flats[-2 - i];
}

tr_pg_t* tr_mesh_dim_pg(const tr_mesh_t* mesh, const char* name) {
  const tr_mesh_dim_t* d = tr_mesh_find(mesh, name);
  return d ? d->pg : NULL;
}

static int is_dropped(const tr_mesh_t* mesh, const char* name) {
  for (int i = 0; i < mesh->root->ndropped; i++)
    if (!strcmp(mesh->root->dropped[i], name)) return 1;
  return 0;
}

int tr_mesh_dim_size(const tr_mesh_t* mesh, const char* name) {
  const tr_mesh_dim_t* d = tr_mesh_find(mesh, name);
  if (d) return d->size;
  return is_dropped(mesh, name) ? 1 : TR_ENOTFOUND;
}

int tr_mesh_dim_coord(const tr_mesh_t* mesh, const char* name) {
  const tr_mesh_dim_t* d = tr_mesh_find(mesh, name);
  if (d) return d->coord;
  return is_dropped(mesh, name) ? 0 : TR_ENOTFOUND;
}

tr_pg_t* tr_mesh_pg(const tr_mesh_t* mesh) { return mesh->root->pg; }

void tr_mesh_coords(const tr_mesh_t* mesh, int* coords) {
  for (int i = 0; i < mesh->ndim; i++) coords[i] = mesh->dims[i].coord;
}

int tr_mesh_global_rank(const tr_mesh_t* mesh, const int* coords) {
  int q = mesh->base;
  for (int i = 0; i < mesh->ndim; i++) {
    if (coords[i] < 0 || coords[i] >= mesh->dims[i].size) return TR_EINVAL;
    q += coords[i] * mesh->dims[i].stride;
  }
  return tr_pg_global_rank(mesh->root->pg, q);
}

int tr_mesh_coords_of(const tr_mesh_t* mesh, int g, int* coords) {
  int q = tr_pg_group_rank(mesh->root->pg, g);
  if (q < 0) return TR_ENOTFOUND;
  int back = mesh->base;
  for (int i = 0; i < mesh->ndim; i++) {
    const tr_mesh_dim_t* d = &mesh->dims[i];
    coords[i] = coord_of(q, d->size, d->stride);
    back += coords[i] * d->stride;
  }
  return back == q ? 0 : TR_ENOTFOUND;
}

/* ---- printing ---- */

typedef struct {
  const char* name;
  int size, stride;
  char parts[128]; /* flattened dims: the parts' names */
} print_dim_t;

#define PRINT_MAX_GROUPS 16

static void print_dims(FILE* f, const print_dim_t* dims, int n, int world,
                       tr_pg_t* pg) {
  int w = 4;
  for (int i = 0; i < n; i++)
    if ((int)strlen(dims[i].name) > w) w = (int)strlen(dims[i].name);
  for (int i = 0; i < n; i++) {
    const print_dim_t* d = &dims[i];
    fprintf(f, "  %-*s  size %d  stride %d  groups", w, d->name, d->size,
            d->stride);
    int ngroups = world / d->size, shown = 0;
    for (int b = 0; b < world && shown < PRINT_MAX_GROUPS; b++) {
      if (coord_of(b, d->size, d->stride) != 0) continue;
      fputs(" [", f);
      for (int c = 0; c < d->size; c++) {
        int q = b + c * d->stride;
        fprintf(f, c ? " %d" : "%d", pg ? tr_pg_global_rank(pg, q) : q);
      }
      fputc(']', f);
      shown++;
    }
    if (ngroups > shown) fprintf(f, " ... (%d groups)", ngroups);
    if (d->parts[0]) fprintf(f, "  (flattened: %s)", d->parts);
    fputc('\n', f);
  }
}

static void join_parts(char* out, size_t n, const char* const* parts, int k) {
  size_t off = 0;
  out[0] = 0;
  for (int i = 0; i < k && off < n; i++)
    off += (size_t)snprintf(out + off, n - off, i ? " %s" : "%s", parts[i]);
}

int tr_mesh_describe(const tr_mesh_t* mesh, FILE* f) {
  const tr__mesh_root_t* r = mesh->root;
  print_dim_t dims[2 * TR_MESH_MAX_DIMS];
  int n = 0;
  if (mesh->ndim == r->ndim && mesh->base == 0)
    fprintf(f, "mesh: %d ranks as ", r->size);
  else
    fprintf(f, "mesh: %d of %d ranks as ", tr_mesh_size(mesh), r->size);
  for (int i = 0; i < mesh->ndim; i++)
    fprintf(f, i ? " x %s %d" : "%s %d", mesh->dims[i].name,
            mesh->dims[i].size);
  if (!mesh->ndim) fputs("a single point", f);
  if (r->ndropped) {
    fputs(" (size 1, left out:", f);
    for (int i = 0; i < r->ndropped; i++) fprintf(f, " %s", r->dropped[i]);
    fputc(')', f);
  }
  fputc('\n', f);
  for (int i = 0; i < mesh->ndim; i++, n++) {
    dims[n].name = mesh->dims[i].name;
    dims[n].size = mesh->dims[i].size;
    dims[n].stride = mesh->dims[i].stride;
    dims[n].parts[0] = 0;
    if (mesh->dims[i].flat) {
      const char* parts[TR_MESH_MAX_DIMS];
      int k = 0;
      for (int j = 0; j < r->ndim; j++)
        if (mesh->mask[i] & (1u << j)) parts[k++] = r->dims[j].name;
      join_parts(dims[n].parts, sizeof dims[n].parts, parts, k);
    }
  }
  /* the root's flattened dims (a sub-mesh may hold some as dims) */
  for (int i = 0; i < r->nflat; i++) {
    if (tr_mesh_dim_index(mesh, r->flats[i].name) >= 0) continue;
    if (mesh->ndim != r->ndim) continue; /* only the root lists them all */
    const char* parts[TR_MESH_MAX_DIMS];
    int k = 0;
    for (int j = 0; j < r->ndim; j++)
      if (r->flat_mask[i] & (1u << j)) parts[k++] = r->dims[j].name;
    dims[n].name = r->flats[i].name;
    dims[n].size = r->flats[i].size;
    dims[n].stride = r->flats[i].stride;
    join_parts(dims[n].parts, sizeof dims[n].parts, parts, k);
    n++;
  }
  print_dims(f, dims, n, r->size, r->pg);
  return ferror(f) ? TR_EIO : 0;
}

int tr_mesh_describe_degrees(const tr_mesh_degrees_t* d, int world_size,
                             FILE* f, tr_errmsg_t* err) {
  tr_mesh_degrees_t rd = *d;
  TR_CHECK(tr_mesh_degrees_resolve(&rd, world_size, err));
  int deg[5], n = 0, nd = 0;
  const char* dropped[5 + N_FLATS];
  print_dim_t dims[5 + N_FLATS];
  degrees_array(&rd, deg);
  int stride = world_size;
  for (int i = 0; i < 5; i++) {
    stride /= deg[i];
    if (deg[i] == 1 && !rd.keep_size1) {
      dropped[nd++] = tr_mesh_dim_names[i];
      continue;
    }
    dims[n].name = tr_mesh_dim_names[i];
    dims[n].size = deg[i];
    dims[n].stride = stride;
    dims[n].parts[0] = 0;
    n++;
  }
  int nroot = n;
  for (int fl = 0; rd.flatten && fl < N_FLATS; fl++) {
    const char* parts[3];
    int k = 0, size = 1, last = -1;
    for (int p = 0; p < k_flats[fl].nparts; p++)
      for (int i = 0; i < nroot; i++)
        if (!strcmp(dims[i].name, k_flats[fl].parts[p])) {
          parts[k++] = dims[i].name;
          size *= dims[i].size;
          last = i;
        }
    if (!k) {
      dropped[nd++] = k_flats[fl].name;
      continue;
    }
    dims[n].name = k_flats[fl].name;
    dims[n].size = size;
    dims[n].stride = dims[last].stride;
    join_parts(dims[n].parts, sizeof dims[n].parts, parts, k);
    n++;
  }
  fprintf(f, "mesh: %d ranks as ", world_size);
  for (int i = 0; i < nroot; i++)
    fprintf(f, i ? " x %s %d" : "%s %d", dims[i].name, dims[i].size);
  if (nd) {
    fputs(" (size 1, left out:", f);
    for (int i = 0; i < nd; i++) fprintf(f, " %s", dropped[i]);
    fputc(')', f);
  }
  fputc('\n', f);
  print_dims(f, dims, n, world_size, NULL);
  return ferror(f) ? TR_EIO : 0;
}
