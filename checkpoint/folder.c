/* checkpoint/folder.c: the checkpoint folder (step-N listing, the latest
 * complete step, removal) and the module's file helpers (durable small
 * files, folders, paths). */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/buf.h"      /* TR_GROW, tr__buf_t */
#include "core/internal.h" /* tr__read_file */
#include "checkpoint/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"

char* tr__ckpt_join(const char* a, const char* b) {
  size_t na = strlen(a), nb = strlen(b);
  char* s = malloc(na + nb + 2);
  if (!s) return NULL;
  memcpy(s, a, na);
  s[na] = '/';
  memcpy(s + na + 1, b, nb + 1);
  return s;
}

int64_t tr__ckpt_volume(int ndim, const int64_t* sizes) {
  int64_t v = 1;
  for (int d = 0; d < ndim; d++) v *= sizes[d];
  return v;
}

int tr__ckpt_fsync_dir(const char* dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return tr_err_from_errno();
  int rc = fsync(fd) < 0 && errno != EINVAL ? tr_err_from_errno() : 0;
  close(fd);
  return rc;
}

int tr__ckpt_read_file(const char* path, char** out, size_t* n,
                       tr_errmsg_t* err) {
  *out = NULL;
  tr__buf_t b = TR__BUF_INIT;
  int rc = tr__read_file(path, &b);
  if (rc == TR_ENOMEM || rc == TR_EIO) tr__buf_release(&b);
  if (rc == TR_ENOMEM) return tr_errmsg_set(err, rc, "out of memory");
  if (rc == TR_EIO)
    return tr_errmsg_set(err, rc, "cannot read '%s': %s", path,
                         tr_strerror(rc));
  if (rc < 0)
    return tr_errmsg_set(err, rc, "cannot open '%s': %s", path,
                         tr_strerror(rc));
  size_t len = 0;
  char* buf = tr__buf_detach(&b, &len);
  if (!buf) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  *out = buf;
  if (n) *n = len;
  return 0;
}

void tr_ckpt_step_dir(const char* folder, int64_t step, char* buf, size_t cap) {
  snprintf(buf, cap, "%s/step-%" PRId64, folder, step);
}

/* N of "step-N", or -1. */
static int64_t step_of(const char* name) {
  if (strncmp(name, "step-", 5) != 0) return -1;
  const char* p = name + 5;
  if (!*p) return -1;
  int64_t v = 0;
  for (; *p; p++) {
    if (*p < '0' || *p > '9' || v > INT64_MAX / 10 - 10) return -1;
    v = v * 10 + (*p - '0');
  }
  return v;
}

static int cmp_entry(const void* a, const void* b) {
  const tr_ckpt_entry_t *x = a, *y = b;
  return x->step < y->step ? -1 : x->step > y->step;
}

int tr_ckpt_list(const char* folder, tr_ckpt_entry_t** out, size_t* n,
                 tr_errmsg_t* err) {
  *out = NULL;
  *n = 0;
  DIR* d = opendir(folder);
  if (!d) {
    if (errno == ENOENT) return 0;
    int rc = tr_err_from_errno();
    return tr_errmsg_set(err, rc, "cannot open folder '%s': %s", folder,
                         tr_strerror(rc));
  }
  size_t cap = 0, cnt = 0;
  tr_ckpt_entry_t* v = NULL;
  struct dirent* de;
  int rc = 0;
  while ((de = readdir(d)) != NULL) {
    int64_t step = step_of(de->d_name);
    if (step < 0) continue;
    char* dir = tr__ckpt_join(folder, de->d_name);
    if (!dir) {
      rc = TR_ENOMEM;
      break;
    }
    struct stat st;
    if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
      free(dir);
      continue;
    }
    if (TR_GROW(v, cnt + 1, cap) < 0) {
      free(dir);
      rc = TR_ENOMEM;
      break;
    }
    tr_ckpt_entry_t* e = &v[cnt++];
    e->step = step;
    e->complete = 0;
    e->bytes = 0;
    e->hf = 0;
    DIR* sd = opendir(dir);
    struct dirent* fe;
    while (sd && (fe = readdir(sd)) != NULL) {
      if (fe->d_name[0] == '.') continue;
      char* fp = tr__ckpt_join(dir, fe->d_name);
      if (fp && stat(fp, &st) == 0 && S_ISREG(st.st_mode)) {
        e->bytes += st.st_size;
        if (strcmp(fe->d_name, TR_CKPT_METADATA) == 0) e->complete = 1;
        if (strcmp(fe->d_name, TR_CKPT_HF_INDEX) == 0) e->hf = 1;
      }
      free(fp);
    }
    if (sd) closedir(sd);
    free(dir);
  }
  closedir(d);
  if (rc < 0) {
    free(v);
    return tr_errmsg_set(err, rc, "out of memory");
  }
  if (cnt) qsort(v, cnt, sizeof *v, cmp_entry);
  *out = v;
  *n = cnt;
  return 0;
}

int tr_ckpt_latest(const char* folder, int64_t* step, tr_errmsg_t* err) {
  tr_ckpt_entry_t* v;
  size_t n;
  TR_CHECK(tr_ckpt_list(folder, &v, &n, err));
  int rc = TR_ENOTFOUND;
  for (size_t i = n; i-- > 0;) {
    if (v[i].complete) {
      *step = v[i].step;
      rc = 0;
      break;
    }
    if (v[i].hf)
      TR_LOG_WARN(CKPT,
                  "skipping '%s/step-%" PRId64
                  "': a Hugging Face export without " TR_CKPT_METADATA
                  " (not resumable)",
                  folder, v[i].step);
    else
      TR_LOG_WARN(CKPT,
                  "skipping '%s/step-%" PRId64
                  "': incomplete (no " TR_CKPT_METADATA ")",
                  folder, v[i].step);
  }
  free(v);
  if (rc < 0)
    tr_errmsg_set(err, rc, "'%s' holds no complete checkpoint", folder);
  return rc;
}

int tr_ckpt_remove_step(const char* folder, int64_t step) {
  char dir[4096];
  tr_ckpt_step_dir(folder, step, dir, sizeof dir);
  int rc = 0;
  static const char* const first[] = {TR_CKPT_METADATA, TR_CKPT_HF_INDEX};
  for (int i = 0; i < 2 && rc == 0; i++) {
    char* p = tr__ckpt_join(dir, first[i]);
    if (!p) return TR_ENOMEM;
    if (unlink(p) < 0 && errno != ENOENT) rc = tr_err_from_errno();
    free(p);
  }
  if (rc < 0) return rc;
  tr__ckpt_fsync_dir(dir);
  DIR* d = opendir(dir);
  if (!d) return errno == ENOENT ? 0 : tr_err_from_errno();
  struct dirent* de;
  while ((de = readdir(d)) != NULL) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
    char* fp = tr__ckpt_join(dir, de->d_name);
    if (fp && unlink(fp) < 0 && errno != ENOENT && rc == 0)
      rc = tr_err_from_errno();
    free(fp);
  }
  closedir(d);
  if (rmdir(dir) < 0 && rc == 0) rc = tr_err_from_errno();
  return rc;
}
