/* store/db.c: the store's data: a hash table of keys, each with its value,
 * its queue and the list of WAITs blocked on it (waiters are indexed by
 * key, so a write touches only the waiters of the key it writes), and the
 * memory accounting behind TRAINRUN_STORE_MAX_MEMORY_BYTES.
 *
 * Hashes are seeded per server with random bytes, so a client cannot
 * precompute keys that collide.
 */
#include "config.h"

#include <stdlib.h>

#include "store/internal.h"
#include "trainrun/error.h"

#define MIN_BUCKETS 1024

static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint64_t fmix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  return h;
}

static uint64_t hash_key(uint64_t seed, const uint8_t* p, size_t n) {
  uint64_t h = seed ^ ((uint64_t)n * 0x9E3779B97F4A7C15ULL);
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    h = rotl(h ^ (w * 0x87c37b91114253d5ULL), 31) * 0x4cf5ad432745937fULL;
    p += 8;
    n -= 8;
  }
  uint64_t w = 0;
  memcpy(&w, p, n);
  h = rotl(h ^ (w * 0x87c37b91114253d5ULL), 31) * 0x4cf5ad432745937fULL;
  return fmix(h);
}

int tr__store_db_init(tr__store_db_t* db, const tr__store_limits_t* lim,
                      const char* token) {
  memset(db, 0, sizeof *db);
  db->lim = *lim;
  db->nbuckets = MIN_BUCKETS;
  db->buckets = calloc(db->nbuckets, sizeof *db->buckets);
  if (!db->buckets) return TR_ENOMEM;
  if (tr__store_random(&db->seed, sizeof db->seed) < 0)
    db->seed = (uint64_t)(uintptr_t)db ^ 0x5bd1e995u;
  if (token && *token) {
    db->token_len = strlen(token);
    db->token = malloc(db->token_len);
    if (!db->token) {
      free(db->buckets);
      return TR_ENOMEM;
    }
    memcpy(db->token, token, db->token_len);
  }
  return 0;
}

static void slot_free(tr__store_slot_t* s) {
  tr__store_qitem_t* q = s->qhead;
  while (q) {
    tr__store_qitem_t* next = q->next;
    free(q);
    q = next;
  }
  free(s->val);
  free(s);
}

void tr__store_db_release(tr__store_db_t* db) {
  for (size_t i = 0; i < db->nbuckets; i++) {
    tr__store_slot_t* s = db->buckets[i];
    while (s) {
      tr__store_slot_t* next = s->next;
      slot_free(s);
      s = next;
    }
  }
  free(db->buckets);
  if (db->token) memset(db->token, 0, db->token_len);
  free(db->token);
  memset(db, 0, sizeof *db);
}

tr__store_slot_t* tr__store_db_find(tr__store_db_t* db, const uint8_t* key,
                                    size_t klen) {
  uint64_t h = hash_key(db->seed, key, klen);
  tr__store_slot_t* s = db->buckets[h & (db->nbuckets - 1)];
  for (; s; s = s->next)
    if (s->hash == h && s->klen == klen && memcmp(s->key, key, klen) == 0)
      return s;
  return NULL;
}

/* Double the table (load factor 1); on allocation failure keep chaining. */
static void grow(tr__store_db_t* db) {
  size_t n = db->nbuckets * 2;
  tr__store_slot_t** b = calloc(n, sizeof *b);
  if (!b) return;
  for (size_t i = 0; i < db->nbuckets; i++) {
    tr__store_slot_t* s = db->buckets[i];
    while (s) {
      tr__store_slot_t* next = s->next;
      size_t j = s->hash & (n - 1);
      s->next = b[j];
      b[j] = s;
      s = next;
    }
  }
  free(db->buckets);
  db->buckets = b;
  db->nbuckets = n;
}

int tr__store_db_get(tr__store_db_t* db, const uint8_t* key, size_t klen,
                     tr__store_slot_t** out) {
  uint64_t h = hash_key(db->seed, key, klen);
  tr__store_slot_t** head = &db->buckets[h & (db->nbuckets - 1)];
  for (tr__store_slot_t* s = *head; s; s = s->next)
    if (s->hash == h && s->klen == klen && memcmp(s->key, key, klen) == 0) {
      *out = s;
      return 0;
    }
  if ((uint64_t)db->bytes + klen > db->lim.max_memory) return TR_ELIMIT;
  tr__store_slot_t* s = calloc(1, sizeof *s + klen);
  if (!s) return TR_ENOMEM;
  s->hash = h;
  s->klen = klen;
  memcpy(s->key, key, klen);
  s->next = *head;
  *head = s;
  db->nslots++;
  db->bytes += (int64_t)klen;
  if (db->nslots > db->nbuckets) grow(db);
  *out = s;
  return 0;
}

