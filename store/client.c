/* store/client.c: the blocking TCPStore client.
 *
 * One non-blocking socket driven with poll(2), so every call has a deadline.
 * Connecting resolves the host (IPv6 and IPv4), retries refused, reset and
 * timed-out attempts with exponential backoff (x1.5, capped) and +-50 %
 * jitter until the deadline, then handshakes: VALIDATE, PING (echo checked),
 * and the token proof when a token is set (auth.c). A request is built in
 * one buffer and sent with one send(); replies are read exactly.
 *
 * A failed or timed-out call drops the connection (the reply stream can no
 * longer be trusted) and the next call reconnects; requests are never resent
 * on their own. A WAIT that times out is canceled on the server instead
 * (CANCEL_WAIT, as PyTorch's client does), which keeps the connection.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h> /* getaddrinfo */
#include <netinet/in.h>
#include <netinet/tcp.h> /* TCP_NODELAY */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "store/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/param.h"
#include "trainrun/store.h"

#define INIT_KEY "init/"
#define CANCEL_GRACE_MS 5000 /* for the CANCEL_WAIT answer after a timeout */

struct tr_store_client_s {
  tr_store_client_opts_t opts; /* host and token point at the copies below */
  char* host;
  char* token;
  int fd;
  int64_t timeout_ms;
  uint64_t rng;
  tr__buf_t req;
  char peer[300];
};

static uint64_t next_rand(tr_store_client_t* c) {
  /* xorshift64*: jitter and nonces only */
  c->rng ^= c->rng >> 12;
  c->rng ^= c->rng << 25;
  c->rng ^= c->rng >> 27;
  return c->rng * 0x2545F4914F6CDD1DULL;
}

void tr_store_client_opts_init(tr_store_client_opts_t* o) {
  memset(o, 0, sizeof *o);
  o->timeout_ms = 300000;
  o->world_size = -1;
  o->backoff_initial_ms = 100;
  o->backoff_max_ms = 5000;
}

static void drop(tr_store_client_t* c) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
}

/* ---- raw I/O with a deadline ---- */

static int wait_fd(int fd, short ev, int64_t deadline) {
  for (;;) {
    int64_t left = deadline - tr__now_ms();
    if (left <= 0) return TR_ETIMEDOUT;
    struct pollfd p = {fd, ev, 0};
    int r = poll(&p, 1, left > INT32_MAX ? INT32_MAX : (int)left);
    if (r > 0) return 0;
    if (r == 0) return TR_ETIMEDOUT;
    if (errno != EINTR) return tr_err_from_errno();
  }
}

static int send_all(int fd, const void* buf, size_t n, int64_t deadline) {
  const uint8_t* p = buf;
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= (size_t)w;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      TR_CHECK(wait_fd(fd, POLLOUT, deadline));
      continue;
    }
    return tr_err_from_errno();
  }
  return 0;
}

/* Read exactly n bytes; TR_ECLOSED on EOF. */
static int recv_all(int fd, void* buf, size_t n, int64_t deadline) {
  uint8_t* p = buf;
  while (n > 0) {
    ssize_t r = recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= (size_t)r;
      continue;
    }
    if (r == 0) return TR_ECLOSED;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      TR_CHECK(wait_fd(fd, POLLIN, deadline));
      continue;
    }
    return tr_err_from_errno();
  }
  return 0;
}

/* ---- connecting ---- */

static int connect_addr(const struct addrinfo* ai, int64_t deadline, int* out) {
  int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                  ai->ai_protocol);
  if (fd < 0) return tr_err_from_errno();
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int rc = 0;
  if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
    if (errno != EINPROGRESS) {
      rc = tr_err_from_errno();
    } else {
      rc = wait_fd(fd, POLLOUT, deadline);
      if (rc == 0) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) rc = -err;
      }
    }
  }
  if (rc < 0) {
    close(fd);
    return rc;
  }
  *out = fd;
  return 0;
}

