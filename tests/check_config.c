/* tests/check_config.c: the typed job config: defaults, TOML values,
 * command-line overrides and their precedence, unknown keys with
 * suggestions, bad types, ranges and choices (exact messages with
 * file:line:col or the flag), cross-field resolution, the TOML round trip,
 * JSON output, the shipped examples, and the key descriptions the man
 * page is generated from (tools/man_config.c, tests/man_config.test). */
#include "config.h"

#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trainrun/config.h"
#include "trainrun/error.h"

static const char* srcdir(void) {
  const char* d = getenv("top_srcdir");
  return d && *d ? d : ".";
}

/* Defaults, then the TOML text as job.toml, then the overrides. */
static int load_text(tr_config_t* cfg, const char* toml, int argc,
                     char* const* argv, tr_errmsg_t* err) {
  int rc = tr_config_init(cfg);
  if (rc < 0) return rc;
  if (toml) {
    rc = tr_config_merge_toml(cfg, "job.toml", toml, strlen(toml), err);
    if (rc < 0) return rc;
  }
  return tr_config_apply_args(cfg, argc, argv, err);
}

/* Expect the TOML text (with overrides) to fail with exactly msg. */
static void expect_error(const char* toml, int argc, char* const* argv,
                         const char* msg) {
  tr_config_t cfg;
  tr_errmsg_t err;
  memset(&err, 0, sizeof err);
  int rc = load_text(&cfg, toml, argc, argv, &err);
  ck_assert_int_eq(rc, TR_ECONFIG);
  ck_assert_str_eq(err.message, msg);
  tr_config_release(&cfg);
}

/* Expect loading and resolving for world to fail with exactly msg. */
static void expect_resolve_error(const char* toml, int argc, char* const* argv,
                                 int64_t world, const char* msg) {
  tr_config_t cfg;
  tr_errmsg_t err;
  memset(&err, 0, sizeof err);
  ck_assert_int_eq(load_text(&cfg, toml, argc, argv, &err), 0);
  ck_assert_int_eq(tr_config_resolve(&cfg, world, &err), TR_ECONFIG);
  ck_assert_str_eq(err.message, msg);
  tr_config_release(&cfg);
}

static char* print_to_string(int (*print)(const tr_config_t*, FILE*),
                             const tr_config_t* cfg) {
  char* text = NULL;
  size_t len = 0;
  FILE* f = open_memstream(&text, &len);
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(print(cfg, f), 0);
  fclose(f);
  return text;
}

#define ARGV(...) ((char* const[]){__VA_ARGS__})
#define ARGC(...) ((int)(sizeof((char* const[]){__VA_ARGS__}) / sizeof(char*)))
#define ARGS(...) ARGC(__VA_ARGS__), ARGV(__VA_ARGS__)

/* ---- defaults and the schema ---- */

START_TEST(test_defaults_are_torchtitans) {
  tr_config_t cfg;
  ck_assert_int_eq(tr_config_init(&cfg), 0);
  ck_assert_str_eq(cfg.job.dump_folder, "./outputs");
  ck_assert_str_eq(cfg.job.description, "default job");
  ck_assert_ptr_null(cfg.job.config_file);
  ck_assert_str_eq(cfg.model.name, "llama3");
  ck_assert_str_eq(cfg.model.flavor, "debugmodel");
  ck_assert_uint_eq(cfg.model.converters.n, 0);
  ck_assert_str_eq(cfg.optimizer.name, "AdamW");
  ck_assert(cfg.optimizer.lr == 8e-4);
  ck_assert(cfg.optimizer.beta1 == 0.9);
  ck_assert(cfg.optimizer.beta2 == 0.95);
  ck_assert(cfg.optimizer.eps == 1e-8);
  ck_assert(cfg.optimizer.weight_decay == 0.1);
  ck_assert_str_eq(cfg.optimizer.implementation, "fused");
  ck_assert_int_eq(cfg.lr_scheduler.warmup_steps, 200);
  ck_assert(!cfg.lr_scheduler.total_steps.set);
  ck_assert(!cfg.lr_scheduler.decay_ratio.set);
  ck_assert_str_eq(cfg.lr_scheduler.decay_type, "linear");
  ck_assert(cfg.lr_scheduler.min_lr_factor == 0.0);
  ck_assert_str_eq(cfg.training.dataset, "c4_test");
  ck_assert_ptr_null(cfg.training.dataset_path);
  ck_assert_int_eq(cfg.training.local_batch_size, 8);
  ck_assert_int_eq(cfg.training.global_batch_size, -1);
  ck_assert_int_eq(cfg.training.seq_len, 2048);
  ck_assert(cfg.training.max_norm == 1.0);
  ck_assert_int_eq(cfg.training.steps, 10000);
  ck_assert_str_eq(cfg.training.dtype, "float32");
  ck_assert_str_eq(cfg.training.mixed_precision_param, "bfloat16");
  ck_assert_str_eq(cfg.training.mixed_precision_reduce, "float32");
  ck_assert_str_eq(cfg.training.device, "auto");
  ck_assert_int_eq(cfg.parallelism.data_parallel_replicate_degree, 1);
  ck_assert_int_eq(cfg.parallelism.data_parallel_shard_degree, -1);
  ck_assert_str_eq(cfg.parallelism.fsdp_reshard_after_forward, "default");
  ck_assert_int_eq(cfg.parallelism.tensor_parallel_degree, 1);
  ck_assert_int_eq(cfg.parallelism.pipeline_parallel_degree, 1);
  ck_assert_str_eq(cfg.parallelism.pipeline_parallel_schedule, "1F1B");
  ck_assert(!cfg.parallelism.pipeline_parallel_layers_per_stage.set);
  ck_assert_int_eq(cfg.parallelism.context_parallel_degree, 1);
  ck_assert_str_eq(cfg.parallelism.context_parallel_load_balancer, "headtail");
  ck_assert(!cfg.checkpoint.enable);
  ck_assert_str_eq(cfg.checkpoint.folder, "checkpoint");
  ck_assert_int_eq(cfg.checkpoint.interval, 500);
  ck_assert(cfg.checkpoint.initial_load_model_only);
  ck_assert(cfg.checkpoint.last_save_model_only);
  ck_assert_str_eq(cfg.checkpoint.async_mode, "disabled");
  ck_assert_int_eq(cfg.checkpoint.keep_latest_k, 10);
  ck_assert_int_eq(cfg.checkpoint.load_step, -1);
  ck_assert(cfg.checkpoint.enable_ft_dataloader_checkpoints);
  ck_assert_str_eq(cfg.activation_checkpoint.mode, "selective");
  ck_assert_str_eq(cfg.activation_checkpoint.selective_ac_option, "2");
  ck_assert(cfg.activation_checkpoint.memory_budget == 0.5);
  ck_assert(cfg.activation_checkpoint.preserve_rng_state);
  ck_assert_int_eq(cfg.metrics.log_freq, 10);
  ck_assert_str_eq(cfg.metrics.save_tb_folder, "tb");
  ck_assert_int_eq(cfg.comm.init_timeout_seconds, 300);
  ck_assert_int_eq(cfg.comm.train_timeout_seconds, 100);
  ck_assert_int_eq(cfg.comm.trace_buf_size, 20000);
  ck_assert_str_eq(cfg.comm.save_traces_folder, "comm_traces");
  ck_assert_str_eq(cfg.comm.save_traces_file_prefix, "rank_");
  ck_assert_str_eq(cfg.comm.mode, "default");
  ck_assert_str_eq(cfg.comm.backend, "cpu:gloo,cuda:nccl");
  ck_assert_ptr_null(cfg.comm.key);
  ck_assert(!cfg.validation.enable);
  ck_assert_str_eq(cfg.validation.dataset, "c4_validation");
  ck_assert_int_eq(cfg.validation.freq, 10);
  ck_assert_int_eq(cfg.validation.steps, -1);
  ck_assert(!cfg.debug.seed.set);
  ck_assert(!cfg.debug.deterministic);
  /* nothing came from a file or flag */
  char buf[64];
  for (size_t i = 0; i < tr_config_nkeys(); i++)
    ck_assert_ptr_null(
        tr_config_origin(&cfg, (tr_config_key_id_t)i, buf, sizeof buf));
  tr_config_release(&cfg);
}
END_TEST

