/* bench/fr_bench.c: flight-recorder figures.
 *
 * Record cost: what the recorder adds to one collective -- its enqueue,
 * start and complete hooks writing one entry into a shared-memory ring
 * (target <= 1 us), without and with native stacks; and a fake-backend
 * all_reduce with and without the recorder. Analyzer time: 1024 ranks x
 * 2000 entries of pickle dumps through `trainrun fr analyze`'s loader and
 * matcher (target <= 10 s). Run: bench/fr_bench [-n N] [--analyze-only]
 * [--analyze-ranks R] [--analyze-entries E]. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "collectives/internal.h" /* tr__pg_hooks: the hooks, called directly */
#include "trainrun/flight_recorder.h"
#include "trainrun/fr_analyze.h" /* the analyzer figure */
#include "trainrun/pg.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ns per recorded collective (enqueue + start + complete), best of 5. */
static double record_ns(int stacks, long n) {
  char name[64];
  snprintf(name, sizeof name, "/trainrun-bench-%d", (int)getpid());
  tr_fr_opts_t o;
  tr_fr_opts_init(&o);
  o.shm_name = name;
  o.capacity = 20000;
  o.stacks = stacks;
  tr_fr_t* fr = NULL;
  if (tr_fr_init(&o, &fr) != 0) return -1;
  const tr_pg_hooks_t* h = tr__pg_hooks();
  int granks[2] = {0, 1};
  h->group(h->arg, 0, "0", "default_pg", granks, 2);
  tr_pg_record_t rec;
  memset(&rec, 0, sizeof rec);
  rec.pg_id = 0;
  rec.pg_name = "0";
  rec.pg_desc = "default_pg";
  rec.profiling_name = "nccl:all_reduce";
  rec.op = TR_PG_OP_ALL_REDUCE;
  rec.n_inputs = rec.n_outputs = 1;
  rec.inputs[0].ndim = rec.outputs[0].ndim = 2;
  rec.inputs[0].shape[0] = rec.outputs[0].shape[0] = 4096;
  rec.inputs[0].shape[1] = rec.outputs[0].shape[1] = 1024;
  rec.timeout_ms = 600000;
  double best = 1e30;
  for (int rep = 0; rep < 5; rep++) {
    double t0 = now_s();
    for (long i = 0; i < n; i++) {
      rec.collective_seq_id = rec.op_id = i + 1;
      rec.time_created_ns = (int64_t)i;
      int64_t id = h->enqueue(h->arg, &rec);
      h->start(h->arg, id, (int64_t)i + 1);
      h->complete(h->arg, id, (int64_t)i + 2, 0);
    }
    double ns = (now_s() - t0) / (double)n * 1e9;
    if (ns < best) best = ns;
  }
  tr_fr_free(fr);
  return best;
}

/* ns per blocking fake-backend all_reduce of 1024 floats. */
static double fake_op_ns(int recorder, long n) {
  char name[64];
  snprintf(name, sizeof name, "/trainrun-bench-op-%d", (int)getpid());
  tr_fr_t* fr = NULL;
  if (recorder) {
    tr_fr_opts_t o;
    tr_fr_opts_init(&o);
    o.shm_name = name;
    o.stacks = 0;
    if (tr_fr_init(&o, &fr) != 0) return -1;
  }
  tr_pg_opts_t po;
  tr_pg_opts_init(&po);
  po.rank = 0;
  po.world_size = 2;
  po.backend = "fake";
  tr_pg_t* pg = NULL;
  if (tr_pg_new(&po, &pg) != 0) return -1;
  if (fr) tr_fr_add_group(fr, pg);
  int64_t len = 1024;
  tr_tensor_t t;
  tr_tensor_zeros(&t, TR_F32, TR_DEVICE_CPU, 1, &len);
  double best = 1e30;
  for (int rep = 0; rep < 5; rep++) {
    double t0 = now_s();
    for (long i = 0; i < n; i++) tr_pg_all_reduce(pg, &t, TR_PG_SUM, NULL);
    double ns = (now_s() - t0) / (double)n * 1e9;
    if (ns < best) best = ns;
  }
  tr_tensor_release(&t);
  tr_pg_free(pg);
  tr_fr_free(fr);
  return best;
}

