"""miles' calls for one RL step, replayed against `rlserve serve` as miles sends them.

Read from radixark/miles at commit 31f1ca961a94cb860cec3b2dea34ec332bfa8f76:
  miles/backends/sglang_utils/sglang_engine.py   SGLangEngine: the HTTP calls and their bodies
                                                 (_wait_server_healthy: GET /health_generate,
                                                 then GET /flush_cache until 200;
                                                 _init_external: GET /get_server_info;
                                                 get_server_info: GET /server_info;
                                                 get_weight_version: GET /model_info, then
                                                 /get_weight_version, reads ["weight_version"];
                                                 pause_generation {"mode"}; begin/end_weight_update;
                                                 update_weight_version {"new_version",
                                                 "abort_all_requests": false}; check_weights)
  miles/rollout/generate_utils/generate_endpoint_utils.py
                                                 compute_request_payload and
                                                 update_sample_from_response: the generate body
                                                 and the reply fields read
  miles/rollout/sglang_rollout.py                GenerateState.sampling_params
  miles/utils/types.py                           Sample.update_from_meta_info: weight_version,
                                                 finish_reason.type
  miles/backends/megatron_utils/update_weight/update_weight_from_tensor.py
                                                 update_weights: pause(mode) -> flush ->
                                                 begin_weight_update(selector) -> buckets ->
                                                 end_weight_update -> continue
  miles/backends/megatron_utils/update_weight/common.py
                                                 begin/end_weight_update, weight_update_selector,
                                                 _check_weight_sync_results (reads "success")
  miles/utils/arguments.py                       --pause-generation-mode defaults to retract
  miles/ray/train/group.py, miles/utils/audit_utils/checksum_utils.py
                                                 after an update: weights_checker(checksum), reads
                                                 success, ranks[*].checksums and
                                                 ranks[*].parallelism_info[*].rank

Also read, at the same commit 31f1ca961a94cb860cec3b2dea34ec332bfa8f76:
  miles/rollout/session/core.py                  prepare_chat_request: the agent's chat body
                                                 plus logprobs: true, return_meta_info: true,
                                                 no_stop_trim: false, stream popped, input_ids
                                                 (the session's own tokenization of the
                                                 messages), return_routed_experts with routing
                                                 replay; extract_completion reads
                                                 choices[0].meta_info.output_token_logprobs,
                                                 meta_info.completion_tokens (must equal their
                                                 count) and message.content (must not be null)
  miles/rollout/session/samples/merge.py         _compute_sample_from_openai_record: the sample
                                                 is request.input_ids + the meta_info's output
                                                 tokens; finish_reason, meta_info.weight_version
  miles/rollout/generate_utils/prefill_logprobs.py
                                                 recompute_samples_rollout_logprobs_via_prefill:
                                                 POST /flush_cache {}, then one batch /generate:
                                                 input_ids a list of lists, one sampling_params
                                                 (max_new_tokens 0, temperature 0), one scalar
                                                 logprob_start_len shared by the batch; reads a
                                                 list of replies, each's meta_info.
                                                 input_token_logprobs (first entry's logprob
                                                 null)

What the replay leaves out, and why:
  - serialized_named_tensors (CUDA IPC pickles) with load_format "flattened_bucket": rlserve's
    CPU engine takes the same request with named_tensors (inline base64, docs/protocol.md); the
    load format describes the pickle and is not sent with inline tensors.
  - return_routed_experts / return_indexer_topk are sent false, as miles does without routing
    replay (the replay's model is dense); tests/python/test_generation_features.py checks the
    routing payload on a Qwen3-MoE in the layout miles' _decode_topk_buffer reads.
    return_indexer_topk true (indexer replay, for DSA models) is refused: no model rlserve
    serves has an indexer (get_indexer_topk_from_response in generate_endpoint_utils.py).
  - release/resume_memory_occupation, pull_weights, the NCCL group calls, LoRA adapters, and
    miles' p2p transfer (/parallelism_config, /get_remote_instance_transfer_engine_info): not
    served.
"""
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(__file__))
import rlserve_testlib as t  # noqa: E402
import trainer_replay as r  # noqa: E402


