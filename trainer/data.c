/* trainer/data.c: llm.c token shards, the byte tokenizer, datasets made of
 * shard and text files, and the deterministic loader (trainrun/data.h).
 *
 * Files are memory-mapped; a dataset is a sorted list of segments, one per
 * file, each a run of tokens of the global stream. Text segments start with
 * a virtual end-of-text token followed by the file's bytes.
 */
#include "config.h"

#include <ctype.h>
#include <dirent.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trainrun/data.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "core/buf.h" /* TR_GROW */
#include "core/internal.h"

/* ---- segments and datasets ---- */

typedef struct {
  char* path;
  const uint8_t* map; /* whole file; NULL for an empty file */
  size_t maplen;
  int width;     /* bytes per token: 1 (text), 2, 4 */
  int64_t hdr;   /* bytes before the first stored token */
  int lead;      /* 1: a virtual TR_BYTE_EOT comes first (text) */
  int64_t ntok;  /* tokens in the stream, lead included */
  int64_t start; /* stream index of the first token */
} seg_t;

struct tr_dataset {
  seg_t* segs;
  size_t nsegs;
  int64_t ntokens;
  int64_t vocab;
};

static void seg_release(seg_t* s) {
  if (s->map) munmap((void*)s->map, s->maplen);
  free(s->path);
  memset(s, 0, sizeof *s);
}

void tr_dataset_free(tr_dataset_t* ds) {
  if (!ds) return;
  for (size_t i = 0; i < ds->nsegs; i++) seg_release(&ds->segs[i]);
  free(ds->segs);
  free(ds);
}

static int ends_with(const char* s, const char* suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int32_t le32_at(const uint8_t* p) {
  uint32_t u;
  memcpy(&u, p, 4);
  return (int32_t)le32toh(u);
}

/* What a file that is not a regular file is, for messages. */
static const char* file_kind(mode_t m) {
  return S_ISDIR(m)    ? "a folder"
         : S_ISFIFO(m) ? "a FIFO"
         : S_ISSOCK(m) ? "a socket"
         : S_ISCHR(m)  ? "a character device"
         : S_ISBLK(m)  ? "a block device"
                       : "not a regular file";
}

/* Open path for reading if it is a regular file: a FIFO or a device is
 * refused rather than waited on (the open does not block). *fd and *st
 * (its fstat) on success. */
static int open_regular(const char* path, int* fd, struct stat* st,
                        tr_errmsg_t* err) {
  *fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (*fd < 0) {
    int rc = tr_err_from_errno();
    return tr_errmsg_set(err, rc, "cannot open '%s': %s", path,
                         tr_strerror(rc));
  }
  if (fstat(*fd, st) < 0) {
    int rc = tr_err_from_errno();
    close(*fd);
    return tr_errmsg_set(err, rc, "cannot stat '%s': %s", path,
                         tr_strerror(rc));
  }
  if (!S_ISREG(st->st_mode)) {
    close(*fd);
    return tr_errmsg_set(err, S_ISDIR(st->st_mode) ? TR_EISDIR : TR_EINVAL,
                         "'%s' is %s, not a data file", path,
                         file_kind(st->st_mode));
  }
  return 0;
}

/* Map path as a shard or a text file into s. */
static int seg_open(seg_t* s, const char* path, tr_errmsg_t* err) {
  memset(s, 0, sizeof *s);
  s->path = strdup(path);
  if (!s->path) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  struct stat st;
  int fd;
  TR_CHECK(open_regular(path, &fd, &st, err));
  size_t size = (size_t)st.st_size;
  if (size > 0) {
    void* m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      int rc = tr_err_from_errno();
      close(fd);
      return tr_errmsg_set(err, rc, "cannot map '%s': %s", path,
                           tr_strerror(rc));
    }
    s->map = m;
    s->maplen = size;
  }
  close(fd);

  if (!ends_with(path, ".bin")) { /* text through the byte tokenizer */
    s->width = 1;
    s->hdr = 0;
    s->lead = 1;
    s->ntok = (int64_t)size + 1;
    return 0;
  }
  if (size < TR_SHARD_HEADER_BYTES)
    return tr_errmsg_set(err, TR_EFORMAT,
                         "'%s': truncated header at byte offset %zu: a shard "
                         "starts with a %d-byte header",
                         path, size, TR_SHARD_HEADER_BYTES);
  int32_t magic = le32_at(s->map), version = le32_at(s->map + 4),
          count = le32_at(s->map + 8);
  int expect_version;
  if (magic == TR_SHARD_MAGIC_U16) {
    s->width = 2;
    expect_version = TR_SHARD_VERSION_U16;
  } else if (magic == TR_SHARD_MAGIC_U32) {
    s->width = 4;
    expect_version = TR_SHARD_VERSION_U32;
  } else {
    return tr_errmsg_set(err, TR_EFORMAT,
                         "'%s': bad magic %" PRId32
                         " at byte offset 0 (expected %d or %d)",
                         path, magic, TR_SHARD_MAGIC_U16, TR_SHARD_MAGIC_U32);
  }
  if (version != expect_version)
    return tr_errmsg_set(err, TR_EFORMAT,
                         "'%s': bad version %" PRId32
                         " at byte offset 4 (magic %" PRId32 " expects %d)",
                         path, version, magic, expect_version);
  if (count < 0)
    return tr_errmsg_set(err, TR_EFORMAT,
                         "'%s': bad token count %" PRId32 " at byte offset 8",
                         path, count);
  int64_t expect = TR_SHARD_HEADER_BYTES + (int64_t)count * s->width;
  if ((int64_t)size < expect)
    return tr_errmsg_set(err, TR_EFORMAT,
                         "'%s': truncated at byte offset %zu: the header says "
                         "%" PRId32
                         " tokens, which end at byte offset %" PRId64,
                         path, size, count, expect);
  if ((int64_t)size > expect)
    return tr_errmsg_set(err, TR_EFORMAT,
                         "'%s': %" PRId64
                         " unexpected bytes at byte offset %" PRId64
                         " after the %" PRId32
                         " tokens the header "
                         "declares",
                         path, (int64_t)size - expect, expect, count);
  s->hdr = TR_SHARD_HEADER_BYTES;
  s->lead = 0;
  s->ntok = count;
  return 0;
}

