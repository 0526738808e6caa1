/* store/server.c: the TCPStore server -- a libuv loop on its own thread that
 * accepts clients, feeds what they send to their request engines (conn.c)
 * and writes the replies back.
 *
 * All server state belongs to the loop thread; the only cross-thread calls
 * are tr_store_server_stop (through a uv_async) and tr_store_server_stats
 * (atomic counters). Replies are gathered per client while a read is
 * processed -- including the STOP_WAITING bytes a SET sends to the clients
 * waiting on its key -- and written once per client at the end, with
 * uv_try_write first and a queued uv_write for what the socket did not take.
 * A client whose replies pile up past TR__STORE_OUT_HIGH is not read until
 * they drain. A client that breaks a rule is closed alone; handles are freed
 * only in their close callbacks.
 */
#include "config.h"

#include <arpa/inet.h> /* inet_ntop */
#include <inttypes.h>
#include <netdb.h> /* getaddrinfo for host names */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h> /* RLIMIT_NOFILE */
#include <uv.h>

#include "store/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/param.h"
#include "trainrun/store.h"

#define READ_BUF (64u << 10)
#define OUT_KEEP (64u << 10) /* output buffer kept between replies */

typedef struct srv_client_s {
  uv_tcp_t tcp; /* first: the handle's address is the record's */
  tr_store_server_t* srv;
  tr__store_conn_t conn;
  uv_write_t wreq;
  tr__buf_t inflight; /* bytes handed to uv_write */
  int writing;
  int closing;
  int reading;
  int draining; /* inside drain(): flush must not re-enter it */
  int dirty;
  struct srv_client_s* dirty_next;
  struct srv_client_s* prev;
  struct srv_client_s* next;
} srv_client_t;

struct tr_store_server_s {
  uv_loop_t loop;
  uv_tcp_t listener;
  uv_async_t stop_async;
  pthread_t thread;
  int thread_started;
  tr__store_db_t db;
  char host[INET6_ADDRSTRLEN];
  int port;
  int64_t max_conns;
  srv_client_t* clients; /* every open client */
  srv_client_t* dirty;   /* clients with replies to write */
  int64_t nconns;
  int64_t refused_logged_at; /* uv_now of the last "refused" warning */
  /* counters read by tr_store_server_stats from any thread */
  int64_t st_conns, st_accepted, st_errors, st_keys, st_bytes, st_requests;
  uint8_t rbuf[READ_BUF];
};

static void publish_stats(tr_store_server_t* s) {
  __atomic_store_n(&s->st_conns, s->nconns, __ATOMIC_RELAXED);
  __atomic_store_n(&s->st_keys, s->db.nkeys, __ATOMIC_RELAXED);
  __atomic_store_n(&s->st_bytes, s->db.bytes, __ATOMIC_RELAXED);
  __atomic_store_n(&s->st_requests, s->db.requests, __ATOMIC_RELAXED);
}

/* ---- closing ---- */

static void on_client_closed(uv_handle_t* h) {
  srv_client_t* cl = (srv_client_t*)h;
  tr__buf_release(&cl->inflight);
  free(cl);
}

static void client_close(srv_client_t* cl, int error) {
  if (cl->closing) return;
  tr_store_server_t* s = cl->srv;
  cl->closing = 1;
  if (error) {
    __atomic_add_fetch(&s->st_errors, 1, __ATOMIC_RELAXED);
    /* Best effort: replies to requests before the bad one (and the byte
     * that says why, for a refused token) still go out. */
    if (!cl->writing && cl->conn.out.len) {
      uv_buf_t b =
          uv_buf_init((char*)cl->conn.out.data, (unsigned)cl->conn.out.len);
      (void)uv_try_write((uv_stream_t*)&cl->tcp, &b, 1);
    }
  }
  tr__store_conn_release(&cl->conn); /* drops its WAIT first */
  if (cl->prev)
    cl->prev->next = cl->next;
  else
    s->clients = cl->next;
  if (cl->next) cl->next->prev = cl->prev;
  s->nconns--;
  uv_close((uv_handle_t*)&cl->tcp, on_client_closed);
}

