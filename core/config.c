/* core/config.c: the typed job config (see trainrun/config.h): defaults,
 * TOML and command-line input with checks and "did you mean" suggestions,
 * cross-field resolution, the TOML and JSON printers and the key
 * descriptions the man page is made of (tools/man_config.c), all driven by
 * the schema table in trainrun/config_schema.h. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h> /* tr_config_print_json */

#include "trainrun/config.h"
#include "trainrun/error.h"
#include "trainrun/toml.h"

/* ---- the schema tables ---- */

static const tr_config_key_t keys[TR_CFG__NKEYS] = {
#define TR__CFG_KEY_DEF(sec, key, type, def, lo, hi, choices, doc) \
  {TR_CFG_K_##sec##_##key,                                         \
   #sec,                                                           \
   #key,                                                           \
   #sec "." #key,                                                  \
   TR_CFG_T_##type,                                                \
   def,                                                            \
   (double)(lo),                                                   \
   (double)(hi),                                                   \
   choices,                                                        \
   doc,                                                            \
   offsetof(tr_config_t, sec.key)},
#define TR__CFG_SEC_DEF(sec, doc) TR_CONFIG_KEYS_##sec(TR__CFG_KEY_DEF)
    TR_CONFIG_SECTIONS(TR__CFG_SEC_DEF)
#undef TR__CFG_SEC_DEF
#undef TR__CFG_KEY_DEF
};

typedef struct {
  const char* name;
  const char* doc;
} section_def_t;

static const section_def_t sections[] = {
#define TR__CFG_SECTION(sec, doc) {#sec, doc},
    TR_CONFIG_SECTIONS(TR__CFG_SECTION)
#undef TR__CFG_SECTION
};
#define NSECTIONS (sizeof sections / sizeof sections[0])

size_t tr_config_nkeys(void) { return TR_CFG__NKEYS; }

const tr_config_key_t* tr_config_key(size_t i) {
  return i < TR_CFG__NKEYS ? &keys[i] : NULL;
}

const tr_config_key_t* tr_config_find_key(const char* name) {
  for (size_t i = 0; i < TR_CFG__NKEYS; i++)
    if (strcmp(keys[i].name, name) == 0) return &keys[i];
  return NULL;
}

size_t tr_config_nsections(void) { return NSECTIONS; }

const char* tr_config_section_name(size_t i) {
  return i < NSECTIONS ? sections[i].name : NULL;
}

const char* tr_config_section_doc(size_t i) {
  return i < NSECTIONS ? sections[i].doc : NULL;
}

static void* field(tr_config_t* cfg, const tr_config_key_t* k) {
  return (char*)cfg + k->offset;
}

static const void* cfield(const tr_config_t* cfg, const tr_config_key_t* k) {
  return (const char*)cfg + k->offset;
}

static int is_stringish(tr_config_type_t t) {
  return t == TR_CFG_T_STR || t == TR_CFG_T_ENUM || t == TR_CFG_T_OPT_STR ||
         t == TR_CFG_T_SECRET;
}

static int is_nullable(tr_config_type_t t) {
  return t == TR_CFG_T_OPT_INT || t == TR_CFG_T_OPT_FLOAT ||
         t == TR_CFG_T_OPT_STR || t == TR_CFG_T_SECRET;
}

static int is_intish(tr_config_type_t t) {
  return t == TR_CFG_T_INT || t == TR_CFG_T_OPT_INT;
}

/* ---- small helpers ---- */

static const char* skip_ws(const char* s) {
  while (*s == ' ' || *s == '\t') s++;
  return s;
}

/* Shortest decimal text that reads back as x ("0.0008", "1e-08"). */
static void fmt_double(char* buf, size_t cap, double x) {
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(buf, cap, "%.*g", prec, x);
    if (strtod(buf, NULL) == x) return;
  }
  snprintf(buf, cap, "%.17g", x);
}

/* As fmt_double, but always a TOML float ("1.0", "inf", "nan"). */
static void fmt_toml_float(char* buf, size_t cap, double x) {
  if (isnan(x)) {
    snprintf(buf, cap, "nan");
    return;
  }
  if (isinf(x)) {
    snprintf(buf, cap, x < 0 ? "-inf" : "inf");
    return;
  }
  fmt_double(buf, cap, x);
  if (!strpbrk(buf, ".eE")) {
    size_t n = strlen(buf);
    if (n + 3 <= cap) memcpy(buf + n, ".0", 3);
  }
}

/* A bound as text: integers for INT keys. */
static void fmt_bound(char* buf, size_t cap, const tr_config_key_t* k,
                      double b) {
  if (isinf(b))
    snprintf(buf, cap, b < 0 ? "-inf" : "inf");
  else if (is_intish(k->type))
    snprintf(buf, cap, "%lld", (long long)b);
  else
    fmt_double(buf, cap, b);
}

static int valid_utf8(const char* s) {
  const unsigned char* p = (const unsigned char*)s;
  while (*p) {
    unsigned c = *p;
    int n;
    unsigned min;
    if (c < 0x80) {
      p++;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      n = 1, min = 0x80, c &= 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2, min = 0x800, c &= 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3, min = 0x10000, c &= 0x07;
    } else {
      return 0;
    }
    p++;
    for (int i = 0; i < n; i++, p++) {
      if ((*p & 0xc0) != 0x80) return 0;
      c = (c << 6) | (*p & 0x3f);
    }
    if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return 0;
  }
  return 1;
}

/* Edit distance (optimal string alignment) ignoring case, with '-' equal
 * to '_', for "did you mean". */
static int fold(int c) { return c == '-' ? '_' : tolower((unsigned char)c); }

static size_t edit_distance(const char* a, size_t la, const char* b,
                            size_t lb) {
  if (la > 64 || lb > 64) return (size_t)-1;
  size_t d[65][65];
  for (size_t i = 0; i <= la; i++) d[i][0] = i;
  for (size_t j = 0; j <= lb; j++) d[0][j] = j;
  for (size_t i = 1; i <= la; i++) {
    for (size_t j = 1; j <= lb; j++) {
      size_t cost = fold(a[i - 1]) == fold(b[j - 1]) ? 0 : 1;
      size_t best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
      if (d[i - 1][j - 1] + cost < best) best = d[i - 1][j - 1] + cost;
      if (i > 1 && j > 1 && fold(a[i - 1]) == fold(b[j - 2]) &&
          fold(a[i - 2]) == fold(b[j - 1]) && d[i - 2][j - 2] + 1 < best)
        best = d[i - 2][j - 2] + 1;
      d[i][j] = best;
    }
  }
  return d[la][lb];
}

/* How far a typo may be from the word it means. */
static size_t typo_limit(size_t len) { return len <= 3 ? 1 : len <= 6 ? 2 : 3; }

static int close_to(const char* typo, size_t tl, const char* word,
                    size_t* dist) {
  size_t d = edit_distance(typo, tl, word, strlen(word));
  *dist = d;
  return d <= typo_limit(strlen(word));
}

/* Section index by name (exact), or -1. */
static int find_section(const char* name, size_t len) {
  for (size_t i = 0; i < NSECTIONS; i++)
    if (strlen(sections[i].name) == len &&
        memcmp(sections[i].name, name, len) == 0)
      return (int)i;
  return -1;
}

static int section_of(const tr_config_key_t* k) {
  return find_section(k->section, strlen(k->section));
}

/* Key of a section by name (exact), or NULL. */
static const tr_config_key_t* find_in_section(int sec, const char* key,
                                              size_t len) {
  for (size_t i = 0; i < TR_CFG__NKEYS; i++)
    if (section_of(&keys[i]) == sec && strlen(keys[i].key) == len &&
        memcmp(keys[i].key, key, len) == 0)
      return &keys[i];
  return NULL;
}

static int suggest_section(const char* typo, size_t len) {
  int best = -1;
  size_t bd = (size_t)-1, d;
  for (size_t i = 0; i < NSECTIONS; i++)
    if (close_to(typo, len, sections[i].name, &d) && d < bd)
      bd = d, best = (int)i;
  return best;
}

static const tr_config_key_t* suggest_key(int sec, const char* typo,
                                          size_t len) {
  const tr_config_key_t* best = NULL;
  size_t bd = (size_t)-1, d;
  for (size_t i = 0; i < TR_CFG__NKEYS; i++)
    if (section_of(&keys[i]) == sec && close_to(typo, len, keys[i].key, &d) &&
        d < bd)
      bd = d, best = &keys[i];
  return best;
}

