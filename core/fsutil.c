/* core/fsutil.c: folders, whole-file reads and atomic file writes for the
 * layers that read and write files (core/internal.h). */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trainrun/error.h"
#include "core/internal.h"

int tr__mkdir_p(const char* path, tr_errmsg_t* err) {
  size_t n = strlen(path);
  char* buf = malloc(n + 1);
  if (!buf) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  memcpy(buf, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] != '/' && buf[i] != '\0') continue;
    char c = buf[i];
    buf[i] = '\0';
    if (mkdir(buf, 0777) < 0 && errno != EEXIST) {
      int rc = tr_err_from_errno();
      tr_errmsg_set(err, rc, "cannot create folder '%s': %s", buf,
                    tr_strerror(rc));
      free(buf);
      return rc;
    }
    buf[i] = c;
  }
  struct stat st;
  int rc = 0;
  if (stat(path, &st) < 0 || !S_ISDIR(st.st_mode))
    rc = tr_errmsg_set(err, TR_ENOTDIR, "cannot create folder '%s': %s", path,
                       tr_strerror(TR_ENOTDIR));
  free(buf);
  return rc;
}

int tr__fsync_parent(const char* path) {
  const char* slash = strrchr(path, '/');
  char* dir = slash ? strndup(path, (size_t)(slash - path)) : strdup(".");
  if (!dir) return TR_ENOMEM;
  if (!*dir) {
    free(dir);
    dir = strdup("/");
    if (!dir) return TR_ENOMEM;
  }
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  free(dir);
  if (fd < 0) return tr_err_from_errno();
  int rc = fsync(fd) < 0 && errno != EINVAL ? tr_err_from_errno() : 0;
  close(fd);
  return rc;
}

void tr__afile_abort(tr__afile_t* af) {
  if (af->f) fclose(af->f);
  if (af->tmp) unlink(af->tmp);
  free(af->tmp);
  free(af->path);
  memset(af, 0, sizeof *af);
}

int tr__afile_open(tr__afile_t* af, const char* path, tr_errmsg_t* err) {
  memset(af, 0, sizeof *af);
  size_t n = strlen(path);
  af->path = strdup(path);
  af->tmp = malloc(n + 5);
  if (!af->path || !af->tmp) {
    tr__afile_abort(af);
    return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  }
  memcpy(af->tmp, path, n);
  memcpy(af->tmp + n, ".tmp", 5);
  af->f = fopen(af->tmp, "wb");
  if (!af->f) {
    int rc = tr_err_from_errno();
    tr_errmsg_set(err, rc, "cannot create '%s': %s", af->tmp, tr_strerror(rc));
    free(af->tmp);
    af->tmp = NULL; /* nothing to unlink */
    tr__afile_abort(af);
    return rc;
  }
  return 0;
}

int tr__afile_write(tr__afile_t* af, const void* buf, size_t n,
                    tr_errmsg_t* err) {
  if (n && fwrite(buf, 1, n, af->f) != n) {
    int rc = tr_err_from_errno();
    return tr_errmsg_set(err, rc, "cannot write '%s': %s", af->tmp,
                         tr_strerror(rc));
  }
  return 0;
}

int tr__afile_commit(tr__afile_t* af, tr_errmsg_t* err) {
  int rc = 0;
  if (fflush(af->f) != 0 || fsync(fileno(af->f)) < 0) {
    rc = tr_err_from_errno();
    tr_errmsg_set(err, rc, "cannot write '%s': %s", af->tmp, tr_strerror(rc));
    tr__afile_abort(af);
    return rc;
  }
  if (fclose(af->f) != 0) {
    af->f = NULL;
    rc = tr_err_from_errno();
    tr_errmsg_set(err, rc, "cannot write '%s': %s", af->tmp, tr_strerror(rc));
    tr__afile_abort(af);
    return rc;
  }
  af->f = NULL;
  if (rename(af->tmp, af->path) < 0) {
    rc = tr_err_from_errno();
    tr_errmsg_set(err, rc, "cannot rename '%s' to '%s': %s", af->tmp, af->path,
                  tr_strerror(rc));
    tr__afile_abort(af);
    return rc;
  }
  tr__fsync_parent(af->path);
  free(af->tmp);
  af->tmp = NULL;
  tr__afile_abort(af); /* frees path */
  return 0;
}

int tr__write_file(const char* path, const void* buf, size_t n,
                   tr_errmsg_t* err) {
  tr__afile_t af;
  int rc = tr__afile_open(&af, path, err);
  if (rc < 0) return rc;
  rc = tr__afile_write(&af, buf, n, err);
  if (rc < 0) {
    tr__afile_abort(&af);
    return rc;
  }
  return tr__afile_commit(&af, err);
}

int tr__read_file(const char* path, tr__buf_t* b) {
  FILE* f = fopen(path, "rb");
  if (!f) return tr_err_from_errno();
  struct stat st;
  size_t hint = fstat(fileno(f), &st) == 0 && st.st_size > 0
                    ? (size_t)st.st_size
                    : (size_t)1 << 16;
  int rc = tr__buf_grow(b, hint);
  while (rc == 0) {
    size_t room = b->cap - b->len - 1;
    size_t r = fread(b->buf + b->len, 1, room, f);
    tr__buf_setlen(b, b->len + r);
    if (r < room) break; /* end of file or an error */
    rc = tr__buf_grow(b, b->cap);
  }
  if (rc == 0 && ferror(f)) rc = TR_EIO;
  fclose(f);
  return rc;
}