/* ---- writing ---- */

static void flush(srv_client_t* cl);
static void read_start(srv_client_t* cl);

/* A paused client (replies over the high mark) whose replies have all been
 * handed to the kernel: parse what it sent meanwhile, flush, and repeat
 * while each round drains at once; read again once no longer paused. Runs
 * after a completed uv_write and after a uv_try_write that took everything
 * (that path has no write callback, so without this the client would stay
 * paused forever). */
static void drain(srv_client_t* cl) {
  if (cl->draining) return;
  cl->draining = 1;
  tr_store_server_t* s = cl->srv;
  while (!cl->closing && !cl->writing && cl->conn.out.len == 0 &&
         cl->conn.paused) {
    int rc = tr__store_conn_resume(&cl->conn);
    if (rc < 0) {
      client_close(cl, 1);
      break;
    }
    flush(cl);
    while (s->dirty) { /* replies to clients this resume woke */
      srv_client_t* d = s->dirty;
      s->dirty = d->dirty_next;
      d->dirty = 0;
      flush(d);
    }
  }
  cl->draining = 0;
  if (!cl->closing && !cl->conn.paused && !cl->reading) read_start(cl);
}

static void on_write(uv_write_t* req, int status) {
  srv_client_t* cl = req->data;
  cl->writing = 0;
  cl->inflight.len = 0;
  tr__buf_shrink(&cl->inflight, OUT_KEEP);
  if (cl->closing) return;
  if (status < 0) {
    TR_LOG_INFO(STORE, "closing client %s: write failed: %s", cl->conn.peer,
                uv_strerror(status));
    client_close(cl, 0);
    return;
  }
  flush(cl);
  if (cl->conn.paused) drain(cl);
  publish_stats(cl->srv);
}

static void flush(srv_client_t* cl) {
  tr__buf_t* out = &cl->conn.out;
  if (cl->closing || cl->writing || out->len == 0) return;
  uv_buf_t b = uv_buf_init((char*)out->data, (unsigned)out->len);
  int n = uv_try_write((uv_stream_t*)&cl->tcp, &b, 1);
  if (n == (int)out->len) {
    out->len = 0;
    tr__buf_shrink(out, OUT_KEEP);
    if (cl->conn.paused) drain(cl);
    return;
  }
  if (n < 0 && n != UV_EAGAIN) {
    TR_LOG_INFO(STORE, "closing client %s: write failed: %s", cl->conn.peer,
                uv_strerror(n));
    client_close(cl, 0);
    return;
  }
  if (n < 0) n = 0;
  /* hand the rest to uv_write; new replies gather in the other buffer */
  tr__buf_t tmp = cl->inflight;
  cl->inflight = *out;
  *out = tmp;
  out->len = 0;
  b = uv_buf_init((char*)cl->inflight.data + n,
                  (unsigned)(cl->inflight.len - (size_t)n));
  cl->wreq.data = cl;
  int rc = uv_write(&cl->wreq, (uv_stream_t*)&cl->tcp, &b, 1, on_write);
  if (rc < 0) {
    cl->inflight.len = 0;
    TR_LOG_INFO(STORE, "closing client %s: write failed: %s", cl->conn.peer,
                uv_strerror(rc));
    client_close(cl, 0);
    return;
  }
  cl->writing = 1;
}

/* db.c tells us a connection has replies (its own, or a wake-up). */
static void on_output(tr__store_conn_t* c, void* arg) {
  tr_store_server_t* s = arg;
  srv_client_t* cl = c->user;
  if (!cl || cl->dirty || cl->closing) return;
  cl->dirty = 1;
  cl->dirty_next = s->dirty;
  s->dirty = cl;
}

static void flush_dirty(tr_store_server_t* s) {
  while (s->dirty) {
    srv_client_t* cl = s->dirty;
    s->dirty = cl->dirty_next;
    cl->dirty = 0;
    flush(cl);
  }
}

