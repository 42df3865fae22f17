"""examples/grpo_qat.py, short: a PyTorch GRPO trainer with INT4 QAT and `rlserve serve` (INT4
experts) colocated on one GPU, 8 steps of variant a (QAT trainer + INT4 engine) and 3 of variant c
(BF16 trainer + BF16 engine). Checked from the example's JSON:

  - the reward improves: the mean of the last 3 steps of variant a exceeds that of the first 3;
  - every step of both variants, every checksum the engine reports after the CUDA IPC update
    equals the trainer's own (xxhash of its BF16 bytes; the package's INT4 recipe for experts),
    and no other tensor is reported; the weight version is the step's;
  - the package's INT4 recipe in PyTorch (on the GPU, used for every step's checksums) gives the
    same bytes as its NumPy recipe (the one CI checks against the CPU engine), checked on the
    first layer at step 0;
  - each release gave memory back to the driver (cudaMemGetInfo, seen by the trainer);
  - the trainer's allocated memory stays flat from step to step: the engine releases PyTorch's
    IPC ref-counter slot of every bucket (else PyTorch keeps each bucket in its limbo);
  - the mismatch is small where the trainer sees what the engine serves: variant a's mean
    |logprob difference| is below 0.3 nats, and so is variant c's (a bound against a broken
    trainer model or recipe, not a measurement: docs/performance.md has those).

Runs on a machine with a GPU and PyTorch (label `gpu`); prints SKIPPED and exits 0 otherwise.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gpu_testlib import BIN, FAILURES, check  # noqa: E402

try:
    import torch
    import xxhash  # noqa: F401
    import safetensors  # noqa: F401
    import numpy  # noqa: F401
except ImportError as e:  # pragma: no cover - CI has no torch
    print(f"SKIPPED: {e}")
    sys.exit(0)
if not torch.cuda.is_available():
    print("SKIPPED: no CUDA device")
    sys.exit(0)

EXAMPLE = os.path.join(HERE, "..", "..", "examples", "grpo_qat.py")


def run(out, variants, steps):
    subprocess.run([sys.executable, EXAMPLE, "--rlserve", BIN, "--out", out, "--variants", variants,
                    "--steps", str(steps)], check=True, timeout=600)
    with open(os.path.join(out, "grpo_qat.json")) as f:
        return json.load(f)["variants"]


def main():
    with tempfile.TemporaryDirectory(prefix="rlserve-grpo-test-") as out:
        variants = run(out, "a", 8)
        variants.update(run(os.path.join(out, "c"), "c", 3))
        check(os.path.getsize(os.path.join(out, "grpo_qat.png")) > 0, "the plot was written")
    a = variants["a"]["steps"]
    first = sum(s["reward"] for s in a[:3]) / 3
    last = sum(s["reward"] for s in a[-3:]) / 3
    check(last > first, f"reward improves: {first:.3f} (first 3 steps) -> {last:.3f} (last 3)")
    for key, v in variants.items():
        steps = v["steps"]
        bad = [(s["step"], s.get("checksums_differ"), s.get("checksums_unexpected"))
               for s in steps if not s["checksums_match"]]
        check(not bad, f"[{key}] every step's {steps[0]['tensors_checked']} checksums equal the "
              f"trainer's: {bad[:2]}")
        if key == "a":
            check(steps[0]["torch_recipe_equals_numpy"] is True,
                  f"[a] PyTorch and NumPy INT4 recipes agree: {steps[0]['torch_recipe_equals_numpy']}")
        check(all(s["weight_version"] == f"step-{s['step'] + 1}" for s in steps),
              f"[{key}] weight versions: {[s['weight_version'] for s in steps]}")
        check(all(s["released_mib"] > 64 for s in steps),
              f"[{key}] releases gave memory back (MiB): {[round(s['released_mib']) for s in steps]}")
        alloc = [s["trainer_allocated_mib"] for s in steps]
        check(max(alloc[1:]) - alloc[1] < 64 if len(alloc) > 1 else True,
              f"[{key}] trainer memory flat (IPC slots released): {[round(x) for x in alloc]} MiB")
        mism = max(s["mismatch_abs"] for s in steps)
        if key in ("a", "c"):
            check(mism < 0.3, f"[{key}] mean |logprob difference| at most {mism:.4f} < 0.3")
    print(f"{0 if FAILURES else 1} passed, {1 if FAILURES else 0} failed")
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
