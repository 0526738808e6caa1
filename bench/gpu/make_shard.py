#!/usr/bin/env python3
"""bench/gpu/make_shard.py: write an llm.c token shard of uniformly random
tokens (numpy's PCG64 with a fixed seed), the data every program of
bench/gpu_train.sh trains on.

  make_shard.py --out FILE --tokens N --vocab V [--width 2|4] [--seed S]

Header: 256 little-endian int32, magic 20240520 version 1 (width 2, uint16
tokens) or magic 20240801 version 7 (width 4, uint32), then the token count;
the tokens follow. Prints the file's size and SHA-256.
"""
import argparse
import hashlib
import sys

import numpy as np


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--tokens", type=int, required=True)
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--width", type=int, choices=(2, 4), default=2)
    p.add_argument("--seed", type=int, default=1234)
    a = p.parse_args()
    if a.tokens < 1 or a.tokens > 2**31 - 1:
        p.error("--tokens must be in 1..2^31-1 (the header holds an int32)")
    if a.vocab < 2 or (a.width == 2 and a.vocab > 65536):
        p.error("--vocab must be in 2..65536 for --width 2")
    hdr = np.zeros(256, dtype="<i4")
    hdr[0], hdr[1] = (20240520, 1) if a.width == 2 else (20240801, 7)
    hdr[2] = a.tokens
    dtype = "<u2" if a.width == 2 else "<u4"
    rng = np.random.default_rng(a.seed)
    h = hashlib.sha256()
    with open(a.out, "wb") as f:
        b = hdr.tobytes()
        f.write(b)
        h.update(b)
        left, chunk = a.tokens, 1 << 24
        while left > 0:
            n = min(left, chunk)
            t = rng.integers(0, a.vocab, size=n, dtype=np.int64).astype(dtype)
            b = t.tobytes()
            f.write(b)
            h.update(b)
            left -= n
    size = 1024 + a.tokens * a.width
    print(f"{a.out}: {a.tokens} tokens < {a.vocab}, {size} bytes, "
          f"sha256 {h.hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
