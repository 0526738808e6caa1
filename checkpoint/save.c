/* checkpoint/save.c: saving a sharded checkpoint — planning who writes
 * which chunk (replicated chunks once, balanced by bytes), staging to host
 * buffers reused across saves, the data file and chunk list each rank
 * writes (in a thread for async saves), and rank 0's commit of
 * metadata.json after every rank reported (trainrun/checkpoint.h). */
#include "config.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h> /* chunk lists and metadata */

#include "core/buf.h" /* TR_GROW */
#include "core/clock.h"
#include "checkpoint/dma.h"
#include "checkpoint/internal.h"
#include "trainrun/error.h"
#include "trainrun/kernels.h" /* the caller's stream (tr_kern_get_stream) */
#include "trainrun/param.h"   /* TRAINRUN_CKPT_TEST_WRITE_BPS */
#include "trainrun/log.h"
#include "trainrun/crc32c.h"
#include "trainrun/safetensors.h" /* dtype names */

/* One chunk this rank writes. */
typedef struct {
  char* name;
  tr_dtype_t dtype;
  int ndim;
  int64_t shape[TR_MAX_DIMS], offsets[TR_MAX_DIMS], sizes[TR_MAX_DIMS];
  const void* data;
  uint64_t nbytes, file_off;
  uint32_t* crcs; /* one per TR_CKPT_CRC_BLOCK bytes */
  long dma_ev;    /* >= 0: its copy's event, to wait for before reading */
} seg_t;

/* A tensor rank 0 knows of (the metadata lists tensors in this order). */
typedef struct {
  char* name;
} decl_t;

/* How a chunk reaches its staging buffer. */
typedef enum {
  STAGE_HOST,   /* host chunk: copied (converted) by the writer thread */
  STAGE_DEVICE, /* device chunk, pageable buffer: the writer thread copies
                 * it on the copy stream (CUDA returns when it is done) */
  STAGE_DMA     /* device chunk, page-locked buffer: tr_ckpt_save enqueues
                 * the copy; the writer waits for its event */
} stage_how_t;

/* A chunk to copy into its staging buffer while the trainer computes the
 * next step (only its optimizer step must wait, tr_ckpt_wait_staged). */
typedef struct {
  size_t dst;       /* staging slot; also the index of the copy's event */
  tr_tensor_t src;  /* a view holding the storage it reads: the caller's,
                     * or a device temporary converted to the saved dtype */
  tr_dtype_t dtype; /* saved dtype */
  stage_how_t how;
  int enqueued; /* STAGE_DMA: the copy is on the copy stream */
} copy_t;

typedef struct {
  char* dir;
  int rank;
  seg_t* segs;
  size_t nsegs;
  copy_t* copies;
  size_t ncopies;
  struct tr__ckpt_dma* dma; /* the saver's (borrowed); NULL: no device */
  uint64_t devs;            /* devices the chunks are copied from */
  int64_t copy_bytes;       /* bytes copied from them */
  int rc;
  tr_errmsg_t err;
  double seconds;
  int64_t bytes;
  int done;    /* atomic: the thread finished */
  int staged;  /* under saver->stage_mu: the writer's copies are done */
  int ordered; /* tr_ckpt_wait_staged ran for this save */
} job_t;

struct tr_ckpt_saver {
  char* folder;
  tr_ckpt_comm_t comm;
  tr_ckpt_mode_t mode;
  int keep;
  char* layout;
  /* staging buffers (uint8 host tensors, page-locked in
   * TR_CKPT_ASYNC_PINNED), by position among the staged chunks this rank
   * writes; reused by every save whose chunk fits */
  tr_tensor_t* stage;
  size_t nstage;
  struct tr__ckpt_dma* dma; /* copy streams and events; NULL until needed */
  /* the save in flight */
  job_t job;
  pthread_mutex_t stage_mu;
  pthread_cond_t stage_cv;
  pthread_t thread;
  int thread_live;
  int pending; /* staged or written, not committed */
  int64_t step;
  char* state;   /* rank 0: train state JSON */
  decl_t* decls; /* rank 0: every item's name in order */
  size_t ndecls;
  /* purge */
  pthread_t purge;
  int purge_live;
  tr_ckpt_stats_t stats;
};

int tr_ckpt_mode_parse(const char* s, tr_ckpt_mode_t* out) {
  if (strcmp(s, "disabled") == 0)
    *out = TR_CKPT_SYNC;
  else if (strcmp(s, "async") == 0)
    *out = TR_CKPT_ASYNC;
  else if (strcmp(s, "async_with_pinned_mem") == 0)
    *out = TR_CKPT_ASYNC_PINNED;
  else
    return TR_EINVAL;
  return 0;
}

int tr_ckpt_saver_new(const tr_ckpt_saver_opts_t* o, tr_ckpt_saver_t** out,
                      tr_errmsg_t* err) {
  *out = NULL;
  if (!o->folder || o->comm.world < 1 || o->comm.rank < 0 ||
      o->comm.rank >= o->comm.world ||
      (o->comm.world > 1 && !o->comm.all_reduce_sum) || o->keep_latest_k < 0)
    return tr_errmsg_set(err, TR_EINVAL, "checkpoint: bad saver options");
  tr_ckpt_saver_t* s = calloc(1, sizeof *s);
  if (!s) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  s->folder = strdup(o->folder);
  s->layout = strdup(o->layout_json ? o->layout_json : "{}");
  pthread_mutex_init(&s->stage_mu, NULL);
  pthread_cond_init(&s->stage_cv, NULL);
  s->comm = o->comm;
  s->mode = o->mode;
  s->keep = o->keep_latest_k;
  s->step = -1;
  s->stats.step = -1;
  s->stats.committed_step = -1;
  if (!s->folder || !s->layout) {
    tr_ckpt_saver_free(s);
    return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  }
  *out = s;
  return 0;
}

