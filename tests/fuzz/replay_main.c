/* tests/fuzz/replay_main.c: a main() for fuzz targets built without
 * libFuzzer. It runs LLVMFuzzerTestOneInput over every file of the corpus
 * (the directories or files given, or TR_FUZZ_CORPUS), so every build -- and
 * the sanitizer build -- replays the corpus as a test.
 */
#include "config.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

static int replay_file(const char* path) {
  FILE* f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "cannot open '%s'\n", path);
    return -1;
  }
  uint8_t* buf = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len == cap) {
      cap = cap ? cap * 2 : 4096;
      uint8_t* p = realloc(buf, cap);
      if (!p) break;
      buf = p;
    }
    size_t n = fread(buf + len, 1, cap - len, f);
    if (n == 0) break;
    len += n;
  }
  fclose(f);
  LLVMFuzzerTestOneInput(buf ? buf : (const uint8_t*)"", len);
  free(buf);
  return 0;
}

static int replay(const char* path, int* count) {
  struct stat st;
  if (stat(path, &st) != 0) {
    fprintf(stderr, "cannot stat '%s'\n", path);
    return -1;
  }
  if (!S_ISDIR(st.st_mode)) {
    if (replay_file(path) < 0) return -1;
    ++*count;
    return 0;
  }
  DIR* d = opendir(path);
  if (!d) return -1;
  struct dirent* e;
  int rc = 0;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char sub[4096];
    snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
    if (replay(sub, count) < 0) rc = -1;
  }
  closedir(d);
  return rc;
}

int main(int argc, char** argv) {
  int count = 0, rc = 0;
  if (argc > 1) {
    for (int i = 1; i < argc; i++)
      if (replay(argv[i], &count) < 0) rc = 1;
  } else {
#ifdef TR_FUZZ_CORPUS
    if (replay(TR_FUZZ_CORPUS, &count) < 0) rc = 1;
#endif
  }
  if (count == 0) {
    fprintf(stderr, "no corpus inputs found\n");
    return 1;
  }
  if (rc) return 1;
  printf("%d passed, 0 failed\n", count);
  return 0;
}
