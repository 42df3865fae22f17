"""The request features GRPO loops use, through `rlserve serve`'s SGLang /generate, against an
independent numpy Qwen3 (test_qwen3_parity.py's reference, float64) and the `tokenizers` package:

- penalties (frequency, presence, repetition) and min_new_tokens, greedy: every token is the
  argmax of the reference's logits after SGLang's penalties over the tokens generated so far, and
  its logprob the log-softmax of those penalized logits;
- prompt logprobs (logprob_start_len, with top_logprobs_num): each prompt token's logprob given
  the tokens before it, the first entry null (SGLang's shape), top alternatives in order;
  max_new_tokens 0 scores the prompt without generating;
- return_text_in_logprobs: every entry's text is the token decoded alone by `tokenizers`;
- stop_token_ids / stop strings / no_stop_trim: SGLang's trimming of the text; skip_special_tokens
  against `tokenizers`' decode;
- routing replay (return_routed_experts) on a Qwen3-MoE model with a dense layer: the
  reference router's top-k for every position that ran, SGLang's base64 int32 layout;
- n > 1 and batches (SGLang's fan-out): one result per prompt and sample, prompt-major, rids
  "{rid}_{i}", sample i seeded sampling_seed + i, each equal to a single request with its seed;
  streamed events carry "index";
- bad input for each: a 400 naming the field, and the server still answers.

Ties: fp32 engine against the fp64 reference can order two nearly equal logits differently, so
a greedy comparison stops (and passes) at a step whose top two reference logits are within
TIE_GAP; no such step occurred with the seeds below when this was written.
"""
import json
import math
import os
import sys
import urllib.request

import numpy as np
from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rlserve_testlib as t  # noqa: E402
from test_qwen3_parity import load_weights, reference_logits  # noqa: E402

TIE_GAP = 1e-3
LOGPROB_TOL = 2e-3


def sse_events(port, body):
    """The JSON events of a streamed /generate, without the final [DONE]."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=json.dumps(body).encode(),
                                 method="POST")
    req.add_header("Content-Type", "application/json")
    events = []
    with urllib.request.urlopen(req, timeout=120) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            payload = line[len("data:"):].strip()
            if payload == "[DONE]":
                break
            events.append(json.loads(payload))
    return events


def generate(port, body):
    status, out = t.http(port, "POST", "/generate", body)
    t.check(status == 200, f"/generate {body} -> {status} {out}")
    return out


def refused(port, body, needle):
    status, out = t.http(port, "POST", "/generate", body)
    t.check(status == 400, f"{body} should be refused, got {status} {out}")
    message = json.dumps(out)
    t.check(needle in message, f"{body}: the error should name {needle!r}: {message}")
    status, health = t.http(port, "GET", "/health")
    t.check(status == 200, f"the server stopped answering after {body}: {status} {health}")


def log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max()
    return x - (m + math.log(np.exp(x - m).sum()))


def penalize(logits, generated, p):
    """SGLang's penalties over the generated tokens: additive first, then repetition."""
    out = np.array(logits, dtype=np.float64)
    counts = {}
    for tok in generated:
        counts[tok] = counts.get(tok, 0) + 1
    for tok, c in counts.items():
        out[tok] -= p.get("frequency_penalty", 0.0) * c + p.get("presence_penalty", 0.0)
        r = p.get("repetition_penalty", 1.0)
        out[tok] = out[tok] / r if out[tok] > 0 else out[tok] * r
    if len(generated) < p.get("min_new_tokens", 0):
        for tok in p.get("stop_token_ids", []) + p.get("_eos", []):
            out[tok] = -np.inf
    return out


