"""Qwen3 / Qwen3-MoE logits: `rlserve forward` (cuda and cpu) against Hugging Face transformers.

Models are built through transformers from a config.json written here (random weights, fixed seed,
scaled so logits have a std of ~3), rounded to BF16 and exported in the Hugging Face hub layout:
transformers 5 keeps a MoE layer's experts fused (`mlp.experts.gate_up_proj` [E, 2I, H],
`mlp.experts.down_proj` [E, H, I]) while checkpoints (and the engine) name each expert
(`mlp.experts.<e>.{gate,up,down}_proj.weight`), so the export splits them. Two checks pin the split:
transformers' own loader must read the exported files back to the very same fused tensors
(from_pretrained, no missing or unexpected keys), and the MoE block of transformers must equal a
per-expert SwiGLU computed here from the exported tensors (and must NOT equal it with gate and up
swapped).

References (docs/testing.md, 'Parity with transformers'), each prompt run alone (batch 1, no
padding), eager attention:
  hf-fp32  transformers in float32 on the same BF16-valued weights: the kernel-bug detector.
  hf-bf16  transformers in bfloat16: the rounding gap of a BF16 engine.
The engine runs all prompts in one call (`--input-ids "a;b;c;d"`; on cuda one batch). Limits:
  engine cpu  (fp32 arithmetic on BF16 weights) vs hf-fp32: tight absolute limits (CPU_*).
  engine cuda (BF16 activations) vs both: calibrated on transformers' own BF16 error on the same
    prompts: rel-L2(cuda, hf-fp32) <= CUDA_VS_FP32 x rel-L2(hf-bf16, hf-fp32) (+ a floor), and so
    on (see check_cuda) -- a BF16 engine should be about as far from the fp32 truth as
    transformers' BF16 is, and a kernel bug is far above it.
INT4: `rlserve quantize` of the MoE model (int4-asym g32, int4-sym-qat g64, routed experts); the
compressed-tensors tensors are unpacked here with numpy from the safetensors bytes (docs/formats.md
§1, §3), written as a BF16 hub checkpoint and loaded by transformers; the engine's logits on the
INT4 checkpoint are held to that model the same way. Guards: the dequantized weights lie within
the quantization step of the originals, and the INT4 model's logits differ from the BF16 model's
by far more than the limits (so the comparison can tell the INT4 path from an ignored one).

Runs on a machine with a GPU, PyTorch and transformers (label `gpu`); prints `SKIPPED` and exits 0
without CUDA. Flags (not used by ctest):
  --reference-only         no engine forward (checks the export, dequantization and references;
                           `quantize` still runs when RLSERVE_BIN is set)
  --engine-devices cpu     engine devices to test (default cuda,cpu)
  --one-call-per-prompt    one `forward` per prompt without --device (for a CPU-only binary that
                           predates the multi-prompt `;` and --device)
  --keep DIR               write the models under DIR and keep them
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
from rlserve_testlib import check  # noqa: E402

SEED = 20251203
PROMPT_LENGTHS = [1, 7, 33, 100]

# Limits (relative L2 = ||engine - ref|| / ||ref|| over all positions of all prompts; top-1 = share
# of positions whose argmax agrees). See the module docstring.
# Observed on an H200 (transformers 5.17, torch 2.11, 2025-12-03) with the CPU engine: max abs
# 1.8e-5 / 9.5e-6, rel L2 9.8e-7 / 6.0e-7 (dense / MoE) against hf-fp32; transformers' own
# bf16-vs-fp32 gap (eager attention and experts): rel L2 1.3e-2 dense, 1.6e-2 MoE, 1.6e-2 / 2.0e-2
# INT4 asym / sym-qat; top-1 97.2..99.3%; max abs 0.2 (dense) .. 1.7 (MoE: routing flips). The
# INT4 models differ from the BF16 one by rel L2 0.096 / 0.123.
CPU_MAX_ABS = 1e-3       # ~50x the observed fp32-vs-fp32 difference (logit std ~3)
CPU_REL_L2 = 2e-5        # ~20x observed
CPU_TOP1 = 0.99          # at most one flip in 141 positions (a near-tie)
CUDA_VS_FP32 = 2.0       # x transformers' bf16-vs-fp32 rel-L2
CUDA_VS_BF16 = 3.0       # two BF16 paths, each ~g from the truth
CUDA_REL_FLOOR = 2e-3    # in case transformers' own BF16 gap is unusually small
CUDA_REL_CEIL = 0.1      # whatever the calibration says, never accept more than this
CUDA_TOP1_SLACK = 0.05   # top-1 vs hf-fp32 may be this much below transformers' bf16 top-1
QUANT_GUARD = 10.0       # INT4 model vs BF16 model must differ by >= this x the cpu rel-L2 limit

INT4_RECIPES = [("int4-asym", 32), ("int4-sym-qat", 64)]

# ---- the two models ----------------------------------------------------------------------------
# head_dim 128 as in Qwen3 (the GPU kernels are specialised for it); hidden 384 != 2 x I = 256 so
# the fused expert tensors' orientation is unambiguous from their shapes; all of H, I, the dense
# intermediate are multiples of 64 and of every INT4 group size; vocab 3000 is not a multiple of 64.
COMMON = {
    "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "initializer_range": 0.02, "use_cache": True, "use_sliding_window": False,
    "sliding_window": None, "bos_token_id": 1, "eos_token_id": 2,
    "torch_dtype": "bfloat16", "dtype": "bfloat16",
}
DENSE = dict(COMMON, **{
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
    "vocab_size": 2048, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128, "max_window_layers": 4,
    "tie_word_embeddings": True,
})
MOE = dict(COMMON, **{
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "vocab_size": 3000, "hidden_size": 384, "intermediate_size": 512, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128, "max_window_layers": 4,
    "tie_word_embeddings": False,
    "num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 128,
    "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [1],
    "output_router_logits": False, "router_aux_loss_coef": 0.001,
})


def layer_is_sparse(cfg, layer):
    return (cfg["model_type"] == "qwen3_moe" and layer not in cfg.get("mlp_only_layers", [])
            and cfg.get("num_experts", 0) > 0 and (layer + 1) % cfg.get("decoder_sparse_step", 1) == 0)


# ---- small helpers -----------------------------------------------------------------------------

FAILURES = []


def expect(condition, message):
    """Records a failed limit and goes on, so that one run prints every number."""
    if not condition:
        FAILURES.append(message)
        print(f"    FAIL: {message}")
    return condition


def rlserve_bin(required=True):
    path = os.environ.get("RLSERVE_BIN")
    if path and os.path.exists(path):
        return path
    if required:
        sys.exit("RLSERVE_BIN is not set to the built rlserve binary (run through ctest)")
    return None


def run_engine(*args):
    cmd = [rlserve_bin(), *map(str, args)]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"`{' '.join(cmd)}` failed with exit code {proc.returncode}:\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc, time.time() - t0


def stats(got, want):
    got = got.astype(np.float64)
    want = want.astype(np.float64)
    diff = got - want
    return {
        "max_abs": float(np.max(np.abs(diff))),
        "rel_l2": float(np.linalg.norm(diff) / np.linalg.norm(want)),
        "top1": float(np.mean(got.argmax(-1) == want.argmax(-1))),
    }


def row(label, s, limit=""):
    print(f"  {label:44s} max|d| {s['max_abs']:9.3e}  relL2 {s['rel_l2']:9.3e}  "
          f"top1 {s['top1'] * 100:6.2f}%  {limit}")


# ---- building and exporting through transformers -------------------------------------------------

def write_config(directory, cfg):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def hf_load_options(torch, dtype, moe):
    # eager attention and eager experts: the rounding points of docs/testing.md (transformers
    # 5 defaults to sdpa and to torch._grouped_mm for the experts)
    opts = {"dtype": dtype, "attn_implementation": "eager"}
    if moe:
        opts["experts_implementation"] = "eager"
    return opts


def build_random_model(torch, transformers, directory, cfg, seed):
    """config.json -> transformers model in float32 with seeded random BF16-valued weights."""
    write_config(directory, cfg)
    hf_cfg = transformers.AutoConfig.from_pretrained(directory)
    model = transformers.AutoModelForCausalLM.from_config(
        hf_cfg, **hf_load_options(torch, torch.float32, "num_experts" in cfg))
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    H = cfg["hidden_size"]
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):           # every RMSNorm incl. q_norm / k_norm
                value = 1.0 + 0.1 * noise
            elif name == "model.embed_tokens.weight":
                # tied: it is also the lm_head, so scale it like one (logit std ~3)
                value = noise * (3.0 / H ** 0.5 if cfg["tie_word_embeddings"] else 1.0)
            elif name == "lm_head.weight":
                value = noise * 3.0 / H ** 0.5
            elif name.endswith("mlp.gate.weight"):     # router: logits of std ~2
                value = noise * 2.0 / H ** 0.5
            elif p.dim() in (2, 3):                    # [out, in] or fused experts [E, ., .]
                fan_in = p.shape[-1]
                if "experts.gate_up_proj" in name or "experts.down_proj" in name:
                    fan_in = fused_fan_in(name, p.shape, cfg)
                value = noise / fan_in ** 0.5
            else:
                raise AssertionError(f"no init rule for parameter {name} {tuple(p.shape)}")
            p.copy_(value.to(torch.bfloat16).float())  # BF16-valued weights
    return model


def fused_fan_in(name, shape, cfg):
    H, I, E = cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["num_experts"]
    if name.endswith("gate_up_proj"):
        if tuple(shape) == (E, 2 * I, H):
            return H
        if tuple(shape) == (E, H, 2 * I):
            return H
    if name.endswith("down_proj"):
        if tuple(shape) in ((E, H, I), (E, I, H)):
            return I
    raise AssertionError(f"{name}: unexpected fused expert shape {tuple(shape)}")


def split_experts(state, cfg):
    """transformers' state dict -> hub names (one tensor per expert and projection)."""
    H, I, E = cfg.get("hidden_size"), cfg.get("moe_intermediate_size"), cfg.get("num_experts")
    out = {}
    for name, t in state.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            p = name[: -len("gate_up_proj")]
            if tuple(t.shape) == (E, 2 * I, H):        # F.linear(x, W[e]): [2I, H], rows = outputs
                w = t
            elif tuple(t.shape) == (E, H, 2 * I):      # x @ W[e]: [H, 2I]
                w = t.transpose(1, 2)
            else:
                raise AssertionError(f"{name}: shape {tuple(t.shape)}")
            # gate = the first I outputs, up = the last I (checked in check_moe_split)
            for e in range(E):
                out[f"{p}{e}.gate_proj.weight"] = w[e, :I, :].contiguous()
                out[f"{p}{e}.up_proj.weight"] = w[e, I:, :].contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            p = name[: -len("down_proj")]
            if tuple(t.shape) == (E, H, I):
                w = t
            elif tuple(t.shape) == (E, I, H):
                w = t.transpose(1, 2)
            else:
                raise AssertionError(f"{name}: shape {tuple(t.shape)}")
            for e in range(E):
                out[f"{p}{e}.down_proj.weight"] = w[e].contiguous()
        elif ".experts." in name and not name.split(".experts.")[1].split(".")[0].isdigit():
            raise AssertionError(f"unknown fused expert tensor {name}")
        else:
            out[name] = t   # already a hub name (also the per-expert ModuleList of transformers 4)
    if cfg["tie_word_embeddings"]:
        out.pop("lm_head.weight", None)
    return out


