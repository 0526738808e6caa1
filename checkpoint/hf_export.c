/* checkpoint/hf_export.c: a checkpoint step's model as a Hugging Face
 * folder — consolidating the saved chunks of every layout into whole
 * tensors, file by file (safetensors files of bounded size, spread over
 * the ranks), the index model.safetensors.index.json and config.json —
 * and checking such a folder (trainrun/safetensors.h). Used by `trainrun
 * ckpt export` and by the trainer's checkpoint.last_save_in_hf. */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h> /* the index */

#include "checkpoint/internal.h"
#include "trainrun/error.h"
#include "trainrun/safetensors.h"

#define TR__ST_DEFAULT_SHARD 5000000000LL

/* The model a checkpoint's train state describes (parameter table only:
 * names, shapes, HF layouts; no storage). */
static int plan_model(const tr_ckpt_t* ck, tr_model_t* m, tr_errmsg_t* err) {
  char* text = tr_ckpt_state_get(ck, "model");
  if (!text)
    return tr_errmsg_set(err, TR_EFORMAT,
                         "'%s': the train state records no model config",
                         ck->dir);
  tr_model_config_t cfg;
  int rc = tr_model_config_from_json(text, &cfg, err);
  free(text);
  if (rc < 0) return tr_errmsg_prefix(err, rc, "'%s'", ck->dir);
  rc = tr_model_init(m, &cfg);
  if (rc < 0)
    return tr_errmsg_set(err, rc, "'%s': cannot build the model: %s", ck->dir,
                         tr_strerror(rc));
  return 0;
}

/* File names: "model.safetensors" alone, or "model-0000i-of-0000n". */
static void file_name(char* buf, size_t cap, int i, int n, int sharded) {
  if (!sharded)
    snprintf(buf, cap, "model.safetensors");
  else
    snprintf(buf, cap, "model-%05d-of-%05d.safetensors", i, n);
}

/* Write file s (1-based) of the plan: load its tensors from ck, write. */
static int write_file(const tr_ckpt_t* ck, const tr_model_t* m,
                      const int* shard, int s, const char* path,
                      tr_dtype_t dt, const char* cfg_json, tr_errmsg_t* err) {
  int np = m->n_params;
  tr_tensor_t* bufs = calloc((size_t)np + 1, sizeof *bufs);
  tr_st_item_t* items = calloc((size_t)np + 1, sizeof *items);
  char name[512];
  size_t n = 0;
  int rc = bufs && items ? 0 : tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  for (int i = 0; i < np && rc == 0; i++) {
    if (shard[i] != s) continue;
    const tr_param_t* p = &m->params[i];
    snprintf(name, sizeof name, "model.%s", p->name);
    const tr_ckpt_tensor_t* ct = tr_ckpt_find(ck, name);
    /* load in the saved dtype; tr_st_write converts to dt */
    tr_dtype_t sdt = ct ? ct->dtype : TR_F32;
    rc = tr_tensor_empty(&bufs[n], sdt, TR_DEVICE_CPU, p->ndim, p->shape);
    if (rc < 0) {
      tr_errmsg_set(err, rc, "out of memory");
      break;
    }
    tr_ckpt_item_t it = {.name = name, .ndim = p->ndim, .tensor = &bufs[n]};
    memcpy(it.shape, p->shape, sizeof it.shape);
    items[n].name = p->name;
    items[n].tensor = &bufs[n];
    items[n].transpose = p->hf_layout == TR_HF_TRANSPOSED;
    n++;
    rc = tr_ckpt_load(ck, &it, 1, err);
  }
  if (rc == 0) {
    const char* meta[] = {"format", "pt", "trainrun_model_config", cfg_json};
    rc = tr_st_write(path, items, n, dt, meta, 2, err);
  }
  for (size_t i = 0; bufs && i < n; i++) tr_tensor_release(&bufs[i]);
  free(bufs);
  free(items);
  return rc;
}

