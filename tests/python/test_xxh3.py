"""The engine's own XXH3-64 (kernels/xxh3.hpp: CPU twin and CUDA kernel) against the `xxhash` package.

tests/data/xxh3_vectors.tsv holds "length<TAB>digest" lines written by the C++ twin
(tests/kernels/xxh3_test.cpp checks the twin and libxxhash against the same file; the GPU test
checks the kernel against the twin). Here the bytes are regenerated from the formula in the
file's header and hashed with `xxhash.xxh3_64_hexdigest`.
"""
import os
import sys

import xxhash

sys.path.insert(0, os.path.dirname(__file__))
import rlserve_testlib as t  # noqa: E402

MASK = (1 << 64) - 1


def vector_bytes(n):
    """n bytes: a 64-bit LCG started at n, one byte per step (its top 8 bits)."""
    out = bytearray(n)
    state = n
    for i in range(n):
        state = (state * 6364136223846793005 + 1442695040888963407) & MASK
        out[i] = state >> 56
    return bytes(out)


def main():
    root = os.environ.get("RLSERVE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
    path = os.path.join(root, "tests", "data", "xxh3_vectors.tsv")
    checked = 0
    lengths = set()
    with open(path) as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            length, digest = line.split()
            n = int(length)
            mine = xxhash.xxh3_64_hexdigest(vector_bytes(n))
            t.check(mine == digest, f"length {n}: rlserve {digest}, xxhash {mine}")
            lengths.add(n)
            checked += 1
    # Every length class of the algorithm is in the file: 0, 1-3, 4-8, 9-16, 17-128, 129-240, 241+.
    for lo, hi in ((0, 0), (1, 3), (4, 8), (9, 16), (17, 128), (129, 240), (241, 1 << 62)):
        t.check(any(lo <= n <= hi for n in lengths), f"no vector of length {lo}..{hi}")
    t.check(any(n > 8 * 1024 for n in lengths), "no vector of more than 8 blocks")
    print(f"ok: {checked} XXH3-64 vectors of the C++ twin match xxhash {xxhash.VERSION}")


if __name__ == "__main__":
    main()
