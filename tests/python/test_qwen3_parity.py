"""Qwen3 and Qwen3-MoE forward parity: `rlserve forward` against an independent numpy Qwen3.

The reference below is written from the Hugging Face `Qwen3ForCausalLM` definition (modeling_qwen3:
Qwen3RMSNorm, rotate_half / apply_rotary_pos_emb, repeat_kv, eager attention with a causal mask,
Qwen3MLP) and `Qwen3MoeForCausalLM` (Qwen3MoeSparseMoeBlock: softmax router, top-k, norm_topk_prob;
decoder_sparse_step and mlp_only_layers), in float64, reading the checkpoint with the `safetensors`
package. It shares no code with the engine. For each weight dtype it builds the tiny model with
`rlserve make-model`, runs prompts of several lengths through `rlserve forward`, and compares the
logits of every position.

Also checks make-model's contract: same seed -> byte-identical files, another seed -> other
weights, and no overwriting of a directory it did not write.
"""
import json
import os
import sys

import numpy as np
import safetensors
import safetensors.numpy
from safetensors import safe_open

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rlserve_testlib import check, run, temp_dir  # noqa: E402

# fp32 engine vs float64 reference on logits of std ~3: the engine's rounding is ~1e-5.
MAX_ABS_DIFF = 1e-3
PROMPT_LENGTHS = [1, 2, 7, 31, 96]


# ---- checkpoint reading (the safetensors package; bf16 decoded by hand) -------------------------

def bf16_to_float32(raw):
    """bfloat16 is the top half of a float32: widen the uint16 bits by 16."""
    bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
    return bits.view(np.float32)


def load_weights(model_dir):
    path = os.path.join(model_dir, "model.safetensors")
    out = {}
    with open(path, "rb") as f:
        entries = safetensors.deserialize(f.read())
    f32_names = []
    for name, entry in entries:
        if entry["dtype"] == "BF16":
            out[name] = bf16_to_float32(bytes(entry["data"])).reshape(entry["shape"])
        elif entry["dtype"] == "F32":
            f32_names.append(name)
        else:
            raise AssertionError(f"{name}: unexpected dtype {entry['dtype']}")
    if f32_names:
        with safe_open(path, framework="numpy") as f:
            for name in f32_names:
                out[name] = f.get_tensor(name)
    return {k: v.astype(np.float64) for k, v in out.items()}


# ---- the reference model -------------------------------------------------------------------------

def rms_norm(x, weight, eps):
    # Qwen3RMSNorm: x * rsqrt(mean(x^2) + eps) * weight, over the last axis.
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(variance + eps) * weight


def rotary(x, positions, theta):
    # x: [T, heads, head_dim]. Default RoPE: inv_freq = theta^(-arange(0, d, 2)/d),
    # emb = cat(freqs, freqs); x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1).
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    freqs = np.outer(positions.astype(np.float64), inv_freq)  # [T, d/2]
    emb = np.concatenate([freqs, freqs], axis=-1)[:, None, :]  # [T, 1, d]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    rotated = np.concatenate([-x2, x1], axis=-1)
    return x * np.cos(emb) + rotated * np.sin(emb)


def silu(x):
    return x / (1.0 + np.exp(-x))


def swiglu(w, prefix, h):
    # Qwen3MLP / Qwen3MoeMLP: down_proj(silu(gate_proj(h)) * up_proj(h)).
    gate = h @ w[prefix + "gate_proj.weight"].T
    up = h @ w[prefix + "up_proj.weight"].T
    return (silu(gate) * up) @ w[prefix + "down_proj.weight"].T


def layer_is_sparse(cfg, layer):
    # Qwen3MoeDecoderLayer: a sparse block unless the layer is in mlp_only_layers, when
    # num_experts > 0 and (layer_idx + 1) % decoder_sparse_step == 0.
    if cfg["architectures"][0] != "Qwen3MoeForCausalLM":
        return False
    return (layer not in cfg.get("mlp_only_layers", []) and cfg.get("num_experts", 0) > 0
            and (layer + 1) % cfg.get("decoder_sparse_step", 1) == 0)


