/* tests/check_trainer.c: the learning-rate schedule against hand-computed
 * torchtitan values; safetensors bytes, round trips and errors; Hugging Face
 * export/import of models; CRC-32C vectors and TensorBoard files decoded;
 * the metric line; and training itself: the loss falls, gradient
 * accumulation matches one big batch, runs repeat bit for bit, validation,
 * sampling, SIGINT, the final weights. */
#include "config.h"

#include <check.h>
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h> /* reading the JSON we wrote */

#include "launcher/compose.h" /* the config -> the trainer's settings */
#include "trainrun/config.h"
#include "trainrun/error.h"
#include "trainrun/kernels.h"
#include "trainrun/crc32c.h"
#include "trainrun/metrics.h"
#include "trainrun/safetensors.h"
#include "trainrun/trainer.h"
#include "tests/fixtures.h"

static void setup(void) { fx_tmpdir_make("check_trainer"); }

/* ---- the learning-rate schedule ---- */

#define LR_EQ(s, step, want) \
  ck_assert_double_eq_tol(tr_lr_schedule_lr(&(s), step), want, 1e-12)

START_TEST(test_lr_linear_warmup) {
  tr_lr_schedule_t s;
  ck_assert_int_eq(tr_lr_schedule_init(&s, 1.0, 2, 10, -1, "linear", 0, NULL),
                   0);
  ck_assert_int_eq(s.decay_steps, 8);
  ck_assert_int_eq(s.stable_steps, 1); /* torchtitan's virtual last step */
  LR_EQ(s, 1, 0.5);
  LR_EQ(s, 2, 1.0);
  LR_EQ(s, 3, 1.0);
  LR_EQ(s, 4, 0.875);
  LR_EQ(s, 5, 0.75);
  LR_EQ(s, 10, 0.125); /* the last step stays above 0 */
  LR_EQ(s, 11, 0.0);   /* past total_steps: p = 1 */
  /* torchtitan's debug_model.toml: lr 8e-4, warmup 2, decay_ratio 0.8 */
  ck_assert_int_eq(tr_lr_schedule_init(&s, 8e-4, 2, 10, 0.8, "linear", 0, NULL),
                   0);
  LR_EQ(s, 1, 4e-4);
  LR_EQ(s, 2, 8e-4);
  LR_EQ(s, 3, 8e-4);
  LR_EQ(s, 4, 7e-4);
  LR_EQ(s, 10, 1e-4);
}
END_TEST

START_TEST(test_lr_shapes) {
  tr_lr_schedule_t s;
  /* cosine, no warmup, min_lr_factor 0.1 */
  ck_assert_int_eq(tr_lr_schedule_init(&s, 1.0, 0, 4, -1, "cosine", 0.1, NULL),
                   0);
  LR_EQ(s, 1, 1.0);
  LR_EQ(s, 2, 0.1 + 0.9 * 0.5 * (1 + cos(M_PI * 0.25)));
  LR_EQ(s, 2, 0.86819805153394637);
  LR_EQ(s, 3, 0.55);
  LR_EQ(s, 4, 0.23180194846605362);
  LR_EQ(s, 9, 0.1);
  /* sqrt, one warmup step */
  ck_assert_int_eq(tr_lr_schedule_init(&s, 2.0, 1, 5, -1, "sqrt", 0, NULL), 0);
  LR_EQ(s, 1, 2.0);
  LR_EQ(s, 2, 2.0);
  LR_EQ(s, 3, 1.0);
  LR_EQ(s, 4, 2.0 * (1 - sqrt(0.5)));
  LR_EQ(s, 5, 2.0 * (1 - sqrt(0.75)));
  /* WSD: 2 warmup, 4 stable (+1 virtual), 5 decay, to 10% */
  ck_assert_int_eq(
      tr_lr_schedule_init(&s, 1.0, 2, 10, 0.5, "linear", 0.1, NULL), 0);
  ck_assert_int_eq(s.decay_steps, 5);
  ck_assert_int_eq(s.stable_steps, 4);
  LR_EQ(s, 1, 0.5);
  LR_EQ(s, 6, 1.0);
  LR_EQ(s, 7, 0.82);
  LR_EQ(s, 10, 0.28);
  /* Python's round: halves to even */
  ck_assert_int_eq(tr_lr_schedule_init(&s, 1, 0, 10, 0.25, "linear", 0, NULL),
                   0);
  ck_assert_int_eq(s.decay_steps, 2); /* round(2.5) */
  ck_assert_int_eq(tr_lr_schedule_init(&s, 1, 0, 6, 0.25, "linear", 0, NULL),
                   0);
  ck_assert_int_eq(s.decay_steps, 2); /* round(1.5) */
  /* warmup longer than the run is cut; decay squeezed to fit */
  ck_assert_int_eq(tr_lr_schedule_init(&s, 1, 20, 10, -1, "linear", 0, NULL),
                   0);
  ck_assert_int_eq(s.warmup_steps, 10);
  LR_EQ(s, 5, 0.5);
  ck_assert_int_eq(tr_lr_schedule_init(&s, 1, 4, 10, 0.9, "linear", 0, NULL),
                   0);
  ck_assert_int_eq(s.decay_steps, 6);
  tr_errmsg_t err;
  ck_assert_int_eq(tr_lr_schedule_init(&s, 1, 0, 10, -1, "step", 0, &err),
                   TR_EINVAL);
  ck_assert_ptr_nonnull(strstr(err.message, "unknown decay_type 'step'"));
}
END_TEST

/* ---- CRC-32C and TensorBoard ---- */

/* Bit-at-a-time CRC-32C, independent of the table-driven one. */
static uint32_t crc_ref(const uint8_t* p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; i++) {
    c ^= p[i];
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1)));
  }
  return ~c;
}

START_TEST(test_crc32c_vectors) {
  ck_assert_uint_eq(tr_crc32c(0, "123456789", 9), 0xe3069283u);
  ck_assert_uint_eq(tr_crc32c(0, "", 0), 0);
  uint8_t buf[32];
  memset(buf, 0, 32);
  ck_assert_uint_eq(tr_crc32c(0, buf, 32), 0x8a9136aau); /* RFC 3720 */
  memset(buf, 0xff, 32);
  ck_assert_uint_eq(tr_crc32c(0, buf, 32), 0x62a8ab43u);
  for (int i = 0; i < 32; i++) buf[i] = (uint8_t)i;
  ck_assert_uint_eq(tr_crc32c(0, buf, 32), 0x46dd794eu);
  for (int i = 0; i < 32; i++) buf[i] = (uint8_t)(31 - i);
  ck_assert_uint_eq(tr_crc32c(0, buf, 32), 0x113fdb5cu);
  /* chaining */
  ck_assert_uint_eq(tr_crc32c(tr_crc32c(0, "12345", 5), "6789", 4),
                    0xe3069283u);
  /* the mask */
  ck_assert_uint_eq(tr_crc32c_mask(0), 0xa282ead8u);
  ck_assert_uint_eq(tr_crc32c_mask(0xe3069283u),
                    ((0xe3069283u >> 15) | (0xe3069283u << 17)) + 0xa282ead8u);
}
END_TEST

/* A minimal protobuf reader for the test. */
typedef struct {
  const uint8_t* p;
  const uint8_t* end;
} rd_t;

