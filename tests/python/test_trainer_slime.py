"""slime's calls for one RL step, replayed against `rlserve serve` as slime sends them.

Read from THUDM/slime at commit 624b824a898ab0ec1fcb4d373004c7f3852bf515:
  slime/backends/sglang_utils/sglang_engine.py   SGLangEngine: the HTTP calls and their bodies
                                                 (_make_request POSTs json=payload or {};
                                                 flush_cache GETs until 200; get_weight_version
                                                 reads ["weight_version"]; health_generate)
  (and at commit 03b32d8baeb8932ccac1d20151f1474ec07651bb: _compute_server_args, the fields an
  external engine's /get_server_info must equal: enable_memory_saver (--offload-rollout), host,
  port, nnodes, node_rank, gpu_id_step, base_gpu_id, tp/dp/pp/ep_size, and
  enable_return_routed_experts with --use-rollout-routing-replay; release_memory_occupation
  flushes then POSTs {}, resume_memory_occupation {"tags": [...]}; train.py with
  --offload-rollout onloads weights, updates, then onloads cuda_graph and kv_cache)
  slime/backends/sglang_utils/external.py        get_server_info: GET /server_info, then
                                                 /get_server_info; reads tp_size, pp_size, ep_size,
                                                 moe_dp_size, num_gpus, disaggregation_mode,
                                                 encoder_only, disaggregation_bootstrap_port
  slime/rollout/sglang_rollout.py                generate: the payload and the reply fields read
                                                 (meta_info.output_token_logprobs, text,
                                                 finish_reason.type, weight_version, ...)
  slime/utils/types.py                           Sample._apply_meta_info: meta_info fields read
  slime/backends/sglang_utils/server_control.py  after a rollout: abort_request {abort_all}, then
                                                 GET /v1/loads?include=core until no request is left
  slime/backends/megatron_utils/update_weight/update_weight_from_tensor.py
                                                 update_weights: pause, flush, buckets, continue
  slime/ray/actor_group.py                       _reload_rollout_weights_from_disk: pause, flush,
                                                 update_weights_from_disk, get_weight_version,
                                                 continue
  slime/ray/placement_group.py                   --check-weight-update-equal: weights_checker
                                                 snapshot, then reset_tensors, before training
  slime/utils/health_monitor.py                  GET /health_generate between steps

Also read, at the same commit 624b824a898ab0ec1fcb4d373004c7f3852bf515:
  slime/rollout/sglang_rollout.py                GenerateState: with --rollout-top-p other than
                                                 1.0, sampling_params.custom_params =
                                                 {"return_top_p_token_ids": True}
  slime/utils/types.py, slime/backends/megatron_utils/loss.py
                                                 _extract_rollout_top_p_token_data reads
                                                 meta_info.top_p_token_ids / top_p_token_offsets
                                                 (docker/patch/latest/sglang-top_p.patch), and
                                                 get_rollout_top_p_logprob_kwargs raises when a
                                                 rollout lacks them (test_top_p_replay.py checks
                                                 the kept sets against numpy)
  slime/rollout/sglang_streaming_rollout.py      generate_streaming: "stream": true; each data:
                                                 event is the result so far (text,
                                                 meta_info.output_token_logprobs), the terminal
                                                 fields (finish_reason, weight_version) read only
                                                 once meta_info.finish_reason is set
  slime/agent/adapters/common.py                 call_sglang_generate: {rid, input_ids,
                                                 sampling_params, return_logprob}, and on a
                                                 client cancel abort_request {"rid": rid}

What the replay leaves out, and why:
  - serialized_named_tensors (CUDA IPC pickles of the trainer's GPU tensors): rlserve's CPU
    engine takes the same request with named_tensors (inline base64, docs/protocol.md); the
    tensors are the next checkpoint's. load_format "flattened_bucket" describes the pickle, so it
    is not sent with inline tensors.
  - return_routed_experts (routing replay): the replay's model is dense, so it would return no
    rows; tests/python/test_generation_features.py checks the payload on a Qwen3-MoE in the
    layout the trainers' decoders read ([len(tokens) - 1 - start, layers, top_k] int32, base64).
  - post_process_weights(restore / post_process_quantization): slime sends it only for
    compressed-tensors checkpoints; the tiny model is BF16.
  - pull_weights (slime's patched SGLang): not served. init/destroy_weights_update_group +
    update_weights_from_distributed (NCCL) need a GPU engine and a trainer process group:
    tests/gpu/test_nccl_update*.py.
"""
import base64
import json
import os
import struct
import sys
import threading

