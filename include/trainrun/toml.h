/* trainrun/toml.h: a TOML 1.0 parser.
 *
 * Parses a whole document into a tree of values. Every value and every key
 * remembers the line and column (1-based, columns in bytes) where it was
 * written, so later checks (the job config) can point users at file:line:col.
 * An invalid document yields TR_EPARSE and an error with the position and a
 * message; no tree is returned.
 *
 * Ownership: tr_toml_parse() returns a tree owned by the caller, freed with
 * tr_toml_free(). Every pointer obtained from the tree (values, keys,
 * strings) lives until that call.
 *
 * Errors point where the offending token starts: the key that is defined
 * twice, the number, the escape sequence, the byte that is not UTF-8; an
 * unterminated string, array or inline table at its opening character.
 * Tables and arrays nest at most 256 levels below the root (deeper is an
 * error), so code that walks a tree recursively needs no guard of its own.
 * Where TOML leaves a choice: newlines in multi-line strings read as LF, a
 * UTF-8 byte order mark may start the text, leap seconds (:60) are
 * rejected, integers must fit in int64_t, and a float that overflows
 * double reads as an infinity.
 */
#ifndef TRAINRUN_TOML_H
#define TRAINRUN_TOML_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  TR_TOML_STRING,
  TR_TOML_INTEGER,
  TR_TOML_FLOAT,
  TR_TOML_BOOL,
  TR_TOML_DATETIME,       /* offset date-time: 1979-05-27T07:32:00Z */
  TR_TOML_DATETIME_LOCAL, /* 1979-05-27T07:32:00 */
  TR_TOML_DATE_LOCAL,     /* 1979-05-27 */
  TR_TOML_TIME_LOCAL,     /* 07:32:00 */
  TR_TOML_ARRAY,
  TR_TOML_TABLE
} tr_toml_type_t;

typedef struct {
  int year, month, day;     /* valid for DATETIME*, DATE_LOCAL */
  int hour, minute, second; /* valid for DATETIME*, TIME_LOCAL */
  int nanosecond;           /* fractional seconds, truncated to ns */
  int frac_digits;          /* digits written after '.', 0 if none */
  int offset_minutes;       /* DATETIME only; Z and +00:00 give 0 */
} tr_toml_datetime_t;

typedef struct tr_toml_value tr_toml_value_t;

typedef struct {
  int line; /* 1-based; 0 when the error has no position */
  int col;  /* 1-based byte column */
  char message[256];
} tr_toml_error_t;

/* Parse text[0..len) (need not be NUL-terminated). On success *root is a
 * TABLE and 0 is returned; on failure TR_EPARSE with *err filled (line, col
 * and a lowercase message like "duplicate key 'a'"), TR_ENOMEM, or
 * TR_ELIMIT for a text over INT_MAX bytes. err may be NULL. */
int tr_toml_parse(const char* text, size_t len, tr_toml_value_t** root,
                  tr_toml_error_t* err);

/* Read and parse a file; errors from reading return the negated errno and
 * carry line 0 and a message like "cannot read 'job.toml': no such file or
 * directory". */
int tr_toml_parse_file(const char* path, tr_toml_value_t** root,
                       tr_toml_error_t* err);

/* Free a tree from tr_toml_parse(); NULL, or a value that is not a root,
 * is ignored. */
void tr_toml_free(tr_toml_value_t* root);

tr_toml_type_t tr_toml_type(const tr_toml_value_t* v); /* v != NULL */
const char* tr_toml_type_name(tr_toml_type_t t); /* "string", "integer" ... */
int tr_toml_line(const tr_toml_value_t* v);      /* where the value starts */
int tr_toml_col(const tr_toml_value_t* v);

/* Scalars. Calling the accessor of the wrong type returns 0/NULL. */
const char* tr_toml_string(const tr_toml_value_t* v, size_t* len); /* UTF-8,
                                        NUL-terminated, may contain NULs */
int64_t tr_toml_int(const tr_toml_value_t* v);
double tr_toml_float(const tr_toml_value_t* v);
int tr_toml_bool(const tr_toml_value_t* v);
const tr_toml_datetime_t* tr_toml_datetime(const tr_toml_value_t* v);
/* The datetime as written but normalised per TOML (a space separator
 * becomes 'T', 'z' becomes 'Z'); valid for the four datetime types. */
const char* tr_toml_datetime_text(const tr_toml_value_t* v);

/* Arrays and tables: entries keep document order. */
size_t tr_toml_count(const tr_toml_value_t* v);
const tr_toml_value_t* tr_toml_at(const tr_toml_value_t* v, size_t i);
/* Table entries: key, and position of the key where it was (last) written. */
const char* tr_toml_key_at(const tr_toml_value_t* table, size_t i);
/* Length of tr_toml_key_at(table, i) in bytes: a quoted key may hold NULs
 * ("\u0000"); 0 when i is out of range. */
size_t tr_toml_key_len(const tr_toml_value_t* table, size_t i);
int tr_toml_key_line(const tr_toml_value_t* table, size_t i);
int tr_toml_key_col(const tr_toml_value_t* table, size_t i);
/* Lookup by one (unquoted, undotted) key; NULL when absent. */
const tr_toml_value_t* tr_toml_get(const tr_toml_value_t* table,
                                   const char* key);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_TOML_H */
