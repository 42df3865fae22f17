"""scripts/gpu/trace_diff.py, the determinism probe's comparison, on traces written here.

The traces are built the way model/qwen3_gpu.cpp writes them (per row the XXH3-64 of its bytes,
by the `xxhash` package, and the sum of its magnitudes, by numpy), from seeded arrays; then one
run is made to part from the other in a known place: a last-bit change (a summation order), a
garbage row (memory nobody wrote), different work, bad files.
"""
import io
import os
import subprocess
import sys
import tempfile

import numpy as np
import xxhash

ROOT = os.environ.get("RLSERVE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "gpu", "trace_diff.py")
sys.path.insert(0, os.path.join(ROOT, "scripts", "gpu"))
import trace_diff  # noqa: E402

PHASES = ["norms", "qkv_GEMM", "paged_attention", "o_proj_GEMM", "norms", "router_GEMM", "MoE"]


def line(step, layer, phase, rows):
    """One trace line for a float32 [rows, cols] array, as the C++ writes it."""
    cells = " ".join(f"{xxhash.xxh3_64_intdigest(r.tobytes()):016x}:{float(np.abs(r.astype(np.float64)).sum()):.9g}"
                     for r in rows)
    return f"m0 s{step} l{layer} {phase} f32 {rows.shape[0]}x{rows.shape[1]} {cells}\n"


def make_run(seed=7, steps=2, layers=3, tokens=6, cols=16, change=None):
    """A run's trace; `change(step, layer, phase_index, rows)` may alter a phase's rows."""
    rng = np.random.default_rng(seed)
    out = []
    for s in range(1, steps + 1):
        for l in range(layers):
            for p, phase in enumerate(PHASES):
                rows = rng.standard_normal((tokens, cols)).astype(np.float32)
                if change:
                    rows = change(s, l, p, rows)
                out.append(line(s, l, phase, rows))
    return "".join(out)


def run_script(a_text, b_text):
    with tempfile.TemporaryDirectory() as d:
        pa, pb = os.path.join(d, "a.trace"), os.path.join(d, "b.trace")
        with open(pa, "w") as f:
            f.write(a_text)
        with open(pb, "w") as f:
            f.write(b_text)
        r = subprocess.run([sys.executable, SCRIPT, pa, pb], capture_output=True, text=True, timeout=60)
        return r.returncode, r.stdout + r.stderr


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def main():
    base = make_run()

    # Same runs: exit 0.
    rc, text = run_script(base, make_run())
    check(rc == 0 and "same" in text, f"identical traces: exit {rc}: {text}")

    # A last-bit difference in step 2, layer 1, MoE, rows 2 and 4: later phases inherit it.
    def last_bit(s, l, p, rows):
        if (s, l) > (2, 1) or ((s, l) == (2, 1) and p >= PHASES.index("MoE")):
            rows = rows.copy()
            for r in (2, 4):
                rows[r, 3] = np.nextafter(rows[r, 3], np.float32(np.inf))
        return rows
    rc, text = run_script(base, make_run(change=last_bit))
    check(rc == 1, f"last-bit: exit {rc}: {text}")
    first = text.splitlines()[0]
    check("step 2 layer 1 MoE" in first and "2 of 6 rows differ" in first, f"last-bit first line: {first}")
    check("row 2:" in text and "row 4:" in text, f"last-bit rows named: {text}")
    worst = float(first.rsplit(" ", 1)[1])
    check(0 < worst < 1e-5, f"a last-bit change has a relative magnitude difference near 1e-7: {worst}")
    check("the phase before it was the same in both: model 0 step 2 layer 1 router_GEMM" in text,
          f"the phase before: {text}")
    check("differing outputs per phase: " in text, f"per-phase summary: {text}")

    # Garbage (memory nobody wrote) in one row of step 1, layer 0, paged attention.
    def garbage(s, l, p, rows):
        if (s, l, p) == (1, 0, PHASES.index("paged_attention")):
            rows = rows.copy()
            rows[5] = np.float32(3.0e38)
        return rows
    rc, text = run_script(base, make_run(change=garbage))
    first = text.splitlines()[0]
    check(rc == 1 and "step 1 layer 0 paged_attention" in first and "1 of 6 rows differ" in first,
          f"garbage first line: {first}")
    check(float(first.rsplit(" ", 1)[1]) > 0.5, f"garbage shows a large difference: {first}")

    # Different work (another step structure): named, comparison stops.
    rc, text = run_script(base, make_run(layers=2))
    check(rc == 1 and "did different work" in text, f"different work: exit {rc}: {text}")

    # One run stopped early: the common part is compared, and the lengths are named.
    cut = "".join(base.splitlines(keepends=True)[:10])
    rc, text = run_script(base, cut)
    check(rc == 1 and "A has 42 lines, B 10" in text, f"a shorter trace: exit {rc}: {text}")

    # Bad files: exit 2 with a sentence.
    rc, text = run_script(base, "")
    check(rc == 2 and "B is empty" in text, f"empty trace: exit {rc}: {text}")
    rc, text = run_script(base, "hello world\n")
    check(rc == 2 and "not a trace line" in text, f"not a trace: exit {rc}: {text}")
    rc, text = run_script(base, "m0 s1 l0 norms f32 2x16 0123:1.0\n")
    check(rc == 2 and "2 rows announced, 1 given" in text, f"short line: exit {rc}: {text}")
    rc, text = run_script(base, "m0 s1 l0 norms f32 1x16 0123:abc\n")
    check(rc == 2 and "malformed" in text, f"malformed cell: exit {rc}: {text}")
    r = subprocess.run([sys.executable, SCRIPT, "/nonexistent/a", "/nonexistent/b"], capture_output=True,
                       text=True, timeout=60)
    check(r.returncode == 2 and "cannot read" in r.stderr, f"missing file: {r.returncode}: {r.stderr}")

    # The module's compare() on parsed traces, as the runner script's caller would use it.
    a = [trace_diff.parse_line(x, "a") for x in base.splitlines()]
    buf = io.StringIO()
    check(trace_diff.compare(a, a, out=buf), "a trace equals itself")
    print("trace_diff: identical, last-bit, garbage, different work, short and bad traces: ok")


if __name__ == "__main__":
    main()
