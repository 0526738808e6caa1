/* tests/pg_suite.c: multi-rank process-group bodies (see pg_suite.h) and
 * the fork harness: a store server on 127.0.0.1 port 0, N ranks forked
 * from the test, each with its own world, their exit codes collected with a
 * time limit (stragglers are killed). */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/pg_suite.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/pg_waits.h"

int pg_test_rank = -1;
const char* pg_failure_key;

/* ---- harness ---- */

tr_store_server_t* pg_server_start(int* port) {
  tr_store_server_opts_t o;
  tr_store_server_opts_init(&o);
  o.host = "127.0.0.1";
  o.port = 0;
  tr_store_server_t* srv = NULL;
  if (tr_store_server_start(&o, &srv) < 0) return NULL;
  *port = tr_store_server_port(srv);
  return srv;
}

tr_store_client_t* pg_client(int port) {
  tr_store_client_opts_t o;
  tr_store_client_opts_init(&o);
  o.host = "127.0.0.1";
  o.port = port;
  o.timeout_ms = 30000;
  tr_store_client_t* c = NULL;
  if (tr_store_client_connect(&o, &c) < 0) return NULL;
  return c;
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void run_rank(int r, int n, int port, const char* backend,
                     tr_device_type_t dev, int cpu_float_sums,
                     int64_t timeout_ms, pg_body_fn body) {
  pg_test_rank = r;
  tr_log_set_rank(r);
  tr_store_client_t* c = pg_client(port);
  PCHECK(c != NULL);
  tr_pg_opts_t o;
  tr_pg_opts_init(&o);
  o.rank = r;
  o.world_size = n;
  o.store = c;
  o.backend = backend;
  o.timeout_ms = timeout_ms;
  o.failure_key = pg_failure_key;
  tr_pg_t* world = NULL;
  PCHECK_RC(tr_pg_new(&o, &world));
  pg_ctx_t ctx = {backend, dev, cpu_float_sums, c, r, n};
  body(world, &ctx);
  tr_pg_free(world);
  tr_store_client_free(c);
  _exit(0);
}

/* The store server runs in a process of its own: the ranks are forked
 * from this (single-threaded) process, so they inherit no lock held by a
 * server thread (the sanitizers' allocator has no fork handlers). */
pid_t pg_server_fork(int* port) {
  int fd[2];
  if (pipe(fd) < 0) return -1;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    close(fd[0]);
    int p = -1;
    tr_store_server_t* srv = pg_server_start(&p);
    if (write(fd[1], &p, sizeof p) != (ssize_t)sizeof p) _exit(1);
    close(fd[1]);
    if (!srv) _exit(1);
    for (;;) pause(); /* until killed */
  }
  close(fd[1]);
  ssize_t got = read(fd[0], port, sizeof *port);
  close(fd[0]);
  if (got != (ssize_t)sizeof *port || *port <= 0) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
  }
  return pid;
}

int pg_spawn(int n, const char* backend, tr_device_type_t dev,
             int cpu_float_sums, int64_t timeout_ms, pg_body_fn body,
             int limit_s, int* status) {
  int port = 0;
  pid_t srv = pg_server_fork(&port);
  if (srv < 0) return -1;
  pid_t pids[16];
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    if (pids[r] < 0) return -1;
    if (pids[r] == 0)
      run_rank(r, n, port, backend, dev, cpu_float_sums, timeout_ms, body);
    status[r] = -1;
  }
  int64_t end = now_ms() + (int64_t)limit_s * 1000;
  int left = n;
  while (left > 0 && now_ms() < end) {
    for (int r = 0; r < n; r++) {
      if (status[r] != -1) continue;
      int st;
      pid_t p = waitpid(pids[r], &st, WNOHANG);
      if (p == pids[r]) {
        status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        left--;
      }
    }
    if (left) usleep(5000);
  }
  for (int r = 0; r < n; r++)
    if (status[r] == -1) {
      fprintf(stderr, "rank %d still running after %d s: killed\n", r, limit_s);
      kill(pids[r], SIGKILL);
      waitpid(pids[r], NULL, 0);
    }
  kill(srv, SIGKILL);
  waitpid(srv, NULL, 0);
  return 0;
}

/* ---- tensors ---- */

static void put(tr_tensor_t* t, int64_t i, double v) {
  void* p = tr_tensor_data(t);
  switch (t->dtype) {
    case TR_F32:
      ((float*)p)[i] = (float)v;
      break;
    case TR_BF16:
      ((uint16_t*)p)[i] = tr_f32_to_bf16((float)v);
      break;
    case TR_F16:
      ((uint16_t*)p)[i] = tr_f32_to_f16((float)v);
      break;
    case TR_I32:
      ((int32_t*)p)[i] = (int32_t)v;
      break;
    case TR_I64:
      ((int64_t*)p)[i] = (int64_t)v;
      break;
    case TR_U16:
      ((uint16_t*)p)[i] = (uint16_t)v;
      break;
    default:
      ((uint8_t*)p)[i] = (uint8_t)v;
      break;
  }
}

static tr_device_t dev_of(const pg_ctx_t* c) {
  if (c->dev == TR_DEV_CPU) return TR_DEVICE_CPU;
  int n = tr_cuda_device_count();
  return (tr_device_t){TR_DEV_CUDA, n > 0 ? c->rank % n : 0};
}

/* A host tensor of numel n; to_dev moves it to the body's device. */
static tr_tensor_t host(tr_dtype_t dt, int64_t n) {
  tr_tensor_t t;
  int64_t shape[1] = {n};
  PCHECK_RC(tr_tensor_zeros(&t, dt, TR_DEVICE_CPU, 1, shape));
  return t;
}

static tr_tensor_t to_dev(const pg_ctx_t* c, tr_tensor_t* h) {
  if (c->dev == TR_DEV_CPU) return *h;
  tr_tensor_t d;
  PCHECK_RC(tr_tensor_empty(&d, h->dtype, dev_of(c), h->ndim, h->shape));
  PCHECK_RC(tr_tensor_copy(&d, h));
  tr_tensor_release(h);
  return d;
}

/* Element i of a tensor on any device. */
static double at(const tr_tensor_t* t, int64_t i) {
  if (t->device.type == TR_DEV_CPU) return tr_tensor_get(t, i);
  tr_tensor_t h;
  PCHECK_RC(tr_tensor_empty(&h, t->dtype, TR_DEVICE_CPU, t->ndim, t->shape));
  PCHECK_RC(tr_tensor_copy(&h, t));
  double v = tr_tensor_get(&h, i);
  tr_tensor_release(&h);
  return v;
}

/* All elements at once (one copy for device tensors). */
static tr_tensor_t fetch(const tr_tensor_t* t) {
  tr_tensor_t h;
  if (t->device.type == TR_DEV_CPU && tr_tensor_is_contiguous(t)) {
    tr_tensor_view(&h, t);
    return h;
  }
  PCHECK_RC(tr_tensor_empty(&h, t->dtype, TR_DEVICE_CPU, t->ndim, t->shape));
  PCHECK_RC(tr_tensor_copy(&h, t));
  return h;
}

