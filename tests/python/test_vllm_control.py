"""vLLM's RL control routes over HTTP against `rlserve serve` (docs/protocol.md, "vLLM's dialect").

The routes as docs/protocol.md's "vLLM's dialect" table states them (vLLM's RL router and its
sleep router): /pause?mode=
abort|wait|keep, /resume, /is_paused, /abort_requests, /sleep?level=, /wake_up?tags=,
/is_sleeping, /reset_prefix_cache, /update_weight_version, /weight_info.

Every wait here is for observable state (a streamed chunk that proves a request runs, a reply),
never a sleep: a request in flight is a streamed /generate whose first event has arrived, long
enough (ignore_eos, most of the context) that the pause reaches it before it ends.
"""
import http.client
import json
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(__file__))
import rlserve_testlib as t  # noqa: E402
import trainer_replay as r  # noqa: E402

LONG = 1800  # tokens: the tiny model's context is 2048


class Streamed:
    """A streamed SGLang /generate on a thread; `started` is set at its first event."""

    def __init__(self, port, max_new_tokens=LONG, headers=None):
        self.port, self.max_new_tokens, self.headers = port, max_new_tokens, headers or {}
        self.started, self.last, self.error = threading.Event(), None, None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
            body = {"input_ids": r.prompt_ids(), "stream": True,
                    "sampling_params": {"max_new_tokens": self.max_new_tokens, "temperature": 0.0,
                                        "ignore_eos": True}}
            conn.request("POST", "/generate", json.dumps(body),
                         {"Content-Type": "application/json", **self.headers})
            resp = conn.getresponse()
            for raw in resp:
                line = raw.decode().strip()
                if line.startswith("data:") and line[5:].strip() != "[DONE]":
                    self.last = json.loads(line[5:])
                    self.started.set()
        except Exception as e:  # noqa: BLE001 - reported by result()
            self.error = e
        finally:
            self.started.set()

    def result(self):
        self.thread.join(300)
        t.check(not self.thread.is_alive(), "the streamed request never ended")
        t.check(self.error is None, f"the streamed request failed: {self.error}")
        return self.last


def finish_type(out):
    return out["meta_info"]["finish_reason"]["type"]


def greedy(engine, n=8):
    out = engine.post("/generate", {"input_ids": r.prompt_ids(),
                                    "sampling_params": {"max_new_tokens": n, "temperature": 0.0}})
    return out.raise_for_status("generate").json()["output_ids"]


def generate_on_thread(engine, result):
    def run():
        result["ids"] = greedy(engine)
    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def expect(reply, status, body=None, what=""):
    t.check(reply.status == status, f"{what}: HTTP {reply.status} {reply.text}, expected {status}")
    if body is not None:
        t.check(reply.json() == body, f"{what}: {reply.text}, expected {body}")


def expect_bad(reply, param, what):
    expect(reply, 400, what=what)
    err = reply.json()["error"]
    t.check(err["param"] == param and err["code"] == 400 and param.split(".")[-1] in err["message"],
            f"{what}: {reply.text}")


