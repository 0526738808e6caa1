/* store/server.c: the TCPStore server -- an acceptor thread and a few libuv
 * I/O loops ("shards"), each on a thread of its own.
 *
 * The acceptor drains the kernel's accept queues in a tight loop (so a
 * burst of thousands of connecting ranks overflows the listen backlog as
 * little as possible) and deals the new sockets round-robin to the shards.
 * It listens on K sockets of one SO_REUSEPORT group (opts.listeners; by
 * default enough that the expected clients fit in K somaxconn-sized
 * backlogs): the kernel spreads connections over them by hash. Each shard
 * reads its clients, feeds what they send to their request engines (conn.c)
 * and writes the replies back. The key-value state (db.c) and every
 * connection's request engine are guarded by one mutex, held only while
 * requests are parsed and executed -- never across a system call -- so the
 * shards overlap their socket work, which is most of the cost of a request.
 *
 * The accept fence. A SET has no reply, so a client may SET, close, and
 * have another process connect and read the key: with one loop the SET
 * executes first (the loop polls the older socket first); with several, the
 * new connection's loop could run ahead of the one holding the SET's bytes.
 * So the acceptor releases the clients it accepted (one batch: everything
 * accepted since the last release) only after every shard has, after the
 * batch's last accept, run a non-blocking poll and read every connection
 * the kernel had bytes for (a uv_idle to keep the poll from blocking, a
 * uv_check to count two polls, a byte on the ack pipe); then it executes,
 * in accept order, what each released client already sent (so clients of
 * one batch are ordered too) and hands them to the shards. The next batch
 * gathers while a fence is in flight: a burst of 16K connects costs a few
 * fences, not 16K. Connections waiting in different accept queues at once
 * have no order among them (the kernel's hash picked the queues).
 *
 * Replies are gathered per client while a read is processed -- including the
 * STOP_WAITING bytes a SET sends to the clients waiting on its key, which may
 * belong to another shard: that shard is woken through its uv_async -- and
 * written once per client, with uv_try_write first and a queued uv_write for
 * what the socket did not take. A read takes the lock once: its requests
 * execute, and the replies of every client of the shard they made ready
 * are taken in the same critical section (collect_dirty), so a request
 * costs one read(2), one write(2) and one lock round; what a connection's
 * own loop alone touches (its input buffer, parser, pause flag) is read
 * without the lock. A client whose replies pile up past
 * TR__STORE_OUT_HIGH is not read until they drain. A client that breaks a
 * rule is closed alone; client records are freed only once their handle is
 * closed and no dirty list holds them.
 *
 * TRAINRUN_STORE_THREADS sets the number of shards (default: a quarter
 * of the CPUs, 1 to 4; see store.h for the ordering the fence keeps and
 * what it does not).
 * Cross-thread calls: tr_store_server_stop (a pipe to the
 * acceptor, the shards' uv_async) and tr_store_server_stats (atomics).
 */
#include "config.h"

#include <arpa/inet.h> /* inet_ntop */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h> /* getaddrinfo for host names */
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h> /* RLIMIT_NOFILE */
#include <stddef.h>       /* offsetof */
#include <sys/socket.h>
#include <sys/un.h> /* the endpoint claim */
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "store/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/param.h"
#include "trainrun/store.h"

#define READ_BUF (64u << 10)
#define OUT_KEEP (64u << 10) /* output buffer kept between replies */
#define MAX_SHARDS 64
#define MAX_LISTENERS 16
#define ACCEPT_BATCH 256

typedef struct shard_s shard_t;

typedef struct srv_client_s {
  uv_tcp_t tcp; /* first: the handle's address is the record's */
  shard_t* sh;
  int fd; /* the accepted socket, until its shard opens tcp on it */
  tr__store_conn_t conn; /* under srv->mu */
  uv_write_t wreq;
  tr__buf_t inflight; /* bytes handed to the socket (loop thread only) */
  int writing;
  int reading;
  int draining;     /* inside drain(): flush must not re-enter it */
  int closing;      /* set under srv->mu: no more wake-ups are queued for it */
  int dirty;        /* on its shard's dirty list (under srv->mu) */
  int free_pending; /* handle closed while dirty: the list pop frees it */
  struct srv_client_s* dirty_next;
  struct srv_client_s* prev; /* the shard's open clients (loop thread) */
  struct srv_client_s* next;
} srv_client_t;

struct shard_s {
  tr_store_server_t* srv;
  uv_loop_t loop;
  uv_async_t async; /* new sockets, wake-ups from other shards, stop */
  pthread_t thread;
  int thread_started;
  srv_client_t* clients;     /* open clients (loop thread) */
  int64_t refused_logged_at; /* uv_now of the last "refused" warning */
  /* under srv->mu */
  srv_client_t* dirty; /* clients with replies to write */
  /* loop thread: the dirty clients taken in one lock round (send_batch) */
  srv_client_t** batch;
  size_t nbatch, capbatch;
  srv_client_t** pend; /* clients from the acceptor (under srv->mu) */
  size_t npend, cappend;
  int stop;
  /* the accept fence: fence_req (under srv->mu) is the acceptor's latest;
   * fence_seen the one being served; fence_acked (atomic) the last one
   * this loop completed */
  uint64_t fence_req, fence_seen, fence_acked;
  int fence_stage;      /* 1: the poll that took it ran; 2: one more poll ran */
  uv_idle_t fence_idle; /* keeps the next poll from blocking */
  uv_check_t fence_check;
  uint8_t rbuf[READ_BUF];
};

struct tr_store_server_s {
  pthread_mutex_t mu; /* db, every conn, dirty lists, pending sockets */
  tr__store_db_t db;
  shard_t* shards;
  int nshards;
  int lfds[MAX_LISTENERS]; /* listening sockets (non-blocking), one
                              SO_REUSEPORT group when more than one */
  int nlfds;
  int lockfd;       /* abstract unix socket claiming host:port for the group */
  int wake[2];      /* tells the acceptor to stop */
  int ack[2];       /* shards tell the acceptor a fence completed */
  uint8_t* acc_buf; /* the acceptor's pre-read buffer */
  pthread_t acceptor;
  int acceptor_started;
  char host[INET6_ADDRSTRLEN];
  int port;
  int64_t max_conns;
  int64_t nconns; /* atomic */
  /* counters read by tr_store_server_stats from any thread */
  int64_t st_conns, st_accepted, st_errors, st_keys, st_bytes, st_requests;
};

