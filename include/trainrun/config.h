/* trainrun/config.h: the typed job config.
 *
 * A job is described by torchtitan-style TOML sections ([job] [model]
 * [training] [parallelism] ...; the full list with defaults is
 * trainrun/config_schema.h and trainrun.toml(5)) and command-line overrides
 * `--section.key value`. Values come from, in order of precedence:
 *
 *   command-line overrides  >  the TOML job file  >  the schema defaults
 *
 * Every key is a typed field of tr_config_t, generated from the schema:
 *
 *   cfg.training.steps                       int64_t
 *   cfg.optimizer.lr                         double
 *   cfg.checkpoint.enable                    bool
 *   cfg.job.dump_folder                      char*  (never NULL)
 *   cfg.activation_checkpoint.mode           char*  ("selective", ...)
 *   cfg.checkpoint.exclude_from_loading      tr_config_list_t
 *   cfg.lr_scheduler.total_steps             tr_config_opt_int_t (.set, .value)
 *   cfg.training.dataset_path                char*  (NULL when unset)
 *
 * Typical use (the launcher's):
 *
 *   tr_config_t cfg;
 *   tr_errmsg_t err;
 *   if (tr_config_load(&cfg, "job.toml", argc, argv, &err) < 0 ||
 *       tr_config_resolve(&cfg, world_size, &err) < 0) {
 *     fprintf(stderr, "trainrun: %s\n", err.message);
 *     tr_config_release(&cfg);
 *     return 2;
 *   }
 *   ... cfg.training.steps ...
 *   tr_config_release(&cfg);
 *
 * Errors: every function that checks input returns TR_ECONFIG (or TR_ENOMEM,
 * or a negated errno when the file cannot be read) and, when given one,
 * fills a tr_errmsg_t (trainrun/errmsg.h: the code and a message, no
 * newline) whose message names where the bad value came from:
 *
 *   job.toml:12:9: training.steps: expected an integer, got a string
 *   job.toml:4:1: unknown key 'stpes' in [training]; did you mean 'steps'?
 *   --training.steps: expected an integer, got 'ten'
 *   --trainig.steps: unknown option; did you mean '--training.steps'?
 *
 * Ownership: strings and lists in a tr_config_t belong to it; set them only
 * through tr_config_set() (or free the old value yourself). Release with
 * tr_config_release(). A config is not thread-safe while it is modified;
 * once loaded it may be read from any thread.
 */
#ifndef TRAINRUN_CONFIG_H
#define TRAINRUN_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "trainrun/config_schema.h"
#include "trainrun/errmsg.h"
#include "trainrun/tensor.h" /* tr_device_t */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- value types ---- */

typedef struct {
  size_t n;
  char** v; /* n strings, owned */
} tr_config_list_t;

typedef struct {
  bool set; /* false: unset (torchtitan's None) */
  int64_t value;
} tr_config_opt_int_t;

typedef struct {
  bool set;
  double value;
} tr_config_opt_float_t;

typedef enum {
  TR_CFG_T_INT,
  TR_CFG_T_FLOAT,
  TR_CFG_T_BOOL,
  TR_CFG_T_STR,
  TR_CFG_T_ENUM,
  TR_CFG_T_LIST,
  TR_CFG_T_OPT_INT,
  TR_CFG_T_OPT_FLOAT,
  TR_CFG_T_OPT_STR,
  TR_CFG_T_SECRET
} tr_config_type_t;

/* C type of each schema TYPE (used to generate the struct). */
#define TR__CFG_CTYPE_INT int64_t
#define TR__CFG_CTYPE_FLOAT double
#define TR__CFG_CTYPE_BOOL bool
#define TR__CFG_CTYPE_STR char*
#define TR__CFG_CTYPE_ENUM char*
#define TR__CFG_CTYPE_LIST tr_config_list_t
#define TR__CFG_CTYPE_OPT_INT tr_config_opt_int_t
#define TR__CFG_CTYPE_OPT_FLOAT tr_config_opt_float_t
#define TR__CFG_CTYPE_OPT_STR char*
#define TR__CFG_CTYPE_SECRET char*

/* ---- key ids: TR_CFG_K_<section>_<key>, in schema order ---- */

typedef enum {
#define TR__CFG_KEY_ENUM(sec, key, type, def, lo, hi, choices, doc) \
  TR_CFG_K_##sec##_##key,
#define TR__CFG_SEC_ENUM(sec, doc) TR_CONFIG_KEYS_##sec(TR__CFG_KEY_ENUM)
  TR_CONFIG_SECTIONS(TR__CFG_SEC_ENUM)
#undef TR__CFG_SEC_ENUM
#undef TR__CFG_KEY_ENUM
      TR_CFG__NKEYS
} tr_config_key_id_t;

