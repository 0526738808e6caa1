/* tests/check_dtensor.c: device meshes, placements and redistribute.
 * In one process (fake backend): degrees and their errors, mesh groups
 * (members, coordinates, flattened dims, sub-meshes), the printout, the
 * placement math with uneven and empty pieces, the parameter-layout seam
 * and which collectives each transition issues. On 2, 3 and 4 forked Gloo
 * ranks: every group communicates with the ranks it should, and every
 * redistribute transition (1-d and 2-d meshes, sub-meshes, size-1 dims,
 * uneven and empty pieces, sync, async and in place) against the reference
 * each rank computes from the whole tensor. */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/pg_suite.h"
#include "trainrun/cp.h"
#include "trainrun/dtensor.h"
#include "trainrun/error.h"
#include "trainrun/kernels.h"
#include "trainrun/log.h"

/* ---- helpers ---- */

static tr_pg_t* fake_world(int rank, int size) {
  tr_pg_opts_t o;
  tr_pg_opts_init(&o);
  o.rank = rank;
  o.world_size = size;
  o.backend = "fake";
  tr_pg_t* pg = NULL;
  ck_assert_int_eq(tr_pg_new(&o, &pg), 0);
  return pg;
}

/* Global ranks of a group, as "0 2" */
static const char* members(tr_pg_t* g, char* buf, size_t n) {
  size_t off = 0;
  buf[0] = 0;
  for (int i = 0; i < tr_pg_size(g) && off < n; i++)
    off += (size_t)snprintf(buf + off, n - off, i ? " %d" : "%d",
                            tr_pg_global_rank(g, i));
  return buf;
}

static const tr_placement_t S0 = {TR_PLACEMENT_SHARD, 0, TR_PG_SUM, 1};
static const tr_placement_t S1 = {TR_PLACEMENT_SHARD, 1, TR_PG_SUM, 1};
static const tr_placement_t S2 = {TR_PLACEMENT_SHARD, 2, TR_PG_SUM, 1};
static const tr_placement_t R = {TR_PLACEMENT_REPLICATE, 0, TR_PG_SUM, 0};
static const tr_placement_t PSUM = {TR_PLACEMENT_PARTIAL, 0, TR_PG_SUM, 0};
static const tr_placement_t PAVG = {TR_PLACEMENT_PARTIAL, 0, TR_PG_AVG, 0};
static const tr_placement_t PMAX = {TR_PLACEMENT_PARTIAL, 0, TR_PG_MAX, 0};
static const tr_placement_t PMIN = {TR_PLACEMENT_PARTIAL, 0, TR_PG_MIN, 0};

/* ---- degrees ---- */

START_TEST(test_degrees) {
  tr_mesh_degrees_t d;
  tr_errmsg_t err;
  tr_mesh_degrees_init(&d);
  ck_assert_int_eq(d.dp_shard, -1);
  ck_assert_int_eq(tr_mesh_degrees_resolve(&d, 8, &err), 0);
  ck_assert_int_eq(d.dp_shard, 8);
  d.dp_shard = -1;
  d.tp = 2;
  d.pp = 2;
  ck_assert_int_eq(tr_mesh_degrees_resolve(&d, 8, &err), 0);
  ck_assert_int_eq(d.dp_shard, 2);

  d.dp_shard = 3;
  ck_assert_int_eq(tr_mesh_degrees_resolve(&d, 8, &err), TR_ECONFIG);
  ck_assert_str_eq(err.message,
                   "parallelism degrees pp 2 * dp_replicate 1 * dp_shard 3 "
                   "* cp 1 * tp 2 = 12 do not match the world size 8");
  tr_mesh_degrees_init(&d);
  d.tp = 4;
  ck_assert_int_eq(tr_mesh_degrees_resolve(&d, 6, &err), TR_ECONFIG);
  ck_assert_str_eq(err.message,
                   "data_parallel_shard_degree -1: the world size 6 is not "
                   "divisible by pp 1 * dp_replicate 1 * cp 1 * tp 4 = 4");
  d.tp = 0;
  ck_assert_int_eq(tr_mesh_degrees_resolve(&d, 6, &err), TR_ECONFIG);
  ck_assert_str_eq(err.message, "parallelism degree tp 0 is not positive");
  tr_mesh_degrees_init(&d);
  d.dp_shard = -2;
  ck_assert_int_eq(tr_mesh_degrees_resolve(&d, 6, &err), TR_ECONFIG);
  ck_assert_str_eq(err.message,
                   "parallelism degree dp_shard -2 is not positive (nor -1)");
  tr_mesh_degrees_init(&d);
  d.dp_replicate = 16;
  ck_assert_int_eq(tr_mesh_degrees_resolve(&d, 8, &err), TR_ECONFIG);
  ck_assert_str_eq(err.message,
                   "parallelism degree dp_replicate 16 exceeds the world "
                   "size 8");
  /* huge degrees do not overflow */
  tr_mesh_degrees_init(&d);
  d.pp = d.dp_replicate = d.cp = d.tp = 65536;
  d.dp_shard = 65536;
  ck_assert_int_eq(tr_mesh_degrees_resolve(&d, 2000000000, &err), TR_ECONFIG);

  /* a mesh over a group of another size says so */
  tr_pg_t* w = fake_world(0, 8);
  tr_mesh_degrees_init(&d);
  d.dp_shard = 3;
  tr_mesh_t* m = (tr_mesh_t*)1;
  ck_assert_int_eq(tr_mesh_from_degrees(w, &d, &m, &err), TR_ECONFIG);
  ck_assert_ptr_null(m);
  ck_assert_str_eq(err.message,
                   "parallelism degrees pp 1 * dp_replicate 1 * dp_shard 3 "
                   "* cp 1 * tp 1 = 3 do not match the world size 8");
  int sizes[2] = {2, 3};
  const char* names[2] = {"dp", "tp"};
  ck_assert_int_eq(tr_mesh_init(w, 2, sizes, names, &m, &err), TR_ECONFIG);
  ck_assert_str_eq(err.message,
                   "mesh dp 2 * tp 3 has 6 ranks, but its group '0' has 8");
  const char* same[2] = {"dp", "dp"};
  sizes[1] = 4;
  ck_assert_int_eq(tr_mesh_init(w, 2, sizes, same, &m, &err), TR_EINVAL);
  ck_assert_str_eq(err.message, "mesh dim name 'dp' is repeated");
  tr_pg_free(w);
}
END_TEST

/* ---- meshes in one process ---- */

/* 2 x 2 on every rank of a fake world of 4: groups, coordinates, lookups */
START_TEST(test_mesh_2x2) {
  int r = _i;
  tr_pg_t* w = fake_world(r, 4);
  int sizes[2] = {2, 2};
  const char* names[2] = {"dp", "tp"};
  tr_mesh_t* m;
  ck_assert_int_eq(tr_mesh_init(w, 2, sizes, names, &m, NULL), 0);
  ck_assert_int_eq(tr_mesh_ndim(m), 2);
  ck_assert_int_eq(tr_mesh_size(m), 4);
  ck_assert_ptr_eq(tr_mesh_pg(m), w);
  char buf[64], want[64];
  /* dp groups: [0 2] [1 3]; tp groups: [0 1] [2 3] */
  snprintf(want, sizeof want, "%d %d", r % 2, r % 2 + 2);
  ck_assert_str_eq(members(tr_mesh_dim_pg(m, "dp"), buf, sizeof buf), want);
  snprintf(want, sizeof want, "%d %d", r / 2 * 2, r / 2 * 2 + 1);
  ck_assert_str_eq(members(tr_mesh_dim_pg(m, "tp"), buf, sizeof buf), want);
  ck_assert_int_eq(tr_mesh_dim_coord(m, "dp"), r / 2);
  ck_assert_int_eq(tr_mesh_dim_coord(m, "tp"), r % 2);
  /* group rank == coordinate */
  ck_assert_int_eq(tr_pg_rank(tr_mesh_dim_pg(m, "dp")), r / 2);
  ck_assert_int_eq(tr_pg_rank(tr_mesh_dim_pg(m, "tp")), r % 2);
  ck_assert_str_eq(tr_pg_desc(tr_mesh_dim_pg(m, "tp")), "mesh_tp");
  const tr_mesh_dim_t* d0 = tr_mesh_dim(m, 0);
  ck_assert_str_eq(d0->name, "dp");
  ck_assert_int_eq(d0->stride, 2);
  ck_assert_int_eq(tr_mesh_dim(m, 1)->stride, 1);
  ck_assert_ptr_null(tr_mesh_dim(m, 2));
  ck_assert_int_eq(tr_mesh_dim_index(m, "tp"), 1);
  ck_assert_int_eq(tr_mesh_dim_index(m, "pp"), -1);
  ck_assert_ptr_null(tr_mesh_dim_pg(m, "pp"));
  ck_assert_int_eq(tr_mesh_dim_size(m, "pp"), TR_ENOTFOUND);
  int c[2] = {1, 0}, back[2];
  ck_assert_int_eq(tr_mesh_global_rank(m, c), 2);
  c[1] = 2;
  ck_assert_int_eq(tr_mesh_global_rank(m, c), TR_EINVAL);
  ck_assert_int_eq(tr_mesh_coords_of(m, 3, back), 0);
  ck_assert_int_eq(back[0], 1);
  ck_assert_int_eq(back[1], 1);
  ck_assert_int_eq(tr_mesh_coords_of(m, 4, back), TR_ENOTFOUND);

  /* the tp sub-mesh: the slice through this rank */
  tr_mesh_t* tp;
  const char* tpn[1] = {"tp"};
  ck_assert_int_eq(tr_mesh_sub(m, tpn, 1, &tp, NULL), 0);
  ck_assert_int_eq(tr_mesh_ndim(tp), 1);
  ck_assert_ptr_eq(tr_mesh_dim_pg(tp, "tp"), tr_mesh_dim_pg(m, "tp"));
  ck_assert_ptr_null(tr_mesh_dim_pg(tp, "dp"));
  int c1 = 1;
  ck_assert_int_eq(tr_mesh_global_rank(tp, &c1), r / 2 * 2 + 1);
  int other = (r + 2) % 4; /* another dp slice */
  ck_assert_int_eq(tr_mesh_coords_of(tp, other, back), TR_ENOTFOUND);
  ck_assert_int_eq(tr_mesh_coords_of(tp, r ^ 1, back), 0);
  ck_assert_int_eq(back[0], (r ^ 1) % 2);
  /* flatten both into "all": one group of every rank */
  tr_errmsg_t err;
  ck_assert_int_eq(tr_mesh_flatten(tp, names, 2, "all", &err), 0);
  ck_assert_str_eq(members(tr_mesh_dim_pg(m, "all"), buf, sizeof buf),
                   "0 1 2 3");
  ck_assert_int_eq(tr_mesh_dim_coord(tp, "all"), r);
  ck_assert_int_eq(tr_mesh_find(m, "all")->flat, 1);
  ck_assert_int_eq(tr_mesh_flatten(m, names, 2, "tp", &err), TR_EINVAL);
  ck_assert_str_eq(err.message, "mesh dim name 'tp' is in use");
  const char* rev[2] = {"tp", "dp"};
  ck_assert_int_eq(tr_mesh_flatten(m, rev, 2, "x", &err), TR_EINVAL);
  ck_assert_str_eq(err.message,
                   "cannot flatten 'x': dims 'tp' and 'dp' are not "
                   "consecutive in the mesh");
  tr_mesh_t* s = (tr_mesh_t*)1;
  ck_assert_int_eq(tr_mesh_sub(m, rev, 2, &s, &err), TR_EINVAL);
  ck_assert_ptr_null(s);
  ck_assert_str_eq(err.message,
                   "sub-mesh dims must keep the mesh's order: 'dp' comes "
                   "before 'tp'");
  const char* ov[2] = {"all", "tp"};
  ck_assert_int_eq(tr_mesh_sub(m, ov, 2, &s, &err), TR_EINVAL);
  ck_assert_str_eq(err.message,
                   "mesh dim 'tp' overlaps an earlier dim of the sub-mesh");
  const char* unk[1] = {"ep"};
  ck_assert_int_eq(tr_mesh_sub(m, unk, 1, &s, &err), TR_EINVAL);
  ck_assert_str_eq(err.message, "the mesh has no dim 'ep'");
  /* 2 x 2 x 1: the size-1 dim's groups hold this rank alone */
  tr_mesh_t* m3;
  int s3[3] = {2, 2, 1};
  const char* n3[3] = {"dp", "tp", "cp"};
  ck_assert_int_eq(tr_mesh_init(w, 3, s3, n3, &m3, NULL), 0);
  snprintf(want, sizeof want, "%d %d", r % 2, r % 2 + 2);
  ck_assert_str_eq(members(tr_mesh_dim_pg(m3, "dp"), buf, sizeof buf), want);
  snprintf(want, sizeof want, "%d %d", r / 2 * 2, r / 2 * 2 + 1);
  ck_assert_str_eq(members(tr_mesh_dim_pg(m3, "tp"), buf, sizeof buf), want);
  snprintf(want, sizeof want, "%d", r);
  ck_assert_str_eq(members(tr_mesh_dim_pg(m3, "cp"), buf, sizeof buf), want);
  ck_assert_int_eq(tr_mesh_dim(m3, 2)->stride, 1);
  ck_assert_int_eq(tr_mesh_dim(m3, 1)->stride, 1);
  ck_assert_int_eq(tr_mesh_dim_coord(m3, "cp"), 0);
  int c3[3] = {1, 1, 0};
  ck_assert_int_eq(tr_mesh_global_rank(m3, c3), 3);
  tr_mesh_free(m3);
  /* the sub-mesh keeps the groups alive after the root is gone */
  tr_mesh_free(m);
  ck_assert_int_eq(tr_pg_size(tr_mesh_dim_pg(tp, "tp")), 2);
  tr_mesh_free(tp);
  tr_pg_free(w);
}
END_TEST

