/* tests/check_toml.c: the TOML 1.0 parser — every value type, tables,
 * arrays of tables, dotted and quoted keys, positions of values and keys,
 * document order, the depth limit, reading files, and invalid documents with
 * their exact line:col and message. */
#include "config.h"

#include <check.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trainrun/error.h"
#include "trainrun/toml.h"

/* ---- helpers ---- */

static tr_toml_value_t* parse_okn(const char* doc, size_t len) {
  tr_toml_value_t* root = NULL;
  tr_toml_error_t err;
  int rc = tr_toml_parse(doc, len, &root, &err);
  ck_assert_msg(rc == 0, "parse failed (%d): %d:%d: %s", rc, err.line, err.col,
                err.message);
  ck_assert_ptr_nonnull(root);
  ck_assert_int_eq(tr_toml_type(root), TR_TOML_TABLE);
  return root;
}

static tr_toml_value_t* parse_ok(const char* doc) {
  return parse_okn(doc, strlen(doc));
}

/* The value at a dotted path of bare keys ("a.b.c"); array items by
 * number ("fruits.1.name"). NULL when absent. */
static const tr_toml_value_t* at(const tr_toml_value_t* v, const char* path) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", path);
  for (char* part = strtok(buf, "."); part && v; part = strtok(NULL, ".")) {
    if (tr_toml_type(v) == TR_TOML_ARRAY)
      v = tr_toml_at(v, (size_t)atoi(part));
    else
      v = tr_toml_get(v, part);
  }
  return v;
}

static const char* str_at(const tr_toml_value_t* root, const char* path) {
  const tr_toml_value_t* v = at(root, path);
  ck_assert_msg(v != NULL, "no value at '%s'", path);
  ck_assert_msg(tr_toml_type(v) == TR_TOML_STRING, "'%s' is a %s", path,
                tr_toml_type_name(tr_toml_type(v)));
  return tr_toml_string(v, NULL);
}

static int64_t int_at(const tr_toml_value_t* root, const char* path) {
  const tr_toml_value_t* v = at(root, path);
  ck_assert_msg(v != NULL, "no value at '%s'", path);
  ck_assert_msg(tr_toml_type(v) == TR_TOML_INTEGER, "'%s' is a %s", path,
                tr_toml_type_name(tr_toml_type(v)));
  return tr_toml_int(v);
}

static double float_at(const tr_toml_value_t* root, const char* path) {
  const tr_toml_value_t* v = at(root, path);
  ck_assert_msg(v != NULL, "no value at '%s'", path);
  ck_assert_msg(tr_toml_type(v) == TR_TOML_FLOAT, "'%s' is a %s", path,
                tr_toml_type_name(tr_toml_type(v)));
  return tr_toml_float(v);
}

typedef struct {
  const char* doc;
  size_t len;
  int line, col;
  const char* message;
} bad_doc_t;

#define D(s) s, sizeof(s) - 1

static void check_bad(const bad_doc_t* b) {
  tr_toml_value_t* root = (tr_toml_value_t*)&root; /* must be reset */
  tr_toml_error_t err;
  int rc = tr_toml_parse(b->doc, b->len, &root, &err);
  ck_assert_msg(rc == TR_EPARSE, "accepted (%d): %s", rc, b->doc);
  ck_assert_ptr_null(root);
  ck_assert_msg(err.line == b->line && err.col == b->col &&
                    strcmp(err.message, b->message) == 0,
                "document %s\n  got  %d:%d: %s\n  want %d:%d: %s", b->doc,
                err.line, err.col, err.message, b->line, b->col, b->message);
}

/* ---- strings ---- */

START_TEST(test_basic_strings) {
  tr_toml_value_t* r = parse_ok(
      "a = \"I'm a string. \\\"You can quote me\\\". Name\\tJos\\u00E9\\n"
      "Location\\tSF.\"\n"
      "b = \"\\b\\t\\n\\f\\r\\\"\\\\\"\n"
      "c = \"\\u00e9\\U0001F600\\U0010FFFF\\u0041\"\n"
      "d = \"tab\there\"\n"
      "e = \"\"\n"
      "f = \"h\xc3\xa9 \xf0\x9d\x84\x9e\"\n"
      "g = \"# not a comment\" # a comment\n");
  ck_assert_str_eq(str_at(r, "a"),
                   "I'm a string. \"You can quote me\". Name\tJos\xc3\xa9\n"
                   "Location\tSF.");
  ck_assert_str_eq(str_at(r, "b"), "\b\t\n\f\r\"\\");
  ck_assert_str_eq(str_at(r, "c"),
                   "\xc3\xa9\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf"
                   "A");
  ck_assert_str_eq(str_at(r, "d"), "tab\there");
  ck_assert_str_eq(str_at(r, "e"), "");
  ck_assert_str_eq(str_at(r, "f"), "h\xc3\xa9 \xf0\x9d\x84\x9e");
  ck_assert_str_eq(str_at(r, "g"), "# not a comment");
  tr_toml_free(r);
}
END_TEST

START_TEST(test_string_with_nul) {
  tr_toml_value_t* r = parse_ok("a = \"x\\u0000y\"\n\"k\\u0000\" = 1\n");
  size_t len = 0;
  const char* s = tr_toml_string(tr_toml_get(r, "a"), &len);
  ck_assert_uint_eq(len, 3);
  ck_assert_int_eq(memcmp(s, "x\0y", 4), 0); /* and NUL-terminated */
  ck_assert_uint_eq(tr_toml_key_len(r, 1), 2);
  ck_assert_int_eq(memcmp(tr_toml_key_at(r, 1), "k\0", 3), 0);
  ck_assert_uint_eq(tr_toml_key_len(r, 0), 1);
  ck_assert_uint_eq(tr_toml_key_len(r, 2), 0);
  tr_toml_free(r);
}
END_TEST

START_TEST(test_multiline_basic_strings) {
  tr_toml_value_t* r = parse_ok(
      "str1 = \"\"\"\nRoses are red\nViolets are blue\"\"\"\n"
      "str2 = \"\"\"\nThe quick brown \\\n\n\n  fox jumps over \\\n"
      "    the lazy dog.\"\"\"\n"
      "str3 = \"\"\"\\\n       The quick brown \\\n       fox jumps over \\\n"
      "       the lazy dog.\\\n       \"\"\"\n"
      "str4 = \"\"\"Here are two quotation marks: \"\". Simple enough.\"\"\"\n"
      "str5 = \"\"\"Here are three quotation marks: \"\"\\\".\"\"\"\n"
      "str7 = \"\"\"\"This,\" she said, \"is just a pointless "
      "statement.\"\"\"\"\n"
      "ws = \"\"\"a \\  \t \n\n  b\"\"\"\n"
      "crlf = \"\"\"\r\none\r\ntwo \\\r\n  three\"\"\"\n"
      "esc = \"\"\"\\t\\u00e9\\\"\"\"\"\n"
      "empty = \"\"\"\"\"\"\n"
      "five = \"\"\"x\"\"\"\"\"\n");
  ck_assert_str_eq(str_at(r, "str1"), "Roses are red\nViolets are blue");
  const char* fox = "The quick brown fox jumps over the lazy dog.";
  ck_assert_str_eq(str_at(r, "str2"), fox);
  ck_assert_str_eq(str_at(r, "str3"), fox);
  ck_assert_str_eq(str_at(r, "str4"),
                   "Here are two quotation marks: \"\". Simple enough.");
  ck_assert_str_eq(str_at(r, "str5"),
                   "Here are three quotation marks: \"\"\".");
  ck_assert_str_eq(str_at(r, "str7"),
                   "\"This,\" she said, \"is just a pointless statement.\"");
  ck_assert_str_eq(str_at(r, "ws"), "a b");
  ck_assert_str_eq(str_at(r, "crlf"), "one\ntwo three"); /* CRLF -> LF */
  ck_assert_str_eq(str_at(r, "esc"), "\t\xc3\xa9\"");
  ck_assert_str_eq(str_at(r, "empty"), "");
  ck_assert_str_eq(str_at(r, "five"), "x\"\"");
  tr_toml_free(r);
}
END_TEST