static uint64_t rd_varint(rd_t* r) {
  uint64_t v = 0;
  for (int s = 0; r->p < r->end; s += 7) {
    uint8_t b = *r->p++;
    v |= (uint64_t)(b & 0x7f) << s;
    if (!(b & 0x80)) return v;
  }
  ck_abort_msg("truncated varint");
  return 0;
}

typedef struct {
  double wall_time;
  int64_t step;
  char file_version[32];
  int nvalues;
  char tags[8][64];
  float values[8];
} event_t;

static void decode_value(rd_t r, event_t* e) {
  int k = e->nvalues++;
  while (r.p < r.end) {
    uint64_t key = rd_varint(&r);
    if (key == ((1 << 3) | 2)) {
      uint64_t n = rd_varint(&r);
      memcpy(e->tags[k], r.p, n);
      e->tags[k][n] = 0;
      r.p += n;
    } else if (key == ((2 << 3) | 5)) {
      memcpy(&e->values[k], r.p, 4);
      r.p += 4;
    } else {
      ck_abort_msg("unexpected Value field %llu", (unsigned long long)key);
    }
  }
}

static void decode_event(const uint8_t* p, size_t n, event_t* e) {
  memset(e, 0, sizeof *e);
  rd_t r = {p, p + n};
  while (r.p < r.end) {
    uint64_t key = rd_varint(&r);
    switch (key) {
      case (1 << 3) | 1:
        memcpy(&e->wall_time, r.p, 8);
        r.p += 8;
        break;
      case (2 << 3) | 0:
        e->step = (int64_t)rd_varint(&r);
        break;
      case (3 << 3) | 2: {
        uint64_t len = rd_varint(&r);
        memcpy(e->file_version, r.p, len);
        r.p += len;
        break;
      }
      case (5 << 3) | 2: {
        uint64_t len = rd_varint(&r);
        rd_t s = {r.p, r.p + len};
        while (s.p < s.end) {
          ck_assert_uint_eq(rd_varint(&s), (1 << 3) | 2);
          uint64_t vl = rd_varint(&s);
          decode_value((rd_t){s.p, s.p + vl}, e);
          s.p += vl;
        }
        r.p += len;
        break;
      }
      default:
        ck_abort_msg("unexpected Event field %llu", (unsigned long long)key);
    }
  }
}

/* Read every TFRecord of a file, checking both CRCs. */
static int read_events(const char* path, event_t* ev, int max) {
  size_t n;
  uint8_t* buf = fx_slurp(path, &n);
  size_t at = 0;
  int k = 0;
  while (at < n) {
    ck_assert_uint_ge(n - at, 16);
    uint64_t len;
    uint32_t c1, c2;
    memcpy(&len, buf + at, 8);
    memcpy(&c1, buf + at + 8, 4);
    ck_assert_uint_eq(c1, tr_crc32c_mask(crc_ref(buf + at, 8)));
    ck_assert_uint_le(at + 16 + len, n);
    memcpy(&c2, buf + at + 12 + len, 4);
    ck_assert_uint_eq(c2, tr_crc32c_mask(crc_ref(buf + at + 12, len)));
    ck_assert_int_lt(k, max);
    decode_event(buf + at + 12, len, &ev[k++]);
    at += 16 + len;
  }
  free(buf);
  return k;
}

START_TEST(test_tensorboard_file) {
  tr_tb_writer_t* w;
  tr_errmsg_t err;
  ck_assert_int_eq(tr_tb_open(&w, fx_path("tb/run"), &err), 0);
  const char* tags[2] = {"loss", "lr"};
  double vals[2] = {2.5, 8e-4};
  ck_assert_int_eq(tr_tb_scalars(w, 7, 1700000000.25, 2, tags, vals, &err), 0);
  ck_assert_int_eq(tr_tb_scalars(w, 300, 1700000001.5, 1, tags, vals, &err), 0);
  char path[512];
  snprintf(path, sizeof path, "%s", tr_tb_path(w));
  tr_tb_close(w);
  ck_assert_ptr_nonnull(strstr(path, "/tb/run/events.out.tfevents."));
  event_t ev[4];
  ck_assert_int_eq(read_events(path, ev, 4), 3);
  ck_assert_str_eq(ev[0].file_version, "brain.Event:2");
  ck_assert_int_eq(ev[0].nvalues, 0);
  ck_assert(ev[0].wall_time > 1.6e9);
  ck_assert_int_eq(ev[1].step, 7);
  ck_assert_double_eq(ev[1].wall_time, 1700000000.25);
  ck_assert_int_eq(ev[1].nvalues, 2);
  ck_assert_str_eq(ev[1].tags[0], "loss");
  ck_assert_float_eq(ev[1].values[0], 2.5f);
  ck_assert_str_eq(ev[1].tags[1], "lr");
  ck_assert_float_eq(ev[1].values[1], 8e-4f);
  ck_assert_int_eq(ev[2].step, 300); /* a two-byte varint */
  ck_assert_int_eq(ev[2].nvalues, 1);

  /* the exact bytes of a small event */
  uint8_t b[64];
  const char* t1 = "a";
  double v1 = 1.0;
  size_t len = tr_tb_encode_event(b, sizeof b, 0.0, 1, NULL, 1, &t1, &v1);
  const uint8_t want[] = {0x09, 0,    0,    0,    0,
                          0,    0,    0,    0,           /* wall_time */
                          0x10, 0x01,                    /* step */
                          0x2a, 0x0a,                    /* summary */
                          0x0a, 0x08,                    /* value */
                          0x0a, 0x01, 'a',               /* tag */
                          0x15, 0x00, 0x00, 0x80, 0x3f}; /* 1.0f */
  ck_assert_uint_eq(len, sizeof want);
  ck_assert_int_eq(memcmp(b, want, len), 0);
  /* a cap too small returns the length needed */
  ck_assert_uint_eq(tr_tb_encode_event(b, 4, 0.0, 1, NULL, 1, &t1, &v1), len);
  /* the record frame of an empty payload: zero length, and as data CRC
   * the mask of crc("") = 0 */
  uint8_t rec[16];
  ck_assert_uint_eq(tr_tfrecord_frame(rec, NULL, 0), 16);
  uint64_t zl = 0;
  ck_assert_int_eq(memcmp(rec, &zl, 8), 0);
  uint32_t c;
  memcpy(&c, rec + 12, 4);
  ck_assert_uint_eq(c, 0xa282ead8u);
}
END_TEST

/* ---- the metric line ---- */

