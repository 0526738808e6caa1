/* launcher/cmd_data.c: `trainrun data prepare FILE... -o DIR`, which turns
 * text files into llm.c token shards through the byte tokenizer; and the
 * exit-code rule the trainer's commands share. */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launcher/commands.h"
#include "trainrun/data.h"
#include "trainrun/error.h"

int tr__cmd_exit_code(int rc) {
  switch (rc) {
    case 0:
      return 0;
    case TR_EINVAL:
    case TR_ENOENT:
    case TR_EACCES:
    case TR_EISDIR:
    case TR_ENOTDIR:
    case TR_ENOTFOUND:
    case TR_EFORMAT:
    case TR_ECHECKSUM:
    case TR_ERANGE:
    case TR_ECONFIG:
    case TR_ESHAPE:
    case TR_EDTYPE:
      return 2; /* bad input: config, files, arguments */
    default:
      return 1;
  }
}

static void data_usage(FILE* out) {
  fprintf(out,
          "usage: trainrun data prepare FILE... -o DIR [--val-fraction F] "
          "[--shard-tokens N] [--quiet]\n"
          "\n"
          "Tokenize text files with the byte-level tokenizer (one token per "
          "byte,\n"
          "token 0 before each file as end-of-text) into llm.c token shards "
          "(uint16,\n"
          "magic 20240520): DIR/train_000000.bin ... and, with a "
          "validation fraction,\n"
          "DIR/val_000000.bin ... holding the last F of the token stream.\n"
          "\n"
          "  -o, --output DIR      where the shards go (created if missing)\n"
          "  --val-fraction F      fraction held out for validation, in [0, "
          "1) (default 0.1)\n"
          "  --shard-tokens N      tokens per shard (default 100000000)\n"
          "  --quiet               no line per shard\n"
          "\n"
          "Then: training.dataset_path = \"DIR\" and validation.dataset_path "
          "= \"DIR\".\n");
}

static int parse_double(const char* s, double* out) {
  char* end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end) return -1;
  *out = v;
  return 0;
}

static int parse_i64(const char* s, int64_t* out) {
  char* end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end) return -1;
  *out = v;
  return 0;
}

int tr_cmd_data(int argc, char** argv) {
  if (argc < 2 || strcmp(argv[1], "--help") == 0 ||
      strcmp(argv[1], "-h") == 0) {
    data_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (strcmp(argv[1], "prepare") == 0 && argc == 2) {
    data_usage(stderr);
    return 2;
  }
  if (strcmp(argv[1], "prepare") != 0) {
    fprintf(stderr, "trainrun: data: unknown subcommand '%s' (prepare)\n",
            argv[1]);
    return 2;
  }
  tr_data_prepare_opts_t o = {.val_fraction = 0.1, .shard_tokens = 100000000};
  const char** inputs = calloc((size_t)argc, sizeof *inputs);
  if (!inputs) {
    fprintf(stderr, "trainrun: %s\n", tr_strerror(TR_ENOMEM));
    return 1;
  }
  size_t n = 0;
  int rc = 0;
  for (int i = 2; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) {
      if (!v) goto missing;
      o.out_dir = v;
      i++;
    } else if (strcmp(a, "--val-fraction") == 0) {
      if (!v) goto missing;
      if (parse_double(v, &o.val_fraction) < 0 || o.val_fraction < 0 ||
          o.val_fraction >= 1) {
        fprintf(stderr,
                "trainrun: data prepare: --val-fraction: expected a number "
                "in [0, 1), got '%s'\n",
                v);
        rc = 2;
        goto out;
      }
      i++;
    } else if (strcmp(a, "--shard-tokens") == 0) {
      if (!v) goto missing;
      if (parse_i64(v, &o.shard_tokens) < 0 || o.shard_tokens < 1 ||
          o.shard_tokens > TR_SHARD_MAX_TOKENS) {
        fprintf(stderr,
                "trainrun: data prepare: --shard-tokens: expected an "
                "integer in [1, %lld], got '%s'\n",
                TR_SHARD_MAX_TOKENS, v);
        rc = 2;
        goto out;
      }
      i++;
    } else if (strcmp(a, "--quiet") == 0 || strcmp(a, "-q") == 0) {
      o.quiet = 1;
    } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      data_usage(stdout);
      goto out;
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "trainrun: data prepare: unknown flag '%s'\n", a);
      rc = 2;
      goto out;
    } else {
      inputs[n++] = a;
    }
    continue;
  missing:
    fprintf(stderr, "trainrun: data prepare: %s needs a value\n", a);
    rc = 2;
    goto out;
  }
  if (!o.out_dir || n == 0) {
    fprintf(stderr, "trainrun: data prepare: %s\n",
            n == 0 ? "no input files" : "no output folder (-o DIR)");
    rc = 2;
    goto out;
  }
  tr_data_prepare_result_t res;
  tr_errmsg_t err;
  int r = tr_data_prepare(inputs, n, &o, &res, &err);
  if (r < 0) {
    fprintf(stderr, "trainrun: %s\n", err.message);
    rc = tr__cmd_exit_code(r);
    goto out;
  }
  printf("%s: %" PRId64 " training tokens in %d shard%s, %" PRId64
         " validation tokens in %d shard%s\n",
         o.out_dir, res.train_tokens, res.train_shards,
         res.train_shards == 1 ? "" : "s", res.val_tokens, res.val_shards,
         res.val_shards == 1 ? "" : "s");
  rc = fflush(stdout) == 0 ? 0 : 1;
out:
  free(inputs);
  return rc;
}