/* torchtitan's mesh from degrees: pp 2 x dp_shard 2 x tp 2 on 8 ranks, with
 * and without the size-1 dims, and the flattened dims */
START_TEST(test_mesh_degrees) {
  int keep = _i;
  for (int r = 0; r < 8; r++) {
    tr_pg_t* w = fake_world(r, 8);
    tr_mesh_degrees_t d;
    tr_mesh_degrees_init(&d);
    d.pp = 2;
    d.tp = 2;
    d.keep_size1 = keep;
    tr_mesh_t* m;
    tr_errmsg_t err;
    /* a mesh takes resolved degrees (a job's config solves them) */
    ck_assert_int_eq(tr_mesh_from_degrees(w, &d, &m, &err), TR_EINVAL);
    ck_assert_str_eq(err.message, "mesh degrees not resolved: dp_shard -1");
    ck_assert_int_eq(tr_mesh_degrees_resolve(&d, 8, &err), 0);
    ck_assert_int_eq(tr_mesh_from_degrees(w, &d, &m, &err), 0);
    ck_assert_int_eq(d.dp_shard, 2); /* not modified */
    ck_assert_int_eq(tr_mesh_ndim(m), keep ? 5 : 3);
    for (int i = 0, k = 0; i < 5; i++) {
      if (!keep && (i == 1 || i == 3)) continue;
      ck_assert_str_eq(tr_mesh_dim(m, k++)->name, tr_mesh_dim_names[i]);
    }
    char buf[64], want[64];
    /* pp: [r%4, r%4+4]; dp_shard: stride 2; tp: stride 1 */
    snprintf(want, sizeof want, "%d %d", r % 4, r % 4 + 4);
    ck_assert_str_eq(members(tr_mesh_dim_pg(m, "pp"), buf, sizeof buf), want);
    int b = r / 4 * 4 + r % 2;
    snprintf(want, sizeof want, "%d %d", b, b + 2);
    ck_assert_str_eq(members(tr_mesh_dim_pg(m, "dp_shard"), buf, sizeof buf),
                     want);
    snprintf(want, sizeof want, "%d %d", r / 2 * 2, r / 2 * 2 + 1);
    ck_assert_str_eq(members(tr_mesh_dim_pg(m, "tp"), buf, sizeof buf), want);
    /* dp = dp_replicate x dp_shard shares dp_shard's groups */
    ck_assert_ptr_eq(tr_mesh_dim_pg(m, "dp"), tr_mesh_dim_pg(m, "dp_shard"));
    ck_assert_ptr_eq(tr_mesh_dim_pg(m, "dp_shard_cp"),
                     tr_mesh_dim_pg(m, "dp_shard"));
    ck_assert_int_eq(tr_mesh_dim_size(m, "dp"), 2);
    ck_assert_int_eq(tr_mesh_dim_size(m, "dp_replicate"), 1);
    ck_assert_int_eq(tr_mesh_dim_coord(m, "dp_replicate"), 0);
    ck_assert_int_eq(tr_mesh_dim_size(m, "cp"), 1);
    ck_assert_int_eq(tr_mesh_dim_size(m, "ep"), TR_ENOTFOUND);
    ck_assert_int_eq(tr_mesh_dim_coord(m, "pp"), r / 4);
    if (keep) {
      snprintf(want, sizeof want, "%d", r);
      ck_assert_str_eq(members(tr_mesh_dim_pg(m, "cp"), buf, sizeof buf), want);
      /* two size-1 dims with the same slices share groups */
      ck_assert_ptr_eq(tr_mesh_dim_pg(m, "cp"),
                       tr_mesh_dim_pg(m, "dp_replicate"));
    } else {
      ck_assert_ptr_null(tr_mesh_dim_pg(m, "cp"));
    }
    /* HSDP's 2-d sub-mesh */
    tr_mesh_t* dp;
    const char* dn[2] = {"dp_replicate", "dp_shard"};
    ck_assert_int_eq(tr_mesh_sub(m, dn, keep ? 2 : 1, &dp, &err) == 0, keep);
    if (!keep) {
      ck_assert_str_eq(err.message, "the mesh has no dim 'dp_replicate'");
      ck_assert_int_eq(tr_mesh_sub(m, dn + 1, 1, &dp, &err), 0);
    }
    ck_assert_int_eq(tr_mesh_size(dp), 2);
    tr_mesh_free(dp);
    tr_mesh_free(m);
    tr_pg_free(w);
  }
}
END_TEST

/* HSDP 2 x 2 with tp 2 on 8 ranks: "dp" is a new group of 4 */
START_TEST(test_mesh_hsdp_flat) {
  for (int r = 0; r < 8; r++) {
    tr_pg_t* w = fake_world(r, 8);
    tr_mesh_degrees_t d;
    tr_mesh_degrees_init(&d);
    d.dp_replicate = 2;
    d.tp = 2;
    ck_assert_int_eq(tr_mesh_degrees_resolve(&d, 8, NULL), 0);
    tr_mesh_t* m;
    ck_assert_int_eq(tr_mesh_from_degrees(w, &d, &m, NULL), 0);
    char buf[64], want[64];
    int b = r % 2;
    snprintf(want, sizeof want, "%d %d %d %d", b, b + 2, b + 4, b + 6);
    ck_assert_str_eq(members(tr_mesh_dim_pg(m, "dp"), buf, sizeof buf), want);
    ck_assert_int_eq(tr_mesh_dim_coord(m, "dp"), r / 2);
    ck_assert_ptr_eq(tr_mesh_dim_pg(m, "dp_cp"), tr_mesh_dim_pg(m, "dp"));
    snprintf(want, sizeof want, "%d %d", r % 4, r % 4 + 4);
    ck_assert_str_eq(
        members(tr_mesh_dim_pg(m, "dp_replicate"), buf, sizeof buf), want);
    tr_mesh_free(m);
    tr_pg_free(w);
  }
}
END_TEST

static char* describe_mesh(tr_mesh_t* m) {
  char* s = NULL;
  size_t n = 0;
  FILE* f = open_memstream(&s, &n);
  ck_assert_int_eq(tr_mesh_describe(m, f), 0);
  fclose(f);
  return s;
}

START_TEST(test_describe) {
  tr_mesh_degrees_t d;
  tr_mesh_degrees_init(&d);
  d.tp = 2;
  char* s = NULL;
  size_t n = 0;
  FILE* f = open_memstream(&s, &n);
  ck_assert_int_eq(tr_mesh_describe_degrees(&d, 4, f, NULL), 0);
  fclose(f);
  const char* want =
      "mesh: 4 ranks as pp 1 x dp_replicate 1 x dp_shard 2 x cp 1 x tp 2\n"
      "  pp            size 1  stride 4  groups [0] [1] [2] [3]\n"
      "  dp_replicate  size 1  stride 4  groups [0] [1] [2] [3]\n"
      "  dp_shard      size 2  stride 2  groups [0 2] [1 3]\n"
      "  cp            size 1  stride 2  groups [0] [1] [2] [3]\n"
      "  tp            size 2  stride 1  groups [0 1] [2 3]\n"
      "  dp            size 2  stride 2  groups [0 2] [1 3]  (flattened: "
      "dp_replicate dp_shard)\n"
      "  dp_shard_cp   size 2  stride 2  groups [0 2] [1 3]  (flattened: "
      "dp_shard cp)\n"
      "  dp_cp         size 2  stride 2  groups [0 2] [1 3]  (flattened: "
      "dp_replicate dp_shard cp)\n";
  ck_assert_str_eq(s, want);
  /* the mesh itself prints the same, on any rank */
  tr_pg_t* w = fake_world(3, 4);
  tr_mesh_t* m;
  tr_mesh_degrees_t rd = d;
  ck_assert_int_eq(tr_mesh_degrees_resolve(&rd, 4, NULL), 0);
  ck_assert_int_eq(tr_mesh_from_degrees(w, &rd, &m, NULL), 0);
  char* s2 = describe_mesh(m);
  ck_assert_str_eq(s2, want);
  free(s2);
  /* a sub-mesh: its dims over the whole root */
  tr_mesh_t* tp;
  const char* tpn[1] = {"tp"};
  ck_assert_int_eq(tr_mesh_sub(m, tpn, 1, &tp, NULL), 0);
  s2 = describe_mesh(tp);
  ck_assert_str_eq(s2,
                   "mesh: 2 of 4 ranks as tp 2\n"
                   "  tp    size 2  stride 1  groups [0 1] [2 3]\n");
  free(s2);
  tr_mesh_free(tp);
  tr_mesh_free(m);
  tr_pg_free(w);
  free(s);

  /* size-1 dims left out; many groups are cut short */
  d.keep_size1 = 0;
  d.tp = 1;
  s = NULL;
  f = open_memstream(&s, &n);
  ck_assert_int_eq(tr_mesh_describe_degrees(&d, 40, f, NULL), 0);
  fclose(f);
  ck_assert_str_eq(s,
                   "mesh: 40 ranks as dp_shard 40 (size 1, left out: pp "
                   "dp_replicate cp tp)\n"
                   "  dp_shard     size 40  stride 1  groups [0 1 2 3 4 5 6 "
                   "7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 "
                   "26 27 28 29 30 31 32 33 34 35 36 37 38 39]\n"
                   "  dp           size 40  stride 1  groups [0 1 2 3 4 5 6 "
                   "7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 "
                   "26 27 28 29 30 31 32 33 34 35 36 37 38 39]  (flattened: "
                   "dp_shard)\n"
                   "  dp_shard_cp  size 40  stride 1  groups [0 1 2 3 4 5 6 "
                   "7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 "
                   "26 27 28 29 30 31 32 33 34 35 36 37 38 39]  (flattened: "
                   "dp_shard)\n"
                   "  dp_cp        size 40  stride 1  groups [0 1 2 3 4 5 6 "
                   "7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 "
                   "26 27 28 29 30 31 32 33 34 35 36 37 38 39]  (flattened: "
                   "dp_shard)\n");
  free(s);
  d.keep_size1 = 1;
  d.flatten = 0;
  d.dp_replicate = 20;
  s = NULL;
  f = open_memstream(&s, &n);
  ck_assert_int_eq(tr_mesh_describe_degrees(&d, 40, f, NULL), 0);
  fclose(f);
  ck_assert_ptr_nonnull(
      strstr(s,
             "  dp_replicate  size 20  stride 2  groups [0 2 4 6 8 10 12 "
             "14 16 18 20 22 24 26 28 30 32 34 36 38] [1 3 5 7 9 11 13 15 "
             "17 19 21 23 25 27 29 31 33 35 37 39]\n"));
  ck_assert_ptr_nonnull(
      strstr(s,
             "  dp_shard      size 2  stride 1  groups [0 1] [2 3] [4 5] "
             "[6 7] [8 9] [10 11] [12 13] [14 15] [16 17] [18 19] [20 21] "
             "[22 23] [24 25] [26 27] [28 29] [30 31] ... (20 groups)\n"));
  free(s);
  tr_errmsg_t err;
  f = open_memstream(&s, &n);
  ck_assert_int_eq(tr_mesh_describe_degrees(&d, 41, f, &err), TR_ECONFIG);
  fclose(f);
  free(s);
  ck_assert_str_eq(err.message,
                   "data_parallel_shard_degree -1: the world size 41 is not "
                   "divisible by pp 1 * dp_replicate 20 * cp 1 * tp 1 = 20");
}
END_TEST

