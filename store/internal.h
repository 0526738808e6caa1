/* store/internal.h: what the store's files share and nothing outside store/
 * (and its tests, fuzz target and bench) uses: wire constants, byte buffers,
 * the incremental request parser (proto.c), the key table with its waiters
 * and queues (db.c), the per-connection request engine (conn.c) and the
 * token proof (auth.c). None of these touch sockets: server.c feeds them
 * bytes from libuv, the fuzz target feeds them bytes from a file.
 */
#ifndef TRAINRUN_STORE_INTERNAL_H
#define TRAINRUN_STORE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/buf.h" /* tr__buf_t: requests and replies */

/* ---- wire constants (PyTorch's c10d::detail::QueryType and friends) ---- */

#define TR__STORE_MAGIC 0x3C85F7CEu /* VALIDATE's u32 */

typedef enum {
  TR__Q_VALIDATE = 0,
  TR__Q_SET = 1,
  TR__Q_COMPARE_SET = 2,
  TR__Q_GET = 3,
  TR__Q_ADD = 4,
  TR__Q_CHECK = 5,
  TR__Q_WAIT = 6,
  TR__Q_GETNUMKEYS = 7,
  TR__Q_DELETE_KEY = 8,
  TR__Q_APPEND = 9,
  TR__Q_MULTI_GET = 10,
  TR__Q_MULTI_SET = 11,
  TR__Q_CANCEL_WAIT = 12,
  TR__Q_PING = 13,
  TR__Q_QUEUE_PUSH = 14,
  TR__Q_QUEUE_POP = 15,
  TR__Q_QUEUE_LEN = 16,
  /* trainrun's own, outside PyTorch's range: the token proof */
  TR__Q_AUTH_HELLO = 0x80,
  TR__Q_AUTH_PROVE = 0x81
} tr__store_cmd_t;

enum { TR__CHECK_READY = 0, TR__CHECK_NOT_READY = 1 };
enum { TR__WAIT_STOP_WAITING = 0, TR__WAIT_CANCELED = 1 };

#define TR__AUTH_NONCE 32 /* bytes of each nonce */
#define TR__AUTH_MAC 32   /* HMAC-SHA256 */

/* Name of a command byte for log lines ("SET", "0x63"); static or buf. */
const char* tr__store_cmd_name(unsigned cmd, char buf[8]);

/* ---- little-endian integers (the wire is the x86/aarch64 host order) ---- */

