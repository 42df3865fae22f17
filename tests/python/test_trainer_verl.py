"""verl's calls for one RL step, replayed against `rlserve serve` as verl's HTTP adapter sends them.

Read from volcengine/verl at commit b178a3cd56f58b2d502255daba591e92833930a7:
  verl/workers/rollout/sglang_rollout/http_server_engine.py
                                   AsyncHttpServerAdapter: the HTTP calls and their bodies
                                   (generate drops None fields; update_weights_from_tensor
                                   {serialized_named_tensors, load_format, flush_cache};
                                   flush_cache GETs until 200 and reads a non-JSON body as
                                   {content_type, text}; abort_request {rid, abort_all})
  verl/workers/rollout/sglang_rollout/sglang_rollout.py
                                   ServerAdapter.update_weights: the buckets, then flush_cache
                                   (no pause, no weight_version: the engine is asleep or idle);
                                   release: release_memory_occupation {"tags": ["kv_cache",
                                   "weights"]}; resume(tags): resume_memory_occupation {"tags"}
  verl/workers/rollout/sglang_rollout/async_sglang_server.py
                                   generate: the request fields (rid, input_ids, sampling_params
                                   with max_new_tokens, return_logprob popped from "logprobs")
                                   and the reply fields read (meta_info.output_token_logprobs,
                                   output_ids)
  verl/experimental/agent_loop/agent_loop.py
                                   the sampling params: temperature, top_p, top_k,
                                   repetition_penalty 1.0, logprobs

verl's step has no pause, continue or version call: between rollouts it puts the engine to sleep
(release_memory_occupation), wakes its weights, sends the buckets, flushes the cache and wakes the
KV cache. The replay does the same, then checks that the next rollout is served by a new version
(rlserve numbers each commit that names no version: "0" -> "1" -> ...) with the new weights. On
the CPU engine a release only marks the memory (it is host memory), so what is checked is the
protocol: the calls succeed, and while asleep a generate request is refused naming what to
resume.

What the replay leaves out, and why:
  - serialized_named_tensors (base64 CUDA IPC pickles) with load_format "flattened_bucket": the
    CPU engine takes the same request with named_tensors (inline base64, docs/protocol.md).
  - return_routed_experts (routing replay): the replay's model is dense, so it would return no
    rows; tests/python/test_generation_features.py checks the payload on a Qwen3-MoE in the
    layout the trainers' decoders read ([len(tokens) - 1 - start, layers, top_k] int32, base64).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import rlserve_testlib as t  # noqa: E402
import trainer_replay as r  # noqa: E402


def generate(engine, rid, max_new_tokens=6):
    sampling_params = dict(temperature=1.0, top_p=1.0, top_k=-1, repetition_penalty=1.0)
    sampling_params["max_new_tokens"] = max_new_tokens
    payload = {"rid": rid, "input_ids": r.prompt_ids(), "sampling_params": sampling_params,
               "return_logprob": True}
    output = engine.post("/generate", payload).raise_for_status("generate").json()
    pairs = output["meta_info"]["output_token_logprobs"]
    # verl unpacks each entry as (logprob, token_id, text): SGLang's triple.
    log_probs, token_ids, _ = zip(*pairs)
    t.check(list(token_ids) == output["output_ids"], output)
    r.check_output_length(output["meta_info"], len(log_probs), max_new_tokens)
    return output["meta_info"]["weight_version"]


def flush_cache(engine):
    """AsyncHttpServerAdapter.flush_cache: GET until 200; the body is text, not JSON."""
    for _ in range(12):
        reply = engine.get("/flush_cache")
        if reply.status == 200:
            t.check(reply.content_type.startswith("text/plain"), reply.content_type)
            return reply.text
    raise AssertionError("flush_cache never answered 200")


def main():
    with t.temp_dir() as tmp:
        model_a, model_b = r.make_models(tmp)
        proc, engine = r.start(tmp, model_a)
        try:
            t.check(generate(engine, "verl-step0-sample0") == "0", "the first rollout's version")
            # Partial rollout: abort what is left.
            reply = engine.post("/abort_request", {"rid": "", "abort_all": True})
            t.check(reply.raise_for_status("abort_request").json()["success"], reply.text)
            # AsyncHttpServerAdapter.abort_request's defaults (rid "", abort_all False): SGLang
            # aborts nothing and answers 200; so does rlserve, and the engine still serves.
            reply = engine.post("/abort_request", {"rid": "", "abort_all": False})
            body = reply.raise_for_status("abort_request with neither rid nor abort_all").json()
            t.check(body["success"] and body["num_aborted"] == 0 and "nothing to abort" in body["message"], reply.text)

            # release: asleep between rollouts.
            reply = engine.post("/release_memory_occupation", {"tags": ["kv_cache", "weights"]})
            t.check(reply.raise_for_status("release_memory_occupation").json()["success"], reply.text)
            asleep = engine.post("/generate", {"input_ids": r.prompt_ids(), "sampling_params": {"max_new_tokens": 2}})
            t.check("resume_memory_occupation" in asleep.text, f"generate while asleep: {asleep.text}")
            reply = engine.post("/resume_memory_occupation", {"tags": ["weights"]})
            t.check(reply.raise_for_status("resume_memory_occupation").json()["success"], reply.text)

            # ServerAdapter.update_weights: the buckets, then one flush. Generation is not paused,
            # so each bucket commits as it arrives (SGLang applies it at once too) and, naming no
            # version, moves rlserve's version by one (docs/architecture.md, 'Versions').
            buckets = r.inline_buckets(model_b)
            for bucket in buckets:
                reply = engine.post("/update_weights_from_tensor", {"named_tensors": bucket, "flush_cache": False})
                t.check(reply.raise_for_status("update_weights_from_tensor").json()["success"], reply.text)
            t.check("flushed" in flush_cache(engine).lower(), "flush_cache's text")
            reply = engine.post("/resume_memory_occupation", {"tags": ["kv_cache"]})
            t.check(reply.raise_for_status("resume_memory_occupation").json()["success"], reply.text)

            version = generate(engine, "verl-step1-sample0")
            t.check(version == str(len(buckets)), f"the rollout after the update served version {version}")
            sums = engine.post("/weights_checker", {"action": "checksum"}).raise_for_status("checksum").json()
            t.check(sums["ranks"][0]["checksums"] == r.checkpoint_checksums(model_b), "the update did not land")
        finally:
            r.stop(proc)
    print("ok: verl's step (sleep, wake weights, buckets, flush, wake KV, next rollout) against rlserve serve")


if __name__ == "__main__":
    main()