def sparse_moe_block(cfg, w, prefix, h, chosen_out=None):
    # Qwen3MoeSparseMoeBlock: softmax over all router logits, top-k (stable sort: ties to the
    # lower expert id), renormalized iff norm_topk_prob, weighted sum of the chosen experts.
    k = cfg["num_experts_per_tok"]
    logits = h @ w[prefix + "gate.weight"].T  # [T, E]
    logits = logits - logits.max(axis=-1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=-1, keepdims=True)
    chosen = np.argsort(-probs, axis=-1, kind="stable")[:, :k]  # [T, k]
    if chosen_out is not None:  # routing replay: the choices and the probabilities they came from
        chosen_out.append((chosen, probs))
    weights = np.take_along_axis(probs, chosen, axis=-1)
    if cfg.get("norm_topk_prob", False):
        weights = weights / weights.sum(axis=-1, keepdims=True)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        for s in range(k):
            expert = f"{prefix}experts.{chosen[t, s]}."
            out[t] += weights[t, s] * swiglu(w, expert, h[t:t + 1])[0]
    return out


def reference_logits(cfg, w, ids, routing=None):
    """Logits of every position; `routing` (a dict), when given, gets layer -> (chosen [T, k],
    router probabilities [T, experts]) of every sparse layer."""
    T = len(ids)
    nq, nkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    positions = np.arange(T)
    causal = np.triu(np.ones((T, T), dtype=bool), k=1)  # True above the diagonal: masked

    x = w["model.embed_tokens.weight"][np.asarray(ids)]  # [T, hidden]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, nq, d)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, nkv, d)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, nkv, d)
        q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
        k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = rotary(q, positions, theta), rotary(k, positions, theta)
        # repeat_kv: kv head j serves query heads j * n_rep .. (j + 1) * n_rep - 1.
        k = np.repeat(k, nq // nkv, axis=1)
        v = np.repeat(v, nq // nkv, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d)
        scores = np.where(causal[None], -np.inf, scores)
        scores = scores - scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(T, nq * d)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        if layer_is_sparse(cfg, layer):
            chosen = [] if routing is not None else None
            x = x + sparse_moe_block(cfg, w, p + "mlp.", h, chosen)
            if routing is not None:
                routing[layer] = chosen[0]
        else:
            x = x + swiglu(w, p + "mlp.", h)
    x = rms_norm(x, w["model.norm.weight"], eps)
    lm_head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    return x @ lm_head.T  # [T, vocab]


def load_npy(path):
    arr = np.load(path)
    check(arr.dtype == np.float32, f"{path}: dtype {arr.dtype}, expected float32")
    return arr


# ---- tests ---------------------------------------------------------------------------------------

def compare(model, label, lengths, tmp):
    """Runs prompts of `lengths` through the engine and the reference; returns the worst diff."""
    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    weights = load_weights(model)
    rng = np.random.RandomState(1234)
    worst = 0.0
    for T in lengths:
        ids = rng.randint(0, cfg["vocab_size"], size=T).tolist()
        out = os.path.join(tmp, f"logits_{T}.npy")
        run("forward", "--model", model, "--input-ids", ",".join(map(str, ids)), "--out", out)
        got = load_npy(out)
        want = reference_logits(cfg, weights, ids)
        check(got.shape == want.shape, f"T={T}: shape {got.shape}, expected {want.shape}")
        # Oracle guard: a model whose logits are all zero (or constant) would match nothing
        # interesting; the random model must produce varied logits.
        check(np.std(want) > 0.5, f"T={T}: reference logits are degenerate (std {np.std(want)})")
        check(np.std(got) > 0.5, f"T={T}: engine logits are degenerate (std {np.std(got)})")
        diff = float(np.max(np.abs(got.astype(np.float64) - want)))
        worst = max(worst, diff)
        print(f"  {label:16s} T={T:3d}: max |engine - numpy| = {diff:.3e} "
              f"(logit std {np.std(want):.2f}, argmax agree "
              f"{np.mean(got.argmax(-1) == want.argmax(-1)) * 100:.0f}%)")
        check(diff <= MAX_ABS_DIFF, f"{label} T={T}: max abs diff {diff} > {MAX_ABS_DIFF}")
    print(f"parity {label}: worst max abs diff {worst:.3e} (limit {MAX_ABS_DIFF})")
    return worst


def test_parity(dtype):
    with temp_dir() as tmp:
        model = os.path.join(tmp, "model")
        run("make-model", "--arch", "qwen3", "--preset", "tiny", "--out", model, "--seed", 7,
            "--dtype", dtype)
        with open(os.path.join(model, "config.json")) as f:
            cfg = json.load(f)
        check(cfg["architectures"] == ["Qwen3ForCausalLM"], f"architectures {cfg['architectures']}")
        check(cfg["model_type"] == "qwen3", f"model_type {cfg['model_type']}")
        check(cfg["torch_dtype"] == dtype, f"torch_dtype {cfg['torch_dtype']} != {dtype}")
        check(cfg["tie_word_embeddings"] is True, "tiny preset ties embeddings")
        check("lm_head.weight" not in load_weights(model),
              "tied model must not store lm_head.weight")
        compare(model, f"tiny {dtype}", PROMPT_LENGTHS, tmp)


def test_parity_small_preset():
    # 8 query heads over 4 kv heads, head_dim 32, 4 layers: other shapes than tiny.
    with temp_dir() as tmp:
        model = os.path.join(tmp, "model")
        run("make-model", "--preset", "small", "--out", model, "--seed", 1, "--dtype", "bfloat16")
        compare(model, "small bfloat16", [1, 19], tmp)


def test_parity_untied_lm_head():
    # make-model presets tie embeddings; give the tiny model its own lm_head (written by the
    # Python package) and untie it in config.json, so the engine's lm_head path is checked too.
    with temp_dir() as tmp:
        model = os.path.join(tmp, "model")
        run("make-model", "--preset", "tiny", "--out", model, "--seed", 5, "--dtype", "float32")
        path = os.path.join(model, "model.safetensors")
        with safe_open(path, framework="numpy") as f:
            arrays = {k: f.get_tensor(k) for k in f.keys()}
        rng = np.random.RandomState(5)
        arrays["lm_head.weight"] = (rng.randn(*arrays["model.embed_tokens.weight"].shape) * 0.25
                                    ).astype(np.float32)
        safetensors.numpy.save_file(arrays, path, metadata={"format": "pt"})
        cfg_path = os.path.join(model, "config.json")
        with open(cfg_path) as f:
            cfg = json.load(f)
        cfg["tie_word_embeddings"] = False
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        compare(model, "untied float32", [1, 12], tmp)


def make_moe(tmp, preset, seed, dtype):
    model = os.path.join(tmp, "moe")
    run("make-model", "--arch", "qwen3-moe", "--preset", preset, "--out", model, "--seed", seed,
        "--dtype", dtype)
    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    check(cfg["architectures"] == ["Qwen3MoeForCausalLM"], f"architectures {cfg['architectures']}")
    check(cfg["model_type"] == "qwen3_moe", f"model_type {cfg['model_type']}")
    for field in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                  "decoder_sparse_step", "norm_topk_prob", "mlp_only_layers"):
        check(field in cfg, f"config.json lacks {field}")
    names = set(load_weights(model))
    E, L = cfg["num_experts"], cfg["num_hidden_layers"]
    for layer in range(L):
        p = f"model.layers.{layer}.mlp."
        check(p + "gate.weight" in names, f"no router {p}gate.weight")
        for e in range(E):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                check(f"{p}experts.{e}.{proj}.weight" in names, f"no {p}experts.{e}.{proj}.weight")
        check(p + "gate_proj.weight" not in names, f"sparse layer {layer} has a dense MLP")
    return model, cfg


def test_moe_parity(dtype):
    with temp_dir() as tmp:
        model, cfg = make_moe(tmp, "tiny", 11, dtype)
        check(cfg["norm_topk_prob"] is True and cfg["decoder_sparse_step"] == 1, cfg)
        return compare(model, f"moe tiny {dtype}", PROMPT_LENGTHS, tmp)


def test_moe_small_preset():
    with temp_dir() as tmp:
        model, _ = make_moe(tmp, "small", 2, "bfloat16")
        return compare(model, "moe small bf16", [1, 19], tmp)


def test_moe_dense_layers(label, changes, dense_layers):
    """Edits a float32 tiny MoE checkpoint: `changes` into config.json, and `dense_layers` get a
    dense MLP (random, written by the Python package) in place of their router and experts."""
    with temp_dir() as tmp:
        model, cfg = make_moe(tmp, "tiny", 13, "float32")
        path = os.path.join(model, "model.safetensors")
        with safe_open(path, framework="numpy") as f:
            arrays = {k: f.get_tensor(k) for k in f.keys()}
        rng = np.random.RandomState(13)
        H, I = cfg["hidden_size"], cfg["intermediate_size"]
        for layer in dense_layers:
            p = f"model.layers.{layer}.mlp."
            arrays = {k: v for k, v in arrays.items() if not k.startswith(p)}
            arrays[p + "gate_proj.weight"] = (rng.randn(I, H) / np.sqrt(H)).astype(np.float32)
            arrays[p + "up_proj.weight"] = (rng.randn(I, H) / np.sqrt(H)).astype(np.float32)
            arrays[p + "down_proj.weight"] = (rng.randn(H, I) * 3 / np.sqrt(I)).astype(np.float32)
        safetensors.numpy.save_file(arrays, path, metadata={"format": "pt"})
        cfg.update(changes)
        with open(os.path.join(model, "config.json"), "w") as f:
            json.dump(cfg, f)
        sparse = [layer_is_sparse(cfg, l) for l in range(cfg["num_hidden_layers"])]
        check(sparse == [l not in dense_layers for l in range(cfg["num_hidden_layers"])],
              f"{label}: layers sparse {sparse}, dense expected {dense_layers}")
        return compare(model, label, [1, 9, 31], tmp)


def test_moe_refuses_a_dense_checkpoint():
    with temp_dir() as tmp:
        model, cfg = make_moe(tmp, "tiny", 1, "float32")
        cfg["mlp_only_layers"] = [0]
        with open(os.path.join(model, "config.json"), "w") as f:
            json.dump(cfg, f)
        proc = run("forward", "--model", model, "--input-ids", "1,2", "--out",
                   os.path.join(tmp, "x.npy"), check=False)
        err = proc.stdout + proc.stderr
        check(proc.returncode != 0, "a MoE checkpoint whose layer 0 should be dense loaded")
        check("missing" in err and "model.layers.0.mlp.gate_proj.weight" in err,
              f"unclear load error: {err!r}")


def read_all(directory):
    files = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            files[name] = f.read()
    return files


def test_make_model_contract():
    with temp_dir() as tmp:
        a, b, c = (os.path.join(tmp, n) for n in ("a", "b", "c"))
        run("make-model", "--preset", "tiny", "--out", a, "--seed", 3)
        run("make-model", "--preset", "tiny", "--out", b, "--seed", 3)
        run("make-model", "--preset", "tiny", "--out", c, "--seed", 4)
        fa, fb, fc = read_all(a), read_all(b), read_all(c)
        check(fa == fb, "same seed must give byte-identical files: differ in "
              f"{[n for n in fa if fa.get(n) != fb.get(n)]}")
        check(fa["model.safetensors"] != fc["model.safetensors"], "another seed, same weights")
        for name in ("config.json", "generation_config.json", "model.safetensors"):
            check(name in fa, f"make-model did not write {name}")
        with open(os.path.join(a, "config.json")) as f:
            cfg = json.load(f)
        with open(os.path.join(a, "generation_config.json")) as f:
            gen = json.load(f)
        check(gen["eos_token_id"] == cfg["eos_token_id"], "generation_config eos != config eos")

        # Rerunning into its own output is allowed and reproduces it.
        run("make-model", "--preset", "tiny", "--out", a, "--seed", 3)
        check(read_all(a) == fb, "re-running make-model into its own output changed the files")

        # A directory it did not write is refused and left alone.
        foreign = os.path.join(tmp, "foreign")
        os.makedirs(foreign)
        with open(os.path.join(foreign, "notes.txt"), "w") as f:
            f.write("keep me")
        proc = run("make-model", "--preset", "tiny", "--out", foreign, check=False)
        check(proc.returncode != 0, "make-model overwrote a foreign directory")
        check("not empty" in proc.stderr and foreign in proc.stderr,
              f"unclear refusal message: {proc.stderr!r}")
        check(os.listdir(foreign) == ["notes.txt"], "make-model wrote into a foreign directory")

        proc = run("make-model", "--preset", "huge", "--out", os.path.join(tmp, "h"), check=False)
        check(proc.returncode != 0 and "huge" in proc.stderr, f"bad preset: {proc.stderr!r}")
    print("make-model contract: ok")


def main():
    test_make_model_contract()
    for dtype in ("bfloat16", "float32"):
        test_parity(dtype)
    test_parity_small_preset()
    test_parity_untied_lm_head()
    moe = [test_moe_parity("bfloat16"), test_moe_parity("float32"), test_moe_small_preset(),
           test_moe_dense_layers("moe step 2, no norm", {"decoder_sparse_step": 2,
                                                         "norm_topk_prob": False}, [0]),
           test_moe_dense_layers("moe mlp_only [1]", {"mlp_only_layers": [1]}, [1])]
    print(f"Qwen3-MoE parity: worst max abs diff {max(moe):.3e} over {len(moe)} checkpoints")
    test_moe_refuses_a_dense_checkpoint()
    print("test_qwen3_parity: all passed")


if __name__ == "__main__":
    main()