START_TEST(test_metrics_line) {
  tr_metrics_t m = {.step = 20,
                    .total_steps = 200,
                    .loss = 2.345678,
                    .grad_norm = 0.512345,
                    .lr = 8e-4,
                    .tps = 12345.4,
                    .tflops = 0.0834,
                    .mfu = NAN,
                    .mem_current = 54630810,
                    .mem_peak = 63229133,
                    .elapsed = 10,
                    .eta = 72};
  char line[512];
  tr_metrics_format(&m, 0, line, sizeof line);
  ck_assert_str_eq(line,
                   "step 20/200 | loss 2.3457 | grad_norm 0.5123 | lr "
                   "8.00e-04 | 12345 tok/s | 0.0834 TFLOP/s | mfu n/a | mem "
                   "52.1/60.3 MiB | eta 1m12s");
  m.mfu = 42.1234;
  m.tflops = 416.6;
  m.mem_current = 3LL << 30;
  m.mem_peak = 70LL << 30;
  m.eta = -1;
  tr_metrics_format(&m, 0, line, sizeof line);
  ck_assert_ptr_nonnull(strstr(line,
                               "| 417 TFLOP/s | mfu 42.12% | mem "
                               "3.00/70.00 GiB | eta n/a"));
  tr_metrics_format(&m, 1, line, sizeof line);
  ck_assert_ptr_nonnull(strstr(line, "\033[")); /* colored */
  /* [metrics] comm_overlap: data-parallel, then tensor-parallel figures */
  m.comm_ms = 31.24;
  m.comm_hidden = 0.874;
  m.tp_comm_ms = 12.04;
  m.tp_comm_hidden = 0.031;
  tr_metrics_format(&m, 0, line, sizeof line);
  ck_assert_ptr_nonnull(strstr(line,
                               "| eta n/a | comm 31.2 ms hidden 87% | tp comm "
                               "12.0 ms hidden 3%"));
  ck_assert_int_eq(line[strlen(line) - 1], '%');
  m.comm_ms = 0; /* TP alone; nothing timed yet: n/a */
  m.tp_comm_hidden = NAN;
  tr_metrics_format(&m, 0, line, sizeof line);
  ck_assert_ptr_nonnull(strstr(line, "| eta n/a | tp comm 12.0 ms hidden n/a"));
  ck_assert_ptr_null(strstr(line, "| comm"));
  m.tp_comm_ms = NAN;
  tr_metrics_format(&m, 0, line, sizeof line);
  ck_assert_ptr_null(strstr(line, "comm"));
  char d[32];
  ck_assert_str_eq(tr_metrics_format_duration(3723, d, sizeof d), "1h02m03s");
  ck_assert_str_eq(tr_metrics_format_duration(59.6, d, sizeof d), "1m00s");
  ck_assert_str_eq(tr_metrics_format_duration(5, d, sizeof d), "5s");
  ck_assert_str_eq(tr_metrics_format_duration(NAN, d, sizeof d), "n/a");
  /* peaks: bf16 dense, never a guess */
  ck_assert_double_eq(tr_peak_bf16_flops("NVIDIA H100 80GB HBM3"), 989e12);
  ck_assert_double_eq(tr_peak_bf16_flops("NVIDIA H100 PCIe"), 756e12);
  ck_assert_double_eq(tr_peak_bf16_flops("NVIDIA H100 NVL"), 835e12);
  ck_assert_double_eq(tr_peak_bf16_flops("NVIDIA H200"), 989e12);
  ck_assert_double_eq(tr_peak_bf16_flops("NVIDIA H20"), 148e12);
  ck_assert_double_eq(tr_peak_bf16_flops("NVIDIA A100-SXM4-80GB"), 312e12);
  ck_assert_double_eq(tr_peak_bf16_flops("NVIDIA GB200"), 2.5e15);
  ck_assert_double_eq(tr_peak_bf16_flops("NVIDIA B200"), 2.25e15);
  ck_assert_double_eq(tr_peak_bf16_flops("AMD Instinct MI300X"), 1307.4e12);
  ck_assert_double_eq(tr_peak_bf16_flops("cpu"), 0);
  ck_assert_double_eq(tr_peak_bf16_flops(NULL), 0);
  ck_assert_double_eq(tr_peak_bf16_flops("NVIDIA GeForce RTX 4090"), 0);
}
END_TEST

START_TEST(test_metrics_files) {
  tr_metrics_logger_t* l;
  tr_errmsg_t err;
  FILE* con = tmpfile();
  tr_metrics_opts_t o = {.console = con,
                         .jsonl_path = fx_path("out/metrics.jsonl"),
                         .tb_dir = fx_path("out/tb")};
  ck_assert_int_eq(tr_metrics_open(&l, &o, &err), 0);
  tr_metrics_t m = {.step = 1,
                    .total_steps = 2,
                    .loss = 5.5,
                    .grad_norm = 1,
                    .lr = 1e-3,
                    .tps = 100,
                    .tflops = NAN,
                    .mfu = NAN,
                    .mem_current = 10,
                    .mem_peak = 20,
                    .elapsed = 1,
                    .eta = 1};
  ck_assert_int_eq(tr_metrics_log(l, &m, &err), 0);
  ck_assert_int_eq(tr_metrics_log_val(l, 2, 2, 4.25, 512, &err), 0);
  tr_metrics_close(l);
  /* console */
  rewind(con);
  char line[512];
  ck_assert_ptr_nonnull(fgets(line, sizeof line, con));
  ck_assert_ptr_nonnull(strstr(line, "step 1/2 | loss 5.5000 |"));
  ck_assert_ptr_nonnull(fgets(line, sizeof line, con));
  ck_assert_str_eq(line, "step 2/2 | val_loss 4.2500 | 512 tokens\n");
  fclose(con);
  /* JSONL: two objects */
  FILE* f = fopen(fx_path("out/metrics.jsonl"), "r");
  ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
  json_error_t je;
  json_t* o1 = json_loads(line, 0, &je);
  ck_assert_ptr_nonnull(o1);
  ck_assert_int_eq(json_integer_value(json_object_get(o1, "step")), 1);
  ck_assert_double_eq(json_real_value(json_object_get(o1, "loss")), 5.5);
  ck_assert(json_is_null(json_object_get(o1, "mfu")));
  ck_assert(json_is_null(json_object_get(o1, "tflops")));
  ck_assert_double_eq(json_number_value(json_object_get(o1, "mem_peak_bytes")),
                      20);
  json_decref(o1);
  ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
  o1 = json_loads(line, 0, &je);
  ck_assert_double_eq(json_real_value(json_object_get(o1, "val_loss")), 4.25);
  ck_assert_int_eq(json_integer_value(json_object_get(o1, "val_tokens")), 512);
  json_decref(o1);
  ck_assert_ptr_null(fgets(line, sizeof line, f));
  fclose(f);
  /* TensorBoard: version record, the step's scalars, the validation loss */
  DIR* d = opendir(fx_path("out/tb"));
  struct dirent* e;
  char ev_path[600] = "";
  while ((e = readdir(d)) != NULL)
    if (strncmp(e->d_name, "events.out.tfevents.", 20) == 0)
      snprintf(ev_path, sizeof ev_path, "%s/%s", fx_path("out/tb"), e->d_name);
  closedir(d);
  event_t ev[4];
  ck_assert_int_eq(read_events(ev_path, ev, 4), 3);
  ck_assert_str_eq(ev[1].tags[0], "loss_metrics/global_avg_loss");
  ck_assert_float_eq(ev[1].values[0], 5.5f);
  ck_assert_str_eq(ev[2].tags[0], "validation_metrics/loss");
  ck_assert_int_eq(ev[2].step, 2);
}
END_TEST

/* ---- safetensors ---- */

