/* daemon/status.c: `trainrun status` -- each daemon listens on a unix
 * socket <TMPDIR>/trainrun-<uid>/<pid>.sock and answers every connection
 * with a text snapshot of its job (run, round, nodes, and per rank: pid,
 * state, run time, step, loss, tokens/s, last heartbeat, last output line),
 * then closes it. tr_daemon_status_print asks every socket of the folder.
 * A daemon removes the sockets of killed daemons (whose pid is gone) when
 * it opens and closes its own.
 * --metrics-port serves the same figures over HTTP in Prometheus text
 * format; both read the workers' heartbeat pages (trainrun/heartbeat.h). */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/clock.h"
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

/* Remove the sockets of daemons that are gone (killed: nobody removed
 * theirs) from the folder; <pid>.sock names its daemon. */
static void prune_stale(const char* dir) {
  DIR* d = opendir(dir);
  if (!d) return;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    char* end;
    long pid = strtol(e->d_name, &end, 10);
    if (pid <= 0 || strcmp(end, ".sock") != 0) continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    unlink(p);
  }
  closedir(d);
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
  if (rc == 0) prune_stale(dir);
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
  if (path) {
    unlink(path);
    char* slash = strrchr(path, '/');
    if (slash) { /* and those of daemons killed meanwhile (another node's) */
      *slash = '\0';
      prune_stale(path);
    }
  }
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
  double now = tr__now();
  for (int i = 0; i < d->nworkers; i++) {
    const tr__worker_t* w = &d->workers[i];
    char state[96];
    if (!w->pid)
      snprintf(state, sizeof state, "not started");
    else if (w->running)
      snprintf(state, sizeof state, "running for %.1fs", now - w->started);
    else
      tr__daemon_describe_status(w->status, state, sizeof state);
    char beat[160] = "";
    if (w->hb_beats > 0) {
      const tr_heartbeat_slot_t* h = &w->hb;
      int n = snprintf(beat, sizeof beat, ", step %lld", (long long)h->step);
      if (h->total_steps > 0 && n > 0 && (size_t)n < sizeof beat)
        n += snprintf(beat + n, sizeof beat - (size_t)n, "/%lld",
                      (long long)h->total_steps);
      if (strcmp(h->phase, "step") != 0 && n > 0 && (size_t)n < sizeof beat)
        n += snprintf(beat + n, sizeof beat - (size_t)n, " (%s)", h->phase);
      if (isfinite(h->loss) && n > 0 && (size_t)n < sizeof beat)
        n +=
            snprintf(beat + n, sizeof beat - (size_t)n, ", loss %.4f", h->loss);
      if (n > 0 && (size_t)n < sizeof beat)
        snprintf(beat + n, sizeof beat - (size_t)n,
                 ", %.0f tokens/s, last heartbeat %.1fs ago", h->tokens_per_s,
                 now - w->hb_at);
    }
    const tr__tail_t* t = &w->tail;
    const char* last =
        t->count ? t->line[(t->next + TR__TAIL_LINES - 1) % TR__TAIL_LINES]
                 : "";
    fprintf(f, "  rank %d (local rank %d, pid %d): %s%s%s%s\n", w->rank,
            w->local_rank, (int)w->pid, state, beat, *last ? ": " : "", last);
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
  /* the request line: "status", or "fr ..." for the flight recorder
   * (daemon/fr.c); a client that sends nothing gets the status */
  char req[256] = "";
  struct pollfd pf = {c, POLLIN, 0};
  if (poll(&pf, 1, 100) > 0) {
    ssize_t got = recv(c, req, sizeof req - 1, MSG_DONTWAIT);
    req[got > 0 ? got : 0] = '\0';
  }
  if (strncmp(req, "fr ", 3) == 0) {
    tr__fr_serve(d, c, req);
    close(c);
    return;
  }
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
static int ask(const char* path, const char* req, FILE* out) {
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
  if (send(s, req, strlen(req), MSG_NOSIGNAL) < 0) {
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
  return tr_daemon_request("status\n", out, found);
}

int tr_daemon_request(const char* req, FILE* out, int* found) {
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
    int rc = ask(path, req, out);
    if (rc == TR_ECONNREFUSED || rc == TR_ENOENT)
      unlink(path); /* its daemon is gone */
    else if (rc == 0)
      n++;
  }
  closedir(dd);
  if (found) *found = n;
  return 0;
}

/* ---- heartbeats ---- */

void tr__heartbeat_poll(tr__daemon_t* d) {
  double now = tr__now();
  for (int i = 0; i < d->nworkers; i++) {
    tr__worker_t* w = &d->workers[i];
    tr_heartbeat_slot_t h;
    if (!w->hb_page || tr_heartbeat_read(w->hb_page, &h) < 0) continue;
    if (h.beats == w->hb_beats) continue;
    w->hb = h;
    w->hb_beats = h.beats;
    w->hb_at = now;
  }
}

/* ---- --metrics-port: Prometheus text format over HTTP ---- */

int tr__metrics_open(int port, int* fd, int* bound, tr_errmsg_t* err) {
  *fd = -1;
  *bound = 0;
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s < 0) {
    int rc = tr_err_from_errno();
    return tr_errmsg_set(err, rc, "--metrics-port %d: %s", port,
                         tr_strerror(rc));
  }
  int one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  sa.sin_port = htons((uint16_t)port);
  socklen_t len = sizeof sa;
  if (bind(s, (struct sockaddr*)&sa, sizeof sa) != 0 || listen(s, 16) != 0 ||
      getsockname(s, (struct sockaddr*)&sa, &len) != 0) {
    int rc = tr_err_from_errno();
    close(s);
    return tr_errmsg_set(err, rc, "--metrics-port %d: cannot listen: %s", port,
                         tr_strerror(rc));
  }
  *fd = s;
  *bound = ntohs(sa.sin_port);
  return 0;
}

