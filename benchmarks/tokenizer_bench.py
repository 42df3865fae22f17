#!/usr/bin/env python3
"""Encode throughput of rlserve's tokenizer beside the `tokenizers` package, on the same
generated corpus and the same trained 32,000-id byte-level BPE as the parity test
(tests/python/tokenizer_corpus.py), for each pre-tokenizer family.

  python3 benchmarks/tokenizer_bench.py --rlserve build/apps/rlserve [--strings 20000]

rlserve: `rlserve tokenize --time-repeats`, one thread, reading the file not counted.
tokenizers: `Tokenizer.encode` in a loop (one thread) and `encode_batch` (all cores, as a trainer
calls it). Prints one table in MB/s of UTF-8 input."""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import tokenizer_corpus as tc  # noqa: E402

from tokenizers import Tokenizer  # noqa: E402


def best_of(fn, repeats):
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlserve", required=True)
    ap.add_argument("--strings", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--families", default=",".join(tc.FAMILIES))
    args = ap.parse_args()

    base = tc.train_bpe()
    strings = tc.corpus(seed=99, count=args.strings)
    mb = sum(len(s.encode()) for s in strings) / 1e6
    rows = []
    with tempfile.TemporaryDirectory() as d:
        inputs = os.path.join(d, "corpus.jsonl")
        with open(inputs, "w", encoding="utf-8") as f:
            for s in strings:
                f.write(json.dumps(s) + "\n")
        for name in args.families.split(","):
            path = os.path.join(d, f"{name}.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(tc.family(base, name), f, ensure_ascii=False)
            out = subprocess.run([args.rlserve, "tokenize", "--tokenizer", path, "--text-file", inputs,
                                  "--json-lines", "--time-repeats", str(args.repeats)],
                                 check=True, capture_output=True, text=True).stdout
            ours = json.loads(out)["mb_per_s"]
            ref = Tokenizer.from_file(path)
            one = best_of(lambda: [ref.encode(s, add_special_tokens=False) for s in strings], args.repeats)
            batch = best_of(lambda: ref.encode_batch(strings, add_special_tokens=False), args.repeats)
            rows.append((name, ours, mb / one, mb / batch))
    print(f"{args.strings} strings, {mb:.2f} MB, {os.cpu_count()} cores")
    print("| family | rlserve (1 thread) | tokenizers encode (1 thread) | tokenizers encode_batch (all cores) |")
    print("|---|---|---|---|")
    for name, ours, one, batch in rows:
        print(f"| {name} | {ours:.1f} MB/s | {one:.1f} MB/s | {batch:.1f} MB/s |")


if __name__ == "__main__":
    main()
