/* checkpoint/safetensors.c: the safetensors format (checked reader, atomic
 * writer) and a model's parameter table as a Hugging Face checkpoint plus
 * its config.json (trainrun/safetensors.h). JSON through jansson. */
#include "config.h"

#include <endian.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h> /* header parsing and writing */

#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/safetensors.h"
#include "core/internal.h"

/* ---- dtypes ---- */

static const struct {
  const char* name;
  tr_dtype_t dt;
} st_dtypes[] = {{"F32", TR_F32}, {"BF16", TR_BF16}, {"F16", TR_F16},
                 {"I32", TR_I32}, {"I64", TR_I64},   {"U16", TR_U16},
                 {"U8", TR_U8}};

const char* tr_st_dtype_name(tr_dtype_t dt) {
  for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
    if (st_dtypes[i].dt == dt) return st_dtypes[i].name;
  return NULL;
}

int tr_st_dtype_parse(const char* s, tr_dtype_t* out) {
  for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
    if (strcmp(st_dtypes[i].name, s) == 0) {
      *out = st_dtypes[i].dt;
      return 0;
    }
  return TR_EDTYPE;
}

/* ---- reading ---- */

void tr_st_release(tr_st_file_t* f) {
  if (f->map) munmap((void*)f->map, f->size);
  for (size_t i = 0; i < f->n; i++) free(f->tensors[i].name);
  free(f->tensors);
  for (size_t i = 0; i < f->nmeta; i++) {
    free(f->meta_keys[i]);
    free(f->meta_values[i]);
  }
  free(f->meta_keys);
  free(f->meta_values);
  free(f->path);
  memset(f, 0, sizeof *f);
}

static int cmp_begin(const void* a, const void* b) {
  const tr_st_tensor_t *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

static const char* shape_str(int ndim, const int64_t* shape, char* buf,
                             size_t cap) {
  size_t w = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < ndim && w < cap; i++)
    w += (size_t)snprintf(buf + w, cap - w, "%s%" PRId64, i ? ", " : "",
                          shape[i]);
  if (w < cap) snprintf(buf + w, cap - w, "]");
  return buf;
}

/* Parse one tensor entry of the header. */
static int parse_entry(tr_st_file_t* f, const char* name, json_t* v,
                       uint64_t data_len, tr_errmsg_t* err) {
  tr_st_tensor_t* e = &f->tensors[f->n];
  memset(e, 0, sizeof *e);
  if (!json_is_object(v))
    return tr_errmsg_set(err, TR_EFORMAT,
                         "'%s': tensor '%s': header entry is not an object",
                         f->path, name);
  json_t* dt = json_object_get(v, "dtype");
  json_t* shape = json_object_get(v, "shape");
  json_t* offs = json_object_get(v, "data_offsets");
  if (!json_is_string(dt) || !json_is_array(shape) || !json_is_array(offs) ||
      json_array_size(offs) != 2)
    return tr_errmsg_set(err, TR_EFORMAT,
                         "'%s': tensor '%s': needs \"dtype\", \"shape\" and "
                         "two \"data_offsets\"",
                         f->path, name);
  if (tr_st_dtype_parse(json_string_value(dt), &e->dtype) < 0)
    return tr_errmsg_set(err, TR_EDTYPE,
                         "'%s': tensor '%s': dtype '%s' is not supported "
                         "(F32, BF16, F16, I32, I64, U16, U8)",
                         f->path, name, json_string_value(dt));
  size_t nd = json_array_size(shape);
  if (nd > TR_MAX_DIMS)
    return tr_errmsg_set(err, TR_EFORMAT,
                         "'%s': tensor '%s': %zu dimensions (at most %d)",
                         f->path, name, nd, TR_MAX_DIMS);
  uint64_t numel = 1;
  e->ndim = (int)nd;
  for (size_t i = 0; i < nd; i++) {
    json_t* d = json_array_get(shape, i);
    if (!json_is_integer(d) || json_integer_value(d) < 0)
      return tr_errmsg_set(err, TR_EFORMAT, "'%s': tensor '%s': bad shape",
                           f->path, name);
    e->shape[i] = json_integer_value(d);
    if (e->shape[i] && numel > UINT64_MAX / 16 / (uint64_t)e->shape[i])
      return tr_errmsg_set(err, TR_EFORMAT,
                           "'%s': tensor '%s': shape too large", f->path, name);
    numel *= (uint64_t)e->shape[i];
  }
  json_t* b = json_array_get(offs, 0);
  json_t* en = json_array_get(offs, 1);
  if (!json_is_integer(b) || !json_is_integer(en) ||
      json_integer_value(b) < 0 ||
      json_integer_value(en) < json_integer_value(b))
    return tr_errmsg_set(err, TR_EFORMAT, "'%s': tensor '%s': bad data_offsets",
                         f->path, name);
  e->begin = (uint64_t)json_integer_value(b);
  e->end = (uint64_t)json_integer_value(en);
  if (e->end > data_len)
    return tr_errmsg_set(err, TR_EFORMAT,
                         "'%s': tensor '%s': data_offsets [%" PRIu64
                         ", %" PRIu64 "] run past the end of the file (%" PRIu64
                         " data bytes)",
                         f->path, name, e->begin, e->end, data_len);
  if (e->end - e->begin != numel * tr_dtype_size(e->dtype)) {
    char sb[160];
    return tr_errmsg_set(err, TR_EFORMAT,
                         "'%s': tensor '%s': %" PRIu64
                         " data bytes for shape %s of %s (%" PRIu64 " bytes)",
                         f->path, name, e->end - e->begin,
                         shape_str(e->ndim, e->shape, sb, sizeof sb),
                         json_string_value(dt),
                         numel * tr_dtype_size(e->dtype));
  }
  if (!(e->name = strdup(name)))
    return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  f->n++;
  return 0;
}