def check_greedy_penalties(port, cfg, w, prompt, params, label):
    body = {"input_ids": prompt, "return_logprob": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True,
                                **{k: v for k, v in params.items() if not k.startswith("_")}}}
    out = generate(port, body)
    got = out["output_ids"]
    logprobs = [e[0] for e in out["meta_info"]["output_token_logprobs"]]
    generated = []
    for step, token in enumerate(got):
        logits = penalize(reference_logits(cfg, w, prompt + generated)[-1], generated, params)
        order = np.argsort(-logits, kind="stable")
        if token != order[0]:
            gap = logits[order[0]] - logits[order[1]]
            t.check(gap < TIE_GAP and token == order[1],
                    f"{label}: step {step} gave {token}, the reference {order[0]} (gap {gap})")
            print(f"  {label}: near-tie at step {step}, compared up to there")
            return
        want = log_softmax(logits)[token]
        t.check(abs(logprobs[step] - want) < LOGPROB_TOL,
                f"{label}: step {step} logprob {logprobs[step]}, reference {want}")
        generated.append(token)
    return got


def test_penalties(port, cfg, w, tok):
    prompt = tok.encode("the cat sat on the mat and the cat").ids
    plain = check_greedy_penalties(port, cfg, w, prompt, {}, "no penalty")
    for params in ({"repetition_penalty": 1.7},
                   {"frequency_penalty": 1.5},
                   {"presence_penalty": 1.2, "frequency_penalty": -0.3, "repetition_penalty": 0.8}):
        got = check_greedy_penalties(port, cfg, w, prompt, params, json.dumps(params))
        print(f"  penalties {params}: ok ({got})")
    # A tiny random model repeats itself greedily; a strong repetition penalty must change that.
    strong = generate(port, {"input_ids": prompt, "sampling_params": {
        "temperature": 0, "max_new_tokens": 12, "ignore_eos": True, "repetition_penalty": 2.0}})
    if plain and len(set(plain)) < len(plain):
        t.check(strong["output_ids"] != plain, "repetition_penalty 2 changed nothing")
    # min_new_tokens: the token greedy would stop on is banned until enough are generated.
    first = plain[0]
    params = {"min_new_tokens": 4, "stop_token_ids": [first]}
    got = check_greedy_penalties(port, cfg, w, prompt, params, "min_new_tokens")
    t.check(first not in got[:4], f"min_new_tokens 4 let stop token {first} through: {got}")
    # Bad values: named, and nothing else changes.
    refused(port, {"input_ids": prompt, "sampling_params": {"repetition_penalty": 0}},
            "repetition_penalty")
    refused(port, {"input_ids": prompt, "sampling_params": {"frequency_penalty": 3}},
            "frequency_penalty")
    refused(port, {"input_ids": prompt, "sampling_params": {"presence_penalty": "high"}},
            "presence_penalty")
    print("penalties: ok")