/* The one key named exactly `key` (case and dashes folded) in any section
 * other than `except`, or NULL. */
static const tr_config_key_t* key_elsewhere(int except, const char* key,
                                            size_t len) {
  for (size_t i = 0; i < TR_CFG__NKEYS; i++)
    if (section_of(&keys[i]) != except &&
        edit_distance(key, len, keys[i].key, strlen(keys[i].key)) == 0)
      return &keys[i];
  return NULL;
}

/* Choice i of "a|b|c" into buf; 0 when there is no choice i. */
static int choice_at(const char* choices, int i, char* buf, size_t cap) {
  const char* p = choices;
  for (int j = 0; j < i; j++) {
    p = strchr(p, '|');
    if (!p) return 0;
    p++;
  }
  size_t n = strcspn(p, "|");
  if (n >= cap) n = cap - 1;
  memcpy(buf, p, n);
  buf[n] = 0;
  return 1;
}

/* "a, b or c" from "a|b|c". */
static void choices_text(const char* choices, char* buf, size_t cap) {
  char c[64];
  size_t used = 0;
  int n = 0;
  while (choice_at(choices, n, c, sizeof c)) n++;
  buf[0] = 0;
  for (int i = 0; i < n; i++) {
    choice_at(choices, i, c, sizeof c);
    const char* sep = i == 0 ? "" : i == n - 1 ? " or " : ", ";
    int w = snprintf(buf + used, cap - used, "%s%s", sep, c);
    if (w < 0 || (size_t)w >= cap - used) break;
    used += (size_t)w;
  }
}

/* ---- errors ---- */

/* Where a value comes from while it is being set. */
typedef struct {
  const char* fname; /* TOML: file name, line, col */
  int line, col;
  int file;         /* index in the config's file list */
  const char* flag; /* CLI: "--training.steps" */
} where_t;

static int fail(tr_errmsg_t* err, const where_t* w, const tr_config_key_t* k,
                const char* fmt, ...) __attribute__((format(printf, 4, 5)));

/* Append s to the NUL-terminated buf of cap bytes, cutting it to fit. */
static void cat(char* buf, size_t cap, const char* s) {
  size_t used = strnlen(buf, cap), n = strlen(s);
  if (used + 1 >= cap) return;
  if (n > cap - used - 1) n = cap - used - 1;
  memcpy(buf + used, s, n);
  buf[used + n] = 0;
}

/* "file:line:col: key: message" or "--flag: message". */
static int fail(tr_errmsg_t* err, const where_t* w, const tr_config_key_t* k,
                const char* fmt, ...) {
  char tail[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tail, sizeof tail, fmt, ap);
  va_end(ap);
  if (!err) return TR_ECONFIG;
  err->code = TR_ECONFIG;
  err->message[0] = 0;
  if (w && w->fname) {
    snprintf(err->message, sizeof err->message, "%s:%d:%d: ", w->fname, w->line,
             w->col);
  } else if (w && w->flag) {
    snprintf(err->message, sizeof err->message, "%s: ", w->flag);
  }
  if (k && !(w && w->flag)) {
    cat(err->message, sizeof err->message, k->name);
    cat(err->message, sizeof err->message, ": ");
  }
  cat(err->message, sizeof err->message, tail);
  return TR_ECONFIG;
}

static int fail_nomem(tr_errmsg_t* err) {
  if (err) {
    err->code = TR_ENOMEM;
    snprintf(err->message, sizeof err->message, "%s", tr_strerror(TR_ENOMEM));
  }
  return TR_ENOMEM;
}

/* ---- storing values ---- */

typedef struct {
  bool unset; /* OPT_* and SECRET: make unset */
  int64_t i;
  double f;
  bool b;
  const char* s;
  char* const* items; /* LIST */
  size_t n;
} val_t;

static void list_free(tr_config_list_t* l) {
  for (size_t i = 0; i < l->n; i++) free(l->v[i]);
  free(l->v);
  l->v = NULL;
  l->n = 0;
}

static int list_copy(tr_config_list_t* dst, char* const* items, size_t n) {
  tr_config_list_t l = {0, NULL};
  if (n) {
    l.v = calloc(n, sizeof *l.v);
    if (!l.v) return TR_ENOMEM;
    for (; l.n < n; l.n++) {
      l.v[l.n] = strdup(items[l.n]);
      if (!l.v[l.n]) {
        list_free(&l);
        return TR_ENOMEM;
      }
    }
  }
  list_free(dst);
  *dst = l;
  return 0;
}

static int replace_str(char** slot, const char* s) {
  char* copy = NULL;
  if (s && !(copy = strdup(s))) return TR_ENOMEM;
  free(*slot);
  *slot = copy;
  return 0;
}

/* Is text a decimal integer that fits int64? */
static int parse_int(const char* text, int64_t* out) {
  const char* p = skip_ws(text);
  if (!*p) return -1;
  char* end;
  errno = 0;
  long long v = strtoll(p, &end, 10);
  if (end == p || errno) return -1;
  if (*skip_ws(end)) return -1;
  *out = v;
  return 0;
}

static int parse_float(const char* text, double* out) {
  const char* p = skip_ws(text);
  if (!*p) return -1;
  /* hexadecimal floats are C, not TOML or Python */
  const char* q = p + (*p == '+' || *p == '-');
  if (q[0] == '0' && (q[1] == 'x' || q[1] == 'X')) return -1;
  char* end;
  errno = 0;
  double v = strtod(p, &end);
  if (end == p || (errno && !isinf(v) && v != 0)) return -1;
  if (*skip_ws(end)) return -1;
  *out = v;
  return 0;
}

static const char* const ckpt_parts =
    "model|optimizer|lr_scheduler|dataloader|"
    "train_state";

/* Index of word in "a|b|c" (exact), or -1. */
static int choice_index(const char* choices, const char* word, size_t len,
                        int ignore_case) {
  char c[64];
  for (int i = 0; choice_at(choices, i, c, sizeof c); i++)
    if (strlen(c) == len &&
        (ignore_case ? strncasecmp(c, word, len) : strncmp(c, word, len)) == 0)
      return i;
  return -1;
}

/* "; did you mean 'x'?" for the closest choice, or "". */
static void choice_hint(const char* choices, const char* word, size_t len,
                        char* buf, size_t cap) {
  char c[64], best[64] = "";
  size_t bd = (size_t)-1, d;
  for (int i = 0; choice_at(choices, i, c, sizeof c); i++)
    if (close_to(word, len, c, &d) && d < bd)
      bd = d, snprintf(best, sizeof best, "%s", c);
  if (best[0])
    snprintf(buf, cap, "; did you mean '%s'?", best);
  else
    buf[0] = 0;
}

/* Checks of one value that the table cannot express. */
static int check_special(const tr_config_key_t* k, const val_t* v,
                         const where_t* w, tr_errmsg_t* err) {
  char expect[160], hint[80];
  switch (k->id) {
    case TR_CFG_K_parallelism_data_parallel_shard_degree:
    case TR_CFG_K_training_global_batch_size:
    case TR_CFG_K_validation_steps:
      if (v->i == 0) return fail(err, w, k, "must be -1 or at least 1, got 0");
      break;
    case TR_CFG_K_checkpoint_keep_latest_k:
      if (v->i == 1)
        return fail(err, w, k,
                    "1 is not allowed: a save in progress could leave no "
                    "complete checkpoint; use 0 (keep all) or at least 2");
      break;
    case TR_CFG_K_activation_checkpoint_mode:
      if (strcmp(v->s, "memory_budget") == 0)
        return fail(err, w, k,
                    "memory_budget needs a compiler's graph partitioner, "
                    "which trainrun does not have; use none, selective or "
                    "full");
      break;
    case TR_CFG_K_activation_checkpoint_selective_ac_option: {
      int64_t n;
      if (strcmp(v->s, "op") != 0 && (parse_int(v->s, &n) < 0 || n < 1))
        return fail(err, w, k, "expected 'op' or a positive number, got '%s'",
                    v->s);
      break;
    }
    /* comm.backend and debug.fault have grammars of their own, parsed by
     * the modules that own them (collectives/pg.c, trainer/fault.c): the
     * launcher's job checks run those parsers and say where the text came
     * from (launcher/jobcheck.c). */
    case TR_CFG_K_checkpoint_exclude_from_loading:
      for (size_t i = 0; i < v->n; i++) {
        const char* s = v->items[i];
        if (choice_index(ckpt_parts, s, strlen(s), 0) >= 0) continue;
        choices_text(ckpt_parts, expect, sizeof expect);
        choice_hint(ckpt_parts, s, strlen(s), hint, sizeof hint);
        return fail(err, w, k, "expected %s, got '%s'%s", expect, s, hint);
      }
      break;
    case TR_CFG_K_model_converters:
      if (v->n)
        return fail(err, w, k,
                    "converter '%s' is not supported by trainrun yet; use []",
                    v->items[0]);
      break;
    case TR_CFG_K_metrics_enable_wandb:
      if (v->b)
        return fail(err, w, k,
                    "Weights & Biases is not available in trainrun; use "
                    "metrics.enable_tensorboard");
      break;
    case TR_CFG_K_job_custom_config_module:
      if (v->s[0])
        return fail(err, w, k,
                    "trainrun has no Python config modules; leave it empty");
      break;
    default:
      break;
  }
  return 0;
}

