/* store/proto.c: the TCPStore request parser, the wire encoding of replies
 * and requests, and the limits.
 *
 * A request is one command byte followed by the command's fields (see
 * ../shared/reference/tcpstore.md, and man trainrun-store(1)): u32, i64,
 * strings (u64 length + bytes), a u64 count followed by count strings or
 * count key/value pairs. The parser is a resumable state machine over a
 * contiguous buffer holding the request received so far: it remembers the
 * field it stopped at, so a request split across any number of reads is
 * examined once, and it checks every length prefix against the limits
 * before anything is buffered or allocated for it.
 */
#include "config.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "store/internal.h"
#include "trainrun/error.h"
#include "trainrun/param.h"

/* ---- wire encoding ---- */

int tr__store_put_u8(tr__buf_t* b, uint8_t v) { return tr__buf_add(b, &v, 1); }

int tr__store_put_u32(tr__buf_t* b, uint32_t v) {
  uint8_t w[4];
  tr__wr_u32(w, v);
  return tr__buf_add(b, w, 4);
}

int tr__store_put_u64(tr__buf_t* b, uint64_t v) {
  uint8_t w[8];
  tr__wr_u64(w, v);
  return tr__buf_add(b, w, 8);
}

int tr__store_put_bytes(tr__buf_t* b, const void* p, size_t n) {
  TR_CHECK(tr__buf_grow(b, 8 + n));
  tr__store_put_u64(b, n);
  return tr__buf_add(b, p, n);
}

/* ---- limits ---- */

void tr__store_limits_from_params(tr__store_limits_t* lim) {
  lim->max_key = (uint64_t)tr_param_int(TR_PARAM_STORE_MAX_KEY);
  lim->max_value = (uint64_t)tr_param_int(TR_PARAM_STORE_MAX_VALUE);
  lim->max_keys = (uint64_t)tr_param_int(TR_PARAM_STORE_MAX_KEYS);
  lim->max_request = (uint64_t)tr_param_int(TR_PARAM_STORE_MAX_REQUEST);
  lim->max_memory = (uint64_t)tr_param_int(TR_PARAM_STORE_MAX_MEMORY);
}

/* ---- command table ---- */

/* Field kinds: u32, i64, a 64-byte blob, a key, a value, the count, count
 * keys, count key/value pairs. */
#define F_U32 'u'
#define F_I64 'i'
#define F_BLOB 'h'
#define F_KEY 'k'
#define F_VAL 'v'
#define F_COUNT 'n'
#define F_KEYS 'K'
#define F_PAIRS 'P'

typedef struct {
  const char* name;
  const char* fields; /* NULL: not a command */
} cmd_def_t;

static const cmd_def_t cmds[] = {
    [TR__Q_VALIDATE] = {"VALIDATE", "u"},
    [TR__Q_SET] = {"SET", "kv"},
    [TR__Q_COMPARE_SET] = {"COMPARE_SET", "kvv"},
    [TR__Q_GET] = {"GET", "k"},
    [TR__Q_ADD] = {"ADD", "ki"},
    [TR__Q_CHECK] = {"CHECK", "nK"},
    [TR__Q_WAIT] = {"WAIT", "nK"},
    [TR__Q_GETNUMKEYS] = {"GETNUMKEYS", ""},
    [TR__Q_DELETE_KEY] = {"DELETE_KEY", "k"},
    [TR__Q_APPEND] = {"APPEND", "kv"},
    [TR__Q_MULTI_GET] = {"MULTI_GET", "nK"},
    [TR__Q_MULTI_SET] = {"MULTI_SET", "nP"},
    [TR__Q_CANCEL_WAIT] = {"CANCEL_WAIT", ""},
    [TR__Q_PING] = {"PING", "u"},
    [TR__Q_QUEUE_PUSH] = {"QUEUE_PUSH", "kv"},
    [TR__Q_QUEUE_POP] = {"QUEUE_POP", "k"},
    [TR__Q_QUEUE_LEN] = {"QUEUE_LEN", "k"},
    [TR__Q_AUTH_HELLO] = {"AUTH_HELLO", ""},
    [TR__Q_AUTH_PROVE] = {"AUTH_PROVE", "h"},
};

static const cmd_def_t* cmd_def(unsigned cmd) {
  if (cmd >= sizeof cmds / sizeof cmds[0] || !cmds[cmd].fields) return NULL;
  return &cmds[cmd];
}

const char* tr__store_cmd_name(unsigned cmd, char buf[8]) {
  const cmd_def_t* d = cmd_def(cmd);
  if (d) return d->name;
  snprintf(buf, 8, "0x%02x", cmd & 0xffu);
  return buf;
}

/* ---- the parser ---- */

static int fail(tr__store_parser_t* ps, int code, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(tr__store_parser_t* ps, int code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ps->err, sizeof ps->err, fmt, ap);
  va_end(ap);
  ps->err_off = ps->pos;
  return code;
}

