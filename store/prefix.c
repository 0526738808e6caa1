/* store/prefix.c: PrefixStore -- a view of a client in which key K is
 * prefix + "/" + K, as PyTorch's c10d::PrefixStore maps it. Nested views
 * compose into one prefix: PrefixStore("a", PrefixStore("b", s)) maps K to
 * "b/a/K", which the client sends as "/b/a/K".
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainrun/error.h"
#include "trainrun/store.h"

int tr_store_prefix_init(tr_store_prefix_t* p, tr_store_client_t* client,
                         const char* prefix) {
  p->client = client;
  p->prefix = strdup(prefix ? prefix : "");
  return p->prefix ? 0 : TR_ENOMEM;
}

int tr_store_prefix_nest(tr_store_prefix_t* p, const tr_store_prefix_t* parent,
                         const char* prefix) {
  p->client = parent->client;
  p->prefix = tr_store_prefix_key(parent, prefix ? prefix : "");
  return p->prefix ? 0 : TR_ENOMEM;
}

void tr_store_prefix_release(tr_store_prefix_t* p) {
  free(p->prefix);
  p->prefix = NULL;
  p->client = NULL;
}

char* tr_store_prefix_key(const tr_store_prefix_t* p, const char* key) {
  size_t a = strlen(p->prefix), b = strlen(key);
  char* k = malloc(a + 1 + b + 1);
  if (!k) return NULL;
  memcpy(k, p->prefix, a);
  k[a] = '/';
  memcpy(k + a + 1, key, b + 1);
  return k;
}

/* Map n keys; *out is one allocation (array + strings), caller frees. */
static int map_keys(const tr_store_prefix_t* p, const char* const* keys,
                    size_t n, char*** out) {
  size_t a = strlen(p->prefix), total = n * sizeof(char*);
  for (size_t i = 0; i < n; i++) total += a + 2 + strlen(keys[i]);
  char** arr = malloc(total ? total : 1);
  if (!arr) return TR_ENOMEM;
  char* s = (char*)(arr + n);
  for (size_t i = 0; i < n; i++) {
    arr[i] = s;
    memcpy(s, p->prefix, a);
    s[a] = '/';
    size_t b = strlen(keys[i]);
    memcpy(s + a + 1, keys[i], b + 1);
    s += a + 2 + b;
  }
  *out = arr;
  return 0;
}

/* Run expr with k bound to the mapped key. */
#define WITH_KEY(p, key, expr)                 \
  do {                                         \
    char* k = tr_store_prefix_key((p), (key)); \
    if (!k) return TR_ENOMEM;                  \
    int rc_ = (expr);                          \
    free(k);                                   \
    return rc_;                                \
  } while (0)

#define WITH_KEYS(p, keys, n, expr)            \
  do {                                         \
    char** ks;                                 \
    TR_CHECK(map_keys((p), (keys), (n), &ks)); \
    int rc_ = (expr);                          \
    free(ks);                                  \
    return rc_;                                \
  } while (0)

int tr_store_prefix_set(tr_store_prefix_t* p, const char* key, const void* val,
                        size_t len) {
  WITH_KEY(p, key, tr_store_client_set(p->client, k, val, len));
}

int tr_store_prefix_get(tr_store_prefix_t* p, const char* key, void** val,
                        size_t* len) {
  WITH_KEY(p, key, tr_store_client_get(p->client, k, val, len));
}

int tr_store_prefix_add(tr_store_prefix_t* p, const char* key, int64_t delta,
                        int64_t* result) {
  WITH_KEY(p, key, tr_store_client_add(p->client, k, delta, result));
}

int tr_store_prefix_compare_set(tr_store_prefix_t* p, const char* key,
                                const void* expected, size_t elen,
                                const void* desired, size_t dlen, void** cur,
                                size_t* clen) {
  WITH_KEY(p, key,
           tr_store_client_compare_set(p->client, k, expected, elen, desired,
                                       dlen, cur, clen));
}

int tr_store_prefix_check(tr_store_prefix_t* p, const char* const* keys,
                          size_t n, int* ready) {
  WITH_KEYS(p, keys, n,
            tr_store_client_check(p->client, (const char* const*)ks, n, ready));
}

int tr_store_prefix_wait(tr_store_prefix_t* p, const char* const* keys,
                         size_t n, int64_t timeout_ms) {
  WITH_KEYS(
      p, keys, n,
      tr_store_client_wait(p->client, (const char* const*)ks, n, timeout_ms));
}

int tr_store_prefix_delete_key(tr_store_prefix_t* p, const char* key,
                               int* deleted) {
  WITH_KEY(p, key, tr_store_client_delete_key(p->client, k, deleted));
}

int tr_store_prefix_append(tr_store_prefix_t* p, const char* key,
                           const void* val, size_t len) {
  WITH_KEY(p, key, tr_store_client_append(p->client, k, val, len));
}

int tr_store_prefix_multi_get(tr_store_prefix_t* p, const char* const* keys,
                              size_t n, void** vals, size_t* lens) {
  WITH_KEYS(p, keys, n,
            tr_store_client_multi_get(p->client, (const char* const*)ks, n,
                                      vals, lens));
}

int tr_store_prefix_multi_set(tr_store_prefix_t* p, const char* const* keys,
                              size_t n, const void* const* vals,
                              const size_t* lens) {
  WITH_KEYS(p, keys, n,
            tr_store_client_multi_set(p->client, (const char* const*)ks, n,
                                      vals, lens));
}

int tr_store_prefix_queue_push(tr_store_prefix_t* p, const char* key,
                               const void* val, size_t len) {
  WITH_KEY(p, key, tr_store_client_queue_push(p->client, k, val, len));
}

int tr_store_prefix_queue_pop(tr_store_prefix_t* p, const char* key, int block,
                              void** val, size_t* len) {
  WITH_KEY(p, key, tr_store_client_queue_pop(p->client, k, block, val, len));
}

int tr_store_prefix_queue_len(tr_store_prefix_t* p, const char* key,
                              int64_t* len) {
  WITH_KEY(p, key, tr_store_client_queue_len(p->client, k, len));
}

int tr_store_prefix_num_keys(tr_store_prefix_t* p, int64_t* n) {
  return tr_store_client_num_keys(p->client, n);
}