static int check_range(const tr_config_key_t* k, double x, const char* text,
                       const where_t* w, tr_errmsg_t* err) {
  if (x >= k->min && x <= k->max) return 0;
  char lo[40], hi[40];
  fmt_bound(lo, sizeof lo, k, k->min);
  fmt_bound(hi, sizeof hi, k, k->max);
  if (isinf(k->max))
    return fail(err, w, k, "must be at least %s, got %s", lo, text);
  if (isinf(k->min))
    return fail(err, w, k, "must be at most %s, got %s", hi, text);
  return fail(err, w, k, "must be between %s and %s, got %s", lo, hi, text);
}

static void set_origin(tr_config_t* cfg, const tr_config_key_t* k,
                       const where_t* w) {
  tr__config_origin_t* o = &cfg->tr__origin[k->id];
  if (!w) {
    o->from = TR_CFG_FROM_DEFAULT;
  } else if (w->fname) {
    o->from = TR_CFG_FROM_FILE;
    o->file = (unsigned short)w->file;
    o->line = w->line;
    o->col = w->col;
  } else {
    o->from = TR_CFG_FROM_CLI;
  }
}

/* Check v against key k and store it. w is NULL for defaults. */
static int set_value(tr_config_t* cfg, const tr_config_key_t* k, const val_t* v,
                     const where_t* w, tr_errmsg_t* err) {
  void* f = field(cfg, k);
  char text[64];
  val_t cv = *v;
  char canon[64];
  if (v->unset) {
    if (!is_nullable(k->type)) return fail(err, w, k, "cannot be unset");
  } else {
    switch (k->type) {
      case TR_CFG_T_INT:
      case TR_CFG_T_OPT_INT:
        snprintf(text, sizeof text, "%" PRId64, v->i);
        TR_CHECK(check_range(k, (double)v->i, text, w, err));
        break;
      case TR_CFG_T_FLOAT:
      case TR_CFG_T_OPT_FLOAT:
        fmt_double(text, sizeof text, v->f);
        if (!isfinite(v->f))
          return fail(err, w, k, "must be a finite number, got %s", text);
        TR_CHECK(check_range(k, v->f, text, w, err));
        break;
      case TR_CFG_T_ENUM: {
        int i = choice_index(k->choices, v->s, strlen(v->s), 1);
        if (i < 0) {
          char expect[200], hint[80];
          choices_text(k->choices, expect, sizeof expect);
          choice_hint(k->choices, v->s, strlen(v->s), hint, sizeof hint);
          return fail(err, w, k, "expected %s, got '%s'%s", expect, v->s, hint);
        }
        choice_at(k->choices, i, canon, sizeof canon);
        cv.s = canon;
        break;
      }
      case TR_CFG_T_STR:
      case TR_CFG_T_OPT_STR:
      case TR_CFG_T_SECRET:
        if (!valid_utf8(v->s)) return fail(err, w, k, "not valid UTF-8");
        break;
      case TR_CFG_T_LIST:
        for (size_t i = 0; i < v->n; i++)
          if (!valid_utf8(v->items[i]))
            return fail(err, w, k, "not valid UTF-8");
        break;
      case TR_CFG_T_BOOL:
        break;
    }
    TR_CHECK(check_special(k, &cv, w, err));
  }
  switch (k->type) {
    case TR_CFG_T_INT:
      *(int64_t*)f = cv.i;
      break;
    case TR_CFG_T_FLOAT:
      *(double*)f = cv.f;
      break;
    case TR_CFG_T_BOOL:
      *(bool*)f = cv.b;
      break;
    case TR_CFG_T_OPT_INT: {
      tr_config_opt_int_t* o = f;
      o->set = !cv.unset;
      o->value = cv.unset ? 0 : cv.i;
      break;
    }
    case TR_CFG_T_OPT_FLOAT: {
      tr_config_opt_float_t* o = f;
      o->set = !cv.unset;
      o->value = cv.unset ? 0 : cv.f;
      break;
    }
    case TR_CFG_T_STR:
    case TR_CFG_T_ENUM:
    case TR_CFG_T_OPT_STR:
    case TR_CFG_T_SECRET:
      if (replace_str((char**)f, cv.unset ? NULL : cv.s) < 0)
        return fail_nomem(err);
      break;
    case TR_CFG_T_LIST:
      if (list_copy(f, cv.items, cv.n) < 0) return fail_nomem(err);
      break;
  }
  set_origin(cfg, k, w);
  return 0;
}

/* Split a comma list into a NULL-terminated array of trimmed items (one
 * allocation). "" gives no items. */
static char** split_list(const char* text, size_t* n) {
  size_t len = strlen(text), count = 1;
  for (const char* p = text; *p; p++) count += *p == ',';
  char** items = malloc((count + 1) * sizeof *items + len + 1);
  if (!items) return NULL;
  char* buf = (char*)(items + count + 1);
  memcpy(buf, text, len + 1);
  *n = 0;
  if (*skip_ws(buf)) {
    char* p = buf;
    for (;;) {
      char* comma = strchr(p, ',');
      if (comma) *comma = 0;
      p = (char*)skip_ws(p);
      char* e = p + strlen(p);
      while (e > p && (e[-1] == ' ' || e[-1] == '\t')) *--e = 0;
      items[(*n)++] = p;
      if (!comma) break;
      p = comma + 1;
    }
  }
  items[*n] = NULL;
  return items;
}

static const char* expected_type(const tr_config_key_t* k) {
  switch (k->type) {
    case TR_CFG_T_INT:
    case TR_CFG_T_OPT_INT:
      return "an integer";
    case TR_CFG_T_FLOAT:
    case TR_CFG_T_OPT_FLOAT:
      return "a number";
    case TR_CFG_T_BOOL:
      return "true or false";
    case TR_CFG_T_LIST:
      return "an array of strings";
    default:
      return "a string";
  }
}

/* Parse command-line text for k and set it. */
static int set_text(tr_config_t* cfg, const tr_config_key_t* k,
                    const char* text, const where_t* w, tr_errmsg_t* err) {
  val_t v = {0};
  if (is_nullable(k->type) &&
      (strcmp(text, "none") == 0 || strcmp(text, "None") == 0)) {
    v.unset = true;
    return set_value(cfg, k, &v, w, err);
  }
  switch (k->type) {
    case TR_CFG_T_INT:
    case TR_CFG_T_OPT_INT:
      if (parse_int(text, &v.i) < 0)
        return fail(err, w, k, "expected an integer, got '%s'", text);
      break;
    case TR_CFG_T_FLOAT:
    case TR_CFG_T_OPT_FLOAT:
      if (parse_float(text, &v.f) < 0)
        return fail(err, w, k, "expected a number, got '%s'", text);
      break;
    case TR_CFG_T_BOOL:
      if (strcasecmp(text, "true") == 0 || strcmp(text, "1") == 0)
        v.b = true;
      else if (strcasecmp(text, "false") == 0 || strcmp(text, "0") == 0)
        v.b = false;
      else
        return fail(err, w, k, "expected true or false, got '%s'", text);
      break;
    case TR_CFG_T_LIST: {
      size_t n;
      char** items = split_list(text, &n);
      if (!items) return fail_nomem(err);
      for (size_t i = 0; i < n; i++)
        if (!items[i][0]) {
          free(items);
          return fail(err, w, k, "empty item in the list '%s'", text);
        }
      v.items = items;
      v.n = n;
      int rc = set_value(cfg, k, &v, w, err);
      free(items);
      return rc;
    }
    default:
      v.s = text;
      break;
  }
  return set_value(cfg, k, &v, w, err);
}