/* Where a key's value came from (for messages about cross-field checks). */
typedef enum {
  TR_CFG_FROM_DEFAULT = 0,
  TR_CFG_FROM_FILE,   /* file:line:col */
  TR_CFG_FROM_CLI,    /* --section.key */
  TR_CFG_FROM_RESOLVE /* computed by tr_config_resolve */
} tr_config_from_t;

typedef struct {
  unsigned short from; /* tr_config_from_t */
  unsigned short file; /* index into the config's file list */
  int line, col;
} tr__config_origin_t;

/* ---- the config ---- */

typedef struct {
#define TR__CFG_FIELD(sec, key, type, def, lo, hi, choices, doc) \
  TR__CFG_CTYPE_##type key;
#define TR__CFG_SEC_STRUCT(sec, doc)    \
  struct {                              \
    TR_CONFIG_KEYS_##sec(TR__CFG_FIELD) \
  } sec;
  TR_CONFIG_SECTIONS(TR__CFG_SEC_STRUCT)
#undef TR__CFG_SEC_STRUCT
#undef TR__CFG_FIELD

  /* Filled by tr_config_resolve(); not part of the schema or the printed
   * config. */
  struct {
    int64_t world_size;
    int64_t dp;               /* data_parallel_replicate × shard degrees */
    int64_t grad_accum_steps; /* global / (local × dp) */
  } derived;

  /* Private: where values came from. */
  tr__config_origin_t tr__origin[TR_CFG__NKEYS];
  char** tr__files; /* names of the TOML files merged, owned */
  size_t tr__nfiles;
} tr_config_t;

/* The config functions' error type before they took a tr_errmsg_t; an
 * alias for code written against the old name, to be dropped. */
typedef tr_errmsg_t tr_config_error_t;

/* ---- the schema, for tools (help text, man page, tests) ---- */

typedef struct {
  tr_config_key_id_t id;
  const char* section; /* "training" */
  const char* key;     /* "steps" */
  const char* name;    /* "training.steps" */
  tr_config_type_t type;
  const char* def;     /* default as command-line text; NULL when unset */
  double min, max;     /* inclusive bounds of INT/FLOAT/OPT_* keys */
  const char* choices; /* ENUM: "a|b|c"; NULL otherwise */
  const char* doc;
  size_t offset; /* of the field in tr_config_t */
} tr_config_key_t;

/* Number of keys and key i (in schema order; i == id). */
size_t tr_config_nkeys(void);
const tr_config_key_t* tr_config_key(size_t i);

/* Look a key up by "section.key" (exact spelling); NULL when unknown. */
const tr_config_key_t* tr_config_find_key(const char* name);

/* Sections: count, name of section i, its one-line description. */
size_t tr_config_nsections(void);
const char* tr_config_section_name(size_t i);
const char* tr_config_section_doc(size_t i);

/* ---- building a config ---- */

/* Fill cfg with the schema defaults. Returns 0 or TR_ENOMEM (then cfg holds
 * nothing to release). */
int tr_config_init(tr_config_t* cfg);

/* Free every string and list the config owns; cfg may be re-initialised. */
void tr_config_release(tr_config_t* cfg);

/* Merge a TOML document into cfg: every key it sets replaces the current
 * value. `name` (the file name) prefixes error positions. Unknown sections
 * and keys, wrong types, out-of-range values and unknown enum values are
 * errors. On error cfg holds a mix of old and new values: release it. */
int tr_config_merge_toml(tr_config_t* cfg, const char* name, const char* text,
                         size_t len, tr_errmsg_t* err);

/* Read path and merge it as above. A file that cannot be read gives the
 * negated errno and "cannot read 'path': <reason>". */
int tr_config_merge_file(tr_config_t* cfg, const char* path, tr_errmsg_t* err);

/* Set one key from command-line text, as `--name value` does. name is
 * "section.key" (dashes accepted for underscores); value is parsed for the
 * key's type (bool: true/false; OPT_*: "none" unsets; LIST: comma list).
 * Errors name the flag: "--training.steps: expected an integer, got 'ten'". */
int tr_config_set(tr_config_t* cfg, const char* name, const char* value,
                  tr_errmsg_t* err);

