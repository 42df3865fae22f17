"""slime's rollout top-p replay against `rlserve serve` (CPU runner, tiny model).

What slime sends and reads (THUDM/slime at 624b824a898ab0ec1fcb4d373004c7f3852bf515):
  slime/rollout/sglang_rollout.py    GenerateState: --rollout-top-p below 1 adds
                                     sampling_params.custom_params = {"return_top_p_token_ids": True}
  slime/utils/misc.py                decode_int32_meta_array: a base64 string is little-endian int32
                                     (a list is read too)
  slime/utils/types.py               _extract_rollout_top_p_token_data: top_p_token_ids and
                                     top_p_token_offsets, both or neither, offsets[0] == 0,
                                     offsets[-1] == len(ids), len(offsets) == new tokens + 1;
                                     _merge_rollout_top_p_token_data joins turns (offsets shifted)
  slime/rollout/sglang_streaming_rollout.py
                                     each event is the call's result so far: its metadata is
                                     applied to the tokens of output_token_logprobs so far
  docker/patch/latest/sglang-top_p.patch
                                     the kept set: SGLang's nucleus of softmax(logits / T) (top-k,
                                     top-p, min-p); the sampled token's logprob renormalized over it;
                                     greedy: the token alone

The reference is independent of the server's sampler: `rlserve forward` gives the logits of every
position of prompt + output, and numpy computes softmax(logits / T), sorts it (most probable
first, ties to the lower id) and cuts the nucleus (tokens whose preceding mass is below top_p).
The forward and the server may differ in the last bits of a logit, so the server's set must lie
between the reference's nuclei at top_p -+ 1e-4 (equal but for a near-tie at the cut).
"""
import base64
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import rlserve_testlib as t  # noqa: E402
import trainer_replay as r  # noqa: E402

KEYS = ("top_p_token_ids", "top_p_token_offsets")
SLACK = 1e-4


def decode_int32(value):
    """slime's decode_int32_meta_array for the shapes rlserve sends (base64 of int32 LE)."""
    t.check(isinstance(value, str), f"expected base64 text, got {value!r}")
    return np.frombuffer(base64.b64decode(value), dtype="<i4").astype(np.int64)


def kept_sets(meta, tokens):
    """slime's _extract_rollout_top_p_token_data, then the per-token sets."""
    t.check(all(k in meta for k in KEYS), f"missing top-p fields: {sorted(meta)}")
    ids, offsets = decode_int32(meta[KEYS[0]]), decode_int32(meta[KEYS[1]])
    t.check(len(offsets) == len(tokens) + 1, f"len(offsets) {len(offsets)} for {len(tokens)} tokens")
    t.check(offsets[0] == 0 and offsets[-1] == len(ids) and np.all(np.diff(offsets) >= 1), offsets)
    return [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(tokens))]


def merge(base, new):
    """slime's _merge_rollout_top_p_token_data on (ids, offsets) pairs."""
    if base is None:
        return new
    (bi, bo), (ni, no) = base, new
    return np.concatenate([bi, ni]), np.concatenate([bo, no[1:] + bo[-1]])


def forward_logits(tmp, model, ids):
    out = os.path.join(tmp, "logits.npy")
    t.run("forward", "--model", model, "--input-ids", ",".join(map(str, ids)), "--out", out)
    logits = np.load(out).astype(np.float64)
    return logits.reshape(-1, logits.shape[-1])


def nucleus(logits, sp, top_p):
    """The reference kept set of one position: ids most probable first (ties to the lower id)."""
    p = np.exp(logits / sp["temperature"] - np.max(logits / sp["temperature"]))
    p /= p.sum()
    order = np.lexsort((np.arange(len(p)), -p))
    n = len(order)
    if sp.get("top_k", -1) > 0:
        n = min(n, sp["top_k"])
    before = np.concatenate([[0.0], np.cumsum(p[order])[:-1]])
    keep = [order[0]] + [order[i] for i in range(1, n) if before[i] < top_p]
    return [int(i) for i in keep], p


def check_against_reference(tmp, model, prompt, out, sp, label):
    meta = out["meta_info"]
    tokens = [e[1] for e in meta["output_token_logprobs"]]
    t.check(tokens == out["output_ids"] and len(tokens) > 0, f"{label}: {out}")
    sets = kept_sets(meta, tokens)
    logits = forward_logits(tmp, model, prompt + tokens)[len(prompt) - 1:]
    t.check(np.std(logits) > 0.1, f"{label}: degenerate reference logits")
    sizes = []
    for i, (tok, got) in enumerate(zip(tokens, sets)):
        t.check(tok in got, f"{label} token {i}: sampled {tok} not in its kept set {got}")
        t.check(len(set(got)) == len(got), f"{label} token {i}: repeated ids {got}")
        lo, p = nucleus(logits[i], sp, sp["top_p"] - SLACK)
        hi, _ = nucleus(logits[i], sp, min(sp["top_p"] + SLACK, 1.0))
        t.check(got == hi[:len(got)] and len(lo) <= len(got) <= len(hi),
                f"{label} token {i}: kept {got}, reference {lo} .. {hi}")
        # The logprob over the kept set: log(p[tok] / sum of p over the set).
        want = float(np.log(p[tok] / p[got].sum()))
        t.check(abs(meta["output_token_logprobs"][i][0] - want) < 1e-3,
                f"{label} token {i}: logprob {meta['output_token_logprobs'][i][0]}, renormalized {want}")
        sizes.append(len(got))
    return sizes


def generate(engine, body, what):
    return engine.post("/generate", body).raise_for_status(what).json()


