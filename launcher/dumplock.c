/* launcher/dumplock.c: the dump folder's lock, so that two jobs never
 * write one folder (checkpoints overwritten, metrics interleaved, one job
 * removing the other's step folders).
 *
 * <dump_folder>/trainrun.lock holds, one "name value" line each, the owner's
 * host, pid, the pid's start time (clock ticks since boot, field 22 of
 * /proc/PID/stat: a pid reused later is not the owner), the wall-clock
 * start, the run id and the rendezvous endpoint ("-": a private store). It
 * is written under a temporary name and linked into place, so a reader never
 * sees half of it, and the link fails when another lock exists. Then:
 *
 *   - the owner is this job (same run id and same endpoint: another node's
 *     daemon sharing the folder on a shared file system): go on, not owning
 *     it;
 *   - the owner's process is gone (same host, pid dead or started at another
 *     time): a stale lock, taken over with a warning naming it;
 *   - else the folder is in use: refused, naming the job that holds it.
 *
 * The owner removes the file when the job ends. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "launcher/launch.h"
#include "trainrun/error.h"
#include "trainrun/log.h"

#define LOCK_NAME "trainrun.lock"

typedef struct {
  char host[256];
  long pid;
  unsigned long long pid_start;
  char started[64];
  char run[256];
  char endpoint[300];
} lockinfo_t;

/* Start time of pid in clock ticks since boot; 0 when it is not running. */
static unsigned long long start_ticks(long pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  const char* p = strrchr(buf, ')'); /* the command may hold spaces */
  if (!p) return 0;
  /* fields 3.. follow; the start time is field 22 */
  for (int field = 2; field < 22 && p; field++) p = strchr(p + 1, ' ');
  return p ? strtoull(p + 1, NULL, 10) : 0;
}

static int parse(const char* text, lockinfo_t* li) {
  memset(li, 0, sizeof *li);
  int seen = 0;
  for (const char* p = text; *p;) {
    size_t n = strcspn(p, "\n");
    char line[400];
    snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line ? n : 0), p);
    char* v = strchr(line, ' ');
    if (v) {
      *v++ = '\0';
      if (strcmp(line, "host") == 0) {
        snprintf(li->host, sizeof li->host, "%s", v);
        seen |= 1;
      } else if (strcmp(line, "pid") == 0) {
        li->pid = strtol(v, NULL, 10);
        seen |= 2;
      } else if (strcmp(line, "pid_start") == 0)
        li->pid_start = strtoull(v, NULL, 10);
      else if (strcmp(line, "started") == 0)
        snprintf(li->started, sizeof li->started, "%s", v);
      else if (strcmp(line, "run") == 0)
        snprintf(li->run, sizeof li->run, "%s", v);
      else if (strcmp(line, "endpoint") == 0)
        snprintf(li->endpoint, sizeof li->endpoint, "%s", v);
    }
    p += n;
    if (*p) p++;
  }
  return seen == 3 && li->pid > 0 ? 0 : -1;
}

/* The lock at path: 0 with *li, TR_ENOENT when there is none, TR_EFORMAT
 * when it does not parse. */
static int read_lock(const char* path, lockinfo_t* li) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return tr_err_from_errno();
  char buf[2048];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n < 0) return tr_err_from_errno();
  buf[n] = '\0';
  return parse(buf, li) == 0 ? 0 : TR_EFORMAT;
}

/* Write our lock under a temporary name in dir: its path (malloc()ed). */
static int write_temp(const char* dir, const lockinfo_t* me, char** tmp,
                      tr_errmsg_t* err) {
  size_t cap = strlen(dir) + 40;
  *tmp = malloc(cap);
  if (!*tmp) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  snprintf(*tmp, cap, "%s/." LOCK_NAME ".XXXXXX", dir);
  int fd = mkstemp(*tmp);
  if (fd < 0) {
    int rc = tr_err_from_errno();
    tr_errmsg_set(err, rc, "cannot write in '%s': %s", dir, tr_strerror(rc));
    free(*tmp);
    *tmp = NULL;
    return rc;
  }
  char text[1200];
  int n = snprintf(text, sizeof text,
                   "host %s\npid %ld\npid_start %llu\nstarted %s\nrun %s\n"
                   "endpoint %s\n",
                   me->host, me->pid, me->pid_start, me->started, me->run,
                   me->endpoint);
  int rc = write(fd, text, (size_t)n) == n && fsync(fd) == 0
               ? 0
               : tr_err_from_errno();
  close(fd);
  if (rc < 0) {
    tr_errmsg_set(err, rc, "cannot write '%s': %s", *tmp, tr_strerror(rc));
    unlink(*tmp);
    free(*tmp);
    *tmp = NULL;
  }
  return rc;
}

