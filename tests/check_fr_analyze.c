/* tests/check_fr_analyze.c: the flight-recorder analyzer and its pickle
 * reader. Dumps in PyTorch's layout come from tests/fr/make_dumps.py
 * (python3), written once per scenario before the suite runs: every
 * scenario's verdict must name the culprit rank, the op and its sequence
 * number; older dump versions, other pickle protocols and the JSON twin must
 * give the same answer; malformed pickles must fail with the file and byte
 * offset, never crash (truncations and byte flips, run under ASan in the
 * sanitizer build); `trainrun fr analyze` must exit 0/1/2; an allocation
 * that fails anywhere in loading, matching or printing makes the analyzer
 * return TR_ENOMEM (or still give the right answer), never abort.
 */
#include "config.h"

#include <check.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "trainrun/error.h"
#include "trainrun/fr_analyze.h"

static char g_root[256]; /* temp folder holding one folder per scenario */

static const char* python(void) {
  const char* py = getenv("PYTHON3");
  return py && *py && strcmp(py, "no") != 0 ? py : "python3";
}

static const char* srcdir(void) {
  const char* s = getenv("top_srcdir");
  return s && *s ? s : "..";
}

/* Write scenario dumps into g_root/name with extra make_dumps.py args. */
static void gen(const char* name, const char* scenario, const char* extra) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s %s/tests/fr/make_dumps.py %s/%s %s %s",
           python(), srcdir(), g_root, name, scenario, extra ? extra : "");
  if (system(cmd) != 0) {
    fprintf(stderr, "check_fr_analyze: '%s' failed\n", cmd);
    exit(1);
  }
}

static tr_fra_t* load(const char* name, int allow) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/%s", g_root, name);
  tr_fra_opts_t o;
  tr_fra_opts_init(&o);
  o.allow_incomplete_ranks = allow;
  tr_fra_t* a = NULL;
  tr_errmsg_t err;
  tr_errmsg_clear(&err);
  int rc = tr_fra_load_dir(&a, dir, &o, &err);
  ck_assert_msg(rc == 0, "load %s: %s", name, err.message);
  return a;
}

/* Analyze and check the primary finding and the verdict text. */
static void expect(const char* name, tr_fra_kind_t kind, int culprit,
                   const char* op, int64_t seq, const char* must_say) {
  tr_fra_t* a = load(name, 1);
  tr_errmsg_t err;
  int n = tr_fra_analyze(a, &err);
  ck_assert_int_gt(n, 0);
  int p = tr_fra_primary(a);
  ck_assert_int_ge(p, 0);
  const tr_fra_finding_t* f = tr_fra_finding(a, (size_t)p);
  ck_assert_msg(f->kind == kind, "%s: kind %s", name, f->kind_name);
  ck_assert_uint_ge(f->n_culprits, 1);
  ck_assert_int_eq(f->culprits[0], culprit);
  ck_assert_str_eq(f->op, op);
  ck_assert_int_eq(f->seq, seq);
  const char* v = tr_fra_verdict(a);
  char want[64];
  snprintf(want, sizeof want, "rank %d", culprit);
  ck_assert_msg(strstr(v, want), "%s: verdict lacks '%s': %s", name, want, v);
  snprintf(want, sizeof want, "%s #%lld", op, (long long)seq);
  ck_assert_msg(strstr(v, want), "%s: verdict lacks '%s': %s", name, want, v);
  if (must_say)
    ck_assert_msg(strstr(v, must_say), "%s: verdict lacks '%s': %s", name,
                  must_say, v);
  tr_fra_free(a);
}

/* ---- allocation failure injection ----
 *
 * This program's malloc family fails the fail_at-th call once armed; the
 * library's calls reach it too (ELF interposition). Not under ASan, which
 * owns malloc. */
#if defined(__SANITIZE_ADDRESS__)
#define TR_TEST_INJECT 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TR_TEST_INJECT 0
#endif
#endif
#ifndef TR_TEST_INJECT
#define TR_TEST_INJECT 1
#endif

#if TR_TEST_INJECT
extern void* __libc_malloc(size_t n);
extern void* __libc_calloc(size_t n, size_t m);
extern void* __libc_realloc(void* p, size_t n);
static long g_alloc_calls, g_fail_at = -1;

static int fail_now(void) {
  if (g_fail_at < 0 || ++g_alloc_calls != g_fail_at) return 0;
  errno = ENOMEM; /* as malloc does */
  return 1;
}