/* The shard whose loop runs on this thread (NULL elsewhere). */
static __thread shard_t* tls_shard;

static void lock(tr_store_server_t* s) { pthread_mutex_lock(&s->mu); }
static void unlock(tr_store_server_t* s) { pthread_mutex_unlock(&s->mu); }

/* Under s->mu. */
static void publish_stats(tr_store_server_t* s) {
  __atomic_store_n(&s->st_conns, __atomic_load_n(&s->nconns, __ATOMIC_RELAXED),
                   __ATOMIC_RELAXED);
  __atomic_store_n(&s->st_keys, s->db.nkeys, __ATOMIC_RELAXED);
  __atomic_store_n(&s->st_bytes, s->db.bytes, __ATOMIC_RELAXED);
  __atomic_store_n(&s->st_requests, s->db.requests, __ATOMIC_RELAXED);
}

/* ---- closing ---- */

static void free_client(srv_client_t* cl) {
  tr__buf_release(&cl->inflight);
  free(cl);
}

static void on_client_closed(uv_handle_t* h) {
  srv_client_t* cl = (srv_client_t*)h;
  tr_store_server_t* s = cl->sh->srv;
  lock(s);
  if (cl->dirty) { /* a wake-up queued it before it closed */
    cl->free_pending = 1;
    unlock(s);
    return;
  }
  unlock(s);
  free_client(cl);
}

static void client_close(srv_client_t* cl, int error) {
  if (cl->closing) return;
  shard_t* sh = cl->sh;
  tr_store_server_t* s = sh->srv;
  lock(s);
  cl->closing = 1;
  if (error) {
    __atomic_add_fetch(&s->st_errors, 1, __ATOMIC_RELAXED);
    /* Best effort: replies to requests before the bad one (and the byte
     * that says why, for a refused token) still go out. */
    if (!cl->writing && cl->conn.out.len) {
      uv_buf_t b = uv_buf_init(cl->conn.out.buf, (unsigned)cl->conn.out.len);
      (void)uv_try_write((uv_stream_t*)&cl->tcp, &b, 1);
    }
  }
  tr__store_conn_release(&cl->conn); /* drops its WAIT first */
  /* the counters a status line reads count it out at once, not at the
   * next request of another client */
  __atomic_sub_fetch(&s->nconns, 1, __ATOMIC_RELAXED);
  publish_stats(s);
  unlock(s);
  if (cl->prev)
    cl->prev->next = cl->next;
  else
    sh->clients = cl->next;
  if (cl->next) cl->next->prev = cl->prev;
  uv_close((uv_handle_t*)&cl->tcp, on_client_closed);
}

/* ---- writing ---- */

static void flush(srv_client_t* cl);
static void flush_dirty(shard_t* sh);
static void read_start(srv_client_t* cl);

/* conn.paused, like conn.in and conn.ps, is touched only by the client's
 * own loop thread (wake-ups from other shards write only conn.out and the
 * WAIT fields), so reading it needs no lock. */
static int is_paused(srv_client_t* cl) { return cl->conn.paused; }

/* A paused client (replies over the high mark) whose replies have all been
 * handed to the kernel: parse what it sent meanwhile, flush, and repeat
 * while each round drains at once; read again once no longer paused. Runs
 * after a completed uv_write and after a uv_try_write that took everything
 * (that path has no write callback, so without this the client would stay
 * paused forever). */
static void drain(srv_client_t* cl) {
  if (cl->draining) return;
  cl->draining = 1;
  tr_store_server_t* s = cl->sh->srv;
  while (!cl->closing && !cl->writing) {
    lock(s);
    if (cl->conn.out.len != 0 || !cl->conn.paused) {
      unlock(s);
      break;
    }
    int rc = tr__store_conn_resume(&cl->conn);
    publish_stats(s);
    unlock(s);
    if (rc < 0) {
      client_close(cl, 1);
      break;
    }
    flush(cl);
    flush_dirty(cl->sh); /* replies to clients this resume woke */
  }
  cl->draining = 0;
  if (!cl->closing && !cl->reading && !is_paused(cl)) read_start(cl);
}

static void on_write(uv_write_t* req, int status) {
  srv_client_t* cl = req->data;
  cl->writing = 0;
  tr__buf_reset(&cl->inflight);
  tr__buf_shrink(&cl->inflight, OUT_KEEP);
  if (cl->closing) return;
  if (status < 0) {
    TR_LOG_INFO(STORE, "closing client %s: write failed: %s", cl->conn.peer,
                uv_strerror(status));
    client_close(cl, 0);
    return;
  }
  flush(cl);
  if (!cl->closing && is_paused(cl)) drain(cl);
}

/* Under s->mu: move the client's gathered replies to inflight (new
 * replies gather in the emptied buffer); 1 when there is something to
 * write. */
static int take_output(srv_client_t* cl) {
  if (cl->closing || cl->writing || cl->conn.out.len == 0) return 0;
  tr__buf_t tmp = cl->inflight; /* empty: no write is in flight */
  cl->inflight = cl->conn.out;
  cl->conn.out = tmp;
  tr__buf_reset(&cl->conn.out);
  return 1;
}

/* Write inflight without the lock: one uv_try_write (a write(2)) for all
 * the replies gathered since the last one, and a queued uv_write for what
 * the socket did not take. */
