/* tests/check_checkpoint.c: the checkpoint library with synthetic tensors —
 * the files and metadata a save leaves, round trips (sync, async, bf16),
 * replicated chunks written once, resharding (Shard(0) over 4 ranks with
 * uneven and empty chunks loaded over 3 ranks, as Shard(1) and whole),
 * incomplete steps skipped, corrupted and truncated data named by file
 * and byte offset, keep_latest_k (and its purge of incomplete step folders
 * older than the step committed). Ranks are threads sharing a summing
 * communicator. */
#include "config.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h> /* reading metadata.json */

#include "trainrun/checkpoint.h"
#include "trainrun/error.h"
#include "trainrun/param.h" /* TRAINRUN_CKPT_TEST_WRITE_BPS */
#include "trainrun/tensor.h"
#include "trainrun/trainer.h"
#include "tests/fixtures.h"

static void setup(void) { fx_tmpdir_make("check_ckpt"); }
static void teardown(void) { fx_tmpdir_remove(); }

/* The value of element i of tensor `id`. */
static float val(int id, int64_t i) { return (float)(id * 1000 + i) * 0.5f; }

/* A host f32 tensor holding box [off, off+shape) of global tensor id of
 * global shape gs (2-D or 1-D), filled with val(). */
static void fill_box(tr_tensor_t* t, int id, int nd, const int64_t* gs,
                     const int64_t* off, const int64_t* shape) {
  ck_assert_int_eq(tr_tensor_empty(t, TR_F32, TR_DEVICE_CPU, nd, shape), 0);
  float* p = tr_tensor_data(t);
  int64_t n = tr_tensor_numel(t);
  for (int64_t k = 0; k < n; k++) {
    int64_t g;
    if (nd == 1)
      g = off[0] + k;
    else
      g = (off[0] + k / shape[1]) * gs[1] + off[1] + k % shape[1];
    p[k] = val(id, g);
  }
}

static void check_box(const tr_tensor_t* t, int id, int nd, const int64_t* gs,
                      const int64_t* off) {
  const float* p = tr_tensor_data(t);
  int64_t n = tr_tensor_numel(t);
  for (int64_t k = 0; k < n; k++) {
    int64_t g;
    if (nd == 1)
      g = off[0] + k;
    else
      g = (off[0] + k / t->shape[1]) * gs[1] + off[1] + k % t->shape[1];
    ck_assert_msg(p[k] == val(id, g), "tensor %d element %lld: %g, want %g", id,
                  (long long)g, (double)p[k], (double)val(id, g));
  }
}

/* ---- a communicator of threads ---- */

enum { MAXW = 8 };
typedef struct {
  pthread_barrier_t bar;
  double slot[MAXW][8];
  int world;
} tcomm_t;

typedef struct {
  tcomm_t* c;
  int rank;
} trank_t;

static int tsum(void* arg, double* v, int n) {
  trank_t* r = arg;
  tcomm_t* c = r->c;
  memcpy(c->slot[r->rank], v, (size_t)n * sizeof *v);
  pthread_barrier_wait(&c->bar);
  for (int i = 0; i < n; i++) {
    double s = 0;
    for (int k = 0; k < c->world; k++) s += c->slot[k][i];
    v[i] = s;
  }
  pthread_barrier_wait(&c->bar);
  return 0;
}

/* ---- one rank's save: tensor 1 = [10, 6] Shard(0) (rows 3,3,3,1 over 4),
 * tensor 2 = [2, 5] Shard(0) (1,1,0,0: empty chunks), tensor 3 = [7]
 * replicated, tensor 4 = [4, 4] replicated ---- */

typedef struct {
  trank_t tr;
  tr_ckpt_mode_t mode;
  int64_t step;
  int bad; /* this rank passes a chunk outside its tensor */
  int rc;
  char msg[640];
} saver_arg_t;

static const int64_t gs1[2] = {10, 6}, gs2[2] = {2, 5}, gs3[1] = {7},
                     gs4[2] = {4, 4};

