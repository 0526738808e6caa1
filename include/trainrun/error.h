/* trainrun/error.h: error codes shared by every module.
 *
 * Every function that can fail returns int: 0 on success, a negative TR_E*
 * code on failure. Codes that mirror a system error equal the negated errno
 * (a failing system call returns -errno as is); codes of trainrun's own are
 * below -4000. One X-macro list generates the enum, tr_strerror() and
 * tr_err_name(), so the three cannot drift (libuv's UV_ERRNO_MAP).
 */
#ifndef TRAINRUN_ERROR_H
#define TRAINRUN_ERROR_H

#include <errno.h>

#ifdef __cplusplus
extern "C" {
#endif

/* XX(name, value, message) */
#define TR_ERRNO_MAP(XX)                                                   \
  XX(EPERM, -EPERM, "operation not permitted")                             \
  XX(ENOENT, -ENOENT, "no such file or directory")                         \
  XX(EINTR, -EINTR, "interrupted system call")                             \
  XX(EIO, -EIO, "i/o error")                                               \
  XX(EBADF, -EBADF, "bad file descriptor")                                 \
  XX(EAGAIN, -EAGAIN, "resource temporarily unavailable")                  \
  XX(ENOMEM, -ENOMEM, "not enough memory")                                 \
  XX(EACCES, -EACCES, "permission denied")                                 \
  XX(EEXIST, -EEXIST, "file already exists")                               \
  XX(ENOTDIR, -ENOTDIR, "not a directory")                                 \
  XX(EISDIR, -EISDIR, "is a directory")                                    \
  XX(EINVAL, -EINVAL, "invalid argument")                                  \
  XX(EMFILE, -EMFILE, "too many open files")                               \
  XX(ENOSPC, -ENOSPC, "no space left on device")                           \
  XX(EPIPE, -EPIPE, "broken pipe")                                         \
  XX(ERANGE, -ERANGE, "result out of range")                               \
  XX(ENAMETOOLONG, -ENAMETOOLONG, "name too long")                         \
  XX(ENOSYS, -ENOSYS, "function not implemented")                          \
  XX(EPROTO, -EPROTO, "protocol error")                                    \
  XX(EMSGSIZE, -EMSGSIZE, "message too long")                              \
  XX(EADDRINUSE, -EADDRINUSE, "address already in use")                    \
  XX(ENETUNREACH, -ENETUNREACH, "network is unreachable")                  \
  XX(ECONNABORTED, -ECONNABORTED, "connection aborted")                    \
  XX(ECONNRESET, -ECONNRESET, "connection reset by peer")                  \
  XX(ETIMEDOUT, -ETIMEDOUT, "timed out")                                   \
  XX(ECONNREFUSED, -ECONNREFUSED, "connection refused")                    \
  XX(EHOSTUNREACH, -EHOSTUNREACH, "host is unreachable")                   \
  XX(ECANCELED, -ECANCELED, "operation canceled")                          \
  XX(EPARSE, -4001, "parse error")                                         \
  XX(ECONFIG, -4002, "invalid configuration")                              \
  XX(EFORMAT, -4003, "bad file format")                                    \
  XX(ECHECKSUM, -4004, "checksum mismatch")                                \
  XX(EUNSUPPORTED, -4005, "not supported by this build")                   \
  XX(ENOTFOUND, -4006, "not found")                                        \
  XX(ELIMIT, -4007, "limit exceeded")                                      \
  XX(ECLOSED, -4008, "connection closed")                                  \
  XX(ECUDA, -4009, "CUDA error")                                           \
  XX(ENCCL, -4010, "NCCL error")                                           \
  XX(EMPI, -4011, "MPI error")                                             \
  XX(EGLOO, -4012, "Gloo error")                                           \
  XX(EABORTED, -4013, "aborted by another rank")                           \
  XX(ESHAPE, -4014, "shape mismatch")                                      \
  XX(EDTYPE, -4015, "unsupported dtype")                                   \
  XX(EDEVICE, -4016, "unsupported device")                                 \
  XX(EAUTH, -4017, "authentication failed")                                \
  XX(EINTERNAL, -4018, "internal error")

typedef enum {
#define TR__ERR_ENUM(name, value, msg) TR_##name = (value),
  TR_ERRNO_MAP(TR__ERR_ENUM)
#undef TR__ERR_ENUM
  TR_OK = 0
} tr_errno_t;

/* Message for a code: "timed out". Unknown negative codes in errno range
 * fall back to the C library's text; never returns NULL. Thread-safe. */
const char* tr_strerror(int err);

/* Symbolic name for a code: "ETIMEDOUT", "EPARSE"; "UNKNOWN" when unknown. */
const char* tr_err_name(int err);

/* Negated errno of the calling thread (never 0: EIO when errno is unset). */
int tr_err_from_errno(void);

/* The check macros (STYLE.md): the jump is visible at the call site. */
#define TR_CHECK(call)               \
  do {                               \
    int tr__rc = (call);             \
    if (tr__rc < 0) return tr__rc;   \
  } while (0)

#define TR_CHECK_GOTO(call, rc, label) \
  do {                                 \
    (rc) = (call);                     \
    if ((rc) < 0) goto label;          \
  } while (0)

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_ERROR_H */
