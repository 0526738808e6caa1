/* bench/ckpt_bench.c: checkpoint figures on this machine — a state of
 * --gb GB (f32 tensors of 64 MiB) saved synchronously and asynchronously
 * (time each save holds the caller, write throughput) next to `dd` writing the
 * same number of bytes to the same folder with fsync, in the same run;
 * then load throughput (same layout) and reshard throughput (every tensor
 * loaded as Shard(0) over 3 ranks), and CRC-32C alone. Prints a table.
 *
 * What an asynchronous save holds a trainer: tr_ckpt_save's return,
 * then --step-ms of single-threaded compute standing for the next step's
 * forward and backward (the writer thread copies the state meanwhile), then
 * tr_ckpt_wait_staged before the "optimizer" may change the tensors.
 *
 * --device cuda[:N] measures the GPU path instead: the state on the GPU,
 * async_with_pinned_mem, its page-locked buffers reserved first (timed);
 * each save is followed at once by tr_ckpt_wait_staged and a fill of
 * every tensor on the device (the "update" the copies must precede), then
 * the save is committed, loaded back and compared bit for bit with the
 * state before the fill (exit 1 on a difference). Prints the time each
 * save held the caller, the device-to-host copy rate and the write. */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "trainrun/checkpoint.h"
#include "trainrun/error.h"
#include "trainrun/crc32c.h"
#include "trainrun/tensor.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Busy single-threaded arithmetic for about `seconds` (the next step's
 * forward and backward; not a sleep, so it holds a core as compute does). */
static void compute_for(double seconds) {
  static float acc[4096];
  double end = now() + seconds;
  float x = 1.0f;
  while (now() < end)
    for (int i = 0; i < 4096; i++) acc[i] = acc[i] * 0.999f + (x += 1e-6f);
}

static void die(const char* what, const tr_errmsg_t* err) {
  fprintf(stderr, "ckpt_bench: %s: %s\n", what, err->message);
  exit(1);
}

/* Drop the page cache when allowed (root, not in a read-only /proc), so
 * loads read the disk; returns 1 when it did. */
static int drop_caches(void) {
  sync();
  FILE* f = fopen("/proc/sys/vm/drop_caches", "w");
  if (!f) return 0;
  int ok = fputs("3\n", f) >= 0;
  return fclose(f) == 0 && ok;
}

/* Load step `step` of folder into host tensors like ts and compare them
 * bit for bit with want[i] (or, when want is NULL, with the constant v). */
static int same_as_saved(const char* folder, int64_t step, tr_tensor_t* ts,
                         const tr_ckpt_item_t* items, int n, float v,
                         const tr_tensor_t* want) {
  char dir[4400];
  tr_ckpt_step_dir(folder, step, dir, sizeof dir);
  tr_errmsg_t err;
  tr_ckpt_t* ck;
  if (tr_ckpt_open(&ck, dir, &err) < 0) die("open", &err);
  int same = 1;
  for (int i = 0; i < n && same; i++) {
    tr_tensor_t h;
    if (tr_tensor_empty(&h, TR_F32, TR_DEVICE_CPU, 2, ts[i].shape) < 0)
      return 0;
    tr_ckpt_item_t it = items[i];
    it.tensor = &h;
    if (tr_ckpt_load(ck, &it, 1, &err) < 0) die("load", &err);
    const float* p = tr_tensor_data(&h);
    if (want) {
      same = memcmp(p, tr_tensor_data(&want[i]), tr_tensor_nbytes(&h)) == 0;
    } else {
      for (int64_t k = 0; k < tr_tensor_numel(&h) && same; k++)
        same = p[k] == v;
    }
    tr_tensor_release(&h);
  }
  tr_ckpt_close(ck);
  return same;
}

