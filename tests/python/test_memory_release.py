"""release_memory_occupation / resume_memory_occupation through `rlserve serve` on the CPU: the
protocol and its rules (on the CPU the memory is host memory and stays allocated; the GPU machine
measures what a release gives back: tests/gpu/test_memory_release.py).

Checked, along a colocated trainer's step (pause with retract, release, resume the weights, update,
continue, resume the rest): a release while a request holds KV is refused; while released and
unpaused, generate is refused naming what to resume, and so are weight updates and checksums while
the weights are; a request retracted before the release waits (it is not failed) and finishes
after resume; resuming the weights alone lets an update in while generation stays refused;
unknown tags are refused with the tag named; the reply shapes are {success, message}.
"""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import rlserve_testlib as t  # noqa: E402
import trainer_replay as r  # noqa: E402


def main():
    with t.temp_dir() as tmp:
        model_a, model_b = r.make_models(tmp)
        proc, engine = r.start(tmp, model_a)
        try:
            prompt = r.prompt_ids()
            before = engine.post("/generate", {"input_ids": prompt, "sampling_params": {"max_new_tokens": 6, "temperature": 0}}).json()

            # A request holding KV: refused.
            long = {}
            th = threading.Thread(target=lambda: long.update(engine.post("/generate", {
                "input_ids": prompt, "sampling_params": {"max_new_tokens": 4000, "temperature": 0, "ignore_eos": True}}).json()),
                daemon=True)
            th.start()
            time.sleep(0.3)
            reply = engine.post("/release_memory_occupation", {"tags": ["kv_cache"]})
            t.check(reply.status == 400 and "hold KV" in reply.json()["message"], f"release while running: {reply.text}")

            # A colocated trainer's step: pause (retract), release everything, resume the weights,
            # update, continue, resume the rest. The retracted request waits; it is not failed.
            reply = engine.post("/pause_generation", {"mode": "retract"})
            t.check(reply.status == 200, reply.text)
            reply = engine.post("/release_memory_occupation", {})
            t.check(reply.status == 200 and reply.json()["success"], f"release all: {reply.text}")
            time.sleep(0.3)
            t.check(th.is_alive(), "the retracted request waits while the memory is released")

            sums = engine.post("/weights_checker", {"action": "checksum"})
            t.check(sums.status == 400 and "resume_memory_occupation" in sums.text, f"checksum while released: {sums.text}")
            bucket = r.inline_buckets(model_b)[0]
            upd = engine.post("/update_weights_from_tensor", {"named_tensors": bucket})
            t.check(upd.status == 400 and "weights" in upd.json()["message"] and "resume_memory_occupation" in upd.json()["message"],
                    f"update while the weights are released: {upd.text}")

            bad = engine.post("/release_memory_occupation", {"tags": ["kv_cache", "gpu"]})
            t.check(bad.status == 400 and "unknown memory tag" in bad.text and "gpu" in bad.text, f"unknown tag: {bad.text}")
            bad = engine.post("/resume_memory_occupation", {"tags": "weights"})
            t.check(bad.status == 400 and "tags" in bad.text, f"tags not a list: {bad.text}")

            # The weights alone: updates go in, generation still waits for the KV.
            reply = engine.post("/resume_memory_occupation", {"tags": ["weights"]})
            t.check(reply.status == 200 and reply.json()["success"], reply.text)
            for bucket in r.inline_buckets(model_b):
                upd = engine.post("/update_weights_from_tensor", {"named_tensors": bucket})
                t.check(upd.status == 200 and upd.json()["success"], f"update after resume(weights): {upd.text}")
            # Unpaused with the KV still released: a new request is refused at once (while paused
            # it would wait at the front door, as every request does); the retracted one waits.
            reply = engine.post("/continue_generation", {})
            t.check(reply.status == 200, reply.text)
            g = engine.post("/generate", {"input_ids": prompt, "sampling_params": {"max_new_tokens": 2}})
            t.check("kv_cache" in g.text and "resume_memory_occupation" in g.text, f"generate with the KV released: {g.text}")
            time.sleep(0.3)
            t.check(th.is_alive(), "the retracted request still waits")

            reply = engine.post("/resume_memory_occupation", {"tags": None})
            t.check(reply.status == 200 and reply.json()["success"], reply.text)
            th.join(120)
            t.check(not th.is_alive() and long.get("meta_info", {}).get("finish_reason", {}).get("type") in ("length", "abort"),
                    f"the retracted request finished after resume: {str(long)[:300]}")
            after = engine.post("/generate", {"input_ids": prompt, "sampling_params": {"max_new_tokens": 6, "temperature": 0}}).json()
            t.check(after["meta_info"]["weight_version"] != before["meta_info"]["weight_version"], "served by the new weights")
            sums = engine.post("/weights_checker", {"action": "checksum"}).json()
            t.check(sums["ranks"][0]["checksums"] == r.checkpoint_checksums(model_b), "the update landed")
        finally:
            r.stop(proc)
    print("ok: release/resume_memory_occupation rules on the CPU engine")


if __name__ == "__main__":
    main()
