/* flight_recorder/recorder.c: the writer side of the flight recorder -- it
 * creates the rank's ring in POSIX shared memory, registers the process
 * group hooks and records every op into the ring without locks or system
 * calls (one atomic add for the record id, a sequence counter per slot).
 * Optional native stacks (backtrace(), symbolised once per address with
 * dladdr into the ring's symbol table, so a reader in another process can
 * print them). SIGUSR1 asks the daemon for a dump. */
#include "config.h"

#include <dlfcn.h> /* dladdr */
#include <errno.h>
#include <execinfo.h> /* backtrace */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/clock.h"
#include "flight_recorder/ring.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/param.h"

#define SYM_HASH 4096 /* process-local address -> symbol index cache */
#define UID_MAP 4096  /* pg uid -> group slot, for uids below this */

struct tr_fr_s {
  tr__fr_shm_hdr_t* h;
  tr__fr_shm_entry_t* ents;
  size_t size;
  uint32_t cap;
  char name[256];
  int stacks;
  int16_t uid_slot[UID_MAP]; /* -1: none */
  pthread_mutex_t sym_mu;    /* symbolising a new address (cold path) */
  uint64_t sym_addr[SYM_HASH];
  uint16_t sym_idx[SYM_HASH];
  struct sigaction old_usr1;
  int usr1_set;
};

static tr_fr_t* g_fr; /* the process's recorder (hooks and SIGUSR1) */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* ---- per-thread identity (one system call per thread, then cached) ---- */

static __thread int64_t t_tid;
static __thread char t_tname[16];

static void thread_ident(void) {
  if (t_tid) return;
  t_tid = (int64_t)syscall(SYS_gettid);
  if (pthread_getname_np(pthread_self(), t_tname, sizeof t_tname) != 0)
    t_tname[0] = '\0';
}

/* ---- slot claims ---- */

/* Make slot's counter odd for record `id` (waiting out a short update of
 * the record that held it). Returns the odd value. */
static uint64_t claim_new(uint64_t* seq, uint64_t id) {
  uint64_t want = ((id + 1) << 8) | 1;
  for (;;) {
    uint64_t s = __atomic_load_n(seq, __ATOMIC_RELAXED);
    if (s & 1) {
      cpu_relax();
      continue;
    }
    if (__atomic_compare_exchange_n(seq, &s, want, 0, __ATOMIC_ACQUIRE,
                                    __ATOMIC_RELAXED))
      return want;
  }
}

/* Claim record id's slot for an update: 1 with the odd counter in *held,
 * 0 when the slot holds another record by now. */
static int claim_update(uint64_t* seq, uint64_t id, uint64_t* held) {
  for (;;) {
    uint64_t s = __atomic_load_n(seq, __ATOMIC_RELAXED);
    if ((s >> 8) != id + 1 || (s & 0xff) >= 0xf0) return 0;
    if (s & 1) {
      cpu_relax();
      continue;
    }
    if (__atomic_compare_exchange_n(seq, &s, s + 1, 0, __ATOMIC_ACQUIRE,
                                    __ATOMIC_RELAXED)) {
      *held = s + 1;
      return 1;
    }
  }
}