static void send_inflight(srv_client_t* cl) {
  uv_buf_t b = uv_buf_init(cl->inflight.buf, (unsigned)cl->inflight.len);
  int n = uv_try_write((uv_stream_t*)&cl->tcp, &b, 1);
  if (n == (int)cl->inflight.len) {
    tr__buf_reset(&cl->inflight);
    tr__buf_shrink(&cl->inflight, OUT_KEEP);
    if (is_paused(cl)) drain(cl);
    return;
  }
  if (n < 0 && n != UV_EAGAIN) {
    tr__buf_reset(&cl->inflight);
    TR_LOG_INFO(STORE, "closing client %s: write failed: %s", cl->conn.peer,
                uv_strerror(n));
    client_close(cl, 0);
    return;
  }
  if (n < 0) n = 0;
  b = uv_buf_init(cl->inflight.buf + n,
                  (unsigned)(cl->inflight.len - (size_t)n));
  cl->wreq.data = cl;
  int rc = uv_write(&cl->wreq, (uv_stream_t*)&cl->tcp, &b, 1, on_write);
  if (rc < 0) {
    tr__buf_reset(&cl->inflight);
    TR_LOG_INFO(STORE, "closing client %s: write failed: %s", cl->conn.peer,
                uv_strerror(rc));
    client_close(cl, 0);
    return;
  }
  cl->writing = 1;
}

/* Hand the client's gathered replies to the socket. */
static void flush(srv_client_t* cl) {
  if (cl->closing || cl->writing) return;
  tr_store_server_t* s = cl->sh->srv;
  lock(s);
  int have = take_output(cl);
  unlock(s);
  if (have) send_inflight(cl);
}

/* db.c tells us a connection has replies (its own, or a wake-up); called
 * under s->mu from whichever shard ran the request. */
static void on_output(tr__store_conn_t* c, void* arg) {
  (void)arg;
  srv_client_t* cl = c->user;
  if (!cl || cl->dirty || cl->closing) return;
  shard_t* sh = cl->sh;
  cl->dirty = 1;
  cl->dirty_next = sh->dirty;
  sh->dirty = cl;
  /* sent under the lock: the shard cannot close this handle meanwhile */
  if (sh != tls_shard) uv_async_send(&sh->async);
}

/* Under s->mu: empty the shard's dirty list into sh->batch, taking each
 * client's replies (take_output) in the same critical section -- one lock
 * round for all the clients a read or a wake-up gave replies to. */
static void collect_dirty(shard_t* sh) {
  while (sh->dirty) {
    srv_client_t* cl = sh->dirty;
    sh->dirty = cl->dirty_next;
    cl->dirty = 0;
    if (!cl->free_pending && !take_output(cl)) continue;
    if (TR_GROW(sh->batch, sh->nbatch + 1, sh->capbatch) < 0) {
      /* write it later: back on the list, woken again */
      if (!cl->free_pending) {
        tr__buf_t tmp = cl->conn.out; /* undo take_output */
        cl->conn.out = cl->inflight;
        cl->inflight = tmp;
        tr__buf_reset(&cl->inflight);
      }
      cl->dirty = 1;
      cl->dirty_next = sh->dirty;
      sh->dirty = cl;
      uv_async_send(&sh->async);
      break;
    }
    sh->batch[sh->nbatch++] = cl;
  }
}

/* Without the lock: write what collect_dirty took, free the records whose
 * handle closed while listed. The batch is detached first: a write may
 * drain a paused client, which flushes the dirty list again. */
static void send_batch(shard_t* sh) {
  srv_client_t** b = sh->batch;
  size_t n = sh->nbatch, cap = sh->capbatch;
  if (n == 0) return;
  sh->batch = NULL;
  sh->nbatch = sh->capbatch = 0;
  for (size_t i = 0; i < n; i++) {
    if (b[i]->free_pending)
      free_client(b[i]);
    else if (!b[i]->closing)
      send_inflight(b[i]);
  }
  if (sh->batch) { /* a nested flush made its own */
    free(b);
    return;
  }
  sh->batch = b;
  sh->capbatch = cap;
}

static void flush_dirty(shard_t* sh) {
  tr_store_server_t* s = sh->srv;
  lock(s);
  collect_dirty(sh);
  unlock(s);
  send_batch(sh);
}

/* ---- reading ---- */

static void on_alloc(uv_handle_t* h, size_t suggested, uv_buf_t* buf) {
  (void)suggested;
  srv_client_t* cl = (srv_client_t*)h;
  size_t room; /* conn.in, .ps, .paused: this loop's own (see is_paused) */
  uint8_t* p = tr__store_conn_read_room(&cl->conn, &room);
  if (p) {
    if (room > UINT32_MAX) room = UINT32_MAX;
    *buf = uv_buf_init((char*)p, (unsigned)room);
    return;
  }
  *buf = uv_buf_init((char*)cl->sh->rbuf, READ_BUF);
}

static void on_read(uv_stream_t* st, ssize_t nread, const uv_buf_t* buf) {
  srv_client_t* cl = (srv_client_t*)st;
  shard_t* sh = cl->sh;
  tr_store_server_t* s = sh->srv;
  if (cl->closing) return;
  if (nread < 0) {
    if (nread == UV_EOF) {
      lock(s);
      size_t partial = cl->conn.in.len;
      unlock(s);
      if (partial)
        TR_LOG_INFO(STORE,
                    "client %s closed in the middle of a request "
                    "(%zu bytes of it received)",
                    cl->conn.peer, partial);
      else
        TR_LOG_DEBUG(STORE, "client %s disconnected", cl->conn.peer);
    } else {
      TR_LOG_INFO(STORE, "closing client %s: read failed: %s", cl->conn.peer,
                  uv_strerror((int)nread));
    }
    client_close(cl, 0);
    flush_dirty(sh);
    return;
  }
  if (nread == 0) return;
  lock(s);
  int rc;
  if (buf->base == (char*)sh->rbuf)
    rc = tr__store_conn_input(&cl->conn, sh->rbuf, (size_t)nread);
  else
    rc = tr__store_conn_input_inplace(&cl->conn, (size_t)nread);
  int paused = cl->conn.paused;
  publish_stats(s);
  if (rc < 0) { /* client_close writes what it had before the bad request */
    unlock(s);
    client_close(cl, 1);
    flush_dirty(sh);
    return;
  }
  collect_dirty(sh); /* this client's replies and those it woke */
  unlock(s);
  if (paused && cl->reading) {
    uv_read_stop(st);
    cl->reading = 0;
  }
  send_batch(sh);
}

