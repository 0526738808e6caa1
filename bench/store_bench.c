/* bench/store_bench.c: load generator for TCPStore servers, on loopback.
 *
 *   store_bench [--clients 1024,4096|none] [--procs 4] [--threads 1]
 *               [--server-threads 1,4] [--null-threads N] [--repeat R]
 *               [--ops-clients 64] [--ops-seconds 2|0] [--python python3]
 *               [--no-pytorch] [--servers null,trainrun,pytorch]
 *               [--connect PORT] [--connect-window W] [--listeners K]
 *
 * (a) rendezvous: N clients each connect, VALIDATE, PING, ADD "init/" 1,
 *     and WAIT on a last key that the client whose ADD returned N sets --
 *     what every rank does when a job starts. The time is from the start
 *     signal to the last client's STOP_WAITING. --clients none skips it.
 * (b) operations: 64 clients in a closed loop of SET, GET, ADD (one request
 *     in flight per connection, like PyTorch's client) for a few seconds;
 *     --ops-seconds 0 skips it.
 *
 * Each load runs against: a null server (parses requests with the store's
 * parser and answers at once in the same framing, stores nothing: the
 * ceiling of this load generator and this machine), trainrun's server with
 * each of --server-threads I/O threads, and PyTorch's libuv server
 * (TCPStore(is_master=True, use_libuv=True) in a child python) when
 * `python -c "import torch"` works (--connect PORT: only a server already
 * listening on 127.0.0.1:PORT, e.g. to run it under perf). The null server runs --null-threads
 * epoll loops (default: the largest --server-threads), so it is a ceiling
 * for a multi-threaded server too. Every server runs in a process of its
 * own, started fresh for each run. Each cell is the median of --repeat runs.
 *
 * The load generators are --procs processes of --threads threads, each
 * thread an epoll loop over its own share of the clients (its own
 * connections); refused or reset connections (listen backlog overflow) are
 * retried after 100 ms +-50 %, x1.5 per retry, like trainrun's client. The
 * soft RLIMIT_NOFILE is raised to the hard limit here.
 *
 * Connects are paced: at most --connect-window W clients (over all the
 * generators; default 3/4 of somaxconn, so that even a one-queue server
 * never overflows its backlog) are connecting at once, a client counting
 * until its PING is answered -- so the rendezvous measures servers, not
 * SYNs the kernel dropped and TCP resent 1 s later. --connect-window 0:
 * every client at once (a burst; see the overflow column). trainrun's
 * server is told the clients to expect, as the daemon does, and picks its
 * accept queues (SO_REUSEPORT sockets) from them; the null server listens
 * on as many; --listeners K sets K for both.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "store/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/store.h"

#define MAX_KINDS 8
#define MAX_REPEAT 15

static int64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void raise_nofile(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

/* ---- servers, each in a child process ---- */

typedef struct {
  char label[24]; /* column name: "null(4t)", "trainrun(1t)", "pytorch" */
  char kind[12];  /* null, trainrun, pytorch, external */
  int threads;    /* null: epoll loops; trainrun: I/O threads; external:
                     its port */
} kind_t;

typedef struct {
  pid_t pid;
  int port;
  int stdin_fd;    /* pytorch: closing it stops the server */
  double base_cpu; /* CPU seconds used before the load started */
} server_t;

/* The null server: nthreads epoll loops sharing the listening socket
 * (EPOLLEXCLUSIVE: one loop is woken per connection, and accepts it into
 * its own epoll). Parses with the store parser, answers PING with the
 * nonce, ADD with a running count shared by the loops, WAIT/CHECK with 00,
 * GET with an empty value, nothing for SET. */
typedef struct {
  int fd;
  size_t n;
  uint8_t in[4096];
} nconn_t;

static int64_t null_counter;

#define NULL_MAX_LFDS 16
static int null_lfds[NULL_MAX_LFDS], null_nlfds;
static nconn_t null_listener[NULL_MAX_LFDS]; /* marks: .fd is the socket */

