/* store/conn.c: one client connection's request engine. It buffers what a
 * client sends until a request is complete, enforces the handshake
 * (VALIDATE first, then the token proof when the server has a token),
 * executes each request against the table (db.c) and appends the reply
 * bytes PyTorch's client expects to the connection's output.
 *
 * Requests that arrive whole are parsed straight from the read buffer; only
 * the partial tail of a read is copied into the connection (and a large
 * request is then read straight into that buffer). A client that breaks a
 * rule is reported here, by address and stream offset, and its caller
 * closes it; nothing here affects other clients except through the table.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "store/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"

/* Bytes of input buffer kept between requests; larger ones are freed. */
#define IN_KEEP (64u << 10)
/* Room offered for reading into c->in at least. */
#define READ_ROOM (64u << 10)

void tr__store_conn_init(tr__store_conn_t* c, tr__store_db_t* db,
                         const char* peer) {
  memset(c, 0, sizeof *c);
  c->db = db;
  snprintf(c->peer, sizeof c->peer, "%s", peer ? peer : "?");
  c->state = TR__CONN_NEW;
  tr__store_parser_reset(&c->ps);
}

/* Unlink every key the pending WAIT is registered on. */
static void wait_clear(tr__store_conn_t* c) {
  if (!c->waiting) return;
  for (size_t i = 0; i < c->wait_nregs; i++) {
    tr__store_reg_t* r = &c->wait_regs[i];
    tr__store_slot_t* s = r->slot;
    if (!s) continue;
    if (r->prev)
      r->prev->next = r->next;
    else
      s->whead = r->next;
    if (r->next)
      r->next->prev = r->prev;
    else
      s->wtail = r->prev;
    r->slot = NULL;
    tr__store_db_gc(c->db, s);
  }
  if (c->wait_regs != &c->wait_one) free(c->wait_regs);
  c->wait_regs = NULL;
  c->wait_nregs = 0;
  c->wait_pending = 0;
  c->waiting = 0;
}

void tr__store_conn_release(tr__store_conn_t* c) {
  wait_clear(c);
  tr__buf_release(&c->in);
  tr__buf_release(&c->out);
}

/* Report why the client is being closed; returns code. */
static int reject(tr__store_conn_t* c, int code, uint64_t off, const char* fmt,
                  ...) __attribute__((format(printf, 4, 5)));

