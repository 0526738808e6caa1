/* tests/check_core.c: errors, logging, the parameter registry, the clock
 * and the growable buffer. */
#include "config.h"

#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/buf.h"
#include "core/clock.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/param.h"

/* ---- errors ---- */

START_TEST(test_error_codes_mirror_errno) {
  ck_assert_int_eq(TR_ENOENT, -ENOENT);
  ck_assert_int_eq(TR_ETIMEDOUT, -ETIMEDOUT);
  ck_assert_int_lt(TR_EPARSE, -4000);
}
END_TEST

START_TEST(test_error_strings) {
  ck_assert_str_eq(tr_strerror(TR_ETIMEDOUT), "timed out");
  ck_assert_str_eq(tr_err_name(TR_ETIMEDOUT), "ETIMEDOUT");
  ck_assert_str_eq(tr_strerror(TR_ECONFIG), "invalid configuration");
  ck_assert_str_eq(tr_err_name(TR_ECONFIG), "ECONFIG");
  ck_assert_str_eq(tr_strerror(0), "success");
  ck_assert_str_eq(tr_err_name(12345), "UNKNOWN");
  ck_assert_str_eq(tr_strerror(-9999), "unknown error");
  /* an errno not in the map still gets the C library's text */
  ck_assert_str_eq(tr_strerror(-ENOTTY), strerror(ENOTTY));
}
END_TEST

START_TEST(test_error_every_code_named) {
  /* every code in the map has a distinct name and a non-empty message */
  static const int codes[] = {
#define XX(name, value, msg) value,
      TR_ERRNO_MAP(XX)
#undef XX
  };
  size_t n = sizeof codes / sizeof codes[0];
  for (size_t i = 0; i < n; i++) {
    ck_assert_str_ne(tr_err_name(codes[i]), "UNKNOWN");
    ck_assert_int_gt(strlen(tr_strerror(codes[i])), 0);
    for (size_t j = i + 1; j < n; j++) ck_assert_int_ne(codes[i], codes[j]);
  }
}
END_TEST

static int fails_then_checks(int* reached) {
  TR_CHECK(TR_EINVAL);
  *reached = 1;
  return 0;
}

static int check_goto(int* cleaned) {
  int rc = 0;
  TR_CHECK_GOTO(TR_ENOMEM, rc, out_clean);
  return 0;
out_clean:
  *cleaned = 1;
  return rc;
}

START_TEST(test_check_macros) {
  int reached = 0, cleaned = 0;
  ck_assert_int_eq(fails_then_checks(&reached), TR_EINVAL);
  ck_assert_int_eq(reached, 0);
  ck_assert_int_eq(check_goto(&cleaned), TR_ENOMEM);
  ck_assert_int_eq(cleaned, 1);
}
END_TEST

/* ---- logging ---- */

/* Run fn with log output captured into buf (a pipe), return length. */
static size_t capture(void (*fn)(void), char* buf, size_t cap) {
  int p[2];
  ck_assert_int_eq(pipe(p), 0);
  int old = tr_log_set_fd(p[1]);
  fn();
  tr_log_set_fd(old);
  close(p[1]);
  size_t n = 0;
  ssize_t r;
  while (n < cap - 1 && (r = read(p[0], buf + n, cap - 1 - n)) > 0) n += (size_t)r;
  buf[n] = '\0';
  close(p[0]);
  return n;
}

static int evaluated;
static int side_effect(void) { return ++evaluated; }

static void log_some(void) {
  TR_LOG_WARN(STORE, "client %s sent %d bytes", "10.0.0.7:1", 42);
  TR_LOG_INFO(STORE, "hidden at warn level %d", side_effect());
  TR_LOG_ERROR(COLL, "coll error");
}

START_TEST(test_log_levels_and_prefix) {
  setenv("TRAINRUN_LOG_LEVEL", "warn", 1);
  setenv("TRAINRUN_LOG_SUBSYS", "store", 1);
  setenv("RANK", "3", 1);
  char buf[1024], host[64];
  gethostname(host, sizeof host);
  evaluated = 0;
  capture(log_some, buf, sizeof buf);
  char want[256];
  snprintf(want, sizeof want, "%s:%d [3] WARN store: client 10.0.0.7:1 sent 42 bytes\n",
           host, (int)getpid());
  /* only the store line: info is below warn, coll is filtered out */
  ck_assert_str_eq(buf, want);
  ck_assert_int_eq(evaluated, 0); /* disabled lines do not evaluate args */
}
END_TEST