sys.path.insert(0, os.path.dirname(__file__))
import rlserve_testlib as t  # noqa: E402
import trainer_replay as r  # noqa: E402

# SGLangEngine._wait_server_healthy sends these headers (api_key None when none is configured).
HEALTH_HEADERS = {"Content-Type": "application/json; charset=utf-8", "Authorization": "Bearer None"}


def slime_sampling_params(max_new_tokens):
    """GenerateState.sampling_params with slime's defaults (rollout_top_p 1.0: no custom_params),
    plus sampling_seed as generate_and_rm_group sets it under deterministic inference."""
    return dict(temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=max_new_tokens, stop=None,
                stop_token_ids=None, skip_special_tokens=True, no_stop_trim=True,
                spaces_between_special_tokens=False, sampling_seed=1234)


def generate(engine, max_new_tokens=6):
    payload = {"sampling_params": slime_sampling_params(max_new_tokens), "return_logprob": True,
               "input_ids": r.prompt_ids()}
    output = engine.post("/generate", payload).raise_for_status("generate").json()
    meta = output["meta_info"]
    # sglang_rollout.generate and Sample._apply_meta_info.
    tokens = [item[1] for item in meta["output_token_logprobs"]]
    logprobs = [item[0] for item in meta["output_token_logprobs"]]
    t.check(len(tokens) == len(logprobs), meta)
    r.check_output_length(meta, len(tokens), max_new_tokens)
    t.check(isinstance(output["text"], str), output)
    t.check(meta["finish_reason"]["type"] in ("length", "stop", "abort"), meta)
    for key in ("cached_tokens", "prompt_tokens", "completion_tokens"):
        t.check(isinstance(meta.get(key, 0), int), f"{key}: {meta}")
    t.check(meta.get("id"), meta)
    return meta["weight_version"], tokens


def top_p_replay(engine):
    """--rollout-top-p 0.9: GenerateState adds custom_params.return_top_p_token_ids; the reply
    carries meta_info.top_p_token_ids / top_p_token_offsets (base64 int32), which
    Sample._apply_meta_info takes when len(offsets) == the new tokens + 1 (the kept sets
    themselves are checked against numpy in test_top_p_replay.py)."""
    params = dict(slime_sampling_params(4), top_p=0.9, custom_params={"return_top_p_token_ids": True})
    out = engine.post("/generate", {"sampling_params": params, "return_logprob": True,
                                    "input_ids": r.prompt_ids()}).raise_for_status("top-p replay").json()
    meta = out["meta_info"]
    ids = base64.b64decode(meta["top_p_token_ids"])
    offsets = struct.unpack(f"<{len(base64.b64decode(meta['top_p_token_offsets'])) // 4}i",
                            base64.b64decode(meta["top_p_token_offsets"]))
    t.check(len(offsets) == len(meta["output_token_logprobs"]) + 1 and offsets[0] == 0
            and offsets[-1] * 4 == len(ids), meta)
    # Other custom_params (a custom logit processor's, which rlserve refuses separately) are
    # accepted and ignored, as is the switch when false: no top-p fields then.
    for custom in ({"return_top_p_token_ids": False}, {"some_processor_arg": 1}):
        params = dict(slime_sampling_params(2), top_p=0.9, custom_params=custom)
        meta = engine.post("/generate", {"sampling_params": params, "input_ids": r.prompt_ids()}).raise_for_status(
            f"custom_params {custom}").json()["meta_info"]
        t.check("top_p_token_ids" not in meta and "top_p_token_offsets" not in meta, meta)