void* malloc(size_t n) { return fail_now() ? NULL : __libc_malloc(n); }
void* calloc(size_t n, size_t m) {
  return fail_now() ? NULL : __libc_calloc(n, m);
}
void* realloc(void* p, size_t n) {
  return fail_now() ? NULL : __libc_realloc(p, n);
}

static void arm(long at) {
  g_alloc_calls = 0;
  g_fail_at = at;
}

/* Load, analyze and print the scenario with allocation number `at` failing
 * (0: none); the report goes to buf (cap bytes). Returns 0 when everything
 * succeeded, TR_ENOMEM when a step said so; *calls gets the number of
 * allocations made. */
static int run_failing(const char* dir, long at, char* buf, size_t cap,
                       long* calls) {
  tr_fra_opts_t o;
  tr_fra_opts_init(&o);
  o.allow_incomplete_ranks = 1;
  tr_fra_t* a = NULL;
  tr_errmsg_t err;
  tr_errmsg_clear(&err);
  memset(buf, 0, cap);
  FILE* out = fmemopen(buf, cap - 1, "w");
  ck_assert_ptr_nonnull(out);
  arm(at ? at : -1);
  if (!at) g_fail_at = LONG_MAX;
  int rc = tr_fra_load_dir(&a, dir, &o, &err);
  if (rc == 0) {
    rc = tr_fra_analyze(a, &err);
    if (rc >= 0) rc = tr_fra_print_report(a, out);
  }
  if (rc == TR_ENOMEM) ck_assert_ptr_nonnull(strstr(err.message, "memory"));
  tr_fra_free(a);
  *calls = g_alloc_calls;
  g_fail_at = -1;
  fclose(out);
  return rc;
}
#endif

START_TEST(test_out_of_memory_never_aborts) {
#if TR_TEST_INJECT
  char dir[512];
  snprintf(dir, sizeof dir, "%s/frames", g_root);
  static char want[1 << 16], got[1 << 16];
  long total = 0, calls = 0;
  ck_assert_int_eq(run_failing(dir, 0, want, sizeof want, &total), 0);
  ck_assert_ptr_nonnull(strstr(want, "verdict: rank 3 is stuck"));
  ck_assert_int_gt(total, 50);
  /* every allocation in turn */
  int failed = 0;
  for (long at = 1; at <= total; at++) {
    int rc = run_failing(dir, at, got, sizeof got, &calls);
    if (rc == TR_ENOMEM) {
      failed++;
      continue;
    }
    /* the failure did not matter (a cache, a retry): the same answer */
    ck_assert_msg(rc == 0, "allocation %ld failing gave %d", at, rc);
    if (strcmp(got, want) != 0) { /* print the difference's place */
      ck_assert_msg(0, "allocation %ld failing changed the report:\n%s", at,
                    got);
    }
  }
  ck_assert_int_gt(failed, total / 2);
#endif
}
END_TEST

START_TEST(test_ok) {
  tr_fra_t* a = load("ok", 0);
  size_t n;
  tr_fra_ranks(a, &n);
  ck_assert_uint_eq(n, 4);
  ck_assert_int_eq(tr_fra_analyze(a, NULL), 0);
  ck_assert_int_eq(tr_fra_primary(a), -1);
  ck_assert_ptr_nonnull(strstr(tr_fra_verdict(a), "no divergence found"));
  tr_fra_free(a);
}
END_TEST

START_TEST(test_skip_collective) {
  expect("skip", TR_FRA_NOT_JOINED, 2, "all_reduce", 6,
         "rank 2 never entered all_reduce #6 on pg 'default_pg'");
}
END_TEST

START_TEST(test_mismatch_size) {
  expect("msize", TR_FRA_SIZE_MISMATCH, 1, "all_reduce", 4, "[[2048]]");
}
END_TEST

START_TEST(test_mismatch_dtype) {
  expect("mdtype", TR_FRA_DTYPE_MISMATCH, 3, "all_reduce", 4, "BFloat16");
}
END_TEST

START_TEST(test_mismatch_type) {
  expect("mtype", TR_FRA_TYPE_MISMATCH, 1, "all_reduce", 4, "all_gather");
}
END_TEST

START_TEST(test_hang) {
  expect("hang", TR_FRA_STATE_MISMATCH, 3, "all_reduce", 4,
         "rank 3 is stuck in all_reduce #4");
}
END_TEST