/* ---- reading ---- */

static void on_alloc(uv_handle_t* h, size_t suggested, uv_buf_t* buf) {
  srv_client_t* cl = (srv_client_t*)h;
  size_t room;
  uint8_t* p = tr__store_conn_read_room(&cl->conn, &room);
  if (p) {
    if (room > UINT32_MAX) room = UINT32_MAX;
    *buf = uv_buf_init((char*)p, (unsigned)room);
    return;
  }
  *buf = uv_buf_init((char*)cl->srv->rbuf, READ_BUF);
}

static void on_read(uv_stream_t* st, ssize_t nread, const uv_buf_t* buf) {
  srv_client_t* cl = (srv_client_t*)st;
  tr_store_server_t* s = cl->srv;
  if (cl->closing) return;
  if (nread < 0) {
    if (nread == UV_EOF) {
      if (cl->conn.in.len)
        TR_LOG_INFO(STORE,
                    "client %s closed in the middle of a request "
                    "(%zu bytes of it received)",
                    cl->conn.peer, cl->conn.in.len);
      else
        TR_LOG_DEBUG(STORE, "client %s disconnected", cl->conn.peer);
    } else {
      TR_LOG_INFO(STORE, "closing client %s: read failed: %s", cl->conn.peer,
                  uv_strerror((int)nread));
    }
    client_close(cl, 0);
    flush_dirty(s);
    publish_stats(s);
    return;
  }
  if (nread == 0) return;
  int rc;
  if (buf->base == (char*)s->rbuf)
    rc = tr__store_conn_input(&cl->conn, s->rbuf, (size_t)nread);
  else
    rc = tr__store_conn_input_inplace(&cl->conn, (size_t)nread);
  if (rc < 0) {
    client_close(cl, 1);
  } else if (cl->conn.paused && cl->reading) {
    uv_read_stop(st);
    cl->reading = 0;
  }
  flush_dirty(s);
  publish_stats(s);
}

/* Also called from on_write when a paused client drained. */
static void read_start(srv_client_t* cl) {
  int rc = uv_read_start((uv_stream_t*)&cl->tcp, on_alloc, on_read);
  if (rc < 0) {
    TR_LOG_INFO(STORE, "closing client %s: %s", cl->conn.peer, uv_strerror(rc));
    client_close(cl, 0);
    return;
  }
  cl->reading = 1;
}

/* ---- accepting ---- */

static void peer_name(uv_tcp_t* t, char* out, size_t n) {
  struct sockaddr_storage ss;
  int len = sizeof ss;
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (uv_tcp_getpeername(t, (struct sockaddr*)&ss, &len) == 0) {
    if (ss.ss_family == AF_INET6) {
      struct sockaddr_in6* a = (struct sockaddr_in6*)&ss;
      uv_ip6_name(a, host, sizeof host);
      port = ntohs(a->sin6_port);
      snprintf(out, n, "[%s]:%d", host, port);
      return;
    }
    struct sockaddr_in* a = (struct sockaddr_in*)&ss;
    uv_ip4_name(a, host, sizeof host);
    port = ntohs(a->sin_port);
  }
  snprintf(out, n, "%s:%d", host, port);
}

static void on_refused_closed(uv_handle_t* h) { free(h); }