def save_hub(torch, directory, tensors):
    from safetensors.torch import save_file
    save_file({k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in tensors.items()},
              os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})


def hub_names_expected(cfg):
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if not cfg["tie_word_embeddings"]:
        names.add("lm_head.weight")
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        names |= {p + n for n in ("input_layernorm.weight", "post_attention_layernorm.weight",
                                  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                  "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                                  "self_attn.q_norm.weight", "self_attn.k_norm.weight")}
        if layer_is_sparse(cfg, l):
            names.add(p + "mlp.gate.weight")
            for e in range(cfg["num_experts"]):
                names |= {f"{p}mlp.experts.{e}.{j}.weight" for j in ("gate_proj", "up_proj", "down_proj")}
        else:
            names |= {p + f"mlp.{j}.weight" for j in ("gate_proj", "up_proj", "down_proj")}
    return names


def load_hf(torch, transformers, directory, dtype):
    with open(os.path.join(directory, "config.json")) as f:
        moe = "num_experts" in json.load(f)
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        directory, output_loading_info=True, **hf_load_options(torch, dtype, moe))
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys",
                                                         "mismatched_keys")}
    if bad:
        raise AssertionError(f"transformers could not read {directory} exactly: {bad}")
    check(model.config._attn_implementation == "eager",
          f"attention implementation {model.config._attn_implementation}")
    experts = getattr(model.config, "_experts_implementation", None)
    check(not moe or experts in (None, "eager"), f"experts implementation {experts}")
    return model.to("cuda").eval()


