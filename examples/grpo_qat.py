#!/usr/bin/env python3
"""GRPO with INT4 quantization-aware training, rlserve as the colocated rollout engine on one GPU.

A PyTorch trainer (this process) trains a small Qwen3-MoE (`rlserve make-model --preset medium`,
random weights) with GRPO on a toy task whose reward is programmatic: the share of generated tokens
whose id is a multiple of 8 (an untrained model scores about 1/8). `rlserve serve` on the same GPU
generates the rollouts. Each step, as a colocated RL loop does it:

  1. generate: `samples` completions of each prompt (temperature 1, with their logprobs);
  2. release the engine's GPU memory (weights, KV pool, the forward's memory) and measure what
     the driver got back;
  3. train: group-normalized advantages, one policy-gradient step (Adam) on the trainer's float32
     master weights; the forward sees the weights the engine will serve: rounded to bfloat16, and
     with QAT the routed experts fake-quantized with the engine's recipe (straight-through);
  4. resume the weights, push every tensor by CUDA IPC in one begin/end session (rlserve's
     `device_tensors`, through the Python package), resume the rest;
  5. verify: every checksum the engine reports equals the one the trainer computes from its own
     tensors (BF16 bytes hashed here; INT4 modules quantized here with the package's recipe).

The train/rollout mismatch is measured on the sampled tokens before each step's update: mean
|logprob_trainer - logprob_rollout| and the k3 estimate of KL(rollout || trainer),
mean(r - 1 - log r) with r = p_trainer / p_rollout. Variants (--variants):
  a  QAT trainer  + INT4 engine (the trainer's forward fake-quantizes the experts)
  b  BF16 trainer + INT4 engine (no QAT: the engine quantizes what the trainer never saw)
  c  BF16 trainer + BF16 engine
Writes OUT/grpo_qat.json (every step of every variant) and OUT/grpo_qat.png (reward and mismatch
over steps). Needs a CUDA GPU, PyTorch, safetensors, xxhash and NumPy.

  python3 examples/grpo_qat.py --rlserve build/apps/rlserve --out /tmp/grpo --steps 20
"""
import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import rlserve  # noqa: E402

VARIANTS = {
    "a": {"label": "QAT trainer + INT4 engine", "qat": True, "int4": True},
    "b": {"label": "BF16 trainer + INT4 engine", "qat": False, "int4": True},
    "c": {"label": "BF16 trainer + BF16 engine", "qat": False, "int4": False},
}
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def reward_of(tokens):
    """The toy task: the share of tokens whose id is a multiple of 8."""
    return sum(1 for t in tokens if t % 8 == 0) / max(len(tokens), 1)


# ---- the trainer's model ------------------------------------------------------------------------

def bf16_ste(torch, w):
    """The bfloat16 value the engine serves, with the float32 master's gradient."""
    return w + (w.to(torch.bfloat16).float() - w).detach()


