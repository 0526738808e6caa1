/* launcher/cmd_fr_live.c: the flight-recorder commands that talk to the
 * running job through the node daemons' status sockets (daemon/fr.c):
 *
 *   trainrun fr dump     every daemon dumps its workers' rings now
 *   trainrun fr follow   a live line per collective completed across the
 *                        local ranks (duration, slowest rank), and a
 *                        "waiting" line for an op some ranks are stuck in
 *
 * follow polls "fr tail N" (the last N entries of every ring, one
 * tab-separated line each) and merges the ranks' entries by process group
 * and sequence number. It reads the rings, not the workers, so it goes on
 * showing a rank that hangs. */
#include "config.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/buf.h" /* TR_GROW */
#include "core/clock.h"
#include "launcher/commands.h"
#include "trainrun/daemon.h"
#include "trainrun/error.h"

int tr__fr_cmd_dump(int argc, char** argv) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      printf(
          "usage: trainrun fr dump\n\nEvery trainrun daemon of this user on "
          "this machine writes its workers'\nflight-recorder rings now, as "
          "PyTorch's dump (pickle) and a JSON twin,\nand prints the files. "
          "See trainrun-fr(1).\n");
      return 0;
    }
    fprintf(stderr, "trainrun: fr dump: unknown argument '%s'\n", argv[i]);
    return 2;
  }
  int found = 0;
  int rc = tr_daemon_request("fr dump\n", stdout, &found);
  if (rc < 0) {
    fprintf(stderr, "trainrun: fr dump: %s\n", tr_strerror(rc));
    return 1;
  }
  if (!found) {
    fprintf(stderr, "trainrun: no trainrun job runs on this machine\n");
    return 1;
  }
  return fflush(stdout) == 0 ? 0 : 1;
}

/* ---- follow ---- */

typedef struct {
  int rank;
  char pg[64], desc[64];
  int p2p;
  long long seq;
  char name[64], state[16];
  long long created, started, completed;
  char sizes[128];
} ent_t;

typedef struct {
  char pg[64], desc[64];
  int p2p;
  long long printed; /* highest sequence number shown */
  double waiting_shown;
  int init;
} stream_t;

typedef struct {
  int rank;
  char pg[64];
} member_t;

static int split_tabs(char* line, char** f, int max) {
  int n = 0;
  f[n++] = line;
  for (char* p = line; *p && n < max; p++)
    if (*p == '\t') {
      *p = '\0';
      f[n++] = p + 1;
    }
  return n;
}

static void clock_str(long long ns, char* buf, size_t cap) {
  time_t t = (time_t)(ns / 1000000000);
  struct tm tm;
  localtime_r(&t, &tm);
  snprintf(buf, cap, "%02d:%02d:%02d.%03d", tm.tm_hour, tm.tm_min, tm.tm_sec,
           (int)(ns / 1000000 % 1000));
}

static volatile sig_atomic_t follow_stop;
static void on_stop(int sig) {
  (void)sig;
  follow_stop = 1;
}

static void follow_usage(FILE* out) {
  fprintf(out,
          "usage: trainrun fr follow [--interval S] [--count N] [--last N]\n"
          "\n"
          "A live view of the collectives of the trainrun job running on "
          "this\nmachine, read from the workers' flight-recorder rings: one "
          "line per op\ncompleted on every local rank of its group (duration, "
          "slowest rank), and\na 'waiting' line for an op some ranks wait in "
          "for more than 2 s.\n"
          "  --interval S   poll period (default 0.5)\n"
          "  --count N      stop after N op lines (default: until Ctrl-C)\n"
          "  --last N       first show the last N completed ops of each group "
          "(default 5)\n"
          "See trainrun-fr(1).\n");
}