static inline uint64_t tr__rd_u64(const uint8_t* p) {
  uint64_t v;
  memcpy(&v, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}
static inline uint32_t tr__rd_u32(const uint8_t* p) {
  uint32_t v;
  memcpy(&v, p, 4);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap32(v);
#endif
  return v;
}
static inline void tr__wr_u64(uint8_t* p, uint64_t v) {
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  memcpy(p, &v, 8);
}
static inline void tr__wr_u32(uint8_t* p, uint32_t v) {
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap32(v);
#endif
  memcpy(p, &v, 4);
}

/* ---- wire encoding into a buffer (core/buf.h) ---- */

/* Little-endian integers, as PyTorch's TCPStore writes them. */
int tr__store_put_u8(tr__buf_t* b, uint8_t v);
int tr__store_put_u32(tr__buf_t* b, uint32_t v);
int tr__store_put_u64(tr__buf_t* b, uint64_t v);
/* u64 length + bytes: PyTorch's string and vector encoding. */
int tr__store_put_bytes(tr__buf_t* b, const void* p, size_t n);

/* ---- limits ---- */

typedef struct {
  uint64_t max_key;     /* bytes of one key */
  uint64_t max_value;   /* bytes of one value */
  uint64_t max_keys;    /* keys in one multi-key request */
  uint64_t max_request; /* bytes of one request; of one MULTI_GET reply */
  uint64_t max_memory;  /* bytes the table holds */
} tr__store_limits_t;

/* The limits from the TRAINRUN_STORE_* parameters. */
void tr__store_limits_from_params(tr__store_limits_t* lim);

/* ---- server defaults (server.c) ---- */

/* I/O loops when neither opts.threads nor TRAINRUN_STORE_THREADS says:
 * min(4, max(1, online CPUs / 4)). */
int tr__store_default_threads(void);
/* Accept queues for expected clients and a backlog per queue:
 * ceil(expected / backlog), 1 to 16 (1 when expected is not known). */
int tr__store_default_listeners(int expected, int backlog);
/* The kernel's accept-queue limit (/proc/sys/net/core/somaxconn), 4096
 * when it cannot be read. */
int tr__store_somaxconn(void);

/* ---- incremental request parser (proto.c) ---- */

/* A byte string inside the request buffer. */
typedef struct {
  const uint8_t* p;
  size_t len;
} tr__bytes_t;

/* A complete, validated request. Pointers point into the buffer given to
 * tr__store_parse and live as long as it does. */
typedef struct {
  uint8_t cmd;
  size_t len;           /* bytes of the whole request, command byte included */
  tr__bytes_t key;      /* single-key commands */
  tr__bytes_t a;        /* SET/APPEND/QUEUE_PUSH value; COMPARE_SET expected */
  tr__bytes_t b;        /* COMPARE_SET desired */
  int64_t i64;          /* ADD delta */
  uint32_t u32;         /* VALIDATE magic, PING nonce */
  uint64_t count;       /* CHECK/WAIT/MULTI_GET keys, MULTI_SET pairs */
  const uint8_t* items; /* the count items: u64 len + bytes each */
  const uint8_t* raw;   /* AUTH_PROVE: client nonce + MAC */
} tr__store_req_t;

/* Parser state of the request being received. All offsets count from the
 * request's first byte. Parsing resumes where it stopped: each byte is
 * examined once however the request is split across reads. */
typedef struct {
  size_t pos;     /* bytes validated so far */
  size_t need;    /* bytes needed before parsing can progress */
  uint64_t count; /* multi-key count read so far */
  uint64_t done;  /* multi-key items parsed so far */
  uint8_t cmd;
  uint8_t step;   /* index in the command's field list */
  size_t err_off; /* on error: offset of the bad field */
  char err[160];  /* on error: what was wrong */
} tr__store_parser_t;

static inline void tr__store_parser_reset(tr__store_parser_t* ps) {
  ps->pos = 0;
  ps->need = 1;
  ps->count = 0;
  ps->done = 0;
  ps->cmd = 0;
  ps->step = 0;
}

/* Parse the request that starts at buf, of which len bytes have arrived.
 * Returns 1 when it is complete (req filled, req->len its size), 0 when
 * more bytes are needed (ps->need says how many in total, at least), or a
 * negative TR_E* code (TR_EPROTO unknown command, TR_ELIMIT a limit) with
 * ps->err and ps->err_off set. Call tr__store_parser_reset before the next
 * request. The same buf prefix must be passed again on resumption. */
int tr__store_parse(tr__store_parser_t* ps, const uint8_t* buf, size_t len,
                    const tr__store_limits_t* lim, tr__store_req_t* req);

/* Next item of a validated multi-key list; advances *cur. */
static inline tr__bytes_t tr__store_next_item(const uint8_t** cur) {
  tr__bytes_t b;
  b.len = (size_t)tr__rd_u64(*cur);
  b.p = *cur + 8;
  *cur += 8 + b.len;
  return b;
}

/* ---- key table, queues, waiters (db.c) ---- */

typedef struct tr__store_conn_s tr__store_conn_t;
typedef struct tr__store_slot_s tr__store_slot_t;

/* One key a WAIT is blocked on: linked into the key's waiter list. */
typedef struct tr__store_reg_s {
  struct tr__store_reg_s* prev;
  struct tr__store_reg_s* next;
  tr__store_slot_t* slot; /* NULL once satisfied or removed */
  tr__store_conn_t* conn;
} tr__store_reg_t;

typedef struct tr__store_qitem_s {
  struct tr__store_qitem_s* next;
  size_t len;
  uint8_t data[];
} tr__store_qitem_t;

/* A key: its value (if set), its queue (if any) and the WAITs blocked on
 * it. A slot with none of the three is freed. */
struct tr__store_slot_s {
  tr__store_slot_t* next; /* hash chain */
  uint64_t hash;
  uint8_t* val;
  size_t vlen;
  size_t vcap;
  int has_val;
  tr__store_qitem_t* qhead;
  tr__store_qitem_t* qtail;
  size_t qlen;
  tr__store_reg_t* whead;
  tr__store_reg_t* wtail;
  size_t klen;
  uint8_t key[];
};

typedef struct {
  tr__store_slot_t** buckets;
  size_t nbuckets; /* a power of two */
  size_t nslots;
  uint64_t seed;
  int64_t nkeys; /* slots with a value: GETNUMKEYS */
  int64_t bytes; /* keys + values + queued items held */
  int64_t requests;
  tr__store_limits_t lim;
  uint8_t* token; /* NULL: no authentication */
  size_t token_len;
  /* Called when a connection's output gains bytes (the server schedules a
   * write); may be NULL. */
  void (*notify)(tr__store_conn_t* c, void* arg);
  void* notify_arg;
} tr__store_db_t;

int tr__store_db_init(tr__store_db_t* db, const tr__store_limits_t* lim,
                      const char* token);
/* Free every slot. Every connection must have been released first. */
void tr__store_db_release(tr__store_db_t* db);

tr__store_slot_t* tr__store_db_find(tr__store_db_t* db, const uint8_t* key,
                                    size_t klen);
/* Find or create; TR_ELIMIT when a new key would pass max_memory. */
int tr__store_db_get(tr__store_db_t* db, const uint8_t* key, size_t klen,
                     tr__store_slot_t** out);
/* Free slot when it holds nothing any more. */
void tr__store_db_gc(tr__store_db_t* db, tr__store_slot_t* slot);

static inline int tr__store_slot_present(const tr__store_slot_t* s) {
  return s && (s->has_val || s->qlen > 0);
}

/* Store a value (copy). TR_ELIMIT past max_memory, TR_ENOMEM. */
int tr__store_db_set(tr__store_db_t* db, tr__store_slot_t* s, const void* v,
                     size_t n);
int tr__store_db_append(tr__store_db_t* db, tr__store_slot_t* s, const void* v,
                        size_t n);
/* Remove the value; 1 if there was one. */
int tr__store_db_delete(tr__store_db_t* db, tr__store_slot_t* s);
int tr__store_db_queue_push(tr__store_db_t* db, tr__store_slot_t* s,
                            const void* v, size_t n);
/* Detach the head item (caller frees it); NULL when empty. */
tr__store_qitem_t* tr__store_db_queue_pop(tr__store_db_t* db,
                                          tr__store_slot_t* s);

/* Wake-ups: every WAIT registered on s counts the key as present; those
 * left with no missing key are answered STOP_WAITING. _one stops after the
 * first WAIT it completes (QUEUE_PUSH: one item, one waiter). */
void tr__store_db_wake_all(tr__store_db_t* db, tr__store_slot_t* s);
void tr__store_db_wake_one(tr__store_db_t* db, tr__store_slot_t* s);

/* ---- one client connection's request engine (conn.c) ---- */

typedef enum {
  TR__CONN_NEW,  /* must send VALIDATE first */
  TR__CONN_AUTH, /* validated; must prove the token */
  TR__CONN_READY
} tr__store_conn_state_t;

/* Replies pile up in out; past this many bytes the connection stops
 * parsing (and the server stops reading) until they are written. */
#define TR__STORE_OUT_HIGH (4u << 20)

struct tr__store_conn_s {
  tr__store_db_t* db;
  char peer[72]; /* "address:port" for log lines */
  tr__store_conn_state_t state;
  tr__buf_t in; /* the unparsed tail (a partial request) */
  tr__store_parser_t ps;
  uint64_t offset; /* stream bytes before in.buf[0] */
  uint64_t nreq;   /* requests completed */
  tr__buf_t out;   /* replies not yet handed to the socket */
  int paused;      /* stopped parsing: out is over the mark */
  int logged;      /* the reason to close it was logged */
  /* the pending WAIT */
  int waiting;
  size_t wait_pending; /* its keys still missing */
  size_t wait_nregs;
  tr__store_reg_t* wait_regs;
  tr__store_reg_t wait_one; /* storage when one key is missing */
  /* token proof */
  int hello_sent;
  uint8_t snonce[TR__AUTH_NONCE];
  void* user; /* the server's per-client record */
};

void tr__store_conn_init(tr__store_conn_t* c, tr__store_db_t* db,
                         const char* peer);

/* Feed bytes received from the client. Replies go to c->out (and to other
 * connections' out when this one wakes their WAITs). Returns 0, or a
 * negative TR_E* when the client broke the protocol or a limit: the reason
 * is logged with the peer and the caller must close the connection. */
int tr__store_conn_input(tr__store_conn_t* c, const uint8_t* data, size_t len);

/* Space for the next read straight into c->in when a large request is
 * partly received (no copy); NULL otherwise. *room is its size. */
uint8_t* tr__store_conn_read_room(tr__store_conn_t* c, size_t* room);
/* n bytes were read into the room given by tr__store_conn_read_room. */
int tr__store_conn_input_inplace(tr__store_conn_t* c, size_t n);

/* Continue parsing buffered input after a pause; same returns as _input. */
int tr__store_conn_resume(tr__store_conn_t* c);

/* Drop the pending WAIT and free the buffers (the client left). */
void tr__store_conn_release(tr__store_conn_t* c);

/* ---- token proof (auth.c) ---- */

typedef struct {
  uint32_t h[8];
  uint64_t nbytes;
  uint8_t block[64];
  size_t fill;
} tr__sha256_t;

void tr__sha256_init(tr__sha256_t* s);
void tr__sha256_update(tr__sha256_t* s, const void* p, size_t n);
void tr__sha256_final(tr__sha256_t* s, uint8_t out[32]);
void tr__hmac_sha256(const void* key, size_t klen, const void* msg, size_t mlen,
                     uint8_t out[32]);

/* The client's (side 'c') and server's (side 's') proofs over both nonces. */
void tr__store_auth_mac(const void* token, size_t tlen, char side,
                        const uint8_t snonce[TR__AUTH_NONCE],
                        const uint8_t cnonce[TR__AUTH_NONCE],
                        uint8_t mac[TR__AUTH_MAC]);
/* Fill buf with random bytes (getrandom); TR_EIO on failure. */
int tr__store_random(void* buf, size_t n);
/* Constant-time comparison: 1 when equal. */
int tr__store_ct_equal(const uint8_t* a, const uint8_t* b, size_t n);

#endif /* TRAINRUN_STORE_INTERNAL_H */