START_TEST(test_stops_early) {
  expect("early", TR_FRA_NOT_JOINED, 1, "all_reduce", 5,
         "rank 1's last completed op was all_reduce #4");
}
END_TEST

START_TEST(test_kill) {
  /* without --allow-incomplete-ranks: refused, naming the rank */
  tr_fra_t* a = load("kill", 0);
  tr_errmsg_t err;
  tr_errmsg_clear(&err);
  ck_assert_int_eq(tr_fra_analyze(a, &err), TR_ENOTFOUND);
  ck_assert_ptr_nonnull(strstr(err.message, "ranks 1"));
  ck_assert_ptr_nonnull(strstr(tr_fra_verdict(a), "rank 1 left no dump"));
  tr_fra_free(a);
  /* with it: the op the others wait in */
  expect("kill", TR_FRA_MISSING_DUMP, 1, "all_reduce", 5,
         "rank 1 left no dump");
}
END_TEST

START_TEST(test_send_no_recv) {
  expect("p2p", TR_FRA_SEND_NO_RECV, 1, "send", 1,
         "rank 0 sends [[16]] to rank 1");
}
END_TEST

/* After a rank skips one collective every later one differs: the findings
 * stop at --mismatch-cap, the verdict is about the first. */
START_TEST(test_mismatch_cap) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/shift", g_root);
  tr_fra_opts_t o;
  tr_fra_opts_init(&o);
  o.mismatch_cap = 3;
  tr_fra_t* a = NULL;
  ck_assert_int_eq(tr_fra_load_dir(&a, dir, &o, NULL), 0);
  ck_assert_int_eq(tr_fra_analyze(a, NULL), 3);
  const tr_fra_finding_t* f = tr_fra_finding(a, (size_t)tr_fra_primary(a));
  ck_assert_int_eq(f->seq, 1);
  ck_assert_int_eq(f->culprits[0], 2);
  char* buf = NULL;
  size_t len = 0;
  FILE* out = open_memstream(&buf, &len);
  tr_fra_print_report(a, out);
  fclose(out);
  ck_assert_ptr_nonnull(strstr(buf,
                               "Too many mismatches for process_group "
                               "0:default_pg"));
  ck_assert_ptr_nonnull(strstr(buf,
                               "Collective sequence number: 3 has "
                               "errors"));
  ck_assert_ptr_null(strstr(buf, "Collective sequence number: 4 has"));
  free(buf);
  tr_fra_free(a);
  /* the default cap is 10 */
  o.mismatch_cap = 0;
  tr_fra_opts_init(&o);
  ck_assert_int_eq(tr_fra_load_dir(&a, dir, &o, NULL), 0);
  ck_assert_int_eq(tr_fra_analyze(a, NULL), 10);
  tr_fra_free(a);
}
END_TEST

START_TEST(test_coalesced) {
  expect("coal", TR_FRA_TYPE_MISMATCH, 1, "all_reduce", 3,
         "rank 1 has all_reduce (coalesced, 4 ops) where ranks 0,2,3 have "
         "all_reduce (coalesced, 3 ops)");
}
END_TEST

/* Older field sets and other encodings reach the same verdict. */
START_TEST(test_versions_and_formats) {
  static const char* const dirs[] = {"v23", "v24",  "v27", "p4",
                                     "p5",  "json", "both"};
  for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++)
    expect(dirs[i], TR_FRA_SIZE_MISMATCH, 1, "all_reduce", 4, "[[2048]]");
  /* a pickle and its JSON twin count once */
  tr_fra_t* a = load("both", 0);
  tr_fra_t* b = load("msize", 0);
  size_t n;
  tr_fra_ranks(a, &n);
  ck_assert_uint_eq(n, 4);
  ck_assert_uint_gt(tr_fra_n_entries(b), 0);
  ck_assert_uint_eq(tr_fra_n_entries(a), tr_fra_n_entries(b));
  tr_fra_free(a);
  tr_fra_free(b);
}
END_TEST

START_TEST(test_c10_typed_lists_and_frames) {
  tr_fra_t* a = load("c10", 0);
  ck_assert_int_eq(tr_fra_analyze(a, NULL), 0);
  tr_fra_free(a);
  expect("frames", TR_FRA_STATE_MISMATCH, 3, "all_reduce", 4,
         "called from all_reduce at torch/distributed/c10d.py:2696");
}
END_TEST