/* ---- placements ---- */

static void layout1(int k, int c, tr_placement_t p, int ndim, const int64_t* g,
                    int64_t* ls, int64_t* off) {
  ck_assert_int_eq(tr_placement_local_layout(1, &k, &c, &p, ndim, g, ls, off),
                   0);
}

START_TEST(test_placement_math) {
  int64_t g[2] = {5, 3}, ls[2], off[2];
  /* 5 rows over 4 ranks: 2, 2, 1, 0 at 0, 2, 4, 5 */
  int64_t want_len[4] = {2, 2, 1, 0}, want_off[4] = {0, 2, 4, 5};
  for (int c = 0; c < 4; c++) {
    layout1(4, c, S0, 2, g, ls, off);
    ck_assert_int_eq(ls[0], want_len[c]);
    ck_assert_int_eq(off[0], want_off[c]);
    ck_assert_int_eq(ls[1], 3);
    ck_assert_int_eq(off[1], 0);
  }
  /* 2 rows over 4 ranks: 1, 1, 0, 0 */
  int64_t g2[1] = {2};
  int64_t l2[4] = {1, 1, 0, 0}, o2[4] = {0, 1, 2, 2};
  for (int c = 0; c < 4; c++) {
    layout1(4, c, S0, 1, g2, ls, off);
    ck_assert_int_eq(ls[0], l2[c]);
    ck_assert_int_eq(off[0], o2[c]);
  }
  /* Shard(-1) is the last dim; 3 over 2: 2, 1 */
  layout1(2, 1, tr_placement_shard(-1), 2, g, ls, off);
  ck_assert_int_eq(ls[1], 1);
  ck_assert_int_eq(off[1], 2);
  ck_assert_int_eq(ls[0], 5);
  /* Replicate and Partial keep the whole tensor */
  layout1(4, 3, PMAX, 2, g, ls, off);
  ck_assert_int_eq(ls[0], 5);
  ck_assert_int_eq(off[0], 0);
  layout1(4, 3, R, 2, g, ls, off);
  ck_assert_int_eq(ls[1], 3);
  /* 2-d mesh cutting dim 0 twice: 7 -> 4 | 3 -> (2, 2) | (2, 1) */
  int sizes[2] = {2, 2};
  tr_placement_t pl[2] = {S0, S0};
  int64_t g7[2] = {7, 4};
  int64_t ll[4] = {2, 2, 2, 1}, oo[4] = {0, 2, 4, 6};
  for (int c = 0; c < 4; c++) {
    int co[2] = {c / 2, c % 2};
    ck_assert_int_eq(
        tr_placement_local_layout(2, sizes, co, pl, 2, g7, ls, off), 0);
    ck_assert_int_eq(ls[0], ll[c]);
    ck_assert_int_eq(off[0], oo[c]);
  }
  /* Shard(0) x Shard(1) on 2 x 3: 7 x 4 -> rows 4|3, cols 2|2|0 (torch.chunk
   * makes pieces of ceil(4/3) = 2) */
  int sz23[2] = {2, 3};
  tr_placement_t pl2[2] = {S0, S1};
  int co[2] = {1, 2};
  ck_assert_int_eq(tr_placement_local_layout(2, sz23, co, pl2, 2, g7, ls, off),
                   0);
  ck_assert_int_eq(ls[0], 3);
  ck_assert_int_eq(off[0], 4);
  ck_assert_int_eq(ls[1], 0);
  ck_assert_int_eq(off[1], 4);
  /* errors */
  int k = 2, c = 2;
  ck_assert_int_eq(tr_placement_local_layout(1, &k, &c, &S0, 2, g, ls, off),
                   TR_EINVAL);
  c = 0;
  ck_assert_int_eq(tr_placement_local_layout(1, &k, &c, &S2, 2, g, ls, off),
                   TR_EINVAL);
  tr_placement_t bad = tr_placement_partial(TR_PG_PRODUCT);
  ck_assert_int_eq(tr_placement_local_layout(1, &k, &c, &bad, 2, g, ls, off),
                   TR_EINVAL);
  tr_placement_t neg = tr_placement_shard(-3);
  ck_assert_int_eq(tr_placement_local_layout(1, &k, &c, &neg, 2, g, ls, off),
                   TR_EINVAL);
}
END_TEST

/* Parameter placements: composing FSDP's Shard(0) on dp_shard onto a
 * tensor-parallel Shard(0) cuts the TP piece (dp_shard moves last in the
 * order: PyTorch's _StridedShard), not the whole tensor; the piece before
 * a dim's cut, another coordinate's piece, replica counts, undoing a
 * shard, and what composition refuses. No groups: mesh shapes only. */
START_TEST(test_param_placement) {
  static const char* const names[3] = {"dp_replicate", "dp_shard", "tp"};
  int sizes[3] = {2, 2, 2}, coords[3] = {1, 0, 1};
  tr_mesh_shape_t mesh;
  ck_assert_int_eq(tr_mesh_shape_init(&mesh, 3, names, sizes, coords), 0);
  ck_assert_int_eq(tr_mesh_shape_index(&mesh, "tp"), 2);
  ck_assert_int_eq(tr_mesh_shape_index(&mesh, "cp"), -1);
  tr_param_t p;
  memset(&p, 0, sizeof p);
  p.ndim = 2;
  p.shape[0] = 10;
  p.shape[1] = 6;
  /* TP: rows 5..9 on tp coordinate 1 */
  tr_placement_t tp[3] = {tr_placement_replicate(), tr_placement_replicate(),
                          tr_placement_shard(0)};
  ck_assert_int_eq(tr_dtensor_param_place(&p, &mesh, tp, NULL), 0);
  ck_assert_int_eq(p.layout.offset[0], 5);
  ck_assert_int_eq(p.layout.shape[0], 5);
  /* FSDP on top: dp_shard coordinate 0 takes the first 3 of those 5 */
  ck_assert_int_eq(tr_dtensor_param_shard(&p, &mesh, "dp_shard", 0), 0);
  ck_assert_int_eq(p.layout.offset[0], 5);
  ck_assert_int_eq(p.layout.shape[0], 3);
  ck_assert_int_eq(p.layout.shape[1], 6);
  const tr_param_placement_t* pl = tr_dtensor_param_placement(&p);
  ck_assert_int_eq(pl->order[0], 0);
  ck_assert_int_eq(pl->order[1], 2);
  ck_assert_int_eq(pl->order[2], 1);
  /* in mesh order dp_shard would cut first: rows 0..4, then tp 3..4 */
  int64_t ls[2], off[2];
  ck_assert_int_eq(tr_placement_local_layout(3, sizes, coords, pl->placements,
                                             2, p.shape, ls, off),
                   0);
  ck_assert_int_eq(off[0], 3);
  ck_assert_int_eq(ls[0], 2);
  /* the piece before dp_shard's cut; dp_shard coordinate 1's piece */
  tr_param_layout_t l;
  ck_assert_int_eq(
      tr_param_placement_layout(pl, 2, p.shape, "dp_shard", 0, 1, &l), 0);
  ck_assert_int_eq(l.offset[0], 5);
  ck_assert_int_eq(l.shape[0], 5);
  ck_assert_int_eq(
      tr_param_placement_layout(pl, 2, p.shape, "dp_shard", 1, 0, &l), 0);
  ck_assert_int_eq(l.offset[0], 8);
  ck_assert_int_eq(l.shape[0], 2);
  ck_assert_int_eq(l.parts, 1);
  ck_assert_int_eq(
      tr_param_placement_layout(pl, 2, p.shape, "dp_shard", 2, 0, &l),
      TR_EINVAL);
  /* held by the dp_replicate ranks alike: 2 replicas over the dp dims */
  static const char* const dp[2] = {"dp_replicate", "dp_shard"};
  ck_assert_int_eq(tr_dtensor_param_replicas(&p, &mesh, dp, 2), 2);
  static const char* const all[3] = {"dp_replicate", "dp_shard", "tp"};
  ck_assert_int_eq(tr_dtensor_param_replicas(&p, &mesh, all, 3), 2);
  /* a second shard on the same dim is refused, the layout kept */
  ck_assert_int_eq(tr_dtensor_param_shard(&p, &mesh, "dp_shard", 0), TR_EINVAL);
  ck_assert_int_eq(tr_dtensor_param_shard(&p, &mesh, "cp", 0), TR_EINVAL);
  ck_assert_int_eq(tr_dtensor_param_shard(&p, &mesh, "dp_replicate", 2),
                   TR_EINVAL);
  ck_assert_int_eq(p.layout.shape[0], 3);
  /* undoing FSDP's shard gives the TP piece back, then the whole */
  ck_assert_int_eq(tr_dtensor_param_unshard(&p, "dp_shard"), 0);
  ck_assert_int_eq(p.layout.offset[0], 5);
  ck_assert_int_eq(p.layout.shape[0], 5);
  ck_assert_int_eq(tr_dtensor_param_unshard(&p, "tp"), 0);
  ck_assert_ptr_null(tr_dtensor_param_placement(&p));
  ck_assert_int_eq(p.layout.shape[0], 10);
  /* without a placement: Replicate everywhere, FSDP composes on mesh */
  ck_assert_int_eq(tr_dtensor_param_replicas(&p, &mesh, dp, 2), 4);
  ck_assert_int_eq(tr_dtensor_param_shard(&p, &mesh, "dp_shard", 0), 0);
  ck_assert_int_eq(p.layout.offset[0], 0);
  ck_assert_int_eq(p.layout.shape[0], 5);
  tr_dtensor_param_clear_layout(&p);
  /* orders that are not permutations */
  int bad[3] = {0, 0, 1};
  ck_assert_int_eq(tr_dtensor_param_place(&p, &mesh, tp, bad), TR_EINVAL);
  ck_assert_ptr_null(tr_dtensor_param_placement(&p));
}
END_TEST