START_TEST(test_safetensors_bytes) {
  float a[6] = {0, 1, 2, 3, 4, 5};
  float b[4] = {1, 2, 3, 4};
  int64_t sa[2] = {2, 3}, sb[2] = {2, 2};
  tr_tensor_t ta, tb;
  ck_assert_int_eq(tr_tensor_wrap(&ta, a, TR_F32, TR_DEVICE_CPU, 2, sa), 0);
  ck_assert_int_eq(tr_tensor_wrap(&tb, b, TR_F32, TR_DEVICE_CPU, 2, sb), 0);
  tr_st_item_t items[2] = {{"a", &ta, 0}, {"b", &tb, 1}};
  const char* meta[2] = {"format", "pt"};
  tr_errmsg_t err;
  ck_assert_int_eq(
      tr_st_write(fx_path("x.safetensors"), items, 2, TR_F32, meta, 1, &err),
      0);
  size_t n;
  uint8_t* buf = fx_slurp(fx_path("x.safetensors"), &n);
  const char* json =
      "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\","
      "\"shape\":[2,3],\"data_offsets\":[0,24]},\"b\":{\"dtype\":\"F32\","
      "\"shape\":[2,2],\"data_offsets\":[24,40]}}";
  size_t jl = strlen(json), padded = (jl + 7) / 8 * 8;
  uint64_t hl;
  memcpy(&hl, buf, 8);
  ck_assert_uint_eq(hl, padded);
  ck_assert_uint_eq(n, 8 + padded + 40);
  ck_assert_int_eq(memcmp(buf + 8, json, jl), 0);
  for (size_t i = jl; i < padded; i++) ck_assert_int_eq(buf[8 + i], ' ');
  float data[10];
  memcpy(data, buf + 8 + padded, 40);
  for (int i = 0; i < 6; i++) ck_assert_float_eq(data[i], a[i]);
  /* b stored transposed: [[1, 3], [2, 4]] */
  ck_assert_float_eq(data[6], 1);
  ck_assert_float_eq(data[7], 3);
  ck_assert_float_eq(data[8], 2);
  ck_assert_float_eq(data[9], 4);
  free(buf);

  /* read back */
  tr_st_file_t f;
  ck_assert_int_eq(tr_st_open(&f, fx_path("x.safetensors"), &err), 0);
  ck_assert_uint_eq(f.n, 2);
  ck_assert_str_eq(tr_st_meta(&f, "format"), "pt");
  const tr_st_tensor_t* e = tr_st_find(&f, "a");
  ck_assert_int_eq(e->ndim, 2);
  ck_assert_int_eq(e->shape[1], 3);
  float back[6];
  tr_tensor_t tback;
  ck_assert_int_eq(tr_tensor_wrap(&tback, back, TR_F32, TR_DEVICE_CPU, 2, sa),
                   0);
  ck_assert_int_eq(tr_st_read(&f, e, &tback, &err), 0);
  ck_assert_int_eq(memcmp(back, a, sizeof a), 0);
  tr_st_release(&f);

  /* bf16 */
  ck_assert_int_eq(
      tr_st_write(fx_path("h.safetensors"), items, 1, TR_BF16, NULL, 0, &err),
      0);
  buf = fx_slurp(fx_path("h.safetensors"), &n);
  memcpy(&hl, buf, 8);
  ck_assert_ptr_nonnull(strstr((char*)buf + 8, "\"dtype\":\"BF16\""));
  uint16_t h[6];
  memcpy(h, buf + 8 + hl, 12);
  ck_assert_uint_eq(h[1], 0x3f80); /* 1.0 */
  ck_assert_uint_eq(h[2], 0x4000); /* 2.0 */
  free(buf);
  tr_tensor_release(&ta);
  tr_tensor_release(&tb);
  tr_tensor_release(&tback);
}
END_TEST

/* Write a safetensors file with a given header and data size. */
static void raw_st(const char* path, const char* header, size_t data_bytes) {
  FILE* f = fopen(path, "wb");
  uint64_t hl = strlen(header);
  fwrite(&hl, 8, 1, f);
  fwrite(header, 1, hl, f);
  for (size_t i = 0; i < data_bytes; i++) fputc(0, f);
  fclose(f);
}

static void expect_st_error(const char* path, int code, const char* want) {
  tr_st_file_t f;
  tr_errmsg_t err;
  ck_assert_int_eq(tr_st_open(&f, path, &err), code);
  ck_assert_msg(strstr(err.message, want), "'%s' lacks '%s'", err.message,
                want);
  ck_assert_ptr_nonnull(strstr(err.message, path));
  tr_st_release(&f);
}