def test_stops(port, tok):
    """stop_token_ids, stop strings and no_stop_trim as SGLang trims them: a matched stop token
    stays in output_ids but not in the text; a stop string ends the text before it (with
    no_stop_trim, right after it)."""
    prompt = tok.encode("the cat sat on").ids
    params = {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True}
    free = generate(port, {"input_ids": prompt, "sampling_params": params})["output_ids"]
    k = next((i for i in range(1, len(free)) if free[i] not in free[:i]), None)
    t.check(k is not None, f"no fresh token to stop on in {free}")
    for trim in (False, True):
        out = generate(port, {"input_ids": prompt, "sampling_params": {
            **params, "stop_token_ids": [free[k]], "no_stop_trim": trim}})
        t.check(out["output_ids"] == free[:k + 1], f"stop token: {out['output_ids']} vs {free[:k + 1]}")
        t.check(out["meta_info"]["finish_reason"] == {"type": "stop", "matched": free[k]},
                f"finish_reason {out['meta_info']['finish_reason']}")
        want = tok.decode(free[:k + 1] if trim else free[:k])
        t.check(out["text"] == want, f"stop token, no_stop_trim {trim}: {out['text']!r} vs {want!r}")
    text = tok.decode(free)
    stop = next((text[i:i + 2] for i in range(1, len(text) - 2) if text[i:i + 2].strip()
                 and text.find(text[i:i + 2]) == i), None)
    if stop:
        pos = text.find(stop)
        for trim in (False, True):
            out = generate(port, {"input_ids": prompt, "sampling_params": {
                **params, "stop": stop, "no_stop_trim": trim}})
            want = text[:pos + len(stop)] if trim else text[:pos]
            t.check(out["text"] == want, f"stop {stop!r}, no_stop_trim {trim}: {out['text']!r} vs {want!r}")
            t.check(out["meta_info"]["finish_reason"]["matched"] == stop, "matched stop string")
    # skip_special_tokens: the text with and without the special tokens, as `tokenizers` decodes
    # the same ids (a hot sampler over the tiny vocabulary soon draws one; ignore_eos keeps going).
    special = {i for i, added in tok.get_added_tokens_decoder().items() if added.special}
    hot = {"max_new_tokens": 200, "temperature": 5.0, "ignore_eos": True}
    for seed in range(20):
        ids = generate(port, {"input_ids": prompt, "sampling_params": {**hot, "sampling_seed": seed}})["output_ids"]
        if special & set(ids):
            for skip in (True, False):
                out = generate(port, {"input_ids": prompt, "sampling_params": {
                    **hot, "sampling_seed": seed, "skip_special_tokens": skip}})
                t.check(out["text"] == tok.decode(ids, skip_special_tokens=skip),
                        f"skip_special_tokens {skip}: {out['text']!r}")
            break
    else:
        raise AssertionError("no special token in 20 hot samples")
    refused(port, {"input_ids": prompt, "sampling_params": {"stop_token_ids": [-1]}}, "stop_token_ids")
    refused(port, {"input_ids": prompt, "sampling_params": {"no_stop_trim": 1}}, "no_stop_trim")
    print("stop tokens and strings: ok")


