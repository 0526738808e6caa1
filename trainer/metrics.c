/* trainer/metrics.c: the metric line, the bf16 peak table, and the JSONL and
 * TensorBoard sinks (trainrun/metrics.h). */
#include "config.h"

#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "trainrun/error.h"
#include "trainrun/metrics.h"
#include "core/internal.h"

/* ---- peaks ---- */

/* Does name contain word as a model number: not inside a longer one ("H20"
 * is not in "H200", "B200" not in "GB200")? Case-insensitive. */
static int has_model(const char* name, const char* word) {
  size_t n = strlen(word);
  for (const char* p = name; *p; p++) {
    if (strncasecmp(p, word, n) != 0) continue;
    if (isdigit((unsigned char)p[n])) continue;
    if (p > name && isalnum((unsigned char)p[-1])) continue; /* "GB200" */
    return 1;
  }
  return 0;
}

double tr_peak_bf16_flops(const char* name) {
  if (!name || !*name || strcasecmp(name, "cpu") == 0) return 0;
  static const struct {
    const char* word;
    const char* also; /* a second word that must appear, or NULL */
    double peak;
  } table[] = {
      /* first match wins: variants before their family */
      {"GB200", NULL, 2.5e15},     {"GB300", NULL, 2.5e15},
      {"B200", NULL, 2.25e15},     {"B300", NULL, 2.25e15},
      {"H100", "NVL", 835e12},     {"H100", "PCIe", 756e12},
      {"H100", NULL, 989e12},      {"H200", NULL, 989e12},
      {"H20", NULL, 148e12},       {"A100", NULL, 312e12},
      {"L40S", NULL, 362e12},      {"MI300X", NULL, 1307.4e12},
      {"MI325X", NULL, 1307.4e12}, {"MI355X", NULL, 2.5e15},
  };
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    if (!has_model(name, table[i].word)) continue;
    if (table[i].also && !strcasestr(name, table[i].also)) continue;
    return table[i].peak;
  }
  return 0;
}

/* ---- formatting ---- */

const char* tr_metrics_format_duration(double s, char* buf, size_t cap) {
  if (!(s >= 0) || !isfinite(s)) {
    snprintf(buf, cap, "n/a");
    return buf;
  }
  long long t = llround(s);
  long long h = t / 3600, m = (t / 60) % 60, sec = t % 60;
  if (h)
    snprintf(buf, cap, "%lldh%02lldm%02llds", h, m, sec);
  else if (m)
    snprintf(buf, cap, "%lldm%02llds", m, sec);
  else
    snprintf(buf, cap, "%llds", sec);
  return buf;
}

static void format_bytes_pair(int64_t cur, int64_t peak, char* buf,
                              size_t cap) {
  if (cur < 0 || peak < 0) {
    snprintf(buf, cap, "n/a");
    return;
  }
  double gib = 1024.0 * 1024.0 * 1024.0;
  if ((double)peak >= gib)
    snprintf(buf, cap, "%.2f/%.2f GiB", (double)cur / gib, (double)peak / gib);
  else
    snprintf(buf, cap, "%.1f/%.1f MiB", (double)cur / (1024.0 * 1024.0),
             (double)peak / (1024.0 * 1024.0));
}

#define C_RESET "\033[0m"
#define C_CYAN "\033[36m"
#define C_GREEN "\033[32m"
#define C_YELLOW "\033[33m"
#define C_BLUE "\033[34m"
#define C_MAGENTA "\033[35m"

/* " | <what> 31.2 ms hidden 87%" appended to the line of length n in buf
 * when ms was measured; the new length (snprintf's). */
static int comm_suffix(char* buf, size_t cap, int n, const char* what,
                       double ms, double hidden) {
  if (n < 0 || !(ms > 0)) return n;
  size_t at = (size_t)n < cap ? (size_t)n : (cap ? cap - 1 : 0);
  char hid[32];
  if (isfinite(hidden))
    snprintf(hid, sizeof hid, "%.0f%%", 100.0 * hidden);
  else
    snprintf(hid, sizeof hid, "n/a");
  int k = snprintf(cap ? buf + at : NULL, cap - at, " | %s %.1f ms hidden %s",
                   what, ms, hid);
  return k > 0 ? n + k : n;
}

int tr_metrics_format(const tr_metrics_t* m, int color, char* buf, size_t cap) {
  char tflops[32], mfu[32], mem[64], eta[32];
  if (isfinite(m->tflops))
    snprintf(tflops, sizeof tflops, "%.3g", m->tflops);
  else
    snprintf(tflops, sizeof tflops, "n/a");
  if (isfinite(m->mfu))
    snprintf(mfu, sizeof mfu, "%.2f%%", m->mfu);
  else
    snprintf(mfu, sizeof mfu, "n/a");
  format_bytes_pair(m->mem_current, m->mem_peak, mem, sizeof mem);
  tr_metrics_format_duration(m->eta, eta, sizeof eta);
  const char* c0 = color ? C_RESET : "";
  int n = snprintf(
      buf, cap,
      "%sstep %" PRId64 "/%" PRId64
      "%s | %sloss %.4f%s | %sgrad_norm %.4f%s"
      " | lr %.2e | %s%.0f tok/s%s | %s TFLOP/s | %smfu %s%s | %smem %s%s"
      " | eta %s",
      color ? C_CYAN : "", m->step, m->total_steps, c0, color ? C_GREEN : "",
      m->loss, c0, color ? C_YELLOW : "", m->grad_norm, c0, m->lr,
      color ? C_BLUE : "", m->tps, c0, tflops, color ? C_MAGENTA : "", mfu, c0,
      color ? C_CYAN : "", mem, c0, eta);
  /* [metrics] comm_overlap: FSDP, DDP; the tp hook */
  n = comm_suffix(buf, cap, n, "comm", m->comm_ms, m->comm_hidden);
  n = comm_suffix(buf, cap, n, "tp comm", m->tp_comm_ms, m->tp_comm_hidden);
  return n;
}

