/* checkpoint/load.c: reading a checkpoint — metadata.json parsed and
 * checked, every local chunk filled from the saved chunks that overlap it
 * (resharding to any layout), checksums (trainrun/checkpoint.h). */
#include "config.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h> /* metadata.json */

#include "checkpoint/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/crc32c.h"
#include "trainrun/safetensors.h" /* dtype names */

/* ---- metadata ---- */

void tr_ckpt_close(tr_ckpt_t* ck) {
  if (!ck) return;
  for (size_t i = 0; i < ck->ntensors; i++) {
    tr_ckpt_tensor_t* t = &ck->tensors[i];
    for (size_t c = 0; c < t->nchunks; c++) {
      free(t->chunks[c].file);
      free(t->chunks[c].crc32c);
    }
    free(t->chunks);
    free(t->name);
  }
  free(ck->tensors);
  free(ck->layout_json);
  free(ck->train_state_json);
  free(ck->dir);
  free(ck);
}

static int ints(json_t* a, int64_t* v, int want) {
  if (!json_is_array(a) || (int)json_array_size(a) != want) return -1;
  for (int i = 0; i < want; i++) {
    json_t* e = json_array_get(a, (size_t)i);
    if (!json_is_integer(e)) return -1;
    v[i] = json_integer_value(e);
  }
  return 0;
}

/* 1 when boxes a and b share an element. */
static int boxes_meet(int nd, const tr_ckpt_chunk_t* a,
                      const tr_ckpt_chunk_t* b) {
  for (int d = 0; d < nd; d++)
    if (a->offsets[d] >= b->offsets[d] + b->sizes[d] ||
        b->offsets[d] >= a->offsets[d] + a->sizes[d])
      return 0;
  return 1;
}

static int parse_tensor(tr_ckpt_tensor_t* t, json_t* o, const char* path,
                        size_t idx, tr_errmsg_t* err) {
  const char* name = json_string_value(json_object_get(o, "name"));
  const char* dt = json_string_value(json_object_get(o, "dtype"));
  json_t* shape = json_object_get(o, "shape");
  json_t* chunks = json_object_get(o, "chunks");
  if (!name || !dt || !json_is_array(shape) ||
      json_array_size(shape) > TR_MAX_DIMS || !json_is_array(chunks))
    return tr_errmsg_set(err, TR_EFORMAT, "'%s': tensor %zu is malformed", path,
                         idx);
  t->name = strdup(name);
  if (!t->name) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  if (tr_st_dtype_parse(dt, &t->dtype) < 0)
    return tr_errmsg_set(err, TR_EFORMAT,
                         "'%s': tensor '%s': unknown dtype "
                         "'%s'",
                         path, name, dt);
  t->ndim = (int)json_array_size(shape);
  if (ints(shape, t->shape, t->ndim) < 0)
    return tr_errmsg_set(err, TR_EFORMAT, "'%s': tensor '%s': bad shape", path,
                         name);
  int64_t numel = 1;
  for (int d = 0; d < t->ndim; d++) {
    if (t->shape[d] < 0)
      return tr_errmsg_set(err, TR_EFORMAT, "'%s': tensor '%s': negative size",
                           path, name);
    numel *= t->shape[d];
  }
  t->nchunks = json_array_size(chunks);
  t->chunks = calloc(t->nchunks + 1, sizeof *t->chunks);
  if (!t->chunks) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  int64_t covered = 0;
  size_t esz = tr_dtype_size(t->dtype);
  for (size_t c = 0; c < t->nchunks; c++) {
    json_t* co = json_array_get(chunks, c);
    tr_ckpt_chunk_t* k = &t->chunks[c];
    const char* file = json_string_value(json_object_get(co, "file"));
    json_t *jo = json_object_get(co, "offset"),
           *jl = json_object_get(co, "length"),
           *jc = json_object_get(co, "crc32c");
    if (!file || strchr(file, '/') || !file[0] || strcmp(file, "..") == 0 ||
        ints(json_object_get(co, "offsets"), k->offsets, t->ndim) < 0 ||
        ints(json_object_get(co, "sizes"), k->sizes, t->ndim) < 0 ||
        !json_is_integer(jo) || !json_is_integer(jl) || !json_is_array(jc) ||
        json_integer_value(jo) < 0 || json_integer_value(jl) < 0)
      return tr_errmsg_set(err, TR_EFORMAT,
                           "'%s': tensor '%s': chunk %zu is malformed", path,
                           name, c);
    k->file = strdup(file);
    if (!k->file) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
    k->offset = (uint64_t)json_integer_value(jo);
    k->length = (uint64_t)json_integer_value(jl);
    k->ncrc = (size_t)((k->length + TR_CKPT_CRC_BLOCK - 1) / TR_CKPT_CRC_BLOCK);
    if (json_array_size(jc) != k->ncrc)
      return tr_errmsg_set(err, TR_EFORMAT,
                           "'%s': tensor '%s': chunk %zu has %zu checksums, "
                           "not %zu",
                           path, name, c, json_array_size(jc), k->ncrc);
    k->crc32c = calloc(k->ncrc + 1, sizeof *k->crc32c);
    if (!k->crc32c) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
    for (size_t b = 0; b < k->ncrc; b++)
      k->crc32c[b] = (uint32_t)json_integer_value(json_array_get(jc, b));
    for (int d = 0; d < t->ndim; d++)
      if (k->offsets[d] < 0 || k->sizes[d] < 0 ||
          k->offsets[d] + k->sizes[d] > t->shape[d])
        return tr_errmsg_set(err, TR_EFORMAT,
                             "'%s': tensor '%s': chunk %zu leaves the "
                             "tensor in dim %d",
                             path, name, c, d);
    int64_t vol = tr__ckpt_volume(t->ndim, k->sizes);
    if (k->length != (uint64_t)vol * esz)
      return tr_errmsg_set(err, TR_EFORMAT,
                           "'%s': tensor '%s': chunk %zu holds %" PRIu64
                           " bytes, not %" PRId64 " elements of %s",
                           path, name, c, k->length, vol, dt);
    for (size_t p = 0; p < c; p++)
      if (vol > 0 && boxes_meet(t->ndim, k, &t->chunks[p]))
        return tr_errmsg_set(err, TR_EFORMAT,
                             "'%s': tensor '%s': chunks %zu and %zu overlap",
                             path, name, p, c);
    covered += vol;
  }
  if (covered != numel)
    return tr_errmsg_set(err, TR_EFORMAT,
                         "'%s': tensor '%s': chunks hold %" PRId64
                         " of its %" PRId64 " elements",
                         path, name, covered, numel);
  return 0;
}