START_TEST(test_safetensors_errors) {
  FILE* f = fopen(fx_path("short"), "wb");
  fwrite("abc", 1, 3, f);
  fclose(f);
  expect_st_error(fx_path("short"), TR_EFORMAT, "truncated at byte offset 3");
  f = fopen(fx_path("long"), "wb");
  uint64_t big = 1000;
  fwrite(&big, 8, 1, f);
  fwrite("{}", 1, 2, f);
  fclose(f);
  expect_st_error(fx_path("long"), TR_EFORMAT,
                  "header length 1000 at byte offset 0 runs past the end");
  raw_st(fx_path("json"), "{\"a\": [1,", 0);
  expect_st_error(fx_path("json"), TR_EFORMAT,
                  "bad JSON header at byte offset");
  raw_st(fx_path("dtype"),
         "{\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8);
  expect_st_error(fx_path("dtype"), TR_EDTYPE, "tensor 'a': dtype 'F64'");
  raw_st(fx_path("size"),
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8);
  expect_st_error(fx_path("size"), TR_EFORMAT,
                  "tensor 'a': 8 data bytes for shape [3] of F32 (12 bytes)");
  raw_st(fx_path("gap"),
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
         12);
  expect_st_error(fx_path("gap"), TR_EFORMAT,
                  "tensor 'b' starts at data offset 8");
  raw_st(fx_path("past"),
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
         8);
  expect_st_error(fx_path("past"), TR_EFORMAT, "run past the end of the file");
  raw_st(fx_path("tail"),
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8);
  expect_st_error(fx_path("tail"), TR_EFORMAT, "4 bytes at byte offset");
  expect_st_error(fx_path("none"), TR_ENOENT, "cannot open");
}
END_TEST

/* ---- models ---- */

static void build(tr_model_t* m, const tr_model_config_t* c, uint64_t seed) {
  ck_assert_int_eq(tr_model_init(m, c), 0);
  ck_assert_int_eq(tr_model_alloc(m, TR_DEVICE_CPU), 0);
  ck_assert_int_eq(tr_model_init_weights(m, seed), 0);
}

static int params_equal(const tr_model_t* a, const tr_model_t* b) {
  for (int i = 0; i < a->n_params; i++)
    if (memcmp(tr_tensor_data(&a->params[i].data),
               tr_tensor_data(&b->params[i].data),
               tr_tensor_nbytes(&a->params[i].data)) != 0)
      return 0;
  return 1;
}

START_TEST(test_export_import_gpt2) {
  tr_model_config_t c = fx_tiny_model("gpt2");
  tr_model_t m, m2;
  build(&m, &c, 1);
  build(&m2, &c, 2);
  ck_assert(!params_equal(&m, &m2));
  tr_errmsg_t err;
  ck_assert_int_eq(
      tr_st_export_model(&m, fx_path("g.safetensors"), TR_F32, &err), 0);
  tr_st_file_t f;
  ck_assert_int_eq(tr_st_open(&f, fx_path("g.safetensors"), &err), 0);
  /* HF layout: Conv1D weights [in, out], the tied head stored once */
  const tr_st_tensor_t* e =
      tr_st_find(&f, "transformer.h.0.attn.c_attn.weight");
  ck_assert_ptr_nonnull(e);
  ck_assert_int_eq(e->shape[0], 32);
  ck_assert_int_eq(e->shape[1], 96);
  int pi = tr_model_find_param(&m, "transformer.h.0.attn.c_attn.weight");
  const float* ours = tr_tensor_data(&m.params[pi].data); /* [96, 32] */
  const float* theirs = (const float*)(f.data + e->begin);
  for (int i = 0; i < 96; i++)
    for (int j = 0; j < 32; j++)
      ck_assert_float_eq(theirs[j * 96 + i], ours[i * 32 + j]);
  ck_assert_ptr_nonnull(tr_st_find(&f, "transformer.wte.weight"));
  ck_assert_ptr_null(tr_st_find(&f, "lm_head.weight"));
  tr_model_config_t back;
  ck_assert_int_eq(tr_st_model_config(&f, &back, &err), 0);
  ck_assert_int_eq(memcmp(&back, &c, sizeof c), 0);
  tr_st_release(&f);

  ck_assert_int_eq(tr_st_import_model(&m2, fx_path("g.safetensors"), &err), 0);
  ck_assert(params_equal(&m, &m2));

  /* a sharded rank (rank 1 of 3 along dim 0, as FSDP's Shard(0); the last
   * dim narrowed too for matrices, as a 2-D layout would): each parameter
   * receives exactly its region of the file's tensor */
  tr_model_t msh;
  ck_assert_int_eq(tr_model_init(&msh, &c), 0);
  for (int i = 0; i < msh.n_params; i++) {
    tr_param_t* p = &msh.params[i];
    int64_t start, len;
    tr_chunk_range(p->shape[0], 3, 1, &start, &len);
    p->layout.offset[0] = start;
    p->layout.shape[0] = len;
    if (p->ndim == 2) {
      p->layout.offset[1] = 1;
      p->layout.shape[1] = p->shape[1] - 2;
    }
  }
  ck_assert_int_eq(tr_model_alloc(&msh, TR_DEVICE_CPU), 0);
  ck_assert_int_eq(tr_st_import_model(&msh, fx_path("g.safetensors"), &err), 0);
  for (int i = 0; i < msh.n_params; i++) {
    const tr_param_t* p = &msh.params[i];
    const float* full = tr_tensor_data(&m.params[i].data);
    const float* mine = tr_tensor_data(&p->data);
    int64_t cols = p->ndim == 2 ? p->shape[1] : 1;
    int64_t lc = p->ndim == 2 ? p->layout.shape[1] : 1;
    int64_t c0 = p->ndim == 2 ? p->layout.offset[1] : 0;
    for (int64_t r = 0; r < p->layout.shape[0]; r++)
      for (int64_t k = 0; k < lc; k++)
        ck_assert_msg(mine[r * lc + k] ==
                          full[(p->layout.offset[0] + r) * cols + c0 + k],
                      "%s [%lld, %lld]", p->name, (long long)r, (long long)k);
  }
  tr_model_release(&msh);

  /* a model of another width: the first tensor that differs is named */
  tr_model_config_t c3 = c;
  c3.dim = 64;
  c3.head_dim = 16;
  c3.ffn_dim = 128;
  tr_model_t m3;
  build(&m3, &c3, 1);
  ck_assert_int_eq(tr_st_import_model(&m3, fx_path("g.safetensors"), &err),
                   TR_ESHAPE);
  ck_assert_msg(strstr(err.message,
                       "g.safetensors': tensor "
                       "'transformer.wte.weight' has shape "
                       "[256, 32], the model expects [256, 64]"),
                "%s", err.message);
  tr_model_release(&m3);
  /* one layer more: a missing tensor */
  c3 = c;
  c3.n_layers = 3;
  build(&m3, &c3, 1);
  ck_assert_int_eq(tr_st_import_model(&m3, fx_path("g.safetensors"), &err),
                   TR_ENOTFOUND);
  ck_assert_msg(strstr(err.message, "tensor 'transformer.h.2."), "%s",
                err.message);
  ck_assert_ptr_nonnull(strstr(err.message, "is missing"));
  tr_model_release(&m3);
  /* one layer fewer: a tensor the model does not have */
  c3.n_layers = 1;
  build(&m3, &c3, 1);
  ck_assert_int_eq(tr_st_import_model(&m3, fx_path("g.safetensors"), &err),
                   TR_EFORMAT);
  ck_assert_msg(strstr(err.message, "tensor 'transformer.h.1."), "%s",
                err.message);
  ck_assert_ptr_nonnull(strstr(err.message, "is not a parameter"));
  tr_model_release(&m3);

  /* OpenAI-style names (no "transformer.") and HF's mask buffers load */
  tr_st_item_t* items = calloc((size_t)m.n_params + 1, sizeof *items);
  char(*names)[128] = calloc((size_t)m.n_params, 128);
  for (int i = 0; i < m.n_params; i++) {
    const char* nm = m.params[i].name;
    snprintf(names[i], 128, "%s",
             strncmp(nm, "transformer.", 12) == 0 ? nm + 12 : nm);
    items[i].name = names[i];
    items[i].tensor = &m.params[i].data;
    items[i].transpose = m.params[i].hf_layout == TR_HF_TRANSPOSED;
  }
  float mask[4] = {1, 0, 1, 1};
  int64_t ms[4] = {1, 1, 2, 2};
  tr_tensor_t tm;
  ck_assert_int_eq(tr_tensor_wrap(&tm, mask, TR_F32, TR_DEVICE_CPU, 4, ms), 0);
  items[m.n_params] = (tr_st_item_t){"h.0.attn.bias", &tm, 0};
  ck_assert_int_eq(tr_st_write(fx_path("openai.safetensors"), items,
                               (size_t)m.n_params + 1, TR_F32, NULL, 0, &err),
                   0);
  tr_model_t m4;
  build(&m4, &c, 9);
  ck_assert_int_eq(tr_st_import_model(&m4, fx_path("openai.safetensors"), &err),
                   0);
  ck_assert(params_equal(&m, &m4));
  tr_model_release(&m4);
  tr_tensor_release(&tm);
  free(items);
  free(names);

  /* config.json for transformers */
  ck_assert_int_eq(tr_hf_write_config(&c, fx_path("config.json"), &err), 0);
  json_error_t je;
  json_t* o = json_load_file(fx_path("config.json"), 0, &je);
  ck_assert_ptr_nonnull(o);
  ck_assert_str_eq(
      json_string_value(json_array_get(json_object_get(o, "architectures"), 0)),
      "GPT2LMHeadModel");
  ck_assert_int_eq(json_integer_value(json_object_get(o, "n_embd")), 32);
  ck_assert_int_eq(json_integer_value(json_object_get(o, "n_inner")), 64);
  ck_assert_double_eq(json_real_value(json_object_get(o, "layer_norm_epsilon")),
                      1e-5);
  json_decref(o);
  tr_model_release(&m);
  tr_model_release(&m2);
}
END_TEST

START_TEST(test_export_import_llama) {
  tr_model_config_t c = fx_tiny_model("llama3");
  tr_model_t m, m2;
  build(&m, &c, 1);
  build(&m2, &c, 2);
  tr_errmsg_t err;
  ck_assert_int_eq(
      tr_st_export_model(&m, fx_path("l.safetensors"), TR_F32, &err), 0);
  tr_st_file_t f;
  ck_assert_int_eq(tr_st_open(&f, fx_path("l.safetensors"), &err), 0);
  const tr_st_tensor_t* e =
      tr_st_find(&f, "model.layers.1.self_attn.k_proj.weight");
  ck_assert_ptr_nonnull(e);
  ck_assert_int_eq(e->shape[0], 16); /* 2 kv heads x 8 */
  ck_assert_int_eq(e->shape[1], 32);
  ck_assert_ptr_nonnull(tr_st_find(&f, "lm_head.weight")); /* untied */
  ck_assert_ptr_nonnull(tr_st_find(&f, "model.norm.weight"));
  tr_st_release(&f);
  ck_assert_int_eq(tr_st_import_model(&m2, fx_path("l.safetensors"), &err), 0);
  ck_assert(params_equal(&m, &m2));
  /* bf16 export loads back rounded */
  ck_assert_int_eq(
      tr_st_export_model(&m, fx_path("b.safetensors"), TR_BF16, &err), 0);
  ck_assert_int_eq(tr_st_import_model(&m2, fx_path("b.safetensors"), &err), 0);
  const float* x = tr_tensor_data(&m.params[0].data);
  const float* y = tr_tensor_data(&m2.params[0].data);
  ck_assert_float_eq(y[3], tr_bf16_to_f32(tr_f32_to_bf16(x[3])));
  ck_assert_int_eq(tr_hf_write_config(&c, fx_path("config.json"), &err), 0);
  json_error_t je;
  json_t* o = json_load_file(fx_path("config.json"), 0, &je);
  ck_assert_str_eq(json_string_value(json_object_get(o, "model_type")),
                   "llama");
  ck_assert_int_eq(
      json_integer_value(json_object_get(o, "num_key_value_heads")), 2);
  ck_assert_str_eq(json_string_value(json_object_get(
                       json_object_get(o, "rope_scaling"), "rope_type")),
                   "llama3");
  ck_assert_double_eq(json_number_value(json_object_get(o, "rope_theta")),
                      500000);
  json_decref(o);
  tr_model_release(&m);
  tr_model_release(&m2);
}
END_TEST

/* ---- training ---- */

static void init_trainer(tr_trainer_t* t, const tr_config_t* cfg,
                         const tr_model_config_t* mc) {
  tr_trainer_settings_t s;
  ck_assert_int_eq(fx_settings(cfg, mc, &s), 0);
  tr_trainer_opts_t o = {.quiet = 1};
  tr_errmsg_t err;
  ck_assert_msg(tr_trainer_init(t, &s, &o, &err) == 0, "%s", err.message);
}

START_TEST(test_loss_falls) {
  fx_write_corpus(fx_path("corpus.txt"), 20000);
  tr_config_t cfg;
  fx_make_cfg(&cfg, NULL);
  tr_model_config_t mc = fx_tiny_model("llama3");
  tr_trainer_t t;
  init_trainer(&t, &cfg, &mc);
  tr_step_stats_t st;
  tr_errmsg_t err;
  double first = 0, last = 0;
  for (int s = 1; s <= 30; s++) {
    ck_assert_msg(tr_trainer_step(&t, &st, &err) == 0, "%s", err.message);
    ck_assert_int_eq(st.step, s);
    ck_assert_int_eq(st.tokens, 4 * 32);
    if (s == 1) first = st.loss;
    if (s > 25) last += st.loss / 5;
    ck_assert_double_eq(st.lr, tr_lr_schedule_lr(&t.lr, s));
  }
  /* about uniform: ln 256, plus the spread of random logits */
  ck_assert_double_eq_tol(first, log(256.0), 1.0);
  ck_assert_msg(last < first - 2.0, "loss %g -> %g", first, last);
  tr_trainer_release(&t);
  tr_config_release(&cfg);
}
END_TEST

START_TEST(test_grad_accumulation) {
  fx_write_corpus(fx_path("corpus.txt"), 20000);
  tr_config_t one, two;
  fx_make_cfg(&one, NULL);
  fx_make_cfg(&two,
              (const char* const[]){"training.local_batch_size", "2",
                                    "training.global_batch_size", "4", NULL});
  ck_assert_int_eq(two.derived.grad_accum_steps, 2);
  tr_model_config_t mc = fx_tiny_model("gpt2");
  tr_trainer_t a, b;
  init_trainer(&a, &one, &mc);
  init_trainer(&b, &two, &mc);
  ck_assert_int_eq(b.grad_accum, 2);
  tr_step_stats_t sa, sb;
  tr_errmsg_t err;
  /* one step: same loss, norm, gradients and parameters */
  ck_assert_int_eq(tr_trainer_step(&a, &sa, &err), 0);
  ck_assert_int_eq(tr_trainer_step(&b, &sb, &err), 0);
  ck_assert_double_eq_tol(sa.loss, sb.loss, 1e-5 * sa.loss);
  ck_assert_double_eq_tol(sa.grad_norm, sb.grad_norm, 1e-5 * sa.grad_norm);
  ck_assert_int_eq(sb.tokens, sa.tokens);
  for (int i = 0; i < a.model.n_params; i++) {
    const tr_param_t *p = &a.model.params[i], *q = &b.model.params[i];
    const float *x = tr_tensor_data(&p->data), *y = tr_tensor_data(&q->data);
    const float *gx = tr_tensor_data(&p->grad), *gy = tr_tensor_data(&q->grad);
    double gmax = 0;
    for (int64_t j = 0; j < tr_tensor_numel(&p->grad); j++)
      gmax = fmax(gmax, fabs(gx[j]));
    for (int64_t j = 0; j < tr_tensor_numel(&p->data); j++) {
      ck_assert_msg(fabs(x[j] - y[j]) <= 1e-5 * fmax(1.0, fabs(x[j])),
                    "%s[%lld]: %g vs %g", p->name, (long long)j, x[j], y[j]);
      ck_assert_msg(fabs(gx[j] - gy[j]) <= 1e-5 * gmax,
                    "grad %s[%lld]: %g vs %g (max %g)", p->name, (long long)j,
                    gx[j], gy[j], gmax);
    }
  }
  /* and the next step's loss (after an update from each) still agrees */
  ck_assert_int_eq(tr_trainer_step(&a, &sa, &err), 0);
  ck_assert_int_eq(tr_trainer_step(&b, &sb, &err), 0);
  ck_assert_double_eq_tol(sa.loss, sb.loss, 1e-5 * sa.loss);
  tr_trainer_release(&a);
  tr_trainer_release(&b);
  tr_config_release(&one);
  tr_config_release(&two);
}
END_TEST

START_TEST(test_bit_reproducible) {
  fx_write_corpus(fx_path("corpus.txt"), 20000);
  tr_config_t cfg;
  fx_make_cfg(&cfg,
              (const char* const[]){"optimizer.name", "AdamW",
                                    "optimizer.weight_decay", "0.1", NULL});
  tr_model_config_t mc = fx_tiny_model("llama3");
  double loss[2][6], norm[2][6];
  tr_trainer_t t[2];
  for (int r = 0; r < 2; r++) {
    /* the second run with another thread count */
    ck_assert_int_eq(tr_kern_cpu_set_num_threads(r == 0 ? 1 : 2), 0);
    init_trainer(&t[r], &cfg, &mc);
    tr_step_stats_t st;
    tr_errmsg_t err;
    for (int s = 0; s < 6; s++) {
      ck_assert_int_eq(tr_trainer_step(&t[r], &st, &err), 0);
      loss[r][s] = st.loss;
      norm[r][s] = st.grad_norm;
    }
  }
  ck_assert_int_eq(memcmp(loss[0], loss[1], sizeof loss[0]), 0);
  ck_assert_int_eq(memcmp(norm[0], norm[1], sizeof norm[0]), 0);
  ck_assert(params_equal(&t[0].model, &t[1].model));
  /* another seed, another run */
  tr_config_t cfg2;
  fx_make_cfg(&cfg2, (const char* const[]){"debug.seed", "43", NULL});
  tr_trainer_t u;
  init_trainer(&u, &cfg2, &mc);
  tr_step_stats_t st;
  tr_errmsg_t err;
  ck_assert_int_eq(tr_trainer_step(&u, &st, &err), 0);
  ck_assert(st.loss != loss[0][0]);
  tr_trainer_release(&u);
  tr_trainer_release(&t[0]);
  tr_trainer_release(&t[1]);
  tr_config_release(&cfg);
  tr_config_release(&cfg2);
}
END_TEST

START_TEST(test_weight_decay_groups) {
  fx_write_corpus(fx_path("corpus.txt"), 20000);
  /* lr 1e-3, weight decay 0.5, zero gradients are impossible to arrange, so
   * compare two runs that differ only in weight decay: norms and biases
   * must come out identical, matrices not */
  tr_config_t c0, c1;
  fx_make_cfg(&c0, (const char* const[]){"optimizer.weight_decay", "0", NULL});
  fx_make_cfg(&c1,
              (const char* const[]){"optimizer.weight_decay", "0.5", NULL});
  tr_model_config_t mc = fx_tiny_model("gpt2");
  tr_trainer_t a, b;
  init_trainer(&a, &c0, &mc);
  init_trainer(&b, &c1, &mc);
  tr_errmsg_t err;
  ck_assert_int_eq(tr_trainer_step(&a, NULL, &err), 0);
  ck_assert_int_eq(tr_trainer_step(&b, NULL, &err), 0);
  int matrices = 0, vectors = 0;
  for (int i = 0; i < a.model.n_params; i++) {
    const tr_param_t* p = &a.model.params[i];
    int same = memcmp(tr_tensor_data(&p->data),
                      tr_tensor_data(&b.model.params[i].data),
                      tr_tensor_nbytes(&p->data)) == 0;
    if (p->ndim >= 2) {
      ck_assert_msg(!same, "%s was not decayed", p->name);
      matrices++;
    } else {
      ck_assert_msg(same, "%s was decayed", p->name);
      vectors++;
    }
  }
  ck_assert_int_gt(matrices, 0);
  ck_assert_int_gt(vectors, 0);
  tr_trainer_release(&a);
  tr_trainer_release(&b);
  tr_config_release(&c0);
  tr_config_release(&c1);
}
END_TEST

START_TEST(test_validation_and_eval) {
  fx_write_corpus(fx_path("corpus.txt"), 20000);
  tr_config_t cfg;
  fx_make_cfg(&cfg, (const char* const[]){"validation.enable", "true",
                                          "validation.split_fraction", "0.1",
                                          "validation.local_batch_size", "4",
                                          "validation.seq_len", "32", NULL});
  tr_model_config_t mc = fx_tiny_model("llama3");
  tr_trainer_t t;
  init_trainer(&t, &cfg, &mc);
  /* 20000+ tokens, 10% held out: (2001 - 1) / 32 = 62 sequences, 15
   * batches of 4 */
  ck_assert_int_eq(t.val.nsamples, (t.val.end - t.val.begin - 1) / 32);
  ck_assert_int_eq(t.val_steps, t.val.nsamples / 4);
  ck_assert_int_eq(t.train.end, t.val.begin);
  double v0, v1, e1;
  int64_t n0, n1, en;
  tr_errmsg_t err;
  ck_assert_int_eq(tr_trainer_validate(&t, &v0, &n0, &err), 0);
  ck_assert_int_eq(n0, t.val_steps * 4 * 32);
  for (int s = 0; s < 20; s++)
    ck_assert_int_eq(tr_trainer_step(&t, NULL, &err), 0);
  ck_assert_int_eq(tr_trainer_validate(&t, &v1, &n1, &err), 0);
  ck_assert_msg(v1 < v0 - 1.0, "val loss %g -> %g", v0, v1);
  /* what `trainrun eval` computes is the same number */
  tr_trainer_settings_t es;
  ck_assert_int_eq(fx_settings(&cfg, NULL, &es), 0);
  ck_assert_int_eq(tr_eval_loss(&t.model, &es, &e1, &en, &err), 0);
  ck_assert_double_eq(e1, v1);
  ck_assert_int_eq(en, n1);
  tr_trainer_release(&t);
  tr_config_release(&cfg);
  /* validation without data is refused */
  tr_config_t bad;
  fx_make_cfg(&bad, (const char* const[]){"validation.enable", "true", NULL});
  tr_trainer_settings_t bs;
  ck_assert_int_eq(fx_settings(&bad, &mc, &bs), 0);
  tr_trainer_opts_t o = {.quiet = 1};
  ck_assert_int_eq(tr_trainer_init(&t, &bs, &o, &err), TR_ECONFIG);
  ck_assert_ptr_nonnull(strstr(err.message, "validation needs data"));
  tr_config_release(&bad);
}
END_TEST

START_TEST(test_train_run_writes_weights) {
  fx_write_corpus(fx_path("corpus.txt"), 20000);
  tr_config_t cfg;
  fx_make_cfg(
      &cfg, (const char* const[]){"training.steps", "4", "metrics.log_freq",
                                  "2", "metrics.enable_jsonl", "true",
                                  "metrics.enable_tensorboard", "true", NULL});
  tr_model_config_t mc = fx_tiny_model("gpt2");
  FILE* con = tmpfile();
  tr_trainer_settings_t s;
  ck_assert_int_eq(fx_settings(&cfg, &mc, &s), 0);
  tr_trainer_opts_t o = {.console = con};
  tr_errmsg_t err;
  int stopped = -1;
  ck_assert_msg(tr_train(&s, &o, &stopped, &err) == 0, "%s", err.message);
  ck_assert_int_eq(stopped, 0);
  /* console: lines for steps 1, 2 and 4 */
  rewind(con);
  char line[512];
  int steps[8], n = 0;
  while (fgets(line, sizeof line, con))
    if (strncmp(line, "step ", 5) == 0) {
      ck_assert_ptr_nonnull(strstr(line, "| mfu n/a |")); /* CPU */
      steps[n++] = atoi(line + 5);
    }
  fclose(con);
  ck_assert_int_eq(n, 3);
  ck_assert_int_eq(steps[0], 1);
  ck_assert_int_eq(steps[1], 2);
  ck_assert_int_eq(steps[2], 4);
  /* files */
  tr_model_t m;
  build(&m, &mc, 7);
  ck_assert_int_eq(
      tr_st_import_model(&m, fx_path("out/model.safetensors"), &err), 0);
  tr_model_release(&m);
  ck_assert_int_eq(access(fx_path("out/config.json"), R_OK), 0);
  size_t len;
  char* jl = (char*)fx_slurp(fx_path("out/metrics.jsonl"), &len);
  int lines = 0;
  for (size_t i = 0; i < len; i++) lines += jl[i] == '\n';
  ck_assert_int_eq(lines, 3);
  free(jl);
  ck_assert_int_eq(access(fx_path("out/tb"), F_OK), 0);
  tr_config_release(&cfg);
}
END_TEST

static void* send_sigint(void* arg) {
  usleep(300000);
  kill(getpid(), SIGINT);
  return arg;
}

START_TEST(test_sigint_finishes_step) {
  fx_write_corpus(fx_path("corpus.txt"), 20000);
  tr_config_t cfg;
  fx_make_cfg(&cfg, (const char* const[]){"training.steps", "1000000", NULL});
  tr_model_config_t mc = fx_tiny_model("gpt2");
  tr_trainer_settings_t s;
  ck_assert_int_eq(fx_settings(&cfg, &mc, &s), 0);
  tr_trainer_opts_t o = {.quiet = 1};
  struct sigaction before, after;
  sigaction(SIGINT, NULL, &before);
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, send_sigint, NULL), 0);
  tr_errmsg_t err;
  int stopped = 0;
  ck_assert_int_eq(tr_train(&s, &o, &stopped, &err), 0);
  pthread_join(th, NULL);
  ck_assert_int_eq(stopped, 1);
  ck_assert_int_eq(access(fx_path("out/model.safetensors"), R_OK), 0);
  /* the handler is gone again: SIGINT is back to its old disposition */
  sigaction(SIGINT, NULL, &after);
  ck_assert_ptr_eq((void*)after.sa_handler, (void*)before.sa_handler);
  tr_config_release(&cfg);
}
END_TEST