/* One length-prefixed string at ps->pos: 1 parsed, 0 need more, <0 error. */
static int parse_str(tr__store_parser_t* ps, size_t len, uint64_t max,
                     const char* what, const char* param,
                     const tr__store_limits_t* lim, const uint8_t* buf) {
  if (len - ps->pos < 8) {
    ps->need = ps->pos + 8;
    return 0;
  }
  uint64_t n = tr__rd_u64(buf + ps->pos);
  if (n > max)
    return fail(ps, TR_ELIMIT,
                "%s of %" PRIu64 " bytes exceeds the limit of %" PRIu64 " (%s)",
                what, n, max, param);
  if (n > lim->max_request || ps->pos + 8 > lim->max_request - n)
    return fail(ps, TR_ELIMIT,
                "request of more than %" PRIu64
                " bytes exceeds the limit (TRAINRUN_STORE_MAX_REQUEST_BYTES)",
                lim->max_request);
  size_t end = ps->pos + 8 + (size_t)n;
  if (len < end) {
    ps->need = end;
    return 0;
  }
  ps->pos = end;
  return 1;
}

/* Fixed-size field: 1 parsed, 0 need more. */
static int parse_fixed(tr__store_parser_t* ps, size_t len, size_t n) {
  if (len - ps->pos < n) {
    ps->need = ps->pos + n;
    return 0;
  }
  ps->pos += n;
  return 1;
}

#define KEY_ARGS "key", "TRAINRUN_STORE_MAX_KEY_BYTES"
#define VAL_ARGS "value", "TRAINRUN_STORE_MAX_VALUE_BYTES"

/* Walk the fields of a complete request again and fill req (cheap: only the
 * fixed part is decoded; multi-key items are left for the cursor). */
static void fill_req(const uint8_t* buf, size_t total, tr__store_req_t* req) {
  memset(req, 0, sizeof *req);
  req->cmd = buf[0];
  req->len = total;
  const char* f = cmds[buf[0]].fields;
  const uint8_t* p = buf + 1;
  tr__bytes_t* strs[3] = {&req->key, &req->a, &req->b};
  int nstr = 0;
  for (; *f; f++) {
    switch (*f) {
      case F_U32:
        req->u32 = tr__rd_u32(p);
        p += 4;
        break;
      case F_I64:
        req->i64 = (int64_t)tr__rd_u64(p);
        p += 8;
        break;
      case F_BLOB:
        req->raw = p;
        p += TR__AUTH_NONCE + TR__AUTH_MAC;
        break;
      case F_KEY:
      case F_VAL:
        *strs[nstr++] = tr__store_next_item(&p);
        break;
      case F_COUNT:
        req->count = tr__rd_u64(p);
        p += 8;
        req->items = p;
        break;
      default: /* F_KEYS, F_PAIRS: last field, validated already */
        return;
    }
  }
}

int tr__store_parse(tr__store_parser_t* ps, const uint8_t* buf, size_t len,
                    const tr__store_limits_t* lim, tr__store_req_t* req) {
  if (ps->pos == 0) {
    if (len < 1) {
      ps->need = 1;
      return 0;
    }
    if (!cmd_def(buf[0]))
      return fail(ps, TR_EPROTO, "unknown command byte 0x%02x", buf[0]);
    ps->cmd = buf[0];
    ps->step = 0;
    ps->pos = 1;
  }
  const char* fields = cmds[ps->cmd].fields;
  int rc;
  for (; fields[ps->step]; ps->step++) {
    switch (fields[ps->step]) {
      case F_U32:
        rc = parse_fixed(ps, len, 4);
        break;
      case F_I64:
        rc = parse_fixed(ps, len, 8);
        break;
      case F_BLOB:
        rc = parse_fixed(ps, len, TR__AUTH_NONCE + TR__AUTH_MAC);
        break;
      case F_KEY:
        rc = parse_str(ps, len, lim->max_key, KEY_ARGS, lim, buf);
        break;
      case F_VAL:
        rc = parse_str(ps, len, lim->max_value, VAL_ARGS, lim, buf);
        break;
      case F_COUNT:
        if (len - ps->pos < 8) {
          ps->need = ps->pos + 8;
          return 0;
        }
        ps->count = tr__rd_u64(buf + ps->pos);
        if (ps->count > lim->max_keys)
          return fail(ps, TR_ELIMIT,
                      "%s of %" PRIu64 " keys exceeds the limit of %" PRIu64
                      " (TRAINRUN_STORE_MAX_KEYS_PER_REQUEST)",
                      cmds[ps->cmd].name, ps->count, lim->max_keys);
        ps->pos += 8;
        ps->done = 0;
        rc = 1;
        break;
      case F_KEYS:
        rc = 1;
        while (ps->done < ps->count) {
          rc = parse_str(ps, len, lim->max_key, KEY_ARGS, lim, buf);
          if (rc <= 0) break;
          ps->done++;
        }
        break;
      case F_PAIRS:
        rc = 1;
        while (ps->done < 2 * ps->count) {
          if (ps->done % 2 == 0)
            rc = parse_str(ps, len, lim->max_key, KEY_ARGS, lim, buf);
          else
            rc = parse_str(ps, len, lim->max_value, VAL_ARGS, lim, buf);
          if (rc <= 0) break;
          ps->done++;
        }
        break;
      default:
        rc = TR_EINTERNAL;
        break;
    }
    if (rc <= 0) return rc;
  }
  if (ps->pos > lim->max_request)
    return fail(ps, TR_ELIMIT,
                "request of %zu bytes exceeds the limit of %" PRIu64
                " (TRAINRUN_STORE_MAX_REQUEST_BYTES)",
                ps->pos, lim->max_request);
  fill_req(buf, ps->pos, req);
  return 1;
}
