/* bench/store_bench.c: load generator for TCPStore servers, on loopback.
 *
 *   store_bench [--clients 1024,4096] [--procs 4] [--ops-clients 64]
 *               [--ops-seconds 2] [--python python3] [--no-pytorch]
 *
 * (a) rendezvous: N clients each connect, VALIDATE, PING, ADD "init/" 1,
 *     and WAIT on a last key that the client whose ADD returned N sets --
 *     what every rank does when a job starts. The time is from the start
 *     signal to the last client's STOP_WAITING.
 * (b) operations: 64 clients in a closed loop of SET, GET, ADD (one request
 *     in flight per connection, like PyTorch's client) for a few seconds.
 *
 * Each load runs against: a null server (parses requests, answers at once,
 * stores nothing: the load generator's own ceiling), trainrun's server, and
 * PyTorch's libuv server when `python -c "import torch"` works (started
 * with TCPStore(is_master=True) in a child python). Every server runs in a
 * process of its own, started fresh for each load. The load generators are
 * --procs processes, each an epoll loop over its share of the clients;
 * refused or reset connections (listen backlog overflow) are retried after
 * 100 ms +-50 %, x1.5 per retry, like trainrun's client. The soft
 * RLIMIT_NOFILE is raised to the hard limit here.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
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
  pid_t pid;
  int port;
  int stdin_fd;    /* pytorch: closing it stops the server */
  double base_cpu; /* CPU seconds used before the load started */
} server_t;

/* The null server: one epoll loop; parses with the store parser, answers
 * PING with the nonce, ADD with a running count, WAIT/CHECK with 00, GET
 * with an empty value, nothing for SET. */
static void null_server_main(int lfd) {
  int ep = epoll_create1(0);
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = lfd};
  epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
  tr__store_limits_t lim;
  tr__store_limits_from_params(&lim);
  int64_t counter = 0;
  static uint8_t buf[1 << 16];
  typedef struct {
    uint8_t in[4096];
    size_t n;
  } nconn_t;
  nconn_t** conns = calloc(1 << 20, sizeof *conns);
  struct epoll_event evs[256];
  for (;;) {
    int n = epoll_wait(ep, evs, 256, -1);
    for (int i = 0; i < n; i++) {
      int fd = evs[i].data.fd;
      if (fd == lfd) {
        int c;
        while ((c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
          int one = 1;
          setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          conns[c] = calloc(1, sizeof(nconn_t));
          struct epoll_event e = {.events = EPOLLIN, .data.fd = c};
          epoll_ctl(ep, EPOLL_CTL_ADD, c, &e);
        }
        continue;
      }
      nconn_t* nc = conns[fd];
      ssize_t r = recv(fd, nc->in + nc->n, sizeof nc->in - nc->n, 0);
      if (r <= 0) {
        close(fd);
        free(nc);
        conns[fd] = NULL;
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
            counter += rq.i64;
            tr__wr_u64(buf + out, (uint64_t)counter);
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
      if (out) (void)!send(fd, buf, out, MSG_NOSIGNAL);
    }
  }
}

static int listen_any(int* port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (struct sockaddr*)&a, sizeof a) < 0 || listen(fd, -1) < 0)
    return -1;
  socklen_t n = sizeof a;
  getsockname(fd, (struct sockaddr*)&a, &n);
  *port = ntohs(a.sin_port);
  return fd;
}

