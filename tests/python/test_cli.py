"""The command line a person uses: `rlserve demo` (what `make run` runs) and `rlserve generate`.

Checks the demo's whole cycle passes (its own verification exits non-zero on a mismatch) and
that `generate --json` emits SGLang's response shape, one object per request, with bad input
refused by a clear message. The same for a Qwen3-MoE checkpoint from `make-model --arch qwen3-moe`:
greedy generate (batched and alone, equal), and the demo's weight-update cycle over every expert.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import rlserve_testlib as t  # noqa: E402


def main():
    with t.temp_dir() as tmp:
        env = dict(os.environ, RLSERVE_CACHE_DIR=os.path.join(tmp, "cache"))
        demo = t.run("demo", "--rollouts", "3", "--max-new-tokens", "12", env=env)
        out = demo.stdout
        for needle in ("[7/7]", "tensors match", "role checksum", "-> match", "a bad update is refused",
                       "checksums unchanged", "completions changed", "ok: the update landed"):
            t.check(needle in out, f"demo output lacks {needle!r}:\n{out}")
        model = os.path.join(tmp, "cache", "tiny-qwen3")
        t.check(os.path.exists(os.path.join(model, "model.safetensors")), "built-in model not cached")

        lines = t.run_json_lines("generate", "--model", model, "--prompt", "Hello", "--input-ids", "1,2,3",
                                 "--max-new-tokens", "5", "--temperature", "0", "--ignore-eos", "--json")
        t.check(len(lines) == 2, f"two requests, two lines: {lines}")
        for obj in lines:
            meta = obj["meta_info"]
            t.check(len(obj["output_ids"]) == 5 and meta["completion_tokens"] == 5, obj)
            t.check(meta["weight_version"] == "0", obj)
            t.check(meta["finish_reason"]["type"] == "length", obj)
            t.check(len(meta["output_token_logprobs"]) == 5, obj)
            t.check(isinstance(obj["text"], str), obj)
        t.check(lines[1]["meta_info"]["prompt_tokens"] == 3, "token ids pass through untouched")

        bad = t.run("generate", "--model", model, "--input-ids", "1,99999", check=False)
        t.check(bad.returncode != 0, "an out-of-vocabulary id must fail")
        t.check("outside the vocabulary" in bad.stdout + bad.stderr, bad.stdout + bad.stderr)
        bad = t.run("generate", "--model", os.path.join(tmp, "nowhere"), "--prompt", "x", check=False)
        t.check(bad.returncode != 0 and "nowhere" in bad.stderr, bad.stderr)

        # Qwen3-MoE runs through the same engine.
        moe = os.path.join(tmp, "moe")
        t.run("make-model", "--arch", "qwen3-moe", "--preset", "tiny", "--out", moe, "--seed", "3")
        lines = t.run_json_lines("generate", "--model", moe, "--prompt", "Hello", "--input-ids", "4,5,6",
                                 "--max-new-tokens", "6", "--temperature", "0", "--ignore-eos", "--json")
        t.check(len(lines) == 2, f"two requests, two lines: {lines}")
        for obj in lines:
            t.check(len(obj["output_ids"]) == 6 and obj["meta_info"]["completion_tokens"] == 6, obj)
        again = t.run_json_lines("generate", "--model", moe, "--input-ids", "4,5,6", "--max-new-tokens", "6",
                                 "--temperature", "0", "--ignore-eos", "--json")
        t.check(again[0]["output_ids"] == lines[1]["output_ids"], "greedy MoE output depends on the batch")
        # The demo's whole weight-update cycle through the engine: every tensor, the router and
        # each expert included, updated in buckets and verified by per-tensor XXH3 checksums.
        out = t.run("demo", "--model", moe, "--rollouts", "2", "--max-new-tokens", "8").stdout
        for needle in ("68 new tensors", "68/68 tensors match", "-> match", "completions changed",
                       "ok: the update landed"):
            t.check(needle in out, f"MoE demo output lacks {needle!r}:\n{out}")
        print("ok: demo and generate work from the command line (qwen3 and qwen3-moe)")


if __name__ == "__main__":
    main()