def generate_payload(max_new_tokens):
    """compute_request_payload over GenerateState.sampling_params (miles' defaults)."""
    sampling_params = dict(temperature=1.0, top_p=1.0, top_k=-1, stop=None, stop_token_ids=None,
                           skip_special_tokens=True, no_stop_trim=True, spaces_between_special_tokens=False)
    return {"input_ids": r.prompt_ids(), "sampling_params": {**sampling_params, "max_new_tokens": max_new_tokens},
            "return_logprob": True, "return_routed_experts": False, "return_indexer_topk": False}


def read_response(output, max_new_tokens):
    """update_sample_from_response and Sample.update_from_meta_info: what miles reads."""
    meta = output["meta_info"]
    pairs = meta.get("output_token_logprobs")
    tokens, logprobs = [p[1] for p in pairs], [p[0] for p in pairs]
    t.check(len(tokens) == len(logprobs), meta)
    r.check_output_length(meta, len(tokens), max_new_tokens)
    t.check(isinstance(output["text"], str), output)
    t.check(meta.get("routed_experts") is None and meta.get("indexer_topk") is None, meta)
    t.check(meta["finish_reason"]["type"] in ("length", "stop", "abort"), meta)
    return meta


def session_chat(engine, version):
    """One agent turn through miles' session server: the chat body as prepare_chat_request
    forwards it (the prompt as the session's input_ids), and what extract_completion and
    _compute_sample_from_openai_record read back. The engine must generate from input_ids, not
    from its own rendering of the messages: the sample is built from input_ids."""
    agent_body = {"model": "policy", "messages": [{"role": "user", "content": "What is 2 + 2?"}],
                  "max_tokens": 5, "temperature": 0}
    body = dict(agent_body, logprobs=True, return_meta_info=True, no_stop_trim=False, input_ids=r.prompt_ids())
    response = engine.post("/v1/chat/completions", body).raise_for_status("session chat").json()
    choice = response["choices"][0]
    meta = choice.get("meta_info")
    t.check(isinstance(meta, dict) and "output_token_logprobs" in meta, f"no meta_info: {choice}")
    t.check(choice["message"].get("content") is not None, choice)
    t.check(len(meta["output_token_logprobs"]) == meta["completion_tokens"], meta)
    t.check(meta["prompt_tokens"] == len(r.prompt_ids()), f"the prompt was not input_ids: {meta}")
    t.check(choice["finish_reason"] in ("stop", "length", "tool_calls", "abort"), choice)
    t.check(meta["weight_version"] == version, meta)
    # The same prompt through /generate, greedy: the same tokens and logprobs.
    same = engine.post("/generate", {"input_ids": r.prompt_ids(), "return_logprob": True,
                                     "sampling_params": {"temperature": 0, "max_new_tokens": 5}})
    same = same.raise_for_status("generate").json()["meta_info"]["output_token_logprobs"]
    t.check([e[:2] for e in meta["output_token_logprobs"]] == [e[:2] for e in same],
            f"chat with input_ids differs from /generate: {meta['output_token_logprobs']} vs {same}")
    # Routing replay asks for the rows in the same meta_info; streaming cannot carry it.
    routed = engine.post("/v1/chat/completions", dict(body, return_routed_experts=True))
    routed_meta = routed.raise_for_status("session chat, routing replay").json()["choices"][0]["meta_info"]
    t.check(routed_meta.get("routed_experts_start_len") == 0, routed_meta)
    streamed = engine.post("/v1/chat/completions", dict(body, stream=True))
    t.check(streamed.status == 400 and "return_meta_info" in streamed.text, streamed.text)


