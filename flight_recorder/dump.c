/* flight_recorder/dump.c: a snapshot as PyTorch's flight-recorder dump --
 * the pickle (protocol 2, as c10's pickler writes it: dicts, lists,
 * tuples, unicode strings, ints, floats, bools, None; the dict layout of
 * dump version "2.10" that torchfrtrace loads) and the JSON twin (PyTorch's
 * dump_json keys: pg_status values as decimal strings, 0 for times not
 * seen, no frames). Files are written to a temporary name, fsynced and
 * renamed, then the folder is fsynced. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/buf.h"      /* the pickle being built */
#include "core/internal.h" /* mkdir -p, atomic writes */
#include "flight_recorder/ring.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/param.h" /* TRAINRUN_FR_NCCL_NAMES */

/* PyTorch's ScalarType names. */
static const char* scalar_type(tr_dtype_t d) {
  switch (d) {
    case TR_F32:
      return "Float";
    case TR_BF16:
      return "BFloat16";
    case TR_F16:
      return "Half";
    case TR_I32:
      return "Int";
    case TR_I64:
      return "Long";
    case TR_U16:
      return "UInt16";
    case TR_U8:
      return "Byte";
    default:
      return "Undefined";
  }
}

/* "[0, 1, 2]", malloc()ed. */
static char* ranks_str(const tr_fr_pg_t* pg) {
  size_t cap = 3 + (size_t)(pg->n > 0 ? pg->n : 0) * 13;
  char* s = malloc(cap);
  if (!s) return NULL;
  size_t n = 0;
  s[n++] = '[';
  for (int i = 0; i < pg->n; i++)
    n += (size_t)snprintf(s + n, cap - n, "%s%d", i ? ", " : "", pg->ranks[i]);
  s[n++] = ']';
  s[n] = '\0';
  return s;
}

static const char* comm_lib_version(void) {
  return "trainrun-" PACKAGE_VERSION;
}

/* The profiling name as dumped: "gloo:all_reduce", or with
 * TRAINRUN_FR_NCCL_NAMES "nccl:all_reduce" (torchfrtrace asserts the
 * backend is nccl or xccl). */
static const char* dumped_name(const char* name, char* buf, size_t cap) {
  const char* colon = strchr(name, ':');
  if (!colon || !tr_param_bool(TR_PARAM_FR_NCCL_NAMES)) return name;
  snprintf(buf, cap, "nccl%s", colon);
  return buf;
}

/* ---- pickle protocol 2 ---- */

/* The pickle is built in a core/buf.h buffer: a failed growth sticks in
 * p->oom, checked once at the end. */
typedef tr__buf_t pk_t;

static void pk_raw(pk_t* p, const void* d, size_t n) { tr__buf_add(p, d, n); }

static void pk_op(pk_t* p, unsigned char op) { pk_raw(p, &op, 1); }

static void pk_int(pk_t* p, int64_t v) {
  if (v >= 0 && v < 256) {
    unsigned char b[2] = {'K', (unsigned char)v}; /* BININT1 */
    pk_raw(p, b, 2);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    unsigned char b[5] = {'J'}; /* BININT, little-endian */
    uint32_t u = (uint32_t)(int32_t)v;
    for (int i = 0; i < 4; i++) b[1 + i] = (unsigned char)(u >> (8 * i));
    pk_raw(p, b, 5);
  } else {
    unsigned char b[10] = {0x8a, 8}; /* LONG1, 8 bytes two's complement */
    uint64_t u = (uint64_t)v;
    for (int i = 0; i < 8; i++) b[2 + i] = (unsigned char)(u >> (8 * i));
    pk_raw(p, b, 10);
  }
}

static void pk_float(pk_t* p, double d) {
  unsigned char b[9] = {'G'}; /* BINFLOAT, big-endian */
  uint64_t u;
  memcpy(&u, &d, 8);
  for (int i = 0; i < 8; i++) b[1 + i] = (unsigned char)(u >> (8 * (7 - i)));
  pk_raw(p, b, 9);
}

static void pk_str(pk_t* p, const char* s) {
  size_t n = strlen(s);
  unsigned char b[5] = {'X'}; /* BINUNICODE */
  for (int i = 0; i < 4; i++) b[1 + i] = (unsigned char)(n >> (8 * i));
  pk_raw(p, b, 5);
  pk_raw(p, s, n);
}