START_TEST(test_literal_strings) {
  tr_toml_value_t* r = parse_ok(
      "winpath  = 'C:\\Users\\nodejs\\templates'\n"
      "winpath2 = '\\\\ServerX\\admin$\\system32\\'\n"
      "quoted   = 'Tom \"Dubs\" Preston-Werner'\n"
      "regex    = '<\\i\\c*\\s*>'\n"
      "regex2 = '''I [dw]on't need \\d{2} apples'''\n"
      "lines  = '''\nThe first newline is\ntrimmed in raw strings.\n"
      "   All other whitespace\n   is preserved.\n'''\n"
      "quot15 = '''Here are fifteen quotation marks: "
      "\"\"\"\"\"\"\"\"\"\"\"\"\"\"\"'''\n"
      "str = ''''That,' she said, 'is still pointless.''''\n"
      "empty = ''\n"
      "tab = 'a\tb'\n");
  ck_assert_str_eq(str_at(r, "winpath"), "C:\\Users\\nodejs\\templates");
  ck_assert_str_eq(str_at(r, "winpath2"), "\\\\ServerX\\admin$\\system32\\");
  ck_assert_str_eq(str_at(r, "quoted"), "Tom \"Dubs\" Preston-Werner");
  ck_assert_str_eq(str_at(r, "regex"), "<\\i\\c*\\s*>");
  ck_assert_str_eq(str_at(r, "regex2"), "I [dw]on't need \\d{2} apples");
  ck_assert_str_eq(str_at(r, "lines"),
                   "The first newline is\ntrimmed in raw strings.\n"
                   "   All other whitespace\n   is preserved.\n");
  ck_assert_str_eq(str_at(r, "quot15"),
                   "Here are fifteen quotation marks: "
                   "\"\"\"\"\"\"\"\"\"\"\"\"\"\"\"");
  ck_assert_str_eq(str_at(r, "str"), "'That,' she said, 'is still pointless.'");
  ck_assert_str_eq(str_at(r, "empty"), "");
  ck_assert_str_eq(str_at(r, "tab"), "a\tb");
  tr_toml_free(r);
}
END_TEST

/* ---- numbers, booleans ---- */

START_TEST(test_integers) {
  tr_toml_value_t* r = parse_ok(
      "int1 = +99\nint2 = 42\nint3 = 0\nint4 = -17\nint5 = 1_000\n"
      "int6 = 5_349_221\nint7 = 53_49_221\nint8 = 1_2_3_4_5\n"
      "hex1 = 0xDEADBEEF\nhex2 = 0xdeadbeef\nhex3 = 0xdead_beef\n"
      "oct1 = 0o01234567\noct2 = 0o755\nbin1 = 0b11010110\n"
      "bin2 = 0b1_0_1\nmax = 9223372036854775807\n"
      "min = -9223372036854775808\nhmax = 0x7FFF_FFFF_FFFF_FFFF\n"
      "pz = +0\nnz = -0\nhz = 0x00\n");
  ck_assert_int_eq(int_at(r, "int1"), 99);
  ck_assert_int_eq(int_at(r, "int2"), 42);
  ck_assert_int_eq(int_at(r, "int3"), 0);
  ck_assert_int_eq(int_at(r, "int4"), -17);
  ck_assert_int_eq(int_at(r, "int5"), 1000);
  ck_assert_int_eq(int_at(r, "int6"), 5349221);
  ck_assert_int_eq(int_at(r, "int7"), 5349221);
  ck_assert_int_eq(int_at(r, "int8"), 12345);
  ck_assert_int_eq(int_at(r, "hex1"), 0xDEADBEEF);
  ck_assert_int_eq(int_at(r, "hex2"), 0xDEADBEEF);
  ck_assert_int_eq(int_at(r, "hex3"), 0xDEADBEEF);
  ck_assert_int_eq(int_at(r, "oct1"), 01234567);
  ck_assert_int_eq(int_at(r, "oct2"), 0755);
  ck_assert_int_eq(int_at(r, "bin1"), 214);
  ck_assert_int_eq(int_at(r, "bin2"), 5);
  ck_assert_int_eq(int_at(r, "max"), INT64_MAX);
  ck_assert_int_eq(int_at(r, "min"), INT64_MIN);
  ck_assert_int_eq(int_at(r, "hmax"), INT64_MAX);
  ck_assert_int_eq(int_at(r, "pz"), 0);
  ck_assert_int_eq(int_at(r, "nz"), 0);
  ck_assert_int_eq(int_at(r, "hz"), 0);
  tr_toml_free(r);
}
END_TEST

START_TEST(test_floats) {
  tr_toml_value_t* r = parse_ok(
      "flt1 = +1.0\nflt2 = 3.1415\nflt3 = -0.01\nflt4 = 5e+22\n"
      "flt5 = 1e06\nflt6 = -2E-2\nflt7 = 6.626e-34\n"
      "flt8 = 224_617.445_991_228\nflt9 = 1_0.0_1e1_0\n"
      "sf1 = inf\nsf2 = +inf\nsf3 = -inf\nsf4 = nan\nsf5 = +nan\n"
      "sf6 = -nan\nnz = -0.0\nz = 0e0\ntiny = 5e-324\n"
      "max = 1.7976931348623157e308\nprecise = 0.1\n");
  ck_assert(float_at(r, "flt1") == 1.0);
  ck_assert(float_at(r, "flt2") == 3.1415);
  ck_assert(float_at(r, "flt3") == -0.01);
  ck_assert(float_at(r, "flt4") == 5e22);
  ck_assert(float_at(r, "flt5") == 1e6);
  ck_assert(float_at(r, "flt6") == -0.02);
  ck_assert(float_at(r, "flt7") == 6.626e-34);
  ck_assert(float_at(r, "flt8") == 224617.445991228);
  ck_assert(float_at(r, "flt9") == 10.01e10);
  ck_assert(isinf(float_at(r, "sf1")) && float_at(r, "sf1") > 0);
  ck_assert(isinf(float_at(r, "sf2")) && float_at(r, "sf2") > 0);
  ck_assert(isinf(float_at(r, "sf3")) && float_at(r, "sf3") < 0);
  ck_assert(isnan(float_at(r, "sf4")));
  ck_assert(isnan(float_at(r, "sf5")));
  ck_assert(isnan(float_at(r, "sf6")));
  ck_assert(float_at(r, "nz") == 0.0 && signbit(float_at(r, "nz")));
  ck_assert(float_at(r, "z") == 0.0 && !signbit(float_at(r, "z")));
  ck_assert(float_at(r, "tiny") == 5e-324);
  ck_assert(float_at(r, "max") == 1.7976931348623157e308);
  ck_assert(float_at(r, "precise") == 0.1);
  tr_toml_free(r);
}
END_TEST

START_TEST(test_booleans) {
  tr_toml_value_t* r = parse_ok("t = true\nf = false\na = [true,false]\n");
  ck_assert_int_eq(tr_toml_type(at(r, "t")), TR_TOML_BOOL);
  ck_assert_int_eq(tr_toml_bool(at(r, "t")), 1);
  ck_assert_int_eq(tr_toml_bool(at(r, "f")), 0);
  ck_assert_int_eq(tr_toml_bool(at(r, "a.0")), 1);
  ck_assert_int_eq(tr_toml_bool(at(r, "a.1")), 0);
  tr_toml_free(r);
}
END_TEST

/* ---- date-times ---- */