def check_same_state(torch, built, loaded, label):
    a, b = built.state_dict(), loaded.state_dict()
    check(set(a) == set(b), f"{label}: state dict names differ: {sorted(set(a) ^ set(b))[:8]}")
    for k in a:
        if not torch.equal(a[k].float().cpu(), b[k].float().cpu()):
            raise AssertionError(f"{label}: transformers read {k} back differently from what was "
                                 "exported (the split/naming of the export is wrong)")
    print(f"  {label}: from_pretrained reads the exported hub checkpoint back to the same "
          f"{len(a)} tensors (no missing/unexpected keys)")


def check_rope(torch, model, cfg):
    d = cfg["head_dim"]
    want = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    found = [(n, b) for n, b in model.named_buffers() if n.endswith("inv_freq")]
    check(found, "no RoPE inv_freq buffer in the transformers model")
    for n, b in found:
        got = b.float().cpu()
        check(b.dtype == torch.float32 and torch.allclose(got, want, rtol=1e-6),
              f"transformers' {n} ({b.dtype}) is not theta={cfg['rope_theta']} default RoPE: "
              f"{got[:4]} vs {want[:4]}")


def check_moe_split(torch, model, cfg, hub, layer):
    """The MoE block of transformers == per-expert SwiGLU on the exported tensors (fp32, cuda)."""
    F = torch.nn.functional
    block = model.model.layers[layer].mlp
    T, H, E, k = 64, cfg["hidden_size"], cfg["num_experts"], cfg["num_experts_per_tok"]
    x = torch.randn(1, T, H, generator=torch.Generator().manual_seed(5)).cuda()
    with torch.no_grad():
        got = block(x)
        got = (got[0] if isinstance(got, tuple) else got).reshape(T, H)
        p = f"model.layers.{layer}.mlp."
        w = {n: hub[n].float().cuda() for n in hub if n.startswith(p)}

        def manual(gate_name, up_name):
            probs = F.softmax(x[0] @ w[p + "gate.weight"].T, dim=-1)
            top, idx = torch.topk(probs, k, dim=-1)
            top = top / top.sum(-1, keepdim=True) if cfg["norm_topk_prob"] else top
            out = torch.zeros(T, H, device="cuda")
            for t in range(T):
                for s in range(k):
                    e = f"{p}experts.{int(idx[t, s])}."
                    h = x[0, t]
                    out[t] += top[t, s] * (w[e + "down_proj.weight"] @ (
                        F.silu(w[e + gate_name] @ h) * (w[e + up_name] @ h)))
            return out

        right = manual("gate_proj.weight", "up_proj.weight")
        swapped = manual("up_proj.weight", "gate_proj.weight")
    err = float((got - right).abs().max() / right.abs().max())
    err_swapped = float((got - swapped).abs().max() / right.abs().max())
    print(f"  layer {layer} MoE block vs per-expert SwiGLU on the exported tensors: rel max err "
          f"{err:.2e} (gate/up swapped: {err_swapped:.2e})")
    check(err < 1e-4, f"transformers' MoE block disagrees with the exported experts ({err:.2e}): "
          "the gate/up split or the expert order is wrong")
    check(err_swapped > 1e-2, "swapping gate and up changed nothing: the check is blind")