START_TEST(test_placement_names) {
  char buf[32];
  ck_assert_str_eq(tr_placement_str(S1, buf, sizeof buf), "Shard(1)");
  ck_assert_str_eq(tr_placement_str(R, buf, sizeof buf), "Replicate()");
  ck_assert_str_eq(tr_placement_str(PAVG, buf, sizeof buf), "Partial(avg)");
  const tr_placement_t all[] = {S0,   S1,   R,    PSUM,
                                PAVG, PMAX, PMIN, tr_placement_shard(-1)};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    tr_placement_t p;
    ck_assert_int_eq(
        tr_placement_parse(tr_placement_str(all[i], buf, sizeof buf), &p), 0);
    ck_assert(tr_placement_eq(p, all[i]));
  }
  tr_placement_t p;
  ck_assert_int_eq(tr_placement_parse("S(2)", &p), 0);
  ck_assert(tr_placement_eq(p, S2));
  ck_assert_int_eq(tr_placement_parse("P", &p), 0);
  ck_assert(tr_placement_eq(p, PSUM));
  ck_assert_int_eq(tr_placement_parse("P(max)", &p), 0);
  ck_assert(tr_placement_eq(p, PMAX));
  ck_assert_int_eq(tr_placement_parse("R", &p), 0);
  ck_assert(tr_placement_eq(p, R));
  ck_assert(!tr_placement_eq(S0, S1));
  ck_assert(!tr_placement_eq(PSUM, PMAX));
  ck_assert(!tr_placement_eq(R, PSUM));
  const char* bad[] = {"Shard()", "Shard(x)", "Partial(product)",
                       "Q",       "",         "Shard(1"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    ck_assert_msg(tr_placement_parse(bad[i], &p) == TR_EINVAL, "%s", bad[i]);
}
END_TEST

/* ---- the reference every rank checks against ---- */

/* The whole tensor: small integers, exact in every dtype we use. */
static double fval(int64_t i) { return 1 + (double)((i * 7) % 13); }
static double gval(int64_t i) { return (double)(i % 3); }

/* A rank's partial value on one mesh dim (k ranks, coordinate c): the
 * reduction over c of partial(op, y, c) is y. */
static double partial(tr_pg_reduce_op_t op, double y, int k, int c, int64_t i) {
  double g = gval(i);
  switch (op) {
    case TR_PG_SUM:
      return c == 0 ? y - (k - 1) * g : g;
    case TR_PG_AVG:
      return y + (2 * c - (k - 1)) * g;
    case TR_PG_MAX:
      return c == 0 ? y : y - 1 - g;
    default:
      return c == 0 ? y : y + 1 + g;
  }
}

static int64_t flat_index(int ndim, const int64_t* shape, const int64_t* idx) {
  int64_t f = 0;
  for (int d = 0; d < ndim; d++) f = f * shape[d] + idx[d];
  return f;
}

static void put(tr_tensor_t* t, int64_t i, double v) {
  void* p = tr_tensor_data(t);
  switch (t->dtype) {
    case TR_F32:
      ((float*)p)[i] = (float)v;
      break;
    case TR_BF16:
      ((uint16_t*)p)[i] = tr_f32_to_bf16((float)v);
      break;
    case TR_I32:
      ((int32_t*)p)[i] = (int32_t)v;
      break;
    default:
      ((int64_t*)p)[i] = (int64_t)v;
  }
}

/* This rank's local tensor for placements pl: its piece of the whole
 * tensor, made partial on every Partial mesh dim (in mesh order). With
 * partials 0, Partial dims hold the plain value (avg/max/min) or, for sum,
 * the value on coordinate 0 and zeros elsewhere (Replicate -> Partial). */
static tr_tensor_t make_local(tr_mesh_t* m, const tr_placement_t* pl, int ndim,
                              const int64_t* g, tr_dtype_t dt, int partials) {
  tr_dtensor_spec_t spec;
  PCHECK_RC(tr_dtensor_spec_init(&spec, m, pl, ndim, g));
  int64_t ls[TR_MAX_DIMS], off[TR_MAX_DIMS], idx[TR_MAX_DIMS];
  PCHECK_RC(tr_dtensor_local_layout(&spec, NULL, ls, off));
  tr_tensor_t t;
  PCHECK_RC(tr_tensor_empty(&t, dt, TR_DEVICE_CPU, ndim, ls));
  int64_t n = tr_tensor_numel(&t);
  for (int64_t e = 0; e < n; e++) {
    int64_t rem = e;
    for (int d = ndim - 1; d >= 0; d--) {
      idx[d] = off[d] + rem % ls[d];
      rem /= ls[d];
    }
    int64_t fi = flat_index(ndim, g, idx);
    double v = fval(fi);
    for (int i = 0; i < tr_mesh_ndim(m); i++) {
      if (spec.placements[i].kind != TR_PLACEMENT_PARTIAL) continue;
      const tr_mesh_dim_t* md = tr_mesh_dim(m, i);
      tr_pg_reduce_op_t op = spec.placements[i].op;
      if (partials)
        v = partial(op, v, md->size, md->coord, fi);
      else if (op == TR_PG_SUM && md->coord != 0)
        v = 0;
    }
    put(&t, e, v);
  }
  return t;
}

static int has_partial(const tr_placement_t* pl, int m) {
  for (int i = 0; i < m; i++)
    if (pl[i].kind == TR_PLACEMENT_PARTIAL) return 1;
  return 0;
}

static void describe_case(char* buf, size_t n, const tr_placement_t* a,
                          const tr_placement_t* b, int m, int ndim,
                          const int64_t* g) {
  size_t off = 0;
  char p[32];
  for (int i = 0; i < m; i++)
    off += (size_t)snprintf(buf + off, n - off, "%s%s", i ? "," : "[",
                            tr_placement_str(a[i], p, sizeof p));
  off += (size_t)snprintf(buf + off, n - off, "] -> ");
  for (int i = 0; i < m; i++)
    off += (size_t)snprintf(buf + off, n - off, "%s%s", i ? "," : "[",
                            tr_placement_str(b[i], p, sizeof p));
  off += (size_t)snprintf(buf + off, n - off, "] shape");
  for (int d = 0; d < ndim; d++)
    off += (size_t)snprintf(buf + off, n - off, " %lld", (long long)g[d]);
}

static void expect_equal(const tr_tensor_t* got, const tr_tensor_t* want,
                         const char* what) {
  char a[64], b[64];
  if (!tr_tensor_same_shape(got, want)) {
    fprintf(stderr, "rank %d: %s: local %s, want %s\n", pg_test_rank, what,
            tr_tensor_shape_str(got, a, sizeof a),
            tr_tensor_shape_str(want, b, sizeof b));
    _exit(1);
  }
  int64_t n = tr_tensor_numel(want);
  for (int64_t e = 0; e < n; e++) {
    double x = tr_tensor_get(got, e), y = tr_tensor_get(want, e);
    if (fabs(x - y) > 1e-5 * (1 + fabs(y))) {
      fprintf(stderr, "rank %d: %s: element %lld is %g, want %g\n",
              pg_test_rank, what, (long long)e, x, y);
      _exit(1);
    }
  }
}

typedef enum { MODE_SYNC, MODE_ASYNC, MODE_IN_PLACE } mode_t_;

/* Redistribute src -> dst placements and check the local result and the
 * whole tensor (full_tensor) against the reference. */
static void check_case(tr_mesh_t* m, const tr_placement_t* src,
                       const tr_placement_t* dst, int ndim, const int64_t* g,
                       tr_dtype_t dt, mode_t_ mode) {
  int nm = tr_mesh_ndim(m);
  char what[256];
  describe_case(what, sizeof what, src, dst, nm, ndim, g);
  tr_tensor_t loc = make_local(m, src, ndim, g, dt, 1);
  tr_dtensor_t a, b;
  PCHECK_RC(tr_dtensor_from_local(&a, &loc, m, src, g));
  tr_tensor_release(&loc);
  int unsupported = 0;
  for (int i = 0; i < nm; i++)
    if (src[i].kind == TR_PLACEMENT_PARTIAL &&
        dst[i].kind == TR_PLACEMENT_PARTIAL && src[i].op != dst[i].op)
      unsupported = 1;
  tr_dtensor_t* out = mode == MODE_IN_PLACE ? &a : &b;
  memset(&b, 0, sizeof b);
  int rc;
  if (mode == MODE_ASYNC && !unsupported) {
    tr_dtensor_work_t* w = NULL;
    rc = tr_dtensor_redistribute(&a, dst, out, &w);
    if (rc == 0) {
      PCHECK(w != NULL);
      rc = tr_dtensor_work_wait(w);
      PCHECK(tr_dtensor_work_wait(w) == rc); /* a second wait */
      tr_dtensor_work_free(w);
    }
  } else {
    int level = TR_LOG_NONE; /* the refusal is logged: quiet it */
    while (level < TR_LOG_TRACE &&
           tr_log_enabled((tr_log_level_t)(level + 1), TR_SUB_DT))
      level++;
    if (unsupported) tr_log_set_level(TR_LOG_NONE);
    rc = tr_dtensor_redistribute(&a, dst, out, NULL);
    tr_log_set_level(level);
  }
  if (unsupported) {
    if (rc != TR_EUNSUPPORTED) {
      fprintf(stderr, "rank %d: %s: returned %d, want EUNSUPPORTED\n",
              pg_test_rank, what, rc);
      _exit(1);
    }
    tr_dtensor_release(&a);
    return;
  }
  if (rc != 0) {
    fprintf(stderr, "rank %d: %s: redistribute returned %s\n", pg_test_rank,
            what, tr_err_name(rc));
    _exit(1);
  }
  for (int i = 0; i < nm; i++)
    PCHECK(tr_placement_eq(out->spec.placements[i], dst[i]) || dst[i].dim < 0);
  PCHECK(out->spec.ndim == ndim && out->spec.shape[0] == g[0]);
  /* The local values: the reference piece; for Partial targets the
   * Replicate -> Partial rule when the source had no Partial (else the
   * partials' split is the plan's business: the whole tensor decides). */
  if (!has_partial(dst, nm) || !has_partial(src, nm)) {
    tr_tensor_t want = make_local(m, dst, ndim, g, dt, 0);
    expect_equal(&out->local, &want, what);
    tr_tensor_release(&want);
  } else {
    int64_t ls[TR_MAX_DIMS], off[TR_MAX_DIMS];
    PCHECK_RC(tr_dtensor_local_layout(&out->spec, NULL, ls, off));
    for (int d = 0; d < ndim; d++) PCHECK(out->local.shape[d] == ls[d]);
  }
  tr_tensor_t full;
  PCHECK_RC(tr_dtensor_full_tensor(out, &full));
  tr_placement_t rep[TR_MESH_MAX_DIMS];
  for (int i = 0; i < nm; i++) rep[i] = R;
  tr_tensor_t want = make_local(m, rep, ndim, g, dt, 0);
  char w2[300];
  snprintf(w2, sizeof w2, "%s, full_tensor", what);
  expect_equal(&full, &want, w2);
  tr_tensor_release(&want);
  tr_tensor_release(&full);
  if (mode != MODE_IN_PLACE) tr_dtensor_release(&b);
  tr_dtensor_release(&a);
}

/* ---- bodies on forked ranks ---- */

static const tr_placement_t k_1d[] = {{TR_PLACEMENT_SHARD, 0, TR_PG_SUM, 0},
                                      {TR_PLACEMENT_SHARD, 1, TR_PG_SUM, 0},
                                      {TR_PLACEMENT_SHARD, -1, TR_PG_SUM, 0},
                                      {TR_PLACEMENT_REPLICATE, 0, TR_PG_SUM, 0},
                                      {TR_PLACEMENT_PARTIAL, 0, TR_PG_SUM, 0},
                                      {TR_PLACEMENT_PARTIAL, 0, TR_PG_AVG, 0},
                                      {TR_PLACEMENT_PARTIAL, 0, TR_PG_MAX, 0},
                                      {TR_PLACEMENT_PARTIAL, 0, TR_PG_MIN, 0}};
