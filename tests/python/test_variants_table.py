"""scripts/gpu/variants_table.py, the table run_runner.sh's `variants` mode prints, on decode_bench
JSON written here in the layout decode_bench's --json writes (numbers chosen so that every cell
can be worked out by hand).
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.environ.get("RLSERVE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "gpu", "variants_table.py")


def bench_json(rows):
    out = []
    for mode, batch, ms, tokens in rows:
        out.append({"mode": mode, "batch": batch, "step_ms": ms, "tokens_per_s": 1000.0 * batch / ms,
                    "roofline_ms": 1.0, "weight_gb": 16.0, "kv_gb": 0.1, "distinct_tokens_last_step": batch,
                    "token_hash": tokens, "logprob_hash": "ab", "prompt": 128, "prefill": "full",
                    "prefill_s": 0.5, "context_mid": 144, "kv_share_of_roofline": 0.01})
    return json.dumps({"copy_bandwidth_bytes_per_s": 4.2e12, "rows": out})


def run(directory):
    r = subprocess.run([sys.executable, SCRIPT, directory], capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout, r.stderr


def rows_of(stdout):
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in stdout.splitlines()
            if line.startswith("| `")]


def check(cond, what):
    if not cond:
        print("FAIL:", what)
        sys.exit(1)


def write(directory, name, text):
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
        f.write(text)


def main():
    with tempfile.TemporaryDirectory() as d:
        write(d, "sets.txt", "--batches 1,8 --prompt 128\n--batches 1 --prompt 8192\n")
        write(d, "binaries.txt", "main\ntwo-groups\n")
        # Set 0: two repeats each; medians 3.0 (main) and 2.0 (variant) at batch 1.
        write(d, "0.main.0.json", bench_json([("int4", 1, 3.0, "aa"), ("int4", 8, 6.0, "b8")]))
        write(d, "0.main.1.json", bench_json([("int4", 1, 3.0, "aa"), ("int4", 8, 6.4, "b8")]))
        write(d, "0.two-groups.0.json", bench_json([("int4", 1, 2.0, "aa"), ("int4", 8, 8.0, "c8")]))
        write(d, "0.two-groups.1.json", bench_json([("int4", 1, 2.0, "aa"), ("int4", 8, 8.0, "c8")]))
        # Set 1: the variant did not run (its run failed): a dash, no ratio.
        write(d, "1.main.0.json", bench_json([("int4", 1, 7.0, "dd")]))
        write(d, "notes.log", "not a run")
        rc, out, err = run(d)
        check(rc == 0, f"exit {rc}: {err}")
        check("| arguments | mode | batch | main ms | two-groups ms | two-groups speed-up | same tokens |" in out, out)
        rows = rows_of(out)
        check(len(rows) == 3, f"three rows: {out}")
        check(rows[0] == ["`--batches 1,8 --prompt 128`", "int4", "1", "3.000", "2.000", "1.50x", "yes"], rows[0])
        # Batch 8: main's median of 6.0 and 6.4 is 6.2; the variant's tokens differ.
        check(rows[1] == ["`--batches 1,8 --prompt 128`", "int4", "8", "6.200", "8.000", "0.78x", "no (2 hashes)"],
              rows[1])
        check(rows[2] == ["`--batches 1 --prompt 8192`", "int4", "1", "7.000", "-", "-", "yes"], rows[2])

    # Bad input: a set past sets.txt, an unknown binary, a file that is not decode_bench JSON,
    # no runs at all, a missing folder; each exits 2 naming what is wrong.
    cases = [("5.main.0.json", bench_json([("int4", 1, 1.0, "a")]), "set 5 is not in sets.txt"),
             ("0.other.0.json", bench_json([("int4", 1, 1.0, "a")]), "binary other is not in binaries.txt"),
             ("0.main.0.json", "{\"rows\": [{\"batch\": 1}]}", "0.main.0.json: not decode_bench JSON"),
             ("0.main.0.json", "[1, 2", "0.main.0.json: not decode_bench JSON"),
             (None, None, "no S.NAME.R.json file")]
    for name, text, want in cases:
        with tempfile.TemporaryDirectory() as d:
            write(d, "sets.txt", "--batches 1\n")
            write(d, "binaries.txt", "main\n")
            if name:
                write(d, name, text)
            rc, out, err = run(d)
            check(rc == 2 and want in err, f"{name}: {rc} {out} {err}")
    rc, out, err = run("/nonexistent/variants")
    check(rc == 2 and "cannot read /nonexistent/variants/sets.txt" in err, f"missing folder: {rc} {err}")
    print("variants_table: medians, speed-ups, token hashes, missing runs, bad input: ok")


if __name__ == "__main__":
    main()
