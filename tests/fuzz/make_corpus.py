#!/usr/bin/env python3
"""tests/fuzz/make_corpus.py: write the seed inputs of tests/fuzz/corpus/.

The input format is store_fuzz.c's: byte 0 picks the mode (bit 0: split
invariance on one connection; else three connections fed chunks, bit 1
validates new connections, bit 2 gives the table a token).
    python3 tests/fuzz/make_corpus.py tests/fuzz/corpus
"""
import os
import struct
import sys

MAGIC = struct.pack("<I", 0x3C85F7CE)


def key(k):
    k = k.encode() if isinstance(k, str) else k
    return struct.pack("<Q", len(k)) + k


def q(cmd, *f):
    return bytes([cmd]) + b"".join(f)


def keys(cmd, *ks):
    return q(cmd, struct.pack("<Q", len(ks)), *[key(k) for k in ks])


def chunks(conn, data):
    """Multi-mode chunks sending data to connection conn (0..2)."""
    out = b""
    while data:
        n = min(63, len(data))
        x = next(x for x in range(3) if (n * 4 + x) % 3 == conn)
        out += bytes([n * 4 + x]) + data[:n]
        data = data[n:]
    return out


session = b"".join([
    q(13, struct.pack("<I", 7)),
    q(1, key("/k"), key("v")),
    q(2, key("/k"), key("v"), key("w")),
    q(2, key("/c"), key(""), key("x")),
    q(3, key("/k")),
    q(4, key("/n"), struct.pack("<q", 3)),
    keys(5, "/k", "/n"),
    keys(6, "/k"),
    q(7),
    q(8, key("/k")),
    q(9, key("/a"), key("12")),
    keys(10, "/a", "/n", "/zz"),
    q(11, struct.pack("<Q", 2), key("/m"), key("1"), key("/o"), key("2")),
    q(12),
    q(14, key("/q"), key("item")),
    q(16, key("/q")),
    q(15, key("/q")),
    q(15, key("/q")),
])

seeds = {
    "split-session": b"\x01" + session,
    "split-wait-cancel": b"\x01" + keys(6, "/x", "/y") + q(12) + keys(6, "/x"),
    "split-limits": b"\x01" + q(3, struct.pack("<Q", 65)) + b"x" * 65,
    "split-count": b"\x01" + q(6, struct.pack("<Q", 17)),
    "split-add-text": b"\x01" + q(1, key("/t"), key(" -12x")) +
                      q(4, key("/t"), struct.pack("<q", 5)),
    "multi-wakeups": b"\x02" + chunks(0, keys(6, "/a", "/b")) +
                     chunks(1, keys(6, "/b")) +
                     chunks(2, q(1, key("/a"), key("1"))) +
                     chunks(2, q(14, key("/b"), key("i"))) +
                     chunks(2, q(14, key("/b"), key("j"))),
    "multi-session": b"\x02" + chunks(0, session) + chunks(1, session),
    "multi-validate": b"\x00" + chunks(0, b"\x00" + MAGIC + session) +
                      chunks(1, b"\x01" + MAGIC),
    "multi-close-waiter": b"\x02" + chunks(0, keys(6, "/w", "/v")) +
                          chunks(0, b"\x63") + chunks(1, q(1, key("/w"), key(""))),
    "multi-token": b"\x06" + chunks(0, q(0x80) + q(0x81) + b"\x00" * 64) +
                   chunks(1, q(13, b"abcd") + q(1, key("/k"), key("v"))),
    "multi-memory": b"\x02" + b"".join(
        chunks(i % 3, q(1, key("/m%d" % i), key(b"v" * 200))) for i in range(40)),
    "multi-queue": b"\x02" + chunks(0, keys(6, "/q")) + chunks(1, keys(6, "/q")) +
                   chunks(2, q(14, key("/q"), key("1"))) +
                   chunks(2, q(15, key("/q"))),
}

out = sys.argv[1] if len(sys.argv) > 1 else "corpus"
os.makedirs(out, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
print("%d seeds written to %s" % (len(seeds), out))