def generate_streaming(engine, max_new_tokens=5):
    """sglang_streaming_rollout.generate_streaming: the events as slime reads them."""
    payload = {"sampling_params": slime_sampling_params(max_new_tokens), "return_logprob": True,
               "stream": True, "input_ids": r.prompt_ids()}
    reply = engine.post("/generate", payload).raise_for_status("generate (stream)")
    tokens, last_meta, text = [], {}, ""
    for line in reply.text.splitlines():
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if not data or data == "[DONE]":
            continue
        chunk = json.loads(data)
        meta = chunk.get("meta_info") or {}
        last_meta = meta
        text = chunk.get("text", text)
        if "output_token_logprobs" in meta:
            new_tokens = [item[1] for item in meta["output_token_logprobs"]]
            # Cumulative within the call: each event repeats the tokens before it.
            t.check(new_tokens[:len(tokens)] == tokens, f"events are not cumulative: {tokens} then {new_tokens}")
            tokens = new_tokens
        if not meta.get("finish_reason"):
            t.check(meta.get("routed_experts") is None, meta)
    t.check(last_meta.get("finish_reason"), f"the last event has no finish_reason: {last_meta}")
    r.check_output_length(last_meta, len(tokens), max_new_tokens)
    t.check(isinstance(text, str) and last_meta.get("weight_version") is not None, last_meta)
    return tokens


def flush_cache(engine):
    """SGLangEngine.flush_cache: GET until 200, at most 60 tries."""
    for _ in range(60):
        if engine.get("/flush_cache").status == 200:
            return
    raise AssertionError("flush_cache never answered 200")