/* Apply command-line overrides argv[0..argc) in order. Forms:
 *   --section.key value     --section.key=value
 *   --section.key           (bool: true)
 *   --section.no_key        (bool: false)
 * Dashes and underscores are interchangeable in names. Every argument must
 * be an override (split the command line with tr_config_arg_span). */
int tr_config_apply_args(tr_config_t* cfg, int argc, char* const* argv,
                         tr_errmsg_t* err);

/* How many arguments starting at argv[i] form one config override: 0 when
 * argv[i] is not one (it does not start with "--" or its name before any
 * '=' holds no '.'), 1 for `--k=v`, bool flags and overrides at the end of
 * argv, 2 for `--k v`. Unknown dotted names count as overrides (1, or 2 when
 * the next argument does not start with "--"), so tr_config_apply_args
 * reports them. */
int tr_config_arg_span(int argc, char* const* argv, int i);

/* The whole load: defaults, then the job file, then the overrides.
 * path may be NULL when the overrides hold --job.config_file (giving both is
 * an error); job.config_file is set to the file loaded. Initialises cfg
 * even on error (release it either way). */
int tr_config_load(tr_config_t* cfg, const char* path, int argc,
                   char* const* argv, tr_errmsg_t* err);

/* Cross-field checks for a world of world_size ranks, and the values they
 * imply:
 *  - the degrees dp_replicate × dp_shard × cp × tp × pp equal world_size;
 *    data_parallel_shard_degree = -1 becomes the ranks left over;
 *  - expert parallelism borrows from dp_shard × cp (× tp when etp is 1);
 *  - global_batch_size = -1 becomes local_batch_size × dp; otherwise it
 *    must be a multiple of local_batch_size × dp;
 *  - pipeline microbatches divide local_batch_size; seq_len divides by
 *    tp and 2 × cp where those are > 1;
 *  - lr_scheduler.total_steps unset becomes training.steps; warmup (plus
 *    the decay_ratio part) fits in total_steps;
 *  - checkpoint.create_seed_checkpoint needs a world of 1.
 * Fills cfg->derived. Messages name where the first key involved came from
 * (file:line:col or --flag). Calling it again with the same world size
 * succeeds. */
int tr_config_resolve(tr_config_t* cfg, int64_t world_size, tr_errmsg_t* err);

/* The device a rank computes on: [training] device "cpu"; "cuda" (cuda:N
 * with N = local_rank modulo the visible GPUs; TR_EDEVICE with a message
 * naming the key when none is visible); "auto": cuda when a GPU is visible,
 * else cpu. */
int tr_config_device(const tr_config_t* cfg, int local_rank, tr_device_t* out,
                     tr_errmsg_t* err);

/* ---- reading a config ---- */

/* Where key id's value came from, as a message prefix: "job.toml:3:9",
 * "--training.steps", or NULL for defaults and resolved values. Writes into
 * buf (cap bytes) and returns it, or NULL. */
const char* tr_config_origin(const tr_config_t* cfg, tr_config_key_id_t id,
                             char* buf, size_t cap);

/* 1 when every key holds the same value in a and b, else 0 and, when
 * first_diff is not NULL, *first_diff = "section.key" of the first key that
 * differs. derived is not compared. */
int tr_config_equal(const tr_config_t* a, const tr_config_t* b,
                    const char** first_diff);

/* 1 when key id holds its schema default (unset for keys without one),
 * else 0. Values tr_config_resolve computed count as not default. */
int tr_config_is_default(const tr_config_t* cfg, tr_config_key_id_t id);

/* Print the config as a TOML document that tr_config_merge_toml reads back
 * to the same values: every section and key in schema order, unset keys as
 * comments. SECRET keys are never printed (a comment says they are set).
 * Returns 0, or a negated errno when writing fails. */
int tr_config_print_toml(const tr_config_t* cfg, FILE* out);

/* Print the config as one JSON object of sections (unset keys are null,
 * a set SECRET is "<hidden>"), followed by a newline. */
int tr_config_print_json(const tr_config_t* cfg, FILE* out);

/* Key k's type in words, as trainrun.toml(5) gives it: "integer, at least
 * 1", "number from 0 to 1", "one of linear, sqrt or cosine", "boolean",
 * "array of strings", "string, may be unset", ... */
void tr_config_key_type_text(const tr_config_key_t* k, char* buf, size_t cap);

/* Print key k's default as TOML ("2048", "\"./outputs\"", "[]"). Returns
 * 1, or 0 when the key is unset by default or a secret (nothing printed),
 * or TR_ENOMEM. */
int tr_config_print_default(const tr_config_key_t* k, FILE* out);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_CONFIG_H */