/* Also called from drain() when a paused client caught up. */
static void read_start(srv_client_t* cl) {
  int rc = uv_read_start((uv_stream_t*)&cl->tcp, on_alloc, on_read);
  if (rc < 0) {
    TR_LOG_INFO(STORE, "closing client %s: %s", cl->conn.peer, uv_strerror(rc));
    client_close(cl, 0);
    return;
  }
  cl->reading = 1;
}

/* ---- adopting accepted sockets (shard loop) ---- */

static void peer_name(const struct sockaddr_storage* ss, char* out, size_t n) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (ss->ss_family == AF_INET6) {
    const struct sockaddr_in6* a = (const struct sockaddr_in6*)ss;
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    snprintf(out, n, "[%s]:%d", host, ntohs(a->sin6_port));
    return;
  }
  const struct sockaddr_in* a = (const struct sockaddr_in*)ss;
  if (ss->ss_family == AF_INET)
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
  snprintf(out, n, "%s:%d", host,
           ss->ss_family == AF_INET ? ntohs(a->sin_port) : 0);
}

/* Drop a client record no loop has opened yet (the acceptor's, or one left
 * in a shard's pending list at stop): replies it has go out best effort. */
static void record_discard(tr_store_server_t* s, srv_client_t* cl, int error) {
  lock(s);
  if (error) {
    __atomic_add_fetch(&s->st_errors, 1, __ATOMIC_RELAXED);
    if (cl->conn.out.len) {
      ssize_t w =
          send(cl->fd, cl->conn.out.buf, cl->conn.out.len, MSG_NOSIGNAL);
      (void)w;
    }
  }
  tr__store_conn_release(&cl->conn);
  unlock(s);
  close(cl->fd);
  __atomic_sub_fetch(&s->nconns, 1, __ATOMIC_RELAXED);
  free_client(cl);
}

static void on_open_failed(uv_handle_t* h) { free_client((srv_client_t*)h); }

/* Open the acceptor's record on this loop. The acceptor may have executed
 * its first requests already (fenced pre-read): their replies are in
 * conn.out, sent by the flush_dirty that follows. */
static void adopt(shard_t* sh, srv_client_t* cl) {
  tr_store_server_t* s = sh->srv;
  cl->sh = sh;
  uv_tcp_init(&sh->loop, &cl->tcp);
  int rc = uv_tcp_open(&cl->tcp, cl->fd);
  if (rc < 0) {
    TR_LOG_INFO(STORE, "closing client %s: %s", cl->conn.peer, uv_strerror(rc));
    lock(s);
    tr__store_conn_release(&cl->conn);
    unlock(s);
    close(cl->fd);
    __atomic_sub_fetch(&s->nconns, 1, __ATOMIC_RELAXED);
    uv_close((uv_handle_t*)&cl->tcp, on_open_failed);
    return;
  }
  uv_tcp_nodelay(&cl->tcp, 1);
  cl->next = sh->clients;
  if (sh->clients) sh->clients->prev = cl;
  sh->clients = cl;
  lock(s);
  cl->conn.user = cl; /* wake-ups reach it from here on */
  if (cl->conn.out.len) on_output(&cl->conn, s);
  unlock(s);
  if (!is_paused(cl)) read_start(cl); /* else drain() starts it */
}

static void shard_stop(shard_t* sh) {
  while (sh->clients) client_close(sh->clients, 0);
  uv_close((uv_handle_t*)&sh->async, NULL);
  uv_close((uv_handle_t*)&sh->fence_idle, NULL);
  uv_close((uv_handle_t*)&sh->fence_check, NULL);
  lock(sh->srv);
  publish_stats(sh->srv);
  unlock(sh->srv);
}

/* ---- the accept fence (see the top of the file) ---- */

static void on_fence_idle(uv_idle_t* h) { (void)h; }

/* Runs after each poll phase while a fence is served: the first time after
 * the poll that delivered the fence, the second after one more poll -- one
 * that did not block (fence_idle) and so returned every connection that
 * was readable when the fence was posted, whose on_read ran. Then ack. */
static void on_fence_check(uv_check_t* h) {
  shard_t* sh = h->data;
  if (sh->fence_stage == 1) {
    sh->fence_stage = 2;
    return;
  }
  sh->fence_stage = 0;
  uv_idle_stop(&sh->fence_idle);
  uv_check_stop(&sh->fence_check);
  __atomic_store_n(&sh->fence_acked, sh->fence_seen, __ATOMIC_RELEASE);
  char b = 1;
  ssize_t w = write(sh->srv->ack[1], &b, 1); /* full pipe: already woken */
  (void)w;
}

static void on_async(uv_async_t* a) {
  shard_t* sh = a->data;
  tr_store_server_t* s = sh->srv;
  lock(s);
  srv_client_t** pend = sh->pend;
  size_t npend = sh->npend;
  sh->pend = NULL;
  sh->npend = sh->cappend = 0;
  int stop = sh->stop;
  uint64_t fence = sh->fence_req;
  unlock(s);
  for (size_t i = 0; i < npend; i++) {
    if (stop)
      record_discard(s, pend[i], 0);
    else
      adopt(sh, pend[i]);
  }
  free(pend);
  if (stop) {
    shard_stop(sh);
    return;
  }
  if (fence > sh->fence_seen) {
    sh->fence_seen = fence;
    sh->fence_stage = 1;
    uv_idle_start(&sh->fence_idle, on_fence_idle);
    uv_check_start(&sh->fence_check, on_fence_check);
  }
  flush_dirty(sh);
  lock(s);
  publish_stats(s);
  unlock(s);
}