def prefill_scoring(engine):
    """recompute_samples_rollout_logprobs_via_prefill with two samples of one prompt length: a
    flush, then one batch request; each reply's response-token logprobs come from
    input_token_logprobs (the first entry, logprob_start_len's own token, has none)."""
    prompt_len = 4
    samples = [[1, 2, 3, 4, 9, 10, 11], [1, 2, 3, 5, 12, 13]]
    sampling_params = dict(temperature=1.0, top_p=1.0, top_k=-1, stop=None, stop_token_ids=None,
                           skip_special_tokens=True, no_stop_trim=True, spaces_between_special_tokens=False)
    sampling_params.update(max_new_tokens=0, temperature=0, skip_special_tokens=False)
    engine.post("/flush_cache", {}).raise_for_status("flush_cache (POST)")
    batch = {"input_ids": samples, "sampling_params": sampling_params, "return_logprob": True,
             "logprob_start_len": prompt_len - 1}
    outputs = engine.post("/generate", batch).raise_for_status("batch prefill scoring").json()
    t.check(isinstance(outputs, list) and len(outputs) == len(samples), outputs)
    for tokens, output in zip(samples, outputs):
        response_length = len(tokens) - prompt_len
        items = output["meta_info"]["input_token_logprobs"][-response_length:]
        t.check([item[1] for item in items] == tokens[-response_length:], output["meta_info"])
        t.check(all(item[0] is not None for item in items), items)
        # The same sample alone (recompute_rollout_logprobs_via_prefill): the same numbers.
        one = dict(batch, input_ids=tokens)
        alone = engine.post("/generate", one).raise_for_status("prefill scoring").json()
        t.check(alone["meta_info"]["input_token_logprobs"][-response_length:] == items, alone["meta_info"])


def get_weight_version(engine):
    """SGLangEngine.get_weight_version: /model_info first, then the older route."""
    for path in ("/model_info", "/get_weight_version"):
        reply = engine.get(path)
        if reply.status == 200:
            return reply.json()["weight_version"]
    reply.raise_for_status("get_weight_version")


def admin(engine, route, payload):
    """_make_request plus _check_weight_sync_results: a {"success": false} reply stops miles."""
    body = engine.post("/" + route, payload).raise_for_status(route).json()
    t.check(body.get("success") is not False, f"{route}: {body}")
    return body