static void atomic_max(int64_t* p, int64_t v) {
  int64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (cur < v && !__atomic_compare_exchange_n(
                        p, &cur, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

/* ---- symbols ---- */

/* The symbol table index of addr (symbolised on first sight), or -1. */
static int sym_index(tr_fr_t* fr, uint64_t addr) {
  unsigned hsh = (unsigned)((addr * 0x9E3779B97F4A7C15ull) >> 52) % SYM_HASH;
  for (unsigned k = 0; k < 16; k++) {
    unsigned i = (hsh + k) % SYM_HASH;
    uint64_t a = __atomic_load_n(&fr->sym_addr[i], __ATOMIC_ACQUIRE);
    if (a == addr) return fr->sym_idx[i];
    if (a == 0) break;
  }
  pthread_mutex_lock(&fr->sym_mu);
  int idx = -1;
  tr__fr_shm_hdr_t* h = fr->h;
  unsigned i = hsh, k;
  for (k = 0; k < 16; k++, i = (i + 1) % SYM_HASH) {
    uint64_t a = fr->sym_addr[i];
    if (a == addr) {
      idx = fr->sym_idx[i];
      goto out;
    }
    if (a == 0) break;
  }
  if (k == 16 || h->nsyms >= TR__FR_MAX_SYMS) goto out;
  idx = (int)h->nsyms;
  tr__fr_shm_sym_t* s = &h->syms[idx];
  Dl_info di;
  memset(&di, 0, sizeof di);
  s->addr = addr;
  if (dladdr((void*)(uintptr_t)addr, &di) && di.dli_sname)
    snprintf(s->name, sizeof s->name, "%s+0x%llx", di.dli_sname,
             (unsigned long long)(addr - (uint64_t)(uintptr_t)di.dli_saddr));
  else if (di.dli_fbase)
    snprintf(s->name, sizeof s->name, "0x%llx",
             (unsigned long long)(addr - (uint64_t)(uintptr_t)di.dli_fbase));
  else
    snprintf(s->name, sizeof s->name, "0x%llx", (unsigned long long)addr);
  snprintf(s->file, sizeof s->file, "%s", di.dli_fname ? di.dli_fname : "??");
  __atomic_store_n(&h->nsyms, (uint32_t)idx + 1, __ATOMIC_RELEASE);
  fr->sym_idx[i] = (uint16_t)idx;
  __atomic_store_n(&fr->sym_addr[i], addr, __ATOMIC_RELEASE);
out:
  pthread_mutex_unlock(&fr->sym_mu);
  return idx;
}

/* ---- hooks ---- */

static int group_slot(tr_fr_t* fr, int64_t pg_id) {
  if (pg_id >= 0 && pg_id < UID_MAP)
    return __atomic_load_n(&fr->uid_slot[pg_id], __ATOMIC_ACQUIRE);
  uint32_t n = __atomic_load_n(&fr->h->npgs, __ATOMIC_ACQUIRE);
  for (uint32_t i = 0; i < n && i < TR__FR_MAX_PGS; i++)
    if (fr->h->pgs[i].pg_id == pg_id &&
        __atomic_load_n(&fr->h->pgs[i].seq, __ATOMIC_ACQUIRE) == 2)
      return (int)i;
  return -1;
}

static void add_group(tr_fr_t* fr, int64_t pg_id, const char* name,
                      const char* desc, const int* granks, int n) {
  tr__fr_shm_hdr_t* h = fr->h;
  if (group_slot(fr, pg_id) >= 0) return;
  uint32_t slot = __atomic_fetch_add(&h->npgs, 1, __ATOMIC_ACQ_REL);
  if (slot >= TR__FR_MAX_PGS) {
    TR_LOG_WARN(FR, "more than %d process groups: group '%s' not recorded",
                TR__FR_MAX_PGS, name);
    return;
  }
  tr__fr_shm_pg_t* pg = &h->pgs[slot];
  __atomic_store_n(&pg->seq, 1, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  pg->pg_id = pg_id;
  snprintf(pg->name, sizeof pg->name, "%s", name ? name : "?");
  snprintf(pg->desc, sizeof pg->desc, "%s", desc ? desc : "undefined");
  uint32_t off =
      __atomic_fetch_add(&h->rank_pool_used, (uint32_t)n, __ATOMIC_RELAXED);
  if ((uint64_t)off + (uint64_t)n <= h->rank_pool_cap) {
    int32_t* pool = tr__fr_pool(h);
    for (int i = 0; i < n; i++) pool[off + (uint32_t)i] = granks[i];
    pg->ranks_off = (int32_t)off;
    pg->nranks = n;
  } else {
    pg->ranks_off = 0;
    pg->nranks = -1;
    TR_LOG_WARN(FR, "rank table full: the ranks of group '%s' not recorded",
                pg->name);
  }
  pg->last_enqueued = pg->last_started = pg->last_completed = -1;
  __atomic_store_n(&pg->seq, 2, __ATOMIC_RELEASE);
  if (pg_id >= 0 && pg_id < UID_MAP)
    __atomic_store_n(&fr->uid_slot[pg_id], (int16_t)slot, __ATOMIC_RELEASE);
}

static void h_group(void* arg, int64_t pg_id, const char* name,
                    const char* desc, const int* granks, int n) {
  add_group(arg, pg_id, name, desc, granks, n);
}

static int64_t h_enqueue(void* arg, const tr_pg_record_t* rec) {
  tr_fr_t* fr = arg;
  tr__fr_shm_hdr_t* h = fr->h;
  void* addrs[TR_FR_MAX_FRAMES + 1];
  int naddr = fr->stacks ? backtrace(addrs, TR_FR_MAX_FRAMES + 1) : 0;
  thread_ident();
  uint64_t id = __atomic_fetch_add(&h->next, 1, __ATOMIC_RELAXED);
  tr__fr_shm_entry_t* e = &fr->ents[id % fr->cap];
  uint64_t held = claim_new(&e->seq, id);
  int slot = group_slot(fr, rec->pg_id);
  e->record_id = (int64_t)id;
  e->pg_slot = slot;
  e->status = 0;
  e->collective_seq_id = rec->collective_seq_id;
  e->p2p_seq_id = rec->p2p_seq_id;
  e->op_id = rec->op_id;
  e->time_created_ns = rec->time_created_ns;
  e->time_started_ns = 0;
  e->time_completed_ns = 0;
  e->timeout_ms = rec->timeout_ms;
  e->thread_id = t_tid;
  e->state = TR_FR_SCHEDULED;
  e->retired = 0;
  e->is_p2p = (uint8_t)rec->is_p2p;
  e->n_inputs = (uint8_t)rec->n_inputs;
  e->n_outputs = (uint8_t)rec->n_outputs;
  e->in_ndim = e->out_ndim = 0;
  if (rec->n_inputs) {
    int nd = rec->inputs[0].ndim;
    e->in_ndim = (uint8_t)nd;
    e->in_dtype = (uint8_t)rec->inputs[0].dtype;
    memcpy(e->in_shape, rec->inputs[0].shape, sizeof(int64_t) * (size_t)nd);
  }
  if (rec->n_outputs) {
    int nd = rec->outputs[0].ndim;
    e->out_ndim = (uint8_t)nd;
    e->out_dtype = (uint8_t)rec->outputs[0].dtype;
    memcpy(e->out_shape, rec->outputs[0].shape, sizeof(int64_t) * (size_t)nd);
  }
  size_t pl = strnlen(rec->profiling_name, TR_FR_NAME_MAX - 1);
  memcpy(e->profiling_name, rec->profiling_name, pl);
  e->profiling_name[pl] = '\0';
  memcpy(e->thread_name, t_tname, sizeof t_tname);
  int nf = 0;
  for (int i = 1; i < naddr && nf < TR_FR_MAX_FRAMES; i++) {
    int idx = sym_index(fr, (uint64_t)(uintptr_t)addrs[i]);
    if (idx >= 0) e->frames[nf++] = (uint16_t)idx;
  }
  e->nframes = (uint8_t)nf;
  __atomic_store_n(&e->seq, held + 1, __ATOMIC_RELEASE);
  __atomic_fetch_add(&h->inflight, 1, __ATOMIC_RELAXED);
  if (slot >= 0 && !rec->is_p2p)
    atomic_max(&h->pgs[slot].last_enqueued, rec->collective_seq_id);
  return (int64_t)id;
}

static void h_start(void* arg, int64_t id, int64_t time_ns) {
  tr_fr_t* fr = arg;
  tr__fr_shm_entry_t* e = &fr->ents[(uint64_t)id % fr->cap];
  uint64_t held;
  if (!claim_update(&e->seq, (uint64_t)id, &held)) return;
  if (!e->time_started_ns) e->time_started_ns = time_ns;
  if (e->state < TR_FR_STARTED) e->state = TR_FR_STARTED;
  int slot = e->pg_slot, p2p = e->is_p2p;
  int64_t seq = e->collective_seq_id;
  __atomic_store_n(&e->seq, held + 1, __ATOMIC_RELEASE);
  __atomic_fetch_add(&fr->h->progress, 1, __ATOMIC_RELAXED);
  if (slot >= 0 && !p2p) atomic_max(&fr->h->pgs[slot].last_started, seq);
}

static void h_complete(void* arg, int64_t id, int64_t time_ns, int status) {
  tr_fr_t* fr = arg;
  tr__fr_shm_entry_t* e = &fr->ents[(uint64_t)id % fr->cap];
  __atomic_fetch_add(&fr->h->inflight, -1, __ATOMIC_RELAXED);
  __atomic_fetch_add(&fr->h->progress, 1, __ATOMIC_RELAXED);
  uint64_t held;
  if (!claim_update(&e->seq, (uint64_t)id, &held)) return;
  e->retired = 1;
  e->status = status;
  if (status == 0) {
    e->time_completed_ns = time_ns;
    e->state = TR_FR_COMPLETED;
  }
  int slot = e->pg_slot, p2p = e->is_p2p;
  int64_t seq = e->collective_seq_id;
  __atomic_store_n(&e->seq, held + 1, __ATOMIC_RELEASE);
  if (status == 0 && slot >= 0 && !p2p)
    atomic_max(&fr->h->pgs[slot].last_completed, seq);
}

static void h_dump(void* arg, int origin_rank, const char* reason) {
  tr_fr_t* fr = arg;
  TR_LOG_INFO(FR, "dump requested (rank %d): %s", origin_rank, reason);
  tr_fr_request_dump(fr, 1);
}

void tr_fr_request_dump(tr_fr_t* fr, int scope) {
  if (!fr) return;
  __atomic_store_n(&fr->h->dump_scope, scope, __ATOMIC_RELAXED);
  __atomic_fetch_add(&fr->h->dump_req, 1, __ATOMIC_RELEASE);
}

static void on_usr1(int sig) {
  (void)sig;
  tr_fr_t* fr = __atomic_load_n(&g_fr, __ATOMIC_ACQUIRE);
  if (fr) tr_fr_request_dump(fr, 0);
}

/* ---- lifecycle ---- */

void tr_fr_opts_init(tr_fr_opts_t* o) {
  memset(o, 0, sizeof *o);
  o->world_size = 1;
  o->capacity = 20000;
  o->stacks = tr_param_bool(TR_PARAM_FR_STACK);
  o->timing = tr_param_bool(TR_PARAM_FR_TIMING);
  o->sigusr1 = 1;
}

const char* tr_fr_shm_name(const tr_fr_t* fr) { return fr->name; }

int tr_fr_init(const tr_fr_opts_t* o, tr_fr_t** out) {
  *out = NULL;
  if (o->capacity <= 0) return 0;
  if (o->capacity > (1 << 26) || o->world_size < 1 || o->rank < 0 ||
      o->rank >= o->world_size)
    return TR_EINVAL;
  if (__atomic_load_n(&g_fr, __ATOMIC_ACQUIRE)) return TR_EEXIST;
  tr_fr_t* fr = calloc(1, sizeof *fr);
  if (!fr) return TR_ENOMEM;
  const char* name = o->shm_name;
  if (!name || !*name) name = tr_param_str(TR_PARAM_FR_SHM);
  if (name && *name)
    snprintf(fr->name, sizeof fr->name, "%s", name);
  else
    snprintf(fr->name, sizeof fr->name, "/trainrun-%d-%d", (int)getpid(),
             o->rank);
  if (fr->name[0] != '/' || strchr(fr->name + 1, '/') ||
      strlen(fr->name) > 250) {
    TR_LOG_ERROR(FR, "bad shared-memory name '%s'", fr->name);
    free(fr);
    return TR_EINVAL;
  }
  fr->cap = (uint32_t)o->capacity;
  fr->stacks = o->stacks;
  /* every group's ranks: the world eight times over, at least 64 Ki */
  uint64_t pool = (uint64_t)o->world_size * 8;
  if (pool < 65536) pool = 65536;
  if (pool > (1u << 30)) pool = 1u << 30;
  fr->size = tr__fr_shm_size((uint32_t)pool, fr->cap);
  shm_unlink(fr->name); /* a stale ring of an earlier process */
  int fd = shm_open(fr->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  int rc = fd >= 0 ? 0 : tr_err_from_errno();
  if (rc == 0 && ftruncate(fd, (off_t)fr->size) != 0) rc = tr_err_from_errno();
  /* reserve the pages now: a full /dev/shm must fail here, not raise
   * SIGBUS inside a collective later */
  if (rc == 0) {
    int e = posix_fallocate(fd, 0, (off_t)fr->size);
    if (e != 0 && e != EOPNOTSUPP && e != EINVAL) rc = -e;
  }
  void* p = MAP_FAILED;
  if (rc == 0) {
    p = mmap(NULL, fr->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) rc = tr_err_from_errno();
  }
  if (fd >= 0) close(fd);
  if (rc < 0) {
    TR_LOG_ERROR(FR,
                 "cannot create the flight-recorder ring '%s' (%.1f MiB of "
                 "shared memory): %s; a smaller [comm] trace_buf_size needs "
                 "less",
                 fr->name, (double)fr->size / 1048576.0, tr_strerror(rc));
    if (fd >= 0) shm_unlink(fr->name);
    free(fr);
    return rc;
  }
  tr__fr_shm_hdr_t* h = p; /* the pages are zero */
  fr->h = h;
  h->layout = TR__FR_LAYOUT;
  h->header_size = sizeof *h;
  h->entry_size = sizeof(tr__fr_shm_entry_t);
  h->capacity = fr->cap;
  h->rank = o->rank;
  h->world_size = o->world_size;
  h->local_rank = o->local_rank;
  h->pid = (int32_t)getpid();
  h->hang_timeout_s = o->hang_timeout_s;
  h->timing = o->timing;
  h->rank_pool_cap = (uint32_t)pool;
  h->created_ns = tr__wall_ns();
  snprintf(h->dump_dir, sizeof h->dump_dir, "%s",
           o->dump_dir ? o->dump_dir : "comm_traces");
  snprintf(h->dump_prefix, sizeof h->dump_prefix, "%s",
           o->dump_prefix ? o->dump_prefix : "rank_");
  snprintf(h->store_prefix, sizeof h->store_prefix, "%s",
           o->store_prefix ? o->store_prefix : "");
  fr->ents = tr__fr_entries(h);
  for (int i = 0; i < UID_MAP; i++) fr->uid_slot[i] = -1;
  pthread_mutex_init(&fr->sym_mu, NULL);
  if (fr->stacks) {
    void* a[2];
    backtrace(a, 2); /* loads the unwinder now, not inside a collective */
  }
  __atomic_store_n(&h->magic, TR__FR_MAGIC, __ATOMIC_RELEASE);

  __atomic_store_n(&g_fr, fr, __ATOMIC_RELEASE);
  tr_pg_hooks_t hooks = {fr, h_group, h_enqueue, h_start, h_complete, h_dump};
  tr_pg_set_hooks(&hooks);
  tr_pg_set_cuda_start_events(o->timing); /* durations need start events */
  if (o->sigusr1) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    fr->usr1_set = sigaction(SIGUSR1, &sa, &fr->old_usr1) == 0;
  }
  *out = fr;
  return 0;
}

int tr_fr_add_group(tr_fr_t* fr, const tr_pg_t* pg) {
  if (!fr || !pg) return 0;
  int n = tr_pg_size(pg);
  int* g = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
  if (!g) return TR_ENOMEM;
  for (int i = 0; i < n; i++) g[i] = tr_pg_global_rank(pg, i);
  add_group(fr, tr_pg_uid(pg), tr_pg_name(pg), tr_pg_desc(pg), g, n);
  free(g);
  return 0;
}

int tr_fr_snapshot_self(const tr_fr_t* fr, tr_fr_snapshot_t* out) {
  return tr__fr_snapshot_hdr(fr->h, fr->size, 0, out);
}

void tr_fr_free(tr_fr_t* fr) {
  if (!fr) return;
  tr_pg_set_hooks(NULL);
  tr_pg_set_cuda_start_events(0);
  if (fr->usr1_set) sigaction(SIGUSR1, &fr->old_usr1, NULL);
  __atomic_store_n(&g_fr, NULL, __ATOMIC_RELEASE);
  munmap(fr->h, fr->size);
  shm_unlink(fr->name);
  pthread_mutex_destroy(&fr->sym_mu);
  free(fr);
}
