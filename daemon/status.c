/* daemon/status.c: `trainrun status` -- each daemon listens on a unix
 * socket <TMPDIR>/trainrun-<uid>/<pid>.sock and answers every connection
 * with a text snapshot of its job (run, round, node, and per rank: pid,
 * state, run time, last output line), then closes it. tr_daemon_status_print
 * asks every socket of the folder. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/param.h"

int tr_daemon_status_dir(char* out, size_t cap) {
  int n = snprintf(out, cap, "%s/trainrun-%u", tr_param_str(TR_PARAM_TMPDIR),
                   (unsigned)getuid());
  return n < 0 || (size_t)n >= cap ? TR_ENAMETOOLONG : 0;
}

static int sock_addr(const char* path, struct sockaddr_un* sa) {
  memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  if (strlen(path) >= sizeof sa->sun_path) return TR_ENAMETOOLONG;
  strcpy(sa->sun_path, path);
  return 0;
}

int tr__status_open(int* fd, char** path) {
  *fd = -1;
  *path = NULL;
  char dir[256];
  int rc = tr_daemon_status_dir(dir, sizeof dir);
  if (rc == 0 && mkdir(dir, 0700) != 0 && errno != EEXIST)
    rc = tr_err_from_errno();
  struct stat st;
  /* a folder someone else made could let them read or fake our answers */
  if (rc == 0 && (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) ||
                  st.st_uid != getuid() || (st.st_mode & 077)))
    rc = TR_EACCES;
  char* p = NULL;
  if (rc == 0 && asprintf(&p, "%s/%d.sock", dir, (int)getpid()) < 0)
    rc = TR_ENOMEM;
  struct sockaddr_un sa;
  if (rc == 0) rc = sock_addr(p, &sa);
  int s = -1;
  if (rc == 0) {
    s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0) rc = tr_err_from_errno();
  }
  if (rc == 0) {
    unlink(p);
    if (bind(s, (struct sockaddr*)&sa, sizeof sa) != 0 || listen(s, 16) != 0)
      rc = tr_err_from_errno();
  }
  if (rc < 0) {
    TR_LOG_INFO(DAEMON, "no status socket in '%s': %s", dir, tr_strerror(rc));
    if (s >= 0) close(s);
    free(p);
    return rc;
  }
  *fd = s;
  *path = p;
  return 0;
}

void tr__status_close(int fd, char* path) {
  if (fd >= 0) close(fd);
  if (path) unlink(path);
  free(path);
}

/* The snapshot, malloc()ed. */
static char* snapshot(const tr__daemon_t* d) {
  char* buf = NULL;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  if (!f) return NULL;
  const tr_daemon_opts_t* o = d->o;
  fprintf(f, "daemon %d on '%s': run '%s', %s\n", (int)getpid(), d->host,
          o->run_id, d->phase ? d->phase : "?");
  if (d->in_round) {
    const tr__rdzv_t* r = &d->rdzv;
    fprintf(f,
            "  round %d (%d restart%s after failures), node %d of %d, ranks "
            "%d-%d of %d, store %s:%d%s\n",
            r->round, d->failures, d->failures == 1 ? "" : "s", r->node_rank,
            r->nnodes, r->rank_base, r->rank_base + d->nworkers - 1,
            r->world_size, d->store_host, d->store_port,
            d->server ? " (hosted here)" : "");
    for (int i = 0; i < r->nnodes; i++)
      fprintf(f, "  node %d: '%s', %d worker%s\n", i, r->nodes[i].host,
              r->nodes[i].nproc, r->nodes[i].nproc == 1 ? "" : "s");
  }
  double now = tr__daemon_now();
  for (int i = 0; i < d->nworkers; i++) {
    const tr__worker_t* w = &d->workers[i];
    char state[96];
    if (!w->pid)
      snprintf(state, sizeof state, "not started");
    else if (w->running)
      snprintf(state, sizeof state, "running for %.1fs", now - w->started);
    else
      tr__daemon_describe_status(w->status, state, sizeof state);
    const tr__tail_t* t = &w->tail;
    const char* last =
        t->count ? t->line[(t->next + TR__TAIL_LINES - 1) % TR__TAIL_LINES]
                 : "";
    fprintf(f, "  rank %d (local rank %d, pid %d): %s%s%s\n", w->rank,
            w->local_rank, (int)w->pid, state, *last ? ": " : "", last);
  }
  fclose(f);
  return buf;
}

void tr__status_serve(int fd, const tr__daemon_t* d) {
  int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
  if (c < 0) return;
  /* a reader that does not read cannot hold the daemon up */
  struct timeval tv = {0, 200000};
  setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  char* s = snapshot(d);
  if (s) {
    size_t n = strlen(s), off = 0;
    while (off < n) {
      ssize_t w = send(c, s + off, n - off, MSG_NOSIGNAL);
      if (w <= 0) break;
      off += (size_t)w;
    }
    free(s);
  }
  close(c);
}

/* Read one daemon's answer into out; 0, or a negative error. */
static int ask(const char* path, FILE* out) {
  struct sockaddr_un sa;
  TR_CHECK(sock_addr(path, &sa));
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return tr_err_from_errno();
  struct timeval tv = {2, 0};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (connect(s, (struct sockaddr*)&sa, sizeof sa) != 0) {
    int rc = tr_err_from_errno();
    close(s);
    return rc;
  }
  char buf[4096];
  ssize_t r;
  while ((r = read(s, buf, sizeof buf)) > 0) fwrite(buf, 1, (size_t)r, out);
  close(s);
  return r < 0 ? tr_err_from_errno() : 0;
}

int tr_daemon_status_print(FILE* out, int* found) {
  char dir[256];
  int n = 0;
  if (found) *found = 0;
  TR_CHECK(tr_daemon_status_dir(dir, sizeof dir));
  DIR* dd = opendir(dir);
  if (!dd) return errno == ENOENT ? 0 : tr_err_from_errno();
  struct dirent* e;
  while ((e = readdir(dd))) {
    size_t len = strlen(e->d_name);
    if (len < 6 || strcmp(e->d_name + len - 5, ".sock") != 0) continue;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    int rc = ask(path, out);
    if (rc == TR_ECONNREFUSED || rc == TR_ENOENT)
      unlink(path); /* its daemon is gone */
    else if (rc == 0)
      n++;
  }
  closedir(dd);
  if (found) *found = n;
  return 0;
}