/* ---- sinks ---- */

struct tr_metrics_logger {
  FILE* console;
  int color;
  FILE* jsonl;
  char* jsonl_path;
  tr_tb_writer_t* tb;
};

int tr_metrics_open(tr_metrics_logger_t** out, const tr_metrics_opts_t* o,
                    tr_errmsg_t* err) {
  *out = NULL;
  tr_metrics_logger_t* l = calloc(1, sizeof *l);
  if (!l) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  l->console = o->console;
  l->color = o->color;
  int rc = 0;
  if (o->jsonl_path) {
    const char* slash = strrchr(o->jsonl_path, '/');
    if (slash && slash != o->jsonl_path) {
      char* dir = strndup(o->jsonl_path, (size_t)(slash - o->jsonl_path));
      rc = dir ? tr__mkdir_p(dir, err)
               : tr_errmsg_set(err, TR_ENOMEM, "out of memory");
      free(dir);
    }
    if (rc == 0) {
      l->jsonl_path = strdup(o->jsonl_path);
      l->jsonl = l->jsonl_path ? fopen(o->jsonl_path, "a") : NULL;
      if (!l->jsonl) {
        rc = l->jsonl_path ? tr_err_from_errno() : TR_ENOMEM;
        tr_errmsg_set(err, rc, "cannot open '%s': %s", o->jsonl_path,
                      tr_strerror(rc));
      }
    }
  }
  if (rc == 0 && o->tb_dir) rc = tr_tb_open(&l->tb, o->tb_dir, err);
  if (rc < 0) {
    tr_metrics_close(l);
    return rc;
  }
  *out = l;
  return 0;
}

/* A JSON number, or null when not finite. */
static void json_num(FILE* f, const char* key, double v, int last) {
  if (isfinite(v))
    fprintf(f, "\"%s\":%.17g%s", key, v, last ? "" : ",");
  else
    fprintf(f, "\"%s\":null%s", key, last ? "" : ",");
}

/* [metrics] comm_overlap's figures, data-parallel and tensor-parallel:
 * their JSONL keys and TensorBoard tags (per step, hidden fraction). */
static const char* const dp_comm_keys[3] = {"comm_ms", "comm_exposed_ms",
                                            "comm_hidden"};
static const char* const tp_comm_keys[3] = {"tp_comm_ms", "tp_comm_exposed_ms",
                                            "tp_comm_hidden"};
static const char* const dp_comm_tags[3] = {
    "comm/ms_per_step", "comm/exposed_ms_per_step", "comm/hidden"};
static const char* const tp_comm_tags[3] = {
    "comm/tp_ms_per_step", "comm/tp_exposed_ms_per_step", "comm/tp_hidden"};

/* The three figures under keys, when ms was measured. */
static void json_comm(FILE* f, const char* const keys[3], double ms,
                      double exposed, double hidden) {
  if (!(ms > 0)) return;
  json_num(f, keys[0], ms, 0);
  json_num(f, keys[1], exposed, 0);
  json_num(f, keys[2], hidden, 0);
}

/* The same as TensorBoard scalars after the n in tags / vals (hidden only
 * when finite); the new count. */
static size_t tb_comm(const char** tags, double* vals, size_t n,
                      const char* const names[3], double ms, double exposed,
                      double hidden) {
  if (!(ms > 0)) return n;
  tags[n] = names[0];
  vals[n++] = ms;
  tags[n] = names[1];
  vals[n++] = exposed;
  if (isfinite(hidden)) {
    tags[n] = names[2];
    vals[n++] = hidden;
  }
  return n;
}

static int jsonl_done(tr_metrics_logger_t* l, tr_errmsg_t* err) {
  fputs("}\n", l->jsonl);
  if (fflush(l->jsonl) != 0 || ferror(l->jsonl)) {
    int rc = tr_err_from_errno();
    return tr_errmsg_set(err, rc, "cannot write '%s': %s", l->jsonl_path,
                         tr_strerror(rc));
  }
  return 0;
}

