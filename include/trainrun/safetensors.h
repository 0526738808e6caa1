/* trainrun/safetensors.h: reading and writing safetensors files, and a
 * model's parameter table as a Hugging Face checkpoint.
 *
 * The format: an 8-byte little-endian header length N, N bytes of JSON
 * (padded with spaces so the data starts 8-byte aligned), then the data.
 * The JSON maps each tensor name to {"dtype": "F32", "shape": [..],
 * "data_offsets": [begin, end]} (offsets relative to the data section) and
 * may hold "__metadata__", a map of strings. A file is accepted only when
 * the tensors cover the data section exactly, without gaps or overlaps,
 * and each one's byte size is its element count times its dtype size.
 *
 * Models (tr_st_export_model / tr_st_import_model) use Hugging Face names
 * and layouts, so GPT2LMHeadModel and LlamaForCausalLM load the files:
 *   - GPT-2's Conv1D weights (c_attn, c_proj, c_fc) are stored transposed,
 *     [in, out], as HF keeps them;
 *   - tied tensors are stored once (GPT-2: transformer.wte.weight, no
 *     lm_head.weight; HF ties them when loading);
 *   - on import, HF's non-parameter buffers are skipped (GPT-2's
 *     "*.attn.bias" / "*.attn.masked_bias" causal masks, Llama's
 *     "*.rotary_emb.inv_freq"), GPT-2 names without the "transformer."
 *     prefix (as OpenAI's original checkpoint has them) are accepted, and
 *     lm_head.weight is ignored for a model with tied embeddings.
 * The metadata of an exported file records the model config
 * ("trainrun_model_config", JSON), so `trainrun sample` can rebuild the
 * model from the file alone.
 */
#ifndef TRAINRUN_SAFETENSORS_H
#define TRAINRUN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "trainrun/checkpoint.h"
#include "trainrun/errmsg.h"
#include "trainrun/model.h"
#include "trainrun/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TR_ST_MAX_HEADER (100u * 1024 * 1024) /* as the Rust crate */

typedef struct {
  char* name;
  tr_dtype_t dtype;
  int ndim;
  int64_t shape[TR_MAX_DIMS];
  uint64_t begin, end; /* byte range inside the data section */
} tr_st_tensor_t;

typedef struct {
  char* path;
  const uint8_t* map; /* the whole file, read-only */
  size_t size;
  uint64_t header_len;
  const uint8_t* data; /* map + 8 + header_len */
  size_t n;
  tr_st_tensor_t* tensors; /* in the order of their data */
  size_t nmeta;
  char** meta_keys;
  char** meta_values;
} tr_st_file_t;

/* safetensors dtype names: "F32" <-> TR_F32, "BF16", "F16", "I32", "I64",
 * "U16", "U8". NULL / TR_EDTYPE for others. */
const char* tr_st_dtype_name(tr_dtype_t dt);
int tr_st_dtype_parse(const char* s, tr_dtype_t* out);

/* Map and check a file (see above). Errors (TR_EFORMAT, TR_EDTYPE for a
 * dtype trainrun has no type for, negated errno) name the file, and the
 * tensor or byte offset. Release with tr_st_release (also after an
 * error). */
int tr_st_open(tr_st_file_t* f, const char* path, tr_errmsg_t* err);
void tr_st_release(tr_st_file_t* f);

const tr_st_tensor_t* tr_st_find(const tr_st_file_t* f, const char* name);
/* A metadata value, or NULL. */
const char* tr_st_meta(const tr_st_file_t* f, const char* key);

/* Copy tensor e into dst (a host tensor of any float dtype and strides
 * with the same element count; shapes are the caller's business), converting
 * the dtype. */
int tr_st_read(const tr_st_file_t* f, const tr_st_tensor_t* e, tr_tensor_t* dst,
               tr_errmsg_t* err);

/* One tensor to write: its name, a host tensor (any strides), whether to
 * store its 2-D transpose. */
typedef struct {
  const char* name;
  const tr_tensor_t* tensor;
  int transpose;
} tr_st_item_t;

/* Write items (in the given order) as dtype (a float dtype: F32, BF16,
 * F16) with metadata pairs meta[2i] = key, meta[2i+1] = value, atomically
 * (temporary file, fsync, rename). */
