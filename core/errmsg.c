/* core/errmsg.c: an error code with a message for the user
 * (trainrun/errmsg.h), shared by every layer that reads outside input. */
#include "config.h"

#include "trainrun/errmsg.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void tr_errmsg_clear(tr_errmsg_t* err) {
  if (!err) return;
  err->code = 0;
  err->message[0] = '\0';
}

int tr_errmsg_set(tr_errmsg_t* err, int code, const char* fmt, ...) {
  if (!err) return code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err->message, sizeof err->message, fmt, ap);
  va_end(ap);
  err->code = code;
  return code;
}

int tr_errmsg_prefix(tr_errmsg_t* err, int code, const char* fmt, ...) {
  if (!err) return code;
  char prefix[sizeof err->message];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  if (n < 0) n = 0;
  /* "prefix: old message", cut at the buffer's end */
  char old[sizeof err->message];
  memcpy(old, err->message, sizeof old);
  size_t cap = sizeof err->message, w = strnlen(prefix, cap - 1);
  memcpy(err->message, prefix, w);
  if (old[0]) {
    const char* parts[2] = {": ", old};
    for (int i = 0; i < 2; i++)
      for (const char* p = parts[i]; *p && w + 1 < cap; p++)
        err->message[w++] = *p;
  }
  err->message[w] = '\0';
  if (err->code == 0) err->code = code;
  return err->code;
}