#define N_1D ((int)(sizeof k_1d / sizeof k_1d[0]))

/* Every pair of 1-d placements on a 1-d mesh of all ranks, for shapes
 * with even, uneven and empty pieces on every dim. */
static void body_1d(tr_pg_t* world, pg_ctx_t* c, tr_dtype_t dt) {
  int n = c->size;
  const char* names[1] = {"x"};
  tr_mesh_t* m;
  PCHECK_RC(tr_mesh_init(world, 1, &n, names, &m, NULL));
  static const int64_t shapes[][3] = {{5, 3, 0}, {2, 3, 0}, {4, 6, 0},
                                      {3, 5, 0}, {0, 3, 0}, {3, 2, 7}};
  static const int ndims[] = {2, 2, 2, 2, 2, 3};
  for (int s = 0; s < 6; s++)
    for (int a = 0; a < N_1D; a++)
      for (int b = 0; b < N_1D; b++) {
        mode_t_ mode = (a + b + s) % 3 == 0   ? MODE_ASYNC
                       : (a + b + s) % 3 == 1 ? MODE_IN_PLACE
                                              : MODE_SYNC;
        check_case(m, &k_1d[a], &k_1d[b], ndims[s], shapes[s], dt, mode);
      }
  tr_mesh_free(m);
}

static void body_1d_f32(tr_pg_t* world, pg_ctx_t* c) {
  body_1d(world, c, TR_F32);
}
static void body_1d_bf16(tr_pg_t* world, pg_ctx_t* c) {
  body_1d(world, c, TR_BF16);
}
static void body_1d_i64(tr_pg_t* world, pg_ctx_t* c) {
  body_1d(world, c, TR_I64);
}

/* At most one partial op within a set of placements: a tensor partial in
 * two ways on two mesh dims has no agreed meaning. */
static int one_op(const tr_placement_t* p, int m) {
  int op = -1;
  for (int i = 0; i < m; i++) {
    if (p[i].kind != TR_PLACEMENT_PARTIAL) continue;
    if (op >= 0 && (int)p[i].op != op) return 0;
    op = (int)p[i].op;
  }
  return 1;
}

/* Every pair of placements on a 2 x 2 mesh (and 2 x 2 x 1). */
static void body_2d(tr_pg_t* world, pg_ctx_t* c) {
  (void)c;
  static const tr_placement_t opts[] = {
      {TR_PLACEMENT_SHARD, 0, TR_PG_SUM, 0},
      {TR_PLACEMENT_SHARD, 1, TR_PG_SUM, 0},
      {TR_PLACEMENT_REPLICATE, 0, TR_PG_SUM, 0},
      {TR_PLACEMENT_PARTIAL, 0, TR_PG_SUM, 0},
      {TR_PLACEMENT_PARTIAL, 0, TR_PG_MAX, 0}};
  const int no = 5;
  int sizes[3] = {2, 2, 1};
  const char* names[3] = {"dp", "tp", "cp"};
  tr_mesh_t* m;
  PCHECK_RC(tr_mesh_init(world, 2, sizes, names, &m, NULL));
  static const int64_t shapes[][2] = {{7, 5}, {3, 1}, {4, 4}};
  for (int s = 0; s < 3; s++)
    for (int a = 0; a < no * no; a++)
      for (int b = 0; b < no * no; b++) {
        tr_placement_t pa[2] = {opts[a / no], opts[a % no]};
        tr_placement_t pb[2] = {opts[b / no], opts[b % no]};
        if (!one_op(pa, 2) || !one_op(pb, 2)) continue;
        check_case(m, pa, pb, 2, shapes[s], TR_F32,
                   (a + b) % 2 ? MODE_ASYNC : MODE_SYNC);
      }
  tr_mesh_free(m);
  /* 2 x 2 x 1: a size-1 dim's groups hold one rank */
  PCHECK_RC(tr_mesh_init(world, 3, sizes, names, &m, NULL));
  static const tr_placement_t p3[][3] = {
      {{TR_PLACEMENT_SHARD, 0, TR_PG_SUM, 0},
       {TR_PLACEMENT_SHARD, 1, TR_PG_SUM, 0},
       {TR_PLACEMENT_SHARD, 0, TR_PG_SUM, 0}},
      {{TR_PLACEMENT_REPLICATE, 0, TR_PG_SUM, 0},
       {TR_PLACEMENT_SHARD, 0, TR_PG_SUM, 0},
       {TR_PLACEMENT_PARTIAL, 0, TR_PG_SUM, 0}},
      {{TR_PLACEMENT_PARTIAL, 0, TR_PG_SUM, 0},
       {TR_PLACEMENT_PARTIAL, 0, TR_PG_SUM, 0},
       {TR_PLACEMENT_SHARD, 1, TR_PG_SUM, 0}},
      {{TR_PLACEMENT_REPLICATE, 0, TR_PG_SUM, 0},
       {TR_PLACEMENT_REPLICATE, 0, TR_PG_SUM, 0},
       {TR_PLACEMENT_REPLICATE, 0, TR_PG_SUM, 0}}};
  for (int a = 0; a < 4; a++)
    for (int b = 0; b < 4; b++)
      check_case(m, p3[a], p3[b], 2, shapes[0], TR_F32, MODE_SYNC);
  tr_mesh_free(m);
}

/* Every group of a torchtitan mesh talks to exactly its members: an
 * all-reduce of the global ranks over each dim's group. */
static void body_mesh_groups(tr_pg_t* world, pg_ctx_t* c) {
  int r = c->rank;
  tr_mesh_degrees_t d;
  tr_mesh_degrees_init(&d);
  d.dp_replicate = 2; /* 2 x 2 HSDP on 4 ranks */
  PCHECK_RC(tr_mesh_degrees_resolve(&d, tr_pg_size(world), NULL));
  tr_mesh_t* m;
  PCHECK_RC(tr_mesh_from_degrees(world, &d, &m, NULL));
  const char* dims[] = {"pp", "dp_replicate", "dp_shard",    "cp",
                        "tp", "dp",           "dp_shard_cp", "dp_cp"};
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
    tr_pg_t* g = tr_mesh_dim_pg(m, dims[i]);
    PCHECK(g != NULL);
    int64_t one = 1;
    tr_tensor_t t;
    PCHECK_RC(tr_tensor_empty(&t, TR_I64, TR_DEVICE_CPU, 1, &one));
    ((int64_t*)tr_tensor_data(&t))[0] = 1 << r;
    PCHECK_RC(tr_pg_all_reduce(g, &t, TR_PG_SUM, NULL));
    int64_t want = 0;
    for (int q = 0; q < tr_pg_size(g); q++)
      want |= 1 << tr_pg_global_rank(g, q);
    PCHECK(((int64_t*)tr_tensor_data(&t))[0] == want);
    PCHECK(want & (1 << r));
    tr_tensor_release(&t);
  }
  /* dp_replicate: [0 2] [1 3]; dp_shard: [0 1] [2 3]; dp: all four */
  PCHECK(tr_pg_global_rank(tr_mesh_dim_pg(m, "dp_replicate"), 1) == r % 2 + 2);
  PCHECK(tr_pg_global_rank(tr_mesh_dim_pg(m, "dp_shard"), 0) == r / 2 * 2);
  PCHECK(tr_pg_size(tr_mesh_dim_pg(m, "dp")) == 4);

  /* DTensors on the HSDP sub-mesh and on the dp_shard 1-d sub-mesh */
  tr_mesh_t* dp;
  const char* dn[2] = {"dp_replicate", "dp_shard"};
  PCHECK_RC(tr_mesh_sub(m, dn, 2, &dp, NULL));
  tr_placement_t hsdp[2] = {R, S0}, rep[2] = {R, R}, part[2] = {PSUM, PSUM};
  int64_t g[2] = {5, 3};
  check_case(dp, hsdp, rep, 2, g, TR_F32, MODE_ASYNC);
  check_case(dp, part, hsdp, 2, g, TR_F32, MODE_SYNC);
  tr_mesh_t* sh;
  PCHECK_RC(tr_mesh_sub(m, dn + 1, 1, &sh, NULL));
  check_case(sh, &S0, &R, 2, g, TR_F32, MODE_SYNC);
  check_case(sh, &PAVG, &S1, 2, g, TR_F32, MODE_ASYNC);
  /* the flattened dp dim as a 1-d mesh of 4 */
  tr_mesh_t* flat;
  const char* fn[1] = {"dp"};
  PCHECK_RC(tr_mesh_sub(m, fn, 1, &flat, NULL));
  check_case(flat, &S0, &S1, 2, g, TR_F32, MODE_SYNC);
  check_case(flat, &PSUM, &S0, 2, g, TR_F32, MODE_SYNC);

  /* distribute needs no communication; full_tensor gives it back */
  tr_tensor_t whole = make_local(dp, rep, 2, g, TR_F32, 0);
  tr_dtensor_t dt;
  tr_pg_stats_t before, after;
  tr_pg_stats(tr_mesh_dim_pg(m, "dp_shard"), &before);
  PCHECK_RC(tr_dtensor_distribute(&dt, &whole, dp, hsdp));
  tr_pg_stats(tr_mesh_dim_pg(m, "dp_shard"), &after);
  PCHECK(memcmp(&before, &after, sizeof before) == 0);
  tr_tensor_t want = make_local(dp, hsdp, 2, g, TR_F32, 0);
  expect_equal(&dt.local, &want, "distribute");
  PCHECK(dt.local.storage != whole.storage);
  tr_tensor_release(&want);
  tr_tensor_t back;
  PCHECK_RC(tr_dtensor_full_tensor(&dt, &back));
  expect_equal(&back, &whole, "full_tensor");
  tr_tensor_release(&back);
  tr_dtensor_release(&dt);
  /* all Replicate: distribute still copies */
  PCHECK_RC(tr_dtensor_distribute(&dt, &whole, dp, rep));
  PCHECK(dt.local.storage != whole.storage);
  expect_equal(&dt.local, &whole, "distribute replicate");
  tr_dtensor_release(&dt);
  tr_tensor_release(&whole);
  tr_mesh_free(flat);
  tr_mesh_free(sh);
  tr_mesh_free(dp);
  tr_mesh_free(m);
}

/* ---- Gloo tests ---- */

#ifdef HAVE_GLOO
static void run(int n, pg_body_fn body) {
  int st[8];
  ck_assert_int_eq(pg_spawn(n, "gloo", TR_DEV_CPU, 1, 30000, body, 50, st), 0);
  for (int r = 0; r < n; r++)
    ck_assert_msg(st[r] == 0, "rank %d of %d exited with %d", r, n, st[r]);
}

START_TEST(test_gloo_1d) {
  static const struct {
    int n;
    pg_body_fn body;
  } cases[] = {
      {2, body_1d_f32}, {4, body_1d_f32}, {3, body_1d_bf16}, {4, body_1d_i64}};
  run(cases[_i].n, cases[_i].body);
}
END_TEST

START_TEST(test_gloo_2d) { run(4, body_2d); }
END_TEST

START_TEST(test_gloo_mesh_groups) { run(4, body_mesh_groups); }
END_TEST
#endif

/* ---- the plan, through the fake backend's op counters ---- */