START_TEST(test_schema_table) {
  size_t n = tr_config_nkeys();
  ck_assert_uint_eq(n, TR_CFG__NKEYS);
  ck_assert_uint_eq(tr_config_nsections(), 12);
  ck_assert_str_eq(tr_config_section_name(0), "job");
  ck_assert_str_eq(tr_config_section_name(11), "debug");
  ck_assert_ptr_null(tr_config_section_name(12));
  for (size_t i = 0; i < n; i++) {
    const tr_config_key_t* k = tr_config_key(i);
    ck_assert_int_eq(k->id, (int)i);
    ck_assert_ptr_eq(tr_config_find_key(k->name), k);
    ck_assert_int_gt(strlen(k->doc), 10);
    ck_assert(k->type != TR_CFG_T_ENUM || k->choices);
    for (size_t j = i + 1; j < n; j++)
      ck_assert_str_ne(k->name, tr_config_key(j)->name);
  }
  const tr_config_key_t* k = tr_config_find_key("training.steps");
  ck_assert_int_eq(k->id, TR_CFG_K_training_steps);
  ck_assert_int_eq(k->type, TR_CFG_T_INT);
  ck_assert_str_eq(k->def, "10000");
  ck_assert(k->min == 1);
  ck_assert_ptr_null(tr_config_find_key("training.stpes"));
  ck_assert_ptr_null(tr_config_key(n));
}
END_TEST

/* ---- TOML values ---- */

START_TEST(test_toml_values_of_every_type) {
  static const char toml[] =
      "[job]\n"
      "description = \"my job\"\n"
      "[optimizer]\n"
      "name = \"adamw\"\n" /* choices ignore case, stored as spelled */
      "lr = 3e-4\n"
      "weight_decay = 0\n" /* an integer for a number */
      "[training]\n"
      "steps = 250\n"
      "dataset_path = \"data/tiny.txt\"\n"
      "[checkpoint]\n"
      "enable = true\n"
      "exclude_from_loading = [\"dataloader\", \"lr_scheduler\"]\n"
      "[lr_scheduler]\n"
      "total_steps = 300\n"
      "decay_ratio = 0.5\n"
      "[debug]\n"
      "seed = 7\n";
  tr_config_t cfg;
  tr_errmsg_t err;
  ck_assert_int_eq(load_text(&cfg, toml, 0, NULL, &err), 0);
  ck_assert_str_eq(cfg.job.description, "my job");
  ck_assert_str_eq(cfg.optimizer.name, "AdamW");
  ck_assert(cfg.optimizer.lr == 3e-4);
  ck_assert(cfg.optimizer.weight_decay == 0.0);
  ck_assert_int_eq(cfg.training.steps, 250);
  ck_assert_str_eq(cfg.training.dataset_path, "data/tiny.txt");
  ck_assert(cfg.checkpoint.enable);
  ck_assert_uint_eq(cfg.checkpoint.exclude_from_loading.n, 2);
  ck_assert_str_eq(cfg.checkpoint.exclude_from_loading.v[0], "dataloader");
  ck_assert_str_eq(cfg.checkpoint.exclude_from_loading.v[1], "lr_scheduler");
  ck_assert(cfg.lr_scheduler.total_steps.set);
  ck_assert_int_eq(cfg.lr_scheduler.total_steps.value, 300);
  ck_assert(cfg.lr_scheduler.decay_ratio.set);
  ck_assert(cfg.lr_scheduler.decay_ratio.value == 0.5);
  ck_assert(cfg.debug.seed.set);
  ck_assert_int_eq(cfg.debug.seed.value, 7);
  /* untouched keys keep their defaults */
  ck_assert_int_eq(cfg.training.seq_len, 2048);
  /* origins point at the values */
  char buf[64];
  ck_assert_str_eq(
      tr_config_origin(&cfg, TR_CFG_K_training_steps, buf, sizeof buf),
      "job.toml:8:9");
  ck_assert_str_eq(tr_config_origin(&cfg, TR_CFG_K_debug_seed, buf, sizeof buf),
                   "job.toml:17:8");
  ck_assert_ptr_null(
      tr_config_origin(&cfg, TR_CFG_K_training_seq_len, buf, sizeof buf));
  tr_config_release(&cfg);
}
END_TEST