static void* shard_main(void* arg) {
  shard_t* sh = arg;
  sigset_t all;
  sigfillset(&all); /* signals go to other threads; SIGPIPE stays pending */
  pthread_sigmask(SIG_BLOCK, &all, NULL);
#ifdef __linux__
  pthread_setname_np(pthread_self(), "tr_store");
#endif
  tls_shard = sh;
  uv_run(&sh->loop, UV_RUN_DEFAULT);
  /* records whose handle closed while a wake-up still listed them */
  lock(sh->srv);
  while (sh->dirty) {
    srv_client_t* cl = sh->dirty;
    sh->dirty = cl->dirty_next;
    if (cl->free_pending) free_client(cl);
  }
  unlock(sh->srv);
  return NULL;
}

/* ---- the acceptor thread ---- */

typedef struct {
  srv_client_t** v;
  size_t n, cap;
} cl_vec_t;

static int vec_push(cl_vec_t* q, srv_client_t* cl) {
  TR_CHECK(TR_GROW(q->v, q->n + 1, q->cap));
  q->v[q->n++] = cl;
  return 0;
}

/* A record for a socket just accepted; NULL when refused. */
static srv_client_t* record_new(tr_store_server_t* s, int fd,
                                const struct sockaddr_storage* addr,
                                time_t* refused_warned) {
  char peer[72];
  peer_name(addr, peer, sizeof peer);
  if (__atomic_load_n(&s->nconns, __ATOMIC_RELAXED) >= s->max_conns) {
    time_t now = time(NULL);
    if (now != *refused_warned) {
      *refused_warned = now;
      TR_LOG_WARN(STORE,
                  "refusing client %s: %" PRId64
                  " clients connected "
                  "(TRAINRUN_STORE_MAX_CONNECTIONS)",
                  peer, __atomic_load_n(&s->nconns, __ATOMIC_RELAXED));
    }
    __atomic_add_fetch(&s->st_errors, 1, __ATOMIC_RELAXED);
    close(fd);
    return NULL;
  }
  srv_client_t* cl = calloc(1, sizeof *cl);
  if (!cl) {
    close(fd);
    return NULL;
  }
  cl->fd = fd;
  lock(s);
  tr__store_conn_init(&cl->conn, &s->db, peer); /* conn.user NULL: no loop */
  unlock(s);
  __atomic_add_fetch(&s->nconns, 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&s->st_accepted, 1, __ATOMIC_RELAXED);
  TR_LOG_DEBUG(STORE, "client %s connected", peer);
  return cl;
}

/* Execute, in accept order, what the new client already sent, before any
 * loop reads it: clients accepted in the same batch are ordered as the
 * kernel queued them. 0, or -1 when the record was discarded. */
static int preread(tr_store_server_t* s, srv_client_t* cl, uint8_t* buf) {
  for (;;) {
    ssize_t r = read(cl->fd, buf, READ_BUF);
    if (r > 0) {
      lock(s);
      int rc = tr__store_conn_input(&cl->conn, buf, (size_t)r);
      int paused = cl->conn.paused;
      publish_stats(s);
      unlock(s);
      if (rc < 0) {
        record_discard(s, cl, 1);
        return -1;
      }
      if (paused || (size_t)r < READ_BUF) return 0;
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (r == 0) {
      /* a client that sent and closed: it gets its replies (a half-closed
       * one may read them) and is dropped */
      if (cl->conn.in.len)
        TR_LOG_INFO(STORE,
                    "client %s closed in the middle of a request "
                    "(%zu bytes of it received)",
                    cl->conn.peer, cl->conn.in.len);
      else
        TR_LOG_DEBUG(STORE, "client %s disconnected", cl->conn.peer);
      if (cl->conn.out.len) {
        ssize_t w =
            send(cl->fd, cl->conn.out.buf, cl->conn.out.len, MSG_NOSIGNAL);
        (void)w;
      }
    } else {
      TR_LOG_INFO(STORE, "closing client %s: read failed: %s", cl->conn.peer,
                  strerror(errno));
    }
    record_discard(s, cl, 0);
    return -1;
  }
}

/* Hand the batch to the shards, round-robin; with several shards, first
 * execute what each client already sent, in accept order. */
static void release(tr_store_server_t* s, cl_vec_t* q, int* next,
                    uint8_t* buf) {
  uint64_t woke = 0;
  if (s->nshards > 1)
    for (size_t i = 0; i < q->n; i++)
      if (preread(s, q->v[i], buf) < 0) q->v[i] = NULL;
  lock(s);
  for (size_t i = 0; i < q->n; i++) {
    srv_client_t* cl = q->v[i];
    if (!cl) continue;
    shard_t* sh = &s->shards[*next];
    if (TR_GROW(sh->pend, sh->npend + 1, sh->cappend) < 0) {
      unlock(s);
      record_discard(s, cl, 0);
      lock(s);
      continue;
    }
    sh->pend[sh->npend++] = cl;
    woke |= 1ull << *next;
    *next = (*next + 1) % s->nshards;
  }
  unlock(s);
  q->n = 0;
  for (int i = 0; i < s->nshards; i++)
    if (woke & (1ull << i)) uv_async_send(&s->shards[i].async);
}

static void post_fence(tr_store_server_t* s, uint64_t seq) {
  lock(s);
  for (int i = 0; i < s->nshards; i++) s->shards[i].fence_req = seq;
  unlock(s);
  for (int i = 0; i < s->nshards; i++) uv_async_send(&s->shards[i].async);
}

static int fence_done(tr_store_server_t* s, uint64_t seq) {
  for (int i = 0; i < s->nshards; i++)
    if (__atomic_load_n(&s->shards[i].fence_acked, __ATOMIC_ACQUIRE) < seq)
      return 0;
  return 1;
}

/* Accept from every listener until each is empty or gave ACCEPT_BATCH;
 * 1 when a failure other than "empty" asks for a back-off. */
static int accept_sweep(tr_store_server_t* s, cl_vec_t* q, time_t* warned,
                        time_t* refused_warned) {
  int backoff = 0;
  for (int l = 0; l < s->nlfds; l++) {
    for (int k = 0; k < ACCEPT_BATCH; k++) {
      struct sockaddr_storage addr;
      socklen_t len = sizeof addr;
      int fd = accept4(s->lfds[l], (struct sockaddr*)&addr, &len,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          /* EMFILE, ENFILE, ENOBUFS: say so once a second and back off */
          time_t now = time(NULL);
          if (now != *warned) {
            *warned = now;
            TR_LOG_WARN(STORE, "cannot accept a client: %s", strerror(errno));
          }
          backoff = 1;
        }
        break;
      }
      srv_client_t* cl = record_new(s, fd, &addr, refused_warned);
      if (cl && vec_push(q, cl) < 0) record_discard(s, cl, 0);
    }
  }
  return backoff;
}

