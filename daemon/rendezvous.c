/* daemon/rendezvous.c: finding the store and joining a round through it.
 *
 * The store: the daemon whose machine owns the endpoint address binds it
 * and hosts the TCPStore server; one that finds the port taken (another
 * daemon on the same machine got there first) or the address elsewhere
 * connects as a client.
 *
 * A round, under the run's prefix "trainrun/<run id>/r<round>/":
 *
 *   arrivals    ADD 1 by each daemon: its order of arrival a (from 0)
 *   node/<a>    SET: the daemon's record (host, workers, --node-rank, ...)
 *   closed      COMPARE_SET "" -> N, once: the round holds arrivals 0..N-1.
 *               Set by the daemon that sees MAX arrivals, or MIN arrivals
 *               for last_call_timeout; the others WAIT on it
 *   waiting     ADD 1 by a daemon that arrived after the round closed (the
 *               daemons of the round then start a bigger one)
 *   expect      SET by the daemon that ended the previous round: the nodes
 *               to expect (its nodes, less a lost one, plus those waiting).
 *               The round closes as soon as they are in, and waits for them
 *               up to keep_alive_interval x keep_alive_max_attempt before
 *               the MIN/last-call rule applies
 *
 * Every member reads the N records and computes the same node ranks, world
 * size and rank offsets. */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "daemon/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/param.h"

/* ---- the store ---- */

static int same_addr(const struct sockaddr* a, const struct sockaddr* b) {
  if (a->sa_family != b->sa_family) return 0;
  if (a->sa_family == AF_INET)
    return ((const struct sockaddr_in*)a)->sin_addr.s_addr ==
           ((const struct sockaddr_in*)b)->sin_addr.s_addr;
  if (a->sa_family == AF_INET6)
    return memcmp(&((const struct sockaddr_in6*)a)->sin6_addr,
                  &((const struct sockaddr_in6*)b)->sin6_addr,
                  sizeof(struct in6_addr)) == 0;
  return 0;
}

static int is_loopback(const struct sockaddr* a) {
  if (a->sa_family == AF_INET)
    return (ntohl(((const struct sockaddr_in*)a)->sin_addr.s_addr) >> 24) ==
           127;
  if (a->sa_family == AF_INET6)
    return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6*)a)->sin6_addr);
  return 0;
}

/* Does host name an address of this machine? Fills bind (cap bytes) with
 * what to bind: the numeric loopback address when host is one (or
 * "localhost"), else every interface of that family. */
static int endpoint_is_local(const char* host, char* bind, size_t cap) {
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host, NULL, &hints, &res) != 0) return 0;
  struct ifaddrs* ifs = NULL;
  if (getifaddrs(&ifs) != 0) ifs = NULL;
  int local = 0;
  int named_loopback = strcmp(host, "localhost") == 0;
  for (struct addrinfo* ai = res; ai && !local; ai = ai->ai_next) {
    const struct sockaddr* sa = ai->ai_addr;
    int loop = is_loopback(sa);
    int mine = loop;
    for (struct ifaddrs* i = ifs; i && !mine; i = i->ifa_next)
      if (i->ifa_addr && same_addr(i->ifa_addr, sa)) mine = 1;
    if (mine) {
      char num[INET6_ADDRSTRLEN];
      const void* raw =
          sa->sa_family == AF_INET
              ? (const void*)&((const struct sockaddr_in*)sa)->sin_addr
              : (const void*)&((const struct sockaddr_in6*)sa)->sin6_addr;
      inet_ntop(sa->sa_family, raw, num, sizeof num);
      /* a name of this machine that resolves to 127.0.1.1 (Debian's
       * /etc/hosts) must still be reachable from the other nodes */
      int numeric_loop = loop && (named_loopback || strcmp(host, num) == 0);
      if (numeric_loop)
        snprintf(bind, cap, "%s", num);
      else
        snprintf(bind, cap, "%s", sa->sa_family == AF_INET ? "0.0.0.0" : "::");
      local = 1;
    }
  }
  if (ifs) freeifaddrs(ifs);
  freeaddrinfo(res);
  return local;
}

/* Does something accept connections on host:port? (A store another daemon
 * of this machine already hosts: join it instead of failing to bind.) */