static int parse_meta(tr_st_file_t* f, json_t* v, tr_errmsg_t* err) {
  if (!json_is_object(v))
    return tr_errmsg_set(err, TR_EFORMAT, "'%s': __metadata__ is not an object",
                         f->path);
  size_t n = json_object_size(v);
  f->meta_keys = calloc(n ? n : 1, sizeof *f->meta_keys);
  f->meta_values = calloc(n ? n : 1, sizeof *f->meta_values);
  if (!f->meta_keys || !f->meta_values)
    return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  const char* k;
  json_t* s;
  json_object_foreach(v, k, s) {
    if (!json_is_string(s))
      return tr_errmsg_set(err, TR_EFORMAT,
                           "'%s': __metadata__ value of '%s' is not a string",
                           f->path, k);
    f->meta_keys[f->nmeta] = strdup(k);
    f->meta_values[f->nmeta] = strdup(json_string_value(s));
    f->nmeta++;
    if (!f->meta_keys[f->nmeta - 1] || !f->meta_values[f->nmeta - 1])
      return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  }
  return 0;
}

int tr_st_open(tr_st_file_t* f, const char* path, tr_errmsg_t* err) {
  memset(f, 0, sizeof *f);
  if (!(f->path = strdup(path)))
    return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int rc = tr_err_from_errno();
    return tr_errmsg_set(err, rc, "cannot open '%s': %s", path,
                         tr_strerror(rc));
  }
  struct stat st;
  if (fstat(fd, &st) < 0 || S_ISDIR(st.st_mode)) {
    int rc = S_ISDIR(st.st_mode) ? TR_EISDIR : tr_err_from_errno();
    close(fd);
    return tr_errmsg_set(err, rc, "cannot read '%s': %s", path,
                         tr_strerror(rc));
  }
  size_t size = (size_t)st.st_size;
  if (size < 8) {
    close(fd);
    return tr_errmsg_set(err, TR_EFORMAT,
                         "'%s': truncated at byte offset %zu: a safetensors "
                         "file starts with an 8-byte header length",
                         path, size);
  }
  void* m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (m == MAP_FAILED) {
    int rc = tr_err_from_errno();
    return tr_errmsg_set(err, rc, "cannot map '%s': %s", path, tr_strerror(rc));
  }
  f->map = m;
  f->size = size;
  uint64_t hl;
  memcpy(&hl, f->map, 8);
  hl = le64toh(hl);
  if (hl > TR_ST_MAX_HEADER)
    return tr_errmsg_set(err, TR_EFORMAT,
                         "'%s': header length %" PRIu64
                         " at byte offset 0 is over the limit of %u bytes",
                         path, hl, TR_ST_MAX_HEADER);
  if (hl > size - 8)
    return tr_errmsg_set(err, TR_EFORMAT,
                         "'%s': header length %" PRIu64
                         " at byte offset 0 runs past the end of the file "
                         "(%zu bytes)",
                         path, hl, size);
  f->header_len = hl;
  f->data = f->map + 8 + hl;
  uint64_t data_len = size - 8 - hl;
  json_error_t jerr;
  json_t* root = json_loadb((const char*)f->map + 8, hl,
                            JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
  if (!root)
    return tr_errmsg_set(err, TR_EFORMAT,
                         "'%s': bad JSON header at byte offset %d: %s", path,
                         8 + jerr.position, jerr.text);
  int rc = 0;
  if (!json_is_object(root)) {
    rc = tr_errmsg_set(err, TR_EFORMAT,
                       "'%s': the header at byte offset 8 is not a JSON "
                       "object",
                       path);
    goto out_json;
  }
  f->tensors = calloc(json_object_size(root) + 1, sizeof *f->tensors);
  if (!f->tensors) {
    rc = tr_errmsg_set(err, TR_ENOMEM, "out of memory");
    goto out_json;
  }
  const char* key;
  json_t* v;
  json_object_foreach(root, key, v) {
    rc = strcmp(key, "__metadata__") == 0
             ? parse_meta(f, v, err)
             : parse_entry(f, key, v, data_len, err);
    if (rc < 0) goto out_json;
  }
  qsort(f->tensors, f->n, sizeof *f->tensors, cmp_begin);
  uint64_t at = 0;
  for (size_t i = 0; i < f->n; i++) {
    const tr_st_tensor_t* e = &f->tensors[i];
    if (e->begin != at) {
      rc = tr_errmsg_set(err, TR_EFORMAT,
                         "'%s': tensor '%s' starts at data offset %" PRIu64
                         " (byte offset %" PRIu64 ") where %" PRIu64
                         " was expected: %s",
                         path, e->name, e->begin, 8 + hl + e->begin, at,
                         e->begin > at ? "a gap" : "an overlap");
      goto out_json;
    }
    at = e->end;
  }
  if (at != data_len)
    rc = tr_errmsg_set(err, TR_EFORMAT,
                       "'%s': %" PRIu64 " bytes at byte offset %" PRIu64
                       " belong to no tensor",
                       path, data_len - at, 8 + hl + at);
out_json:
  json_decref(root);
  return rc;
}