def test_prompt_logprobs(port, cfg, w, tok):
    prompt = tok.encode("one two three four five six seven").ids
    L = len(prompt)
    ref = reference_logits(cfg, w, prompt)
    for start in (0, 3, L - 1):
        out = generate(port, {"input_ids": prompt, "return_logprob": True, "logprob_start_len": start,
                              "top_logprobs_num": 3, "return_text_in_logprobs": True,
                              "sampling_params": {"max_new_tokens": 0}})
        meta = out["meta_info"]
        entries = meta["input_token_logprobs"]
        t.check(len(entries) == L - start, f"start {start}: {len(entries)} entries for {L - start}")
        t.check(out["output_ids"] == [] and meta["finish_reason"]["type"] == "length",
                f"max_new_tokens 0 generated {out['output_ids']}")
        t.check(entries[0][0] is None and entries[0][1] == prompt[start],
                f"start {start}: the first entry {entries[0]} should be [null, {prompt[start]}, ...]")
        tops = meta["input_top_logprobs"]
        t.check(len(tops) == len(entries) and tops[0] is None, f"start {start}: input_top_logprobs {tops[:1]}")
        for k in range(1, len(entries)):
            pos = start + k
            lp = log_softmax(ref[pos - 1])
            value, token, text = entries[k]
            t.check(token == prompt[pos], f"entry {k}: token {token}, prompt has {prompt[pos]}")
            t.check(abs(value - lp[token]) < LOGPROB_TOL, f"entry {k}: {value} vs reference {lp[token]}")
            t.check(text == tok.decode([token], skip_special_tokens=False),
                    f"entry {k}: text {text!r}")
            order = np.argsort(-lp, kind="stable")
            got_ids = [e[1] for e in tops[k]]
            for rank, (v, i, _) in enumerate(tops[k]):
                t.check(abs(v - lp[i]) < LOGPROB_TOL, f"entry {k} top {rank}: {v} vs {lp[i]}")
            if lp[order[2]] - lp[order[3]] > TIE_GAP and lp[order[0]] - lp[order[1]] > TIE_GAP:
                t.check(got_ids == [int(x) for x in order[:3]], f"entry {k}: top ids {got_ids}")
    # With generation, streamed: the prompt logprobs arrive once, the outputs as usual, and the
    # default -1 gives SGLang's single [null, last prompt token] entry.
    events = sse_events(port, {"input_ids": prompt, "return_logprob": True, "logprob_start_len": 2,
                               "stream": True, "sampling_params": {"max_new_tokens": 5,
                                                                    "temperature": 0}})
    last = events[-1]["meta_info"]
    t.check(len(last["input_token_logprobs"]) == L - 2, f"streamed: {last['input_token_logprobs']}")
    t.check(len(last["output_token_logprobs"]) == len(events[-1]["output_ids"]) == 5,
            f"streamed outputs {events[-1]['output_ids']}")
    t.check(all(e[2] is None for e in last["output_token_logprobs"]), "texts without asking")
    default = generate(port, {"input_ids": prompt, "return_logprob": True,
                              "sampling_params": {"max_new_tokens": 2}})["meta_info"]
    t.check(default["input_token_logprobs"] == [[None, prompt[-1], None]],
            f"default logprob_start_len: {default['input_token_logprobs']}")
    # Output entries with texts; top rows for every output token.
    out = generate(port, {"input_ids": prompt, "return_logprob": True, "top_logprobs_num": 2,
                          "return_text_in_logprobs": True,
                          "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
    meta = out["meta_info"]
    for (v, token, text), row in zip(meta["output_token_logprobs"], meta["output_top_logprobs"]):
        t.check(text == tok.decode([token], skip_special_tokens=False), f"output text {text!r}")
        t.check(len(row) == 2 and row[0][1] == token and abs(row[0][0] - v) < 1e-6,
                f"greedy: the top alternative {row[0]} should be the token {token}")
    refused(port, {"input_ids": prompt, "return_logprob": True, "logprob_start_len": L,
                   "sampling_params": {"max_new_tokens": 1}}, "logprob_start_len")
    refused(port, {"input_ids": prompt, "return_logprob": True, "logprob_start_len": -2},
            "logprob_start_len")
    refused(port, {"input_ids": prompt, "return_text_in_logprobs": "yes"}, "return_text_in_logprobs")
    print("prompt logprobs and texts: ok")


def test_routed_experts(tmp):
    """Routing replay on a Qwen3-MoE model with a dense layer: rows for every position that ran
    (prompt + outputs - 1), [rows, layers, top_k] little-endian int32 in base64 as SGLang, the
    reference router's top-k by descending weight, -1 in the dense layer."""
    import base64
    import safetensors.numpy
    from safetensors import safe_open
    model = os.path.join(tmp, "moe")
    t.run("make-model", "--arch", "qwen3-moe", "--preset", "tiny", "--out", model, "--seed", "5",
          "--dtype", "float32")
    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    # Layer 1 becomes dense (mlp_only_layers): a random MLP in place of its router and experts.
    path = os.path.join(model, "model.safetensors")
    with safe_open(path, framework="numpy") as f:
        arrays = {k: f.get_tensor(k) for k in f.keys()}
    rng = np.random.RandomState(5)
    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    p = "model.layers.1.mlp."
    arrays = {k: v for k, v in arrays.items() if not k.startswith(p)}
    arrays[p + "gate_proj.weight"] = (rng.randn(I, H) / np.sqrt(H)).astype(np.float32)
    arrays[p + "up_proj.weight"] = (rng.randn(I, H) / np.sqrt(H)).astype(np.float32)
    arrays[p + "down_proj.weight"] = (rng.randn(H, I) / np.sqrt(I)).astype(np.float32)
    safetensors.numpy.save_file(arrays, path, metadata={"format": "pt"})
    cfg["mlp_only_layers"] = [1]
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump(cfg, f)
    w = load_weights(model)
    L, K = cfg["num_hidden_layers"], cfg["num_experts_per_tok"]
    proc, port = t.start_server(dict(os.environ), "--model", model, "--device", "cpu")
    try:
        prompt = [5, 17, 2, 9, 30, 4, 11]
        out = generate(port, {"input_ids": prompt, "return_routed_experts": True,
                              "sampling_params": {"max_new_tokens": 5, "temperature": 0,
                                                  "ignore_eos": True}})
        meta = out["meta_info"]
        tokens = prompt + out["output_ids"]
        ids = np.frombuffer(base64.b64decode(meta["routed_experts"]), dtype="<i4")
        t.check(ids.size == (len(tokens) - 1) * L * K,
                f"{ids.size} ids for {len(tokens) - 1} positions x {L} layers x {K}")
        ids = ids.reshape(len(tokens) - 1, L, K)
        routing = {}
        reference_logits(cfg, w, tokens[:-1], routing)
        t.check(set(routing) == {l for l in range(L) if l != 1}, f"sparse layers {sorted(routing)}")
        t.check((ids[:, 1, :] == -1).all(), "the dense layer should be -1")
        for layer, (chosen, probs) in routing.items():
            for pos in range(len(tokens) - 1):
                got, want = list(ids[pos, layer]), [int(e) for e in chosen[pos]]
                if got != want:  # allowed only where the reference's choice is a near-tie
                    p = np.sort(probs[pos])[::-1]
                    t.check(np.min(np.abs(np.diff(p[:K + 1]))) < 1e-5,
                            f"position {pos} layer {layer}: {got}, reference {want}")
        # routed_experts_start_len: the rows from there on, and streaming gives them at the end.
        part = generate(port, {"input_ids": prompt, "return_routed_experts": True,
                               "routed_experts_start_len": 3,
                               "sampling_params": {"max_new_tokens": 5, "temperature": 0,
                                                   "ignore_eos": True}})["meta_info"]
        tail = np.frombuffer(base64.b64decode(part["routed_experts"]), dtype="<i4").reshape(-1, L, K)
        t.check(part["routed_experts_start_len"] == 3 and (tail == ids[3:]).all(),
                "routed_experts_start_len 3 should give the rows from 3 on")
        events = sse_events(port, {"input_ids": prompt, "return_routed_experts": True, "stream": True,
                                   "sampling_params": {"max_new_tokens": 5, "temperature": 0,
                                                       "ignore_eos": True}})
        last = np.frombuffer(base64.b64decode(events[-1]["meta_info"]["routed_experts"]), dtype="<i4")
        t.check((last.reshape(-1, L, K) == ids).all(), "streamed routing differs")
        plain = generate(port, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 2}})
        t.check("routed_experts" not in plain["meta_info"], "routing without asking")
        refused(port, {"input_ids": prompt, "return_routed_experts": True,
                       "routed_experts_start_len": 8}, "routed_experts_start_len")
        refused(port, {"input_ids": prompt, "return_routed_experts": "yes"}, "return_routed_experts")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print("routed experts: ok")


