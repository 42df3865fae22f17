"""A PyTorch trainer on GPU 1 broadcasts new weights over NCCL into `rlserve serve` on GPU 0, as
slime and SGLang's trainers do (init_weights_update_group, update_weights_from_distributed,
destroy_weights_update_group). Needs two GPUs: prints SKIPPED (and why) and exits 0 with fewer.

This process is the trainer. It loads the BF16 Qwen3-MoE checkpoint the engine serves (made by
`rlserve make-model`), perturbs every float tensor on GPU 1, joins the group with SGLang's recipe
(rendezvous through the TCPStore it hosts, PrefixStore(G), the NCCL process-group helper) while
the engine joins over HTTP, then sends the tensors in buckets — alternately one broadcast per
tensor and SGLang's flattened bucket (one uint8 broadcast of the tensors back to back) — each with
its update_weights_from_distributed call, inside begin/end. Checked:

  1. between the buckets the served digests are those of before (nothing serves before end);
  2. after end, every BF16 tensor's digest equals Python xxhash of the trainer's bytes, and, for
     an engine serving INT4 experts (quantized on the device from the BF16 broadcast), every
     digest equals that of a fresh engine started from the perturbed checkpoint;
  3. a bucket the engine refuses (a wrong shape) is still received and dropped: the next bucket
     lands intact; destroy, then 5 more init/update/destroy rounds work.

RLSERVE_BIN names the rlserve binary.
"""
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from datetime import timedelta

try:
    import torch
    import torch.distributed as dist
    import xxhash
    from safetensors.torch import load_file, save_file
    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world, rendezvous
except ImportError as e:  # pragma: no cover
    print(f"SKIPPED: {e}")
    sys.exit(0)

if torch.cuda.device_count() < 2:
    print(f"SKIPPED: needs two GPUs (the engine's and the trainer's; NCCL cannot put two ranks on one), "
          f"{torch.cuda.device_count()} visible")
    sys.exit(0)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_testlib import BIN, FAILURES, Server, check, free_port  # noqa: E402


def join_group(engine, group):
    """The trainer's init_custom_process_group, concurrent with the engine's init."""
    port = free_port()
    answer = {}
    th = threading.Thread(target=lambda: answer.update(engine.call("init_weights_update_group", {
        "master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2,
        "group_name": group, "backend": "nccl", "timeout_s": 120})))
    th.start()
    timeout = timedelta(seconds=120)
    store, _, _ = next(rendezvous(f"tcp://127.0.0.1:{port}", 0, 2, timeout=timeout))
    store.set_timeout(timeout)
    params = inspect.signature(_new_process_group_helper).parameters
    options = "backend_options" if "backend_options" in params else "pg_options"
    pg, _ = _new_process_group_helper(2, 0, [], Backend("nccl"), PrefixStore(group, store), group_name=group,
                                      timeout=timeout, **{options: None})
    _world.pg_group_ranks[pg] = {0: 0, 1: 1}
    th.join(180)
    check(answer.get("success") is True, f"init_weights_update_group {group}: {answer.get('message')}")
    return pg


def send_bucket(engine, pg, group, bucket, flattened, **extra):
    body = {"names": [n for n, _ in bucket], "dtypes": [str(t.dtype).replace("torch.", "") for _, t in bucket],
            "shapes": [list(t.shape) for _, t in bucket], "group_name": group, "timeout_s": 120}
    if flattened:
        body["load_format"] = "flattened_bucket"
    body.update(extra)
    answer = {}
    th = threading.Thread(target=lambda: answer.update(engine.call("update_weights_from_distributed", body)))
    th.start()
    if flattened:
        flat = torch.cat([t.contiguous().view(-1).view(torch.uint8) for _, t in bucket])
        dist.broadcast(flat, src=0, group=pg)
    else:
        for _, t in bucket:
            dist.broadcast(t, src=0, group=pg)
    torch.cuda.synchronize()
    th.join(300)
    return answer


def buckets_of(named, limit=8 << 20):
    out, cur, size = [], [], 0
    for n, t in named:
        cur.append((n, t))
        size += t.numel() * t.element_size()
        if size >= limit:
            out.append(cur)
            cur, size = [], 0
    if cur:
        out.append(cur)
    return out