/* The acceptor: accepts into a batch; with several shards, a batch is
 * released only once every shard completed a fence posted after the
 * batch's last accept, and the next batch gathers meanwhile (so a burst
 * costs one fence per round trip to the shards, not one per client). */
static void* acceptor_main(void* arg) {
  tr_store_server_t* s = arg;
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, NULL);
#ifdef __linux__
  pthread_setname_np(pthread_self(), "tr_store_acc");
#endif
  uint8_t* buf = s->acc_buf;
  cl_vec_t fenced = {0}, gathering = {0};
  uint64_t seq = 0;
  int next = 0, in_flight = 0;
  time_t warned = 0, refused_warned = 0;
  struct pollfd p[MAX_LISTENERS + 2];
  for (;;) {
    int np = 0;
    for (int l = 0; l < s->nlfds; l++)
      p[np++] = (struct pollfd){s->lfds[l], POLLIN, 0};
    p[np++] = (struct pollfd){s->wake[0], POLLIN, 0};
    p[np++] = (struct pollfd){s->ack[0], POLLIN, 0};
    if (poll(p, (nfds_t)np, -1) < 0) {
      if (errno == EINTR) continue;
      TR_LOG_ERROR(STORE, "store acceptor: poll: %s", strerror(errno));
      break;
    }
    if (p[s->nlfds].revents) break;
    if (p[s->nlfds + 1].revents) {
      char drain[64];
      while (read(s->ack[0], drain, sizeof drain) > 0) {
      }
    }
    if (in_flight && fence_done(s, seq)) {
      in_flight = 0;
      release(s, &fenced, &next, buf);
    }
    int backoff = accept_sweep(s, &gathering, &warned, &refused_warned);
    if (!in_flight && gathering.n) {
      if (s->nshards == 1) {
        release(s, &gathering, &next, buf);
      } else {
        cl_vec_t t = fenced;
        fenced = gathering;
        gathering = t;
        post_fence(s, ++seq);
        in_flight = 1;
      }
    }
    if (backoff) {
      struct timespec ts = {0, 10 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
  }
  for (size_t i = 0; i < fenced.n; i++) record_discard(s, fenced.v[i], 0);
  for (size_t i = 0; i < gathering.n; i++) record_discard(s, gathering.v[i], 0);
  free(fenced.v);
  free(gathering.v);
  return NULL;
}
/* ---- start / stop ---- */

int tr__store_somaxconn(void) {
  FILE* f = fopen("/proc/sys/net/core/somaxconn", "r");
  int v = 0;
  if (f) {
    if (fscanf(f, "%d", &v) != 1) v = 0;
    fclose(f);
  }
  return v > 0 ? v : 4096;
}

static void raise_nofile(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max) return;
  rlim_t old = rl.rlim_cur;
  rl.rlim_cur = rl.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
    TR_LOG_DEBUG(STORE, "raised the open-file limit from %llu to %llu",
                 (unsigned long long)old, (unsigned long long)rl.rlim_max);
}

/* A non-blocking listening socket on one address, in a SO_REUSEPORT group
 * when reuseport; -errno on failure. */
static int listen_on(const struct sockaddr* sa, socklen_t len, int backlog,
                     int reuseport) {
  int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
#ifdef SO_REUSEPORT
  if (reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof on)) {
    int e = errno;
    close(fd);
    return -e;
  }
#else
  if (reuseport) {
    close(fd);
    return TR_ENOTSUP;
  }
#endif
  if (bind(fd, sa, len) < 0 || listen(fd, backlog) < 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  return fd;
}

/* Listen on host:port: numeric addresses directly, names through
 * getaddrinfo (their first address that binds). The fd, or -errno. */
static int bind_listener(const char* host, int port, int backlog,
                         int reuseport) {
  struct sockaddr_in a4;
  struct sockaddr_in6 a6;
  if (uv_ip4_addr(host, port, &a4) == 0)
    return listen_on((struct sockaddr*)&a4, sizeof a4, backlog, reuseport);
  if (uv_ip6_addr(host, port, &a6) == 0)
    return listen_on((struct sockaddr*)&a6, sizeof a6, backlog, reuseport);
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", port);
  int grc = getaddrinfo(host, portstr, &hints, &res);
  if (grc != 0) {
    TR_LOG_ERROR(STORE, "cannot resolve store bind address '%s': %s", host,
                 gai_strerror(grc));
    return TR_EINVAL;
  }
  int fd = TR_EINVAL;
  for (struct addrinfo* ai = res; ai; ai = ai->ai_next) {
    fd = listen_on(ai->ai_addr, ai->ai_addrlen, backlog, reuseport);
    if (fd >= 0) break;
  }
  freeaddrinfo(res);
  return fd;
}

void tr_store_server_opts_init(tr_store_server_opts_t* o) {
  memset(o, 0, sizeof *o);
  tr__store_limits_t lim;
  tr__store_limits_from_params(&lim);
  o->max_key_bytes = (int64_t)lim.max_key;
  o->max_value_bytes = (int64_t)lim.max_value;
  o->max_request_bytes = (int64_t)lim.max_request;
  o->max_keys = (int64_t)lim.max_keys;
  o->max_memory_bytes = (int64_t)lim.max_memory;
  o->max_connections = tr_param_int(TR_PARAM_STORE_MAX_CONNS);
  o->threads = (int)tr_param_int(TR_PARAM_STORE_THREADS);     /* 0: auto */
  o->listeners = (int)tr_param_int(TR_PARAM_STORE_LISTENERS); /* 0: auto */
}

