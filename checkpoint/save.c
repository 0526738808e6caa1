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
#include "checkpoint/internal.h"
#include "trainrun/error.h"
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
} seg_t;

/* A tensor rank 0 knows of (the metadata lists tensors in this order). */
typedef struct {
  char* name;
} decl_t;

/* A host chunk to copy into its staging buffer: done by the writer thread
 * while the trainer computes the next step (only its optimizer step must
 * wait, tr_ckpt_wait_staged). */
typedef struct {
  size_t dst;      /* index into the saver's staging buffers */
  tr_tensor_t src; /* a view: holds a reference to the caller's storage */
} copy_t;

typedef struct {
  char* dir;
  int rank;
  seg_t* segs;
  size_t nsegs;
  copy_t* copies;
  size_t ncopies;
  int rc;
  tr_errmsg_t err;
  double seconds;
  int64_t bytes;
  int done;   /* atomic: the thread finished */
  int staged; /* under saver->stage_mu: the copies are done */
} job_t;

struct tr_ckpt_saver {
  char* folder;
  tr_ckpt_comm_t comm;
  tr_ckpt_mode_t mode;
  int keep;
  char* layout;
  /* staging buffers, by position among the chunks this rank writes */
  tr_tensor_t* stage;
  size_t nstage;
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
  for (size_t i = 0; i < j->ncopies; i++) tr_tensor_release(&j->copies[i].src);
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

/* The data file rank-R.bin (when there is data) and the chunk list
 * rank-R.json, both on disk (fsynced) when this returns 0. */
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
    uint8_t hdr[TR__CKPT_HEADER] = {0};
    memcpy(hdr, TR__CKPT_MAGIC, 8);
    uint32_t v = htole32(TR_CKPT_VERSION), r = htole32((uint32_t)j->rank);
    memcpy(hdr + 8, &v, 4);
    memcpy(hdr + 12, &r, 4);
    rc = pwrite_all(fd, hdr, sizeof hdr, 0);
    const size_t piece = 8u << 20;
    for (size_t i = 0; i < j->nsegs && rc == 0; i++) {
      seg_t* g = &j->segs[i];
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

/* Copy the host chunks into their staging buffers, then say so. */
static int stage_copies(tr_ckpt_saver_t* s) {
  job_t* j = &s->job;
  int rc = 0;
  for (size_t i = 0; i < j->ncopies && rc == 0; i++)
    rc = tr_tensor_copy(&s->stage[j->copies[i].dst], &j->copies[i].src);
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
  if (!s->thread_live) return 0;
  double t0 = tr__now();
  pthread_mutex_lock(&s->stage_mu);
  while (!s->job.staged) pthread_cond_wait(&s->stage_cv, &s->stage_mu);
  pthread_mutex_unlock(&s->stage_mu);
  s->stats.stall_s += tr__now() - t0;
  return 0;
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
        TR_LOG_INFO(CKPT,
                    "removed '%s/step-%" PRId64 "' (keep_latest_k %d)",
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

int tr_ckpt_save(tr_ckpt_saver_t* s, int64_t step, const tr_ckpt_item_t* items,
                 size_t n, const char* train_state_json,
                 const tr_dtype_t* as_dtype, tr_errmsg_t* err) {
  double t0 = tr__now();
  TR_CHECK(tr_ckpt_wait(s, err));
  s->step = step;
  s->stats.step = step;
  int rank = s->comm.rank, world = s->comm.world;
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

  /* plan: replicated chunks go to the rank with the fewest bytes so far */
  job_t* j = &s->job;
  memset(j, 0, sizeof *j);
  j->rank = rank;
  j->dir = strdup(dir);
  j->segs = calloc(n + 1, sizeof *j->segs);
  if (rank == 0) {
    s->decls = calloc(n + 1, sizeof *s->decls);
    s->state = strdup(train_state_json ? train_state_json : "{}");
  }
  double* load = calloc((size_t)world, sizeof *load);
  if (!j->dir || !j->segs || !load || (rank == 0 && (!s->decls || !s->state))) {
    free(load);
    job_release(j);
    drop_decls(s);
    return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  }
  j->copies = calloc(n + 1, sizeof *j->copies);
  if (!j->copies) {
    free(load);
    job_release(j);
    drop_decls(s);
    return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  }
  uint64_t off = TR__CKPT_HEADER;
  size_t nstaged = 0;
  for (size_t i = 0; i < n && rc == 0; i++) {
    const tr_ckpt_item_t* it = &items[i];
    const tr_tensor_t* src = it->tensor;
    if (rank == 0) {
      s->decls[s->ndecls].name = strdup(it->name);
      if (!s->decls[s->ndecls++].name) rc = TR_ENOMEM;
    }
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
    for (int d = 0; d < it->ndim; d++)
      if (it->offset[d] < 0 || it->offset[d] + src->shape[d] > it->shape[d])
        rc = tr_errmsg_set(err, TR_EINVAL,
                           "checkpoint: tensor '%s': chunk leaves the global "
                           "shape in dim %d",
                           it->name, d);
    if (rc < 0) break;
    seg_t* g = &j->segs[j->nsegs++];
    g->name = strdup(it->name);
    if (!g->name) {
      rc = TR_ENOMEM;
      break;
    }
    g->dtype = dt;
    g->ndim = it->ndim;
    memcpy(g->shape, it->shape, sizeof g->shape);
    memcpy(g->offsets, it->offset, sizeof g->offsets);
    memcpy(g->sizes, src->shape, sizeof g->sizes);
    g->nbytes = nbytes;
    g->file_off = off;
    off += (nbytes + TR__CKPT_ALIGN - 1) / TR__CKPT_ALIGN * TR__CKPT_ALIGN;
    int direct = s->mode == TR_CKPT_SYNC && dt == src->dtype &&
                 src->device.type == TR_DEV_CPU && tr_tensor_is_contiguous(src);
    if (direct) {
      g->data = tr_tensor_data(src);
      continue;
    }
    /* stage: a host copy (reused when the next save has the same chunk) */
    if (nstaged >= s->nstage) {
      tr_tensor_t* ns = realloc(s->stage, (nstaged + 1) * sizeof *ns);
      if (!ns) {
        rc = TR_ENOMEM;
        break;
      }
      memset(ns + s->nstage, 0, (nstaged + 1 - s->nstage) * sizeof *ns);
      s->stage = ns;
      s->nstage = nstaged + 1;
    }
    tr_tensor_t* st = &s->stage[nstaged++];
    if (st->ndim != src->ndim || st->dtype != dt ||
        !tr_tensor_same_shape(st, src) || !tr_tensor_data(st)) {
      tr_tensor_release(st);
      rc = s->mode == TR_CKPT_ASYNC_PINNED
               ? tr_tensor_empty_pinned(st, dt, src->ndim, src->shape)
               : tr_tensor_empty(st, dt, TR_DEVICE_CPU, src->ndim, src->shape);
      if (rc < 0) break;
    }
    if (src->device.type == TR_DEV_CPU) {
      /* host chunks are copied by the writer thread (below) */
      copy_t* c = &j->copies[j->ncopies++];
      c->dst = nstaged - 1; /* s->stage may move as it grows */
      tr_tensor_view(&c->src, src);
    } else if (dt != src->dtype) {
      /* device tensors convert on the host: copy, then convert */
      tr_tensor_t tmp;
      rc = tr_tensor_empty(&tmp, src->dtype, TR_DEVICE_CPU, src->ndim,
                           src->shape);
      if (rc == 0) rc = tr_tensor_copy(&tmp, src);
      if (rc == 0) rc = tr_tensor_copy(st, &tmp);
      tr_tensor_release(&tmp);
    } else {
      rc = tr_tensor_copy(st, src);
    }
    if (rc < 0) break;
    g->data = tr_tensor_data(st);
  }
  free(load);
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
      s->stats.stall_s = tr__now() - t0;
      return 0;
    }
    return finish(s, err);
  }
  if (s->mode != TR_CKPT_SYNC &&
      pthread_create(&s->thread, NULL, write_thread, s) == 0) {
    s->thread_live = 1;
    s->stats.stall_s = tr__now() - t0;
    return 0;
  }
  /* synchronous (or no thread could start): stage, write, then commit */
  j->rc = stage_copies(s);
  if (j->rc == 0) j->rc = write_rank(j);
  j->done = 1;
  rc = finish(s, err);
  s->stats.stall_s = tr__now() - t0;
  return rc;
}
