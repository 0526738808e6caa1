/* launcher/cmd_ckpt.c: `trainrun ckpt ls|inspect|verify|export|import` —
 * listing a checkpoint folder, printing a step's tensors and chunks,
 * checking every checksum, exporting the model as Hugging Face safetensors
 * (one file, or shards with model.safetensors.index.json), and importing
 * safetensors weights as a step a run can start from
 * (checkpoint.initial_load_path). */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "launcher/commands.h"
#include "trainrun/checkpoint.h"
#include "trainrun/error.h"
#include "trainrun/model.h"
#include "trainrun/safetensors.h"

static void ckpt_usage(FILE* out) {
  fprintf(out,
          "usage: trainrun ckpt ls FOLDER\n"
          "       trainrun ckpt inspect STEP\n"
          "       trainrun ckpt verify STEP\n"
          "       trainrun ckpt export STEP -o DIR [--format safetensors] "
          "[--dtype DTYPE] [--max-shard-size BYTES]\n"
          "       trainrun ckpt import FILE.safetensors -o FOLDER [--step N]\n"
          "FOLDER holds step-N folders; STEP is a step folder, or a FOLDER "
          "(its latest complete step).\n");
}

static const char* human(double b, char* buf, size_t cap) {
  const char* u[] = {"B", "KB", "MB", "GB", "TB"};
  int i = 0;
  while (b >= 1000 && i < 4) {
    b /= 1000;
    i++;
  }
  snprintf(buf, cap, i ? "%.1f %s" : "%.0f %s", b, u[i]);
  return buf;
}

/* A step folder: path itself when it has metadata, else the latest
 * complete step of path when it holds some, else path. */
static char* resolve_step(const char* path) {
  char meta[4200];
  snprintf(meta, sizeof meta, "%s/%s", path, TR_CKPT_METADATA);
  int64_t step;
  if (access(meta, F_OK) != 0 && tr_ckpt_latest(path, &step, NULL) == 0) {
    char* s = malloc(strlen(path) + 32);
    if (s) tr_ckpt_step_dir(path, step, s, strlen(path) + 32);
    return s;
  }
  return strdup(path);
}

static int open_or_fail(const char* path, tr_ckpt_t** ck) {
  char* dir = resolve_step(path);
  if (!dir) {
    fprintf(stderr, "trainrun: %s\n", tr_strerror(TR_ENOMEM));
    return 1;
  }
  tr_errmsg_t err;
  int rc = tr_ckpt_open(ck, dir, &err);
  free(dir);
  if (rc < 0) {
    fprintf(stderr, "trainrun: %s\n", err.message);
    return tr__cmd_exit_code(rc);
  }
  return 0;
}

static int cmd_ls(const char* folder) {
  tr_ckpt_entry_t* v;
  size_t n;
  tr_errmsg_t err;
  int rc = tr_ckpt_list(folder, &v, &n, &err);
  if (rc < 0) {
    fprintf(stderr, "trainrun: %s\n", err.message);
    return tr__cmd_exit_code(rc);
  }
  struct stat st;
  if (stat(folder, &st) != 0) {
    fprintf(stderr, "trainrun: no checkpoint folder '%s'\n", folder);
    free(v);
    return 2;
  }
  printf("%-10s %-11s %10s %5s  %s\n", "step", "state", "size", "world",
         "layout");
  for (size_t i = 0; i < n; i++) {
    char sz[32], dir[4200];
    tr_ckpt_step_dir(folder, v[i].step, dir, sizeof dir);
    tr_ckpt_t* ck = NULL;
    int ok = v[i].complete && tr_ckpt_open(&ck, dir, NULL) == 0;
    /* a data file shorter than its chunks need (or gone): not complete */
    int cut = ok && tr_ckpt_check_files(ck, NULL) < 0;
    /* +hf: it also holds a Hugging Face export (last_save_in_hf); hf-only:
     * nothing else (torchtitan's last_save_in_hf), not resumable */
    const char* state = !v[i].complete ? (v[i].hf ? "hf-only" : "incomplete")
                        : !ok          ? "unreadable"
                        : cut          ? "truncated"
                        : v[i].hf      ? "complete+hf"
                                       : "complete";
    printf("%-10" PRId64 " %-11s %10s ", v[i].step, state,
           human((double)v[i].bytes, sz, sizeof sz));
    if (ok)
      printf("%5d  %s\n", ck->world_size, ck->layout_json);
    else
      printf("%5s  -\n", "-");
    tr_ckpt_close(ck);
  }
  free(v);
  return 0;
}

