/* launcher/cmd_config.c: `trainrun config`, which prints the resolved job
 * config (TOML, or JSON with --json) for a world size, or the first error
 * in it with exit code 2. The hidden --man prints trainrun.toml(5), which
 * is generated from the config schema. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launcher/commands.h"
#include "trainrun/config.h"
#include "trainrun/error.h"

static void config_usage(FILE* out) {
  fprintf(out,
          "usage: trainrun config [JOB.toml] [--section.key value ...] "
          "[--world-size N] [--json]\n"
          "\n"
          "Print the job config as trainrun resolves it: the defaults, then "
          "JOB.toml,\n"
          "then the overrides; checked for a world of N ranks (default 1). "
          "Exit code 2\n"
          "and a message naming file:line:col or the flag when anything is "
          "wrong.\n"
          "\n"
          "  --world-size N   check the parallel layout for N ranks\n"
          "  --json           print JSON instead of TOML\n"
          "\n"
          "Keys and defaults: trainrun.toml(5).\n");
}

static int parse_world(const char* text, long long* out) {
  char* end;
  errno = 0;
  long long v = strtoll(text, &end, 10);
  if (errno || end == text || *end || v < 1) return -1;
  *out = v;
  return 0;
}

int tr_cmd_config(int argc, char** argv) {
  const char* path = NULL;
  long long world = 1;
  int json = 0, man = 0, rc;
  char** overrides = calloc((size_t)argc + 1, sizeof *overrides);
  int n = 0;
  if (!overrides) {
    fprintf(stderr, "trainrun: %s\n", tr_strerror(TR_ENOMEM));
    return 1;
  }
  for (int i = 1; i < argc;) {
    const char* a = argv[i];
    int span = tr_config_arg_span(argc, argv, i);
    if (span > 0) {
      for (int j = 0; j < span; j++) overrides[n++] = argv[i + j];
      i += span;
      continue;
    }
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      config_usage(stdout);
      rc = 0;
      goto out;
    } else if (strcmp(a, "--json") == 0) {
      json = 1;
    } else if (strcmp(a, "--man") == 0) {
      man = 1;
    } else if (strcmp(a, "--world-size") == 0 ||
               strncmp(a, "--world-size=", 13) == 0) {
      const char* v = a[12] == '=' ? a + 13 : i + 1 < argc ? argv[++i] : NULL;
      if (!v || parse_world(v, &world) < 0) {
        fprintf(stderr,
                "trainrun: --world-size: expected a positive integer, got "
                "'%s'\n",
                v ? v : "");
        rc = 2;
        goto out;
      }
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "trainrun: config: unknown flag '%s'\n", a);
      config_usage(stderr);
      rc = 2;
      goto out;
    } else if (path) {
      fprintf(stderr, "trainrun: config: more than one job file ('%s', '%s')\n",
              path, a);
      rc = 2;
      goto out;
    } else {
      path = a;
    }
    i++;
  }
  if (man) {
    rc = tr_config_print_man(stdout) < 0 ? 1 : 0;
    goto out;
  }

  tr_config_t cfg;
  tr_config_error_t err;
  if (tr_config_load(&cfg, path, n, overrides, &err) < 0 ||
      tr_config_resolve(&cfg, world, &err) < 0) {
    fprintf(stderr, "trainrun: %s\n", err.message);
    rc = 2;
  } else {
    int prc = json ? tr_config_print_json(&cfg, stdout)
                   : tr_config_print_toml(&cfg, stdout);
    if (prc < 0) {
      fprintf(stderr, "trainrun: cannot print the config: %s\n",
              tr_strerror(prc));
      rc = 1;
    } else {
      rc = 0;
    }
  }
  tr_config_release(&cfg);
out:
  free(overrides);
  return rc;
}