const tr_st_tensor_t* tr_st_find(const tr_st_file_t* f, const char* name) {
  for (size_t i = 0; i < f->n; i++)
    if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
  return NULL;
}

const char* tr_st_meta(const tr_st_file_t* f, const char* key) {
  for (size_t i = 0; i < f->nmeta; i++)
    if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
  return NULL;
}

int tr_st_read(const tr_st_file_t* f, const tr_st_tensor_t* e, tr_tensor_t* dst,
               tr_errmsg_t* err) {
  int64_t numel = 1;
  for (int i = 0; i < e->ndim; i++) numel *= e->shape[i];
  if (numel != tr_tensor_numel(dst))
    return tr_errmsg_set(err, TR_ESHAPE,
                         "'%s': tensor '%s' has %" PRId64
                         " elements, expected %" PRId64,
                         f->path, e->name, numel, tr_tensor_numel(dst));
  size_t bytes = (size_t)(e->end - e->begin);
  const uint8_t* p = f->data + e->begin;
  void* aligned = NULL;
  if (((uintptr_t)p) % tr_dtype_size(e->dtype) != 0) {
    aligned = malloc(bytes ? bytes : 1);
    if (!aligned) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
    memcpy(aligned, p, bytes);
    p = aligned;
  }
  tr_tensor_t src;
  int rc = tr_tensor_wrap(&src, (void*)p, e->dtype, TR_DEVICE_CPU, dst->ndim,
                          dst->shape);
  if (rc == 0) rc = tr_tensor_copy(dst, &src);
  tr_tensor_release(&src);
  free(aligned);
  if (rc < 0)
    return tr_errmsg_set(err, rc, "'%s': cannot read tensor '%s': %s", f->path,
                         e->name, tr_strerror(rc));
  return 0;
}