static void job_release(job_t* j) {
  for (size_t i = 0; i < j->nsegs; i++) {
    free(j->segs[i].name);
    free(j->segs[i].crcs);
  }
  free(j->segs);
  for (size_t i = 0; i < j->ncopies; i++) {
#ifdef HAVE_CUDA
    /* a save that failed after enqueuing copies: they still read the
     * storage this view holds */
    if (j->copies[i].enqueued) tr__ckpt_dma_wait(j->dma, j->copies[i].dst);
#endif
    tr_tensor_release(&j->copies[i].src);
  }
  free(j->copies);
  free(j->dir);
  memset(j, 0, sizeof *j);
}

static void drop_decls(tr_ckpt_saver_t* s) {
  for (size_t i = 0; i < s->ndecls; i++) free(s->decls[i].name);
  free(s->decls);
  s->decls = NULL;
  s->ndecls = 0;
  free(s->state);
  s->state = NULL;
}

static void join_write(tr_ckpt_saver_t* s) {
  if (s->thread_live) {
    pthread_join(s->thread, NULL);
    s->thread_live = 0;
  }
}

static void join_purge(tr_ckpt_saver_t* s) {
  if (s->purge_live) {
    pthread_join(s->purge, NULL);
    s->purge_live = 0;
  }
}

void tr_ckpt_saver_free(tr_ckpt_saver_t* s) {
  if (!s) return;
  join_write(s);
  join_purge(s);
  job_release(&s->job);
  drop_decls(s);
  for (size_t i = 0; i < s->nstage; i++) tr_tensor_release(&s->stage[i]);
  free(s->stage);
#ifdef HAVE_CUDA
  tr__ckpt_dma_free(s->dma);
#endif
  free(s->folder);
  free(s->layout);
  pthread_mutex_destroy(&s->stage_mu);
  pthread_cond_destroy(&s->stage_cv);
  free(s);
}

int tr_ckpt_pending(const tr_ckpt_saver_t* s) { return s->pending; }

void tr_ckpt_saver_stats(const tr_ckpt_saver_t* s, tr_ckpt_stats_t* st) {
  *st = s->stats;
}

/* ---- writing one rank's data ---- */

static int json_ints(json_t* obj, const char* key, int n, const int64_t* v) {
  json_t* a = json_array();
  if (!a) return TR_ENOMEM;
  for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
  return json_object_set_new(obj, key, a) == 0 ? 0 : TR_ENOMEM;
}