static void pk_bool(pk_t* p, int v) { pk_op(p, v ? 0x88 : 0x89); }
static void pk_none(pk_t* p) { pk_op(p, 'N'); }
static void pk_dict_begin(pk_t* p) {
  pk_op(p, '}'); /* EMPTY_DICT */
  pk_op(p, '('); /* MARK */
}
static void pk_dict_end(pk_t* p) { pk_op(p, 'u'); } /* SETITEMS */
static void pk_list_begin(pk_t* p) {
  pk_op(p, ']'); /* EMPTY_LIST */
  pk_op(p, '(');
}
static void pk_list_end(pk_t* p) { pk_op(p, 'e'); } /* APPENDS */

static void pk_sizes(pk_t* p, int n, const tr_pg_tensor_meta_t* m) {
  pk_list_begin(p);
  for (int i = 0; i < n; i++) {
    pk_list_begin(p);
    for (int d = 0; d < m[i].ndim; d++) pk_int(p, m[i].shape[d]);
    pk_list_end(p);
  }
  pk_list_end(p);
}

static void pk_dtypes(pk_t* p, int n, const tr_pg_tensor_meta_t* m) {
  pk_list_begin(p);
  for (int i = 0; i < n; i++) pk_str(p, scalar_type(m[i].dtype));
  pk_list_end(p);
}

static void pk_entry(pk_t* p, const tr_fr_entry_t* e) {
  char tid[32];
  snprintf(tid, sizeof tid, "%lld", (long long)e->thread_id);
  pk_dict_begin(p);
  pk_str(p, "record_id");
  pk_int(p, e->record_id);
  pk_str(p, "pg_id");
  pk_int(p, e->pg_id);
  pk_str(p, "process_group");
  pk_op(p, '(');
  pk_str(p, e->pg_name);
  pk_str(p, e->pg_desc);
  pk_op(p, 't'); /* TUPLE */
  pk_str(p, "collective_seq_id");
  pk_int(p, e->collective_seq_id);
  pk_str(p, "p2p_seq_id");
  pk_int(p, e->p2p_seq_id);
  pk_str(p, "op_id");
  pk_int(p, e->op_id);
  char nb[TR_FR_NAME_MAX + 8];
  pk_str(p, "profiling_name");
  pk_str(p, dumped_name(e->profiling_name, nb, sizeof nb));
  pk_str(p, "time_created_ns");
  pk_int(p, e->time_created_ns);
  if (e->has_duration) {
    pk_str(p, "duration_ms");
    pk_float(p, e->duration_ms);
  }
  pk_str(p, "input_sizes");
  pk_sizes(p, e->n_inputs, e->inputs);
  pk_str(p, "input_dtypes");
  pk_dtypes(p, e->n_inputs, e->inputs);
  pk_str(p, "output_sizes");
  pk_sizes(p, e->n_outputs, e->outputs);
  pk_str(p, "output_dtypes");
  pk_dtypes(p, e->n_outputs, e->outputs);
  pk_str(p, "state");
  pk_str(p, tr_fr_state_name(e->state));
  pk_str(p, "time_discovered_started_ns");
  if (e->time_started_ns)
    pk_int(p, e->time_started_ns);
  else
    pk_none(p);
  pk_str(p, "time_discovered_completed_ns");
  if (e->time_completed_ns)
    pk_int(p, e->time_completed_ns);
  else
    pk_none(p);
  pk_str(p, "retired");
  pk_bool(p, e->retired);
  pk_str(p, "timeout_ms");
  pk_int(p, e->timeout_ms);
  pk_str(p, "is_p2p");
  pk_bool(p, e->is_p2p);
  pk_str(p, "thread_id");
  pk_str(p, tid);
  pk_str(p, "thread_name");
  pk_str(p, e->thread_name);
  pk_str(p, "frames");
  pk_list_begin(p);
  for (int i = 0; i < e->nframes; i++) {
    pk_dict_begin(p);
    pk_str(p, "name");
    pk_str(p, e->frames[i].name);
    pk_str(p, "filename");
    pk_str(p, e->frames[i].file);
    pk_str(p, "line");
    pk_int(p, 0);
    pk_dict_end(p);
  }
  pk_list_end(p);
  pk_dict_end(p);
}