/* ---- analyzer time (bench/fr_bench --analyze-ranks R --analyze-entries E)
 *
 * Writes R per-rank pickle dumps of E entries each into a temp folder, the
 * way c10's pickler writes them (protocol 2, memoized strings, LONG1
 * timestamps): all_reduce on the world group alternating with
 * reduce_scatter on a group of 8; rank R/2 never enters the last
 * reduce_scatter (its ring ends one entry early). Then times
 * tr_fra_load_dir + tr_fra_analyze (target for 1024 x 2000: <= 10 s) and
 * prints the verdict. */

typedef struct {
  unsigned char* b;
  size_t n, cap;
  const char* memo_s[64];
  int nmemo;
} pk_t;

static void pk_put(pk_t* p, const void* s, size_t n) {
  if (p->n + n > p->cap) {
    while (p->n + n > p->cap) p->cap = p->cap ? p->cap * 2 : 1 << 20;
    p->b = realloc(p->b, p->cap);
    if (!p->b) abort();
  }
  memcpy(p->b + p->n, s, n);
  p->n += n;
}

static void pk_op(pk_t* p, unsigned char op) { pk_put(p, &op, 1); }

static void pk_int(pk_t* p, int64_t v) {
  unsigned char t[10];
  if (v >= 0 && v < 256) {
    t[0] = 'K';
    t[1] = (unsigned char)v;
    pk_put(p, t, 2);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    t[0] = 'J';
    for (int i = 0; i < 4; i++)
      t[1 + i] = (unsigned char)((uint64_t)v >> (8 * i));
    pk_put(p, t, 5);
  } else {
    t[0] = 0x8a;
    t[1] = 8;
    for (int i = 0; i < 8; i++)
      t[2 + i] = (unsigned char)((uint64_t)v >> (8 * i));
    pk_put(p, t, 10);
  }
}

/* Strings are memoized (BINPUT on first use, BINGET after), as c10 does;
 * only the first 64 distinct constant strings are. */
static void pk_str(pk_t* p, const char* s) {
  for (int i = 0; i < p->nmemo; i++)
    if (p->memo_s[i] == s) {
      unsigned char t[2] = {'h', (unsigned char)i};
      pk_put(p, t, 2);
      return;
    }
  size_t n = strlen(s);
  unsigned char t[5] = {'X', (unsigned char)n, (unsigned char)(n >> 8),
                        (unsigned char)(n >> 16), (unsigned char)(n >> 24)};
  pk_put(p, t, 5);
  pk_put(p, s, n);
  if (p->nmemo < 64) {
    unsigned char q[2] = {'q', (unsigned char)p->nmemo};
    pk_put(p, q, 2);
    p->memo_s[p->nmemo++] = s;
  }
}

static void pk_sizes(pk_t* p, int64_t d0) {
  pk_op(p, ']');
  pk_op(p, '(');
  pk_op(p, ']');
  pk_op(p, '(');
  pk_int(p, d0);
  pk_op(p, 'e');
  pk_op(p, 'e');
}