static double tol(tr_dtype_t dt, double e) {
  switch (dt) {
    case TR_F32:
      return fabs(e) * 1e-6 + 1e-6;
    case TR_BF16:
      return fabs(e) / 128 + 1e-3;
    case TR_F16:
      return fabs(e) / 1024 + 1e-3;
    default:
      return 0;
  }
}

static int close_to(tr_dtype_t dt, double got, double want) {
  return fabs(got - want) <= tol(dt, want);
}

#define PCHECK_VAL(dt, got, want, what)                                        \
  do {                                                                         \
    double g_ = (got), w_ = (want);                                            \
    if (!close_to((dt), g_, w_)) {                                             \
      fprintf(stderr, "rank %d: %s:%d: %s (%s): got %g, want %g\n",            \
              pg_test_rank, __FILE__, __LINE__, (what), tr_dtype_name(dt), g_, \
              w_);                                                             \
      _exit(1);                                                                \
    }                                                                          \
  } while (0)

/* ---- the data ---- */

/* Rank r's element i: 1..3, exact in every dtype, products fit a uint8. */
static double val(int r, int64_t i) { return 1 + (r + 2 * i) % 3; }

static int is_int(tr_dtype_t dt) {
  return dt == TR_I32 || dt == TR_I64 || dt == TR_U16 || dt == TR_U8;
}

static double reduced(tr_pg_reduce_op_t op, tr_dtype_t dt, int n, int64_t i) {
  double s = 0, p = 1, mx = -1e300, mn = 1e300;
  for (int q = 0; q < n; q++) {
    double v = val(q, i);
    s += v;
    p *= v;
    mx = v > mx ? v : mx;
    mn = v < mn ? v : mn;
  }
  switch (op) {
    case TR_PG_SUM:
      return s;
    case TR_PG_AVG:
      return is_int(dt) ? floor(s / n) : s / n;
    case TR_PG_MAX:
      return mx;
    case TR_PG_MIN:
      return mn;
    default:
      return p;
  }
}

static void check_all_reduce(tr_pg_t* pg, pg_ctx_t* c, tr_dtype_t dt, int64_t k,
                             tr_pg_reduce_op_t op) {
  tr_tensor_t h = host(dt, k);
  for (int64_t i = 0; i < k; i++) put(&h, i, val(c->rank, i));
  tr_tensor_t t = to_dev(c, &h);
  PCHECK_RC(tr_pg_all_reduce(pg, &t, op, NULL));
  tr_tensor_t g = fetch(&t);
  for (int64_t i = 0; i < k; i++)
    PCHECK_VAL(dt, tr_tensor_get(&g, i), reduced(op, dt, c->size, i),
               tr_pg_reduce_op_name(op));
  tr_tensor_release(&g);
  tr_tensor_release(&t);
}

static void check_reduce_scatter(tr_pg_t* pg, pg_ctx_t* c, tr_dtype_t dt,
                                 int64_t k, tr_pg_reduce_op_t op) {
  int n = c->size;
  tr_tensor_t hi = host(dt, k * n), ho = host(dt, k);
  for (int64_t i = 0; i < k * n; i++) put(&hi, i, val(c->rank, i));
  tr_tensor_t in = to_dev(c, &hi), out = to_dev(c, &ho);
  PCHECK_RC(tr_pg_reduce_scatter(pg, &out, &in, op, NULL));
  tr_tensor_t g = fetch(&out);
  for (int64_t i = 0; i < k; i++)
    PCHECK_VAL(dt, tr_tensor_get(&g, i),
               reduced(op, dt, n, (int64_t)c->rank * k + i), "reduce_scatter");
  tr_tensor_release(&g);
  tr_tensor_release(&in);
  tr_tensor_release(&out);
}

static void check_reduce(tr_pg_t* pg, pg_ctx_t* c, tr_dtype_t dt, int64_t k,
                         tr_pg_reduce_op_t op) {
  int root = c->size - 1;
  tr_tensor_t h = host(dt, k);
  for (int64_t i = 0; i < k; i++) put(&h, i, val(c->rank, i));
  tr_tensor_t t = to_dev(c, &h);
  PCHECK_RC(tr_pg_reduce(pg, &t, root, op, NULL));
  tr_tensor_t g = fetch(&t);
  for (int64_t i = 0; i < k; i++)
    PCHECK_VAL(dt, tr_tensor_get(&g, i),
               c->rank == root ? reduced(op, dt, c->size, i) : val(c->rank, i),
               "reduce");
  tr_tensor_release(&g);
  tr_tensor_release(&t);
}

static void check_all_gather(tr_pg_t* pg, pg_ctx_t* c, tr_dtype_t dt,
                             int64_t k) {
  int n = c->size;
  tr_tensor_t hi = host(dt, k), ho = host(dt, k * n);
  for (int64_t i = 0; i < k; i++) put(&hi, i, val(c->rank, i));
  tr_tensor_t in = to_dev(c, &hi), out = to_dev(c, &ho);
  PCHECK_RC(tr_pg_all_gather(pg, &out, &in, NULL));
  tr_tensor_t g = fetch(&out);
  for (int q = 0; q < n; q++)
    for (int64_t i = 0; i < k; i++)
      PCHECK_VAL(dt, tr_tensor_get(&g, q * k + i), val(q, i), "all_gather");
  tr_tensor_release(&g);
  tr_tensor_release(&in);
  tr_tensor_release(&out);
}

static void check_broadcast(tr_pg_t* pg, pg_ctx_t* c, tr_dtype_t dt,
                            int64_t k) {
  int root = 1 % c->size;
  tr_tensor_t h = host(dt, k);
  if (c->rank == root)
    for (int64_t i = 0; i < k; i++) put(&h, i, val(root, i) + 1);
  tr_tensor_t t = to_dev(c, &h);
  PCHECK_RC(tr_pg_broadcast(pg, &t, root, NULL));
  tr_tensor_t g = fetch(&t);
  for (int64_t i = 0; i < k; i++)
    PCHECK_VAL(dt, tr_tensor_get(&g, i), val(root, i) + 1, "broadcast");
  tr_tensor_release(&g);
  tr_tensor_release(&t);
}

/* What rank `from` puts in element e of its block for rank `to`. */
static double a2a_val(int from, int to, int64_t e) {
  return 10 * from + to + e % 5;
}

