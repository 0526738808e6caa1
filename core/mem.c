/* core/mem.c: the host, pinned-host and device allocators with byte
 * accounting (current, peak, live and total allocations per kind/device). */
#include "config.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#endif

#include "core/cuda.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/param.h"
#include "trainrun/tensor.h"

typedef struct {
  int64_t current, peak, live, total;
} mem_counter_t;

/* [kind][device]; host and pinned use device 0 only. */
static mem_counter_t counters[3][TR_MAX_DEVICES];

static mem_counter_t* counter(tr_mem_kind_t kind, int device) {
  if (kind != TR_MEM_DEVICE) device = 0;
  if (device < 0 || device >= TR_MAX_DEVICES) device = TR_MAX_DEVICES - 1;
  return &counters[kind][device];
}

static void account(mem_counter_t* c, int64_t delta) {
  int64_t now = __atomic_add_fetch(&c->current, delta, __ATOMIC_RELAXED);
  if (delta > 0) {
    __atomic_add_fetch(&c->live, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&c->total, 1, __ATOMIC_RELAXED);
    int64_t peak = __atomic_load_n(&c->peak, __ATOMIC_RELAXED);
    while (now > peak &&
           !__atomic_compare_exchange_n(&c->peak, &peak, now, 1,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
  } else {
    __atomic_sub_fetch(&c->live, 1, __ATOMIC_RELAXED);
  }
}

/* Pinned memory comes from CUDA when this build has CUDA and the machine a
 * device; else it is page-aligned host memory (nothing to pin for). Decided
 * once per process, so a buffer is always freed the way it was allocated. */
static int pinned_via_cuda(void) {
#ifdef HAVE_CUDA
  static int state; /* 0 unknown, 1 CUDA, 2 host */
  int v = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
  if (v == 0) {
    v = tr__cuda_device_count() > 0 ? 1 : 2;
    __atomic_store_n(&state, v, __ATOMIC_RELEASE);
  }
  return v == 1;
#else
  return 0;
#endif
}

/* ---- host blocks kept for reuse ----
 * A host block of HC_MIN bytes or more goes, when freed, to a small cache
 * keyed by its size and alignment, and the next allocation of that size
 * takes it back. A training step frees and allocates the same activation
 * sizes every step, and a fresh large block costs a mapping and a page
 * fault per page (ASan maps every block above 128 KiB afresh; on the CPU
 * suite under ASan the faults were ~15% of a run). At most HC_SLOTS blocks
 * and HC_BYTES are kept; what does not fit is freed. Under ASan a kept
 * block is poisoned, so a use after free is still reported; a block freed
 * twice aborts, as glibc's free does. A kept block serves any alignment
 * its address meets. The counters see a kept block as freed. */
#define HC_MIN ((size_t)128 << 10)
#define HC_SLOTS 64
#define HC_BYTES ((size_t)256 << 20)

typedef struct {
  void* p;
  size_t n, align; /* align: the largest power of two p is a multiple of */
} hc_block_t;

static struct {
  pthread_mutex_t mu;
  hc_block_t b[HC_SLOTS];
  int n;
  size_t bytes;
} hc = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* a fork while another thread holds the cache's lock: the child's stays
 * usable */
static void hc_lock(void) { pthread_mutex_lock(&hc.mu); }
static void hc_unlock(void) { pthread_mutex_unlock(&hc.mu); }
static pthread_once_t hc_once = PTHREAD_ONCE_INIT;
static void hc_init(void) { pthread_atfork(hc_lock, hc_unlock, hc_unlock); }

static void* hc_take(size_t n, size_t align) {
  if (n < HC_MIN) return NULL;
  void* p = NULL;
  hc_lock();
  for (int i = hc.n - 1; i >= 0; i--) /* the latest first: warm in cache */
    if (hc.b[i].n == n && hc.b[i].align >= align) {
      p = hc.b[i].p;
      hc.bytes -= n;
      hc.b[i] = hc.b[--hc.n];
      break;
    }
  hc_unlock();
#ifdef __SANITIZE_ADDRESS__
  if (p) ASAN_UNPOISON_MEMORY_REGION(p, n);
#endif
  return p;
}

/* 1: p kept; 0: the caller frees it */
static int hc_put(void* p, size_t n) {
  if (n < HC_MIN) return 0;
  pthread_once(&hc_once, hc_init);
  int kept = 0;
  hc_lock();
  for (int i = 0; i < hc.n; i++)
    if (hc.b[i].p == p) {
      hc_unlock();
      TR_LOG_ERROR(CORE, "host block %p (%zu bytes) freed twice", p, n);
      abort();
    }
  if (hc.n < HC_SLOTS && hc.bytes + n <= HC_BYTES) {
    /* poisoned before another thread can take it */
#ifdef __SANITIZE_ADDRESS__
    ASAN_POISON_MEMORY_REGION(p, n);
#endif
    uintptr_t a = (uintptr_t)p & (~(uintptr_t)p + 1);
    hc.b[hc.n++] = (hc_block_t){p, n, (size_t)a};
    hc.bytes += n;
    kept = 1;
  }
  hc_unlock();
  return kept;
}

static size_t host_align(void) {
  size_t a = (size_t)tr_param_int(TR_PARAM_ALLOC_ALIGN);
  if (a & (a - 1)) a = 64; /* not a power of two: the registry bounds it */
  return a;
}

int tr_mem_alloc(tr_mem_kind_t kind, int device, size_t nbytes, void** out) {
  void* p = NULL;
  /* a zero-byte request still gets a distinct buffer */
  size_t n = nbytes ? nbytes : 1;
  switch (kind) {
    case TR_MEM_HOST: {
      size_t a = host_align();
      if (a < sizeof(void*)) a = sizeof(void*);
      p = hc_take(n, a);
      if (!p && posix_memalign(&p, a, n) != 0) return TR_ENOMEM;
      break;
    }
    case TR_MEM_PINNED: {
      if (pinned_via_cuda()) {
#ifdef HAVE_CUDA
        int rc = tr__cuda_host_alloc(n, &p);
        if (rc < 0) return rc;
#endif
      } else {
        long page = sysconf(_SC_PAGESIZE);
        if (posix_memalign(&p, page > 0 ? (size_t)page : 4096, n) != 0)
          return TR_ENOMEM;
      }
      break;
    }
    case TR_MEM_DEVICE: {
#ifdef HAVE_CUDA
      if (device < 0 || device >= TR_MAX_DEVICES) return TR_EINVAL;
      int rc = tr__cuda_malloc(device, n, &p);
      if (rc < 0) return rc;
#else
      TR_LOG_ERROR(CORE,
                   "cannot allocate %zu bytes on cuda:%d: built without CUDA",
                   nbytes, device);
      return TR_EUNSUPPORTED;
#endif
      break;
    }
    default:
      return TR_EINVAL;
  }
  account(counter(kind, device), (int64_t)nbytes);
  *out = p;
  return 0;
}

void tr_mem_free(tr_mem_kind_t kind, int device, void* p, size_t nbytes) {
  if (!p) return;
  switch (kind) {
    case TR_MEM_HOST:
      if (!hc_put(p, nbytes ? nbytes : 1)) free(p);
      break;
    case TR_MEM_PINNED:
      if (pinned_via_cuda()) {
#ifdef HAVE_CUDA
        tr__cuda_host_free(p);
#endif
      } else {
        free(p);
      }
      break;
    case TR_MEM_DEVICE:
#ifdef HAVE_CUDA
      tr__cuda_free(device, p);
#endif
      break;
  }
  account(counter(kind, device), -(int64_t)nbytes);
}

void tr_mem_stats(tr_mem_kind_t kind, int device, tr_mem_stats_t* out) {
  mem_counter_t* c = counter(kind, device);
  out->current_bytes = __atomic_load_n(&c->current, __ATOMIC_RELAXED);
  out->peak_bytes = __atomic_load_n(&c->peak, __ATOMIC_RELAXED);
  out->live_allocs = __atomic_load_n(&c->live, __ATOMIC_RELAXED);
  out->total_allocs = __atomic_load_n(&c->total, __ATOMIC_RELAXED);
}

void tr_mem_reset_peak(tr_mem_kind_t kind, int device) {
  mem_counter_t* c = counter(kind, device);
  __atomic_store_n(&c->peak, __atomic_load_n(&c->current, __ATOMIC_RELAXED),
                   __ATOMIC_RELAXED);
}