static int write_bench_dump(const char* dir, int rank, int world, long n_ent) {
  static const char* K[] = {"record_id",
                            "pg_id",
                            "process_group",
                            "collective_seq_id",
                            "p2p_seq_id",
                            "op_id",
                            "profiling_name",
                            "time_created_ns",
                            "input_sizes",
                            "input_dtypes",
                            "output_sizes",
                            "output_dtypes",
                            "state",
                            "time_discovered_started_ns",
                            "time_discovered_completed_ns",
                            "retired",
                            "timeout_ms",
                            "is_p2p"};
  static const char *s_version = "version", *s_v = "2.10", *s_cfg = "pg_config",
                    *s_entries = "entries", *s_world = "0",
                    *s_dp = "default_pg", *s_name = "name", *s_desc = "desc",
                    *s_ranks = "ranks", *s_ar = "nccl:all_reduce",
                    *s_rs = "nccl:_reduce_scatter_base", *s_float = "Float",
                    *s_done = "completed", *s_started = "started",
                    *s_tpdesc = "tp";
  char tpname[32];
  int tp0 = rank / 8 * 8;
  snprintf(tpname, sizeof tpname, "%d", 1 + rank / 8);
  const char* s_tp = tpname;
  pk_t p = {0};
  unsigned char hdr[2] = {0x80, 2};
  pk_put(&p, hdr, 2);
  pk_op(&p, '}');
  pk_op(&p, '(');
  pk_str(&p, s_version);
  pk_str(&p, s_v);
  /* pg_config */
  pk_str(&p, s_cfg);
  pk_op(&p, '}');
  pk_op(&p, '(');
  char* wr = malloc((size_t)world * 8 + 4);
  size_t k = 0;
  wr[k++] = '[';
  for (int r = 0; r < world; r++)
    k += (size_t)sprintf(wr + k, r ? ", %d" : "%d", r);
  wr[k++] = ']';
  wr[k] = '\0';
  char tr[128];
  k = 0;
  tr[k++] = '[';
  for (int r = tp0; r < tp0 + 8 && r < world; r++)
    k += (size_t)sprintf(tr + k, r > tp0 ? ", %d" : "%d", r);
  tr[k++] = ']';
  tr[k] = '\0';
  const char* names[2] = {s_world, s_tp};
  const char* descs[2] = {s_dp, s_tpdesc};
  const char* rks[2] = {wr, tr};
  for (int g = 0; g < 2; g++) {
    pk_str(&p, names[g]);
    pk_op(&p, '}');
    pk_op(&p, '(');
    pk_str(&p, s_name);
    pk_str(&p, names[g]);
    pk_str(&p, s_desc);
    pk_str(&p, descs[g]);
    pk_str(&p, s_ranks);
    pk_str(&p, rks[g]);
    pk_op(&p, 'u');
  }
  pk_op(&p, 'u');
  free(wr);
  /* entries */
  pk_str(&p, s_entries);
  pk_op(&p, ']');
  pk_op(&p, '(');
  int skip = rank == world / 2;
  int64_t t0 = (int64_t)1795262400 * 1000000000;
  long n = skip ? n_ent - 1 : n_ent;
  for (long i = 0; i < n; i++) {
    int ar = i % 2 == 0;
    int last = i >= n_ent - 2;
    int64_t t = t0 + (int64_t)i * 1000000;
    pk_op(&p, '}');
    pk_op(&p, '(');
    pk_str(&p, K[0]);
    pk_int(&p, i);
    pk_str(&p, K[1]);
    pk_int(&p, ar ? 0 : 1);
    pk_str(&p, K[2]);
    pk_str(&p, ar ? s_world : s_tp);
    pk_str(&p, ar ? s_dp : s_tpdesc);
    pk_op(&p, 0x86);
    pk_str(&p, K[3]);
    pk_int(&p, i / 2 + 1);
    pk_str(&p, K[4]);
    pk_int(&p, 0);
    pk_str(&p, K[5]);
    pk_int(&p, i + 1);
    pk_str(&p, K[6]);
    pk_str(&p, ar ? s_ar : s_rs);
    pk_str(&p, K[7]);
    pk_int(&p, t);
    pk_str(&p, K[8]);
    pk_sizes(&p, ar ? 4096 : 8192);
    pk_str(&p, K[9]);
    pk_op(&p, ']');
    pk_str(&p, s_float);
    pk_op(&p, 'a');
    pk_str(&p, K[10]);
    pk_sizes(&p, ar ? 4096 : 1024);
    pk_str(&p, K[11]);
    pk_op(&p, ']');
    pk_str(&p, s_float);
    pk_op(&p, 'a');
    pk_str(&p, K[12]);
    pk_str(&p, last ? s_started : s_done);
    pk_str(&p, K[13]);
    pk_int(&p, t + 1000);
    pk_str(&p, K[14]);
    if (last)
      pk_op(&p, 'N');
    else
      pk_int(&p, t + 5000);
    pk_str(&p, K[15]);
    pk_op(&p, last ? 0x89 : 0x88);
    pk_str(&p, K[16]);
    pk_int(&p, 600000);
    pk_str(&p, K[17]);
    pk_op(&p, 0x89);
    pk_op(&p, 'u');
  }
  pk_op(&p, 'e');
  pk_op(&p, 'u');
  pk_op(&p, '.');
  char path[512];
  snprintf(path, sizeof path, "%s/rank_%d", dir, rank);
  FILE* f = fopen(path, "wb");
  int rc = f && fwrite(p.b, 1, p.n, f) == p.n ? 0 : -1;
  if (f) fclose(f);
  free(p.b);
  return rc;
}