START_TEST(test_toml_merge_replaces_lists_and_strings) {
  tr_config_t cfg;
  tr_errmsg_t err;
  ck_assert_int_eq(
      load_text(&cfg, "[checkpoint]\nexclude_from_loading = [\"model\"]\n", 0,
                NULL, &err),
      0);
  static const char second[] =
      "[checkpoint]\nexclude_from_loading = []\n[job]\ndump_folder = \"x\"\n";
  ck_assert_int_eq(
      tr_config_merge_toml(&cfg, "b.toml", second, strlen(second), &err), 0);
  ck_assert_uint_eq(cfg.checkpoint.exclude_from_loading.n, 0);
  ck_assert_str_eq(cfg.job.dump_folder, "x");
  char buf[64];
  ck_assert_str_eq(
      tr_config_origin(&cfg, TR_CFG_K_job_dump_folder, buf, sizeof buf),
      "b.toml:4:15");
  tr_config_release(&cfg);
}
END_TEST

/* ---- command-line overrides ---- */

START_TEST(test_overrides_in_every_form) {
  tr_config_t cfg;
  tr_errmsg_t err;
  ck_assert_int_eq(
      load_text(&cfg, NULL,
                ARGS("--training.steps", "20", "--training.seq_len=512",
                     "--checkpoint.enable", "--metrics.enable_tensorboard",
                     "--checkpoint.initial_load_model_only=false",
                     "--checkpoint.exclude_from_loading",
                     "dataloader, lr_scheduler", "--training.local-batch-size",
                     "4", "--lr-scheduler.warmup-steps", "3", "--debug.seed",
                     "42", "--optimizer.lr", "1e-3",
                     "--training.global_batch_size", "-1", "--model.name=GPT2",
                     "--job.description", "a b c", "--comm.key", "s3cret"),
                &err),
      0);
  ck_assert_int_eq(cfg.training.steps, 20);
  ck_assert_int_eq(cfg.training.seq_len, 512);
  ck_assert(cfg.checkpoint.enable);
  ck_assert(cfg.metrics.enable_tensorboard);
  ck_assert(!cfg.checkpoint.initial_load_model_only);
  ck_assert_uint_eq(cfg.checkpoint.exclude_from_loading.n, 2);
  ck_assert_str_eq(cfg.checkpoint.exclude_from_loading.v[0], "dataloader");
  ck_assert_str_eq(cfg.checkpoint.exclude_from_loading.v[1], "lr_scheduler");
  ck_assert_int_eq(cfg.training.local_batch_size, 4);
  ck_assert_int_eq(cfg.lr_scheduler.warmup_steps, 3);
  ck_assert(cfg.debug.seed.set);
  ck_assert_int_eq(cfg.debug.seed.value, 42);
  ck_assert(cfg.optimizer.lr == 1e-3);
  ck_assert_int_eq(cfg.training.global_batch_size, -1);
  ck_assert_str_eq(cfg.model.name, "gpt2");
  ck_assert_str_eq(cfg.job.description, "a b c");
  ck_assert_str_eq(cfg.comm.key, "s3cret");
  char buf[64];
  ck_assert_str_eq(tr_config_origin(&cfg, TR_CFG_K_training_local_batch_size,
                                    buf, sizeof buf),
                   "--training.local_batch_size");

  /* later flags win; no_ turns a boolean off; none unsets; "" empties */
  ck_assert_int_eq(
      tr_config_apply_args(
          &cfg,
          ARGS("--checkpoint.no_enable", "--metrics.no-enable-tensorboard",
               "--debug.seed", "none",
               "--checkpoint.exclude_from_loading=", "--training.steps", "21"),
          &err),
      0);
  ck_assert(!cfg.checkpoint.enable);
  ck_assert(!cfg.metrics.enable_tensorboard);
  ck_assert(!cfg.debug.seed.set);
  ck_assert_uint_eq(cfg.checkpoint.exclude_from_loading.n, 0);
  ck_assert_int_eq(cfg.training.steps, 21);

  ck_assert_int_eq(
      tr_config_set(&cfg, "parallelism.tensor-parallel-degree", "2", &err), 0);
  ck_assert_int_eq(cfg.parallelism.tensor_parallel_degree, 2);
  tr_config_release(&cfg);
}
END_TEST

START_TEST(test_arg_span) {
  char* const argv[] = {"--training.steps",
                        "5",
                        "--json",
                        "job.toml",
                        "--checkpoint.enable",
                        "x",
                        "--training.steps=5",
                        "--checkpoint.no_enable",
                        "--nope.key",
                        "v",
                        "--nope.key",
                        "--world-size",
                        "--training.steps"};
  int argc = (int)(sizeof argv / sizeof argv[0]);
  ck_assert_int_eq(tr_config_arg_span(argc, argv, 0), 2);
  ck_assert_int_eq(tr_config_arg_span(argc, argv, 2), 0);  /* no '.' */
  ck_assert_int_eq(tr_config_arg_span(argc, argv, 3), 0);  /* positional */
  ck_assert_int_eq(tr_config_arg_span(argc, argv, 4), 1);  /* bool flag */
  ck_assert_int_eq(tr_config_arg_span(argc, argv, 6), 1);  /* k=v */
  ck_assert_int_eq(tr_config_arg_span(argc, argv, 7), 1);  /* no_ */
  ck_assert_int_eq(tr_config_arg_span(argc, argv, 8), 2);  /* unknown + v */
  ck_assert_int_eq(tr_config_arg_span(argc, argv, 10), 1); /* unknown */
  ck_assert_int_eq(tr_config_arg_span(argc, argv, 12), 1); /* at the end */
  ck_assert_int_eq(tr_config_arg_span(argc, argv, argc), 0);
}
END_TEST