static int open_socket(tr_store_client_t* c, int64_t deadline) {
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_ADDRCONFIG;
  char port[16];
  snprintf(port, sizeof port, "%d", c->opts.port);
  int g = getaddrinfo(c->host, port, &hints, &res);
  if (g == EAI_ADDRFAMILY || g == EAI_NONAME) {
    hints.ai_flags = 0; /* loopback-only hosts: no configured address */
    g = getaddrinfo(c->host, port, &hints, &res);
  }
  if (g != 0) {
    TR_LOG_DEBUG(STORE, "cannot resolve store host '%s': %s", c->host,
                 gai_strerror(g));
    return g == EAI_AGAIN ? TR_EAGAIN : TR_ENOTFOUND;
  }
  int rc = TR_ECONNREFUSED;
  for (struct addrinfo* ai = res; ai; ai = ai->ai_next) {
    rc = connect_addr(ai, deadline, &c->fd);
    if (rc == 0) break;
  }
  freeaddrinfo(res);
  return rc;
}

static int token_proof(tr_store_client_t* c, int64_t deadline) {
  uint8_t st;
  uint8_t hello = TR__Q_AUTH_HELLO;
  TR_CHECK(send_all(c->fd, &hello, 1, deadline));
  int rc = recv_all(c->fd, &st, 1, deadline);
  if (rc == TR_ECLOSED || rc == TR_ECONNRESET) {
    TR_LOG_ERROR(STORE,
                 "store server %s closed the connection at the token "
                 "challenge: it does not support tokens (a PyTorch server?); "
                 "unset TRAINRUN_STORE_TOKEN",
                 c->peer);
    return TR_EAUTH;
  }
  TR_CHECK(rc);
  if (st == 1) {
    TR_LOG_ERROR(STORE,
                 "store server %s does not require a token but this "
                 "client has one: start it with --token-env, or unset "
                 "TRAINRUN_STORE_TOKEN",
                 c->peer);
    return TR_EAUTH;
  }
  if (st != 0) return TR_EPROTO;
  uint8_t sn[TR__AUTH_NONCE], msg[1 + TR__AUTH_NONCE + TR__AUTH_MAC];
  TR_CHECK(recv_all(c->fd, sn, sizeof sn, deadline));
  uint8_t* cn = msg + 1;
  TR_CHECK(tr__store_random(cn, TR__AUTH_NONCE));
  msg[0] = TR__Q_AUTH_PROVE;
  size_t tlen = strlen(c->token);
  tr__store_auth_mac(c->token, tlen, 'c', sn, cn, msg + 1 + TR__AUTH_NONCE);
  TR_CHECK(send_all(c->fd, msg, sizeof msg, deadline));
  rc = recv_all(c->fd, &st, 1, deadline);
  if (rc == 0 && st == 1) rc = TR_EAUTH;
  if (rc == TR_ECLOSED || rc == TR_ECONNRESET) rc = TR_EAUTH;
  if (rc == TR_EAUTH) {
    TR_LOG_ERROR(STORE, "store server %s refused this client's token", c->peer);
    return rc;
  }
  TR_CHECK(rc);
  if (st != 0) return TR_EPROTO;
  uint8_t mac[TR__AUTH_MAC], want[TR__AUTH_MAC];
  TR_CHECK(recv_all(c->fd, mac, sizeof mac, deadline));
  tr__store_auth_mac(c->token, tlen, 's', sn, cn, want);
  if (!tr__store_ct_equal(mac, want, sizeof mac)) {
    TR_LOG_ERROR(STORE, "store server %s could not prove it knows the token",
                 c->peer);
    return TR_EAUTH;
  }
  return 0;
}

/* Without a token: does the server require one? (opts.probe_auth) */
static int probe_auth(tr_store_client_t* c, int64_t deadline) {
  uint8_t st, hello = TR__Q_AUTH_HELLO;
  TR_CHECK(send_all(c->fd, &hello, 1, deadline));
  TR_CHECK(recv_all(c->fd, &st, 1, deadline));
  if (st == 1) return 0; /* no token required */
  if (st != 0) return TR_EPROTO;
  TR_LOG_ERROR(STORE,
               "store server %s requires a token and this client has none "
               "(set [comm] key or TRAINRUN_STORE_TOKEN)",
               c->peer);
  return TR_EAUTH;
}