static int reject(tr__store_conn_t* c, int code, uint64_t off, const char* fmt,
                  ...) {
  char why[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  c->logged = 1;
  TR_LOG_WARN(STORE,
              "closing client %s: %s (request %" PRIu64
              " at stream byte %" PRIu64 ")",
              c->peer, why, c->nreq + 1, off);
  return code;
}

static void notify_self(tr__store_conn_t* c) {
  if (c->db->notify) c->db->notify(c, c->db->notify_arg);
}

/* ---- commands ---- */

/* ADD on the stored text: std::stoll's rules (leading space, sign, digits,
 * anything after the digits ignored); 0 or TR_EPARSE / TR_ERANGE. */
static int parse_counter(const uint8_t* p, size_t n, int64_t* out) {
  size_t i = 0;
  while (i < n && (p[i] == ' ' || (p[i] >= '\t' && p[i] <= '\r'))) i++;
  int neg = 0;
  if (i < n && (p[i] == '+' || p[i] == '-')) neg = p[i++] == '-';
  if (i >= n || p[i] < '0' || p[i] > '9') return TR_EPARSE;
  uint64_t v = 0;
  const uint64_t lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
  for (; i < n && p[i] >= '0' && p[i] <= '9'; i++) {
    uint64_t d = (uint64_t)(p[i] - '0');
    if (v > (lim - d) / 10) return TR_ERANGE;
    v = v * 10 + d;
  }
  *out = neg ? (int64_t)(0 - v) : (int64_t)v;
  return 0;
}

/* v in decimal, as "%" PRId64 writes it (snprintf's format parsing was a
 * visible share of an ADD's CPU time); returns the length. */
static size_t format_i64(int64_t v, char out[24]) {
  char tmp[24];
  size_t n = 0;
  uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
  do {
    tmp[n++] = (char)('0' + u % 10);
    u /= 10;
  } while (u);
  size_t len = 0;
  if (v < 0) out[len++] = '-';
  while (n) out[len++] = tmp[--n];
  return len;
}

static int cmd_add(tr__store_conn_t* c, const tr__store_req_t* rq,
                   uint64_t off) {
  tr__store_slot_t* s;
  int rc = tr__store_db_get(c->db, rq->key.p, rq->key.len, &s);
  if (rc < 0) return rc;
  int64_t v = 0;
  if (s->has_val) {
    rc = parse_counter(s->val, s->vlen, &v);
    if (rc < 0)
      return reject(c, rc, off, "ADD on key '%.*s' whose value is %s",
                    (int)(rq->key.len > 64 ? 64 : rq->key.len),
                    (const char*)rq->key.p,
                    rc == TR_ERANGE ? "out of int64 range" : "not a number");
  }
  if (__builtin_add_overflow(v, rq->i64, &v)) {
    tr__store_db_gc(c->db, s);
    return reject(c, TR_ERANGE, off, "ADD overflows int64");
  }
  char text[24];
  size_t n = format_i64(v, text);
  rc = tr__store_db_set(c->db, s, text, n);
  if (rc < 0) {
    tr__store_db_gc(c->db, s);
    return rc;
  }
  tr__store_db_wake_all(c->db, s);
  return tr__store_put_u64(&c->out, (uint64_t)v);
}

static int cmd_wait(tr__store_conn_t* c, const tr__store_req_t* rq,
                    uint64_t off) {
  if (c->waiting)
    return reject(c, TR_EPROTO, off,
                  "sent WAIT while its previous WAIT is pending");
  const uint8_t* cur = rq->items;
  size_t missing = 0;
  for (uint64_t i = 0; i < rq->count; i++) {
    tr__bytes_t k = tr__store_next_item(&cur);
    if (!tr__store_slot_present(tr__store_db_find(c->db, k.p, k.len)))
      missing++;
  }
  if (missing == 0) return tr__store_put_u8(&c->out, TR__WAIT_STOP_WAITING);
  tr__store_reg_t* regs = &c->wait_one;
  if (missing > 1) {
    regs = calloc(missing, sizeof *regs);
    if (!regs) return TR_ENOMEM;
  }
  c->waiting = 1;
  c->wait_regs = regs;
  c->wait_nregs = 0;
  c->wait_pending = missing;
  cur = rq->items;
  for (uint64_t i = 0; i < rq->count; i++) {
    tr__bytes_t k = tr__store_next_item(&cur);
    tr__store_slot_t* s = tr__store_db_find(c->db, k.p, k.len);
    if (tr__store_slot_present(s)) continue;
    if (!s) {
      int rc = tr__store_db_get(c->db, k.p, k.len, &s);
      if (rc < 0) return rc; /* caller closes; release unlinks the rest */
    }
    tr__store_reg_t* r = &regs[c->wait_nregs++];
    r->conn = c;
    r->slot = s;
    r->next = NULL;
    r->prev = s->wtail;
    if (s->wtail)
      s->wtail->next = r;
    else
      s->whead = r;
    s->wtail = r;
  }
  return 0;
}

static int cmd_multi_get(tr__store_conn_t* c, const tr__store_req_t* rq,
                         uint64_t off) {
  const uint8_t* cur = rq->items;
  uint64_t total = 0;
  for (uint64_t i = 0; i < rq->count; i++) {
    tr__bytes_t k = tr__store_next_item(&cur);
    tr__store_slot_t* s = tr__store_db_find(c->db, k.p, k.len);
    total += 8 + (s && s->has_val ? s->vlen : 0);
  }
  if (total > c->db->lim.max_request)
    return reject(c, TR_ELIMIT, off,
                  "MULTI_GET reply of %" PRIu64
                  " bytes exceeds the limit "
                  "of %" PRIu64 " (TRAINRUN_STORE_MAX_REQUEST_BYTES)",
                  total, c->db->lim.max_request);
  TR_CHECK(tr__buf_grow(&c->out, (size_t)total));
  cur = rq->items;
  for (uint64_t i = 0; i < rq->count; i++) {
    tr__bytes_t k = tr__store_next_item(&cur);
    tr__store_slot_t* s = tr__store_db_find(c->db, k.p, k.len);
    if (s && s->has_val)
      tr__store_put_bytes(&c->out, s->val, s->vlen);
    else
      tr__store_put_u64(&c->out, 0);
  }
  return 0;
}

static int cmd_multi_set(tr__store_conn_t* c, const tr__store_req_t* rq,
                         uint64_t off) {
  /* Check the memory limit for the whole request first, so it is applied
   * entirely or not at all. */
  uint64_t add = rq->len;
  if ((uint64_t)c->db->bytes + add > c->db->lim.max_memory)
    return reject(c, TR_ELIMIT, off,
                  "MULTI_SET would pass the store memory limit of %" PRIu64
                  " bytes (TRAINRUN_STORE_MAX_MEMORY_BYTES)",
                  c->db->lim.max_memory);
  const uint8_t* cur = rq->items;
  for (uint64_t i = 0; i < rq->count; i++) {
    tr__bytes_t k = tr__store_next_item(&cur);
    tr__bytes_t v = tr__store_next_item(&cur);
    tr__store_slot_t* s;
    TR_CHECK(tr__store_db_get(c->db, k.p, k.len, &s));
    int rc = tr__store_db_set(c->db, s, v.p, v.len);
    if (rc < 0) {
      tr__store_db_gc(c->db, s);
      return rc;
    }
    tr__store_db_wake_all(c->db, s);
  }
  return 0;
}

static int cmd_compare_set(tr__store_conn_t* c, const tr__store_req_t* rq) {
  tr__store_slot_t* s = tr__store_db_find(c->db, rq->key.p, rq->key.len);
  if (!s || !s->has_val) {
    if (rq->a.len != 0) /* PyTorch answers expected and stores nothing */
      return tr__store_put_bytes(&c->out, rq->a.p, rq->a.len);
    if (!s) TR_CHECK(tr__store_db_get(c->db, rq->key.p, rq->key.len, &s));
    int rc = tr__store_db_set(c->db, s, rq->b.p, rq->b.len);
    if (rc < 0) {
      tr__store_db_gc(c->db, s);
      return rc;
    }
    tr__store_db_wake_all(c->db, s);
    return tr__store_put_bytes(&c->out, s->val, s->vlen);
  }
  if (s->vlen == rq->a.len && memcmp(s->val, rq->a.p, rq->a.len) == 0) {
    TR_CHECK(tr__store_db_set(c->db, s, rq->b.p, rq->b.len));
    tr__store_db_wake_all(c->db, s);
  }
  return tr__store_put_bytes(&c->out, s->val, s->vlen);
}

/* Write-type commands that store a value at one key. */
static int cmd_store_value(tr__store_conn_t* c, const tr__store_req_t* rq) {
  tr__store_slot_t* s;
  TR_CHECK(tr__store_db_get(c->db, rq->key.p, rq->key.len, &s));
  int rc;
  if (rq->cmd == TR__Q_SET)
    rc = tr__store_db_set(c->db, s, rq->a.p, rq->a.len);
  else if (rq->cmd == TR__Q_APPEND)
    rc = tr__store_db_append(c->db, s, rq->a.p, rq->a.len);
  else
    rc = tr__store_db_queue_push(c->db, s, rq->a.p, rq->a.len);
  if (rc < 0) {
    tr__store_db_gc(c->db, s);
    return rc;
  }
  if (rq->cmd == TR__Q_QUEUE_PUSH)
    tr__store_db_wake_one(c->db, s);
  else
    tr__store_db_wake_all(c->db, s);
  return 0;
}

static int cmd_auth(tr__store_conn_t* c, const tr__store_req_t* rq,
                    uint64_t off) {
  tr__store_db_t* db = c->db;
  if (rq->cmd == TR__Q_AUTH_HELLO) {
    if (!db->token) return tr__store_put_u8(&c->out, 1); /* not required */
    if (c->state != TR__CONN_AUTH)
      return reject(c, TR_EPROTO, off, "sent AUTH_HELLO after proving");
    TR_CHECK(tr__store_random(c->snonce, sizeof c->snonce));
    c->hello_sent = 1;
    TR_CHECK(tr__store_put_u8(&c->out, 0));
    return tr__buf_add(&c->out, c->snonce, sizeof c->snonce);
  }
  if (!db->token || c->state != TR__CONN_AUTH || !c->hello_sent)
    return reject(c, TR_EPROTO, off, "sent AUTH_PROVE out of turn");
  uint8_t want[TR__AUTH_MAC];
  tr__store_auth_mac(db->token, db->token_len, 'c', c->snonce, rq->raw, want);
  if (!tr__store_ct_equal(want, rq->raw + TR__AUTH_NONCE, TR__AUTH_MAC)) {
    tr__store_put_u8(&c->out, 1); /* sent before the close when possible */
    return reject(c, TR_EAUTH, off, "wrong store token");
  }
  uint8_t mac[TR__AUTH_MAC];
  tr__store_auth_mac(db->token, db->token_len, 's', c->snonce, rq->raw, mac);
  c->state = TR__CONN_READY;
  TR_CHECK(tr__store_put_u8(&c->out, 0));
  return tr__buf_add(&c->out, mac, sizeof mac);
}

/* Is cmd allowed in the connection's state? 0, or the reason to close. */
static int check_state(tr__store_conn_t* c, unsigned cmd, uint64_t off) {
  char nb[8];
  switch (c->state) {
    case TR__CONN_NEW:
      if (cmd != TR__Q_VALIDATE)
        return reject(c, TR_EPROTO, off,
                      "first request is %s, not VALIDATE (not a TCPStore "
                      "client?)",
                      tr__store_cmd_name(cmd, nb));
      return 0;
    case TR__CONN_AUTH:
      if (cmd != TR__Q_PING && cmd != TR__Q_AUTH_HELLO &&
          cmd != TR__Q_AUTH_PROVE)
        return reject(c, TR_EAUTH, off,
                      "sent %s before proving the store token (set "
                      "TRAINRUN_STORE_TOKEN on the client)",
                      tr__store_cmd_name(cmd, nb));
      return 0;
    case TR__CONN_READY:
      if (cmd == TR__Q_VALIDATE)
        return reject(c, TR_EPROTO, off, "sent VALIDATE twice");
      return 0;
  }
  return 0;
}

/* Execute one complete request. */
static int execute(tr__store_conn_t* c, const tr__store_req_t* rq,
                   uint64_t off) {
  tr__store_db_t* db = c->db;
  tr__store_slot_t* s;
  int rc = 0;
  size_t out0 = c->out.len;
  db->requests++;
  switch ((tr__store_cmd_t)rq->cmd) {
    case TR__Q_VALIDATE:
      if (rq->u32 != TR__STORE_MAGIC)
        return reject(c, TR_EPROTO, off,
                      "VALIDATE magic 0x%08" PRIx32 " is not 0x%08x", rq->u32,
                      TR__STORE_MAGIC);
      c->state = db->token ? TR__CONN_AUTH : TR__CONN_READY;
      return 0;
    case TR__Q_PING:
      rc = tr__store_put_u32(&c->out, rq->u32);
      break;
    case TR__Q_SET:
    case TR__Q_APPEND:
    case TR__Q_QUEUE_PUSH:
      rc = cmd_store_value(c, rq);
      break;
    case TR__Q_COMPARE_SET:
      rc = cmd_compare_set(c, rq);
      break;
    case TR__Q_GET:
      s = tr__store_db_find(db, rq->key.p, rq->key.len);
      if (s && s->has_val)
        rc = tr__store_put_bytes(&c->out, s->val, s->vlen);
      else
        rc = tr__store_put_u64(&c->out, 0); /* PyTorch's libuv: empty */
      break;
    case TR__Q_ADD:
      rc = cmd_add(c, rq, off);
      break;
    case TR__Q_CHECK: {
      const uint8_t* cur = rq->items;
      int ready = 1;
      for (uint64_t i = 0; i < rq->count && ready; i++) {
        tr__bytes_t k = tr__store_next_item(&cur);
        ready = tr__store_slot_present(tr__store_db_find(db, k.p, k.len));
      }
      rc = tr__store_put_u8(&c->out,
                            ready ? TR__CHECK_READY : TR__CHECK_NOT_READY);
      break;
    }
    case TR__Q_WAIT:
      rc = cmd_wait(c, rq, off);
      break;
    case TR__Q_GETNUMKEYS:
      rc = tr__store_put_u64(&c->out, (uint64_t)db->nkeys);
      break;
    case TR__Q_DELETE_KEY:
      s = tr__store_db_find(db, rq->key.p, rq->key.len);
      rc = tr__store_db_delete(db, s);
      tr__store_db_gc(db, s);
      rc = tr__store_put_u64(&c->out, (uint64_t)rc);
      break;
    case TR__Q_MULTI_GET:
      rc = cmd_multi_get(c, rq, off);
      break;
    case TR__Q_MULTI_SET:
      rc = cmd_multi_set(c, rq, off);
      break;
    case TR__Q_CANCEL_WAIT:
      wait_clear(c);
      rc = tr__store_put_u8(&c->out, TR__WAIT_CANCELED);
      break;
    case TR__Q_QUEUE_POP: {
      s = tr__store_db_find(db, rq->key.p, rq->key.len);
      size_t n = s ? s->qlen : 0;
      rc = tr__store_put_u64(&c->out, (uint64_t)n);
      if (rc == 0 && n > 0) {
        tr__store_qitem_t* q = tr__store_db_queue_pop(db, s);
        rc = tr__store_put_bytes(&c->out, q->data, q->len);
        free(q);
        tr__store_db_gc(db, s);
      }
      break;
    }
    case TR__Q_QUEUE_LEN:
      s = tr__store_db_find(db, rq->key.p, rq->key.len);
      rc = tr__store_put_u64(&c->out, (uint64_t)(s ? s->qlen : 0));
      break;
    case TR__Q_AUTH_HELLO:
    case TR__Q_AUTH_PROVE:
      rc = cmd_auth(c, rq, off);
      break;
  }
  if (rc == TR_ELIMIT && !c->logged)
    return reject(c, rc, off,
                  "%s would pass the store memory limit of %" PRIu64
                  " bytes (TRAINRUN_STORE_MAX_MEMORY_BYTES)",
                  tr__store_cmd_name(rq->cmd, (char[8]){0}),
                  db->lim.max_memory);
  if (rc < 0 && !c->logged) return reject(c, rc, off, "%s", tr_strerror(rc));
  if (rc < 0) return rc;
  if (c->out.len != out0) notify_self(c);
  return 0;
}

/* Parse and execute requests from buf[0..len); *used: bytes consumed by
 * complete requests. Stops at a partial request or when paused. */
static int run(tr__store_conn_t* c, const uint8_t* buf, size_t len,
               size_t* used) {
  size_t off = 0;
  int rc = 0;
  while (off < len && !c->paused) {
    if (len - off < c->ps.need) break; /* nothing new to look at */
    if (c->ps.pos == 0 && (rc = check_state(c, buf[off], c->offset + off)))
      break;
    tr__store_req_t rq;
    rc = tr__store_parse(&c->ps, buf + off, len - off, &c->db->lim, &rq);
    if (rc == 0) break;
    if (rc < 0) {
      rc = reject(c, rc, c->offset + off + c->ps.err_off, "%s", c->ps.err);
      break;
    }
    rc = execute(c, &rq, c->offset + off);
    if (rc < 0) break;
    off += rq.len;
    c->nreq++;
    tr__store_parser_reset(&c->ps);
    if (c->out.len >= TR__STORE_OUT_HIGH) c->paused = 1;
  }
  *used = off;
  return rc < 0 ? rc : 0;
}

/* Drop the consumed head of c->in; free a large idle buffer. */
static void consume_in(tr__store_conn_t* c, size_t used) {
  if (used == 0) return;
  c->offset += used;
  if (c->in.len > used) memmove(c->in.buf, c->in.buf + used, c->in.len - used);
  tr__buf_setlen(&c->in, c->in.len - used);
  tr__buf_shrink(&c->in, IN_KEEP);
}

int tr__store_conn_resume(tr__store_conn_t* c) {
  c->paused = 0;
  size_t used = 0;
  int rc = run(c, (const uint8_t*)c->in.buf, c->in.len, &used);
  consume_in(c, used);
  return rc;
}

int tr__store_conn_input(tr__store_conn_t* c, const uint8_t* data, size_t len) {
  if (c->in.len == 0 && !c->paused) {
    size_t used = 0;
    int rc = run(c, data, len, &used);
    c->offset += used;
    if (rc < 0) return rc;
    if (used == len) return 0;
    /* keep the tail; reserve for the whole request when its size is known */
    size_t rest = len - used;
    size_t want = c->ps.need > rest ? c->ps.need : rest;
    TR_CHECK(tr__buf_grow(&c->in, want));
    return tr__buf_add(&c->in, data + used, rest);
  }
  size_t want = c->in.len + len;
  if (c->ps.need > want) want = c->ps.need;
  TR_CHECK(tr__buf_grow(&c->in, want - c->in.len));
  memcpy(c->in.buf + c->in.len, data, len);
  tr__buf_setlen(&c->in, c->in.len + len);
  if (c->paused) return 0;
  return tr__store_conn_resume(c);
}

uint8_t* tr__store_conn_read_room(tr__store_conn_t* c, size_t* room) {
  /* Only for a partial request still missing more than a read's worth. */
  if (c->in.len == 0 || c->paused || c->ps.need <= c->in.len + READ_ROOM)
    return NULL;
  if (tr__buf_grow(&c->in, c->ps.need - c->in.len) < 0) return NULL;
  *room = c->in.cap - c->in.len - 1; /* the buffer's NUL stays in */
  return (uint8_t*)c->in.buf + c->in.len;
}

int tr__store_conn_input_inplace(tr__store_conn_t* c, size_t n) {
  tr__buf_setlen(&c->in, c->in.len + n);
  if (c->in.len < c->ps.need) return 0;
  return tr__store_conn_resume(c);
}
