"""prefix_cache_bench: a GRPO-shaped rollout with and without the prefix cache (results:
docs/performance.md).

P prompts of L random tokens, each sent as one SGLang /generate with n = S samples (temperature
1, seeded) of N new tokens, all P at once, to two `rlserve serve` processes on the same model:
one as started by default (prefix cache on) and one with --disable-radix-cache. Rounds alternate
between the two so machine noise falls on both alike; each round uses fresh prompts (nothing
cached from an earlier round helps). Prints per server the median wall time of a round, output
tokens per second, and the prefill tokens computed per round (get_server_info's prefill_tokens),
then the ratios, and how many samples both servers returned alike. On the CPU runner every
sample must be identical (the bench fails otherwise). The GPU runner is not batch-invariant yet:
a prefix computed once in another batch's shape, or a sample decoded beside other rows, can round
differently in the last bits and, at temperature 1, pick another token from there on; on the GPU
the bench reports the share of identical samples instead of failing.

    python3 benchmarks/prefix_cache_bench.py --rlserve build/apps/rlserve [--device cpu]
        [--model DIR | --arch qwen3-moe --preset small] [--prompts 8] [--samples 16]
        [--prompt-len 256] [--tokens 16] [--rounds 3] [--serve-arg=--kv-cache-tokens=65536 ...]

The GPU shape it is meant for: --device cuda --prompts 64 --samples 16 --prompt-len 1024 --tokens 256
on a Qwen3-30B-A3B-shaped model directory (--model).
"""
import argparse
import json
import os
import random
import statistics
import tempfile

from serve_util import call, make_model, start_server, timed_concurrently


def one_round(port, prompts, samples, tokens, seed):
    """(seconds, output tokens, prefill tokens, results) of one GRPO round."""
    before = call(port, "GET", "/get_server_info")["prefill_tokens"]
    results = [None] * len(prompts)

    def one(i):
        results[i] = call(port, "POST", "/generate", {
            "input_ids": prompts[i],
            "sampling_params": {"n": samples, "temperature": 1.0, "max_new_tokens": tokens,
                                "ignore_eos": True, "sampling_seed": seed + 1000 * i}})

    elapsed = timed_concurrently(one, len(prompts))
    outs = [[s["output_ids"] for s in r] for r in results]
    assert all(len(s) == tokens for group in outs for s in group)
    prefill = call(port, "GET", "/get_server_info")["prefill_tokens"] - before
    return elapsed, len(prompts) * samples * tokens, prefill, outs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlserve", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", help="an existing model directory (else one is made)")
    ap.add_argument("--arch", default="qwen3-moe")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--serve-arg", action="append", default=[])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if not model:
            model = os.path.join(tmp, "model")
            make_model(args.rlserve, model, args.arch, args.preset)
        vocab = json.load(open(os.path.join(model, "config.json")))["vocab_size"]
        serve = [args.rlserve, "--model", model, "--device", args.device, *args.serve_arg]
        servers = {"cache": start_server(*serve),
                   "no cache": start_server(*serve, "--disable-radix-cache")}
        try:
            rng = random.Random(0)
            stats = {name: [] for name in servers}
            same = total = 0
            for r in range(args.rounds + 1):  # round 0 warms up, with one prompt
                prompts = [[rng.randrange(3, min(vocab, 30000)) for _ in range(args.prompt_len)]
                           for _ in range(args.prompts if r > 0 else 1)]
                outs = {}
                for name, (_, port) in servers.items():
                    sec, out_tokens, prefill, outs[name] = one_round(port, prompts, args.samples,
                                                                      args.tokens, seed=r)
                    if r > 0:
                        stats[name].append((sec, out_tokens / sec, prefill))
                pairs = [(a, b) for ga, gb in zip(outs["cache"], outs["no cache"]) for a, b in zip(ga, gb)]
                if r > 0:
                    same += sum(a == b for a, b in pairs)
                    total += len(pairs)
                if args.device == "cpu":
                    assert all(a == b for a, b in pairs), "the cache changed what was sampled"
            print(f"{args.prompts} prompts x {args.samples} samples, prompt {args.prompt_len} tokens, "
                  f"{args.tokens} new, device {args.device}, {args.rounds} rounds (medians):")
            med = {}
            for name, rows in stats.items():
                sec = statistics.median(r[0] for r in rows)
                rate = statistics.median(r[1] for r in rows)
                prefill = statistics.median(r[2] for r in rows)
                med[name] = (sec, rate, prefill)
                print(f"  {name:9s} {sec:8.3f} s/round  {rate:9.1f} output tokens/s  "
                      f"{prefill:9.0f} prefill tokens/round")
            print(f"  prefill work / {med['no cache'][2] / max(med['cache'][2], 1):.1f}, "
                  f"throughput x {med['cache'][1] / med['no cache'][1]:.2f}; samples identical: "
                  f"{same} of {total}")
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(timeout=60)


if __name__ == "__main__":
    main()
