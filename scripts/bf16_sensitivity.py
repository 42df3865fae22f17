#!/usr/bin/env python3
"""How far a correct BF16 forward of a model lands from its fp32 forward, per row.

The GPU runner computes in BF16 with an fp32 residual stream; its logits differ from the CPU
runner's (fp32) by rounding, and on MoE models by the router flips rounding causes where two
experts' scores nearly tie -- a property of the model and the prompts, not of the kernels. This
script measures that distance without a GPU: the float64 numpy reference of
tests/python/test_qwen3_parity.py, and the same forward rounded to bf16 at every point where
model/qwen3_gpu.cpp stores bf16 (norm outputs, q/k/v, q/k after norm + RoPE, attention output,
o_proj, gate / up, h, expert and MLP outputs, final norm; router logits, attention math, the
residual and the lm_head stay wide). Used to calibrate tests/model/qwen3_gpu_gpu_test.cpp.

  scripts/bf16_sensitivity.py --model DIR --prompts "1,2,3;4,5"
prints, per prompt row, the relative L2 of the bf16-emulated logits against float64, then the
median, the share of rows above 6e-2 and the top-1 agreement.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import test_qwen3_parity as ref  # noqa: E402
from test_qwen3_int4_parity import round_to_bf16  # noqa: E402


def bf16(x):
    """Round to the nearest bf16 (ties to even, through float32), returned as float64."""
    return round_to_bf16(np.asarray(x, dtype=np.float32)).astype(np.float64)


def bf16_logits(cfg, w, ids):
    T = len(ids)
    nq, nkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    positions = np.arange(T)
    causal = np.triu(np.ones((T, T), dtype=bool), k=1)
    x = w["model.embed_tokens.weight"][np.asarray(ids)].copy()  # fp32 residual (bf16 values)
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = bf16(ref.rms_norm(x, w[p + "input_layernorm.weight"], eps))
        q = bf16(h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, nq, d)
        k = bf16(h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, nkv, d)
        v = bf16(h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, nkv, d)
        q = bf16(ref.rotary(ref.rms_norm(q, w[p + "self_attn.q_norm.weight"], eps), positions, theta))
        k = bf16(ref.rotary(ref.rms_norm(k, w[p + "self_attn.k_norm.weight"], eps), positions, theta))
        k = np.repeat(k, nq // nkv, axis=1)
        v = np.repeat(v, nq // nkv, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d)
        scores = np.where(causal[None], -np.inf, scores)
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        attn = bf16(np.einsum("hqk,khd->qhd", probs, v).reshape(T, nq * d))
        x = x + bf16(attn @ w[p + "self_attn.o_proj.weight"].T)
        h = bf16(ref.rms_norm(x, w[p + "post_attention_layernorm.weight"], eps))
        if ref.layer_is_sparse(cfg, layer):
            top_k = cfg["num_experts_per_tok"]
            logits = h @ w[p + "mlp.gate.weight"].T
            logits = logits - logits.max(axis=-1, keepdims=True)
            router = np.exp(logits)
            router /= router.sum(axis=-1, keepdims=True)
            chosen = np.argsort(-router, axis=-1, kind="stable")[:, :top_k]
            weights = np.take_along_axis(router, chosen, axis=-1)
            if cfg.get("norm_topk_prob", False):
                weights = weights / weights.sum(axis=-1, keepdims=True)
            out = np.zeros_like(h)
            for t in range(T):
                for s in range(top_k):
                    e = f"{p}mlp.experts.{chosen[t, s]}."
                    g = bf16(h[t] @ w[e + "gate_proj.weight"].T)
                    u = bf16(h[t] @ w[e + "up_proj.weight"].T)
                    out[t] += weights[t, s] * (bf16(ref.silu(g) * u) @ w[e + "down_proj.weight"].T)
            x = x + bf16(out)
        else:
            g = bf16(h @ w[p + "mlp.gate_proj.weight"].T)
            u = bf16(h @ w[p + "mlp.up_proj.weight"].T)
            x = x + bf16(bf16(bf16(ref.silu(g)) * u) @ w[p + "mlp.down_proj.weight"].T)
    x = bf16(ref.rms_norm(x, w["model.norm.weight"], eps))
    lm_head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    return x @ lm_head.T


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a Hugging Face layout model directory")
    ap.add_argument("--prompts", required=True, help='token ids, prompts separated by ";"')
    args = ap.parse_args()
    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    w = ref.load_weights(args.model)
    rows, agree = [], []
    for text in args.prompts.split(";"):
        ids = [int(t) for t in text.split(",")]
        exact, rounded = ref.reference_logits(cfg, w, ids), bf16_logits(cfg, w, ids)
        for r in range(len(ids)):
            rows.append(np.linalg.norm(exact[r] - rounded[r]) / np.linalg.norm(exact[r]))
            agree.append(exact[r].argmax() == rounded[r].argmax())
        print(f"prompt of {len(ids)}: " + " ".join(f"{v:.3f}" for v in rows[-len(ids):]))
    rows = np.array(rows)
    print(f"median row {np.median(rows):.3e}, rows above 6e-2 {100 * np.mean(rows > 6e-2):.1f}%, "
          f"max {rows.max():.3e}, top-1 agreement {100 * np.mean(agree):.1f}%")


if __name__ == "__main__":
    main()