/* The launcher's composition root: the settings carry what the config
 * says, as resolved (the schedule's length, the global batch, the shard
 * degree), and a tool composing for the CPU ignores training.device. */
START_TEST(test_compose_settings) {
  tr_config_t cfg;
  fx_make_cfg_world(
      &cfg, 4,
      (const char* const[]){"training.device", "cuda", "training.max_norm",
                            "0.5", "checkpoint.exclude_from_loading",
                            "optimizer,dataloader", NULL});
  tr_trainer_settings_t s;
  tr_errmsg_t err;
  ck_assert_int_eq(tr_compose_trainer(&cfg, -1, &s, &err), 0);
  ck_assert_int_eq(s.device.type, TR_DEV_CPU);
  ck_assert_int_eq(s.compute_dtype, TR_F32);
  ck_assert_int_eq(s.training.steps, 30);
  ck_assert_int_eq(s.training.global_batch_size, 16); /* -1: 4 x 4 ranks */
  ck_assert_double_eq(s.training.max_norm, 0.5);
  ck_assert_int_eq(s.lr_scheduler.total_steps, 30); /* unset: the steps */
  ck_assert_int_eq(s.lr_scheduler.warmup_steps, 2);
  ck_assert_double_eq(s.lr_scheduler.decay_ratio, -1.0); /* unset */
  ck_assert_double_eq(s.optimizer.lr, 3e-3);
  ck_assert_int_eq(s.debug.seed_set, 1);
  ck_assert_uint_eq(s.debug.seed, 42);
  ck_assert_str_eq(s.dump_folder, fx_path("out"));
  ck_assert_uint_eq(s.checkpoint.n_exclude_from_loading, 2);
  ck_assert_str_eq(s.checkpoint.exclude_from_loading[1], "dataloader");
  /* llama3: the longest seq_len of training and validation (2048) */
  ck_assert_int_eq(s.model.max_seq_len, 2048);
  if (tr_cuda_device_count() == 0) { /* a rank of a cuda job needs one */
    ck_assert_int_eq(tr_compose_trainer(&cfg, 0, &s, &err), TR_EDEVICE);
    ck_assert_ptr_nonnull(strstr(err.message, "training.device: 'cuda'"));
  }
  /* the mesh gets the shard degree the config solved */
  tr_mesh_degrees_t d;
  tr_compose_mesh_degrees(&cfg, &d);
  ck_assert_int_eq(d.dp_shard, 4);
  ck_assert_int_eq(d.dp_replicate, 1);
  tr_config_release(&cfg);
  fx_make_cfg(&cfg, (const char* const[]){"model.flavor", "nosuch", NULL});
  ck_assert_int_eq(tr_compose_trainer(&cfg, -1, &s, &err), TR_ECONFIG);
  ck_assert_ptr_nonnull(
      strstr(err.message, "model.flavor: unknown flavor 'nosuch'"));
  tr_config_release(&cfg);
}
END_TEST

