"""rlserve.FleetClient: one weight update over three CPU engines, all or nothing, over HTTP and
over websockets. References are independent of the fleet code: the checkpoint files' own bytes
(read here) hashed with the package's checksums module, and each engine's own weights_checker.

Per transport, three fresh `rlserve serve` engines of the tiny model (checkpoint A) with a 2 s
session idle timeout; the third refuses NaN weights, the others accept them:
- a bucket holding a NaN: the third engine refuses it, the fleet aborts every session, the error
  names that engine; every engine serves the old version with the old checksums;
- a trainer process that begins and stages, then is SIGKILLed: the engines end its sessions (over
  HTTP after the idle timeout, over websockets when the connection drops) and serve the old
  weights;
- a good update, inline and then from disk (checkpoint B): every engine serves the new version,
  the same per-engine checksum, and each tensor's checksum is that of the bytes sent;
- (HTTP) a commit lost on one engine after the others committed: FleetSplitError names it, and
  roll_forward() sends the session again to it;
- an engine killed between staging and commit: the fleet aborts the others; the error names the
  dead engine; the others serve the old version.
"""
import json
import os
import signal
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rlserve_testlib as t  # noqa: E402

REPO = os.environ.get("RLSERVE_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))
import rlserve  # noqa: E402

ADMIN = "fleet-admin-key"
IDLE_S = 2  # --update-session-idle-timeout of the engines


def file_tensors(model):
    """{name: (dtype, shape, raw bytes)} of a checkpoint's model.safetensors, read here."""
    with open(os.path.join(model, "model.safetensors"), "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    return {k: (v["dtype"], v["shape"], data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__"}


def wait_until(what, condition, limit_s=30):
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.1)


class Fleet:
    """Three engines serving checkpoint A."""

    def __init__(self, tmp, model):
        self.procs, self.urls = [], []
        env = dict(os.environ, RLSERVE_CACHE_DIR=os.path.join(tmp, "cache"))
        for i in range(3):
            extra = [] if i == 2 else ["--allow-non-finite-weights"]
            proc, port = t.start_server(env, "--model", model, "--device", "cpu", "--admin-api-key", ADMIN,
                                        "--update-session-idle-timeout", IDLE_S, *extra)
            self.procs.append(proc)
            self.urls.append(f"http://127.0.0.1:{port}")
        self.admin = [rlserve.HttpClient(u, api_key=ADMIN, timeout=30) for u in self.urls]

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)

    def state(self, alive=None):
        """[(weight_version, per_engine_checksum, session open)] of the engines alive."""
        out = []
        for i, c in enumerate(self.admin):
            if alive is not None and i not in alive:
                continue
            info = c.get_server_info()
            out.append((info["weight_version"], c.check_weights()["per_engine_checksum"],
                        info["weight_update_session_open"]))
        return out

    def sessions_closed(self):
        return not any(c.get_server_info()["weight_update_session_open"] for c in self.admin)


def check_refused_bucket(fleet, transport, old):
    nan = struct.pack("<H", 0x7FC0)  # a bfloat16 quiet NaN
    dtype, shape, raw = fleet.files["model.norm.weight"]
    bucket = {"model.norm.weight": rlserve.tensor_from_bytes("bfloat16", shape, nan + raw[2:])}
    with rlserve.FleetClient(fleet.urls, api_key=ADMIN, transport=transport, call_timeout=30) as f:
        f.begin_weight_update()
        try:
            f.update_weights(bucket, weight_version="refused")
            raise AssertionError("a bucket one engine refused was staged")
        except rlserve.FleetError as e:
            t.check(e.phase == "stage" and list(e.failures) == [fleet.urls[2]], f"{e.phase} {e.failures}")
            t.check("model.norm.weight" in e.failures[fleet.urls[2]], e.failures)
            t.check(e.aborted and fleet.urls[2] in str(e), str(e))
    t.check(fleet.state() == old, f"after the refusal {fleet.state()}, before {old}")
    print(f"  {transport}: one engine refused a bucket; all aborted, old weights serve")