/* ---- writing ---- */

/* The contiguous bytes of item it as dtype, in a new tensor. */
static int materialize(const tr_st_item_t* it, tr_dtype_t dtype,
                       tr_tensor_t* out) {
  tr_tensor_t view = {0};
  const tr_tensor_t* src = it->tensor;
  if (it->transpose) {
    if (src->ndim != 2) return TR_ESHAPE;
    TR_CHECK(tr_tensor_transpose(&view, src, 0, 1)); /* a new reference */
    src = &view;
  }
  int rc = tr_tensor_empty(out, dtype, TR_DEVICE_CPU, src->ndim, src->shape);
  if (rc == 0) rc = tr_tensor_copy(out, src);
  if (rc < 0) tr_tensor_release(out);
  tr_tensor_release(&view);
  return rc;
}

int tr_st_write(const char* path, const tr_st_item_t* items, size_t n,
                tr_dtype_t dtype, const char* const* meta, size_t nmeta,
                tr_errmsg_t* err) {
  const char* dname = tr_st_dtype_name(dtype);
  if (!dname || !tr_dtype_is_float(dtype))
    return tr_errmsg_set(err, TR_EDTYPE, "'%s': cannot write dtype %s", path,
                         tr_dtype_name(dtype));
  json_t* root = json_object();
  if (!root) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  int rc = 0;
  if (nmeta) {
    json_t* md = json_object();
    for (size_t i = 0; md && i < nmeta; i++)
      json_object_set_new(md, meta[2 * i], json_string(meta[2 * i + 1]));
    if (!md || json_object_set_new(root, "__metadata__", md) < 0)
      rc = TR_ENOMEM;
  }
  uint64_t at = 0;
  for (size_t i = 0; i < n && rc == 0; i++) {
    const tr_tensor_t* t = items[i].tensor;
    if (t->device.type != TR_DEV_CPU || (items[i].transpose && t->ndim != 2)) {
      json_decref(root);
      return tr_errmsg_set(
          err, TR_EINVAL, "'%s': tensor '%s' must be a host tensor%s", path,
          items[i].name, items[i].transpose ? " of 2 dimensions" : "");
    }
    json_t* e = json_object();
    json_t* shape = json_array();
    json_t* offs = json_array();
    if (!e || !shape || !offs) {
      json_decref(e);
      json_decref(shape);
      json_decref(offs);
      rc = TR_ENOMEM;
      break;
    }
    for (int d = 0; d < t->ndim; d++) {
      int64_t s = items[i].transpose ? t->shape[t->ndim - 1 - d] : t->shape[d];
      json_array_append_new(shape, json_integer(s));
    }
    uint64_t bytes = (uint64_t)tr_tensor_numel(t) * tr_dtype_size(dtype);
    json_array_append_new(offs, json_integer((json_int_t)at));
    json_array_append_new(offs, json_integer((json_int_t)(at + bytes)));
    at += bytes;
    json_object_set_new(e, "dtype", json_string(dname));
    json_object_set_new(e, "shape", shape);
    json_object_set_new(e, "data_offsets", offs);
    if (json_object_set_new(root, items[i].name, e) < 0) rc = TR_ENOMEM;
  }
  char* hdr =
      rc == 0 ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(root);
  if (!hdr) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  size_t hl = strlen(hdr);
  size_t padded = (hl + 7) / 8 * 8;

  tr__afile_t af;
  rc = tr__afile_open(&af, path, err);
  if (rc < 0) {
    free(hdr);
    return rc;
  }
  uint64_t le = htole64((uint64_t)padded);
  rc = tr__afile_write(&af, &le, 8, err);
  if (rc == 0) rc = tr__afile_write(&af, hdr, hl, err);
  for (size_t i = hl; rc == 0 && i < padded; i++)
    rc = tr__afile_write(&af, " ", 1, err);
  free(hdr);
  for (size_t i = 0; i < n && rc == 0; i++) {
    tr_tensor_t tmp;
    rc = materialize(&items[i], dtype, &tmp);
    if (rc < 0) {
      tr_errmsg_set(err, rc, "'%s': cannot convert tensor '%s': %s", path,
                    items[i].name, tr_strerror(rc));
      break;
    }
    rc =
        tr__afile_write(&af, tr_tensor_data(&tmp), tr_tensor_nbytes(&tmp), err);
    tr_tensor_release(&tmp);
  }
  if (rc < 0) {
    tr__afile_abort(&af);
    return rc;
  }
  return tr__afile_commit(&af, err);
}