def main():
    with t.temp_dir() as tmp:
        model_a, model_b = r.make_models(tmp)
        proc, engine = r.start(tmp, model_a)
        try:
            # Start-up: the health wait, then (external engines) the server's parallel config.
            engine.get("/health_generate", headers=HEALTH_HEADERS).raise_for_status("health_generate")
            info = engine.get("/server_info").raise_for_status("server_info").json()
            pp = int(info.get("pp_size") or info.get("pipeline_parallel_size") or 1)
            tp = int(info.get("tp_size") or info.get("tensor_parallel_size") or 1)
            num_gpus = int(info.get("num_gpus") or info.get("num_gpus_per_engine") or tp * pp)
            t.check((tp, pp, num_gpus) == (1, 1, 1), info)
            t.check(int(info.get("ep_size") or 1) == 1 and int(info.get("moe_dp_size") or 1) == 1, info)
            t.check(not info.get("encoder_only") and info.get("disaggregation_mode") not in ("prefill", "decode"),
                    info)
            t.check(info.get("disaggregation_bootstrap_port") is None, info)
            # _sanity_check_server_args: the fields not skipped must equal what slime would launch.
            t.check(info.get("enable_memory_saver") is False, "enable_memory_saver (no --offload-rollout)")
            t.check(engine.get("/get_server_info").status == 200, "the older name answers too")

            # --check-weight-update-equal, before the first rollout.
            for action in ("snapshot", "reset_tensors"):
                reply = engine.post("/weights_checker", {"action": action}).raise_for_status(action).json()
                t.check(reply["success"], reply)

            # Rollout on the initial weights (the reset ones: any tokens will do).
            version, _ = generate(engine)
            t.check(version == "0", version)
            top_p_replay(engine)
            generate_streaming(engine)
            # The agent adapters' turn, and their abort of it by rid on a client cancel (the
            # request has finished by then: SGLang answers an unknown rid with success too).
            rid = "0123456789abcdef0123456789abcdef"
            body = {"rid": rid, "input_ids": r.prompt_ids(), "return_logprob": True,
                    "sampling_params": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "skip_special_tokens": False,
                                        "no_stop_trim": True, "max_new_tokens": 3}}
            turn = engine.post("/generate", body).raise_for_status("agent turn").json()
            t.check(len(turn["meta_info"]["output_token_logprobs"]) == turn["meta_info"]["completion_tokens"], turn)
            engine.post("/abort_request", {"rid": rid}).raise_for_status("abort_request by rid")

            # End of the rollout: abort what is left, poll the load until idle.
            engine.post("/abort_request", {"abort_all": True}).raise_for_status("abort_request")
            load = engine.get("/v1/loads?include=core").raise_for_status("v1/loads").json()
            t.check(num_requests_from_load(load) == 0, load)

            # update_weights (tensor transport): pause, flush, the buckets, continue.
            engine.post("/pause_generation", {}).raise_for_status("pause_generation")
            flush_cache(engine)
            for bucket in r.inline_buckets(model_b):
                payload = {"named_tensors": bucket, "flush_cache": False, "weight_version": "1"}
                reply = engine.post("/update_weights_from_tensor", payload).raise_for_status("update").json()
                t.check(reply["success"], reply)
                # Staged until continue_generation: the buckets' version is not reported before
                # the weights it names serve.
                t.check(get_weight_version(engine) == "0", "the version moved before the commit")
            engine.post("/continue_generation", {}).raise_for_status("continue_generation")
            t.check(get_weight_version(engine) == "1", "the tensor update's version")
            version, _ = generate(engine)
            t.check(version == "1", f"generation after the update served version {version}")
            # Every tensor the reset poisoned was rewritten with the next checkpoint's bytes.
            sums = engine.post("/weights_checker", {"action": "checksum"}).raise_for_status("checksum").json()
            t.check(sums["ranks"][0]["checksums"] == r.checkpoint_checksums(model_b), "the update did not land")

            # The disk transport (update_weight_transport == "disk"): the same step from a checkpoint.
            engine.post("/pause_generation", {}).raise_for_status("pause_generation")
            flush_cache(engine)
            reply = engine.post("/update_weights_from_disk", {"model_path": model_a, "weight_version": "2"})
            t.check(reply.raise_for_status("update_weights_from_disk").json()["success"], reply.text)
            t.check(get_weight_version(engine) == "2", "weight version mismatch after disk reload")
            engine.post("/continue_generation", {}).raise_for_status("continue_generation")
            version, _ = generate(engine)
            t.check(version == "2", f"generation after the disk reload served version {version}")

            # The health monitor between steps.
            engine.get("/health_generate").raise_for_status("health_generate")
        finally:
            r.stop(proc)
        colocated_external_engine(tmp, model_a, model_b)
        deterministic_inference(tmp, model_a)
    print("ok: slime's step (tensor and disk transports) against rlserve serve")


def update_weights(engine, model_dir, version):
    """update_weight_from_tensor: pause, flush, the buckets, continue."""
    engine.post("/pause_generation", {}).raise_for_status("pause_generation")
    flush_cache(engine)
    for bucket in r.inline_buckets(model_dir):
        payload = {"named_tensors": bucket, "flush_cache": False, "weight_version": version}
        reply = engine.post("/update_weights_from_tensor", payload).raise_for_status("update").json()
        t.check(reply["success"], reply)
    engine.post("/continue_generation", {}).raise_for_status("continue_generation")


def onload(engine, tag):
    reply = engine.post("/resume_memory_occupation", {"tags": [tag]}).raise_for_status(f"onload {tag}").json()
    t.check(reply["success"], reply)