def pause_modes(engine, port):
    # Refusals name the parameter and change nothing.
    expect_bad(engine.post("/pause?mode=stop", None), "query.mode", "unknown mode")
    expect_bad(engine.post("/pause?clear_cache=maybe", None), "query.clear_cache", "bad clear_cache")
    expect(engine.get("/is_paused"), 200, {"is_paused": False}, "after refusals")
    expect(engine.get("/pause"), 405, what="GET /pause")
    expect(engine.post("/is_paused", None), 405, what="POST /is_paused")

    # keep: the request in flight is frozen and goes on after /resume, whole.
    s = Streamed(port)
    s.started.wait(60)
    expect(engine.post("/pause?mode=keep", None), 200, {"status": "paused"}, "pause keep")
    expect(engine.get("/is_paused"), 200, {"is_paused": True}, "paused")
    expect(engine.post("/pause?mode=keep", None), 200, {"status": "paused"}, "pause is idempotent")
    t.check(s.thread.is_alive(), "a kept request ended while paused")
    expect(engine.post("/resume", None), 200, {"status": "resumed"}, "resume")
    out = s.result()
    t.check(finish_type(out) == "length" and len(out["output_ids"]) == LONG, f"keep: {out['meta_info']}")
    expect(engine.post("/resume", None), 200, {"status": "resumed"}, "resume is idempotent")

    # abort: the request in flight ends with its partial tokens and finish reason abort.
    s = Streamed(port)
    s.started.wait(60)
    expect(engine.post("/pause?mode=abort&clear_cache=false", None), 200, {"status": "paused"}, "pause abort")
    out = s.result()
    t.check(finish_type(out) == "abort" and len(out["output_ids"]) < LONG, f"abort: {out['meta_info']}")
    # A request sent while paused waits for /resume (any mode).
    waiting = {}
    th = generate_on_thread(engine, waiting)
    expect(engine.get("/is_paused"), 200, {"is_paused": True}, "still paused")
    t.check(th.is_alive() and "ids" not in waiting, "a request completed while paused")
    expect(engine.post("/resume", None), 200, {"status": "resumed"}, "resume after abort")
    th.join(120)
    t.check(len(waiting.get("ids", [])) == 8, f"the waiting request: {waiting}")

    # wait: running requests finish; the reply comes once they have.
    s = Streamed(port, max_new_tokens=300)
    s.started.wait(60)
    expect(engine.post("/pause?mode=wait", None), 200, {"status": "paused"}, "pause wait")
    info = engine.get("/server_info").json()
    t.check(info["running_requests"] == 0, f"pause wait answered with requests running: {info}")
    out = s.result()
    t.check(finish_type(out) == "length" and len(out["output_ids"]) == 300, f"wait: {out['meta_info']}")
    expect(engine.post("/resume", None), 200, {"status": "resumed"}, "resume after wait")


def abort_requests(engine, port):
    expect_bad(engine.post("/abort_requests", {"request_ids": "x"}), "body.request_ids", "not a list")
    expect_bad(engine.post("/abort_requests", {"request_ids": [1]}), "body.request_ids", "not strings")
    expect_bad(engine.post("/abort_requests", [1]), "body", "not an object")
    expect(engine.post("/abort_requests", {"request_ids": ["nobody"]}), 200,
           {"status": "aborted", "aborted": 0}, "an unknown id")
    s = Streamed(port)
    s.started.wait(60)
    expect(engine.post("/abort_requests", {}), 200, {"status": "aborted", "aborted": 1}, "abort all")
    t.check(finish_type(s.result()) == "abort", "abort_requests did not abort")
    expect(engine.get("/is_paused"), 200, {"is_paused": False}, "abort_requests does not pause")


def sleep_wake(engine):
    before = greedy(engine)
    expect_bad(engine.post("/sleep?level=3", None), "query.level", "bad level")
    expect_bad(engine.post("/sleep?mode=nap", None), "query.mode", "bad sleep mode")
    expect_bad(engine.post("/wake_up?tags=cuda_graph", None), "query.tags", "unknown tag")
    expect(engine.get("/is_sleeping"), 200, {"is_sleeping": False}, "awake")
    for level in ("0", "1", "2"):
        reply = engine.post(f"/sleep?level={level}", None)
        expect(reply, 200, what=f"sleep level {level}")
        t.check(reply.text == "", f"sleep's body is empty: {reply.text!r}")
        expect(engine.get("/is_sleeping"), 200, {"is_sleeping": True}, f"asleep at {level}")
        waiting = {}
        th = generate_on_thread(engine, waiting)
        if level != "0":
            # Partial wake: still asleep, the request still waits.
            expect(engine.post("/wake_up?tags=weights", None), 200, what="wake weights")
            expect(engine.get("/is_sleeping"), 200, {"is_sleeping": True}, "weights awake, KV asleep")
            t.check(th.is_alive(), "a request ran with the KV asleep")
            expect(engine.post("/wake_up?tags=kv_cache&tags=weights", None), 200, what="wake the rest")
        else:
            expect(engine.post("/wake_up", None), 200, what="wake level 0")
        expect(engine.get("/is_sleeping"), 200, {"is_sleeping": False}, f"awake after {level}")
        th.join(120)
        t.check(waiting.get("ids") == before, f"level {level}: {waiting} != {before}")
        t.check(greedy(engine) == before, f"greedy output after a level-{level} sleep")
    expect(engine.post("/wake_up", None), 200, what="waking an awake engine is a no-op")
    expect(engine.post("/reset_prefix_cache", None), 200, {"success": True}, "reset_prefix_cache")
    expect_bad(engine.post("/reset_prefix_cache?reset_running_requests=sure", None),
               "query.reset_running_requests", "bad reset_running_requests")