static void* save_rank(void* arg) {
  saver_arg_t* a = arg;
  int r = a->tr.rank, world = a->tr.c->world;
  tr_tensor_t t[4];
  tr_ckpt_item_t it[4];
  memset(it, 0, sizeof it);
  int64_t st, len;
  tr_chunk_range(10, world, r, &st, &len);
  int64_t o1[2] = {st, 0}, s1[2] = {len, 6};
  fill_box(&t[0], 1, 2, gs1, o1, s1);
  tr_chunk_range(2, world, r, &st, &len);
  int64_t o2[2] = {st, 0}, s2[2] = {len, 5};
  fill_box(&t[1], 2, 2, gs2, o2, s2);
  int64_t z[2] = {0, 0};
  fill_box(&t[2], 3, 1, gs3, z, gs3);
  fill_box(&t[3], 4, 2, gs4, z, gs4);
  const char* names[4] = {"w1", "w2", "rep1", "rep2"};
  const int64_t* gss[4] = {gs1, gs2, gs3, gs4};
  const int64_t* offs[4] = {o1, o2, z, z};
  for (int i = 0; i < 4; i++) {
    it[i].name = names[i];
    it[i].ndim = i == 2 ? 1 : 2;
    memcpy(it[i].shape, gss[i], (size_t)it[i].ndim * 8);
    memcpy(it[i].offset, offs[i], (size_t)it[i].ndim * 8);
    it[i].tensor = &t[i];
    it[i].replicated = i >= 2;
  }
  if (a->bad) it[0].offset[1] = 3; /* 6 columns from 3: past the 6 */
  char folder[400];
  snprintf(folder, sizeof folder, "%s/ck", fx_tmpdir);
  tr_ckpt_saver_opts_t o = {.folder = folder,
                            .comm = {.rank = r,
                                     .world = world,
                                     .all_reduce_sum = tsum,
                                     .arg = &a->tr},
                            .mode = a->mode,
                            .layout_json = "{\"dp\":4}"};
  tr_ckpt_saver_t* s;
  tr_errmsg_t err;
  a->rc = tr_ckpt_saver_new(&o, &s, &err);
  if (a->rc == 0)
    a->rc =
        tr_ckpt_save(s, a->step, it, 4, "{\"step\":7,\"x\":[1,2]}", NULL, &err);
  /* the caller may change its host tensors once they are staged (async:
   * the writer thread copies them, as the trainer's next forward runs) */
  if (a->rc == 0) a->rc = tr_ckpt_wait_staged(s);
  for (int i = 0; i < 4; i++) tr_tensor_fill(&t[i], -1.0);
  for (int k = 0; a->rc == 0 && k < 3; k++) a->rc = tr_ckpt_poll(s, &err);
  if (a->rc == 0) a->rc = tr_ckpt_wait(s, &err);
  if (a->rc < 0) snprintf(a->msg, sizeof a->msg, "%s", err.message);
  tr_ckpt_saver_free(s);
  for (int i = 0; i < 4; i++) tr_tensor_release(&t[i]);
  return NULL;
}

static void save_world_bad(int world, tr_ckpt_mode_t mode, int64_t step,
                           int bad_rank) {
  tcomm_t c;
  c.world = world;
  pthread_barrier_init(&c.bar, NULL, (unsigned)world);
  pthread_t th[MAXW];
  saver_arg_t a[MAXW];
  for (int r = 0; r < world; r++) {
    memset(&a[r], 0, sizeof a[r]);
    a[r].tr.c = &c;
    a[r].tr.rank = r;
    a[r].mode = mode;
    a[r].step = step;
    a[r].bad = r == bad_rank;
    pthread_create(&th[r], NULL, save_rank, &a[r]);
  }
  for (int r = 0; r < world; r++) pthread_join(th[r], NULL);
  pthread_barrier_destroy(&c.bar);
  for (int r = 0; r < world; r++) {
    if (bad_rank < 0) {
      ck_assert_msg(a[r].rc == 0, "rank %d: %s", r, a[r].msg);
    } else {
      /* every rank fails, none hangs */
      ck_assert_msg(a[r].rc < 0, "rank %d succeeded", r);
      ck_assert_msg(r == bad_rank ? strstr(a[r].msg, "leaves the global")
                                  : strstr(a[r].msg, "1 rank(s) could not"),
                    "rank %d: %s", r, a[r].msg);
    }
  }
}

static void save_world(int world, tr_ckpt_mode_t mode, int64_t step) {
  save_world_bad(world, mode, step, -1);
}

START_TEST(test_failed_rank) {
  save_world_bad(4, TR_CKPT_ASYNC, 3, 2);
  save_world_bad(4, TR_CKPT_SYNC, 4, 0);
  char path[500];
  snprintf(path, sizeof path, "%s/ck/step-3/metadata.json", fx_tmpdir);
  ck_assert_int_ne(access(path, F_OK), 0);
  snprintf(path, sizeof path, "%s/ck/step-4/metadata.json", fx_tmpdir);
  ck_assert_int_ne(access(path, F_OK), 0);
}
END_TEST

static tr_ckpt_t* open_step(int64_t step) {
  char dir[400];
  snprintf(dir, sizeof dir, "%s/ck/step-%lld", fx_tmpdir, (long long)step);
  tr_ckpt_t* ck;
  tr_errmsg_t err;
  int rc = tr_ckpt_open(&ck, dir, &err);
  ck_assert_msg(rc == 0, "%s", err.message);
  return ck;
}

/* Load global tensor id (name) as box [off, off+shape) and check it. */
static void load_box(const tr_ckpt_t* ck, const char* name, int id, int nd,
                     const int64_t* gs, const int64_t* off,
                     const int64_t* shape) {
  tr_tensor_t t;
  ck_assert_int_eq(tr_tensor_zeros(&t, TR_F32, TR_DEVICE_CPU, nd, shape), 0);
  tr_ckpt_item_t it = {.name = name, .ndim = nd, .tensor = &t};
  memcpy(it.shape, gs, (size_t)nd * 8);
  memcpy(it.offset, off, (size_t)nd * 8);
  tr_errmsg_t err;
  int rc = tr_ckpt_load(ck, &it, 1, &err);
  ck_assert_msg(rc == 0, "%s", err.message);
  check_box(&t, id, nd, gs, off);
  tr_tensor_release(&t);
}

