/* trainrun/errmsg.h: an error code together with a message for the user.
 *
 * Functions that read input from outside (data files, safetensors, job
 * files) return a negative TR_E* code and, when the caller passes a
 * tr_errmsg_t, a message that names where the bad input came from, in
 * Git's style: lowercase, what failed first, the subject in quotes, no
 * final period:
 *
 *     'data/train_000000.bin': bad magic 1234 at byte offset 0 (expected
 *     20240520 or 20240801)
 *
 * Only the CLI layer prints it. A NULL tr_errmsg_t* is accepted everywhere
 * and means "the caller only wants the code".
 */
#ifndef TRAINRUN_ERRMSG_H
#define TRAINRUN_ERRMSG_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int code;          /* the TR_E* code of the last failure; 0 when none */
  char message[640]; /* NUL-terminated; "" when none */
} tr_errmsg_t;

/* Clear err (may be NULL). */
void tr_errmsg_clear(tr_errmsg_t* err);

/* Record code and the formatted message in err (may be NULL) and return
 * code, so a failing function can `return tr_errmsg_set(err, rc, ...)`.
 * Messages longer than the buffer are cut. */
int tr_errmsg_set(tr_errmsg_t* err, int code, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefix the message already in err with "prefix: " (for a caller adding
 * context); returns err->code, or code when err is NULL. */
int tr_errmsg_prefix(tr_errmsg_t* err, int code, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_ERRMSG_H */