/* Redistribute on rank 1 of a fake 1-d mesh of 4 and count the ops. */
static void count_ops(tr_placement_t a, tr_placement_t b, int64_t rows,
                      tr_pg_op_t op, int64_t calls, int64_t bytes) {
  tr_pg_t* w = fake_world(1, 4);
  int n = 4;
  const char* names[1] = {"x"};
  tr_mesh_t* m;
  ck_assert_int_eq(tr_mesh_init(w, 1, &n, names, &m, NULL), 0);
  int64_t g[2] = {rows, 3};
  tr_dtensor_t x, y;
  ck_assert_int_eq(tr_dtensor_zeros(&x, m, &a, 2, g, TR_F32, TR_DEVICE_CPU), 0);
  tr_pg_t* pg = tr_mesh_dim_pg(m, "x");
  tr_pg_stats_t s0, s1;
  tr_pg_stats(pg, &s0);
  ck_assert_int_eq(tr_dtensor_redistribute(&x, &b, &y, NULL), 0);
  tr_pg_stats(pg, &s1);
  int64_t total = 0;
  for (int k = 0; k < TR_PG_OP__COUNT; k++) total += s1.calls[k] - s0.calls[k];
  char pa[32], pb[32];
  ck_assert_msg(total == calls, "%s -> %s: %lld ops, want %lld",
                tr_placement_str(a, pa, sizeof pa),
                tr_placement_str(b, pb, sizeof pb), (long long)total,
                (long long)calls);
  if (calls) {
    ck_assert_int_eq(s1.calls[op] - s0.calls[op], calls);
    ck_assert_int_eq(s1.bytes[op] - s0.bytes[op], bytes);
  }
  /* the result has this rank's piece's shape */
  int64_t ls[2], off[2];
  ck_assert_int_eq(tr_dtensor_local_layout(&y.spec, NULL, ls, off), 0);
  ck_assert_int_eq(y.local.shape[0], ls[0]);
  ck_assert_int_eq(y.local.shape[1], ls[1]);
  tr_dtensor_release(&x);
  tr_dtensor_release(&y);
  tr_mesh_free(m);
  tr_pg_free(w);
}

START_TEST(test_plan_ops) {
  /* 5 x 3 over 4: pieces of ceil(5/4) = 2 rows (24 bytes) */
  count_ops(S0, R, 5, TR_PG_OP_ALL_GATHER, 1, 24);
  count_ops(S0, R, 8, TR_PG_OP_ALL_GATHER, 1, 24); /* even: no copy */
  count_ops(S1, R, 5, TR_PG_OP_ALL_GATHER, 1, 20); /* 5 x 1 */
  count_ops(PSUM, R, 5, TR_PG_OP_ALL_REDUCE, 1, 60);
  count_ops(PMAX, S0, 5, TR_PG_OP_REDUCE_SCATTER, 1, 4 * 24);
  count_ops(PAVG, S1, 5, TR_PG_OP_REDUCE_SCATTER, 1, 4 * 20);
  /* Shard(0) -> Shard(1): all-to-all of 4 pieces of 2 x 1 */
  count_ops(S0, S1, 5, TR_PG_OP_ALL_TO_ALL, 1, 4 * 8);
  /* local steps */
  count_ops(R, S0, 5, TR_PG_OP_ALL_GATHER, 0, 0);
  count_ops(R, PSUM, 5, TR_PG_OP_ALL_GATHER, 0, 0);
  count_ops(S0, S0, 5, TR_PG_OP_ALL_GATHER, 0, 0);
  /* Shard -> Partial: all-gather, then local */
  count_ops(S1, PMIN, 5, TR_PG_OP_ALL_GATHER, 1, 20);
  /* every piece empty: nothing to send */
  count_ops(S0, R, 0, TR_PG_OP_ALL_GATHER, 0, 0);

  /* 2-d: [S0, S0] -> [S1, R]: gather the inner level, then an all-to-all
   * on the outer one */
  tr_pg_t* w = fake_world(0, 4);
  int sizes[2] = {2, 2};
  const char* names[2] = {"a", "b"};
  tr_mesh_t* m;
  ck_assert_int_eq(tr_mesh_init(w, 2, sizes, names, &m, NULL), 0);
  tr_placement_t a[2] = {S0, S0}, b[2] = {S1, R};
  int64_t g[2] = {8, 4};
  tr_dtensor_t x, y;
  memset(&y, 0, sizeof y); /* an out must hold no tensor (dtensor.h) */
  ck_assert_int_eq(tr_dtensor_zeros(&x, m, a, 2, g, TR_F32, TR_DEVICE_CPU), 0);
  ck_assert_int_eq(x.local.shape[0], 2);
  tr_pg_stats_t sa0, sa1, sb0, sb1;
  tr_pg_stats(tr_mesh_dim_pg(m, "a"), &sa0);
  tr_pg_stats(tr_mesh_dim_pg(m, "b"), &sb0);
  tr_dtensor_work_t* wk;
  ck_assert_int_eq(tr_dtensor_redistribute(&x, b, &y, &wk), 0);
  /* async: only the first collective is issued before the wait */
  tr_pg_stats(tr_mesh_dim_pg(m, "a"), &sa1);
  tr_pg_stats(tr_mesh_dim_pg(m, "b"), &sb1);
  ck_assert_int_eq(
      sb1.calls[TR_PG_OP_ALL_GATHER] - sb0.calls[TR_PG_OP_ALL_GATHER], 1);
  ck_assert_int_eq(
      sa1.calls[TR_PG_OP_ALL_TO_ALL] - sa0.calls[TR_PG_OP_ALL_TO_ALL], 0);
  ck_assert_ptr_null(y.local.storage);
  ck_assert_int_eq(tr_dtensor_work_wait(wk), 0);
  tr_dtensor_work_free(wk);
  tr_pg_stats(tr_mesh_dim_pg(m, "a"), &sa1);
  ck_assert_int_eq(
      sa1.calls[TR_PG_OP_ALL_TO_ALL] - sa0.calls[TR_PG_OP_ALL_TO_ALL], 1);
  ck_assert_int_eq(y.local.shape[0], 8);
  ck_assert_int_eq(y.local.shape[1], 2);
  tr_dtensor_release(&y);
  /* Partial(sum) -> Partial(max): refused, nothing issued */
  tr_placement_t ps[2] = {PSUM, R}, pm[2] = {PMAX, R};
  tr_dtensor_release(&x);
  ck_assert_int_eq(tr_dtensor_zeros(&x, m, ps, 2, g, TR_F32, TR_DEVICE_CPU), 0);
  memset(&y, 0, sizeof y);
  ck_assert_int_eq(tr_dtensor_redistribute(&x, pm, &y, NULL), TR_EUNSUPPORTED);
  ck_assert_ptr_null(y.local.storage);
  /* a local tensor that is not this rank's piece */
  tr_dtensor_t bad = x;
  bad.local.shape[0] = 3;
  ck_assert_int_eq(tr_dtensor_redistribute(&bad, ps, &y, NULL), TR_ESHAPE);
  tr_dtensor_release(&x);
  tr_mesh_free(m);
  tr_pg_free(w);
}
END_TEST

/* ---- DTensors and the parameter table in one process ---- */

START_TEST(test_dtensor_local) {
  tr_pg_t* w = fake_world(3, 4);
  int n = 4;
  const char* names[1] = {"dp_shard"};
  tr_mesh_t* m;
  ck_assert_int_eq(tr_mesh_init(w, 1, &n, names, &m, NULL), 0);
  /* from_local checks the piece: rank 3 of 4 holds 0 of 5 rows */
  int64_t shape[2] = {0, 3}, g[2] = {5, 3};
  tr_tensor_t t;
  ck_assert_int_eq(tr_tensor_zeros(&t, TR_F32, TR_DEVICE_CPU, 2, shape), 0);
  tr_dtensor_t dt;
  ck_assert_int_eq(tr_dtensor_from_local(&dt, &t, m, &S0, g), 0);
  ck_assert_int_eq(dt.spec.shape[0], 5);
  tr_dtensor_release(&dt);
  ck_assert_int_eq(tr_dtensor_from_local(&dt, &t, m, &S1, g), TR_ESHAPE);
  tr_tensor_release(&t);
  /* no global shape: even shards assumed (local x mesh size) */
  shape[0] = 2;
  ck_assert_int_eq(tr_tensor_zeros(&t, TR_F32, TR_DEVICE_CPU, 2, shape), 0);
  ck_assert_int_eq(tr_dtensor_from_local(&dt, &t, m, &S0, NULL), 0);
  ck_assert_int_eq(dt.spec.shape[0], 8);
  ck_assert_ptr_eq(dt.local.storage, t.storage);
  tr_dtensor_release(&dt);
  tr_tensor_release(&t);
  ck_assert_int_eq(tr_dtensor_zeros(&dt, m, &S2, 2, g, TR_F32, TR_DEVICE_CPU),
                   TR_EINVAL);

  /* distribute: rank 3's rows of a 10 x 2 tensor are 9 (chunk 3 of 3,3,3,1) */
  int64_t fs[2] = {10, 2};
  tr_tensor_t full;
  ck_assert_int_eq(tr_tensor_empty(&full, TR_F32, TR_DEVICE_CPU, 2, fs), 0);
  for (int i = 0; i < 20; i++) ((float*)tr_tensor_data(&full))[i] = (float)i;
  ck_assert_int_eq(tr_dtensor_distribute(&dt, &full, m, &S0), 0);
  ck_assert_int_eq(dt.local.shape[0], 1);
  ck_assert_double_eq(tr_tensor_get(&dt.local, 0), 18);
  ck_assert_double_eq(tr_tensor_get(&dt.local, 1), 19);
  tr_dtensor_release(&dt);
  /* Partial(sum): coordinate 3 holds zeros; Partial(max): the values */
  ck_assert_int_eq(tr_dtensor_distribute(&dt, &full, m, &PSUM), 0);
  ck_assert_double_eq(tr_tensor_get(&dt.local, 19), 0);
  tr_dtensor_release(&dt);
  ck_assert_int_eq(tr_dtensor_distribute(&dt, &full, m, &PMAX), 0);
  ck_assert_double_eq(tr_tensor_get(&dt.local, 19), 19);
  tr_dtensor_release(&dt);
  /* Shard(1) of 2 columns over 4: rank 3 holds none */
  ck_assert_int_eq(tr_dtensor_distribute(&dt, &full, m, &S1), 0);
  ck_assert_int_eq(dt.local.shape[0], 10);
  ck_assert_int_eq(dt.local.shape[1], 0);
  tr_dtensor_release(&dt);
  tr_tensor_release(&full);

  /* the parameter seam */
  tr_param_t p;
  memset(&p, 0, sizeof p);
  p.ndim = 2;
  p.shape[0] = 10;
  p.shape[1] = 6;
  ck_assert_int_eq(tr_dtensor_param_set_layout(&p, m, &S0), 0);
  ck_assert_int_eq(p.layout.offset[0], 9);
  ck_assert_int_eq(p.layout.shape[0], 1);
  ck_assert_int_eq(p.layout.shape[1], 6);
  const tr_param_placement_t* sp = tr_dtensor_param_placement(&p);
  ck_assert_ptr_nonnull(sp);
  ck_assert_int_eq(sp->mesh.ndim, tr_mesh_ndim(m));
  ck_assert_int_eq(sp->mesh.sizes[0], tr_mesh_dim(m, 0)->size);
  ck_assert_int_eq(sp->mesh.coords[0], tr_mesh_dim(m, 0)->coord);
  ck_assert(tr_placement_eq(sp->placements[0], S0));
  tr_placement_t last = tr_placement_shard(-1);
  ck_assert_int_eq(tr_dtensor_param_set_layout(&p, m, &last), 0);
  ck_assert_int_eq(tr_dtensor_param_placement(&p)->placements[0].dim, 1);
  ck_assert_int_eq(p.layout.offset[0], 0);
  ck_assert_int_eq(p.layout.shape[0], 10);
  ck_assert_int_eq(p.layout.offset[1], 6);
  ck_assert_int_eq(p.layout.shape[1], 0);
  ck_assert_int_eq(tr_dtensor_param_set_layout(&p, m, &S2), TR_EINVAL);
  ck_assert_ptr_nonnull(tr_dtensor_param_placement(&p)); /* kept */
  tr_dtensor_param_clear_layout(&p);
  ck_assert_ptr_null(tr_dtensor_param_placement(&p));
  ck_assert_int_eq(p.layout.shape[1], 6);
  ck_assert_int_eq(p.layout.offset[1], 0);
  tr_mesh_free(m);
  tr_pg_free(w);
}
END_TEST