static void* null_loop(void* arg) {
  (void)arg;
  int ep = epoll_create1(0);
  for (int l = 0; l < null_nlfds; l++) {
    null_listener[l].fd = null_lfds[l];
    struct epoll_event ev = {.events = EPOLLIN | EPOLLEXCLUSIVE,
                             .data.ptr = &null_listener[l]};
    epoll_ctl(ep, EPOLL_CTL_ADD, null_lfds[l], &ev);
  }
  tr__store_limits_t lim;
  tr__store_limits_from_params(&lim);
  uint8_t* buf = malloc(1 << 16);
  struct epoll_event evs[256];
  for (;;) {
    int n = epoll_wait(ep, evs, 256, -1);
    for (int i = 0; i < n; i++) {
      nconn_t* nc = evs[i].data.ptr;
      if (nc >= null_listener && nc < null_listener + NULL_MAX_LFDS) {
        int c;
        while ((c = accept4(nc->fd, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
          int one = 1;
          setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          nconn_t* x = calloc(1, sizeof *x);
          x->fd = c;
          struct epoll_event e = {.events = EPOLLIN, .data.ptr = x};
          epoll_ctl(ep, EPOLL_CTL_ADD, c, &e);
        }
        continue;
      }
      ssize_t r = recv(nc->fd, nc->in + nc->n, sizeof nc->in - nc->n, 0);
      if (r <= 0) {
        if (r < 0 && errno == EAGAIN) continue;
        close(nc->fd);
        free(nc);
        continue;
      }
      nc->n += (size_t)r;
      size_t off = 0, out = 0;
      for (;;) {
        tr__store_parser_t ps;
        tr__store_parser_reset(&ps);
        tr__store_req_t rq;
        if (tr__store_parse(&ps, nc->in + off, nc->n - off, &lim, &rq) != 1)
          break;
        off += rq.len;
        switch (rq.cmd) {
          case TR__Q_PING:
            tr__wr_u32(buf + out, rq.u32);
            out += 4;
            break;
          case TR__Q_ADD:
            tr__wr_u64(buf + out, (uint64_t)__atomic_add_fetch(
                                      &null_counter, rq.i64, __ATOMIC_RELAXED));
            out += 8;
            break;
          case TR__Q_WAIT:
          case TR__Q_CHECK:
            buf[out++] = 0;
            break;
          case TR__Q_GET:
            memset(buf + out, 0, 8);
            out += 8;
            break;
          default:
            break;
        }
      }
      memmove(nc->in, nc->in + off, nc->n - off);
      nc->n -= off;
      if (out) (void)!send(nc->fd, buf, out, MSG_NOSIGNAL);
    }
  }
  return NULL;
}

static void null_server_main(int nthreads) {
  for (int i = 1; i < nthreads; i++) {
    pthread_t t;
    pthread_create(&t, NULL, null_loop, NULL);
  }
  null_loop(NULL);
}

/* The null server's nlfds listening sockets on one loopback port (one
 * SO_REUSEPORT group when more than one, as trainrun's server does). */
static int listen_any(int nlfds, int* port) {
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  null_nlfds = 0;
  for (int l = 0; l < nlfds && l < NULL_MAX_LFDS; l++) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (nlfds > 1) setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    if (bind(fd, (struct sockaddr*)&a, sizeof a) < 0 || listen(fd, -1) < 0)
      return l ? 0 : -1;
    socklen_t n = sizeof a;
    getsockname(fd, (struct sockaddr*)&a, &n);
    *port = ntohs(a.sin_port);
    null_lfds[null_nlfds++] = fd;
  }
  return 0;
}

/* Accept queues a server gets for nclients: --listeners, or (0) the
 * trainrun server's own default for that many expected clients. */
static int queues_for(int listeners, int nclients) {
  return listeners > 0 ? listeners
                       : tr__store_default_listeners(nclients, tr__store_somaxconn());
}

/* CPU seconds a process has used so far (/proc/PID/stat utime + stime,
 * all its threads). */
static double proc_cpu(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE* f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char* p = strrchr(buf, ')'); /* the name may hold spaces */
  unsigned long ut = 0, st = 0;
  if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
                   &ut, &st) != 2)
    return 0;
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* Start a server; its port is read back through a pipe. */
static int server_start(const kind_t* k, const char* python, int nclients,
                        int listeners, server_t* s) {
  memset(s, 0, sizeof *s);
  s->stdin_fd = -1;
  if (strcmp(k->kind, "external") == 0) { /* --connect: already running */
    s->port = k->threads;
    return 0;
  }
  int p[2], in[2];
  if (pipe(p) < 0 || pipe(in) < 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    close(in[1]);
    raise_nofile();
    if (strcmp(k->kind, "pytorch") == 0) {
      dup2(p[1], 1);
      dup2(in[0], 0);
      int null = open("/dev/null", O_WRONLY); /* its per-client warnings */
      if (null >= 0) dup2(null, 2);
      execlp(python, python, "-c",
             "import sys, datetime, torch.distributed as d\n"
             "s = d.TCPStore('127.0.0.1', 0, None, True, "
             "wait_for_workers=False, use_libuv=True, "
             "timeout=datetime.timedelta(seconds=600))\n"
             "print(s.port, flush=True)\n"
             "sys.stdin.read()\n",
             (char*)NULL);
      _exit(127);
    }
    char line[32];
    if (strcmp(k->kind, "null") == 0) {
      int port = 0;
      if (listen_any(queues_for(listeners, nclients), &port) < 0) _exit(1);
      int n = snprintf(line, sizeof line, "%d\n", port);
      (void)!write(p[1], line, (size_t)n);
      null_server_main(k->threads);
      _exit(0);
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    tr_store_server_opts_t o;
    tr_store_server_opts_init(&o);
    o.host = "127.0.0.1";
    o.threads = k->threads;
    o.expected_clients = nclients; /* as the daemon does for a job */
    o.listeners = listeners;
    tr_store_server_t* srv;
    if (tr_store_server_start(&o, &srv) < 0) _exit(1);
    int n = snprintf(line, sizeof line, "%d\n", tr_store_server_port(srv));
    (void)!write(p[1], line, (size_t)n);
    int sig;
    sigwait(&set, &sig);
    tr_store_server_stop(srv);
    _exit(0);
  }
  close(p[1]);
  close(in[0]);
  s->pid = pid;
  s->stdin_fd = in[1];
  char line[64] = {0};
  size_t n = 0;
  while (n < sizeof line - 1 && !strchr(line, '\n')) {
    struct pollfd pf = {p[0], POLLIN, 0};
    if (poll(&pf, 1, 60000) <= 0) break;
    ssize_t r = read(p[0], line + n, sizeof line - 1 - n);
    if (r <= 0) break;
    n += (size_t)r;
  }
  close(p[0]);
  s->port = atoi(line);
  s->base_cpu = proc_cpu(pid); /* start-up (python import) not counted */
  if (s->port <= 0) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    if (s->stdin_fd >= 0) close(s->stdin_fd);
    return -1;
  }
  return 0;
}