static void print_box(const int64_t* v, int n) {
  putchar('[');
  for (int d = 0; d < n; d++) printf("%s%" PRId64, d ? ", " : "", v[d]);
  putchar(']');
}

/* The Hugging Face export a step folder also holds (last_save_in_hf):
 * one line, checked; nothing when there is none. 0, or an exit code when
 * it is damaged (the message on stderr). */
static int print_hf(const char* dir) {
  char idx[4200];
  snprintf(idx, sizeof idx, "%s/%s", dir, TR_CKPT_HF_INDEX);
  if (access(idx, F_OK) != 0) return 0;
  tr_st_hf_summary_t hs;
  tr_errmsg_t err;
  int rc = tr_st_check_hf_dir(dir, &hs, &err);
  if (rc < 0) {
    fflush(stdout);
    fprintf(stderr, "trainrun: the Hugging Face export: %s\n", err.message);
    return tr__cmd_exit_code(rc);
  }
  char sz[32];
  printf("hugging face: %s: %d tensor%s in %d file%s, %s, %s\n",
         TR_CKPT_HF_INDEX, hs.ntensors, hs.ntensors == 1 ? "" : "s",
         hs.nfiles, hs.nfiles == 1 ? "" : "s", tr_st_dtype_name(hs.dtype),
         human((double)hs.total_size, sz, sizeof sz));
  return 0;
}

static int cmd_inspect(const char* path) {
  tr_ckpt_t* ck;
  int rc = open_or_fail(path, &ck);
  if (rc) return rc;
  printf("checkpoint '%s': step %" PRId64 ", world %d\n", ck->dir, ck->step,
         ck->world_size);
  printf("layout: %s\ntrain_state: %s\n", ck->layout_json,
         ck->train_state_json);
  int64_t total = 0;
  for (size_t i = 0; i < ck->ntensors; i++) {
    const tr_ckpt_tensor_t* t = &ck->tensors[i];
    printf("%s %s ", t->name, tr_st_dtype_name(t->dtype));
    print_box(t->shape, t->ndim);
    printf(" %zu chunk%s\n", t->nchunks, t->nchunks == 1 ? "" : "s");
    for (size_t c = 0; c < t->nchunks; c++) {
      const tr_ckpt_chunk_t* k = &t->chunks[c];
      printf("  offsets ");
      print_box(k->offsets, t->ndim);
      printf(" sizes ");
      print_box(k->sizes, t->ndim);
      printf(" %s@%" PRIu64 " %" PRIu64 " bytes crc32c %08x", k->file,
             k->offset, k->length, k->ncrc ? k->crc32c[0] : 0);
      if (k->ncrc > 1) printf(" (+%zu blocks)", k->ncrc - 1);
      putchar('\n');
      total += (int64_t)k->length;
    }
  }
  char sz[32];
  printf("%zu tensors, %s\n", ck->ntensors,
         human((double)total, sz, sizeof sz));
  rc = print_hf(ck->dir);
  tr_ckpt_close(ck);
  return rc;
}