static void check_reshard(int64_t step) {
  tr_ckpt_t* ck = open_step(step);
  ck_assert_int_eq(ck->step, step);
  ck_assert_int_eq(ck->world_size, 4);
  ck_assert_str_eq(ck->layout_json, "{\"dp\":4}");
  ck_assert_str_eq(ck->train_state_json, "{\"step\":7,\"x\":[1,2]}");
  ck_assert_uint_eq(ck->ntensors, 4);
  ck_assert_str_eq(ck->tensors[0].name, "w1");
  /* w1: four chunks of 3,3,3,1 rows; w2: two (the empty ones are not
   * written); replicated tensors once */
  ck_assert_uint_eq(tr_ckpt_find(ck, "w1")->nchunks, 4);
  ck_assert_uint_eq(tr_ckpt_find(ck, "w2")->nchunks, 2);
  ck_assert_uint_eq(tr_ckpt_find(ck, "rep1")->nchunks, 1);
  ck_assert_uint_eq(tr_ckpt_find(ck, "rep2")->nchunks, 1);
  /* replicated tensors spread over ranks: not both in rank 0's file */
  ck_assert_str_ne(tr_ckpt_find(ck, "rep1")->chunks[0].file,
                   tr_ckpt_find(ck, "rep2")->chunks[0].file);
  /* as Shard(0) over 3 ranks (rows 4,4,2 and 1,1,0) */
  for (int r = 0; r < 3; r++) {
    int64_t st, len;
    tr_chunk_range(10, 3, r, &st, &len);
    int64_t o[2] = {st, 0}, s[2] = {len, 6};
    load_box(ck, "w1", 1, 2, gs1, o, s);
    tr_chunk_range(2, 3, r, &st, &len);
    int64_t o2[2] = {st, 0}, s2[2] = {len, 5};
    load_box(ck, "w2", 2, 2, gs2, o2, s2);
  }
  /* as Shard(1) over 4 ranks (columns 2,2,2,0) */
  for (int r = 0; r < 4; r++) {
    int64_t st, len;
    tr_chunk_range(6, 4, r, &st, &len);
    int64_t o[2] = {0, st}, s[2] = {10, len};
    load_box(ck, "w1", 1, 2, gs1, o, s);
  }
  /* whole, and a replicated tensor as a shard */
  int64_t z[2] = {0, 0};
  load_box(ck, "w1", 1, 2, gs1, z, gs1);
  load_box(ck, "w2", 2, 2, gs2, z, gs2);
  load_box(ck, "rep1", 3, 1, gs3, z, gs3);
  int64_t o4[2] = {1, 1}, s4[2] = {2, 3};
  load_box(ck, "rep2", 4, 2, gs4, o4, s4);
  int64_t bytes = 0;
  tr_errmsg_t err;
  ck_assert_int_eq(tr_ckpt_verify(ck, &bytes, &err), 0);
  ck_assert_int_eq(bytes, (60 + 10 + 7 + 16) * 4);
  tr_ckpt_close(ck);
}

START_TEST(test_reshard_sync) {
  save_world(4, TR_CKPT_SYNC, 7);
  check_reshard(7);
}
END_TEST

START_TEST(test_reshard_async) {
  save_world(4, TR_CKPT_ASYNC, 9);
  check_reshard(9);
  save_world(4, TR_CKPT_ASYNC_PINNED, 10);
  check_reshard(10);
}
END_TEST

/* ---- the files of a save ---- */

/* Save one [3, 4] tensor "a" and a [5] tensor "b" on one rank. */
static void save_one(const char* folder, int64_t step, tr_ckpt_mode_t mode,
                     int keep, const tr_dtype_t* as) {
  int64_t sa[2] = {3, 4}, sb[1] = {5}, z[2] = {0, 0};
  tr_tensor_t a, b;
  fill_box(&a, 1, 2, sa, z, sa);
  fill_box(&b, 2, 1, sb, z, sb);
  tr_ckpt_item_t it[2] = {
      {.name = "a", .ndim = 2, .shape = {3, 4}, .tensor = &a},
      {.name = "b", .ndim = 1, .shape = {5}, .tensor = &b}};
  tr_ckpt_saver_opts_t o = {.folder = folder,
                            .comm = {.rank = 0, .world = 1},
                            .mode = mode,
                            .keep_latest_k = keep};
  tr_ckpt_saver_t* s;
  tr_errmsg_t err;
  ck_assert_int_eq(tr_ckpt_saver_new(&o, &s, &err), 0);
  int rc = tr_ckpt_save(s, step, it, 2, NULL, as, &err);
  if (rc == 0) rc = tr_ckpt_wait(s, &err);
  ck_assert_msg(rc == 0, "%s", err.message);
  tr_ckpt_stats_t st;
  tr_ckpt_saver_stats(s, &st);
  ck_assert_int_eq(st.committed_step, step);
  ck_assert_int_eq(st.bytes,
                   (12 + 5) * (int64_t)tr_dtype_size(as ? *as : TR_F32));
  tr_ckpt_saver_free(s);
  tr_tensor_release(&a);
  tr_tensor_release(&b);
}