int tr_ckpt_open(tr_ckpt_t** out, const char* dir, tr_errmsg_t* err) {
  *out = NULL;
  char* path = tr__ckpt_join(dir, TR_CKPT_METADATA);
  if (!path) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  struct stat st;
  if (stat(path, &st) < 0) {
    int rc = errno == ENOENT ? TR_ENOTFOUND : tr_err_from_errno();
    struct stat ds;
    if (rc == TR_ENOTFOUND && stat(dir, &ds) == 0)
      tr_errmsg_set(err, rc, "'%s' is incomplete: it has no " TR_CKPT_METADATA,
                    dir);
    else if (rc == TR_ENOTFOUND)
      tr_errmsg_set(err, rc, "no checkpoint at '%s'", dir);
    else
      tr_errmsg_set(err, rc, "cannot open '%s': %s", path, tr_strerror(rc));
    free(path);
    return rc;
  }
  char* text = NULL;
  int rc = tr__ckpt_read_file(path, &text, NULL, err);
  if (rc < 0) {
    free(path);
    return rc;
  }
  json_error_t je;
  json_t* root = json_loads(text, 0, &je);
  free(text);
  tr_ckpt_t* ck = calloc(1, sizeof *ck);
  if (!ck) {
    json_decref(root);
    free(path);
    return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  }
  if (!root) {
    rc = tr_errmsg_set(err, TR_EFORMAT, "'%s':%d:%d: %s", path, je.line,
                       je.column, je.text);
    goto out;
  }
  const char* fmt = json_string_value(json_object_get(root, "format"));
  json_t* ver = json_object_get(root, "version");
  if (!fmt || strcmp(fmt, "trainrun-checkpoint") != 0) {
    rc = tr_errmsg_set(err, TR_EFORMAT,
                       "'%s': not a trainrun checkpoint (no \"format\": "
                       "\"trainrun-checkpoint\")",
                       path);
    goto out;
  }
  if (!json_is_integer(ver) || json_integer_value(ver) != TR_CKPT_VERSION) {
    rc = tr_errmsg_set(err, TR_EFORMAT,
                       "'%s': checkpoint format version %" JSON_INTEGER_FORMAT
                       " (this trainrun reads version %d)",
                       path, json_integer_value(ver), TR_CKPT_VERSION);
    goto out;
  }
  ck->dir = strdup(dir);
  ck->step = json_integer_value(json_object_get(root, "step"));
  ck->world_size = (int)json_integer_value(json_object_get(root, "world_size"));
  json_t* layout = json_object_get(root, "layout");
  json_t* state = json_object_get(root, "train_state");
  ck->layout_json = json_dumps(layout ? layout : json_object(), JSON_COMPACT);
  ck->train_state_json =
      json_dumps(state ? state : json_object(), JSON_COMPACT);
  json_t* tensors = json_object_get(root, "tensors");
  if (!ck->dir || !ck->layout_json || !ck->train_state_json) {
    rc = tr_errmsg_set(err, TR_ENOMEM, "out of memory");
    goto out;
  }
  if (!json_is_array(tensors)) {
    rc = tr_errmsg_set(err, TR_EFORMAT, "'%s': no \"tensors\" list", path);
    goto out;
  }
  ck->tensors = calloc(json_array_size(tensors) + 1, sizeof *ck->tensors);
  if (!ck->tensors) {
    rc = tr_errmsg_set(err, TR_ENOMEM, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < json_array_size(tensors) && rc == 0; i++) {
    ck->ntensors++;
    rc =
        parse_tensor(&ck->tensors[i], json_array_get(tensors, i), path, i, err);
  }
out:
  json_decref(root);
  free(path);
  if (rc < 0) {
    tr_ckpt_close(ck);
    return rc;
  }
  *out = ck;
  return 0;
}

char* tr_ckpt_state_get(const tr_ckpt_t* ck, const char* key) {
  json_error_t je;
  json_t* st = json_loads(ck->train_state_json, 0, &je);
  json_t* v = json_object_get(st, key);
  char* s = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
  json_decref(st);
  return s;
}

const tr_ckpt_tensor_t* tr_ckpt_find(const tr_ckpt_t* ck, const char* name) {
  for (size_t i = 0; i < ck->ntensors; i++)
    if (strcmp(ck->tensors[i].name, name) == 0) return &ck->tensors[i];
  return NULL;
}

/* ---- reading chunks ---- */

/* Read bytes [lo, hi) of chunk k of t into buf, where lo and hi are
 * multiples of TR_CKPT_CRC_BLOCK or hi = the chunk's length, checking the
 * file header, its size and the checksum of every block read. */
static int read_range(const tr_ckpt_t* ck, const tr_ckpt_tensor_t* t,
                      const tr_ckpt_chunk_t* k, uint64_t lo, uint64_t hi,
                      void* buf, tr_errmsg_t* err) {
  char* path = tr__ckpt_join(ck->dir, k->file);
  if (!path) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  int rc = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    rc = tr_err_from_errno();
    tr_errmsg_set(err, rc, "cannot open '%s': %s", path, tr_strerror(rc));
    goto out;
  }
  struct stat st;
  char hdr[12];
  if (fstat(fd, &st) < 0) {
    rc = tr_err_from_errno();
    tr_errmsg_set(err, rc, "cannot read '%s': %s", path, tr_strerror(rc));
    goto out;
  }
  if (pread(fd, hdr, sizeof hdr, 0) != (ssize_t)sizeof hdr ||
      memcmp(hdr, TR__CKPT_MAGIC, 8) != 0) {
    rc = tr_errmsg_set(err, TR_EFORMAT,
                       "'%s': not a trainrun checkpoint data file (bad "
                       "header at byte offset 0)",
                       path);
    goto out;
  }
  if ((uint64_t)st.st_size < k->offset + hi) {
    rc = tr_errmsg_set(err, TR_EFORMAT,
                       "'%s' is truncated: tensor '%s' needs bytes [%" PRIu64
                       ", %" PRIu64 ") but the file ends at byte offset %lld",
                       path, t->name, k->offset + lo, k->offset + hi,
                       (long long)st.st_size);
    goto out;
  }
  uint8_t* p = buf;
  uint64_t left = hi - lo, off = k->offset + lo;
  while (left > 0) {
    size_t want = left > (1u << 30) ? (1u << 30) : (size_t)left;
    ssize_t r = pread(fd, p, want, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      rc = r < 0 ? tr_err_from_errno() : TR_EFORMAT;
      tr_errmsg_set(err, rc, "cannot read '%s' at byte offset %" PRIu64 ": %s",
                    path, off, r < 0 ? tr_strerror(rc) : "end of file");
      goto out;
    }
    p += r;
    off += (uint64_t)r;
    left -= (uint64_t)r;
  }
  for (uint64_t b = lo; b < hi; b += TR_CKPT_CRC_BLOCK) {
    uint64_t n = hi - b < TR_CKPT_CRC_BLOCK ? hi - b : TR_CKPT_CRC_BLOCK;
    uint32_t want = k->crc32c[b / TR_CKPT_CRC_BLOCK];
    uint32_t crc = tr_crc32c(0, (const uint8_t*)buf + (b - lo), (size_t)n);
    if (crc != want) {
      rc = tr_errmsg_set(err, TR_ECHECKSUM,
                         "'%s': checksum mismatch at byte offset %" PRIu64
                         " (tensor '%s', %" PRIu64
                         " bytes): crc32c 0x%08x, metadata says 0x%08x",
                         path, k->offset + b, t->name, n, crc, want);
      break;
    }
  }
out:
  if (fd >= 0) close(fd);
  free(path);
  return rc;
}

