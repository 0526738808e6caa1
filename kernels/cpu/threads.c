/* kernels/cpu/threads.c: the CPU kernels' thread pool.
 *
 * One pool per process: n-1 worker threads plus the calling thread. A
 * parallel region publishes (fn, ctx, ntasks) under a generation number;
 * threads take task indices from an atomic counter until none are left, and
 * the caller waits until every task has finished. Workers spin briefly for
 * the next region (kernels come in quick succession during a step) and then
 * sleep on a condition variable. Which thread runs which task never affects
 * results: tasks write disjoint outputs (see cpu.h).
 */
#include "config.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include "kernels/cpu/cpu.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/param.h"

#define SPIN_ITERS 20000

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

/* One parallel region; lives on the caller's stack until every thread that
 * could see it has left it (see tr__cpu_parallel). */
typedef struct {
  tr__cpu_task_fn fn;
  void* ctx;
  int64_t ntasks;
  int64_t next; /* atomic: next task index to take */
  int64_t done; /* atomic: tasks finished */
} region_t;

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t wake;
  int nthreads; /* including the caller */
  pthread_t* workers;
  region_t* region; /* atomic: the current region or NULL */
  uint64_t gen;     /* atomic: bumped per region */
  int active;       /* atomic: workers that may be looking at region */
  int stop;         /* atomic */
  int started;      /* atomic */
} pool_t;

static pool_t pool = {.mu = PTHREAD_MUTEX_INITIALIZER,
                      .wake = PTHREAD_COND_INITIALIZER};
static pthread_mutex_t pool_init_mu = PTHREAD_MUTEX_INITIALIZER;
static __thread int tls_index; /* 0 for every non-worker thread */
static __thread int tls_in_region;

int tr__cpu_thread_index(void) { return tls_index; }

/* ---- per-thread scratch, freed when the thread exits ---- */

typedef struct {
  void* p[TR__CPU_SCRATCH_SLOTS];
  size_t n[TR__CPU_SCRATCH_SLOTS];
} scratch_t;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void* arg) {
  scratch_t* s = arg;
  for (int i = 0; i < TR__CPU_SCRATCH_SLOTS; i++) free(s->p[i]);
  free(s);
}

static void scratch_key_init(void) {
  if (pthread_key_create(&scratch_key, scratch_free) != 0) abort();
}

void* tr__cpu_scratch(int slot, size_t bytes) {
  pthread_once(&scratch_once, scratch_key_init);
  scratch_t* s = pthread_getspecific(scratch_key);
  if (!s) {
    s = calloc(1, sizeof *s);
    if (!s || pthread_setspecific(scratch_key, s) != 0) abort();
  }
  if (s->n[slot] < bytes) {
    free(s->p[slot]);
    size_t n = (bytes + 63) / 64 * 64;
    s->p[slot] = aligned_alloc(64, n);
    if (!s->p[slot]) abort(); /* kernel scratch is small: see callers */
    s->n[slot] = n;
  }
  return s->p[slot];
}

static void run_tasks(region_t* r) {
  for (;;) {
    int64_t i = __atomic_fetch_add(&r->next, 1, __ATOMIC_ACQ_REL);
    if (i >= r->ntasks) break;
    r->fn(r->ctx, i);
    __atomic_add_fetch(&r->done, 1, __ATOMIC_ACQ_REL);
  }
}

static void* worker_main(void* arg) {
  tls_index = (int)(intptr_t)arg;
  tls_in_region = 1;
  uint64_t seen = 0;
  for (;;) {
    uint64_t g = seen;
    for (int spin = 0; spin < SPIN_ITERS; spin++) {
      g = __atomic_load_n(&pool.gen, __ATOMIC_ACQUIRE);
      if (g != seen || __atomic_load_n(&pool.stop, __ATOMIC_ACQUIRE)) break;
      if (spin % 1024 == 1023)
        sched_yield();
      else
        cpu_relax();
    }
    if (g == seen && !__atomic_load_n(&pool.stop, __ATOMIC_ACQUIRE)) {
      pthread_mutex_lock(&pool.mu);
      while ((g = __atomic_load_n(&pool.gen, __ATOMIC_ACQUIRE)) == seen &&
             !__atomic_load_n(&pool.stop, __ATOMIC_ACQUIRE))
        pthread_cond_wait(&pool.wake, &pool.mu);
      pthread_mutex_unlock(&pool.mu);
    }
    if (__atomic_load_n(&pool.stop, __ATOMIC_ACQUIRE)) break;
    seen = g;
    /* Announce before looking: the caller clears `region` and then waits
     * for active == 0, so a region seen here stays alive until we leave. */
    __atomic_add_fetch(&pool.active, 1, __ATOMIC_SEQ_CST);
    region_t* r = __atomic_load_n(&pool.region, __ATOMIC_SEQ_CST);
    if (r) run_tasks(r);
    __atomic_sub_fetch(&pool.active, 1, __ATOMIC_SEQ_CST);
  }
  return NULL;
}