/* Stop the server; returns the CPU seconds it used (user + system), a
 * figure the other processes on the machine do not disturb. */
static double server_stop(server_t* s) {
  if (s->pid == 0) return 0; /* external */
  if (s->stdin_fd >= 0) close(s->stdin_fd);
  kill(s->pid, SIGTERM);
  struct rusage ru;
  memset(&ru, 0, sizeof ru);
  wait4(s->pid, NULL, 0, &ru);
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
         (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* ---- the load generator ---- */

enum { ST_RETRY, ST_CONNECTING, ST_PING, ST_ADD, ST_WAIT, ST_DONE, ST_OPS };

typedef struct {
  int fd;
  int state;
  int added;   /* ADD init/ was answered: not repeated on a retry */
  size_t need; /* reply bytes expected */
  size_t got;
  uint8_t rbuf[128];
  int64_t retry_at;
  double backoff;
  int op;     /* ops mode: 0 SET+GET, 1 ADD */
  int pinged; /* its PING was answered: out of the connect window */
} gconn_t;

typedef struct {
  int port;
  int nclients; /* total, for the last-client test */
  int mine;     /* clients of this thread */
  int base;     /* index of the first */
  int ops;      /* 1: operations load */
  int64_t ops_us;
  uint64_t seed;
  int64_t start_us; /* set when the start signal arrives */
  int window;       /* clients connecting (no PING reply yet) at once;
                       0: all */
} gen_args_t;

typedef struct {
  int64_t last_done_us;
  int64_t retries;
  int64_t ops;
  int64_t failed;
} gen_result_t;

static uint64_t rnd(uint64_t* s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static void put_key(uint8_t* b, size_t* n, const char* k) {
  size_t l = strlen(k);
  tr__wr_u64(b + *n, l);
  memcpy(b + *n + 8, k, l);
  *n += 8 + l;
}

static int gconnect(int ep, gconn_t* c, int idx, int port) {
  c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (c->fd < 0) return -1;
  int one = 1;
  setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  c->state = ST_CONNECTING;
  c->got = 0;
  struct epoll_event ev = {.events = EPOLLOUT, .data.u32 = (uint32_t)idx};
  epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
  if (connect(c->fd, (struct sockaddr*)&a, sizeof a) < 0 &&
      errno != EINPROGRESS)
    return -1;
  return 0;
}

static void gsend(gconn_t* c, const uint8_t* b, size_t n, int state,
                  size_t need) {
  c->state = state;
  c->need = need;
  c->got = 0;
  if (send(c->fd, b, n, MSG_NOSIGNAL) != (ssize_t)n) c->state = -1;
}

/* One operation round: a SET (no reply) then a GET, each its own send as
 * PyTorch's client sends them; or an ADD. */
static void send_ops(gconn_t* c, int idx) {
  uint8_t b[256];
  size_t n = 0;
  char key[32];
  snprintf(key, sizeof key, "/bench/%d", idx);
  if (c->op == 0) {
    static const char val[64] =
        "0123456789abcdef0123456789abcdef"
        "0123456789abcdef0123456789abcde";
    b[n++] = TR__Q_SET;
    put_key(b, &n, key);
    tr__wr_u64(b + n, 64);
    memcpy(b + n + 8, val, 64);
    n += 72;
    if (send(c->fd, b, n, MSG_NOSIGNAL) != (ssize_t)n) {
      c->state = -1;
      return;
    }
    n = 0;
    b[n++] = TR__Q_GET;
    put_key(b, &n, key);
    gsend(c, b, n, ST_OPS, 8);
  } else {
    b[n++] = TR__Q_ADD;
    put_key(b, &n, key + 1); /* a counter next to the value */
    tr__wr_u64(b + n, 1);
    n += 8;
    gsend(c, b, n, ST_OPS, 8);
  }
}

/* One generator thread's epoll loop over its clients. */
static void gen_loop(const gen_args_t* a, gen_result_t* res) {
  gconn_t* cs = calloc((size_t)(a->mine > 0 ? a->mine : 1), sizeof *cs);
  int ep = epoll_create1(0);
  memset(res, 0, sizeof *res);
  uint64_t seed = a->seed | 1;
  int64_t start = a->start_us;
  int64_t ops_end = start + a->ops_us;
  int left = a->mine, pending_retry = 0;
  /* clients started and not yet answered their PING: at most window */
  int window = a->window > 0 ? a->window : a->mine;
  int started = 0, connecting = 0;
#define START_MORE()                                 \
  while (started < a->mine && connecting < window) { \
    gconn_t* c0 = &cs[started];                      \
    c0->backoff = 100000;                            \
    if (gconnect(ep, c0, started, a->port) < 0) {    \
      c0->state = ST_RETRY;                          \
      c0->retry_at = now_us();                       \
      pending_retry++;                               \
    }                                                \
    started++;                                       \
    connecting++;                                    \
  }
  START_MORE();
  struct epoll_event evs[512];
  uint8_t b[256];
  while (left > 0) {
    int64_t t = now_us();
    if (a->ops && t >= ops_end) break;
    int n = epoll_wait(ep, evs, 512, pending_retry ? 5 : 100);
    for (int e = 0; e < n; e++) {
      int i = (int)evs[e].data.u32;
      gconn_t* c = &cs[i];
      int fail = 0;
      if (c->state == ST_CONNECTING) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err || (evs[e].events & (EPOLLERR | EPOLLHUP))) {
          fail = 1;
        } else {
          struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
          epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
          size_t m = 0;
          b[m++] = TR__Q_VALIDATE;
          tr__wr_u32(b + m, TR__STORE_MAGIC);
          m += 4;
          b[m++] = TR__Q_PING;
          tr__wr_u32(b + m, (uint32_t)i);
          m += 4;
          gsend(c, b, m, ST_PING, 4);
        }
      } else {
        ssize_t r = recv(c->fd, c->rbuf + c->got, c->need - c->got, 0);
        if (r <= 0) {
          fail = 1;
        } else {
          c->got += (size_t)r;
          if (c->state == ST_OPS && c->op == 0 && c->need == 8 &&
              c->got == 8) { /* GET: the value follows its length */
            uint64_t vlen = tr__rd_u64(c->rbuf);
            if (vlen > sizeof c->rbuf - 8) {
              fail = 1;
              goto failed;
            }
            c->need = 8 + (size_t)vlen;
          }
          if (c->got < c->need) continue;
          size_t m = 0;
          switch (c->state) {
            case ST_PING:
              if (!c->pinged) { /* out of the connect window */
                c->pinged = 1;
                connecting--;
                START_MORE();
              }
              if (a->ops) {
                send_ops(c, a->base + i);
                break;
              }
              if (c->added) goto send_wait;
              b[m++] = TR__Q_ADD;
              put_key(b, &m, "init/");
              tr__wr_u64(b + m, 1);
              m += 8;
              gsend(c, b, m, ST_ADD, 8);
              break;
            case ST_ADD:
              c->added = 1;
              if ((int64_t)tr__rd_u64(c->rbuf) == a->nclients) {
                b[m++] = TR__Q_SET;
                put_key(b, &m, "/bench/last");
                tr__wr_u64(b + m, 1);
                b[m + 8] = '1';
                m += 9;
              }
            send_wait:
              b[m++] = TR__Q_WAIT;
              tr__wr_u64(b + m, 1);
              m += 8;
              put_key(b, &m, "/bench/last");
              gsend(c, b, m, ST_WAIT, 1);
              break;
            case ST_WAIT:
              c->state = ST_DONE;
              res->last_done_us = now_us();
              left--;
              break;
            case ST_OPS:
              res->ops += c->op == 0 ? 2 : 1;
              c->op ^= 1;
              send_ops(c, a->base + i);
              break;
          }
          if (c->state < 0) fail = 1;
        }
      }
    failed:
      if (fail) { /* refused or reset: retry with backoff and jitter */
        epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
        c->fd = -1;
        c->state = ST_RETRY;
        double f = 0.5 + (double)(rnd(&seed) % 1000) / 1000.0;
        c->retry_at = now_us() + (int64_t)(c->backoff * f);
        c->backoff *= 1.5;
        res->retries++;
        pending_retry++;
      }
    }
    if (pending_retry) {
      t = now_us();
      for (int i = 0; i < started; i++) {
        if (cs[i].state != ST_RETRY || cs[i].retry_at > t) continue;
        pending_retry--;
        if (gconnect(ep, &cs[i], i, a->port) < 0) {
          if (cs[i].fd >= 0) {
            epoll_ctl(ep, EPOLL_CTL_DEL, cs[i].fd, NULL);
            close(cs[i].fd);
          }
          cs[i].fd = -1;
          cs[i].state = ST_RETRY;
          cs[i].retry_at = t + 100000;
          pending_retry++;
          res->failed++;
        }
      }
    }
    if (!a->ops && now_us() - start > 120000000) break; /* 2 min: give up */
  }
  if (!a->ops && left > 0) res->failed += left;
#undef START_MORE
  for (int i = 0; i < started; i++)
    if (cs[i].fd > 0) close(cs[i].fd);
  close(ep);
  free(cs);
}

typedef struct {
  gen_args_t a;
  gen_result_t r;
  pthread_barrier_t* go;
} gen_thread_t;

static void* gen_thread_main(void* arg) {
  gen_thread_t* g = arg;
  pthread_barrier_wait(g->go); /* released by the process's start signal */
  g->a.start_us = now_us();
  gen_loop(&g->a, &g->r);
  return NULL;
}

/* One load-generator process: nthreads threads over a->mine clients, each
 * with its own epoll and connections; the summed result goes to
 * result_fd. */
static void gen_proc_main(const gen_args_t* a, int nthreads, int result_fd,
                          int go_fd) {
  raise_nofile();
  gen_thread_t* g = calloc((size_t)nthreads, sizeof *g);
  pthread_t* th = calloc((size_t)nthreads, sizeof *th);
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, (unsigned)nthreads + 1);
  int base = a->base;
  for (int t = 0; t < nthreads; t++) {
    g[t].a = *a;
    g[t].a.mine = a->mine / nthreads + (t < a->mine % nthreads);
    g[t].a.base = base;
    g[t].a.seed = a->seed * (uint64_t)(2 * t + 1);
    g[t].go = &go;
    base += g[t].a.mine;
    pthread_create(&th[t], NULL, gen_thread_main, &g[t]);
  }
  char c;
  if (read(go_fd, &c, 1) != 1) _exit(1);
  pthread_barrier_wait(&go);
  gen_result_t res = {0};
  for (int t = 0; t < nthreads; t++) {
    pthread_join(th[t], NULL);
    if (g[t].r.last_done_us > res.last_done_us)
      res.last_done_us = g[t].r.last_done_us;
    res.retries += g[t].r.retries;
    res.ops += g[t].r.ops;
    res.failed += g[t].r.failed;
  }
  (void)!write(result_fd, &res, sizeof res);
  _exit(0);
}