static void check_all_to_all(tr_pg_t* pg, pg_ctx_t* c, tr_dtype_t dt,
                             int64_t k) {
  int n = c->size, r = c->rank;
  /* equal pieces of k elements */
  tr_tensor_t hi = host(dt, k * n), ho = host(dt, k * n);
  for (int j = 0; j < n; j++)
    for (int64_t e = 0; e < k; e++) put(&hi, j * k + e, a2a_val(r, j, e));
  tr_tensor_t in = to_dev(c, &hi), out = to_dev(c, &ho);
  PCHECK_RC(tr_pg_all_to_all(pg, &out, &in, NULL, NULL, NULL));
  tr_tensor_t g = fetch(&out);
  for (int j = 0; j < n; j++)
    for (int64_t e = 0; e < k; e++)
      PCHECK_VAL(dt, tr_tensor_get(&g, j * k + e), a2a_val(j, r, e),
                 "all_to_all");
  tr_tensor_release(&g);
  tr_tensor_release(&in);
  tr_tensor_release(&out);

  /* uneven: rank a sends (a + b + k) % 3 rows of 2 to rank b (some 0) */
  int64_t sin[16], sout[16], rin = 0, rout = 0;
  for (int j = 0; j < n; j++) {
    sin[j] = (r + j + k) % 3;
    sout[j] = (j + r + k) % 3;
    rin += sin[j];
    rout += sout[j];
  }
  int64_t shin[2] = {rin, 2}, shout[2] = {rout, 2};
  tr_tensor_t h2, o2;
  PCHECK_RC(tr_tensor_zeros(&h2, dt, TR_DEVICE_CPU, 2, shin));
  PCHECK_RC(tr_tensor_zeros(&o2, dt, TR_DEVICE_CPU, 2, shout));
  int64_t off = 0;
  for (int j = 0; j < n; j++)
    for (int64_t e = 0; e < sin[j] * 2; e++) put(&h2, off++, a2a_val(r, j, e));
  in = to_dev(c, &h2);
  out = to_dev(c, &o2);
  PCHECK_RC(tr_pg_all_to_all(pg, &out, &in, sout, sin, NULL));
  g = fetch(&out);
  off = 0;
  for (int j = 0; j < n; j++)
    for (int64_t e = 0; e < sout[j] * 2; e++)
      PCHECK_VAL(dt, tr_tensor_get(&g, off++), a2a_val(j, r, e),
                 "all_to_all uneven");
  tr_tensor_release(&g);
  tr_tensor_release(&in);
  tr_tensor_release(&out);
}

/* Ring exchange: every rank sends to r+1 and receives from r-1 in one
 * coalesced group (both sides send first). */
static void check_send_recv(tr_pg_t* pg, pg_ctx_t* c, tr_dtype_t dt,
                            int64_t k) {
  int n = c->size, r = c->rank, to = (r + 1) % n, from = (r - 1 + n) % n;
  tr_tensor_t hs = host(dt, k), hr = host(dt, k);
  for (int64_t i = 0; i < k; i++) put(&hs, i, 5 * r + i % 7);
  tr_tensor_t s = to_dev(c, &hs), d = to_dev(c, &hr);
  PCHECK_RC(tr_pg_coalesce_begin(pg));
  PCHECK_RC(tr_pg_send(pg, &s, to, 3, NULL));
  PCHECK_RC(tr_pg_recv(pg, &d, from, 3, NULL));
  tr_pg_work_t* w = NULL;
  PCHECK_RC(tr_pg_coalesce_end(pg, &w));
  PCHECK_RC(tr_pg_work_wait(w, 0));
  PCHECK(tr_pg_work_test(w) == 1);
  tr_pg_work_free(w);
  tr_tensor_t g = fetch(&d);
  for (int64_t i = 0; i < k; i++)
    PCHECK_VAL(dt, tr_tensor_get(&g, i), 5 * from + i % 7, "recv");
  tr_tensor_release(&g);
  tr_tensor_release(&s);
  tr_tensor_release(&d);
}

void pg_body_ops(tr_pg_t* pg, pg_ctx_t* c) {
  static const int64_t sizes[] = {1, 7, 1000};
  for (int dt = 0; dt < TR_DTYPE__COUNT; dt++) {
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
      int64_t k = sizes[s];
      for (int op = 0; op < TR_PG_REDUCE_OP__COUNT; op++) {
        check_all_reduce(pg, c, (tr_dtype_t)dt, k, (tr_pg_reduce_op_t)op);
        check_reduce_scatter(pg, c, (tr_dtype_t)dt, k, (tr_pg_reduce_op_t)op);
        check_reduce(pg, c, (tr_dtype_t)dt, k, (tr_pg_reduce_op_t)op);
      }
      check_all_gather(pg, c, (tr_dtype_t)dt, k);
      check_broadcast(pg, c, (tr_dtype_t)dt, k);
      check_all_to_all(pg, c, (tr_dtype_t)dt, k);
    }
    check_send_recv(pg, c, (tr_dtype_t)dt, 7);
  }
  PCHECK_RC(tr_pg_barrier(pg, NULL));

  /* Empty tensors. */
  check_all_reduce(pg, c, TR_F32, 0, TR_PG_SUM);
  check_all_gather(pg, c, TR_F32, 0);

  /* Integer sums wrap: n x 200 in uint8. */
  tr_tensor_t h = host(TR_U8, 3);
  for (int i = 0; i < 3; i++) put(&h, i, 200);
  tr_tensor_t t = to_dev(c, &h);
  PCHECK_RC(tr_pg_all_reduce(pg, &t, TR_PG_SUM, NULL));
  PCHECK_VAL(TR_U8, at(&t, 2), (200 * c->size) % 256, "u8 wrap");
  tr_tensor_release(&t);

  /* bf16 sums accumulate in float on CPU backends: 256 + 1 + 1 (+ 1) is
   * 256 when every step rounds to bf16, 258 (260) when rounded once. */
  if (c->cpu_float_sums && c->size >= 3) {
    h = host(TR_BF16, 1);
    put(&h, 0, c->rank == 0 ? 256 : 1);
    t = to_dev(c, &h);
    PCHECK_RC(tr_pg_all_reduce(pg, &t, TR_PG_SUM, NULL));
    double want = tr_bf16_to_f32(tr_f32_to_bf16(256.0f + c->size - 1));
    PCHECK(at(&t, 0) == want);
    tr_tensor_release(&t);
  }

  /* A strided (transposed) CPU tensor is reduced in place. */
  if (c->dev == TR_DEV_CPU) {
    int64_t shape[2] = {4, 3};
    tr_tensor_t base, tv;
    PCHECK_RC(tr_tensor_zeros(&base, TR_F32, TR_DEVICE_CPU, 2, shape));
    for (int i = 0; i < 12; i++) put(&base, i, i + c->rank);
    PCHECK_RC(tr_tensor_transpose(&tv, &base, 0, 1));
    PCHECK(!tr_tensor_is_contiguous(&tv));
    PCHECK_RC(tr_pg_all_reduce(pg, &tv, TR_PG_SUM, NULL));
    int rs = c->size * (c->size - 1) / 2;
    for (int i = 0; i < 12; i++)
      PCHECK(tr_tensor_get(&base, i) == (double)(i * c->size + rs));
    tr_tensor_release(&tv);
    tr_tensor_release(&base);
  }

  tr_pg_stats_t st;
  tr_pg_stats(pg, &st);
  PCHECK(st.calls[TR_PG_OP_ALL_REDUCE] >= 7 * 3 * 5);
  PCHECK(st.calls[TR_PG_OP_SEND] == TR_DTYPE__COUNT);
  PCHECK(tr_pg_error(pg) == NULL);
}