static int port_open(const char* host, int port) {
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port);
  if (getaddrinfo(host, ps, &hints, &res) != 0) return 0;
  int open_ = 0;
  int fd =
      socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    int rc = connect(fd, res->ai_addr, res->ai_addrlen);
    if (rc == 0) {
      open_ = 1;
    } else if (errno == EINPROGRESS) {
      struct pollfd pf = {fd, POLLOUT, 0};
      int soerr = 0;
      socklen_t sl = sizeof soerr;
      if (poll(&pf, 1, 200) == 1 &&
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && !soerr)
        open_ = 1;
    }
    close(fd);
  }
  freeaddrinfo(res);
  return open_;
}

/* The daemon that hosts the store records whose it is under OWNER_KEY
 * ("run=<id>\nhost=<h>\npid=<p>\nsince=<time>\n"); a daemon of another
 * run id that finds the endpoint taken reads it and stops at once, naming
 * that job, instead of joining a store where nobody rendezvouses with it
 * (it used to wait out join_timeout, and more). A store nobody hosts (a
 * `trainrun store` of its own) has no owner: nothing is checked. */
#define OWNER_KEY "trainrun/owner"

static int claim_store(const tr_daemon_opts_t* o, tr_store_client_t* c,
                       tr_errmsg_t* err) {
  char host[256], since[64], v[700];
  if (gethostname(host, sizeof host - 1) != 0) strcpy(host, "?");
  host[sizeof host - 1] = '\0';
  time_t now = time(NULL);
  struct tm tmv;
  gmtime_r(&now, &tmv);
  strftime(since, sizeof since, "%Y-%m-%dT%H:%M:%SZ", &tmv);
  int n = snprintf(v, sizeof v, "run=%s\nhost=%s\npid=%d\nsince=%s\n",
                   o->run_id, host, (int)getpid(), since);
  int rc = tr_store_client_set(c, OWNER_KEY, v, (size_t)n);
  if (rc < 0)
    tr_errmsg_set(err, rc, "store at %s: %s", tr_store_client_peer(c),
                  tr_strerror(rc));
  return rc;
}

/* The value of field `name` in an owner record, into out. */
static void owner_field(const char* rec, const char* name, char* out,
                        size_t cap) {
  size_t nl = strlen(name);
  out[0] = '\0';
  for (const char* p = rec; *p;) {
    size_t n = strcspn(p, "\n");
    if (n > nl && strncmp(p, name, nl) == 0 && p[nl] == '=')
      snprintf(out, cap, "%.*s", (int)(n - nl - 1), p + nl + 1);
    p += n;
    if (*p) p++;
  }
}

static int check_owner(const tr_daemon_opts_t* o, tr_store_client_t* c,
                       tr_errmsg_t* err) {
  const char* key = OWNER_KEY;
  int ready = 0;
  int rc = tr_store_client_check(c, &key, 1, &ready);
  void* v = NULL;
  size_t len = 0;
  if (rc == 0 && !ready) return 0;
  if (rc == 0) rc = tr_store_client_get(c, key, &v, &len);
  if (rc < 0)
    return tr_errmsg_set(err, rc, "store at %s: %s", tr_store_client_peer(c),
                         tr_strerror(rc));
  char run[300], host[300], pid[32], since[64];
  owner_field(v, "run", run, sizeof run);
  owner_field(v, "host", host, sizeof host);
  owner_field(v, "pid", pid, sizeof pid);
  owner_field(v, "since", since, sizeof since);
  free(v);
  if (strcmp(run, o->run_id) == 0) return 0;
  return tr_errmsg_set(
      err, TR_EEXIST,
      "the rendezvous endpoint %s:%d is held by another job: run '%s' (its "
      "store is hosted by pid %s on host '%s' since %s); give this job "
      "another --rdzv-endpoint port, or the same --rdzv-id to join that job",
      o->rdzv_host, o->rdzv_port, run, pid, host, since);
}