/* Run one load with nprocs x nthreads generators; fills *out (sums, the
 * latest finish). */
static int run_load(int port, int nclients, int nprocs, int nthreads, int ops,
                    double seconds, int window, gen_result_t* out,
                    int64_t* start_us) {
  int rp[2], gp[2];
  if (pipe(rp) < 0 || pipe(gp) < 0) return -1;
  pid_t* pids = calloc((size_t)nprocs, sizeof *pids);
  int base = 0;
  for (int p = 0; p < nprocs; p++) {
    gen_args_t a = {port,
                    nclients,
                    nclients / nprocs + (p < nclients % nprocs),
                    base,
                    ops,
                    (int64_t)(seconds * 1e6),
                    0x9E3779B97F4A7C15ULL * (uint64_t)(p + 1),
                    0,
                    0};
    base += a.mine;
    int nt = nthreads < a.mine ? nthreads : (a.mine > 0 ? a.mine : 1);
    /* the window is shared out over every generator thread */
    a.window = window > 0 ? window / (nprocs * nt) : 0;
    if (window > 0 && a.window < 1) a.window = 1;
    pids[p] = fork();
    if (pids[p] == 0) {
      close(rp[0]);
      close(gp[1]);
      gen_proc_main(&a, nt, rp[1], gp[0]);
    }
  }
  close(rp[1]);
  close(gp[0]);
  usleep(200000 + 2000 * nprocs * nthreads); /* let the generators set up */
  *start_us = now_us();
  char go[256] = {0};
  (void)!write(gp[1], go, (size_t)nprocs);
  memset(out, 0, sizeof *out);
  for (int p = 0; p < nprocs; p++) {
    gen_result_t r;
    if (read(rp[0], &r, sizeof r) != sizeof r) {
      out->failed++;
      continue;
    }
    if (r.last_done_us > out->last_done_us) out->last_done_us = r.last_done_us;
    out->retries += r.retries;
    out->ops += r.ops;
    out->failed += r.failed;
  }
  for (int p = 0; p < nprocs; p++) waitpid(pids[p], NULL, 0);
  close(rp[0]);
  close(gp[1]);
  free(pids);
  return 0;
}

