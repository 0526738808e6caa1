/* trainer/prepare.c: writing llm.c token shards, and `trainrun data
 * prepare` — text files through the byte tokenizer into train/val shards
 * (trainrun/data.h). */
#include "config.h"

#include <dirent.h>
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trainrun/data.h"
#include "trainrun/error.h"
#include "core/internal.h"

/* A shard being written: header placeholder, tokens, header at commit. */
typedef struct {
  tr__afile_t af;
  int wide;
  int64_t n;
  size_t fill;
  uint8_t buf[1 << 16];
} shardw_t;

static int shardw_open(shardw_t* w, const char* path, int wide,
                       tr_errmsg_t* err) {
  w->wide = wide;
  w->n = 0;
  w->fill = 0;
  TR_CHECK(tr__afile_open(&w->af, path, err));
  uint8_t zero[TR_SHARD_HEADER_BYTES] = {0};
  int rc = tr__afile_write(&w->af, zero, sizeof zero, err);
  if (rc < 0) tr__afile_abort(&w->af);
  return rc;
}

static int shardw_flush(shardw_t* w, tr_errmsg_t* err) {
  int rc = tr__afile_write(&w->af, w->buf, w->fill, err);
  w->fill = 0;
  return rc;
}

static int shardw_put(shardw_t* w, uint32_t tok, tr_errmsg_t* err) {
  size_t width = w->wide ? 4 : 2;
  if (w->fill + width > sizeof w->buf) TR_CHECK(shardw_flush(w, err));
  if (w->wide) {
    uint32_t u = htole32(tok);
    memcpy(w->buf + w->fill, &u, 4);
  } else {
    uint16_t u = htole16((uint16_t)tok);
    memcpy(w->buf + w->fill, &u, 2);
  }
  w->fill += width;
  w->n++;
  return 0;
}

static int shardw_commit(shardw_t* w, tr_errmsg_t* err) {
  int rc = shardw_flush(w, err);
  if (rc < 0) goto out_abort;
  int32_t hdr[TR_SHARD_HEADER_INTS] = {0};
  hdr[0] = (int32_t)htole32(w->wide ? TR_SHARD_MAGIC_U32 : TR_SHARD_MAGIC_U16);
  hdr[1] =
      (int32_t)htole32(w->wide ? TR_SHARD_VERSION_U32 : TR_SHARD_VERSION_U16);
  hdr[2] = (int32_t)htole32((uint32_t)w->n);
  if (fseek(w->af.f, 0, SEEK_SET) != 0) {
    rc = tr_err_from_errno();
    tr_errmsg_set(err, rc, "cannot seek in '%s': %s", w->af.tmp,
                  tr_strerror(rc));
    goto out_abort;
  }
  rc = tr__afile_write(&w->af, hdr, sizeof hdr, err);
  if (rc < 0) goto out_abort;
  return tr__afile_commit(&w->af, err);
out_abort:
  tr__afile_abort(&w->af);
  return rc;
}

int tr_shard_write(const char* path, const uint32_t* tokens, int64_t n,
                   int wide, tr_errmsg_t* err) {
  if (n < 0 || n > TR_SHARD_MAX_TOKENS)
    return tr_errmsg_set(err, TR_ERANGE,
                         "'%s': %" PRId64 " tokens do not fit one shard", path,
                         n);
  uint32_t limit = wide ? UINT32_MAX : UINT16_MAX;
  for (int64_t i = 0; i < n; i++)
    if (tokens[i] > limit)
      return tr_errmsg_set(err, TR_ERANGE,
                           "'%s': token %" PRIu32 " at index %" PRId64
                           " does not fit a uint16 shard",
                           path, tokens[i], i);
  shardw_t* w = malloc(sizeof *w);
  if (!w) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  int rc = shardw_open(w, path, wide, err);
  for (int64_t i = 0; rc == 0 && i < n; i++) rc = shardw_put(w, tokens[i], err);
  if (rc == 0)
    rc = shardw_commit(w, err);
  else
    tr__afile_abort(&w->af);
  free(w);
  return rc;
}

/* ---- data prepare ---- */

typedef struct {
  const tr_data_prepare_opts_t* o;
  int64_t split; /* stream index where validation starts */
  int64_t pos;   /* stream index of the next token */
  shardw_t* w;   /* the open shard, or NULL */
  int w_is_val;
  int shards[2]; /* written so far: [0] train, [1] val */
  tr_data_prepare_result_t* res;
} prep_t;

static int prep_close(prep_t* p, tr_errmsg_t* err) {
  if (!p->w) return 0;
  int64_t n = p->w->n;
  int val = p->w_is_val;
  char path[4096];
  snprintf(path, sizeof path, "%s", p->w->af.path);
  int rc = shardw_commit(p->w, err);
  free(p->w);
  p->w = NULL;
  if (rc < 0) return rc;
  if (!p->o->quiet)
    printf("wrote %s (%" PRId64 " tokens, %s)\n", path, n,
           val ? "validation" : "training");
  return 0;
}