int tr__rdzv_store_open(const tr_daemon_opts_t* o, tr_store_server_t** server,
                        tr_store_client_t** client, char** host, int* port,
                        tr_errmsg_t* err) {
  *server = NULL;
  *client = NULL;
  *host = NULL;
  const char* token = tr_param_str(TR_PARAM_STORE_TOKEN);
  tr_store_server_opts_t so;
  tr_store_server_opts_init(&so);
  so.token = *token ? token : NULL;
  so.expected_clients = o->nnodes_max * (o->nproc_per_node * 3 + 1);
  int rc;
  const char* chost;
  int cport;
  int taken = 0; /* the endpoint's port was in use when we tried to bind */
  if (o->standalone || !o->rdzv_host) {
    so.host = "127.0.0.1";
    so.port = 0;
    rc = tr_store_server_start(&so, server);
    if (rc < 0)
      return tr_errmsg_set(err, rc, "cannot start a store on 127.0.0.1: %s",
                           tr_strerror(rc));
    chost = "127.0.0.1";
    cport = tr_store_server_port(*server);
  } else {
    char bind[INET6_ADDRSTRLEN + 1] = "";
    int local =
        o->is_host != 0 && endpoint_is_local(o->rdzv_host, bind, sizeof bind);
    if (o->is_host == 1 && !local)
      snprintf(bind, sizeof bind, "%s", o->rdzv_host);
    if (local && o->is_host != 1 && port_open(o->rdzv_host, o->rdzv_port)) {
      TR_LOG_INFO(DAEMON, "a store already listens on %s:%d (joining it)",
                  o->rdzv_host, o->rdzv_port);
      local = 0;
      taken = 1;
    }
    if (local || o->is_host == 1) {
      so.host = bind;
      so.port = o->rdzv_port;
      rc = tr_store_server_start(&so, server);
      if (rc == TR_EADDRINUSE && o->is_host != 1) {
        taken = 1;
        TR_LOG_INFO(DAEMON,
                    "%s:%d is taken: another daemon on this machine hosts "
                    "the store (joining it)",
                    bind, o->rdzv_port);
      } else if (rc < 0) {
        return tr_errmsg_set(err, rc, "cannot host the store on %s:%d: %s",
                             bind, o->rdzv_port, tr_strerror(rc));
      } else {
        TR_LOG_INFO(DAEMON, "hosting the store on %s:%d", bind, o->rdzv_port);
      }
    }
    chost = o->rdzv_host;
    cport = o->rdzv_port;
  }
  tr_store_client_opts_t co;
  tr_store_client_opts_init(&co);
  co.host = chost;
  co.port = cport;
  co.timeout_ms = (int64_t)(o->join_timeout * 1000);
  /* nodes start together: the host may bind a few ms after the others
   * first try, so retry soon (the client backs off from there) */
  co.backoff_initial_ms = 10;
  co.backoff_max_ms = 1000;
  co.probe_auth = 1; /* a trainrun store: a missing secret fails here */
  rc = tr_store_client_connect(&co, client);
  if (rc == TR_EAUTH) {
    tr_errmsg_set(err, rc,
                  "authentication failed at the rendezvous store %s:%d: this "
                  "node's secret ([comm] key or TRAINRUN_STORE_TOKEN) is "
                  "missing or differs from the one the store requires",
                  chost, cport);
    tr_store_server_stop(*server);
    *server = NULL;
    return rc;
  }
  if (rc < 0 && taken) {
    /* something holds the port, and it does not answer as a store */
    tr_errmsg_set(err, rc,
                  "the rendezvous endpoint %s:%d is in use by a program that "
                  "is not a trainrun store (%s): pick another port",
                  chost, cport, tr_strerror(rc));
    return rc;
  }
  if (rc < 0) {
    tr_errmsg_set(err, rc, "cannot reach the rendezvous store at %s:%d: %s%s",
                  chost, cport, tr_strerror(rc),
                  rc == TR_ETIMEDOUT ? " (is the node that hosts it up?)" : "");
    tr_store_server_stop(*server);
    *server = NULL;
    return rc;
  }
  tr_store_client_set_timeout(*client, (int64_t)(o->read_timeout * 1000));
  rc = *server ? claim_store(o, *client, err) : check_owner(o, *client, err);
  if (rc < 0) {
    tr_store_client_free(*client);
    tr_store_server_stop(*server);
    *client = NULL;
    *server = NULL;
    return rc;
  }
  *host = strdup(chost);
  *port = cport;
  if (!*host) {
    tr_store_client_free(*client);
    tr_store_server_stop(*server);
    *client = NULL;
    *server = NULL;
    return TR_ENOMEM;
  }
  return 0;
}

/* ---- node records ---- */

char* tr__rdzv_node_encode(const tr__rdzv_node_t* n) {
  char* s = NULL;
  if (asprintf(&s,
               "v=1\nhost=%s\nnproc=%d\nwant=%d\nprev=%d\npid=%d\ngpus=%d\n"
               "nmin=%d\nnmax=%d\n",
               n->host, n->nproc, n->want_rank, n->prev_rank, n->pid, n->gpus,
               n->nnodes_min, n->nnodes_max) < 0)
    return NULL;
  return s;
}

