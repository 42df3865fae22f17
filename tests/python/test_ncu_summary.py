"""scripts/gpu/ncu_summary.py, the table run_runner.sh's ncu mode prints, on reports written here.

The reports are laid out as `ncu --import R --csv --page raw --print-units base` writes them (a
header row, a units row, one row per launch, quoted cells, profiler chatter before them); the
numbers are chosen so that every column of the table can be worked out by hand.
"""
import csv
import io
import os
import subprocess
import sys
import tempfile

ROOT = os.environ.get("RLSERVE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "gpu", "ncu_summary.py")
sys.path.insert(0, os.path.join(ROOT, "scripts", "gpu"))
import ncu_summary  # noqa: E402

COLUMNS = ["ID", "Kernel Name", "Block Size", "Grid Size", "gpu__time_duration.sum", "dram__bytes_read.sum",
           "dram__bytes_write.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
           "sm__throughput.avg.pct_of_peak_sustained_elapsed", "sm__warps_active.avg.pct_of_peak_sustained_active",
           "launch__registers_per_thread",
           "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
           "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
           "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"]
UNITS = ["", "", "", "", "nsecond", "byte", "byte", "%", "%", "%", "register/thread", "ratio", "ratio", "ratio"]
GEMV = "void rlserve::kernels::(anonymous namespace)::gemv_kernel<1, 4>(const unsigned short *, int)"
NORM = "unnamed>::add_rms_norm_kernel(float *, const unsigned short *, long)"
CUBLAS = "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT"


def report(rows, columns=COLUMNS, units=UNITS):
    out = io.StringIO()
    out.write("==PROF== Connected to process 1234\n")
    w = csv.writer(out, quoting=csv.QUOTE_ALL)
    w.writerow(columns)
    w.writerow(units)
    for i, r in enumerate(rows):
        w.writerow([str(i)] + r)
    return out.getvalue()


def launch(name, grid, block, ns, read, write, dram, sm, occ, regs, stalls):
    return [name, f"({block}, 1, 1)", f"({grid}, 1, 1)", f"{ns:,}", str(read), str(write), str(dram), str(sm),
            str(occ), str(regs)] + [str(x) for x in stalls]


def summarize(text):
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write(text)
    try:
        r = subprocess.run([sys.executable, SCRIPT, f.name], capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(f.name)
    return r.returncode, r.stdout, r.stderr


def table_rows(stdout):
    return [[c.strip() for c in line.strip("|").split("|")] for line in stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| kernel")]


def check(cond, what):
    if not cond:
        print("FAIL:", what)
        sys.exit(1)


def main():
    rows = [
        # Two launches of one GEMV shape (two layers): merged, percentages weighted by time.
        launch(GEMV, 320, 256, 10000, 30_000_000, 0, 90, 20, 30, 71, [6.0, 1.0, 2.0]),
        launch(GEMV, 320, 256, 30000, 30_000_000, 0, 50, 20, 30, 71, [2.0, 1.0, 2.0]),
        # The same kernel on another grid: its own line.
        launch(GEMV, 512, 256, 20000, 20_000_000, 0, 40, 10, 20, 71, [1.0, 1.0, 1.0]),
        launch(NORM, 1, 256, 4000, 4_000, 4_000, 0, 0, 12, 80, [5.0, 0.5, 2.5]),
        launch(CUBLAS, 132, 384, 36000, 100_000_000, 1_000_000, 84, 7, 14, 168, [20.0, 0.0, 1.5]),
    ]
    rc, out, err = summarize(report(rows))
    check(rc == 0, f"exit {rc}: {err}")
    t = table_rows(out)
    check([r[0] for r in t] == ["gemv_kernel<1, 4>", "gemv_kernel<1, 4>", "add_rms_norm_kernel", CUBLAS],
          f"names, first-appearance order: {[r[0] for r in t]}")
    gemv = t[0]
    check(gemv[1:5] == ["(320, 1, 1)", "(256, 1, 1)", "71", "2"], f"GEMV grid, block, regs, count: {gemv}")
    check(gemv[5] == "40.0" and gemv[6] == "40%", f"GEMV time 40 us of 100: {gemv}")
    check(gemv[7] == "1.50", f"GEMV 60 MB in 40 us = 1.50 TB/s: {gemv}")
    check(gemv[8] == "60", f"GEMV DRAM % weighted by time (90 x 10 + 50 x 30) / 40 = 60: {gemv}")
    check(gemv[11].startswith("long_scoreboard 3.0, wait 2.0, barrier 1.0"),
          f"GEMV stalls, largest first, weighted (6 x 10 + 2 x 30) / 40 = 3: {gemv}")
    check(t[1][1] == "(512, 1, 1)" and t[1][4] == "1", f"the other grid apart: {t[1]}")
    check(t[3][7] == "2.81", f"cuBLAS 101 MB in 36 us: {t[3]}")
    check("5 launches, 100.0 us in all." in out, f"totals: {out}")

    # Names as ncu prints them.
    check(ncu_summary.short_name("void a::b::(anonymous namespace)::k<8, true>(int, float *)") == "k<8, true>",
          "anonymous namespace, templates kept, parameters dropped")
    check(ncu_summary.short_name("void a::w4a16::<unnamed>::w4a16_kernel<32>(p)") == "w4a16_kernel<32>", "<unnamed>")
    check(ncu_summary.short_name("unnamed>::embed_kernel(const int *, long)") == "embed_kernel", "unnamed>:: prefix")
    check(ncu_summary.short_name("cutlass::Kernel2<cutlass::gemm::Sm90<x::y>>(Params)") == "Kernel2<cutlass::gemm::Sm90<x::y>>",
          "namespaces inside template arguments kept")

    # A report without the DRAM metrics (the sections alone): said, and the table still printed.
    cols = [c for c in COLUMNS if not c.startswith("dram__")]
    units = [u for c, u in zip(COLUMNS, UNITS) if not c.startswith("dram__")]
    keep = [i for i, c in enumerate(COLUMNS[1:]) if not c.startswith("dram__")]
    rc, out, err = summarize(report([[r[i] for i in keep] for r in rows], cols, units))
    check(rc == 0 and "columns not in this report: dram__bytes_read.sum" in out, f"missing DRAM: {rc} {out} {err}")
    check(len(table_rows(out)) == 4 and table_rows(out)[0][8] == "-", f"no DRAM %: {out}")

    # Nothing profiled (an empty range), a malformed number, a missing file.
    rc, out, err = summarize("==PROF== Disconnected\n")
    check(rc == 0 and "(no kernels profiled)" in out, f"empty report: {rc} {out} {err}")
    bad = [r[:] for r in rows[:1]]
    bad[0][3] = "n/a"
    rc, out, err = summarize(report(bad))
    check(rc == 0 and table_rows(out)[0][5] == "0.0", f"a time that is not a number counts 0: {out} {err}")
    r = subprocess.run([sys.executable, SCRIPT, "/nonexistent/r.csv"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 2 and "cannot read /nonexistent/r.csv" in r.stderr, f"missing file: {r.returncode} {r.stderr}")
    print("ncu_summary: merged launches, rates, weighted percentages, stalls, names, missing columns, bad input: ok")


if __name__ == "__main__":
    main()