def hf_logits(torch, model, prompts):
    outs = []
    with torch.no_grad():
        for ids in prompts:
            t = torch.tensor([ids], dtype=torch.long, device="cuda")
            outs.append(model(input_ids=t).logits[0].float().cpu().numpy())
    return np.concatenate(outs, axis=0)


# ---- INT4: unpacking compressed-tensors here, from the safetensors bytes ------------------------

NP_DTYPES = {"I32": "<i4", "I64": "<i8", "F32": "<f4", "F16": "<f2", "U8": "u1"}


def read_safetensors_dir(directory):
    import safetensors
    files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
    check(files, f"{directory}: no .safetensors file")
    out = {}
    for name in files:
        with open(os.path.join(directory, name), "rb") as f:
            entries = safetensors.deserialize(f.read())
        for key, entry in entries:
            raw = bytes(entry["data"])
            if entry["dtype"] == "BF16":
                bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
                arr = bits.view(np.float32)
            elif entry["dtype"] in NP_DTYPES:
                arr = np.frombuffer(raw, dtype=NP_DTYPES[entry["dtype"]])
            else:
                raise AssertionError(f"{name}: {key} has dtype {entry['dtype']}")
            out[key] = (arr.reshape(entry["shape"]), entry["dtype"])
    return out


def unpack_nibbles(words, axis):
    """int32 words -> their 8 nibbles (slot s = bits 4s..4s+3), slot index inserted after `axis`."""
    u = words.astype(np.int64) & 0xFFFFFFFF
    shifts = (np.arange(8, dtype=np.int64) * 4)
    shape = [1] * (u.ndim + 1)
    shape[axis + 1] = 8
    return (np.expand_dims(u, axis + 1) >> shifts.reshape(shape)) & 0xF