START_TEST(test_datetimes) {
  tr_toml_value_t* r = parse_ok(
      "odt1 = 1979-05-27T07:32:00Z\n"
      "odt2 = 1979-05-27T00:32:00-07:00\n"
      "odt3 = 1979-05-27T00:32:00.999999-07:00\n"
      "odt4 = 1979-05-27 07:32:00z\n"
      "odt5 = 1979-05-27t07:32:00+05:30\n"
      "ldt1 = 1979-05-27T07:32:00\n"
      "ldt2 = 1979-05-27 00:32:00.999999\n"
      "ld1 = 1979-05-27\n"
      "lt1 = 07:32:00\n"
      "lt2 = 00:32:00.123456789123\n"
      "leap = 2000-02-29\n"
      "leap2 = 2024-02-29T23:59:59Z\n"
      "y0 = 0000-01-01\n");
  const tr_toml_value_t* v = at(r, "odt1");
  ck_assert_int_eq(tr_toml_type(v), TR_TOML_DATETIME);
  const tr_toml_datetime_t* dt = tr_toml_datetime(v);
  ck_assert_int_eq(dt->year, 1979);
  ck_assert_int_eq(dt->month, 5);
  ck_assert_int_eq(dt->day, 27);
  ck_assert_int_eq(dt->hour, 7);
  ck_assert_int_eq(dt->minute, 32);
  ck_assert_int_eq(dt->second, 0);
  ck_assert_int_eq(dt->offset_minutes, 0);
  ck_assert_int_eq(dt->frac_digits, 0);
  ck_assert_str_eq(tr_toml_datetime_text(v), "1979-05-27T07:32:00Z");

  dt = tr_toml_datetime(at(r, "odt2"));
  ck_assert_int_eq(dt->offset_minutes, -420);
  dt = tr_toml_datetime(at(r, "odt3"));
  ck_assert_int_eq(dt->nanosecond, 999999000);
  ck_assert_int_eq(dt->frac_digits, 6);
  ck_assert_int_eq(dt->offset_minutes, -420);
  ck_assert_str_eq(tr_toml_datetime_text(at(r, "odt3")),
                   "1979-05-27T00:32:00.999999-07:00");
  /* a space separator and a lowercase z are normalised in the text */
  ck_assert_int_eq(tr_toml_type(at(r, "odt4")), TR_TOML_DATETIME);
  ck_assert_str_eq(tr_toml_datetime_text(at(r, "odt4")),
                   "1979-05-27T07:32:00Z");
  ck_assert_str_eq(tr_toml_datetime_text(at(r, "odt5")),
                   "1979-05-27T07:32:00+05:30");
  ck_assert_int_eq(tr_toml_datetime(at(r, "odt5"))->offset_minutes, 330);

  ck_assert_int_eq(tr_toml_type(at(r, "ldt1")), TR_TOML_DATETIME_LOCAL);
  ck_assert_int_eq(tr_toml_type(at(r, "ldt2")), TR_TOML_DATETIME_LOCAL);
  ck_assert_str_eq(tr_toml_datetime_text(at(r, "ldt2")),
                   "1979-05-27T00:32:00.999999");
  v = at(r, "ld1");
  ck_assert_int_eq(tr_toml_type(v), TR_TOML_DATE_LOCAL);
  ck_assert_str_eq(tr_toml_datetime_text(v), "1979-05-27");
  ck_assert_int_eq(tr_toml_datetime(v)->day, 27);
  v = at(r, "lt1");
  ck_assert_int_eq(tr_toml_type(v), TR_TOML_TIME_LOCAL);
  ck_assert_str_eq(tr_toml_datetime_text(v), "07:32:00");
  dt = tr_toml_datetime(at(r, "lt2"));
  ck_assert_int_eq(dt->nanosecond, 123456789); /* truncated, not rounded */
  ck_assert_int_eq(dt->frac_digits, 12);
  ck_assert_int_eq(tr_toml_datetime(at(r, "leap"))->day, 29);
  ck_assert_int_eq(tr_toml_datetime(at(r, "leap2"))->month, 2);
  ck_assert_int_eq(tr_toml_datetime(at(r, "y0"))->year, 0);
  tr_toml_free(r);
}
END_TEST

/* ---- arrays, inline tables ---- */

START_TEST(test_arrays) {
  tr_toml_value_t* r = parse_ok(
      "integers = [ 1, 2, 3 ]\n"
      "nested = [ [ 1, 2 ], [\"a\", \"b\", \"c\"] ]\n"
      "strings = [ \"all\", 'strings', \"\"\"are the same\"\"\", '''type''' ]\n"
      "mixed = [ 0.1, 1, \"s\", true, 1979-05-27, [], {x = 1} ]\n"
      "empty = []\n"
      "multi = [\n  1, # one\n  # nothing\n  2, # trailing comma\n]\n"
      "dates = [1979-05-27 , 07:32:00,1979-05-27 07:32:00Z]\n");
  const tr_toml_value_t* v = at(r, "integers");
  ck_assert_int_eq(tr_toml_type(v), TR_TOML_ARRAY);
  ck_assert_uint_eq(tr_toml_count(v), 3);
  ck_assert_int_eq(tr_toml_int(tr_toml_at(v, 2)), 3);
  ck_assert_ptr_null(tr_toml_at(v, 3));
  ck_assert_uint_eq(tr_toml_count(at(r, "nested")), 2);
  ck_assert_str_eq(str_at(r, "nested.1.2"), "c");
  ck_assert_str_eq(str_at(r, "strings.2"), "are the same");
  ck_assert_str_eq(str_at(r, "strings.3"), "type");
  v = at(r, "mixed");
  ck_assert_uint_eq(tr_toml_count(v), 7);
  static const tr_toml_type_t types[] = {
      TR_TOML_FLOAT,      TR_TOML_INTEGER, TR_TOML_STRING, TR_TOML_BOOL,
      TR_TOML_DATE_LOCAL, TR_TOML_ARRAY,   TR_TOML_TABLE};
  for (size_t i = 0; i < 7; i++)
    ck_assert_int_eq(tr_toml_type(tr_toml_at(v, i)), types[i]);
  ck_assert_int_eq(int_at(r, "mixed.6.x"), 1);
  ck_assert_uint_eq(tr_toml_count(at(r, "empty")), 0);
  ck_assert_uint_eq(tr_toml_count(at(r, "multi")), 2);
  ck_assert_int_eq(tr_toml_type(at(r, "dates.1")), TR_TOML_TIME_LOCAL);
  ck_assert_int_eq(tr_toml_type(at(r, "dates.2")), TR_TOML_DATETIME);
  tr_toml_free(r);
}
END_TEST

START_TEST(test_inline_tables) {
  tr_toml_value_t* r = parse_ok(
      "name = { first = \"Tom\", last = \"Preston-Werner\" }\n"
      "point = {x=1,y=2}\n"
      "animal = { type.name = \"pug\" }\n"
      "nest = { a = { b = { c = 1 } }, d.e = 2, d.f = 3 }\n"
      "empty = {}\n"
      "points = [ { x = 1, y = 2 },\n  { x = 7, y = 8 } ]\n");
  ck_assert_str_eq(str_at(r, "name.last"), "Preston-Werner");
  ck_assert_int_eq(int_at(r, "point.y"), 2);
  ck_assert_str_eq(str_at(r, "animal.type.name"), "pug");
  ck_assert_int_eq(int_at(r, "nest.a.b.c"), 1);
  ck_assert_int_eq(int_at(r, "nest.d.f"), 3);
  ck_assert_uint_eq(tr_toml_count(at(r, "nest.d")), 2);
  ck_assert_int_eq(tr_toml_type(at(r, "empty")), TR_TOML_TABLE);
  ck_assert_uint_eq(tr_toml_count(at(r, "empty")), 0);
  ck_assert_int_eq(int_at(r, "points.1.x"), 7);
  tr_toml_free(r);
}
END_TEST

/* ---- keys, tables, arrays of tables ---- */

