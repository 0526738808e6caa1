/* tests/check_data.c: llm.c token shards (round trip, every bad-file error
 * with its offset), text through the byte tokenizer, folders and globs,
 * the loader (determinism, epochs, data-parallel resharding, resume), the
 * validation split, and `data prepare`. */
#include "config.h"

#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trainrun/data.h"
#include "trainrun/error.h"
#include "tests/fixtures.h"

static void setup(void) { fx_tmpdir_make("check_data"); }

/* A raw shard: header fields as given, then n uint16/uint32 tokens. */
static void write_raw_shard(const char* path, int32_t magic, int32_t version,
                            int32_t count, const uint32_t* toks, size_t n,
                            int width) {
  size_t size = 1024 + n * (size_t)width;
  uint8_t* buf = calloc(1, size);
  int32_t hdr[3] = {magic, version, count};
  memcpy(buf, hdr, sizeof hdr);
  for (size_t i = 0; i < n; i++) {
    if (width == 2) {
      uint16_t u = (uint16_t)toks[i];
      memcpy(buf + 1024 + 2 * i, &u, 2);
    } else {
      memcpy(buf + 1024 + 4 * i, &toks[i], 4);
    }
  }
  fx_write_bytes(path, buf, size);
  free(buf);
}

/* Expect tr_dataset_open(path) to fail with code and a message holding
 * every string in want[] (NULL-terminated). */
static void expect_open_error(const char* path, int64_t vocab, int code,
                              const char* const* want) {
  tr_dataset_t* ds;
  tr_errmsg_t err;
  int rc = tr_dataset_open(&ds, path, TR_DATA_ALL, vocab, &err);
  ck_assert_int_eq(rc, code);
  ck_assert_ptr_null(ds);
  for (size_t i = 0; want[i]; i++)
    ck_assert_msg(strstr(err.message, want[i]), "message '%s' lacks '%s'",
                  err.message, want[i]);
}

START_TEST(test_shard_round_trip) {
  uint32_t toks[1000];
  for (int i = 0; i < 1000; i++) toks[i] = (uint32_t)(i * 37 % 50257);
  tr_errmsg_t err;
  ck_assert_int_eq(tr_shard_write(fx_path("a.bin"), toks, 1000, 0, &err), 0);
  /* header bytes: magic, version, count; size 1024 + 2n */
  FILE* f = fopen(fx_path("a.bin"), "rb");
  int32_t hdr[256];
  ck_assert_uint_eq(fread(hdr, 4, 256, f), 256);
  fseek(f, 0, SEEK_END);
  ck_assert_int_eq(ftell(f), 1024 + 2000);
  fclose(f);
  ck_assert_int_eq(hdr[0], 20240520);
  ck_assert_int_eq(hdr[1], 1);
  ck_assert_int_eq(hdr[2], 1000);
  for (int i = 3; i < 256; i++) ck_assert_int_eq(hdr[i], 0);
  ck_assert_int_eq(access(fx_path("a.bin.tmp"), F_OK), -1); /* renamed away */

  /* uint32 shard with a Llama-3-sized token */
  uint32_t big[3] = {128000, 5, 128255};
  ck_assert_int_eq(tr_shard_write(fx_path("b.bin"), big, 3, 1, &err), 0);
  f = fopen(fx_path("b.bin"), "rb");
  ck_assert_uint_eq(fread(hdr, 4, 256, f), 256);
  fclose(f);
  ck_assert_int_eq(hdr[0], 20240801);
  ck_assert_int_eq(hdr[1], 7);
  ck_assert_int_eq(hdr[2], 3);
  /* a token that does not fit uint16 is refused */
  ck_assert_int_eq(tr_shard_write(fx_path("c.bin"), big, 3, 0, &err),
                   TR_ERANGE);
  ck_assert_ptr_nonnull(strstr(err.message, "token 128000"));

  /* both read back, in name order, as one stream */
  tr_dataset_t* ds;
  ck_assert_int_eq(
      tr_dataset_open(&ds, fx_path("*.bin"), TR_DATA_ALL, 128256, &err), 0);
  ck_assert_uint_eq(tr_dataset_nfiles(ds), 2);
  ck_assert_int_eq(tr_dataset_ntokens(ds), 1003);
  int32_t out[1003];
  ck_assert_int_eq(tr_dataset_read(ds, 0, 1003, out, &err), 0);
  for (int i = 0; i < 1000; i++) ck_assert_int_eq(out[i], (int32_t)toks[i]);
  ck_assert_int_eq(out[1000], 128000);
  ck_assert_int_eq(out[1002], 128255);
  /* a read across the file boundary */
  ck_assert_int_eq(tr_dataset_read(ds, 998, 4, out, &err), 0);
  ck_assert_int_eq(out[0], (int32_t)toks[998]);
  ck_assert_int_eq(out[2], 128000);
  ck_assert_int_eq(tr_dataset_read(ds, 1000, 4, out, &err), TR_ERANGE);
  tr_dataset_free(ds);
}
END_TEST