static int cmd_verify(const char* path) {
  tr_ckpt_t* ck;
  int rc = open_or_fail(path, &ck);
  if (rc) return rc;
  int64_t bytes = 0;
  tr_errmsg_t err;
  rc = tr_ckpt_verify(ck, &bytes, &err);
  if (rc < 0) {
    fprintf(stderr, "trainrun: %s\n", err.message);
    tr_ckpt_close(ck);
    return tr__cmd_exit_code(rc);
  }
  size_t chunks = 0;
  for (size_t i = 0; i < ck->ntensors; i++) chunks += ck->tensors[i].nchunks;
  printf("'%s': step %" PRId64
         " is complete: %zu tensors, %zu chunks, "
         "%" PRId64 " bytes, every checksum matches\n",
         ck->dir, ck->step, ck->ntensors, chunks, bytes);
  rc = print_hf(ck->dir);
  tr_ckpt_close(ck);
  return rc;
}

static int cmd_export(const char* path, const char* out, const char* dtype,
                      int64_t max_shard) {
  tr_ckpt_t* ck;
  int rc = open_or_fail(path, &ck);
  if (rc) return rc;
  tr_dtype_t dt = TR_F32;
  if (dtype && (tr_dtype_parse(dtype, &dt) < 0 ||
                (dt != TR_F32 && dt != TR_BF16 && dt != TR_F16))) {
    fprintf(stderr,
            "trainrun: --dtype: '%s' is not float32, bfloat16 or float16\n",
            dtype);
    tr_ckpt_close(ck);
    return 2;
  }
  tr_st_export_opts_t o = {.dtype = dtype ? &dt : NULL,
                           .max_shard_bytes = max_shard,
                           .report = stdout};
  tr_errmsg_t err;
  int trc = tr_st_export_checkpoint(ck, out, &o, &err);
  if (trc < 0) {
    fprintf(stderr, "trainrun: %s\n", err.message);
    rc = tr__cmd_exit_code(trc);
  }
  tr_ckpt_close(ck);
  return rc;
}

static int cmd_import(const char* file, const char* folder, int64_t step) {
  tr_errmsg_t err;
  tr_st_file_t f;
  tr_model_t m;
  memset(&m, 0, sizeof m);
  tr_model_config_t cfg;
  int rc = tr_st_open(&f, file, &err);
  if (rc == 0) rc = tr_st_model_config(&f, &cfg, &err);
  if (rc == TR_ENOTFOUND)
    tr_errmsg_set(&err, rc,
                  "'%s' records no trainrun model config (export it with "
                  "trainrun, or train from it with "
                  "checkpoint.initial_load_in_hf)",
                  file);
  tr_st_release(&f);
  if (rc == 0) rc = tr_model_init(&m, &cfg);
  if (rc == 0) rc = tr_model_alloc(&m, TR_DEVICE_CPU);
  if (rc == 0) rc = tr_st_import_model(&m, file, &err);
  tr_ckpt_item_t* items = NULL;
  char** names = NULL;
  if (rc == 0) {
    items = calloc((size_t)m.n_params + 1, sizeof *items);
    names = calloc((size_t)m.n_params + 1, sizeof *names);
    for (int i = 0; items && names && i < m.n_params; i++) {
      tr_param_t* p = &m.params[i];
      names[i] = malloc(strlen(p->name) + 8);
      if (!names[i]) break;
      sprintf(names[i], "model.%s", p->name);
      items[i].name = names[i];
      items[i].ndim = p->ndim;
      memcpy(items[i].shape, p->shape, sizeof items[i].shape);
      items[i].tensor = &p->data;
    }
    char* js = tr_model_config_to_json(&cfg);
    size_t cap = (js ? strlen(js) : 0) + 64;
    char* state = malloc(cap);
    tr_ckpt_saver_opts_t o = {.folder = folder,
                              .comm = {.rank = 0, .world = 1},
                              .layout_json = "{\"kind\":\"import\"}"};
    tr_ckpt_saver_t* s = NULL;
    if (!items || !names || !js || !state) {
      rc = tr_errmsg_set(&err, TR_ENOMEM, "out of memory");
    } else {
      snprintf(state, cap, "{\"step\":%" PRId64 ",\"model\":%s}", step, js);
      rc = tr_ckpt_saver_new(&o, &s, &err);
      if (rc == 0)
        rc =
            tr_ckpt_save(s, step, items, (size_t)m.n_params, state, NULL, &err);
    }
    tr_ckpt_saver_free(s);
    free(js);
    free(state);
  }
  if (rc == 0) {
    char dir[4200];
    tr_ckpt_step_dir(folder, step, dir, sizeof dir);
    printf("wrote %s (model only: set checkpoint.initial_load_path to it)\n",
           dir);
  } else {
    fprintf(stderr, "trainrun: %s\n", err.message);
  }
  if (names)
    for (int i = 0; i < m.n_params; i++) free(names[i]);
  free(names);
  free(items);
  tr_model_release(&m);
  return tr__cmd_exit_code(rc);
}