START_TEST(test_log_subsys_parse) {
  ck_assert_int_eq(tr_log_parse_subsys("store"), 1 << TR_SUB_STORE);
  ck_assert_int_eq(tr_log_parse_subsys("store,coll"),
                   (1 << TR_SUB_STORE) | (1 << TR_SUB_COLL));
  ck_assert_int_eq(tr_log_parse_subsys("^store"),
                   ((1 << TR_SUB__COUNT) - 1) & ~(1 << TR_SUB_STORE));
  ck_assert_int_eq(tr_log_parse_subsys("all"), (1 << TR_SUB__COUNT) - 1);
  ck_assert_int_eq(tr_log_parse_subsys("nosuch"), -1);
  ck_assert_int_eq(tr_log_parse_level("DEBUG"), TR_LOG_DEBUG);
  ck_assert_int_eq(tr_log_parse_level("loud"), -1);
}
END_TEST

static void log_long(void) {
  char big[8192];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  TR_LOG_WARN(CORE, "%s", big);
}

START_TEST(test_log_truncates_long_lines) {
  unsetenv("RANK");
  unsetenv("TRAINRUN_LOG_SUBSYS");
  char buf[16384];
  size_t n = capture(log_long, buf, sizeof buf);
  ck_assert_uint_le(n, 4096);
  ck_assert_str_eq(buf + n - 4, "...\n");
}
END_TEST

static void log_bad_env(void) { TR_LOG_ERROR(CORE, "after"); }

START_TEST(test_log_bad_level_warns) {
  setenv("TRAINRUN_LOG_LEVEL", "loud", 1);
  char buf[2048];
  capture(log_bad_env, buf, sizeof buf);
  /* the bad value was reported before the stderr switch; the default (warn)
   * level still lets errors through */
  ck_assert_ptr_nonnull(strstr(buf, "ERROR core: after"));
}
END_TEST

/* ---- parameters ---- */

START_TEST(test_param_defaults_and_env) {
  unsetenv("TRAINRUN_STORE_MAX_KEY_BYTES");
  tr_param_reset();
  ck_assert_int_eq(tr_param_int(TR_PARAM_STORE_MAX_KEY), 8192);
  ck_assert_int_eq(tr_param_is_set(TR_PARAM_STORE_MAX_KEY), 0);
  setenv("TRAINRUN_STORE_MAX_KEY_BYTES", "0x100", 1);
  /* read once: the cached value stays until reset */
  ck_assert_int_eq(tr_param_int(TR_PARAM_STORE_MAX_KEY), 8192);
  tr_param_reset();
  ck_assert_int_eq(tr_param_int(TR_PARAM_STORE_MAX_KEY), 256);
  ck_assert_int_eq(tr_param_is_set(TR_PARAM_STORE_MAX_KEY), 1);
  ck_assert_str_eq(tr_param_env_name(TR_PARAM_STORE_MAX_KEY),
                   "TRAINRUN_STORE_MAX_KEY_BYTES");
}
END_TEST

static void read_bad_param(void) {
  ck_assert_int_eq(tr_param_int(TR_PARAM_STORE_MAX_KEY), 8192);
}

START_TEST(test_param_bad_value_warns_and_defaults) {
  setenv("TRAINRUN_LOG_LEVEL", "warn", 1);
  setenv("TRAINRUN_STORE_MAX_KEY_BYTES", "-5", 1);
  tr_param_reset();
  char buf[2048];
  capture(read_bad_param, buf, sizeof buf);
  ck_assert_ptr_nonnull(strstr(
      buf, "ignoring TRAINRUN_STORE_MAX_KEY_BYTES='-5': out of range; using "
           "the default 8192"));
  setenv("TRAINRUN_STORE_MAX_KEY_BYTES", "12abc", 1);
  tr_param_reset();
  capture(read_bad_param, buf, sizeof buf);
  ck_assert_ptr_nonnull(strstr(buf, "'12abc': not an integer"));
}
END_TEST