static int read_chunk(const tr_ckpt_t* ck, const tr_ckpt_tensor_t* t,
                      const tr_ckpt_chunk_t* k, void* buf, tr_errmsg_t* err) {
  return read_range(ck, t, k, 0, k->length, buf, err);
}

/* Convert n elements from src (sd) to dst (dd). */
static void convert(void* dst, tr_dtype_t dd, const void* src, tr_dtype_t sd,
                    int64_t n) {
  if (dd == sd) {
    memcpy(dst, src, (size_t)n * tr_dtype_size(dd));
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    float f;
    if (sd == TR_F32)
      memcpy(&f, (const char*)src + 4 * i, 4);
    else if (sd == TR_BF16)
      f = tr_bf16_to_f32(((const uint16_t*)src)[i]);
    else
      f = tr_f16_to_f32(((const uint16_t*)src)[i]);
    if (dd == TR_F32)
      memcpy((char*)dst + 4 * i, &f, 4);
    else if (dd == TR_BF16)
      ((uint16_t*)dst)[i] = tr_f32_to_bf16(f);
    else
      ((uint16_t*)dst)[i] = tr_f32_to_f16(f);
  }
}

static int float_dtype(tr_dtype_t d) {
  return d == TR_F32 || d == TR_BF16 || d == TR_F16;
}

