/* trainrun/data.h: training data — llm.c token shards, the byte-level
 * tokenizer, and the deterministic, resumable, resharding-safe loader.
 *
 * Token files
 * -----------
 * An llm.c token shard is a header of 256 little-endian int32 (1024 bytes)
 * followed by the tokens:
 *
 *     header[0]  magic: 20240520 (uint16 tokens, GPT-2 vocabularies) or
 *                       20240801 (uint32 tokens, Llama-3 vocabularies)
 *     header[1]  version: 1 for 20240520, 7 for 20240801 (llm.c's values)
 *     header[2]  number of tokens that follow (>= 0)
 *
 * and the file size must be exactly 1024 + count * token size. Any other
 * file is plain text, read through the byte-level tokenizer: token = byte
 * value (vocabulary of 256). The byte tokenizer has no token to spare for an
 * end-of-text marker, so byte 0 (NUL, which text files do not contain) is
 * the end-of-text token TR_BYTE_EOT: every text file (document) starts with
 * one, as llm.c's preprocessing puts GPT-2's <|endoftext|> before every
 * document, and `trainrun sample` stops at it.
 *
 * A dataset (tr_dataset_t) is one or more files read as one stream of
 * tokens, in file-name order. The path given to tr_dataset_open is
 *   - a file: "data/train.bin" (shard when its name ends in ".bin", else
 *     text),
 *   - a folder: its "*.bin" files, or when it holds none its "*.txt" files
 *     (hidden files skipped); with TR_DATA_TRAIN, file names that mark a
 *     validation split ("val", "valid" or "validation" between separators:
 *     val_000000.bin, fineweb_val_000000.bin, validation.txt) are left out,
 *     and with TR_DATA_VAL only those are taken — the layout `trainrun data
 *     prepare` writes and llm.c's scripts use;
 *   - a glob: "data/fineweb_train_*.bin" (every match, sorted).
 * Shards are memory-mapped; nothing is read until a window is asked for.
 * Every token is checked against the vocabulary as it is read; a bad one
 * fails the read with a message naming the file and its byte offset.
 *
 * The loader
 * ----------
 * The token stream [begin, end) of a dataset is cut into S = (end - begin
 * - 1) / T non-overlapping windows of T + 1 tokens (window j starts at
 * begin + j*T; inputs are its first T tokens, targets its last T). The
 * global stream of samples is infinite: sample i belongs to epoch
 * e = i / S and is window perm_e(i % S), where perm_e is a permutation of
 * [0, S) fixed by (seed, e) (identity when shuffling is off). So sample i
 * depends only on (data, T, seed, i).
 *
 * A global batch of G sequences at optimizer step s is samples [s*G,
 * (s+1)*G). Each micro-step takes B × dp of them, and data-parallel rank r
 * takes the B starting at r*B. The loader's state is the index of the next
 * global sample; resuming at any step with any dp degree (and the same G)
 * continues the same stream.
 */
#ifndef TRAINRUN_DATA_H
#define TRAINRUN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "trainrun/errmsg.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TR_SHARD_MAGIC_U16 20240520
#define TR_SHARD_VERSION_U16 1
#define TR_SHARD_MAGIC_U32 20240801
#define TR_SHARD_VERSION_U32 7
#define TR_SHARD_HEADER_INTS 256
#define TR_SHARD_HEADER_BYTES 1024
#define TR_SHARD_MAX_TOKENS 2147483647LL /* header[2] is an int32 */

#define TR_BYTE_VOCAB 256 /* the byte tokenizer's vocabulary */
#define TR_BYTE_EOT 0     /* its end-of-text token (byte NUL) */

/* ---- shard files ---- */

/* Write tokens as an llm.c shard at path: uint16 (magic 20240520) when
 * wide == 0, uint32 (20240801) when wide == 1. Written to "path.tmp",
 * fsync'd and renamed, so a reader never sees half a file. Tokens must fit
 * the width (TR_ERANGE names the first that does not). */
int tr_shard_write(const char* path, const uint32_t* tokens, int64_t n,
                   int wide, tr_errmsg_t* err);

/* ---- the byte tokenizer ---- */

/* out[i] = (unsigned char)text[i]; returns n. */
int64_t tr_byte_encode(const char* text, size_t n, int32_t* out);
/* Bytes of tokens < 256 into out (cap bytes, always NUL-terminated when
 * cap > 0); tokens >= 256 or < 0 become '?'. Returns the bytes written. */
size_t tr_byte_decode(const int32_t* tokens, size_t n, char* out, size_t cap);

/* ---- datasets ---- */

typedef enum {
  TR_DATA_ALL = 0,   /* every file the path names */
  TR_DATA_TRAIN = 1, /* in a folder: leave out validation files */
  TR_DATA_VAL = 2    /* in a folder: only validation files */
} tr_data_role_t;

typedef struct tr_dataset tr_dataset_t;

/* Open the files path names (see above). Shard headers and sizes are
 * checked here (TR_EFORMAT: bad magic, bad version, negative count,
 * truncated or oversized file — the message names the file and byte
 * offset); vocab_size bounds every token later read. Errors: the negated
 * errno of a file that cannot be opened, TR_ENOTFOUND when the path names
 * no file, TR_EFORMAT, TR_ENOMEM. *out is NULL on error. */