static char* write_temp(const char* text) {
  char* path = strdup("/tmp/check_config_XXXXXX.toml");
  int fd = mkstemps(path, 5);
  ck_assert_int_ge(fd, 0);
  FILE* f = fdopen(fd, "w");
  fputs(text, f);
  fclose(f);
  return path;
}

START_TEST(test_precedence_cli_over_toml_over_defaults) {
  char* path = write_temp(
      "[training]\nsteps = 50\nseq_len = 128\n[lr_scheduler]\n"
      "warmup_steps = 5\n");
  tr_config_t cfg;
  tr_errmsg_t err;
  /* the flag comes first on the command line and still wins */
  ck_assert_int_eq(
      tr_config_load(&cfg, path, ARGS("--training.steps", "20"), &err), 0);
  ck_assert_int_eq(cfg.training.steps, 20);           /* CLI */
  ck_assert_int_eq(cfg.training.seq_len, 128);        /* TOML */
  ck_assert_int_eq(cfg.training.local_batch_size, 8); /* default */
  ck_assert_str_eq(cfg.job.config_file, path);
  tr_config_release(&cfg);

  /* --job.config_file, with a dash, names the file like torchtitan's */
  char flag[256];
  snprintf(flag, sizeof flag, "--job.config-file=%s", path);
  ck_assert_int_eq(
      tr_config_load(&cfg, NULL, ARGS("--training.seq_len", "64", flag), &err),
      0);
  ck_assert_int_eq(cfg.training.steps, 50);
  ck_assert_int_eq(cfg.training.seq_len, 64);
  ck_assert_str_eq(cfg.job.config_file, path);
  tr_config_release(&cfg);

  /* both a file argument and a different --job.config_file */
  ck_assert_int_eq(
      tr_config_load(&cfg, path, ARGS("--job.config_file", "other.toml"), &err),
      TR_ECONFIG);
  char want[512];
  snprintf(want, sizeof want,
           "--job.config_file: 'other.toml' conflicts with the job file '%s' "
           "given as an argument",
           path);
  ck_assert_str_eq(err.message, want);
  tr_config_release(&cfg);
  unlink(path);
  free(path);

  ck_assert_int_eq(tr_config_load(&cfg, "/nonexistent/job.toml", 0, NULL, &err),
                   TR_ENOENT);
  ck_assert_str_eq(err.message,
                   "cannot read '/nonexistent/job.toml': No such file or "
                   "directory");
  tr_config_release(&cfg);
}
END_TEST

/* ---- unknown sections and keys ---- */

START_TEST(test_unknown_keys_suggest) {
  expect_error("[training]\nstpes = 5\n", 0, NULL,
               "job.toml:2:1: unknown key 'stpes' in [training]; did you "
               "mean 'steps'?");
  expect_error("[training]\nlocal-batch-size = 5\n", 0, NULL,
               "job.toml:2:1: unknown key 'local-batch-size' in [training]; "
               "did you mean 'local_batch_size'?");
  expect_error("[training]\nlr = 1e-3\n", 0, NULL,
               "job.toml:2:1: unknown key 'lr' in [training]; did you mean "
               "[optimizer] lr?");
  expect_error("[training]\nfrobnicate = 1\n", 0, NULL,
               "job.toml:2:1: unknown key 'frobnicate' in [training]");
  expect_error("\n[trainig]\nsteps = 5\n", 0, NULL,
               "job.toml:2:2: unknown section [trainig]; did you mean "
               "[training]?");
  expect_error("[compile]\nenable = false\n", 0, NULL,
               "job.toml:1:2: unknown section [compile]");
  expect_error("steps = 5\n", 0, NULL,
               "job.toml:1:1: unknown key 'steps' outside any section; did "
               "you mean [training] steps?");
  expect_error("[training.dataloader]\nnum_workers = 0\n", 0, NULL,
               "job.toml:1:11: unknown section [training.dataloader]");
  expect_error("training = 5\n", 0, NULL,
               "job.toml:1:1: [training] must be a table, got an integer");
  expect_error(NULL, ARGS("--training.stpes", "5"),
               "--training.stpes: unknown option; did you mean "
               "'--training.steps'?");
  expect_error(NULL, ARGS("--trainig.steps", "5"),
               "--trainig.steps: unknown option; did you mean "
               "'--training.steps'?");
  expect_error(NULL, ARGS("--training.lr", "5"),
               "--training.lr: unknown option; did you mean '--optimizer.lr'?");
  expect_error(NULL, ARGS("--training.zzzzzz", "5"),
               "--training.zzzzzz: unknown option");
  expect_error(NULL, ARGS("job.toml"),
               "unexpected argument 'job.toml' (config overrides are "
               "--section.key value)");
}
END_TEST

/* ---- bad values ---- */

