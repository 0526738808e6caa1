/* trainrun/log.h: leveled, per-subsystem logging.
 *
 * Lines go to stderr as one write each, so lines from threads and processes
 * never interleave mid-line:
 *
 *   host:pid [rank] WARN store: client 10.0.0.7:51234 sent a 9 MiB key
 *
 * The level comes from TRAINRUN_LOG_LEVEL (none, error, warn, info, debug,
 * trace; default warn) and the subsystems from TRAINRUN_LOG_SUBSYS (a comma
 * list such as "store,coll", "all", or "^store" for all but store; default
 * all). Both are read once, on the first log call. A disabled TR_LOG_* costs
 * one load and one compare: the arguments are not evaluated.
 */
#ifndef TRAINRUN_LOG_H
#define TRAINRUN_LOG_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  TR_LOG_NONE = 0,
  TR_LOG_ERROR = 1,
  TR_LOG_WARN = 2,
  TR_LOG_INFO = 3,
  TR_LOG_DEBUG = 4,
  TR_LOG_TRACE = 5
} tr_log_level_t;

/* XX(enum suffix, name in TRAINRUN_LOG_SUBSYS and in the line) */
#define TR_LOG_SUBSYS_MAP(XX) \
  XX(CORE, "core")            \
  XX(CONFIG, "config")        \
  XX(STORE, "store")          \
  XX(COLL, "coll")            \
  XX(FR, "fr")                \
  XX(KERN, "kernels")         \
  XX(MODEL, "model")          \
  XX(DT, "dtensor")           \
  XX(FSDP, "fsdp")            \
  XX(PP, "pp")                \
  XX(CKPT, "ckpt")            \
  XX(TRAIN, "train")          \
  XX(DAEMON, "daemon")        \
  XX(LAUNCH, "launch")

typedef enum {
#define TR__SUBSYS_ENUM(name, str) TR_SUB_##name,
  TR_LOG_SUBSYS_MAP(TR__SUBSYS_ENUM)
#undef TR__SUBSYS_ENUM
  TR_SUB__COUNT
} tr_log_subsys_t;

/* Internal state read by the macros; -1 until the environment is read. */
extern int tr__log_level;
extern unsigned tr__log_mask;
int tr__log_init(void);

static inline int tr_log_enabled(tr_log_level_t level, tr_log_subsys_t sub) {
  int lv = __atomic_load_n(&tr__log_level, __ATOMIC_RELAXED);
  if (lv < 0) lv = tr__log_init();
  return (int)level <= lv && (tr__log_mask & (1u << sub));
}

void tr__log(tr_log_level_t level, tr_log_subsys_t sub, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
void tr__vlog(tr_log_level_t level, tr_log_subsys_t sub, const char* fmt,
              va_list ap);

#define TR__LOG(level, sub, ...)                                      \
  do {                                                                \
    if (tr_log_enabled(level, TR_SUB_##sub)) tr__log(level, TR_SUB_##sub, __VA_ARGS__); \
  } while (0)
#define TR_LOG_ERROR(sub, ...) TR__LOG(TR_LOG_ERROR, sub, __VA_ARGS__)
#define TR_LOG_WARN(sub, ...) TR__LOG(TR_LOG_WARN, sub, __VA_ARGS__)
#define TR_LOG_INFO(sub, ...) TR__LOG(TR_LOG_INFO, sub, __VA_ARGS__)
#define TR_LOG_DEBUG(sub, ...) TR__LOG(TR_LOG_DEBUG, sub, __VA_ARGS__)
#define TR_LOG_TRACE(sub, ...) TR__LOG(TR_LOG_TRACE, sub, __VA_ARGS__)

/* The rank shown in the prefix; -1 (the default, unless RANK is set in the
 * environment) prints no rank. */
void tr_log_set_rank(int rank);

/* Override the environment (tests, CLI --verbose). level < 0 keeps it. */
void tr_log_set_level(int level);

/* Parse a TRAINRUN_LOG_SUBSYS value into a mask; -1 on an unknown name. */
long tr_log_parse_subsys(const char* spec);

/* Parse a level name ("warn") or digit; -1 when unknown. */
int tr_log_parse_level(const char* name);

/* Send lines to fd instead of stderr (tests); returns the previous fd. */
int tr_log_set_fd(int fd);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_LOG_H */