static void on_connection(uv_stream_t* listener, int status) {
  tr_store_server_t* s = listener->data;
  if (status < 0) {
    /* EMFILE and friends: libuv keeps the listener; say it once a second */
    uint64_t now = uv_now(&s->loop);
    if ((int64_t)now - s->refused_logged_at >= 1000) {
      s->refused_logged_at = (int64_t)now;
      TR_LOG_WARN(STORE, "cannot accept a client: %s", uv_strerror(status));
    }
    return;
  }
  srv_client_t* cl = calloc(1, sizeof *cl);
  if (!cl) {
    uv_tcp_t* t = malloc(sizeof *t);
    if (t && uv_tcp_init(&s->loop, t) == 0 &&
        uv_accept(listener, (uv_stream_t*)t) == 0)
      uv_close((uv_handle_t*)t, on_refused_closed);
    else
      free(t);
    return;
  }
  uv_tcp_init(&s->loop, &cl->tcp);
  cl->srv = s;
  if (uv_accept(listener, (uv_stream_t*)&cl->tcp) < 0) {
    uv_close((uv_handle_t*)&cl->tcp, on_client_closed);
    return;
  }
  char peer[72];
  peer_name(&cl->tcp, peer, sizeof peer);
  if (s->nconns >= s->max_conns) {
    uint64_t now = uv_now(&s->loop);
    if ((int64_t)now - s->refused_logged_at >= 1000) {
      s->refused_logged_at = (int64_t)now;
      TR_LOG_WARN(STORE,
                  "refusing client %s: %" PRId64
                  " clients connected "
                  "(TRAINRUN_STORE_MAX_CONNECTIONS)",
                  peer, s->nconns);
    }
    __atomic_add_fetch(&s->st_errors, 1, __ATOMIC_RELAXED);
    uv_close((uv_handle_t*)&cl->tcp, on_client_closed);
    return;
  }
  uv_tcp_nodelay(&cl->tcp, 1);
  tr__store_conn_init(&cl->conn, &s->db, peer);
  cl->conn.user = cl;
  cl->next = s->clients;
  if (s->clients) s->clients->prev = cl;
  s->clients = cl;
  s->nconns++;
  __atomic_add_fetch(&s->st_accepted, 1, __ATOMIC_RELAXED);
  TR_LOG_DEBUG(STORE, "client %s connected", peer);
  read_start(cl);
  publish_stats(s);
}

/* ---- start / stop ---- */

static void on_stop(uv_async_t* a) {
  tr_store_server_t* s = a->data;
  while (s->clients) client_close(s->clients, 0);
  s->dirty = NULL;
  uv_close((uv_handle_t*)&s->listener, NULL);
  uv_close((uv_handle_t*)&s->stop_async, NULL);
  publish_stats(s);
}

static void* server_main(void* arg) {
  tr_store_server_t* s = arg;
  sigset_t all;
  sigfillset(&all); /* signals go to other threads; SIGPIPE stays pending */
  pthread_sigmask(SIG_BLOCK, &all, NULL);
#ifdef __linux__
  pthread_setname_np(pthread_self(), "tr_store");
#endif
  uv_run(&s->loop, UV_RUN_DEFAULT);
  return NULL;
}

static int read_somaxconn(void) {
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

/* Bind the listener to host:port: numeric addresses directly, names through
 * getaddrinfo (their first address). */
static int bind_listener(tr_store_server_t* s, const char* host, int port,
                         int backlog) {
  struct sockaddr_storage ss;
  int rc = uv_ip4_addr(host, port, (struct sockaddr_in*)&ss);
  if (rc < 0) rc = uv_ip6_addr(host, port, (struct sockaddr_in6*)&ss);
  if (rc == 0) {
    rc = uv_tcp_bind(&s->listener, (struct sockaddr*)&ss, 0);
    if (rc == 0)
      rc = uv_listen((uv_stream_t*)&s->listener, backlog, on_connection);
    return rc;
  }
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
    return UV_EINVAL;
  }
  rc = uv_tcp_bind(&s->listener, res->ai_addr, 0);
  if (rc == 0)
    rc = uv_listen((uv_stream_t*)&s->listener, backlog, on_connection);
  freeaddrinfo(res);
  return rc;
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
}

/* uv error (negated errno on Unix) to a TR_E* code: the same numbers. */
static int uv_to_tr(int uvrc) { return uvrc; }

