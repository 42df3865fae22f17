"""What the Python benchmarks share: a seeded model made by `rlserve make-model`, an `rlserve
serve` started on a free port, JSON calls to it, and a batch of calls run at once and timed."""
import json
import subprocess
import threading
import time
import urllib.request


def make_model(rlserve, out, arch="qwen3-moe", preset="small", seed=1):
    subprocess.run([rlserve, "make-model", "--arch", arch, "--preset", preset, "--out", out,
                    "--seed", str(seed)], check=True, capture_output=True)


def start_server(rlserve, *args):
    """`rlserve serve --port 0 ARGS...`; (process, port) once it listens."""
    proc = subprocess.Popen([rlserve, "serve", "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        raise SystemExit(f"serve did not start: {line!r}")
    return proc, int(line.split("listening on ")[1].split(" ")[0].rsplit(":", 1)[1])


def call(port, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=3600) as r:
        return json.loads(r.read())


def timed_concurrently(fn, n):
    """Runs fn(0) .. fn(n - 1) on n threads at once; the seconds until all returned."""
    threads = [threading.Thread(target=fn, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0