static int handshake(tr_store_client_t* c, int64_t deadline) {
  uint8_t msg[10];
  size_t n = 0;
  msg[n++] = TR__Q_VALIDATE;
  tr__wr_u32(msg + n, TR__STORE_MAGIC);
  n += 4;
  uint32_t nonce = (uint32_t)next_rand(c);
  if (!c->opts.no_ping) {
    msg[n++] = TR__Q_PING;
    tr__wr_u32(msg + n, nonce);
    n += 4;
  }
  TR_CHECK(send_all(c->fd, msg, n, deadline));
  if (!c->opts.no_ping) {
    uint8_t echo[4];
    TR_CHECK(recv_all(c->fd, echo, 4, deadline));
    if (tr__rd_u32(echo) != nonce) {
      TR_LOG_WARN(STORE, "store server %s answered PING with the wrong nonce",
                  c->peer);
      return TR_EPROTO;
    }
  }
  if (c->token && *c->token) return token_proof(c, deadline);
  if (c->opts.probe_auth) return probe_auth(c, deadline);
  return 0;
}

static int retryable(int rc) {
  switch (rc) {
    case TR_ECONNREFUSED:
    case TR_ECONNRESET:
    case TR_ECONNABORTED:
    case TR_ETIMEDOUT:
    case TR_EHOSTUNREACH:
    case TR_ENETUNREACH:
    case TR_EAGAIN:
    case TR_ENOTFOUND: /* DNS may not know the host yet */
    case TR_ECLOSED:   /* reset at accept-backlog overflow */
    case TR_EPIPE:
    case TR_EPROTO: /* PyTorch retries a bad PING echo too */
      return 1;
    default:
      return 0;
  }
}

