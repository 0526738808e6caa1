/* launcher/preflight.c: what a job is checked for before any work starts
 * (before the daemon spawns a worker, or the one rank trains), so that a
 * mistake costs an exit code 2 and its reason at once rather than a failure
 * after the training, or a process that waits forever:
 *
 *   - the model's config for the job (training.seq_len against the model:
 *     what the trainer would refuse at start), with file:line:col;
 *   - job.dump_folder: not empty, a folder this process can create and
 *     write in; the checkpoint folder inside it too when checkpoints are
 *     saved;
 *   - the data: training.dataset_path (and validation.dataset_path when
 *     validation runs) names regular files that can be opened (a glob that
 *     matches nothing, a FIFO or a device are refused).
 *
 * Messages name where the key involved was set ("job.toml:3:15: ...",
 * "--job.dump_folder: ..."), as tr_config_resolve's do. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/internal.h" /* tr__mkdir_p */
#include "launcher/launch.h"
#include "trainrun/data.h"
#include "trainrun/error.h"

/* Put where key `name` was set in front of err's message, as the config's
 * own messages read: "job.toml:3:15: section.key: ...", "--section.key:
 * ...", or "section.key: ..." for a default. */
static int at_key(const tr_config_t* cfg, const char* name, tr_errmsg_t* err) {
  const tr_config_key_t* k = tr_config_find_key(name);
  char where[512];
  const char* w = k ? tr_config_origin(cfg, k->id, where, sizeof where) : NULL;
  if (w && w[0] == '-') return tr_errmsg_prefix(err, err->code, "%s", w);
  tr_errmsg_prefix(err, err->code, "%s", name);
  if (w) tr_errmsg_prefix(err, err->code, "%s", w);
  return err->code;
}

int tr__preflight_config(const tr_config_t* cfg, tr_errmsg_t* err) {
  if (!cfg->job.dump_folder[0]) {
    tr_errmsg_set(err, TR_ECONFIG,
                  "empty; it names the folder for checkpoints, metrics and "
                  "the weights");
    return at_key(cfg, "job.dump_folder", err);
  }
  /* the model's fit (flavor, training.seq_len) is tr__job_check's, which
   * every caller runs first */
  return 0;
}

/* Create folder (and its parents) and prove a file can be made in it. */
static int writable_folder(const char* folder, tr_errmsg_t* err) {
  tr_errmsg_t merr;
  int rc = tr__mkdir_p(folder, &merr);
  if (rc < 0)
    return tr_errmsg_set(err, rc, "cannot create '%s': %s", folder,
                         tr_strerror(rc));
  size_t cap = strlen(folder) + 32;
  char* probe = malloc(cap);
  if (!probe) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  snprintf(probe, cap, "%s/.trainrun-probe-XXXXXX", folder);
  int fd = mkstemp(probe);
  if (fd < 0) {
    rc = tr_err_from_errno();
    tr_errmsg_set(err, rc, "cannot write in '%s': %s", folder, tr_strerror(rc));
  } else {
    close(fd);
    unlink(probe);
  }
  free(probe);
  return rc;
}

int tr__preflight_files(const tr_config_t* cfg, tr_errmsg_t* err) {
  const char* dump = cfg->job.dump_folder;
  if (writable_folder(dump, err) < 0)
    return at_key(cfg, "job.dump_folder", err);
  if (cfg->checkpoint.enable && !cfg->checkpoint.load_only) {
    size_t cap = strlen(dump) + strlen(cfg->checkpoint.folder) + 2;
    char* ck = malloc(cap);
    if (!ck) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
    snprintf(ck, cap, "%s/%s", dump, cfg->checkpoint.folder);
    int rc = writable_folder(ck, err);
    free(ck);
    if (rc < 0) return at_key(cfg, "checkpoint.folder", err);
  }
  if (cfg->training.dataset_path &&
      tr_dataset_check(cfg->training.dataset_path, TR_DATA_TRAIN, err) < 0)
    return at_key(cfg, "training.dataset_path", err);
  if (cfg->validation.enable && cfg->validation.dataset_path &&
      tr_dataset_check(cfg->validation.dataset_path, TR_DATA_VAL, err) < 0)
    return at_key(cfg, "validation.dataset_path", err);
  return 0;
}
