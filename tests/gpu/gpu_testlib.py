"""What the GPU machine's Python tests share: named checks that collect failures, a free port, and
`rlserve serve` on a GPU driven over HTTP (RLSERVE_BIN names the binary). Not a test itself."""
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request

BIN = os.environ.get("RLSERVE_BIN", "build/apps/rlserve")
FAILURES = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        FAILURES.append(what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`rlserve serve --model MODEL --device DEVICE EXTRA...`, its output in `log`; healthy when
    constructed."""

    def __init__(self, model, extra=(), log="serve.log", device="cuda"):
        self.port = free_port()
        self.log = open(log, "w")
        self.proc = subprocess.Popen([BIN, "serve", "--model", model, "--device", device, "--port", str(self.port)]
                                     + list(extra), stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                self.call("health", method="GET")
                return
            except Exception:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"rlserve serve exited: see {log}")
                time.sleep(0.5)
        raise RuntimeError("rlserve serve did not become healthy")

    def call(self, route, body=None, method="POST", timeout=600):
        """The reply's JSON; a 400 (a refusal) is a reply too."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/{route}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                text = r.read().decode()
        except urllib.error.HTTPError as e:
            if e.code != 400:
                raise
            text = e.read().decode()
        return json.loads(text) if text else {}

    def digests(self):
        return self.call("weights_checker", {"action": "checksum"})["ranks"][0]["checksums"]

    def greedy(self, prompts, n=16):
        return [self.call("generate", {"input_ids": p, "sampling_params": {"max_new_tokens": n, "temperature": 0}})
                .get("output_ids") for p in prompts]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
