/* launcher/cmd_config.c: `trainrun config`, which prints the resolved job
 * config (TOML, or JSON with --json) for a world size, or the first error
 * in it with exit code 2. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launcher/commands.h"
#include "launcher/launch.h" /* tr__preflight_config */
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

typedef struct {
  long long world;
  int json;
} config_flags_t;

/* config's own flags (launcher/jobargs.c asks). */
static int config_flag(void* arg, int argc, char** argv, int i, int* code) {
  config_flags_t* f = arg;
  const char* a = argv[i];
  if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
    config_usage(stdout);
    *code = 0;
    return -1;
  }
  if (strcmp(a, "--json") == 0) {
    f->json = 1;
    return 1;
  }
  if (strcmp(a, "--world-size") != 0 && strncmp(a, "--world-size=", 13) != 0)
    return 0;
  const char* v = a[12] == '=' ? a + 13 : i + 1 < argc ? argv[i + 1] : NULL;
  if (!v || parse_world(v, &f->world) < 0) {
    fprintf(stderr,
            "trainrun: --world-size: expected a positive integer, got "
            "'%s'\n",
            v ? v : "");
    *code = 2;
    return -1;
  }
  return a[12] == '=' ? 1 : 2;
}

int tr_cmd_config(int argc, char** argv) {
  config_flags_t f = {.world = 1};
  tr__jobargs_opts_t o = {.cmd = "config",
                          .first = 1,
                          .flag = config_flag,
                          .usage = config_usage,
                          .arg = &f};
  tr__jobargs_t ja;
  int rc = tr__jobargs_parse(&ja, argc, argv, &o);
  if (rc >= 0) return rc;

  tr_config_t cfg;
  tr_errmsg_t err;
  if (tr_config_load(&cfg, ja.path, ja.n, ja.overrides, &err) < 0 ||
      tr__job_check(&cfg, f.world, &err) < 0 ||
      tr__preflight_config(&cfg, &err) < 0) {
    fprintf(stderr, "trainrun: %s\n", err.message);
    rc = 2;
  } else {
    int prc = f.json ? tr_config_print_json(&cfg, stdout)
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
  tr__jobargs_release(&ja);
  return rc;
}