START_TEST(test_bad_shards) {
  uint32_t toks[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  write_raw_shard(fx_path("magic.bin"), 12345, 1, 8, toks, 8, 2);
  expect_open_error(
      fx_path("magic.bin"), 256, TR_EFORMAT,
      (const char*[]){"magic.bin'", "bad magic 12345", "byte offset 0", NULL});
  write_raw_shard(fx_path("version.bin"), 20240520, 2, 8, toks, 8, 2);
  expect_open_error(
      fx_path("version.bin"), 256, TR_EFORMAT,
      (const char*[]){"version.bin'", "bad version 2", "byte offset 4", NULL});
  write_raw_shard(fx_path("version32.bin"), 20240801, 1, 8, toks, 8, 4);
  expect_open_error(fx_path("version32.bin"), 256, TR_EFORMAT,
                    (const char*[]){"bad version 1", "expects 7", NULL});
  write_raw_shard(fx_path("count.bin"), 20240520, 1, -5, toks, 8, 2);
  expect_open_error(
      fx_path("count.bin"), 256, TR_EFORMAT,
      (const char*[]){"bad token count -5", "byte offset 8", NULL});
  /* header says 8 tokens, the file holds 5 */
  write_raw_shard(fx_path("trunc.bin"), 20240520, 1, 8, toks, 5, 2);
  expect_open_error(fx_path("trunc.bin"), 256, TR_EFORMAT,
                    (const char*[]){"trunc.bin'",
                                    "truncated at byte offset "
                                    "1034",
                                    "says 8 tokens", "byte offset 1040", NULL});
  /* shorter than a header */
  fx_write_bytes(fx_path("short.bin"), "\x58\xd9\x34\x01", 4);
  expect_open_error(fx_path("short.bin"), 256, TR_EFORMAT,
                    (const char*[]){"short.bin'",
                                    "truncated header at byte "
                                    "offset 4",
                                    NULL});
  /* bytes after the last token */
  write_raw_shard(fx_path("long.bin"), 20240520, 1, 6, toks, 8, 2);
  expect_open_error(
      fx_path("long.bin"), 256, TR_EFORMAT,
      (const char*[]){"4 unexpected bytes at byte offset 1036", NULL});
  /* a missing file: the negated errno, naming the file */
  expect_open_error(
      fx_path("nope.bin"), 256, TR_ENOENT,
      (const char*[]){"cannot open '", "nope.bin'", "no such file", NULL});
  expect_open_error(fx_path("nothing*.bin"), 256, TR_ENOTFOUND,
                    (const char*[]){"no file matches", NULL});
}
END_TEST

START_TEST(test_token_beyond_vocab) {
  uint32_t toks[6] = {1, 2, 3, 300, 5, 6};
  write_raw_shard(fx_path("v.bin"), 20240520, 1, 6, toks, 6, 2);
  tr_dataset_t* ds;
  tr_errmsg_t err;
  ck_assert_int_eq(
      tr_dataset_open(&ds, fx_path("v.bin"), TR_DATA_ALL, 256, &err), 0);
  int32_t out[6];
  ck_assert_int_eq(tr_dataset_read(ds, 0, 3, out, &err), 0); /* before it */
  ck_assert_int_eq(tr_dataset_read(ds, 1, 4, out, &err), TR_EFORMAT);
  ck_assert_msg(strstr(err.message,
                       "v.bin': token 300 at byte offset 1030 is "
                       "not below the vocabulary size 256"),
                "%s", err.message);
  tr_dataset_free(ds);
  /* uint32 shard: offset counts 4 bytes per token */
  uint32_t wide[4] = {7, 8, 9, 70000};
  write_raw_shard(fx_path("w.bin"), 20240801, 7, 4, wide, 4, 4);
  ck_assert_int_eq(
      tr_dataset_open(&ds, fx_path("w.bin"), TR_DATA_ALL, 50000, &err), 0);
  ck_assert_int_eq(tr_dataset_read(ds, 0, 4, out, &err), TR_EFORMAT);
  ck_assert_msg(strstr(err.message, "token 70000 at byte offset 1036"), "%s",
                err.message);
  tr_dataset_free(ds);
}
END_TEST

START_TEST(test_text_and_folders) {
  fx_write_bytes(fx_path("a.txt"), "hi\n", 3);
  fx_write_bytes(fx_path("b.txt"), "\xff", 1);
  fx_write_bytes(fx_path("notes.md"), "ignored", 7);
  tr_dataset_t* ds;
  tr_errmsg_t err;
  /* a folder of text files: each starts with the EOT token (0) */
  ck_assert_int_eq(tr_dataset_open(&ds, fx_tmpdir, TR_DATA_ALL, 256, &err), 0);
  ck_assert_uint_eq(tr_dataset_nfiles(ds), 2);
  ck_assert_int_eq(tr_dataset_ntokens(ds), 6);
  int32_t out[6];
  ck_assert_int_eq(tr_dataset_read(ds, 0, 6, out, &err), 0);
  int32_t want[6] = {0, 'h', 'i', '\n', 0, 255};
  for (int i = 0; i < 6; i++) ck_assert_int_eq(out[i], want[i]);
  tr_dataset_free(ds);
  /* a byte >= vocab names the file and the byte offset in it */
  ck_assert_int_eq(
      tr_dataset_open(&ds, fx_path("b.txt"), TR_DATA_ALL, 200, &err), 0);
  ck_assert_int_eq(tr_dataset_read(ds, 0, 2, out, &err), TR_EFORMAT);
  ck_assert_msg(strstr(err.message, "b.txt': token 255 at byte offset 0"), "%s",
                err.message);
  tr_dataset_free(ds);

  /* a folder with shards: train and val files told apart by name */
  char sub[512];
  snprintf(sub, sizeof sub, "%s/shards", fx_tmpdir);
  ck_assert_int_eq(mkdir(sub, 0777), 0);
  uint32_t t1[2] = {1, 2}, t2[2] = {3, 4}, t3[2] = {5, 6};
  ck_assert_int_eq(tr_shard_write(fx_path("shards/fineweb_train_000001.bin"),
                                  t1, 2, 0, &err),
                   0);
  ck_assert_int_eq(
      tr_shard_write(fx_path("shards/fineweb_val_000000.bin"), t2, 2, 0, &err),
      0);
  ck_assert_int_eq(tr_shard_write(fx_path("shards/fineweb_train_000002.bin"),
                                  t3, 2, 0, &err),
                   0);
  ck_assert_int_eq(tr_dataset_open(&ds, sub, TR_DATA_TRAIN, 256, &err), 0);
  ck_assert_uint_eq(tr_dataset_nfiles(ds), 2);
  ck_assert_int_eq(tr_dataset_read(ds, 0, 4, out, &err), 0);
  ck_assert_int_eq(out[0], 1);
  ck_assert_int_eq(out[3], 6);
  tr_dataset_free(ds);
  ck_assert_int_eq(tr_dataset_open(&ds, sub, TR_DATA_VAL, 256, &err), 0);
  ck_assert_uint_eq(tr_dataset_nfiles(ds), 1);
  ck_assert_ptr_nonnull(strstr(tr_dataset_file(ds, 0), "fineweb_val_000000"));
  tr_dataset_free(ds);
  ck_assert_int_eq(tr_dataset_open(&ds, sub, TR_DATA_ALL, 256, &err), 0);
  ck_assert_uint_eq(tr_dataset_nfiles(ds), 3);
  tr_dataset_free(ds);
  /* "valid" and "validation" count; "interval" and "value" do not */
  ck_assert_int_eq(
      tr_shard_write(fx_path("shards/interval.bin"), t1, 2, 0, &err), 0);
  ck_assert_int_eq(
      tr_shard_write(fx_path("shards/validation.bin"), t2, 2, 0, &err), 0);
  ck_assert_int_eq(tr_dataset_open(&ds, sub, TR_DATA_VAL, 256, &err), 0);
  ck_assert_uint_eq(tr_dataset_nfiles(ds), 2);
  ck_assert_ptr_nonnull(strstr(tr_dataset_file(ds, 1), "validation.bin"));
  tr_dataset_free(ds);
  ck_assert_int_eq(tr_dataset_open(&ds, sub, TR_DATA_TRAIN, 256, &err), 0);
  ck_assert_uint_eq(tr_dataset_nfiles(ds), 3);
  tr_dataset_free(ds);
}
END_TEST

START_TEST(test_byte_tokenizer) {
  int32_t t[5];
  ck_assert_int_eq(tr_byte_encode("a\xc3\xa9z", 4, t), 4);
  ck_assert_int_eq(t[0], 'a');
  ck_assert_int_eq(t[1], 0xc3);
  ck_assert_int_eq(t[2], 0xa9);
  char s[8];
  t[3] = 300;
  ck_assert_uint_eq(tr_byte_decode(t, 4, s, sizeof s), 4);
  ck_assert_str_eq(s, "a\xc3\xa9?");
  ck_assert_uint_eq(tr_byte_decode(t, 4, s, 3), 2); /* cut, terminated */
  ck_assert_str_eq(s, "a\xc3");
}
END_TEST

START_TEST(test_permutation) {
  const int64_t sizes[] = {1, 2, 3, 7, 16, 100, 1000, 4097};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    int64_t n = sizes[k];
    char* seen = calloc((size_t)n, 1);
    int64_t fixed = 0;
    for (int64_t i = 0; i < n; i++) {
      int64_t p = tr_data_permute(i, n, 42);
      ck_assert(p >= 0 && p < n);
      ck_assert(!seen[p]);
      seen[p] = 1;
      fixed += p == i;
      ck_assert_int_eq(p, tr_data_permute(i, n, 42)); /* a function */
    }
    if (n >= 100) ck_assert_int_lt(fixed, n / 10); /* it does shuffle */
    free(seen);
  }
  /* another key, another order */
  int differ = 0;
  for (int64_t i = 0; i < 100; i++)
    differ += tr_data_permute(i, 100, 1) != tr_data_permute(i, 100, 2);
  ck_assert_int_gt(differ, 50);
}
END_TEST