START_TEST(test_param_print_table) {
  setenv("TRAINRUN_STORE_TOKEN", "s3cret", 1);
  tr_param_reset();
  char* text = NULL;
  size_t len = 0;
  FILE* f = open_memstream(&text, &len);
  tr_param_print(f);
  fclose(f);
  ck_assert_ptr_nonnull(strstr(text, "TRAINRUN_LOG_LEVEL"));
  ck_assert_ptr_nonnull(strstr(text, "TRAINRUN_STORE_MAX_KEY_BYTES"));
  ck_assert_ptr_nonnull(strstr(text, "[1, 1048576]"));
  ck_assert_ptr_null(strstr(text, "s3cret")); /* secrets never printed */
  ck_assert_ptr_nonnull(strstr(text, "<hidden>"));
  free(text);
}
END_TEST

/* ---- the clock ---- */

START_TEST(test_clock_monotonic_units_agree) {
  int64_t ns0 = tr__now_ns();
  double s0 = tr__now();
  usleep(20000);
  int64_t ms1 = tr__now_ms();
  int64_t ns1 = tr__now_ns();
  double s1 = tr__now();
  ck_assert_int_ge(ns1 - ns0, 20000000);
  ck_assert_int_lt(ns1 - ns0, 5000000000LL);
  /* one clock: the units differ by their factor only */
  ck_assert_int_ge(ms1, ns0 / 1000000 + 20);
  ck_assert_int_le(ms1, ns1 / 1000000);
  ck_assert(s1 - s0 >= 0.02 && s1 - s0 < 5.0);
  ck_assert(s0 >= (double)ns0 * 1e-9 - 1e-6);
}
END_TEST

START_TEST(test_clock_wall_and_deadline) {
  struct timespec rt;
  clock_gettime(CLOCK_REALTIME, &rt);
  int64_t w = tr__wall_ns();
  int64_t r = (int64_t)rt.tv_sec * 1000000000 + rt.tv_nsec;
  ck_assert_int_ge(w, r);
  ck_assert_int_lt(w - r, 1000000000);
  ck_assert(tr__wall() - (double)rt.tv_sec < 2.0);
  /* 1.5 s from now, normalized */
  struct timespec d = tr__deadline_ms(1500);
  ck_assert_int_ge(d.tv_nsec, 0);
  ck_assert_int_lt(d.tv_nsec, 1000000000);
  int64_t dn = (int64_t)d.tv_sec * 1000000000 + d.tv_nsec;
  ck_assert_int_ge(dn - w, 1500000000LL - 1000000);
  ck_assert_int_lt(dn - w, 2500000000LL);
}
END_TEST

/* ---- the growable buffer ---- */

START_TEST(test_buf_text_and_bytes) {
  tr__buf_t b = TR__BUF_INIT;
  ck_assert_str_eq(tr__buf_str(&b), "");
  ck_assert_int_eq(tr__buf_addstr(&b, "rank "), 0);
  ck_assert_int_eq(tr__buf_addf(&b, "%d of %s", 3, "0-7"), 0);
  ck_assert_int_eq(tr__buf_addch(&b, '!'), 0);
  ck_assert_str_eq(b.buf, "rank 3 of 0-7!");
  ck_assert_uint_eq(b.len, 14);
  /* a long formatted piece (beyond the first guess) */
  char big[3000];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  ck_assert_int_eq(tr__buf_addf(&b, "[%s]", big), 0);
  ck_assert_uint_eq(b.len, 14 + 3001);
  ck_assert_int_eq(b.buf[b.len], '\0');
  ck_assert_int_eq(b.buf[14], '[');
  ck_assert_int_eq(b.buf[b.len - 1], ']');
  /* binary with NUL bytes inside */
  tr__buf_reset(&b);
  ck_assert_uint_eq(b.len, 0);
  ck_assert_str_eq(b.buf, "");
  const char bin[4] = {'a', 0, 'b', 0};
  ck_assert_int_eq(tr__buf_add(&b, bin, 4), 0);
  ck_assert_uint_eq(b.len, 4);
  ck_assert_int_eq(memcmp(b.buf, bin, 4), 0);
  tr__buf_setlen(&b, 1);
  ck_assert_str_eq(b.buf, "a");
  size_t n = 0;
  char* s = tr__buf_detach(&b, &n);
  ck_assert_str_eq(s, "a");
  ck_assert_uint_eq(n, 1);
  ck_assert_ptr_null(b.buf);
  ck_assert_uint_eq(b.len, 0);
  free(s);
  /* an empty buffer detaches as "" */
  s = tr__buf_detach(&b, &n);
  ck_assert_str_eq(s, "");
  ck_assert_uint_eq(n, 0);
  free(s);
  tr__buf_release(&b);
}
END_TEST