def stream_events(engine, body):
    reply = engine.post("/generate", dict(body, stream=True)).raise_for_status("generate (stream)")
    events = []
    for line in reply.text.splitlines():
        data = line[len("data:"):].strip() if line.startswith("data:") else ""
        if data and data != "[DONE]":
            events.append(json.loads(data))
    return events


def main():
    with t.temp_dir() as tmp:
        model, _ = r.make_models(tmp)
        proc, engine = r.start(tmp, model)
        try:
            prompt = r.prompt_ids()
            # slime's GenerateState with --rollout-top-p 0.7 (temperature, no_stop_trim, ...).
            sp = {"temperature": 0.9, "top_p": 0.7, "top_k": -1, "max_new_tokens": 12,
                  "no_stop_trim": True, "skip_special_tokens": False, "spaces_between_special_tokens": False,
                  "sampling_seed": 7, "custom_params": {"return_top_p_token_ids": True}}
            body = {"input_ids": prompt, "sampling_params": sp, "return_logprob": True}
            out = generate(engine, body, "generate (top-p replay)")
            sizes = check_against_reference(tmp, model, prompt, out, sp, "top_p 0.7")
            t.check(max(sizes) > 1, f"the nuclei should hold more than one token somewhere: {sizes}")
            print(f"top_p 0.7: {len(sizes)} tokens, kept set sizes {sizes}")

            # top-k and top-p together; min-p alone (kept in id order); greedy (the token alone).
            sp_k = dict(sp, top_k=3, top_p=0.95, sampling_seed=8)
            check_against_reference(tmp, model, prompt, generate(engine, dict(body, sampling_params=sp_k), "top-k"),
                                    sp_k, "top_k 3 top_p 0.95")
            sp_m = dict(sp, top_p=1.0, min_p=0.05, sampling_seed=9)
            out_m = generate(engine, dict(body, sampling_params=sp_m), "min-p")
            for i, got in enumerate(kept_sets(out_m["meta_info"], out_m["output_ids"])):
                t.check(got == sorted(got) and out_m["output_ids"][i] in got, f"min-p token {i}: {got}")
            greedy = generate(engine, dict(body, sampling_params=dict(sp, temperature=0.0)), "greedy")
            sets = kept_sets(greedy["meta_info"], greedy["output_ids"])
            t.check(sets == [[tok] for tok in greedy["output_ids"]], f"greedy kept sets {sets}")
            t.check(all(e[0] == 0.0 for e in greedy["meta_info"]["output_token_logprobs"]), greedy["meta_info"])

            # Streaming (slime's generate_streaming): every event is the result so far, its
            # metadata that of its tokens; the last event equals the unstreamed reply.
            events = stream_events(engine, body)
            t.check(len(events) > 1, f"expected several events, got {len(events)}")
            for ev in events:
                meta = ev["meta_info"]
                tokens = [e[1] for e in meta["output_token_logprobs"]]
                kept_sets(meta, tokens)  # validates lengths against the tokens so far
            last = events[-1]["meta_info"]
            t.check(last["finish_reason"] is not None, last)
            for k in KEYS + ("output_token_logprobs",):
                t.check(last[k] == out["meta_info"][k], f"streamed {k} differs from the unstreamed reply")

            # n > 1: each sample its own sets; sample s is the single request seeded 7 + s.
            many = generate(engine, dict(body, sampling_params=dict(sp, n=3)), "n = 3")
            t.check(isinstance(many, list) and len(many) == 3, many)
            for s, o in enumerate(many):
                check_against_reference(tmp, model, prompt, o, sp, f"n=3 sample {s}")
                one = generate(engine, dict(body, sampling_params=dict(sp, sampling_seed=7 + s)), "seeded")
                for k in KEYS:
                    t.check(o["meta_info"][k] == one["meta_info"][k], f"sample {s}: {k} differs")

            # slime's multi-turn merge: a second call continues from prompt + first response.
            turn2 = generate(engine, dict(body, input_ids=prompt + out["output_ids"],
                                          sampling_params=dict(sp, sampling_seed=70)), "turn 2")
            merged = None
            for o in (out, turn2):
                m = o["meta_info"]
                merged = merge(merged, (decode_int32(m[KEYS[0]]), decode_int32(m[KEYS[1]])))
            response_length = len(out["output_ids"]) + len(turn2["output_ids"])
            t.check(len(merged[1]) == response_length + 1 and merged[1][-1] == len(merged[0]), merged)

            # Without the switch (absent, false, or with nothing filtered): none of the fields.
            for label, params in (("absent", {k: v for k, v in sp.items() if k != "custom_params"}),
                                  ("false", dict(sp, custom_params={"return_top_p_token_ids": False})),
                                  ("null", dict(sp, custom_params={"return_top_p_token_ids": None})),
                                  ("no filter", dict(sp, top_p=1.0))):
                meta = generate(engine, dict(body, sampling_params=params), label)["meta_info"]
                t.check(not any(k in meta for k in KEYS), f"{label}: {sorted(meta)}")
            # Other custom_params keys are accepted and ignored.
            generate(engine, dict(body, sampling_params=dict(sp, custom_params={"x": 1})), "other key")

            # Wrong types are refused, naming the field.
            for bad in ("yes", 1, [True]):
                reply = engine.post("/generate", dict(body, sampling_params=dict(
                    sp, custom_params={"return_top_p_token_ids": bad})))
                t.check(reply.status == 400 and
                        "sampling_params.custom_params.return_top_p_token_ids" in reply.text, reply.text)
        finally:
            r.stop(proc)
    print("top-p replay: ok")


if __name__ == "__main__":
    main()