def fake_quant(torch, w, recipe, group_size):
    """W4A16 fake quantization of [..., n, k] weights along k, the engine's recipe (see
    rlserve.int4): the bfloat16 value quantized in float32 arithmetic, dequantized with the
    bfloat16 scale the engine stores; the gradient passes straight through."""
    x = w.to(torch.bfloat16).float()
    *lead, n, k = x.shape
    g = k if group_size == -1 else group_size
    x = x.reshape(*lead, n, k // g, g)
    if recipe == "int4-asym":
        lo = x.amin(-1).clamp(max=0.0)
        hi = x.amax(-1).clamp(min=0.0)
        # Divided by a tensor: PyTorch's CUDA kernel multiplies by the reciprocal of a Python
        # number, which is not the engine's IEEE division.
        scale = ((hi - lo) / torch.full_like(hi, 15.0)).clamp(min=1e-5)
        zero = torch.round(-lo / scale).clamp(0, 15)
        code = (torch.round(x / scale[..., None]) + zero[..., None]).clamp(0, 15)
        deq = (code - zero[..., None]) * scale.to(torch.bfloat16).float()[..., None]
    else:
        qat = recipe == "int4-sym-qat"
        amax = x.abs().amax(-1)
        scale = (amax / torch.full_like(amax, 7.0 if qat else 7.5)).clamp(min=1e-5)
        code = torch.round(x / scale[..., None]).clamp(-7 if qat else -8, 7)
        deq = code * scale.to(torch.bfloat16).float()[..., None]
    return w + (deq.reshape(w.shape) - w).detach()


class Trainer:
    """Qwen3-MoE in float32 arithmetic on float32 master weights; the experts of a layer stacked
    ([E, I, H] gate and up, [E, H, I] down) and computed densely (every expert on every token,
    weighted by the router's top-k), which is exact and simple at this size."""

    def __init__(self, torch, cfg, state, qat, recipe, group_size):
        self.torch, self.cfg, self.qat = torch, cfg, qat
        self.recipe, self.group_size = recipe, group_size
        self.tied = cfg.get("tie_word_embeddings", False)
        E = cfg["num_experts"]
        self.params = {}
        for name, t in state.items():
            if ".mlp.experts." not in name:
                self.params[name] = torch.nn.Parameter(t.float().clone())
        for layer in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{layer}.mlp.experts."
            for proj in PROJECTIONS:
                stacked = torch.stack([state[f"{p}{e}.{proj}.weight"].float() for e in range(E)])
                self.params[f"{p}{proj}"] = torch.nn.Parameter(stacked)
        half = cfg["head_dim"] // 2
        inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(half, device="cuda", dtype=torch.float64) / half))
        self.inv_freq = inv

    def w(self, name):
        p = self.params[name]
        if self.qat and ".mlp.experts." in name:
            return fake_quant(self.torch, p, self.recipe, self.group_size)
        return bf16_ste(self.torch, p)

    def rms(self, x, name):
        torch = self.torch
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg["rms_norm_eps"]) * self.w(name)

    def rope(self, x, T):
        torch = self.torch
        ang = torch.arange(T, device="cuda", dtype=torch.float64)[:, None] * self.inv_freq[None, :]
        cos, sin = ang.cos().float()[None, :, None, :], ang.sin().float()[None, :, None, :]
        a, b = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    def logits(self, tokens):
        torch, F, cfg = self.torch, self.torch.nn.functional, self.cfg
        B, T = tokens.shape
        nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        x = self.w("model.embed_tokens.weight")[tokens]
        for layer in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{layer}."
            h = self.rms(x, p + "input_layernorm.weight")
            q = (h @ self.w(p + "self_attn.q_proj.weight").T).view(B, T, nh, hd)
            k = (h @ self.w(p + "self_attn.k_proj.weight").T).view(B, T, nkv, hd)
            v = (h @ self.w(p + "self_attn.v_proj.weight").T).view(B, T, nkv, hd)
            q = self.rope(self.rms(q, p + "self_attn.q_norm.weight"), T)
            k = self.rope(self.rms(k, p + "self_attn.k_norm.weight"), T)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            k = k.repeat_interleave(nh // nkv, dim=1)
            v = v.repeat_interleave(nh // nkv, dim=1)
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + att.transpose(1, 2).reshape(B, T, nh * hd) @ self.w(p + "self_attn.o_proj.weight").T
            h = self.rms(x, p + "post_attention_layernorm.weight")
            probs = (h @ self.w(p + "mlp.gate.weight").T).softmax(-1)
            top_w, top_i = probs.topk(cfg["num_experts_per_tok"], dim=-1)
            if cfg.get("norm_topk_prob", True):
                top_w = top_w / top_w.sum(-1, keepdim=True)
            combine = torch.zeros_like(probs).scatter(-1, top_i, top_w)        # [B, T, E]
            e = p + "mlp.experts."
            gate = torch.einsum("bth,eih->btei", h, self.w(e + "gate_proj"))
            up = torch.einsum("bth,eih->btei", h, self.w(e + "up_proj"))
            act = F.silu(gate) * up * combine[..., None]
            x = x + torch.einsum("btei,ehi->bth", act, self.w(e + "down_proj"))
        x = self.rms(x, "model.norm.weight")
        head = self.w("model.embed_tokens.weight" if self.tied else "lm_head.weight")
        return x @ head.T

    def served(self):
        """name -> the bfloat16 tensor the engine is sent (every expert by its hub name)."""
        torch, out = self.torch, {}
        with torch.no_grad():
            for name, p in self.params.items():
                if name.endswith(PROJECTIONS) and ".mlp.experts." in name:
                    stacked = p.to(torch.bfloat16)
                    for expert in range(stacked.shape[0]):
                        prefix, proj = name.rsplit(".", 1)
                        out[f"{prefix}.{expert}.{proj}.weight"] = stacked[expert].contiguous()
                else:
                    out[name] = p.to(torch.bfloat16).contiguous()
        return out


def expected_checksums(torch, served, int4, recipe, group_size, num_experts, numpy_too=False):
    """The checksums the engine must report for `served`: BF16 bytes hashed as they are; with an
    INT4 engine each expert's module quantized with the package's recipe on the GPU (one stacked
    call per layer and projection: rows of experts are independent). With `numpy_too`, the first
    layer's modules are also quantized with the package's NumPy path, which must give the same
    bytes (returned as the second value: True, False, or None when not checked)."""
    import numpy as np
    out = {}
    agree = None
    experts = {}
    for name, t in served.items():
        if int4 and ".mlp.experts." in name:
            prefix, rest = name.split(".mlp.experts.")
            expert, proj, _ = rest.split(".")
            experts.setdefault((prefix, proj), {})[int(expert)] = t
        else:
            out[name] = rlserve.tensor_checksum(rlserve.tensor_from_array(t))
    for (prefix, proj), by_expert in experts.items():
        stacked = torch.stack([by_expert[e] for e in range(num_experts)])
        E, n, k = stacked.shape
        q = rlserve.int4.quantize_module(stacked.reshape(E * n, k), recipe, group_size)
        if numpy_too and prefix == "model.layers.0":
            host = rlserve.int4.quantize_module(stacked.reshape(E * n, k).float().cpu().numpy(), recipe, group_size)
            same = all(host[s].data == q[s].data for s in q)
            agree = same if agree is None else agree and same
        for suffix, tensor in q.items():
            if suffix == "weight_shape":
                one = rlserve.tensor_from_array(np.array([n, k], dtype=np.int64))
                parts = [one.data] * E
            else:
                rows = tensor.shape[0] // E
                row_bytes = len(tensor.data) // tensor.shape[0]
                parts = [tensor.data[e * rows * row_bytes:(e + 1) * rows * row_bytes] for e in range(E)]
            for e in range(E):
                out[f"{prefix}.mlp.experts.{e}.{proj}.{suffix}"] = rlserve.tensor_checksum(parts[e])
    return out, agree


# ---- the engine ---------------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Engine:
    def __init__(self, binary, model, extra, log_path):
        self.port = free_port()
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([binary, "serve", "--model", model, "--device", "cuda", "--port",
                                      str(self.port)] + extra, stdout=self.log, stderr=subprocess.STDOUT)
        self.client = rlserve.HttpClient(f"http://127.0.0.1:{self.port}")
        deadline = time.time() + 180
        while not self.client.health():
            if self.proc.poll() is not None:
                raise RuntimeError(f"rlserve serve exited with {self.proc.returncode}: see {log_path}")
            if time.time() > deadline:
                raise RuntimeError(f"rlserve serve did not answer /health in 180 s: see {log_path}")
            time.sleep(0.5)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def rollouts(client, prompts, samples, tokens, seed):
    """`samples` completions of every prompt, all requests in flight together (the engine batches
    them): [(prompt index, output ids, rollout logprobs)]."""
    def one(i):
        reply = client.generate(input_ids=prompts[i], return_logprob=True, sampling_params={
            "n": samples, "temperature": 1.0, "max_new_tokens": tokens, "ignore_eos": True,
            "sampling_seed": seed + 1000 * i})
        reply = reply if isinstance(reply, list) else [reply]
        out = []
        for r in reply:
            lps = r["meta_info"]["output_token_logprobs"]
            ids = r["output_ids"]
            if [e[1] for e in lps] != ids:
                raise RuntimeError(f"prompt {i}: logprob entries do not name the output tokens")
            out.append((i, ids, [e[0] for e in lps]))
        return out
    with ThreadPoolExecutor(len(prompts)) as pool:
        return [x for group in pool.map(one, range(len(prompts))) for x in group]


def release_when_idle(client, attempts=100):
    """Releases all of the engine's GPU memory. The last reply of a generate can arrive a moment
    before its request's KV is freed, and a release is refused while a request holds KV: retry
    then, and return how many times it had to wait."""
    for waited in range(attempts):
        try:
            client.release_memory_occupation(None)
            return waited
        except rlserve.RlserveError as e:
            if "KV" not in str(e) or waited == attempts - 1:
                raise
            time.sleep(0.02)


# ---- the loop -----------------------------------------------------------------------------------

def run_variant(torch, args, key, model_dir, work):
    variant = VARIANTS[key]
    from safetensors.torch import load_file
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    state = {}
    for name in sorted(os.listdir(model_dir)):
        if name.endswith(".safetensors"):
            state.update(load_file(os.path.join(model_dir, name), device="cuda"))
    torch.manual_seed(args.seed)
    trainer = Trainer(torch, cfg, state, variant["qat"], args.recipe, args.group_size)
    del state
    opt = torch.optim.Adam(trainer.params.values(), lr=args.lr)
    extra = ["--max-running-requests", str(args.prompts * args.samples)]
    if variant["int4"]:
        extra += ["--quantize", args.recipe, "--group-size", str(args.group_size)]
    engine = Engine(args.rlserve, model_dir, extra, os.path.join(work, f"engine-{key}.log"))
    gen = torch.Generator().manual_seed(args.seed)
    vocab = cfg["vocab_size"]
    prompts = [torch.randint(16, vocab - 16, (args.prompt_len,), generator=gen).tolist()
               for _ in range(args.prompts)]
    steps = []
    try:
        client = engine.client
        for step in range(args.steps):
            t0 = time.time()
            got = rollouts(client, prompts, args.samples, args.tokens, seed=args.seed * 100000 + step * 37)
            t_gen = time.time() - t0

            free0 = torch.cuda.mem_get_info()[0]
            release_waits = release_when_idle(client)
            released_mib = (torch.cuda.mem_get_info()[0] - free0) / 2**20

            # train: advantages normalized within each prompt's group
            rewards = torch.tensor([reward_of(ids) for _, ids, _ in got], device="cuda")
            group = torch.tensor([i for i, _, _ in got], device="cuda")
            adv = torch.zeros_like(rewards)
            for i in range(args.prompts):
                r = rewards[group == i]
                adv[group == i] = (r - r.mean()) / (r.std(unbiased=False) + 1e-4)
            seqs = torch.tensor([prompts[i] + ids for i, ids, _ in got], device="cuda")
            rollout_lp = torch.tensor([lp for _, _, lp in got], device="cuda", dtype=torch.float32)
            logits = trainer.logits(seqs[:, :-1])[:, args.prompt_len - 1:]
            lp = torch.log_softmax(logits.float(), -1).gather(-1, seqs[:, args.prompt_len:, None])[..., 0]
            with torch.no_grad():
                diff = lp - rollout_lp
                mismatch = diff.abs().mean().item()
                kl_k3 = (diff.exp() - 1 - diff).mean().item()
            loss = -(adv[:, None] * lp).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            t_train = time.time() - t0 - t_gen

            # back to the engine: weights first (updates need nothing else), then the rest
            t1 = time.time()
            client.resume_memory_occupation(["weights"])
            served = trainer.served()
            client.begin_weight_update()
            replies = client.update_weights_from_device(served, bucket_bytes=args.bucket_mb << 20)
            client.end_weight_update(weight_version=f"step-{step + 1}")
            client.resume_memory_occupation(["kv_cache", "cuda_graph"])
            t_update = time.time() - t1

            reported = client.check_weights()["ranks"][0]["checksums"]
            want, recipes_agree = expected_checksums(torch, served, variant["int4"], args.recipe,
                                                     args.group_size, cfg["num_experts"], numpy_too=step == 0)
            differ = sorted(n for n in want if reported.get(n) != want[n])
            extra_names = sorted(set(reported) - set(want))
            ok = not differ and not extra_names
            version = client.get_weight_version()
            row = {"step": step, "reward": rewards.mean().item(), "mismatch_abs": mismatch,
                   "kl_k3": kl_k3, "loss": loss.item(), "released_mib": released_mib,
                   "release_waits": release_waits,
                   "trainer_allocated_mib": torch.cuda.memory_allocated() / 2**20,
                   "checksums_match": ok, "tensors_checked": len(want), "buckets": len(replies),
                   "weight_version": version, "torch_recipe_equals_numpy": recipes_agree, "seconds": {"generate": t_gen, "train": t_train,
                                                          "update": t_update}}
            if not ok:
                row["checksums_differ"] = differ[:5]
                row["checksums_unexpected"] = extra_names[:5]
            steps.append(row)
            print(f"[{key}] step {step:3d}  reward {row['reward']:.3f}  |dlogp| {mismatch:.4f}  "
                  f"KL {kl_k3:.5f}  released {released_mib:.0f} MiB  checksums "
                  f"{'ok' if ok else 'DIFFER ' + str(differ[:3] + extra_names[:3])} ({len(want)})  "
                  f"gen {t_gen:.2f}s train {t_train:.2f}s update {t_update:.2f}s", flush=True)
    finally:
        engine.stop()
    return {"label": variant["label"], "steps": steps}


# ---- the figure ---------------------------------------------------------------------------------

def plot(results, path):
    """Reward and mismatch over steps; matplotlib when present, else a plain raster of lines."""
    series = [(k, r["label"], [s["reward"] for s in r["steps"]], [s["mismatch_abs"] for s in r["steps"]])
              for k, r in results.items()]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        for _, label, reward, mism in series:
            ax1.plot(reward, label=label)
            ax2.plot(mism, label=label)
        ax1.set(title="reward (share of ids % 8 == 0)", xlabel="step")
        ax2.set(title="mean |logprob trainer - rollout|", xlabel="step", yscale="log")
        ax1.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        return
    except ImportError:
        pass
    write_line_png(path, [[(reward, mism) for _, _, reward, mism in series]])


def write_line_png(path, panels):
    """Two panels (reward, log mismatch) of colored polylines, one per variant, as a PNG written
    with zlib: no plotting library needed."""
    import struct
    import zlib
    W, H, pad = 800, 300, 20
    colors = [(31, 119, 180), (255, 127, 14), (44, 160, 44)]
    img = [[(255, 255, 255)] * W for _ in range(H)]
    lines = panels[0]
    for panel in range(2):
        x0, x1 = pad + panel * W // 2, (panel + 1) * W // 2 - pad
        ys = [v if panel == 0 else math.log10(max(v, 1e-9)) for pair in lines for v in pair[panel]]
        lo, hi = (min(ys), max(ys)) if ys else (0, 1)
        hi = hi if hi > lo else lo + 1
        for x in range(x0, x1):
            img[H - pad][x] = (0, 0, 0)
        for y in range(pad, H - pad):
            img[y][x0] = (0, 0, 0)
        for color, pair in zip(colors, lines):
            vals = [v if panel == 0 else math.log10(max(v, 1e-9)) for v in pair[panel]]
            pts = [(x0 + (x1 - x0) * i / max(len(vals) - 1, 1), H - pad - (H - 2 * pad) * (v - lo) / (hi - lo))
                   for i, v in enumerate(vals)]
            for (ax, ay), (bx, by) in zip(pts, pts[1:]):
                n = int(max(abs(bx - ax), abs(by - ay))) + 1
                for j in range(n + 1):
                    x, y = int(ax + (bx - ax) * j / n), int(ay + (by - ay) * j / n)
                    for dy in (-1, 0, 1):
                        if 0 <= y + dy < H and 0 <= x < W:
                            img[y + dy][x] = color
    raw = b"".join(b"\x00" + bytes(c for px in row for c in px) for row in img)

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rlserve", default=os.environ.get("RLSERVE_BIN", "build/apps/rlserve"))
    ap.add_argument("--model", help="a BF16 Qwen3-MoE checkpoint (default: make-model --preset medium)")
    ap.add_argument("--out", required=True, help="directory for grpo_qat.json and grpo_qat.png")
    ap.add_argument("--variants", default="a,b,c")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--recipe", default="int4-asym", choices=rlserve.int4.RECIPES)
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--bucket-mb", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    keys = [k for k in args.variants.split(",") if k]
    unknown = [k for k in keys if k not in VARIANTS]
    if unknown or not keys:
        ap.error(f"--variants {args.variants!r}: expected a comma-separated subset of a,b,c")

    import torch
    if not torch.cuda.is_available():
        sys.exit("grpo_qat needs a CUDA GPU (the engine serves on it and the trainer shares it)")
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="rlserve-grpo-")
    try:
        model_dir = args.model
        if model_dir is None:
            model_dir = os.path.join(work, "model")
            subprocess.run([args.rlserve, "make-model", "--arch", "qwen3-moe", "--preset", "medium",
                            "--out", model_dir, "--seed", str(args.seed)], check=True, stdout=subprocess.DEVNULL)
        results = {}
        for key in keys:
            results[key] = run_variant(torch, args, key, model_dir, work)
        for name in os.listdir(work):
            if name.endswith(".log"):
                shutil.copy(os.path.join(work, name), args.out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = {"args": vars(args), "device": torch.cuda.get_device_name(0), "variants": results}
    with open(os.path.join(args.out, "grpo_qat.json"), "w") as f:
        json.dump(summary, f, indent=1)
    plot(results, os.path.join(args.out, "grpo_qat.png"))
    for key, r in results.items():
        s = r["steps"]
        head, tail = s[: max(len(s) // 4, 1)], s[-max(len(s) // 4, 1):]
        mean = lambda rows, f: sum(x[f] for x in rows) / len(rows)  # noqa: E731
        print(f"{key}: {r['label']}: reward {mean(head, 'reward'):.3f} -> {mean(tail, 'reward'):.3f}; "
              f"mean |dlogp| {mean(s, 'mismatch_abs'):.4f}, KL k3 {mean(s, 'kl_k3'):.5f}; checksums "
              f"matched {sum(x['checksums_match'] for x in s)}/{len(s)} steps")


if __name__ == "__main__":
    main()
