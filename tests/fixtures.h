/* tests/fixtures.h: helpers the Check suites of the trainer and checkpoint
 * layers share (check_data, check_trainer, check_ddp, check_checkpoint,
 * check_fsdp2, check_tp): a
 * temporary folder per test, files in it, and a tiny model trained on a
 * generated corpus.
 *
 * The temporary folder: fx_tmpdir_make as a checked fixture's setup
 * (Check forks each test, so each test gets a new one) and
 * fx_tmpdir_remove as its teardown:
 *
 *     static void setup(void) { fx_tmpdir_make("check_data"); }
 *     ...
 *     tcase_add_checked_fixture(tc, setup, fx_tmpdir_remove);
 *
 * Helpers fail the running test (ck_assert) when the system says no. */
#ifndef TRAINRUN_TESTS_FIXTURES_H
#define TRAINRUN_TESTS_FIXTURES_H

#include <stddef.h>
#include <stdint.h>

#include "trainrun/config.h"
#include "trainrun/model.h"
#include "trainrun/trainer.h"

/* The test's temporary folder, "/tmp/<prefix>.XXXXXX" once made. */
extern char fx_tmpdir[256];

/* Make a new fx_tmpdir named after prefix (the program's name). */
void fx_tmpdir_make(const char* prefix);
/* Remove fx_tmpdir and everything in it. */
void fx_tmpdir_remove(void);

/* "<fx_tmpdir>/<name>" in a static buffer; the four latest results stay
 * valid, so a call may take a few paths. */
const char* fx_path(const char* name);

/* Write n bytes to path (created or truncated). */
void fx_write_bytes(const char* path, const void* data, size_t n);
/* The whole file, NUL-terminated (not counted in *n); free() it. */
uint8_t* fx_slurp(const char* path, size_t* n);

/* The debugmodel of family ("gpt2", "llama3") shrunk to dim 32, 2 layers,
 * 4 heads (llama3: 2 KV heads), FFN 64, max_seq_len 64: trains in
 * milliseconds a step. */
tr_model_config_t fx_tiny_model(const char* family);

/* Text of `bytes` bytes (at least) with structure a tiny model learns in a
 * few dozen steps: two repeating three-word sentences in a fixed
 * pseudo-random order. */
void fx_write_corpus(const char* path, int bytes);

/* Set one config key (fails the test on an error). */
void fx_cfg_set(tr_config_t* cfg, const char* key, const char* value);

/* A config resolved for one rank (world size 1) that trains on
 * fx_path("corpus.txt") and dumps into fx_path("out"): seed 42, batch 4 x
 * 32, 30 steps, lr 3e-3 after 2 warmup steps, no JSONL; kv: further "key",
 * "value" pairs (NULL-terminated; may be NULL), applied before resolving.
 */
void fx_make_cfg(tr_config_t* cfg, const char* const* kv);
/* fx_make_cfg() resolved for world size `world`. */
void fx_make_cfg_world(tr_config_t* cfg, int world, const char* const* kv);

/* The trainer's settings for cfg as the launcher composes them
 * (launcher/compose.h, the device of LOCAL_RANK); model: build this one
 * instead of cfg's flavor (NULL: cfg's). They borrow cfg's strings.
 * Returns 0, or the error after printing its message to stderr (so that
 * forked ranks can check it too). */
int fx_settings(const tr_config_t* cfg, const tr_model_config_t* model,
                tr_trainer_settings_t* s);

/* A trainer for cfg (model as in fx_settings) with opts, `steps` steps
 * run, then released. *state: the bytes the host allocator holds once the
 * trainer exists above what it held before; *peak (NULL: not asked): the
 * allocator's peak during the steps above that same baseline. Returns 0,
 * or the error after printing its message to stderr (forked ranks check
 * it with PCHECK_RC). */
int fx_trainer_bytes(const tr_config_t* cfg, const tr_model_config_t* model,
                     const tr_trainer_opts_t* opts, int steps, int64_t* state,
                     int64_t* peak);

#endif /* TRAINRUN_TESTS_FIXTURES_H */
