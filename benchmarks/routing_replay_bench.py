"""routing_replay_bench: what return_routed_experts costs, and what it costs the requests that do
not ask, on the CPU or the GPU runner (results: docs/performance.md).

Starts `rlserve serve --device cpu|cuda` on a seeded Qwen3-MoE made by `rlserve make-model` (or
the one --model names), then runs
rounds of B concurrent greedy requests of N new tokens each, in three shapes, interleaved so
that machine noise falls on all three alike:
  none   no request asks for routing
  one    one request of the batch asks (the others pay for its recording, if anything)
  all    every request asks
and prints tokens per second (median over rounds) per shape.

    python3 benchmarks/routing_replay_bench.py --rlserve build/apps/rlserve [--preset small]
        [--batch 16] [--tokens 32] [--rounds 5] [--device cpu|cuda] [--model DIR]
        [--serve-arg=--flag=value ...]
"""
import argparse
import os
import statistics
import tempfile

from serve_util import call, make_model, start_server, timed_concurrently


def round_of(port, batch, tokens, routed):
    outs = [None] * batch

    def one(i):
        outs[i] = call(port, "POST", "/generate", {"input_ids": [3 + i, 7, 11, 5 + i, 9], "return_routed_experts": i in routed,
                              "sampling_params": {"max_new_tokens": tokens, "temperature": 0,
                                                  "ignore_eos": True}})

    elapsed = timed_concurrently(one, batch)
    assert all(o["meta_info"]["completion_tokens"] == tokens for o in outs)
    assert all(("routed_experts" in o["meta_info"]) == (i in routed) for i, o in enumerate(outs))
    return batch * tokens / elapsed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlserve", required=True)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--model", help="an existing Qwen3-MoE directory (else one is made from --preset)")
    ap.add_argument("--serve-arg", action="append", default=[], help="passed to rlserve serve")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if not model:
            model = os.path.join(tmp, "moe")
            make_model(args.rlserve, model, "qwen3-moe", args.preset)
        proc, port = start_server(args.rlserve, "--model", model, "--device", args.device, *args.serve_arg)
        try:
            shapes = {"none": set(), "one": {0}, "all": set(range(args.batch))}
            round_of(port, args.batch, args.tokens, set())  # warm-up
            rates = {name: [] for name in shapes}
            for _ in range(args.rounds):
                for name, routed in shapes.items():
                    rates[name].append(round_of(port, args.batch, args.tokens, routed))
            base = statistics.median(rates["none"])
            for name in shapes:
                m = statistics.median(rates[name])
                print(f"{name:5s} {m:9.1f} tokens/s  ({m / base:.3f} of none; rounds "
                      f"{', '.join(f'{r:.0f}' for r in rates[name])})")
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