/* Copy the overlap of saved chunk k (data in buf) into the local chunk
 * (host, contiguous, dtype dd) of item it. Returns the elements copied. */
static int64_t copy_overlap(const tr_ckpt_tensor_t* t, const tr_ckpt_chunk_t* k,
                            const void* buf, uint64_t base,
                            const tr_ckpt_item_t* it, void* dst,
                            tr_dtype_t dd) {
  int nd = t->ndim;
  const int64_t* ls = it->tensor->shape;
  int64_t start[TR_MAX_DIMS], len[TR_MAX_DIMS];
  for (int d = 0; d < nd; d++) {
    int64_t a = k->offsets[d] > it->offset[d] ? k->offsets[d] : it->offset[d];
    int64_t b = k->offsets[d] + k->sizes[d] < it->offset[d] + ls[d]
                    ? k->offsets[d] + k->sizes[d]
                    : it->offset[d] + ls[d];
    if (b <= a) return 0;
    start[d] = a;
    len[d] = b - a;
  }
  size_t ss = tr_dtype_size(t->dtype), ds = tr_dtype_size(dd);
  if (nd == 0) {
    convert(dst, dd, buf, t->dtype, 1);
    return 1;
  }
  /* row-major strides of the saved chunk and of the local chunk */
  int64_t sst[TR_MAX_DIMS], dst_st[TR_MAX_DIMS];
  sst[nd - 1] = dst_st[nd - 1] = 1;
  for (int d = nd - 2; d >= 0; d--) {
    sst[d] = sst[d + 1] * k->sizes[d + 1];
    dst_st[d] = dst_st[d + 1] * ls[d + 1];
  }
  int64_t rows = 1;
  for (int d = 0; d < nd - 1; d++) rows *= len[d];
  int64_t idx[TR_MAX_DIMS] = {0};
  for (int64_t r = 0; r < rows; r++) {
    int64_t so = 0, doff = 0;
    for (int d = 0; d < nd; d++) {
      int64_t g = start[d] + (d < nd - 1 ? idx[d] : 0);
      so += (g - k->offsets[d]) * sst[d];
      doff += (g - it->offset[d]) * dst_st[d];
    }
    convert((char*)dst + doff * (int64_t)ds, dd,
            (const char*)buf + (so * (int64_t)ss - (int64_t)base), t->dtype,
            len[nd - 1]);
    for (int d = nd - 2; d >= 0; d--) {
      if (++idx[d] < len[d]) break;
      idx[d] = 0;
    }
  }
  return tr__ckpt_volume(nd, len);
}