/* Dumps PyTorch 2.15 wrote itself (Gloo, 2 ranks; tests/fr/pt_gloo_dumps.py):
 * its Gloo recorder leaves every state "scheduled" and names the group ""
 * in pg_config, so completion comes from pg_status and the group from the
 * entries. The pickle and its JSON twin agree and count once. */
START_TEST(test_pytorch_gloo_dumps) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/tests/fr/pt215_gloo_skip", srcdir());
  tr_fra_opts_t o;
  tr_fra_opts_init(&o);
  tr_fra_t* a = NULL;
  tr_errmsg_t err;
  ck_assert_int_eq(tr_fra_load_dir(&a, dir, &o, &err), 0);
  size_t n;
  tr_fra_ranks(a, &n);
  ck_assert_uint_eq(n, 2);
  ck_assert_int_eq(tr_fra_analyze(a, &err), 1);
  const tr_fra_finding_t* f = tr_fra_finding(a, (size_t)tr_fra_primary(a));
  ck_assert_int_eq(f->kind, TR_FRA_NOT_JOINED);
  ck_assert_int_eq(f->culprits[0], 1);
  ck_assert_int_eq(f->seq, 6);
  ck_assert_str_eq(f->profiling_name, "gloo:all_reduce");
  ck_assert_ptr_nonnull(strstr(tr_fra_verdict(a),
                               "rank 1 never entered all_reduce #6 on pg "
                               "'default_pg' (0) [ranks 0,1]; rank 0 waits"));
  tr_fra_free(a);
  snprintf(dir, sizeof dir, "%s/tests/fr/pt215_gloo_type", srcdir());
  ck_assert_int_eq(tr_fra_load_dir(&a, dir, &o, &err), 0);
  ck_assert_int_eq(tr_fra_analyze(a, &err), 1);
  f = tr_fra_finding(a, (size_t)tr_fra_primary(a));
  ck_assert_int_eq(f->kind, TR_FRA_TYPE_MISMATCH);
  ck_assert_int_eq(f->culprits[0], 1);
  ck_assert_int_eq(f->seq, 4);
  ck_assert_ptr_nonnull(strstr(f->detail, "rank 1 has broadcast"));
  tr_fra_free(a);
}
END_TEST

static char* capture_entries(tr_fra_t* a) {
  char* buf = NULL;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  ck_assert_ptr_nonnull(f);
  tr_fra_print_entries(a, f);
  fclose(f);
  return buf;
}

START_TEST(test_print_entries) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/hang", g_root);
  tr_fra_opts_t o;
  tr_fra_opts_init(&o);
  int sel[] = {0, 3};
  const char* pgs[] = {"tp"};
  o.selected_ranks = sel;
  o.n_selected_ranks = 2;
  tr_fra_t* a = NULL;
  ck_assert_int_eq(tr_fra_load_dir(&a, dir, &o, NULL), 0);
  char* t = capture_entries(a);
  ck_assert_ptr_nonnull(strstr(t, "Rank 0"));
  ck_assert_ptr_nonnull(strstr(t, "Rank 3"));
  ck_assert_ptr_null(strstr(t, "Rank 1"));
  ck_assert_ptr_nonnull(
      strstr(t, "all_reduce(input_sizes=[[1024]], state=started)"));
  ck_assert_ptr_nonnull(strstr(t, "all_gather(input_sizes=[[256]]"));
  free(t);
  tr_fra_free(a);
  /* only group "tp": no all_reduce cell left */
  o.pg_filters = pgs;
  o.n_pg_filters = 1;
  ck_assert_int_eq(tr_fra_load_dir(&a, dir, &o, NULL), 0);
  t = capture_entries(a);
  ck_assert_ptr_null(strstr(t, "all_reduce("));
  ck_assert_ptr_nonnull(strstr(t, "all_gather(input_sizes=[[256]]"));
  free(t);
  tr_fra_free(a);
  /* p2p cells name global source and destination */
  snprintf(dir, sizeof dir, "%s/p2p", g_root);
  tr_fra_opts_init(&o);
  ck_assert_int_eq(tr_fra_load_dir(&a, dir, &o, NULL), 0);
  t = capture_entries(a);
  ck_assert_ptr_nonnull(strstr(t, "send(s=0 d=1, input_sizes=[[16]]"));
  free(t);
  tr_fra_free(a);
}
END_TEST