TRAINER = """
import sys
sys.path.insert(0, sys.argv[1])
import rlserve
urls, transport, key = sys.argv[2].split(","), sys.argv[3], sys.argv[4]
fleet = rlserve.FleetClient(urls, api_key=key, transport=transport, call_timeout=30)
fleet.begin_weight_update()
fleet.update_weights({"model.norm.weight": rlserve.tensor_from_bytes("bfloat16", [64], bytes(128))})
print("staged", flush=True)
sys.stdin.read()  # until killed
"""


def check_trainer_killed(fleet, transport, old):
    proc = subprocess.Popen([sys.executable, "-c", TRAINER, os.path.join(REPO, "python"), ",".join(fleet.urls),
                             transport, ADMIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        t.check(line.strip() == "staged", f"trainer said {line!r}")
        t.check(not fleet.sessions_closed(), "the trainer's sessions are open")
        start = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        # get_server_info is no session request: polling it does not hold the sessions alive.
        wait_until("the engines abort the dead trainer's sessions", fleet.sessions_closed, IDLE_S + 20)
        waited = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    t.check(fleet.state() == old, f"after the trainer died {fleet.state()}, before {old}")
    print(f"  {transport}: trainer killed mid-session; sessions aborted after {waited:.1f} s, old weights serve")


def check_good_updates(fleet, transport, step):
    names = ["model.norm.weight", "model.layers.0.mlp.up_proj.weight"]
    inline = {n: rlserve.tensor_from_bytes(TORCH[fleet.new[n][0]], fleet.new[n][1], fleet.new[n][2]) for n in names}
    with rlserve.FleetClient(fleet.urls, api_key=ADMIN, transport=transport, call_timeout=30) as f:
        f.begin_weight_update()
        f.update_weights({names[0]: inline[names[0]]})
        f.update_weights({names[1]: inline[names[1]]})
        report = f.end_weight_update(weight_version=f"{transport}-{step}")
        state = fleet.state()
        t.check(report.weight_version == f"{transport}-{step}", report)
        t.check(len(set(state)) == 1 and state[0] == (report.weight_version, report.checksum, False), state)
        for c in fleet.admin:
            sums = c.check_weights()["ranks"][0]["checksums"]
            for n in names:
                t.check(sums[n] == rlserve.tensor_checksum(fleet.new[n][2]), f"{c.base_url} {n}")
            t.check(sums["model.embed_tokens.weight"] == rlserve.tensor_checksum(fleet.files["model.embed_tokens.weight"][2]),
                    "a tensor the update did not name keeps its bytes")
        # The whole checkpoint B from disk: one session of its own.
        report = f.update_weights_from_disk(fleet.model_b, weight_version=f"{transport}-{step}-disk")
    state = fleet.state()
    t.check(len(set(state)) == 1 and state[0] == (report.weight_version, report.checksum, False), state)
    for c in fleet.admin:
        sums = c.check_weights()["ranks"][0]["checksums"]
        t.check(sorted(sums) == sorted(fleet.new), "the engine's tensors are the checkpoint's")
        for n, (_, _, raw) in fleet.new.items():
            t.check(sums[n] == rlserve.tensor_checksum(raw), f"{c.base_url} {n}")
    print(f"  {transport}: good updates (inline, disk): same version and checksums everywhere, "
          "equal to the trainer's bytes")


class LosesCommit:
    """An engine's client whose commit is lost: it sends an abort instead (the engine drops what
    it staged) and reports a failure, as an engine that restarts at commit time would. Once: the
    fleet opens a new client after a failure that got no reply."""
    armed = True

    def __init__(self, url):
        self.inner = rlserve.HttpClient(url, api_key=ADMIN, timeout=30)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def end_weight_update(self, weight_version=None, abort=False):
        if LosesCommit.armed and not abort:
            LosesCommit.armed = False
            self.inner.end_weight_update(abort=True)
            raise rlserve.RlserveError(f"cannot reach {self.inner.base_url}: injected")
        return self.inner.end_weight_update(weight_version=weight_version, abort=abort)


def check_split_and_roll_forward(fleet):
    lossy = fleet.urls[1]
    connect = lambda u: LosesCommit(u) if u == lossy else rlserve.HttpClient(u, api_key=ADMIN, timeout=30)
    dtype, shape, raw = fleet.files["model.norm.weight"]
    bucket = {"model.norm.weight": rlserve.tensor_from_bytes("bfloat16", shape, raw[::-1])}
    with rlserve.FleetClient(fleet.urls, connect=connect, call_timeout=30) as f:
        try:
            f.update_weights(bucket, weight_version="split")
            raise AssertionError("a lost commit went unnoticed")
        except rlserve.FleetSplitError as e:
            t.check(e.lagging == [lossy] and sorted(e.committed) == sorted(set(fleet.urls) - {lossy}),
                    f"{e.committed} {e.lagging}")
            t.check(e.versions[lossy] != "split" and lossy in str(e), str(e))
        report = f.roll_forward()
    state = fleet.state()
    t.check(report.weight_version == "split" and len(set(state)) == 1 and state[0][0] == "split", state)
    print("  http: a commit lost on one engine is reported as a split; roll_forward re-sends it")


def check_engine_killed(fleet, transport, old):
    dtype, shape, raw = fleet.files["model.norm.weight"]
    bucket = {"model.norm.weight": rlserve.tensor_from_bytes("bfloat16", shape, raw[::-1])}
    dead = fleet.urls[1]
    with rlserve.FleetClient(fleet.urls, api_key=ADMIN, transport=transport, call_timeout=30) as f:
        f.begin_weight_update()
        f.update_weights(bucket)
        fleet.procs[1].kill()
        fleet.procs[1].wait(timeout=30)
        try:
            f.end_weight_update(weight_version="never")
            raise AssertionError("the fleet committed without an engine")
        except rlserve.FleetError as e:
            t.check(e.phase == "verify" and list(e.failures) == [dead] and e.aborted, f"{e.phase} {e.failures}")
            t.check(dead in str(e) and e.versions[dead] is None, str(e))
    alive = [0, 2]
    t.check(fleet.state(alive) == [old[i] for i in alive], f"after the kill {fleet.state(alive)}")
    print(f"  {transport}: an engine killed before the commit; the others aborted, the error names it")


TORCH = {"BF16": "bfloat16", "F32": "float32", "F16": "float16"}


def run_transport(tmp, transport, model_a, model_b, files_a, files_b):
    start = time.monotonic()
    fleet = Fleet(tmp, model_a)
    fleet.files, fleet.new, fleet.model_b = files_a, files_b, model_b
    try:
        old = fleet.state()
        t.check(len(set(old)) == 1 and not old[0][2], f"three engines of the same checkpoint: {old}")
        check_refused_bucket(fleet, transport, old)
        check_trainer_killed(fleet, transport, old)
        check_good_updates(fleet, transport, 1)
        if transport == "http":
            check_split_and_roll_forward(fleet)
        old = fleet.state()
        check_engine_killed(fleet, transport, old)
    finally:
        fleet.stop()
    print(f"  {transport}: {time.monotonic() - start:.1f} s")


def main():
    with t.temp_dir() as tmp:
        model_a, model_b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
        t.run("make-model", "--preset", "tiny", "--out", model_a, "--seed", "31")
        t.run("make-model", "--preset", "tiny", "--out", model_b, "--seed", "32")
        files_a, files_b = file_tensors(model_a), file_tensors(model_b)
        for transport in ("http", "websocket"):
            run_transport(tmp, transport, model_a, model_b, files_a, files_b)
    print("test_fleet: all passed")


if __name__ == "__main__":
    main()
