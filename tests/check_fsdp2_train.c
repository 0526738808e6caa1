/* tests/check_fsdp2_train.c: FSDP2, HSDP and DDP jobs through the
 * launcher, and `trainrun plan`.
 *
 * `trainrun --nproc-per-node N examples/debug.toml` on loopback trains
 * the same global batch of 4 sequences for 20 steps as FSDP over 2 and 4
 * ranks, HSDP 2 x 2 and DDP over 4, and one rank; the losses in
 * metrics.jsonl agree step by step within 1e-5 relative, each run logs the
 * layout it chose, and the weights written at the end match the one-rank
 * run's. With [metrics] comm_overlap the FSDP run reports its
 * communication per step and the fraction hidden, on the step line and in
 * metrics.jsonl, and trains to the same bits. `trainrun plan` prints the
 * mesh and the memory table, and exits 2 on a layout that does not fit the
 * world. */
#include "config.h"

#include <check.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/procs.h"

static void setup(void) { tp_tmpdir_make("check_fsdp2_train"); }
static void teardown(void) { tp_cleanup(); }

/* ---- equivalence ---- */

enum { STEPS = 20 };

typedef struct {
  const char* tag;
  const char* nproc;
  const char* batch; /* local batch: 4 sequences in all */
  const char* replicate;
  const char* shard;
  const char* layout; /* a line the run logs about its layout */
  const char* extra;  /* one more option, or NULL */
} layout_t;

static const layout_t layouts[] = {
    {"one", "1", "4", "1", "-1", NULL, NULL},
    {"fsdp2", "2", "2", "1", "-1",
     "fsdp: 7 groups over 2 shard ranks x 1 replica", NULL},
    {"fsdp4", "4", "1", "1", "-1",
     "fsdp: 7 groups over 4 shard ranks x 1 replica", NULL},
    {"hsdp", "4", "1", "2", "2",
     "fsdp: 7 groups over 2 shard ranks x 2 replicas", NULL},
    {"ddp4", "4", "1", "4", "1", "ddp: ", NULL},
};

/* The float32 payload of a safetensors file (header skipped). */
static char* weights(const char* dump, size_t* n) {
  char p[600];
  snprintf(p, sizeof p, "%s/model.safetensors", dump);
  FILE* f = fopen(p, "rb");
  ck_assert_msg(f != NULL, "no %s", p);
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  char* b = malloc((size_t)len);
  ck_assert_ptr_nonnull(b);
  ck_assert_int_eq(fread(b, 1, (size_t)len, f), len);
  fclose(f);
  unsigned long long h = 0;
  memcpy(&h, b, 8);
  *n = (size_t)len - 8 - (size_t)h;
  memmove(b, b + 8 + h, *n);
  return b;
}

static double ref_loss[STEPS];
static char* ref_w;
static size_t ref_n;

static void train(const layout_t* l, double* loss, char** w, size_t* wn) {
  char job[600], data[600], dump[400], dumparg[440];
  snprintf(job, sizeof job, "%s/examples/debug.toml", tp_srcdir());
  snprintf(data, sizeof data, "%s/examples/data/tinytales.txt", tp_srcdir());
  snprintf(dump, sizeof dump, "%s/%s", tp_tmpdir, l->tag);
  snprintf(dumparg, sizeof dumparg, "--job.dump_folder=%s", dump);
  char* a[] = {(char*)tp_bin("trainrun"),
               "--nproc-per-node",
               (char*)l->nproc,
               job,
               "--training.steps",
               "20",
               "--metrics.log_freq",
               "1",
               "--training.local_batch_size",
               (char*)l->batch,
               "--training.seq_len",
               "16",
               "--parallelism.data_parallel_replicate_degree",
               (char*)l->replicate,
               "--parallelism.data_parallel_shard_degree",
               (char*)l->shard,
               "--validation.enable=false",
               "--debug.seed",
               "42",
               "--metrics.enable_jsonl=true",
               "--training.dataset_path",
               data,
               dumparg,
               (char*)l->extra,
               NULL};
  char* env[] = {"TRAINRUN_LOG_LEVEL=info", "OMP_NUM_THREADS=1",
                 "OPENBLAS_NUM_THREADS=1", NULL};
  char *out, *err;
  int rc = tp_run(l->tag, a, env, &out, &err, 120);
  ck_assert_msg(rc == 0, "%s: exit %d\nstdout:\n%s\nstderr:\n%s", l->tag, rc,
                out, err);
  if (l->layout)
    ck_assert_msg(strstr(out, l->layout) || strstr(err, l->layout),
                  "%s: no '%s' in\n%s\n%s", l->tag, l->layout, out, err);
  char want[80];
  snprintf(want, sizeof want, "step %d/%d | loss ", STEPS, STEPS);
  ck_assert_msg(strstr(out, want), "%s: stdout:\n%s", l->tag, out);
  /* the communication figures: on the line exactly when asked for */
  int timed = l->extra && strstr(l->extra, "comm_overlap=true");
  ck_assert_msg(!strstr(out, " | comm ") == !timed, "%s: stdout:\n%s", l->tag,
                out);
  free(out);
  free(err);
  tp_read_losses(dump, loss, STEPS);
  *w = weights(dump, wn);
}

