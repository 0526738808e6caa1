/* tests/fuzz/store_fuzz.c: libFuzzer target for the store's request parser
 * and engine (store/proto.c, conn.c, db.c), no sockets involved.
 *
 * The first input byte picks a mode:
 *   bit 0 = 0  several connections: the rest is a list of chunks, each a
 *              header byte (connection = h % 3, length = h >> 2) and that
 *              many bytes fed to the connection; a connection that is
 *              rejected is released and replaced by a fresh one. Bit 1
 *              sends VALIDATE for each new connection first, bit 2 gives
 *              the table a token. After a rejection and at the end, the
 *              table's accounting is checked against a walk of the table.
 *   bit 0 = 1  split invariance: the rest is fed to one connection whole,
 *              and to another (on a second table) in pieces cut at a
 *              pattern drawn from the input; both must produce the same
 *              reply bytes and the same verdict.
 * Limits are small so that the limit paths are reached.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>

#include "store/internal.h"
#include "trainrun/log.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

static const tr__store_limits_t lim = {64, 256, 16, 4096, 8192};

static void die(const char* what) {
  fprintf(stderr, "store_fuzz: invariant broken: %s\n", what);
  abort();
}

/* The table walk is not code under test: keep coverage hooks out of it. */
#if defined(__clang__) && __clang_major__ >= 13
#define NO_COVERAGE __attribute__((no_sanitize("coverage")))
#else
#define NO_COVERAGE
#endif

/* Walk the table: sizes, counts and waiter links must match the books. */
NO_COVERAGE static void check_db(tr__store_db_t* db) {
  int64_t bytes = 0, keys = 0;
  size_t slots = 0;
  for (size_t i = 0; i < db->nbuckets; i++) {
    for (tr__store_slot_t* s = db->buckets[i]; s; s = s->next) {
      slots++;
      bytes += (int64_t)s->klen;
      if (s->has_val) {
        keys++;
        bytes += (int64_t)s->vlen;
      }
      size_t q = 0;
      for (tr__store_qitem_t* it = s->qhead; it; it = it->next) {
        q++;
        bytes += (int64_t)it->len;
      }
      if (q != s->qlen) die("queue length");
      if (!s->has_val && !s->qhead && !s->whead) die("empty slot kept");
      tr__store_reg_t* prev = NULL;
      for (tr__store_reg_t* r = s->whead; r; r = r->next) {
        if (r->slot != s || r->prev != prev) die("waiter links");
        if (!r->conn->waiting || r->conn->wait_pending == 0)
          die("waiter of a connection that is not waiting");
        /* SET-type writes release every waiter; QUEUE_PUSH only one */
        if (s->has_val) die("waiter on a key with a value");
        prev = r;
      }
      if (s->wtail != prev) die("waiter tail");
    }
  }
  if (slots != db->nslots) die("slot count");
  if (keys != db->nkeys) die("key count");
  if (bytes != db->bytes) die("byte count");
  if ((uint64_t)bytes > lim.max_memory) die("memory limit");
}

static void new_conn(tr__store_db_t* db, tr__store_conn_t* c, int validate) {
  tr__store_conn_init(c, db, "fuzz");
  if (validate) {
    uint8_t v[5] = {0, 0xCE, 0xF7, 0x85, 0x3C};
    if (tr__store_conn_input(c, v, 5) < 0) die("VALIDATE refused");
  }
}

static void multi(const uint8_t* data, size_t size, int flags) {
  tr__store_db_t db;
  if (tr__store_db_init(&db, &lim, (flags & 4) ? "tok" : NULL) < 0) return;
  tr__store_conn_t conns[3];
  for (int i = 0; i < 3; i++) new_conn(&db, &conns[i], flags & 2);
  size_t off = 0;
  while (off < size) {
    uint8_t h = data[off++];
    tr__store_conn_t* c = &conns[h % 3];
    size_t n = h >> 2;
    if (n > size - off) n = size - off;
    int rc = tr__store_conn_input(c, data + off, n);
    off += n;
    if (rc < 0) {
      tr__store_conn_release(c);
      new_conn(&db, c, flags & 2);
    }
    for (int i = 0; i < 3; i++) { /* the socket took every reply */
      conns[i].out.len = 0;
      if (conns[i].paused && tr__store_conn_resume(&conns[i]) < 0) {
        tr__store_conn_release(&conns[i]);
        new_conn(&db, &conns[i], flags & 2);
      }
    }
    if (rc < 0 || off >= size) check_db(&db);
  }
  for (int i = 0; i < 3; i++) tr__store_conn_release(&conns[i]);
  check_db(&db);
  tr__store_db_release(&db);
}

static void split(const uint8_t* data, size_t size) {
  tr__store_db_t da, db;
  if (tr__store_db_init(&da, &lim, NULL) < 0) return;
  if (tr__store_db_init(&db, &lim, NULL) < 0) {
    tr__store_db_release(&da);
    return;
  }
  tr__store_conn_t a, b;
  new_conn(&da, &a, 1);
  new_conn(&db, &b, 1);
  int ra = tr__store_conn_input(&a, data, size);
  int rb = 0;
  uint32_t x = 2166136261u;
  for (size_t i = 0; i < size; i++) x = (x ^ data[i]) * 16777619u;
  size_t off = 0;
  while (off < size && rb >= 0) {
    x = x * 1103515245u + 12345u;
    size_t n = 1 + (x >> 16) % 7; /* pieces of 1..7 bytes */
    if (n > size - off) n = size - off;
    rb = tr__store_conn_input(&b, data + off, n);
    off += n;
  }
  if ((ra < 0) != (rb < 0)) die("split changed the verdict");
  if (a.out.len != b.out.len ||
      (a.out.len && memcmp(a.out.buf, b.out.buf, a.out.len)))
    die("split changed the replies");
  check_db(&da);
  check_db(&db);
  tr__store_conn_release(&a);
  tr__store_conn_release(&b);
  tr__store_db_release(&da);
  tr__store_db_release(&db);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static int quiet;
  if (!quiet) { /* rejected clients are expected: keep the output clean */
    tr_log_set_level(TR_LOG_NONE);
    quiet = 1;
  }
  if (size < 1) return 0;
  if (data[0] & 1)
    split(data + 1, size - 1);
  else
    multi(data + 1, size - 1, data[0]);
  return 0;
}