START_TEST(test_keys) {
  tr_toml_value_t* r = parse_ok(
      "bare_key = 1\nbare-key = 2\n1234 = 3\n"
      "\"127.0.0.1\" = 4\n\"character encoding\" = 5\n"
      "\"\xca\x8e\xc7\x9d\xca\x9e\" = 6\n'key2' = 7\n"
      "'quoted \"value\"' = 8\n\"\" = 9\n"
      "physical.color = \"orange\"\nsite.\"google.com\" = true\n"
      "fruit . flavor = \"banana\"\nfruit. color = \"yellow\"\n"
      "3.14159 = \"pi\"\ntrue = 10\n\"\\u0041\" = 11\n");
  ck_assert_int_eq(int_at(r, "bare_key"), 1);
  ck_assert_int_eq(int_at(r, "bare-key"), 2);
  ck_assert_int_eq(int_at(r, "1234"), 3);
  ck_assert_int_eq(tr_toml_int(tr_toml_get(r, "127.0.0.1")), 4);
  ck_assert_int_eq(tr_toml_int(tr_toml_get(r, "character encoding")), 5);
  ck_assert_int_eq(tr_toml_int(tr_toml_get(r, "\xca\x8e\xc7\x9d\xca\x9e")), 6);
  ck_assert_int_eq(int_at(r, "key2"), 7);
  ck_assert_int_eq(tr_toml_int(tr_toml_get(r, "quoted \"value\"")), 8);
  ck_assert_int_eq(tr_toml_int(tr_toml_get(r, "")), 9);
  ck_assert_str_eq(str_at(r, "physical.color"), "orange");
  ck_assert_int_eq(tr_toml_bool(tr_toml_get(at(r, "site"), "google.com")), 1);
  ck_assert_str_eq(str_at(r, "fruit.flavor"), "banana");
  ck_assert_str_eq(str_at(r, "fruit.color"), "yellow");
  ck_assert_str_eq(str_at(r, "3.14159"), "pi"); /* the table 3, key 14159 */
  ck_assert_int_eq(int_at(r, "true"), 10);
  ck_assert_int_eq(int_at(r, "A"), 11);
  tr_toml_free(r);
}
END_TEST

START_TEST(test_tables) {
  tr_toml_value_t* r = parse_ok(
      "title = \"t\"\n"
      "[table-1]\nkey1 = \"some string\"\nkey2 = 123\n"
      "[dog.\"tater.man\"]\ntype.name = \"pug\"\n"
      "[ g .  h  . i ]\nx = 1\n"
      "[ j . \"\xca\x9e\" . 'l' ]\ny = 2\n"
      "[x.y.z.w]\n[x]\nsuper = 1\n"
      "[fruit]\napple.color = \"red\"\napple.taste.sweet = true\n"
      "[fruit.apple.texture]\nsmooth = true\n"
      "[empty]\n");
  ck_assert_str_eq(str_at(r, "title"), "t");
  ck_assert_int_eq(int_at(r, "table-1.key2"), 123);
  ck_assert_str_eq(str_at(tr_toml_get(at(r, "dog"), "tater.man"), "type.name"),
                   "pug");
  ck_assert_int_eq(int_at(r, "g.h.i.x"), 1);
  ck_assert_int_eq(
      tr_toml_int(tr_toml_get(
          tr_toml_get(tr_toml_get(at(r, "j"), "\xca\x9e"), "l"), "y")),
      2);
  ck_assert_int_eq(tr_toml_type(at(r, "x.y.z.w")), TR_TOML_TABLE);
  ck_assert_int_eq(int_at(r, "x.super"), 1);
  ck_assert_int_eq(tr_toml_bool(at(r, "fruit.apple.taste.sweet")), 1);
  ck_assert_int_eq(tr_toml_bool(at(r, "fruit.apple.texture.smooth")), 1);
  ck_assert_uint_eq(tr_toml_count(at(r, "empty")), 0);
  tr_toml_free(r);
}
END_TEST

START_TEST(test_arrays_of_tables) {
  tr_toml_value_t* r = parse_ok(
      "[[products]]\nname = \"Hammer\"\nsku = 738594937\n"
      "[[products]]  # empty table within the array\n"
      "[[products]]\nname = \"Nail\"\nsku = 284758393\ncolor = \"gray\"\n"
      "[[fruits]]\nname = \"apple\"\n"
      "[fruits.physical]\ncolor = \"red\"\n"
      "[[fruits.varieties]]\nname = \"red delicious\"\n"
      "[[fruits.varieties]]\nname = \"granny smith\"\n"
      "[[fruits]]\nname = \"banana\"\n"
      "[[fruits.varieties]]\nname = \"plantain\"\n"
      "[[fruits.varieties]]\n[fruits.varieties.detail]\nok = true\n");
  const tr_toml_value_t* p = at(r, "products");
  ck_assert_int_eq(tr_toml_type(p), TR_TOML_ARRAY);
  ck_assert_uint_eq(tr_toml_count(p), 3);
  ck_assert_uint_eq(tr_toml_count(tr_toml_at(p, 1)), 0);
  ck_assert_str_eq(str_at(r, "products.2.color"), "gray");
  ck_assert_uint_eq(tr_toml_count(at(r, "fruits")), 2);
  ck_assert_str_eq(str_at(r, "fruits.0.physical.color"), "red");
  ck_assert_str_eq(str_at(r, "fruits.0.varieties.1.name"), "granny smith");
  ck_assert_uint_eq(tr_toml_count(at(r, "fruits.1.varieties")), 2);
  ck_assert_str_eq(str_at(r, "fruits.1.varieties.0.name"), "plantain");
  ck_assert_int_eq(tr_toml_bool(at(r, "fruits.1.varieties.1.detail.ok")), 1);
  tr_toml_free(r);
}
END_TEST

START_TEST(test_document_order) {
  tr_toml_value_t* r =
      parse_ok("z = 1\ny.b = 2\nx = 3\ny.a = 4\n[b]\n[a.q]\n[0]\n[a]\n");
  static const char* const keys[] = {"z", "y", "x", "b", "a", "0"};
  ck_assert_uint_eq(tr_toml_count(r), 6);
  for (size_t i = 0; i < 6; i++)
    ck_assert_str_eq(tr_toml_key_at(r, i), keys[i]);
  ck_assert_str_eq(tr_toml_key_at(at(r, "y"), 0), "b");
  ck_assert_str_eq(tr_toml_key_at(at(r, "y"), 1), "a");
  ck_assert_ptr_null(tr_toml_key_at(r, 6));
  tr_toml_free(r);
}
END_TEST

START_TEST(test_newlines_comments_bom) {
  /* LF and CRLF may mix; comments may hold tabs and UTF-8; a BOM starts a
   * file; the last line needs no newline */
  static const char doc[] =
      "\xEF\xBB\xBF# \xe2\x9c\x93 comment\twith tab\r\n"
      "a = 1\r\nb = 2\n  \t\n[t] # c\r\nc = [\r\n1,\n2]\r\nd = 4";
  tr_toml_value_t* r = parse_okn(doc, sizeof doc - 1);
  ck_assert_int_eq(int_at(r, "a"), 1);
  ck_assert_int_eq(int_at(r, "b"), 2);
  ck_assert_int_eq(int_at(r, "t.c.1"), 2);
  ck_assert_int_eq(int_at(r, "t.d"), 4);
  tr_toml_free(r);
  r = parse_ok("");
  ck_assert_uint_eq(tr_toml_count(r), 0);
  tr_toml_free(r);
  r = parse_ok("# only a comment");
  ck_assert_uint_eq(tr_toml_count(r), 0);
  tr_toml_free(r);
  r = parse_okn(NULL, 0);
  ck_assert_uint_eq(tr_toml_count(r), 0);
  tr_toml_free(r);
}
END_TEST

/* ---- positions ---- */

