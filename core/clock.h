/* core/clock.h: the one clock of trainrun (not public).
 *
 * Durations, deadlines and timeouts are measured on CLOCK_MONOTONIC, which
 * does not jump when the wall clock is set: tr__now() in seconds, tr__now_ms()
 * and tr__now_ns() in milliseconds and nanoseconds (the same clock). Wall-clock time is used only
 * for what a person or another tool reads as a date (timestamps in dumps,
 * logs, TensorBoard events: tr__wall(), tr__wall_ns()) and for the absolute deadlines
 * that pthread_cond_timedwait and pthread_mutex_timedlock take, which are on
 * CLOCK_REALTIME unless a condition variable is set up otherwise
 * (tr__deadline_ms()).
 */
#ifndef CORE_CLOCK_H
#define CORE_CLOCK_H

#include <stdint.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Monotonic seconds since an arbitrary origin (boot). */
double tr__now(void);

/* Monotonic nanoseconds and milliseconds, same clock and origin as
 * tr__now(). */
int64_t tr__now_ns(void);
int64_t tr__now_ms(void);

/* CLOCK_REALTIME since the Unix epoch: seconds, nanoseconds. */
double tr__wall(void);
int64_t tr__wall_ns(void);

/* The CLOCK_REALTIME instant ms milliseconds from now, as the absolute
 * deadline pthread_cond_timedwait and pthread_mutex_timedlock take
 * (ms >= 0). */
struct timespec tr__deadline_ms(int64_t ms);

#ifdef __cplusplus
}
#endif
#endif /* CORE_CLOCK_H */
