"""INT4 Qwen3-MoE parity: `rlserve forward` on compressed-tensors pack-quantized checkpoints
against numpy.

numpy reads the safetensors bytes (the `safetensors` package), unpacks the codes, scales and zero
points itself from the compressed-tensors description (docs/formats.md §3, written out again
below; no engine code), dequantizes w = bf16_rn((q - z) * scale), and runs the float64 reference
Qwen3-MoE of test_qwen3_parity.py on the result. Checkpoints: make-model --quant for every recipe
(group 32 and per-channel, standard zero points) and `rlserve quantize --zp-layout miles`.
Tolerance: the same 1e-3 max abs logit difference as the BF16 parity test (fp32 engine vs float64
reference over the same dequantized weights; measured ~1e-5).

Also the command line: generate on an INT4 checkpoint, `generate --quantize` (same greedy tokens
as generating on `rlserve quantize`'s output), and the refusals.
"""
import json
import os
import sys

import numpy as np
import safetensors

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rlserve_testlib import check, run, temp_dir  # noqa: E402
from test_qwen3_parity import (MAX_ABS_DIFF, bf16_to_float32, load_npy,  # noqa: E402
                               reference_logits)

LENGTHS = [1, 7, 31]
# Nibble slot s of a miles zero-point word holds output channel 8m + INTERLEAVE[s] (AWQ order).
INTERLEAVE = [0, 2, 4, 6, 1, 3, 5, 7]


def round_to_bf16(x32):
    """float32 -> nearest-even bfloat16, returned as float32 (no NaNs here)."""
    bits = x32.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def nibbles(words):
    """int32 words [..., m] -> codes [..., 8m], slot 0 (lowest bits) first."""
    u = words.astype(np.int64) & 0xFFFFFFFF
    return np.stack([(u >> (4 * s)) & 0xF for s in range(8)], axis=-1).reshape(*words.shape[:-1], -1)