START_TEST(test_positions) {
  tr_toml_value_t* r = parse_ok(
      "# c\n"                   /* 1 */
      "name = \"x\"\n"          /* 2 */
      "[server]\n"              /* 3 */
      "  port = 8080\n"         /* 4 */
      "[[job]]\n"               /* 5 */
      "id = 1\n"                /* 6 */
      "[[job]]\n"               /* 7 */
      "id = 2\n"                /* 8 */
      "pt = {x = 1}\n"          /* 9 */
      "arr = [\n"               /* 10 */
      "  1,\n"                  /* 11 */
      "  2\n"                   /* 12 */
      "]\n"                     /* 13 */
      "s = \"\"\"\nx\n\"\"\"\n" /* 14-16 */
      "after = 1\n"             /* 17 */
      "x.y.z = true\n");        /* 18 */
  ck_assert_int_eq(tr_toml_line(r), 1);
  ck_assert_int_eq(tr_toml_col(r), 1);
  const tr_toml_value_t* v = at(r, "name");
  ck_assert_int_eq(tr_toml_line(v), 2);
  ck_assert_int_eq(tr_toml_col(v), 8);
  ck_assert_int_eq(tr_toml_key_line(r, 0), 2);
  ck_assert_int_eq(tr_toml_key_col(r, 0), 1);
  v = at(r, "server");
  ck_assert_int_eq(tr_toml_line(v), 3);
  ck_assert_int_eq(tr_toml_col(v), 1);
  ck_assert_int_eq(tr_toml_key_line(r, 1), 3);
  ck_assert_int_eq(tr_toml_key_col(r, 1), 2);
  ck_assert_int_eq(tr_toml_line(at(r, "server.port")), 4);
  ck_assert_int_eq(tr_toml_col(at(r, "server.port")), 10);
  ck_assert_int_eq(tr_toml_key_line(v, 0), 4);
  ck_assert_int_eq(tr_toml_key_col(v, 0), 3);
  /* the array of tables' key: where it was last written */
  ck_assert_int_eq(tr_toml_key_line(r, 2), 7);
  ck_assert_int_eq(tr_toml_key_col(r, 2), 3);
  ck_assert_int_eq(tr_toml_line(at(r, "job.1")), 7);
  ck_assert_int_eq(tr_toml_line(at(r, "job.1.pt")), 9);
  ck_assert_int_eq(tr_toml_col(at(r, "job.1.pt")), 6);
  ck_assert_int_eq(tr_toml_col(at(r, "job.1.pt.x")), 11);
  ck_assert_int_eq(tr_toml_line(at(r, "job.1.arr")), 10);
  ck_assert_int_eq(tr_toml_col(at(r, "job.1.arr")), 7);
  ck_assert_int_eq(tr_toml_line(at(r, "job.1.arr.1")), 12);
  ck_assert_int_eq(tr_toml_col(at(r, "job.1.arr.1")), 3);
  ck_assert_int_eq(tr_toml_line(at(r, "job.1.s")), 14);
  ck_assert_int_eq(tr_toml_line(at(r, "job.1.after")), 17);
  ck_assert_int_eq(tr_toml_col(at(r, "job.1.after")), 9);
  const tr_toml_value_t* job = at(r, "job.1");
  ck_assert_int_eq(tr_toml_key_line(job, 5), 18);
  ck_assert_int_eq(tr_toml_key_col(job, 5), 1);
  ck_assert_int_eq(tr_toml_key_col(at(r, "job.1.x"), 0), 3); /* y */
  ck_assert_int_eq(tr_toml_col(at(r, "job.1.x.y.z")), 9);
  ck_assert_int_eq(tr_toml_key_line(job, 99), 0);
  tr_toml_free(r);

  /* a table made implicitly takes the position of its later header */
  r = parse_ok("[a.b]\n\n[a]\n");
  ck_assert_int_eq(tr_toml_key_line(r, 0), 3);
  ck_assert_int_eq(tr_toml_key_col(r, 0), 2);
  ck_assert_int_eq(tr_toml_line(at(r, "a")), 3);
  ck_assert_int_eq(tr_toml_line(at(r, "a.b")), 1);
  ck_assert_int_eq(tr_toml_key_col(at(r, "a"), 0), 4);
  tr_toml_free(r);
}
END_TEST

/* ---- API edges ---- */

START_TEST(test_accessors) {
  tr_toml_value_t* r = parse_ok("s = \"x\"\ni = 7\nt = {}\n");
  const tr_toml_value_t* s = at(r, "s");
  const tr_toml_value_t* i = at(r, "i");
  size_t len = 99;
  ck_assert_ptr_null(tr_toml_string(i, &len));
  ck_assert_uint_eq(len, 0);
  ck_assert_int_eq(tr_toml_int(s), 0);
  ck_assert(tr_toml_float(i) == 0.0); /* no conversion between types */
  ck_assert_int_eq(tr_toml_bool(i), 0);
  ck_assert_ptr_null(tr_toml_datetime(i));
  ck_assert_ptr_null(tr_toml_datetime_text(s));
  ck_assert_uint_eq(tr_toml_count(s), 0);
  ck_assert_ptr_null(tr_toml_at(s, 0));
  ck_assert_ptr_null(tr_toml_get(s, "x"));
  ck_assert_ptr_null(tr_toml_get(r, "missing"));
  ck_assert_ptr_null(tr_toml_get(NULL, "s"));
  ck_assert_ptr_null(tr_toml_key_at(s, 0));
  ck_assert_int_eq(tr_toml_int(NULL), 0);
  ck_assert_int_eq(tr_toml_line(NULL), 0);
  ck_assert_str_eq(tr_toml_type_name(TR_TOML_STRING), "string");
  ck_assert_str_eq(tr_toml_type_name(TR_TOML_INTEGER), "integer");
  ck_assert_str_eq(tr_toml_type_name(TR_TOML_FLOAT), "float");
  ck_assert_str_eq(tr_toml_type_name(TR_TOML_BOOL), "bool");
  ck_assert_str_eq(tr_toml_type_name(TR_TOML_DATETIME), "datetime");
  ck_assert_str_eq(tr_toml_type_name(TR_TOML_DATETIME_LOCAL), "datetime-local");
  ck_assert_str_eq(tr_toml_type_name(TR_TOML_DATE_LOCAL), "date-local");
  ck_assert_str_eq(tr_toml_type_name(TR_TOML_TIME_LOCAL), "time-local");
  ck_assert_str_eq(tr_toml_type_name(TR_TOML_ARRAY), "array");
  ck_assert_str_eq(tr_toml_type_name(TR_TOML_TABLE), "table");
  /* freeing something that is not a root does nothing; NULL is fine */
  tr_toml_free((tr_toml_value_t*)at(r, "t"));
  tr_toml_free(NULL);
  ck_assert_int_eq(int_at(r, "i"), 7);
  tr_toml_free(r);
}
END_TEST

START_TEST(test_not_nul_terminated) {
  /* the parser reads exactly len bytes */
  static const char doc[] = "a = 12345";
  tr_toml_value_t* r = parse_okn(doc, 6); /* "a = 12" */
  ck_assert_int_eq(int_at(r, "a"), 12);
  tr_toml_free(r);
  r = parse_okn("a = \"xyz\"garbage", 9);
  ck_assert_str_eq(str_at(r, "a"), "xyz");
  tr_toml_free(r);
}
END_TEST

START_TEST(test_big_table) {
  /* enough keys for the hash index; lookups and duplicates still exact */
  size_t cap = 64 * 1024, n = 0;
  char* doc = malloc(cap);
  for (int i = 0; i < 2000; i++)
    n += (size_t)snprintf(doc + n, cap - n, "k%d = %d\n", i, i);
  tr_toml_value_t* r = parse_okn(doc, n);
  ck_assert_uint_eq(tr_toml_count(r), 2000);
  char key[16];
  for (int i = 0; i < 2000; i++) {
    snprintf(key, sizeof key, "k%d", i);
    ck_assert_int_eq(tr_toml_int(tr_toml_get(r, key)), i);
    ck_assert_str_eq(tr_toml_key_at(r, (size_t)i), key);
  }
  ck_assert_ptr_null(tr_toml_get(r, "k2000"));
  tr_toml_free(r);
  n += (size_t)snprintf(doc + n, cap - n, "k1234 = 0\n");
  bad_doc_t b = {doc, n, 2001, 1, "duplicate key 'k1234'"};
  check_bad(&b);
  free(doc);
}
END_TEST

/* ---- nesting depth ---- */