/* ---- init and release ---- */

int tr_config_init(tr_config_t* cfg) {
  memset(cfg, 0, sizeof *cfg);
  for (size_t i = 0; i < TR_CFG__NKEYS; i++) {
    const tr_config_key_t* k = &keys[i];
    if (!k->def) continue;
    tr_errmsg_t err;
    int rc = set_text(cfg, k, k->def, NULL, &err);
    if (rc == TR_ENOMEM) {
      tr_config_release(cfg);
      return rc;
    }
    if (rc < 0) abort(); /* a default that fails its own checks is a bug */
  }
  return 0;
}

void tr_config_release(tr_config_t* cfg) {
  for (size_t i = 0; i < TR_CFG__NKEYS; i++) {
    const tr_config_key_t* k = &keys[i];
    void* f = field(cfg, k);
    if (is_stringish(k->type)) {
      free(*(char**)f);
      *(char**)f = NULL;
    } else if (k->type == TR_CFG_T_LIST) {
      list_free(f);
    }
  }
  for (size_t i = 0; i < cfg->tr__nfiles; i++) free(cfg->tr__files[i]);
  free(cfg->tr__files);
  memset(cfg, 0, sizeof *cfg);
}

/* ---- TOML input ---- */

static const char* toml_type_text(tr_toml_type_t t) {
  switch (t) {
    case TR_TOML_STRING:
      return "a string";
    case TR_TOML_INTEGER:
      return "an integer";
    case TR_TOML_FLOAT:
      return "a float";
    case TR_TOML_BOOL:
      return "a boolean";
    case TR_TOML_DATETIME:
      return "a date-time";
    case TR_TOML_DATETIME_LOCAL:
      return "a local date-time";
    case TR_TOML_DATE_LOCAL:
      return "a local date";
    case TR_TOML_TIME_LOCAL:
      return "a local time";
    case TR_TOML_ARRAY:
      return "an array";
    case TR_TOML_TABLE:
      return "a table";
  }
  return "a value";
}

/* A TOML string as a C string; fails on embedded NULs. */
static int toml_cstr(const tr_toml_value_t* v, const char** out) {
  size_t len;
  const char* s = tr_toml_string(v, &len);
  if (!s || strlen(s) != len) return -1;
  *out = s;
  return 0;
}

static int set_toml(tr_config_t* cfg, const tr_config_key_t* k,
                    const tr_toml_value_t* v, where_t* w, tr_errmsg_t* err) {
  tr_toml_type_t t = tr_toml_type(v);
  val_t val = {0};
  int ok = 1;
  switch (k->type) {
    case TR_CFG_T_INT:
    case TR_CFG_T_OPT_INT:
      ok = t == TR_TOML_INTEGER;
      val.i = tr_toml_int(v);
      break;
    case TR_CFG_T_FLOAT:
    case TR_CFG_T_OPT_FLOAT:
      ok = t == TR_TOML_FLOAT || t == TR_TOML_INTEGER;
      val.f = t == TR_TOML_FLOAT ? tr_toml_float(v) : (double)tr_toml_int(v);
      break;
    case TR_CFG_T_BOOL:
      ok = t == TR_TOML_BOOL;
      val.b = tr_toml_bool(v) != 0;
      break;
    case TR_CFG_T_LIST: {
      ok = t == TR_TOML_ARRAY;
      if (!ok) break;
      size_t n = tr_toml_count(v);
      char** items = calloc(n + 1, sizeof *items);
      if (!items) return fail_nomem(err);
      for (size_t i = 0; i < n; i++) {
        const tr_toml_value_t* e = tr_toml_at(v, i);
        const char* s;
        if (tr_toml_type(e) != TR_TOML_STRING || toml_cstr(e, &s) < 0) {
          w->line = tr_toml_line(e);
          w->col = tr_toml_col(e);
          free(items);
          if (tr_toml_type(e) == TR_TOML_STRING)
            return fail(err, w, k, "strings may not contain NUL characters");
          return fail(err, w, k, "expected a string in the array, got %s",
                      toml_type_text(tr_toml_type(e)));
        }
        items[i] = (char*)s;
      }
      val.items = items;
      val.n = n;
      int rc = set_value(cfg, k, &val, w, err);
      free(items);
      return rc;
    }
    default:
      ok = t == TR_TOML_STRING;
      if (ok && toml_cstr(v, &val.s) < 0)
        return fail(err, w, k, "strings may not contain NUL characters");
      break;
  }
  if (!ok)
    return fail(err, w, k, "expected %s, got %s", expected_type(k),
                toml_type_text(t));
  return set_value(cfg, k, &val, w, err);
}

/* Message tail for an unknown key in section sec (-1: outside sections). */
static void unknown_key_hint(int sec, const char* key, char* buf, size_t cap) {
  size_t len = strlen(key);
  const tr_config_key_t* s = sec >= 0 ? suggest_key(sec, key, len) : NULL;
  if (s && edit_distance(key, len, s->key, strlen(s->key)) == 0) {
    snprintf(buf, cap, "; did you mean '%s'?", s->key);
    return;
  }
  const tr_config_key_t* o = key_elsewhere(sec, key, len);
  if (o) {
    snprintf(buf, cap, "; did you mean [%s] %s?", o->section, o->key);
    return;
  }
  if (s) {
    snprintf(buf, cap, "; did you mean '%s'?", s->key);
    return;
  }
  buf[0] = 0;
}

static int add_file(tr_config_t* cfg, const char* name) {
  for (size_t i = 0; i < cfg->tr__nfiles; i++)
    if (strcmp(cfg->tr__files[i], name) == 0) return (int)i;
  if (cfg->tr__nfiles >= 65535) return TR_ELIMIT;
  char** files = realloc(cfg->tr__files, (cfg->tr__nfiles + 1) * sizeof *files);
  if (!files) return TR_ENOMEM;
  cfg->tr__files = files;
  if (!(files[cfg->tr__nfiles] = strdup(name))) return TR_ENOMEM;
  return (int)cfg->tr__nfiles++;
}

static int merge_tree(tr_config_t* cfg, const char* name,
                      const tr_toml_value_t* root, int file, tr_errmsg_t* err) {
  char hint[120];
  for (size_t i = 0; i < tr_toml_count(root); i++) {
    const char* sname = tr_toml_key_at(root, i);
    const tr_toml_value_t* st = tr_toml_at(root, i);
    where_t w = {name, tr_toml_key_line(root, i), tr_toml_key_col(root, i),
                 file, NULL};
    int sec = find_section(sname, tr_toml_key_len(root, i));
    if (tr_toml_type(st) != TR_TOML_TABLE) {
      if (sec >= 0)
        return fail(err, &w, NULL, "[%s] must be a table, got %s", sname,
                    toml_type_text(tr_toml_type(st)));
      unknown_key_hint(-1, sname, hint, sizeof hint);
      return fail(err, &w, NULL, "unknown key '%s' outside any section%s",
                  sname, hint);
    }
    if (sec < 0) {
      int s = suggest_section(sname, strlen(sname));
      if (s >= 0)
        return fail(err, &w, NULL, "unknown section [%s]; did you mean [%s]?",
                    sname, sections[s].name);
      return fail(err, &w, NULL, "unknown section [%s]", sname);
    }
    for (size_t j = 0; j < tr_toml_count(st); j++) {
      const char* kname = tr_toml_key_at(st, j);
      const tr_toml_value_t* v = tr_toml_at(st, j);
      const tr_config_key_t* k =
          find_in_section(sec, kname, tr_toml_key_len(st, j));
      w.line = tr_toml_key_line(st, j);
      w.col = tr_toml_key_col(st, j);
      if (!k) {
        if (tr_toml_type(v) == TR_TOML_TABLE)
          return fail(err, &w, NULL, "unknown section [%s.%s]", sname, kname);
        unknown_key_hint(sec, kname, hint, sizeof hint);
        return fail(err, &w, NULL, "unknown key '%s' in [%s]%s", kname, sname,
                    hint);
      }
      w.line = tr_toml_line(v);
      w.col = tr_toml_col(v);
      TR_CHECK(set_toml(cfg, k, v, &w, err));
    }
  }
  return 0;
}