/* ---- model configs as JSON ---- */

/* The shortest decimal that reads back as f (1e-05f gives 1e-05, not
 * 9.99999975e-06); printed with at most 9 significant digits, which every
 * float needs at most. */
static double pretty(float f) {
  char buf[32];
  for (int p = 6; p < 9; p++) {
    snprintf(buf, sizeof buf, "%.*g", p, (double)f);
    if (strtof(buf, NULL) == f) return strtod(buf, NULL);
  }
  return (double)f;
}
#define TR__JSON_FLOATS JSON_REAL_PRECISION(9)

char* tr_model_config_to_json(const tr_model_config_t* c) {
  json_t* o = json_pack(
      "{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:i, s:f, "
      "s:f, s:{s:f, s:f, s:f, s:i}, s:b, s:b}",
      "family", tr_model_family_name(c->family), "flavor", c->flavor,
      "vocab_size", c->vocab_size, "max_seq_len", c->max_seq_len, "dim", c->dim,
      "n_layers", c->n_layers, "n_heads", c->n_heads, "n_kv_heads",
      c->n_kv_heads, "head_dim", c->head_dim, "ffn_dim", c->ffn_dim,
      "ffn_dim_multiplier", pretty(c->ffn_dim_multiplier), "multiple_of",
      c->multiple_of, "norm_eps", pretty(c->norm_eps), "rope_theta",
      pretty(c->rope_theta), "rope_scaling", "factor",
      pretty(c->rope_scaling.factor), "low_freq_factor",
      pretty(c->rope_scaling.low_freq_factor), "high_freq_factor",
      pretty(c->rope_scaling.high_freq_factor), "original_max_pos",
      c->rope_scaling.original_max_pos, "tie_embeddings", c->tie_embeddings,
      "bias", c->bias);
  if (!o) return NULL;
  char* s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | TR__JSON_FLOATS);
  json_decref(o);
  return s;
}

int tr_model_config_from_json(const char* text, tr_model_config_t* c,
                              tr_errmsg_t* err) {
  json_error_t jerr;
  json_t* o = json_loads(text, 0, &jerr);
  if (!o)
    return tr_errmsg_set(err, TR_EFORMAT, "bad model config JSON: %s",
                         jerr.text);
  const char *family, *flavor;
  double mult, eps, theta, f, lo, hi;
  int tie, bias;
  memset(c, 0, sizeof *c);
  int rc = json_unpack_ex(
      o, &jerr, JSON_STRICT,
      "{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:F, s:i, s:F, "
      "s:F, s:{s:F, s:F, s:F, s:i}, s:b, s:b}",
      "family", &family, "flavor", &flavor, "vocab_size", &c->vocab_size,
      "max_seq_len", &c->max_seq_len, "dim", &c->dim, "n_layers", &c->n_layers,
      "n_heads", &c->n_heads, "n_kv_heads", &c->n_kv_heads, "head_dim",
      &c->head_dim, "ffn_dim", &c->ffn_dim, "ffn_dim_multiplier", &mult,
      "multiple_of", &c->multiple_of, "norm_eps", &eps, "rope_theta", &theta,
      "rope_scaling", "factor", &f, "low_freq_factor", &lo, "high_freq_factor",
      &hi, "original_max_pos", &c->rope_scaling.original_max_pos,
      "tie_embeddings", &tie, "bias", &bias);
  if (rc < 0) {
    json_decref(o);
    return tr_errmsg_set(err, TR_EFORMAT, "bad model config JSON: %s",
                         jerr.text);
  }
  if (tr_model_family_from_name(family, &c->family) < 0)
    rc = tr_errmsg_set(err, TR_EFORMAT,
                       "bad model config JSON: unknown family '%s'", family);
  snprintf(c->flavor, sizeof c->flavor, "%s", flavor);
  c->ffn_dim_multiplier = (float)mult;
  c->norm_eps = (float)eps;
  c->rope_theta = (float)theta;
  c->rope_scaling.factor = (float)f;
  c->rope_scaling.low_freq_factor = (float)lo;
  c->rope_scaling.high_freq_factor = (float)hi;
  c->tie_embeddings = tie;
  c->bias = bias;
  json_decref(o);
  if (rc < 0) return rc;
  char msg[256] = "";
  rc = tr_model_config_check(c, msg, sizeof msg);
  if (rc < 0) return tr_errmsg_set(err, rc, "bad model config JSON: %s", msg);
  return 0;
}

