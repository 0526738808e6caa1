/* core/error.c: tr_strerror() and tr_err_name() from TR_ERRNO_MAP. */
#include "config.h"

#include <errno.h>
#include <string.h>

#include "trainrun/error.h"

const char* tr_strerror(int err) {
  switch (err) {
    case 0:
      return "success";
#define TR__ERR_MSG(name, value, msg) \
  case (value):                       \
    return msg;
      TR_ERRNO_MAP(TR__ERR_MSG)
#undef TR__ERR_MSG
    default:
      break;
  }
  if (err < 0 && err > -4000) {
    /* strerror_r (GNU) may return a static string or fill the buffer. */
    static __thread char buf[128];
    return strerror_r(-err, buf, sizeof buf);
  }
  return "unknown error";
}

const char* tr_err_name(int err) {
  switch (err) {
    case 0:
      return "OK";
#define TR__ERR_NAME(name, value, msg) \
  case (value):                        \
    return #name;
      TR_ERRNO_MAP(TR__ERR_NAME)
#undef TR__ERR_NAME
    default:
      return "UNKNOWN";
  }
}

int tr_err_from_errno(void) { return errno > 0 ? -errno : TR_EIO; }