/* A quarter of the CPUs, 1 to 4: the store shares its host with the
 * daemon's workers, and past 4 the one lock over the table is the limit. */
int tr__store_default_threads(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  n /= 4;
  if (n < 1) n = 1;
  return n < 4 ? (int)n : 4;
}

/* Accept queues for expected clients with a backlog each: enough that a
 * burst of them all fits, at most MAX_LISTENERS. */
int tr__store_default_listeners(int expected, int backlog) {
  if (expected <= 0 || backlog <= 0) return 1;
  int64_t k = ((int64_t)expected + backlog - 1) / backlog;
  if (k < 1) k = 1;
  return k > MAX_LISTENERS ? MAX_LISTENERS : (int)k;
}

/* Claim host:port for this process's SO_REUSEPORT group: an abstract unix
 * socket of that name binds once per network namespace, so a second
 * trainrun server (same user: the kernel would let its sockets join the
 * group) gets EADDRINUSE as it would without SO_REUSEPORT. The fd or -errno. */
static int claim_endpoint(const struct sockaddr_storage* ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port;
  if (ss->ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &((const struct sockaddr_in6*)ss)->sin6_addr, host,
              sizeof host);
    port = ntohs(((const struct sockaddr_in6*)ss)->sin6_port);
  } else {
    inet_ntop(AF_INET, &((const struct sockaddr_in*)ss)->sin_addr, host,
              sizeof host);
    port = ntohs(((const struct sockaddr_in*)ss)->sin_port);
  }
  struct sockaddr_un un;
  memset(&un, 0, sizeof un);
  un.sun_family = AF_UNIX;
  int n = snprintf(un.sun_path + 1, sizeof un.sun_path - 1,
                   "trainrun-store/%s/%d", host, port);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  if (bind(fd, (struct sockaddr*)&un,
           (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)) < 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  return fd;
}

/* Listen on K sockets of one SO_REUSEPORT group at host:port (the first
 * bound picks the port when it is 0), or one plain socket when k is 1 or
 * the group cannot be made. 0 or a negative TR_E*. */
static int listen_all(tr_store_server_t* s, const char* host, int port,
                      int backlog, int k) {
  int rc = bind_listener(host, port, backlog, k > 1);
  if (k > 1 && rc < 0 && rc != TR_EADDRINUSE && rc != TR_EINVAL) {
    TR_LOG_WARN(STORE,
                "cannot listen on %d SO_REUSEPORT sockets at '%s' port %d: "
                "%s; using one accept queue",
                k, host, port, tr_strerror(rc));
    k = 1;
    rc = bind_listener(host, port, backlog, 0);
  }
  if (rc < 0) return rc;
  s->lfds[0] = rc;
  s->nlfds = 1;
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  getsockname(rc, (struct sockaddr*)&ss, &len);
  if (k > 1) {
    rc = claim_endpoint(&ss);
    if (rc < 0) {
      if (rc == TR_EADDRINUSE) return rc; /* another server's group */
      TR_LOG_WARN(STORE,
                  "cannot claim '%s' port %d for SO_REUSEPORT sockets: %s; "
                  "using one accept queue",
                  host, port, tr_strerror(rc));
      k = 1;
    } else {
      s->lockfd = rc;
    }
  }
  for (int i = 1; i < k; i++) {
    rc = listen_on((struct sockaddr*)&ss, len, backlog, 1);
    if (rc < 0) {
      TR_LOG_WARN(STORE,
                  "cannot listen on %d SO_REUSEPORT sockets at '%s' port "
                  "%d: %s; using %d accept queue(s)",
                  k, host, port, tr_strerror(rc), s->nlfds);
      break;
    }
    s->lfds[s->nlfds++] = rc;
  }
  return 0;
}