START_TEST(test_bad_toml_values) {
  expect_error("[training]\nsteps = \"ten\"\n", 0, NULL,
               "job.toml:2:9: training.steps: expected an integer, got a "
               "string");
  expect_error("[training]\nsteps = 1.5\n", 0, NULL,
               "job.toml:2:9: training.steps: expected an integer, got a "
               "float");
  expect_error("[training]\nsteps = 0\n", 0, NULL,
               "job.toml:2:9: training.steps: must be at least 1, got 0");
  expect_error("[optimizer]\nbeta1 = 1.5\n", 0, NULL,
               "job.toml:2:9: optimizer.beta1: must be between 0 and 1, got "
               "1.5");
  expect_error("[optimizer]\nlr = inf\n", 0, NULL,
               "job.toml:2:6: optimizer.lr: must be a finite number, got inf");
  expect_error("[checkpoint]\nenable = 1\n", 0, NULL,
               "job.toml:2:10: checkpoint.enable: expected true or false, got "
               "an integer");
  expect_error("[model]\nname = \"lama3\"\n", 0, NULL,
               "job.toml:2:8: model.name: expected llama3 or gpt2, got "
               "'lama3'; did you mean 'llama3'?");
  expect_error("[activation_checkpoint]\nmode = \"ful\"\n", 0, NULL,
               "job.toml:2:8: activation_checkpoint.mode: expected "
               "selective, full, memory_budget or none, got 'ful'; did you "
               "mean 'full'?");
  expect_error("[checkpoint]\nkeep_latest_k = 1\n", 0, NULL,
               "job.toml:2:17: checkpoint.keep_latest_k: 1 is not allowed: a "
               "save in progress could leave no complete checkpoint; use 0 "
               "(keep all) or at least 2");
  expect_error("[checkpoint]\nexclude_from_loading = [\"model\", 3]\n", 0, NULL,
               "job.toml:2:34: checkpoint.exclude_from_loading: expected a "
               "string in the array, got an integer");
  expect_error("[checkpoint]\nexclude_from_loading = \"model\"\n", 0, NULL,
               "job.toml:2:24: checkpoint.exclude_from_loading: expected an "
               "array of strings, got a string");
  expect_error("[checkpoint]\nexclude_from_loading = [\"data_loader\"]\n", 0,
               NULL,
               "job.toml:2:24: checkpoint.exclude_from_loading: expected "
               "model, optimizer, lr_scheduler, dataloader or train_state, "
               "got 'data_loader'; did you mean 'dataloader'?");
  expect_error("[parallelism]\ndata_parallel_shard_degree = 0\n", 0, NULL,
               "job.toml:2:30: parallelism.data_parallel_shard_degree: must "
               "be -1 or at least 1, got 0");
  expect_error("[parallelism]\ndata_parallel_shard_degree = -2\n", 0, NULL,
               "job.toml:2:30: parallelism.data_parallel_shard_degree: must "
               "be at least -1, got -2");
  expect_error("[job]\ndescription = \"a\\u0000b\"\n", 0, NULL,
               "job.toml:2:15: job.description: strings may not contain NUL "
               "characters");
  expect_error("[metrics]\nenable_wandb = true\n", 0, NULL,
               "job.toml:2:16: metrics.enable_wandb: Weights & Biases is not "
               "available in trainrun; use metrics.enable_tensorboard");
  expect_error("[model]\nconverters = [\"float8\"]\n", 0, NULL,
               "job.toml:2:14: model.converters: converter 'float8' is not "
               "supported by trainrun yet; use []");

  /* a TOML syntax error keeps the parser's position and message */
  tr_config_t cfg;
  tr_errmsg_t err;
  ck_assert_int_eq(load_text(&cfg, "[training]\nsteps = \n", 0, NULL, &err),
                   TR_ECONFIG);
  ck_assert_int_eq(strncmp(err.message, "job.toml:2:", 11), 0);
  ck_assert_int_eq(err.code, TR_ECONFIG);
  tr_config_release(&cfg);
}
END_TEST

START_TEST(test_bad_flag_values) {
  expect_error(NULL, ARGS("--training.steps", "ten"),
               "--training.steps: expected an integer, got 'ten'");
  expect_error(NULL, ARGS("--training.steps=1.0"),
               "--training.steps: expected an integer, got '1.0'");
  expect_error(NULL, ARGS("--training.steps", "0"),
               "--training.steps: must be at least 1, got 0");
  expect_error(NULL, ARGS("--optimizer.lr", "fast"),
               "--optimizer.lr: expected a number, got 'fast'");
  expect_error(NULL, ARGS("--optimizer.beta2", "-0.5"),
               "--optimizer.beta2: must be between 0 and 1, got -0.5");
  expect_error(NULL, ARGS("--checkpoint.enable=maybe"),
               "--checkpoint.enable: expected true or false, got 'maybe'");
  expect_error(NULL, ARGS("--checkpoint.no_enable=1"),
               "--checkpoint.no_enable: takes no value");
  expect_error(NULL, ARGS("--training.no_steps"),
               "--training.no_steps: unknown option; training.steps is not a "
               "boolean");
  expect_error(NULL, ARGS("--training.steps"),
               "--training.steps: expects a value");
  expect_error(NULL, ARGS("--training.steps", "none"),
               "--training.steps: expected an integer, got 'none'");
  expect_error(NULL, ARGS("--checkpoint.async-mode", "async_pinned"),
               "--checkpoint.async_mode: expected disabled, async or "
               "async_with_pinned_mem, got 'async_pinned'");
  expect_error(NULL, ARGS("--checkpoint.exclude_from_loading", "model,,"),
               "--checkpoint.exclude_from_loading: empty item in the list "
               "'model,,'");
  expect_error(NULL, ARGS("--activation_checkpoint.selective_ac_option", "x"),
               "--activation_checkpoint.selective_ac_option: expected 'op' or "
               "a positive number, got 'x'");
  /* comm.backend and debug.fault are kept as text here: their grammars
   * belong to collectives/pg.c and trainer/fault.c, whose parsers the
   * launcher runs (tests/cli_config.test) */
  expect_error(NULL, ARGS("--job.description", "\xff\xfe"),
               "--job.description: not valid UTF-8");

  tr_config_t cfg;
  tr_errmsg_t err;
  ck_assert_int_eq(
      load_text(&cfg, NULL,
                ARGS("--comm.backend", "nccl", "--debug.fault",
                     "kill:rank=3:step=5,slow:rank=0:ms=500",
                     "--activation_checkpoint.selective_ac_option", "op"),
                &err),
      0);
  ck_assert_str_eq(cfg.comm.backend, "nccl");
  ck_assert_uint_eq(cfg.debug.fault.n, 2);
  ck_assert_str_eq(cfg.debug.fault.v[1], "slow:rank=0:ms=500");
  ck_assert_int_eq(tr_config_set(&cfg, "training.stpes", "4", &err),
                   TR_ECONFIG);
  ck_assert_str_eq(err.message,
                   "--training.stpes: unknown option; did you mean "
                   "'--training.steps'?");
  tr_config_release(&cfg);
}
END_TEST