/* TcpExt ListenOverflows of this network namespace: SYNs or handshakes
 * the kernel dropped because a listen queue was full (the client resends
 * the SYN after 1 s, 3 s, ...: those runs are slow for TCP's reasons).
 * -1 when unreadable. */
static int64_t listen_overflows(void) {
  FILE* f = fopen("/proc/net/netstat", "r");
  if (!f) return -1;
  char names[4096], vals[4096];
  int64_t v = -1;
  while (fgets(names, sizeof names, f) && fgets(vals, sizeof vals, f)) {
    if (strncmp(names, "TcpExt:", 7) != 0) continue;
    char *sn, *sv;
    char* n = strtok_r(names, " \n", &sn);
    char* x = strtok_r(vals, " \n", &sv);
    while (n && x) {
      if (strcmp(n, "ListenOverflows") == 0) {
        v = strtoll(x, NULL, 10);
        break;
      }
      n = strtok_r(NULL, " \n", &sn);
      x = strtok_r(NULL, " \n", &sv);
    }
    break;
  }
  fclose(f);
  return v;
}

static int have_pytorch(const char* python) {
  char cmd[512];
  snprintf(cmd, sizeof cmd,
           "%s -c 'import torch.distributed as d; d.TCPStore' >/dev/null 2>&1",
           python);
  return system(cmd) == 0;
}