/* "val", "valid" or "validation" as a word of the file name: val_0.bin,
 * fineweb_val_000000.bin, shakespeare_val.bin, validation.txt. */
static int is_val_name(const char* name) {
  static const char* const words[] = {"validation", "valid", "val"};
  const char* base = strrchr(name, '/');
  base = base ? base + 1 : name;
  for (const char* p = base; (p = strstr(p, "val")) != NULL; p++) {
    if (p != base && isalnum((unsigned char)p[-1])) continue;
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
      size_t n = strlen(words[i]);
      if (strncmp(p, words[i], n) == 0 && !isalnum((unsigned char)p[n]))
        return 1;
    }
  }
  return 0;
}

typedef struct {
  char** v;
  size_t n, cap;
} strlist_t;

static int strlist_add(strlist_t* l, const char* s) {
  if (TR_GROW(l->v, l->n + 1, l->cap) < 0) return TR_ENOMEM;
  if (!(l->v[l->n] = strdup(s))) return TR_ENOMEM;
  l->n++;
  return 0;
}

static void strlist_release(strlist_t* l) {
  for (size_t i = 0; i < l->n; i++) free(l->v[i]);
  free(l->v);
  memset(l, 0, sizeof *l);
}

static int cmp_str(const void* a, const void* b) {
  return strcmp(*(char* const*)a, *(char* const*)b);
}

static int list_folder(const char* dir, tr_data_role_t role, strlist_t* out,
                       tr_errmsg_t* err) {
  DIR* d = opendir(dir);
  if (!d) {
    int rc = tr_err_from_errno();
    return tr_errmsg_set(err, rc, "cannot open '%s': %s", dir, tr_strerror(rc));
  }
  strlist_t bins = {0}, txts = {0};
  int rc = 0;
  struct dirent* e;
  size_t dl = strlen(dir);
  int slash = dl > 0 && dir[dl - 1] == '/';
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char path[4096];
    snprintf(path, sizeof path, "%s%s%s", dir, slash ? "" : "/", e->d_name);
    struct stat st;
    if (stat(path, &st) < 0 || !S_ISREG(st.st_mode)) continue;
    if (role == TR_DATA_TRAIN && is_val_name(e->d_name)) continue;
    if (role == TR_DATA_VAL && !is_val_name(e->d_name)) continue;
    if (ends_with(e->d_name, ".bin"))
      rc = strlist_add(&bins, path);
    else if (ends_with(e->d_name, ".txt"))
      rc = strlist_add(&txts, path);
    if (rc < 0) break;
  }
  closedir(d);
  if (rc < 0) {
    strlist_release(&bins);
    strlist_release(&txts);
    return tr_errmsg_set(err, rc, "out of memory");
  }
  strlist_t* pick = bins.n ? &bins : &txts;
  strlist_release(bins.n ? &txts : &bins);
  *out = *pick;
  if (out->n == 0)
    return tr_errmsg_set(err, TR_ENOTFOUND,
                         "'%s' holds no %s*.bin or *.txt files", dir,
                         role == TR_DATA_VAL ? "validation (val_*) " : "");
  qsort(out->v, out->n, sizeof *out->v, cmp_str);
  return 0;
}