static int load_item(const tr_ckpt_t* ck, const tr_ckpt_item_t* it,
                     tr_errmsg_t* err) {
  const tr_ckpt_tensor_t* t = tr_ckpt_find(ck, it->name);
  if (!t)
    return tr_errmsg_set(err, TR_ENOTFOUND, "'%s' has no tensor '%s'", ck->dir,
                         it->name);
  tr_tensor_t* dt = it->tensor;
  int same = t->ndim == it->ndim && dt->ndim == it->ndim;
  for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == it->shape[d];
  if (!same)
    return tr_errmsg_set(err, TR_EINVAL,
                         "'%s': tensor '%s' has another global shape than "
                         "the one to load",
                         ck->dir, it->name);
  for (int d = 0; d < it->ndim; d++)
    if (it->offset[d] < 0 || it->offset[d] + dt->shape[d] > it->shape[d])
      return tr_errmsg_set(err, TR_EINVAL,
                           "tensor '%s': the chunk to load leaves the global "
                           "shape in dim %d",
                           it->name, d);
  if (!float_dtype(t->dtype) || !float_dtype(dt->dtype)) {
    if (t->dtype != dt->dtype)
      return tr_errmsg_set(
          err, TR_EDTYPE, "'%s': tensor '%s' is %s, cannot load it as %s",
          ck->dir, it->name, tr_dtype_name(t->dtype), tr_dtype_name(dt->dtype));
  }
  int64_t numel = tr_tensor_numel(dt);
  if (numel == 0) return 0;
  /* the local chunk as host contiguous memory */
  tr_tensor_t host = {0};
  int direct = dt->device.type == TR_DEV_CPU && tr_tensor_is_contiguous(dt);
  if (!direct)
    TR_CHECK(
        tr_tensor_empty(&host, dt->dtype, TR_DEVICE_CPU, dt->ndim, dt->shape));
  void* dst = direct ? tr_tensor_data(dt) : tr_tensor_data(&host);
  int rc = 0;
  int64_t got = 0;
  void* buf = NULL;
  size_t bufcap = 0;
  for (size_t c = 0; c < t->nchunks && rc == 0; c++) {
    const tr_ckpt_chunk_t* k = &t->chunks[c];
    if (k->length == 0) continue;
    int meets = 1, whole = 1;
    for (int d = 0; d < t->ndim; d++) {
      if (k->offsets[d] >= it->offset[d] + dt->shape[d] ||
          it->offset[d] >= k->offsets[d] + k->sizes[d])
        meets = 0;
      if (k->offsets[d] != it->offset[d] || k->sizes[d] != dt->shape[d])
        whole = 0;
    }
    if (!meets) continue;
    if (whole && t->dtype == dt->dtype) {
      /* the saved chunk is exactly the local one: read in place */
      rc = read_chunk(ck, t, k, dst, err);
      got += numel;
      continue;
    }
    /* the bytes of the chunk from the overlap's first element to its
     * last, widened to whole checksum blocks */
    uint64_t lo = 0, hi = k->length;
    if (t->ndim > 0) {
      int64_t first = 0, last = 0, stride = 1;
      for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t a =
            k->offsets[d] > it->offset[d] ? k->offsets[d] : it->offset[d];
        int64_t b = k->offsets[d] + k->sizes[d] < it->offset[d] + dt->shape[d]
                        ? k->offsets[d] + k->sizes[d]
                        : it->offset[d] + dt->shape[d];
        first += (a - k->offsets[d]) * stride;
        last += (b - 1 - k->offsets[d]) * stride;
        stride *= k->sizes[d];
      }
      uint64_t es = tr_dtype_size(t->dtype);
      lo = (uint64_t)first * es / TR_CKPT_CRC_BLOCK * TR_CKPT_CRC_BLOCK;
      hi = ((uint64_t)(last + 1) * es + TR_CKPT_CRC_BLOCK - 1) /
           TR_CKPT_CRC_BLOCK * TR_CKPT_CRC_BLOCK;
      if (hi > k->length) hi = k->length;
    }
    if (bufcap < hi - lo) {
      free(buf);
      bufcap = (size_t)(hi - lo);
      buf = malloc(bufcap);
      if (!buf) {
        rc = tr_errmsg_set(err, TR_ENOMEM, "out of memory");
        break;
      }
    }
    rc = read_range(ck, t, k, lo, hi, buf, err);
    if (rc == 0) got += copy_overlap(t, k, buf, lo, it, dst, dt->dtype);
  }
  free(buf);
  if (rc == 0 && got != numel)
    rc = tr_errmsg_set(err, TR_EFORMAT,
                       "'%s': tensor '%s': the saved chunks cover %" PRId64
                       " of the %" PRId64 " elements to load",
                       ck->dir, it->name, got, numel);
  if (rc == 0 && !direct) {
    rc = tr_tensor_copy(dt, &host);
    if (rc < 0)
      tr_errmsg_set(err, rc, "tensor '%s': %s", it->name, tr_strerror(rc));
  }
  tr_tensor_release(&host);
  return rc;
}