static void compare(int k) {
  if (!ref_w) train(&layouts[0], ref_loss, &ref_w, &ref_n);
  double loss[STEPS];
  char* w;
  size_t n;
  train(&layouts[k], loss, &w, &n);
  double worst = 0;
  for (int i = 0; i < STEPS; i++) {
    double rel = fabs(loss[i] - ref_loss[i]) / fabs(ref_loss[i]);
    if (rel > worst) worst = rel;
    ck_assert_msg(rel <= 1e-5,
                  "%s step %d: loss %.12g, one rank %.12g (relative "
                  "difference %.3g)",
                  layouts[k].tag, i + 1, loss[i], ref_loss[i], rel);
  }
  /* training moved: the comparison is not of two constants */
  ck_assert_double_lt(ref_loss[STEPS - 1], ref_loss[0] - 1.0);
  /* the weights written at the end (gathered from the shards) */
  ck_assert_int_eq(n, ref_n);
  const float* a = (const float*)w;
  const float* b = (const float*)ref_w;
  double wmax = 0;
  for (size_t i = 0; i < n / 4; i++)
    wmax = fmax(wmax, fabs((double)a[i] - (double)b[i]));
  ck_assert_msg(wmax < 1e-4, "%s: weights differ by %g", layouts[k].tag, wmax);
  fprintf(stderr,
          "%s: max relative loss difference over %d steps %.3g; max "
          "weight difference %.3g\n",
          layouts[k].tag, STEPS, worst, wmax);
  free(w);
}

START_TEST(test_equivalence) {
  /* one process runs them all (the one-rank reference once) */
  for (int k = 1; k < (int)(sizeof layouts / sizeof layouts[0]); k++)
    compare(k);
  free(ref_w);
  ref_w = NULL;
}
END_TEST

/* ---- communication overlap ---- */

/* The number after "key": in step's line of dump/metrics.jsonl; NaN when
 * the line has no such key. */
static double metric_at(const char* dump, int step, const char* key) {
  char p[600];
  snprintf(p, sizeof p, "%s/metrics.jsonl", dump);
  char* f = tp_slurp(p);
  char k[64];
  snprintf(k, sizeof k, "{\"step\":%d,\"loss\":", step);
  char* at = NULL;
  for (char* q = f; (q = strstr(q, k)); q++) at = q;
  ck_assert_msg(at != NULL, "%s has no step %d:\n%s", p, step, f);
  char* eol = strchr(at, '\n');
  if (eol) *eol = '\0';
  snprintf(k, sizeof k, "\"%s\":", key);
  char* v = strstr(at, k);
  double x = v ? strtod(v + strlen(k), NULL) : NAN;
  free(f);
  return x;
}