static int pwrite_all(int fd, const void* buf, size_t n, uint64_t off) {
  const char* p = buf;
  while (n > 0) {
    ssize_t w = pwrite(fd, p, n, (off_t)off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return tr_err_from_errno();
    p += w;
    n -= (size_t)w;
    off += (uint64_t)w;
  }
  return 0;
}

/* Writeback of a data file as it is written: each piece is handed to the
 * disk at once, and what lies more than TR__CKPT_WINDOW bytes behind is
 * waited for and dropped from the page cache. A save of many GB then never
 * holds more than a window of dirty or cached pages, so the kernel does not
 * throttle or reclaim in the trainer's threads (a step that allocates, or
 * writes its metrics line, would wait for the disk), and the final fsync
 * has little left to do. Best effort: file systems without writeback
 * (tmpfs) ignore it. */
#define TR__CKPT_WINDOW ((uint64_t)128 << 20)

typedef struct {
  int fd;
  uint64_t queued;  /* [0, queued) handed to the disk */
  uint64_t dropped; /* [0, dropped) on disk and out of the cache */
} flush_t;

static void flush_after(flush_t* f, uint64_t off, uint64_t len) {
  sync_file_range(f->fd, (off_t)off, (off_t)len, SYNC_FILE_RANGE_WRITE);
  if (off + len > f->queued) f->queued = off + len;
  if (f->queued - f->dropped <= TR__CKPT_WINDOW) return;
  uint64_t to = f->queued - TR__CKPT_WINDOW / 2;
  sync_file_range(f->fd, (off_t)f->dropped, (off_t)(to - f->dropped),
                  SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                      SYNC_FILE_RANGE_WAIT_AFTER);
  posix_fadvise(f->fd, (off_t)f->dropped, (off_t)(to - f->dropped),
                POSIX_FADV_DONTNEED);
  f->dropped = to;
}

/* TRAINRUN_CKPT_TEST_WRITE_BPS (tests): sleep until `done` bytes took at
 * least done / bps seconds since t0. */
static void throttle(double t0, uint64_t done) {
  int64_t bps = tr_param_int(TR_PARAM_CKPT_TEST_WRITE_BPS);
  if (bps <= 0) return;
  double wait = t0 + (double)done / (double)bps - tr__now();
  if (wait > 0) usleep((useconds_t)(wait * 1e6));
}

/* The data file rank-R.bin (when there is data) and the chunk list
 * rank-R.json, both on disk (fsynced) when this returns 0. Chunks copied
 * from a device by the copy stream are waited for one by one, so the
 * first ones are written while the last ones are still being copied. */
static int write_rank(job_t* j) {
  double t0 = tr__now();
  char name[64];
  snprintf(name, sizeof name, "rank-%05d.bin", j->rank);
  char* path = tr__ckpt_join(j->dir, name);
  if (!path) return tr_errmsg_set(&j->err, TR_ENOMEM, "out of memory");
  int rc = 0;
  if (j->nsegs > 0) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      rc = tr_err_from_errno();
      tr_errmsg_set(&j->err, rc, "cannot create '%s': %s", path,
                    tr_strerror(rc));
      free(path);
      return rc;
    }
    flush_t fl = {.fd = fd};
    uint8_t hdr[TR__CKPT_HEADER] = {0};
    memcpy(hdr, TR__CKPT_MAGIC, 8);
    uint32_t v = htole32(TR_CKPT_VERSION), r = htole32((uint32_t)j->rank);
    memcpy(hdr + 8, &v, 4);
    memcpy(hdr + 12, &r, 4);
    rc = pwrite_all(fd, hdr, sizeof hdr, 0);
    const size_t piece = 8u << 20;
    uint64_t done = 0;
    for (size_t i = 0; i < j->nsegs && rc == 0; i++) {
      seg_t* g = &j->segs[i];
#ifdef HAVE_CUDA
      if (g->dma_ev >= 0 &&
          (rc = tr__ckpt_dma_wait(j->dma, (size_t)g->dma_ev)) < 0) {
        tr_errmsg_set(&j->err, rc, "cannot copy '%s' from the device: %s",
                      g->name, tr_strerror(rc));
        close(fd);
        free(path);
        return rc;
      }
#endif
      const uint64_t blk = TR_CKPT_CRC_BLOCK;
      size_t nb = (size_t)((g->nbytes + blk - 1) / blk);
      g->crcs = calloc(nb + 1, sizeof *g->crcs);
      if (!g->crcs) rc = TR_ENOMEM;
      for (uint64_t k = 0; k < g->nbytes && rc == 0; k += piece) {
        size_t len = g->nbytes - k < piece ? (size_t)(g->nbytes - k) : piece;
        const uint8_t* p = (const uint8_t*)g->data + k;
        for (uint64_t b = 0; b < len; b += blk) /* piece % blk == 0 */
          g->crcs[(k + b) / blk] =
              tr_crc32c(0, p + b, len - b < blk ? (size_t)(len - b) : blk);
        rc = pwrite_all(fd, p, len, g->file_off + k);
        if (rc < 0) break;
        flush_after(&fl, g->file_off + k, len);
        throttle(t0, done += len);
      }
      j->bytes += (int64_t)g->nbytes;
    }
    if (rc == 0 && fsync(fd) < 0) rc = tr_err_from_errno();
    if (close(fd) < 0 && rc == 0) rc = tr_err_from_errno();
    if (rc < 0) {
      tr_errmsg_set(&j->err, rc, "cannot write '%s': %s", path,
                    tr_strerror(rc));
      free(path);
      return rc;
    }
  }
  /* the chunk list */
  json_t* root = json_object();
  json_t* chunks = json_array();
  if (!root || !chunks) rc = TR_ENOMEM;
  for (size_t i = 0; i < j->nsegs && rc == 0; i++) {
    const seg_t* g = &j->segs[i];
    json_t* c = json_object();
    if (!c) {
      rc = TR_ENOMEM;
      break;
    }
    json_object_set_new(c, "name", json_string(g->name));
    json_object_set_new(c, "dtype", json_string(tr_st_dtype_name(g->dtype)));
    if (json_ints(c, "shape", g->ndim, g->shape) < 0 ||
        json_ints(c, "offsets", g->ndim, g->offsets) < 0 ||
        json_ints(c, "sizes", g->ndim, g->sizes) < 0)
      rc = TR_ENOMEM;
    json_object_set_new(c, "file", json_string(name));
    json_object_set_new(c, "offset", json_integer((json_int_t)g->file_off));
    json_object_set_new(c, "length", json_integer((json_int_t)g->nbytes));
    json_t* crcs = json_array();
    size_t nb =
        (size_t)((g->nbytes + TR_CKPT_CRC_BLOCK - 1) / TR_CKPT_CRC_BLOCK);
    for (size_t b = 0; crcs && b < nb; b++)
      json_array_append_new(crcs, json_integer(g->crcs[b]));
    json_object_set_new(c, "crc32c", crcs);
    json_array_append_new(chunks, c);
  }
  char* text = NULL;
  if (rc == 0) {
    json_object_set_new(root, "rank", json_integer(j->rank));
    json_object_set_new(root, "chunks", chunks);
    chunks = NULL;
    text = json_dumps(root, JSON_COMPACT);
    if (!text) rc = TR_ENOMEM;
  }
  json_decref(chunks);
  json_decref(root);
  if (rc < 0) {
    free(path);
    return tr_errmsg_set(&j->err, rc, "out of memory");
  }
  snprintf(name, sizeof name, "rank-%05d.json", j->rank);
  free(path);
  path = tr__ckpt_join(j->dir, name);
  if (!path)
    rc = tr_errmsg_set(&j->err, TR_ENOMEM, "out of memory");
  else
    rc = tr__write_file(path, text, strlen(text), &j->err);
  free(text);
  free(path);
  j->seconds = tr__now() - t0;
  return rc;
}

/* One copy the writer makes (STAGE_HOST, STAGE_DEVICE). */
static int stage_one(tr_ckpt_saver_t* s, const copy_t* c) {
  const tr_tensor_t* src = &c->src;
  void* dst = tr_tensor_data(&s->stage[c->dst]);
  if (c->how == STAGE_HOST) {
    tr_tensor_t d;
    TR_CHECK(tr_tensor_wrap(&d, dst, c->dtype, TR_DEVICE_CPU, src->ndim,
                            src->shape));
    int rc = tr_tensor_copy(&d, src);
    tr_tensor_release(&d);
    return rc;
  }
#ifdef HAVE_CUDA
  TR_CHECK(tr__ckpt_dma_copy(s->dma, src->device.index, dst,
                             tr_tensor_data(src), tr_tensor_nbytes(src),
                             c->dst));
  return tr__ckpt_dma_wait(s->dma, c->dst);
#else
  return TR_EUNSUPPORTED;
#endif
}