def dequantize(tensors, prefix, symmetric, group_size):
    """docs/formats.md §1 and §3: w = bf16_rn(float(q - z) * float(s)), returned as float32 values."""
    packed, dt = tensors[prefix + ".weight_packed"]
    check(dt == "I32", f"{prefix}.weight_packed dtype {dt}")
    n, k = (int(v) for v in tensors[prefix + ".weight_shape"][0])
    check(packed.shape == (n, k // 8), f"{prefix}.weight_packed shape {packed.shape} for {(n, k)}")
    codes = unpack_nibbles(packed, axis=1).reshape(n, k)             # word (n, j) slot s = k 8j+s
    scale, sdt = tensors[prefix + ".weight_scale"]
    check(sdt in ("BF16", "F16"), f"{prefix}.weight_scale dtype {sdt}")
    G = k if group_size == -1 else group_size
    check(scale.shape == (n, k // G), f"{prefix}.weight_scale shape {scale.shape}")
    if symmetric:
        check(prefix + ".weight_zero_point" not in tensors, f"{prefix}: symmetric with a zero point")
        zero = np.full((n, k // G), 8, dtype=np.int64)
    else:
        zp, zdt = tensors[prefix + ".weight_zero_point"]
        check(zdt == "I32" and zp.shape == (n // 8, k // G),
              f"{prefix}.weight_zero_point {zdt} {zp.shape}, expected I32 {(n // 8, k // G)} (standard)")
        zero = unpack_nibbles(zp, axis=0).reshape(n, k // G)         # word (r, g) slot s = row 8r+s
    g = np.arange(k) // G
    w = (codes - zero[:, g]).astype(np.float32) * scale.astype(np.float32)[:, g]   # exact in fp32
    return w, scale.astype(np.float32)[:, g]


def bf16_round(torch, w):
    return torch.from_numpy(np.ascontiguousarray(w)).to(torch.bfloat16)


def make_dequantized_checkpoint(torch, qdir, ddir, orig_hub, recipe, group_size):
    """INT4 checkpoint -> BF16 hub checkpoint of the dequantized weights; checks them against the
    original weights (the quantization step bounds the error)."""
    with open(os.path.join(qdir, "config.json")) as f:
        cfg = json.load(f)
    qc = cfg.pop("quantization_config", None)
    check(qc is not None and qc.get("format") == "pack-quantized",
          f"{qdir}: no pack-quantized quantization_config")
    weights = qc["config_groups"]["group_0"]["weights"]
    symmetric = bool(weights["symmetric"])
    check(symmetric == (recipe != "int4-asym"), f"{recipe}: symmetric = {symmetric}")
    check(weights.get("group_size") == group_size, f"group_size {weights.get('group_size')}")
    tensors = read_safetensors_dir(qdir)
    prefixes = sorted(k[: -len(".weight_packed")] for k in tensors if k.endswith(".weight_packed"))
    want = sorted(k[: -len(".weight")] for k in orig_hub if ".mlp.experts." in k)
    check(prefixes == want, f"quantized modules {len(prefixes)} != routed expert weights {len(want)}")
    quantized = {p + s for p in prefixes for s in (".weight_packed", ".weight_scale",
                                                   ".weight_zero_point", ".weight_shape")}
    out, worst = {}, 0.0
    for key, (arr, dt) in tensors.items():
        if key in quantized:
            continue
        check(dt == "BF16", f"{key}: copied tensor has dtype {dt}")
        check(key in orig_hub, f"{key}: not in the BF16 checkpoint")
        check(torch.equal(torch.from_numpy(arr.copy()).to(torch.bfloat16), orig_hub[key].cpu()),
              f"{key}: quantize did not copy it unchanged")
        out[key] = orig_hub[key]
    step = 1.05 if not symmetric else 0.55     # x scale; formats.md §2 (rounding, zero point, bf16 scale)
    for p in prefixes:
        w, s = dequantize(tensors, p, symmetric, group_size)
        wb = bf16_round(torch, w)
        orig = orig_hub[p + ".weight"].float().cpu().numpy()
        err = np.abs(wb.float().numpy() - orig)
        bound = step * s + np.abs(orig) * 2.0 ** -8 + 1e-7
        check(np.all(err <= bound), f"{p}: dequantized weight off by {float(err.max()):.3e} "
              f"(> bound); the unpacking disagrees with the recipe")
        worst = max(worst, float((err / s).max()))
        out[p + ".weight"] = wb
    os.makedirs(ddir, exist_ok=True)
    write_config(ddir, cfg)
    save_hub(torch, ddir, out)
    print(f"  {recipe} g{group_size}: {len(prefixes)} expert weights unpacked; worst |deq - orig| = "
          f"{worst:.3f} x scale (bound {step})")


# ---- the engine ----------------------------------------------------------------------------------

def engine_logits(model_dir, prompts, device, tmp, one_call_per_prompt):
    out = os.path.join(tmp, f"logits_{device}.npy")
    if one_call_per_prompt:
        parts, secs = [], 0.0
        for ids in prompts:
            extra = [] if device == "cpu" else ["--device", device]
            _, s = run_engine("forward", "--model", model_dir, "--input-ids",
                              ",".join(map(str, ids)), "--out", out, *extra)
            secs += s
            parts.append(np.load(out))
        got = np.concatenate(parts, axis=0)
    else:
        ids = ";".join(",".join(map(str, p)) for p in prompts)
        _, secs = run_engine("forward", "--model", model_dir, "--input-ids", ids, "--out", out,
                             "--device", device)
        got = np.load(out)
    check(got.dtype == np.float32, f"engine logits dtype {got.dtype}, expected float32")
    return got, secs


def check_cpu(label, s):
    limit = f"[<= {CPU_MAX_ABS:g}, {CPU_REL_L2:g}, {CPU_TOP1 * 100:g}%]"
    row(label, s, limit)
    expect(s["max_abs"] <= CPU_MAX_ABS, f"{label}: max abs {s['max_abs']:.3e} > {CPU_MAX_ABS}")
    expect(s["rel_l2"] <= CPU_REL_L2, f"{label}: rel L2 {s['rel_l2']:.3e} > {CPU_REL_L2}")
    expect(s["top1"] >= CPU_TOP1, f"{label}: top-1 {s['top1']:.3f} < {CPU_TOP1}")


def cuda_limits(gap):
    """gap = stats(hf-bf16, hf-fp32) on the same model and prompts."""
    return {
        "fp32": min(max(CUDA_VS_FP32 * gap["rel_l2"], CUDA_REL_FLOOR), CUDA_REL_CEIL),
        "bf16": min(max(CUDA_VS_BF16 * gap["rel_l2"], CUDA_REL_FLOOR), CUDA_REL_CEIL),
        "top1": gap["top1"] - CUDA_TOP1_SLACK,
    }


def check_cuda(label, s, rel_limit, top1_limit=None):
    limit = f"[relL2 <= {rel_limit:.2e}" + (f", top1 >= {top1_limit * 100:.1f}%]" if top1_limit
                                             is not None else "]")
    row(label, s, limit)
    expect(s["rel_l2"] <= rel_limit, f"{label}: rel L2 {s['rel_l2']:.3e} > {rel_limit:.3e}")
    if top1_limit is not None:
        expect(s["top1"] >= top1_limit, f"{label}: top-1 {s['top1']:.3f} < {top1_limit:.3f}")


def compare_engine(name, model_dir, prompts, ref32, ref16, args, tmp):
    gap = stats(ref16, ref32)
    row(f"{name}: hf-bf16 vs hf-fp32 (calibration)", gap)
    if args.reference_only:
        return gap
    lim = cuda_limits(gap)
    V, total = ref32.shape[1], sum(len(p) for p in prompts)
    for device in args.engine_devices:
        try:
            got, secs = engine_logits(model_dir, prompts, device, tmp, args.one_call_per_prompt)
        except AssertionError as e:
            expect(False, f"{name}: engine forward --device {device} failed: {e}")
            continue
        if not expect(got.shape == (total, V), f"{name} {device}: logits shape {got.shape}, "
                      f"expected {(total, V)}"):
            continue
        expect(np.isfinite(got).all(), f"{name} {device}: non-finite logits")
        expect(float(np.std(got)) > 0.5, f"{name} {device}: degenerate logits (std {np.std(got):.3f})")
        print(f"  {name}: engine {device} forward of {len(prompts)} prompts took {secs:.2f} s")
        if device == "cpu":
            check_cpu(f"{name}: engine cpu vs hf-fp32", stats(got, ref32))
            row(f"{name}: engine cpu vs hf-bf16", stats(got, ref16), "(reported)")
        else:
            check_cuda(f"{name}: engine {device} vs hf-fp32", stats(got, ref32), lim["fp32"], lim["top1"])
            check_cuda(f"{name}: engine {device} vs hf-bf16", stats(got, ref16), lim["bf16"])
            # per prompt, so that a batching bug (one sequence leaking into another) shows
            off = 0
            for p in prompts:
                s = stats(got[off:off + len(p)], ref32[off:off + len(p)])
                print(f"      prompt of {len(p):3d} tokens vs hf-fp32: max|d| {s['max_abs']:.3e} "
                      f"relL2 {s['rel_l2']:.3e} top1 {s['top1'] * 100:.1f}%")
                expect(s["rel_l2"] <= max(2 * lim["fp32"], CUDA_REL_FLOOR * 2),
                       f"{name} {device}: prompt of {len(p)} tokens rel L2 {s['rel_l2']:.3e}")
                off += len(p)
    return gap


# ---- main ----------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reference-only", action="store_true")
    ap.add_argument("--engine-devices", default="cuda,cpu")
    ap.add_argument("--one-call-per-prompt", action="store_true")
    ap.add_argument("--keep", default=None)
    args = ap.parse_args()
    args.engine_devices = [d for d in args.engine_devices.split(",") if d]

    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"SKIPPED test_transformers_parity: {e} (needs PyTorch and transformers)")
        return 0
    if not torch.cuda.is_available():
        print("SKIPPED test_transformers_parity: torch.cuda is not available")
        return 0
    if not args.reference_only:
        rlserve_bin()
    torch.set_float32_matmul_precision("highest")   # no TF32 in the fp32 reference
    t_start = time.time()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}; engine {os.environ.get('RLSERVE_BIN', '(none)')}")

    root = args.keep or tempfile.mkdtemp(prefix="rlserve-hf-parity-")
    os.makedirs(root, exist_ok=True)
    rng = np.random.RandomState(SEED)
    try:
        moe_state = None
        for name, cfg, seed in (("qwen3 dense", DENSE, SEED), ("qwen3-moe", MOE, SEED + 1)):
            print(f"== {name}: {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
                  f"heads {cfg['num_attention_heads']}/{cfg['num_key_value_heads']} x {cfg['head_dim']}, "
                  f"vocab {cfg['vocab_size']}" + (
                      f", {cfg['num_experts']} experts top-{cfg['num_experts_per_tok']}, I "
                      f"{cfg['moe_intermediate_size']}, mlp_only_layers {cfg['mlp_only_layers']}"
                      if "num_experts" in cfg else ""))
            d = os.path.join(root, name.replace(" ", "-"))
            built = build_random_model(torch, transformers, d, cfg, seed)
            print(f"  transformers class {type(built).__name__}; parameters: " + ", ".join(
                f"{n} {tuple(p.shape)}" for n, p in built.named_parameters()
                if n.startswith("model.layers.0.mlp.") and ("experts" in n or "gate" in n))[:400])
            hub = split_experts(built.state_dict(), cfg)
            check(set(hub) == hub_names_expected(cfg),
                  f"{name}: exported names differ from the hub layout: "
                  f"{sorted(set(hub) ^ hub_names_expected(cfg))[:8]}")
            save_hub(torch, d, hub)
            hub = {k: v.to(torch.bfloat16) for k, v in hub.items()}
            ref32_model = load_hf(torch, transformers, d, torch.float32)
            check_same_state(torch, built, ref32_model, name)
            check_rope(torch, ref32_model, cfg)
            if "num_experts" in cfg:
                check_moe_split(torch, ref32_model, cfg, hub, 0)
            ref16_model = load_hf(torch, transformers, d, torch.bfloat16)
            prompts = [rng.randint(3, cfg["vocab_size"], size=T).tolist() for T in PROMPT_LENGTHS]
            ref32 = hf_logits(torch, ref32_model, prompts)
            ref16 = hf_logits(torch, ref16_model, prompts)
            check(float(np.std(ref32)) > 0.5, f"{name}: reference logits degenerate")
            top2 = np.sort(ref32, axis=-1)[:, -2:]
            print(f"  logits std {np.std(ref32):.2f}; smallest top-1/top-2 gap "
                  f"{float((top2[:, 1] - top2[:, 0]).min()):.2e}")
            del ref32_model, ref16_model
            compare_engine(name, d, prompts, ref32, ref16, args, root)
            if "num_experts" in cfg:
                moe_state = (d, cfg, hub, prompts, ref32)
            torch.cuda.empty_cache()

        d, cfg, hub, prompts, orig32 = moe_state
        recipes = INT4_RECIPES
        if rlserve_bin(required=False) is None:
            print("== INT4: skipped (no RLSERVE_BIN for `rlserve quantize`)")
            recipes = []
        for recipe, G in recipes:
            name = f"qwen3-moe {recipe} g{G}"
            print(f"== {name}")
            qdir = os.path.join(root, f"moe-{recipe}-g{G}")
            shutil.rmtree(qdir, ignore_errors=True)
            proc, secs = run_engine("quantize", "--model", d, "--out", qdir, "--recipe", recipe,
                                    "--group-size", G, "--targets", "experts", "--quiet")
            print(f"  {proc.stdout.strip()} ({secs:.1f} s)")
            ddir = os.path.join(root, f"moe-{recipe}-g{G}-dequantized")
            make_dequantized_checkpoint(torch, qdir, ddir, hub, recipe, G)
            m32 = load_hf(torch, transformers, ddir, torch.float32)
            m16 = load_hf(torch, transformers, ddir, torch.bfloat16)
            ref32, ref16 = hf_logits(torch, m32, prompts), hf_logits(torch, m16, prompts)
            del m32, m16
            qgap = stats(ref32, orig32)
            row(f"{name}: hf-fp32 INT4 vs hf-fp32 BF16 (guard)", qgap,
                f"[relL2 >= {QUANT_GUARD * CPU_REL_L2:g}]")
            check(qgap["rel_l2"] >= QUANT_GUARD * CPU_REL_L2,
                  f"{name}: quantization changes the logits too little for the test to see it")
            cuda_fp32_limit = cuda_limits(stats(ref16, ref32))["fp32"]
            if qgap["rel_l2"] < 2 * cuda_fp32_limit:
                print(f"  note: the cuda limit {cuda_fp32_limit:.2e} is not far below the INT4 "
                      f"effect {qgap['rel_l2']:.2e}; the cuda INT4 rows tell less")
            compare_engine(name, qdir, prompts, ref32, ref16, args, root)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    print(f"total {time.time() - t_start:.1f} s")
    if FAILURES:
        print(f"test_transformers_parity: {len(FAILURES)} FAILED:")
        for f in FAILURES:
            print(f"  - {f}")
        return 1
    print("test_transformers_parity: all passed" + (" (reference only: no engine forward)"
                                                     if args.reference_only else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