int tr_st_model_config(const tr_st_file_t* f, tr_model_config_t* cfg,
                       tr_errmsg_t* err) {
  const char* js = tr_st_meta(f, "trainrun_model_config");
  if (!js)
    return tr_errmsg_set(err, TR_ENOTFOUND,
                         "'%s' records no model config (metadata "
                         "'trainrun_model_config')",
                         f->path);
  int rc = tr_model_config_from_json(js, cfg, err);
  if (rc < 0) return tr_errmsg_prefix(err, rc, "'%s'", f->path);
  return 0;
}

/* The JSON object of fields f[*i ..] up to a TR_HF_END or the end; *i
 * moves past them. NULL when out of memory. */
static json_t* hf_object(const tr_hf_field_t* f, int n, int* i) {
  json_t* o = json_object();
  for (; o && *i < n && f[*i].kind != TR_HF_END; (*i)++) {
    const tr_hf_field_t* e = &f[*i];
    json_t* v = NULL;
    switch (e->kind) {
      case TR_HF_STRING:
        v = json_string(e->s);
        break;
      case TR_HF_STRING_LIST:
        v = json_pack("[s]", e->s);
        break;
      case TR_HF_INT:
        v = json_integer(e->i);
        break;
      case TR_HF_FLOAT:
        v = json_real(pretty(e->f));
        break;
      case TR_HF_BOOL:
        v = json_boolean(e->i);
        break;
      case TR_HF_NULL:
        v = json_null();
        break;
      case TR_HF_OBJECT:
        (*i)++;
        v = hf_object(f, n, i); /* stops at its TR_HF_END */
        break;
      case TR_HF_END:
        break;
    }
    if (!v || json_object_set_new(o, e->key, v) < 0) {
      json_decref(o);
      return NULL;
    }
  }
  return o;
}

int tr_hf_write_config(const tr_model_config_t* c, const char* path,
                       tr_errmsg_t* err) {
  tr_hf_field_t fields[TR_HF_CONFIG_MAX];
  int n = tr_model_hf_config(c, fields, TR_HF_CONFIG_MAX);
  if (n < 0)
    return tr_errmsg_set(err, n,
                         "'%s': no Hugging Face config for model "
                         "family %d",
                         path, (int)c->family);
  int i = 0;
  json_t* o = hf_object(fields, n, &i);
  if (!o) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  char* s =
      json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | TR__JSON_FLOATS);
  json_decref(o);
  if (!s) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  tr__afile_t af;
  int rc = tr__afile_open(&af, path, err);
  if (rc == 0) rc = tr__afile_write(&af, s, strlen(s), err);
  if (rc == 0) rc = tr__afile_write(&af, "\n", 1, err);
  free(s);
  if (rc < 0) {
    tr__afile_abort(&af);
    return rc;
  }
  return tr__afile_commit(&af, err);
}

/* ---- models ---- */

static int param_whole(const tr_param_t* p) {
  if (p->layout.placement) return 0;
  for (int d = 0; d < p->ndim; d++)
    if (p->layout.offset[d] != 0 || p->layout.shape[d] != p->shape[d]) return 0;
  return 1;
}