START_TEST(test_buf_out_of_memory_sticks) {
  tr__buf_t b = TR__BUF_INIT;
  ck_assert_int_eq(tr__buf_addstr(&b, "head"), 0);
  /* more than can ever be allocated: fails without touching the text */
  ck_assert_int_eq(tr__buf_grow(&b, SIZE_MAX / 2), TR_ENOMEM);
  ck_assert_int_eq(b.oom, 1);
  ck_assert_str_eq(b.buf, "head");
  /* every later add fails and changes nothing */
  ck_assert_int_eq(tr__buf_addstr(&b, "tail"), TR_ENOMEM);
  ck_assert_int_eq(tr__buf_addf(&b, "%d", 7), TR_ENOMEM);
  ck_assert_str_eq(b.buf, "head");
  /* detach refuses a text with a hole in it, and frees */
  size_t n = 99;
  ck_assert_ptr_null(tr__buf_detach(&b, &n));
  ck_assert_uint_eq(n, 0);
  ck_assert_int_eq(b.oom, 0);
  /* reset clears the failure */
  ck_assert_int_eq(tr__buf_grow(&b, SIZE_MAX / 2), TR_ENOMEM);
  tr__buf_reset(&b);
  ck_assert_int_eq(tr__buf_addstr(&b, "again"), 0);
  ck_assert_str_eq(b.buf, "again");
  /* shrink gives a large idle buffer back, keeps a small one */
  tr__buf_shrink(&b, 1 << 20);
  ck_assert_ptr_nonnull(b.buf);
  tr__buf_reset(&b);
  tr__buf_shrink(&b, 16);
  ck_assert_ptr_null(b.buf);
  tr__buf_release(&b);
}
END_TEST

START_TEST(test_grow_arrays) {
  int64_t* v = NULL;
  size_t n = 0, cap = 0, grows = 0;
  for (int64_t i = 0; i < 100000; i++) {
    size_t before = cap;
    ck_assert_int_eq(TR_GROW(v, n + 1, cap), 0);
    grows += cap != before;
    ck_assert_uint_ge(cap, n + 1);
    v[n++] = i * 3;
  }
  /* geometric: a push is O(1) amortized */
  ck_assert_uint_le(grows, 20);
  for (size_t i = 0; i < n; i++) ck_assert_int_eq(v[i], (int64_t)i * 3);
  /* an impossible size fails and leaves the array as it was */
  int64_t* keep = v;
  size_t keep_cap = cap;
  ck_assert_int_eq(TR_GROW(v, SIZE_MAX / 4, cap), TR_ENOMEM);
  ck_assert_ptr_eq(v, keep);
  ck_assert_uint_eq(cap, keep_cap);
  ck_assert_int_eq(v[n - 1], (int64_t)(n - 1) * 3);
  /* enough room: nothing happens */
  ck_assert_int_eq(TR_GROW(v, 1, cap), 0);
  ck_assert_ptr_eq(v, keep);
  free(v);
}
END_TEST

static Suite* core_suite(void) {
  Suite* s = suite_create("core");
  TCase* tc = tcase_create("errors");
  tcase_add_test(tc, test_error_codes_mirror_errno);
  tcase_add_test(tc, test_error_strings);
  tcase_add_test(tc, test_error_every_code_named);
  tcase_add_test(tc, test_check_macros);
  suite_add_tcase(s, tc);
  tc = tcase_create("log");
  tcase_add_test(tc, test_log_levels_and_prefix);
  tcase_add_test(tc, test_log_subsys_parse);
  tcase_add_test(tc, test_log_truncates_long_lines);
  tcase_add_test(tc, test_log_bad_level_warns);
  suite_add_tcase(s, tc);
  tc = tcase_create("param");
  tcase_add_test(tc, test_param_defaults_and_env);
  tcase_add_test(tc, test_param_bad_value_warns_and_defaults);
  tcase_add_test(tc, test_param_print_table);
  suite_add_tcase(s, tc);
  tc = tcase_create("clock");
  tcase_add_test(tc, test_clock_monotonic_units_agree);
  tcase_add_test(tc, test_clock_wall_and_deadline);
  suite_add_tcase(s, tc);
  tc = tcase_create("buf");
  tcase_add_test(tc, test_buf_text_and_bytes);
  tcase_add_test(tc, test_buf_out_of_memory_sticks);
  tcase_add_test(tc, test_grow_arrays);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(core_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