static char* repeat3(const char* head, const char* unit, int n, const char* mid,
                     const char* unit2, int n2, const char* tail, size_t* len) {
  size_t cap = strlen(head) + strlen(unit) * (size_t)n + strlen(mid) +
               strlen(unit2) * (size_t)n2 + strlen(tail) + 1;
  char* s = malloc(cap);
  size_t o = 0;
  o += (size_t)sprintf(s + o, "%s", head);
  for (int i = 0; i < n; i++) o += (size_t)sprintf(s + o, "%s", unit);
  o += (size_t)sprintf(s + o, "%s", mid);
  for (int i = 0; i < n2; i++) o += (size_t)sprintf(s + o, "%s", unit2);
  o += (size_t)sprintf(s + o, "%s", tail);
  *len = o;
  return s;
}

START_TEST(test_depth_limit) {
  size_t len;
  /* 256 levels below the root are fine */
  char* doc = repeat3("a = ", "[", 256, "1", "]", 256, "\n", &len);
  tr_toml_value_t* r = parse_okn(doc, len);
  const tr_toml_value_t* v = at(r, "a");
  for (int i = 1; i < 256; i++) v = tr_toml_at(v, 0);
  ck_assert_int_eq(tr_toml_int(tr_toml_at(v, 0)), 1);
  tr_toml_free(r);
  free(doc);
  /* one more is an error at the bracket that goes too deep */
  doc = repeat3("a = ", "[", 257, "", "]", 257, "\n", &len);
  bad_doc_t b = {doc, len, 1, 4 + 257, "nesting deeper than 256 levels"};
  check_bad(&b);
  free(doc);
  /* a hundred thousand brackets do not exhaust the stack */
  doc = repeat3("a = ", "[", 100000, "", "", 0, "", &len);
  b = (bad_doc_t){doc, len, 1, 4 + 257, "nesting deeper than 256 levels"};
  check_bad(&b);
  free(doc);
  doc = repeat3("a = ", "{b=", 257, "1", "}", 257, "\n", &len);
  b = (bad_doc_t){doc, len, 1, 5 + 256 * 3, "nesting deeper than 256 levels"};
  check_bad(&b);
  free(doc);
  /* dotted keys: a key of 256 parts (the last a value) is fine */
  doc = repeat3("a", ".a", 255, " = 1\n", "", 0, "", &len);
  r = parse_okn(doc, len);
  tr_toml_free(r);
  free(doc);
  doc = repeat3("a", ".a", 256, " = 1\n", "", 0, "", &len);
  b = (bad_doc_t){doc, len, 1, 1 + 2 * 256, "nesting deeper than 256 levels"};
  check_bad(&b);
  free(doc);
  /* headers and keys below them add up */
  doc = repeat3("[t", ".t", 255, "]\n", "", 0, "x = 1\ny.z = 2\n", &len);
  b = (bad_doc_t){doc, len, 3, 1, "nesting deeper than 256 levels"};
  check_bad(&b);
  free(doc);
}
END_TEST

/* ---- files ---- */

START_TEST(test_parse_file) {
  char path[] = "/tmp/check_toml_XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  static const char doc[] = "[job]\nname = \"run\"\nsteps = 10\n";
  ck_assert_int_eq(write(fd, doc, sizeof doc - 1), (ssize_t)(sizeof doc - 1));
  close(fd);
  tr_toml_value_t* r = NULL;
  tr_toml_error_t err;
  ck_assert_int_eq(tr_toml_parse_file(path, &r, &err), 0);
  ck_assert_str_eq(str_at(r, "job.name"), "run");
  ck_assert_int_eq(int_at(r, "job.steps"), 10);
  tr_toml_free(r);

  fd = open(path, O_WRONLY | O_APPEND);
  ck_assert_int_eq(write(fd, "steps = 11\n", 11), 11);
  close(fd);
  ck_assert_int_eq(tr_toml_parse_file(path, &r, &err), TR_EPARSE);
  ck_assert_ptr_null(r);
  ck_assert_int_eq(err.line, 4);
  ck_assert_int_eq(err.col, 1);
  ck_assert_str_eq(err.message, "duplicate key 'job.steps'");
  unlink(path);

  ck_assert_int_eq(tr_toml_parse_file(path, &r, &err), TR_ENOENT);
  ck_assert_ptr_null(r);
  ck_assert_int_eq(err.line, 0);
  char want[128];
  snprintf(want, sizeof want, "cannot read '%s': no such file or directory",
           path);
  ck_assert_str_eq(err.message, want);
  ck_assert_int_eq(tr_toml_parse_file("/tmp", &r, &err), TR_EISDIR);
  ck_assert_int_eq(err.line, 0);
}
END_TEST

/* ---- invalid documents ---- */