/* A stream 0, 1, 2, ... (mod 50000) of n tokens as one uint16 shard. */
static tr_dataset_t* counting_data(int64_t n) {
  uint32_t* t = malloc((size_t)n * 4);
  for (int64_t i = 0; i < n; i++) t[i] = (uint32_t)(i % 50000);
  tr_errmsg_t err;
  ck_assert_int_eq(tr_shard_write(fx_path("count.bin"), t, n, 0, &err), 0);
  free(t);
  tr_dataset_t* ds;
  ck_assert_int_eq(
      tr_dataset_open(&ds, fx_path("count.bin"), TR_DATA_ALL, 50000, &err), 0);
  return ds;
}

START_TEST(test_loader_windows_and_epochs) {
  tr_dataset_t* ds = counting_data(1001);
  tr_loader_t ld;
  tr_errmsg_t err;
  ck_assert_int_eq(tr_loader_init(&ld, ds, 0, -1, 10, 7, 0, &err), 0);
  ck_assert_int_eq(ld.nsamples, 100); /* (1001 - 1) / 10 */
  int32_t in[10], tg[10];
  ck_assert_int_eq(tr_loader_sample(&ld, 3, in, tg, &err), 0);
  for (int i = 0; i < 10; i++) {
    ck_assert_int_eq(in[i], 30 + i);
    ck_assert_int_eq(tg[i], 31 + i); /* shifted by one */
  }
  /* the last window ends at the last token */
  ck_assert_int_eq(tr_loader_sample(&ld, 99, in, tg, &err), 0);
  ck_assert_int_eq(tg[9], 1000);
  /* shuffled: every window once per epoch, a new order each epoch */
  ck_assert_int_eq(tr_loader_init(&ld, ds, 0, -1, 10, 7, 1, &err), 0);
  char seen[100] = {0};
  int same_order = 0;
  for (int64_t i = 0; i < 100; i++) {
    int64_t w = tr_loader_window(&ld, i);
    ck_assert_int_eq(w % 10, 0);
    ck_assert(!seen[w / 10]);
    seen[w / 10] = 1;
    same_order += tr_loader_window(&ld, i + 100) == w;
  }
  ck_assert_int_lt(same_order, 20);
  ld.next = 250;
  ck_assert_int_eq(tr_loader_epoch(&ld), 2);
  ck_assert_int_eq(tr_loader_epoch_index(&ld), 50);
  /* too little data for one sequence */
  tr_loader_t small;
  ck_assert_int_eq(tr_loader_init(&small, ds, 0, 10, 10, 7, 1, &err),
                   TR_EINVAL);
  ck_assert_msg(strstr(err.message,
                       "holds 10 tokens, fewer than one "
                       "sequence of 11"),
                "%s", err.message);
  tr_dataset_free(ds);
}
END_TEST