static int prep_put(prep_t* p, uint32_t tok, tr_errmsg_t* err) {
  int val = p->pos >= p->split;
  if (p->w && (p->w_is_val != val || p->w->n >= p->o->shard_tokens))
    TR_CHECK(prep_close(p, err));
  if (!p->w) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s_%06d.bin", p->o->out_dir,
             val ? "val" : "train", p->shards[val]);
    p->w = malloc(sizeof *p->w);
    if (!p->w) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
    int rc = shardw_open(p->w, path, 0, err);
    if (rc < 0) {
      free(p->w);
      p->w = NULL;
      return rc;
    }
    p->w_is_val = val;
    p->shards[val]++;
    if (val)
      p->res->val_shards++;
    else
      p->res->train_shards++;
  }
  TR_CHECK(shardw_put(p->w, tok, err));
  if (val)
    p->res->val_tokens++;
  else
    p->res->train_tokens++;
  p->pos++;
  return 0;
}

/* Remove train_NNNNNN.bin / val_NNNNNN.bin left by an earlier, larger run. */
static void remove_stale(const char* dir, const int shards[2]) {
  DIR* d = opendir(dir);
  if (!d) return;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    int idx, len = 0;
    int val = strncmp(e->d_name, "val_", 4) == 0;
    const char* num = e->d_name + (val ? 4 : 6);
    if (!val && strncmp(e->d_name, "train_", 6) != 0) continue;
    if (sscanf(num, "%6d.bin%n", &idx, &len) != 1 || len != 10 ||
        num[len] != '\0')
      continue;
    if (idx < shards[val]) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  closedir(d);
}

int tr_data_prepare(const char* const* inputs, size_t ninputs,
                    const tr_data_prepare_opts_t* opts,
                    tr_data_prepare_result_t* res, tr_errmsg_t* err) {
  memset(res, 0, sizeof *res);
  if (ninputs == 0) return tr_errmsg_set(err, TR_EINVAL, "no input files");
  if (!(opts->val_fraction >= 0 && opts->val_fraction < 1))
    return tr_errmsg_set(err, TR_EINVAL, "--val-fraction %g is not in [0, 1)",
                         opts->val_fraction);
  if (opts->shard_tokens <= 0 || opts->shard_tokens > TR_SHARD_MAX_TOKENS)
    return tr_errmsg_set(err, TR_EINVAL,
                         "--shard-tokens %" PRId64 " is not in [1, %lld]",
                         opts->shard_tokens, TR_SHARD_MAX_TOKENS);
  /* Sizes first: the split point depends on the total. */
  int64_t total = 0;
  for (size_t i = 0; i < ninputs; i++) {
    FILE* f = fopen(inputs[i], "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st) < 0) {
      int rc = tr_err_from_errno();
      if (f) fclose(f);
      return tr_errmsg_set(err, rc, "cannot open '%s': %s", inputs[i],
                           tr_strerror(rc));
    }
    if (!S_ISREG(st.st_mode)) {
      fclose(f);
      return tr_errmsg_set(err, TR_EINVAL, "'%s' is not a regular file",
                           inputs[i]);
    }
    uint8_t head[4];
    if (fread(head, 1, 4, f) == 4) {
      uint32_t m;
      memcpy(&m, head, 4);
      m = le32toh(m);
      if (m == TR_SHARD_MAGIC_U16 || m == TR_SHARD_MAGIC_U32) {
        fclose(f);
        return tr_errmsg_set(err, TR_EINVAL,
                             "'%s' is already a token shard (magic %" PRIu32
                             " at byte offset 0); data prepare reads text",
                             inputs[i], m);
      }
    }
    fclose(f);
    total += (int64_t)st.st_size + 1;
  }
  TR_CHECK(tr__mkdir_p(opts->out_dir, err));

  prep_t p = {.o = opts, .res = res};
  p.split = opts->val_fraction > 0
                ? tr_data_split_point(total, opts->val_fraction)
                : total;
  int rc = 0;
  uint8_t* buf = malloc(1 << 20);
  if (!buf) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  for (size_t i = 0; i < ninputs && rc == 0; i++) {
    FILE* f = fopen(inputs[i], "rb");
    if (!f) {
      rc = tr_err_from_errno();
      tr_errmsg_set(err, rc, "cannot open '%s': %s", inputs[i],
                    tr_strerror(rc));
      break;
    }
    rc = prep_put(&p, TR_BYTE_EOT, err); /* every document starts with EOT */
    size_t got;
    while (rc == 0 && (got = fread(buf, 1, 1 << 20, f)) > 0)
      for (size_t j = 0; j < got && rc == 0; j++)
        rc = prep_put(&p, buf[j], err);
    if (rc == 0 && ferror(f)) {
      rc = tr_err_from_errno();
      tr_errmsg_set(err, rc, "cannot read '%s': %s", inputs[i],
                    tr_strerror(rc));
    }
    fclose(f);
  }
  free(buf);
  if (rc == 0 && p.pos != total)
    rc = tr_errmsg_set(err, TR_EIO,
                       "the input files changed while they were read");
  if (rc == 0) rc = prep_close(&p, err);
  if (rc < 0) {
    if (p.w) {
      tr__afile_abort(&p.w->af);
      free(p.w);
    }
    return rc;
  }
  remove_stale(opts->out_dir, p.shards);
  return 0;
}
