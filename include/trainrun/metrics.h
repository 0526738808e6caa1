/* trainrun/metrics.h: what a training step reports — the console line, a
 * JSONL file, and TensorBoard event files written without TensorFlow.
 *
 * The console line (one per metrics.log_freq steps):
 *
 *   step 20/200 | loss 2.3456 | grad_norm 0.5123 | lr 8.00e-04 |
 *   12345 tok/s | 0.083 TFLOP/s | mfu n/a | mem 52.1/60.3 MiB | eta 1m12s
 *
 * (one line on the terminal). tok/s is per rank, TFLOP/s is
 * flops_per_token × tok/s (torchtitan's count), MFU is that over the
 * device's dense bf16 peak, and "n/a" where no peak is known (CPU, unknown
 * GPUs: never a guess). mem is this process's current/peak tensor memory
 * (trainrun/tensor.h's allocator counters). With [metrics] comm_overlap
 * on, FSDP and DDP runs end the line with "| comm 31.2 ms hidden 87%": the
 * summed durations of a step's data-parallel collectives and the share of
 * that time the compute did not wait for (trainrun/pg_waits.h,
 * tr_pg_comm_t); tensor-parallel runs then add "| tp comm 12.0 ms hidden
 * 3%", the same for the tp hook's collectives.
 *
 * JSONL: one object per logged step, keys step, loss, grad_norm, lr, tps,
 * tflops, mfu, mem_current_bytes, mem_peak_bytes, elapsed_s, eta_s (null
 * where not applicable), then, when measured, comm_ms, comm_exposed_ms and
 * comm_hidden (TensorBoard: comm/ms_per_step, comm/exposed_ms_per_step,
 * comm/hidden), and tp_comm_ms, tp_comm_exposed_ms and tp_comm_hidden
 * (comm/tp_ms_per_step, comm/tp_exposed_ms_per_step, comm/tp_hidden), and
 * per validation {"step", "val_loss", "val_tokens"}.
 *
 * TensorBoard: a file events.out.tfevents.<time>.<host>.<pid>.<n> of
 * TFRecord frames (uint64 length, masked CRC-32C of the length, the data,
 * masked CRC-32C of the data; little-endian), each an Event protobuf:
 * wall_time (field 1, double), step (2, int64), and either file_version
 * (3, "brain.Event:2", the first record) or summary (5) holding
 * Summary.value (1) entries {tag (1), simple_value (2, float)}.
 */
#ifndef TRAINRUN_METRICS_H
#define TRAINRUN_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "trainrun/errmsg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- TensorBoard event files ---- */

typedef struct tr_tb_writer tr_tb_writer_t;

/* Create dir (and parents) and a new event file in it; writes the
 * file_version record. */
int tr_tb_open(tr_tb_writer_t** out, const char* dir, tr_errmsg_t* err);
/* The event file's path. */
const char* tr_tb_path(const tr_tb_writer_t* w);
/* One Event holding n scalars (tags[i], values[i] as float) at step;
 * wall_time in seconds since the epoch, or <= 0 for now. */
int tr_tb_scalars(tr_tb_writer_t* w, int64_t step, double wall_time, size_t n,
                  const char* const* tags, const double* values,
                  tr_errmsg_t* err);
int tr_tb_flush(tr_tb_writer_t* w, tr_errmsg_t* err);
/* Flush, close and free (NULL is fine). */
void tr_tb_close(tr_tb_writer_t* w);

/* Encode one Event (file_version when not NULL, else a summary of the n
 * scalars) into buf; returns its length, or the length needed when cap is
 * too small. */
size_t tr_tb_encode_event(uint8_t* buf, size_t cap, double wall_time,
                          int64_t step, const char* file_version, size_t n,
                          const char* const* tags, const double* values);
/* Frame data as one TFRecord into buf (cap >= n + 16); returns n + 16. */
size_t tr_tfrecord_frame(uint8_t* buf, const uint8_t* data, size_t n);

/* ---- peaks ---- */

/* Dense bf16 peak FLOP/s of a device by its model name (CUDA's
 * "NVIDIA H100 80GB HBM3" ...): H100 SXM and H200 989e12, H100 NVL 835e12,
 * H100 PCIe 756e12, H20 148e12, A100 312e12, L40S 362e12, B200/B300
 * 2.25e15, GB200/GB300 2.5e15, MI300X/MI325X 1.3074e15, MI355X 2.5e15.
 * 0 for NULL ("cpu") and names not in the table. */
double tr_peak_bf16_flops(const char* device_name);

/* ---- the metric line and files ---- */

typedef struct {
  int64_t step, total_steps;
  double loss, grad_norm, lr;
  double tps;                    /* tokens per second on this rank */
  double tflops;                 /* NaN: n/a */
  double mfu;                    /* percent; NaN: n/a */
  int64_t mem_current, mem_peak; /* bytes; < 0: n/a */
  double elapsed;                /* seconds since training started */
  double eta;                    /* seconds left; < 0 or NaN: n/a */
  /* FSDP's communication per step ([metrics] comm_overlap): the
   * collectives' summed durations, the compute's waits for them, and the
   * fraction hidden (0..1). comm_ms <= 0 or NaN: not measured (left out). */
  double comm_ms, comm_exposed_ms, comm_hidden;
  /* The same for tensor parallel's collectives (the model's tp hook on
   * the group 'tp', this rank's) when measured; tp_comm_ms <= 0 or NaN:
   * left out. */
  double tp_comm_ms, tp_comm_exposed_ms, tp_comm_hidden;
} tr_metrics_t;

/* The console line (no newline) into buf; color adds ANSI colors. Returns
 * the length (snprintf's: may exceed cap - 1 when cut). */
int tr_metrics_format(const tr_metrics_t* m, int color, char* buf, size_t cap);
/* "1h02m03s", "2m05s", "12s"; "n/a" when s < 0 or not finite. */
const char* tr_metrics_format_duration(double s, char* buf, size_t cap);

typedef struct {
  FILE* console; /* NULL: no console lines */
  int color;
  const char* jsonl_path; /* NULL: no JSONL (appends when it exists) */
  const char* tb_dir;     /* NULL: no TensorBoard */
} tr_metrics_opts_t;

typedef struct tr_metrics_logger tr_metrics_logger_t;

int tr_metrics_open(tr_metrics_logger_t** out, const tr_metrics_opts_t* o,
                    tr_errmsg_t* err);
/* Print and record one step's metrics. */
int tr_metrics_log(tr_metrics_logger_t* l, const tr_metrics_t* m,
                   tr_errmsg_t* err);
/* Print and record a validation result. */
int tr_metrics_log_val(tr_metrics_logger_t* l, int64_t step,
                       int64_t total_steps, double loss, int64_t ntokens,
                       tr_errmsg_t* err);
/* Record a committed checkpoint (JSONL: checkpoint_stall_s,
 * checkpoint_write_s, checkpoint_bytes; TensorBoard: checkpoint/stall_s,
 * checkpoint/write_s): how long the save held training up and how long
 * its write took. l may be NULL. */
int tr_metrics_log_ckpt(tr_metrics_logger_t* l, int64_t step, double stall_s,
                        double write_s, int64_t bytes, tr_errmsg_t* err);
/* Flush and free (NULL is fine). */
void tr_metrics_close(tr_metrics_logger_t* l);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_METRICS_H */
