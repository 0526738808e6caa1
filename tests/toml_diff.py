#!/usr/bin/env python3
"""tests/toml_diff.py: differential test of trainrun's TOML parser against
Python's tomllib.

Every document goes to tests/toml-decoder (the toml-test decoder interface:
one process per corpus document; the generated ones through a few
`toml-decoder --batch` processes, which decode the same way) and to tomllib.
Both must agree on valid/invalid, and on a valid document the decoded trees
must be equal: same keys in the same order, same types, same values (floats
by value, nan equal to nan, the sign of zero kept; date-times by their
fields, fractions truncated to tomllib's microseconds). A rejected document
must produce exactly one "line:col: message" line, with a position inside the
document. A crash or a sanitizer report fails the test.

Documents:
  * the corpus under tests/toml/valid and tests/toml/invalid (the TOML 1.0
    specification's examples and many small cases); a file's folder is its
    expected verdict, which both parsers must give;
  * documents from a seeded random generator (valid by construction:
    every string form, integer bases, floats, date-times, arrays, inline
    tables, dotted and quoted keys, tables, super-tables defined late,
    arrays of tables, comments, CRLF) and mutants of them (duplicated lines,
    redefined headers, broken numbers, dates, escapes and strings, bare CRs,
    control characters, invalid UTF-8, inserted or deleted bytes ...).

Where the two parsers differ by design, the oracle's verdict is adjusted,
never ours:
  * integers outside the signed 64-bit range: tomllib keeps Python ints,
    TOML 1.0 requires an error, so such documents count as invalid;
  * the year 0000 is a valid TOML date that Python's datetime cannot hold;
  * a byte order mark starts a file, not a document: it is removed before
    tomllib sees the text.

Prints "toml-diff: N passed, M failed" and exits 1 on any disagreement, 77
(skipped) without Python 3.11's tomllib. Environment: top_srcdir and
top_builddir locate the corpus and the decoder (make check sets both).
"""

import argparse
import calendar
import concurrent.futures
import datetime
import json
import math
import os
import random
import re
import subprocess
import sys

try:
    import tomllib
except ImportError:  # Python < 3.11
    print("toml-diff: skipped, Python's tomllib is missing (needs 3.11+)")
    sys.exit(77)

INT_MIN, INT_MAX = -(2**63), 2**63 - 1


class OutOfRange(Exception):
    pass


# ---- the canonical form both sides are converted to ----


