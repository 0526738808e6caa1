/* pipelining/internal.h: what the pipelining/ files share and the library
 * does not export: the text of a refusal (schedule.c) and the start and
 * end times of one rank's executed actions (stamps.c). */
#ifndef TRAINRUN_PIPELINING_INTERNAL_H
#define TRAINRUN_PIPELINING_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* fmt's text into err[errlen] (NULL or 0: none); returns rc. */
int tr__pp_fail(char* err, size_t errlen, int rc, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- stamps.c: the times of the executed actions, for
 * tr_pp_exec_t.times ---- */

typedef struct tr__pp_stamps tr__pp_stamps_t;

/* Stamps for n actions into times[2n] (start, end; seconds on the host's
 * monotonic clock; 0 for what is never marked). cuda: the times are the
 * compute stream's (events; the device is synchronized once here and once
 * in tr__pp_stamps_free). */
int tr__pp_stamps_new(tr__pp_stamps_t** out, double* times, int64_t n,
                      int cuda);
/* Action k starts (end 0) or ends (end 1) now, in stream order on CUDA.
 * A second mark of the same point is ignored on CUDA, and the host's
 * clock keeps the last one: mark each point once. NULL s: nothing. */
void tr__pp_stamps_mark(tr__pp_stamps_t* s, int64_t k, int end);
/* Whether that point has been marked (1 for a NULL s). */
int tr__pp_stamps_is_marked(const tr__pp_stamps_t* s, int64_t k, int end);
/* Fill the times (CUDA: waits for the device) and free s. */
int tr__pp_stamps_free(tr__pp_stamps_t* s);

#endif /* TRAINRUN_PIPELINING_INTERNAL_H */