static int analyze_bench(int world, long n_ent) {
  char dir[256];
  snprintf(dir, sizeof dir, "%s/fr_bench.XXXXXX",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(dir)) return -1;
  double g0 = now_s();
  for (int r = 0; r < world; r++)
    if (write_bench_dump(dir, r, world, n_ent) != 0) return -1;
  double g1 = now_s();
  tr_fra_opts_t o;
  tr_fra_opts_init(&o);
  tr_fra_t* a = NULL;
  tr_errmsg_t err;
  double t0 = now_s();
  clock_t c0 = clock();
  if (tr_fra_load_dir(&a, dir, &o, &err) != 0) {
    fprintf(stderr, "fr_bench: %s\n", err.message);
    return -1;
  }
  double t1 = now_s();
  tr_fra_analyze(a, &err);
  double t2 = now_s();
  double cpu = (double)(clock() - c0) / CLOCKS_PER_SEC;
  printf(
      "flight recorder, analyzer (%d ranks x %ld entries, pickle, "
      "written in %.1f s):\n",
      world, n_ent, g1 - g0);
  printf(
      "  load %.2f s + analyze %.2f s = %.2f s wall, %.2f s CPU (target "
      "<= 10 s); %zu entries\n",
      t1 - t0, t2 - t1, t2 - t0, cpu, tr_fra_n_entries(a));
  printf("  verdict: %s\n", tr_fra_verdict(a));
  tr_fra_free(a);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "fr_bench: cannot remove %s\n", dir);
  return 0;
}

int main(int argc, char** argv) {
  long n = 200000;
  int a_ranks = 1024, a_only = 0;
  long a_entries = 2000;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--analyze-only") == 0) a_only = 1;
    if (i + 1 >= argc) continue;
    if (strcmp(argv[i], "-n") == 0)
      n = atol(argv[++i]);
    else if (strcmp(argv[i], "--analyze-ranks") == 0)
      a_ranks = atoi(argv[++i]);
    else if (strcmp(argv[i], "--analyze-entries") == 0)
      a_entries = atol(argv[++i]);
  }
  if (n < 1) n = 1;
  if (a_ranks < 16) a_ranks = 16;
  if (a_entries < 4) a_entries = 4;
  if (a_only) return analyze_bench(a_ranks, a_entries) == 0 ? 0 : 1;
  printf(
      "flight recorder, record cost (enqueue + start + complete of one "
      "entry, ring of 20000, best of 5 x %ld):\n",
      n);
  printf("  without stacks: %8.1f ns per collective (target <= 1000)\n",
         record_ns(0, n));
  printf(
      "  with stacks:    %8.1f ns per collective (8 frames, "
      "TRAINRUN_FR_STACK=1)\n",
      record_ns(1, n / 10 > 0 ? n / 10 : 1));
  double off = fake_op_ns(0, n / 4 > 0 ? n / 4 : 1);
  double on = fake_op_ns(1, n / 4 > 0 ? n / 4 : 1);
  printf(
      "  fake-backend all_reduce: %.1f ns without the recorder, %.1f ns "
      "with it (+%.1f ns)\n",
      off, on, on - off);
  if (analyze_bench(a_ranks, a_entries) != 0) return 1;
  return 0;
}