int tr_store_server_start(const tr_store_server_opts_t* o,
                          tr_store_server_t** out) {
  *out = NULL;
  if (o->port < 0 || o->port > 65535) return TR_EINVAL;
  if (o->max_key_bytes <= 0 || o->max_value_bytes <= 0 ||
      o->max_request_bytes <= 0 || o->max_keys <= 0 ||
      o->max_memory_bytes <= 0 || o->max_connections <= 0)
    return TR_EINVAL;
  raise_nofile();
  tr_store_server_t* s = calloc(1, sizeof *s);
  if (!s) return TR_ENOMEM;
  tr__store_limits_t lim = {(uint64_t)o->max_key_bytes,
                            (uint64_t)o->max_value_bytes, (uint64_t)o->max_keys,
                            (uint64_t)o->max_request_bytes,
                            (uint64_t)o->max_memory_bytes};
  int rc = tr__store_db_init(&s->db, &lim, o->token);
  if (rc < 0) {
    free(s);
    return rc;
  }
  s->db.notify = on_output;
  s->db.notify_arg = s;
  s->max_conns = o->max_connections;
  s->refused_logged_at = -1000000;
  rc = uv_loop_init(&s->loop);
  if (rc < 0) goto out_free_db;
  uv_tcp_init(&s->loop, &s->listener);
  s->listener.data = s;
  uv_async_init(&s->loop, &s->stop_async, on_stop);
  s->stop_async.data = s;

  const char* host = o->host && *o->host ? o->host : "127.0.0.1";
  int somax = read_somaxconn();
  int backlog = o->backlog > 0 ? o->backlog : somax;
  if (o->expected_clients > backlog)
    TR_LOG_WARN(STORE,
                "listen backlog %d is below the %d expected clients: "
                "raise net.core.somaxconn, or clients may be reset at "
                "connect (they retry)",
                backlog, o->expected_clients);
  rc = bind_listener(s, host, o->port, backlog);
  if (rc < 0) {
    /* an endpoint already taken is a normal outcome for daemons racing to
     * host the store (the loser joins it); the caller reports it */
    if (rc == UV_EADDRINUSE)
      TR_LOG_DEBUG(STORE, "cannot listen on '%s' port %d: %s", host, o->port,
                   uv_strerror(rc));
    else
      TR_LOG_ERROR(STORE, "cannot listen on '%s' port %d: %s", host, o->port,
                   uv_strerror(rc));
    goto out_close_loop;
  }
  struct sockaddr_storage ss;
  int len = sizeof ss;
  uv_tcp_getsockname(&s->listener, (struct sockaddr*)&ss, &len);
  if (ss.ss_family == AF_INET6) {
    uv_ip6_name((struct sockaddr_in6*)&ss, s->host, sizeof s->host);
    s->port = ntohs(((struct sockaddr_in6*)&ss)->sin6_port);
  } else {
    uv_ip4_name((struct sockaddr_in*)&ss, s->host, sizeof s->host);
    s->port = ntohs(((struct sockaddr_in*)&ss)->sin_port);
  }
  rc = pthread_create(&s->thread, NULL, server_main, s);
  if (rc != 0) {
    rc = -rc;
    goto out_close_loop;
  }
  s->thread_started = 1;
  TR_LOG_INFO(STORE, "store server listening on %s port %d%s", s->host, s->port,
              s->db.token ? " (token required)" : "");
  *out = s;
  return 0;

out_close_loop:
  uv_close((uv_handle_t*)&s->listener, NULL);
  uv_close((uv_handle_t*)&s->stop_async, NULL);
  uv_run(&s->loop, UV_RUN_DEFAULT);
  uv_loop_close(&s->loop);
out_free_db:
  tr__store_db_release(&s->db);
  free(s);
  return uv_to_tr(rc);
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
  if (s->thread_started) {
    uv_async_send(&s->stop_async);
    pthread_join(s->thread, NULL);
  }
  /* every handle is closed; uv_loop_close fails only while one is open */
  while (uv_loop_close(&s->loop) == UV_EBUSY) uv_run(&s->loop, UV_RUN_NOWAIT);
  tr__store_db_release(&s->db);
  free(s);
}