START_TEST(test_sampling) {
  tr_model_config_t c = fx_tiny_model("llama3");
  tr_model_t m;
  build(&m, &c, 3);
  int32_t prompt[3] = {'t', 'h', 'e'};
  int32_t a[20], b[20], g[20], k1[20];
  int64_t na, nb, ng, nk;
  tr_sample_opts_t o = {.temperature = 1.0, .max_new_tokens = 20, .seed = 5};
  tr_errmsg_t err;
  ck_assert_int_eq(tr_sample(&m, prompt, 3, &o, a, &na, &err), 0);
  ck_assert_int_eq(tr_sample(&m, prompt, 3, &o, b, &nb, &err), 0);
  ck_assert_int_eq(na, 20);
  ck_assert_int_eq(memcmp(a, b, sizeof a), 0); /* same seed, same text */
  o.seed = 6;
  ck_assert_int_eq(tr_sample(&m, prompt, 3, &o, b, &nb, &err), 0);
  ck_assert(memcmp(a, b, sizeof a) != 0);
  /* top-k 1 is greedy */
  tr_sample_opts_t greedy = {.temperature = 0, .max_new_tokens = 20};
  ck_assert_int_eq(tr_sample(&m, prompt, 3, &greedy, g, &ng, &err), 0);
  o.top_k = 1;
  ck_assert_int_eq(tr_sample(&m, prompt, 3, &o, k1, &nk, &err), 0);
  ck_assert_int_eq(memcmp(g, k1, sizeof g), 0);
  for (int i = 0; i < 20; i++) ck_assert(a[i] >= 0 && a[i] < 256);
  /* a context longer than max_seq_len slides */
  o.max_new_tokens = 70;
  int32_t longer[70];
  ck_assert_int_eq(tr_sample(&m, prompt, 3, &o, longer, &nk, &err), 0);
  ck_assert_int_eq(nk, 70);
  int32_t badp[1] = {300};
  ck_assert_int_eq(tr_sample(&m, badp, 1, &o, longer, &nk, &err), TR_EINVAL);
  tr_model_release(&m);
}
END_TEST

