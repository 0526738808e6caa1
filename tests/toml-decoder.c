/* tests/toml-decoder.c: the decoder interface of the toml-test suite
 * (github.com/toml-lang/toml-test) over trainrun's TOML parser.
 *
 *   toml-decoder [FILE] < doc.toml
 *
 * Reads a TOML document (FILE, or stdin) and, when it is valid, writes it to
 * stdout as toml-test's tagged JSON and exits 0: tables become objects,
 * arrays JSON arrays, and every scalar {"type": T, "value": "text"} with T
 * one of string, integer, float, bool, datetime, datetime-local, date-local,
 * time-local. Floats are written so they read back to the same double
 * ("inf", "-inf", "nan" for the special values). An invalid document prints
 * "line:col: message" to stderr and exits 1.
 *
 *   toml-decoder --batch < records
 *
 * Decodes many documents in one process (tests/toml_diff.py sends thousands;
 * starting a sanitizer build once per document would take minutes). Each
 * input record is the document's length in decimal, a newline, then its
 * bytes; each output record is "0 LEN\n" and the JSON, or "1 LEN\n" and the
 * error line, LEN counting the bytes that follow. Exits 0 when every record
 * was read, 2 on a malformed record.
 */
#include "config.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainrun/error.h"
#include "trainrun/toml.h"

static void put_string(FILE* f, const char* s, size_t n) {
  putc('"', f);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    switch (c) {
      case '"':
        fputs("\\\"", f);
        break;
      case '\\':
        fputs("\\\\", f);
        break;
      case '\n':
        fputs("\\n", f);
        break;
      case '\t':
        fputs("\\t", f);
        break;
      case '\r':
        fputs("\\r", f);
        break;
      case '\b':
        fputs("\\b", f);
        break;
      case '\f':
        fputs("\\f", f);
        break;
      default:
        if (c < 0x20 || c == 0x7f)
          fprintf(f, "\\u%04x", c);
        else
          putc(c, f); /* UTF-8 passes through: the parser validated it */
    }
  }
  putc('"', f);
}

/* The shortest of %.15g .. %.17g that reads back as the same double. */
static void format_float(double x, char* buf, size_t cap) {
  if (isnan(x)) {
    snprintf(buf, cap, "nan");
    return;
  }
  if (isinf(x)) {
    snprintf(buf, cap, x > 0 ? "inf" : "-inf");
    return;
  }
  for (int prec = 15; prec <= 17; prec++) {
    snprintf(buf, cap, "%.*g", prec, x);
    if (strtod(buf, NULL) == x) break;
  }
}

static void put_tagged(FILE* f, const char* type, const char* value,
                       size_t len) {
  fprintf(f, "{\"type\": \"%s\", \"value\": ", type);
  put_string(f, value, len);
  putc('}', f);
}

static void put_value(FILE* f, const tr_toml_value_t* v) {
  char buf[64];
  tr_toml_type_t t = tr_toml_type(v);
  switch (t) {
    case TR_TOML_TABLE:
      putc('{', f);
      for (size_t i = 0; i < tr_toml_count(v); i++) {
        if (i) fputs(", ", f);
        put_string(f, tr_toml_key_at(v, i), tr_toml_key_len(v, i));
        fputs(": ", f);
        put_value(f, tr_toml_at(v, i));
      }
      putc('}', f);
      return;
    case TR_TOML_ARRAY:
      putc('[', f);
      for (size_t i = 0; i < tr_toml_count(v); i++) {
        if (i) fputs(", ", f);
        put_value(f, tr_toml_at(v, i));
      }
      putc(']', f);
      return;
    case TR_TOML_STRING: {
      size_t len;
      const char* s = tr_toml_string(v, &len);
      put_tagged(f, "string", s, len);
      return;
    }
    case TR_TOML_INTEGER:
      snprintf(buf, sizeof buf, "%" PRId64, tr_toml_int(v));
      break;
    case TR_TOML_FLOAT:
      format_float(tr_toml_float(v), buf, sizeof buf);
      break;
    case TR_TOML_BOOL:
      snprintf(buf, sizeof buf, "%s", tr_toml_bool(v) ? "true" : "false");
      break;
    default: {
      const char* text = tr_toml_datetime_text(v);
      put_tagged(f, tr_toml_type_name(t), text, strlen(text));
      return;
    }
  }
  put_tagged(f, tr_toml_type_name(t), buf, strlen(buf));
}

static char* read_all(FILE* in, size_t* len) {
  size_t cap = 65536, n = 0;
  char* buf = malloc(cap);
  while (buf) {
    n += fread(buf + n, 1, cap - n, in);
    if (n < cap) break;
    char* bigger = realloc(buf, cap * 2);
    if (!bigger) {
      free(buf);
      return NULL;
    }
    buf = bigger;
    cap *= 2;
  }
  if (buf && ferror(in)) {
    free(buf);
    return NULL;
  }
  *len = n;
  return buf;
}

/* Decode text[0..len) into out (JSON or the error line); 0 valid, 1 not. */
static int decode(const char* text, size_t len, FILE* out) {
  tr_toml_value_t* root;
  tr_toml_error_t err;
  int rc = tr_toml_parse(text, len, &root, &err);
  if (rc < 0) {
    fprintf(out, "%d:%d: %s\n", err.line, err.col,
            err.message[0] ? err.message : tr_strerror(rc));
    return 1;
  }
  put_value(out, root);
  putc('\n', out);
  tr_toml_free(root);
  return 0;
}

static int batch(void) {
  unsigned long long len;
  while (scanf("%llu", &len) == 1) {
    if (getchar() != '\n' || len > (1ull << 30)) return 2;
    char* text = malloc(len ? len : 1);
    if (!text || fread(text, 1, len, stdin) != len) {
      free(text);
      return 2;
    }
    char* res = NULL;
    size_t res_len = 0;
    FILE* out = open_memstream(&res, &res_len);
    if (!out) {
      free(text);
      return 2;
    }
    int status = decode(text, len, out);
    fclose(out);
    free(text);
    printf("%d %zu\n", status, res_len);
    fwrite(res, 1, res_len, stdout);
    free(res);
  }
  return feof(stdin) && fflush(stdout) == 0 ? 0 : 2;
}

int main(int argc, char** argv) {
  if (argc == 2 && strcmp(argv[1], "--batch") == 0) return batch();
  if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
    fprintf(stderr,
            "usage: toml-decoder [FILE | --batch] (stdin by default)\n");
    return 2;
  }
  FILE* in = stdin;
  if (argc == 2 && !(in = fopen(argv[1], "rb"))) {
    perror(argv[1]);
    return 2;
  }
  size_t len = 0;
  char* text = read_all(in, &len);
  if (in != stdin) fclose(in);
  if (!text) {
    fprintf(stderr, "toml-decoder: cannot read the document\n");
    return 2;
  }
  /* stdout gets the JSON, stderr the error */
  char* res = NULL;
  size_t res_len = 0;
  FILE* out = open_memstream(&res, &res_len);
  if (!out) {
    free(text);
    return 2;
  }
  int status = decode(text, len, out);
  fclose(out);
  free(text);
  fwrite(res, 1, res_len, status ? stderr : stdout);
  free(res);
  return fflush(stdout) == 0 ? status : 2;
}