START_TEST(test_json_output) {
  tr_fra_t* a = load("msize", 0);
  tr_fra_analyze(a, NULL);
  json_t* j = tr_fra_to_json(a);
  json_t* fs = json_object_get(j, "findings");
  int p = (int)json_integer_value(json_object_get(j, "primary"));
  json_t* f = json_array_get(fs, (size_t)p);
  ck_assert_str_eq(json_string_value(json_object_get(f, "kind")),
                   "SIZE_OR_SYNTAX_MISMATCH");
  ck_assert_int_eq(
      json_integer_value(json_array_get(json_object_get(f, "culprits"), 0)), 1);
  ck_assert_int_eq(json_integer_value(json_object_get(f, "seq")), 4);
  ck_assert_str_eq(json_string_value(json_object_get(j, "verdict")),
                   tr_fra_verdict(a));
  ck_assert_str_eq(json_string_value(json_object_get(j, "version")), "2.10");
  json_decref(j);
  tr_fra_free(a);
}
END_TEST

/* ---- the pickle reader ---- */

static int unpickle(const char* bytes, size_t n, json_t** out,
                    tr_errmsg_t* err) {
  tr_errmsg_clear(err);
  return tr_fra_unpickle(bytes, n, "t.pkl", out, err);
}

START_TEST(test_unpickle_values) {
  /* {'a': [1, -2, 70000, (True, None)], 'b': 1.5, 'c': 'xy'} protocol 2,
     with a memoized string fetched twice and LONG1 */
  static const char p[] =
      "\x80\x02}q\x00(X\x01\x00\x00\x00"
      "a"
      "q\x01]q\x02(K\x01"
      "J\xfe\xff\xff\xffJ\x70\x11\x01\x00\x88N\x86q\x03"
      "\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80\x8a\x01\xff"
      "e"
      "X\x01\x00\x00\x00"
      "b"
      "G?\xf8\x00\x00\x00\x00\x00\x00"
      "X\x01\x00\x00\x00"
      "c"
      "h\x01u.";
  json_t* j = NULL;
  tr_errmsg_t err;
  ck_assert_msg(unpickle(p, sizeof p - 1, &j, &err) == 0, "%s", err.message);
  char* s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
  ck_assert_str_eq(s,
                   "{\"a\":[1,-2,70000,[true,null],-9223372036854775808,-1],"
                   "\"b\":1.5,\"c\":\"a\"}");
  free(s);
  json_decref(j);
}
END_TEST

START_TEST(test_unpickle_refuses) {
  json_t* j = NULL;
  tr_errmsg_t err;
  /* GLOBAL os.system + REDUCE */
  static const char g[] =
      "\x80\x02"
      "cos\nsystem\nX\x02\x00\x00\x00"
      "id\x85R.";
  ck_assert_int_eq(unpickle(g, sizeof g - 1, &j, &err), TR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err.message, "'t.pkl'"));
  ck_assert_ptr_nonnull(strstr(err.message, "os.system"));
  ck_assert_ptr_nonnull(strstr(err.message, "byte offset 2"));
  /* a list appended into itself through the memo: refused, no cycle */
  static const char c[] = "\x80\x02]q\x00h\x00\x61.";
  ck_assert_int_eq(unpickle(c, sizeof c - 1, &j, &err), TR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err.message, "byte offset 7"));
  /* memo index out of sequence */
  static const char m[] = "\x80\x02Nq\x05.";
  ck_assert_int_eq(unpickle(m, sizeof m - 1, &j, &err), TR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err.message, "byte offset 3"));
  /* unknown opcode, protocol 1, string longer than the file, no STOP */
  static const char u[] = "\x80\x02\xff.";
  ck_assert_int_eq(unpickle(u, sizeof u - 1, &j, &err), TR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err.message, "opcode 0xff at byte offset 2"));
  static const char p1[] = "\x80\x01N.";
  ck_assert_int_eq(unpickle(p1, sizeof p1 - 1, &j, &err), TR_EFORMAT);
  static const char l[] =
      "\x80\x02X\xff\xff\xff\x7f"
      "abc.";
  ck_assert_int_eq(unpickle(l, sizeof l - 1, &j, &err), TR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err.message, "truncated"));
  static const char ns[] = "\x80\x02N";
  ck_assert_int_eq(unpickle(ns, sizeof ns - 1, &j, &err), TR_EFORMAT);
  /* nesting bomb: 1000 nested lists */
  char deep[3 + 2000 + 2];
  size_t k = 0;
  deep[k++] = '\x80';
  deep[k++] = 2;
  for (int i = 0; i < 1000; i++) deep[k++] = ']';
  for (int i = 0; i < 999; i++) deep[k++] = 'a';
  deep[k++] = '.';
  ck_assert_int_eq(unpickle(deep, k, &j, &err), TR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err.message, "nesting"));
  ck_assert_ptr_null(j);
}
END_TEST