/* ---- cross-field checks ---- */

START_TEST(test_resolve_solves_shard_degree_and_batch) {
  tr_config_t cfg;
  tr_errmsg_t err;
  ck_assert_int_eq(load_text(&cfg, "[training]\nsteps = 300\n", 0, NULL, &err),
                   0);
  ck_assert_int_eq(tr_config_resolve(&cfg, 8, &err), 0);
  ck_assert_int_eq(cfg.parallelism.data_parallel_shard_degree, 8);
  ck_assert_int_eq(cfg.training.global_batch_size, 64);
  ck_assert(cfg.lr_scheduler.total_steps.set);
  ck_assert_int_eq(cfg.lr_scheduler.total_steps.value, 300);
  ck_assert_int_eq(cfg.derived.world_size, 8);
  ck_assert_int_eq(cfg.derived.dp, 8);
  ck_assert_int_eq(cfg.derived.grad_accum_steps, 1);
  /* resolving again for the same world changes nothing */
  ck_assert_int_eq(tr_config_resolve(&cfg, 8, &err), 0);
  ck_assert_int_eq(cfg.parallelism.data_parallel_shard_degree, 8);
  ck_assert_int_eq(cfg.training.global_batch_size, 64);
  tr_config_release(&cfg);

  /* HSDP 2 x (solved) 2 with tp 2 on 8 ranks, gradient accumulation 3 */
  ck_assert_int_eq(
      load_text(&cfg,
                "[parallelism]\ndata_parallel_replicate_degree = 2\n"
                "tensor_parallel_degree = 2\n[training]\nlocal_batch_size = 2\n"
                "global_batch_size = 24\nsteps = 300\n",
                0, NULL, &err),
      0);
  ck_assert_int_eq(tr_config_resolve(&cfg, 8, &err), 0);
  ck_assert_int_eq(cfg.parallelism.data_parallel_shard_degree, 2);
  ck_assert_int_eq(cfg.derived.dp, 4);
  ck_assert_int_eq(cfg.derived.grad_accum_steps, 3);
  tr_config_release(&cfg);
}
END_TEST

START_TEST(test_resolve_errors_name_where) {
  /* a degree that leaves no whole shard degree; named where it was set */
  expect_resolve_error(
      "[training]\nsteps = 300\n[parallelism]\n"
      "tensor_parallel_degree = 4\n",
      0, NULL, 6,
      "job.toml:4:26: the parallel degrees multiply to 4 "
      "(tensor_parallel_degree 4), which does not divide the "
      "world size 6, so data_parallel_shard_degree = -1 has "
      "no solution");
  expect_resolve_error(
      "[training]\nsteps = 300\n",
      ARGS("--parallelism.data_parallel_shard_degree", "2",
           "--parallelism.data_parallel_replicate_degree", "2"),
      8,
      "--parallelism.data_parallel_shard_degree: the "
      "parallel degrees multiply to 4 "
      "(data_parallel_replicate_degree 2 x "
      "data_parallel_shard_degree 2) but the world size is "
      "8; set data_parallel_shard_degree = -1 to use the "
      "rest");
  expect_resolve_error(
      "[training]\nsteps = 300\nlocal_batch_size = 4\n"
      "global_batch_size = 24\n",
      0, NULL, 4,
      "job.toml:4:21: training.global_batch_size 24 must be "
      "a multiple of local_batch_size x data-parallel degree "
      "= 4 x 4 = 16");
  /* warmup (and decay) beyond the run: resolves, as in torchtitan; the
   * trainer shortens them with a warning */
  {
    tr_config_t c;
    tr_errmsg_t e;
    memset(&e, 0, sizeof e);
    ck_assert_int_eq(load_text(&c, "[lr_scheduler]\nwarmup_steps = 2\n"
                                   "decay_ratio = 0.9\n[training]\nsteps = 10\n",
                               ARGS("--training.steps", "5"), &e),
                     0);
    ck_assert_int_eq(tr_config_resolve(&c, 1, &e), 0);
    ck_assert_int_eq(c.lr_scheduler.total_steps.value, 5);
    tr_config_release(&c);
  }
  expect_resolve_error(
      "[training]\nsteps = 300\n[parallelism]\n"
      "pipeline_parallel_degree = 2\n"
      "pipeline_parallel_microbatch_size = 3\n",
      0, NULL, 2,
      "job.toml:5:37: pipeline_parallel_microbatch_size 3 "
      "must divide training.local_batch_size 8");
  expect_resolve_error(
      "[training]\nsteps = 300\nseq_len = 2047\n"
      "[parallelism]\ntensor_parallel_degree = 2\n",
      0, NULL, 2,
      "job.toml:3:11: training.seq_len 2047 must be a "
      "multiple of tensor_parallel_degree 2 (sequence "
      "parallelism splits it)");
  expect_resolve_error(
      "[training]\nsteps = 300\n[parallelism]\n"
      "context_parallel_degree = 2\n",
      ARGS("--training.seq_len", "1026"), 2,
      "--training.seq_len: training.seq_len 1026 must be a "
      "multiple of 2 x context_parallel_degree = 4");
  expect_resolve_error(
      "[training]\nsteps = 300\n[parallelism]\n"
      "expert_parallel_degree = 3\n",
      0, NULL, 4,
      "job.toml:4:26: expert_parallel_degree 3 must be a "
      "multiple of 1 and divide 4 (the "
      "data_parallel_shard_degree x context_parallel_degree "
      "ranks it borrows)");
  expect_resolve_error(
      "[training]\nsteps = 300\n[parallelism]\n"
      "expert_parallel_degree = 2\n"
      "tensor_parallel_degree = 2\n"
      "expert_tensor_parallel_degree = 4\n",
      0, NULL, 4,
      "job.toml:6:33: expert_tensor_parallel_degree must be "
      "1 or tensor_parallel_degree (2), got 4");
  expect_resolve_error(
      "[training]\nsteps = 300\n[checkpoint]\n"
      "create_seed_checkpoint = true\n",
      0, NULL, 2,
      "job.toml:4:26: checkpoint.create_seed_checkpoint needs "
      "a world size of 1, got 2");
  expect_resolve_error("[training]\nsteps = 300\n", 0, NULL, 0,
                       "the world size must be at least 1, got 0");

  /* expert parallelism that fits: borrows from dp_shard */
  tr_config_t cfg;
  tr_errmsg_t err;
  ck_assert_int_eq(load_text(&cfg,
                             "[training]\nsteps = 300\n[parallelism]\n"
                             "expert_parallel_degree = 2\n",
                             0, NULL, &err),
                   0);
  ck_assert_int_eq(tr_config_resolve(&cfg, 4, &err), 0);
  tr_config_release(&cfg);
}
END_TEST