START_TEST(test_files) {
  char folder[400], path[500];
  snprintf(folder, sizeof folder, "%s/c", fx_tmpdir);
  save_one(folder, 3, TR_CKPT_SYNC, 0, NULL);
  snprintf(path, sizeof path, "%s/step-3/metadata.json", folder);
  size_t len;
  char* text = (char*)fx_slurp(path, &len);
  json_error_t je;
  json_t* m = json_loads(text, 0, &je);
  ck_assert_ptr_nonnull(m);
  ck_assert_str_eq(json_string_value(json_object_get(m, "format")),
                   "trainrun-checkpoint");
  ck_assert_int_eq(json_integer_value(json_object_get(m, "version")), 1);
  ck_assert_int_eq(json_integer_value(json_object_get(m, "step")), 3);
  json_t* t0 = json_array_get(json_object_get(m, "tensors"), 0);
  ck_assert_str_eq(json_string_value(json_object_get(t0, "name")), "a");
  ck_assert_str_eq(json_string_value(json_object_get(t0, "dtype")), "F32");
  json_t* c0 = json_array_get(json_object_get(t0, "chunks"), 0);
  ck_assert_str_eq(json_string_value(json_object_get(c0, "file")),
                   "rank-00000.bin");
  ck_assert_int_eq(json_integer_value(json_object_get(c0, "offset")), 64);
  ck_assert_int_eq(json_integer_value(json_object_get(c0, "length")), 48);
  json_decref(m);
  free(text);
  /* the data file: magic, then the chunk at its offset, as written */
  snprintf(path, sizeof path, "%s/step-3/rank-00000.bin", folder);
  char* bin = (char*)fx_slurp(path, &len);
  ck_assert_int_eq(memcmp(bin, "TRCKPT01", 8), 0);
  float f;
  memcpy(&f, bin + 64 + 4 * 5, 4);
  ck_assert(f == val(1, 5));
  memcpy(&f, bin + 128 + 4 * 2, 4); /* b starts 64-aligned after a */
  ck_assert(f == val(2, 2));
  free(bin);
  /* no temporary file is left */
  snprintf(path, sizeof path, "%s/step-3/metadata.json.tmp", folder);
  ck_assert_int_ne(access(path, F_OK), 0);
}
END_TEST

START_TEST(test_bf16_and_async_single) {
  char folder[400], dir[500];
  snprintf(folder, sizeof folder, "%s/c", fx_tmpdir);
  tr_dtype_t bf = TR_BF16;
  save_one(folder, 1, TR_CKPT_ASYNC, 0, &bf);
  snprintf(dir, sizeof dir, "%s/step-1", folder);
  tr_ckpt_t* ck;
  tr_errmsg_t err;
  ck_assert_int_eq(tr_ckpt_open(&ck, dir, &err), 0);
  ck_assert_int_eq(tr_ckpt_find(ck, "a")->dtype, TR_BF16);
  int64_t sa[2] = {3, 4};
  /* loaded into f32: the values rounded to bf16 */
  tr_tensor_t t;
  ck_assert_int_eq(tr_tensor_zeros(&t, TR_F32, TR_DEVICE_CPU, 2, sa), 0);
  tr_ckpt_item_t it = {.name = "a", .ndim = 2, .shape = {3, 4}, .tensor = &t};
  ck_assert_int_eq(tr_ckpt_load(ck, &it, 1, &err), 0);
  const float* p = tr_tensor_data(&t);
  int inexact = 0;
  for (int k = 0; k < 12; k++) {
    float want = tr_bf16_to_f32(tr_f32_to_bf16(val(1, k)));
    ck_assert_msg(p[k] == want, "element %d: %g, want %g", k, (double)p[k],
                  (double)want);
    inexact += want != val(1, k);
  }
  ck_assert_int_gt(inexact, 0); /* the save did convert */
  /* a missing tensor and another global shape are errors */
  it.name = "zz";
  ck_assert_int_eq(tr_ckpt_load(ck, &it, 1, &err), TR_ENOTFOUND);
  ck_assert_ptr_nonnull(strstr(err.message, "has no tensor 'zz'"));
  it.name = "a";
  it.shape[1] = 5;
  ck_assert_int_eq(tr_ckpt_load(ck, &it, 1, &err), TR_EINVAL);
  tr_tensor_release(&t);
  tr_ckpt_close(ck);
}
END_TEST

