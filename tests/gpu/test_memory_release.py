"""release_memory_occupation / resume_memory_occupation on the GPU runner (`rlserve serve`), with
the device's free memory read by PyTorch (cudaMemGetInfo) in this process:

  1. with --enable-weights-cpu-backup: releasing everything gives the engine's memory back (free
     memory grows by at least 90% of what the engine held); while released, generate and a weight
     update are refused naming what to resume; after resume, greedy output and every checksum
     equal those of before (the CUDA graphs replay into the same addresses);
  2. 100 release/resume cycles: free memory after each resume within 1 MiB of the first, the
     engine's RSS flat (within 64 MiB), greedy output unchanged at the end;
  3. a release while a request holds KV is refused; one of a single tag works alone;
  4. without the backup (a colocated trainer's flow): release all, resume the weights, reload them
     (update_weights_from_disk), resume the rest: greedy output equals that of before.

Runs on a machine with a GPU and PyTorch (label `gpu`); prints SKIPPED and exits 0 otherwise.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

try:
    import torch
except ImportError as e:  # pragma: no cover
    print(f"SKIPPED: {e}")
    sys.exit(0)

if not torch.cuda.is_available():
    print("SKIPPED: no CUDA device")
    sys.exit(0)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_testlib import BIN, FAILURES, Server, check  # noqa: E402

PROMPTS = [[5, 17, 300, 42, 9], [1000, 7, 7, 21], [3]]


def rss(engine):
    with open(f"/proc/{engine.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def free_mem():
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def main():
    torch.cuda.init()
    work = tempfile.mkdtemp(prefix="rlserve-mem-")
    engines = []
    try:
        model = os.path.join(work, "model")
        subprocess.run([BIN, "make-model", "--arch", "qwen3-moe", "--preset", "medium", "--out", model, "--seed", "4"],
                       check=True, stdout=subprocess.DEVNULL)
        baseline = free_mem()
        engine = Server(model, ["--enable-weights-cpu-backup", "--quantize", "int4-asym"], os.path.join(work, "backup.log"))
        engines.append(engine)
        before_out = engine.greedy(PROMPTS)
        before_sums = engine.digests()
        loaded = free_mem()
        held = baseline - loaded
        r = engine.call("release_memory_occupation", {})
        released = free_mem()
        check(r.get("success", True) is not False, f"release all: {r.get('message', r)}")
        # What the engine says it gave back (its arenas: weights, KV, the forward's memory); the
        # rest of what it holds is the CUDA context, cuBLAS and the host-visible staging.
        said = int(re.search(r"released (\d+) MiB", r.get("message", "")).group(1)) << 20
        print(f"     engine held {held >> 20} MiB, says it released {said >> 20} MiB; free memory grew by "
              f"{(released - loaded) >> 20} MiB")
        check(said > 0 and released - loaded >= said - (2 << 20),
              "the release gave back (at least) what the engine says it released")
        g = engine.call("generate", {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}})
        msg = json.dumps(g)
        check("resume_memory_occupation" in msg, f"generate refused while released: {msg[:200]}")
        u = engine.call("update_weights_from_disk", {"model_path": model})
        check(u.get("success") is False and "resume_memory_occupation" in u.get("message", ""),
              f"a weight update refused while the weights are released: {u.get('message')}")
        r = engine.call("resume_memory_occupation", {})
        check(r.get("success", True) is not False, f"resume all: {r.get('message', r)}")
        check(engine.greedy(PROMPTS) == before_out, "greedy output after resume equals before (backup restored)")
        check(engine.digests() == before_sums, "every checksum after resume equals before")

        # 2. 100 cycles.
        rss0 = rss(engine)
        frees = []
        for i in range(100):
            a = engine.call("release_memory_occupation", {})
            b = engine.call("resume_memory_occupation", {})
            if a.get("success") is False or b.get("success") is False:
                check(False, f"cycle {i}: {a} {b}")
                break
            frees.append(free_mem())
        spread = max(frees) - min(frees) if frees else -1
        rss_growth = rss(engine) - rss0
        print(f"     100 cycles: free memory spread {spread / 2**20:.2f} MiB, RSS growth {rss_growth >> 20} MiB")
        check(0 <= spread <= 1 << 20, "free memory after each resume within 1 MiB")
        check(rss_growth < 64 << 20, "host RSS flat over 100 cycles")
        check(engine.greedy(PROMPTS) == before_out, "greedy output unchanged after 100 cycles")

        # 3. refused while a request holds KV (paused in place); a single tag alone.
        res = {}
        th = threading.Thread(target=lambda: res.update(engine.call("generate", {
            "input_ids": [5, 17, 300], "sampling_params": {"max_new_tokens": 100000, "temperature": 0, "ignore_eos": True}})),
            daemon=True)
        th.start()
        time.sleep(0.5)
        engine.call("pause_generation", {"mode": "in_place"})
        r = engine.call("release_memory_occupation", {"tags": ["kv_cache"]})
        check(r.get("success") is False and "hold KV" in r.get("message", ""), f"release refused while a request holds KV: {r.get('message')}")
        engine.call("abort_request", {"abort_all": True})
        engine.call("continue_generation", {})
        th.join(120)
        r = engine.call("release_memory_occupation", {"tags": ["kv_cache"]})
        check(r.get("success", True) is not False, f"release kv_cache alone: {r.get('message')}")
        r = engine.call("resume_memory_occupation", {"tags": ["kv_cache"]})
        check(r.get("success", True) is not False and engine.greedy(PROMPTS) == before_out, "resume kv_cache: same output")
        r = engine.call("release_memory_occupation", {"tags": ["bogus"]})
        check(r.get("success") is False and "bogus" in json.dumps(r), f"an unknown tag is refused: {r}")
        engine.stop()
        engines.remove(engine)

        # 4. no backup: the trainer sends the weights after resume(weights).
        engine = Server(model, [], os.path.join(work, "nobackup.log"))
        engines.append(engine)
        before_out = engine.greedy(PROMPTS)
        check(engine.call("release_memory_occupation", {}).get("success", True) is not False, "release all (no backup)")
        check(engine.call("resume_memory_occupation", {"tags": ["weights"]}).get("success", True) is not False, "resume weights")
        u = engine.call("update_weights_from_disk", {"model_path": model})
        check(u.get("success") is True, f"weights reloaded while KV and graphs are released: {u.get('message')}")
        check(engine.call("resume_memory_occupation", {"tags": ["kv_cache", "cuda_graph"]}).get("success", True) is not False,
              "resume kv_cache and cuda_graph")
        check(engine.greedy(PROMPTS) == before_out, "greedy output equals before")
    finally:
        for e in engines:
            e.stop()
        if not FAILURES:
            shutil.rmtree(work, ignore_errors=True)
    if FAILURES:
        print(f"{len(FAILURES)} checks failed (logs in {work})")
        sys.exit(1)
    print("test_memory_release: all passed")


if __name__ == "__main__":
    main()
