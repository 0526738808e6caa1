/* tests/fixtures.c: the shared test helpers of tests/fixtures.h. */
#include "config.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launcher/compose.h"
#include "tests/fixtures.h"
#include "trainrun/param.h" /* LOCAL_RANK */

char fx_tmpdir[256];

void fx_tmpdir_make(const char* prefix) {
  snprintf(fx_tmpdir, sizeof fx_tmpdir, "/tmp/%s.XXXXXX", prefix);
  ck_assert_ptr_nonnull(mkdtemp(fx_tmpdir));
}

void fx_tmpdir_remove(void) {
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", fx_tmpdir);
  ck_assert_int_eq(system(cmd), 0);
}

const char* fx_path(const char* name) {
  static char buf[4][512];
  static int k;
  char* p = buf[k++ % 4];
  snprintf(p, 512, "%s/%s", fx_tmpdir, name);
  return p;
}

void fx_write_bytes(const char* path, const void* data, size_t n) {
  FILE* f = fopen(path, "wb");
  ck_assert_msg(f != NULL, "cannot create %s", path);
  ck_assert_uint_eq(fwrite(data, 1, n, f), n);
  ck_assert_int_eq(fclose(f), 0);
}

uint8_t* fx_slurp(const char* path, size_t* n) {
  FILE* f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t* buf = malloc((size_t)len + 1);
  ck_assert_ptr_nonnull(buf);
  ck_assert_uint_eq(fread(buf, 1, (size_t)len, f), (size_t)len);
  buf[len] = 0;
  fclose(f);
  *n = (size_t)len;
  return buf;
}

tr_model_config_t fx_tiny_model(const char* family) {
  tr_model_config_t c;
  ck_assert_int_eq(tr_model_config_get(family, "debugmodel", &c), 0);
  c.dim = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = strcmp(family, "llama3") == 0 ? 2 : 4;
  c.head_dim = 8;
  c.ffn_dim = 64;
  c.max_seq_len = 64;
  return c;
}

void fx_write_corpus(const char* path, int bytes) {
  static const char* const words[] = {"the cat ", "sat on ", "a mat. ",
                                      "the dog ", "ran to ", "the park. "};
  FILE* f = fopen(path, "wb");
  ck_assert_msg(f != NULL, "cannot create %s", path);
  unsigned s = 1;
  int n = 0;
  while (n < bytes) {
    s = s * 1103515245u + 12345u;
    int k = (int)((s >> 16) % 2) * 3;
    for (int j = 0; j < 3; j++) n += fprintf(f, "%s", words[k + j]);
  }
  ck_assert_int_eq(fclose(f), 0);
}

void fx_cfg_set(tr_config_t* cfg, const char* key, const char* value) {
  tr_errmsg_t e;
  ck_assert_msg(tr_config_set(cfg, key, value, &e) == 0, "%s", e.message);
}

void fx_make_cfg(tr_config_t* cfg, const char* const* kv) {
  fx_make_cfg_world(cfg, 1, kv);
}

void fx_make_cfg_world(tr_config_t* cfg, int world, const char* const* kv) {
  ck_assert_int_eq(tr_config_init(cfg), 0);
  fx_cfg_set(cfg, "training.dataset_path", fx_path("corpus.txt"));
  fx_cfg_set(cfg, "job.dump_folder", fx_path("out"));
  fx_cfg_set(cfg, "debug.seed", "42");
  fx_cfg_set(cfg, "training.local_batch_size", "4");
  fx_cfg_set(cfg, "training.seq_len", "32");
  fx_cfg_set(cfg, "training.steps", "30");
  fx_cfg_set(cfg, "optimizer.lr", "3e-3");
  fx_cfg_set(cfg, "lr_scheduler.warmup_steps", "2");
  fx_cfg_set(cfg, "metrics.enable_jsonl", "false");
  for (size_t i = 0; kv && kv[i]; i += 2) fx_cfg_set(cfg, kv[i], kv[i + 1]);
  tr_errmsg_t e;
  ck_assert_msg(tr_config_resolve(cfg, world, &e) == 0, "%s", e.message);
}

int fx_settings(const tr_config_t* cfg, const tr_model_config_t* model,
                tr_trainer_settings_t* s) {
  tr_errmsg_t e;
  int rc =
      tr_compose_trainer(cfg, (int)tr_param_int(TR_PARAM_LOCAL_RANK), s, &e);
  if (rc < 0) {
    fprintf(stderr, "settings: %s\n", e.message);
    return rc;
  }
  if (model) s->model = *model;
  return 0;
}

int fx_trainer_bytes(const tr_config_t* cfg, const tr_model_config_t* model,
                     const tr_trainer_opts_t* opts, int steps, int64_t* state,
                     int64_t* peak) {
  tr_mem_stats_t s0, s1;
  tr_mem_stats(TR_MEM_HOST, 0, &s0);
  tr_trainer_settings_t ts;
  int rc = fx_settings(cfg, model, &ts);
  if (rc < 0) return rc;
  tr_trainer_t t;
  tr_errmsg_t err;
  rc = tr_trainer_init(&t, &ts, opts, &err);
  if (rc < 0) {
    fprintf(stderr, "trainer: %s\n", err.message);
    return rc;
  }
  tr_mem_stats(TR_MEM_HOST, 0, &s1);
  *state = s1.current_bytes - s0.current_bytes;
  tr_mem_reset_peak(TR_MEM_HOST, 0);
  for (int k = 0; k < steps && rc == 0; k++) {
    tr_step_stats_t st;
    rc = tr_trainer_step(&t, &st, &err);
    if (rc < 0) fprintf(stderr, "step: %s\n", err.message);
  }
  tr_mem_stats(TR_MEM_HOST, 0, &s1);
  tr_trainer_release(&t);
  if (peak) *peak = s1.peak_bytes - s0.current_bytes;
  return rc < 0 ? rc : 0;
}
