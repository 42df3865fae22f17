"""Peer baseline for the decode benchmark: Hugging Face transformers `generate` on a
Qwen3-30B-A3B-shaped model with random BF16 weights, built directly on the GPU (no checkpoint).

Shape (default): 48 layers, hidden 2048, 32 q / 4 kv heads x 128, 128 experts top-8, moe
intermediate 768, vocab 151936, norm_topk_prob, rope_theta 1e6, untied lm_head: 30.5 B
parameters, 61 GB in BF16. `--small` is a tiny shape for a smoke run.

Method. Greedy `generate` (do_sample False, use_cache True, no EOS so every sequence runs to
max_new_tokens) from B identical-length random prompts (`--prompt-len`, no padding). For each
batch size: one warm-up call of base + N tokens, then REPEATS x (a call with `--base-tokens` new tokens and one with
base + N new tokens); the decode step time is the best of (t_long - t_short) / N, which removes
prefill and the per-call set-up, and tokens/s = B / step. N depends on the batch (`--new-tokens`,
default 1:64,8:64,32:64,128:32 -- fewer at B = 128 to stay within the time budget). The cache
is transformers' DynamicCache by default (`--cache static` for StaticCache; torch.compile stays off
unless `--compile`). Attention and expert implementations are transformers' defaults unless given,
and are recorded. Weights are normal(0, 0.02) (norms 1): random routing spreads tokens over the
experts; the JSON records how many distinct tokens the batch produced at the last step (a batch
that collapsed onto one token would route every row to the same experts and flatter large B).

Prints a table and writes JSON (`--json PATH`). Seen on an H200 (transformers 5.17, torch 2.11,
sdpa attention, grouped_mm experts, dynamic cache; a smoke run with N = 8 and one repeat): the
30.5 B model builds and inits on the GPU in under 1 s (56.9 GiB); decode step 53 ms at B = 1 and
294 ms at B = 128. The default run should take about 2 minutes with the model built.

  python3 benchmarks/gpu/transformers_decode.py --json $OUT/hf_decode.json
  python3 benchmarks/gpu/transformers_decode.py --small --json /tmp/small.json
"""
import argparse
import json
import sys
import time

FULL = {
    "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
    "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
}
SMALL = {
    "bos_token_id": 1, "eos_token_id": 2, "vocab_size": 4096, "hidden_size": 256, "intermediate_size": 512,
    "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
    "num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 128,
}
COMMON = {
    "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "rms_norm_eps": 1e-6, "max_position_embeddings": 40960, "tie_word_embeddings": False,
    "hidden_act": "silu", "attention_bias": False, "use_sliding_window": False,
    "output_router_logits": False, "bos_token_id": 151643, "eos_token_id": 151645,
}
ROPE_THETA = 1000000.0


def parse_new_tokens(text, batches):
    table = {}
    for item in text.split(","):
        if ":" in item:
            b, n = item.split(":")
            table[int(b)] = int(n)
        else:
            table = {b: int(item) for b in batches}
    out = {}
    for b in batches:
        known = [k for k in sorted(table) if k <= b]
        out[b] = table[known[-1]] if known else table[min(table)]
    return out


def make_config(transformers, shape):
    import inspect
    fields = dict(COMMON, **shape)
    params = inspect.signature(transformers.Qwen3MoeConfig.__init__).parameters
    if "rope_parameters" in params:
        fields["rope_parameters"] = {"rope_type": "default", "rope_theta": ROPE_THETA}
    else:
        fields["rope_theta"] = ROPE_THETA
    return transformers.Qwen3MoeConfig(**fields)