int tr_st_export_model(const tr_model_t* m, const char* path, tr_dtype_t dtype,
                       tr_errmsg_t* err) {
  tr_st_item_t* items = calloc((size_t)m->n_params + 1, sizeof *items);
  /* host copies of device parameters */
  tr_tensor_t* host = calloc((size_t)m->n_params + 1, sizeof *host);
  int rc = 0;
  if (!items || !host) {
    rc = tr_errmsg_set(err, TR_ENOMEM, "out of memory");
    goto out;
  }
  for (int i = 0; i < m->n_params; i++) {
    const tr_param_t* p = &m->params[i];
    if (!param_whole(p)) {
      rc = tr_errmsg_set(err, TR_EINVAL,
                         "'%s': parameter '%s' is not a whole tensor on this "
                         "rank",
                         path, p->name);
      goto out;
    }
    items[i].name = p->name;
    items[i].tensor = &p->data;
    items[i].transpose = p->hf_layout == TR_HF_TRANSPOSED;
    if (p->data.device.type == TR_DEV_CPU) continue;
    rc = tr_tensor_empty(&host[i], p->data.dtype, TR_DEVICE_CPU, p->data.ndim,
                         p->data.shape);
    if (rc == 0) rc = tr_tensor_copy(&host[i], &p->data);
    if (rc < 0) {
      rc = tr_errmsg_set(err, rc, "'%s': copying '%s' to the host: %s", path,
                         p->name, tr_strerror(rc));
      goto out;
    }
    items[i].tensor = &host[i];
  }
  char* js = tr_model_config_to_json(&m->cfg);
  if (!js) {
    rc = tr_errmsg_set(err, TR_ENOMEM, "out of memory");
    goto out;
  }
  const char* meta[] = {"format", "pt", "trainrun_model_config", js};
  rc = tr_st_write(path, items, (size_t)m->n_params, dtype, meta, 2, err);
  free(js);
out:
  if (host)
    for (int i = 0; i < m->n_params; i++) tr_tensor_release(&host[i]);
  free(host);
  free(items);
  return rc;
}

/* HF tensors that are buffers, not parameters. */
static int is_hf_buffer(const char* name) {
  size_t n = strlen(name);
  static const char* const suffixes[] = {".attn.bias", ".attn.masked_bias",
                                         ".rotary_emb.inv_freq"};
  for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
    size_t k = strlen(suffixes[i]);
    if (n >= k && strcmp(name + n - k, suffixes[i]) == 0) return 1;
  }
  return 0;
}

/* The file's tensor for parameter p: its name, or (GPT-2) without the
 * "transformer." prefix. */
static const tr_st_tensor_t* find_param(const tr_st_file_t* f,
                                        const tr_param_t* p) {
  const tr_st_tensor_t* e = tr_st_find(f, p->name);
  if (!e && strncmp(p->name, "transformer.", 12) == 0)
    e = tr_st_find(f, p->name + 12);
  return e;
}

/* Read e into p->data. A whole host parameter is read in place; otherwise
 * (a device parameter, or a shard: the region [layout.offset, +layout.shape)
 * of the global tensor) the global tensor is read into a host buffer, one
 * parameter at a time, and the rank's region copied over. tr: HF holds the
 * transpose of our layout. */
