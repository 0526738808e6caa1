/* core/log.c: leveled, per-subsystem logging to stderr (see log.h). */
#include "config.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "trainrun/log.h"
#include "trainrun/param.h"

int tr__log_level = -1;
unsigned tr__log_mask = ~0u;

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static int log_rank = -1;
static int log_fd = 2;
static char log_host[64];

static const char* const subsys_names[TR_SUB__COUNT] = {
#define TR__SUBSYS_NAME(name, str) str,
    TR_LOG_SUBSYS_MAP(TR__SUBSYS_NAME)
#undef TR__SUBSYS_NAME
};

static const char* const level_names[] = {"none", "error", "warn",
                                          "info", "debug", "trace"};

int tr_log_parse_level(const char* name) {
  if (!name) return -1;
  for (int i = 0; i <= TR_LOG_TRACE; i++)
    if (strcasecmp(name, level_names[i]) == 0) return i;
  if (strcasecmp(name, "warning") == 0) return TR_LOG_WARN;
  if (name[0] >= '0' && name[0] <= '5' && name[1] == '\0') return name[0] - '0';
  return -1;
}

long tr_log_parse_subsys(const char* spec) {
  if (!spec || !*spec) return (long)((1u << TR_SUB__COUNT) - 1);
  int negate = spec[0] == '^';
  if (negate) spec++;
  unsigned mask = 0;
  const char* p = spec;
  while (*p) {
    size_t n = strcspn(p, ",");
    if (n == 3 && strncasecmp(p, "all", 3) == 0) {
      mask = (1u << TR_SUB__COUNT) - 1;
    } else if (n > 0) {
      int found = -1;
      for (int i = 0; i < TR_SUB__COUNT; i++)
        if (strlen(subsys_names[i]) == n && strncasecmp(p, subsys_names[i], n) == 0)
          found = i;
      if (found < 0) return -1;
      mask |= 1u << found;
    }
    p += n;
    if (*p == ',') p++;
  }
  if (negate) mask = ~mask & ((1u << TR_SUB__COUNT) - 1);
  return (long)mask;
}

static void log_init_once(void) {
  if (gethostname(log_host, sizeof log_host - 1) != 0) strcpy(log_host, "?");
  log_host[sizeof log_host - 1] = '\0';
  /* RANK is the launcher's worker variable (torchrun's), not a trainrun
   * parameter: the daemon sets it, log lines only show it. */
  const char* r = getenv("RANK");
  if (log_rank < 0 && r && *r) log_rank = atoi(r);
  /* String parameters never warn, so reading them cannot recurse here. */
  const char* level_env = tr_param_str(TR_PARAM_LOG_LEVEL);
  const char* subsys_env = tr_param_str(TR_PARAM_LOG_SUBSYS);
  int lv = tr_log_parse_level(level_env);
  long mask = tr_log_parse_subsys(subsys_env);
  int bad_level = lv < 0;
  int bad_mask = mask < 0;
  if (lv < 0) lv = TR_LOG_WARN;
  if (mask < 0) mask = (long)((1u << TR_SUB__COUNT) - 1);
  __atomic_store_n(&tr__log_mask, (unsigned)mask, __ATOMIC_RELAXED);
  if (__atomic_load_n(&tr__log_level, __ATOMIC_RELAXED) < 0)
    __atomic_store_n(&tr__log_level, lv, __ATOMIC_RELEASE);
  if (bad_level)
    tr__log(TR_LOG_WARN, TR_SUB_CORE,
            "ignoring TRAINRUN_LOG_LEVEL='%s': expected none, error, warn, "
            "info, debug or trace",
            level_env);
  if (bad_mask)
    tr__log(TR_LOG_WARN, TR_SUB_CORE,
            "ignoring TRAINRUN_LOG_SUBSYS='%s': unknown subsystem",
            subsys_env);
}

int tr__log_init(void) {
  pthread_once(&log_once, log_init_once);
  return __atomic_load_n(&tr__log_level, __ATOMIC_ACQUIRE);
}

void tr_log_set_rank(int rank) {
  tr__log_init();
  log_rank = rank;
}

void tr_log_set_level(int level) {
  tr__log_init();
  if (level >= 0) __atomic_store_n(&tr__log_level, level, __ATOMIC_RELEASE);
}

int tr_log_set_fd(int fd) {
  tr__log_init();
  int old = log_fd;
  log_fd = fd;
  return old;
}

void tr__vlog(tr_log_level_t level, tr_log_subsys_t sub, const char* fmt,
              va_list ap) {
  static const char* const tags[] = {"", "ERROR", "WARN", "INFO", "DEBUG",
                                     "TRACE"};
  char line[4096];
  int n;
  if (log_rank >= 0)
    n = snprintf(line, sizeof line, "%s:%d [%d] %s %s: ", log_host,
                 (int)getpid(), log_rank, tags[level], subsys_names[sub]);
  else
    n = snprintf(line, sizeof line, "%s:%d %s %s: ", log_host, (int)getpid(),
                 tags[level], subsys_names[sub]);
  if (n < 0) return;
  int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
  if (m < 0) return;
  size_t len = (size_t)n + (size_t)m;
  if (len > sizeof line - 2) {
    len = sizeof line - 5;
    memcpy(line + len, "...", 3);
    len += 3;
  }
  line[len++] = '\n';
  /* one write(2): lines from several threads or processes stay whole */
  ssize_t w = write(log_fd, line, len);
  (void)w;
}

void tr__log(tr_log_level_t level, tr_log_subsys_t sub, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tr__vlog(level, sub, fmt, ap);
  va_end(ap);
}