/* Enqueue j's page-locked copies on the copy streams, each followed by its
 * event. Enqueueing hundreds of copies blocks until earlier ones are done
 * (0.13 s for the 441 chunks, 7.4 GB, of a Llama 1B FSDP rank on an
 * H200), which must not hold the trainer: the writer thread does it
 * (stage_copies). */
static int enqueue_dma(tr_ckpt_saver_t* s, job_t* j) {
  int rc = 0;
#ifdef HAVE_CUDA
  double t0 = tr__now();
  for (size_t i = 0; i < j->ncopies && rc == 0; i++) {
    copy_t* c = &j->copies[i];
    if (c->how == STAGE_HOST) continue;
    j->copy_bytes += (int64_t)tr_tensor_nbytes(&c->src);
    if (c->how != STAGE_DMA) continue;
    rc = tr__ckpt_dma_copy(
        j->dma, c->src.device.index, tr_tensor_data(&s->stage[c->dst]),
        tr_tensor_data(&c->src), tr_tensor_nbytes(&c->src), c->dst);
    c->enqueued = rc == 0;
  }
  for (int dev = 0; dev < TR_MAX_DEVICES && rc == 0; dev++)
    if ((j->devs >> dev & 1) && s->mode == TR_CKPT_ASYNC_PINNED)
      rc = tr__ckpt_dma_end(j->dma, dev);
  if (j->devs)
    TR_LOG_DEBUG(CKPT, "rank %d: %.1f MB of device copies enqueued in %.4f s",
                 j->rank, (double)j->copy_bytes / 1e6, tr__now() - t0);
#else
  (void)s;
  (void)j;
#endif
  return rc;
}

/* The writer's staging, then say so (tr_ckpt_wait_staged waits for it):
 * the page-locked copies enqueued, then the other copies made (host
 * chunks; device chunks into pageable buffers, which CUDA copies before it
 * returns). */
static int stage_copies(tr_ckpt_saver_t* s) {
  job_t* j = &s->job;
  int rc = enqueue_dma(s, j);
  for (size_t i = 0; i < j->ncopies && rc == 0; i++)
    if (j->copies[i].how != STAGE_DMA) rc = stage_one(s, &j->copies[i]);
#ifdef HAVE_CUDA
  /* the end of the pageable copies */
  for (int dev = 0; dev < TR_MAX_DEVICES && rc == 0; dev++)
    if ((j->devs >> dev & 1) && s->mode != TR_CKPT_ASYNC_PINNED)
      rc = tr__ckpt_dma_end(j->dma, dev);
#endif
  if (rc < 0) tr_errmsg_set(&j->err, rc, "cannot stage: %s", tr_strerror(rc));
  pthread_mutex_lock(&s->stage_mu);
  j->staged = 1;
  pthread_cond_broadcast(&s->stage_cv);
  pthread_mutex_unlock(&s->stage_mu);
  return rc;
}