void tr__store_db_gc(tr__store_db_t* db, tr__store_slot_t* slot) {
  if (!slot || slot->has_val || slot->qhead || slot->whead) return;
  tr__store_slot_t** pp = &db->buckets[slot->hash & (db->nbuckets - 1)];
  while (*pp && *pp != slot) pp = &(*pp)->next;
  if (!*pp) return;
  *pp = slot->next;
  db->nslots--;
  db->bytes -= (int64_t)slot->klen;
  slot_free(slot);
}

/* Bytes to allocate for a value of n bytes: a little slack so counters and
 * small rewrites reuse their storage. */
static size_t val_cap(size_t n) { return n < 32 ? 32 : n; }

int tr__store_db_set(tr__store_db_t* db, tr__store_slot_t* s, const void* v,
                     size_t n) {
  int64_t old = s->has_val ? (int64_t)s->vlen : 0;
  if ((uint64_t)(db->bytes - old) + n > db->lim.max_memory) return TR_ELIMIT;
  if (s->vcap < n || !s->val) {
    size_t cap = val_cap(n);
    uint8_t* p = realloc(s->val, cap);
    if (!p) return TR_ENOMEM;
    s->val = p;
    s->vcap = cap;
  } else if (s->vcap > 4096 && n < s->vcap / 4) {
    uint8_t* p = realloc(s->val, val_cap(n)); /* shrink; failure is fine */
    if (p) {
      s->val = p;
      s->vcap = val_cap(n);
    }
  }
  if (n) memcpy(s->val, v, n);
  s->vlen = n;
  if (!s->has_val) db->nkeys++;
  s->has_val = 1;
  db->bytes += (int64_t)n - old;
  return 0;
}

int tr__store_db_append(tr__store_db_t* db, tr__store_slot_t* s, const void* v,
                        size_t n) {
  if (!s->has_val) return tr__store_db_set(db, s, v, n);
  if ((uint64_t)db->bytes + n > db->lim.max_memory) return TR_ELIMIT;
  TR_CHECK(TR_GROW(s->val, s->vlen + n, s->vcap));
  if (n) memcpy(s->val + s->vlen, v, n);
  s->vlen += n;
  db->bytes += (int64_t)n;
  return 0;
}

int tr__store_db_delete(tr__store_db_t* db, tr__store_slot_t* s) {
  if (!s || !s->has_val) return 0;
  db->bytes -= (int64_t)s->vlen;
  db->nkeys--;
  free(s->val);
  s->val = NULL;
  s->vlen = s->vcap = 0;
  s->has_val = 0;
  return 1;
}

int tr__store_db_queue_push(tr__store_db_t* db, tr__store_slot_t* s,
                            const void* v, size_t n) {
  if ((uint64_t)db->bytes + n > db->lim.max_memory) return TR_ELIMIT;
  tr__store_qitem_t* q = malloc(sizeof *q + n);
  if (!q) return TR_ENOMEM;
  q->next = NULL;
  q->len = n;
  if (n) memcpy(q->data, v, n);
  if (s->qtail)
    s->qtail->next = q;
  else
    s->qhead = q;
  s->qtail = q;
  s->qlen++;
  db->bytes += (int64_t)n;
  return 0;
}

tr__store_qitem_t* tr__store_db_queue_pop(tr__store_db_t* db,
                                          tr__store_slot_t* s) {
  tr__store_qitem_t* q = s ? s->qhead : NULL;
  if (!q) return NULL;
  s->qhead = q->next;
  if (!s->qhead) s->qtail = NULL;
  s->qlen--;
  db->bytes -= (int64_t)q->len;
  return q;
}

/* The waiter-list walk shared by both wake-ups. */
static void wake(tr__store_db_t* db, tr__store_slot_t* s, int one) {
  tr__store_reg_t* r;
  while ((r = s->whead) != NULL) {
    s->whead = r->next;
    if (s->whead)
      s->whead->prev = NULL;
    else
      s->wtail = NULL;
    r->prev = r->next = NULL;
    r->slot = NULL;
    tr__store_conn_t* c = r->conn; /* r may be freed below */
    if (--c->wait_pending > 0) continue;
    if (c->wait_regs != &c->wait_one) free(c->wait_regs);
    c->wait_regs = NULL;
    c->wait_nregs = 0;
    c->waiting = 0;
    if (tr__store_put_u8(&c->out, TR__WAIT_STOP_WAITING) == 0 && db->notify)
      db->notify(c, db->notify_arg);
    if (one) return;
  }
}

void tr__store_db_wake_all(tr__store_db_t* db, tr__store_slot_t* s) {
  wake(db, s, 0);
}

void tr__store_db_wake_one(tr__store_db_t* db, tr__store_slot_t* s) {
  wake(db, s, 1);
}