/* ---- context parallelism's attention core (dtensor/cp.c) ---- */

static uint64_t cp_rng = 17;
static float cp_rand(void) {
  cp_rng = cp_rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((double)(cp_rng >> 11) * 0x1p-53 * 3.0 - 1.5);
}

static void cp_tensor(tr_tensor_t* t, int64_t a, int64_t b, int64_t c,
                      int random) {
  int64_t sh[3] = {a, b, c};
  ck_assert_int_eq(tr_tensor_zeros(t, TR_F32, TR_DEVICE_CPU, 3, sh), 0);
  float* p = tr_tensor_data(t);
  for (int64_t i = 0; random && i < a * b * c; i++) p[i] = cp_rand();
}

/* rows [r0, r0 + n) of x [B, *, W] (dim 1), or of lse [B, H, *] (dim 2),
 * against ref's rows [s0, s0 + n): the largest difference */
static double cp_diff(const tr_tensor_t* x, int64_t r0, const tr_tensor_t* ref,
                      int64_t s0, int64_t n, int dim) {
  double m = 0;
  int64_t A = x->shape[0], M = x->shape[1], W = x->shape[2];
  int64_t Mr = ref->shape[1], Wr = ref->shape[2];
  for (int64_t a = 0; a < A; a++)
    for (int64_t i = 0; i < n; i++)
      if (dim == 1) {
        for (int64_t w = 0; w < W; w++)
          m = fmax(m, fabs(tr_tensor_get(x, (a * M + r0 + i) * W + w) -
                           tr_tensor_get(ref, (a * Mr + s0 + i) * Wr + w)));
      } else {
        for (int64_t h = 0; h < M; h++)
          m = fmax(m, fabs(tr_tensor_get(x, (a * M + h) * W + r0 + i) -
                           tr_tensor_get(ref, (a * Mr + h) * Wr + s0 + i)));
      }
  return m;
}

/* chunk `chunk` of raw (rows chunk*c..) rotated at its own positions into
 * rows dst_chunk*c.. of dst: RoPE offset per chunk */
static void cp_rope_chunk(tr_tensor_t* dst, int dst_chunk,
                          const tr_tensor_t* raw, int chunk, int64_t c,
                          int heads, const tr_tensor_t* cos_t,
                          const tr_tensor_t* sin_t) {
  tr_tensor_t src = {0}, tmp = {0}, cs = {0}, sn = {0}, out = {0};
  ck_assert_int_eq(tr_tensor_narrow(&src, raw, 1, chunk * c, c), 0);
  ck_assert_int_eq(tr_tensor_contiguous(&tmp, &src), 0);
  if (tmp.storage == src.storage) { /* a new reference: copy */
    tr_tensor_release(&tmp);
    cp_tensor(&tmp, raw->shape[0], c, raw->shape[2], 0);
    ck_assert_int_eq(tr_tensor_copy(&tmp, &src), 0);
  }
  ck_assert_int_eq(tr_tensor_narrow(&cs, cos_t, 0, chunk * c, c), 0);
  ck_assert_int_eq(tr_tensor_narrow(&sn, sin_t, 0, chunk * c, c), 0);
  ck_assert_int_eq(tr_kern_rope(&tmp, heads, &cs, &sn, 0), 0);
  ck_assert_int_eq(tr_tensor_narrow(&out, dst, 1, dst_chunk * c, c), 0);
  ck_assert_int_eq(tr_tensor_copy(&out, &tmp), 0);
  tr_tensor_t* ts[] = {&src, &tmp, &cs, &sn, &out};
  for (int i = 0; i < 5; i++) tr_tensor_release(ts[i]);
}

/* A sequence of 2N chunks of c tokens over N cp ranks, head-tail: each
 * rank's merged attention (forward: out and lse of its rows; backward: dq
 * of its rows, and dk, dv summed over the ranks) equals full causal
 * attention within 1e-6. q and k are rotated per chunk at the chunk's
 * positions, the reference rotates the whole sequence. */
static void cp_case(int N, int H, int KVH, int B) {
  const int D = 8, n_chunks = 2 * N;
  const int64_t c = 5, T = n_chunks * c, HD = (int64_t)H * D,
                KD = (int64_t)KVH * D;
  tr_tensor_t raw_q, raw_k, v, dout, q, k, of, lf, dqf, dkf, dvf, dks, dvs;
  cp_tensor(&raw_q, B, T, HD, 1);
  cp_tensor(&raw_k, B, T, KD, 1);
  cp_tensor(&v, B, T, KD, 1);
  cp_tensor(&dout, B, T, HD, 1);
  int64_t tsh[2] = {T, D / 2};
  tr_tensor_t cos_t, sin_t;
  ck_assert_int_eq(tr_tensor_empty(&cos_t, TR_F32, TR_DEVICE_CPU, 2, tsh), 0);
  ck_assert_int_eq(tr_tensor_empty(&sin_t, TR_F32, TR_DEVICE_CPU, 2, tsh), 0);
  ck_assert_int_eq(tr_kern_rope_table(tr_tensor_data(&cos_t),
                                      tr_tensor_data(&sin_t), (int)T, D,
                                      10000.0, NULL),
                   0);
  /* the reference: the whole sequence rotated at positions 0..T-1 */
  cp_tensor(&q, B, T, HD, 0);
  cp_tensor(&k, B, T, KD, 0);
  ck_assert_int_eq(tr_tensor_copy(&q, &raw_q), 0);
  ck_assert_int_eq(tr_tensor_copy(&k, &raw_k), 0);
  ck_assert_int_eq(tr_kern_rope(&q, H, &cos_t, &sin_t, 0), 0);
  ck_assert_int_eq(tr_kern_rope(&k, KVH, &cos_t, &sin_t, 0), 0);
  cp_tensor(&of, B, T, HD, 0);
  cp_tensor(&lf, B, H, T, 0);
  cp_tensor(&dqf, B, T, HD, 0);
  cp_tensor(&dkf, B, T, KD, 0);
  cp_tensor(&dvf, B, T, KD, 0);
  ck_assert_int_eq(tr_kern_attention_fwd(&of, &lf, &q, &k, &v, H, KVH), 0);
  ck_assert_int_eq(tr_kern_attention_bwd(&dqf, &dkf, &dvf, &dout, &q, &k, &v,
                                         &of, &lf, H, KVH),
                   0);
  /* the key chunks every rank sees (an all-gather of the rotated chunks) */
  tr_tensor_t kall;
  cp_tensor(&kall, B, T, KD, 0);
  for (int j = 0; j < n_chunks; j++)
    cp_rope_chunk(&kall, j, &raw_k, j, c, KVH, &cos_t, &sin_t);
  cp_tensor(&dks, B, T, KD, 0);
  cp_tensor(&dvs, B, T, KD, 0);
  double e_out = 0, e_lse = 0, e_dq = 0;
  for (int r = 0; r < N; r++) {
    int ch[2];
    ck_assert_int_eq(tr_cp_headtail(N, r, ch), 0);
    ck_assert_int_eq(ch[0], r);
    ck_assert_int_eq(ch[1], n_chunks - 1 - r);
    tr_tensor_t ql, gl, ol, ll, dql, dkr, dvr, gv = {0};
    cp_tensor(&ql, B, 2 * c, HD, 0);
    cp_tensor(&gl, B, 2 * c, HD, 0);
    for (int i = 0; i < 2; i++) {
      cp_rope_chunk(&ql, i, &raw_q, ch[i], c, H, &cos_t, &sin_t);
      tr_tensor_t dst = {0};
      ck_assert_int_eq(tr_tensor_narrow(&gv, &dout, 1, ch[i] * c, c), 0);
      ck_assert_int_eq(tr_tensor_narrow(&dst, &gl, 1, i * c, c), 0);
      ck_assert_int_eq(tr_tensor_copy(&dst, &gv), 0);
      tr_tensor_release(&gv);
      tr_tensor_release(&dst);
    }
    cp_tensor(&ol, B, 2 * c, HD, 0);
    cp_tensor(&ll, B, H, 2 * c, 0);
    cp_tensor(&dql, B, 2 * c, HD, 0);
    cp_tensor(&dkr, B, T, KD, 0);
    cp_tensor(&dvr, B, T, KD, 0);
    ck_assert_int_eq(tr_cp_attention_fwd(&ol, &ll, &ql, &kall, &v, H, KVH, ch,
                                         2, n_chunks, NULL, 0),
                     0);
    ck_assert_int_eq(
        tr_cp_attention_bwd(&dql, &dkr, &dvr, &gl, &ql, &kall, &v, &ol, &ll, H,
                            KVH, ch, 2, n_chunks, NULL, 0),
        0);
    for (int i = 0; i < 2; i++) {
      e_out = fmax(e_out, cp_diff(&ol, i * c, &of, ch[i] * c, c, 1));
      e_lse = fmax(e_lse, cp_diff(&ll, i * c, &lf, ch[i] * c, c, 2));
      e_dq = fmax(e_dq, cp_diff(&dql, i * c, &dqf, ch[i] * c, c, 1));
    }
    ck_assert_int_eq(tr_kern_add(&dks, &dks, &dkr), 0); /* reduce over cp */
    ck_assert_int_eq(tr_kern_add(&dvs, &dvs, &dvr), 0);
    tr_tensor_t* ts[] = {&ql, &gl, &ol, &ll, &dql, &dkr, &dvr};
    for (int i = 0; i < 7; i++) tr_tensor_release(ts[i]);
  }
  double e_dk = cp_diff(&dks, 0, &dkf, 0, T, 1);
  double e_dv = cp_diff(&dvs, 0, &dvf, 0, T, 1);
  fprintf(stderr,
          "cp N=%d H=%d KVH=%d T=%lld: max |cp - full| out %.2g lse %.2g dq "
          "%.2g dk %.2g dv %.2g\n",
          N, H, KVH, (long long)T, e_out, e_lse, e_dq, e_dk, e_dv);
  ck_assert_msg(e_out <= 1e-6 && e_lse <= 1e-6 && e_dq <= 1e-6 &&
                    e_dk <= 1e-6 && e_dv <= 1e-6,
                "cp attention differs from full attention: out %g lse %g dq "
                "%g dk %g dv %g",
                e_out, e_lse, e_dq, e_dk, e_dv);
  tr_tensor_t* ts[] = {&raw_q, &raw_k, &v,   &dout, &q,     &k,     &of,
                       &lf,    &dqf,   &dkf, &dvf,  &dks,   &dvs,   &kall,
                       &cos_t, &sin_t};
  for (int i = 0; i < 16; i++) tr_tensor_release(ts[i]);
}

START_TEST(test_cp_attention_headtail) {
  cp_case(2, 2, 2, 2); /* GPT-2's layout: as many kv heads as heads */
  cp_case(4, 2, 2, 2);
  cp_case(2, 4, 2, 2); /* Llama's grouped-query heads */
  cp_case(4, 4, 1, 2);
  /* one sequence: the gradient chunks are contiguous, written in place */
  cp_case(2, 4, 2, 1);
  cp_case(4, 2, 2, 1);
}
END_TEST

/* The shifted-chunk kernel alone: a chunk after its keys sees them all, a
 * chunk before them sees none (out 0, lse -inf); no rank past the world. */
