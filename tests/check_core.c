/* tests/check_core.c: errors, logging and the parameter registry. */
#include "config.h"

#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(core_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