static int do_connect(tr_store_client_t* c) {
  int64_t start = tr__now_ms();
  int64_t deadline = start + c->timeout_ms;
  double backoff = (double)c->opts.backoff_initial_ms;
  int attempts = 0, rc, last = TR_ETIMEDOUT;
  for (;;) {
    attempts++;
    rc = open_socket(c, deadline);
    if (rc == 0) {
      rc = handshake(c, deadline);
      if (rc == 0) return 0;
      drop(c);
    }
    if (!retryable(rc)) return rc;
    if (rc != TR_ETIMEDOUT) last = rc;
    int64_t left = deadline - tr__now_ms();
    if (left <= 0) break;
    /* +-50 % jitter */
    double f = 0.5 + (double)(next_rand(c) >> 11) / (double)(1ULL << 53);
    int64_t sleep_ms = (int64_t)(backoff * f);
    if (sleep_ms > left) sleep_ms = left;
    TR_LOG_DEBUG(STORE, "store %s: %s; retrying in %" PRId64 " ms", c->peer,
                 tr_strerror(rc), sleep_ms);
    struct timespec ts = {sleep_ms / 1000, (sleep_ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    backoff *= 1.5;
    if (backoff > (double)c->opts.backoff_max_ms)
      backoff = (double)c->opts.backoff_max_ms;
  }
  TR_LOG_WARN(STORE,
              "cannot connect to store %s within %" PRId64
              " ms "
              "(%d attempts): %s",
              c->peer, tr__now_ms() - start, attempts, tr_strerror(last));
  return TR_ETIMEDOUT;
}

static int ensure(tr_store_client_t* c) {
  if (c->fd >= 0) return 0;
  return do_connect(c);
}

static int client_new(const tr_store_client_opts_t* o,
                      tr_store_client_t** out) {
  *out = NULL;
  if (!o->host || !*o->host || o->port <= 0 || o->port > 65535)
    return TR_EINVAL;
  tr_store_client_t* c = calloc(1, sizeof *c);
  if (!c) return TR_ENOMEM;
  c->opts = *o;
  c->fd = -1;
  c->host = strdup(o->host);
  const char* tok = o->token ? o->token : tr_param_str(TR_PARAM_STORE_TOKEN);
  c->token = strdup(tok);
  if (!c->host || !c->token) {
    tr_store_client_free(c);
    return TR_ENOMEM;
  }
  c->opts.host = c->host;
  c->opts.token = c->token;
  c->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 300000;
  if (c->opts.backoff_initial_ms <= 0) c->opts.backoff_initial_ms = 100;
  if (c->opts.backoff_max_ms < c->opts.backoff_initial_ms)
    c->opts.backoff_max_ms = c->opts.backoff_initial_ms;
  if (tr__store_random(&c->rng, sizeof c->rng) < 0 || c->rng == 0)
    c->rng = (uint64_t)tr__now_ms() ^ (uint64_t)getpid() << 32 ^ 0x9E3779B9u;
  if (strchr(c->host, ':'))
    snprintf(c->peer, sizeof c->peer, "[%s]:%d", c->host, o->port);
  else
    snprintf(c->peer, sizeof c->peer, "%s:%d", c->host, o->port);
  *out = c;
  return 0;
}

/* ---- requests ---- */

static void req_begin(tr_store_client_t* c, uint8_t cmd) {
  tr__buf_reset(&c->req);
  tr__store_put_u8(&c->req, cmd);
}

/* A user key on the wire: "/" + key (raw: as is). */
static int put_key(tr_store_client_t* c, const char* key, int raw) {
  size_t n = strlen(key);
  TR_CHECK(tr__buf_grow(&c->req, 9 + n));
  tr__store_put_u64(&c->req, n + (raw ? 0 : 1));
  if (!raw) tr__store_put_u8(&c->req, '/');
  return tr__buf_add(&c->req, key, n);
}

/* Send the built request (TR_ENOMEM, nothing sent, when building it ran
 * out of memory); on failure the connection is dropped. */
static int req_send(tr_store_client_t* c, int64_t deadline) {
  int rc = c->req.oom ? TR_ENOMEM
                      : send_all(c->fd, c->req.buf, c->req.len, deadline);
  tr__buf_reset(&c->req);
  tr__buf_shrink(&c->req, 1u << 20); /* do not keep a huge value's buffer */
  if (rc < 0) drop(c);
  return rc;
}

static int recv_or_drop(tr_store_client_t* c, void* p, size_t n,
                        int64_t deadline) {
  int rc = recv_all(c->fd, p, n, deadline);
  if (rc < 0) drop(c);
  return rc;
}

static int recv_u64(tr_store_client_t* c, uint64_t* v, int64_t deadline) {
  uint8_t b[8];
  TR_CHECK(recv_or_drop(c, b, 8, deadline));
  *v = tr__rd_u64(b);
  return 0;
}

/* u64 length + bytes into a malloc()ed, NUL-terminated buffer. */
static int recv_bytes(tr_store_client_t* c, void** val, size_t* len,
                      int64_t deadline) {
  uint64_t n;
  TR_CHECK(recv_u64(c, &n, deadline));
  if (n > (uint64_t)SIZE_MAX / 2) {
    drop(c);
    return TR_EPROTO;
  }
  uint8_t* p = malloc((size_t)n + 1);
  if (!p) {
    drop(c);
    return TR_ENOMEM;
  }
  int rc = recv_or_drop(c, p, (size_t)n, deadline);
  if (rc < 0) {
    free(p);
    return rc;
  }
  p[n] = 0;
  *val = p;
  if (len) *len = (size_t)n;
  return 0;
}

static int64_t deadline_of(tr_store_client_t* c) {
  return tr__now_ms() + c->timeout_ms;
}

/* WAIT on wire keys built by the caller into c->req (after req_begin). */
static int wait_sent(tr_store_client_t* c, int64_t deadline) {
  uint8_t b;
  int rc = recv_all(c->fd, &b, 1, deadline);
  if (rc == 0) {
    if (b == TR__WAIT_STOP_WAITING) return 0;
    drop(c);
    return TR_EPROTO;
  }
  if (rc != TR_ETIMEDOUT) {
    drop(c);
    return rc;
  }
  /* cancel it on the server; it may have answered just before */
  uint8_t cancel = TR__Q_CANCEL_WAIT;
  int64_t grace = tr__now_ms() + CANCEL_GRACE_MS;
  rc = send_all(c->fd, &cancel, 1, grace);
  if (rc == 0) rc = recv_all(c->fd, &b, 1, grace);
  if (rc == 0 && b == TR__WAIT_STOP_WAITING) rc = recv_all(c->fd, &b, 1, grace);
  if (rc < 0 || b != TR__WAIT_CANCELED) drop(c);
  return TR_ETIMEDOUT;
}

static int wait_keys(tr_store_client_t* c, const char* const* keys, size_t n,
                     int raw, int64_t deadline) {
  req_begin(c, TR__Q_WAIT);
  tr__store_put_u64(&c->req, n);
  for (size_t i = 0; i < n; i++) TR_CHECK(put_key(c, keys[i], raw));
  TR_CHECK(req_send(c, deadline));
  return wait_sent(c, deadline);
}

/* ---- public calls ---- */

int tr_store_client_connect(const tr_store_client_opts_t* o,
                            tr_store_client_t** out) {
  tr_store_client_t* c;
  TR_CHECK(client_new(o, &c));
  int rc = do_connect(c);
  if (rc == 0 && o->world_size > 0) {
    int64_t v;
    int64_t dl = deadline_of(c);
    req_begin(c, TR__Q_ADD);
    put_key(c, INIT_KEY, 1);
    tr__store_put_u64(&c->req, 1);
    rc = req_send(c, dl);
    uint64_t u = 0;
    if (rc == 0) rc = recv_u64(c, &u, dl);
    v = (int64_t)u;
    if (rc == 0)
      TR_LOG_DEBUG(STORE, "joined store %s as worker %" PRId64 " of %d",
                   c->peer, v, o->world_size);
  }
  if (rc < 0) {
    tr_store_client_free(c);
    return rc;
  }
  *out = c;
  return 0;
}

int tr_store_client_clone(const tr_store_client_t* src,
                          tr_store_client_t** out) {
  tr_store_client_opts_t o = src->opts;
  o.world_size = -1;
  o.timeout_ms = src->timeout_ms;
  tr_store_client_t* c;
  TR_CHECK(client_new(&o, &c));
  int rc = do_connect(c);
  if (rc < 0) {
    tr_store_client_free(c);
    return rc;
  }
  *out = c;
  return 0;
}

void tr_store_client_free(tr_store_client_t* c) {
  if (!c) return;
  drop(c);
  tr__buf_release(&c->req);
  free(c->host);
  if (c->token) memset(c->token, 0, strlen(c->token));
  free(c->token);
  free(c);
}

void tr_store_client_set_timeout(tr_store_client_t* c, int64_t ms) {
  if (ms > 0) c->timeout_ms = ms;
}

int64_t tr_store_client_timeout(const tr_store_client_t* c) {
  return c->timeout_ms;
}

const char* tr_store_client_peer(const tr_store_client_t* c) { return c->peer; }

/* key + value requests with no reply */
static int send_kv(tr_store_client_t* c, uint8_t cmd, const char* key,
                   const void* val, size_t len) {
  TR_CHECK(ensure(c));
  int64_t dl = deadline_of(c);
  req_begin(c, cmd);
  TR_CHECK(put_key(c, key, 0));
  TR_CHECK(tr__store_put_bytes(&c->req, val, len));
  return req_send(c, dl);
}

int tr_store_client_set(tr_store_client_t* c, const char* key, const void* val,
                        size_t len) {
  return send_kv(c, TR__Q_SET, key, val, len);
}

int tr_store_client_append(tr_store_client_t* c, const char* key,
                           const void* val, size_t len) {
  return send_kv(c, TR__Q_APPEND, key, val, len);
}

int tr_store_client_queue_push(tr_store_client_t* c, const char* key,
                               const void* val, size_t len) {
  return send_kv(c, TR__Q_QUEUE_PUSH, key, val, len);
}

int tr_store_client_get(tr_store_client_t* c, const char* key, void** val,
                        size_t* len) {
  TR_CHECK(ensure(c));
  int64_t dl = deadline_of(c);
  TR_CHECK(wait_keys(c, (const char* const*)&key, 1, 0, dl));
  req_begin(c, TR__Q_GET);
  TR_CHECK(put_key(c, key, 0));
  TR_CHECK(req_send(c, dl));
  return recv_bytes(c, val, len, dl);
}

/* ADD on a wire key (raw: "init/"). */
static int add_key(tr_store_client_t* c, const char* key, int raw,
                   int64_t delta, int64_t* result) {
  TR_CHECK(ensure(c));
  int64_t dl = deadline_of(c);
  req_begin(c, TR__Q_ADD);
  TR_CHECK(put_key(c, key, raw));
  tr__store_put_u64(&c->req, (uint64_t)delta);
  TR_CHECK(req_send(c, dl));
  uint64_t v;
  TR_CHECK(recv_u64(c, &v, dl));
  if (result) *result = (int64_t)v;
  return 0;
}

int tr_store_client_add(tr_store_client_t* c, const char* key, int64_t delta,
                        int64_t* result) {
  return add_key(c, key, 0, delta, result);
}

int tr_store_client_compare_set(tr_store_client_t* c, const char* key,
                                const void* expected, size_t elen,
                                const void* desired, size_t dlen, void** cur,
                                size_t* clen) {
  TR_CHECK(ensure(c));
  int64_t dl = deadline_of(c);
  req_begin(c, TR__Q_COMPARE_SET);
  TR_CHECK(put_key(c, key, 0));
  TR_CHECK(tr__store_put_bytes(&c->req, expected, elen));
  TR_CHECK(tr__store_put_bytes(&c->req, desired, dlen));
  TR_CHECK(req_send(c, dl));
  void* v;
  size_t n;
  TR_CHECK(recv_bytes(c, &v, &n, dl));
  if (cur) {
    *cur = v;
    if (clen) *clen = n;
  } else {
    free(v);
  }
  return 0;
}

int tr_store_client_check(tr_store_client_t* c, const char* const* keys,
                          size_t n, int* ready) {
  TR_CHECK(ensure(c));
  int64_t dl = deadline_of(c);
  req_begin(c, TR__Q_CHECK);
  tr__store_put_u64(&c->req, n);
  for (size_t i = 0; i < n; i++) TR_CHECK(put_key(c, keys[i], 0));
  TR_CHECK(req_send(c, dl));
  uint8_t b;
  TR_CHECK(recv_or_drop(c, &b, 1, dl));
  if (b > TR__CHECK_NOT_READY) {
    drop(c);
    return TR_EPROTO;
  }
  *ready = b == TR__CHECK_READY;
  return 0;
}

int tr_store_client_wait(tr_store_client_t* c, const char* const* keys,
                         size_t n, int64_t timeout_ms) {
  TR_CHECK(ensure(c));
  int64_t dl = tr__now_ms() + (timeout_ms > 0 ? timeout_ms : c->timeout_ms);
  return wait_keys(c, keys, n, 0, dl);
}

static int simple_u64(tr_store_client_t* c, uint8_t cmd, const char* key,
                      uint64_t* v) {
  TR_CHECK(ensure(c));
  int64_t dl = deadline_of(c);
  req_begin(c, cmd);
  if (key) TR_CHECK(put_key(c, key, 0));
  TR_CHECK(req_send(c, dl));
  return recv_u64(c, v, dl);
}

int tr_store_client_num_keys(tr_store_client_t* c, int64_t* n) {
  uint64_t v;
  TR_CHECK(simple_u64(c, TR__Q_GETNUMKEYS, NULL, &v));
  *n = (int64_t)v;
  return 0;
}

int tr_store_client_delete_key(tr_store_client_t* c, const char* key,
                               int* deleted) {
  uint64_t v;
  TR_CHECK(simple_u64(c, TR__Q_DELETE_KEY, key, &v));
  if (deleted) *deleted = v == 1;
  return 0;
}

int tr_store_client_queue_len(tr_store_client_t* c, const char* key,
                              int64_t* len) {
  uint64_t v;
  TR_CHECK(simple_u64(c, TR__Q_QUEUE_LEN, key, &v));
  *len = (int64_t)v;
  return 0;
}

int tr_store_client_multi_get(tr_store_client_t* c, const char* const* keys,
                              size_t n, void** vals, size_t* lens) {
  TR_CHECK(ensure(c));
  int64_t dl = deadline_of(c);
  TR_CHECK(wait_keys(c, keys, n, 0, dl));
  req_begin(c, TR__Q_MULTI_GET);
  tr__store_put_u64(&c->req, n);
  for (size_t i = 0; i < n; i++) TR_CHECK(put_key(c, keys[i], 0));
  TR_CHECK(req_send(c, dl));
  for (size_t i = 0; i < n; i++) {
    int rc = recv_bytes(c, &vals[i], &lens[i], dl);
    if (rc < 0) {
      while (i > 0) {
        free(vals[--i]);
        vals[i] = NULL;
      }
      return rc;
    }
  }
  return 0;
}

int tr_store_client_multi_set(tr_store_client_t* c, const char* const* keys,
                              size_t n, const void* const* vals,
                              const size_t* lens) {
  TR_CHECK(ensure(c));
  int64_t dl = deadline_of(c);
  req_begin(c, TR__Q_MULTI_SET);
  tr__store_put_u64(&c->req, n);
  for (size_t i = 0; i < n; i++) {
    TR_CHECK(put_key(c, keys[i], 0));
    TR_CHECK(tr__store_put_bytes(&c->req, vals[i], lens[i]));
  }
  return req_send(c, dl);
}

int tr_store_client_queue_pop(tr_store_client_t* c, const char* key, int block,
                              void** val, size_t* len) {
  TR_CHECK(ensure(c));
  int64_t dl = deadline_of(c);
  if (block) TR_CHECK(wait_keys(c, (const char* const*)&key, 1, 0, dl));
  req_begin(c, TR__Q_QUEUE_POP);
  TR_CHECK(put_key(c, key, 0));
  TR_CHECK(req_send(c, dl));
  uint64_t count;
  TR_CHECK(recv_u64(c, &count, dl));
  if (count == 0) return TR_ENOTFOUND;
  return recv_bytes(c, val, len, dl);
}

int tr_store_client_ping(tr_store_client_t* c) {
  TR_CHECK(ensure(c));
  int64_t dl = deadline_of(c);
  uint32_t nonce = (uint32_t)next_rand(c);
  req_begin(c, TR__Q_PING);
  tr__store_put_u32(&c->req, nonce);
  TR_CHECK(req_send(c, dl));
  uint8_t b[4];
  TR_CHECK(recv_or_drop(c, b, 4, dl));
  if (tr__rd_u32(b) != nonce) {
    drop(c);
    return TR_EPROTO;
  }
  return 0;
}

int tr_store_client_wait_workers(tr_store_client_t* c, int world_size,
                                 int64_t timeout_ms) {
  int64_t start = tr__now_ms();
  int64_t dl = start + (timeout_ms > 0 ? timeout_ms : c->timeout_ms);
  int64_t joined = 0;
  const char* key = INIT_KEY;
  for (;;) {
    TR_CHECK(ensure(c));
    int rc = wait_keys(c, (const char* const*)&key, 1, 1, dl);
    if (rc == 0) {
      req_begin(c, TR__Q_GET);
      put_key(c, key, 1);
      rc = req_send(c, dl);
      void* v = NULL;
      if (rc == 0) rc = recv_bytes(c, &v, NULL, dl);
      if (rc == 0) {
        joined = strtoll(v, NULL, 10);
        free(v);
        if (joined >= world_size) return 0;
      }
    }
    if (rc < 0 && rc != TR_ETIMEDOUT) return rc;
    if (tr__now_ms() >= dl) break;
    struct timespec ts = {0, 10 * 1000000};
    nanosleep(&ts, NULL);
  }
  TR_LOG_WARN(STORE,
              "timed out after %" PRId64
              " ms waiting for clients of "
              "store %s: %" PRId64 "/%d clients joined",
              tr__now_ms() - start, c->peer, joined, world_size);
  return TR_ETIMEDOUT;
}
