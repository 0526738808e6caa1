/* trainer/heartbeat.c: a worker's heartbeat page -- the rank writes it
 * under a seqlock, the daemon copies it out (trainrun/heartbeat.h). */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/clock.h"
#include "trainrun/error.h"
#include "trainrun/heartbeat.h"
#include "trainrun/log.h"
#include "trainrun/param.h"

enum { PAGE = 4096 };

_Static_assert(sizeof(tr_heartbeat_slot_t) <= PAGE, "slot fits a page");

/* ---- the rank's side ---- */

static tr_heartbeat_slot_t* mine; /* NULL: not mapped (yet) */
static int tried;
static int64_t total;

void tr_heartbeat_set_total(int64_t total_steps) { total = total_steps; }

static tr_heartbeat_slot_t* map_mine(void) {
  if (tried) return mine;
  tried = 1;
  int fd = (int)tr_param_int(TR_PARAM_HEARTBEAT_FD);
  if (fd < 0) return NULL;
  void* p = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    TR_LOG_WARN(TRAIN, "cannot map the heartbeat page (fd %d): %s", fd,
                strerror(errno));
    return NULL;
  }
  close(fd); /* the mapping keeps the page */
  mine = p;
  mine->magic = TR_HEARTBEAT_MAGIC;
  mine->version = TR_HEARTBEAT_VERSION;
  mine->pid = (int32_t)getpid();
  return mine;
}

void tr_heartbeat_beat(const char* phase, int64_t step, double loss,
                       double tokens_per_s) {
  tr_heartbeat_slot_t* s = map_mine();
  if (!s) return;
  __atomic_add_fetch(&s->seq, 1, __ATOMIC_ACQ_REL); /* odd: writing */
  s->beats++;
  s->step = step;
  s->total_steps = total;
  s->loss = loss;
  s->tokens_per_s = tokens_per_s;
  s->time = tr__wall();
  s->mono = tr__now();
  snprintf(s->phase, sizeof s->phase, "%s", phase);
  __atomic_add_fetch(&s->seq, 1, __ATOMIC_RELEASE); /* even: done */
}

void tr_heartbeat_phase(const char* phase) {
  tr_heartbeat_slot_t* s = map_mine();
  if (!s) return;
  tr_heartbeat_beat(phase, s->step, s->loss, s->tokens_per_s);
}

/* ---- the daemon's side ---- */

int tr_heartbeat_create(void** page) {
  *page = NULL;
  int fd = memfd_create("trainrun-heartbeat", MFD_CLOEXEC);
  if (fd < 0) return tr_err_from_errno();
  if (ftruncate(fd, PAGE) != 0) {
    int rc = tr_err_from_errno();
    close(fd);
    return rc;
  }
  void* p = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int rc = tr_err_from_errno();
    close(fd);
    return rc;
  }
  *page = p;
  return fd;
}

int tr_heartbeat_read(const void* page, tr_heartbeat_slot_t* out) {
  const tr_heartbeat_slot_t* s = page;
  for (int tries = 0; tries < 100; tries++) {
    uint64_t a = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
    if (a & 1) continue;
    memcpy(out, (const void*)s, sizeof *out);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    uint64_t b = __atomic_load_n(&s->seq, __ATOMIC_RELAXED);
    if (a != b) continue;
    if (out->beats == 0) return 0; /* never written: all zero */
    if (out->magic != TR_HEARTBEAT_MAGIC ||
        out->version != TR_HEARTBEAT_VERSION)
      return TR_EINVAL;
    out->phase[sizeof out->phase - 1] = '\0';
    return 0;
  }
  return TR_EAGAIN;
}

void tr_heartbeat_destroy(void* page, int fd) {
  if (page) munmap(page, PAGE);
  if (fd >= 0) close(fd);
}