static int write_index(const tr_model_t* m, const int* shard, int nfiles,
                       int64_t total, const char* path, tr_errmsg_t* err) {
  json_t* root = json_object();
  json_t* meta = json_pack("{sI}", "total_size", (json_int_t)total);
  json_t* wm = json_object();
  int rc = root && meta && wm ? 0 : TR_ENOMEM;
  char fname[64];
  for (int i = 0; i < m->n_params && rc == 0; i++) {
    file_name(fname, sizeof fname, shard[i], nfiles, 1);
    if (json_object_set_new(wm, m->params[i].name, json_string(fname)) < 0)
      rc = TR_ENOMEM;
  }
  if (rc == 0) {
    /* set_new takes the reference, also when it fails */
    int a = json_object_set_new(root, "metadata", meta);
    int b = json_object_set_new(root, "weight_map", wm);
    meta = wm = NULL;
    if (a < 0 || b < 0) rc = TR_ENOMEM;
  }
  char* text = rc == 0 ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER)
                       : NULL;
  json_decref(root);
  json_decref(meta);
  json_decref(wm);
  if (!text) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  size_t len = strlen(text);
  char* withnl = realloc(text, len + 2);
  if (!withnl) {
    free(text);
    return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  }
  withnl[len] = '\n';
  withnl[len + 1] = '\0';
  rc = tr__write_file(path, withnl, len + 1, err);
  free(withnl);
  return rc;
}

int tr_st_export_checkpoint(const tr_ckpt_t* ck, const char* dir,
                            const tr_st_export_opts_t* o, tr_errmsg_t* err) {
  int world = o->world > 0 ? o->world : 1;
  if (o->rank < 0 || o->rank >= world || o->max_shard_bytes < 0 ||
      (unsigned)o->part > TR_ST_EXPORT_INDEX)
    return tr_errmsg_set(err, TR_EINVAL, "export: bad options");
  tr_model_t m;
  memset(&m, 0, sizeof m);
  TR_CHECK(plan_model(ck, &m, err));
  int np = m.n_params;
  tr_dtype_t dt = TR_F32;
  if (o->dtype) {
    dt = *o->dtype;
  } else if (np > 0) {
    char name[512];
    snprintf(name, sizeof name, "model.%s", m.params[0].name);
    const tr_ckpt_tensor_t* ct = tr_ckpt_find(ck, name);
    if (ct) dt = ct->dtype; /* keep what was saved */
  }
  int64_t max =
      o->max_shard_bytes > 0 ? o->max_shard_bytes : TR__ST_DEFAULT_SHARD;
  /* the plan, the same on every rank: files of at most max bytes in
   * parameter order (a bigger tensor gets a file of its own) */
  int* shard = calloc((size_t)np + 1, sizeof *shard);
  char* path = malloc(strlen(dir) + 80);
  char* cfg_json = tr_model_config_to_json(&m.cfg);
  int rc = 0;
  if (!shard || !path || !cfg_json) {
    rc = tr_errmsg_set(err, TR_ENOMEM, "out of memory");
    goto out;
  }
  int nfiles = 0;
  int64_t cur = 0, total = 0;
  for (int i = 0; i < np; i++) {
    int64_t b = 1;
    for (int d = 0; d < m.params[i].ndim; d++) b *= m.params[i].shape[d];
    b *= (int64_t)tr_dtype_size(dt);
    if (i == 0 || (cur > 0 && cur + b > max)) {
      nfiles++;
      cur = 0;
    }
    cur += b;
    total += b;
    shard[i] = nfiles;
  }
  int sharded = nfiles > 1 || o->sharded_names;
  char fname[64];
  if (o->part != TR_ST_EXPORT_INDEX) {
    rc = tr__mkdir_p(dir, err);
    for (int s = 1; rc == 0 && s <= nfiles; s++) {
      if ((s - 1) % world != o->rank) continue;
      file_name(fname, sizeof fname, s, nfiles, sharded);
      sprintf(path, "%s/%s", dir, fname);
      rc = write_file(ck, &m, shard, s, path, dt, cfg_json, err);
      if (rc == 0 && o->report) fprintf(o->report, "wrote %s\n", path);
    }
  }
  if (rc == 0 && o->part != TR_ST_EXPORT_FILES) {
    /* after every file: the index says the export is whole */
    if (sharded) {
      sprintf(path, "%s/%s", dir, TR_CKPT_HF_INDEX);
      rc = write_index(&m, shard, nfiles, total, path, err);
      if (rc == 0 && o->report) fprintf(o->report, "wrote %s\n", path);
    }
    if (rc == 0) {
      sprintf(path, "%s/config.json", dir);
      rc = tr_hf_write_config(&m.cfg, path, err);
    }
  }
out:
  free(cfg_json);
  free(path);
  free(shard);
  tr_model_release(&m);
  return rc;
}

