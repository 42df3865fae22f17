#!/usr/bin/env python3
"""One Markdown table per Nsight Compute report: what each kernel reached and what held it.

Input: `ncu --import R.ncu-rep --csv --page raw --print-units base` output (one row per profiled
launch, a units row under the header), as scripts/gpu/run_runner.sh ncu writes it. Launches of
the same kernel with the same grid and block are merged (the layers of a decode step): count,
total time, DRAM bytes, and the time-weighted percentages. Columns:

  time      total over the merged launches (us), and its share of the report's time
  DRAM      bytes read + written / time, and dram__throughput as % of the device's peak
  SM        sm__throughput, % of peak (the busiest SM unit: a compute-bound kernel is high here)
  occupancy achieved active warps, % of the SM's maximum
  stalls    the three largest warp stall reasons, cycles per issued instruction
            (WarpStateStats; long_scoreboard = waiting on global memory, barrier = __syncthreads,
            wait = fixed-latency dependencies, math_pipe_throttle = a busy math pipe)

Usage: ncu_summary.py REPORT.csv...
"""
import csv
import re
import sys

TIME = "gpu__time_duration.sum"
READ = "dram__bytes_read.sum"
WRITE = "dram__bytes_write.sum"
DRAM_PCT = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
SM_PCT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
OCC = "sm__warps_active.avg.pct_of_peak_sustained_active"
STALL = re.compile(r"issue_stalled_(\w+?)_per_issue_active\.ratio$")


def number(text):
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def short_name(name):
    """The kernel's own name and template arguments: no namespaces, no parameter list."""
    name = name.replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    name = re.sub(r"^void ", "", name.strip())
    name = re.sub(r"^unnamed>::", "", name)  # how ncu prints some kernels of an unnamed namespace
    depth, cut, last_scope = 0, len(name), 0
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
        elif ch == ":" and depth == 0 and name[i - 1:i + 1] == "::":
            last_scope = i + 1
    return name[last_scope:cut].strip() or name


def rows_of(path):
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # drop ==PROF== and other chatter
    reader = csv.reader(lines)
    header = next(reader, None)
    if header is None:
        return [], []
    rows = [dict(zip(header, r)) for r in reader]
    rows = [r for r in rows if r.get("ID", "").strip().isdigit()]  # the units row has no ID
    return header, rows


def summarize(path):
    header, rows = rows_of(path)
    print(f"\n### {path.rsplit('/', 1)[-1]}\n")
    if not rows:
        print("(no kernels profiled)")
        return
    stalls = [(c, STALL.search(c).group(1)) for c in header if STALL.search(c)]
    missing = [c for c in (TIME, READ, WRITE, DRAM_PCT, SM_PCT, OCC) if c not in header]
    if missing:
        print("columns not in this report: " + ", ".join(missing) + "\n")
    groups = {}
    order = []
    for r in rows:
        key = (short_name(r.get("Kernel Name", "?")), r.get("Grid Size", ""), r.get("Block Size", ""))
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(r)
    total_ns = sum(number(r.get(TIME)) or 0 for r in rows)
    print("| kernel | grid | block | regs | n | time us | share | DRAM TB/s | DRAM % peak | SM % | occupancy % | top stalls |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for key in order:
        rs = groups[key]
        t = sum(number(r.get(TIME)) or 0 for r in rs)  # ns (base units)
        b = sum((number(r.get(READ)) or 0) + (number(r.get(WRITE)) or 0) for r in rs)

        def weighted(col):
            vals = [(number(r.get(col)), number(r.get(TIME)) or 0) for r in rs]
            vals = [(v, w) for v, w in vals if v is not None]
            wsum = sum(w for _, w in vals)
            return sum(v * w for v, w in vals) / wsum if wsum else None

        def pct(v):
            return "-" if v is None else f"{v:.0f}"

        top = sorted(((weighted(c) or 0, reason) for c, reason in stalls), reverse=True)[:3]
        regs = rs[0].get("launch__registers_per_thread", "")
        print(f"| {key[0][:48]} | {key[1]} | {key[2]} | {regs} | {len(rs)} | {t / 1e3:.1f} | "
              f"{100 * t / total_ns if total_ns else 0:.0f}% | {b / t / 1e3 if t else 0:.2f} | "
              f"{pct(weighted(DRAM_PCT))} | {pct(weighted(SM_PCT))} | {pct(weighted(OCC))} | "
              + ", ".join(f"{reason} {v:.1f}" for v, reason in top if v > 0) + " |")
    print(f"\n{len(rows)} launches, {total_ns / 1e3:.1f} us in all.")


def main(paths):
    if not paths:
        print(__doc__)
        return 2
    status = 0
    for p in paths:
        try:
            summarize(p)
        except (OSError, csv.Error, UnicodeDecodeError) as e:
            print(f"ncu_summary: cannot read {p}: {e}", file=sys.stderr)
            status = 2
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