int tr_fr_dump_pickle(const tr_fr_snapshot_t* s, char** buf, size_t* len) {
  pk_t p = TR__BUF_INIT;
  unsigned char proto[2] = {0x80, 2}; /* PROTO 2 */
  pk_raw(&p, proto, 2);
  pk_dict_begin(&p);
  pk_str(&p, "version");
  pk_str(&p, TR_FR_DUMP_VERSION);
  pk_str(&p, "comm_lib_version");
  pk_str(&p, comm_lib_version());
  pk_str(&p, "pg_config");
  pk_dict_begin(&p);
  for (int i = 0; i < s->npgs; i++) {
    const tr_fr_pg_t* g = &s->pgs[i];
    char* rs = ranks_str(g);
    if (!rs) p.oom = 1;
    pk_str(&p, g->name);
    pk_dict_begin(&p);
    pk_str(&p, "name");
    pk_str(&p, g->name);
    pk_str(&p, "desc");
    pk_str(&p, g->desc);
    pk_str(&p, "ranks");
    pk_str(&p, rs ? rs : "[]");
    pk_dict_end(&p);
    free(rs);
  }
  pk_dict_end(&p);
  pk_str(&p, "pg_status");
  pk_dict_begin(&p);
  for (int i = 0; i < s->npgs; i++) {
    const tr_fr_pg_t* g = &s->pgs[i];
    char id[32];
    snprintf(id, sizeof id, "%lld", (long long)g->pg_id);
    pk_str(&p, id);
    pk_dict_begin(&p);
    pk_str(&p, "last_enqueued_collective");
    pk_int(&p, g->last_enqueued);
    pk_str(&p, "last_started_collective");
    pk_int(&p, g->last_started);
    pk_str(&p, "last_completed_collective");
    pk_int(&p, g->last_completed);
    pk_dict_end(&p);
  }
  pk_dict_end(&p);
  pk_str(&p, "entries");
  pk_list_begin(&p);
  for (size_t i = 0; i < s->nentries; i++) pk_entry(&p, &s->entries[i]);
  pk_list_end(&p);
  pk_dict_end(&p);
  pk_op(&p, '.'); /* STOP */
  if (p.oom) {
    tr__buf_release(&p);
    return TR_ENOMEM;
  }
  *buf = p.buf;
  *len = p.len;
  return 0;
}

/* ---- JSON ---- */

static json_t* js_sizes(int n, const tr_pg_tensor_meta_t* m) {
  json_t* a = json_array();
  for (int i = 0; i < n; i++) {
    json_t* s = json_array();
    for (int d = 0; d < m[i].ndim; d++)
      json_array_append_new(s, json_integer(m[i].shape[d]));
    json_array_append_new(a, s);
  }
  return a;
}

static json_t* js_dtypes(int n, const tr_pg_tensor_meta_t* m) {
  json_t* a = json_array();
  for (int i = 0; i < n; i++)
    json_array_append_new(a, json_string(scalar_type(m[i].dtype)));
  return a;
}

static char* i64s(int64_t v, char* buf) {
  sprintf(buf, "%lld", (long long)v);
  return buf;
}