def canon_oracle(v):
    """tomllib's tree as nested dicts/lists of (type, value) tuples."""
    if isinstance(v, dict):
        return {k: canon_oracle(x) for k, x in v.items()}
    if isinstance(v, list):
        return [canon_oracle(x) for x in v]
    if isinstance(v, bool):
        return ("bool", v)
    if isinstance(v, int):
        if not INT_MIN <= v <= INT_MAX:
            raise OutOfRange(v)
        return ("integer", v)
    if isinstance(v, float):
        return ("float", v)
    if isinstance(v, str):
        return ("string", v)
    if isinstance(v, datetime.datetime):
        fields = (v.year, v.month, v.day, v.hour, v.minute, v.second,
                  v.microsecond)
        if v.tzinfo is None:
            return ("datetime-local", fields)
        off = v.utcoffset()
        return ("datetime", fields + (int(off.total_seconds()) // 60,))
    if isinstance(v, datetime.date):
        return ("date-local", (v.year, v.month, v.day))
    if isinstance(v, datetime.time):
        return ("time-local", (v.hour, v.minute, v.second, v.microsecond))
    raise TypeError(type(v))


DT_RE = re.compile(
    r"^(?:(\d{4})-(\d{2})-(\d{2}))?(?:T?(\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?)?"
    r"(Z|[+-]\d{2}:\d{2})?$")


def micro(frac):
    return int(frac[:6].ljust(6, "0")) if frac else 0


def canon_ours(v):
    """The decoder's tagged JSON in the same canonical form."""
    if isinstance(v, list):
        return [canon_ours(x) for x in v]
    if (isinstance(v, dict) and set(v) == {"type", "value"}
            and isinstance(v["type"], str) and isinstance(v["value"], str)):
        t, s = v["type"], v["value"]
        if t == "string":
            return (t, s)
        if t == "integer":
            return (t, int(s))
        if t == "float":
            return (t, float(s))
        if t == "bool":
            if s not in ("true", "false"):
                raise ValueError("bool value %r" % s)
            return (t, s == "true")
        m = DT_RE.match(s)
        if not m:
            raise ValueError("%s value %r" % (t, s))
        y, mo, d, h, mi, sec, frac, off = m.groups()
        if t == "date-local" and y and not h and not off:
            return (t, (int(y), int(mo), int(d)))
        if t == "time-local" and h and not y and not off:
            return (t, (int(h), int(mi), int(sec), micro(frac)))
        if t in ("datetime-local", "datetime") and y and h:
            fields = (int(y), int(mo), int(d), int(h), int(mi), int(sec),
                      micro(frac))
            if t == "datetime-local" and not off:
                return (t, fields)
            if t == "datetime" and off:
                minutes = 0 if off == "Z" else (
                    (1 if off[0] == "+" else -1) *
                    (int(off[1:3]) * 60 + int(off[4:6])))
                return (t, fields + (minutes,))
        raise ValueError("%s value %r" % (t, s))
    if isinstance(v, dict):
        return {k: canon_ours(x) for k, x in v.items()}
    raise ValueError("untagged JSON value %r" % (v,))


def diff(a, b, path="$"):
    """None when equal, else where and how they differ."""
    if isinstance(a, dict) or isinstance(b, dict):
        if not (isinstance(a, dict) and isinstance(b, dict)):
            return "%s: table vs %r" % (path, b if isinstance(a, dict) else a)
        if list(a) != list(b):
            return "%s: keys %r vs %r" % (path, list(a), list(b))
        for k in a:
            d = diff(a[k], b[k], "%s.%s" % (path, json.dumps(k)))
            if d:
                return d
        return None
    if isinstance(a, list) or isinstance(b, list):
        if not (isinstance(a, list) and isinstance(b, list)):
            return "%s: array vs scalar" % path
        if len(a) != len(b):
            return "%s: %d vs %d items" % (path, len(a), len(b))
        for i, (x, y) in enumerate(zip(a, b)):
            d = diff(x, y, "%s[%d]" % (path, i))
            if d:
                return d
        return None
    if a[0] != b[0]:
        return "%s: type %s vs %s" % (path, a[0], b[0])
    if a[0] == "float":
        x, y = a[1], b[1]
        if math.isnan(x) and math.isnan(y):
            return None
        if x == y and math.copysign(1, x) == math.copysign(1, y):
            return None
        return "%s: float %r vs %r" % (path, x, y)
    if a[1] != b[1]:
        return "%s: %r vs %r" % (path, a[1], b[1])
    return None


def has_year0(v):
    if isinstance(v, dict):
        if set(v) == {"type", "value"} and isinstance(v["type"], str):
            return v["type"] in ("datetime", "datetime-local",
                                 "date-local") and v["value"].startswith("0000-")
        return any(has_year0(x) for x in v.values())
    if isinstance(v, list):
        return any(has_year0(x) for x in v)
    return False


# ---- running both parsers ----


def oracle(data):
    """(canonical tree, None) or (None, why invalid)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, "not UTF-8: %s" % e
    if text.startswith("\ufeff"):
        text = text[1:]
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        return None, "tomllib: %s" % e
    except RecursionError:
        return None, "tomllib: nested too deep"
    try:
        return canon_oracle(doc), None
    except OutOfRange as e:
        return None, "integer %d outside 64 bits" % e.args[0]


ERR_LINE = re.compile(rb"^(\d+):(\d+): [^\n]+\n$")


def run_decoder(decoder, data):
    """One document, one process: (exit status, stdout, stderr)."""
    p = subprocess.run([decoder], input=data, capture_output=True,
                       timeout=60)
    return p.returncode, p.stdout, p.stderr


def run_batch(decoder, datas):
    """Many documents through one `toml-decoder --batch`, as run_decoder's
    triples; None when the batch process fails (crash, sanitizer report)."""
    inp = b"".join(b"%d\n" % len(d) + d for d in datas)
    p = subprocess.run([decoder, "--batch"], input=inp, capture_output=True,
                       timeout=600)
    if p.returncode != 0 or p.stderr:
        return None, p.stderr.decode("utf-8", "replace")[-2000:]
    out, pos, results = p.stdout, 0, []
    try:
        for _ in datas:
            nl = out.index(b"\n", pos)
            status, n = map(int, out[pos:nl].split())
            body = out[nl + 1:nl + 1 + n]
            pos = nl + 1 + n
            results.append((0, body, b"") if status == 0 else (1, b"", body))
    except ValueError:
        return None, "malformed batch output"
    if pos != len(out):
        return None, "malformed batch output"
    return results, None


def check(name, data, expect, result):
    """None when both parsers agree (and match `expect`), else a reason."""
    rc, out, err = result
    want, why = oracle(data)
    if rc == 0:
        if err:
            return "decoder accepted but wrote to stderr: %r" % err[:500]
        try:
            raw = json.loads(out)
            ours = canon_ours(raw)
        except ValueError as e:
            return "decoder printed bad JSON (%s): %r" % (e, out[:300])
        if want is None:
            if "Invalid date or datetime" in (why or "") and has_year0(raw):
                return None  # year 0000: valid TOML, beyond Python's datetime
            return "decoder accepted, oracle rejected (%s)" % why
        if expect == "invalid":
            return "both accepted a document of invalid/"
        d = diff(ours, want)
        return "values differ at %s" % d if d else None
    if rc != 1:
        return "decoder exited %d: %r" % (rc, err[-500:])
    m = ERR_LINE.match(err)
    if not m:
        return "decoder's error is not one 'line:col: message' line: %r" % (
            err[-500:])
    line, col = int(m.group(1)), int(m.group(2))
    if not 1 <= line <= data.count(b"\n") + 1 or col < 1:
        return "error position %d:%d outside the document" % (line, col)
    if want is not None:
        return "decoder rejected (%s), oracle accepted" % err.decode(
            "utf-8", "replace").strip()
    if expect == "valid":
        return "both rejected a document of valid/ (%s; %s)" % (
            err.decode("utf-8", "replace").strip(), why)
    return None


# ---- the random generator ----

NEWLINES = ["\n"] * 6 + ["\r\n"] * 2 + ["mixed"]
BARE = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"
TEXT_CHARS = (list("abcdefghijklmnopqrstuvwxyz ABCXYZ0123456789.,;:!?=[]{}#$%&*+-/<>@^_`|~'\"\\\t") +
              ["é", "ü", "ß", "✓", "日", "本", "𝄞", "😀", "\u2028", "\u00a0",
               "\ufeff", "\x00", "\x01", "\x08", "\x0c", "\x1b", "\x1f",
               "\x7f", "\n", "\r"])


class Gen:
    def __init__(self, rng):
        self.r = rng
        self.counter = 0
        self.nl = "\n"

    def fresh(self):
        self.counter += 1
        return self.counter

    def newline(self):
        if self.nl == "mixed":
            return self.r.choice(["\n", "\r\n"])
        return self.nl

    def ws(self):
        return self.r.choice(["", "", "", " ", " ", "  ", "\t", " \t "])

    def comment(self):
        r = self.r
        body = "".join(r.choice("abc xyz#\t'\"\\=[]é✓𝄞") for _ in range(r.randint(0, 12)))
        return "#" + body

    # strings

    def text(self, n):
        return "".join(self.r.choice(TEXT_CHARS) for _ in range(n))

    def basic(self, s):
        r = self.r
        out = []
        for ch in s:
            c = ord(ch)
            if ch == '"' or ch == "\\":
                out.append("\\" + ch)
            elif ch in "\b\t\n\f\r" and r.random() < 0.7:
                out.append({"\b": "\\b", "\t": "\\t", "\n": "\\n",
                            "\f": "\\f", "\r": "\\r"}[ch])
            elif (c < 0x20 and ch != "\t") or c == 0x7f:
                out.append("\\u%04X" % c if r.random() < 0.7 else "\\U%08x" % c)
            elif c > 0x7f and r.random() < 0.3:
                out.append("\\u%04x" % c if c <= 0xFFFF else "\\U%08X" % c)
            else:
                out.append(ch)
        return '"' + "".join(out) + '"'

    def literal_ok(self, s, multiline):
        for ch in s:
            c = ord(ch)
            if ch == "'" and not multiline:
                return False
            if ch == "\n" and multiline:
                continue
            if (c < 0x20 and ch != "\t") or c == 0x7f:
                return False
        return "'''" not in s and not s.endswith("'''")

    def ml_basic(self, s):
        r = self.r
        out = ['"""']
        if r.random() < 0.5:
            out.append(self.newline())
        quotes = 0
        for ch in s:
            c = ord(ch)
            if ch == '"':
                if quotes == 2 or r.random() < 0.3:
                    out.append('\\"')
                    quotes = 0
                else:
                    out.append('"')
                    quotes += 1
                continue
            quotes = 0
            if ch == "\\":
                out.append("\\\\")
            elif ch == "\n":
                out.append(self.newline())
                if r.random() < 0.2:  # a line-ending backslash
                    out.append("\\" + self.ws() + self.newline() + self.ws())
            elif ch == "\r":
                out.append("\\r")
            elif (c < 0x20 and ch != "\t") or c == 0x7f:
                out.append("\\u%04x" % c)
            else:
                out.append(ch)
        out.append('"""')
        return "".join(out)

    def ml_literal(self, s):
        body = s.replace("\n", self.newline())
        lead = self.newline() if self.r.random() < 0.5 else ""
        return "'''" + lead + body + "'''"

    def string(self, allow_ml=True):
        r = self.r
        s = self.text(r.randint(0, 14))
        form = r.choice(["basic", "basic", "literal", "ml_basic", "ml_literal"]
                        if allow_ml else ["basic", "basic", "literal"])
        if form == "literal":
            s2 = s.replace("\n", "").replace("\r", "")
            if self.literal_ok(s2, False):
                return "'" + s2 + "'"
            return self.basic(s)
        if form == "ml_basic":
            return self.ml_basic(s.replace("\r", ""))
        if form == "ml_literal":
            s2 = s.replace("\r", "")
            while "''" in s2 and r.random() < 0.5:
                s2 = s2.replace("''", "'", 1)
            if self.literal_ok(s2, True) and not s2.startswith("\n"):
                return self.ml_literal(s2)
            return self.ml_basic(s2)
        return self.basic(s)

    # numbers and dates

    def digits_us(self, digits):
        r = self.r
        if len(digits) < 2 or r.random() < 0.6:
            return digits
        out = [digits[0]]
        for ch in digits[1:]:
            if r.random() < 0.25:
                out.append("_")
            out.append(ch)
        return "".join(out)

    def integer(self):
        r = self.r
        k = r.random()
        if k < 0.15:
            n = r.choice([INT_MAX, INT_MIN, INT_MAX - 1, INT_MIN + 1, 0, -1, 1])
        elif k < 0.5:
            n = r.randint(-1000, 1000)
        else:
            n = r.randint(INT_MIN, INT_MAX) >> r.randint(0, 62)
        form = r.random()
        if n >= 0 and form < 0.15:
            h = "%x" % n
            if r.random() < 0.5:
                h = h.upper()
            return "0x" + self.digits_us(h)
        if n >= 0 and form < 0.25:
            return "0o" + self.digits_us("%o" % n)
        if n >= 0 and form < 0.32:
            return "0b" + self.digits_us("%s" % bin(n)[2:])
        sign = "-" if n < 0 else ("+" if r.random() < 0.2 else "")
        return sign + self.digits_us(str(abs(n)))

    def float_(self):
        r = self.r
        k = r.random()
        if k < 0.1:
            return r.choice(["", "+", "-"]) + r.choice(["inf", "nan"])
        if k < 0.35:
            s = repr(r.choice([0.1, 1 / 3, 2.5e-308, 1.7976931348623157e308,
                               5e-324, -0.0, 123456.789, 1e22, 1e-7,
                               r.uniform(-1e6, 1e6),
                               r.uniform(-1, 1) * 10 ** r.randint(-300, 300)]))
            if s in ("inf", "-inf", "nan"):
                s = "1.5"
            return s
        ip = str(r.randint(0, 10 ** r.randint(0, 12)))
        s = r.choice(["", "-", "+"]) + self.digits_us(ip)
        if r.random() < 0.7:
            s += "." + self.digits_us("".join(r.choice("0123456789")
                                             for _ in range(r.randint(1, 20))))
            if r.random() < 0.4:
                s += r.choice("eE") + r.choice(["", "+", "-"]) + self.digits_us(
                    str(r.randint(0, 400)).zfill(r.randint(1, 4)))
        else:
            s += r.choice("eE") + r.choice(["", "+", "-"]) + self.digits_us(
                str(r.randint(0, 400)).zfill(r.randint(1, 3)))
        return s

    def date(self):
        r = self.r
        y = r.choice([r.randint(1, 9999), 2000, 1900, 2024, 2023, 1, 9999])
        m = r.randint(1, 12)
        d = r.randint(1, calendar.monthrange(y, m)[1])
        if m == 2 and r.random() < 0.3 and calendar.isleap(y):
            d = 29
        return "%04d-%02d-%02d" % (y, m, d)

    def time(self):
        r = self.r
        s = "%02d:%02d:%02d" % (r.randint(0, 23), r.randint(0, 59),
                                r.randint(0, 59))
        if r.random() < 0.4:
            s += "." + "".join(r.choice("0123456789")
                               for _ in range(r.randint(1, 12)))
        return s

    def datetime_(self):
        r = self.r
        k = r.random()
        if k < 0.2:
            return self.date()
        if k < 0.35:
            return self.time()
        s = self.date() + r.choice(["T", "T", "t", " "]) + self.time()
        if k < 0.6:
            return s
        if r.random() < 0.4:
            return s + r.choice(["Z", "z"])
        return s + "%s%02d:%02d" % (r.choice("+-"), r.randint(0, 23),
                                    r.randint(0, 59))

    # containers

    def array(self, depth):
        r = self.r
        n = r.randint(0, 5)
        ml = r.random() < 0.4
        parts = ["["]
        for i in range(n):
            if ml:
                parts.append(self.ws())
                if r.random() < 0.3:
                    parts.append(self.comment())
                parts.append(self.newline() + self.ws())
            else:
                parts.append(self.ws())
            parts.append(self.value(depth + 1))
            parts.append(self.ws())
            if i < n - 1 or r.random() < 0.3:
                parts.append(",")
        if ml:
            parts.append(self.newline())
        parts.append(self.ws() + "]")
        return "".join(parts)

    def inline(self, depth):
        r = self.r
        n = r.randint(0, 4)
        items = []
        prefix = None
        for _ in range(n):
            key = [self.key()]
            if r.random() < 0.3:
                if prefix is None or r.random() < 0.5:
                    prefix = self.key()
                key = [prefix] + key
            items.append(self.dotted(key) + self.ws() + "=" + self.ws() +
                         self.value(depth + 1))
        sep = "," + self.ws()
        return "{" + self.ws() + sep.join(items) + self.ws() + "}"

    def value(self, depth=0):
        r = self.r
        kinds = ["int", "float", "bool", "string", "string", "date"]
        if depth < 4:
            kinds += ["array", "inline"]
        k = r.choice(kinds)
        if k == "int":
            return self.integer()
        if k == "float":
            return self.float_()
        if k == "bool":
            return r.choice(["true", "false"])
        if k == "string":
            return self.string()
        if k == "date":
            return self.datetime_()
        if k == "array":
            return self.array(depth)
        return self.inline(depth)

    # keys and the document

    def key(self):
        r = self.r
        base = "".join(r.choice(BARE) for _ in range(r.randint(0, 5))) + str(
            self.fresh())
        k = r.random()
        if k < 0.65:
            return base
        s = self.text(r.randint(0, 4)).replace("\n", "").replace("\r", "")
        if k < 0.85 or not self.literal_ok(s + base, False):
            return self.basic(s + base)
        return "'" + s + base + "'"

    def dotted(self, parts):
        return "".join((p if i == 0 else self.r.choice([".", " . ", ".", "\t.\t"]) + p)
                       for i, p in enumerate(parts))

    def keyvals(self, out, n):
        r = self.r
        prefix = None
        for _ in range(n):
            key = [self.key()]
            if r.random() < 0.3:
                if prefix is None or r.random() < 0.4:
                    prefix = [self.key() for _ in range(r.randint(1, 2))]
                key = prefix + key
            line = self.ws() + self.dotted(key) + self.ws() + "=" + self.ws() + \
                self.value() + self.ws()
            if r.random() < 0.2:
                line += self.comment()
            out.append(line)
            if r.random() < 0.15:
                out.append(self.ws() + (self.comment() if r.random() < 0.5 else ""))

    def header(self, parts, aot):
        inner = self.ws() + self.dotted(parts) + self.ws()
        line = ("[[" + inner + "]]") if aot else ("[" + inner + "]")
        line = self.ws() + line + self.ws()
        if self.r.random() < 0.2:
            line += self.comment()
        return line

    def document(self):
        r = self.r
        self.nl = r.choice(NEWLINES)
        out = []
        if r.random() < 0.3:
            out.append(self.comment())
        self.keyvals(out, r.randint(0, 5))
        tables = []      # header-defined table paths
        implicit = []    # paths created only as header prefixes
        aots = []        # array-of-tables paths
        for _ in range(r.randint(0, 6)):
            k = r.random()
            if k < 0.25 or not (tables or aots):
                path = [self.key() for _ in range(r.randint(1, 3))]
                for i in range(1, len(path)):
                    implicit.append(path[:i])
                tables.append(path)
                out.append(self.header(path, False))
            elif k < 0.4 and tables:
                path = r.choice(tables) + [self.key()]
                tables.append(path)
                out.append(self.header(path, False))
            elif k < 0.5 and implicit:
                path = implicit.pop(r.randrange(len(implicit)))
                if path in tables:
                    continue
                tables.append(path)
                out.append(self.header(path, False))
            elif k < 0.7:
                path = r.choice(aots) if aots and r.random() < 0.5 else \
                    [self.key() for _ in range(r.randint(1, 2))]
                if path not in aots:
                    aots.append(path)
                out.append(self.header(path, True))
            elif aots:
                parent = r.choice(aots)
                path = parent + [self.key()]
                if r.random() < 0.5:
                    aots.append(path)
                    out.append(self.header(path, True))
                else:
                    out.append(self.header(path, False))
            else:
                continue
            self.keyvals(out, r.randint(0, 4))
            if r.random() < 0.3:
                out.append("")
        text = ""
        for line in out:
            text += line + self.newline()
        if r.random() < 0.15:
            text = text.rstrip("\r\n")
        return text.encode("utf-8")


BAD_NUMBERS = [b"01", b"-01", b"0_1", b"1__0", b"1_", b"_1", b"+0x1", b"0X1",
               b"0x", b"0x_1", b"0o8", b"0b2", b"1.", b".1", b"1.e1", b"1e",
               b"1e_1", b"1_.5", b"9223372036854775808",
               b"-9223372036854775809", b"0x8000000000000000",
               b"0xffffffffffffffff", b"1e1.5", b"Inf", b"NaN", b"+-1",
               b"infinity", b"nan1", b"00.5", b"1__0.0", b"0.0_"]
BAD_DATES = [b"2021-02-29", b"2021-02-30", b"1900-02-29", b"2021-04-31",
             b"2021-13-01", b"2021-00-10", b"2021-01-00", b"2021-01-32",
             b"24:00:00", b"12:60:00", b"12:00:60", b"07:32", b"07:32:00Z",
             b"1979-05-27T07:32", b"1979-05-27T07:32:00+24:00",
             b"1979-05-27T07:32:00+07", b"1979-05-27T", b"979-05-27",
             b"1979-5-27", b"1979-05-27T07:32:00.", b"1979-05-27T07:32:00Zx",
             b"1979-05-27 07:32"]
BAD_ESCAPES = [b"\\q", b"\\x41", b"\\ ", b"\\e", b"\\u12", b"\\uD800",
               b"\\uDFFF", b"\\U00110000", b"\\u12G4", b"\\U0001F60"]
NASTY = [b'"', b"'", b"=", b"[", b"]", b"{", b"}", b",", b".", b"#", b"\\",
         b" ", b"\t", b"\n", b"\r", b"\r\n", b"0", b"_", b"x", b"e", b"+",
         b"-", b":", b"T", b"Z", b"\x00", b"\x01", b"\x7f", b"\xff",
         b"\xc3", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
         "é".encode(), b'"""', b"'''", b"[[", b"]]"]
NUMBER_RE = re.compile(rb"(?<=[=\[, ])[+-]?[0-9][0-9A-Za-z_.+:-]*")
DATE_RE = re.compile(rb"\d{4}-\d{2}-\d{2}(?:[Tt ]\d{2}:\d{2}:\d{2}(?:\.\d+)?"
                     rb"(?:[Zz]|[+-]\d{2}:\d{2})?)?|\d{2}:\d{2}:\d{2}(?:\.\d+)?")
ESCAPE_RE = re.compile(rb'\\(?:[btnfr"\\]|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8})')
KEYLINE_RE = re.compile(rb"^[ \t]*([A-Za-z0-9_-]+(?:[ \t]*\.[ \t]*[A-Za-z0-9_-]+)*)[ \t]*=",
                        re.M)
HEADER_RE = re.compile(rb"^[ \t]*\[[^\n]*$", re.M)


def mutate(doc, r):
    ops = ["dup_line", "del", "ins", "rep", "swap", "truncate", "number",
           "date", "escape", "cr", "inline_comma", "redefine", "extend",
           "utf8", "nasty_line"]
    for _ in range(r.choice([1, 1, 1, 2])):
        op = r.choice(ops)
        lines = doc.split(b"\n")
        if op == "dup_line" and len(lines) > 1:
            i = r.randrange(len(lines))
            lines.insert(r.randint(i + 1, len(lines)), lines[i])
            doc = b"\n".join(lines)
        elif op == "swap" and len(lines) > 1:
            i, j = r.randrange(len(lines)), r.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
            doc = b"\n".join(lines)
        elif op == "del" and doc:
            i = r.randrange(len(doc))
            doc = doc[:i] + doc[i + r.randint(1, 3):]
        elif op == "ins":
            i = r.randint(0, len(doc))
            doc = doc[:i] + r.choice(NASTY) + doc[i:]
        elif op == "rep" and doc:
            i = r.randrange(len(doc))
            doc = doc[:i] + r.choice(NASTY) + doc[i + 1:]
        elif op == "truncate" and doc:
            doc = doc[:r.randrange(len(doc))]
        elif op == "number":
            ms = list(NUMBER_RE.finditer(doc))
            if ms:
                m = r.choice(ms)
                doc = doc[:m.start()] + r.choice(BAD_NUMBERS) + doc[m.end():]
        elif op == "date":
            ms = list(DATE_RE.finditer(doc))
            if ms:
                m = r.choice(ms)
                doc = doc[:m.start()] + r.choice(BAD_DATES) + doc[m.end():]
        elif op == "escape":
            ms = list(ESCAPE_RE.finditer(doc))
            if ms:
                m = r.choice(ms)
                doc = doc[:m.start()] + r.choice(BAD_ESCAPES) + doc[m.end():]
        elif op == "cr":
            idx = [i for i, c in enumerate(doc) if c == 0x0a]
            if idx:
                i = r.choice(idx)
                doc = doc[:i] + b"\r" + doc[i + 1:]
        elif op == "inline_comma":
            idx = [i for i, c in enumerate(doc) if c == 0x7d]
            if idx:
                i = r.choice(idx)
                doc = doc[:i] + r.choice([b",}", b",\n}", b"\n}"]) + doc[i + 1:]
        elif op == "redefine":
            hs = HEADER_RE.findall(doc)
            if hs:
                doc = doc + b"\n" + r.choice(hs).strip(b"\r") + b"\n"
        elif op == "extend":
            ms = list(KEYLINE_RE.finditer(doc))
            if ms:
                m = r.choice(ms)
                key = m.group(1)
                end = doc.find(b"\n", m.end())
                end = len(doc) if end < 0 else end
                extra = b"\n" + key + r.choice([b".x", b""]) + b" = 1"
                doc = doc[:end] + extra + doc[end:]
        elif op == "utf8":
            i = r.randint(0, len(doc))
            doc = doc[:i] + r.choice([b"\xff", b"\xc3", b"\xed\xa0\x80",
                                      b"\xc0\xaf", b"\xf8\x88\x80\x80\x80",
                                      b"\xe2\x82"]) + doc[i:]
        elif op == "nasty_line":
            i = r.randint(0, len(lines))
            lines.insert(i, r.choice([b"a = 1", b"[x]", b"[[x]]", b"x.y = 2",
                                      b"= 1", b"[]", b"a = {", b"a = [",
                                      b'a = """', b"'k' = 'v'", b"a.b.c = {}"]))
            doc = b"\n".join(lines)
    return doc


# ---- main ----


def corpus(root):
    docs = []
    for verdict in ("valid", "invalid"):
        d = os.path.join(root, verdict)
        for name in sorted(os.listdir(d)):
            if name.endswith(".toml"):
                with open(os.path.join(d, name), "rb") as f:
                    docs.append(("%s/%s" % (verdict, name), f.read(), verdict))
    return docs


def generated(seed, count):
    r = random.Random(seed)
    g = Gen(r)
    docs = []
    n_valid = count * 2 // 5
    valid = []
    for i in range(n_valid):
        doc = g.document()
        valid.append(doc)
        docs.append(("gen-%d" % i, doc, None))
    for i in range(count - n_valid):
        docs.append(("mut-%d" % i, mutate(r.choice(valid), r), None))
    return docs


def main():
    srcdir = os.environ.get("top_srcdir", os.path.join(os.path.dirname(__file__), ".."))
    builddir = os.environ.get("top_builddir", ".")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--decoder", default=os.path.join(builddir, "tests", "toml-decoder"))
    ap.add_argument("--corpus", default=os.path.join(srcdir, "tests", "toml"))
    ap.add_argument("--seed", type=int, default=20240520)
    ap.add_argument("--count", type=int, default=4000,
                    help="generated documents (default 4000)")
    ap.add_argument("--keep", metavar="DIR",
                    help="write each failing document to DIR")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    if not os.access(args.decoder, os.X_OK):
        print("toml-diff: no decoder at %s" % args.decoder, file=sys.stderr)
        return 1

    # The corpus goes through the decoder's real interface, one process per
    # document; the generated documents in a few --batch processes.
    fixed = corpus(args.corpus)
    gen = generated(args.seed, args.count)
    docs = fixed + gen
    workers = max(1, min(8, os.cpu_count() or 1))
    chunks = [gen[i::workers] for i in range(workers)]
    passed = failed = 0
    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
        singles = ex.map(lambda d: run_decoder(args.decoder, d[1]), fixed)
        batches = list(ex.map(
            lambda c: run_batch(args.decoder, [d[1] for d in c]), chunks))
        results = list(singles)
        gen_results = [None] * len(gen)
        for w, (res, err) in enumerate(batches):
            idx = list(range(w, len(gen), workers))
            if res is None:  # find the culprit one document at a time
                failed += 1
                print("FAIL batch %d: %s" % (w, err))
                res = list(ex.map(lambda i: run_decoder(args.decoder, gen[i][1]),
                                  idx))
            for i, r in zip(idx, res):
                gen_results[i] = r
        results += gen_results

    counts = {"valid": 0, "invalid": 0}
    for (name, data, expect), result in zip(docs, results):
        why = check(name, data, expect, result)
        if why is None:
            passed += 1
            counts["valid" if result[0] == 0 else "invalid"] += 1
            if args.verbose:
                print("ok   %s" % name)
            continue
        failed += 1
        if failed <= 25:
            print("FAIL %s: %s" % (name, why))
            print("     document: %r" % data[:400])
        if args.keep:
            os.makedirs(args.keep, exist_ok=True)
            with open(os.path.join(args.keep, name.replace("/", "_")), "wb") as f:
                f.write(data)
    print("toml-diff: %d documents (%d corpus, %d generated, seed %d): "
          "%d agreed valid, %d agreed invalid" %
          (len(docs), len(docs) - args.count, args.count, args.seed,
           counts["valid"], counts["invalid"]))
    print("toml-diff: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
