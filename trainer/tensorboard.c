/* trainer/tensorboard.c: TFRecord framing (CRC-32C from core) and hand-encoded Event
 * protobufs — TensorBoard event files without TensorFlow
 * (trainrun/metrics.h). */
#include "config.h"

#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "trainrun/crc32c.h"
#include "trainrun/error.h"
#include "trainrun/metrics.h"
#include "core/internal.h"

/* ---- protobuf encoding ---- */

typedef struct {
  uint8_t* buf;
  size_t cap, len; /* len may pass cap: then only the length is counted */
} pb_t;

static void pb_byte(pb_t* p, uint8_t b) {
  if (p->len < p->cap) p->buf[p->len] = b;
  p->len++;
}

static void pb_varint(pb_t* p, uint64_t v) {
  while (v >= 0x80) {
    pb_byte(p, (uint8_t)(v | 0x80));
    v >>= 7;
  }
  pb_byte(p, (uint8_t)v);
}

static void pb_bytes(pb_t* p, const void* data, size_t n) {
  const uint8_t* d = data;
  for (size_t i = 0; i < n; i++) pb_byte(p, d[i]);
}

static void pb_tag(pb_t* p, int field, int wire) {
  pb_varint(p, ((uint64_t)field << 3) | (uint64_t)wire);
}

static void pb_le(pb_t* p, uint64_t v, int nbytes) {
  for (int i = 0; i < nbytes; i++) pb_byte(p, (uint8_t)(v >> (8 * i)));
}

static size_t varint_len(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

/* Summary.Value {tag = 1; simple_value = 2} */
static size_t value_len(const char* tag) {
  size_t t = strlen(tag);
  return 1 + varint_len(t) + t + 1 + 4;
}

size_t tr_tb_encode_event(uint8_t* buf, size_t cap, double wall_time,
                          int64_t step, const char* file_version, size_t n,
                          const char* const* tags, const double* values) {
  pb_t p = {buf, cap, 0};
  uint64_t bits;
  memcpy(&bits, &wall_time, 8);
  pb_tag(&p, 1, 1); /* wall_time: double, fixed64 */
  pb_le(&p, bits, 8);
  pb_tag(&p, 2, 0); /* step: int64, varint (two's complement) */
  pb_varint(&p, (uint64_t)step);
  if (file_version) {
    size_t fl = strlen(file_version);
    pb_tag(&p, 3, 2);
    pb_varint(&p, fl);
    pb_bytes(&p, file_version, fl);
    return p.len;
  }
  size_t summary = 0;
  for (size_t i = 0; i < n; i++) {
    size_t vl = value_len(tags[i]);
    summary += 1 + varint_len(vl) + vl;
  }
  pb_tag(&p, 5, 2); /* summary */
  pb_varint(&p, summary);
  for (size_t i = 0; i < n; i++) {
    size_t tl = strlen(tags[i]);
    pb_tag(&p, 1, 2); /* Summary.value */
    pb_varint(&p, value_len(tags[i]));
    pb_tag(&p, 1, 2); /* Value.tag */
    pb_varint(&p, tl);
    pb_bytes(&p, tags[i], tl);
    float f = (float)values[i];
    uint32_t fb;
    memcpy(&fb, &f, 4);
    pb_tag(&p, 2, 5); /* Value.simple_value: float, fixed32 */
    pb_le(&p, fb, 4);
  }
  return p.len;
}

size_t tr_tfrecord_frame(uint8_t* buf, const uint8_t* data, size_t n) {
  uint8_t len[8];
  for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)n >> (8 * i));
  memcpy(buf, len, 8);
  uint32_t c = tr_crc32c_mask(tr_crc32c(0, len, 8));
  for (int i = 0; i < 4; i++) buf[8 + i] = (uint8_t)(c >> (8 * i));
  if (n) memcpy(buf + 12, data, n);
  c = tr_crc32c_mask(tr_crc32c(0, data, n));
  for (int i = 0; i < 4; i++) buf[12 + n + i] = (uint8_t)(c >> (8 * i));
  return n + 16;
}

/* ---- the writer ---- */

struct tr_tb_writer {
  FILE* f;
  char* path;
};

static int write_event(tr_tb_writer_t* w, double wall_time, int64_t step,
                       const char* fv, size_t n, const char* const* tags,
                       const double* values, tr_errmsg_t* err) {
  size_t len =
      tr_tb_encode_event(NULL, 0, wall_time, step, fv, n, tags, values);
  uint8_t* ev = malloc(len);
  uint8_t* rec = malloc(len + 16);
  if (!ev || !rec) {
    free(ev);
    free(rec);
    return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  }
  tr_tb_encode_event(ev, len, wall_time, step, fv, n, tags, values);
  size_t rl = tr_tfrecord_frame(rec, ev, len);
  int rc = 0;
  if (fwrite(rec, 1, rl, w->f) != rl) {
    rc = tr_err_from_errno();
    tr_errmsg_set(err, rc, "cannot write '%s': %s", w->path, tr_strerror(rc));
  }
  free(ev);
  free(rec);
  return rc;
}

int tr_tb_open(tr_tb_writer_t** out, const char* dir, tr_errmsg_t* err) {
  static int counter;
  *out = NULL;
  TR_CHECK(tr__mkdir_p(dir, err));
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = '\0';
  tr_tb_writer_t* w = calloc(1, sizeof *w);
  if (!w) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  int n = __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
  double now = tr__wall();
  size_t cap = strlen(dir) + strlen(host) + 96;
  w->path = malloc(cap);
  if (!w->path) {
    free(w);
    return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  }
  snprintf(w->path, cap, "%s/events.out.tfevents.%010lld.%s.%ld.%d", dir,
           (long long)now, host, (long)getpid(), n);
  w->f = fopen(w->path, "wb");
  if (!w->f) {
    int rc = tr_err_from_errno();
    tr_errmsg_set(err, rc, "cannot create '%s': %s", w->path, tr_strerror(rc));
    free(w->path);
    free(w);
    return rc;
  }
  int rc = write_event(w, now, 0, "brain.Event:2", 0, NULL, NULL, err);
  if (rc == 0) rc = tr_tb_flush(w, err);
  if (rc < 0) {
    tr_tb_close(w);
    return rc;
  }
  *out = w;
  return 0;
}

const char* tr_tb_path(const tr_tb_writer_t* w) { return w->path; }

int tr_tb_scalars(tr_tb_writer_t* w, int64_t step, double wall_time, size_t n,
                  const char* const* tags, const double* values,
                  tr_errmsg_t* err) {
  if (wall_time <= 0) wall_time = tr__wall();
  return write_event(w, wall_time, step, NULL, n, tags, values, err);
}

int tr_tb_flush(tr_tb_writer_t* w, tr_errmsg_t* err) {
  if (fflush(w->f) != 0) {
    int rc = tr_err_from_errno();
    return tr_errmsg_set(err, rc, "cannot write '%s': %s", w->path,
                         tr_strerror(rc));
  }
  return 0;
}

void tr_tb_close(tr_tb_writer_t* w) {
  if (!w) return;
  if (w->f) fclose(w->f);
  free(w->path);
  free(w);
}