static int field_int(const char* v, size_t len, long lo, long hi, int* out) {
  char buf[24];
  if (len == 0 || len >= sizeof buf) return TR_EPROTO;
  memcpy(buf, v, len);
  buf[len] = '\0';
  char* end;
  errno = 0;
  long x = strtol(buf, &end, 10);
  if (errno || *end || x < lo || x > hi) return TR_EPROTO;
  *out = (int)x;
  return 0;
}

int tr__rdzv_node_decode(const char* buf, size_t len, tr__rdzv_node_t* n) {
  memset(n, 0, sizeof *n);
  n->want_rank = n->prev_rank = -1;
  const char* p = buf;
  const char* end = buf + len;
  int have = 0, rc = 0;
  while (p < end && rc == 0) {
    const char* nl = memchr(p, '\n', (size_t)(end - p));
    const char* eq = nl ? memchr(p, '=', (size_t)(nl - p)) : NULL;
    if (!eq) {
      rc = TR_EPROTO;
      break;
    }
    size_t kl = (size_t)(eq - p), vl = (size_t)(nl - eq - 1);
    const char* v = eq + 1;
#define KEY(name) (kl == sizeof(name) - 1 && memcmp(p, name, kl) == 0)
    if (KEY("v")) {
      int ver;
      rc = field_int(v, vl, 1, 1, &ver);
      have |= 1;
    } else if (KEY("host")) {
      free(n->host);
      n->host = NULL;
      if (vl == 0 || vl > 255 || memchr(v, '\0', vl))
        rc = TR_EPROTO;
      else if (!(n->host = strndup(v, vl)))
        rc = TR_ENOMEM;
      have |= 2;
    } else if (KEY("nproc")) {
      rc = field_int(v, vl, 1, 65536, &n->nproc);
      have |= 4;
    } else if (KEY("want")) {
      rc = field_int(v, vl, -1, 1 << 20, &n->want_rank);
    } else if (KEY("prev")) {
      rc = field_int(v, vl, -1, 1 << 20, &n->prev_rank);
    } else if (KEY("pid")) {
      rc = field_int(v, vl, 0, INT_MAX, &n->pid);
    } else if (KEY("gpus")) {
      rc = field_int(v, vl, 0, 65536, &n->gpus);
    } else if (KEY("nmin")) {
      rc = field_int(v, vl, 1, 1 << 20, &n->nnodes_min);
      have |= 8;
    } else if (KEY("nmax")) {
      rc = field_int(v, vl, 1, 1 << 20, &n->nnodes_max);
      have |= 16;
    } /* other keys: from a newer daemon, ignored */
#undef KEY
    p = nl + 1;
  }
  if (rc == 0 && have != 31) rc = TR_EPROTO;
  if (rc < 0) {
    free(n->host);
    n->host = NULL;
  }
  return rc;
}

/* ---- node ranks ---- */

int tr__rdzv_assign(const tr__rdzv_node_t* nodes, int n, int* rank_of,
                    tr_errmsg_t* err) {
  int* slot = malloc((size_t)n * sizeof *slot); /* node rank -> arrival */
  if (!slot) return TR_ENOMEM;
  for (int i = 0; i < n; i++) slot[i] = rank_of[i] = -1;
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    int w = nodes[i].want_rank;
    if (w < 0) continue;
    if (w >= n)
      rc = tr_errmsg_set(err, TR_EINVAL,
                         "node '%s' asked for --node-rank %d but the round "
                         "has %d node%s",
                         nodes[i].host, w, n, n == 1 ? "" : "s");
    else if (slot[w] >= 0)
      rc = tr_errmsg_set(err, TR_EINVAL,
                         "nodes '%s' and '%s' both asked for --node-rank %d",
                         nodes[slot[w]].host, nodes[i].host, w);
    else
      slot[w] = i, rank_of[i] = w;
  }
  /* a node keeps its rank of the previous round where it can */
  for (int i = 0; i < n && rc == 0; i++) {
    int p = nodes[i].prev_rank;
    if (rank_of[i] < 0 && p >= 0 && p < n && slot[p] < 0)
      slot[p] = i, rank_of[i] = p;
  }
  int next = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    if (rank_of[i] >= 0) continue;
    while (slot[next] >= 0) next++;
    slot[next] = i;
    rank_of[i] = next;
  }
  free(slot);
  return rc;
}