static int count_cores(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

static int threads_from_env(void) {
  int64_t n = tr_param_int(TR_PARAM_NUM_THREADS);
  if (n <= 0) n = tr_param_int(TR_PARAM_OMP_NUM_THREADS);
  if (n <= 0) n = count_cores();
  return (int)n;
}

static void pool_stop_locked(void) {
  if (!pool.started) return;
  pthread_mutex_lock(&pool.mu);
  __atomic_store_n(&pool.stop, 1, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&pool.wake);
  pthread_mutex_unlock(&pool.mu);
  for (int i = 0; i < pool.nthreads - 1; i++)
    pthread_join(pool.workers[i], NULL);
  free(pool.workers);
  pool.workers = NULL;
  pool.started = 0;
  pool.stop = 0;
}

static int pool_start_locked(int n) {
  if (n < 1) n = 1;
  pool.nthreads = n;
  pool.gen = 0;
  pool.region = NULL;
  pool.workers = NULL;
  if (n > 1) {
    pool.workers = calloc((size_t)n - 1, sizeof(pthread_t));
    if (!pool.workers) return TR_ENOMEM;
    for (int i = 0; i < n - 1; i++) {
      int rc = pthread_create(&pool.workers[i], NULL, worker_main,
                              (void*)(intptr_t)(i + 1));
      if (rc != 0) {
        TR_LOG_WARN(KERN, "cannot start kernel thread %d of %d: %s", i + 1, n,
                    tr_strerror(-rc));
        pool.nthreads = i + 1; /* run with what started */
        break;
      }
    }
  }
  __atomic_store_n(&pool.started, 1, __ATOMIC_RELEASE);
  TR_LOG_DEBUG(KERN, "cpu kernels use %d threads", pool.nthreads);
  return 0;
}

static void pool_ensure(void) {
  if (__atomic_load_n(&pool.started, __ATOMIC_ACQUIRE)) return;
  pthread_mutex_lock(&pool_init_mu);
  if (!pool.started) pool_start_locked(threads_from_env());
  pthread_mutex_unlock(&pool_init_mu);
}

int tr_kern_cpu_num_threads(void) {
  pool_ensure();
  return pool.nthreads;
}

int tr_kern_cpu_set_num_threads(int n) {
  if (n < 0) return TR_EINVAL;
  pthread_mutex_lock(&pool_init_mu);
  pool_stop_locked();
  int rc = pool_start_locked(n == 0 ? threads_from_env() : n);
  pthread_mutex_unlock(&pool_init_mu);
  return rc;
}

void tr__cpu_parallel(int64_t ntasks, tr__cpu_task_fn fn, void* ctx) {
  if (ntasks <= 0) return;
  pool_ensure();
  if (ntasks == 1 || pool.nthreads == 1 || tls_in_region) {
    for (int64_t i = 0; i < ntasks; i++) fn(ctx, i);
    return;
  }
  region_t r = {fn, ctx, ntasks, 0, 0};
  tls_in_region = 1;
  __atomic_store_n(&pool.region, &r, __ATOMIC_SEQ_CST);
  pthread_mutex_lock(&pool.mu);
  __atomic_add_fetch(&pool.gen, 1, __ATOMIC_ACQ_REL);
  pthread_cond_broadcast(&pool.wake);
  pthread_mutex_unlock(&pool.mu);
  run_tasks(&r);
  /* wait for tasks other threads took; yield now and then, in case they
   * were preempted on a machine with more threads than free cores */
  for (unsigned spin = 1; __atomic_load_n(&r.done, __ATOMIC_ACQUIRE) < ntasks;
       spin++)
    if (spin % 1024 == 0)
      sched_yield();
    else
      cpu_relax();
  __atomic_store_n(&pool.region, NULL, __ATOMIC_SEQ_CST);
  for (unsigned spin = 1; __atomic_load_n(&pool.active, __ATOMIC_SEQ_CST) != 0;
       spin++)
    if (spin % 1024 == 0)
      sched_yield();
    else
      cpu_relax();
  tls_in_region = 0;
}

void tr_kern_cpu_parallel(int64_t ntasks, void (*fn)(void* ctx, int64_t i),
                          void* ctx) {
  tr__cpu_parallel(ntasks, fn, ctx);
}
