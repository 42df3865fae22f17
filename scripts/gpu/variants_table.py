#!/usr/bin/env python3
"""One markdown table from decode_bench runs of the main runner and of variants (run_runner.sh's
`variants` mode): a row per (argument set, mode, batch), a column per binary with its step time,
its ratio to the first binary, and whether its tokens hashed the same.

    variants_table.py DIR

DIR holds `sets.txt` (line k: the decode_bench arguments of set k) and `S.NAME.R.json` files:
decode_bench --json output of set S by binary NAME, repeat R. A speed-up is the baseline's median
step time over the variant's (above 1: the variant is faster). The binary order is that of
`binaries.txt` in DIR (one name a line; the first is the baseline). Repeats are summarised by their
median step time. Exit 2 on a missing or malformed file.
"""
import json
import os
import re
import statistics
import sys

NAME = re.compile(r"^(\d+)\.([A-Za-z0-9._-]+?)\.(\d+)\.json$")


def fail(message):
    print(f"variants_table: {message}", file=sys.stderr)
    sys.exit(2)


def read_lines(path):
    try:
        with open(path, encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f if line.strip()]
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")


def load(directory):
    sets = read_lines(os.path.join(directory, "sets.txt"))
    binaries = read_lines(os.path.join(directory, "binaries.txt"))
    if not binaries:
        fail("binaries.txt names no binary")
    runs = {}  # (set, mode, batch) -> name -> list of (step_ms, token_hash)
    for entry in sorted(os.listdir(directory)):
        m = NAME.match(entry)
        if not m:
            continue
        s, name = int(m.group(1)), m.group(2)
        if s >= len(sets):
            fail(f"{entry}: set {s} is not in sets.txt ({len(sets)} sets)")
        if name not in binaries:
            fail(f"{entry}: binary {name} is not in binaries.txt")
        path = os.path.join(directory, entry)
        try:
            with open(path, encoding="utf-8") as f:
                rows = json.load(f)["rows"]
            for r in rows:
                key = (s, str(r["mode"]), int(r["batch"]))
                runs.setdefault(key, {}).setdefault(name, []).append((float(r["step_ms"]), str(r["token_hash"])))
        except (OSError, ValueError, KeyError, TypeError) as e:
            fail(f"{entry}: not decode_bench JSON ({e})")
    return sets, binaries, runs


def table(sets, binaries, runs):
    base = binaries[0]
    head = ["arguments", "mode", "batch"] + [f"{b} ms" for b in binaries]
    head += [f"{b} speed-up" for b in binaries[1:]] + ["same tokens"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in sorted(runs):
        s, mode, batch = key
        by = runs[key]
        med = {b: statistics.median(t for t, _ in by[b]) for b in binaries if b in by}
        cells = [f"`{sets[s]}`", mode, str(batch)]
        cells += [f"{med[b]:.3f}" if b in med else "-" for b in binaries]
        for b in binaries[1:]:
            cells.append(f"{med[base] / med[b]:.2f}x" if base in med and b in med else "-")
        hashes = {h for b in binaries if b in by for _, h in by[b]}
        cells.append("yes" if len(hashes) == 1 else f"no ({len(hashes)} hashes)")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    sets, binaries, runs = load(argv[1])
    if not runs:
        fail(f"no S.NAME.R.json file in {argv[1]}")
    print(table(sets, binaries, runs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
