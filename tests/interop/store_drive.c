/* tests/interop/store_drive.c: drive a TCPStore server through every call of
 * trainrun's C client and check each answer. store_interop.py runs it
 * against PyTorch's server; it works against trainrun's too.
 *
 *   store_drive HOST PORT      prints "ok CALL" per call; exit 0 when all
 *                              answers were right, 1 otherwise
 *
 * Leaves keys for the caller to read back with another client:
 * "c/str" = "written by C", "c/ctr" = "42" (a counter), queue "c/q" = one
 * item "from C".
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainrun/error.h"
#include "trainrun/store.h"

static int failures;

static void check(int ok, const char* what, int rc) {
  if (ok) {
    printf("ok %s\n", what);
  } else {
    printf("FAIL %s (%s)\n", what, rc < 0 ? tr_strerror(rc) : "wrong answer");
    failures++;
  }
}

static int eq(const void* v, size_t n, const char* want) {
  return v && n == strlen(want) && memcmp(v, want, n) == 0;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: store_drive HOST PORT\n");
    return 2;
  }
  tr_store_client_opts_t o;
  tr_store_client_opts_init(&o);
  o.host = argv[1];
  o.port = atoi(argv[2]);
  o.timeout_ms = 10000;
  o.token = "";
  tr_store_client_t* c = NULL;
  int rc = tr_store_client_connect(&o, &c);
  if (rc < 0) {
    fprintf(stderr, "cannot connect: %s\n", tr_strerror(rc));
    return 1;
  }
  void* v = NULL;
  size_t n = 0;
  int64_t x = 0;
  int ready = -1, del = -1;

  rc = tr_store_client_ping(c);
  check(rc == 0, "ping", rc);
  rc = tr_store_client_set(c, "c/str", "written by C", 12);
  check(rc == 0, "set", rc);
  rc = tr_store_client_get(c, "c/str", &v, &n);
  check(rc == 0 && eq(v, n, "written by C"), "get", rc);
  free(v);
  rc = tr_store_client_add(c, "c/ctr", 40, &x);
  check(rc == 0 && x == 40, "add", rc);
  rc = tr_store_client_add(c, "c/ctr", 2, &x);
  check(rc == 0 && x == 42, "add again", rc);
  v = NULL;
  rc = tr_store_client_compare_set(c, "c/cas", "", 0, "first", 5, &v, &n);
  check(rc == 0 && eq(v, n, "first"), "compare_set (missing key)", rc);
  free(v);
  v = NULL;
  rc = tr_store_client_compare_set(c, "c/cas", "nope", 4, "x", 1, &v, &n);
  check(rc == 0 && eq(v, n, "first"), "compare_set (mismatch)", rc);
  free(v);
  v = NULL;
  rc = tr_store_client_compare_set(c, "c/cas", "first", 5, "second", 6, &v, &n);
  check(rc == 0 && eq(v, n, "second"), "compare_set (match)", rc);
  free(v);
  const char* keys[] = {"c/str", "c/ctr", "c/missing"};
  rc = tr_store_client_check(c, keys, 2, &ready);
  check(rc == 0 && ready == 1, "check (present)", rc);
  rc = tr_store_client_check(c, keys, 3, &ready);
  check(rc == 0 && ready == 0, "check (missing)", rc);
  rc = tr_store_client_wait(c, keys, 2, 0);
  check(rc == 0, "wait (present)", rc);
  rc = tr_store_client_wait(c, keys + 2, 1, 300);
  check(rc == TR_ETIMEDOUT, "wait (timeout, CANCEL_WAIT)", rc);
  rc = tr_store_client_ping(c); /* the cancel left the stream in sync */
  check(rc == 0, "ping after canceled wait", rc);
  rc = tr_store_client_append(c, "c/app", "ab", 2);
  if (rc == 0) rc = tr_store_client_append(c, "c/app", "cd", 2);
  v = NULL;
  if (rc == 0) rc = tr_store_client_get(c, "c/app", &v, &n);
  check(rc == 0 && eq(v, n, "abcd"), "append", rc);
  free(v);
  const char* mk[] = {"c/m1", "c/m2"};
  const void* mv[] = {"one", "two"};
  size_t ml[] = {3, 3};
  rc = tr_store_client_multi_set(c, mk, 2, mv, ml);
  check(rc == 0, "multi_set", rc);
  void* vals[2] = {0};
  size_t lens[2] = {0};
  rc = tr_store_client_multi_get(c, mk, 2, vals, lens);
  check(rc == 0 && eq(vals[0], lens[0], "one") && eq(vals[1], lens[1], "two"),
        "multi_get", rc);
  free(vals[0]);
  free(vals[1]);
  int64_t before = 0, after = 0;
  rc = tr_store_client_num_keys(c, &before);
  check(rc == 0 && before >= 6, "num_keys", rc);
  rc = tr_store_client_delete_key(c, "c/m1", &del);
  check(rc == 0 && del == 1, "delete_key", rc);
  rc = tr_store_client_delete_key(c, "c/m1", &del);
  check(rc == 0 && del == 0, "delete_key (missing)", rc);
  rc = tr_store_client_num_keys(c, &after);
  check(rc == 0 && after == before - 1, "num_keys after delete", rc);
  rc = tr_store_client_queue_push(c, "c/q2", "a", 1);
  if (rc == 0) rc = tr_store_client_queue_push(c, "c/q2", "b", 1);
  check(rc == 0, "queue_push", rc);
  rc = tr_store_client_queue_len(c, "c/q2", &x);
  check(rc == 0 && x == 2, "queue_len", rc);
  v = NULL;
  rc = tr_store_client_queue_pop(c, "c/q2", 0, &v, &n);
  check(rc == 0 && eq(v, n, "a"), "queue_pop", rc);
  free(v);
  v = NULL;
  rc = tr_store_client_queue_pop(c, "c/q2", 1, &v, &n);
  check(rc == 0 && eq(v, n, "b"), "queue_pop (blocking)", rc);
  free(v);
  rc = tr_store_client_queue_pop(c, "c/q2", 0, &v, &n);
  check(rc == TR_ENOTFOUND, "queue_pop (empty)", rc);
  rc = tr_store_client_queue_push(c, "c/q", "from C", 6);
  check(rc == 0, "queue_push (left for the caller)", rc);

  tr_store_client_t* d = NULL;
  rc = tr_store_client_clone(c, &d);
  v = NULL;
  if (rc == 0) rc = tr_store_client_get(d, "c/str", &v, &n);
  check(rc == 0 && eq(v, n, "written by C"), "clone", rc);
  free(v);
  tr_store_client_free(d);

  tr_store_prefix_t p;
  tr_store_prefix_init(&p, c, "c/prefix");
  rc = tr_store_prefix_set(&p, "k", "pv", 2);
  v = NULL;
  if (rc == 0) rc = tr_store_client_get(c, "c/prefix/k", &v, &n);
  check(rc == 0 && eq(v, n, "pv"), "prefix store", rc);
  free(v);
  tr_store_prefix_release(&p);

  tr_store_client_free(c);
  printf("store_drive: %d wrong answers\n", failures);
  return failures ? 1 : 0;
}