static void* write_thread(void* arg) {
  tr_ckpt_saver_t* s = arg;
  job_t* j = &s->job;
  j->rc = stage_copies(s);
  if (j->rc == 0) j->rc = write_rank(j);
  __atomic_store_n(&j->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

int tr_ckpt_wait_staged(tr_ckpt_saver_t* s) {
  job_t* j = &s->job;
  if (!s->pending || j->ordered) return 0;
  double t0 = tr__now();
  int rc = 0;
  /* the writer's copies: the calling thread waits */
  if (s->thread_live) {
    pthread_mutex_lock(&s->stage_mu);
    while (!j->staged) pthread_cond_wait(&s->stage_cv, &s->stage_mu);
    pthread_mutex_unlock(&s->stage_mu);
  }
#ifdef HAVE_CUDA
  /* the copy streams' copies: the caller's stream waits, on the device,
   * for the last copy of each device (each stream copies in order) */
  uint64_t seen = 0;
  for (size_t i = j->ncopies; i-- > 0 && rc == 0;) {
    const copy_t* c = &j->copies[i];
    int dev = c->src.device.index;
    if (!c->enqueued || (seen >> dev & 1)) continue;
    seen |= UINT64_C(1) << dev;
    rc = tr__ckpt_dma_order(j->dma, c->dst, tr_kern_get_stream());
  }
#endif
  j->ordered = 1;
  s->stats.blocked_s += tr__now() - t0;
  return rc;
}

/* ---- rank 0's commit ---- */

typedef struct {
  const char* name;
  json_t* obj; /* {"name","dtype","shape","chunks"} */
  int64_t numel, covered;
} mtensor_t;

static int int_array(json_t* a, int64_t* v, int* n) {
  if (!json_is_array(a) || json_array_size(a) > TR_MAX_DIMS) return -1;
  *n = (int)json_array_size(a);
  for (int i = 0; i < *n; i++) {
    json_t* e = json_array_get(a, (size_t)i);
    if (!json_is_integer(e)) return -1;
    v[i] = json_integer_value(e);
  }
  return 0;
}

static int commit(tr_ckpt_saver_t* s, const char* dir, tr_errmsg_t* err) {
  int rc = 0;
  size_t cap = s->ndecls + 16, nt = 0;
  mtensor_t* ts = calloc(cap, sizeof *ts);
  json_t* tensors = json_array();
  json_t** lists = calloc((size_t)s->comm.world, sizeof *lists);
  if (!ts || !tensors || !lists) {
    rc = tr_errmsg_set(err, TR_ENOMEM, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < s->ndecls; i++) ts[nt++].name = s->decls[i].name;
  for (int r = 0; r < s->comm.world && rc == 0; r++) {
    char name[64];
    snprintf(name, sizeof name, "rank-%05d.json", r);
    char* path = tr__ckpt_join(dir, name);
    char* text = NULL;
    if (!path) {
      rc = tr_errmsg_set(err, TR_ENOMEM, "out of memory");
      break;
    }
    rc = tr__ckpt_read_file(path, &text, NULL, err);
    json_error_t je;
    if (rc == 0) {
      lists[r] = json_loads(text, 0, &je);
      json_t* chunks = json_object_get(lists[r], "chunks");
      if (!json_is_array(chunks))
        rc = tr_errmsg_set(err, TR_EFORMAT, "'%s': not a chunk list", path);
      for (size_t c = 0; rc == 0 && c < json_array_size(chunks); c++) {
        json_t* ch = json_array_get(chunks, c);
        const char* tn = json_string_value(json_object_get(ch, "name"));
        int64_t shape[TR_MAX_DIMS], sizes[TR_MAX_DIMS];
        int nd, nd2;
        if (!tn || int_array(json_object_get(ch, "shape"), shape, &nd) < 0 ||
            int_array(json_object_get(ch, "sizes"), sizes, &nd2) < 0 ||
            nd != nd2) {
          rc = tr_errmsg_set(err, TR_EFORMAT, "'%s': bad chunk %zu", path, c);
          break;
        }
        size_t k = 0;
        while (k < nt && strcmp(ts[k].name, tn) != 0) k++;
        if (k == nt) {
          if (TR_GROW(ts, nt + 1, cap) < 0) {
            rc = tr_errmsg_set(err, TR_ENOMEM, "out of memory");
            break;
          }
          memset(&ts[nt], 0, sizeof *ts);
          ts[nt++].name = tn;
        }
        mtensor_t* t = &ts[k];
        if (!t->obj) {
          t->obj = json_object();
          json_object_set_new(t->obj, "name", json_string(tn));
          json_object_set(t->obj, "dtype", json_object_get(ch, "dtype"));
          json_object_set(t->obj, "shape", json_object_get(ch, "shape"));
          json_object_set_new(t->obj, "chunks", json_array());
          t->numel = tr__ckpt_volume(nd, shape);
        }
        /* a chunk several ranks wrote (replicas the caller did not mark,
         * e.g. HSDP): keep the first copy */
        json_t* have = json_object_get(t->obj, "chunks");
        int dup = 0;
        for (size_t h = 0; h < json_array_size(have) && !dup; h++)
          dup = json_equal(json_object_get(json_array_get(have, h), "offsets"),
                           json_object_get(ch, "offsets")) &&
                json_equal(json_object_get(json_array_get(have, h), "sizes"),
                           json_object_get(ch, "sizes"));
        if (dup) continue;
        json_t* out = json_object();
        json_object_set(out, "offsets", json_object_get(ch, "offsets"));
        json_object_set(out, "sizes", json_object_get(ch, "sizes"));
        json_object_set(out, "file", json_object_get(ch, "file"));
        json_object_set(out, "offset", json_object_get(ch, "offset"));
        json_object_set(out, "length", json_object_get(ch, "length"));
        json_object_set(out, "crc32c", json_object_get(ch, "crc32c"));
        json_array_append_new(json_object_get(t->obj, "chunks"), out);
        t->covered += tr__ckpt_volume(nd, sizes);
      }
    }
    free(text);
    free(path);
  }
  for (size_t k = 0; k < nt && rc == 0; k++) {
    if (!ts[k].obj) {
      /* a tensor of no elements, or one nobody wrote */
      continue;
    }
    if (ts[k].covered != ts[k].numel) {
      rc = tr_errmsg_set(err, TR_EINVAL,
                         "step %" PRId64
                         ": tensor '%s': the saved chunks "
                         "hold %" PRId64 " of its %" PRId64 " elements",
                         s->step, ts[k].name, ts[k].covered, ts[k].numel);
      break;
    }
    json_array_append(tensors, ts[k].obj);
  }
  if (rc == 0) {
    json_error_t je;
    json_t* root = json_object();
    json_t* layout = json_loads(s->layout, 0, &je);
    json_t* state = json_loads(s->state ? s->state : "{}", 0, &je);
    json_object_set_new(root, "format", json_string("trainrun-checkpoint"));
    json_object_set_new(root, "version", json_integer(TR_CKPT_VERSION));
    json_object_set_new(root, "step", json_integer(s->step));
    json_object_set_new(root, "world_size", json_integer(s->comm.world));
    json_object_set_new(root, "layout", layout ? layout : json_object());
    json_object_set_new(root, "train_state", state ? state : json_object());
    json_object_set(root, "tensors", tensors);
    char* text = json_dumps(root, JSON_INDENT(1));
    json_decref(root);
    char* path = tr__ckpt_join(dir, TR_CKPT_METADATA);
    if (!text || !path)
      rc = tr_errmsg_set(err, TR_ENOMEM, "out of memory");
    else
      rc = tr__write_file(path, text, strlen(text), err);
    free(text);
    free(path);
  }
out:
  if (ts)
    for (size_t k = 0; k < nt; k++) json_decref(ts[k].obj);
  free(ts);
  if (lists)
    for (int r = 0; r < s->comm.world; r++) json_decref(lists[r]);
  free(lists);
  json_decref(tensors);
  return rc;
}

/* ---- purge ---- */

typedef struct {
  char* folder;
  int keep;
  int64_t committed; /* the step whose commit started this purge */
} purge_t;

/* Remove the complete steps beyond the newest p->keep, and the incomplete
 * step folders (a save that never finished: no metadata) older than the
 * step just committed. Newer incomplete ones are left alone: the next save
 * of this run may be writing one now. */
static void* purge_thread(void* arg) {
  purge_t* p = arg;
  tr_ckpt_entry_t* v;
  size_t n;
  if (tr_ckpt_list(p->folder, &v, &n, NULL) == 0) {
    size_t complete = 0;
    for (size_t i = n; i-- > 0;) {
      int stale;
      if (v[i].complete)
        stale = ++complete > (size_t)p->keep;
      else
        stale = !v[i].hf && v[i].step < p->committed;
      if (!stale) continue;
      int rc = tr_ckpt_remove_step(p->folder, v[i].step);
      if (rc < 0)
        TR_LOG_WARN(CKPT, "cannot remove '%s/step-%" PRId64 "': %s", p->folder,
                    v[i].step, tr_strerror(rc));
      else if (v[i].complete)
        TR_LOG_INFO(CKPT, "removed '%s/step-%" PRId64 "' (keep_latest_k %d)",
                    p->folder, v[i].step, p->keep);
      else
        TR_LOG_WARN(CKPT,
                    "removed the incomplete '%s/step-%" PRId64
                    "' (%.1f MB, no " TR_CKPT_METADATA
                    ": a save that never finished)",
                    p->folder, v[i].step, (double)v[i].bytes / 1e6);
    }
    free(v);
  }
  free(p->folder);
  free(p);
  return NULL;
}

static void start_purge(tr_ckpt_saver_t* s) {
  if (s->keep <= 0 || s->comm.rank != 0) return;
  join_purge(s);
  purge_t* p = malloc(sizeof *p);
  if (!p) return;
  p->folder = strdup(s->folder);
  p->keep = s->keep;
  p->committed = s->step;
  if (!p->folder || pthread_create(&s->purge, NULL, purge_thread, p) != 0) {
    free(p->folder);
    free(p);
    return;
  }
  s->purge_live = 1;
}

/* ---- the collective steps ---- */

static int sum(tr_ckpt_saver_t* s, double* v, int n, tr_errmsg_t* err) {
  if (s->comm.world == 1) return 0;
  int rc = s->comm.all_reduce_sum(s->comm.arg, v, n);
  if (rc < 0)
    return tr_errmsg_set(err, rc, "checkpoint step %" PRId64 ": %s", s->step,
                         tr_strerror(rc));
  return 0;
}

/* After this rank's write finished: agree, commit on rank 0, agree. */
static int finish(tr_ckpt_saver_t* s, tr_errmsg_t* err) {
  job_t* j = &s->job;
  char dir[4096];
  tr_ckpt_step_dir(s->folder, s->step, dir, sizeof dir);
  int rc = j->rc;
  double v[1] = {rc < 0 ? 1 : 0};
  int src = sum(s, v, 1, err);
  if (src < 0) goto out;
  if (rc < 0) {
    tr_errmsg_set(err, rc, "checkpoint step %" PRId64 ": %s", s->step,
                  j->err.message);
    goto out;
  }
  if (v[0] > 0) {
    rc = tr_errmsg_set(err, TR_EIO,
                       "checkpoint step %" PRId64
                       ": %.0f rank(s) could not write their data; '%s' "
                       "stays incomplete",
                       s->step, v[0], dir);
    goto out;
  }
  tr_errmsg_t cerr;
  tr_errmsg_clear(&cerr);
  int crc = s->comm.rank == 0 ? commit(s, dir, &cerr) : 0;
  v[0] = crc < 0 ? 1 : 0;
  src = sum(s, v, 1, err);
  if (src < 0) {
    rc = src;
    goto out;
  }
  if (crc < 0) {
    rc = tr_errmsg_set(err, crc, "%s", cerr.message);
  } else if (v[0] > 0) {
    rc = tr_errmsg_set(err, TR_EIO,
                       "checkpoint step %" PRId64
                       ": rank 0 could not write "
                       "its metadata",
                       s->step);
  } else {
    s->stats.committed_step = s->step;
    s->stats.write_s = j->seconds;
    s->stats.bytes = j->bytes;
    s->stats.copy_bytes = j->copy_bytes;
    s->stats.copy_s = 0;
#ifdef HAVE_CUDA
    for (int dev = 0; dev < TR_MAX_DEVICES; dev++) {
      double t = 0;
      if ((j->devs >> dev & 1) && tr__ckpt_dma_span(j->dma, dev, &t) == 0)
        s->stats.copy_s += t;
    }
#endif
    start_purge(s);
  }
out:
  if (src < 0) rc = src;
  s->pending = 0;
  job_release(j);
  drop_decls(s);
  return rc;
}

int tr_ckpt_poll(tr_ckpt_saver_t* s, tr_errmsg_t* err) {
  if (!s->pending) return 0;
  double v[1] = {__atomic_load_n(&s->job.done, __ATOMIC_ACQUIRE) ? 1 : 0};
  TR_CHECK(sum(s, v, 1, err));
  if (v[0] < s->comm.world) return 0;
  join_write(s);
  return finish(s, err);
}

int tr_ckpt_wait(tr_ckpt_saver_t* s, tr_errmsg_t* err) {
  if (!s->pending) return 0;
  join_write(s);
  return finish(s, err);
}

/* ---- saving ---- */

/* Staging slot k with room for at least nbytes: reused when it has it,
 * else (re)allocated — page-locked in TR_CKPT_ASYNC_PINNED; pageable
 * memory is touched at once when `fault` (so a later save does not pay
 * for the page faults). */
static int slot_get(tr_ckpt_saver_t* s, size_t k, uint64_t nbytes, int fault,
                    void** data) {
  if (k >= s->nstage) {
    size_t n = k + 1 > 2 * s->nstage ? k + 1 : 2 * s->nstage;
    tr_tensor_t* ns = realloc(s->stage, n * sizeof *ns);
    if (!ns) return TR_ENOMEM;
    memset(ns + s->nstage, 0, (n - s->nstage) * sizeof *ns);
    s->stage = ns;
    s->nstage = n;
  }
  tr_tensor_t* st = &s->stage[k];
  if (!st->storage || (uint64_t)tr_tensor_nbytes(st) < nbytes) {
    tr_tensor_release(st);
    int64_t cap = (int64_t)nbytes;
    int pinned = s->mode == TR_CKPT_ASYNC_PINNED;
    TR_CHECK(pinned ? tr_tensor_empty_pinned(st, TR_U8, 1, &cap)
                    : tr_tensor_empty(st, TR_U8, TR_DEVICE_CPU, 1, &cap));
    if (fault && !pinned) memset(tr_tensor_data(st), 0, (size_t)cap);
  }
  *data = tr_tensor_data(st);
  return 0;
}

/* The chunks of items this rank writes, in order, with their staging:
 * replicated chunks go to the rank with the fewest bytes so far (every
 * rank computes the same plan). With j, fill j's segments and copies (a
 * device chunk saved in another dtype is converted on its device into a
 * temporary the copy holds); without, only make the staging slots
 * (tr_ckpt_reserve). */
static int plan(tr_ckpt_saver_t* s, const tr_ckpt_item_t* items, size_t n,
                const tr_dtype_t* as_dtype, job_t* j, tr_errmsg_t* err) {
  int rank = s->comm.rank, world = s->comm.world;
  double* load = calloc((size_t)world, sizeof *load);
  if (!load) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  uint64_t off = TR__CKPT_HEADER;
  size_t nslots = 0;
  int rc = 0;
  for (size_t i = 0; i < n && rc == 0; i++) {
    const tr_ckpt_item_t* it = &items[i];
    const tr_tensor_t* src = it->tensor;
    int64_t numel = tr_tensor_numel(src);
    if (numel == 0) continue;
    tr_dtype_t dt = as_dtype ? *as_dtype : src->dtype;
    uint64_t nbytes = (uint64_t)numel * tr_dtype_size(dt);
    if (it->replicated && world > 1) {
      int owner = 0;
      for (int r = 1; r < world; r++)
        if (load[r] < load[owner]) owner = r;
      load[owner] += (double)nbytes;
      if (owner != rank) continue;
    }
    if (src->ndim != it->ndim) {
      rc = tr_errmsg_set(err, TR_EINVAL,
                         "checkpoint: tensor '%s': chunk has %d dims, the "
                         "global tensor %d",
                         it->name, src->ndim, it->ndim);
      break;
    }
    for (int d = 0; d < it->ndim && rc == 0; d++)
      if (it->offset[d] < 0 || it->offset[d] + src->shape[d] > it->shape[d])
        rc = tr_errmsg_set(err, TR_EINVAL,
                           "checkpoint: tensor '%s': chunk leaves the global "
                           "shape in dim %d",
                           it->name, d);
    int on_dev = src->device.type != TR_DEV_CPU;
    if (rc == 0 && on_dev && !tr_tensor_is_contiguous(src))
      rc = tr_errmsg_set(err, TR_EUNSUPPORTED,
                         "checkpoint: tensor '%s': a strided device chunk",
                         it->name);
    if (rc < 0) break;
    int direct = s->mode == TR_CKPT_SYNC && dt == src->dtype && !on_dev &&
                 tr_tensor_is_contiguous(src);
    void* data = NULL;
    size_t slot = nslots;
    if (!direct) {
      nslots++;
      rc = slot_get(s, slot, nbytes, !j, &data);
      if (rc < 0) {
        tr_errmsg_set(err, rc, "checkpoint: %.1f MB of staging buffers: %s",
                      (double)nbytes / 1e6, tr_strerror(rc));
        break;
      }
    }
    if (!j) continue;
    seg_t* g = &j->segs[j->nsegs++];
    g->name = strdup(it->name);
    if (!g->name) {
      rc = tr_errmsg_set(err, TR_ENOMEM, "out of memory");
      break;
    }
    g->dtype = dt;
    g->ndim = it->ndim;
    memcpy(g->shape, it->shape, sizeof g->shape);
    memcpy(g->offsets, it->offset, sizeof g->offsets);
    memcpy(g->sizes, src->shape, sizeof g->sizes);
    g->nbytes = nbytes;
    g->file_off = off;
    g->dma_ev = -1;
    off += (nbytes + TR__CKPT_ALIGN - 1) / TR__CKPT_ALIGN * TR__CKPT_ALIGN;
    if (direct) {
      g->data = tr_tensor_data(src);
      continue;
    }
    g->data = data;
    copy_t* c = &j->copies[j->ncopies++];
    c->dst = slot;
    c->dtype = dt;
    c->how = !on_dev                           ? STAGE_HOST
             : s->mode == TR_CKPT_ASYNC_PINNED ? STAGE_DMA
                                               : STAGE_DEVICE;
    if (c->how == STAGE_DMA) g->dma_ev = (long)slot;
    if (!on_dev || dt == src->dtype) {
      tr_tensor_view(&c->src, src);
      continue;
    }
    /* device chunks convert on their device (the legacy default stream,
     * which the copy stream waits for) */
    rc = tr_tensor_empty(&c->src, dt, src->device, src->ndim, src->shape);
    if (rc == 0) rc = tr_tensor_copy(&c->src, src);
    if (rc < 0)
      tr_errmsg_set(err, rc, "checkpoint: tensor '%s': to %s: %s", it->name,
                    tr_dtype_name(dt), tr_strerror(rc));
  }
  free(load);
  return rc;
}

/* Order the copy streams after the kernels the caller has enqueued so far
 * (the state of this step): the writer thread then enqueues the copies
 * there, and they run while the caller computes the next step. */
static int order_device_copies(tr_ckpt_saver_t* s, job_t* j, tr_errmsg_t* err) {
  size_t ndev = 0;
  for (size_t i = 0; i < j->ncopies; i++)
    ndev += j->copies[i].how != STAGE_HOST;
  if (ndev == 0) return 0;
#ifdef HAVE_CUDA
  int rc = s->dma ? 0 : tr__ckpt_dma_new(&s->dma);
  j->dma = s->dma;
  for (size_t i = 0; i < j->ncopies && rc == 0; i++) {
    int dev = j->copies[i].src.device.index;
    if (j->copies[i].how == STAGE_HOST || (j->devs >> dev & 1)) continue;
    j->devs |= UINT64_C(1) << dev;
    rc = tr__ckpt_dma_after(s->dma, dev, tr_kern_get_stream());
  }
  if (rc < 0)
    return tr_errmsg_set(err, rc, "checkpoint: copying from the device: %s",
                         tr_strerror(rc));
  return 0;
#else
  return tr_errmsg_set(err, TR_EUNSUPPORTED,
                       "checkpoint: device tensors in a build without CUDA");
#endif
}

int tr_ckpt_reserve(tr_ckpt_saver_t* s, const tr_ckpt_item_t* items, size_t n,
                    int64_t* bytes, tr_errmsg_t* err) {
  *bytes = 0;
  if (s->mode == TR_CKPT_SYNC) return 0;
  if (s->pending)
    return tr_errmsg_set(err, TR_EINVAL,
                         "checkpoint: staging buffers are reserved before "
                         "the first save");
  TR_CHECK(plan(s, items, n, NULL, NULL, err));
  for (size_t k = 0; k < s->nstage; k++)
    if (s->stage[k].storage) *bytes += (int64_t)tr_tensor_nbytes(&s->stage[k]);
  return 0;
}

int tr_ckpt_save(tr_ckpt_saver_t* s, int64_t step, const tr_ckpt_item_t* items,
                 size_t n, const char* train_state_json,
                 const tr_dtype_t* as_dtype, tr_errmsg_t* err) {
  double t0 = tr__now();
  TR_CHECK(tr_ckpt_wait(s, err));
  double t_wait = tr__now();
  s->step = step;
  s->stats.step = step;
  int rank = s->comm.rank;
  char dir[4096];
  tr_ckpt_step_dir(s->folder, step, dir, sizeof dir);
  /* rank 0 clears what an earlier attempt at this step left (a complete
   * one loses its metadata first), then every rank may write */
  int rc = 0;
  if (rank == 0) {
    if (access(dir, F_OK) == 0) {
      TR_LOG_WARN(CKPT, "'%s' exists: saving step %" PRId64 " over it", dir,
                  step);
      rc = tr_ckpt_remove_step(s->folder, step);
      if (rc < 0)
        tr_errmsg_set(err, rc, "cannot remove '%s': %s", dir, tr_strerror(rc));
    }
    if (rc == 0) rc = tr__mkdir_p(dir, err);
  }
  double v[1] = {rc < 0 ? 1 : 0};
  TR_CHECK(sum(s, v, 1, err));
  if (rc < 0) return rc;
  if (v[0] > 0)
    return tr_errmsg_set(err, TR_EIO,
                         "checkpoint step %" PRId64
                         ": rank 0 cannot prepare "
                         "'%s'",
                         step, dir);

  double t_agree = tr__now();
  job_t* j = &s->job;
  memset(j, 0, sizeof *j);
  j->rank = rank;
  j->dir = strdup(dir);
  j->segs = calloc(n + 1, sizeof *j->segs);
  j->copies = calloc(n + 1, sizeof *j->copies);
  if (rank == 0) {
    s->decls = calloc(n + 1, sizeof *s->decls);
    s->state = strdup(train_state_json ? train_state_json : "{}");
    for (size_t i = 0; s->decls && i < n; i++)
      if (!(s->decls[s->ndecls++].name = strdup(items[i].name))) rc = TR_ENOMEM;
  }
  if (rc < 0 || !j->dir || !j->segs || !j->copies ||
      (rank == 0 && (!s->decls || !s->state))) {
    job_release(j);
    drop_decls(s);
    return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  }
  rc = plan(s, items, n, as_dtype, j, err);
  if (rc == 0) rc = order_device_copies(s, j, err);
  s->pending = 1;
  if (rc < 0) {
    /* still take part in the agreement, so the other ranks fail too
     * instead of waiting for this one */
    if (err && err->message[0] && err->code == rc)
      j->err = *err;
    else
      tr_errmsg_set(&j->err, rc, "cannot stage: %s", tr_strerror(rc));
    j->rc = rc;
    j->done = 1;
    /* async: the other ranks agree at their next poll or wait, so this one
     * reports the failure there too */
    if (s->mode != TR_CKPT_SYNC) {
      s->stats.blocked_s = tr__now() - t0;
      return 0;
    }
    return finish(s, err);
  }
  if (s->mode != TR_CKPT_SYNC &&
      pthread_create(&s->thread, NULL, write_thread, s) == 0) {
    s->thread_live = 1;
    s->stats.blocked_s = tr__now() - t0;
    TR_LOG_DEBUG(CKPT,
                 "step %" PRId64
                 ": save call %.4f s (the previous save %.4f,"
                 " preparing the folder %.4f, planning and ordering %.4f)",
                 step, s->stats.blocked_s, t_wait - t0, t_agree - t_wait,
                 tr__now() - t_agree);
    return 0;
  }
  /* synchronous (or no thread could start): stage, write, then commit */
  j->rc = stage_copies(s);
  if (j->rc == 0) j->rc = write_rank(j);
  j->done = 1;
  rc = finish(s, err);
  s->stats.blocked_s = tr__now() - t0;
  return rc;
}