/* ---- printing ---- */

START_TEST(test_toml_round_trip) {
  static const char toml[] =
      "[job]\n"
      "description = \"quote \\\" backslash \\\\ tab \\t newline \\n "
      "\\u00e9 \\u0001 \\u007f\"\n"
      "[optimizer]\n"
      "lr = 8e-4\n"
      "beta2 = 0.999\n"
      "eps = 1e-12\n"
      "[lr_scheduler]\n"
      "warmup_steps = 10\n"
      "decay_ratio = 0.3\n"
      "min_lr_factor = 0.1\n"
      "[training]\n"
      "steps = 1000\n"
      "max_norm = 2\n"
      "dataset_path = \"data/x.txt\"\n"
      "[checkpoint]\n"
      "exclude_from_loading = [\"dataloader\", \"train_state\"]\n"
      "[parallelism]\n"
      "tensor_parallel_degree = 2\n"
      "pipeline_parallel_layers_per_stage = 3\n"
      "[debug]\n"
      "seed = 0\n"
      "fault = [\"kill:rank=1:step=3\"]\n";
  tr_config_t a, b;
  tr_errmsg_t err;
  ck_assert_int_eq(load_text(&a, toml, 0, NULL, &err), 0);
  ck_assert_int_eq(tr_config_resolve(&a, 4, &err), 0);
  char* text = print_to_string(tr_config_print_toml, &a);
  ck_assert_ptr_nonnull(strstr(text,
                               "\n[optimizer]\nname = \"AdamW\"\n"
                               "lr = 0.0008\n"));
  ck_assert_ptr_nonnull(strstr(text, "\nmax_norm = 2.0\n"));
  ck_assert_ptr_nonnull(strstr(text, "\neps = 1e-12\n"));
  ck_assert_ptr_nonnull(strstr(text, "\ndata_parallel_shard_degree = 2\n"));
  ck_assert_ptr_nonnull(strstr(text, "\n# initial_load_path is unset\n"));
  ck_assert_ptr_nonnull(strstr(
      text, "\nexclude_from_loading = [\"dataloader\", \"train_state\"]\n"));
  ck_assert_ptr_nonnull(
      strstr(text,
             "description = \"quote \\\" backslash \\\\ tab \\t newline \\n "
             "\xc3\xa9 \\u0001 \\u007F\"\n"));
  /* reading it back gives the same config */
  ck_assert_int_eq(load_text(&b, text, 0, NULL, &err), 0);
  const char* diff = "none";
  ck_assert_msg(tr_config_equal(&a, &b, &diff), "differs at %s", diff);
  ck_assert_ptr_null(diff);
  /* and the equality check sees a change */
  ck_assert_int_eq(tr_config_set(&b, "optimizer.eps", "1e-11", &err), 0);
  ck_assert_int_eq(tr_config_equal(&a, &b, &diff), 0);
  ck_assert_str_eq(diff, "optimizer.eps");
  free(text);
  tr_config_release(&a);
  tr_config_release(&b);

  /* the defaults too */
  ck_assert_int_eq(tr_config_init(&a), 0);
  text = print_to_string(tr_config_print_toml, &a);
  ck_assert_int_eq(load_text(&b, text, 0, NULL, &err), 0);
  ck_assert(tr_config_equal(&a, &b, NULL));
  free(text);
  tr_config_release(&a);
  tr_config_release(&b);
}
END_TEST

/* ---- describing keys (the man page's key table) ---- */

static char* default_text(const char* name) {
  char* text = NULL;
  size_t len = 0;
  FILE* m = open_memstream(&text, &len);
  ck_assert_int_ge(tr_config_print_default(tr_config_find_key(name), m), 0);
  fclose(m);
  return text;
}

START_TEST(test_key_descriptions) {
  static const struct {
    const char *name, *type, *def;
  } want[] = {
      {"training.steps", "integer, at least 1", "10000"},
      {"optimizer.beta1", "number from 0 to 1", "0.9"},
      {"training.global_batch_size", "integer, at least -1", "-1"},
      {"lr_scheduler.decay_type", "one of linear, sqrt or cosine",
       "\"linear\""},
      {"checkpoint.enable", "boolean", "false"},
      {"checkpoint.exclude_from_loading", "array of strings", "[]"},
      {"training.dataset_path", "string, may be unset", ""},
      {"lr_scheduler.decay_ratio", "number from 0 to 1, may be unset", ""},
      {"comm.key", "secret string, may be unset", ""},
      {"job.dump_folder", "string", "\"./outputs\""},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    char type[320];
    tr_config_key_type_text(tr_config_find_key(want[i].name), type,
                            sizeof type);
    ck_assert_str_eq(type, want[i].type);
    char* def = default_text(want[i].name);
    ck_assert_str_eq(def, want[i].def);
    free(def);
  }
}
END_TEST