int tr__fr_cmd_follow(int argc, char** argv) {
  double interval = 0.5;
  long count = -1, last = 5;
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      follow_usage(stdout);
      return 0;
    }
    if (i + 1 < argc && strcmp(a, "--interval") == 0) {
      interval = atof(argv[++i]);
      if (interval < 0.01 || interval > 3600) {
        fprintf(stderr,
                "trainrun: fr follow: --interval: '%s' is out of "
                "range (0.01 to 3600)\n",
                argv[i]);
        return 2;
      }
    } else if (i + 1 < argc && strcmp(a, "--count") == 0) {
      count = strtol(argv[++i], NULL, 10);
    } else if (i + 1 < argc && strcmp(a, "--last") == 0) {
      last = strtol(argv[++i], NULL, 10);
      if (last < 0) last = 0;
    } else {
      fprintf(stderr, "trainrun: fr follow: unknown argument '%s'\n", a);
      follow_usage(stderr);
      return 2;
    }
  }
  struct sigaction sa, old_int, old_term;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop;
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  follow_stop = 0;

  stream_t* streams = NULL;
  int nstreams = 0, rc = 0, waiting_note = 0;
  size_t cstreams = 0;
  long shown = 0;
  while (!follow_stop && (count < 0 || shown < count)) {
    char* buf = NULL;
    size_t len = 0;
    FILE* f = open_memstream(&buf, &len);
    if (!f) {
      rc = 1;
      break;
    }
    int found = 0;
    int r = tr_daemon_request("fr tail 512\n", f, &found);
    fclose(f);
    if (r < 0 || !found) {
      free(buf);
      if (shown == 0 && nstreams == 0) {
        fprintf(stderr, "trainrun: no trainrun job runs on this machine\n");
        rc = 1;
      }
      break;
    }
    /* parse */
    ent_t* ents = NULL;
    size_t ne = 0, ce = 0;
    member_t* mem = NULL;
    size_t nm = 0, cm = 0;
    char* save = NULL;
    for (char* line = strtok_r(buf, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
      char* fl[16];
      int n = split_tabs(line, fl, 16);
      if (fl[0][0] == 'G' && n >= 6) {
        if (TR_GROW(mem, nm + 1, cm) < 0) continue;
        mem[nm].rank = atoi(fl[1]);
        snprintf(mem[nm].pg, sizeof mem[nm].pg, "%s", fl[2]);
        nm++;
      } else if (fl[0][0] == 'E' && n >= 13) {
        if (TR_GROW(ents, ne + 1, ce) < 0) continue;
        ent_t* e = &ents[ne++];
        e->rank = atoi(fl[1]);
        snprintf(e->pg, sizeof e->pg, "%s", fl[3]);
        snprintf(e->desc, sizeof e->desc, "%s", fl[4]);
        e->p2p = atoi(fl[5]);
        e->seq = atoll(fl[6]);
        snprintf(e->name, sizeof e->name, "%s", fl[7]);
        snprintf(e->state, sizeof e->state, "%s", fl[8]);
        e->created = atoll(fl[9]);
        e->started = atoll(fl[10]);
        e->completed = atoll(fl[11]);
        snprintf(e->sizes, sizeof e->sizes, "%s", fl[12]);
      }
    }
    free(buf);
    if (ne == 0 && !waiting_note) {
      fprintf(stderr, "trainrun: fr follow: no collectives recorded yet\n");
      waiting_note = 1;
    }
    /* streams: one per (group, p2p) */
    for (size_t i = 0; i < ne; i++) {
      int k;
      for (k = 0; k < nstreams; k++)
        if (streams[k].p2p == ents[i].p2p &&
            strcmp(streams[k].pg, ents[i].pg) == 0)
          break;
      if (k == nstreams) {
        if (TR_GROW(streams, (size_t)nstreams + 1, cstreams) < 0) break;
        memset(&streams[k], 0, sizeof *streams);
        snprintf(streams[k].pg, sizeof streams[k].pg, "%s", ents[i].pg);
        snprintf(streams[k].desc, sizeof streams[k].desc, "%s", ents[i].desc);
        streams[k].p2p = ents[i].p2p;
        nstreams++;
      }
    }
    double now = tr__wall();
    for (int k = 0; k < nstreams && (count < 0 || shown < count); k++) {
      stream_t* s = &streams[k];
      /* the members of the group here */
      int members[1024], nmem = 0;
      for (size_t m = 0; m < nm && nmem < 1024; m++)
        if (strcmp(mem[m].pg, s->pg) == 0) members[nmem++] = mem[m].rank;
      if (nmem == 0) continue;
      /* sequence numbers completed everywhere here, in order */
      long long lo = -1, hi = -1;
      for (size_t i = 0; i < ne; i++) {
        const ent_t* e = &ents[i];
        if (e->p2p != s->p2p || strcmp(e->pg, s->pg) != 0) continue;
        if (lo < 0 || e->seq < lo) lo = e->seq;
        if (e->seq > hi) hi = e->seq;
      }
      if (!s->init) {
        s->printed = hi - last;
        s->init = 1;
      }
      if (s->printed < lo - 1) s->printed = lo - 1; /* older are gone */
      for (long long q = s->printed + 1; q <= hi; q++) {
        int done = 0, seen = 0;
        long long min_c = 0, max_c = 0, max_end = 0;
        int slow = -1;
        const ent_t* first = NULL;
        for (int m = 0; m < nmem; m++) {
          const ent_t* found_e = NULL;
          for (size_t i = 0; i < ne; i++) {
            const ent_t* e = &ents[i];
            /* the last entry of a coalesced run carries its end */
            if (e->rank == members[m] && e->seq == q && e->p2p == s->p2p &&
                strcmp(e->pg, s->pg) == 0)
              found_e = e;
          }
          if (!found_e) continue;
          seen++;
          if (!first || found_e->rank < first->rank) first = found_e;
          if (strcmp(found_e->state, "completed") == 0) done++;
          if (!min_c || found_e->created < min_c) min_c = found_e->created;
          if (found_e->created >= max_c) {
            max_c = found_e->created;
            slow = found_e->rank;
          }
          if (found_e->completed > max_end) max_end = found_e->completed;
        }
        if (done == nmem) {
          char ts[32];
          clock_str(max_end, ts, sizeof ts);
          printf(
              "%s  pg %s (%s)  %s#%lld  %-24s %-18s ranks %d  %.3f ms  "
              "slowest rank %d (+%.3f ms)\n",
              ts, s->pg, s->desc, s->p2p ? "p2p " : "", q, first->name,
              first->sizes, nmem, (double)(max_end - min_c) / 1e6, slow,
              (double)(max_c - min_c) / 1e6);
          s->printed = q;
          if (count >= 0 && ++shown >= count) break;
          continue;
        }
        /* the oldest op not done everywhere: say who waits there */
        if (seen > 0 && now - (double)min_c / 1e9 >= 2.0 &&
            now - s->waiting_shown >= 5.0) {
          char in[256] = "", out[256] = "";
          size_t ni = 0, no = 0;
          for (int m = 0; m < nmem; m++) {
            int has = 0, comp = 0;
            for (size_t i = 0; i < ne; i++) {
              const ent_t* e = &ents[i];
              if (e->rank == members[m] && e->seq == q && e->p2p == s->p2p &&
                  strcmp(e->pg, s->pg) == 0) {
                has = 1;
                comp = strcmp(e->state, "completed") == 0;
              }
            }
            if (has && !comp && ni + 12 < sizeof in)
              ni += (size_t)snprintf(in + ni, sizeof in - ni, "%s%d",
                                     ni ? "," : "", members[m]);
            if (!has && no + 12 < sizeof out)
              no += (size_t)snprintf(out + no, sizeof out - no, "%s%d",
                                     no ? "," : "", members[m]);
          }
          printf(
              "WAITING  pg %s (%s)  %s#%lld  %s: rank%s %s in it for "
              "%.1fs%s%s%s\n",
              s->pg, s->desc, s->p2p ? "p2p " : "", q, first->name,
              strchr(in, ',') ? "s" : "", in[0] ? in : "-",
              now - (double)min_c / 1e9, no ? "; not entered by rank" : "",
              strchr(out, ',') ? "s " : (no ? " " : ""), out);
          s->waiting_shown = now;
        }
        break;
      }
    }
    fflush(stdout);
    free(ents);
    free(mem);
    if (count >= 0 && shown >= count) break;
    struct timespec ts = {(time_t)interval,
                          (long)((interval - (double)(time_t)interval) * 1e9)};
    while (!follow_stop && nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
  }
  free(streams);
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  return rc;
}
