/* tests/check_store.c: the TCPStore's Check suite.
 *
 * Server tests talk to a server on 127.0.0.1 (port 0, read back) through raw
 * sockets and compare the reply bytes with what PyTorch's libuv server sends
 * (tests/interop/store_interop.py records the same exchanges against it).
 * Client tests run the C client against the server, and against fake
 * servers written here to see the bytes it sends and to make it time out.
 */
#include "config.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "store/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/param.h"
#include "trainrun/store.h"

/* ---- helpers ---- */

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static tr_store_server_t* start_opts(tr_store_server_opts_t* o) {
  o->host = "127.0.0.1";
  tr_store_server_t* s = NULL;
  int rc = tr_store_server_start(o, &s);
  ck_assert_msg(rc == 0, "server start: %s", tr_strerror(rc));
  return s;
}

static tr_store_server_t* start(void) {
  tr_store_server_opts_t o;
  tr_store_server_opts_init(&o);
  return start_opts(&o);
}

static int raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ck_assert_int_ge(fd, 0);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ck_assert_int_eq(connect(fd, (struct sockaddr*)&a, sizeof a), 0);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

static int local_port(int fd) {
  struct sockaddr_in a;
  socklen_t n = sizeof a;
  getsockname(fd, (struct sockaddr*)&a, &n);
  return ntohs(a.sin_port);
}