/* A label value with \, " and newlines escaped. */
static void label(FILE* f, const char* v) {
  for (; *v; v++) {
    if (*v == '\\' || *v == '"')
      fprintf(f, "\\%c", *v);
    else if (*v == '\n')
      fputs("\\n", f);
    else
      fputc(*v, f);
  }
}

static void value(FILE* f, double v) {
  if (isnan(v))
    fputs("NaN", f);
  else if (isinf(v))
    fputs(v > 0 ? "+Inf" : "-Inf", f);
  else
    fprintf(f, "%.17g", v);
}

static void family(FILE* f, const char* name, const char* type,
                   const char* help) {
  fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One sample of a job-wide metric. */
static void job_sample(FILE* f, const tr__daemon_t* d, const char* name,
                       double v) {
  fprintf(f, "%s{run_id=\"", name);
  label(f, d->o->run_id);
  fprintf(f, "\",node=\"%d\"} ", d->in_round ? d->rdzv.node_rank : -1);
  value(f, v);
  fputc('\n', f);
}

char* tr__metrics_text(const tr__daemon_t* d) {
  char* buf = NULL;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  if (!f) return NULL;
  const tr__rdzv_t* r = &d->rdzv;
  family(f, "trainrun_round", "gauge",
         "Rendezvous round of the job (0 for the first).");
  job_sample(f, d, "trainrun_round", d->in_round ? r->round : -1);
  family(f, "trainrun_restarts", "gauge",
         "Rounds that ended in a failure so far.");
  job_sample(f, d, "trainrun_restarts", d->failures);
  family(f, "trainrun_nodes", "gauge", "Nodes in the current round.");
  job_sample(f, d, "trainrun_nodes", d->in_round ? r->nnodes : 0);
  family(f, "trainrun_world_size", "gauge", "Ranks in the current round.");
  job_sample(f, d, "trainrun_world_size", d->in_round ? r->world_size : 0);

  static const struct {
    const char *name, *type, *help;
  } fam[] = {
      {"trainrun_rank_up", "gauge", "1 while the rank's process runs."},
      {"trainrun_rank_step", "gauge", "Optimizer steps the rank finished."},
      {"trainrun_rank_total_steps", "gauge", "Steps the run trains."},
      {"trainrun_rank_loss", "gauge", "Loss of the rank's last step."},
      {"trainrun_rank_tokens_per_second", "gauge",
       "Tokens per second of the rank's last step."},
      {"trainrun_rank_heartbeats_total", "counter",
       "Heartbeats the rank sent."},
      {"trainrun_rank_last_heartbeat_age_seconds", "gauge",
       "Seconds since the rank's last heartbeat."},
      {"trainrun_rank_last_heartbeat_timestamp_seconds", "gauge",
       "Unix time of the rank's last heartbeat."},
  };
  double now = tr__now();
  for (size_t k = 0; k < sizeof fam / sizeof fam[0]; k++) {
    family(f, fam[k].name, fam[k].type, fam[k].help);
    for (int i = 0; i < d->nworkers; i++) {
      const tr__worker_t* w = &d->workers[i];
      const tr_heartbeat_slot_t* h = &w->hb;
      int beat = w->hb_beats > 0;
      double v;
      switch (k) {
        case 0:
          v = w->running;
          break;
        case 1:
          v = beat ? (double)h->step : NAN;
          break;
        case 2:
          v = beat ? (double)h->total_steps : NAN;
          break;
        case 3:
          v = beat ? h->loss : NAN;
          break;
        case 4:
          v = beat ? h->tokens_per_s : NAN;
          break;
        case 5:
          v = (double)w->hb_beats;
          break;
        case 6:
          v = beat ? now - w->hb_at : NAN;
          break;
        default:
          v = beat ? h->time : NAN;
          break;
      }
      fprintf(f, "%s{run_id=\"", fam[k].name);
      label(f, d->o->run_id);
      fprintf(f, "\",node=\"%d\",rank=\"%d\",local_rank=\"%d\"} ",
              d->rdzv.node_rank, w->rank, w->local_rank);
      value(f, v);
      fputc('\n', f);
    }
  }
  fclose(f);
  return buf;
}

static void send_all(int c, const char* s, size_t n) {
  size_t off = 0;
  while (off < n) {
    ssize_t w = send(c, s + off, n - off, MSG_NOSIGNAL);
    if (w <= 0) return;
    off += (size_t)w;
  }
}

void tr__metrics_serve(int fd, const tr__daemon_t* d) {
  int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
  if (c < 0) return;
  /* a client that sends slowly or reads nothing cannot hold the daemon up */
  struct timeval tv = {0, 200000};
  setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  char req[2048];
  size_t n = 0;
  while (n < sizeof req - 1) {
    ssize_t r = recv(c, req + n, sizeof req - 1 - n, 0);
    if (r <= 0) break;
    n += (size_t)r;
    req[n] = '\0';
    if (strstr(req, "\r\n\r\n") || strstr(req, "\n\n")) break;
  }
  req[n] = '\0';
  int head = strncmp(req, "HEAD ", 5) == 0;
  const char* path = head                           ? req + 5
                     : strncmp(req, "GET ", 4) == 0 ? req + 4
                                                    : NULL;
  size_t pl = path ? strcspn(path, " ?\r\n") : 0;
  int ok = path && ((pl == 8 && memcmp(path, "/metrics", 8) == 0) ||
                    (pl == 1 && path[0] == '/'));
  char* body = ok ? tr__metrics_text(d) : NULL;
  const char* msg = "not found: ask GET /metrics\n";
  const char* b = body ? body : msg;
  char hdr[256];
  int hl = snprintf(hdr, sizeof hdr,
                    "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: "
                    "%zu\r\nConnection: close\r\n\r\n",
                    body ? "200 OK"
                    : ok ? "500 Internal Server Error"
                         : "404 Not Found",
                    body ? "text/plain; version=0.0.4; charset=utf-8"
                         : "text/plain; charset=utf-8",
                    strlen(b));
  send_all(c, hdr, (size_t)hl);
  if (!head) send_all(c, b, strlen(b));
  free(body);
  close(c);
}