START_TEST(test_cp_chunk_shift_edges) {
  tr_tensor_t q, k, v, o, l;
  cp_tensor(&q, 1, 4, 8, 1);
  cp_tensor(&k, 1, 4, 8, 1);
  cp_tensor(&v, 1, 4, 8, 1);
  cp_tensor(&o, 1, 4, 8, 0);
  cp_tensor(&l, 1, 1, 4, 0);
  ck_assert_int_eq(
      tr_kern_attention_masked_fwd(&o, &l, &q, &k, &v, 1, 1, NULL, 0, -4), 0);
  for (int i = 0; i < 4; i++) {
    ck_assert(isinf(tr_tensor_get(&l, i)) && tr_tensor_get(&l, i) < 0);
    for (int d = 0; d < 8; d++) ck_assert(tr_tensor_get(&o, i * 8 + d) == 0);
  }
  ck_assert_int_eq(
      tr_kern_attention_masked_fwd(&o, &l, &q, &k, &v, 1, 1, NULL, 0, 4), 0);
  /* full attention: row 0 sees all 4 keys, so its lse exceeds the causal
   * row 0's (which sees one) unless by chance; check against by hand */
  const float* qp = tr_tensor_data(&q);
  const float* kp = tr_tensor_data(&k);
  double s[4], mx = -INFINITY, sum = 0;
  for (int j = 0; j < 4; j++) {
    s[j] = 0;
    for (int d = 0; d < 8; d++) s[j] += qp[d] * kp[j * 8 + d];
    s[j] /= sqrt(8.0);
    mx = fmax(mx, s[j]);
  }
  for (int j = 0; j < 4; j++) sum += exp(s[j] - mx);
  ck_assert(fabs(tr_tensor_get(&l, 0) - (mx + log(sum))) < 1e-5);
  /* a window counts from the row's position: row 0 (at 4) sees key 3 */
  ck_assert_int_eq(
      tr_kern_attention_masked_fwd(&o, &l, &q, &k, &v, 1, 1, NULL, 2, 4), 0);
  ck_assert(fabs(tr_tensor_get(&l, 0) - s[3]) < 1e-5);
  int ch[2];
  ck_assert_int_eq(tr_cp_headtail(2, 2, ch), TR_EINVAL);
  tr_tensor_t* ts[] = {&q, &k, &v, &o, &l};
  for (int i = 0; i < 5; i++) tr_tensor_release(ts[i]);
}
END_TEST

#ifdef HAVE_GLOO
/* rows of chunks ch[0], ch[1] (c each) of x [B, T, W] into a fresh
 * [B, 2c, W] */
static void cp_local(tr_tensor_t* dst, const tr_tensor_t* x, const int ch[2],
                     int64_t c) {
  int64_t sh[3] = {x->shape[0], 2 * c, x->shape[2]};
  PCHECK_RC(tr_tensor_zeros(dst, TR_F32, TR_DEVICE_CPU, 3, sh));
  for (int i = 0; i < 2; i++) {
    tr_tensor_t a = {0}, b = {0};
    PCHECK_RC(tr_tensor_narrow(&a, x, 1, ch[i] * c, c));
    PCHECK_RC(tr_tensor_narrow(&b, dst, 1, i * c, c));
    PCHECK_RC(tr_tensor_copy(&b, &a));
    tr_tensor_release(&a);
    tr_tensor_release(&b);
  }
}

/* One case of the ring over pg against full attention over the whole
 * sequence: out, lse, dq of this rank's rows and dk, dv of its chunks
 * (the sum over every rank's queries) within 1e-6. masked: documents
 * (block_causal starts) and a sliding window that crosses chunks. With
 * H == KVH q, k, v (and dq, dk, dv) are strided views of one fused
 * [B, 2c, 3 H D] tensor, as GPT-2's c_attn leaves them. */
static void cp_ring_case(tr_pg_t* pg, tr_cp_rotate_t rot, int H, int KVH,
                         int masked, int B) {
  const int D = 8, n = tr_pg_size(pg), r = tr_pg_rank(pg);
  const int64_t c = 6, T = 2 * n * c, HD = (int64_t)H * D,
                KD = (int64_t)KVH * D;
  cp_rng = 17; /* every rank draws the same sequence */
  tr_tensor_t q, k, v, dout, of, lf, dqf, dkf, dvf;
  cp_tensor(&q, B, T, HD, 1);
  cp_tensor(&k, B, T, KD, 1);
  cp_tensor(&v, B, T, KD, 1);
  cp_tensor(&dout, B, T, HD, 1);
  tr_tensor_t ds = {0};
  int window = masked ? (int)(c + c / 2) : 0;
  if (masked) { /* documents end at every 7th and 11th token */
    int64_t sh[2] = {B, T};
    PCHECK_RC(tr_tensor_empty(&ds, TR_I32, TR_DEVICE_CPU, 2, sh));
    int32_t* tok = malloc(sizeof *tok * (size_t)(B * T));
    PCHECK(tok != NULL);
    for (int64_t i = 0; i < B * T; i++)
      tok[i] = (i % T) % (i < T ? 7 : 11) == 5 ? 0 : 1;
    tr_kern_attn_doc_start(tr_tensor_data(&ds), NULL, tok, B, (int)T, 0);
    free(tok);
  }
  const tr_tensor_t* dsp = masked ? &ds : NULL;
  cp_tensor(&of, B, T, HD, 0);
  cp_tensor(&lf, B, H, T, 0);
  cp_tensor(&dqf, B, T, HD, 0);
  cp_tensor(&dkf, B, T, KD, 0);
  cp_tensor(&dvf, B, T, KD, 0);
  PCHECK_RC(tr_kern_attention_masked_fwd(&of, &lf, &q, &k, &v, H, KVH, dsp,
                                         window, 0));
  PCHECK_RC(tr_kern_attention_masked_bwd(&dqf, &dkf, &dvf, &dout, &q, &k, &v,
                                         &of, &lf, H, KVH, dsp, window, 0));
  int ch[2];
  PCHECK_RC(tr_cp_headtail(n, r, ch));
  tr_tensor_t ql, kl, vl, gl, ol, ll, dql, dkl, dvl, fused = {0}, dfused = {0};
  cp_local(&ql, &q, ch, c);
  cp_local(&kl, &k, ch, c);
  cp_local(&vl, &v, ch, c);
  cp_local(&gl, &dout, ch, c);
  cp_tensor(&ol, B, 2 * c, HD, 0);
  cp_tensor(&ll, B, H, 2 * c, 0);
  if (H == KVH) { /* views of fused [B, 2c, 3HD] tensors */
    cp_tensor(&fused, B, 2 * c, 3 * HD, 0);
    cp_tensor(&dfused, B, 2 * c, 3 * HD, 0);
    tr_tensor_t* src[3] = {&ql, &kl, &vl};
    tr_tensor_t* dd[3] = {&dql, &dkl, &dvl};
    for (int i = 0; i < 3; i++) {
      tr_tensor_t view = {0};
      PCHECK_RC(tr_tensor_narrow(&view, &fused, 2, i * HD, HD));
      PCHECK_RC(tr_tensor_copy(&view, src[i]));
      tr_tensor_release(src[i]);
      *src[i] = view;
      PCHECK_RC(tr_tensor_narrow(dd[i], &dfused, 2, i * HD, HD));
    }
  } else {
    cp_tensor(&dql, B, 2 * c, HD, 0);
    cp_tensor(&dkl, B, 2 * c, KD, 0);
    cp_tensor(&dvl, B, 2 * c, KD, 0);
  }
  tr_cp_t cp = {.pg = pg, .rotate = rot};
  PCHECK_RC(tr_cp_ring_fwd(&cp, &ol, &ll, &ql, &kl, &vl, H, KVH, dsp, window));
  PCHECK_RC(tr_cp_ring_bwd(&cp, &dql, &dkl, &dvl, &gl, &ql, &kl, &vl, &ol, &ll,
                           H, KVH, dsp, window));
  double e[5] = {0};
  for (int i = 0; i < 2; i++) {
    e[0] = fmax(e[0], cp_diff(&ol, i * c, &of, ch[i] * c, c, 1));
    e[1] = fmax(e[1], cp_diff(&ll, i * c, &lf, ch[i] * c, c, 2));
    e[2] = fmax(e[2], cp_diff(&dql, i * c, &dqf, ch[i] * c, c, 1));
    e[3] = fmax(e[3], cp_diff(&dkl, i * c, &dkf, ch[i] * c, c, 1));
    e[4] = fmax(e[4], cp_diff(&dvl, i * c, &dvf, ch[i] * c, c, 1));
  }
  fprintf(stderr,
          "cp ring %s N=%d H=%d KVH=%d %s rank %d: max |cp - full| out %.2g "
          "lse %.2g dq %.2g dk %.2g dv %.2g\n",
          rot == TR_CP_ALLGATHER ? "allgather" : "alltoall", n, H, KVH,
          masked ? "documents+window" : "causal", r, e[0], e[1], e[2], e[3],
          e[4]);
  for (int i = 0; i < 5; i++) PCHECK(e[i] <= 1e-6);
  tr_tensor_t* ts[] = {&q,   &k,   &v,   &dout, &of,  &lf,    &dqf,
                       &dkf, &dvf, &ds,  &ql,   &kl,  &vl,    &gl,
                       &ol,  &ll,  &dql, &dkl,  &dvl, &fused, &dfused};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
    tr_tensor_release(ts[i]);
}

static void body_cp_ring(tr_pg_t* world, pg_ctx_t* ctx) {
  (void)ctx;
  static const int heads[2][2] = {{2, 2}, {4, 2}}; /* GPT-2's, GQA */
  for (int rot = 0; rot < 2; rot++) {
    for (int h = 0; h < 2; h++)
      for (int masked = 0; masked < 2; masked++)
        cp_ring_case(world, (tr_cp_rotate_t)rot, heads[h][0], heads[h][1],
                     masked, 2);
    /* one sequence: GQA's separate q, k, v have contiguous gradient chunks
     * (written in place), GPT-2's fused ones strided (through scratch) */
    cp_ring_case(world, (tr_cp_rotate_t)rot, 4, 2, 0, 1);
    cp_ring_case(world, (tr_cp_rotate_t)rot, 2, 2, 1, 1);
  }
}

START_TEST(test_cp_ring) { run(_i ? 4 : 2, body_cp_ring); }
END_TEST
#endif

static Suite* dtensor_suite(void) {
  Suite* s = suite_create("dtensor");
  TCase* tc = tcase_create("local");
  tcase_add_test(tc, test_degrees);
  tcase_add_loop_test(tc, test_mesh_2x2, 0, 4);
  tcase_add_loop_test(tc, test_mesh_degrees, 0, 2);
  tcase_add_test(tc, test_mesh_hsdp_flat);
  tcase_add_test(tc, test_describe);
  tcase_add_test(tc, test_placement_math);
  tcase_add_test(tc, test_placement_names);
  tcase_add_test(tc, test_param_placement);
  tcase_add_test(tc, test_plan_ops);
  tcase_add_test(tc, test_dtensor_local);
  suite_add_tcase(s, tc);
  tc = tcase_create("cp");
  tcase_add_test(tc, test_cp_attention_headtail);
  tcase_add_test(tc, test_cp_chunk_shift_edges);
#ifdef HAVE_GLOO
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_cp_ring, 0, 2); /* 2 and 4 ranks */
#endif
  suite_add_tcase(s, tc);
#ifdef HAVE_GLOO
  tc = tcase_create("gloo");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_gloo_1d, 0, 4);
  tcase_add_test(tc, test_gloo_2d);
  tcase_add_test(tc, test_gloo_mesh_groups);
  suite_add_tcase(s, tc);
#endif
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(dtensor_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