/* Global batches of G sequences, read through dp ranks of B sequences per
 * micro-step, concatenate to the same stream whatever the layout. */
static void read_global(const tr_dataset_t* ds, int dp, int64_t B,
                        int64_t steps, int64_t G, int32_t* out) {
  const int64_t T = 8;
  tr_loader_t ld[8];
  tr_errmsg_t err;
  for (int r = 0; r < dp; r++)
    ck_assert_int_eq(tr_loader_init(&ld[r], ds, 0, -1, T, 99, 1, &err), 0);
  int64_t accum = G / (B * dp);
  int32_t* buf = malloc((size_t)(B * T) * 4);
  for (int64_t s = 0; s < steps; s++)
    for (int64_t a = 0; a < accum; a++)
      for (int r = 0; r < dp; r++) {
        ck_assert_int_eq(tr_loader_next(&ld[r], B, r, dp, buf, NULL, &err), 0);
        /* rank r's slice of micro-batch a of step s */
        int64_t at = ((s * accum + a) * dp + r) * B * T;
        memcpy(out + at, buf, (size_t)(B * T) * 4);
      }
  free(buf);
}

START_TEST(test_loader_resharding) {
  tr_dataset_t* ds = counting_data(3000);
  const int64_t G = 8, steps = 50, T = 8; /* 50 steps pass an epoch (374) */
  size_t n = (size_t)(G * steps * T);
  int32_t* one = malloc(n * 4);
  int32_t* two = malloc(n * 4);
  int32_t* four = malloc(n * 4);
  int32_t* acc = malloc(n * 4);
  read_global(ds, 1, 8, steps, G, one);
  read_global(ds, 2, 4, steps, G, two);
  read_global(ds, 4, 2, steps, G, four);
  read_global(ds, 2, 2, steps, G, acc); /* 2 accumulation micro-steps */
  ck_assert_int_eq(memcmp(one, two, n * 4), 0);
  ck_assert_int_eq(memcmp(one, four, n * 4), 0);
  ck_assert_int_eq(memcmp(one, acc, n * 4), 0);
  /* and it is the fixed sample stream */
  tr_loader_t ld;
  tr_errmsg_t err;
  ck_assert_int_eq(tr_loader_init(&ld, ds, 0, -1, T, 99, 1, &err), 0);
  int32_t s[8];
  ck_assert_int_eq(tr_loader_sample(&ld, 123, s, NULL, &err), 0);
  ck_assert_int_eq(memcmp(s, one + 123 * T, sizeof s), 0);
  free(one);
  free(two);
  free(four);
  free(acc);
  tr_dataset_free(ds);
}
END_TEST