START_TEST(test_secrets_are_never_printed) {
  tr_config_t cfg;
  tr_errmsg_t err;
  ck_assert_int_eq(load_text(&cfg, "[comm]\nkey = \"s3cret\"\n", 0, NULL, &err),
                   0);
  ck_assert_str_eq(cfg.comm.key, "s3cret");
  char* toml = print_to_string(tr_config_print_toml, &cfg);
  char* json = print_to_string(tr_config_print_json, &cfg);
  ck_assert_ptr_null(strstr(toml, "s3cret"));
  ck_assert_ptr_nonnull(strstr(toml, "\n# key is set (hidden)\n"));
  ck_assert_ptr_null(strstr(json, "s3cret"));
  ck_assert_ptr_nonnull(strstr(json, "\"key\": \"<hidden>\""));
  free(toml);
  free(json);
  tr_config_release(&cfg);
}
END_TEST

START_TEST(test_json_output) {
  tr_config_t cfg;
  tr_errmsg_t err;
  ck_assert_int_eq(
      load_text(&cfg, "[training]\nsteps = 300\n",
                ARGS("--checkpoint.exclude_from_loading", "model,optimizer"),
                &err),
      0);
  ck_assert_int_eq(tr_config_resolve(&cfg, 2, &err), 0);
  char* text = print_to_string(tr_config_print_json, &cfg);
  ck_assert_int_eq(text[strlen(text) - 1], '\n');
  ck_assert_ptr_nonnull(strstr(text, "\"lr\": 0.0008,")); /* not 0.000800..04 */
  json_error_t jerr;
  json_t* root = json_loads(text, 0, &jerr);
  ck_assert_msg(root != NULL, "bad JSON: %s", jerr.text);
  /* sections in schema order */
  ck_assert_str_eq(json_object_iter_key(json_object_iter(root)), "job");
  ck_assert_uint_eq(json_object_size(root), tr_config_nsections());
  json_t* training = json_object_get(root, "training");
  ck_assert_int_eq(json_integer_value(json_object_get(training, "steps")), 300);
  ck_assert(json_is_null(json_object_get(training, "dataset_path")));
  ck_assert(json_real_value(json_object_get(json_object_get(root, "optimizer"),
                                            "lr")) == 8e-4);
  ck_assert(json_is_false(
      json_object_get(json_object_get(root, "checkpoint"), "enable")));
  json_t* ex = json_object_get(json_object_get(root, "checkpoint"),
                               "exclude_from_loading");
  ck_assert_uint_eq(json_array_size(ex), 2);
  ck_assert_str_eq(json_string_value(json_array_get(ex, 1)), "optimizer");
  ck_assert_int_eq(
      json_integer_value(json_object_get(json_object_get(root, "parallelism"),
                                         "data_parallel_shard_degree")),
      2);
  ck_assert(
      json_is_null(json_object_get(json_object_get(root, "debug"), "seed")));
  /* every key is there */
  size_t nkeys = 0;
  const char* name;
  json_t* sec;
  json_object_foreach(root, name, sec) nkeys += json_object_size(sec);
  ck_assert_uint_eq(nkeys, tr_config_nkeys());
  json_decref(root);
  free(text);
  tr_config_release(&cfg);
}
END_TEST

/* ---- the shipped examples ---- */

START_TEST(test_examples_load_and_resolve) {
  static const struct {
    const char* file;
    int64_t world;
  } ex[] = {{"examples/debug.toml", 1},
            {"examples/debug.toml", 4},
            {"examples/gpt2_124m.toml", 8},
            {"examples/llama3_8b.toml", 8},
            {"examples/llama3_8b.toml", 64}};
  for (size_t i = 0; i < sizeof ex / sizeof ex[0]; i++) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", srcdir(), ex[i].file);
    tr_config_t cfg;
    tr_errmsg_t err;
    int rc = tr_config_load(&cfg, path, 0, NULL, &err);
    if (rc == 0) rc = tr_config_resolve(&cfg, ex[i].world, &err);
    ck_assert_msg(rc == 0, "%s: %s", ex[i].file, err.message);
    if (strstr(ex[i].file, "debug")) {
      ck_assert_str_eq(cfg.training.device, "cpu");
      ck_assert_int_eq(cfg.training.steps, 150);
      ck_assert_str_eq(cfg.model.flavor, "debugmodel");
      ck_assert_ptr_nonnull(cfg.training.dataset_path);
    }
    tr_config_release(&cfg);
  }
}
END_TEST


static Suite* config_suite(void) {
  Suite* s = suite_create("config");
  TCase* tc = tcase_create("schema");
  tcase_add_test(tc, test_defaults_are_torchtitans);
  tcase_add_test(tc, test_schema_table);
  suite_add_tcase(s, tc);
  tc = tcase_create("input");
  tcase_add_test(tc, test_toml_values_of_every_type);
  tcase_add_test(tc, test_toml_merge_replaces_lists_and_strings);
  tcase_add_test(tc, test_overrides_in_every_form);
  tcase_add_test(tc, test_arg_span);
  tcase_add_test(tc, test_precedence_cli_over_toml_over_defaults);
  tcase_add_test(tc, test_unknown_keys_suggest);
  tcase_add_test(tc, test_bad_toml_values);
  tcase_add_test(tc, test_bad_flag_values);
  suite_add_tcase(s, tc);
  tc = tcase_create("resolve");
  tcase_add_test(tc, test_resolve_solves_shard_degree_and_batch);
  tcase_add_test(tc, test_resolve_errors_name_where);
  tcase_add_test(tc, test_examples_load_and_resolve);
  suite_add_tcase(s, tc);
  tc = tcase_create("print");
  tcase_add_test(tc, test_toml_round_trip);
  tcase_add_test(tc, test_key_descriptions);
  tcase_add_test(tc, test_secrets_are_never_printed);
  tcase_add_test(tc, test_json_output);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(config_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