int tr_config_merge_toml(tr_config_t* cfg, const char* name, const char* text,
                         size_t len, tr_errmsg_t* err) {
  tr_toml_value_t* root = NULL;
  tr_toml_error_t terr;
  memset(&terr, 0, sizeof terr);
  int rc = tr_toml_parse(text, len, &root, &terr);
  if (rc == TR_ENOMEM) return fail_nomem(err);
  if (rc < 0) {
    where_t w = {name, terr.line, terr.col, 0, NULL};
    if (terr.line > 0) return fail(err, &w, NULL, "%s", terr.message);
    w.fname = NULL;
    return fail(err, &w, NULL, "%s: %s", name, terr.message);
  }
  int file = add_file(cfg, name);
  if (file < 0) {
    tr_toml_free(root);
    return file == TR_ENOMEM ? fail_nomem(err)
                             : fail(err, NULL, NULL, "too many job files");
  }
  rc = merge_tree(cfg, name, root, file, err);
  tr_toml_free(root);
  return rc;
}

int tr_config_merge_file(tr_config_t* cfg, const char* path, tr_errmsg_t* err) {
  FILE* f = fopen(path, "rb");
  char* buf = NULL;
  size_t len = 0, cap = 0;
  int rc = 0;
  if (!f) goto out_errno;
  errno = 0;
  for (;;) {
    if (len == cap) {
      size_t ncap = cap ? cap * 2 : 8192;
      char* nb = realloc(buf, ncap);
      if (!nb) {
        fclose(f);
        free(buf);
        return fail_nomem(err);
      }
      buf = nb;
      cap = ncap;
    }
    size_t got = fread(buf + len, 1, cap - len, f);
    len += got;
    if (got == 0) break;
  }
  if (ferror(f)) {
    if (errno == 0) errno = EIO;
    int e = errno;
    fclose(f);
    errno = e;
    goto out_errno;
  }
  fclose(f);
  rc = tr_config_merge_toml(cfg, path, buf ? buf : "", len, err);
  free(buf);
  return rc;
out_errno:
  rc = tr_err_from_errno();
  free(buf);
  if (err) {
    err->code = rc;
    snprintf(err->message, sizeof err->message, "cannot read '%s': %s", path,
             strerror(-rc));
  }
  return rc;
}

/* ---- command-line input ---- */

/* Normalised flag name: the part of arg after "--" and before '=', with
 * dashes as underscores. Returns 0, or -1 when arg is not "--x.y...". */
static int flag_name(const char* arg, char* buf, size_t cap,
                     const char** value) {
  if (strncmp(arg, "--", 2) != 0) return -1;
  const char* name = arg + 2;
  const char* eq = strchr(name, '=');
  size_t n = eq ? (size_t)(eq - name) : strlen(name);
  if (!memchr(name, '.', n) || n >= cap) return -1;
  for (size_t i = 0; i < n; i++) buf[i] = name[i] == '-' ? '_' : name[i];
  buf[n] = 0;
  *value = eq ? eq + 1 : NULL;
  return 0;
}

/* The key a normalised flag name sets; *negated for "section.no_key". */
static const tr_config_key_t* flag_key(const char* name, int* negated) {
  *negated = 0;
  const tr_config_key_t* k = tr_config_find_key(name);
  if (k) return k;
  const char* dot = strchr(name, '.');
  if (dot && strncmp(dot + 1, "no_", 3) == 0) {
    char plain[256];
    snprintf(plain, sizeof plain, "%.*s.%s", (int)(dot - name), name, dot + 4);
    k = tr_config_find_key(plain);
    if (k) {
      *negated = 1;
      return k;
    }
  }
  return NULL;
}

int tr_config_arg_span(int argc, char* const* argv, int i) {
  char name[256];
  const char* value;
  if (i >= argc || flag_name(argv[i], name, sizeof name, &value) < 0) return 0;
  if (value) return 1;
  int neg;
  const tr_config_key_t* k = flag_key(name, &neg);
  if (k && (k->type == TR_CFG_T_BOOL || neg)) return 1;
  if (i + 1 >= argc) return 1;
  if (!k && strncmp(argv[i + 1], "--", 2) == 0) return 1;
  return 2;
}

/* "--section.key" of the suggestion for an unknown flag name, or "". */
static void flag_hint(const char* name, char* buf, size_t cap) {
  const char* dot = strchr(name, '.');
  buf[0] = 0;
  if (!dot) return;
  size_t sl = (size_t)(dot - name);
  int sec = find_section(name, sl);
  if (sec < 0) sec = suggest_section(name, sl);
  if (sec < 0) {
    const tr_config_key_t* o = key_elsewhere(-1, dot + 1, strlen(dot + 1));
    if (o) snprintf(buf, cap, "; did you mean '--%s'?", o->name);
    return;
  }
  const char* key = dot + 1;
  const tr_config_key_t* k = find_in_section(sec, key, strlen(key));
  if (!k) k = suggest_key(sec, key, strlen(key));
  if (!k || edit_distance(key, strlen(key), k->key, strlen(k->key)) != 0) {
    const tr_config_key_t* o = key_elsewhere(sec, key, strlen(key));
    if (o) k = o;
  }
  if (k) snprintf(buf, cap, "; did you mean '--%s'?", k->name);
}

int tr_config_apply_args(tr_config_t* cfg, int argc, char* const* argv,
                         tr_errmsg_t* err) {
  for (int i = 0; i < argc;) {
    char name[256], flag[264], hint[300];
    const char* value;
    if (flag_name(argv[i], name, sizeof name, &value) < 0) {
      return fail(err, NULL, NULL,
                  "unexpected argument '%s' (config overrides are "
                  "--section.key value)",
                  argv[i]);
    }
    int span = tr_config_arg_span(argc, argv, i);
    int neg;
    const tr_config_key_t* k = flag_key(name, &neg);
    snprintf(flag, sizeof flag, "--%s", name);
    where_t w = {NULL, 0, 0, 0, flag};
    if (!k) {
      flag_hint(name, hint, sizeof hint);
      return fail(err, &w, NULL, "unknown option%s", hint);
    }
    if (neg && k->type != TR_CFG_T_BOOL)
      return fail(err, &w, NULL, "unknown option; %s is not a boolean",
                  k->name);
    if (neg) {
      if (value) return fail(err, &w, NULL, "takes no value");
      val_t v = {0};
      v.b = false;
      TR_CHECK(set_value(cfg, k, &v, &w, err));
    } else if (k->type == TR_CFG_T_BOOL && !value) {
      val_t v = {0};
      v.b = true;
      TR_CHECK(set_value(cfg, k, &v, &w, err));
    } else {
      if (!value && span < 2) return fail(err, &w, NULL, "expects a value");
      TR_CHECK(set_text(cfg, k, value ? value : argv[i + 1], &w, err));
    }
    i += span;
  }
  return 0;
}

int tr_config_set(tr_config_t* cfg, const char* name, const char* value,
                  tr_errmsg_t* err) {
  char norm[256], flag[264];
  size_t n = strlen(name);
  if (n >= sizeof norm) n = sizeof norm - 1;
  for (size_t i = 0; i < n; i++) norm[i] = name[i] == '-' ? '_' : name[i];
  norm[n] = 0;
  snprintf(flag, sizeof flag, "--%s", norm);
  where_t w = {NULL, 0, 0, 0, flag};
  const tr_config_key_t* k = tr_config_find_key(norm);
  if (!k) {
    char hint[300];
    flag_hint(norm, hint, sizeof hint);
    return fail(err, &w, NULL, "unknown option%s", hint);
  }
  return set_text(cfg, k, value, &w, err);
}