static int list_files(const char* path, tr_data_role_t role, strlist_t* out,
                      tr_errmsg_t* err) {
  memset(out, 0, sizeof *out);
  if (strpbrk(path, "*?[")) {
    glob_t g;
    int grc = glob(path, GLOB_ERR, NULL, &g);
    if (grc == GLOB_NOMATCH)
      return tr_errmsg_set(err, TR_ENOTFOUND, "no file matches '%s'", path);
    if (grc != 0) {
      globfree(&g);
      return tr_errmsg_set(err, TR_EIO, "cannot expand '%s'", path);
    }
    int rc = 0;
    for (size_t i = 0; i < g.gl_pathc && rc == 0; i++)
      rc = strlist_add(out, g.gl_pathv[i]); /* glob sorts */
    globfree(&g);
    if (rc < 0) return tr_errmsg_set(err, rc, "out of memory");
    return 0;
  }
  struct stat st;
  if (stat(path, &st) < 0) {
    int rc = tr_err_from_errno();
    return tr_errmsg_set(err, rc, "cannot open '%s': %s", path,
                         tr_strerror(rc));
  }
  if (S_ISDIR(st.st_mode)) return list_folder(path, role, out, err);
  if (strlist_add(out, path) < 0)
    return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  return 0;
}

int tr_dataset_check(const char* path, tr_data_role_t role, tr_errmsg_t* err) {
  if (!path || !*path)
    return tr_errmsg_set(err, TR_EINVAL, "no data path given");
  strlist_t files;
  int rc = list_files(path, role, &files, err);
  for (size_t i = 0; i < files.n && rc == 0; i++) {
    struct stat st;
    int fd;
    rc = open_regular(files.v[i], &fd, &st, err);
    if (rc == 0) close(fd);
  }
  strlist_release(&files);
  return rc;
}

int tr_dataset_open(tr_dataset_t** out, const char* path, tr_data_role_t role,
                    int64_t vocab_size, tr_errmsg_t* err) {
  *out = NULL;
  if (!path || !*path)
    return tr_errmsg_set(err, TR_EINVAL, "no data path given");
  if (vocab_size <= 0)
    return tr_errmsg_set(err, TR_EINVAL, "bad vocabulary size %" PRId64,
                         vocab_size);
  strlist_t files;
  int rc = list_files(path, role, &files, err);
  if (rc < 0) {
    strlist_release(&files);
    return rc;
  }
  tr_dataset_t* ds = calloc(1, sizeof *ds);
  if (ds) ds->segs = calloc(files.n, sizeof *ds->segs);
  if (!ds || !ds->segs) {
    free(ds);
    strlist_release(&files);
    return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  }
  ds->vocab = vocab_size;
  for (size_t i = 0; i < files.n; i++) {
    rc = seg_open(&ds->segs[i], files.v[i], err);
    ds->nsegs = i + 1;
    if (rc < 0) break;
    ds->segs[i].start = ds->ntokens;
    ds->ntokens += ds->segs[i].ntok;
  }
  strlist_release(&files);
  if (rc < 0) {
    tr_dataset_free(ds);
    return rc;
  }
  TR_LOG_INFO(TRAIN, "data '%s': %zu files, %" PRId64 " tokens", path,
              ds->nsegs, ds->ntokens);
  *out = ds;
  return 0;
}

int64_t tr_dataset_ntokens(const tr_dataset_t* ds) { return ds->ntokens; }
size_t tr_dataset_nfiles(const tr_dataset_t* ds) { return ds->nsegs; }
int64_t tr_dataset_vocab_size(const tr_dataset_t* ds) { return ds->vocab; }
const char* tr_dataset_file(const tr_dataset_t* ds, size_t i) {
  return i < ds->nsegs ? ds->segs[i].path : NULL;
}

/* Index of the segment holding stream token t (t < ntokens). */
static size_t seg_find(const tr_dataset_t* ds, int64_t t) {
  size_t lo = 0, hi = ds->nsegs;
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (ds->segs[mid].start <= t)
      lo = mid;
    else
      hi = mid;
  }
  while (lo + 1 < ds->nsegs && ds->segs[lo].start + ds->segs[lo].ntok <= t)
    lo++; /* skip empty segments */
  return lo;
}