START_TEST(test_incomplete_skipped) {
  char folder[400], dir[500];
  snprintf(folder, sizeof folder, "%s/c", fx_tmpdir);
  save_one(folder, 5, TR_CKPT_SYNC, 0, NULL);
  save_one(folder, 7, TR_CKPT_SYNC, 0, NULL);
  snprintf(dir, sizeof dir, "%s/step-7/metadata.json", folder);
  ck_assert_int_eq(unlink(dir), 0); /* a save that never committed */
  snprintf(dir, sizeof dir, "%s/step-9", folder);
  ck_assert_int_eq(mkdir(dir, 0777), 0); /* one that wrote nothing */
  int64_t step = -1;
  tr_errmsg_t err;
  ck_assert_int_eq(tr_ckpt_latest(folder, &step, &err), 0);
  ck_assert_int_eq(step, 5);
  tr_ckpt_entry_t* v;
  size_t n;
  ck_assert_int_eq(tr_ckpt_list(folder, &v, &n, &err), 0);
  ck_assert_uint_eq(n, 3);
  ck_assert_int_eq(v[0].step, 5);
  ck_assert_int_eq(v[0].complete, 1);
  ck_assert_int_eq(v[1].step, 7);
  ck_assert_int_eq(v[1].complete, 0);
  ck_assert_int_gt(v[1].bytes, 0);
  free(v);
  snprintf(dir, sizeof dir, "%s/step-7", folder);
  tr_ckpt_t* ck;
  ck_assert_int_eq(tr_ckpt_open(&ck, dir, &err), TR_ENOTFOUND);
  ck_assert_ptr_nonnull(strstr(err.message, "is incomplete"));
  /* no complete step at all */
  snprintf(dir, sizeof dir, "%s/none", fx_tmpdir);
  ck_assert_int_eq(tr_ckpt_latest(dir, &step, &err), TR_ENOTFOUND);
}
END_TEST

START_TEST(test_corrupt_and_truncated) {
  char folder[400], dir[500], bin[600];
  snprintf(folder, sizeof folder, "%s/c", fx_tmpdir);
  save_one(folder, 2, TR_CKPT_SYNC, 0, NULL);
  snprintf(dir, sizeof dir, "%s/step-2", folder);
  snprintf(bin, sizeof bin, "%s/rank-00000.bin", dir);
  /* flip one byte of tensor b (at 128..148) */
  int fd = open(bin, O_RDWR);
  ck_assert_int_ge(fd, 0);
  unsigned char c;
  ck_assert_int_eq(pread(fd, &c, 1, 130), 1);
  c ^= 0x40;
  ck_assert_int_eq(pwrite(fd, &c, 1, 130), 1);
  tr_ckpt_t* ck;
  tr_errmsg_t err;
  ck_assert_int_eq(tr_ckpt_open(&ck, dir, &err), 0);
  ck_assert_int_eq(tr_ckpt_verify(ck, NULL, &err), TR_ECHECKSUM);
  char want[800];
  snprintf(want, sizeof want,
           "'%s': checksum mismatch at byte offset 128 (tensor 'b', 20 bytes)",
           bin);
  ck_assert_msg(strstr(err.message, want), "%s", err.message);
  /* loading a (is fine) and b (fails the same way) */
  int64_t sa[2] = {3, 4}, z[2] = {0, 0};
  load_box(ck, "a", 1, 2, sa, z, sa);
  tr_tensor_t t;
  int64_t sb[1] = {5};
  ck_assert_int_eq(tr_tensor_zeros(&t, TR_F32, TR_DEVICE_CPU, 1, sb), 0);
  tr_ckpt_item_t it = {.name = "b", .ndim = 1, .shape = {5}, .tensor = &t};
  ck_assert_int_eq(tr_ckpt_load(ck, &it, 1, &err), TR_ECHECKSUM);
  ck_assert_msg(strstr(err.message, want), "%s", err.message);
  /* truncated inside a */
  ck_assert_int_eq(ftruncate(fd, 100), 0);
  close(fd);
  ck_assert_int_eq(tr_ckpt_verify(ck, NULL, &err), TR_EFORMAT);
  snprintf(want, sizeof want,
           "'%s' is truncated: tensor 'a' needs bytes [64, 112) but the "
           "file ends at byte offset 100",
           bin);
  ck_assert_msg(strstr(err.message, want), "%s", err.message);
  ck_assert_int_eq(tr_ckpt_load(ck, &it, 1, &err), TR_EFORMAT);
  tr_tensor_release(&t);
  tr_ckpt_close(ck);
  /* bad metadata is named */
  snprintf(bin, sizeof bin, "%s/metadata.json", dir);
  FILE* f = fopen(bin, "w");
  fputs("{\"format\": \"trainrun-checkpoint\", \"version\": 99}", f);
  fclose(f);
  ck_assert_int_eq(tr_ckpt_open(&ck, dir, &err), TR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err.message, "version 99"));
}
END_TEST

/* A step folder with one file and no metadata (what a save that crashed
 * leaves), or a Hugging Face export alone (index named). */
static void fake_step(const char* folder, int64_t step, const char* file) {
  char dir[500], path[600];
  snprintf(dir, sizeof dir, "%s/step-%lld", folder, (long long)step);
  ck_assert_int_eq(mkdir(folder, 0777) == 0 || errno == EEXIST, 1);
  ck_assert_int_eq(mkdir(dir, 0777), 0);
  snprintf(path, sizeof path, "%s/%s", dir, file);
  fx_write_bytes(path, "partial", 7);
}