int tr_config_load(tr_config_t* cfg, const char* path, int argc,
                   char* const* argv, tr_errmsg_t* err) {
  TR_CHECK(tr_config_init(cfg) == 0 ? 0 : fail_nomem(err));
  /* --job.config_file names the file to load before the other overrides */
  const char* cli_path = NULL;
  for (int i = 0; i < argc;) {
    char name[256];
    const char* value;
    int span = tr_config_arg_span(argc, argv, i);
    if (span == 0) break; /* tr_config_apply_args reports it */
    if (flag_name(argv[i], name, sizeof name, &value) == 0 &&
        strcmp(name, "job.config_file") == 0)
      cli_path = value ? value : span == 2 ? argv[i + 1] : NULL;
    i += span;
  }
  if (path && cli_path && strcmp(path, cli_path) != 0) {
    where_t w = {NULL, 0, 0, 0, "--job.config_file"};
    return fail(err, &w, NULL,
                "'%s' conflicts with the job file '%s' given as an argument",
                cli_path, path);
  }
  const char* file = path ? path : cli_path;
  if (file && file[0]) {
    TR_CHECK(tr_config_merge_file(cfg, file, err));
    if (replace_str(&cfg->job.config_file, file) < 0) return fail_nomem(err);
    cfg->tr__origin[TR_CFG_K_job_config_file].from = TR_CFG_FROM_CLI;
  }
  return tr_config_apply_args(cfg, argc, argv, err);
}

/* ---- origins ---- */

const char* tr_config_origin(const tr_config_t* cfg, tr_config_key_id_t id,
                             char* buf, size_t cap) {
  if ((unsigned)id >= TR_CFG__NKEYS || cap == 0) return NULL;
  const tr__config_origin_t* o = &cfg->tr__origin[id];
  if (o->from == TR_CFG_FROM_FILE && o->file < cfg->tr__nfiles) {
    snprintf(buf, cap, "%s:%d:%d", cfg->tr__files[o->file], o->line, o->col);
    return buf;
  }
  if (o->from == TR_CFG_FROM_CLI) {
    snprintf(buf, cap, "--%s", keys[id].name);
    return buf;
  }
  return NULL;
}

/* ---- cross-field checks ---- */

/* Fail with the origin of the first of ids (n of them) set by the user as
 * the prefix: "job.toml:3:9: message" or "--flag: message". */
static int fail_at(const tr_config_t* cfg, tr_errmsg_t* err,
                   const tr_config_key_id_t* ids, size_t n, const char* fmt,
                   ...) __attribute__((format(printf, 5, 6)));

static int fail_at(const tr_config_t* cfg, tr_errmsg_t* err,
                   const tr_config_key_id_t* ids, size_t n, const char* fmt,
                   ...) {
  char tail[400], where[300];
  const char* at = NULL;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tail, sizeof tail, fmt, ap);
  va_end(ap);
  for (size_t i = 0; i < n && !at; i++)
    at = tr_config_origin(cfg, ids[i], where, sizeof where);
  if (!err) return TR_ECONFIG;
  err->code = TR_ECONFIG;
  err->message[0] = 0;
  if (at) {
    cat(err->message, sizeof err->message, at);
    cat(err->message, sizeof err->message, ": ");
  }
  cat(err->message, sizeof err->message, tail);
  return TR_ECONFIG;
}

#define FAIL_AT(cfg, err, ...) \
  fail_at(cfg, err, ids_, sizeof ids_ / sizeof ids_[0], __VA_ARGS__)

/* Append " x name N" for degrees above 1 (all when `all`). */
static void degree_terms(char* buf, size_t cap, const char* const* names,
                         const int64_t* vals, size_t n) {
  size_t used = strlen(buf);
  int first = 1;
  for (size_t i = 0; i < n; i++) {
    if (vals[i] == 1) continue;
    int w = snprintf(buf + used, cap - used, "%s%s %" PRId64,
                     first ? "" : " x ", names[i], vals[i]);
    if (w < 0 || (size_t)w >= cap - used) return;
    used += (size_t)w;
    first = 0;
  }
}

