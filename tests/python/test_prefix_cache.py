"""The prefix cache through `rlserve serve`'s SGLang routes, against an independent numpy Qwen3
(test_qwen3_parity.py's reference, float64) and against the same server with
--disable-radix-cache:

- a GRPO group (n = 8 samples of one 80-token prompt): one sample computes the prompt, the
  other seven report meta_info.cached_tokens = 79 (4 shared blocks of 16 and 15 tokens copied
  from the fifth: all but the last token, whose logits are sampled from);
  every sample's tokens and logprobs equal the uncached server's, bit for bit;
- a prompt sharing 70 tokens with it reuses those 70 and its greedy tokens are the reference's
  argmax;
- /get_server_info says disable_radix_cache and cache_hit_rate as SGLang does; /metrics and
  /v1/loads report the hit rate;
- /flush_cache empties the cache; after update_weights_from_disk nothing cached before is reused
  and greedy tokens follow the new weights;
- bad input on these routes: a 400 naming what is wrong, and the server still answers.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rlserve_testlib as t  # noqa: E402
from test_qwen3_parity import load_weights, reference_logits  # noqa: E402

TIE_GAP = 1e-3


def generate(port, body):
    status, out = t.http(port, "POST", "/generate", body)
    t.check(status == 200, f"/generate -> {status} {out}")
    return out


def check_greedy(port, cfg, w, prompt, n, label):
    """Greedy tokens of `prompt` are the reference's argmax (stopping at a near-tie); returns
    the reply."""
    out = generate(port, {"input_ids": prompt,
                          "sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}})
    seq = list(prompt)
    for step, token in enumerate(out["output_ids"]):
        logits = reference_logits(cfg, w, seq)[-1]
        order = np.argsort(-logits, kind="stable")
        if token != order[0]:
            gap = logits[order[0]] - logits[order[1]]
            t.check(gap < TIE_GAP and token == order[1],
                    f"{label}: step {step} gave {token}, the reference {order[0]} (gap {gap})")
            print(f"  {label}: near-tie at step {step}, compared up to there")
            break
        seq.append(token)
    return out


def grpo_group(port, prompt):
    out = generate(port, {"input_ids": prompt, "return_logprob": True,
                          "sampling_params": {"n": 8, "temperature": 0.9, "max_new_tokens": 10,
                                              "ignore_eos": True, "sampling_seed": 5}})
    t.check(isinstance(out, list) and len(out) == 8, f"n = 8 gives 8 results: {out}")
    return out


def main():
    with t.temp_dir() as tmp:
        model = os.path.join(tmp, "model")
        other = os.path.join(tmp, "other")
        t.run("make-model", "--preset", "tiny", "--out", model, "--seed", "3")
        t.run("make-model", "--preset", "tiny", "--out", other, "--seed", "4")
        with open(os.path.join(model, "config.json")) as f:
            cfg = json.load(f)
        w = load_weights(model)
        w_other = load_weights(other)
        rng = np.random.default_rng(7)
        prompt = [int(x) for x in rng.integers(3, 400, size=80)]
        env = dict(os.environ)

        plain, plain_port = t.start_server(env, "--model", model, "--device", "cpu", "--disable-radix-cache")
        try:
            status, info = t.http(plain_port, "GET", "/get_server_info")
            t.check(status == 200 and info["disable_radix_cache"] is True, f"off: {info}")
            uncached = grpo_group(plain_port, prompt)
            t.check(all(o["meta_info"]["cached_tokens"] == 0 for o in uncached), "nothing cached when off")
        finally:
            plain.terminate()
            plain.wait(timeout=30)

        proc, port = t.start_server(env, "--model", model, "--device", "cpu")
        try:
            status, info = t.http(port, "GET", "/get_server_info")
            t.check(status == 200 and info["disable_radix_cache"] is False, f"on: {info}")
            cached = grpo_group(port, prompt)
            reuse = sorted(o["meta_info"]["cached_tokens"] for o in cached)
            t.check(reuse == [0] + [79] * 7, f"one sample computes the prompt, seven reuse 79: {reuse}")
            for j, (a, b) in enumerate(zip(cached, uncached)):
                t.check(a["output_ids"] == b["output_ids"], f"sample {j}: tokens differ from the uncached run")
                t.check(a["meta_info"]["output_token_logprobs"] == b["meta_info"]["output_token_logprobs"],
                        f"sample {j}: logprobs differ from the uncached run")
            print("  n = 8: one prefill, tokens and logprobs equal the uncached run")

            shared = prompt[:70] + [5, 6, 7, 8, 9]
            out = check_greedy(port, cfg, w, shared, 8, "shared prefix")
            t.check(out["meta_info"]["cached_tokens"] == 70, f"70 shared tokens reused: {out['meta_info']}")

            status, info = t.http(port, "GET", "/get_server_info")
            t.check(info["cache_hit_rate"] > 0.5, f"cache_hit_rate {info['cache_hit_rate']}")
            status, text = t.http(port, "GET", "/metrics")
            t.check("rlserve_prefix_cache_hit_rate" in text and "rlserve_prefill_tokens_total" in text,
                    "metrics name the cache")
            status, loads = t.http(port, "GET", "/v1/loads")
            t.check(loads["loads"][0]["cache_hit_rate"] > 0.5, f"/v1/loads {loads}")

            status, out = t.http(port, "POST", "/flush_cache", {})
            t.check(status == 200, f"flush_cache -> {status} {out}")
            status, info = t.http(port, "GET", "/get_server_info")
            t.check(info["prefix_cached_tokens"] == 0, f"flushed: {info['prefix_cached_tokens']}")
            again = generate(port, {"input_ids": shared, "sampling_params": {"temperature": 0, "max_new_tokens": 2}})
            t.check(again["meta_info"]["cached_tokens"] == 0, "nothing reused after a flush")

            # OpenAI's usage reports the cached prompt tokens too: the request above cached 4
            # whole blocks of `shared` (its 75 + 1 positions), the partial fifth one it kept.
            status, comp = t.http(port, "POST", "/v1/completions",
                                {"prompt": shared, "max_tokens": 2, "temperature": 0})
            t.check(status == 200 and comp["usage"]["prompt_tokens_details"]["cached_tokens"] == 64,
                    f"usage {comp.get('usage')}")

            # New weights: nothing of the old ones is reused, tokens follow the new weights.
            generate(port, {"input_ids": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 2}})
            status, out = t.http(port, "POST", "/update_weights_from_disk", {"model_path": other})
            t.check(status == 200 and out["success"], f"update -> {status} {out}")
            out = check_greedy(port, cfg, w_other, prompt, 8, "after the update")
            t.check(out["meta_info"]["cached_tokens"] == 0, f"old blocks reused after an update: {out['meta_info']}")
            out = check_greedy(port, cfg, w_other, prompt, 8, "new weights cached")
            t.check(out["meta_info"]["cached_tokens"] == 79, "the new weights' blocks are reused")
            print("  flush and update: nothing stale reused")

            # Bad input: refused with a message, the server still answers.
            for body, needle in [({"timeout_s": "soon"}, "timeout_s"), ({"timeout_s": -1}, "timeout_s")]:
                status, out = t.http(port, "POST", "/flush_cache", body)
                t.check(status == 400 and needle in json.dumps(out), f"flush_cache {body} -> {status} {out}")
            status, out = t.http(port, "POST", "/generate", {"input_ids": prompt, "sampling_params": {"n": 0}})
            t.check(status == 400 and "n" in json.dumps(out), f"n = 0 -> {status} {out}")
            status, _ = t.http(port, "GET", "/health")
            t.check(status == 200, "the server still answers")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print("test_prefix_cache: all passed")


if __name__ == "__main__":
    main()