int main(void) {
  Suite* s = suite_create("trainer");
  TCase* tc = tcase_create("formats");
  tcase_add_checked_fixture(tc, setup, fx_tmpdir_remove);
  tcase_add_test(tc, test_lr_linear_warmup);
  tcase_add_test(tc, test_lr_shapes);
  tcase_add_test(tc, test_crc32c_vectors);
  tcase_add_test(tc, test_tensorboard_file);
  tcase_add_test(tc, test_metrics_line);
  tcase_add_test(tc, test_metrics_files);
  tcase_add_test(tc, test_safetensors_bytes);
  tcase_add_test(tc, test_safetensors_errors);
  tcase_add_test(tc, test_export_import_gpt2);
  tcase_add_test(tc, test_export_import_llama);
  suite_add_tcase(s, tc);
  tc = tcase_create("training");
  tcase_set_timeout(tc, 60);
  tcase_add_checked_fixture(tc, setup, fx_tmpdir_remove);
  tcase_add_test(tc, test_loss_falls);
  tcase_add_test(tc, test_grad_accumulation);
  tcase_add_test(tc, test_bit_reproducible);
  tcase_add_test(tc, test_weight_decay_groups);
  tcase_add_test(tc, test_validation_and_eval);
  tcase_add_test(tc, test_train_run_writes_weights);
  tcase_add_test(tc, test_sigint_finishes_step);
  tcase_add_test(tc, test_compose_settings);
  tcase_add_test(tc, test_sampling);
  suite_add_tcase(s, tc);
  SRunner* sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