/* A non-negative integer flag value, or an error naming the flag. */
static int int_flag(const char* sub, const char* flag, const char* v,
                    int64_t lo, int64_t* out) {
  char* end = NULL;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (errno || end == v || *end || x < lo) {
    fprintf(stderr, "trainrun: ckpt %s: %s: '%s' is not an integer >= %lld\n",
            sub, flag, v, (long long)lo);
    return TR_EINVAL;
  }
  *out = x;
  return 0;
}

int tr_cmd_ckpt(int argc, char** argv) {
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      ckpt_usage(stdout);
      return 0;
    }
  if (argc < 2) {
    ckpt_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const char* sub = argv[1];
  const char* path = NULL;
  const char* out = NULL;
  const char* dtype = NULL;
  const char* format = "safetensors";
  int64_t max_shard = 5000000000LL, step = 0;
  for (int i = 2; i < argc; i++) {
    const char* a = argv[i];
    int has = i + 1 < argc;
    if ((strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) && has)
      out = argv[++i];
    else if (strcmp(a, "--dtype") == 0 && has)
      dtype = argv[++i];
    else if (strcmp(a, "--format") == 0 && has)
      format = argv[++i];
    else if (strcmp(a, "--max-shard-size") == 0 && has) {
      if (int_flag(sub, a, argv[++i], 1, &max_shard) < 0) return 2;
    } else if (strcmp(a, "--step") == 0 && has) {
      if (int_flag(sub, a, argv[++i], 0, &step) < 0) return 2;
    }
    else if (a[0] == '-') {
      fprintf(stderr, "trainrun: ckpt %s: unknown flag '%s'\n", sub, a);
      return 2;
    } else if (!path)
      path = a;
    else {
      fprintf(stderr, "trainrun: ckpt %s: unexpected argument '%s'\n", sub, a);
      return 2;
    }
  }
  if (!path) {
    ckpt_usage(stderr);
    return 2;
  }
  if (strcmp(sub, "ls") == 0) return cmd_ls(path);
  if (strcmp(sub, "inspect") == 0) return cmd_inspect(path);
  if (strcmp(sub, "verify") == 0) return cmd_verify(path);
  if (strcmp(sub, "export") == 0 || strcmp(sub, "import") == 0) {
    if (!out) {
      fprintf(stderr, "trainrun: ckpt %s: -o is required\n", sub);
      return 2;
    }
    if (strcmp(format, "safetensors") != 0) {
      fprintf(stderr, "trainrun: ckpt %s: --format: only safetensors\n", sub);
      return 2;
    }
    if (max_shard < 1 || step < 0) {
      fprintf(stderr, "trainrun: ckpt %s: bad --max-shard-size or --step\n",
              sub);
      return 2;
    }
    return sub[0] == 'e' ? cmd_export(path, out, dtype, max_shard)
                         : cmd_import(path, out, step);
  }
  fprintf(stderr, "trainrun: ckpt: unknown command '%s'\n", sub);
  ckpt_usage(stderr);
  return 2;
}