/* Tear down what start built (threads not started, or joined). */
static void server_free(tr_store_server_t* s) {
  for (int i = 0; i < s->nshards; i++) {
    shard_t* sh = &s->shards[i];
    if (!sh->srv) continue;
    uv_handle_t* hs[3] = {(uv_handle_t*)&sh->async,
                          (uv_handle_t*)&sh->fence_idle,
                          (uv_handle_t*)&sh->fence_check};
    for (int j = 0; j < 3; j++)
      if (!uv_is_closing(hs[j])) uv_close(hs[j], NULL);
    while (uv_loop_close(&sh->loop) == UV_EBUSY)
      uv_run(&sh->loop, UV_RUN_NOWAIT);
    for (size_t j = 0; j < sh->npend; j++) record_discard(s, sh->pend[j], 0);
    free(sh->pend);
    free(sh->batch);
  }
  free(s->shards);
  for (int i = 0; i < s->nlfds; i++) close(s->lfds[i]);
  if (s->lockfd >= 0) close(s->lockfd);
  int* fds[4] = {&s->wake[0], &s->wake[1], &s->ack[0], &s->ack[1]};
  for (int i = 0; i < 4; i++)
    if (*fds[i] >= 0) close(*fds[i]);
  free(s->acc_buf);
  tr__store_db_release(&s->db);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

int tr_store_server_start(const tr_store_server_opts_t* o,
                          tr_store_server_t** out) {
  *out = NULL;
  if (o->port < 0 || o->port > 65535) return TR_EINVAL;
  if (o->max_key_bytes <= 0 || o->max_value_bytes <= 0 ||
      o->max_request_bytes <= 0 || o->max_keys <= 0 ||
      o->max_memory_bytes <= 0 || o->max_connections <= 0 || o->threads < 0 ||
      o->threads > MAX_SHARDS || o->listeners < 0 ||
      o->listeners > MAX_LISTENERS)
    return TR_EINVAL;
  raise_nofile();
  tr_store_server_t* s = calloc(1, sizeof *s);
  if (!s) return TR_ENOMEM;
  s->lockfd = s->wake[0] = s->wake[1] = s->ack[0] = s->ack[1] = -1;
  pthread_mutex_init(&s->mu, NULL);
  tr__store_limits_t lim = {(uint64_t)o->max_key_bytes,
                            (uint64_t)o->max_value_bytes, (uint64_t)o->max_keys,
                            (uint64_t)o->max_request_bytes,
                            (uint64_t)o->max_memory_bytes};
  int rc = tr__store_db_init(&s->db, &lim, o->token);
  if (rc < 0) {
    pthread_mutex_destroy(&s->mu);
    free(s);
    return rc;
  }
  s->db.notify = on_output;
  s->db.notify_arg = s;
  s->max_conns = o->max_connections;
  s->nshards = o->threads > 0 ? o->threads : tr__store_default_threads();
  s->shards = calloc((size_t)s->nshards, sizeof *s->shards);
  s->acc_buf = malloc(READ_BUF);
  if (!s->shards || !s->acc_buf) {
    rc = TR_ENOMEM;
    goto fail;
  }
  if (pipe2(s->wake, O_CLOEXEC) < 0 ||
      pipe2(s->ack, O_CLOEXEC | O_NONBLOCK) < 0) {
    rc = -errno;
    goto fail;
  }
  for (int i = 0; i < s->nshards; i++) {
    shard_t* sh = &s->shards[i];
    rc = uv_loop_init(&sh->loop);
    if (rc < 0) goto fail;
    sh->srv = s;
    sh->refused_logged_at = -1000000;
    uv_async_init(&sh->loop, &sh->async, on_async);
    sh->async.data = sh;
    uv_idle_init(&sh->loop, &sh->fence_idle);
    uv_check_init(&sh->loop, &sh->fence_check);
    sh->fence_check.data = sh;
  }

  const char* host = o->host && *o->host ? o->host : "127.0.0.1";
  int somax = tr__store_somaxconn();
  int backlog = o->backlog > 0 ? o->backlog : somax;
  int k = o->listeners > 0
              ? o->listeners
              : tr__store_default_listeners(o->expected_clients, backlog);
  rc = listen_all(s, host, o->port, backlog, k);
  if (rc < 0) {
    /* an endpoint already taken is a normal outcome for daemons racing to
     * host the store (the loser joins it); the caller reports it */
    if (rc == TR_EADDRINUSE)
      TR_LOG_DEBUG(STORE, "cannot listen on '%s' port %d: %s", host, o->port,
                   tr_strerror(rc));
    else if (rc != TR_EINVAL)
      TR_LOG_ERROR(STORE, "cannot listen on '%s' port %d: %s", host, o->port,
                   tr_strerror(rc));
    goto fail;
  }
  if (o->expected_clients > (int64_t)backlog * s->nlfds)
    TR_LOG_WARN(STORE,
                "listen backlog %d x %d accept queue(s) is below the %d "
                "expected clients: raise net.core.somaxconn, or clients may "
                "be reset at connect (they retry)",
                backlog, s->nlfds, o->expected_clients);
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  getsockname(s->lfds[0], (struct sockaddr*)&ss, &len);
  if (ss.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &((struct sockaddr_in6*)&ss)->sin6_addr, s->host,
              sizeof s->host);
    s->port = ntohs(((struct sockaddr_in6*)&ss)->sin6_port);
  } else {
    inet_ntop(AF_INET, &((struct sockaddr_in*)&ss)->sin_addr, s->host,
              sizeof s->host);
    s->port = ntohs(((struct sockaddr_in*)&ss)->sin_port);
  }
  for (int i = 0; i < s->nshards; i++) {
    rc = pthread_create(&s->shards[i].thread, NULL, shard_main, &s->shards[i]);
    if (rc != 0) {
      rc = -rc;
      tr_store_server_stop(s);
      return rc;
    }
    s->shards[i].thread_started = 1;
  }
  rc = pthread_create(&s->acceptor, NULL, acceptor_main, s);
  if (rc != 0) {
    rc = -rc;
    tr_store_server_stop(s);
    return rc;
  }
  s->acceptor_started = 1;
  TR_LOG_INFO(STORE,
              "store server listening on %s port %d (%d I/O threads, %d "
              "accept queue(s))%s",
              s->host, s->port, s->nshards, s->nlfds,
              s->db.token ? " (token required)" : "");
  *out = s;
  return 0;

fail:
  server_free(s);
  return rc;
}

int tr_store_server_port(const tr_store_server_t* s) { return s->port; }

const char* tr_store_server_host(const tr_store_server_t* s) { return s->host; }

void tr_store_server_stats(const tr_store_server_t* s,
                           tr_store_server_stats_t* st) {
  st->connections = __atomic_load_n(&s->st_conns, __ATOMIC_RELAXED);
  st->accepted = __atomic_load_n(&s->st_accepted, __ATOMIC_RELAXED);
  st->closed_errors = __atomic_load_n(&s->st_errors, __ATOMIC_RELAXED);
  st->keys = __atomic_load_n(&s->st_keys, __ATOMIC_RELAXED);
  st->bytes = __atomic_load_n(&s->st_bytes, __ATOMIC_RELAXED);
  st->requests = __atomic_load_n(&s->st_requests, __ATOMIC_RELAXED);
}

void tr_store_server_stop(tr_store_server_t* s) {
  if (!s) return;
  if (s->acceptor_started) {
    char b = 1;
    while (write(s->wake[1], &b, 1) < 0 && errno == EINTR) {
    }
    pthread_join(s->acceptor, NULL);
  }
  /* the listeners close first: new connections are refused from here on */
  for (int i = 0; i < s->nlfds; i++) close(s->lfds[i]);
  s->nlfds = 0;
  for (int i = 0; i < s->nshards; i++) {
    shard_t* sh = &s->shards[i];
    if (!sh->thread_started) continue;
    lock(s);
    sh->stop = 1;
    uv_async_send(&sh->async);
    unlock(s);
    pthread_join(sh->thread, NULL);
  }
  server_free(s);
}