def dequantize(raw, prefix, quant, zp_layout):
    packed = np.frombuffer(raw[prefix + ".weight_packed"]["data"], dtype="<i4").reshape(
        raw[prefix + ".weight_packed"]["shape"])
    n, k = np.frombuffer(raw[prefix + ".weight_shape"]["data"], dtype="<i8").tolist()
    scale = bf16_to_float32(bytes(raw[prefix + ".weight_scale"]["data"])).reshape(
        raw[prefix + ".weight_scale"]["shape"])
    groups = scale.shape[1]
    G = k // groups
    q = nibbles(packed)  # [n, k]
    check(q.shape == (n, k), f"{prefix}: codes {q.shape} != {(n, k)}")
    if quant["symmetric"]:
        z = np.full((n, groups), 8)
    else:
        zw = np.frombuffer(raw[prefix + ".weight_zero_point"]["data"], dtype="<i4").reshape(
            raw[prefix + ".weight_zero_point"]["shape"])
        if zp_layout == "standard":  # [n/8, groups], channel n in word n/8, slot n % 8
            check(zw.shape == (n // 8, groups), f"{prefix}: zero points {zw.shape}")
            z = nibbles(zw.T).T  # [groups, n] -> [n, groups]
        else:  # miles [groups, n/8]: slot s of word m is channel 8m + INTERLEAVE[s]
            check(zw.shape == (groups, n // 8), f"{prefix}: zero points {zw.shape}")
            slots = nibbles(zw).reshape(groups, n // 8, 8)
            z = np.zeros((n, groups), dtype=np.int64)
            for s in range(8):
                z[np.arange(n // 8) * 8 + INTERLEAVE[s], :] = slots[:, :, s].T
    zk = np.repeat(z, G, axis=1)
    sk = np.repeat(scale, G, axis=1)
    return round_to_bf16((q - zk).astype(np.float32) * sk).astype(np.float64)


def load_int4_weights(model_dir, zp_layout):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    quant = cfg["quantization_config"]["config_groups"]["group_0"]["weights"]
    with open(os.path.join(model_dir, "model.safetensors"), "rb") as f:
        raw = {name: entry for name, entry in safetensors.deserialize(f.read())}
    out = {}
    for name, entry in raw.items():
        if name.endswith(".weight_packed"):
            prefix = name[: -len(".weight_packed")]
            out[prefix + ".weight"] = dequantize(raw, prefix, quant, zp_layout)
        elif entry["dtype"] == "BF16":
            out[name] = bf16_to_float32(bytes(entry["data"])).reshape(entry["shape"]).astype(np.float64)
        else:
            check(name.endswith((".weight_scale", ".weight_zero_point", ".weight_shape")),
                  f"{name}: unexpected {entry['dtype']} tensor")
    return cfg, raw, out


def compare(model, label, zp_layout, tmp):
    cfg, raw, weights = load_int4_weights(model, zp_layout)
    rng = np.random.RandomState(99)
    worst = 0.0
    for T in LENGTHS:
        ids = rng.randint(0, cfg["vocab_size"], size=T).tolist()
        out = os.path.join(tmp, f"int4_{T}.npy")
        run("forward", "--model", model, "--input-ids", ",".join(map(str, ids)), "--out", out)
        got = load_npy(out)
        want = reference_logits(cfg, weights, ids)
        check(got.shape == want.shape, f"{label} T={T}: shape {got.shape} vs {want.shape}")
        check(np.std(want) > 0.5 and np.std(got) > 0.5, f"{label} T={T}: degenerate logits")
        diff = float(np.max(np.abs(got.astype(np.float64) - want)))
        worst = max(worst, diff)
        check(diff <= MAX_ABS_DIFF, f"{label} T={T}: max abs diff {diff} > {MAX_ABS_DIFF}")
    print(f"int4 parity {label}: worst max abs diff {worst:.3e} (limit {MAX_ABS_DIFF})")
    return cfg, raw


def check_int4_layout(cfg, raw, recipe, group):
    q = cfg["quantization_config"]
    check(q["quant_method"] == "compressed-tensors" and q["format"] == "pack-quantized", q)
    w = q["config_groups"]["group_0"]["weights"]
    check(w["num_bits"] == 4 and w["type"] == "int", w)
    check(w["symmetric"] == (recipe != "int4-asym"), w)
    check(w["strategy"] == ("channel" if group == -1 else "group"), w)
    check(w["group_size"] == (None if group == -1 else group), w)
    ignore = set(q["ignore"])
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        check(p + "mlp.gate" in ignore, f"router of layer {layer} not ignored")
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            check(p + "self_attn." + proj in ignore, f"{proj} of layer {layer} not ignored")
            check(p + f"self_attn.{proj}.weight" in raw, f"{proj} is not BF16")
        for e in range(cfg["num_experts"]):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                x = f"{p}mlp.experts.{e}.{proj}"
                check(x + ".weight" not in raw and x + ".weight_packed" in raw, f"{x} is not INT4")
                check(x not in ignore, f"{x} is ignored")
    check("lm_head" in ignore, "lm_head not ignored")


def test_make_model_int4(tmp, recipe, group):
    model = os.path.join(tmp, f"moe-{recipe}-{group}")
    run("make-model", "--arch", "qwen3-moe", "--preset", "tiny", "--out", model, "--seed", 3,
        "--quant", recipe, "--group-size", group)
    cfg, raw = compare(model, f"{recipe} g{group}", "standard", tmp)
    check_int4_layout(cfg, raw, recipe, group)
    return model


def test_miles_zero_points(tmp, bf16):
    model = os.path.join(tmp, "moe-miles")
    run("quantize", "--model", bf16, "--out", model, "--recipe", "int4-asym", "--group-size", 32,
        "--zp-layout", "miles", "--quiet")
    compare(model, "int4-asym g32 miles", "miles", tmp)


def greedy_tokens(*args):
    proc = run("generate", "--input-ids", "5,6,7,8", "--max-new-tokens", 6, "--temperature", 0,
               "--json", *args)
    outs = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    check(len(outs) == 1, f"one output expected: {proc.stdout!r}")
    ids = outs[0].get("output_ids") or outs[0]["meta_info"].get("output_ids")
    check(ids and len(ids) == 6, f"6 tokens expected: {outs[0]}")
    return ids


def test_cli(tmp, int4_model, bf16):
    greedy_tokens("--model", int4_model)
    quantized = os.path.join(tmp, "moe-q")
    run("quantize", "--model", bf16, "--out", quantized, "--recipe", "int4-sym-qat", "--group-size",
        32, "--quiet")
    a = greedy_tokens("--model", quantized)
    b = greedy_tokens("--model", bf16, "--quantize", "int4-sym-qat", "--group-size", 32)
    check(a == b, f"--quantize at load generated {b}, the quantized checkpoint {a}")
    proc = run("generate", "--model", int4_model, "--quantize", "int4-asym", "--group-size", 32,
               "--input-ids", "1", check=False)
    check(proc.returncode != 0 and "already quantized" in proc.stderr, f"refusal: {proc.stderr!r}")
    proc = run("generate", "--model", bf16, "--quantize", "int4-fancy", "--input-ids", "1", check=False)
    check(proc.returncode != 0 and "int4-fancy" in proc.stderr, f"bad recipe: {proc.stderr!r}")
    proc = run("generate", "--model", bf16, "--quantize", "int4-asym", "--group-size", 128,
               "--input-ids", "1", check=False)
    check(proc.returncode != 0 and "group size 128" in proc.stderr, f"tiny g128: {proc.stderr!r}")
    print(f"cli: generate on INT4 and with --quantize agree ({a})")


def main():
    with temp_dir() as tmp:
        bf16 = os.path.join(tmp, "moe-bf16")
        run("make-model", "--arch", "qwen3-moe", "--preset", "tiny", "--out", bf16, "--seed", 3)
        int4 = test_make_model_int4(tmp, "int4-asym", 32)
        test_make_model_int4(tmp, "int4-sym-qat", 32)
        test_make_model_int4(tmp, "int4-sym", -1)
        test_miles_zero_points(tmp, bf16)
        test_cli(tmp, int4, bf16)
    print("test_qwen3_int4_parity: all passed")


if __name__ == "__main__":
    main()