def main():
    with t.temp_dir() as tmp:
        model = os.path.join(tmp, "model")
        t.run("make-model", "--preset", "tiny", "--out", model, "--seed", "3")
        with open(os.path.join(model, "config.json")) as f:
            cfg = json.load(f)
        w = load_weights(model)
        tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
        env = dict(os.environ)
        proc, port = t.start_server(env, "--model", model, "--device", "cpu")
        try:
            test_penalties(port, cfg, w, tok)
            test_prompt_logprobs(port, cfg, w, tok)
            test_stops(port, tok)
            test_parallel_samples(port, tok)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        test_routed_experts(tmp)
    print("test_generation_features: all passed")


def test_parallel_samples(port, tok):
    prompt = tok.encode("a b c d").ids
    other = tok.encode("x y").ids
    params = {"max_new_tokens": 6, "temperature": 0.9, "ignore_eos": True, "sampling_seed": 40}
    # n samples of one prompt: a list, rids "{rid}_{i}", sample i seeded 40 + i, each equal to a
    # single request with that seed.
    out = generate(port, {"input_ids": prompt, "rid": "grpo", "return_logprob": True,
                          "sampling_params": {**params, "n": 4}})
    t.check(isinstance(out, list) and len(out) == 4, f"n=4 gave {type(out).__name__} of {len(out)}")
    for i, o in enumerate(out):
        meta = o["meta_info"]
        t.check(meta["id"] == f"grpo_{i}", f"sample {i}: rid {meta['id']}")
        t.check(meta["sampling_seed"] == 40 + i, f"sample {i}: seed {meta['sampling_seed']}")
        alone = generate(port, {"input_ids": prompt, "return_logprob": True,
                                "sampling_params": {**params, "sampling_seed": 40 + i}})
        t.check(alone["output_ids"] == o["output_ids"], f"sample {i} differs from its single request")
        t.check(alone["meta_info"]["output_token_logprobs"] == meta["output_token_logprobs"],
                f"sample {i}: logprobs differ from its single request")
    t.check(len({tuple(o["output_ids"]) for o in out}) > 1, "four samples, all the same tokens")
    # A batch of prompts with n = 2: prompt-major, per-prompt sampling_params, text prompts too.
    out = generate(port, {"text": ["a b c d", "x y"], "sampling_params": [
        {**params, "n": 2}, {**params, "n": 2, "max_new_tokens": 3}]})
    t.check([o["meta_info"]["prompt_tokens"] for o in out] == [len(prompt)] * 2 + [len(other)] * 2,
            f"batch order {[o['meta_info']['prompt_tokens'] for o in out]}")
    t.check([o["meta_info"]["completion_tokens"] for o in out] == [6, 6, 3, 3], "per-prompt params")
    out = generate(port, {"input_ids": [prompt, other], "rid": ["p", "q"],
                          "sampling_params": {"max_new_tokens": 2}})
    t.check([o["meta_info"]["id"] for o in out] == ["p", "q"], f"batch rids {[o['meta_info']['id'] for o in out]}")
    # Streamed: events carry "index"; the last event of each index is that result, whole.
    events = sse_events(port, {"input_ids": prompt, "stream": True,
                               "sampling_params": {**params, "n": 3}})
    last = {}
    for e in events:
        last[e["index"]] = e
    t.check(sorted(last) == [0, 1, 2], f"stream indexes {sorted(last)}")
    for i in range(3):
        alone = generate(port, {"input_ids": prompt, "sampling_params": {**params, "sampling_seed": 40 + i}})
        t.check(last[i]["output_ids"] == alone["output_ids"], f"streamed sample {i} differs")
    # Bad input: named, nothing runs, the server answers on.
    refused(port, {"input_ids": prompt, "sampling_params": {"n": 0}}, "n")
    refused(port, {"input_ids": prompt, "sampling_params": {"n": 1.5}}, "n")
    refused(port, {"input_ids": [prompt, other], "rid": ["only-one"]}, "rid")
    refused(port, {"input_ids": [prompt, other], "rid": ["same", "same"]}, "same")
    refused(port, {"input_ids": [prompt, other], "sampling_params": [{"n": 2}, {"n": 3}]}, "n")
    refused(port, {"input_ids": [prompt, other], "return_logprob": [True, False],
                   "sampling_params": {"n": 2}}, "return_logprob")
    refused(port, {"input_ids": [prompt, [1, 99999]]}, "request 1")
    refused(port, {"text": []}, "text")
    refused(port, {"input_ids": prompt, "sampling_params": {"n": 5000}}, "at most")
    # A batch larger than the body bound of one request is refused whole, saying so.
    status, body = t.http(port, "POST", "/generate", {"text": ["word " * 260_000, "more"]})
    t.check(status == 413 and "a batch of prompts counts whole" in json.dumps(body), f"{status} {body}")
    t.check(t.http(port, "GET", "/health")[0] == 200, "the server stopped answering after a 413")
    print("n > 1 and batches: ok")


if __name__ == "__main__":
    main()