static char* slurp(const char* path, size_t* n) {
  FILE* f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  char* b = malloc((size_t)len + 1);
  ck_assert_uint_eq(fread(b, 1, (size_t)len, f), (size_t)len);
  fclose(f);
  *n = (size_t)len;
  return b;
}

/* Every truncation of a real dump fails cleanly with an offset; random
 * byte flips never crash. */
START_TEST(test_unpickle_fuzz) {
  char path[512];
  snprintf(path, sizeof path, "%s/frames/nccl_trace_rank_0", g_root);
  size_t n;
  char* b = slurp(path, &n);
  json_t* j = NULL;
  tr_errmsg_t err;
  ck_assert_int_eq(unpickle(b, n, &j, &err), 0);
  ck_assert_str_eq(json_string_value(json_object_get(j, "version")), "2.10");
  ck_assert_uint_gt(json_array_size(json_object_get(j, "entries")), 3);
  json_decref(j);
  for (size_t cut = 0; cut < n; cut += (cut < 64 ? 1 : 7)) {
    j = NULL;
    ck_assert_int_lt(unpickle(b, cut, &j, &err), 0);
    ck_assert_ptr_null(j);
    ck_assert_ptr_nonnull(strstr(err.message, "byte offset"));
  }
  unsigned seed = 12345;
  for (int it = 0; it < 400; it++) {
    char* m = malloc(n);
    memcpy(m, b, n);
    for (int f = 0; f < 3; f++) {
      seed = seed * 1103515245u + 12345u;
      size_t at = (seed >> 8) % n;
      seed = seed * 1103515245u + 12345u;
      m[at] = (char)(seed >> 16);
    }
    j = NULL;
    if (unpickle(m, n, &j, &err) == 0)
      json_decref(j);
    else
      ck_assert_ptr_nonnull(strstr(err.message, "t.pkl"));
    free(m);
  }
  free(b);
}
END_TEST

/* A malformed dump in the folder: the error names the file and offset;
 * with --allow-incomplete-ranks the rank is skipped instead. */
START_TEST(test_bad_dump_in_folder) {
  char dir[512], path[600];
  snprintf(dir, sizeof dir, "%s/bad", g_root);
  snprintf(path, sizeof path, "%s/nccl_trace_rank_2", dir);
  size_t n;
  char* b = slurp(path, &n);
  FILE* f = fopen(path, "wb");
  fwrite(b, 1, n / 2, f);
  fclose(f);
  free(b);
  tr_fra_opts_t o;
  tr_fra_opts_init(&o);
  tr_fra_t* a = NULL;
  tr_errmsg_t err;
  ck_assert_int_eq(tr_fra_load_dir(&a, dir, &o, &err), TR_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err.message, "nccl_trace_rank_2"));
  ck_assert_ptr_nonnull(strstr(err.message, "byte offset"));
  ck_assert_ptr_null(a);
  /* bad JSON */
  snprintf(path, sizeof path, "%s/nccl_trace_rank_2", dir);
  f = fopen(path, "w");
  fputs("{\"version\": \"2.10\", \"entries\": [", f);
  fclose(f);
  ck_assert_int_eq(tr_fra_load_dir(&a, dir, &o, &err), TR_EPARSE);
  ck_assert_ptr_nonnull(strstr(err.message, "byte offset"));
  o.allow_incomplete_ranks = 1;
  ck_assert_int_eq(tr_fra_load_dir(&a, dir, &o, &err), 0);
  size_t nr;
  tr_fra_ranks(a, &nr);
  ck_assert_uint_eq(nr, 3);
  tr_fra_free(a);
  /* no dumps at all */
  snprintf(dir, sizeof dir, "%s/empty", g_root);
  ck_assert_int_eq(mkdir(dir, 0700), 0);
  ck_assert_int_eq(tr_fra_load_dir(&a, dir, &o, &err), TR_ENOENT);
  ck_assert_ptr_nonnull(strstr(err.message, "no flight-recorder dumps"));
}
END_TEST