static int import_param(const tr_st_file_t* f, const tr_st_tensor_t* e,
                        tr_param_t* p, int tr, tr_errmsg_t* err) {
  tr_tensor_t global = {0}, view = {0}, part = {0}, next = {0}, packed = {0};
  int whole_host = param_whole(p) && p->data.device.type == TR_DEV_CPU;
  int rc = 0;
  if (whole_host)
    tr_tensor_view(&global, &p->data);
  else
    rc = tr_tensor_empty(&global, p->data.dtype, TR_DEVICE_CPU, p->ndim,
                         p->shape);
  if (rc == 0 && tr)
    rc = tr_tensor_transpose(&view, &global, 0, 1); /* a new reference */
  else if (rc == 0)
    tr_tensor_view(&view, &global);
  if (rc == 0) rc = tr_st_read(f, e, &view, err);
  if (rc < 0 || whole_host) goto out;
  /* a strided layout (tr_param_layout_t.parts) is runs of rows, each a
   * box of its part; a plain shard is one */
  tr_param_run_t runs[TR_PARAM_MAX_RUNS];
  int nrun = tr_param_layout_runs(&p->layout, p->shape[0], runs);
  if (nrun < 0) rc = nrun;
  int one = nrun == 1 && runs[0].rows == p->layout.shape[0];
  for (int j = 0; j < nrun && rc == 0; j++) {
    tr_tensor_view(&part, &global);
    for (int d = 0; d < p->ndim && rc == 0; d++) {
      rc = tr_tensor_narrow(&next, &part, d,
                            d == 0 ? runs[j].global : p->layout.offset[d],
                            d == 0 ? runs[j].rows : p->layout.shape[d]);
      tr_tensor_release(&part);
      part = next;
      memset(&next, 0, sizeof next);
    }
    /* host->device copies want a contiguous source */
    if (rc == 0) rc = tr_tensor_contiguous(&packed, &part);
    if (rc == 0 && one) {
      rc = tr_tensor_copy(&p->data, &packed);
    } else if (rc == 0) { /* rows of p->data: contiguous on any device */
      rc = tr_tensor_narrow(&next, &p->data, 0, runs[j].local, runs[j].rows);
      if (rc == 0) rc = tr_tensor_copy(&next, &packed);
      tr_tensor_release(&next);
    }
    tr_tensor_release(&packed);
    tr_tensor_release(&part);
  }
  if (rc < 0)
    tr_errmsg_set(err, rc, "parameter '%s': copying this rank's part: %s",
                  p->name, tr_strerror(rc));
out:
  tr_tensor_release(&packed);
  tr_tensor_release(&part);
  tr_tensor_release(&view);
  tr_tensor_release(&global);
  return rc;
}

int tr_st_import_model(tr_model_t* m, const char* path, tr_errmsg_t* err) {
  tr_st_file_t f;
  int rc = tr_st_open(&f, path, err);
  if (rc < 0) goto out;
  char* used = calloc(f.n + 1, 1);
  if (!used) {
    rc = tr_errmsg_set(err, TR_ENOMEM, "out of memory");
    goto out;
  }
  for (int i = 0; i < m->n_params && rc == 0; i++) {
    tr_param_t* p = &m->params[i];
    const tr_st_tensor_t* e = find_param(&f, p);
    if (!e) {
      rc = tr_errmsg_set(err, TR_ENOTFOUND,
                         "'%s': tensor '%s' is missing (%s %s)", path, p->name,
                         tr_model_family_name(m->cfg.family), m->cfg.flavor);
      break;
    }
    used[e - f.tensors] = 1;
    int tr = p->hf_layout == TR_HF_TRANSPOSED && p->ndim == 2;
    int64_t want[TR_MAX_DIMS];
    for (int d = 0; d < p->ndim; d++)
      want[d] = tr ? p->shape[p->ndim - 1 - d] : p->shape[d];
    int same = e->ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) same = e->shape[d] == want[d];
    if (!same) {
      char a[160], b[160];
      rc = tr_errmsg_set(err, TR_ESHAPE,
                         "'%s': tensor '%s' has shape %s, the model expects "
                         "%s",
                         path, p->name,
                         shape_str(e->ndim, e->shape, a, sizeof a),
                         shape_str(p->ndim, want, b, sizeof b));
      break;
    }
    if (!tr_dtype_is_float(e->dtype)) {
      rc = tr_errmsg_set(err, TR_EDTYPE,
                         "'%s': tensor '%s' is %s, not a float dtype", path,
                         p->name, tr_st_dtype_name(e->dtype));
      break;
    }
    rc = import_param(&f, e, p, tr, err);
  }
  for (size_t i = 0; i < f.n && rc == 0; i++) {
    if (used[i] || is_hf_buffer(f.tensors[i].name)) continue;
    if (m->cfg.tie_embeddings &&
        strcmp(f.tensors[i].name, "lm_head.weight") == 0)
      continue;
    rc = tr_errmsg_set(err, TR_EFORMAT,
                       "'%s': tensor '%s' is not a parameter of the model "
                       "(%s %s)",
                       path, f.tensors[i].name,
                       tr_model_family_name(m->cfg.family), m->cfg.flavor);
  }
  free(used);
out:
  tr_st_release(&f);
  return rc;
}
