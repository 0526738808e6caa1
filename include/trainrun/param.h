/* trainrun/param.h: the registry of environment variables.
 *
 * Every environment variable trainrun reads is one line of TR_PARAM_MAP
 * (name, type, default, bounds, description), as NCCL_PARAM and Redis's
 * static config table do. A value is read from the environment once, on
 * first use, checked against its type and bounds, and cached; a bad value
 * is reported once with a warning naming the variable and the default is
 * used. `trainrun --help-env` prints the table (tr_param_print).
 *
 * To add a variable: add one XX line below; read it with
 * tr_param_int(TR_PARAM_<NAME>) and friends.
 */
#ifndef TRAINRUN_PARAM_H
#define TRAINRUN_PARAM_H

#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  TR_PARAM_T_INT,    /* int64, bounds inclusive */
  TR_PARAM_T_DOUBLE, /* double, bounds inclusive */
  TR_PARAM_T_BOOL,   /* 0/1/true/false/yes/no/on/off */
  TR_PARAM_T_STRING  /* any text */
} tr_param_type_t;

/* XX(ID, "ENV_NAME", type, "default", min, max, "description") */
#define TR_PARAM_MAP(XX)                                                       \
  XX(LOG_LEVEL, "TRAINRUN_LOG_LEVEL", STRING, "warn", 0, 0,                    \
     "log level: none, error, warn, info, debug, trace")                       \
  XX(LOG_SUBSYS, "TRAINRUN_LOG_SUBSYS", STRING, "all", 0, 0,                   \
     "subsystems to log: comma list of core,config,store,coll,fr,kernels,"     \
     "model,dtensor,fsdp,pp,ckpt,train,daemon,launch; all; ^name excludes")    \
  XX(NUM_THREADS, "TRAINRUN_NUM_THREADS", INT, "0", 0, 4096,                   \
     "CPU kernel threads per rank; 0 = OMP_NUM_THREADS, else the cores")       \
  XX(STORE_TOKEN, "TRAINRUN_STORE_TOKEN", STRING, "", 0, 0,                    \
     "shared secret trainrun store clients prove before any command")          \
  XX(STORE_MAX_KEY, "TRAINRUN_STORE_MAX_KEY_BYTES", INT, "8192", 1, 1048576,   \
     "largest key the store server accepts")                                   \
  XX(STORE_MAX_VALUE, "TRAINRUN_STORE_MAX_VALUE_BYTES", INT, "67108864", 1,    \
     4294967296, "largest value the store server accepts")                     \
  XX(STORE_MAX_MEMORY, "TRAINRUN_STORE_MAX_MEMORY_BYTES", INT, "4294967296",   \
     1048576, INT64_MAX, "total key+value bytes the store server holds")      \
  XX(STORE_MAX_CONNS, "TRAINRUN_STORE_MAX_CONNECTIONS", INT, "262144", 1,      \
     16777216, "connections the store server accepts at once")                 \
  XX(ALLOC_ALIGN, "TRAINRUN_HOST_ALLOC_ALIGN", INT, "64", 16, 4096,            \
     "alignment in bytes of host tensor allocations (a power of two)")

typedef enum {
#define TR__PARAM_ENUM(id, env, type, def, lo, hi, doc) TR_PARAM_##id,
  TR_PARAM_MAP(TR__PARAM_ENUM)
#undef TR__PARAM_ENUM
  TR_PARAM__COUNT
} tr_param_id_t;

/* Cached values. Calling the getter of another type aborts (a bug). */
int64_t tr_param_int(tr_param_id_t id);
double tr_param_double(tr_param_id_t id);
int tr_param_bool(tr_param_id_t id);
const char* tr_param_str(tr_param_id_t id); /* never NULL; owned by registry */

/* 1 when the variable was set in the environment and valid. */
int tr_param_is_set(tr_param_id_t id);

/* Environment name of a parameter ("TRAINRUN_LOG_LEVEL"). */
const char* tr_param_env_name(tr_param_id_t id);

/* Print the table (name, type, default, bounds, current, description). */
void tr_param_print(FILE* out);

/* Forget cached values so the next read sees the environment again (tests,
 * and the daemon after it rewrites a worker's environment). Not thread-safe
 * against concurrent readers. */
void tr_param_reset(void);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_PARAM_H */