/* ---- sub-groups ---- */

static void sum_check(tr_pg_t* g, pg_ctx_t* c, double want) {
  tr_tensor_t h = host(TR_F32, 5);
  for (int i = 0; i < 5; i++) put(&h, i, c->rank + 1);
  tr_tensor_t t = to_dev(c, &h);
  PCHECK_RC(tr_pg_all_reduce(g, &t, TR_PG_SUM, NULL));
  PCHECK_VAL(TR_F32, at(&t, 4), want, "group sum");
  tr_tensor_release(&t);
}

void pg_body_subgroups(tr_pg_t* world, pg_ctx_t* c) {
  int n = c->size, r = c->rank;
  /* On GPUs the groups below are then ncclCommSplit from the world's. */
  if (c->dev == TR_DEV_CUDA) PCHECK_RC(tr_pg_connect(world, TR_DEV_CUDA));
  /* odd ranks, given out of order */
  int odd[8], m = 0;
  for (int i = n - 1; i >= 0; i--)
    if (i % 2) odd[m++] = i;
  tr_pg_t* g = NULL;
  PCHECK_RC(tr_pg_new_group(world, odd, m, "odd", &g));
  if (r % 2 == 0) {
    PCHECK(g == NULL);
  } else {
    PCHECK(g != NULL);
    PCHECK(tr_pg_size(g) == m);
    PCHECK(tr_pg_rank(g) == r / 2); /* sorted: 1, 3, ... */
    PCHECK(tr_pg_global_rank(g, 0) == 1);
    PCHECK(tr_pg_group_rank(g, r) == r / 2);
    PCHECK(!strcmp(tr_pg_name(g), "1"));
    PCHECK(!strcmp(tr_pg_desc(g), "odd"));
    double want = 0;
    for (int i = 0; i < m; i++) want += odd[i] + 1;
    sum_check(g, c, want);
  }

  /* split by parity, reversed order (key = -rank) */
  tr_pg_t* s = NULL;
  PCHECK_RC(tr_pg_split(world, r % 2, -r, "parity", &s));
  PCHECK(s != NULL);
  PCHECK(!strcmp(tr_pg_name(s), "2"));
  int cnt = (n - r % 2 + 1) / 2;
  PCHECK(tr_pg_size(s) == cnt);
  /* the highest rank of my parity is group rank 0 */
  int top = (n - 1) % 2 == r % 2 ? n - 1 : n - 2;
  PCHECK(tr_pg_global_rank(s, 0) == top);
  PCHECK(tr_pg_rank(s) == (top - r) / 2);
  {
    tr_tensor_t hi = host(TR_I32, 1), ho = host(TR_I32, cnt);
    put(&hi, 0, r);
    tr_tensor_t in = to_dev(c, &hi), out = to_dev(c, &ho);
    PCHECK_RC(tr_pg_all_gather(s, &out, &in, NULL));
    for (int i = 0; i < cnt; i++) PCHECK(at(&out, i) == top - 2 * i);
    tr_tensor_release(&in);
    tr_tensor_release(&out);
  }

  /* a rank outside every group of a split (color -1), and a split of a
   * sub-group */
  tr_pg_t* none = NULL;
  PCHECK_RC(tr_pg_split(world, r == 0 ? -1 : 7, r, NULL, &none));
  PCHECK((none == NULL) == (r == 0));
  if (none) {
    PCHECK(tr_pg_size(none) == n - 1);
    double want = 0;
    for (int i = 1; i < n; i++) want += i + 1;
    sum_check(none, c, want);
    tr_pg_t* sub = NULL;
    PCHECK_RC(tr_pg_split(none, 0, tr_pg_rank(none), "sub", &sub));
    PCHECK(sub != NULL);
    PCHECK(!strcmp(tr_pg_name(sub), "3.1"));
    sum_check(sub, c, want);
    tr_pg_free(sub);
  }

  /* ops of the world still work next to the groups */
  sum_check(world, c, n * (n + 1) / 2.0);
  tr_pg_free(none);
  tr_pg_free(s);
  tr_pg_free(g);
}

/* ---- async: overlap, test, wait with a timeout, callbacks ---- */

typedef struct {
  pthread_mutex_t mu;
  int calls;
  int status;
} cb_state_t;

static void on_done(tr_pg_work_t* w, int status, void* arg) {
  cb_state_t* s = arg;
  (void)w;
  pthread_mutex_lock(&s->mu);
  s->calls++;
  s->status = status;
  pthread_mutex_unlock(&s->mu);
}

static int cb_calls(cb_state_t* s) {
  for (int i = 0; i < 200; i++) {
    pthread_mutex_lock(&s->mu);
    int n = s->calls;
    pthread_mutex_unlock(&s->mu);
    if (n) return n;
    usleep(5000);
  }
  return 0;
}

static void store_wait(pg_ctx_t* c, const char* key) {
  void* v = NULL;
  size_t n = 0;
  PCHECK_RC(tr_store_client_get(c->store, key, &v, &n));
  free(v);
}

