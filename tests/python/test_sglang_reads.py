"""The SGLang routes trainers read that are not engine operations (docs/protocol.md,
'Compatibility with SGLang'), over HTTP against `rlserve serve` with both keys configured: each
route's auth level, and what a wrong method, a bad query or a bad body gets (a status and a
sentence naming the field; never a 404 for a route SGLang has).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import rlserve_testlib as t  # noqa: E402
import trainer_replay as r  # noqa: E402

USER, ADMIN = "reads-user-key", "reads-admin-key"


def bearer(key):
    return {"Authorization": f"Bearer {key}"}


def refused(reply, status, starts_with):
    t.check(reply.status == status, f"expected {status}: {reply.status} {reply.text}")
    message = reply.json()["message"]
    t.check(message.startswith(starts_with), f"message {message!r} does not start with {starts_with!r}")


def main():
    with t.temp_dir() as tmp:
        env = dict(os.environ, RLSERVE_CACHE_DIR=os.path.join(tmp, "cache"), RLSERVE_API_KEY=USER,
                   RLSERVE_ADMIN_API_KEY=ADMIN)
        proc, port = t.start_server(env, "--device", "cpu")
        engine = r.Engine(port)
        try:
            # Normal-level reads: the user key (and the admin key) open them; no key does not.
            for path in ("/get_weight_version", "/model_info", "/get_model_info", "/v1/loads", "/server_info"):
                t.check(engine.get(path).status == 401, f"{path} without a key")
                for key in (USER, ADMIN):
                    t.check(engine.get(path, headers=bearer(key)).status == 200, f"{path} with a key")
            for path in ("/get_weight_version", "/v1/loads", "/model_info"):
                t.check(engine.post(path, {}, headers=bearer(USER)).status == 405, f"POST {path}")
            version = engine.get("/get_weight_version", headers=bearer(USER)).json()
            t.check(version == {"weight_version": "0"}, version)

            # /v1/loads: SGLang's query parameters, checked.
            loads = engine.get("/v1/loads?include=core,queues", headers=bearer(USER)).json()
            t.check(loads["dp_rank_count"] == 1 and loads["loads"][0]["num_total_reqs"] == 0, loads)
            t.check(loads["timestamp"].endswith("+00:00") and loads["version"], loads)
            prom = engine.get("/v1/loads?format=prometheus&dp_rank=0", headers=bearer(USER))
            t.check(prom.status == 200 and 'sglang_num_running_reqs{dp_rank="0"} 0' in prom.text, prom.text)
            refused(engine.get("/v1/loads?include=core,gpu", headers=bearer(USER)), 400, 'include: "gpu"')
            refused(engine.get("/v1/loads?dp_rank=1", headers=bearer(USER)), 400, "dp_rank")
            refused(engine.get("/v1/loads?dp_rank=x", headers=bearer(USER)), 400, "dp_rank")
            refused(engine.get("/v1/loads?format=csv", headers=bearer(USER)), 400, "format")

            # /server_info: the ServerArgs fields trainers read.
            info = engine.get("/server_info", headers=bearer(USER)).json()
            for key in ("tp_size", "dp_size", "pp_size", "ep_size"):
                t.check(info[key] == 1, f"{key}: {info.get(key)}")
            t.check(info["disaggregation_mode"] == "null" and info["version"], info)
            refused(engine.post("/get_server_info", [1], headers=bearer(USER)), 400, "the request body")

            # Profiles: admin only; the body checked naming the field; a real Chrome trace of the
            # scheduler's and runner's steps, written at /stop_profile or after num_steps.
            trace_dir = os.path.join(tmp, "trace")
            os.makedirs(trace_dir)
            start = {"output_dir": trace_dir, "start_step": None, "activities": ["CPU", "GPU"],
                     "profile_by_stage": False, "with_stack": None, "record_shapes": None}
            t.check(engine.post("/start_profile", start).status == 401, "start_profile without a key")
            t.check(engine.post("/start_profile", start, headers=bearer(USER)).status == 401,
                    "start_profile with the user key")
            refused(engine.post("/stop_profile", {}, headers=bearer(ADMIN)), 400, "no profile is running")
            reply = engine.post("/start_profile", start, headers=bearer(ADMIN))
            t.check(reply.status == 200 and reply.text.startswith("Start profiling."), reply.text)
            refused(engine.post("/start_profile", start, headers=bearer(ADMIN)), 400, "a profile is already running")
            engine.post("/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}},
                        headers=bearer(USER)).raise_for_status("generate while profiling")
            reply = engine.post("/stop_profile", {}, headers=bearer(ADMIN))
            t.check(reply.status == 200 and reply.text.startswith("Stop profiling."), reply.text)
            traces = [os.path.join(trace_dir, f) for f in os.listdir(trace_dir)]
            t.check(len(traces) == 1 and traces[0].endswith(".trace.json"), traces)
            with open(traces[0]) as f:
                events = json.load(f)["traceEvents"]
            names = {(e.get("args", {}).get("name") if e["ph"] == "M" else e["name"]) for e in events}
            for name in ("scheduler", "runner target", "plan", "forward", "results", "run_batch"):
                t.check(name in names, f"the trace lacks {name!r}: {sorted(n for n in names if n)}")
            t.check(all(e["dur"] >= 0 and e["ts"] >= 0 for e in events if e["ph"] == "X"), "negative times")
            # num_steps: the trace is written by itself after that many steps.
            steps_dir = os.path.join(tmp, "steps")
            os.makedirs(steps_dir)
            # A GET (which any web page can make a browser send) may not choose where to write.
            refused(engine.get(f"/start_profile?num_steps=2&output_dir={steps_dir}", headers=bearer(ADMIN)),
                    400, "output_dir")
            t.check(os.listdir(steps_dir) == [], "a refused GET wrote nothing")
            reply = engine.post("/start_profile", {"num_steps": 2, "output_dir": steps_dir, "profile_prefix": "grpo"},
                                headers=bearer(ADMIN))
            t.check(reply.status == 200, reply.text)
            engine.post("/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}},
                        headers=bearer(USER)).raise_for_status("generate while profiling")
            written = os.listdir(steps_dir)
            t.check(len(written) == 1 and written[0].startswith("grpo-"), written)
            refused(engine.post("/stop_profile", {}, headers=bearer(ADMIN)), 400, "no profile is running")
            for field, value, name in (("num_steps", 0, "num_steps"), ("num_steps", "3", "num_steps"),
                                       ("activities", ["TPU"], "activities"), ("activities", "CPU", "activities"),
                                       ("activities", ["MEM"], "activities"),
                                       ("output_dir", 5, "output_dir"), ("output_dir", "", "output_dir"),
                                       ("output_dir", os.path.join(tmp, "missing"), "output_dir"),
                                       ("start_step", -1, "start_step"), ("start_step", 5, "start_step"),
                                       ("with_stack", "yes", "with_stack"), ("profile_id", "../up", "profile_id")):
                refused(engine.post("/start_profile", dict(start, **{field: value}), headers=bearer(ADMIN)), 400, name)
            refused(engine.request("POST", "/start_profile", [1], headers=bearer(ADMIN)), 400, "the request body")
            t.check(engine.request("HEAD", "/start_profile", headers=bearer(ADMIN)).status == 405, "HEAD")
            t.check(not os.path.exists(os.path.join(tmp, "missing")), "a refused profile made a directory")

            # weights_checker in SGLang's shape: "ranks", and the engine checksum.
            body = engine.post("/weights_checker", {"action": "checksum"}, headers=bearer(ADMIN)).json()
            t.check(len(body["ranks"]) == 1 and len(body["per_engine_checksum"]) == 16, body)
            refused(engine.post("/weights_checker", {"action": "weigh"}, headers=bearer(ADMIN)), 400, "action")
        finally:
            r.stop(proc)
    print("ok: get_weight_version, model_info, server_info, v1/loads, start/stop_profile, weights_checker")


if __name__ == "__main__":
    main()