START_TEST(test_keep_latest_k) {
  char folder[400];
  snprintf(folder, sizeof folder, "%s/c", fx_tmpdir);
  /* left by a crashed run: incomplete steps older than what this run
   * saves (purged), one newer (kept: it could be a save in progress), and
   * a Hugging Face export alone (kept) */
  fake_step(folder, 5, "rank-00000.bin");
  fake_step(folder, 35, "rank-00001.bin");
  fake_step(folder, 7, TR_CKPT_HF_INDEX);
  fake_step(folder, 99, "rank-00000.bin");
  tr_ckpt_entry_t* v;
  size_t n;
  tr_errmsg_t err;
  ck_assert_int_eq(tr_ckpt_list(folder, &v, &n, &err), 0);
  ck_assert_uint_eq(n, 4);
  ck_assert(!v[1].complete && v[1].hf && !v[0].hf);
  free(v);
  /* the first commit (step 10) purges step-5, not step-35 */
  save_one(folder, 10, TR_CKPT_SYNC, 2, NULL);
  char dir[500];
  snprintf(dir, sizeof dir, "%s/step-5", folder);
  ck_assert_int_eq(access(dir, F_OK), -1);
  snprintf(dir, sizeof dir, "%s/step-35", folder);
  ck_assert_int_eq(access(dir, F_OK), 0);
  for (int s = 2; s <= 5; s++) save_one(folder, s * 10, TR_CKPT_SYNC, 2, NULL);
  ck_assert_int_eq(tr_ckpt_list(folder, &v, &n, &err), 0);
  ck_assert_uint_eq(n, 4);
  ck_assert_int_eq(v[0].step, 7);
  ck_assert(v[0].hf && !v[0].complete);
  ck_assert_int_eq(v[1].step, 40);
  ck_assert_int_eq(v[2].step, 50);
  ck_assert(v[1].complete && v[2].complete);
  ck_assert_int_eq(v[3].step, 99);
  ck_assert(!v[3].complete);
  free(v);
  ck_assert_int_eq(tr_ckpt_remove_step(folder, 99), 0);
  ck_assert_int_eq(tr_ckpt_remove_step(folder, 7), 0); /* index first */
  snprintf(dir, sizeof dir, "%s/step-7", folder);
  ck_assert_int_eq(access(dir, F_OK), -1);
  /* saving a step again replaces it */
  save_one(folder, 50, TR_CKPT_SYNC, 0, NULL);
  int64_t step;
  ck_assert_int_eq(tr_ckpt_latest(folder, &step, &err), 0);
  ck_assert_int_eq(step, 50);
}
END_TEST

START_TEST(test_partial_reads) {
  /* a [1024, 1024] f32 tensor is 4 checksum blocks of 1 MiB: loading some
   * rows reads only their blocks, so damage elsewhere does not stop it,
   * while damage inside them is found */
  char folder[400], dir[500], bin[600];
  snprintf(folder, sizeof folder, "%s/c", fx_tmpdir);
  int64_t gs[2] = {1024, 1024}, z[2] = {0, 0};
  tr_tensor_t a;
  fill_box(&a, 5, 2, gs, z, gs);
  tr_ckpt_item_t it = {
      .name = "big", .ndim = 2, .shape = {1024, 1024}, .tensor = &a};
  tr_ckpt_saver_opts_t o = {.folder = folder, .comm = {.rank = 0, .world = 1}};
  tr_ckpt_saver_t* s;
  tr_errmsg_t err;
  ck_assert_int_eq(tr_ckpt_saver_new(&o, &s, &err), 0);
  ck_assert_int_eq(tr_ckpt_save(s, 1, &it, 1, NULL, NULL, &err), 0);
  tr_ckpt_saver_free(s);
  tr_tensor_release(&a);
  snprintf(dir, sizeof dir, "%s/step-1", folder);
  snprintf(bin, sizeof bin, "%s/rank-00000.bin", dir);
  tr_ckpt_t* ck;
  ck_assert_int_eq(tr_ckpt_open(&ck, dir, &err), 0);
  ck_assert_uint_eq(tr_ckpt_find(ck, "big")->chunks[0].ncrc, 4);
  /* rows [100, 300) span blocks 0 and 1, unaligned */
  int64_t o1[2] = {100, 0}, s1[2] = {200, 1024};
  load_box(ck, "big", 5, 2, gs, o1, s1);
  /* damage block 3 (bytes [3 MiB, 4 MiB) of the chunk, at file offset 64) */
  int fd = open(bin, O_RDWR);
  ck_assert_int_ge(fd, 0);
  unsigned char c = 0x5a;
  ck_assert_int_eq(pwrite(fd, &c, 1, 64 + (3 << 20) + 10), 1);
  close(fd);
  load_box(ck, "big", 5, 2, gs, o1, s1); /* blocks 0-1 only: still fine */
  int64_t o2[2] = {700, 0}, s2[2] = {324, 1024};
  tr_tensor_t t;
  ck_assert_int_eq(tr_tensor_zeros(&t, TR_F32, TR_DEVICE_CPU, 2, s2), 0);
  it.tensor = &t;
  it.offset[0] = o2[0];
  ck_assert_int_eq(tr_ckpt_load(ck, &it, 1, &err), TR_ECHECKSUM);
  char want[700];
  snprintf(want, sizeof want,
           "'%s': checksum mismatch at byte offset %d (tensor 'big', 1048576 "
           "bytes)",
           bin, 64 + (3 << 20));
  ck_assert_msg(strstr(err.message, want), "%s", err.message);
  ck_assert_int_eq(tr_ckpt_verify(ck, NULL, &err), TR_ECHECKSUM);
  ck_assert_msg(strstr(err.message, want), "%s", err.message);
  tr_tensor_release(&t);
  tr_ckpt_close(ck);
}
END_TEST

