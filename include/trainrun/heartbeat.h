/* trainrun/heartbeat.h: a worker's heartbeat to its node daemon -- one
 * page of shared memory per worker that the rank rewrites as it goes (phase,
 * step, loss, tokens/s, time) and the daemon reads without a system call.
 *
 * The daemon (daemon/supervise.c) creates the page (memfd) before it spawns
 * a worker and names its descriptor in TRAINRUN_HEARTBEAT_FD; the trainer
 * beats with tr_heartbeat_beat, which maps the page on its first call and
 * does nothing in a process the daemon did not start. A worker that has
 * beaten once and then stops for --worker-timeout seconds fails the round
 * like a crash; `trainrun status` and --metrics-port show the last beat of
 * every rank.
 *
 * Writer (a rank):
 *
 *   tr_heartbeat_beat("step", step, loss, tokens_per_s);
 *
 * Reader (the daemon):
 *
 *   int fd = tr_heartbeat_create(&page);      // before the spawn
 *   ... TRAINRUN_HEARTBEAT_FD=fd in the worker's environment ...
 *   tr_heartbeat_slot_t s;
 *   if (tr_heartbeat_read(page, &s) == 0 && s.beats > 0) ... s.step ...
 *   tr_heartbeat_destroy(page, fd);
 */
#ifndef TRAINRUN_HEARTBEAT_H
#define TRAINRUN_HEARTBEAT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TR_HEARTBEAT_MAGIC 0x54524842u /* "TRHB" */
#define TR_HEARTBEAT_VERSION 1u

/* What a beat says (a copy, as tr_heartbeat_read returns it). */
typedef struct {
  uint32_t magic, version;
  uint64_t seq;        /* odd while the rank writes (a seqlock) */
  int64_t beats;       /* beats so far; 0: the rank never beat */
  int64_t step;        /* optimizer steps done */
  int64_t total_steps; /* training.steps */
  double loss;         /* of the last step (NaN before the first) */
  double tokens_per_s; /* this rank's, of the last step */
  double time;         /* CLOCK_REALTIME seconds of the beat */
  double mono;         /* CLOCK_MONOTONIC seconds of the beat */
  int32_t pid;
  char phase[20]; /* "init", "step", "done" ... NUL-terminated */
} tr_heartbeat_slot_t;

/* ---- the rank's side ---- */

/* Set how many steps the run has (shown with the step). */
void tr_heartbeat_set_total(int64_t total_steps);

/* Beat: `phase` (cut to 19 bytes), steps done, the last step's loss and
 * tokens/s. A no-op without TRAINRUN_HEARTBEAT_FD (or when the descriptor
 * cannot be mapped: logged once). Async-signal-unsafe; cheap (no system
 * call after the first). */
void tr_heartbeat_beat(const char* phase, int64_t step, double loss,
                       double tokens_per_s);

/* Beat with a new phase, the step and figures kept ("sync": entering the
 * gradient collectives, where a rank waits for its peers). */
void tr_heartbeat_phase(const char* phase);

/* ---- the daemon's side ---- */

/* A zeroed page in a new memfd (close-on-exec; the spawner clears that in
 * the child): *page is its mapping. Returns the fd or a negative TR_E*. */
int tr_heartbeat_create(void** page);

/* Copy a consistent snapshot of page into *out: 0, or TR_EAGAIN when the
 * rank kept writing (try later), TR_EINVAL when the page holds no beat
 * layout (wrong magic or version). */
int tr_heartbeat_read(const void* page, tr_heartbeat_slot_t* out);

/* Unmap and close (NULL page / fd < 0 are skipped). */
void tr_heartbeat_destroy(void* page, int fd);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_HEARTBEAT_H */