static int run_cli(const char* args) {
  const char* b = getenv("top_builddir");
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s/trainrun fr analyze %s >/dev/null 2>&1",
           b && *b ? b : ".", args);
  int st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(test_cli_exit_codes) {
  char args[600];
  snprintf(args, sizeof args, "%s/ok", g_root);
  ck_assert_int_eq(run_cli(args), 0);
  snprintf(args, sizeof args, "%s/hang --json", g_root);
  ck_assert_int_eq(run_cli(args), 1);
  snprintf(args, sizeof args, "%s/hang -j --selected-ranks 0 1", g_root);
  ck_assert_int_eq(run_cli(args), 0);
  snprintf(args, sizeof args, "%s/hang --selected-ranks 0", g_root);
  ck_assert_int_eq(run_cli(args), 2); /* needs -j, as torchfrtrace */
  snprintf(args, sizeof args, "%s/no-such-folder", g_root);
  ck_assert_int_eq(run_cli(args), 2);
  snprintf(args, sizeof args, "%s/kill", g_root);
  ck_assert_int_eq(run_cli(args), 1);
}
END_TEST

static Suite* fra_suite(void) {
  Suite* s = suite_create("fr_analyze");
  TCase* t = tcase_create("scenarios");
  tcase_set_timeout(t, 60);
  tcase_add_test(t, test_ok);
  tcase_add_test(t, test_skip_collective);
  tcase_add_test(t, test_mismatch_size);
  tcase_add_test(t, test_mismatch_dtype);
  tcase_add_test(t, test_mismatch_type);
  tcase_add_test(t, test_hang);
  tcase_add_test(t, test_stops_early);
  tcase_add_test(t, test_kill);
  tcase_add_test(t, test_send_no_recv);
  tcase_add_test(t, test_versions_and_formats);
  tcase_add_test(t, test_mismatch_cap);
  tcase_add_test(t, test_coalesced);
  tcase_add_test(t, test_c10_typed_lists_and_frames);
  tcase_add_test(t, test_pytorch_gloo_dumps);
  tcase_add_test(t, test_print_entries);
  tcase_add_test(t, test_json_output);
  tcase_add_test(t, test_cli_exit_codes);
  tcase_add_test(t, test_out_of_memory_never_aborts);
  suite_add_tcase(s, t);
  TCase* u = tcase_create("unpickle");
  tcase_set_timeout(u, 60);
  tcase_add_test(u, test_unpickle_values);
  tcase_add_test(u, test_unpickle_refuses);
  tcase_add_test(u, test_unpickle_fuzz);
  tcase_add_test(u, test_bad_dump_in_folder);
  suite_add_tcase(s, u);
  return s;
}

int main(void) {
  snprintf(g_root, sizeof g_root, "%s/fra.XXXXXX",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(g_root)) {
    perror("mkdtemp");
    return 1;
  }
  gen("ok", "ok", NULL);
  gen("skip", "skip_collective", NULL);
  gen("msize", "mismatch_size", NULL);
  gen("mdtype", "mismatch_dtype", NULL);
  gen("mtype", "mismatch_type", NULL);
  gen("hang", "hang", NULL);
  gen("early", "stops_early", "--prefix rank_");
  gen("kill", "kill", NULL);
  gen("p2p", "send_no_recv", NULL);
  gen("v23", "mismatch_size", "--version 2.3");
  gen("v24", "mismatch_size", "--version 2.4");
  gen("v27", "mismatch_size", "--version 2.7 --prefix rank_");
  gen("p4", "mismatch_size", "--protocol 4");
  gen("p5", "mismatch_size", "--protocol 5");
  gen("json", "mismatch_size", "--format json --prefix rank_");
  gen("both", "mismatch_size", "--format both --prefix rank_");
  gen("c10", "c10_lists", NULL);
  gen("frames", "frames", NULL);
  gen("bad", "ok", NULL);
  gen("shift", "shift", "--steps 16");
  gen("coal", "coalesced", NULL);
  SRunner* sr = srunner_create(fra_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove '%s'\n", g_root);
  return failed ? 1 : 0;
}
