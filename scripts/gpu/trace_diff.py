#!/usr/bin/env python3
"""Compare two RLSERVE_GPU_TRACE files and name the first phase where the runs part.

A trace line (written by model/qwen3_gpu.cpp, one per phase of every step):

    m<model> s<step> l<layer> <phase> <bf16|f32|i32> <rows>x<row elements> <xxh3>:<magnitude> ...

with one `<xxh3>:<magnitude>` per row: the XXH3-64 of the row's bytes and the sum of the
magnitudes of its values. Two runs of the same build, arguments and seeds should write the same
lines. Where they do not, the first differing line is where the runs part (later phases inherit
the difference); the rows that differ and how far their magnitudes are apart tell a last-bit
difference (a summation order: relative differences near 1e-7) from garbage (memory nobody
wrote: large or non-finite differences).

    trace_diff.py A B [--rows 8] [--lines 12]

Exit status: 0 when the files are the same, 1 when they differ, 2 when they cannot be compared
(a file is missing or unreadable, or a line is not a trace line).
"""
import argparse
import math
import sys
from collections import Counter


class TraceError(Exception):
    pass


def parse_line(text, where):
    parts = text.split()
    if len(parts) < 6 or not (parts[0].startswith("m") and parts[1].startswith("s") and parts[2].startswith("l")):
        raise TraceError(f"{where}: not a trace line: {text[:80]!r}")
    try:
        rows, elems = (int(x) for x in parts[5].split("x"))
        model, step, layer = int(parts[0][1:]), int(parts[1][1:]), int(parts[2][1:])
        cells = []
        for cell in parts[6:]:
            digest, magnitude = cell.split(":")
            cells.append((digest, float(magnitude)))
    except ValueError as e:
        raise TraceError(f"{where}: malformed trace line ({e}): {text[:80]!r}") from None
    if len(cells) != rows:
        raise TraceError(f"{where}: {rows} rows announced, {len(cells)} given")
    return {"model": model, "step": step, "layer": layer, "phase": parts[3], "type": parts[4],
            "shape": (rows, elems), "rows": cells}


def read_trace(path):
    try:
        with open(path, encoding="ascii") as f:
            return [parse_line(line, f"{path}:{i + 1}") for i, line in enumerate(f) if line.strip()]
    except OSError as e:
        raise TraceError(f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path} is not a trace file (not ASCII text)") from None


def header(entry):
    return (f"model {entry['model']} step {entry['step']} layer {entry['layer']} {entry['phase']} "
            f"({entry['type']} {entry['shape'][0]}x{entry['shape'][1]})")


def relative(a, b):
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b):
        return float("inf")
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale > 0 else 0.0


def compare(a, b, show_rows=8, show_lines=12, out=sys.stdout):
    """Prints the comparison; returns True when the traces are the same."""
    n = min(len(a), len(b))
    differing = []
    for i in range(n):
        ea, eb = a[i], b[i]
        same_place = all(ea[k] == eb[k] for k in ("model", "step", "layer", "phase", "type", "shape"))
        if not same_place:
            print(f"line {i + 1}: the runs did different work: A has {header(ea)}, B has {header(eb)}; "
                  "comparison stops here", file=out)
            differing.append((i, None))
            break
        rows = [r for r in range(len(ea["rows"])) if ea["rows"][r][0] != eb["rows"][r][0]]
        if rows:
            differing.append((i, rows))
    if len(a) != len(b) and not (differing and differing[-1][1] is None):
        print(f"A has {len(a)} lines, B {len(b)}: compared the first {n}", file=out)
    if not differing and len(a) == len(b):
        print(f"same: {len(a)} phase outputs, every row equal", file=out)
        return True
    if not differing:
        return False
    first, rows = differing[0]
    if rows is not None:
        e, f = a[first], b[first]
        worst = max(relative(e["rows"][r][1], f["rows"][r][1]) for r in rows)
        print(f"first difference, line {first + 1}: {header(e)}: {len(rows)} of {e['shape'][0]} rows differ; "
              f"largest relative difference of row magnitudes {worst:.3g}", file=out)
        for r in rows[:show_rows]:
            ma, mb = e["rows"][r][1], f["rows"][r][1]
            print(f"  row {r}: magnitude {ma:.9g} vs {mb:.9g} (relative {relative(ma, mb):.3g})", file=out)
        if len(rows) > show_rows:
            print(f"  ... {len(rows) - show_rows} more rows", file=out)
        if first > 0:
            p = a[first - 1]
            print(f"the phase before it was the same in both: {header(p)}", file=out)
    real = [(i, r) for i, r in differing if r is not None]
    print(f"{len(real)} of {n} phase outputs differ; the first few:", file=out)
    for i, r in real[:show_lines]:
        print(f"  line {i + 1}: {header(a[i])}: {len(r)} rows", file=out)
    by_phase = Counter(a[i]["phase"] for i, _ in real)
    print("differing outputs per phase: " + ", ".join(f"{p} {c}" for p, c in by_phase.most_common()), file=out)
    return False


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--rows", type=int, default=8, help="differing rows to show of the first difference")
    ap.add_argument("--lines", type=int, default=12, help="differing phase outputs to list")
    args = ap.parse_args(argv)
    try:
        a, b = read_trace(args.a), read_trace(args.b)
    except TraceError as e:
        print(f"trace_diff: {e}", file=sys.stderr)
        return 2
    if not a or not b:
        print(f"trace_diff: {'A' if not a else 'B'} is empty (was RLSERVE_GPU_TRACE set for that run?)",
              file=sys.stderr)
        return 2
    return 0 if compare(a, b, args.rows, args.lines) else 1


if __name__ == "__main__":
    sys.exit(main())