void pg_body_async(tr_pg_t* world, pg_ctx_t* c) {
  int n = c->size, r = c->rank;
  /* Two groups over the same ranks. Rank 0 issues A then B, everyone else
   * B then A (blocking): this completes only if the groups' ops overlap. */
  int all[16];
  for (int i = 0; i < n; i++) all[i] = i;
  /* NCCL communicators are made on the issuing thread: set the world's up
   * first, so that dup is split from it (the overlap below needs both). */
  if (c->dev == TR_DEV_CUDA) PCHECK_RC(tr_pg_connect(world, TR_DEV_CUDA));
  tr_pg_t* dup = NULL;
  PCHECK_RC(tr_pg_new_group(world, all, n, "dup", &dup));
  tr_tensor_t ha = host(TR_F32, 1000), hb = host(TR_F32, 1000);
  for (int i = 0; i < 1000; i++) {
    put(&ha, i, 1);
    put(&hb, i, 2);
  }
  tr_tensor_t a = to_dev(c, &ha), b = to_dev(c, &hb);
  /* First ops in the same order everywhere: NCCL connects a communicator's
   * peers on its first collective, which needs them all. */
  tr_tensor_t hw = host(TR_F32, 4);
  tr_tensor_t warm = to_dev(c, &hw);
  PCHECK_RC(tr_pg_all_reduce(world, &warm, TR_PG_SUM, NULL));
  PCHECK_RC(tr_pg_all_reduce(dup, &warm, TR_PG_SUM, NULL));
  tr_tensor_release(&warm);
  if (r == 0) {
    tr_pg_work_t *wa = NULL, *wb = NULL;
    PCHECK_RC(tr_pg_all_reduce(world, &a, TR_PG_SUM, &wa));
    PCHECK_RC(tr_pg_all_reduce(dup, &b, TR_PG_SUM, &wb));
    PCHECK_RC(tr_pg_work_wait(wb, 0));
    PCHECK_RC(tr_pg_work_wait(wa, 0));
    tr_pg_work_free(wa);
    tr_pg_work_free(wb);
  } else {
    PCHECK_RC(tr_pg_all_reduce(dup, &b, TR_PG_SUM, NULL));
    PCHECK_RC(tr_pg_all_reduce(world, &a, TR_PG_SUM, NULL));
  }
  PCHECK(at(&a, 999) == n);
  PCHECK(at(&b, 999) == 2 * n);
  tr_tensor_release(&a);
  tr_tensor_release(&b);

  /* test() and the callback: rank 1 sends only after rank 0 has seen its
   * receive pending. A first exchange connects the pair (NCCL's first
   * send/recv between two ranks blocks until both post one). */
  tr_tensor_t hx = host(TR_I64, 9);
  tr_tensor_t x = to_dev(c, &hx);
  if (r < 2) {
    tr_tensor_t hz = host(TR_I64, 9);
    tr_tensor_t z = to_dev(c, &hz);
    PCHECK_RC(tr_pg_coalesce_begin(world));
    PCHECK_RC(tr_pg_send(world, &z, 1 - r, 0, NULL));
    PCHECK_RC(tr_pg_recv(world, &x, 1 - r, 0, NULL));
    PCHECK_RC(tr_pg_coalesce_end(world, NULL));
    tr_tensor_release(&z);
  }
  if (r == 0) {
    cb_state_t cs = {PTHREAD_MUTEX_INITIALIZER, 0, 1};
    tr_pg_work_t* w = NULL;
    PCHECK_RC(tr_pg_recv(world, &x, 1, 0, &w));
    PCHECK(tr_pg_work_test(w) == 0);
    PCHECK(tr_pg_work_status(w) == 1);
    PCHECK(tr_pg_work_error(w) == NULL);
    PCHECK_RC(tr_pg_work_on_complete(w, on_done, &cs));
    PCHECK(tr_pg_work_on_complete(w, on_done, &cs) == TR_EINVAL);
    /* a bounded wait gives up without failing the op */
    PCHECK(tr_pg_work_wait(w, 50) == TR_ETIMEDOUT);
    PCHECK(tr_pg_work_test(w) == 0);
    PCHECK_RC(tr_store_client_set(c->store, "t/go", "1", 1));
    PCHECK_RC(tr_pg_work_wait(w, 0));
    PCHECK(tr_pg_work_test(w) == 1);
    PCHECK(tr_pg_work_status(w) == 0);
    PCHECK(cb_calls(&cs) == 1);
    PCHECK(cs.status == 0);
    PCHECK(at(&x, 8) == 42);
    tr_pg_work_free(w);
  } else if (r == 1) {
    store_wait(c, "t/go");
    tr_tensor_t hy = host(TR_I64, 9);
    for (int i = 0; i < 9; i++) put(&hy, i, 42);
    tr_tensor_t y = to_dev(c, &hy);
    tr_pg_work_t* w = NULL;
    PCHECK_RC(tr_pg_send(world, &y, 0, 0, &w));
    PCHECK_RC(tr_pg_work_wait(w, 0));
    tr_pg_work_free(w);
    tr_tensor_release(&y);
  }
  tr_tensor_release(&x);

  /* An empty coalesced group gives a completed work. */
  tr_pg_work_t* e = NULL;
  PCHECK_RC(tr_pg_coalesce_begin(world));
  PCHECK(tr_pg_coalesce_begin(world) == TR_EINVAL);
  PCHECK_RC(tr_pg_coalesce_end(world, &e));
  PCHECK(tr_pg_work_test(e) == 1 && tr_pg_work_status(e) == 0);
  /* a callback registered after completion runs at once */
  cb_state_t late = {PTHREAD_MUTEX_INITIALIZER, 0, 1};
  PCHECK_RC(tr_pg_work_on_complete(e, on_done, &late));
  PCHECK(late.calls == 1 && late.status == 0);
  tr_pg_work_free(e);
  PCHECK_RC(tr_pg_barrier(world, NULL));
  tr_pg_free(dup);
}

/* ---- a timeout that fires, and is reported ---- */

static pthread_mutex_t g_dump_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_dump_origin = -2;
static char g_dump_reason[1024];

static void dump_hook(void* arg, int origin, const char* reason) {
  (void)arg;
  pthread_mutex_lock(&g_dump_mu);
  g_dump_origin = origin;
  snprintf(g_dump_reason, sizeof g_dump_reason, "%s", reason);
  pthread_mutex_unlock(&g_dump_mu);
}

static int64_t since_ms(int64_t t0) { return now_ms() - t0; }

void pg_body_timeout(tr_pg_t* world, pg_ctx_t* c) {
  const char* b = tr_pg_backend_name(tr_pg_backend(world, c->dev));
  int is_mpi = !strcmp(b, "mpi");
  tr_pg_hooks_t hooks = {0};
  hooks.dump = dump_hook;
  tr_pg_set_hooks(&hooks);
  tr_tensor_t h = host(TR_F32, 16);
  tr_tensor_t t = to_dev(c, &h);
  PCHECK_RC(tr_pg_all_reduce(world, &t, TR_PG_SUM, NULL)); /* set-up */
  PCHECK_RC(tr_pg_barrier(world, NULL));
  tr_pg_set_timeout(world, 500);
  PCHECK(tr_pg_timeout(world) == 500);
  char want[512];
  snprintf(want, sizeof want,
           "process group '0' (default_pg) rank 0/2: %s:all_reduce seq %d "
           "timed out after 500 ms; peers: 1",
           b, 3);
  if (c->rank == 0) {
    tr_pg_work_t* w = NULL;
    int64_t t0 = now_ms();
    PCHECK_RC(tr_pg_all_reduce(world, &t, TR_PG_SUM, &w));
    int rc = tr_pg_work_wait(w, 0);
    int64_t el = since_ms(t0);
    PCHECK(rc == TR_ETIMEDOUT);
    if (strcmp(tr_pg_work_error(w), want)) {
      fprintf(stderr, "got  '%s'\nwant '%s'\n", tr_pg_work_error(w), want);
      PCHECK(0);
    }
    PCHECK(el >= 450 && el < 3000);
    PCHECK(tr_pg_error(world) && !strcmp(tr_pg_error(world), want));
    tr_pg_work_free(w);
    /* the group is broken: later ops fail at once */
    t0 = now_ms();
    PCHECK(tr_pg_all_reduce(world, &t, TR_PG_SUM, NULL) == TR_EABORTED);
    PCHECK(since_ms(t0) < 200);
    /* reported: the store keys and the dump hook */
    void* v = NULL;
    size_t n = 0;
    PCHECK_RC(tr_store_client_get(c->store, "trpg/0/error", &v, &n));
    char full[600];
    snprintf(full, sizeof full, "0\n%s", want);
    PCHECK(n == strlen(full) && !memcmp(v, full, n));
    free(v);
    PCHECK_RC(tr_store_client_get(c->store, "trpg/exception_dump", &v, &n));
    int32_t origin = -1;
    PCHECK(n == 4);
    memcpy(&origin, v, 4);
    PCHECK(origin == 0);
    free(v);
    for (int i = 0; i < 200 && g_dump_origin == -2; i++) usleep(10000);
    pthread_mutex_lock(&g_dump_mu);
    PCHECK(g_dump_origin == 0 && !strcmp(g_dump_reason, want));
    pthread_mutex_unlock(&g_dump_mu);
    PCHECK_RC(tr_store_client_set(c->store, "t/r0", "1", 1));
    store_wait(c, "t/r1");
  } else {
    /* Rank 1 joins late: after rank 0 reported. Its op may still complete
     * with what rank 0's timed-out op had sent before the abort (NCCL's
     * buffers, MPI's pending request); a second one cannot. */
    void* v = NULL;
    size_t n = 0;
    PCHECK_RC(tr_store_client_get(c->store, "trpg/0/error", &v, &n));
    PCHECK(n > 2 && !memcmp(v, "0\n", 2));
    free(v);
    int64_t t0 = now_ms();
    int rc = 0;
    tr_pg_work_t* w = NULL;
    for (int k = 0; k < 2 && rc == 0; k++) {
      tr_pg_work_free(w);
      w = NULL;
      rc = tr_pg_all_reduce(world, &t, TR_PG_SUM, &w);
      if (rc == 0) rc = tr_pg_work_wait(w, 0);
      if (is_mpi || (k == 0 && rc == 0 && !strcmp(b, "gloo"))) break;
    }
    PCHECK(since_ms(t0) < 4000);
    if (!is_mpi) {
      PCHECK(rc < 0);
      char pre[128];
      snprintf(pre, sizeof pre,
               "process group '0' (default_pg) rank 1/2: %s:all_reduce seq ",
               b);
      const char* e = w ? tr_pg_work_error(w) : tr_pg_error(world);
      if (!e || strncmp(e, pre, strlen(pre))) {
        fprintf(stderr, "rank 1: unexpected message '%s'\n", e ? e : "");
        PCHECK(0);
      }
    }
    tr_pg_work_free(w);
    PCHECK_RC(tr_store_client_set(c->store, "t/r1", "1", 1));
    store_wait(c, "t/r0");
  }
  tr_tensor_release(&t);
  tr_pg_set_hooks(NULL);
}