static int mul_ok(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

int tr_config_device(const tr_config_t* cfg, int local_rank, tr_device_t* out,
                     tr_errmsg_t* err) {
  const char* want = cfg->training.device;
  int n = tr_cuda_device_count();
  *out = TR_DEVICE_CPU;
  if (strcmp(want, "cpu") == 0 || (strcmp(want, "auto") == 0 && n == 0))
    return 0;
  if (n == 0)
    return tr_errmsg_set(err, TR_EDEVICE,
                         "training.device: 'cuda', but no CUDA device is "
                         "visible%s",
#ifdef HAVE_CUDA
                         ""
#else
                         " (this build has no CUDA)"
#endif
    );
  out->type = TR_DEV_CUDA;
  out->index = (local_rank < 0 ? 0 : local_rank) % n;
  return 0;
}

int tr_config_resolve(tr_config_t* cfg, int64_t world_size, tr_errmsg_t* err) {
  typeof(cfg->parallelism)* par = &cfg->parallelism;
  int64_t rep = par->data_parallel_replicate_degree;
  int64_t shard = par->data_parallel_shard_degree;
  int64_t cp = par->context_parallel_degree;
  int64_t tp = par->tensor_parallel_degree;
  int64_t pp = par->pipeline_parallel_degree;
  int64_t others, total;
  if (world_size < 1)
    return fail(err, NULL, NULL,
                "the world size must be at least 1, got %" PRId64, world_size);

  /* degrees */
  {
    static const tr_config_key_id_t ids_[] = {
        TR_CFG_K_parallelism_data_parallel_shard_degree,
        TR_CFG_K_parallelism_data_parallel_replicate_degree,
        TR_CFG_K_parallelism_context_parallel_degree,
        TR_CFG_K_parallelism_tensor_parallel_degree,
        TR_CFG_K_parallelism_pipeline_parallel_degree};
    static const char* const names[] = {
        "data_parallel_replicate_degree", "context_parallel_degree",
        "tensor_parallel_degree", "pipeline_parallel_degree"};
    int64_t vals[] = {rep, cp, tp, pp};
    char terms[400] = "";
    degree_terms(terms, sizeof terms, names, vals, 4);
    if (!mul_ok(rep, cp, &others) || !mul_ok(others, tp, &others) ||
        !mul_ok(others, pp, &others))
      return FAIL_AT(cfg, err, "the parallel degrees are too large (%s)",
                     terms);
    if (shard == -1) {
      /* name where a degree above 1 was set, else any of them */
      tr_config_key_id_t order[4];
      size_t no = 0;
      for (int pass = 0; pass < 2; pass++)
        for (size_t d = 0; d < 4; d++)
          if ((vals[d] != 1) == (pass == 0)) order[no++] = ids_[d + 1];
      if (world_size % others != 0)
        return fail_at(cfg, err, order, 4,
                       "the parallel degrees multiply to %" PRId64
                       " (%s), which does not divide the world size %" PRId64
                       ", so data_parallel_shard_degree = -1 has no solution",
                       others, terms, world_size);
      shard = world_size / others;
      par->data_parallel_shard_degree = shard;
      cfg->tr__origin[TR_CFG_K_parallelism_data_parallel_shard_degree].from =
          TR_CFG_FROM_RESOLVE;
    } else if (!mul_ok(others, shard, &total)) {
      return FAIL_AT(cfg, err, "the parallel degrees are too large");
    } else if (total != world_size) {
      static const char* const all[] = {
          "data_parallel_replicate_degree", "data_parallel_shard_degree",
          "context_parallel_degree", "tensor_parallel_degree",
          "pipeline_parallel_degree"};
      int64_t av[] = {rep, shard, cp, tp, pp};
      char t2[400] = "";
      degree_terms(t2, sizeof t2, all, av, 5);
      if (!t2[0]) snprintf(t2, sizeof t2, "all 1");
      return FAIL_AT(cfg, err,
                     "the parallel degrees multiply to %" PRId64
                     " (%s) but the world size is %" PRId64
                     "; set data_parallel_shard_degree = -1 to use the rest",
                     total, t2, world_size);
    }
  }

  /* expert parallelism borrows ranks from dp_shard x cp (x tp) */
  int64_t ep = par->expert_parallel_degree;
  int64_t etp = par->expert_tensor_parallel_degree;
  if (ep > 1) {
    static const tr_config_key_id_t ids_[] = {
        TR_CFG_K_parallelism_expert_tensor_parallel_degree,
        TR_CFG_K_parallelism_tensor_parallel_degree};
    if (etp != tp && etp != 1)
      return FAIL_AT(cfg, err,
                     "expert_tensor_parallel_degree must be 1 or "
                     "tensor_parallel_degree (%" PRId64 "), got %" PRId64,
                     tp, etp);
    int64_t borrow = etp == tp ? cp : cp * tp;
    if (ep % borrow != 0 || (shard * borrow) % ep != 0) {
      static const tr_config_key_id_t ids2[] = {
          TR_CFG_K_parallelism_expert_parallel_degree};
      return fail_at(cfg, err, ids2, 1,
                     "expert_parallel_degree %" PRId64
                     " must be a multiple of %" PRId64 " and divide %" PRId64
                     " (the data_parallel_shard_degree x %s ranks it borrows)",
                     ep, borrow, shard * borrow,
                     etp == tp ? "context_parallel_degree"
                               : "context x tensor parallel degree");
    }
  }

  /* batch */
  int64_t dp = rep * shard, lbs = cfg->training.local_batch_size, per_step;
  {
    static const tr_config_key_id_t ids_[] = {
        TR_CFG_K_training_global_batch_size,
        TR_CFG_K_training_local_batch_size};
    if (!mul_ok(lbs, dp, &per_step))
      return FAIL_AT(cfg, err,
                     "local_batch_size x data-parallel degree is "
                     "too large");
    int64_t gbs = cfg->training.global_batch_size;
    if (gbs == -1) {
      cfg->training.global_batch_size = per_step;
      cfg->tr__origin[TR_CFG_K_training_global_batch_size].from =
          TR_CFG_FROM_RESOLVE;
    } else if (gbs % per_step != 0) {
      return FAIL_AT(cfg, err,
                     "training.global_batch_size %" PRId64
                     " must be a multiple of local_batch_size x "
                     "data-parallel degree = %" PRId64 " x %" PRId64
                     " = %" PRId64,
                     gbs, lbs, dp, per_step);
    }
  }
  if (pp > 1 && lbs % par->pipeline_parallel_microbatch_size != 0) {
    static const tr_config_key_id_t ids_[] = {
        TR_CFG_K_parallelism_pipeline_parallel_microbatch_size,
        TR_CFG_K_training_local_batch_size};
    return FAIL_AT(cfg, err,
                   "pipeline_parallel_microbatch_size %" PRId64
                   " must divide training.local_batch_size %" PRId64,
                   par->pipeline_parallel_microbatch_size, lbs);
  }
  int64_t seq = cfg->training.seq_len;
  if (tp > 1 && seq % tp != 0) {
    static const tr_config_key_id_t ids_[] = {
        TR_CFG_K_training_seq_len, TR_CFG_K_parallelism_tensor_parallel_degree};
    return FAIL_AT(cfg, err,
                   "training.seq_len %" PRId64
                   " must be a multiple of tensor_parallel_degree %" PRId64
                   " (sequence parallelism splits it)",
                   seq, tp);
  }
  if (cp > 1 && seq % (2 * cp) != 0) {
    static const tr_config_key_id_t ids_[] = {
        TR_CFG_K_training_seq_len,
        TR_CFG_K_parallelism_context_parallel_degree};
    return FAIL_AT(cfg, err,
                   "training.seq_len %" PRId64
                   " must be a multiple of 2 x context_parallel_degree = "
                   "%" PRId64,
                   seq, 2 * cp);
  }

  /* learning-rate schedule: total_steps unset becomes training.steps. Like
   * torchtitan, a warmup (plus decay_ratio's steps) longer than the schedule
   * is not an error: the trainer shortens it with a warning (trainer/lr.c),
   * so `--training.steps 5` works on any job file. */
  {
    typeof(cfg->lr_scheduler)* lr = &cfg->lr_scheduler;
    int64_t sched_total = cfg->training.steps;
    if (!lr->total_steps.set ||
        cfg->tr__origin[TR_CFG_K_lr_scheduler_total_steps].from ==
            TR_CFG_FROM_RESOLVE) {
      lr->total_steps.set = true;
      lr->total_steps.value = sched_total;
      cfg->tr__origin[TR_CFG_K_lr_scheduler_total_steps].from =
          TR_CFG_FROM_RESOLVE;
    }
  }

  if (cfg->checkpoint.create_seed_checkpoint && world_size != 1) {
    static const tr_config_key_id_t ids_[] = {
        TR_CFG_K_checkpoint_create_seed_checkpoint};
    return FAIL_AT(cfg, err,
                   "checkpoint.create_seed_checkpoint needs a world size of 1, "
                   "got %" PRId64,
                   world_size);
  }

  cfg->derived.world_size = world_size;
  cfg->derived.dp = dp;
  cfg->derived.grad_accum_steps = cfg->training.global_batch_size / per_step;
  return 0;
}

/* ---- comparing ---- */

static int value_equal(const tr_config_key_t* k, const void* a, const void* b) {
  switch (k->type) {
    case TR_CFG_T_INT:
      return *(const int64_t*)a == *(const int64_t*)b;
    case TR_CFG_T_FLOAT: {
      double x = *(const double*)a, y = *(const double*)b;
      return x == y || (isnan(x) && isnan(y));
    }
    case TR_CFG_T_BOOL:
      return *(const bool*)a == *(const bool*)b;
    case TR_CFG_T_OPT_INT: {
      const tr_config_opt_int_t *x = a, *y = b;
      return x->set == y->set && (!x->set || x->value == y->value);
    }
    case TR_CFG_T_OPT_FLOAT: {
      const tr_config_opt_float_t *x = a, *y = b;
      return x->set == y->set && (!x->set || x->value == y->value);
    }
    case TR_CFG_T_LIST: {
      const tr_config_list_t *x = a, *y = b;
      if (x->n != y->n) return 0;
      for (size_t i = 0; i < x->n; i++)
        if (strcmp(x->v[i], y->v[i]) != 0) return 0;
      return 1;
    }
    default: {
      const char *x = *(char*const*)a, *y = *(char*const*)b;
      if (!x || !y) return x == y;
      return strcmp(x, y) == 0;
    }
  }
}

int tr_config_is_default(const tr_config_t* cfg, tr_config_key_id_t id) {
  if ((unsigned)id >= TR_CFG__NKEYS) return 1;
  const tr_config_key_t* k = &keys[id];
  if (!k->def) { /* unset by default */
    const void* f = cfield(cfg, k);
    switch (k->type) {
      case TR_CFG_T_OPT_INT:
        return !((const tr_config_opt_int_t*)f)->set;
      case TR_CFG_T_OPT_FLOAT:
        return !((const tr_config_opt_float_t*)f)->set;
      default:
        return *(char* const*)f == NULL;
    }
  }
  tr_config_t tmp;
  tr_errmsg_t err;
  memset(&tmp, 0, sizeof tmp);
  if (set_text(&tmp, k, k->def, NULL, &err) < 0) { /* out of memory */
    tr_config_release(&tmp);
    return 1;
  }
  int same = value_equal(k, cfield(cfg, k), cfield(&tmp, k));
  tr_config_release(&tmp);
  return same;
}

int tr_config_equal(const tr_config_t* a, const tr_config_t* b,
                    const char** first_diff) {
  for (size_t i = 0; i < TR_CFG__NKEYS; i++) {
    if (!value_equal(&keys[i], cfield(a, &keys[i]), cfield(b, &keys[i]))) {
      if (first_diff) *first_diff = keys[i].name;
      return 0;
    }
  }
  if (first_diff) *first_diff = NULL;
  return 1;
}

/* ---- TOML output ---- */

static void toml_string(FILE* out, const char* s) {
  fputc('"', out);
  for (const unsigned char* p = (const unsigned char*)s; *p; p++) {
    switch (*p) {
      case '"':
        fputs("\\\"", out);
        break;
      case '\\':
        fputs("\\\\", out);
        break;
      case '\b':
        fputs("\\b", out);
        break;
      case '\t':
        fputs("\\t", out);
        break;
      case '\n':
        fputs("\\n", out);
        break;
      case '\f':
        fputs("\\f", out);
        break;
      case '\r':
        fputs("\\r", out);
        break;
      default:
        if (*p < 0x20 || *p == 0x7f)
          fprintf(out, "\\u%04X", *p);
        else
          fputc(*p, out);
    }
  }
  fputc('"', out);
}

/* The value as TOML; 0 when the key is unset (nothing written). */
static int toml_value(FILE* out, const tr_config_key_t* k, const void* f) {
  char num[64];
  switch (k->type) {
    case TR_CFG_T_INT:
      fprintf(out, "%" PRId64, *(const int64_t*)f);
      return 1;
    case TR_CFG_T_OPT_INT: {
      const tr_config_opt_int_t* o = f;
      if (!o->set) return 0;
      fprintf(out, "%" PRId64, o->value);
      return 1;
    }
    case TR_CFG_T_FLOAT:
      fmt_toml_float(num, sizeof num, *(const double*)f);
      fputs(num, out);
      return 1;
    case TR_CFG_T_OPT_FLOAT: {
      const tr_config_opt_float_t* o = f;
      if (!o->set) return 0;
      fmt_toml_float(num, sizeof num, o->value);
      fputs(num, out);
      return 1;
    }
    case TR_CFG_T_BOOL:
      fputs(*(const bool*)f ? "true" : "false", out);
      return 1;
    case TR_CFG_T_LIST: {
      const tr_config_list_t* l = f;
      fputc('[', out);
      for (size_t i = 0; i < l->n; i++) {
        if (i) fputs(", ", out);
        toml_string(out, l->v[i]);
      }
      fputc(']', out);
      return 1;
    }
    default: {
      const char* s = *(char* const*)f;
      if (!s) return 0;
      toml_string(out, s);
      return 1;
    }
  }
}

int tr_config_print_toml(const tr_config_t* cfg, FILE* out) {
  for (size_t s = 0; s < NSECTIONS; s++) {
    fprintf(out, "%s[%s]\n", s ? "\n" : "", sections[s].name);
    for (size_t i = 0; i < TR_CFG__NKEYS; i++) {
      const tr_config_key_t* k = &keys[i];
      if (section_of(k) != (int)s) continue;
      const void* f = cfield(cfg, k);
      if (k->type == TR_CFG_T_SECRET) {
        fprintf(out, "# %s is %s\n", k->key,
                *(char* const*)f ? "set (hidden)" : "unset");
        continue;
      }
      if (is_nullable(k->type)) {
        /* probe: unset values print as a comment */
        const int set = k->type == TR_CFG_T_OPT_INT
                            ? ((const tr_config_opt_int_t*)f)->set
                        : k->type == TR_CFG_T_OPT_FLOAT
                            ? ((const tr_config_opt_float_t*)f)->set
                            : *(char* const*)f != NULL;
        if (!set) {
          fprintf(out, "# %s is unset\n", k->key);
          continue;
        }
      }
      fprintf(out, "%s = ", k->key);
      toml_value(out, k, f);
      fputc('\n', out);
    }
  }
  if (fflush(out) != 0 || ferror(out)) return tr_err_from_errno();
  return 0;
}

/* ---- JSON output ---- */

static json_t* json_value(const tr_config_key_t* k, const void* f) {
  switch (k->type) {
    case TR_CFG_T_INT:
      return json_integer(*(const int64_t*)f);
    case TR_CFG_T_OPT_INT: {
      const tr_config_opt_int_t* o = f;
      return o->set ? json_integer(o->value) : json_null();
    }
    case TR_CFG_T_FLOAT: {
      double x = *(const double*)f;
      return isfinite(x) ? json_real(x) : json_null();
    }
    case TR_CFG_T_OPT_FLOAT: {
      const tr_config_opt_float_t* o = f;
      return o->set && isfinite(o->value) ? json_real(o->value) : json_null();
    }
    case TR_CFG_T_BOOL:
      return json_boolean(*(const bool*)f);
    case TR_CFG_T_LIST: {
      const tr_config_list_t* l = f;
      json_t* a = json_array();
      for (size_t i = 0; a && i < l->n; i++)
        if (json_array_append_new(a, json_string(l->v[i])) < 0) {
          json_decref(a);
          return NULL;
        }
      return a;
    }
    case TR_CFG_T_SECRET:
      return *(char* const*)f ? json_string("<hidden>") : json_null();
    default: {
      const char* s = *(char* const*)f;
      return s ? json_string(s) : json_null();
    }
  }
}

/* Digits needed so that every float of the config reads back exactly. */
static int float_digits(const tr_config_t* cfg) {
  int need = 1;
  char buf[64];
  for (size_t i = 0; i < TR_CFG__NKEYS; i++) {
    const tr_config_key_t* k = &keys[i];
    double x;
    if (k->type == TR_CFG_T_FLOAT)
      x = *(const double*)cfield(cfg, k);
    else if (k->type == TR_CFG_T_OPT_FLOAT &&
             ((const tr_config_opt_float_t*)cfield(cfg, k))->set)
      x = ((const tr_config_opt_float_t*)cfield(cfg, k))->value;
    else
      continue;
    if (!isfinite(x)) continue;
    for (int p = 1; p <= 17; p++) {
      snprintf(buf, sizeof buf, "%.*g", p, x);
      if (strtod(buf, NULL) == x || p == 17) {
        if (p > need) need = p;
        break;
      }
    }
  }
  return need;
}

int tr_config_print_json(const tr_config_t* cfg, FILE* out) {
  json_t* root = json_object();
  if (!root) return TR_ENOMEM;
  for (size_t s = 0; s < NSECTIONS; s++) {
    json_t* sec = json_object();
    if (!sec || json_object_set_new(root, sections[s].name, sec) < 0)
      goto out_nomem;
    for (size_t i = 0; i < TR_CFG__NKEYS; i++) {
      const tr_config_key_t* k = &keys[i];
      if (section_of(k) != (int)s) continue;
      json_t* v = json_value(k, cfield(cfg, k));
      if (!v || json_object_set_new(sec, k->key, v) < 0) goto out_nomem;
    }
  }
  int rc = json_dumpf(root, out,
                      JSON_INDENT(2) | JSON_PRESERVE_ORDER |
                          JSON_REAL_PRECISION(float_digits(cfg)));
  json_decref(root);
  if (rc < 0 || fputc('\n', out) == EOF || fflush(out) != 0)
    return tr_err_from_errno();
  return 0;
out_nomem:
  json_decref(root);
  return TR_ENOMEM;
}

/* ---- describing keys ---- */

void tr_config_key_type_text(const tr_config_key_t* k, char* buf, size_t cap) {
  char lo[40], hi[40], ch[200];
  const char* range = "";
  buf[0] = 0;
  switch (k->type) {
    case TR_CFG_T_INT:
    case TR_CFG_T_OPT_INT:
    case TR_CFG_T_FLOAT:
    case TR_CFG_T_OPT_FLOAT:
      fmt_bound(lo, sizeof lo, k, k->min);
      fmt_bound(hi, sizeof hi, k, k->max);
      if (!isinf(k->min) && !isinf(k->max))
        range = " from ";
      else if (!isinf(k->min))
        range = ", at least ";
      else if (!isinf(k->max))
        range = ", at most ";
      snprintf(buf, cap, "%s%s%s%s%s",
               is_intish(k->type) ? "integer" : "number", range,
               !range[0] || isinf(k->min) ? "" : lo,
               !isinf(k->min) && !isinf(k->max) ? " to " : "",
               !range[0] || isinf(k->max) ? "" : hi);
      break;
    case TR_CFG_T_BOOL:
      snprintf(buf, cap, "boolean");
      break;
    case TR_CFG_T_ENUM:
      choices_text(k->choices, ch, sizeof ch);
      snprintf(buf, cap, "%s%s", strchr(ch, ',') ? "one of " : "", ch);
      break;
    case TR_CFG_T_LIST:
      snprintf(buf, cap, "array of strings");
      break;
    case TR_CFG_T_SECRET:
      snprintf(buf, cap, "secret string");
      break;
    default:
      snprintf(buf, cap, "string");
  }
  if (is_nullable(k->type)) cat(buf, cap, ", may be unset");
}

int tr_config_print_default(const tr_config_key_t* k, FILE* out) {
  if (k->type == TR_CFG_T_SECRET || !k->def) return 0;
  tr_config_t tmp;
  tr_errmsg_t err;
  memset(&tmp, 0, sizeof tmp);
  int rc = set_text(&tmp, k, k->def, NULL, &err);
  if (rc == 0) rc = toml_value(out, k, cfield(&tmp, k));
  tr_config_release(&tmp);
  return rc;
}