int tr_fr_dump_json(const tr_fr_snapshot_t* s, char** text) {
  json_t* root = json_object();
  json_t* cfg = json_object();
  json_t* st = json_object();
  char b[32];
  if (!root || !cfg || !st) {
    json_decref(root);
    json_decref(cfg);
    json_decref(st);
    return TR_ENOMEM;
  }
  json_object_set_new(root, "version", json_string(TR_FR_DUMP_VERSION));
  json_object_set_new(root, "comm_lib_version",
                      json_string(comm_lib_version()));
  for (int i = 0; i < s->npgs; i++) {
    const tr_fr_pg_t* g = &s->pgs[i];
    char* rs = ranks_str(g);
    json_object_set_new(cfg, g->name,
                        json_pack("{s:s, s:s, s:s}", "name", g->name, "desc",
                                  g->desc, "ranks", rs ? rs : "[]"));
    free(rs);
    char id[32], x[32], y[32], z[32];
    snprintf(id, sizeof id, "%lld", (long long)g->pg_id);
    json_object_set_new(
        st, id,
        json_pack("{s:s, s:s, s:s}", "last_enqueued_collective",
                  i64s(g->last_enqueued, x), "last_started_collective",
                  i64s(g->last_started, y), "last_completed_collective",
                  i64s(g->last_completed, z)));
  }
  json_object_set_new(root, "pg_config", cfg);
  json_object_set_new(root, "pg_status", st);
  if (s->nentries) {
    json_t* ents = json_array();
    for (size_t i = 0; i < s->nentries; i++) {
      const tr_fr_entry_t* e = &s->entries[i];
      json_t* o = json_object();
      json_object_set_new(o, "record_id", json_integer(e->record_id));
      json_object_set_new(o, "pg_id", json_integer(e->pg_id));
      json_object_set_new(o, "process_group",
                          json_pack("[s, s]", e->pg_name, e->pg_desc));
      json_object_set_new(o, "collective_seq_id",
                          json_integer(e->collective_seq_id));
      json_object_set_new(o, "p2p_seq_id", json_integer(e->p2p_seq_id));
      json_object_set_new(o, "op_id", json_integer(e->op_id));
      char nb[TR_FR_NAME_MAX + 8];
      json_object_set_new(
          o, "profiling_name",
          json_string(dumped_name(e->profiling_name, nb, sizeof nb)));
      json_object_set_new(o, "time_created_ns",
                          json_integer(e->time_created_ns));
      if (e->has_duration)
        json_object_set_new(o, "duration_ms", json_real(e->duration_ms));
      json_object_set_new(o, "input_sizes", js_sizes(e->n_inputs, e->inputs));
      json_object_set_new(o, "input_dtypes", js_dtypes(e->n_inputs, e->inputs));
      json_object_set_new(o, "output_sizes",
                          js_sizes(e->n_outputs, e->outputs));
      json_object_set_new(o, "output_dtypes",
                          js_dtypes(e->n_outputs, e->outputs));
      json_object_set_new(o, "state", json_string(tr_fr_state_name(e->state)));
      json_object_set_new(o, "time_discovered_started_ns",
                          json_integer(e->time_started_ns));
      json_object_set_new(o, "time_discovered_completed_ns",
                          json_integer(e->time_completed_ns));
      json_object_set_new(o, "retired", json_boolean(e->retired));
      json_object_set_new(o, "timeout_ms", json_integer(e->timeout_ms));
      json_object_set_new(o, "is_p2p", json_boolean(e->is_p2p));
      json_object_set_new(o, "thread_id", json_string(i64s(e->thread_id, b)));
      json_object_set_new(o, "thread_name", json_string(e->thread_name));
      json_array_append_new(ents, o);
    }
    json_object_set_new(root, "entries", ents);
  }
  *text = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  return *text ? 0 : TR_ENOMEM;
}

/* ---- files ---- */

int tr_fr_dump_write(const tr_fr_snapshot_t* s, const char* dir,
                     const char* prefix, char* path, size_t cap) {
  if (!dir) dir = s->dump_dir[0] ? s->dump_dir : ".";
  if (!prefix) prefix = s->dump_prefix;
  /* The JSON twin lives in the sibling folder <dir>_json: torchfrtrace
   * reads every file under <dir> whose name holds the prefix, and would
   * choke on rank_N.json there. */
  char file[4096], jdir[4200], jfile[4400];
  int n = snprintf(file, sizeof file, "%s/%s%d", dir, prefix, s->rank);
  if (n < 0 || (size_t)n >= sizeof file) return TR_ENAMETOOLONG;
  snprintf(jdir, sizeof jdir, "%s_json", dir);
  snprintf(jfile, sizeof jfile, "%s/%s%d.json", jdir, prefix, s->rank);
  tr_errmsg_t err;
  tr_errmsg_clear(&err);
  char* pk = NULL;
  size_t pklen = 0;
  char* js = NULL;
  int rc = tr__mkdir_p(dir, &err);
  if (rc == 0) rc = tr__mkdir_p(jdir, &err);
  if (rc == 0) rc = tr_fr_dump_pickle(s, &pk, &pklen);
  if (rc == 0) rc = tr_fr_dump_json(s, &js);
  if (rc == 0) rc = tr__write_file(file, pk, pklen, &err);
  if (rc == 0) rc = tr__write_file(jfile, js, strlen(js), &err);
  if (rc < 0)
    TR_LOG_ERROR(FR, "cannot write the dump '%s': %s", file,
                 err.code ? err.message : tr_strerror(rc));
  else if (path)
    snprintf(path, cap, "%s", file);
  free(pk);
  free(js);
  return rc;
}