START_TEST(test_kill_during_async_write) {
  /* a process saves step 1, starts an async save of step 2 (64 MB) and is
   * killed with SIGKILL while its thread writes: step 1 stays loadable and
   * step 2 is skipped */
  char folder[400], dir[500];
  snprintf(folder, sizeof folder, "%s/c", fx_tmpdir);
  int fds[2];
  ck_assert_int_eq(pipe(fds), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    save_one(folder, 1, TR_CKPT_SYNC, 0, NULL);
    int64_t shape[1] = {16 << 20};
    tr_tensor_t big;
    if (tr_tensor_zeros(&big, TR_F32, TR_DEVICE_CPU, 1, shape) < 0) _exit(3);
    tr_ckpt_item_t it = {
        .name = "big", .ndim = 1, .shape = {16 << 20}, .tensor = &big};
    tr_ckpt_saver_opts_t o = {.folder = folder,
                              .comm = {.rank = 0, .world = 1},
                              .mode = TR_CKPT_ASYNC};
    tr_ckpt_saver_t* sv;
    if (tr_ckpt_saver_new(&o, &sv, NULL) < 0 ||
        tr_ckpt_save(sv, 2, &it, 1, NULL, NULL, NULL) < 0)
      _exit(4);
    char c = 1;
    if (write(fds[1], &c, 1) != 1) _exit(5);
    for (;;) pause(); /* never commits */
  }
  close(fds[1]);
  char c = 0;
  ck_assert_int_eq(read(fds[0], &c, 1), 1);
  kill(pid, SIGKILL);
  int status;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  close(fds[0]);
  snprintf(dir, sizeof dir, "%s/step-2", folder);
  ck_assert_int_eq(access(dir, F_OK), 0); /* the save had started */
  int64_t step = -1;
  tr_errmsg_t err;
  ck_assert_int_eq(tr_ckpt_latest(folder, &step, &err), 0);
  ck_assert_int_eq(step, 1);
  snprintf(dir, sizeof dir, "%s/step-1", folder);
  tr_ckpt_t* ck;
  ck_assert_int_eq(tr_ckpt_open(&ck, dir, &err), 0);
  ck_assert_int_eq(tr_ckpt_verify(ck, NULL, &err), 0);
  int64_t sa[2] = {3, 4}, z[2] = {0, 0};
  load_box(ck, "a", 1, 2, sa, z, sa);
  tr_ckpt_close(ck);
}
END_TEST

/* ---- a trainer's async save does not hold its next steps ---- */

static double mono_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The weights and AdamW moments of t, one buffer each (free them). */
static float** snapshot(const tr_trainer_t* t) {
  int np = t->model.n_params;
  float** v = calloc((size_t)np * 3, sizeof *v);
  ck_assert_ptr_nonnull(v);
  for (int i = 0; i < np; i++) {
    const tr_tensor_t* ts[3] = {&t->model.params[i].data, &t->adam_m[i],
                                &t->adam_v[i]};
    for (int w = 0; w < 3; w++) {
      size_t nb = tr_tensor_nbytes(ts[w]);
      v[w * np + i] = malloc(nb + 1);
      ck_assert_ptr_nonnull(v[w * np + i]);
      memcpy(v[w * np + i], tr_tensor_data(ts[w]), nb);
    }
  }
  return v;
}