START_TEST(test_comm_overlap) {
  static const layout_t timed = {"fsdp2_timed", "2", "2", "1", "-1",
                                 "fsdp: 7 groups over 2 shard ranks",
                                 "--metrics.comm_overlap=true"};
  double plain[STEPS], loss[STEPS];
  char *w0, *w1;
  size_t n0, n1;
  train(&layouts[1], plain, &w0, &n0);
  train(&timed, loss, &w1, &n1);
  char dump[400];
  snprintf(dump, sizeof dump, "%s/%s", tp_tmpdir, timed.tag);
  char plain_dump[400];
  snprintf(plain_dump, sizeof plain_dump, "%s/%s", tp_tmpdir, layouts[1].tag);
  double hidden_sum = 0;
  for (int i = 0; i < STEPS; i++) {
    /* timing changes nothing the model computes */
    ck_assert_msg(loss[i] == plain[i], "step %d: loss %.17g, untimed %.17g",
                  i + 1, loss[i], plain[i]);
    double comm = metric_at(dump, i + 1, "comm_ms");
    double exposed = metric_at(dump, i + 1, "comm_exposed_ms");
    double hidden = metric_at(dump, i + 1, "comm_hidden");
    ck_assert_msg(comm > 0, "step %d: comm_ms %g", i + 1, comm);
    ck_assert_msg(exposed >= 0, "step %d: comm_exposed_ms %g", i + 1, exposed);
    ck_assert_msg(hidden >= 0 && hidden <= 1, "step %d: comm_hidden %g", i + 1,
                  hidden);
    /* hidden is what the waits did not cover */
    double want = 1 - exposed / comm;
    want = want < 0 ? 0 : want > 1 ? 1 : want;
    ck_assert_msg(fabs(hidden - want) < 1e-9, "step %d: hidden %g, want %g",
                  i + 1, hidden, want);
    hidden_sum += hidden;
    ck_assert_msg(isnan(metric_at(plain_dump, i + 1, "comm_ms")),
                  "step %d: an untimed run reports comm_ms", i + 1);
  }
  ck_assert_int_eq(n0, n1);
  ck_assert(memcmp(w0, w1, n0) == 0);
  fprintf(stderr, "comm overlap: mean hidden fraction %.3f over %d steps\n",
          hidden_sum / STEPS, STEPS);
  free(w0);
  free(w1);
}
END_TEST

/* ---- trainrun plan ---- */

START_TEST(test_plan) {
  char job[600];
  snprintf(job, sizeof job, "%s/examples/debug.toml", tp_srcdir());
  char* a[] = {(char*)tp_bin("trainrun"),
               "plan",
               job,
               "--world-size",
               "4",
               "--parallelism.data_parallel_replicate_degree",
               "2",
               NULL};
  char *out, *err;
  ck_assert_int_eq(tp_run("plan", a, NULL, &out, &err, 30), 0);
  static const char* const want[] = {
      "job 'Llama 3 debug training': llama3 debugmodel, 5246208 parameters\n",
      "mesh: pp 1 x dp_replicate 2 x dp_shard 2 x cp 1 x tp 1 = 4 ranks\n",
      "  dp_replicate 0: dp_shard ranks 0 1\n",
      "  dp_replicate 1: dp_shard ranks 2 3\n",
      "data parallel: HSDP (each parameter sharded on dim 0 over 2 ranks, "
      "gradients all-reduced across replicas",
      /* 5246208 / 2 fp32 (every dim-0 size of the model is even) */
      "  parameters                                 10492416     10.01 MiB\n",
      "  optimizer state (AdamW m, v)               20984832     20.01 MiB\n",
      /* a layer: 852,480 fp32 parameters and their grads */
      "  largest unsharded group (layers.0)          6819840      6.50 MiB\n",
      "  unsharded, for comparison                  83939328     80.05 MiB\n"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    ck_assert_msg(strstr(out, want[i]), "no '%s' in:\n%s", want[i], out);
  free(out);
  free(err);
  /* a layout that does not fit the world */
  char* b[] = {(char*)tp_bin("trainrun"),
               "plan",
               job,
               "--world-size",
               "6",
               "--parallelism.data_parallel_replicate_degree",
               "4",
               NULL};
  ck_assert_int_eq(tp_run("plan6", b, NULL, &out, &err, 30), 2);
  ck_assert_msg(strstr(err, "trainrun: ") == err, "stderr: %s", err);
  free(out);
  free(err);
  char* c[] = {
      (char*)tp_bin("trainrun"), "plan", job, "--world-size", "0", NULL};
  ck_assert_int_eq(tp_run("plan0", c, NULL, &out, &err, 30), 2);
  ck_assert_str_eq(err,
                   "trainrun: --world-size: expected a positive integer, got "
                   "'0'\n");
  free(out);
  free(err);
}
END_TEST

static Suite* fsdp2_train_suite(void) {
  Suite* s = suite_create("fsdp2_train");
  TCase* tc = tcase_create("jobs");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, test_plan);
#ifdef HAVE_GLOO
  tcase_add_test(tc, test_equivalence);
  tcase_add_test(tc, test_comm_overlap);
#endif
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(fsdp2_train_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