/* ---- a rank that dies mid-collective ---- */

static void die_now(void* arg, int64_t id, int64_t t) {
  (void)arg;
  (void)id;
  (void)t;
  _exit(PG_DIE_STATUS);
}

/* The last rank dies while the others are in a collective: on CPU
 * backends right as its own part of the op begins (the start hook runs on
 * its communication thread), on GPUs (where its kernel would be done in
 * microseconds) before issuing it. The others must get an error, soon. */
void pg_body_die(tr_pg_t* world, pg_ctx_t* c) {
  const char* b = tr_pg_backend_name(tr_pg_backend(world, c->dev));
  int64_t k = 4 << 20;
  tr_tensor_t h = host(TR_F32, k);
  tr_tensor_t t = to_dev(c, &h);
  PCHECK_RC(tr_pg_all_reduce(world, &t, TR_PG_SUM, NULL)); /* set-up */
  PCHECK_RC(tr_pg_barrier(world, NULL));
  /* CPU backends see the closed connections; NCCL may only time out */
  tr_pg_set_timeout(world, c->dev == TR_DEV_CUDA ? 5000 : 20000);
  tr_pg_work_t* w = NULL;
  if (c->rank == c->size - 1) {
    if (c->dev == TR_DEV_CUDA) {
      usleep(300000);
      _exit(PG_DIE_STATUS);
    }
    tr_pg_hooks_t hooks = {0};
    hooks.start = die_now;
    tr_pg_set_hooks(&hooks);
    PCHECK_RC(tr_pg_all_reduce(world, &t, TR_PG_SUM, &w));
    sleep(30);
    PCHECK(0); /* not reached */
  }
  PCHECK_RC(tr_pg_all_reduce(world, &t, TR_PG_SUM, &w));
  int64_t t0 = now_ms();
  int rc = tr_pg_work_wait(w, 0);
  PCHECK(rc < 0);
  PCHECK(since_ms(t0) < 15000);
  char pre[160];
  snprintf(pre, sizeof pre,
           "process group '0' (default_pg) rank %d/%d: %s:all_reduce seq 3 ",
           c->rank, c->size, b);
  const char* e = tr_pg_work_error(w);
  if (!e || strncmp(e, pre, strlen(pre))) {
    fprintf(stderr, "rank %d: unexpected message '%s'\n", c->rank,
            e ? e : "(null)");
    PCHECK(0);
  }
  tr_pg_work_free(w);
  tr_tensor_release(&t);
}

/* ---- flight-recorder hooks ---- */

typedef struct {
  tr_pg_record_t rec;
  char name[64];
  int64_t id;
  int started, completed, status;
} rec_t;

static pthread_mutex_t g_rec_mu = PTHREAD_MUTEX_INITIALIZER;
static rec_t g_recs[64];
static int g_nrec;
static int64_t g_group_id = -1;
static int g_group_n;
static char g_group_name[32];

static void h_group(void* arg, int64_t id, const char* name, const char* desc,
                    const int* ranks, int n) {
  (void)arg;
  (void)desc;
  pthread_mutex_lock(&g_rec_mu);
  g_group_id = id;
  g_group_n = n;
  snprintf(g_group_name, sizeof g_group_name, "%s", name);
  for (int i = 0; i < n; i++)
    if (ranks[i] != i) g_group_n = -1;
  pthread_mutex_unlock(&g_rec_mu);
}

static int64_t h_enqueue(void* arg, const tr_pg_record_t* r) {
  (void)arg;
  pthread_mutex_lock(&g_rec_mu);
  int i = g_nrec < 64 ? g_nrec++ : 63;
  g_recs[i].rec = *r;
  snprintf(g_recs[i].name, sizeof g_recs[i].name, "%s", r->profiling_name);
  g_recs[i].id = 1000 + i;
  pthread_mutex_unlock(&g_rec_mu);
  return 1000 + i;
}

static void h_start(void* arg, int64_t id, int64_t t) {
  (void)arg;
  (void)t;
  pthread_mutex_lock(&g_rec_mu);
  if (id >= 1000 && id < 1064) g_recs[id - 1000].started++;
  pthread_mutex_unlock(&g_rec_mu);
}

static void h_complete(void* arg, int64_t id, int64_t t, int status) {
  (void)arg;
  (void)t;
  pthread_mutex_lock(&g_rec_mu);
  if (id >= 1000 && id < 1064) {
    g_recs[id - 1000].completed++;
    g_recs[id - 1000].status = status;
  }
  pthread_mutex_unlock(&g_rec_mu);
}