START_TEST(test_loader_resume) {
  tr_dataset_t* ds = counting_data(2000);
  tr_errmsg_t err;
  const int64_t T = 16;
  tr_loader_t a, b;
  ck_assert_int_eq(tr_loader_init(&a, ds, 0, -1, T, 5, 1, &err), 0);
  int32_t x[4 * 16], y[4 * 16];
  for (int s = 0; s < 37; s++) /* mid-epoch: 148 of 124-sample epochs */
    ck_assert_int_eq(tr_loader_next(&a, 4, 0, 1, x, NULL, &err), 0);
  tr_loader_state_t st;
  tr_loader_get_state(&a, &st);
  ck_assert_int_eq(st.sample, 148);
  ck_assert_int_eq(tr_loader_epoch(&a), 1);
  /* a new loader (a restarted job) with dp = 2 continues the stream */
  ck_assert_int_eq(tr_loader_init(&b, ds, 0, -1, T, 5, 1, &err), 0);
  ck_assert_int_eq(tr_loader_restore(&b, &st, &err), 0);
  tr_loader_t b1 = b;
  for (int s = 0; s < 10; s++) {
    ck_assert_int_eq(tr_loader_next(&a, 4, 0, 1, x, NULL, &err), 0);
    ck_assert_int_eq(tr_loader_next(&b, 2, 0, 2, y, NULL, &err), 0);
    ck_assert_int_eq(tr_loader_next(&b1, 2, 1, 2, y + 2 * T, NULL, &err), 0);
    ck_assert_int_eq(memcmp(x, y, sizeof x), 0);
  }
  /* state from another stream is refused */
  tr_loader_t c;
  ck_assert_int_eq(tr_loader_init(&c, ds, 0, -1, 32, 5, 1, &err), 0);
  ck_assert_int_eq(tr_loader_restore(&c, &st, &err), TR_EINVAL);
  ck_assert_ptr_nonnull(strstr(err.message, "seq_len 16"));
  tr_dataset_free(ds);
}
END_TEST