/* Is the owner's process gone? Only known on its own host. */
static int stale(const lockinfo_t* li, const char* host) {
  if (strcmp(li->host, host) != 0) return 0;
  unsigned long long t = start_ticks(li->pid);
  return t == 0 || (li->pid_start && t != li->pid_start);
}

int tr__dumplock_acquire(tr__dumplock_t* l, const char* dump,
                         const char* run_id, const char* endpoint,
                         tr_errmsg_t* err) {
  memset(l, 0, sizeof *l);
  lockinfo_t me;
  memset(&me, 0, sizeof me);
  if (gethostname(me.host, sizeof me.host - 1) != 0) strcpy(me.host, "?");
  me.pid = (long)getpid();
  me.pid_start = start_ticks(me.pid);
  time_t now = time(NULL);
  struct tm tmv;
  gmtime_r(&now, &tmv);
  strftime(me.started, sizeof me.started, "%Y-%m-%dT%H:%M:%SZ", &tmv);
  snprintf(me.run, sizeof me.run, "%s", run_id && *run_id ? run_id : "-");
  snprintf(me.endpoint, sizeof me.endpoint, "%s",
           endpoint && *endpoint ? endpoint : "-");

  size_t cap = strlen(dump) + sizeof LOCK_NAME + 2;
  char* path = malloc(cap);
  if (!path) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  snprintf(path, cap, "%s/" LOCK_NAME, dump);
  char* tmp = NULL;
  int rc = write_temp(dump, &me, &tmp, err);
  for (int tries = 0; rc == 0; tries++) {
    if (link(tmp, path) == 0) {
      l->path = path;
      path = NULL;
      break;
    }
    if (errno != EEXIST) {
      rc = tr_err_from_errno();
      tr_errmsg_set(err, rc, "cannot create '%s': %s", path, tr_strerror(rc));
      break;
    }
    lockinfo_t li;
    int lrc = read_lock(path, &li);
    if (lrc == TR_ENOENT && tries < 8) continue; /* its owner just left */
    if (lrc == 0 && strcmp(li.run, me.run) == 0 &&
        strcmp(li.endpoint, me.endpoint) == 0 && strcmp(me.endpoint, "-")) {
      break; /* this job's lock, taken by another node's daemon */
    }
    if (lrc == 0 && stale(&li, me.host) && tries < 8) {
      TR_LOG_WARN(LAUNCH,
                  "taking over the lock of '%s': its owner, pid %ld (since "
                  "%s), is gone",
                  dump, li.pid, li.started);
      /* replace it with ours in one step, then look again: two jobs that
       * took it over at once see which one won */
      if (rename(tmp, path) != 0) {
        rc = tr_err_from_errno();
        tr_errmsg_set(err, rc, "cannot replace '%s': %s", path,
                      tr_strerror(rc));
        break;
      }
      free(tmp);
      tmp = NULL;
      lockinfo_t got;
      if (read_lock(path, &got) == 0 && got.pid == me.pid &&
          strcmp(got.host, me.host) == 0) {
        l->path = path;
        path = NULL;
        break;
      }
      rc = write_temp(dump, &me, &tmp, err);
      continue;
    }
    char run[300] = "";
    if (lrc == 0 && strcmp(li.run, "-") != 0)
      snprintf(run, sizeof run, ", run '%s'", li.run);
    if (lrc == 0)
      rc = tr_errmsg_set(err, TR_EEXIST,
                         "the dump folder '%s' is in use by another job (pid "
                         "%ld on host '%s' since %s%s): give this job another "
                         "job.dump_folder, or remove '%s' if that job is gone",
                         dump, li.pid, li.host, li.started, run, path);
    else
      rc = tr_errmsg_set(err, TR_EEXIST,
                         "the dump folder '%s' holds a lock '%s' that does "
                         "not parse: remove it if no job uses the folder",
                         dump, path);
  }
  if (tmp) {
    unlink(tmp);
    free(tmp);
  }
  free(path);
  return rc;
}

void tr__dumplock_release(tr__dumplock_t* l) {
  if (!l->path) return;
  /* only our own: a lock taken over after a long stop is the new owner's */
  lockinfo_t li;
  if (read_lock(l->path, &li) == 0 && li.pid == (long)getpid()) unlink(l->path);
  free(l->path);
  l->path = NULL;
}
