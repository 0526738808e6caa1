/* daemon/main.c: `trainrund [flags] [--] PROGRAM [ARGS...]`, the node daemon
 * on its own: rendezvous with the other nodes, run PROGRAM once per local
 * worker with torchrun's environment, supervise and restart it
 * (trainrund(8)). `trainrun JOB.toml` runs the same daemon in its own
 * process. Exit codes: 0 success, 1 a worker failed (no restart left) or
 * the daemon failed, 2 bad usage or a worker that exited with code 2 (a
 * configuration or data error: never restarted), 128+N after a second
 * signal N. */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "build_commit.h"
#include "trainrun/daemon.h"
#include "trainrun/error.h"
#include "trainrun/param.h"

static void usage(FILE* out) {
  fprintf(out,
          "usage: trainrund [flags] [--] PROGRAM [ARGS...]\n"
          "\n"
          "Runs PROGRAM once per local worker with RANK, LOCAL_RANK,\n"
          "WORLD_SIZE, MASTER_ADDR, MASTER_PORT ... set, and supervises it.\n"
          "\n"
          "flags (torchrun's):\n"
          "  --nnodes N|MIN:MAX          nodes of the job (default 1)\n"
          "  --nproc-per-node N|gpu|cpu|auto  workers here (default auto:\n"
          "                              every GPU, else 1)\n"
          "  --node-rank R               this node's rank (default: order "
          "of arrival)\n"
          "  --rdzv-endpoint HOST[:PORT] the store (default port 29500)\n"
          "  --rdzv-id ID                run id (default none)\n"
          "  --rdzv-conf K=V,...         join_timeout, last_call_timeout,\n"
          "                              keep_alive_interval,\n"
          "                              keep_alive_max_attempt, "
          "read_timeout, is_host\n"
          "  --standalone                one node, a private store\n"
          "  --max-restarts N            restarts after failures (default 0)\n"
          "  --monitor-interval S        store checks (default 0.1)\n"
          "  --worker-timeout S          silent heartbeat that fails a\n"
          "                              worker (default 300, 0 off)\n"
          "  --metrics-port P            Prometheus metrics over HTTP\n"
          "  --log-dir DIR               per-rank stdout/stderr files\n"
          "  --redirects S, --tee S      0-3 or LOCAL_RANK:0-3,... "
          "(1 stdout, 2 stderr)\n"
          "  --local-ranks-filter LIST   show only these local ranks\n"
          "  --role NAME                 ROLE_NAME (default 'default')\n"
          "  --help, --help-env, --version\n"
          "\n"
          "See trainrund(8).\n");
}

/* "trainrund: first line", then the others as they are. */
static void print_message(const char* msg) {
  const char* p = msg;
  int first = 1;
  while (*p) {
    size_t n = strcspn(p, "\n");
    fprintf(stderr, "%s%.*s\n", first ? "trainrund: " : "", (int)n, p);
    first = 0;
    p += n;
    if (*p) p++;
  }
}

int main(int argc, char** argv) {
  tr_daemon_opts_t o;
  tr_daemon_opts_init(&o);
  o.prog = "trainrund";
  tr_errmsg_t err;
  tr_errmsg_clear(&err);
  int i = 1, rc = 2;
  while (i < argc) {
    const char* a = argv[i];
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    }
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      rc = 0;
      goto out;
    }
    if (strcmp(a, "--version") == 0) {
      printf("trainrund %s (git %s)\n", PACKAGE_VERSION, TR_BUILD_COMMIT);
      rc = 0;
      goto out;
    }
    if (strcmp(a, "--help-env") == 0) {
      tr_param_print(stdout);
      rc = 0;
      goto out;
    }
    int n = tr_daemon_opts_flag(&o, argc, argv, i, &err);
    if (n < 0) {
      fprintf(stderr, "trainrund: %s\n", err.message);
      goto out;
    }
    if (n == 0) {
      if (a[0] == '-') {
        fprintf(stderr, "trainrund: unknown flag '%s' (see trainrund --help)\n",
                a);
        goto out;
      }
      break;
    }
    i += n;
  }
  if (i >= argc) {
    fprintf(stderr,
            "trainrund: no program to run (trainrund [flags] "
            "PROGRAM [ARGS...])\n");
    goto out;
  }
  if (tr_daemon_opts_from_env(&o, &err) < 0 ||
      tr_daemon_opts_finish(&o, TR_DAEMON_DEVICE_AUTO, &err) < 0) {
    fprintf(stderr, "trainrund: %s\n", err.message);
    goto out;
  }
  tr_daemon_report_t rep;
  tr_daemon_run(&o, argv + i, &rep);
  if (rep.message) print_message(rep.message);
  rc = rep.exit_code;
  tr_daemon_report_release(&rep);
out:
  tr_daemon_opts_release(&o);
  return rc;
}
