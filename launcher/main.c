/* launcher/main.c: `trainrun`, the command users type. Dispatches the
 * subcommands; turns errors into messages and exit codes (the only layer
 * that exits). Exit codes: 0 success, 1 runtime failure, 2 bad usage or bad
 * input (config, CLI). */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "build_commit.h"
#include "launcher/commands.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/param.h"

/* The subcommands: `trainrun NAME args...` calls fn(argc - 1, argv + 1). */
static const struct {
  const char* name;
  int (*fn)(int argc, char** argv);
} commands[] = {
    {"config", tr_cmd_config},
    {"plan", tr_cmd_plan},
    {"store", tr_cmd_store},
    {"data", tr_cmd_data},
    {"eval", tr_cmd_eval},
    {"sample", tr_cmd_sample},
    {"status", tr_cmd_status},
    {"fr", tr_cmd_fr},
    {"ckpt", tr_cmd_ckpt},
};

static void usage(FILE* out) {
  fprintf(out,
          "usage: trainrun [flags] JOB.toml [--section.key value ...]\n"
          "       trainrun [flags] --exec PROGRAM [ARGS...]\n"
          "       trainrun COMMAND [args]\n"
          "\n"
          "commands:\n"
          "  config JOB.toml [overrides] [--json]   print the resolved job config\n"
          "  plan JOB.toml [--world-size N]         mesh and memory per rank\n"
          "  store --port P [--host H] [--token-env] run a TCPStore server\n"
          "  data prepare FILE... -o DIR            text files to token shards\n"
          "  eval JOB.toml --weights FILE           validation loss of weights\n"
          "  sample --weights FILE --prompt TEXT    generate text\n"
          "  status                                 jobs running on this machine\n"
          "  fr analyze DIR [options]               which rank hung where (dumps)\n"
          "  ckpt ls|inspect|verify|export|import   checkpoints (trainrun-ckpt(1))\n"
          "\n"
          "launcher flags (torchrun's; see trainrun(1)):\n"
          "  --nnodes N|MIN:MAX  --nproc-per-node N|gpu|cpu|auto  --node-rank R\n"
          "  --rdzv-endpoint HOST[:PORT]  --rdzv-id ID  --rdzv-conf K=V,...\n"
          "  --standalone  --max-restarts N  --monitor-interval S\n"
          "  --log-dir DIR  --redirects S  --tee S  --local-ranks-filter LIST\n"
          "  --worker-timeout S  --metrics-port P\n"
          "  --dry-run     check the job and layout for the world, run nothing\n"
          "  --exec        run PROGRAM as the workers instead of a job\n"
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
    printf("trainrun %s (git %s)\n", PACKAGE_VERSION, TR_BUILD_COMMIT);
    return 0;
  }
  if (strcmp(cmd, "--help-env") == 0) {
    tr_param_print(stdout);
    return 0;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (strcmp(cmd, commands[i].name) == 0)
      return commands[i].fn(argc - 1, argv + 1);
  /* no subcommand: `trainrun [flags] JOB.toml [overrides]` */
  return tr_launch_job(argc - 1, argv + 1);
}