int tr_metrics_log(tr_metrics_logger_t* l, const tr_metrics_t* m,
                   tr_errmsg_t* err) {
  if (l->console) {
    char line[512];
    tr_metrics_format(m, l->color, line, sizeof line);
    fprintf(l->console, "%s\n", line);
    fflush(l->console);
  }
  if (l->jsonl) {
    FILE* f = l->jsonl;
    fprintf(f, "{\"step\":%" PRId64 ",", m->step);
    json_num(f, "loss", m->loss, 0);
    json_num(f, "grad_norm", m->grad_norm, 0);
    json_num(f, "lr", m->lr, 0);
    json_num(f, "tps", m->tps, 0);
    json_num(f, "tflops", m->tflops, 0);
    json_num(f, "mfu", m->mfu, 0);
    json_num(f, "mem_current_bytes",
             m->mem_current < 0 ? NAN : (double)m->mem_current, 0);
    json_num(f, "mem_peak_bytes", m->mem_peak < 0 ? NAN : (double)m->mem_peak,
             0);
    json_num(f, "elapsed_s", m->elapsed, 0);
    json_comm(f, dp_comm_keys, m->comm_ms, m->comm_exposed_ms, m->comm_hidden);
    json_comm(f, tp_comm_keys, m->tp_comm_ms, m->tp_comm_exposed_ms,
              m->tp_comm_hidden);
    json_num(f, "eta_s", m->eta >= 0 ? m->eta : NAN, 1);
    TR_CHECK(jsonl_done(l, err));
  }
  if (l->tb) {
    const double gib = 1024.0 * 1024.0 * 1024.0;
    const char* tags[14] = {"loss_metrics/global_avg_loss", "grad_norm", "lr",
                            "throughput(tps)"};
    double vals[14] = {m->loss, m->grad_norm, m->lr, m->tps};
    size_t n = 4;
    if (isfinite(m->tflops)) {
      tags[n] = "tflops";
      vals[n++] = m->tflops;
    }
    if (isfinite(m->mfu)) {
      tags[n] = "mfu(%)";
      vals[n++] = m->mfu;
    }
    if (m->mem_peak >= 0) {
      tags[n] = "memory/current(GiB)";
      vals[n++] = (double)m->mem_current / gib;
      tags[n] = "memory/peak(GiB)";
      vals[n++] = (double)m->mem_peak / gib;
    }
    n = tb_comm(tags, vals, n, dp_comm_tags, m->comm_ms, m->comm_exposed_ms,
                m->comm_hidden);
    n = tb_comm(tags, vals, n, tp_comm_tags, m->tp_comm_ms,
                m->tp_comm_exposed_ms, m->tp_comm_hidden);
    TR_CHECK(tr_tb_scalars(l->tb, m->step, 0, n, tags, vals, err));
    TR_CHECK(tr_tb_flush(l->tb, err));
  }
  return 0;
}

int tr_metrics_log_val(tr_metrics_logger_t* l, int64_t step,
                       int64_t total_steps, double loss, int64_t ntokens,
                       tr_errmsg_t* err) {
  if (l->console) {
    if (l->color)
      fprintf(l->console,
              C_CYAN "step %" PRId64 "/%" PRId64 C_RESET " | " C_GREEN
                     "val_loss %.4f" C_RESET " | %" PRId64 " tokens\n",
              step, total_steps, loss, ntokens);
    else
      fprintf(l->console,
              "step %" PRId64 "/%" PRId64 " | val_loss %.4f | %" PRId64
              " tokens\n",
              step, total_steps, loss, ntokens);
    fflush(l->console);
  }
  if (l->jsonl) {
    fprintf(l->jsonl, "{\"step\":%" PRId64 ",", step);
    json_num(l->jsonl, "val_loss", loss, 0);
    fprintf(l->jsonl, "\"val_tokens\":%" PRId64, ntokens);
    TR_CHECK(jsonl_done(l, err));
  }
  if (l->tb) {
    const char* tag = "validation_metrics/loss";
    TR_CHECK(tr_tb_scalars(l->tb, step, 0, 1, &tag, &loss, err));
    TR_CHECK(tr_tb_flush(l->tb, err));
  }
  return 0;
}

int tr_metrics_log_ckpt(tr_metrics_logger_t* l, int64_t step, double stall_s,
                        double write_s, int64_t bytes, tr_errmsg_t* err) {
  if (!l) return 0;
  if (l->jsonl) {
    fprintf(l->jsonl, "{\"step\":%" PRId64 ",", step);
    json_num(l->jsonl, "checkpoint_stall_s", stall_s, 0);
    json_num(l->jsonl, "checkpoint_write_s", write_s, 0);
    fprintf(l->jsonl, "\"checkpoint_bytes\":%" PRId64, bytes);
    TR_CHECK(jsonl_done(l, err));
  }
  if (l->tb) {
    const char* tags[2] = {"checkpoint/stall_s", "checkpoint/write_s"};
    double vals[2] = {stall_s, write_s};
    TR_CHECK(tr_tb_scalars(l->tb, step, 0, 2, tags, vals, err));
    TR_CHECK(tr_tb_flush(l->tb, err));
  }
  return 0;
}

void tr_metrics_close(tr_metrics_logger_t* l) {
  if (!l) return;
  if (l->jsonl) fclose(l->jsonl);
  free(l->jsonl_path);
  tr_tb_close(l->tb);
  free(l);
}
