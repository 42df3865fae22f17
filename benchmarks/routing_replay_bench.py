"""routing_replay_bench: what return_routed_experts costs, and what it costs the requests that do
not ask, on the CPU runner (results: docs/performance.md).

Starts `rlserve serve --device cpu` on a seeded Qwen3-MoE made by `rlserve make-model`, then runs
rounds of B concurrent greedy requests of N new tokens each, in three shapes, interleaved so
that machine noise falls on all three alike:
  none   no request asks for routing
  one    one request of the batch asks (the others pay for its recording, if anything)
  all    every request asks
and prints tokens per second (median over rounds) per shape.

    python3 benchmarks/routing_replay_bench.py --rlserve build/apps/rlserve [--preset small]
        [--batch 16] [--tokens 32] [--rounds 5]
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
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "moe")
        make_model(args.rlserve, model, "qwen3-moe", args.preset)
        proc, port = start_server(args.rlserve, "--model", model, "--device", "cpu")
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
