#!/usr/bin/env python3
"""bench/gpu/make_shard.py: write an llm.c token shard of uniformly random
tokens (numpy's PCG64 with a fixed seed), the data every program of
bench/gpu_train.sh trains on.

  make_shard.py --out FILE --tokens N --vocab V [--width 2|4] [--seed S]
                [--eot ID --doc-len MEAN]

--eot ID --doc-len MEAN cut the stream into documents for block-causal
attention (bench/parallel_gpu.sh's flex run): an end-of-text token ID ends
each document (and belongs to it, as trainrun's block_causal and
torchtitan's get_document_mask_mod read it); document lengths are drawn
from a geometric distribution of mean MEAN (at least 1 token) by a second
PCG64 stream seeded with (S, 1), so the shard is reproducible and the
random tokens between the end-of-text tokens are the ones the same call
without --eot writes (the token at each document's end is replaced).
Without --eot the output is byte-identical to what it always was.

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
    p.add_argument("--eot", type=int, default=None,
                   help="end-of-text token ending each document")
    p.add_argument("--doc-len", type=float, default=None,
                   help="mean document length in tokens (with --eot)")
    a = p.parse_args()
    if a.tokens < 1 or a.tokens > 2**31 - 1:
        p.error("--tokens must be in 1..2^31-1 (the header holds an int32)")
    if a.vocab < 2 or (a.width == 2 and a.vocab > 65536):
        p.error("--vocab must be in 2..65536 for --width 2")
    if (a.eot is None) != (a.doc_len is None):
        p.error("--eot and --doc-len go together")
    if a.eot is not None and not 0 <= a.eot < a.vocab:
        p.error(f"--eot {a.eot} is not a token below --vocab {a.vocab}")
    if a.doc_len is not None and a.doc_len < 1:
        p.error("--doc-len must be at least 1")
    hdr = np.zeros(256, dtype="<i4")
    hdr[0], hdr[1] = (20240520, 1) if a.width == 2 else (20240801, 7)
    hdr[2] = a.tokens
    dtype = "<u2" if a.width == 2 else "<u4"
    rng = np.random.default_rng(a.seed)
    docs = None if a.eot is None else np.random.default_rng([a.seed, 1])
    eot_at, ndocs = -1, 0  # the next end-of-text position (absolute)
    if docs is not None:
        eot_at = int(docs.geometric(1.0 / a.doc_len)) - 1
    h = hashlib.sha256()
    with open(a.out, "wb") as f:
        b = hdr.tobytes()
        f.write(b)
        h.update(b)
        left, chunk, first = a.tokens, 1 << 24, 0
        while left > 0:
            n = min(left, chunk)
            t = rng.integers(0, a.vocab, size=n, dtype=np.int64).astype(dtype)
            while docs is not None and eot_at < first + n:
                t[eot_at - first] = a.eot
                ndocs += 1
                eot_at += int(docs.geometric(1.0 / a.doc_len))
            first += n
            b = t.tobytes()
            f.write(b)
            h.update(b)
            left -= n
    size = 1024 + a.tokens * a.width
    docs_note = ("" if docs is None else
                 f", {ndocs} documents ended by {a.eot} (mean length "
                 f"{a.tokens / max(ndocs, 1):.1f})")
    print(f"{a.out}: {a.tokens} tokens < {a.vocab}{docs_note}, {size} "
          f"bytes, sha256 {h.hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