static const bad_doc_t bad_docs[] = {
    /* keys and tables defined twice */
    {D("a = 1\na = 2\n"), 2, 1, "duplicate key 'a'"},
    {D("[server]\nhost = 1\nhost = 2\n"), 3, 1, "duplicate key 'server.host'"},
    {D("spelling = 1\n\"spelling\" = 2\n"), 2, 1, "duplicate key 'spelling'"},
    {D("a = 1\n\"\\u0061\" = 2\n"), 2, 1, "duplicate key 'a'"},
    {D("\"a b\" = 1\n'a b' = 2\n"), 2, 1, "duplicate key '\"a b\"'"},
    {D("[a.\"b.c\"]\nx = 1\nx = 2\n"), 3, 1, "duplicate key 'a.\"b.c\".x'"},
    {D("a.b = 1\na.b = 2\n"), 2, 3, "duplicate key 'a.b'"},
    {D("a = {b = 1, b = 2}\n"), 1, 13, "duplicate key 'a.b'"},
    {D("[a.b.c]\n[a]\nb = 1\n"), 3, 1, "duplicate key 'a.b'"},
    {D("[server]\n[server]\n"), 2, 2, "table 'server' already defined"},
    {D("[a]\n[a.b]\n[a]\n"), 3, 2, "table 'a' already defined"},
    {D("[ a . b ]\n[a.b]\n"), 2, 4, "table 'a.b' already defined"},
    {D("[fruit]\napple.color = \"red\"\n[fruit.apple]\n"), 3, 8,
     "table 'fruit.apple' already defined"},
    {D("[fruit]\napple.taste.sweet = true\n[fruit.apple.taste]\n"), 3, 14,
     "table 'fruit.apple.taste' already defined"},
    {D("a.b = 1\n[a]\n"), 2, 2, "table 'a' already defined"},
    {D("[a.b]\n[a]\nb.c = 1\n"), 3, 1, "table 'a.b' already defined"},
    {D("[a]\nb = 1\n[a.b]\n"), 3, 4, "key 'a.b' already defined as integer"},
    {D("a = \"x\"\n[a.b]\n"), 2, 2, "key 'a' already defined as string"},
    {D("a.b = 1\na.b.c = 2\n"), 2, 3, "key 'a.b' already defined as integer"},
    {D("fruit.apple = 1\nfruit.apple.smooth = true\n"), 2, 7,
     "key 'fruit.apple' already defined as integer"},
    {D("[[a]]\n[a]\n"), 2, 2, "key 'a' already defined as array of tables"},
    {D("[a]\n[[a]]\n"), 2, 3, "key 'a' already defined as table"},
    {D("[[t.arr]]\n[t]\narr.y = 2\n"), 3, 1,
     "key 't.arr' already defined as array of tables"},
    {D("a = [{}]\n[a.b]\n"), 2, 2, "key 'a' already defined as array"},
    {D("a = [1]\na.b = 2\n"), 2, 1, "key 'a' already defined as array"},
    {D("fruits = []\n[[fruits]]\n"), 2, 3,
     "cannot append to static array 'fruits'"},
    {D("[fruit.physical]\n[[fruit]]\n"), 2, 3,
     "key 'fruit' already defined as table"},
    {D("[[fruits]]\n[[fruits.varieties]]\n[fruits.varieties]\n"), 3, 9,
     "key 'fruits.varieties' already defined as array of tables"},
    /* inline tables are complete */
    {D("a = {b = 1}\na.c = 2\n"), 2, 1, "cannot extend inline table 'a'"},
    {D("a = {b = 1}\n[a]\n"), 2, 2, "cannot extend inline table 'a'"},
    {D("a = {b = {}}\n[a.b.c]\n"), 2, 2, "cannot extend inline table 'a'"},
    {D("[product]\ntype = { name = \"Nail\" }\ntype.edible = false\n"), 3, 1,
     "cannot extend inline table 'product.type'"},
    {D("[product]\ntype.name = \"Nail\"\ntype = { edible = false }\n"), 3, 1,
     "duplicate key 'product.type'"},
    {D("a = {b = {c = 1}, b.d = 2}\n"), 1, 19,
     "cannot extend inline table 'a.b'"},
    {D("a = {}\n[[a.b]]\n"), 2, 3, "cannot extend inline table 'a'"},
    {D("a = {b = 1,}\n"), 1, 11, "trailing comma in inline table"},
    {D("a = {b = 1\n"), 1, 11, "newline in inline table"},
    {D("a = {b = 1,\n c = 2}\n"), 1, 12, "newline in inline table"},
    {D("a = {\nb = 1}\n"), 1, 6, "newline in inline table"},
    {D("a = {b = 1 c = 2}\n"), 1, 12,
     "expected ',' or '}' in inline table, found 'c'"},
    {D("a = {b = 1 # c\n}\n"), 1, 12,
     "expected ',' or '}' in inline table, found '#'"},
    {D("a = {,}\n"), 1, 6, "expected a key, found ','"},
    {D("a = {b = 1"), 1, 5, "unterminated inline table"},
    /* arrays */
    {D("a = [1, 2\n"), 1, 5, "unterminated array"},
    {D("a = [1 2]\n"), 1, 8, "expected ',' or ']' in array, found '2'"},
    {D("a = [,]\n"), 1, 6, "expected a value, found ','"},
    {D("a = [1,,2]\n"), 1, 8, "expected a value, found ','"},
    /* integers */
    {D("a = 0123\n"), 1, 5,
     "invalid number '0123': leading zeros are not allowed"},
    {D("a = -01\n"), 1, 5,
     "invalid number '-01': leading zeros are not allowed"},
    {D("a = 0_1\n"), 1, 5,
     "invalid number '0_1': leading zeros are not allowed"},
    {D("a = 1__000\n"), 1, 5,
     "invalid number '1__000': underscores must sit between digits"},
    {D("a = 1_\n"), 1, 5,
     "invalid number '1_': underscores must sit between digits"},
    {D("a = 0x_1\n"), 1, 5,
     "invalid number '0x_1': underscores must sit between digits"},
    {D("a = _1\n"), 1, 5, "invalid value '_1'"},
    {D("a = +0x1\n"), 1, 5,
     "invalid number '+0x1': a sign is not allowed before a base prefix"},
    {D("a = 0X1\n"), 1, 5, "invalid number '0X1'"},
    {D("a = 0x\n"), 1, 5, "invalid number '0x'"},
    {D("a = 0o8\n"), 1, 5, "invalid number '0o8'"},
    {D("a = 0b102\n"), 1, 5, "invalid number '0b102'"},
    {D("a = 12abc\n"), 1, 5, "invalid number '12abc'"},
    {D("a = +\n"), 1, 5, "invalid number '+'"},
    {D("a = 9223372036854775808\n"), 1, 5,
     "integer '9223372036854775808' out of range"},
    {D("a = -9223372036854775809\n"), 1, 5,
     "integer '-9223372036854775809' out of range"},
    {D("a = 0x8000000000000000\n"), 1, 5,
     "integer '0x8000000000000000' out of range"},
    {D("a = 0b1_0000000000000000000000000000000000000000000000000000000000000"
       "00\n"),
     1, 5,
     "integer '0b1_0000000000000000000000000000000000000000...' out of range"},
    /* floats */
    {D("a = .7\n"), 1, 5, "invalid value '.7'"},
    {D("a = 7.\n"), 1, 5, "invalid number '7.': expected a digit after '.'"},
    {D("a = 3.e+20\n"), 1, 5,
     "invalid number '3.e+20': expected a digit after '.'"},
    {D("a = 1e\n"), 1, 5,
     "invalid number '1e': expected a digit in the exponent"},
    {D("a = 1e_5\n"), 1, 5,
     "invalid number '1e_5': expected a digit in the exponent"},
    {D("a = 1.2.3\n"), 1, 5, "invalid number '1.2.3'"},
    {D("a = 03.14\n"), 1, 5,
     "invalid number '03.14': leading zeros are not allowed"},
    {D("a = nan1\n"), 1, 5, "invalid number 'nan1'"},
    {D("a = Inf\n"), 1, 5, "invalid value 'Inf'"},
    /* booleans and other bare words */
    {D("a = True\n"), 1, 5, "invalid value 'True'"},
    {D("a = truex\n"), 1, 5, "invalid value 'truex'"},
    {D("a = @\n"), 1, 5, "expected a value, found '@'"},
    {D("a = \n"), 1, 5, "expected a value, found newline"},
    {D("a ="), 1, 4, "expected a value, found end of file"},
    /* date-times */
    {D("d = 2021-02-30\n"), 1, 5,
     "invalid date '2021-02-30': day out of range"},
    {D("d = 2021-02-29\n"), 1, 5,
     "invalid date '2021-02-29': day out of range"},
    {D("d = 1900-02-29\n"), 1, 5,
     "invalid date '1900-02-29': day out of range"},
    {D("d = 2021-04-31\n"), 1, 5,
     "invalid date '2021-04-31': day out of range"},
    {D("d = 2021-13-01\n"), 1, 5,
     "invalid date '2021-13-01': month out of range"},
    {D("d = 2021-00-01\n"), 1, 5,
     "invalid date '2021-00-01': month out of range"},
    {D("d = 1979-5-27\n"), 1, 5, "invalid date '1979-5-27'"},
    {D("d = 24:00:00\n"), 1, 5, "invalid time '24:00:00': hour out of range"},
    {D("d = 12:60:00\n"), 1, 5, "invalid time '12:60:00': minute out of range"},
    {D("d = 12:00:60\n"), 1, 5, "invalid time '12:00:60': second out of range"},
    {D("d = 07:32\n"), 1, 5, "invalid time '07:32'"},
    {D("d = 07:32:00Z\n"), 1, 5, "invalid time '07:32:00Z'"},
    {D("d = 07:32:00.\n"), 1, 5,
     "invalid time '07:32:00.': expected a digit after '.'"},
    {D("d = 1979-05-27T07:32\n"), 1, 5, "invalid date-time '1979-05-27T07:32'"},
    {D("d = 1979-05-27 07:32\n"), 1, 5, "invalid date-time '1979-05-27 07:32'"},
    {D("d = 1979-05-27T\n"), 1, 5, "invalid date-time '1979-05-27T'"},
    {D("d = 1979-05-27T07:32:00+24:00\n"), 1, 5,
     "invalid date-time '1979-05-27T07:32:00+24:00': offset out of range"},
    {D("d = 1979-05-27T07:32:00+0700\n"), 1, 5,
     "invalid date-time '1979-05-27T07:32:00+0700'"},
    {D("d = 1979-05-27T25:00:00Z\n"), 1, 5,
     "invalid date-time '1979-05-27T25:00:00Z': hour out of range"},
    /* strings */
    {D("a = \"\\q\"\n"), 1, 6, "invalid escape sequence '\\q'"},
    {D("a = \"ok \\e\"\n"), 1, 9, "invalid escape sequence '\\e'"},
    {D("a = \"\\ \"\n"), 1, 6,
     "invalid escape sequence: '\\' followed by space"},
    {D("a = \"\\u12\"\n"), 1, 6,
     "invalid escape sequence '\\u12': expected 4 hex digits"},
    {D("a = \"\\U0001F60\"\n"), 1, 6,
     "invalid escape sequence '\\U0001F60': expected 8 hex digits"},
    {D("a = \"\\uD800\"\n"), 1, 6,
     "invalid escape sequence '\\uD800': not a unicode scalar value"},
    {D("a = \"\\U00110000\"\n"), 1, 6,
     "invalid escape sequence '\\U00110000': not a unicode scalar value"},
    {D("a = \"\"\"\nline\nline\\q\"\"\"\n"), 3, 5,
     "invalid escape sequence '\\q'"},
    {D("a = \"\"\"a \\  b\"\"\"\n"), 1, 10,
     "invalid escape sequence: '\\' followed by whitespace must end the line"},
    {D("a = \"abc\n"), 1, 5, "unterminated string"},
    {D("a = \"abc"), 1, 5, "unterminated string"},
    {D("a = 'abc\nd'\n"), 1, 5, "unterminated string"},
    {D("a = \"a\r\nb\"\n"), 1, 5, "unterminated string"},
    {D("x = 1\na = \"\"\"abc\n\n"), 2, 5, "unterminated multi-line string"},
    {D("a = '''abc''"), 1, 5, "unterminated multi-line string"},
    {D("a = \"\"\"a\"\"\"\"\"\"\n"), 1, 14,
     "expected end of line after value, found '\"'"},
    {D("a = '''a''''''\n"), 1, 14,
     "expected end of line after value, found \"'\""},
    {D("a = \"x\x01\"\n"), 1, 7, "control character U+0001 in string"},
    {D("a = \"x\x7f\"\n"), 1, 7, "control character U+007F in string"},
    {D("a = 'x\0'\n"), 1, 7, "control character U+0000 in string"},
    {D("a = \"\"\"\nx\x1b\"\"\"\n"), 2, 2,
     "control character U+001B in string"},
    {D("a = \"\"\"x\ry\"\"\"\n"), 1, 9, "carriage return without line feed"},
    {D("a = \"x\ry\"\n"), 1, 7, "carriage return without line feed"},
    /* encoding, control characters, newlines */
    {D("a = \"\xff\"\n"), 1, 6, "invalid UTF-8 byte 0xff in string"},
    {D("a = \"\xc0\x80\"\n"), 1, 6, "invalid UTF-8 byte 0xc0 in string"},
    {D("a = \"\xed\xa0\x80\"\n"), 1, 6, "invalid UTF-8 byte 0xed in string"},
    {D("a = \"\xf4\x90\x80\x80\"\n"), 1, 6,
     "invalid UTF-8 byte 0xf4 in string"},
    {D("a = \"\xe2\x82\"\n"), 1, 6, "invalid UTF-8 byte 0xe2 in string"},
    {D("a = 1 # \xc3\x28\n"), 1, 9, "invalid UTF-8 byte 0xc3 in comment"},
    {D("# \x01\n"), 1, 3, "control character U+0001 in comment"},
    {D("a = 1 # \x7f\n"), 1, 9, "control character U+007F in comment"},
    {D("\xff = 1\n"), 1, 1,
     "expected a key or table header, found invalid UTF-8 byte 0xff"},
    {D("\xc3\xa9 = 1\n"), 1, 1,
     "expected a key or table header, found '\xc3\xa9' (U+00E9)"},
    {D("a = 1\x0b\n"), 1, 6, "unexpected control character U+000B after '1'"},
    {D("a = true\xff\n"), 1, 9,
     "unexpected invalid UTF-8 byte 0xff after 'true'"},
    {D("a = [6\xe2\x82\xac]\n"), 1, 7,
     "unexpected '\xe2\x82\xac' (U+20AC) after '6'"},
    {D("a = 1979-05-27\x01\n"), 1, 15,
     "unexpected control character U+0001 after '1979-05-27'"},
    {D("a = 1\n\0\n"), 2, 1,
     "expected a key or table header, found control character U+0000"},
    {D("a = 1\rb = 2\n"), 1, 6, "carriage return without line feed"},
    {D("a = 1\r\nb = 2\r\na = 3\r\n"), 3, 1, "duplicate key 'a'"},
    {D("# c\r"), 1, 4, "carriage return without line feed"},
    {D("\r"), 1, 1, "carriage return without line feed"},
    /* statement syntax */
    {D("= 1\n"), 1, 1, "expected a key or table header, found '='"},
    {D("a\n"), 1, 2, "expected '=' after key 'a', found newline"},
    {D("a b = 1\n"), 1, 3, "expected '=' after key 'a', found 'b'"},
    {D("x.\"y z\" 1\n"), 1, 9, "expected '=' after key 'x.\"y z\"', found '1'"},
    {D("a. = 1\n"), 1, 4, "expected a key, found '='"},
    {D("a..b = 1\n"), 1, 3, "expected a key, found '.'"},
    {D("a."), 1, 3, "expected a key, found end of file"},
    {D("\"\"\"a\"\"\" = 1\n"), 1, 1, "a multi-line string cannot be a key"},
    {D("a.\"b\\q\" = 1\n"), 1, 5, "invalid escape sequence '\\q'"},
    {D("a = 1 b = 2\n"), 1, 7, "expected end of line after value, found 'b'"},
    {D("a = \"x\"y\n"), 1, 8, "expected end of line after value, found 'y'"},
    {D("[]\n"), 1, 2, "expected a key, found ']'"},
    {D("[a\n"), 1, 3, "expected ']' after table name, found newline"},
    {D("[a.]\n"), 1, 4, "expected a key, found ']'"},
    {D("[a]]\n"), 1, 4, "expected end of line after table header, found ']'"},
    {D("[a] b = 1\n"), 1, 5,
     "expected end of line after table header, found 'b'"},
    {D("[[a]\n"), 1, 4, "expected ']]' after array of tables name, found ']'"},
    {D("[ [a] ]\n"), 1, 3, "expected a key, found '['"},
    /* errors keep their positions after multi-line strings */
    {D("a = \"\"\"\nx\n\"\"\"\nb = 1\nb = 2\n"), 5, 1, "duplicate key 'b'"},
    {D("a = '''\n\n'''\nb = [\n1,\n2 3]\n"), 6, 3,
     "expected ',' or ']' in array, found '3'"},
    {D("a = \"\"\"x\\\n\n   \"\"\"\nb = 0x\n"), 4, 5, "invalid number '0x'"},
};