static void raw_send(int fd, const void* p, size_t n) {
  ck_assert_int_eq(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* Receive exactly n bytes within 3 s; returns what arrived (-1: closed). */
static ssize_t recv_n(int fd, uint8_t* buf, size_t n, int ms) {
  size_t got = 0;
  int64_t dl = now_ms() + ms;
  while (got < n) {
    struct pollfd p = {fd, POLLIN, 0};
    int64_t left = dl - now_ms();
    if (left <= 0 || poll(&p, 1, (int)left) <= 0) break;
    ssize_t r = recv(fd, buf + got, n - got, 0);
    if (r <= 0) return got ? (ssize_t)got : -1;
    got += (size_t)r;
  }
  return (ssize_t)got;
}

static void hexdump(char* out, size_t outn, const uint8_t* p, size_t n) {
  size_t o = 0;
  for (size_t i = 0; i < n && o + 4 < outn; i++)
    o += (size_t)snprintf(out + o, outn - o, "%02x ", p[i]);
  if (o < outn) out[o] = 0;
}

#define expect_bytes(fd, want, n)                                     \
  do {                                                                \
    uint8_t got_[4096];                                               \
    size_t n_ = (n);                                                  \
    ck_assert_uint_le(n_, sizeof got_);                               \
    ssize_t r_ = recv_n((fd), got_, n_, 3000);                        \
    char gh_[512], wh_[512];                                          \
    hexdump(gh_, sizeof gh_, got_, r_ > 0 ? (size_t)r_ : 0);          \
    hexdump(wh_, sizeof wh_, (const uint8_t*)(want), n_);             \
    ck_assert_msg(r_ == (ssize_t)n_ && memcmp(got_, (want), n_) == 0, \
                  "line %d: got [%s] want [%s]", __LINE__, gh_, wh_); \
  } while (0)

/* Nothing arrives within ms. */
static void expect_silence(int fd, int ms) {
  struct pollfd p = {fd, POLLIN, 0};
  int r = poll(&p, 1, ms);
  if (r > 0) {
    uint8_t b[64];
    ssize_t n = recv(fd, b, sizeof b, MSG_DONTWAIT);
    ck_abort_msg("expected silence, got %zd bytes (first 0x%02x)", n,
                 n > 0 ? b[0] : 0);
  }
}

/* The server closes the connection within 3 s. */
static void expect_closed(int fd) {
  uint8_t b[256];
  int64_t dl = now_ms() + 3000;
  for (;;) {
    struct pollfd p = {fd, POLLIN, 0};
    int64_t left = dl - now_ms();
    ck_assert_msg(left > 0 && poll(&p, 1, (int)left) > 0,
                  "connection was not closed");
    ssize_t r = recv(fd, b, sizeof b, 0);
    if (r == 0 || (r < 0 && errno == ECONNRESET)) return;
  }
}

/* A request builder. */
typedef struct {
  uint8_t b[65536];
  size_t n;
} msg_t;

static msg_t* m_new(void) {
  msg_t* m = calloc(1, sizeof *m);
  ck_assert_ptr_nonnull(m);
  return m;
}
static void m_u8(msg_t* m, uint8_t v) { m->b[m->n++] = v; }
static void m_u32(msg_t* m, uint32_t v) {
  tr__wr_u32(m->b + m->n, v);
  m->n += 4;
}
static void m_u64(msg_t* m, uint64_t v) {
  tr__wr_u64(m->b + m->n, v);
  m->n += 8;
}
static void m_strn(msg_t* m, const void* s, size_t n) {
  m_u64(m, n);
  memcpy(m->b + m->n, s, n);
  m->n += n;
}
static void m_str(msg_t* m, const char* s) { m_strn(m, s, strlen(s)); }
static void m_validate(msg_t* m) {
  m_u8(m, 0);
  m_u32(m, TR__STORE_MAGIC);
}
static void m_set(msg_t* m, const char* k, const char* v) {
  m_u8(m, TR__Q_SET);
  m_str(m, k);
  m_str(m, v);
}
static void m_get(msg_t* m, const char* k) {
  m_u8(m, TR__Q_GET);
  m_str(m, k);
}
static void m_keys(msg_t* m, uint8_t cmd, int n, const char* const* keys) {
  m_u8(m, cmd);
  m_u64(m, (uint64_t)n);
  for (int i = 0; i < n; i++) m_str(m, keys[i]);
}
static void m_wait1(msg_t* m, const char* k) { m_keys(m, TR__Q_WAIT, 1, &k); }
static void m_add(msg_t* m, const char* k, int64_t d) {
  m_u8(m, TR__Q_ADD);
  m_str(m, k);
  m_u64(m, (uint64_t)d);
}
static void m_ping(msg_t* m, uint32_t nonce) {
  m_u8(m, TR__Q_PING);
  m_u32(m, nonce);
}
static void m_send(int fd, msg_t* m) {
  raw_send(fd, m->b, m->n);
  m->n = 0;
}

/* Expected-reply builder: same layout. */
#define R_BYTES(m, s) m_strn((m), (s), sizeof(s) - 1)

/* A connected, validated raw client. */
static int raw_client(tr_store_server_t* s) {
  int fd = raw_connect(tr_store_server_port(s));
  uint8_t v[5] = {0, 0xCE, 0xF7, 0x85, 0x3C};
  raw_send(fd, v, 5);
  return fd;
}

/* The client still gets answers: PING round trip. */
static void expect_alive(int fd) {
  msg_t m = {0};
  m_ping(&m, 0x0a0b0c0d);
  raw_send(fd, m.b, m.n);
  uint8_t want[4] = {0x0d, 0x0c, 0x0b, 0x0a};
  expect_bytes(fd, want, 4);
}

/* Log lines go to a temp file the test can read. */
static FILE* capture_log(void) {
  FILE* f = tmpfile();
  ck_assert_ptr_nonnull(f);
  tr_log_set_fd(fileno(f));
  tr_log_set_level(TR_LOG_WARN);
  return f;
}

static char* read_log(FILE* f) {
  static char buf[16384];
  fflush(f);
  size_t n = (size_t)pread(fileno(f), buf, sizeof buf - 1, 0);
  buf[n < sizeof buf ? n : 0] = 0;
  return buf;
}

/* ---- wire: handshake, PING ---- */

START_TEST(t_validate_ping) {
  tr_store_server_t* s = start();
  int fd = raw_connect(tr_store_server_port(s));
  uint8_t req[] = {0x00, 0xCE, 0xF7, 0x85, 0x3C, 0x0D, 1, 2, 3, 4};
  raw_send(fd, req, sizeof req);
  uint8_t want[] = {1, 2, 3, 4};
  expect_bytes(fd, want, 4);
  expect_silence(fd, 50); /* VALIDATE has no reply */
  close(fd);
  tr_store_server_stop(s);
}
END_TEST

/* The exact smoke exchange of the reference doc, section 5. */
START_TEST(t_set_wait_get_wire) {
  tr_store_server_t* s = start();
  int fd = raw_client(s);
  uint8_t set[] = {0x01, 4, 0, 0, 0, 0, 0, 0, 0, '/', 'f', 'o',
                   'o',  3, 0, 0, 0, 0, 0, 0, 0, 'b', 'a', 'r'};
  raw_send(fd, set, sizeof set);
  expect_silence(fd, 50); /* SET: fire and forget */
  uint8_t wait[] = {0x06, 1, 0, 0, 0, 0, 0,   0,   0,   4,  0,
                    0,    0, 0, 0, 0, 0, '/', 'f', 'o', 'o'};
  raw_send(fd, wait, sizeof wait);
  uint8_t zero = 0;
  expect_bytes(fd, &zero, 1);
  uint8_t get[] = {0x03, 4, 0, 0, 0, 0, 0, 0, 0, '/', 'f', 'o', 'o'};
  raw_send(fd, get, sizeof get);
  uint8_t want[] = {3, 0, 0, 0, 0, 0, 0, 0, 'b', 'a', 'r'};
  expect_bytes(fd, want, sizeof want);
  /* GET of a missing key: an empty value, like PyTorch's libuv server */
  msg_t m = {0};
  m_get(&m, "/missing");
  m_send(fd, &m);
  uint8_t empty[8] = {0};
  expect_bytes(fd, empty, 8);
  close(fd);
  tr_store_server_stop(s);
}
END_TEST

START_TEST(t_add_wire) {
  tr_store_server_t* s = start();
  int fd = raw_client(s);
  msg_t *m = m_new(), *r = m_new();
  m_add(m, "/ctr", 5);
  m_get(m, "/ctr");
  m_add(m, "/ctr", -7);
  m_get(m, "/ctr");
  m_set(m, "/nn2", " 12abc"); /* std::stoll: spaces, then digits */
  m_add(m, "/nn2", 1);
  m_send(fd, m);
  m_u64(r, 5);
  R_BYTES(r, "5");
  m_u64(r, (uint64_t)-2);
  R_BYTES(r, "-2");
  m_u64(r, 13);
  expect_bytes(fd, r->b, r->n);
  /* ADD on a value that is not a number closes that client only */
  int other = raw_client(s);
  m_set(m, "/nn", "abc");
  m_add(m, "/nn", 1);
  m_send(fd, m);
  expect_closed(fd);
  expect_alive(other);
  m_get(m, "/ctr");
  m_send(other, m);
  r->n = 0;
  R_BYTES(r, "-2");
  expect_bytes(other, r->b, r->n);
  close(fd);
  close(other);
  free(m);
  free(r);
  tr_store_server_stop(s);
}
END_TEST

static void m_cas(msg_t* m, const char* k, const char* e, const char* d) {
  m_u8(m, TR__Q_COMPARE_SET);
  m_str(m, k);
  m_str(m, e);
  m_str(m, d);
}

START_TEST(t_compare_set_wire) {
  tr_store_server_t* s = start();
  int fd = raw_client(s);
  msg_t *m = m_new(), *r = m_new();
  m_cas(m, "/cas", "", "new");      /* absent, empty expected: stored */
  m_cas(m, "/cas2", "exp", "new");  /* absent: answers expected */
  m_cas(m, "/cas", "zzz", "other"); /* mismatch: current value */
  m_cas(m, "/cas", "new", "other"); /* match: replaced */
  m_u8(m, TR__Q_GETNUMKEYS);
  m_send(fd, m);
  R_BYTES(r, "new");
  R_BYTES(r, "exp");
  R_BYTES(r, "new");
  R_BYTES(r, "other");
  m_u64(r, 1); /* /cas2 was not stored */
  expect_bytes(fd, r->b, r->n);
  close(fd);
  free(m);
  free(r);
  tr_store_server_stop(s);
}
END_TEST

START_TEST(t_check_wait_wire) {
  tr_store_server_t* s = start();
  int fd = raw_client(s);
  msg_t* m = m_new();
  const char* both[] = {"/a", "/b"};
  m_keys(m, TR__Q_CHECK, 0, NULL);
  m_keys(m, TR__Q_WAIT, 0, NULL);
  m_keys(m, TR__Q_CHECK, 2, both);
  m_set(m, "/a", "1");
  m_set(m, "/b", "2");
  m_keys(m, TR__Q_CHECK, 2, both);
  m_keys(m, TR__Q_WAIT, 2, both);
  m_send(fd, m);
  uint8_t want[] = {TR__CHECK_READY, TR__WAIT_STOP_WAITING, TR__CHECK_NOT_READY,
                    TR__CHECK_READY, TR__WAIT_STOP_WAITING};
  expect_bytes(fd, want, sizeof want);
  /* a WAIT counts only the keys missing when it arrives */
  const char* mix[] = {"/a", "/c", "/d"};
  m_keys(m, TR__Q_WAIT, 3, mix);
  m_send(fd, m);
  expect_silence(fd, 50);
  int w = raw_client(s);
  m_set(m, "/c", "3");
  m_send(w, m);
  expect_silence(fd, 50);
  m_u8(m, TR__Q_DELETE_KEY); /* deleting a key does not touch waiters */
  m_str(m, "/a");
  m_set(m, "/d", "4");
  m_send(w, m);
  uint8_t one[8] = {1};
  expect_bytes(w, one, 8);
  expect_bytes(fd, want + 1, 1);
  expect_silence(fd, 50);
  close(fd);
  close(w);
  free(m);
  tr_store_server_stop(s);
}
END_TEST

/* Every command that writes a key releases the WAITs on it. */
START_TEST(t_wait_released_by_writers) {
  tr_store_server_t* s = start();
  int writer = raw_client(s);
  msg_t* m = m_new();
  const uint8_t cmds[] = {TR__Q_SET,       TR__Q_ADD,         TR__Q_APPEND,
                          TR__Q_MULTI_SET, TR__Q_COMPARE_SET, TR__Q_QUEUE_PUSH};
  for (size_t i = 0; i < sizeof cmds; i++) {
    char key[32];
    snprintf(key, sizeof key, "/w%zu", i);
    int w = raw_client(s);
    m_wait1(m, key);
    m_send(w, m);
    expect_silence(w, 30);
    size_t replies = 0;
    switch (cmds[i]) {
      case TR__Q_SET:
        m_set(m, key, "v");
        break;
      case TR__Q_ADD:
        m_add(m, key, 1);
        replies = 8;
        break;
      case TR__Q_APPEND:
        m_u8(m, TR__Q_APPEND);
        m_str(m, key);
        m_str(m, "x");
        break;
      case TR__Q_MULTI_SET:
        m_u8(m, TR__Q_MULTI_SET);
        m_u64(m, 2);
        m_str(m, "/other");
        m_str(m, "o");
        m_str(m, key);
        m_str(m, "v");
        break;
      case TR__Q_COMPARE_SET:
        m_cas(m, key, "", "v");
        replies = 9;
        break;
      case TR__Q_QUEUE_PUSH:
        m_u8(m, TR__Q_QUEUE_PUSH);
        m_str(m, key);
        m_str(m, "item");
        break;
    }
    m_send(writer, m);
    uint8_t zero = 0;
    expect_bytes(w, &zero, 1);
    if (replies) {
      uint8_t junk[16];
      ck_assert_int_eq(recv_n(writer, junk, replies, 3000), (ssize_t)replies);
    }
    close(w);
  }
  expect_alive(writer);
  close(writer);
  free(m);
  tr_store_server_stop(s);
}
END_TEST

START_TEST(t_cancel_wait) {
  tr_store_server_t* s = start();
  int fd = raw_client(s), w = raw_client(s);
  msg_t* m = m_new();
  m_u8(m, TR__Q_CANCEL_WAIT); /* no wait pending: still 01 */
  m_send(fd, m);
  uint8_t canceled = TR__WAIT_CANCELED, zero = 0;
  expect_bytes(fd, &canceled, 1);
  m_wait1(m, "/late");
  m_u8(m, TR__Q_CANCEL_WAIT);
  m_send(fd, m);
  expect_bytes(fd, &canceled, 1);
  m_set(m, "/late", "x");
  m_send(w, m);
  expect_silence(fd, 100); /* the canceled WAIT is gone */
  m_wait1(m, "/late");     /* and a new one works */
  m_send(fd, m);
  expect_bytes(fd, &zero, 1);
  /* a second WAIT while one is pending breaks the one-request rule */
  m_wait1(m, "/never1");
  m_wait1(m, "/never2");
  m_send(fd, m);
  expect_closed(fd);
  expect_alive(w);
  close(fd);
  close(w);
  free(m);
  tr_store_server_stop(s);
}
END_TEST

START_TEST(t_queue_wire) {
  tr_store_server_t* s = start();
  int fd = raw_client(s);
  msg_t *m = m_new(), *r = m_new();
  m_u8(m, TR__Q_QUEUE_PUSH);
  m_str(m, "/q");
  m_str(m, "aa");
  m_u8(m, TR__Q_QUEUE_PUSH);
  m_str(m, "/q");
  m_str(m, "bbb");
  m_u8(m, TR__Q_QUEUE_LEN);
  m_str(m, "/q");
  for (int i = 0; i < 3; i++) {
    m_u8(m, TR__Q_QUEUE_POP);
    m_str(m, "/q");
  }
  m_u8(m, TR__Q_QUEUE_POP);
  m_str(m, "/none");
  m_u8(m, TR__Q_QUEUE_LEN);
  m_str(m, "/none");
  m_send(fd, m);
  m_u64(r, 2);
  m_u64(r, 2); /* POP: length before the pop, then the item */
  R_BYTES(r, "aa");
  m_u64(r, 1);
  R_BYTES(r, "bbb");
  m_u64(r, 0);
  m_u64(r, 0);
  m_u64(r, 0);
  expect_bytes(fd, r->b, r->n);
  /* a non-empty queue satisfies CHECK; it is not a key for GETNUMKEYS or
   * DELETE_KEY */
  const char* q = "/q";
  m_u8(m, TR__Q_QUEUE_PUSH);
  m_str(m, "/q");
  m_str(m, "c");
  m_keys(m, TR__Q_CHECK, 1, &q);
  m_u8(m, TR__Q_GETNUMKEYS);
  m_u8(m, TR__Q_DELETE_KEY);
  m_str(m, "/q");
  m_u8(m, TR__Q_QUEUE_LEN);
  m_str(m, "/q");
  m_send(fd, m);
  r->n = 0;
  m_u8(r, TR__CHECK_READY);
  m_u64(r, 0);
  m_u64(r, 0);
  m_u64(r, 1);
  expect_bytes(fd, r->b, r->n);
  /* each push releases one waiter, in order */
  int w1 = raw_client(s), w2 = raw_client(s);
  m_wait1(m, "/q2");
  m_send(w1, m);
  sleep_ms(20);
  m_wait1(m, "/q2");
  m_send(w2, m);
  expect_silence(w1, 30);
  m_u8(m, TR__Q_QUEUE_PUSH);
  m_str(m, "/q2");
  m_str(m, "i");
  m_send(fd, m);
  uint8_t zero = 0;
  expect_bytes(w1, &zero, 1);
  expect_silence(w2, 100);
  m_u8(m, TR__Q_QUEUE_PUSH);
  m_str(m, "/q2");
  m_str(m, "j");
  m_send(fd, m);
  expect_bytes(w2, &zero, 1);
  expect_silence(w1, 50);
  close(fd);
  close(w1);
  close(w2);
  free(m);
  free(r);
  tr_store_server_stop(s);
}
END_TEST

START_TEST(t_keys_append_multi_wire) {
  tr_store_server_t* s = start();
  int fd = raw_client(s);
  msg_t *m = m_new(), *r = m_new();
  m_add(m, "init/", 1); /* the worker counter is a key like any other */
  m_u8(m, TR__Q_APPEND);
  m_str(m, "/ap");
  m_str(m, "x");
  m_u8(m, TR__Q_APPEND);
  m_str(m, "/ap");
  m_str(m, "yz");
  m_u8(m, TR__Q_MULTI_SET);
  m_u64(m, 2);
  m_str(m, "/m1");
  m_str(m, "v1");
  m_str(m, "/m2");
  m_str(m, "");
  const char* keys[] = {"/ap", "/m2", "/nope", "/m1", "init/"};
  m_keys(m, TR__Q_MULTI_GET, 5, keys);
  m_u8(m, TR__Q_GETNUMKEYS);
  m_u8(m, TR__Q_DELETE_KEY);
  m_str(m, "/m1");
  m_u8(m, TR__Q_DELETE_KEY);
  m_str(m, "/m1");
  m_u8(m, TR__Q_GETNUMKEYS);
  m_send(fd, m);
  m_u64(r, 1);
  R_BYTES(r, "xyz");
  R_BYTES(r, "");
  R_BYTES(r, "");
  R_BYTES(r, "v1");
  R_BYTES(r, "1");
  m_u64(r, 4);
  m_u64(r, 1);
  m_u64(r, 0);
  m_u64(r, 3);
  expect_bytes(fd, r->b, r->n);
  close(fd);
  free(m);
  free(r);
  tr_store_server_stop(s);
}
END_TEST

/* ---- the handshake and protocol errors: one client closed, not others ---- */

START_TEST(t_protocol_errors_close_one) {
  tr_store_server_t* s = start();
  FILE* log = capture_log();
  int good = raw_client(s);
  msg_t* m = m_new();
  m_wait1(m, "/later"); /* a pending WAIT must survive the others' errors */
  m_send(good, m);
  /* 1: not VALIDATE first (a PING) */
  int bad = raw_connect(tr_store_server_port(s));
  int bad_port = local_port(bad);
  m_ping(m, 7);
  m_send(bad, m);
  expect_closed(bad);
  close(bad);
  /* 2: a wrong magic */
  bad = raw_connect(tr_store_server_port(s));
  m_u8(m, 0);
  m_u32(m, 0x12345678);
  m_send(bad, m);
  expect_closed(bad);
  close(bad);
  /* 3: VALIDATE twice */
  bad = raw_client(s);
  m_validate(m);
  m_send(bad, m);
  expect_closed(bad);
  close(bad);
  /* 4: an unknown command after valid ones, whose replies still arrive */
  bad = raw_client(s);
  m_ping(m, 0x01010101);
  m_u8(m, 0x63);
  m_send(bad, m);
  uint8_t echo[4] = {1, 1, 1, 1};
  expect_bytes(bad, echo, 4);
  expect_closed(bad);
  close(bad);
  /* 5: garbage (an HTTP request) */
  bad = raw_connect(tr_store_server_port(s));
  const char* http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  raw_send(bad, http, strlen(http));
  expect_closed(bad);
  close(bad);

  expect_alive(good);
  int w = raw_client(s);
  m_set(m, "/later", "ok");
  m_send(w, m);
  uint8_t zero = 0;
  expect_bytes(good, &zero, 1);
  char want[64];
  snprintf(want, sizeof want, "closing client 127.0.0.1:%d: first request",
           bad_port);
  const char* text = read_log(log);
  ck_assert_msg(strstr(text, want), "log lacks '%s':\n%s", want, text);
  ck_assert_ptr_nonnull(strstr(text, "VALIDATE magic 0x12345678"));
  ck_assert_ptr_nonnull(strstr(text, "sent VALIDATE twice"));
  ck_assert_ptr_nonnull(strstr(text, "unknown command byte 0x63"));
  tr_store_server_stats_t st;
  tr_store_server_stats(s, &st);
  ck_assert_int_eq(st.closed_errors, 5);
  close(good);
  close(w);
  free(m);
  tr_store_server_stop(s);
}
END_TEST

/* ---- limits ---- */

START_TEST(t_limits) {
  tr_store_server_opts_t o;
  tr_store_server_opts_init(&o);
  o.max_key_bytes = 16;
  o.max_value_bytes = 100;
  o.max_keys = 4;
  o.max_request_bytes = 300;
  o.max_memory_bytes = 400;
  tr_store_server_t* s = start_opts(&o);
  FILE* log = capture_log();
  int good = raw_client(s);
  msg_t* m = m_new();
  m_wait1(m, "/g");
  m_send(good, m);
  struct {
    const char* what;
    const char* log;
  } cases[] = {
      {"key", "key of 17 bytes exceeds the limit of 16"},
      {"value", "value of 101 bytes exceeds the limit of 100"},
      {"count", "WAIT of 5 keys exceeds the limit of 4"},
      {"request", "exceeds the limit (TRAINRUN_STORE_MAX_REQUEST_BYTES)"},
      {"memory", "would pass the store memory limit of 400"},
      {"huge", "key of 18446744073709551615 bytes"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int bad = raw_client(s);
    char big[200];
    memset(big, 'x', sizeof big);
    switch (i) {
      case 0:
        m_u8(m, TR__Q_GET);
        m_strn(m, big, 17);
        break;
      case 1:
        m_u8(m, TR__Q_SET);
        m_str(m, "/k");
        m_strn(m, big, 101);
        break;
      case 2: {
        const char* k[5] = {"/1", "/2", "/3", "/4", "/5"};
        m_keys(m, TR__Q_WAIT, 5, k);
        break;
      }
      case 3:
        m_u8(m, TR__Q_MULTI_SET);
        m_u64(m, 4);
        for (int j = 0; j < 4; j++) {
          m_strn(m, big, 16);
          m_strn(m, big, 100);
        }
        break;
      case 4:
        for (int j = 0; j < 5; j++) {
          char k[8];
          snprintf(k, sizeof k, "/m%d", j);
          m_u8(m, TR__Q_SET);
          m_str(m, k);
          m_strn(m, big, 100);
        }
        break;
      case 5: /* a length prefix of 2^64-1: refused before buffering */
        m_u8(m, TR__Q_GET);
        m_u64(m, UINT64_MAX);
        break;
    }
    m_send(bad, m);
    expect_closed(bad);
    close(bad);
    const char* text = read_log(log);
    ck_assert_msg(strstr(text, cases[i].log), "%s: log lacks '%s':\n%s",
                  cases[i].what, cases[i].log, text);
  }
  /* the well-behaved client still works and is still waiting */
  expect_alive(good);
  int w = raw_client(s);
  m_u8(m, TR__Q_DELETE_KEY); /* free memory the refused SETs left */
  m_str(m, "/m0");
  m_u8(m, TR__Q_DELETE_KEY);
  m_str(m, "/m1");
  m_u8(m, TR__Q_DELETE_KEY);
  m_str(m, "/m2");
  m_set(m, "/g", "ok");
  m_send(w, m);
  uint8_t dels[24];
  ck_assert_int_eq(recv_n(w, dels, 24, 3000), 24);
  uint8_t zero = 0;
  expect_bytes(good, &zero, 1);
  close(good);
  close(w);
  free(m);
  tr_store_server_stop(s);
}
END_TEST

START_TEST(t_connection_limit) {
  tr_store_server_opts_t o;
  tr_store_server_opts_init(&o);
  o.max_connections = 2;
  tr_store_server_t* s = start_opts(&o);
  FILE* log = capture_log();
  int a = raw_client(s), b = raw_client(s);
  expect_alive(a);
  expect_alive(b);
  int c = raw_connect(tr_store_server_port(s));
  expect_closed(c);
  close(c);
  ck_assert_ptr_nonnull(
      strstr(read_log(log), "TRAINRUN_STORE_MAX_CONNECTIONS"));
  close(b);
  expect_alive(a);
  /* a slot is free again once the server saw b leave */
  int64_t dl = now_ms() + 3000;
  tr_store_server_stats_t st;
  do {
    tr_store_server_stats(s, &st);
    sleep_ms(5);
  } while (st.connections > 1 && now_ms() < dl);
  c = raw_client(s);
  expect_alive(c);
  close(a);
  close(c);
  tr_store_server_stop(s);
}
END_TEST

/* ---- framing: split, pipelined, cut short, large ---- */

/* A session touching every command, and the replies it must produce. */
static void session(msg_t* m, msg_t* r) {
  m_validate(m);
  m_ping(m, 0xdeadbeef);
  m_u32(r, 0xdeadbeef);
  m_set(m, "/k", "value");
  m_cas(m, "/k", "value", "v2");
  R_BYTES(r, "v2");
  m_add(m, "/n", 40);
  m_add(m, "/n", 2);
  m_u64(r, 40);
  m_u64(r, 42);
  const char* ks[] = {"/k", "/n"};
  m_keys(m, TR__Q_CHECK, 2, ks);
  m_u8(r, 0);
  m_keys(m, TR__Q_WAIT, 2, ks);
  m_u8(r, 0);
  m_get(m, "/k");
  R_BYTES(r, "v2");
  m_u8(m, TR__Q_APPEND);
  m_str(m, "/k");
  m_str(m, "+");
  m_u8(m, TR__Q_MULTI_SET);
  m_u64(m, 1);
  m_str(m, "/z");
  m_str(m, "zz");
  m_keys(m, TR__Q_MULTI_GET, 2, (const char* const[]){"/k", "/z"});
  R_BYTES(r, "v2+");
  R_BYTES(r, "zz");
  m_u8(m, TR__Q_GETNUMKEYS);
  m_u64(r, 3);
  m_u8(m, TR__Q_DELETE_KEY);
  m_str(m, "/z");
  m_u64(r, 1);
  m_u8(m, TR__Q_QUEUE_PUSH);
  m_str(m, "/q");
  m_str(m, "item");
  m_u8(m, TR__Q_QUEUE_LEN);
  m_str(m, "/q");
  m_u64(r, 1);
  m_u8(m, TR__Q_QUEUE_POP);
  m_str(m, "/q");
  m_u64(r, 1);
  R_BYTES(r, "item");
  m_u8(m, TR__Q_CANCEL_WAIT);
  m_u8(r, 1);
}

START_TEST(t_split_bytewise) {
  tr_store_server_t* s = start();
  msg_t *m = m_new(), *r = m_new();
  session(m, r);
  int fd = raw_connect(tr_store_server_port(s));
  for (size_t i = 0; i < m->n; i++) { /* one byte per segment */
    raw_send(fd, m->b + i, 1);
    if (i % 4 == 0) sleep_ms(1);
  }
  expect_bytes(fd, r->b, r->n);
  expect_silence(fd, 50);
  close(fd);
  free(m);
  free(r);
  tr_store_server_stop(s);
}
END_TEST

START_TEST(t_pipelined) {
  tr_store_server_t* s = start();
  msg_t *m = m_new(), *r = m_new();
  session(m, r);
  int fd = raw_connect(tr_store_server_port(s));
  raw_send(fd, m->b, m->n); /* the whole session in one segment */
  expect_bytes(fd, r->b, r->n);
  expect_silence(fd, 50);
  close(fd);
  free(m);
  free(r);
  tr_store_server_stop(s);
}
END_TEST

START_TEST(t_close_mid_request) {
  tr_store_server_t* s = start();
  msg_t* m = m_new();
  int fd = raw_client(s);
  m_set(m, "/half", "0123456789");
  raw_send(fd, m->b, m->n - 5); /* the value's last 5 bytes never come */
  sleep_ms(20);
  close(fd);
  m->n = 0;
  int other = raw_client(s);
  const char* k = "/half";
  m_keys(m, TR__Q_CHECK, 1, &k);
  m_send(other, m);
  uint8_t nr = TR__CHECK_NOT_READY;
  expect_bytes(other, &nr, 1);
  close(other);
  free(m);
  tr_store_server_stop(s);
}
END_TEST

/* A 12 MiB value (read straight into the request buffer), and replies that
 * pass the 4 MiB mark while the client does not read (reading pauses). */
START_TEST(t_large_values_and_backpressure) {
  tr_store_server_t* s = start();
  int fd = raw_client(s);
  size_t n = 12u << 20;
  uint8_t* big = malloc(n + 32);
  for (size_t i = 0; i < n; i++) big[i] = (uint8_t)(i * 2654435761u >> 13);
  uint8_t hdr[32];
  size_t h = 0;
  hdr[h++] = TR__Q_SET;
  tr__wr_u64(hdr + h, 4);
  memcpy(hdr + h + 8, "/big", 4);
  h += 12;
  tr__wr_u64(hdr + h, n);
  h += 8;
  raw_send(fd, hdr, h);
  for (size_t off = 0; off < n; off += 1 << 20)
    raw_send(fd, big + off, 1 << 20);
  /* ask for it 3 times (36 MiB of replies) before reading anything */
  msg_t* m = m_new();
  for (int i = 0; i < 3; i++) m_get(m, "/big");
  m_ping(m, 99);
  m_send(fd, m);
  uint8_t* got = malloc(n);
  for (int i = 0; i < 3; i++) {
    uint8_t len[8];
    ck_assert_int_eq(recv_n(fd, len, 8, 10000), 8);
    ck_assert_uint_eq(tr__rd_u64(len), n);
    ck_assert_int_eq(recv_n(fd, got, n, 10000), (ssize_t)n);
    ck_assert(memcmp(got, big, n) == 0);
  }
  uint8_t echo[4] = {99, 0, 0, 0};
  expect_bytes(fd, echo, 4);
  tr_store_server_stats_t st;
  tr_store_server_stats(s, &st);
  ck_assert_int_eq(st.bytes, (int64_t)n + 4);
  free(got);
  free(big);
  free(m);
  close(fd);
  tr_store_server_stop(s);
}
END_TEST

/* One SET releases many waiters, each exactly once. */
START_TEST(t_many_waiters) {
  tr_store_server_t* s = start();
  enum { N = 200 };
  int fds[N];
  msg_t* m = m_new();
  for (int i = 0; i < N; i++) {
    fds[i] = raw_client(s);
    m_wait1(m, "/go");
    m_send(fds[i], m);
  }
  expect_silence(fds[N - 1], 50);
  int w = raw_client(s);
  m_set(m, "/go", "1");
  m_send(w, m);
  uint8_t zero = 0;
  for (int i = 0; i < N; i++) expect_bytes(fds[i], &zero, 1);
  for (int i = 0; i < N; i++) {
    expect_silence(fds[i], 0);
    close(fds[i]);
  }
  close(w);
  free(m);
  tr_store_server_stop(s);
}
END_TEST

/* ---- the client ---- */

static tr_store_client_t* client_for(tr_store_server_t* s, int64_t timeout) {
  tr_store_client_opts_t o;
  tr_store_client_opts_init(&o);
  o.host = "127.0.0.1";
  o.port = tr_store_server_port(s);
  o.timeout_ms = timeout;
  o.token = "";
  tr_store_client_t* c = NULL;
  int rc = tr_store_client_connect(&o, &c);
  ck_assert_msg(rc == 0, "connect: %s", tr_strerror(rc));
  return c;
}

/* Closed clients leave the counters at once (the SIGUSR1 line of
 * `trainrun store` and tr_store_server_stats), with no request after. */
START_TEST(t_stats_count_closed_clients) {
  tr_store_server_t* s = start();
  tr_store_client_t* c[3];
  for (int i = 0; i < 3; i++) c[i] = client_for(s, 5000);
  ck_assert_int_eq(tr_store_client_set(c[0], "k", "v", 1), 0);
  tr_store_server_stats_t st;
  tr_store_server_stats(s, &st);
  ck_assert_int_eq(st.connections, 3);
  tr_store_client_free(c[1]);
  tr_store_client_free(c[2]);
  int64_t t0 = now_ms();
  do {
    sleep_ms(10);
    tr_store_server_stats(s, &st);
  } while (st.connections != 1 && now_ms() - t0 < 5000);
  ck_assert_int_eq(st.connections, 1);
  ck_assert_int_eq(st.accepted, 3);
  ck_assert_int_eq(st.keys, 1);
  tr_store_client_free(c[0]);
  tr_store_server_stop(s);
}
END_TEST

START_TEST(t_client_calls) {
  tr_store_server_t* s = start();
  tr_store_client_t* c = client_for(s, 5000);
  void* v;
  size_t n;
  int64_t x;
  int ready, del;
  ck_assert_int_eq(tr_store_client_set(c, "foo", "bar", 3), 0);
  ck_assert_int_eq(tr_store_client_get(c, "foo", &v, &n), 0);
  ck_assert_uint_eq(n, 3);
  ck_assert_str_eq(v, "bar");
  free(v);
  ck_assert_int_eq(tr_store_client_add(c, "cnt", 3, &x), 0);
  ck_assert_int_eq(x, 3);
  ck_assert_int_eq(tr_store_client_add(c, "cnt", -10, &x), 0);
  ck_assert_int_eq(x, -7);
  ck_assert_int_eq(tr_store_client_get(c, "cnt", &v, &n), 0);
  ck_assert_str_eq(v, "-7"); /* counters are ASCII decimal */
  free(v);
  ck_assert_int_eq(tr_store_client_compare_set(c, "cas", "", 0, "a", 1, &v, &n),
                   0);
  ck_assert_str_eq(v, "a");
  free(v);
  ck_assert_int_eq(
      tr_store_client_compare_set(c, "cas", "b", 1, "c", 1, &v, &n), 0);
  ck_assert_str_eq(v, "a");
  free(v);
  const char* keys[] = {"foo", "cnt", "nope"};
  ck_assert_int_eq(tr_store_client_check(c, keys, 2, &ready), 0);
  ck_assert_int_eq(ready, 1);
  ck_assert_int_eq(tr_store_client_check(c, keys, 3, &ready), 0);
  ck_assert_int_eq(ready, 0);
  ck_assert_int_eq(tr_store_client_wait(c, keys, 2, 0), 0);
  ck_assert_int_eq(tr_store_client_append(c, "foo", "!!", 2), 0);
  void* vals[2];
  size_t lens[2];
  ck_assert_int_eq(tr_store_client_multi_get(c, keys, 2, vals, lens), 0);
  ck_assert_str_eq(vals[0], "bar!!");
  ck_assert_str_eq(vals[1], "-7");
  free(vals[0]);
  free(vals[1]);
  const char* mk[] = {"m1", "m2"};
  const void* mv[] = {"one", "two"};
  size_t ml[] = {3, 3};
  ck_assert_int_eq(tr_store_client_multi_set(c, mk, 2, mv, ml), 0);
  ck_assert_int_eq(tr_store_client_num_keys(c, &x), 0);
  ck_assert_int_eq(x, 5);
  ck_assert_int_eq(tr_store_client_delete_key(c, "m1", &del), 0);
  ck_assert_int_eq(del, 1);
  ck_assert_int_eq(tr_store_client_delete_key(c, "m1", &del), 0);
  ck_assert_int_eq(del, 0);
  ck_assert_int_eq(tr_store_client_queue_push(c, "q", "i1", 2), 0);
  ck_assert_int_eq(tr_store_client_queue_push(c, "q", "i2", 2), 0);
  ck_assert_int_eq(tr_store_client_queue_len(c, "q", &x), 0);
  ck_assert_int_eq(x, 2);
  ck_assert_int_eq(tr_store_client_queue_pop(c, "q", 0, &v, &n), 0);
  ck_assert_str_eq(v, "i1");
  free(v);
  ck_assert_int_eq(tr_store_client_queue_pop(c, "q", 1, &v, &n), 0);
  ck_assert_str_eq(v, "i2");
  free(v);
  ck_assert_int_eq(tr_store_client_queue_pop(c, "q", 0, &v, &n), TR_ENOTFOUND);
  ck_assert_int_eq(tr_store_client_ping(c), 0);
  tr_store_client_free(c);
  tr_store_server_stop(s);
}
END_TEST

/* A fake server: accepts one client, answers its PING, records what it
 * sends; never answers anything else. */
typedef struct {
  int lfd, port;
  uint8_t got[4096];
  size_t n;
  int accepted;
  int64_t linger_ms;
} fake_t;

static void fake_listen(fake_t* f) {
  memset(f, 0, sizeof *f);
  f->lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ck_assert_int_eq(bind(f->lfd, (struct sockaddr*)&a, sizeof a), 0);
  ck_assert_int_eq(listen(f->lfd, 8), 0);
  f->port = local_port(f->lfd);
}

static void* fake_main(void* arg) {
  fake_t* f = arg;
  int64_t end = now_ms() + f->linger_ms;
  while (now_ms() < end) {
    struct pollfd p = {f->lfd, POLLIN, 0};
    if (poll(&p, 1, 20) <= 0) continue;
    int fd = accept(f->lfd, NULL, NULL);
    if (fd < 0) continue;
    f->accepted++;
    size_t start = f->n;
    while (now_ms() < end) {
      struct pollfd q = {fd, POLLIN, 0};
      if (poll(&q, 1, 20) <= 0) continue;
      ssize_t r = recv(fd, f->got + f->n, sizeof f->got - f->n, 0);
      if (r <= 0) break;
      f->n += (size_t)r;
      /* answer the handshake's PING (bytes 5..9 of this connection) */
      if (f->n - start >= 10 && f->n - start - (size_t)r < 10)
        send(fd, f->got + start + 6, 4, MSG_NOSIGNAL);
    }
    close(fd);
  }
  return NULL;
}

START_TEST(t_client_wire_bytes) {
  fake_t f;
  fake_listen(&f);
  f.linger_ms = 600;
  pthread_t th;
  pthread_create(&th, NULL, fake_main, &f);
  tr_store_client_opts_t o;
  tr_store_client_opts_init(&o);
  o.host = "127.0.0.1";
  o.port = f.port;
  o.timeout_ms = 2000;
  o.token = "";
  tr_store_client_t* c = NULL;
  ck_assert_int_eq(tr_store_client_connect(&o, &c), 0);
  ck_assert_int_eq(tr_store_client_set(c, "foo", "bar", 3), 0);
  pthread_join(th, NULL);
  tr_store_client_free(c);
  close(f.lfd);
  uint8_t want[] = {0x00, 0xCE, 0xF7, 0x85, 0x3C, 0x0D, 0,  0, 0,
                    0,    0x01, 4,    0,    0,    0,    0,  0, 0,
                    0,    '/',  'f',  'o',  'o',  3,    0,  0, 0,
                    0,    0,    0,    0,    'b',  'a',  'r'};
  ck_assert_uint_eq(f.n, sizeof want);
  memcpy(want + 6, f.got + 6, 4); /* the PING nonce is random */
  ck_assert(memcmp(f.got, want, sizeof want) == 0);
}
END_TEST

/* A reply that never comes: the call times out, the next call reconnects. */
START_TEST(t_client_timeout_reconnect) {
  fake_t f;
  fake_listen(&f);
  f.linger_ms = 1500;
  pthread_t th;
  pthread_create(&th, NULL, fake_main, &f);
  tr_store_client_opts_t o;
  tr_store_client_opts_init(&o);
  o.host = "127.0.0.1";
  o.port = f.port;
  o.timeout_ms = 300;
  o.token = "";
  tr_store_client_t* c = NULL;
  ck_assert_int_eq(tr_store_client_connect(&o, &c), 0);
  int64_t t0 = now_ms();
  int64_t x;
  ck_assert_int_eq(tr_store_client_add(c, "k", 1, &x), TR_ETIMEDOUT);
  int64_t dt = now_ms() - t0;
  ck_assert_int_ge(dt, 280);
  ck_assert_int_lt(dt, 1000);
  ck_assert_int_eq(tr_store_client_add(c, "k", 1, &x), TR_ETIMEDOUT);
  pthread_join(th, NULL);
  ck_assert_int_eq(f.accepted, 2); /* the second call reconnected */
  tr_store_client_free(c);
  close(f.lfd);
}
END_TEST

START_TEST(t_client_wait_timeout_cancels) {
  tr_store_server_t* s = start();
  tr_store_client_t* c = client_for(s, 5000);
  tr_store_client_t* other = client_for(s, 5000);
  const char* k = "never";
  int64_t t0 = now_ms();
  ck_assert_int_eq(tr_store_client_wait(c, &k, 1, 200), TR_ETIMEDOUT);
  int64_t dt = now_ms() - t0;
  ck_assert_int_ge(dt, 190);
  ck_assert_int_lt(dt, 1500);
  /* the server forgot the wait: setting the key sends no stray byte that
   * would be read as the next reply */
  ck_assert_int_eq(tr_store_client_set(other, "never", "x", 1), 0);
  int64_t x;
  ck_assert_int_eq(tr_store_client_add(c, "ctr", 7, &x), 0);
  ck_assert_int_eq(x, 7);
  /* GET waits with the client deadline */
  tr_store_client_set_timeout(c, 150);
  void* v;
  size_t n;
  ck_assert_int_eq(tr_store_client_get(c, "missing", &v, &n), TR_ETIMEDOUT);
  ck_assert_int_eq(tr_store_client_ping(c), 0);
  tr_store_client_free(c);
  tr_store_client_free(other);
  tr_store_server_stop(s);
}
END_TEST

static int free_port(void) {
  fake_t f;
  fake_listen(&f);
  int p = f.port;
  close(f.lfd);
  return p;
}

typedef struct {
  int port;
  int rc;
  int64_t ms;
} conn_arg_t;

static void* connect_main(void* arg) {
  conn_arg_t* a = arg;
  tr_store_client_opts_t o;
  tr_store_client_opts_init(&o);
  o.host = "127.0.0.1";
  o.port = a->port;
  o.timeout_ms = 5000;
  o.backoff_initial_ms = 50;
  o.token = "";
  tr_store_client_t* c = NULL;
  int64_t t0 = now_ms();
  a->rc = tr_store_client_connect(&o, &c);
  if (a->rc == 0) a->rc = tr_store_client_set(c, "hello", "1", 1);
  a->ms = now_ms() - t0;
  tr_store_client_free(c);
  return NULL;
}

/* The client starts before the server and retries until it is up. */
START_TEST(t_client_connect_retry) {
  conn_arg_t a = {free_port(), -1, 0};
  pthread_t th;
  pthread_create(&th, NULL, connect_main, &a);
  sleep_ms(400);
  tr_store_server_opts_t o;
  tr_store_server_opts_init(&o);
  o.port = a.port;
  tr_store_server_t* s = start_opts(&o);
  pthread_join(th, NULL);
  ck_assert_int_eq(a.rc, 0);
  ck_assert_int_ge(a.ms, 390);
  ck_assert_int_lt(a.ms, 3000);
  tr_store_client_t* c = client_for(s, 2000);
  const char* k = "hello";
  int ready;
  ck_assert_int_eq(tr_store_client_check(c, &k, 1, &ready), 0);
  ck_assert_int_eq(ready, 1);
  tr_store_client_free(c);
  tr_store_server_stop(s);
}
END_TEST

/* Several I/O threads: 24 clients (dealt round-robin over 4 loops) ADD a
 * counter and WAIT for the key the last one sets, as a rendezvous does; a
 * WAIT released by a client of another loop must be answered by its own. */
typedef struct {
  tr_store_server_t* s;
  int n;
  int rc;
} rdzv_arg_t;

static void* rdzv_main(void* arg) {
  rdzv_arg_t* a = arg;
  tr_store_client_t* c = client_for(a->s, 10000);
  int64_t v = 0;
  a->rc = tr_store_client_add(c, "arrived", 1, &v);
  if (a->rc == 0 && v == a->n) a->rc = tr_store_client_set(c, "go", "1", 1);
  const char* k = "go";
  if (a->rc == 0) a->rc = tr_store_client_wait(c, &k, 1, 10000);
  void* val = NULL;
  size_t len = 0;
  if (a->rc == 0) a->rc = tr_store_client_get(c, "go", &val, &len);
  if (a->rc == 0 && (len != 1 || memcmp(val, "1", 1) != 0)) a->rc = -1;
  free(val);
  tr_store_client_free(c);
  return NULL;
}

START_TEST(t_threads_rendezvous) {
  tr_store_server_opts_t o;
  tr_store_server_opts_init(&o);
  o.threads = 4;
  tr_store_server_t* s = start_opts(&o);
  enum { N = 24 };
  pthread_t th[N];
  rdzv_arg_t a[N];
  for (int i = 0; i < N; i++) {
    a[i] = (rdzv_arg_t){s, N, 1};
    pthread_create(&th[i], NULL, rdzv_main, &a[i]);
  }
  for (int i = 0; i < N; i++) {
    pthread_join(th[i], NULL);
    ck_assert_msg(a[i].rc == 0, "client %d: %d", i, a[i].rc);
  }
  tr_store_server_stats_t st;
  tr_store_server_stats(s, &st);
  ck_assert_int_eq(st.accepted, N);
  ck_assert_int_eq(st.keys, 2);
  tr_store_server_stop(s);
}
END_TEST

START_TEST(t_client_connect_timeout) {
  tr_store_client_opts_t o;
  tr_store_client_opts_init(&o);
  o.host = "127.0.0.1";
  o.port = free_port();
  o.timeout_ms = 300;
  o.token = "";
  tr_store_client_t* c = NULL;
  int64_t t0 = now_ms();
  ck_assert_int_eq(tr_store_client_connect(&o, &c), TR_ETIMEDOUT);
  int64_t dt = now_ms() - t0;
  ck_assert_int_ge(dt, 290);
  ck_assert_int_lt(dt, 1500);
  ck_assert_ptr_null(c);
}
END_TEST

/* The server goes away and comes back on the same port: the call that saw
 * it go fails, the next one reconnects. */
START_TEST(t_client_reconnect) {
  tr_store_server_t* s = start();
  int port = tr_store_server_port(s);
  tr_store_client_t* c = client_for(s, 3000);
  ck_assert_int_eq(tr_store_client_set(c, "a", "1", 1), 0);
  tr_store_server_stop(s);
  int64_t x;
  int rc = tr_store_client_add(c, "n", 1, &x);
  ck_assert_msg(rc == TR_ECLOSED || rc == TR_ECONNRESET || rc == TR_EPIPE,
                "rc %s", tr_err_name(rc));
  tr_store_server_opts_t o;
  tr_store_server_opts_init(&o);
  o.port = port;
  s = start_opts(&o);
  ck_assert_int_eq(tr_store_client_add(c, "n", 5, &x), 0);
  ck_assert_int_eq(x, 5); /* a new server: its own data */
  tr_store_client_free(c);
  tr_store_server_stop(s);
}
END_TEST

START_TEST(t_client_clone) {
  tr_store_server_t* s = start();
  tr_store_client_t* c = client_for(s, 3000);
  tr_store_client_t* d = NULL;
  ck_assert_int_eq(tr_store_client_clone(c, &d), 0);
  ck_assert_ptr_ne(c, d);
  ck_assert_int_eq(tr_store_client_set(d, "from_clone", "y", 1), 0);
  void* v;
  size_t n;
  ck_assert_int_eq(tr_store_client_get(c, "from_clone", &v, &n), 0);
  ck_assert_str_eq(v, "y");
  free(v);
  tr_store_server_stats_t st;
  tr_store_server_stats(s, &st);
  ck_assert_int_eq(st.connections, 2);
  tr_store_client_free(d);
  ck_assert_int_eq(tr_store_client_ping(c), 0);
  tr_store_client_free(c);
  tr_store_server_stop(s);
}
END_TEST

START_TEST(t_wait_workers) {
  tr_store_server_t* s = start();
  tr_store_client_opts_t o;
  tr_store_client_opts_init(&o);
  o.host = "127.0.0.1";
  o.port = tr_store_server_port(s);
  o.timeout_ms = 3000;
  o.world_size = 3;
  o.token = "";
  tr_store_client_t *master, *w1, *w2;
  ck_assert_int_eq(tr_store_client_connect(&o, &master), 0);
  ck_assert_int_eq(tr_store_client_connect(&o, &w1), 0);
  ck_assert_int_eq(tr_store_client_wait_workers(master, 3, 200), TR_ETIMEDOUT);
  ck_assert_int_eq(tr_store_client_connect(&o, &w2), 0);
  ck_assert_int_eq(tr_store_client_wait_workers(master, 3, 2000), 0);
  /* "init/" is sent raw (no "/" prefix) */
  int fd = raw_client(s);
  msg_t m = {0};
  m_get(&m, "init/");
  m_send(fd, &m);
  uint8_t want[] = {1, 0, 0, 0, 0, 0, 0, 0, '3'};
  expect_bytes(fd, want, sizeof want);
  close(fd);
  tr_store_client_free(master);
  tr_store_client_free(w1);
  tr_store_client_free(w2);
  tr_store_server_stop(s);
}
END_TEST

START_TEST(t_prefix_store) {
  tr_store_server_t* s = start();
  tr_store_client_t* c = client_for(s, 3000);
  tr_store_prefix_t outer, inner;
  ck_assert_int_eq(tr_store_prefix_init(&outer, c, "default_pg"), 0);
  ck_assert_int_eq(tr_store_prefix_nest(&inner, &outer, "0/"), 0);
  ck_assert_int_eq(tr_store_prefix_set(&inner, "k", "v", 1), 0);
  int64_t x;
  ck_assert_int_eq(tr_store_prefix_add(&outer, "n", 2, &x), 0);
  const char* keys[] = {"k"};
  int ready;
  ck_assert_int_eq(tr_store_prefix_check(&inner, keys, 1, &ready), 0);
  ck_assert_int_eq(ready, 1);
  ck_assert_int_eq(tr_store_prefix_check(&outer, keys, 1, &ready), 0);
  ck_assert_int_eq(ready, 0);
  void* vals[1];
  size_t lens[1];
  ck_assert_int_eq(tr_store_prefix_multi_get(&inner, keys, 1, vals, lens), 0);
  ck_assert_str_eq(vals[0], "v");
  free(vals[0]);
  /* on the wire: PrefixStore("0/", PrefixStore("default_pg", s)) maps k to
   * "/default_pg/0//k" (PyTorch's group-name layering) */
  int fd = raw_client(s);
  msg_t m = {0};
  m_get(&m, "/default_pg/0//k");
  m_get(&m, "/default_pg/n");
  m_send(fd, &m);
  uint8_t want[] = {1, 0, 0, 0, 0, 0, 0, 0, 'v', 1, 0, 0, 0, 0, 0, 0, 0, '2'};
  expect_bytes(fd, want, sizeof want);
  close(fd);
  char* k = tr_store_prefix_key(&inner, "x");
  ck_assert_str_eq(k, "default_pg/0//x");
  free(k);
  tr_store_prefix_release(&inner);
  tr_store_prefix_release(&outer);
  tr_store_client_free(c);
  tr_store_server_stop(s);
}
END_TEST

/* ---- the token ---- */

START_TEST(t_token) {
  tr_store_server_opts_t so;
  tr_store_server_opts_init(&so);
  so.token = "s3cret";
  tr_store_server_t* s = start_opts(&so);
  FILE* log = capture_log();
  tr_store_client_opts_t o;
  tr_store_client_opts_init(&o);
  o.host = "127.0.0.1";
  o.port = tr_store_server_port(s);
  o.timeout_ms = 2000;
  o.token = "s3cret";
  tr_store_client_t* c = NULL;
  ck_assert_int_eq(tr_store_client_connect(&o, &c), 0);
  ck_assert_int_eq(tr_store_client_set(c, "k", "v", 1), 0);
  void* v;
  size_t n;
  ck_assert_int_eq(tr_store_client_get(c, "k", &v, &n), 0);
  ck_assert_str_eq(v, "v");
  free(v);
  /* a clone proves the token again */
  tr_store_client_t* d = NULL;
  ck_assert_int_eq(tr_store_client_clone(c, &d), 0);
  ck_assert_int_eq(tr_store_client_ping(d), 0);
  tr_store_client_free(d);
  /* wrong token: refused at once, not retried until the deadline */
  o.token = "wrong";
  int64_t t0 = now_ms();
  ck_assert_int_eq(tr_store_client_connect(&o, &d), TR_EAUTH);
  ck_assert_int_lt(now_ms() - t0, 1000);
  ck_assert_ptr_nonnull(strstr(read_log(log), "wrong store token"));
  /* a PyTorch-style client (no proof): PING works, SET closes it */
  int fd = raw_client(s);
  expect_alive(fd);
  msg_t m = {0};
  m_set(&m, "/k", "evil");
  m_send(fd, &m);
  expect_closed(fd);
  close(fd);
  ck_assert_ptr_nonnull(
      strstr(read_log(log), "before proving the store token"));
  /* the hello on the wire: 00 + a 32-byte nonce, fresh each time */
  uint8_t nonce[2][33];
  for (int i = 0; i < 2; i++) {
    fd = raw_client(s);
    uint8_t hello = TR__Q_AUTH_HELLO;
    raw_send(fd, &hello, 1);
    ck_assert_int_eq(recv_n(fd, nonce[i], 33, 3000), 33);
    ck_assert_int_eq(nonce[i][0], 0);
    close(fd);
  }
  ck_assert(memcmp(nonce[0], nonce[1], 33) != 0);
  ck_assert_int_eq(tr_store_client_get(c, "k", &v, &n), 0); /* untouched */
  ck_assert_str_eq(v, "v");
  free(v);
  tr_store_client_free(c);
  tr_store_server_stop(s);

  /* a client with a token and a server without one: a clear refusal */
  s = start();
  o.port = tr_store_server_port(s);
  o.token = "s3cret";
  ck_assert_int_eq(tr_store_client_connect(&o, &c), TR_EAUTH);
  ck_assert_ptr_nonnull(strstr(read_log(log), "does not require a token"));
  tr_store_server_stop(s);
}
END_TEST

START_TEST(t_sha256_hmac_vectors) {
  static const struct {
    const char* msg;
    const char* hex;
  } v[] = {
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc",
       "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
  };
  for (size_t i = 0; i < 3; i++) {
    tr__sha256_t s;
    uint8_t d[32];
    char hex[65];
    tr__sha256_init(&s);
    tr__sha256_update(&s, v[i].msg, strlen(v[i].msg));
    tr__sha256_final(&s, d);
    for (int j = 0; j < 32; j++) sprintf(hex + 2 * j, "%02x", d[j]);
    ck_assert_str_eq(hex, v[i].hex);
  }
  /* RFC 4231 test case 2 */
  uint8_t mac[32];
  char hex[65];
  const char* data = "what do ya want for nothing?";
  tr__hmac_sha256("Jefe", 4, data, strlen(data), mac);
  for (int j = 0; j < 32; j++) sprintf(hex + 2 * j, "%02x", mac[j]);
  ck_assert_str_eq(
      hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  /* RFC 4231 test case 6: a key longer than the block */
  uint8_t key[131];
  memset(key, 0xaa, sizeof key);
  data = "Test Using Larger Than Block-Size Key - Hash Key First";
  tr__hmac_sha256(key, sizeof key, data, strlen(data), mac);
  for (int j = 0; j < 32; j++) sprintf(hex + 2 * j, "%02x", mac[j]);
  ck_assert_str_eq(
      hex, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}
END_TEST

/* ---- `trainrun store` ---- */

START_TEST(t_cli_store) {
  const char* bd = getenv("top_builddir");
  char exe[4096];
  snprintf(exe, sizeof exe, "%s/trainrun", bd ? bd : ".");
  ck_assert_msg(access(exe, X_OK) == 0, "'%s' is not built", exe);
  int out[2];
  ck_assert_int_eq(pipe(out), 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    close(out[0]);
    execl(exe, exe, "store", "--port", "0", "--host", "127.0.0.1", (char*)NULL);
    _exit(127);
  }
  close(out[1]);
  char line[256] = {0};
  size_t n = 0;
  while (n < sizeof line - 1 && !strchr(line, '\n')) {
    struct pollfd p = {out[0], POLLIN, 0};
    if (poll(&p, 1, 5000) <= 0) break;
    ssize_t r = read(out[0], line + n, sizeof line - 1 - n);
    if (r <= 0) break;
    n += (size_t)r;
  }
  int port = 0;
  ck_assert_msg(sscanf(line, "trainrun store: listening on 127.0.0.1 port %d",
                       &port) == 1,
                "got '%s'", line);
  int fd = raw_connect(port);
  uint8_t v[5] = {0, 0xCE, 0xF7, 0x85, 0x3C};
  raw_send(fd, v, 5);
  expect_alive(fd);
  close(fd);
  kill(pid, SIGTERM);
  int status;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert(WIFEXITED(status));
  ck_assert_int_eq(WEXITSTATUS(status), 0);
  close(out[0]);
  /* bad usage: exit 2 */
  pid = fork();
  if (pid == 0) {
    int null = open("/dev/null", O_WRONLY);
    dup2(null, 2);
    execl(exe, exe, "store", "--port", "99999", (char*)NULL);
    _exit(127);
  }
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_int_eq(WEXITSTATUS(status), 2);
}
END_TEST

/* ---- several I/O loops: the accept fence; several accept queues ---- */

/* Round after round, client A connects, SETs a fresh key and closes (or,
 * every third round, stays connected and says nothing more) without
 * waiting for anything -- SET has no reply; then client B connects and
 * GETs the key: B must see A's value, never the empty reply of a missing
 * key, though A and B are served by different loops of the 4. */
START_TEST(t_fence_set_close_then_get) {
  tr_store_server_opts_t o;
  tr_store_server_opts_init(&o);
  o.threads = 4;
  tr_store_server_t* s = start_opts(&o);
  int port = tr_store_server_port(s);
  enum { ROUNDS = 1500 };
  static char big[20000];
  memset(big, 'v', sizeof big - 1);
  msg_t* m = m_new();
  int missing = 0, first_missing = -1;
  for (int i = 0; i < ROUNDS; i++) {
    char key[32], val[32];
    snprintf(key, sizeof key, "/fence/%d", i);
    snprintf(val, sizeof val, "value-%d", i);
    const char* v = i % 7 == 3 ? big : val; /* some SETs span segments */
    int a = raw_connect(port);
    m_validate(m);
    m_set(m, key, v);
    m_send(a, m);
    int keep = i % 3 == 2;
    if (!keep) close(a);
    int b = raw_connect(port);
    m_validate(m);
    m_get(m, key);
    m_send(b, m);
    uint8_t len8[8];
    ck_assert_int_eq(recv_n(b, len8, 8, 3000), 8);
    uint64_t n = tr__rd_u64(len8);
    if (n == 0) {
      if (first_missing < 0) first_missing = i;
      missing++;
    } else {
      ck_assert_uint_eq(n, strlen(v));
      char* got = malloc(n);
      ck_assert_int_eq(recv_n(b, (uint8_t*)got, n, 3000), (ssize_t)n);
      ck_assert_msg(memcmp(got, v, n) == 0, "round %d: wrong value", i);
      free(got);
    }
    close(b);
    if (keep) close(a);
  }
  free(m);
  ck_assert_msg(missing == 0,
                "%d of %d GETs missed the SET their predecessor sent "
                "before closing (first in round %d)",
                missing, ROUNDS, first_missing);
  tr_store_server_stats_t st;
  tr_store_server_stats(s, &st);
  ck_assert_int_eq(st.keys, ROUNDS);
  tr_store_server_stop(s);
}
END_TEST

/* Listening sockets on 127.0.0.1:port, from /proc/net/tcp. */
static int count_listeners(int port) {
  FILE* f = fopen("/proc/net/tcp", "r");
  if (!f) return -1;
  char line[512];
  int n = 0;
  char want[32];
  snprintf(want, sizeof want, "0100007F:%04X", port);
  while (fgets(line, sizeof line, f)) {
    char local[64], remote[64];
    unsigned st;
    if (sscanf(line, " %*d: %63s %63s %x", local, remote, &st) == 3 &&
        st == 0x0A && strcmp(local, want) == 0)
      n++;
  }
  fclose(f);
  return n;
}

/* opts.listeners = 4 with port 0: four listening sockets on the port the
 * first one got, every one of 64 clients (spread over them by the kernel)
 * served; a second server cannot take the port, with or without a group
 * of its own; the defaults follow expected clients over the backlog. */
START_TEST(t_reuseport_listeners) {
  ck_assert_int_eq(tr__store_default_listeners(0, 4096), 1);
  ck_assert_int_eq(tr__store_default_listeners(4096, 4096), 1);
  ck_assert_int_eq(tr__store_default_listeners(4097, 4096), 2);
  ck_assert_int_eq(tr__store_default_listeners(16384, 4096), 4);
  ck_assert_int_eq(tr__store_default_listeners(1 << 24, 4096), 16);
  tr_store_server_opts_t o;
  tr_store_server_opts_init(&o);
  o.listeners = 4;
  o.threads = 2;
  tr_store_server_t* s = start_opts(&o);
  int port = tr_store_server_port(s);
  ck_assert_int_gt(port, 0);
  ck_assert_int_eq(count_listeners(port), 4);
  enum { N = 64 };
  int fds[N];
  for (int i = 0; i < N; i++) fds[i] = raw_client(s);
  for (int i = 0; i < N; i++) {
    expect_alive(fds[i]);
    close(fds[i]);
  }
  tr_store_server_stats_t st;
  tr_store_server_stats(s, &st);
  ck_assert_int_eq(st.accepted, N);
  for (int k = 1; k <= 4; k += 3) {
    tr_store_server_opts_t o2;
    tr_store_server_opts_init(&o2);
    o2.host = "127.0.0.1";
    o2.port = port;
    o2.listeners = k;
    tr_store_server_t* s2 = NULL;
    ck_assert_int_eq(tr_store_server_start(&o2, &s2), TR_EADDRINUSE);
    ck_assert_ptr_null(s2);
  }
  tr_store_server_stop(s);
  ck_assert_int_eq(count_listeners(port), 0);
  /* expected clients past the backlog pick the queues */
  tr_store_server_opts_init(&o);
  o.backlog = 64;
  o.expected_clients = 200;
  s = start_opts(&o);
  ck_assert_int_eq(count_listeners(tr_store_server_port(s)), 4);
  tr_store_server_stop(s);
}
END_TEST

/* The I/O thread default: several where the CPUs allow, the variable
 * overrides it. */
START_TEST(t_threads_default) {
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int want = (int)(ncpu / 4 < 1 ? 1 : ncpu / 4 > 4 ? 4 : ncpu / 4);
  ck_assert_int_eq(tr__store_default_threads(), want);
  unsetenv("TRAINRUN_STORE_THREADS");
  tr_param_reset();
  tr_store_server_opts_t o;
  tr_store_server_opts_init(&o);
  ck_assert_int_eq(o.threads, 0);
  setenv("TRAINRUN_STORE_THREADS", "3", 1);
  tr_param_reset();
  tr_store_server_opts_init(&o);
  ck_assert_int_eq(o.threads, 3);
  unsetenv("TRAINRUN_STORE_THREADS");
  tr_param_reset();
}
END_TEST

static Suite* store_suite(void) {
  Suite* s = suite_create("store");
  TCase* wire = tcase_create("wire");
  tcase_set_timeout(wire, 30);
  tcase_add_test(wire, t_validate_ping);
  tcase_add_test(wire, t_set_wait_get_wire);
  tcase_add_test(wire, t_add_wire);
  tcase_add_test(wire, t_compare_set_wire);
  tcase_add_test(wire, t_check_wait_wire);
  tcase_add_test(wire, t_wait_released_by_writers);
  tcase_add_test(wire, t_cancel_wait);
  tcase_add_test(wire, t_queue_wire);
  tcase_add_test(wire, t_keys_append_multi_wire);
  suite_add_tcase(s, wire);
  TCase* robust = tcase_create("robustness");
  tcase_set_timeout(robust, 30);
  tcase_add_test(robust, t_protocol_errors_close_one);
  tcase_add_test(robust, t_limits);
  tcase_add_test(robust, t_connection_limit);
  tcase_add_test(robust, t_split_bytewise);
  tcase_add_test(robust, t_pipelined);
  tcase_add_test(robust, t_close_mid_request);
  tcase_add_test(robust, t_large_values_and_backpressure);
  tcase_add_test(robust, t_many_waiters);
  suite_add_tcase(s, robust);
  TCase* client = tcase_create("client");
  tcase_set_timeout(client, 30);
  tcase_add_test(client, t_client_calls);
  tcase_add_test(client, t_stats_count_closed_clients);
  tcase_add_test(client, t_client_wire_bytes);
  tcase_add_test(client, t_client_timeout_reconnect);
  tcase_add_test(client, t_client_wait_timeout_cancels);
  tcase_add_test(client, t_client_connect_retry);
  tcase_add_test(client, t_client_connect_timeout);
  tcase_add_test(client, t_client_reconnect);
  tcase_add_test(client, t_client_clone);
  tcase_add_test(client, t_wait_workers);
  tcase_add_test(client, t_threads_rendezvous);
  tcase_add_test(client, t_prefix_store);
  suite_add_tcase(s, client);
  TCase* multi = tcase_create("multi");
  tcase_set_timeout(multi, 40);
  tcase_add_test(multi, t_fence_set_close_then_get);
  tcase_add_test(multi, t_reuseport_listeners);
  tcase_add_test(multi, t_threads_default);
  suite_add_tcase(s, multi);
  TCase* auth = tcase_create("token");
  tcase_set_timeout(auth, 30);
  tcase_add_test(auth, t_token);
  tcase_add_test(auth, t_sha256_hmac_vectors);
  suite_add_tcase(s, auth);
  TCase* cli = tcase_create("cli");
  tcase_set_timeout(cli, 30);
  tcase_add_test(cli, t_cli_store);
  suite_add_tcase(s, cli);
  return s;
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  SRunner* sr = srunner_create(store_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
