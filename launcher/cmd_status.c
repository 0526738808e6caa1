/* launcher/cmd_status.c: `trainrun status` -- what every trainrun daemon
 * of this user on this machine reports (daemon/status.c answers). */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "launcher/commands.h"
#include "trainrun/daemon.h" /* tr_daemon_status_print */
#include "trainrun/error.h"

int tr_cmd_status(int argc, char** argv) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      printf(
          "usage: trainrun status\n\nWhat every trainrun daemon of this "
          "user on this machine reports:\nits run, round and nodes, and "
          "each rank's pid, state, step, loss, tokens/s,\nlast heartbeat "
          "and last output line.\n");
      return 0;
    }
    fprintf(stderr, "trainrun status: unknown argument '%s'\n", argv[i]);
    return 2;
  }
  int found = 0;
  int rc = tr_daemon_status_print(stdout, &found);
  if (rc < 0) {
    fprintf(stderr, "trainrun: status: %s\n", tr_strerror(rc));
    return 1;
  }
  if (found == 0) {
    fprintf(stderr, "trainrun: no trainrun job runs on this machine\n");
    return 1;
  }
  return 0;
}