def versions(engine):
    expect(engine.get("/weight_info"), 200, {"weight_version": "default"}, "the initial version")
    reply = engine.post("/update_weight_version", {"new_version": "step-1"})
    t.check(reply.status == 200 and reply.json()["success"] and reply.json()["new_version"] == "step-1", reply.text)
    expect(engine.get("/weight_info"), 200, {"weight_version": "step-1"}, "after update_weight_version")
    expect(engine.get("/get_weight_version"), 200, {"weight_version": "step-1"}, "SGLang's read agrees")
    expect(engine.post("/update_weight_version", {}), 400, what="no new_version")


def mixed_dialects(engine):
    # One pause state: SGLang's pause is ended by vLLM's resume and the reverse.
    expect(engine.post("/pause_generation", {"mode": "retract"}), 200, what="SGLang pause")
    expect(engine.get("/is_paused"), 200, {"is_paused": True}, "vLLM sees SGLang's pause")
    expect(engine.post("/resume", None), 200, {"status": "resumed"}, "vLLM resume")
    expect(engine.post("/pause?mode=keep", None), 200, {"status": "paused"}, "vLLM pause")
    t.check(engine.get("/server_info").json()["paused"], "SGLang sees vLLM's pause")
    expect(engine.post("/continue_generation", {}), 200, what="SGLang continue")
    expect(engine.get("/is_paused"), 200, {"is_paused": False}, "continued")
    greedy(engine)


def sleep_disabled(tmp, model):
    proc, engine = r.start(tmp, model)
    try:
        for path in ("/sleep", "/wake_up"):
            reply = engine.post(path, None)
            t.check(reply.status == 500 and "--enable-sleep-mode" in reply.text, f"{path}: {reply.text}")
        expect(engine.get("/is_sleeping"), 200, {"is_sleeping": False}, "is_sleeping without sleep mode")
        expect(engine.get("/weight_info"), 200, {"weight_version": "0"}, "rlserve's default version")
    finally:
        r.stop(proc)


def admin_key(tmp, model):
    proc, engine = r.start(tmp, model, "--admin-api-key", "A", "--api-key", "U")
    try:
        expect(engine.post("/pause?mode=keep", None), 401, what="pause without a key")
        expect(engine.post("/pause?mode=keep", None, {"Authorization": "Bearer U"}), 401,
               what="pause with the normal key")
        expect(engine.post("/pause?mode=keep", None, {"Authorization": "Bearer A"}), 200,
               {"status": "paused"}, "pause with the admin key")
        expect(engine.get("/is_paused", {"Authorization": "Bearer U"}), 200, {"is_paused": True},
               "is_paused with the normal key")
        expect(engine.post("/resume", None), 401, what="resume without a key")
        expect(engine.post("/resume", None, {"Authorization": "Bearer A"}), 200, what="resume")
    finally:
        r.stop(proc)


def main():
    with t.temp_dir() as tmp:
        model, _ = r.make_models(tmp)
        proc, engine = r.start(tmp, model, "--enable-sleep-mode", "--weight-version", "default")
        try:
            pause_modes(engine, engine.port)
            abort_requests(engine, engine.port)
            sleep_wake(engine)
            versions(engine)
            mixed_dialects(engine)
            greedy(engine)  # still serving
        finally:
            r.stop(proc)
        sleep_disabled(tmp, model)
        admin_key(tmp, model)
    print("ok: vLLM's control routes (pause modes, resume, abort, sleep/wake, versions, keys)")


if __name__ == "__main__":
    main()