int tr_st_check_hf_dir(const char* dir, tr_st_hf_summary_t* sum,
                       tr_errmsg_t* err) {
  memset(sum, 0, sizeof *sum);
  char* ipath = tr__ckpt_join(dir, TR_CKPT_HF_INDEX);
  if (!ipath) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  char* text = NULL;
  int rc = tr__ckpt_read_file(ipath, &text, NULL, err);
  json_t* root = NULL;
  if (rc == 0) {
    json_error_t je;
    root = json_loads(text, 0, &je);
    if (!root)
      rc = tr_errmsg_set(err, TR_EFORMAT, "'%s': bad JSON: %s", ipath,
                         je.text);
  }
  json_t* wm = root ? json_object_get(root, "weight_map") : NULL;
  json_t* ts = root ? json_object_get(json_object_get(root, "metadata"),
                                      "total_size")
                    : NULL;
  if (rc == 0 && (!json_is_object(wm) || !json_is_integer(ts)))
    rc = tr_errmsg_set(err, TR_EFORMAT,
                       "'%s': needs \"weight_map\" and "
                       "\"metadata\": {\"total_size\"}",
                       ipath);
  /* every file the map names, opened (and so checked) once */
  json_t* files = json_object();
  const char* key;
  json_t* v;
  if (rc == 0 && !files) rc = tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  json_object_foreach(wm, key, v) {
    if (rc < 0) break;
    if (!json_is_string(v) || strchr(json_string_value(v), '/')) {
      rc = tr_errmsg_set(err, TR_EFORMAT, "'%s': tensor '%s': bad file name",
                         ipath, key);
      break;
    }
    json_object_set_new(files, json_string_value(v), json_true());
  }
  int64_t bytes = 0;
  json_object_foreach(files, key, v) {
    if (rc < 0) break;
    char* fp = tr__ckpt_join(dir, key);
    tr_st_file_t f;
    memset(&f, 0, sizeof f);
    rc = fp ? tr_st_open(&f, fp, err)
            : tr_errmsg_set(err, TR_ENOMEM, "out of memory");
    const char* tn;
    json_t* tv;
    json_object_foreach(wm, tn, tv) {
      if (rc < 0) break;
      if (strcmp(json_string_value(tv), key) != 0) continue;
      const tr_st_tensor_t* e = tr_st_find(&f, tn);
      if (!e) {
        rc = tr_errmsg_set(err, TR_EFORMAT,
                           "'%s': tensor '%s' is not in '%s' as '%s' says",
                           fp, tn, key, TR_CKPT_HF_INDEX);
        break;
      }
      bytes += (int64_t)(e->end - e->begin);
      if (sum->ntensors == 0) sum->dtype = e->dtype;
      sum->ntensors++;
    }
    sum->nfiles++;
    tr_st_release(&f);
    free(fp);
  }
  if (rc == 0 && bytes != json_integer_value(ts))
    rc = tr_errmsg_set(err, TR_EFORMAT,
                       "'%s': total_size %" PRId64
                       " but the tensors hold %" PRId64 " bytes",
                       ipath, (int64_t)json_integer_value(ts), bytes);
  sum->total_size = bytes;
  json_decref(files);
  json_decref(root);
  free(text);
  free(ipath);
  return rc;
}
