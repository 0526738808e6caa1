/* daemon/output.c: what workers print. Each stream of each worker is a
 * pipe; its whole lines go to the daemon's console prefixed "[rank3]:"
 * (one write per batch of lines, so lines of two ranks never mix), every
 * byte to the rank's log file when there is one
 * (<log_dir>/attempt_<round>/<rank>/stdout.log and stderr.log), and the
 * last lines to a tail kept for the failure report. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/internal.h"
#include "trainrun/error.h"

/* A line longer than this is shown in pieces. */
#define MAX_LINE 65536

void tr__tail_push(tr__tail_t* t, const char* line, size_t len) {
  if (len > 512) len = 512; /* keep a report readable */
  char* c = strndup(line, len);
  if (!c) return;
  free(t->line[t->next]);
  t->line[t->next] = c;
  t->next = (t->next + 1) % TR__TAIL_LINES;
  if (t->count < TR__TAIL_LINES) t->count++;
}

char* tr__tail_format(const tr__tail_t* t, const char* indent) {
  size_t cap = 1, il = strlen(indent);
  int first = (t->next - t->count + TR__TAIL_LINES) % TR__TAIL_LINES;
  for (int i = 0; i < t->count; i++)
    cap += il + strlen(t->line[(first + i) % TR__TAIL_LINES]) + 1;
  char* s = malloc(cap);
  if (!s) return NULL;
  size_t w = 0;
  for (int i = 0; i < t->count; i++) {
    const char* l = t->line[(first + i) % TR__TAIL_LINES];
    size_t n = strlen(l);
    memcpy(s + w, indent, il);
    w += il;
    memcpy(s + w, l, n);
    w += n;
    s[w++] = '\n';
  }
  s[w] = '\0';
  return s;
}

void tr__tail_release(tr__tail_t* t) {
  for (int i = 0; i < TR__TAIL_LINES; i++) free(t->line[i]);
  memset(t, 0, sizeof *t);
}

void tr__stream_init(tr__stream_t* s, int fd, int console_fd, int file_fd,
                     int rank) {
  memset(s, 0, sizeof *s);
  s->fd = fd;
  s->console_fd = console_fd;
  s->file_fd = file_fd;
  snprintf(s->prefix, sizeof s->prefix, "[rank%d]:", rank);
}

static void write_all(int fd, const char* p, size_t n, int* failed) {
  while (n > 0 && !*failed) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      *failed = 1; /* a closed console: keep the files and the job going */
      return;
    }
    p += w;
    n -= (size_t)w;
  }
}

/* Emit the lines in data[0..n) (each ends with '\n', but the last may be a
 * piece of a long line, ended here): to the console with prefixes, in one
 * write. */
static void emit_lines(tr__stream_t* s, tr__tail_t* tail, const char* data,
                       size_t n) {
  size_t plen = strlen(s->prefix), lines = 0;
  for (size_t i = 0; i < n; i++) lines += data[i] == '\n';
  int partial = n > 0 && data[n - 1] != '\n';
  lines += partial;
  const char* p = data;
  const char* end = data + n;
  char* out = NULL;
  size_t w = 0;
  if (s->console_fd >= 0 && !s->console_err) out = malloc(n + lines * plen + 1);
  while (p < end) {
    const char* nl = memchr(p, '\n', (size_t)(end - p));
    size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
    /* a worker's "\r\n" shows as one line */
    size_t tl = len > 0 && p[len - 1] == '\r' ? len - 1 : len;
    tr__tail_push(tail, p, tl);
    if (out) {
      memcpy(out + w, s->prefix, plen);
      w += plen;
      memcpy(out + w, p, len);
      w += len;
      out[w++] = '\n';
    }
    p += len + (nl ? 1 : 0);
  }
  if (out) {
    write_all(s->console_fd, out, w, &s->console_err);
    free(out);
  }
}

int tr__stream_read(tr__stream_t* s, tr__tail_t* tail) {
  if (s->fd < 0) return 1;
  char chunk[65536];
  for (int round = 0;; round++) {
    if (round == 16) return 2; /* let the other workers' pipes have a turn */
    ssize_t r = read(s->fd, chunk, sizeof chunk);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (r < 0) return tr_err_from_errno();
    if (r == 0) {
      tr__stream_close(s, tail);
      return 1;
    }
    if (s->file_fd >= 0) {
      int ferr = 0;
      write_all(s->file_fd, chunk, (size_t)r, &ferr);
      if (ferr) {
        close(s->file_fd);
        s->file_fd = -1;
      }
    }
    tr__buf_t* b = &s->line;
    if (tr__buf_add(b, chunk, (size_t)r) < 0) {
      /* out of memory: what we have goes out as it is */
      emit_lines(s, tail, b->buf, b->len);
      emit_lines(s, tail, chunk, (size_t)r);
      tr__buf_release(b);
      return TR_ENOMEM;
    }
    /* whole lines out; the unfinished one waits (unless it grew too long) */
    char* last_nl = NULL;
    for (size_t i = b->len; i > 0; i--)
      if (b->buf[i - 1] == '\n') {
        last_nl = b->buf + i - 1;
        break;
      }
    size_t done = last_nl ? (size_t)(last_nl - b->buf) + 1 : 0;
    if (!last_nl && b->len >= MAX_LINE) done = b->len;
    if (done) {
      emit_lines(s, tail, b->buf, done);
      memmove(b->buf, b->buf + done, b->len - done);
      tr__buf_setlen(b, b->len - done);
    }
  }
}

void tr__stream_close(tr__stream_t* s, tr__tail_t* tail) {
  if (s->line.len) emit_lines(s, tail, s->line.buf, s->line.len);
  tr__buf_release(&s->line);
  if (s->fd >= 0) close(s->fd);
  if (s->file_fd >= 0) close(s->file_fd);
  s->fd = s->file_fd = -1;
}

/* mkdir -p */
static int make_dirs(char* path) {
  for (char* p = path + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    int rc = mkdir(path, 0777) == 0 || errno == EEXIST ? 0 : -errno;
    *p = '/';
    if (rc < 0) return rc;
  }
  if (mkdir(path, 0777) != 0 && errno != EEXIST) return -errno;
  return 0;
}

int tr__log_file_open(const char* log_dir, int round, int rank,
                      const char* name, tr_errmsg_t* err) {
  char dir[4096], path[4200];
  int n = snprintf(dir, sizeof dir, "%s/attempt_%d/%d", log_dir, round, rank);
  if (n < 0 || (size_t)n >= sizeof dir)
    return tr_errmsg_set(err, TR_ENAMETOOLONG, "log folder '%s' is too long",
                         log_dir);
  int rc = make_dirs(dir);
  if (rc < 0)
    return tr_errmsg_set(err, rc, "cannot create '%s': %s", dir,
                         tr_strerror(rc));
  snprintf(path, sizeof path, "%s/%s.log", dir, name);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) {
    rc = tr_err_from_errno();
    return tr_errmsg_set(err, rc, "cannot open '%s': %s", path,
                         tr_strerror(rc));
  }
  return fd;
}