static int cmp_double(const void* x, const void* y) {
  double a = *(const double*)x, b = *(const double*)y;
  return a < b ? -1 : a > b;
}

static double median(double* v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* One measurement: median wall seconds (or ops/s), server CPU seconds,
 * retries, and the spread of the runs. */
typedef struct {
  double val, cpu, lo, hi;
  int64_t retries, ops, failed, overflows;
  int ok;
} cell_t;

static cell_t measure(const kind_t* k, const char* python, int nclients,
                      int nprocs, int nthreads, int ops, double seconds,
                      int repeat, int window, int listeners) {
  cell_t c = {0};
  double vals[MAX_REPEAT], cpus[MAX_REPEAT];
  int n = 0;
  for (int r = 0; r < repeat; r++) {
    server_t s;
    if (server_start(k, python, nclients, listeners, &s) < 0) continue;
    gen_result_t res = {0};
    int64_t start = 0;
    double cpu0 = s.base_cpu;
    int64_t ov0 = listen_overflows();
    int lrc = run_load(s.port, nclients, nprocs, nthreads, ops, seconds, window,
                       &res, &start);
    double cpu = server_stop(&s) - cpu0;
    int64_t ov1 = listen_overflows();
    if (ov0 >= 0 && ov1 >= ov0) c.overflows += ov1 - ov0;
    if (lrc < 0) {
      c.failed++;
      continue;
    }
    c.failed += res.failed;
    c.retries += res.retries;
    c.ops += res.ops;
    vals[n] = ops ? (double)res.ops / seconds
                  : (double)(res.last_done_us - start) / 1e6;
    cpus[n] = ops ? (res.ops ? cpu * 1e6 / (double)res.ops : 0) : cpu;
    n++;
  }
  if (n == 0) return c;
  c.ok = 1;
  c.retries /= n;
  c.overflows /= n;
  double sorted[MAX_REPEAT];
  memcpy(sorted, vals, sizeof vals[0] * (size_t)n);
  qsort(sorted, (size_t)n, sizeof *sorted, cmp_double);
  c.lo = sorted[0];
  c.hi = sorted[n - 1];
  c.val = median(vals, n);
  c.cpu = median(cpus, n);
  return c;
}

static void usage(void) {
  printf(
      "usage: store_bench [--clients N[,N...]|none] [--procs P] [--threads T]\n"
      "                   [--server-threads N[,N...]] [--null-threads N] "
      "[--repeat R]\n"
      "                   [--ops-clients N] [--ops-seconds S] [--python PATH]\n"
      "                   [--no-pytorch] [--servers null,trainrun,pytorch]"
      " [--connect PORT]\n"
      "                   [--connect-window W] [--listeners K]\n");
}

int main(int argc, char** argv) {
  const char* clients = "1024,4096";
  const char* python = "python3";
  const char* servers_arg = NULL;
  const char* sthreads_arg = "1";
  int nprocs = 4, nthreads = 1, null_threads = 0, repeat = 1;
  int ops_clients = 64, no_pt = 0, connect_port = 0;
  int window = -1, listeners = 0;
  double ops_seconds = 2.0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--clients") && i + 1 < argc) {
      clients = argv[++i];
    } else if (!strcmp(argv[i], "--procs") && i + 1 < argc) {
      nprocs = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
      nthreads = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--server-threads") && i + 1 < argc) {
      sthreads_arg = argv[++i];
    } else if (!strcmp(argv[i], "--null-threads") && i + 1 < argc) {
      null_threads = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) {
      repeat = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--ops-clients") && i + 1 < argc) {
      ops_clients = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--ops-seconds") && i + 1 < argc) {
      ops_seconds = atof(argv[++i]);
    } else if (!strcmp(argv[i], "--python") && i + 1 < argc) {
      python = argv[++i];
    } else if (!strcmp(argv[i], "--servers") && i + 1 < argc) {
      servers_arg = argv[++i];
    } else if (!strcmp(argv[i], "--connect") && i + 1 < argc) {
      connect_port = atoi(argv[++i]);
      if (connect_port <= 0 || connect_port > 65535) {
        usage();
        return 2;
      }
    } else if (!strcmp(argv[i], "--connect-window") && i + 1 < argc) {
      window = atoi(argv[++i]);
      if (window < 0) {
        usage();
        return 2;
      }
    } else if (!strcmp(argv[i], "--listeners") && i + 1 < argc) {
      listeners = atoi(argv[++i]);
      if (listeners < 0 || listeners > 16) {
        usage();
        return 2;
      }
    } else if (!strcmp(argv[i], "--no-pytorch")) {
      no_pt = 1;
    } else {
      usage();
      return strcmp(argv[i], "--help") && strcmp(argv[i], "-h") ? 2 : 0;
    }
  }
  if (nprocs < 1 || nprocs > 64 || nthreads < 1 || nthreads > 64 ||
      ops_clients < 1 || repeat < 1 || repeat > MAX_REPEAT ||
      null_threads < 0 || null_threads > 64 || ops_seconds < 0) {
    usage();
    return 2;
  }
  /* the trainrun variants */
  int st[MAX_KINDS], nst = 0, max_st = 1;
  {
    char copy[128];
    snprintf(copy, sizeof copy, "%s", sthreads_arg);
    for (char* t = strtok(copy, ","); t && nst < MAX_KINDS - 2;
         t = strtok(NULL, ",")) {
      int v = atoi(t);
      if (v < 1 || v > 64) {
        usage();
        return 2;
      }
      st[nst++] = v;
      if (v > max_st) max_st = v;
    }
  }
  if (nst == 0) st[nst++] = 1;
  if (null_threads == 0) null_threads = max_st;
  signal(SIGPIPE, SIG_IGN);
  tr_log_set_level(TR_LOG_ERROR);
  raise_nofile();
  int want_null = 1, want_tr = 1, want_pt = !no_pt;
  if (servers_arg) {
    want_null = strstr(servers_arg, "null") != NULL;
    want_tr = strstr(servers_arg, "trainrun") != NULL;
    want_pt = strstr(servers_arg, "pytorch") != NULL;
  }
  if (connect_port) want_null = want_tr = want_pt = 0;
  if (want_pt && !have_pytorch(python)) {
    printf("store_bench: '%s' cannot import torch: no PyTorch column\n",
           python);
    want_pt = 0;
  }
  kind_t kinds[MAX_KINDS];
  int nk = 0, ni = -1, pi = -1;
  if (want_null) {
    ni = nk;
    kinds[nk] = (kind_t){"", "null", null_threads};
    snprintf(kinds[nk].label, sizeof kinds[nk].label, "null(%dt)",
             null_threads);
    nk++;
  }
  if (want_tr)
    for (int i = 0; i < nst; i++) {
      kinds[nk] = (kind_t){"", "trainrun", st[i]};
      snprintf(kinds[nk].label, sizeof kinds[nk].label, "trainrun(%dt)", st[i]);
      nk++;
    }
  if (connect_port) {
    kinds[nk] = (kind_t){"", "external", connect_port};
    snprintf(kinds[nk].label, sizeof kinds[nk].label, "port %d", connect_port);
    nk++;
  }
  if (want_pt) {
    pi = nk;
    kinds[nk++] = (kind_t){"pytorch", "pytorch", 1};
  }
  /* default window: 3/4 of one somaxconn backlog -- PyTorch's server has
   * one accept queue -- so no server's queue overflows */
  if (window < 0) window = tr__store_somaxconn() * 3 / 4;
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  printf(
      "store_bench: loopback 127.0.0.1, %ld CPUs, load generator %d "
      "processes x %d threads, open-file limit %llu, median of %d run%s\n",
      sysconf(_SC_NPROCESSORS_ONLN), nprocs, nthreads,
      (unsigned long long)rl.rlim_cur, repeat, repeat > 1 ? "s" : "");
  if (window > 0)
    printf(
        "connect window: %d clients connecting at once (no PING reply "
        "yet), over all generators; somaxconn %d\n",
        window, tr__store_somaxconn());
  else
    printf(
        "connect window: none (every client connects at once); "
        "somaxconn %d\n",
        tr__store_somaxconn());
  if (listeners > 0)
    printf("accept queues (trainrun, null): %d\n", listeners);
  else
    printf(
        "accept queues (trainrun, null): the server's default, "
        "ceil(clients / somaxconn) for a rendezvous\n");
  if (pi >= 0) {
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "%s -c 'import torch; print(\"reference: PyTorch\", "
             "torch.__version__, \"TCPStore(use_libuv=True)\")'",
             python);
    fflush(stdout);
    (void)!system(cmd);
  }
  int rc = 0;
  if (strcmp(clients, "none") == 0) goto ops;
  printf(
      "\n(a) rendezvous: connect, VALIDATE, PING, ADD init/, WAIT last "
      "key\n    cells: wall seconds / server CPU seconds / retried "
      "connects (backlog resets) / listen-queue overflows (dropped SYNs, "
      "resent\n"
      "    after 1 s, 3 s); per run%s\n",
      repeat > 1 ? "; [min-max wall]" : "");
  printf("%-8s", "clients");
  for (int k = 0; k < nk; k++)
    printf(" %*s", repeat > 1 ? 34 : 22, kinds[k].label);
  for (int k = 0; k < nk; k++)
    if (!strcmp(kinds[k].kind, "trainrun")) {
      char h[40];
      if (pi >= 0) {
        snprintf(h, sizeof h, "%dt/pytorch", kinds[k].threads);
        printf(" %12s", h);
      }
      if (ni >= 0) {
        snprintf(h, sizeof h, "%dt/null", kinds[k].threads);
        printf(" %10s", h);
      }
    }
  printf("\n");
  char list[256];
  snprintf(list, sizeof list, "%s", clients);
  for (char* t = strtok(list, ","); t; t = strtok(NULL, ",")) {
    int n = atoi(t);
    if (n <= 0) continue;
    printf("%-8d", n);
    fflush(stdout);
    cell_t cells[MAX_KINDS];
    for (int k = 0; k < nk; k++) {
      cells[k] = measure(&kinds[k], python, n, nprocs, nthreads, 0, 0, repeat,
                         window, listeners);
      char cell[96];
      if (!cells[k].ok)
        snprintf(cell, sizeof cell, "no server"), rc = 1;
      else if (cells[k].failed)
        snprintf(cell, sizeof cell, "FAILED %" PRId64, cells[k].failed), rc = 1;
      else if (repeat > 1)
        snprintf(cell, sizeof cell,
                 "%.3f/%.3f/%" PRId64 "/%" PRId64 " [%.3f-%.3f]", cells[k].val,
                 cells[k].cpu, cells[k].retries, cells[k].overflows,
                 cells[k].lo, cells[k].hi);
      else
        snprintf(cell, sizeof cell, "%.3f/%.3f/%" PRId64 "/%" PRId64,
                 cells[k].val, cells[k].cpu, cells[k].retries,
                 cells[k].overflows);
      printf(" %*s", repeat > 1 ? 34 : 22, cell);
      fflush(stdout);
    }
    for (int k = 0; k < nk; k++)
      if (!strcmp(kinds[k].kind, "trainrun")) {
        if (pi >= 0) {
          if (cells[k].ok && cells[pi].ok && cells[pi].val > 0)
            printf(" %12.2f", cells[k].val / cells[pi].val);
          else
            printf(" %12s", "-");
        }
        if (ni >= 0) {
          if (cells[k].ok && cells[ni].ok && cells[ni].val > 0)
            printf(" %10.2f", cells[k].val / cells[ni].val);
          else
            printf(" %10s", "-");
        }
      }
    printf("\n");
  }
