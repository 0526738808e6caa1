/* core/param.c: the environment-variable registry (see param.h). */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "trainrun/log.h"
#include "trainrun/param.h"

typedef struct {
  const char* env;
  tr_param_type_t type;
  const char* def;
  double lo, hi;
  const char* doc;
} param_def_t;

static const param_def_t defs[TR_PARAM__COUNT] = {
#define TR__PARAM_DEF(id, env, type, def, lo, hi, doc) \
  {env, TR_PARAM_T_##type, def, (double)(lo), (double)(hi), doc},
    TR_PARAM_MAP(TR__PARAM_DEF)
#undef TR__PARAM_DEF
};

typedef struct {
  int loaded;
  int set;
  int64_t i;
  double d;
  const char* s;
} param_val_t;

static param_val_t vals[TR_PARAM__COUNT];
static pthread_mutex_t param_lock = PTHREAD_MUTEX_INITIALIZER;

static int parse_bool(const char* s, int* out) {
  static const char* const yes[] = {"1", "true", "yes", "on"};
  static const char* const no[] = {"0", "false", "no", "off"};
  for (int i = 0; i < 4; i++) {
    if (strcasecmp(s, yes[i]) == 0) return *out = 1, 0;
    if (strcasecmp(s, no[i]) == 0) return *out = 0, 0;
  }
  return -1;
}

/* Parse text as the parameter's type into v; -1 with a reason on error. */
static int parse_value(const param_def_t* d, const char* text, param_val_t* v,
                       const char** why) {
  char* end;
  errno = 0;
  switch (d->type) {
    case TR_PARAM_T_INT: {
      long long x = strtoll(text, &end, 0);
      if (errno || end == text || *end) return *why = "not an integer", -1;
      if ((double)x < d->lo || (double)x > d->hi) return *why = "out of range", -1;
      v->i = x;
      return 0;
    }
    case TR_PARAM_T_DOUBLE: {
      double x = strtod(text, &end);
      if (errno || end == text || *end) return *why = "not a number", -1;
      if (x < d->lo || x > d->hi) return *why = "out of range", -1;
      v->d = x;
      return 0;
    }
    case TR_PARAM_T_BOOL: {
      int b;
      if (parse_bool(text, &b) < 0) return *why = "not a boolean", -1;
      v->i = b;
      return 0;
    }
    case TR_PARAM_T_STRING:
      v->s = text;
      return 0;
  }
  return -1;
}

static const param_val_t* load(tr_param_id_t id) {
  param_val_t* v = &vals[id];
  if (__atomic_load_n(&v->loaded, __ATOMIC_ACQUIRE)) return v;
  pthread_mutex_lock(&param_lock);
  const char* bad = NULL;
  const char* why = NULL;
  if (!v->loaded) {
    const param_def_t* d = &defs[id];
    const char* env = getenv(d->env);
    param_val_t nv = {0};
    if (env && parse_value(d, env, &nv, &why) == 0) {
      nv.set = 1;
    } else {
      if (env) bad = env;
      if (parse_value(d, d->def, &nv, &why) != 0) abort(); /* bad default */
    }
    if (d->type == TR_PARAM_T_STRING) nv.s = strdup(nv.s ? nv.s : "");
    nv.loaded = 1;
    *v = nv;
  }
  pthread_mutex_unlock(&param_lock);
  if (bad) /* outside the lock: logging reads string params */
    TR_LOG_WARN(CORE, "ignoring %s='%s': %s; using the default %s",
                defs[id].env, bad, why, defs[id].def);
  return v;
}

static void check_type(tr_param_id_t id, tr_param_type_t t) {
  if ((unsigned)id >= TR_PARAM__COUNT || defs[id].type != t) abort();
}

int64_t tr_param_int(tr_param_id_t id) {
  check_type(id, TR_PARAM_T_INT);
  return load(id)->i;
}

double tr_param_double(tr_param_id_t id) {
  check_type(id, TR_PARAM_T_DOUBLE);
  return load(id)->d;
}

int tr_param_bool(tr_param_id_t id) {
  check_type(id, TR_PARAM_T_BOOL);
  return (int)load(id)->i;
}

const char* tr_param_str(tr_param_id_t id) {
  check_type(id, TR_PARAM_T_STRING);
  return load(id)->s;
}

int tr_param_is_set(tr_param_id_t id) {
  if ((unsigned)id >= TR_PARAM__COUNT) return 0;
  return load(id)->set;
}

const char* tr_param_env_name(tr_param_id_t id) {
  return (unsigned)id < TR_PARAM__COUNT ? defs[id].env : NULL;
}

void tr_param_print(FILE* out) {
  static const char* const tnames[] = {"int", "double", "bool", "string"};
  fprintf(out, "%-34s %-7s %-12s %-26s %s\n", "VARIABLE", "TYPE", "DEFAULT",
          "BOUNDS", "DESCRIPTION");
  for (int i = 0; i < TR_PARAM__COUNT; i++) {
    const param_def_t* d = &defs[i];
    char bounds[64] = "-";
    if (d->type == TR_PARAM_T_INT || d->type == TR_PARAM_T_DOUBLE)
      snprintf(bounds, sizeof bounds, "[%.15g, %.15g]", d->lo, d->hi);
    fprintf(out, "%-34s %-7s %-12s %-26s %s\n", d->env, tnames[d->type],
            *d->def ? d->def : "\"\"", bounds, d->doc);
    const param_val_t* v = load((tr_param_id_t)i);
    if (v->set) {
      switch (d->type) {
        case TR_PARAM_T_INT:
        case TR_PARAM_T_BOOL:
          fprintf(out, "%-34s   (set: %" PRId64 ")\n", "", v->i);
          break;
        case TR_PARAM_T_DOUBLE:
          fprintf(out, "%-34s   (set: %g)\n", "", v->d);
          break;
        case TR_PARAM_T_STRING:
          /* secrets are never echoed */
          fprintf(out, "%-34s   (set: %s)\n", "",
                  i == TR_PARAM_STORE_TOKEN ? "<hidden>" : v->s);
          break;
      }
    }
  }
}

void tr_param_reset(void) {
  pthread_mutex_lock(&param_lock);
  for (int i = 0; i < TR_PARAM__COUNT; i++) {
    if (defs[i].type == TR_PARAM_T_STRING && vals[i].loaded)
      free((void*)vals[i].s);
    memset(&vals[i], 0, sizeof vals[i]);
  }
  pthread_mutex_unlock(&param_lock);
}
