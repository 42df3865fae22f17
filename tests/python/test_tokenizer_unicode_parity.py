"""rlserve's tokenizer gives the ids of the `tokenizers` package on a realistic vocabulary, for
every code point and every pre-tokenizer family rlserve serves, whatever the host's libraries.

A byte-level BPE of 32,000 ids is trained here by `tokenizers` on generated text
(tokenizer_corpus.py), then put behind the pre-tokenizers of Qwen3, Qwen3.5, GLM-4/GLM-4.5
(Llama 3's pattern), DeepSeek-V3 (three Splits), o200k-style cased words and GPT-2. For each:
  - a generated corpus (English, code, CJK, emoji, numbers, whitespace runs, CRLF, decomposed
    characters, Unicode 15/16 letters) must encode to identical ids;
  - every code point (all 17 planes but the surrogates) in letter, space, digit, punctuation,
    apostrophe, newline and combining-mark contexts must encode to identical ids. A mismatching
    line is narrowed down to the code points that differ, so a failure names them.
Options: --strings N (corpus size per family), --families a,b, --sample K (every K-th code
point only, for a quick look by hand). The plain build sweeps every code point; under the
sanitizers (make test-asan) the same engine runs a sample, as it is 5-10x slower there.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rlserve_testlib import check, run, temp_dir  # noqa: E402
import tokenizer_corpus as tc  # noqa: E402

from tokenizers import Tokenizer  # noqa: E402

CODE_POINTS_PER_LINE = 256


def segment(c, nfc=False):
    """`c` after and before a letter, after a space and two spaces, between digits and punctuation,
    after an apostrophe, before a newline; for NFC families also before a combining mark."""
    return f"a{c}b {c}  {c}1{c}.{c}'{c}\n" + (f"{c}\u0301" if nfc else "")


def code_point_lines(sample, nfc):
    cps = [c for c in range(0, 0x110000, sample) if not 0xD800 <= c <= 0xDFFF]
    lines = []
    for i in range(0, len(cps), CODE_POINTS_PER_LINE):
        chunk = cps[i:i + CODE_POINTS_PER_LINE]
        lines.append((chunk, "".join(segment(chr(c), nfc) for c in chunk)))
    return lines


def rlserve_encode(path, strings, workdir):
    inputs = os.path.join(workdir, "inputs.jsonl")
    with open(inputs, "w", encoding="utf-8") as f:
        for s in strings:
            f.write(json.dumps(s) + "\n")
    out = run("tokenize", "--tokenizer", path, "--text-file", inputs, "--json-lines").stdout
    lines = out.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    check(len(lines) == len(strings), f"{len(lines)} results for {len(strings)} strings")
    return [[int(x) for x in line.split(",")] if line else [] for line in lines]


def reference_encode(path, strings):
    ref = Tokenizer.from_file(path)
    return [e.ids for e in ref.encode_batch(strings, add_special_tokens=False)]


def compare_family(name, base, args, workdir):
    path = os.path.join(workdir, f"{name}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tc.family(base, name), f, ensure_ascii=False)
    failures = []

    strings = tc.corpus(seed=hash(name) % 1000 + 11, count=args.strings)
    got, want = rlserve_encode(path, strings, workdir), reference_encode(path, strings)
    for s, g, w in zip(strings, got, want):
        if g != w:
            failures.append(f"{name}: corpus string {s!r}: rlserve {g} tokenizers {w}")

    nfc = name in ("qwen3", "qwen35")
    lines = code_point_lines(args.sample, nfc)
    texts = [text for _, text in lines]
    got, want = rlserve_encode(path, texts, workdir), reference_encode(path, texts)
    bad = [chunk for (chunk, _), g, w in zip(lines, got, want) if g != w]
    if bad:
        # Narrow down to the code points whose own segment differs.
        cps = [c for chunk in bad for c in chunk]
        segs = [segment(chr(c), nfc) for c in cps]
        g2, w2 = rlserve_encode(path, segs, workdir), reference_encode(path, segs)
        named = [f"U+{c:04X}" for c, a, b in zip(cps, g2, w2) if a != b]
        failures.append(f"{name}: {len(bad)} code point lines differ; code points whose segment "
                        f"differs: {named[:40]}{' ...' if len(named) > 40 else ''}")
    return failures, len(strings), len(lines) * CODE_POINTS_PER_LINE


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strings", type=int, default=20000)
    ap.add_argument("--families", default=",".join(tc.FAMILIES))
    ap.add_argument("--sample", type=int, default=1)
    ap.add_argument("--vocab-size", type=int, default=32000)
    args = ap.parse_args()
    if os.environ.get("RLSERVE_SANITIZED") and args.sample == 1:
        args.sample, args.strings = 17, min(args.strings, 4000)

    t0 = time.time()
    base = tc.train_bpe(vocab_size=args.vocab_size)
    merges = len(base["model"]["merges"])
    check(merges > 20000, f"the trained BPE has {merges} merges; expected tens of thousands")
    print(f"trained a byte-level BPE: {len(base['model']['vocab'])} ids, {merges} merges "
          f"({time.time() - t0:.1f} s)")
    failures = []
    with temp_dir() as workdir:
        for name in args.families.split(","):
            t1 = time.time()
            f, n_strings, n_cps = compare_family(name, base, args, workdir)
            failures += f
            print(f"{name}: {n_strings} strings, {n_cps} code points: "
                  f"{'ok' if not f else 'DIFFERENT'} ({time.time() - t1:.1f} s)")
    for line in failures[:30]:
        print(line)
    check(not failures, f"{len(failures)} differences from tokenizers")
    print("tokenizer unicode parity: ok")


if __name__ == "__main__":
    main()