START_TEST(test_invalid_documents) { check_bad(&bad_docs[_i]); }
END_TEST

static Suite* toml_suite(void) {
  Suite* s = suite_create("toml");
  TCase* tc = tcase_create("values");
  tcase_add_test(tc, test_basic_strings);
  tcase_add_test(tc, test_string_with_nul);
  tcase_add_test(tc, test_multiline_basic_strings);
  tcase_add_test(tc, test_literal_strings);
  tcase_add_test(tc, test_integers);
  tcase_add_test(tc, test_floats);
  tcase_add_test(tc, test_booleans);
  tcase_add_test(tc, test_datetimes);
  tcase_add_test(tc, test_arrays);
  tcase_add_test(tc, test_inline_tables);
  suite_add_tcase(s, tc);
  tc = tcase_create("structure");
  tcase_add_test(tc, test_keys);
  tcase_add_test(tc, test_tables);
  tcase_add_test(tc, test_arrays_of_tables);
  tcase_add_test(tc, test_document_order);
  tcase_add_test(tc, test_newlines_comments_bom);
  tcase_add_test(tc, test_positions);
  tcase_add_test(tc, test_accessors);
  tcase_add_test(tc, test_not_nul_terminated);
  tcase_add_test(tc, test_big_table);
  tcase_add_test(tc, test_depth_limit);
  tcase_add_test(tc, test_parse_file);
  suite_add_tcase(s, tc);
  tc = tcase_create("invalid");
  tcase_add_loop_test(tc, test_invalid_documents, 0,
                      (int)(sizeof bad_docs / sizeof bad_docs[0]));
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(toml_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