void pg_body_hooks(tr_pg_t* world, pg_ctx_t* c) {
  int n = c->size, r = c->rank;
  const char* b = tr_pg_backend_name(tr_pg_backend(world, c->dev));
  tr_pg_hooks_t hooks = {NULL, h_group, h_enqueue, h_start, h_complete, NULL};
  tr_pg_set_hooks(&hooks);
  int all[16];
  for (int i = 0; i < n; i++) all[i] = i;
  tr_pg_t* g = NULL;
  PCHECK_RC(tr_pg_new_group(world, all, n, "hooked", &g));
  PCHECK(g_group_id == tr_pg_uid(g) && g_group_n == n);
  PCHECK(!strcmp(g_group_name, "1"));
  tr_pg_set_timeout(g, 12345);

  int64_t shape[2] = {2, 3};
  tr_tensor_t h;
  PCHECK_RC(tr_tensor_zeros(&h, TR_BF16, TR_DEVICE_CPU, 2, shape));
  tr_tensor_t t = to_dev(c, &h);
  PCHECK_RC(tr_pg_all_reduce(g, &t, TR_PG_MAX, NULL));
  tr_tensor_t s1 = host(TR_U8, 4), d1 = host(TR_U8, 4);
  tr_tensor_t s = to_dev(c, &s1), d = to_dev(c, &d1);
  int to = (r + 1) % n, from = (r - 1 + n) % n;
  PCHECK_RC(tr_pg_coalesce_begin(g));
  PCHECK_RC(tr_pg_send(g, &s, to, 0, NULL));
  PCHECK_RC(tr_pg_recv(g, &d, from, 0, NULL));
  PCHECK_RC(tr_pg_coalesce_end(g, NULL));
  /* CUDA works complete when their events are seen: wait for them */
  PCHECK_RC(tr_pg_barrier(g, NULL));
  tr_pg_free(g);
  tr_pg_set_hooks(NULL);

  pthread_mutex_lock(&g_rec_mu);
  PCHECK(g_nrec >= 4);
  char want[64];
  rec_t* a = &g_recs[0];
  snprintf(want, sizeof want, "%s:all_reduce", b);
  PCHECK(!strcmp(a->name, want));
  PCHECK(a->rec.pg_id == g_group_id);
  PCHECK(a->rec.op == TR_PG_OP_ALL_REDUCE && !a->rec.is_p2p);
  PCHECK(a->rec.collective_seq_id == 1 && a->rec.p2p_seq_id == 0);
  PCHECK(a->rec.op_id == 1 && a->rec.timeout_ms == 12345);
  PCHECK(a->rec.n_inputs == 1 && a->rec.n_outputs == 1);
  PCHECK(a->rec.inputs[0].ndim == 2 && a->rec.inputs[0].shape[1] == 3);
  PCHECK(a->rec.inputs[0].dtype == TR_BF16);
  PCHECK(a->rec.time_created_ns > 0);
  rec_t* sd = &g_recs[1];
  rec_t* rv = &g_recs[2];
  rec_t* co = &g_recs[3];
  snprintf(want, sizeof want, "%s:send %d->%d", b, r, to);
  PCHECK(!strcmp(sd->name, want));
  snprintf(want, sizeof want, "%s:recv %d<-%d", b, r, from);
  PCHECK(!strcmp(rv->name, want));
  snprintf(want, sizeof want, "%s:coalesced", b);
  PCHECK(!strcmp(co->name, want));
  PCHECK(sd->rec.is_p2p && rv->rec.is_p2p && co->rec.is_p2p);
  PCHECK(sd->rec.p2p_seq_id == 1 && rv->rec.p2p_seq_id == 1 &&
         co->rec.p2p_seq_id == 1);
  PCHECK(sd->rec.collective_seq_id == 1 && co->rec.op == TR_PG_OP_COALESCED);
  PCHECK(sd->rec.op_id == 2 && rv->rec.op_id == 3 && co->rec.op_id == 4);
  PCHECK(sd->rec.n_inputs == 1 && sd->rec.n_outputs == 0);
  PCHECK(rv->rec.n_inputs == 0 && rv->rec.n_outputs == 1);
  for (int i = 0; i < 4; i++) {
    PCHECK(g_recs[i].started == 1);
    PCHECK(g_recs[i].completed == 1 && g_recs[i].status == 0);
  }
  pthread_mutex_unlock(&g_rec_mu);
  tr_tensor_release(&t);
  tr_tensor_release(&s);
  tr_tensor_release(&d);
}

/* ---- op timing ---- */

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Every element of t is want. */
static void all_equal(const tr_tensor_t* t, double want) {
  tr_tensor_t h = fetch(t);
  for (int64_t i = 0; i < tr_tensor_numel(&h); i++)
    PCHECK(tr_tensor_get(&h, i) == want);
  tr_tensor_release(&h);
}

static tr_tensor_t filled(pg_ctx_t* c, int64_t n, double v) {
  tr_tensor_t h = host(TR_F32, n);
  for (int64_t i = 0; i < n; i++) put(&h, i, v);
  return to_dev(c, &h);
}

/* Issue-to-wait wall time of w's op: waits, checks its status and that its
 * duration is > 0 and inside [t0, now]. */
static void check_timed(tr_pg_work_t* w, int64_t t0) {
  PCHECK_RC(tr_pg_work_wait(w, 0));
  double wall_us = (double)(now_ns() - t0) / 1e3, us = -1;
  PCHECK_RC(tr_pg_work_duration_us(w, &us));
  if (!(us > 0 && us <= wall_us))
    fprintf(stderr, "rank %d: duration %.3f us, wall %.3f us\n", pg_test_rank,
            us, wall_us);
  PCHECK(us > 0 && us <= wall_us);
}