/* --device: the GPU path (see the header). */
static int device_saves(tr_device_t dev, const char* root, tr_tensor_t* host,
                        tr_ckpt_item_t* items, int n, double bytes, int saves) {
  tr_errmsg_t err;
  char name[96];
  if (tr_cuda_set_device(dev.index, name, sizeof name) < 0) {
    fprintf(stderr, "ckpt_bench: no CUDA device %d\n", dev.index);
    return 1;
  }
  tr_tensor_t* ds = calloc((size_t)n, sizeof *ds);
  for (int i = 0; i < n; i++) {
    if (tr_tensor_empty(&ds[i], TR_F32, dev, 2, host[i].shape) < 0 ||
        tr_tensor_copy(&ds[i], &host[i]) < 0)
      return 1;
    items[i].tensor = &ds[i];
  }
  char folder[4200];
  snprintf(folder, sizeof folder, "%s/ck", root);
  tr_ckpt_saver_opts_t o = {.folder = folder,
                            .comm = {.rank = 0, .world = 1},
                            .mode = TR_CKPT_ASYNC_PINNED};
  tr_ckpt_saver_t* s;
  if (tr_ckpt_saver_new(&o, &s, &err) < 0) die("saver", &err);
  printf("device %s, async_with_pinned_mem\n", name);
  double t0 = now();
  int64_t held = 0;
  if (tr_ckpt_reserve(s, items, (size_t)n, &held, &err) < 0)
    die("reserve", &err);
  printf("%-40s %12.3f %12.3f\n", "page-locked buffers reserved", now() - t0,
         (double)held / (now() - t0) / 1e9);
  int bad = 0;
  for (int k = 0; k < saves; k++) {
    if (tr_ckpt_save(s, 10 + k, items, (size_t)n, NULL, NULL, &err) < 0)
      die("save", &err);
    /* the "optimizer": ordered after the copies, not after the write */
    tr_ckpt_wait_staged(s);
    for (int i = 0; i < n; i++) tr_tensor_fill(&ds[i], (double)-(k + 1));
    tr_ckpt_stats_t st;
    tr_ckpt_saver_stats(s, &st);
    double blocked = st.blocked_s;
    if (tr_ckpt_wait(s, &err) < 0) die("wait", &err);
    tr_ckpt_saver_stats(s, &st);
    int same = same_as_saved(folder, 10 + k, host, items, n, (float)-k,
                             k == 0 ? host : NULL);
    bad |= !same;
    char label[64];
    snprintf(label, sizeof label, "device save %d: held the caller", k + 1);
    printf("%-40s %12.3f %12s   %.4f s per GB\n", label, blocked, "",
           blocked / (bytes / 1e9));
    snprintf(label, sizeof label, "device save %d: device-to-host copy", k + 1);
    printf("%-40s %12.3f %12.3f\n", label, st.copy_s,
           st.copy_s > 0 ? (double)st.copy_bytes / st.copy_s / 1e9 : 0.0);
    snprintf(label, sizeof label, "device save %d: background write", k + 1);
    printf("%-40s %12.3f %12.3f   %s\n", label, st.write_s,
           bytes / st.write_s / 1e9,
           same ? "loads bit for bit" : "DIFFERS from the state saved");
  }
  tr_ckpt_saver_free(s);
  for (int i = 0; i < n; i++) tr_tensor_release(&ds[i]);
  free(ds);
  return bad;
}