def colocated_external_engine(tmp, model_a, model_b):
    """slime with --rollout-external, --offload-rollout and --use-rollout-routing-replay: the
    engine launched with SGLang's matching flags passes _sanity_check_server_args, and the
    offload cycle (release, onload weights, update, onload cuda_graph then kv_cache) works."""
    proc, engine = r.start(tmp, model_a, "--enable-memory-saver", "--enable-return-routed-experts")
    try:
        info = engine.get("/get_server_info").raise_for_status("get_server_info").json()
        expect = {"enable_memory_saver": True, "host": "127.0.0.1", "port": engine.port, "nnodes": 1,
                  "node_rank": 0, "gpu_id_step": 1, "base_gpu_id": 0, "tp_size": 1, "dp_size": 1,
                  "pp_size": 1, "ep_size": 1, "enable_return_routed_experts": True}
        wrong = {k: (v, info.get(k)) for k, v in expect.items() if info.get(k) != v}
        t.check(not wrong, f"_sanity_check_server_args: expected vs actual {wrong}")

        # train.py at start-up: onload weights (nothing was released: a no-op), the first update,
        # then the rest.
        onload(engine, "weights")
        update_weights(engine, model_b, "1")
        onload(engine, "cuda_graph")
        onload(engine, "kv_cache")
        version, _ = generate(engine)
        t.check(version == "1", version)
        for step in (2, 3):
            engine.post("/abort_request", {"abort_all": True}).raise_for_status("abort_request")
            flush_cache(engine)  # SGLangEngine.release_memory_occupation: flush, then release all
            reply = engine.post("/release_memory_occupation", {}).raise_for_status("release").json()
            t.check(reply["success"], reply)
            onload(engine, "weights")
            update_weights(engine, model_a if step % 2 == 0 else model_b, str(step))
            onload(engine, "cuda_graph")
            onload(engine, "kv_cache")
            version, _ = generate(engine)
            t.check(version == str(step), f"offload step {step}: served version {version}")
        sums = engine.post("/weights_checker", {"action": "checksum"}).raise_for_status("checksum").json()
        t.check(sums["ranks"][0]["checksums"] == r.checkpoint_checksums(model_b), "the last update did not land")
    finally:
        r.stop(proc)
    print("ok: slime's external-engine check and --offload-rollout cycle against rlserve serve")


def deterministic_inference(tmp, model_a):
    """slime with --sglang-enable-deterministic-inference: the engine launched with SGLang's flag
    reports it, and a group's samples (sampling_seed = rollout_seed + i, as GenerateState seeds
    them) come back with the same tokens and logprobs whether the group runs alone or beside
    other requests."""
    proc, engine = r.start(tmp, model_a, "--enable-deterministic-inference")
    try:
        info = engine.get("/get_server_info").raise_for_status("get_server_info").json()
        t.check(info.get("enable_deterministic_inference") is True, f"server_info: {info}")

        def group(seed_base, n=4):
            bodies = [{"input_ids": r.prompt_ids(), "return_logprob": True,
                       "sampling_params": dict(slime_sampling_params(6), sampling_seed=seed_base + i)}
                      for i in range(n)]
            return bodies

        def run(bodies):
            outs = [None] * len(bodies)

            def one(i):
                outs[i] = engine.post("/generate", bodies[i]).raise_for_status("generate").json()
            threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            return [[(e[0], e[1]) for e in o["meta_info"]["output_token_logprobs"]] for o in outs]

        alone = run(group(42))
        others = [{"input_ids": [5 + i, 9, 11 + i], "return_logprob": True,
                   "sampling_params": {"max_new_tokens": 8, "temperature": 1.0, "sampling_seed": 900 + i}}
                  for i in range(6)]
        mixed = run(group(42) + others)[:4]
        t.check(alone == mixed, f"a seeded group alone vs among others: {alone} vs {mixed}")
        t.check(len({tuple(x) for x in alone}) > 1, f"the group's seeds should differ: {alone}")
    finally:
        r.stop(proc)


def get_weight_version(engine):
    """SGLangEngine.get_weight_version."""
    return engine.get("/get_weight_version").raise_for_status("get_weight_version").json()["weight_version"]


def num_requests_from_load(load):
    """What server_control.num_requests_from_load takes from a /v1/loads reply: per rank the
    total (num_total_reqs), else running plus waiting, summed over the ranks."""
    total = 0
    for rank in load["loads"]:
        total += rank.get("num_total_reqs", rank.get("num_running_reqs", 0) + rank.get("num_waiting_reqs", 0))
    return total


if __name__ == "__main__":
    main()