/* Copy n tokens of segment s starting at its token k; check the vocab. */
static int seg_copy(const tr_dataset_t* ds, const seg_t* s, int64_t k,
                    int64_t n, int32_t* out, tr_errmsg_t* err) {
  int64_t j = 0;
  for (; j < n && k + j < s->lead; j++) out[j] = TR_BYTE_EOT;
  const uint8_t* base = s->map + s->hdr;
  int64_t first = k + j - s->lead; /* stored token index */
  int64_t m = n - j;
  int32_t* o = out + j;
  int64_t bad = -1;
  uint32_t badv = 0;
  if (s->width == 1) {
    for (int64_t i = 0; i < m; i++) o[i] = base[first + i];
  } else if (s->width == 2) {
    for (int64_t i = 0; i < m; i++) {
      uint16_t u;
      memcpy(&u, base + 2 * (first + i), 2);
      o[i] = le16toh(u);
    }
  } else {
    for (int64_t i = 0; i < m; i++) {
      uint32_t u;
      memcpy(&u, base + 4 * (first + i), 4);
      u = le32toh(u);
      if (u > INT32_MAX) {
        bad = i;
        badv = u;
        break;
      }
      o[i] = (int32_t)u;
    }
  }
  if (bad < 0) {
    for (int64_t i = 0; i < m; i++)
      if (o[i] >= ds->vocab) {
        bad = i;
        badv = (uint32_t)o[i];
        break;
      }
  }
  if (bad >= 0)
    return tr_errmsg_set(err, TR_EFORMAT,
                         "'%s': token %" PRIu32 " at byte offset %" PRId64
                         " is not below the vocabulary size %" PRId64,
                         s->path, badv, s->hdr + (first + bad) * s->width,
                         ds->vocab);
  return 0;
}

int tr_dataset_read(const tr_dataset_t* ds, int64_t start, int64_t n,
                    int32_t* out, tr_errmsg_t* err) {
  if (start < 0 || n < 0 || start > ds->ntokens || n > ds->ntokens - start)
    return tr_errmsg_set(err, TR_ERANGE,
                         "tokens [%" PRId64 ", %" PRId64
                         ") are outside the %" PRId64 " tokens of the data",
                         start, start + n, ds->ntokens);
  if (n == 0) return 0;
  size_t si = seg_find(ds, start);
  int64_t t = start, done = 0;
  while (done < n) {
    const seg_t* s = &ds->segs[si++];
    int64_t k = t - s->start;
    int64_t take = s->ntok - k;
    if (take <= 0) continue;
    if (take > n - done) take = n - done;
    TR_CHECK(seg_copy(ds, s, k, take, out + done, err));
    done += take;
    t += take;
  }
  return 0;
}

int64_t tr_data_split_point(int64_t ntokens, double fraction) {
  if (ntokens <= 0 || !(fraction > 0)) return ntokens < 0 ? 0 : ntokens;
  if (fraction >= 1) return 0;
  int64_t val = (int64_t)ceil(fraction * (double)ntokens);
  if (val > ntokens) val = ntokens;
  return ntokens - val;
}

/* ---- the byte tokenizer ---- */

int64_t tr_byte_encode(const char* text, size_t n, int32_t* out) {
  for (size_t i = 0; i < n; i++) out[i] = (unsigned char)text[i];
  return (int64_t)n;
}

size_t tr_byte_decode(const int32_t* tokens, size_t n, char* out, size_t cap) {
  if (cap == 0) return 0;
  size_t w = 0;
  for (size_t i = 0; i < n && w + 1 < cap; i++)
    out[w++] = (tokens[i] >= 0 && tokens[i] < 256) ? (char)tokens[i] : '?';
  out[w] = '\0';
  return w;
}

/* ---- the permutation ---- */