void pg_body_timing(tr_pg_t* world, pg_ctx_t* c) {
  int n = c->size;
  tr_tensor_t a = filled(c, 1 << 16, 1), b = filled(c, 1000, 2);
  tr_pg_work_t* w = NULL;
  double us = -1;
  PCHECK(tr_pg_work_duration_us(NULL, &us) == TR_EINVAL);
  PCHECK(tr_pg_set_op_timing(NULL, 1) == TR_EINVAL);

  /* Off by default (this first op also connects NCCL's peers). */
  PCHECK_RC(tr_pg_all_reduce(world, &a, TR_PG_SUM, &w));
  PCHECK_RC(tr_pg_work_wait(w, 0));
  PCHECK(tr_pg_work_duration_us(w, &us) == TR_EINVAL);
  PCHECK(us == -1);
  tr_pg_work_free(w);
  all_equal(&a, n);

  /* On: single ops of several sizes, the result unchanged. */
  PCHECK_RC(tr_pg_set_op_timing(world, 1));
  for (int i = 0; i < 3; i++) {
    tr_tensor_t* t = i == 1 ? &b : &a;
    int64_t t0 = now_ns();
    PCHECK_RC(tr_pg_all_reduce(world, t, TR_PG_SUM, &w));
    check_timed(w, t0);
    tr_pg_work_free(w);
  }
  all_equal(&a, (double)n * n * n);
  all_equal(&b, 2.0 * n);

  /* A coalesced batch: one duration for the whole batch. */
  int64_t t0 = now_ns();
  PCHECK_RC(tr_pg_coalesce_begin(world));
  PCHECK_RC(tr_pg_all_reduce(world, &a, TR_PG_MAX, NULL));
  PCHECK_RC(tr_pg_all_reduce(world, &b, TR_PG_SUM, NULL));
  PCHECK_RC(tr_pg_coalesce_end(world, &w));
  check_timed(w, t0);
  tr_pg_work_free(w);
  all_equal(&b, 2.0 * n * n);

  /* Pending: rank 0's op cannot complete before every rank issued its
   * own, and the others issue only after rank 0 has looked. */
  t0 = now_ns();
  if (c->rank == 0) {
    PCHECK_RC(tr_pg_all_reduce(world, &b, TR_PG_MIN, &w));
    PCHECK(tr_pg_work_duration_us(w, &us) == TR_EAGAIN);
    PCHECK(tr_pg_work_test(w) == 0);
    PCHECK_RC(tr_store_client_set(c->store, "timing/looked", "1", 1));
  } else {
    store_wait(c, "timing/looked");
    t0 = now_ns();
    PCHECK_RC(tr_pg_all_reduce(world, &b, TR_PG_MIN, &w));
  }
  check_timed(w, t0);
  tr_pg_work_free(w);

  /* Off again: ops issued from now on have no duration. */
  PCHECK_RC(tr_pg_set_op_timing(world, 0));
  PCHECK_RC(tr_pg_all_reduce(world, &b, TR_PG_SUM, &w));
  PCHECK_RC(tr_pg_work_wait(w, 0));
  PCHECK(tr_pg_work_duration_us(w, &us) == TR_EINVAL);
  tr_pg_work_free(w);
  all_equal(&b, 2.0 * n * n * n);
  tr_tensor_release(&a);
  tr_tensor_release(&b);
}

/* trainrun/pg_waits.h: the compute's waits for works (host on the CPU,
 * streams on CUDA with the handles held, at most lag of them) and their
 * timing: untimed waits count nothing; timed ones count every op once
 * with its duration, and the take zeroes the totals and the steps. */
void pg_body_waits(tr_pg_t* world, pg_ctx_t* c) {
  int n = c->size, cuda = c->dev == TR_DEV_CUDA;
  PCHECK(tr_pg_comm_hidden(10, 2) == 0.8);
  PCHECK(tr_pg_comm_hidden(10, 20) == 0 && tr_pg_comm_hidden(10, -1) == 1);
  PCHECK(isnan(tr_pg_comm_hidden(0, 1)));
  tr_tensor_t a = filled(c, 1 << 12, 1);
  tr_pg_waits_t q;
  tr_pg_comm_t out;
  tr_pg_work_t* w = NULL;
  int64_t steps = 1;
  PCHECK_RC(tr_pg_waits_init(&q, 2));
  PCHECK_RC(tr_pg_all_reduce(world, &a, TR_PG_SUM, &w));
  PCHECK_RC(tr_pg_waits_wait(&q, w, cuda, 1, 0, "all-reduce", "test", "a"));
  PCHECK_RC(tr_pg_waits_drain(&q));
  tr_pg_waits_take(&q, &steps, &out);
  PCHECK(out.steps == 1 && steps == 0 && out.ops == 0 && out.comm_ms == 0 &&
         out.exposed_ms == 0 && isnan(out.hidden));

  PCHECK_RC(tr_pg_set_op_timing(world, 1));
  for (int i = 0; i < 5; i++) { /* past the lag: the oldest settled */
    PCHECK_RC(tr_pg_all_reduce(world, &a, TR_PG_SUM, &w));
    PCHECK_RC(tr_pg_waits_wait(&q, w, cuda, 1, 1, "all-reduce", "test", "a"));
    PCHECK(q.nheld <= 2 && (cuda || q.nheld == 0));
  }
  PCHECK_RC(tr_pg_waits_drain(&q));
  PCHECK(q.nheld == 0);
  steps = 2;
  tr_pg_waits_take(&q, &steps, &out);
  if (!(out.ops == 5 && out.comm_ms > 0 && out.exposed_ms >= 0))
    fprintf(stderr, "rank %d: ops %lld comm %g ms exposed %g ms\n",
            pg_test_rank, (long long)out.ops, out.comm_ms, out.exposed_ms);
  PCHECK(out.steps == 2 && out.ops == 5 && out.comm_ms > 0 &&
         out.exposed_ms >= 0);
  PCHECK(out.hidden == tr_pg_comm_hidden(out.comm_ms, out.exposed_ms));
  all_equal(&a, pow(n, 6)); /* the results the waits ordered */
  tr_pg_waits_take(&q, &steps, &out);
  PCHECK(out.steps == 0 && out.ops == 0 && out.comm_ms == 0 &&
         out.exposed_ms == 0);
  PCHECK_RC(tr_pg_set_op_timing(world, 0));
  tr_pg_waits_release(&q);
  tr_tensor_release(&a);
}

void pg_body_job_failure(tr_pg_t* world, pg_ctx_t* c) {
  tr_tensor_t h = host(TR_F32, 16);
  tr_tensor_t t = to_dev(c, &h);
  PCHECK_RC(tr_pg_all_reduce(world, &t, TR_PG_SUM, NULL)); /* set-up */
  PCHECK_RC(tr_pg_barrier(world, NULL));
  const char* report =
      "rank 1 (local rank 1, pid 4242) on node 0 'h' was killed by SIGKILL\n"
      "last lines: ...";
  if (c->rank == 1) {
    /* alive, but out of the next op: as a dead peer on NCCL looks */
    usleep(300 * 1000);
    PCHECK_RC(tr_store_client_set(c->store, pg_failure_key, report,
                                  strlen(report)));
    const char* k = "test/rank0_done";
    PCHECK_RC(tr_store_client_wait(c->store, &k, 1, 30000));
  } else {
    tr_pg_work_t* w = NULL;
    int64_t t0 = now_ms();
    PCHECK_RC(tr_pg_all_reduce(world, &t, TR_PG_SUM, &w));
    int rc = tr_pg_work_wait(w, 0); /* the op timeout is 30 s */
    int64_t el = since_ms(t0);
    if (rc != TR_EABORTED)
      fprintf(stderr, "rc %s: %s\n", tr_err_name(rc), tr_pg_work_error(w));
    PCHECK(rc == TR_EABORTED);
    const char* want =
        "the job failed: rank 1 (local rank 1, pid 4242) on node 0 'h' was "
        "killed by SIGKILL";
    if (!tr_pg_work_error(w) || !strstr(tr_pg_work_error(w), want)) {
      fprintf(stderr, "got  '%s'\nwant '...%s'\n", tr_pg_work_error(w), want);
      PCHECK(0);
    }
    PCHECK(el >= 250 && el < 5000);
    tr_pg_work_free(w);
    /* the group is broken: later ops fail at once */
    PCHECK(tr_pg_all_reduce(world, &t, TR_PG_SUM, NULL) == TR_EABORTED);
    PCHECK_RC(tr_store_client_set(c->store, "test/rank0_done", "1", 1));
  }
  tr_tensor_release(&t);
}