START_TEST(test_steps_do_not_wait_for_writer) {
  /* The writer is throttled to a crawl (TRAINRUN_CKPT_TEST_WRITE_BPS: the
   * step-3 save takes 4 s to write). The two steps after the save must
   * finish while it is still being written (no rank-00000.json, no
   * metadata.json yet), each far quicker than the write; the stall the
   * trainer reports leaves the write out; and the checkpoint, once
   * committed, holds the state after step 3 bit for bit although steps 4
   * and 5 changed the tensors while it was written. */
  fx_write_corpus(fx_path("corpus.txt"), 20000);
  tr_config_t cfg;
  fx_make_cfg(&cfg, (const char* const[]){
                        "checkpoint.enable", "true", "checkpoint.interval", "3",
                        "checkpoint.async_mode", "async_with_pinned_mem",
                        "training.steps", "5", NULL});
  tr_model_config_t mc = fx_tiny_model("gpt2");
  tr_trainer_settings_t ts;
  ck_assert_int_eq(fx_settings(&cfg, &mc, &ts), 0);
  tr_trainer_opts_t o = {.quiet = 1};
  tr_trainer_t t;
  tr_errmsg_t err;
  ck_assert_msg(tr_trainer_init(&t, &ts, &o, &err) == 0, "%s", err.message);
  FILE* con = tmpfile();
  ck_assert_msg(tr_trainer_checkpoint_start(&t, con, NULL, &err) == 0, "%s",
                err.message);
  int64_t bytes = 0;
  for (int i = 0; i < t.model.n_params; i++)
    bytes += 3 * (int64_t)tr_tensor_nbytes(&t.model.params[i].data);
  const double write_s = 4.0;
  char bps[32];
  snprintf(bps, sizeof bps, "%lld", (long long)(bytes / write_s));
  setenv("TRAINRUN_CKPT_TEST_WRITE_BPS", bps, 1);
  tr_param_reset();
  float** saved = NULL;
  double save_end = 0, after[2] = {0, 0};
  for (int s = 1; s <= 5; s++) {
    tr_step_stats_t st;
    ck_assert_msg(tr_trainer_step(&t, &st, &err) == 0, "%s", err.message);
    if (s == 3) saved = snapshot(&t);
    ck_assert_msg(tr_trainer_checkpoint_step(&t, &st, 0, &err) == 0, "%s",
                  err.message);
    if (s == 3) save_end = mono_now();
    if (s > 3) after[s - 4] = st.seconds;
  }
  double steps_s = mono_now() - save_end;
  /* still writing: the rank's chunk list and the metadata come last */
  ck_assert_int_eq(
      access(fx_path("out/checkpoint/step-3/rank-00000.bin"), F_OK), 0);
  ck_assert_msg(
      access(fx_path("out/checkpoint/step-3/rank-00000.json"), F_OK) != 0,
      "the write finished before the steps after the save (%.3f s)", steps_s);
  ck_assert_int_ne(access(fx_path("out/checkpoint/step-3/metadata.json"), F_OK),
                   0);
  for (int k = 0; k < 2; k++)
    ck_assert_msg(after[k] < write_s / 4, "step %d took %.3f s", 4 + k,
                  after[k]);
  ck_assert_msg(steps_s < write_s / 2, "steps 4-5 took %.3f s", steps_s);
  double t0 = mono_now();
  ck_assert_msg(tr_trainer_checkpoint_finish(&t, &err) == 0, "%s", err.message);
  /* the write went on after the steps: finishing waited for it */
  ck_assert_msg(mono_now() - t0 > write_s / 4, "finish waited %.3f s",
                mono_now() - t0);
  unsetenv("TRAINRUN_CKPT_TEST_WRITE_BPS");
  tr_param_reset();
  ck_assert_int_eq(access(fx_path("out/checkpoint/step-3/metadata.json"), F_OK),
                   0);
  /* the console: the save, its stall (steps 3-5, without the write) */
  rewind(con);
  char line[512];
  int started = 0, stalled = 0;
  while (fgets(line, sizeof line, con)) {
    started |= strstr(line, "checkpoint step 3: save started in ") == line &&
               strstr(line, ", writing in the background\n") != NULL;
    double v;
    if (sscanf(line, "checkpoint step 3: training stalled %lf s (steps 3-5",
               &v) == 1) {
      stalled = 1;
      ck_assert_msg(v >= 0 && v < write_s / 4, "%s", line);
    }
  }
  fclose(con);
  ck_assert(started);
  ck_assert(stalled);
  /* the state after step 3, bit for bit */
  tr_trainer_t u;
  ck_assert_msg(tr_trainer_init(&u, &ts, &o, &err) == 0, "%s", err.message);
  ck_assert_msg(tr_trainer_load_checkpoint(&u, fx_path("out/checkpoint/step-3"),
                                           0, &err) == 0,
                "%s", err.message);
  ck_assert_int_eq(u.step, 3);
  float** got = snapshot(&u);
  int np = t.model.n_params;
  for (int i = 0; i < np * 3; i++) {
    const tr_tensor_t* ref = &t.model.params[i % np].data;
    ck_assert_msg(memcmp(saved[i], got[i], tr_tensor_nbytes(ref)) == 0,
                  "%s (part %d) differs from the state after step 3",
                  t.model.params[i % np].name, i / np);
    free(saved[i]);
    free(got[i]);
  }
  free(saved);
  free(got);
  tr_trainer_release(&u);
  tr_trainer_release(&t);
  tr_config_release(&cfg);
}
END_TEST

START_TEST(test_mode_parse) {
  tr_ckpt_mode_t m;
  ck_assert_int_eq(tr_ckpt_mode_parse("disabled", &m), 0);
  ck_assert_int_eq(m, TR_CKPT_SYNC);
  ck_assert_int_eq(tr_ckpt_mode_parse("async_with_pinned_mem", &m), 0);
  ck_assert_int_eq(m, TR_CKPT_ASYNC_PINNED);
  ck_assert_int_eq(tr_ckpt_mode_parse("sync", &m), TR_EINVAL);
}
END_TEST

int main(void) {
  Suite* s = suite_create("checkpoint");
  TCase* tc = tcase_create("library");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_files);
  tcase_add_test(tc, test_reshard_sync);
  tcase_add_test(tc, test_reshard_async);
  tcase_add_test(tc, test_failed_rank);
  tcase_add_test(tc, test_bf16_and_async_single);
  tcase_add_test(tc, test_incomplete_skipped);
  tcase_add_test(tc, test_corrupt_and_truncated);
  tcase_add_test(tc, test_keep_latest_k);
  tcase_add_test(tc, test_partial_reads);
  tcase_add_test(tc, test_kill_during_async_write);
  tcase_add_test(tc, test_mode_parse);
  tcase_add_test(tc, test_steps_do_not_wait_for_writer);
  suite_add_tcase(s, tc);
  SRunner* sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