static uint64_t mix64(uint64_t x) { /* SplitMix64's finaliser */
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

int64_t tr_data_permute(int64_t i, int64_t n, uint64_t key) {
  if (n <= 1 || i < 0 || i >= n) return i;
  int bits = 2;
  while (bits < 62 && ((uint64_t)1 << bits) < (uint64_t)n) bits += 2;
  int half = bits / 2;
  uint64_t mask = ((uint64_t)1 << half) - 1;
  uint64_t x = (uint64_t)i;
  do { /* cycle-walk until the image falls back into [0, n) */
    uint64_t l = x >> half, r = x & mask;
    for (int round = 0; round < 4; round++) {
      uint64_t f = mix64(r ^ mix64(key + (uint64_t)round)) & mask;
      uint64_t nl = r;
      r = l ^ f;
      l = nl;
    }
    x = (l << half) | r;
  } while (x >= (uint64_t)n);
  return (int64_t)x;
}

/* ---- the loader ---- */

int tr_loader_init(tr_loader_t* ld, const tr_dataset_t* ds, int64_t begin,
                   int64_t end, int64_t seq_len, uint64_t seed, int shuffle,
                   tr_errmsg_t* err) {
  memset(ld, 0, sizeof *ld);
  if (end < 0 || end > ds->ntokens) end = ds->ntokens;
  if (begin < 0) begin = 0;
  if (seq_len <= 0)
    return tr_errmsg_set(err, TR_EINVAL, "bad sequence length %" PRId64,
                         seq_len);
  int64_t n = end > begin ? end - begin : 0;
  if (n < seq_len + 1)
    return tr_errmsg_set(
        err, TR_EINVAL,
        "'%s'%s holds %" PRId64 " tokens, fewer than one sequence of %" PRId64
        " (seq_len + 1)",
        ds->nsegs ? ds->segs[0].path : "",
        ds->nsegs > 1 ? " (and the files after it)" : "", n, seq_len + 1);
  ld->ds = ds;
  ld->begin = begin;
  ld->end = end;
  ld->seq_len = seq_len;
  ld->seed = seed;
  ld->shuffle = shuffle;
  ld->nsamples = (n - 1) / seq_len;
  ld->next = 0;
  return 0;
}

int64_t tr_loader_window(const tr_loader_t* ld, int64_t i) {
  int64_t epoch = i / ld->nsamples, k = i % ld->nsamples;
  if (ld->shuffle)
    k = tr_data_permute(k, ld->nsamples,
                        mix64(ld->seed ^ mix64((uint64_t)epoch)));
  return ld->begin + k * ld->seq_len;
}

int tr_loader_sample(const tr_loader_t* ld, int64_t i, int32_t* inputs,
                     int32_t* targets, tr_errmsg_t* err) {
  int64_t T = ld->seq_len;
  int32_t stackbuf[1025];
  int32_t* buf = T + 1 <= 1025 ? stackbuf : malloc((size_t)(T + 1) * 4);
  if (!buf) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  int rc = tr_dataset_read(ld->ds, tr_loader_window(ld, i), T + 1, buf, err);
  if (rc == 0) {
    if (inputs) memcpy(inputs, buf, (size_t)T * 4);
    if (targets) memcpy(targets, buf + 1, (size_t)T * 4);
  }
  if (buf != stackbuf) free(buf);
  return rc;
}

int tr_loader_next(tr_loader_t* ld, int64_t batch, int dp_rank, int dp_size,
                   int32_t* inputs, int32_t* targets, tr_errmsg_t* err) {
  int64_t first = ld->next + (int64_t)dp_rank * batch;
  ld->next += batch * dp_size;
  for (int64_t b = 0; b < batch; b++)
    TR_CHECK(tr_loader_sample(ld, first + b,
                              inputs ? inputs + b * ld->seq_len : NULL,
                              targets ? targets + b * ld->seq_len : NULL, err));
  return 0;
}

int64_t tr_loader_epoch(const tr_loader_t* ld) {
  return ld->next / ld->nsamples;
}
int64_t tr_loader_epoch_index(const tr_loader_t* ld) {
  return ld->next % ld->nsamples;
}

void tr_loader_get_state(const tr_loader_t* ld, tr_loader_state_t* st) {
  st->sample = ld->next;
  st->seed = ld->seed;
  st->seq_len = ld->seq_len;
  st->ntokens = ld->end - ld->begin;
}

int tr_loader_restore(tr_loader_t* ld, const tr_loader_state_t* st,
                      tr_errmsg_t* err) {
  if (st->seq_len != ld->seq_len || st->seed != ld->seed ||
      st->ntokens != ld->end - ld->begin || st->sample < 0)
    return tr_errmsg_set(
        err, TR_EINVAL,
        "the saved data-loader state is for another stream (seq_len %" PRId64
        ", seed %" PRIu64 ", %" PRId64 " tokens; this run: seq_len %" PRId64
        ", seed %" PRIu64 ", %" PRId64 " tokens)",
        st->seq_len, st->seed, st->ntokens, ld->seq_len, ld->seed,
        ld->end - ld->begin);
  ld->next = st->sample;
  return 0;
}