int tr_st_write(const char* path, const tr_st_item_t* items, size_t n,
                tr_dtype_t dtype, const char* const* meta, size_t nmeta,
                tr_errmsg_t* err);

/* ---- models ---- */

/* Write m's parameters with HF names and layouts (see above) as dtype.
 * Parameters must be whole (not sharded); device tensors are copied to the
 * host first. */
int tr_st_export_model(const tr_model_t* m, const char* path, tr_dtype_t dtype,
                       tr_errmsg_t* err);
/* Load every parameter of m from path: into host or device tensors, and
 * for a sharded parameter only this rank's region (layout.offset/shape;
 * the runs of each part for a strided tensor-parallel layout,
 * layout.parts) of the file's tensor (read whole into a host buffer, one
 * at a time). Errors
 * name the tensor and the file: a missing tensor, a shape that differs (in
 * HF layout), a tensor the model does not have. The caller refreshes compute
 * copies (tr_model_refresh_compute). */
int tr_st_import_model(tr_model_t* m, const char* path, tr_errmsg_t* err);
/* The model config recorded in an exported file's metadata; TR_ENOTFOUND
 * when the file has none (a file from another tool). */
int tr_st_model_config(const tr_st_file_t* f, tr_model_config_t* cfg,
                       tr_errmsg_t* err);
/* The config as JSON (what the metadata holds); free() the result. */
char* tr_model_config_to_json(const tr_model_config_t* cfg);
int tr_model_config_from_json(const char* json, tr_model_config_t* cfg,
                              tr_errmsg_t* err);
/* Write a Hugging Face config.json for cfg (GPT2LMHeadModel or
 * LlamaForCausalLM) at path. */
int tr_hf_write_config(const tr_model_config_t* cfg, const char* path,
                       tr_errmsg_t* err);

/* ---- checkpoint steps as Hugging Face folders ---- */

/* The model of a checkpoint step (trainrun/checkpoint.h) written as a
 * Hugging Face folder: the "model.<name>" tensors, consolidated from the
 * chunks of whatever layout saved them, in files of at most
 * max_shard_bytes (in parameter order; a bigger tensor gets a file of its
 * own), named model.safetensors when there is one file (unless
 * sharded_names), else model-<i>-of-<n>.safetensors (5 digits each) with
 * model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map":
 * {name: file}}, written after every file, so its presence means the
 * files are whole), plus config.json. Names, layouts and metadata as
 * tr_st_export_model, so the bytes of one file equal what
 * tr_st_export_model writes for the same weights. Each file holds only
 * its own tensors in memory while it is written. */
typedef enum {
  TR_ST_EXPORT_ALL = 0,   /* every file, then the index and config.json */
  TR_ST_EXPORT_FILES = 1, /* this rank's files: file i (from 0) when
                             i % world == rank */
  TR_ST_EXPORT_INDEX = 2  /* the index and config.json, after every rank
                             wrote its files */
} tr_st_export_part_t;

typedef struct {
  const tr_dtype_t* dtype; /* F32, BF16 or F16; NULL: the saved dtype */
  int64_t max_shard_bytes; /* 0: 5000000000 */
  int sharded_names;       /* model-00001-of-00001 and an index for one
                              file too (checkpoint.last_save_in_hf, as
                              torchtitan's consolidated save) */
  tr_st_export_part_t part;
  int rank, world; /* TR_ST_EXPORT_FILES; world 0 means 1 */
  FILE* report;    /* "wrote PATH" per file written, or NULL */
} tr_st_export_opts_t;

/* Creates dir when missing. Errors name the file (or the checkpoint). */
int tr_st_export_checkpoint(const tr_ckpt_t* ck, const char* dir,
                            const tr_st_export_opts_t* o, tr_errmsg_t* err);

typedef struct {
  int nfiles, ntensors;
  int64_t total_size; /* bytes of tensor data */
  tr_dtype_t dtype;   /* of the first tensor */
} tr_st_hf_summary_t;

/* Check the Hugging Face folder dir through its
 * model.safetensors.index.json: every file it names opens and checks
 * (tr_st_open), holds the tensors the map gives it, and the tensors add up
 * to total_size. Without an index: the negated errno of opening it. */
int tr_st_check_hf_dir(const char* dir, tr_st_hf_summary_t* sum,
                       tr_errmsg_t* err);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_SAFETENSORS_H */