int main(int argc, char** argv) {
  double gb = 2.0;
  const char* dir = NULL;
  int saves = 3;
  double step_ms = 1000;
  tr_device_t dev = TR_DEVICE_CPU;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--gb") == 0 && i + 1 < argc)
      gb = atof(argv[++i]);
    else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc)
      dir = argv[++i];
    else if (strcmp(argv[i], "--saves") == 0 && i + 1 < argc)
      saves = atoi(argv[++i]);
    else if (strcmp(argv[i], "--step-ms") == 0 && i + 1 < argc)
      step_ms = atof(argv[++i]);
    else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc &&
             tr_device_parse(argv[i + 1], &dev) == 0 && ++i)
      continue;
    else {
      fprintf(stderr,
              "usage: ckpt_bench [--gb G] [--dir DIR] [--saves N] [--step-ms "
              "MS] [--device cuda[:N]]\n"
              "  DIR: a folder on the disk to measure (default: a new one "
              "in /tmp); removed at the end\n");
      return 2;
    }
  }
  char tmpl[] = "/tmp/ckpt_bench.XXXXXX";
  char root[4096];
  if (dir) {
    snprintf(root, sizeof root, "%s/ckpt_bench.%d", dir, (int)getpid());
  } else {
    if (!mkdtemp(tmpl)) return 1;
    snprintf(root, sizeof root, "%s", tmpl);
  }
  char cmd[8400];
  snprintf(cmd, sizeof cmd, "mkdir -p '%s'", root);
  if (system(cmd) != 0) return 1;

  /* the state: n tensors of 16M f32 (64 MiB), pseudo-random bits */
  const int64_t per = 16 << 20;
  int n = (int)(gb * 1e9 / (per * 4.0) + 0.999);
  if (n < 1) n = 1;
  double bytes = (double)n * per * 4;
  tr_tensor_t* ts = calloc((size_t)n, sizeof *ts);
  tr_ckpt_item_t* items = calloc((size_t)n, sizeof *items);
  char(*names)[32] = calloc((size_t)n, sizeof *names);
  uint64_t x = 88172645463325252ULL;
  for (int i = 0; i < n; i++) {
    int64_t shape[2] = {4096, 4096};
    if (tr_tensor_empty(&ts[i], TR_F32, TR_DEVICE_CPU, 2, shape) < 0) return 1;
    uint32_t* p = tr_tensor_data(&ts[i]);
    for (int64_t k = 0; k < per; k++) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      p[k] = (uint32_t)x & 0x3fffffffu; /* finite floats */
    }
    snprintf(names[i], sizeof names[i], "layer.%d.weight", i);
    items[i].name = names[i];
    items[i].ndim = 2;
    items[i].shape[0] = items[i].shape[1] = 4096;
    items[i].tensor = &ts[i];
  }
  printf("ckpt_bench: %d tensors, %.2f GB, folder %s, %ld cores\n", n,
         bytes / 1e9, root, sysconf(_SC_NPROCESSORS_ONLN));
  if (dev.type == TR_DEV_CUDA) {
    int rc = device_saves(dev, root, ts, items, n, bytes, saves);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) return 1;
    return rc;
  }
  printf("%-40s %12s %12s\n", "measure", "seconds", "GB/s");
  tr_errmsg_t err;

  /* dd: the same bytes, same folder, fsync at the end */
  snprintf(cmd, sizeof cmd,
           "dd if=/dev/zero of='%s/dd.bin' bs=64M count=%d conv=fsync "
           "status=none && rm -f '%s/dd.bin'",
           root, n, root);
  double t0 = now();
  if (system(cmd) != 0) fprintf(stderr, "ckpt_bench: dd failed\n");
  double dd_s = now() - t0;
  printf("%-40s %12.3f %12.3f\n", "dd bs=64M conv=fsync", dd_s,
         bytes / dd_s / 1e9);

  /* CRC-32C alone, over the whole state */
  t0 = now();
  uint32_t crc = 0;
  for (int i = 0; i < n; i++)
    crc = tr_crc32c(crc, tr_tensor_data(&ts[i]), (size_t)per * 4);
  double crc_s = now() - t0;
  printf("%-40s %12.3f %12.3f\n", "crc32c (tr_crc32c)", crc_s,
         bytes / crc_s / 1e9);

  char folder[4200];
  snprintf(folder, sizeof folder, "%s/ck", root);
  /* synchronous saves */
  tr_ckpt_saver_opts_t o = {.folder = folder,
                            .comm = {.rank = 0, .world = 1},
                            .mode = TR_CKPT_SYNC,
                            .keep_latest_k = 2};
  tr_ckpt_saver_t* s;
  if (tr_ckpt_saver_new(&o, &s, &err) < 0) die("saver", &err);
  t0 = now();
  if (tr_ckpt_save(s, 1, items, (size_t)n, NULL, NULL, &err) < 0)
    die("sync save", &err);
  double sync_s = now() - t0;
  tr_ckpt_saver_free(s);
  printf("%-40s %12.3f %12.3f\n", "sync save (write + fsync + commit)", sync_s,
         bytes / sync_s / 1e9);

  /* asynchronous saves: held = time tr_ckpt_save holds the caller, plus
   * the wait for staging after a step's worth of compute */
  o.mode = TR_CKPT_ASYNC;
  if (tr_ckpt_saver_new(&o, &s, &err) < 0) die("saver", &err);
  for (int k = 0; k < saves; k++) {
    if (tr_ckpt_save(s, 10 + k, items, (size_t)n, NULL, NULL, &err) < 0)
      die("async save", &err);
    compute_for(step_ms / 1e3);
    tr_ckpt_wait_staged(s);
    tr_ckpt_stats_t st;
    tr_ckpt_saver_stats(s, &st);
    double held = st.blocked_s;
    /* "training" goes on: poll until committed */
    t0 = now();
    while (tr_ckpt_pending(s)) {
      if (tr_ckpt_poll(s, &err) < 0) die("poll", &err);
      usleep(1000);
    }
    tr_ckpt_saver_stats(s, &st);
    char label[64];
    snprintf(label, sizeof label, "async save %d: held the caller%s", k + 1,
             k == 0 ? " (buffers allocated)" : "");
    if (k == 0)
      printf(
          "(async: each save is followed by %.0f ms of compute, the next "
          "step, before the optimizer waits for staging)\n",
          step_ms);
    printf("%-40s %12.3f %12s   %.3f s per GB\n", label, held, "",
           held / (bytes / 1e9));
    snprintf(label, sizeof label, "async save %d: background write", k + 1);
    printf("%-40s %12.3f %12.3f   %.2f x dd\n", label, st.write_s,
           bytes / st.write_s / 1e9, dd_s / st.write_s);
  }
  tr_ckpt_saver_free(s);

  /* load (same layout) and reshard (Shard(0) over 3 ranks) */
  char step[4300];
  tr_ckpt_step_dir(folder, 10 + saves - 1, step, sizeof step);
  tr_ckpt_t* ck;
  if (tr_ckpt_open(&ck, step, &err) < 0) die("open", &err);
  int cold = drop_caches();
  for (int i = 0; i < n; i++) tr_tensor_fill(&ts[i], 0);
  t0 = now();
  if (tr_ckpt_load(ck, items, (size_t)n, &err) < 0) die("load", &err);
  double load_s = now() - t0;
  printf("%-40s %12.3f %12.3f\n",
         cold ? "load, same layout (cold cache)"
              : "load, same layout (page cache warm)",
         load_s, bytes / load_s / 1e9);
  cold = drop_caches();
  t0 = now();
  for (int i = 0; i < n; i++) {
    for (int r = 0; r < 3; r++) {
      int64_t st0, len;
      tr_chunk_range(4096, 3, r, &st0, &len);
      tr_tensor_t part;
      if (tr_tensor_narrow(&part, &ts[i], 0, st0, len) < 0) return 1;
      tr_ckpt_item_t it = items[i];
      it.offset[0] = st0;
      it.tensor = &part;
      if (tr_ckpt_load(ck, &it, 1, &err) < 0) die("reshard", &err);
      tr_tensor_release(&part);
    }
  }
  double rs_s = now() - t0;
  printf("%-40s %12.3f %12.3f\n",
         cold ? "reshard to Shard(0) x 3 (cold cache)"
              : "reshard to Shard(0) x 3 (cache warm)",
         rs_s, bytes / rs_s / 1e9);
  t0 = now();
  if (tr_ckpt_verify(ck, NULL, &err) < 0) die("verify", &err);
  double v_s = now() - t0;
  printf("%-40s %12.3f %12.3f\n", "verify (read + crc32c)", v_s,
         bytes / v_s / 1e9);
  tr_ckpt_close(ck);
  for (int i = 0; i < n; i++) tr_tensor_release(&ts[i]);
  free(ts);
  free(items);
  free(names);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  if (system(cmd) != 0) return 1;
  return 0;
}