START_TEST(test_split_point) {
  ck_assert_int_eq(tr_data_split_point(1000, 0.1), 900);
  ck_assert_int_eq(tr_data_split_point(1001, 0.1), 900); /* ceil(100.1) */
  ck_assert_int_eq(tr_data_split_point(1000, 0), 1000);
  ck_assert_int_eq(tr_data_split_point(10, 0.5), 5);
  /* the train loader never reads the validation tokens */
  tr_dataset_t* ds = counting_data(1000);
  tr_loader_t tl, vl;
  tr_errmsg_t err;
  int64_t split = tr_data_split_point(1000, 0.1);
  ck_assert_int_eq(tr_loader_init(&tl, ds, 0, split, 9, 1, 1, &err), 0);
  ck_assert_int_eq(tr_loader_init(&vl, ds, split, -1, 9, 1, 0, &err), 0);
  ck_assert_int_eq(tl.nsamples, 99);
  ck_assert_int_eq(vl.nsamples, 11);
  int32_t tg[9];
  for (int64_t i = 0; i < tl.nsamples; i++) {
    ck_assert_int_eq(tr_loader_sample(&tl, i, NULL, tg, &err), 0);
    ck_assert_int_lt(tg[8], 900);
  }
  ck_assert_int_eq(tr_loader_sample(&vl, 0, tg, NULL, &err), 0);
  ck_assert_int_eq(tg[0], 900);
  tr_dataset_free(ds);
}
END_TEST

static int count_files(const char* dir, const char* prefix) {
  DIR* d = opendir(dir);
  int n = 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL)
    n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
  closedir(d);
  return n;
}

