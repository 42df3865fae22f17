"""Three CPU engines behind SGLang's router (sglang-router from PyPI, the Rust gateway slime and
miles launch): rlserve as a worker of the router, observed from each engine's own /metrics.

- every policy the router offers (random, round_robin, cache_aware, power_of_two, manual): every
  request answered; round_robin spreads 3n requests n per engine; cache_aware sends a repeated
  prompt to one engine; manual keeps each x-smg-routing-key on one engine;
- /flush_cache through the router reaches every engine; /get_loads reads each engine's load
  (rlserve's /get_load), /workers shows the metadata the router read from /server_info and
  /model_info;
- a worker removed (DELETE /workers/{id}) and added back (POST /workers) while a client sends
  requests: none lost;
- a worker killed: the router marks it unhealthy and the others serve every request.

Skips (exit 77) only when the router's compiled extension cannot run on this machine; a missing
package is a failure (scripts/setup.sh installs it). Loopback only; every process is killed at
the end."""
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rlserve_testlib as t  # noqa: E402

ROUTER_VERSION = "0.3.2"
# round_robin last: its run also removes, adds back and finally kills a worker.
POLICIES = ["random", "cache_aware", "power_of_two", "manual", "round_robin"]


def router_or_skip():
    if importlib.util.find_spec("sglang_router") is None:
        raise AssertionError(f"sglang_router is not installed: pip install sglang-router=={ROUTER_VERSION} "
                             "(scripts/setup.sh does)")
    p = subprocess.run([sys.executable, "-c", "import sglang_router.router, sglang_router.version as v; print(v.__version__)"],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        print("SKIP: the sglang-router package is installed but its compiled router cannot run on this "
              f"machine:\n{p.stderr.strip()[-1500:]}")
        sys.exit(77)
    print(f"  sglang-router {p.stdout.strip()}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(url, method="GET", body=None, headers=None, timeout=60):
    """(status, JSON or text) of one request; connection failures are status 0."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
        return 0, str(e)
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def wait_until(what, condition, limit_s=60):
    deadline = time.monotonic() + limit_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.1)


def served(engine_url, route="generate"):
    """Requests the engine answered on `route` over HTTP, from its /metrics."""
    _, text = call(engine_url + "/metrics")
    pattern = rf'rlserve_requests_total{{transport="http",route="{route}",result="ok"}} (\d+)'
    return sum(int(n) for n in re.findall(pattern, text))


class Router:
    def __init__(self, workers, policy, log_path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log_path, "w")
        cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(self.port),
               "--worker-urls", *workers, "--policy", policy, "--log-level", "warn",
               "--health-check-interval-secs", "1", "--health-failure-threshold", "1"]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait_until(f"the {policy} router has {len(workers)} healthy workers",
                       lambda: self.healthy() == len(workers) or self._died(), 60)
        except BaseException:
            self.stop()
            raise

    def _died(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"the router exited ({self.proc.returncode}): {open(self.log.name).read()[-2000:]}")
        return False

    def workers(self):
        status, body = call(self.url + "/workers", timeout=10)
        return body["workers"] if status == 200 else []

    def healthy(self):
        return sum(1 for w in self.workers() if w["is_healthy"])

    def generate(self, ids, headers=None):
        return call(self.url + "/generate", "POST", {"input_ids": ids, "sampling_params": {
            "max_new_tokens": 2, "temperature": 0, "ignore_eos": True}}, headers)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self.log.close()


def delta(engines, before):
    return [served(u) - b for u, b in zip(engines, before)]


def check_policy(engines, procs, policy, tmp):
    router = Router(engines, policy, os.path.join(tmp, f"router-{policy}.log"))
    try:
        before = [served(u) for u in engines]
        n = 3 * len(engines)
        for i in range(n):
            status, body = router.generate([7, 8, 9 + i])
            t.check(status == 200 and body.get("success", True), f"{policy}: {status} {body}")
        spread = delta(engines, before)
        t.check(sum(spread) == n, f"{policy}: {spread} answered, {n} sent")
        if policy == "round_robin":
            t.check(spread == [3] * len(engines), f"round_robin spread {spread}")
        if policy == "cache_aware":  # one long prompt, repeated: its prefix lives on one engine
            before = [served(u) for u in engines]
            for _ in range(4):
                t.check(router.generate(list(range(40, 100)))[0] == 200, "cache_aware")
            t.check(sorted(delta(engines, before)) == [0] * (len(engines) - 1) + [4],
                    f"cache_aware split a repeated prompt: {delta(engines, before)}")
        if policy == "manual":  # x-smg-routing-key: each key stays on one engine
            for key in ("alice", "bob", "carol"):
                before = [served(u) for u in engines]
                for i in range(3):
                    t.check(router.generate([5, i], {"x-smg-routing-key": key})[0] == 200, key)
                t.check(sorted(delta(engines, before))[-1] == 3, f"key {key} moved: {delta(engines, before)}")
        print(f"  {policy}: {spread}")
        if policy == "round_robin":
            check_router_reads(engines, router)
            check_remove_and_add(engines, router)
            check_killed_worker(engines, procs, router)
    finally:
        router.stop()


def check_router_reads(engines, router):
    before = [served(u, "flush_cache") for u in engines]
    status, body = call(router.url + "/flush_cache", "POST")
    t.check(status == 200 and body.get("workers_flushed") == len(engines), f"flush_cache: {status} {body}")
    t.check([served(u, "flush_cache") - b for u, b in zip(engines, before)] == [1] * len(engines),
            "flush_cache reached every engine")
    status, body = call(router.url + "/get_loads")
    loads = {w["worker"]: w["load"] for w in body["workers"]}
    t.check(sorted(loads) == sorted(engines) and all(v >= 0 for v in loads.values()),
            f"/get_loads read every engine's /get_load: {body}")
    for w in router.workers():
        meta = w["metadata"]
        t.check(meta["model_type"] == "qwen3" and meta["tp_size"] == "1" and meta["dp_size"] == "1",
                f"metadata from /server_info and /model_info: {meta}")
    status, info = call(router.url + "/get_model_info")
    t.check(status == 200 and info["is_generation"] is True and info["model_type"] == "qwen3", info)
    print("  flush_cache reaches all; /get_loads, /get_model_info and worker metadata read")


def check_remove_and_add(engines, router):
    results, stop = [], threading.Event()

    def client():
        i = 0
        while not stop.is_set() and i < 400:  # bounded
            results.append(router.generate([11, 12, i % 50])[0])
            i += 1
    th = threading.Thread(target=client)
    th.start()
    try:
        wait_until("requests flow", lambda: len(results) >= 3, 30)
        victim = engines[2]
        wid = next(w["id"] for w in router.workers() if w["url"] == victim)
        status, body = call(f"{router.url}/workers/{wid}", "DELETE")
        t.check(status in (200, 202), f"remove: {status} {body}")
        wait_until("the worker is removed", lambda: victim not in [w["url"] for w in router.workers()], 30)
        mark = len(results)
        wait_until("requests flow without it", lambda: len(results) >= mark + 3, 30)
        status, body = call(router.url + "/workers", "POST", {"url": victim})
        t.check(status in (200, 202), f"add: {status} {body}")
        wait_until("the worker is back and healthy",
                   lambda: any(w["url"] == victim and w["is_healthy"] for w in router.workers()), 30)
        before = served(victim)
        wait_until("the worker serves again", lambda: served(victim) > before, 30)
    finally:
        stop.set()
        th.join(timeout=120)
    t.check(results and all(s == 200 for s in results), f"requests lost: {[s for s in results if s != 200]}")
    print(f"  a worker removed and added back while {len(results)} requests ran: none lost")


def check_killed_worker(engines, procs, router):
    victim = engines[2]
    procs[2].kill()
    procs[2].wait(timeout=30)
    # Until the health check notices, a request sent to the dead worker is retried on another.
    early = [router.generate([21, i]) for i in range(6)]
    wait_until("the router marks the dead worker unhealthy",
               lambda: any(w["url"] == victim and not w["is_healthy"] for w in router.workers()), 30)
    late = [router.generate([22, i]) for i in range(6)]
    failed = [(s, b) for s, b in early + late if s != 200]
    for s, b in failed:  # an error, if any, must say what happened
        t.check(s >= 500 and str(b).strip(), f"unclear router error: {s} {b}")
    t.check(all(s == 200 for s, _ in late), f"the live workers did not serve: {late}")
    print(f"  a worker killed: marked unhealthy, the others serve ({len(failed)} errors before that)")


def main():
    router_or_skip()
    with t.temp_dir() as tmp:
        model = os.path.join(tmp, "model")
        t.run("make-model", "--preset", "tiny", "--out", model, "--seed", "41")
        procs, engines = [], []
        try:
            for _ in range(3):
                proc, port = t.start_server(dict(os.environ), "--model", model, "--device", "cpu")
                procs.append(proc)
                engines.append(f"http://127.0.0.1:{port}")
            for policy in POLICIES:
                start = time.monotonic()
                check_policy(engines, procs, policy, tmp)
                print(f"    ({time.monotonic() - start:.1f} s)")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait(timeout=30)
    print("test_router_fleet: all passed")


if __name__ == "__main__":
    main()
