"""The trainers' replays of tests/python (miles, slime, verl: each RL step's calls in each
trainer's order, weight versions in every order miles and slime name them, pauses of each mode,
checksum audits) against `rlserve serve --device cuda`: the GPU runner under the same calls as
the CPU engine in CI. The engine runs its batch-invariant forward (--enable-deterministic-
inference), since miles' batched prefill scoring is checked to equal the single requests' bit for
bit, which the CPU engine always is and the GPU's default forward is not. Needs RLSERVE_BIN."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPLAYS = ["test_trainer_miles.py", "test_trainer_slime.py", "test_trainer_verl.py"]


def main():
    env = dict(os.environ, RLSERVE_REPLAY_DEVICE="cuda", RLSERVE_REPLAY_ARGS="--enable-deterministic-inference")
    failed = []
    for name in REPLAYS:
        proc = subprocess.run([sys.executable, os.path.join(HERE, "..", "python", name)], env=env,
                              capture_output=True, text=True, timeout=600)
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        print(f"{name} on the GPU: exit {proc.returncode}: " + " | ".join(tail), flush=True)
        if proc.returncode != 0:
            failed.append(name)
            print(proc.stdout[-4000:] + proc.stderr[-4000:])
    if failed:
        sys.exit(f"failed on the GPU: {failed}")
    print("ok: miles, slime and verl replays against the GPU runner")


if __name__ == "__main__":
    main()