def main():
    with t.temp_dir() as tmp:
        model_a, model_b = r.make_models(tmp)
        proc, engine = r.start(tmp, model_a)
        try:
            # Start-up: health, then an empty queue (miles polls GET /flush_cache with its key).
            headers = {"Content-Type": "application/json; charset=utf-8", "Authorization": "Bearer None"}
            engine.get("/health_generate", headers=headers).raise_for_status("health_generate")
            t.check(engine.get("/flush_cache", headers=headers).status == 200, "flush_cache at start")
            actual = engine.get("/get_server_info").raise_for_status("get_server_info").json()
            # _sanity_check_server_args compares the fields miles would launch with.
            t.check(actual.get("enable_memory_saver") is False, actual)
            t.check(actual["model_path"] == model_a, actual)
            info = engine.get("/server_info").raise_for_status("server_info").json()
            t.check(info["tp_size"] == 1 and info["dp_size"] == 1, info)

            # Rollout requests of the fully-async loop: one in flight when the trainer pauses
            # (retract re-queues it with its tokens; it may also finish first), one sent while
            # generation is paused (it waits, and must run on the new weights).
            replies = {}

            def generate_in_background(name, max_new_tokens):
                replies[name] = engine.post("/generate", generate_payload(max_new_tokens))

            threads = [threading.Thread(target=generate_in_background, args=("in_flight", 400))]
            threads[0].start()

            # update_weights: pause(retract) -> flush -> begin -> buckets -> end -> continue.
            engine.post("/pause_generation", {"mode": "retract"}).raise_for_status("pause_generation")
            threads.append(threading.Thread(target=generate_in_background, args=("while_paused", 6)))
            threads[1].start()
            for _ in range(60):
                if engine.get("/flush_cache").status == 200:
                    break
            else:
                raise AssertionError("flush_cache never answered 200 after a retract pause")
            admin(engine, "begin_weight_update", {"selector": "all"})
            for bucket in r.inline_buckets(model_b):
                admin(engine, "update_weights_from_tensor",
                      {"named_tensors": bucket, "flush_cache": False, "selector": "all", "weight_version": "1"})
            admin(engine, "end_weight_update", {})
            engine.post("/continue_generation", {}).raise_for_status("continue_generation")

            for thread in threads:
                thread.join(timeout=300)
            t.check(set(replies) == {"in_flight", "while_paused"}, f"requests never finished: {replies}")
            meta = replies["in_flight"].raise_for_status("generate").json()["meta_info"]
            t.check(meta["finish_reason"]["type"] in ("length", "stop"), meta)
            t.check(meta["weight_version"] in ("0", "1"), meta)  # "1" when the pause caught it
            meta = read_response(replies["while_paused"].raise_for_status("generate").json(), 6)
            t.check(meta["weight_version"] == "1", f"a request sent while paused ran on {meta['weight_version']}")

            # The version step, and what the rollout after it is served with.
            t.check(get_weight_version(engine) == "1", "weight version after end_weight_update")
            admin(engine, "update_weight_version", {"new_version": "step-1", "abort_all_requests": False})
            t.check(get_weight_version(engine) == "step-1", "update_weight_version")
            output = engine.post("/generate", generate_payload(6)).raise_for_status("generate").json()
            t.check(read_response(output, 6)["weight_version"] == "step-1", output["meta_info"])
            session_chat(engine, "step-1")
            prefill_scoring(engine)
            # --use-rollout-indexer-replay (DSA models, which rlserve does not serve): refused at
            # once rather than answered without meta_info.indexer_topk.
            refused = engine.post("/generate", dict(generate_payload(2), return_indexer_topk=True))
            t.check(refused.status == 400 and "return_indexer_topk" in refused.text, refused.text)

            # The audit after an update: one checksum body per engine, ranks sorted by GPU rank.
            body = admin(engine, "weights_checker",
                         {"action": "checksum", "allow_quant_error": False, "selector": "all"})
            ranks = body.get("ranks", []) or []
            t.check(len(ranks) == 1, body)
            gpu_ranks = {role["rank"] for role in ranks[0]["parallelism_info"]}
            t.check(gpu_ranks == {0}, ranks[0]["parallelism_info"])
            t.check(ranks[0]["checksums"] == r.checkpoint_checksums(model_b), "the update did not land")

            # A second step naming its version the other way miles does: update_weight_version
            # after the last bucket, before end_weight_update, around an in-place pause. The
            # name is published with the weights, exactly: the old one until end_weight_update.
            replies.clear()
            held = threading.Thread(target=generate_in_background, args=("held", 400))
            held.start()
            engine.post("/pause_generation", {"mode": "in_place"}).raise_for_status("pause_generation")
            admin(engine, "begin_weight_update", {"selector": "all"})
            for bucket in r.inline_buckets(model_a):
                admin(engine, "update_weights_from_tensor",
                      {"named_tensors": bucket, "flush_cache": False, "selector": "all"})
            named = admin(engine, "update_weight_version", {"new_version": "step-2", "abort_all_requests": False})
            t.check("published when the staged update commits" in named["message"], named)
            t.check(get_weight_version(engine) == "step-1", "the name was reported before its weights served")
            ended = admin(engine, "end_weight_update", {})
            t.check(ended["weight_version"] == "step-2", ended)
            t.check(get_weight_version(engine) == "step-2", "weight version after end_weight_update")
            engine.post("/continue_generation", {}).raise_for_status("continue_generation")
            held.join(timeout=300)
            meta = replies["held"].raise_for_status("generate").json()["meta_info"]
            t.check(meta["weight_version"] in ("step-1", "step-2"), meta)  # never a counted-up "step-3"
            output = engine.post("/generate", generate_payload(6)).raise_for_status("generate").json()
            t.check(read_response(output, 6)["weight_version"] == "step-2", output["meta_info"])
            body = admin(engine, "weights_checker", {"action": "checksum", "selector": "all"})
            t.check(body["ranks"][0]["checksums"] == r.checkpoint_checksums(model_a), "the second update did not land")
        finally:
            r.stop(proc)
    print("ok: miles' steps (retract pause, begin/end session, checksum audit; in-place pause, "
          "update_weight_version before end_weight_update) against rlserve serve")


if __name__ == "__main__":
    main()