def run(engine, named, group):
    pg = join_group(engine, group)
    before = engine.digests()
    check(engine.call("begin_weight_update", {}).get("success"), "begin_weight_update")
    # a refused bucket (wrong shape) is received and dropped; the next lines up.
    n0, t0 = named[0]
    bad = send_bucket(engine, pg, group, [(n0, t0.view(-1))], False)
    check(bad.get("success") is False and n0 in bad.get("message", "") and "received and dropped" in bad.get("message", ""),
          f"a wrong shape is refused and its bytes dropped: {bad.get('message')}")
    for i, bucket in enumerate(buckets_of(named)):
        r = send_bucket(engine, pg, group, bucket, flattened=(i % 2 == 1))
        check(r.get("success") is True, f"bucket {i} ({len(bucket)} tensors, {'flattened' if i % 2 else 'per tensor'}): {r.get('message')}")
    check(engine.digests() == before, "nothing serves before end_weight_update")
    r = engine.call("end_weight_update", {})
    check(r.get("success") is True, f"end_weight_update: {r.get('message')}")
    d = engine.call("destroy_weights_update_group", {"group_name": group})
    check(d.get("success") is True, f"destroy: {d.get('message')}")
    dist.destroy_process_group(pg)
    return engine.digests()


def main():
    print(f"PyTorch {torch.__version__}, NCCL {torch.cuda.nccl.version()}, {torch.cuda.device_count()} GPUs")
    torch.cuda.set_device(1)
    work = tempfile.mkdtemp(prefix="rlserve-nccl2-")
    engines = []
    try:
        base, new = os.path.join(work, "base"), os.path.join(work, "new")
        subprocess.run([BIN, "make-model", "--arch", "qwen3-moe", "--preset", "medium", "--out", base, "--seed", "5"],
                       check=True, stdout=subprocess.DEVNULL)
        shutil.copytree(base, new)
        gen = torch.Generator(device="cuda:1").manual_seed(7)
        trainer = {}
        for f in [f for f in os.listdir(base) if f.endswith(".safetensors")]:
            out = {}
            for n, t in load_file(os.path.join(base, f), device="cuda:1").items():
                if t.is_floating_point():
                    noise = torch.randn(t.shape, generator=gen, device="cuda:1", dtype=torch.float32)
                    t = (t.float() + 0.5 * noise * t.float().std().clamp_min(1e-3)).to(t.dtype)
                out[n] = t.contiguous()
            trainer.update(out)
            save_file({n: t.cpu() for n, t in out.items()}, os.path.join(new, f))
        named = sorted(trainer.items())

        bf16 = Server(base, [], os.path.join(work, "bf16.log"), device="cuda:0")
        engines.append(bf16)
        got = run(bf16, named, "slime-pp_0")
        want = {n: xxhash.xxh3_64_hexdigest(t.contiguous().view(torch.uint8).cpu().numpy().tobytes()) for n, t in named}
        check(all(got.get(n) == d for n, d in want.items()), "BF16 engine: every digest is xxhash of the trainer's bytes")
        for i in range(5):
            pg = join_group(bf16, f"round{i}")
            r = send_bucket(bf16, pg, f"round{i}", named[:3], flattened=bool(i % 2))
            check(r.get("success") is True, f"round {i}: {r.get('message')}")
            bf16.call("destroy_weights_update_group", {"group_name": f"round{i}"})
            dist.destroy_process_group(pg)

        quant = ["--quantize", "int4-asym", "--group-size", "128"]
        int4 = Server(base, quant, os.path.join(work, "int4.log"), device="cuda:0")
        engines.append(int4)
        got = run(int4, named, "slime-pp_1")
        fresh = Server(new, quant, os.path.join(work, "fresh.log"), device="cuda:0")
        engines.append(fresh)
        check(got == fresh.digests(), "INT4 engine: every digest equals a fresh engine's from the perturbed checkpoint")
    finally:
        for e in engines:
            e.stop()
        if not FAILURES:
            shutil.rmtree(work, ignore_errors=True)
    if FAILURES:
        print(f"{len(FAILURES)} checks failed (logs in {work})")
        sys.exit(1)
    print("test_nccl_update_2gpu: all passed")


if __name__ == "__main__":
    main()