def build(torch, transformers, cfg, args):
    kwargs = {"dtype": torch.bfloat16}
    if args.attn:
        kwargs["attn_implementation"] = args.attn
    if args.experts_impl:
        kwargs["experts_implementation"] = args.experts_impl
    torch.set_default_dtype(torch.bfloat16)
    t0 = time.time()
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, **kwargs)
    torch.set_default_dtype(torch.float32)
    t1 = time.time()
    # Our own init: every parameter written once on the GPU (whatever transformers' init did or
    # skipped), seeded.
    torch.manual_seed(args.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.device.type != "cuda" or p.dtype != torch.bfloat16:
                raise SystemExit(f"{name} is {p.dtype} on {p.device}, expected bf16 on cuda")
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    for name, b in model.named_buffers():
        if b.device.type != "cuda":
            raise SystemExit(f"buffer {name} on {b.device}")
    torch.cuda.synchronize()
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    n = sum(p.numel() for p in model.parameters())
    return model, n, t1 - t0, time.time() - t1


def timed_generate(torch, model, ids, mask, new_tokens, args):
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                  use_cache=True, pad_token_id=0, eos_token_id=None)
    if args.cache == "static":
        kwargs["cache_implementation"] = "static"
        if not args.compile:
            kwargs["disable_compile"] = True
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    if out.shape[1] != ids.shape[1] + new_tokens:
        raise SystemExit(f"generate returned {out.shape[1] - ids.shape[1]} new tokens, "
                         f"asked for {new_tokens}")
    return dt, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="tiny shape (smoke run)")
    ap.add_argument("--batch-sizes", default="1,8,32,128")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", default="1:64,8:64,32:64,128:32",
                    help="N per batch size, B:N,... (the largest B' <= B applies), or one N")
    ap.add_argument("--base-tokens", type=int, default=4, help="new tokens of the short call")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--cache", choices=("dynamic", "static"), default="dynamic")
    ap.add_argument("--compile", action="store_true", help="let generate torch.compile (static)")
    ap.add_argument("--attn", default=None, help="attn_implementation (default: transformers')")
    ap.add_argument("--experts-impl", default=None,
                    help="experts_implementation of transformers 5 (default: transformers')")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import torch
    import transformers
    if not torch.cuda.is_available():
        print("SKIPPED transformers_decode: torch.cuda is not available")
        return 0
    batches = [int(b) for b in args.batch_sizes.split(",")]
    new_tokens = parse_new_tokens(args.new_tokens, batches)
    shape = SMALL if args.small else FULL
    cfg = make_config(transformers, shape)
    t_start = time.time()
    model, n_params, t_build, t_init = build(torch, transformers, cfg, args)
    attn = model.config._attn_implementation
    experts = getattr(model.config, "_experts_implementation", None)
    rope = getattr(model.config, "rope_parameters", None) or {"rope_theta": getattr(model.config, "rope_theta", None)}
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}")
    print(f"model {'small' if args.small else 'Qwen3-30B-A3B shape'}: {n_params / 1e9:.2f} B params, "
          f"{torch.cuda.memory_allocated() / 2**30:.1f} GiB; built in {t_build:.1f} s, init "
          f"{t_init:.1f} s; attn {attn}, experts {experts}, rope {rope}, cache {args.cache}"
          f"{' (compiled)' if args.compile else ''}")

    gen = torch.Generator(device="cuda").manual_seed(args.seed + 1)
    results = []
    print(f"{'batch':>6} {'new':>5} {'step ms':>9} {'tokens/s':>10} {'prefill ms*':>11} "
          f"{'distinct':>8}  (prompt {args.prompt_len}, step = (t[{args.base_tokens}+N] - "
          f"t[{args.base_tokens}]) / N)")
    for B in batches:
        N = new_tokens[B]
        ids = torch.randint(3, cfg.vocab_size, (B, args.prompt_len), device="cuda", generator=gen)
        mask = torch.ones_like(ids)
        # warm-up at the full length: the first call at new shapes is several times slower
        timed_generate(torch, model, ids, mask, args.base_tokens + N, args)
        steps, shorts, longs = [], [], []
        out = None
        for _ in range(args.repeats):
            t_short, _ = timed_generate(torch, model, ids, mask, args.base_tokens, args)
            t_long, out = timed_generate(torch, model, ids, mask, args.base_tokens + N, args)
            shorts.append(t_short)
            longs.append(t_long)
            steps.append((t_long - t_short) / N)
        step = min(steps)                      # best of the repeats
        distinct = int(torch.unique(out[:, -1]).numel())
        prefill = min(shorts) - args.base_tokens * step
        r = {"batch": B, "new_tokens": N, "base_tokens": args.base_tokens,
             "decode_step_ms": step * 1e3, "tokens_per_s": B / step,
             "prefill_ms_estimate": prefill * 1e3, "t_short_s": shorts, "t_long_s": longs,
             "step_ms_each": [s * 1e3 for s in steps], "distinct_last_tokens": distinct,
             "max_memory_gib": torch.cuda.max_memory_allocated() / 2**30}
        results.append(r)
        print(f"{B:6d} {N:5d} {step * 1e3:9.2f} {B / step:10.1f} {prefill * 1e3:11.1f} "
              f"{distinct:8d}", flush=True)
    total = time.time() - t_start
    print(f"* prefill ms = t[{args.base_tokens}] - {args.base_tokens} x step (an estimate). "
          f"Total {total:.1f} s.")
    if args.json:
        doc = {
            "benchmark": "transformers generate, greedy decode",
            "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "transformers": transformers.__version__,
            "model": "small" if args.small else "Qwen3-30B-A3B shape (random weights)",
            "config": dict(COMMON, **shape, rope_theta=ROPE_THETA), "params": n_params,
            "dtype": "bfloat16", "attn_implementation": attn, "experts_implementation": experts,
            "cache": args.cache, "compile": args.compile, "prompt_len": args.prompt_len,
            "repeats": args.repeats, "seed": args.seed, "build_s": t_build, "init_s": t_init,
            "total_s": total,
            "method": "decode step = min over repeats of (t(base+N) - t(base)) / N after a "
                      "warm-up call of base+N tokens; "
                      "tokens/s = batch / step",
            "results": results,
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