START_TEST(test_prepare) {
  char text1[300], text2[101];
  for (int i = 0; i < 300; i++) text1[i] = (char)('a' + i % 26);
  for (int i = 0; i < 101; i++) text2[i] = (char)('A' + i % 26);
  fx_write_bytes(fx_path("one.txt"), text1, 300);
  fx_write_bytes(fx_path("two.txt"), text2, 101);
  const char* in[2] = {fx_path("one.txt"), fx_path("two.txt")};
  char out[512];
  snprintf(out, sizeof out, "%s/out/data", fx_tmpdir);
  /* a stale shard from an earlier, larger run */
  tr_errmsg_t err;
  uint32_t z = 0;
  char stale[600];
  snprintf(stale, sizeof stale, "mkdir -p '%s'", out);
  ck_assert_int_eq(system(stale), 0);
  snprintf(stale, sizeof stale, "%s/train_000009.bin", out);
  ck_assert_int_eq(tr_shard_write(stale, &z, 1, 0, &err), 0);

  tr_data_prepare_opts_t o = {
      .out_dir = out, .val_fraction = 0.1, .shard_tokens = 100, .quiet = 1};
  tr_data_prepare_result_t res;
  ck_assert_int_eq(tr_data_prepare(in, 2, &o, &res, &err), 0);
  /* 403 tokens (two EOTs): val = ceil(40.3) = 41, train 362 */
  ck_assert_int_eq(res.train_tokens, 362);
  ck_assert_int_eq(res.val_tokens, 41);
  ck_assert_int_eq(res.train_shards, 4);
  ck_assert_int_eq(res.val_shards, 1);
  ck_assert_int_eq(count_files(out, "train_"), 4);
  ck_assert_int_eq(access(stale, F_OK), -1);

  tr_dataset_t *tr, *va;
  ck_assert_int_eq(tr_dataset_open(&tr, out, TR_DATA_TRAIN, 256, &err), 0);
  ck_assert_int_eq(tr_dataset_open(&va, out, TR_DATA_VAL, 256, &err), 0);
  ck_assert_int_eq(tr_dataset_ntokens(tr), 362);
  ck_assert_int_eq(tr_dataset_ntokens(va), 41);
  int32_t all[403];
  ck_assert_int_eq(tr_dataset_read(tr, 0, 362, all, &err), 0);
  ck_assert_int_eq(tr_dataset_read(va, 0, 41, all + 362, &err), 0);
  ck_assert_int_eq(all[0], 0);
  for (int i = 0; i < 300; i++) ck_assert_int_eq(all[1 + i], text1[i]);
  ck_assert_int_eq(all[301], 0);
  for (int i = 0; i < 101; i++) ck_assert_int_eq(all[302 + i], text2[i]);
  tr_dataset_free(tr);
  tr_dataset_free(va);

  /* inputs that already are shards, and missing inputs, are refused */
  const char* bad[1] = {stale};
  uint32_t one = 1;
  ck_assert_int_eq(tr_shard_write(stale, &one, 1, 0, &err), 0);
  ck_assert_int_eq(tr_data_prepare(bad, 1, &o, &res, &err), TR_EINVAL);
  ck_assert_ptr_nonnull(strstr(err.message, "is already a token shard"));
  const char* missing[1] = {fx_path("missing.txt")};
  ck_assert_int_eq(tr_data_prepare(missing, 1, &o, &res, &err), TR_ENOENT);
  ck_assert_ptr_nonnull(strstr(err.message, "missing.txt'"));
}
END_TEST

int main(void) {
  Suite* s = suite_create("data");
  TCase* tc = tcase_create("shards");
  tcase_add_checked_fixture(tc, setup, fx_tmpdir_remove);
  tcase_add_test(tc, test_shard_round_trip);
  tcase_add_test(tc, test_bad_shards);
  tcase_add_test(tc, test_token_beyond_vocab);
  tcase_add_test(tc, test_text_and_folders);
  tcase_add_test(tc, test_byte_tokenizer);
  tcase_add_test(tc, test_prepare);
  suite_add_tcase(s, tc);
  tc = tcase_create("loader");
  tcase_add_checked_fixture(tc, setup, fx_tmpdir_remove);
  tcase_add_test(tc, test_permutation);
  tcase_add_test(tc, test_loader_windows_and_epochs);
  tcase_add_test(tc, test_loader_resharding);
  tcase_add_test(tc, test_loader_resume);
  tcase_add_test(tc, test_split_point);
  suite_add_tcase(s, tc);
  SRunner* sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
