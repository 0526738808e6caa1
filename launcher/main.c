/* launcher/main.c: `trainrun`, the command users type. Dispatches the
 * subcommands; turns errors into messages and exit codes (the only layer
 * that exits). Exit codes: 0 success, 1 runtime failure, 2 bad usage or bad
 * input (config, CLI). */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/param.h"

static void usage(FILE* out) {
  fprintf(out,
          "usage: trainrun [flags] JOB.toml [--section.key value ...]\n"
          "       trainrun COMMAND [args]\n"
          "\n"
          "commands:\n"
          "  config JOB.toml [overrides] [--json]   print the resolved job config\n"
          "\n"
          "flags:\n"
          "  --help        this text\n"
          "  --help-env    the environment variables trainrun reads\n"
          "  --version     print the version\n"
          "\n"
          "See trainrun(1) and trainrun.toml(5).\n");
}

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char* cmd = argv[1];
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(cmd, "--version") == 0) {
    printf("trainrun %s\n", PACKAGE_VERSION);
    return 0;
  }
  if (strcmp(cmd, "--help-env") == 0) {
    tr_param_print(stdout);
    return 0;
  }
  fprintf(stderr, "trainrun: unknown command '%s'\n", cmd);
  usage(stderr);
  return 2;
}