/* CPU seconds a process has used so far (/proc/PID/stat utime + stime). */
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
static int server_start(const char* kind, const char* python, server_t* s) {
  memset(s, 0, sizeof *s);
  s->stdin_fd = -1;
  int p[2], in[2];
  if (pipe(p) < 0 || pipe(in) < 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    close(in[1]);
    raise_nofile();
    if (strcmp(kind, "pytorch") == 0) {
      dup2(p[1], 1);
      dup2(in[0], 0);
      int null = open("/dev/null", O_WRONLY); /* its per-client warnings */
      if (null >= 0) dup2(null, 2);
      execlp(
          python, python, "-c",
          "import sys, datetime, torch.distributed as d\n"
          "s = d.TCPStore('127.0.0.1', 0, None, True, "
          "wait_for_workers=False, timeout=datetime.timedelta(seconds=600))\n"
          "print(s.port, flush=True)\n"
          "sys.stdin.read()\n",
          (char*)NULL);
      _exit(127);
    }
    char line[32];
    if (strcmp(kind, "null") == 0) {
      int port = 0, lfd = listen_any(&port);
      int n = snprintf(line, sizeof line, "%d\n", port);
      (void)!write(p[1], line, (size_t)n);
      null_server_main(lfd);
      _exit(0);
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    tr_store_server_opts_t o;
    tr_store_server_opts_init(&o);
    o.host = "127.0.0.1";
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
  return s->port > 0 ? 0 : -1;
}

/* Stop the server; returns the CPU seconds it used (user + system), a
 * figure the other processes on the machine do not disturb. */
static double server_stop(server_t* s) {
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
  int op; /* ops mode: 0 SET+GET, 1 ADD */
} gconn_t;

typedef struct {
  int port;
  int nclients; /* total, for the last-client test */
  int mine;     /* clients of this process */
  int base;     /* index of the first */
  int ops;      /* 1: operations load */
  int64_t ops_us;
  uint64_t seed;
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

static void send_ops(gconn_t* c, int idx) {
  uint8_t b[256];
  size_t n = 0;
  char key[32];
  snprintf(key, sizeof key, "/bench/%d", idx);
  if (c->op == 0) { /* SET (no reply), then GET */
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

static void gen_main(const gen_args_t* a, int result_fd, int go_fd) {
  raise_nofile();
  gconn_t* cs = calloc((size_t)a->mine, sizeof *cs);
  int ep = epoll_create1(0);
  char go;
  if (read(go_fd, &go, 1) != 1) _exit(1);
  gen_result_t res = {0};
  uint64_t seed = a->seed | 1;
  int64_t start = now_us();
  int64_t ops_end = start + a->ops_us;
  int left = a->mine, pending_retry = 0;
  for (int i = 0; i < a->mine; i++) {
    cs[i].backoff = 100000;
    if (gconnect(ep, &cs[i], i, a->port) < 0) {
      cs[i].state = ST_RETRY;
      cs[i].retry_at = now_us();
      pending_retry++;
    }
  }
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
              res.last_done_us = now_us();
              left--;
              break;
            case ST_OPS:
              res.ops += c->op == 0 ? 2 : 1;
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
        res.retries++;
        pending_retry++;
      }
    }
    if (pending_retry) {
      t = now_us();
      for (int i = 0; i < a->mine; i++) {
        if (cs[i].state != ST_RETRY || cs[i].retry_at > t) continue;
        pending_retry--;
        if (gconnect(ep, &cs[i], i, a->port) < 0) {
          close(cs[i].fd);
          cs[i].state = ST_RETRY;
          cs[i].retry_at = t + 100000;
          pending_retry++;
          res.failed++;
        }
      }
    }
    if (!a->ops && now_us() - start > 120000000) break; /* 2 min: give up */
  }
  if (!a->ops && left > 0) res.failed += left;
  (void)!write(result_fd, &res, sizeof res);
  _exit(0);
}

/* Run one load with nprocs generators; fills *out (sums, max time). */
static int run_load(int port, int nclients, int nprocs, int ops, double seconds,
                    gen_result_t* out, int64_t* start_us) {
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
                    0x9E3779B97F4A7C15ULL * (uint64_t)(p + 1)};
    base += a.mine;
    pids[p] = fork();
    if (pids[p] == 0) {
      close(rp[0]);
      close(gp[1]);
      gen_main(&a, rp[1], gp[0]);
    }
  }
  close(rp[1]);
  close(gp[0]);
  usleep(200000); /* let the generators set up */
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

static int have_pytorch(const char* python) {
  char cmd[512];
  snprintf(cmd, sizeof cmd,
           "%s -c 'import torch.distributed as d; d.TCPStore' >/dev/null 2>&1",
           python);
  return system(cmd) == 0;
}

static void usage(void) {
  printf(
      "usage: store_bench [--clients N[,N...]] [--procs P] "
      "[--ops-clients N] [--ops-seconds S]\n"
      "                   [--python PATH] [--no-pytorch] [--servers "
      "null,trainrun,pytorch]\n");
}

int main(int argc, char** argv) {
  const char* clients = "1024,4096";
  const char* python = "python3";
  const char* servers_arg = NULL;
  int nprocs = 4, ops_clients = 64, no_pt = 0;
  double ops_seconds = 2.0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--clients") && i + 1 < argc) {
      clients = argv[++i];
    } else if (!strcmp(argv[i], "--procs") && i + 1 < argc) {
      nprocs = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--ops-clients") && i + 1 < argc) {
      ops_clients = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--ops-seconds") && i + 1 < argc) {
      ops_seconds = atof(argv[++i]);
    } else if (!strcmp(argv[i], "--python") && i + 1 < argc) {
      python = argv[++i];
    } else if (!strcmp(argv[i], "--servers") && i + 1 < argc) {
      servers_arg = argv[++i];
    } else if (!strcmp(argv[i], "--no-pytorch")) {
      no_pt = 1;
    } else {
      usage();
      return strcmp(argv[i], "--help") && strcmp(argv[i], "-h") ? 2 : 0;
    }
  }
  if (nprocs < 1 || nprocs > 64 || ops_clients < 1) {
    usage();
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  tr_log_set_level(TR_LOG_ERROR);
  raise_nofile();
  const char* kinds[3];
  int nk = 0;
  if (servers_arg) {
    static char copy[128];
    snprintf(copy, sizeof copy, "%s", servers_arg);
    for (char* t = strtok(copy, ","); t && nk < 3; t = strtok(NULL, ","))
      kinds[nk++] = t;
  } else {
    kinds[nk++] = "null";
    kinds[nk++] = "trainrun";
    if (!no_pt && have_pytorch(python)) kinds[nk++] = "pytorch";
  }
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  printf(
      "store_bench: loopback 127.0.0.1, %ld CPUs, %d load-generator "
      "processes, open-file limit %llu\n",
      sysconf(_SC_NPROCESSORS_ONLN), nprocs, (unsigned long long)rl.rlim_cur);
  printf(
      "\n(a) rendezvous: connect, VALIDATE, PING, ADD init/, WAIT last "
      "key\n    cells: wall seconds / server CPU seconds / retried "
      "connects (backlog resets)\n");
  printf("%-8s", "clients");
  for (int k = 0; k < nk; k++) printf(" %20s", kinds[k]);
  int ti = -1, pi = -1;
  for (int k = 0; k < nk; k++) {
    if (!strcmp(kinds[k], "trainrun")) ti = k;
    if (!strcmp(kinds[k], "pytorch")) pi = k;
  }
  if (ti >= 0 && pi >= 0) printf(" %18s", "trainrun/pytorch");
  printf("\n");
  char list[256];
  snprintf(list, sizeof list, "%s", clients);
  int rc = 0;
  for (char* t = strtok(list, ","); t; t = strtok(NULL, ",")) {
    int n = atoi(t);
    if (n <= 0) continue;
    printf("%-8d", n);
    fflush(stdout);
    double secs[3] = {0};
    for (int k = 0; k < nk; k++) {
      server_t s;
      if (server_start(kinds[k], python, &s) < 0) {
        printf(" %20s", "no server");
        continue;
      }
      gen_result_t r;
      int64_t start;
      double cpu0 = s.base_cpu;
      run_load(s.port, n, nprocs, 0, 0, &r, &start);
      double cpu = server_stop(&s) - cpu0;
      secs[k] = (double)(r.last_done_us - start) / 1e6;
      char cell[64];
      if (r.failed)
        snprintf(cell, sizeof cell, "FAILED %" PRId64, r.failed), rc = 1;
      else
        snprintf(cell, sizeof cell, "%.3f/%.3f/%" PRId64, secs[k], cpu,
                 r.retries);
      printf(" %20s", cell);
      fflush(stdout);
    }
    if (ti >= 0 && pi >= 0 && secs[pi] > 0)
      printf(" %18.2f", secs[ti] / secs[pi]);
    printf("\n");
  }
  printf(
      "\n(b) operations/s: %d clients, closed loop of SET, GET, ADD, "
      "%.1f s\n",
      ops_clients, ops_seconds);
  double opsr[3] = {0};
  for (int k = 0; k < nk; k++) {
    server_t s;
    if (server_start(kinds[k], python, &s) < 0) continue;
    gen_result_t r;
    int64_t start;
    double cpu0 = s.base_cpu;
    run_load(s.port, ops_clients, nprocs < ops_clients ? nprocs : ops_clients,
             1, ops_seconds, &r, &start);
    double cpu = server_stop(&s) - cpu0;
    opsr[k] = (double)r.ops / ops_seconds;
    printf("%-10s %12.0f ops/s %12.2f us server CPU per op\n", kinds[k],
           opsr[k], r.ops ? cpu * 1e6 / (double)r.ops : 0.0);
  }
  if (ti >= 0 && pi >= 0 && opsr[pi] > 0)
    printf("trainrun/pytorch: %.2fx\n", opsr[ti] / opsr[pi]);
  return rc;
}