/* ---- joining ---- */

void tr__rdzv_release(tr__rdzv_t* r) {
  if (r->nodes)
    for (int i = 0; i < r->nnodes; i++) free(r->nodes[i].host);
  free(r->nodes);
  memset(r, 0, sizeof *r);
}

static void key(char* buf, size_t cap, int round, const char* name) {
  snprintf(buf, cap, "r%d/%s", round, name);
}

/* Parse the decimal value of "closed". */
static int parse_count(const void* v, size_t len, int* out) {
  return field_int(v, len, 1, 1 << 20, out);
}

static int try_close(tr_store_prefix_t* st, const char* k_closed, int64_t n) {
  char want[24];
  int len = snprintf(want, sizeof want, "%lld", (long long)n);
  void* cur = NULL;
  size_t clen;
  int rc = tr_store_prefix_compare_set(st, k_closed, "", 0, want, (size_t)len,
                                       &cur, &clen);
  free(cur);
  return rc;
}

int tr__rdzv_join(tr_store_prefix_t* st, int round, tr__rdzv_node_t* me,
                  const tr_daemon_opts_t* o, tr__rdzv_t* out,
                  tr_errmsg_t* err) {
  char k_arr[48], k_closed[48], k_node[64];
  memset(out, 0, sizeof *out);
  key(k_arr, sizeof k_arr, round, "arrivals");
  key(k_closed, sizeof k_closed, round, "closed");
  int64_t a;
  int rc = tr_store_prefix_add(st, k_arr, 1, &a);
  if (rc < 0) goto out_store;
  me->arrival = (int)(a - 1);
  char* rec = tr__rdzv_node_encode(me);
  if (!rec) return TR_ENOMEM;
  snprintf(k_node, sizeof k_node, "r%d/node/%d", round, me->arrival);
  rc = tr_store_prefix_set(st, k_node, rec, strlen(rec));
  free(rec);
  if (rc < 0) goto out_store;

  /* a round that follows a failure or a new node knows how many nodes to
   * expect: it closes as soon as they are in, without the last call, and
   * waits for them (up to the time a node takes to count as lost) */
  int expect = 0;
  {
    char k_expect[48];
    key(k_expect, sizeof k_expect, round, "expect");
    const char* ek[1] = {k_expect};
    int ready = 0;
    rc = tr_store_prefix_check(st, ek, 1, &ready);
    if (rc < 0) goto out_store;
    if (ready) {
      void* v;
      size_t len;
      rc = tr_store_prefix_get(st, k_expect, &v, &len);
      if (rc < 0) goto out_store;
      if (parse_count(v, len, &expect) < 0) expect = 0;
      free(v);
    }
  }
  double node_timeout = o->keep_alive_interval * o->keep_alive_max_attempt;
  double start = tr__now(), min_seen = -1;
  int n_closed = 0;
  int64_t n = 0;
  for (;;) {
    if (tr__daemon_interrupted())
      return tr_errmsg_set(err, TR_ECANCELED, "rendezvous interrupted");
    int ready;
    const char* keys[1] = {k_closed};
    rc = tr_store_prefix_check(st, keys, 1, &ready);
    if (rc < 0) goto out_store;
    if (ready) {
      void* v;
      size_t len;
      rc = tr_store_prefix_get(st, k_closed, &v, &len);
      if (rc < 0) goto out_store;
      rc = parse_count(v, len, &n_closed);
      free(v);
      if (rc < 0)
        return tr_errmsg_set(err, TR_EPROTO,
                             "rendezvous: bad value of key '%s' in the store",
                             k_closed);
      break;
    }
    rc = tr_store_prefix_add(st, k_arr, 0, &n);
    if (rc < 0) goto out_store;
    double now = tr__now();
    double slice;
    if (n >= o->nnodes_max || (expect > 0 && n >= expect)) {
      rc = try_close(st, k_closed, n < o->nnodes_max ? n : o->nnodes_max);
      if (rc < 0) goto out_store;
      continue;
    } else if (n >= o->nnodes_min) {
      if (min_seen < 0) min_seen = now;
      double until = min_seen + o->last_call_timeout;
      if (expect > 0 && start + node_timeout > until)
        until = start + node_timeout;
      double left = until - now;
      if (left <= 0) {
        rc = try_close(st, k_closed, n);
        if (rc < 0) goto out_store;
        continue;
      }
      slice = left < 0.5 ? left : 0.5;
    } else {
      double left = start + o->join_timeout - now;
      if (left <= 0)
        return tr_errmsg_set(err, TR_ETIMEDOUT,
                             "rendezvous timed out after %gs: %lld of %d "
                             "node%s joined round %d",
                             o->join_timeout, (long long)n, o->nnodes_min,
                             o->nnodes_min == 1 ? "" : "s", round);
      slice = left < 0.5 ? left : 0.5;
    }
    int64_t ms = (int64_t)(slice * 1000) + 1;
    rc = tr_store_prefix_wait(st, keys, 1, ms);
    if (rc < 0 && rc != TR_ETIMEDOUT) goto out_store;
  }
  if (me->arrival >= n_closed) return 1;

  /* every member's record */
  int N = n_closed;
  char** keys = calloc((size_t)N, sizeof *keys);
  void** vals = calloc((size_t)N, sizeof *vals);
  size_t* lens = calloc((size_t)N, sizeof *lens);
  int* rank_of = calloc((size_t)N, sizeof *rank_of);
  tr__rdzv_node_t* arr = calloc((size_t)N, sizeof *arr);
  rc = keys && vals && lens && rank_of && arr ? 0 : TR_ENOMEM;
  for (int i = 0; i < N && rc == 0; i++)
    if (asprintf(&keys[i], "r%d/node/%d", round, i) < 0) rc = TR_ENOMEM;
  if (rc == 0) {
    rc = tr_store_prefix_multi_get(st, (const char* const*)keys, (size_t)N,
                                   vals, lens);
    if (rc < 0)
      tr_errmsg_set(err, rc,
                    "rendezvous: cannot read the records of the %d nodes of "
                    "round %d: %s",
                    N, round, tr_strerror(rc));
    for (int i = 0; i < N && rc == 0; i++) {
      rc = tr__rdzv_node_decode(vals[i], lens[i], &arr[i]);
      if (rc < 0)
        tr_errmsg_set(err, rc,
                      "rendezvous: bad record of node %d in the "
                      "store",
                      i);
      arr[i].arrival = i;
    }
  }
  for (int i = 0; i < N && rc == 0; i++)
    if (arr[i].nnodes_min != o->nnodes_min ||
        arr[i].nnodes_max != o->nnodes_max)
      rc = tr_errmsg_set(err, TR_EINVAL,
                         "node '%s' was started with --nnodes %d:%d, this "
                         "node with --nnodes %d:%d",
                         arr[i].host, arr[i].nnodes_min, arr[i].nnodes_max,
                         o->nnodes_min, o->nnodes_max);
  if (rc == 0) rc = tr__rdzv_assign(arr, N, rank_of, err);
  if (rc == 0) {
    out->nodes = calloc((size_t)N, sizeof *out->nodes);
    if (!out->nodes) rc = TR_ENOMEM;
  }
  if (rc == 0) {
    out->round = round;
    out->nnodes = N;
    for (int i = 0; i < N; i++) {
      out->nodes[rank_of[i]] = arr[i];
      arr[i].host = NULL; /* moved */
    }
    out->node_rank = rank_of[me->arrival];
    const char* myhost = out->nodes[out->node_rank].host;
    for (int r = 0; r < N; r++) {
      const tr__rdzv_node_t* nd = &out->nodes[r];
      out->world_size += nd->nproc;
      if (r < out->node_rank) out->rank_base += nd->nproc;
      if (strcmp(nd->host, myhost) == 0) {
        out->local_world += nd->nproc;
        if (r < out->node_rank) out->local_base += nd->nproc;
      }
    }
  }
  for (int i = 0; i < N; i++) {
    if (keys) free(keys[i]);
    if (vals) free(vals[i]);
    if (arr) free(arr[i].host);
  }
  free(keys);
  free(vals);
  free(lens);
  free(rank_of);
  free(arr);
  if (rc < 0) {
    /* the round and its size stay: the caller leaves it in order */
    tr__rdzv_release(out);
    out->round = round;
    out->nnodes = N;
  }
  return rc;
out_store:
  return tr_errmsg_set(err, rc, "rendezvous through the store at %s: %s",
                       tr_store_client_peer(st->client), tr_strerror(rc));
}