int tr_dataset_open(tr_dataset_t** out, const char* path, tr_data_role_t role,
                    int64_t vocab_size, tr_errmsg_t* err);
void tr_dataset_free(tr_dataset_t* ds);

/* What tr_dataset_open checks before it reads anything, without reading:
 * the path names files (a glob matches some, a folder holds some for the
 * role) and each is a regular file that can be opened for reading (a FIFO,
 * a socket or a device is refused, never waited on). For a launcher's
 * checks before any work starts. */
int tr_dataset_check(const char* path, tr_data_role_t role, tr_errmsg_t* err);

int64_t tr_dataset_ntokens(const tr_dataset_t* ds);
size_t tr_dataset_nfiles(const tr_dataset_t* ds);
const char* tr_dataset_file(const tr_dataset_t* ds, size_t i);
int64_t tr_dataset_vocab_size(const tr_dataset_t* ds);

/* Copy tokens [start, start+n) of the stream into out (as int32), checking
 * each against the vocabulary: TR_EFORMAT with "'file': token 300 at byte
 * offset 1062 is not below the vocabulary size 256". TR_ERANGE when the
 * range leaves the stream. Thread-safe (reads only). */
int tr_dataset_read(const tr_dataset_t* ds, int64_t start, int64_t n,
                    int32_t* out, tr_errmsg_t* err);

/* Token index where a validation split of the last `fraction` of n tokens
 * begins: n - ceil(fraction * n), in [0, n]. */
int64_t tr_data_split_point(int64_t ntokens, double fraction);

/* ---- the loader ---- */

typedef struct {
  const tr_dataset_t* ds; /* borrowed; outlives the loader */
  int64_t begin, end;     /* token range read */
  int64_t seq_len;        /* T */
  uint64_t seed;
  int shuffle;
  int64_t nsamples; /* S: windows per epoch */
  int64_t next;     /* the state: index of the next global sample */
} tr_loader_t;

/* What a checkpoint keeps of a loader. tr_loader_restore checks that the
 * stream it describes is the one this loader reads. */
typedef struct {
  int64_t sample; /* next global sample */
  uint64_t seed;
  int64_t seq_len;
  int64_t ntokens; /* end - begin */
} tr_loader_state_t;

/* Read tokens [begin, end) of ds (end < 0: to the end) as windows of
 * seq_len + 1. TR_EINVAL with a message when the range holds no full window
 * ("'data/val.bin' holds 100 tokens, fewer than one sequence of 257"). */
int tr_loader_init(tr_loader_t* ld, const tr_dataset_t* ds, int64_t begin,
                   int64_t end, int64_t seq_len, uint64_t seed, int shuffle,
                   tr_errmsg_t* err);

/* First token (stream index) of global sample i. */
int64_t tr_loader_window(const tr_loader_t* ld, int64_t i);
/* Sample i: inputs[T] and targets[T] (either may be NULL). */
int tr_loader_sample(const tr_loader_t* ld, int64_t i, int32_t* inputs,
                     int32_t* targets, tr_errmsg_t* err);
/* This rank's slice of the next micro-batch of batch*dp_size samples:
 * samples next + dp_rank*batch + [0, batch) into inputs/targets [batch*T];
 * then next += batch*dp_size (also when the read fails). */
int tr_loader_next(tr_loader_t* ld, int64_t batch, int dp_rank, int dp_size,
                   int32_t* inputs, int32_t* targets, tr_errmsg_t* err);

/* Epoch of the next sample and its index inside the epoch. */
int64_t tr_loader_epoch(const tr_loader_t* ld);
int64_t tr_loader_epoch_index(const tr_loader_t* ld);

void tr_loader_get_state(const tr_loader_t* ld, tr_loader_state_t* st);
/* Continue from st; TR_EINVAL with a message when st was saved for another
 * seed, seq_len or token count. */
int tr_loader_restore(tr_loader_t* ld, const tr_loader_state_t* st,
                      tr_errmsg_t* err);

/* The permutation behind shuffling: a bijection of [0, n) fixed by key
 * (a 4-round Feistel network over the next power of 4, cycle-walking back
 * into range). Exposed for tests. */
int64_t tr_data_permute(int64_t i, int64_t n, uint64_t key);

/* ---- `trainrun data prepare` ---- */

typedef struct {
  const char* out_dir;  /* created if missing */
  double val_fraction;  /* last fraction of the stream to val_*.bin; 0: none */
  int64_t shard_tokens; /* tokens per shard (default 100,000,000) */
  int quiet;            /* no per-shard lines on stdout */
} tr_data_prepare_opts_t;

typedef struct {
  int64_t train_tokens, val_tokens;
  int train_shards, val_shards;
} tr_data_prepare_result_t;

/* Tokenize text files with the byte tokenizer (an EOT before each file) and
 * write out_dir/train_NNNNNN.bin and out_dir/val_NNNNNN.bin (uint16
 * shards). Inputs that already are token shards are refused (TR_EINVAL).
 * Errors name the file. */
int tr_data_prepare(const char* const* inputs, size_t ninputs,
                    const tr_data_prepare_opts_t* opts,
                    tr_data_prepare_result_t* res, tr_errmsg_t* err);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_DATA_H */