ops:
  if (ops_seconds == 0) return rc;
  printf(
      "\n(b) operations/s: %d clients, closed loop of SET+GET, ADD "
      "(one request in flight each), %.1f s%s\n",
      ops_clients, ops_seconds, repeat > 1 ? "; [min-max]" : "");
  printf("%-14s %10s %12s %24s %12s %10s\n", "server", "ops/s", "us CPU/op",
         repeat > 1 ? "[min-max]" : "", pi >= 0 ? "/pytorch" : "",
         ni >= 0 ? "/null" : "");
  int gp = nprocs < ops_clients ? nprocs : ops_clients;
  cell_t oc[MAX_KINDS];
  for (int k = 0; k < nk; k++)
    oc[k] = measure(&kinds[k], python, ops_clients, gp, nthreads, 1,
                    ops_seconds, repeat, window, listeners);
  for (int k = 0; k < nk; k++) {
    if (!oc[k].ok) {
      printf("%-14s %10s\n", kinds[k].label, "no server");
      rc = 1;
      continue;
    }
    char range[48] = "";
    if (repeat > 1)
      snprintf(range, sizeof range, "[%.0f-%.0f]", oc[k].lo, oc[k].hi);
    printf("%-14s %10.0f %12.2f %24s", kinds[k].label, oc[k].val, oc[k].cpu,
           range);
    if (pi >= 0 && oc[pi].ok && oc[pi].val > 0)
      printf(" %11.2fx", oc[k].val / oc[pi].val);
    else
      printf(" %12s", "");
    if (ni >= 0 && oc[ni].ok && oc[ni].val > 0)
      printf(" %9.2fx", oc[k].val / oc[ni].val);
    printf("\n");
  }
  return rc;
}