int tr_ckpt_load(const tr_ckpt_t* ck, const tr_ckpt_item_t* items, size_t n,
                 tr_errmsg_t* err) {
  for (size_t i = 0; i < n; i++) TR_CHECK(load_item(ck, &items[i], err));
  return 0;
}

int tr_ckpt_check_files(const tr_ckpt_t* ck, tr_errmsg_t* err) {
  /* files in the order chunks first name them, with the bytes they need */
  size_t cap = 0, n = 0;
  struct {
    const char* file;
    uint64_t end;
  }* v = NULL;
  int rc = 0;
  for (size_t i = 0; i < ck->ntensors && rc == 0; i++) {
    const tr_ckpt_tensor_t* t = &ck->tensors[i];
    for (size_t c = 0; c < t->nchunks; c++) {
      const tr_ckpt_chunk_t* k = &t->chunks[c];
      if (k->length == 0) continue;
      size_t j = 0;
      while (j < n && strcmp(v[j].file, k->file) != 0) j++;
      if (j == n) {
        if (n == cap) {
          cap = cap ? 2 * cap : 16;
          void* nv = realloc(v, cap * sizeof *v);
          if (!nv) {
            rc = tr_errmsg_set(err, TR_ENOMEM, "out of memory");
            break;
          }
          v = nv;
        }
        v[n].file = k->file;
        v[n++].end = 0;
      }
      if (k->offset + k->length > v[j].end) v[j].end = k->offset + k->length;
    }
  }
  for (size_t j = 0; j < n && rc == 0; j++) {
    char* path = tr__ckpt_join(ck->dir, v[j].file);
    if (!path) {
      rc = tr_errmsg_set(err, TR_ENOMEM, "out of memory");
      break;
    }
    struct stat st;
    if (stat(path, &st) < 0) {
      rc = tr_err_from_errno();
      if (rc == TR_ENOENT)
        tr_errmsg_set(err, rc, "'%s' is missing", path);
      else
        tr_errmsg_set(err, rc, "cannot open '%s': %s", path, tr_strerror(rc));
    } else if ((uint64_t)st.st_size < v[j].end) {
      rc = tr_errmsg_set(err, TR_EFORMAT,
                         "'%s' is truncated: %lld bytes, the metadata needs "
                         "%" PRIu64,
                         path, (long long)st.st_size, v[j].end);
    }
    free(path);
  }
  free(v);
  return rc;
}

int tr_ckpt_verify(const tr_ckpt_t* ck, int64_t* bytes, tr_errmsg_t* err) {
  int64_t total = 0;
  void* buf = NULL;
  size_t cap = 0;
  int rc = 0;
  for (size_t i = 0; i < ck->ntensors && rc == 0; i++) {
    const tr_ckpt_tensor_t* t = &ck->tensors[i];
    for (size_t c = 0; c < t->nchunks && rc == 0; c++) {
      const tr_ckpt_chunk_t* k = &t->chunks[c];
      if (k->length > cap) {
        free(buf);
        cap = (size_t)k->length;
        buf = malloc(cap);
        if (!buf) {
          rc = tr_errmsg_set(err, TR_ENOMEM, "out of memory");
          break;
        }
      }
      rc = read_chunk(ck, t, k, buf, err);
      total += (int64_t)k->length;
    }
  }
  free(buf);
  if (bytes) *bytes = total;
  return rc;
}
