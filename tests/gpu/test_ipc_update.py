"""A colocated PyTorch trainer pushes new weights into `rlserve serve` on the same GPU by CUDA IPC.

The trainer is this process (PyTorch): it loads a BF16 Qwen3-MoE checkpoint made by
`rlserve make-model`, perturbs every tensor on the GPU, and sends each bucket's CUDA IPC handles
(rlserve's own form: `device_tensors` with the 64-byte cudaIpcMemHandle_t in hex, the byte offset
into the allocation, the GPU's UUID) to an engine that serves the same model with INT4 experts
(`--quantize int4-asym`): the engine quantizes the BF16 experts on the device. Checked:

  1. inside begin/end, the update serves only after end (digests unchanged between); buckets go
     alternately in rlserve's form and in SGLang's (`serialized_named_tensors`: base64 of PyTorch's
     multiprocessing pickle of a flattened bucket, SGLang's patched reduction), and after each
     SGLang bucket the engine has released PyTorch's ref-counter slot;
  2. after end, every BF16 tensor's digest equals Python xxhash of the bytes the trainer holds, and
     every tensor's digest (INT4 ones included) equals that of a fresh engine started from the
     perturbed checkpoint written to disk (same recipe, quantized at its load);
  3. greedy output equals the fresh engine's;
  4. refusals name the tensor and stage nothing, the session going on: a handle that opens no
     allocation, a byte count that does not match the shape, another GPU's UUID, a NaN;
  5. a session whose last bucket fails is aborted with end(abort) and the digests are those of
     before.

Runs on a machine with a GPU and PyTorch (label `gpu`); prints SKIPPED and exits 0 otherwise.
RLSERVE_BIN names the rlserve binary.
"""
import base64
import io
import json
import pickle
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

try:
    import torch
    import xxhash
    from safetensors.torch import load_file, save_file
except ImportError as e:  # pragma: no cover - CI has no torch
    print(f"SKIPPED: {e}")
    sys.exit(0)

if not torch.cuda.is_available():
    print("SKIPPED: no CUDA device")
    sys.exit(0)

BIN = os.environ.get("RLSERVE_BIN", "build/apps/rlserve")
# SGLang's wire form: PyTorch's multiprocessing pickle with SGLang's patched reduction and its
# FlattenedTensorMetadata (stand-ins under SGLang's module names; see the script).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "gpu"))
import make_ipc_fixtures as sglang_form  # noqa: E402
FAILURES = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        FAILURES.append(what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model, extra, log):
        self.port = free_port()
        self.log = open(log, "w")
        self.proc = subprocess.Popen([BIN, "serve", "--model", model, "--device", "cuda", "--port",
                                      str(self.port)] + extra, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if self.call("health", method="GET", ok_codes=(200,)) is not None:
                    return
            except Exception:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"rlserve serve exited: see {log}")
            time.sleep(0.5)
        raise RuntimeError("rlserve serve did not become healthy")

    def call(self, route, body=None, method="POST", ok_codes=(200, 400)):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/{route}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                text = r.read().decode()
        except urllib.error.HTTPError as e:
            if e.code not in ok_codes:
                raise
            text = e.read().decode()
        return json.loads(text) if text else {}

    def digests(self):
        r = self.call("weights_checker", {"action": "checksum"})
        assert r.get("success", True) and r.get("ranks"), r
        return r["ranks"][0]["checksums"]

    def greedy(self, prompts, n=16):
        out = []
        for p in prompts:
            r = self.call("generate", {"input_ids": p, "sampling_params": {"max_new_tokens": n, "temperature": 0}})
            out.append(r["output_ids"])
        return out

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def uuid_of(device):
    return "GPU-" + str(torch.cuda.get_device_properties(device).uuid)


def ipc_ref(name, t):
    """rlserve's own form of one CUDA tensor: handle of its allocation, byte offset, dtype, shape."""
    storage = t.untyped_storage()
    shared = storage._share_cuda_()
    handle, offset_bytes = shared[1], shared[3]
    assert len(handle) == 66 and handle[1:2] == b"c", "expected PyTorch's versioned 'c' handle"
    return {"name": name, "dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
            "ipc_handle": handle[2:].hex(), "offset": offset_bytes + t.storage_offset() * t.element_size(),
            "nbytes": t.numel() * t.element_size(), "device_uuid": uuid_of(t.device.index)}


def pickled_slot(payload):
    """The ref-counter slot a pickled CUDA tensor carries (each reduction takes a slot of its own),
    read with Python's unpickler and inert stand-ins: nothing of torch is rebuilt."""
    slots = []

    class Reader(pickle.Unpickler):
        def find_class(self, module, name):
            if name in ("rebuild_cuda_tensor", "_rebuild_cuda_tensor_modified"):
                return lambda *a: slots.append((a[11].decode(), a[12]))
            if module == "torch" and name == "Size":
                return tuple
            if name == "FlattenedTensorMetadata":
                return sglang_form.FlattenedTensorMetadata
            return object  # classes and dtypes passed as values

    Reader(io.BytesIO(payload)).load()
    assert len(slots) == 1, slots
    return slots[0]


def read_slot(where):
    name, slot = where
    with open("/dev/shm/" + name.lstrip("/"), "rb") as f:
        f.seek(64 + 8 * slot)
        return int.from_bytes(f.read(8), "little", signed=True)


SGLANG_RELEASES = []  # (before, after) ref-counter values around each SGLang-form call


def push(server, named, bucket_bytes=1 << 20, **extra):
    """Sends `named` in buckets, each one flat allocation the tensors are views of; even buckets
    in rlserve's own form, odd ones as SGLang's flattened bucket (base64 of the pickle)."""
    replies, bucket, size = [], [], 0
    keep = []

    def flush():
        nonlocal bucket, size
        if not bucket:
            return
        flat = torch.empty(sum(t.numel() * t.element_size() for _, t in bucket), dtype=torch.uint8, device="cuda")
        refs, meta, off = [], [], 0
        for n, t in bucket:
            b = t.numel() * t.element_size()
            view = flat[off:off + b].view(t.dtype).view(t.shape)
            view.copy_(t)
            refs.append(ipc_ref(n, view))
            meta.append(sglang_form.FlattenedTensorMetadata(n, t.shape, t.dtype, off, off + b, b))
            off += b
        torch.cuda.synchronize()
        keep.append(flat)
        if len(replies) % 2 == 0:
            body = {"device_tensors": refs}
        else:
            payload = sglang_form.dump({"flattened_tensor": flat, "metadata": meta}, sglang_patch=True)
            where = pickled_slot(payload)
            body = {"serialized_named_tensors": [base64.b64encode(payload).decode()],
                    "load_format": "flattened_bucket", "flush_cache": False}
            before = read_slot(where)
        replies.append(server.call("update_weights_from_tensor", dict(body, **extra)))
        if "serialized_named_tensors" in body:
            SGLANG_RELEASES.append((before, read_slot(where)))
        bucket, size = [], 0

    for n, t in named:
        bucket.append((n, t))
        size += t.numel() * t.element_size()
        if size >= bucket_bytes:
            flush()
    flush()
    return replies


def main():
    work = tempfile.mkdtemp(prefix="rlserve-ipc-")
    try:
        base, new = os.path.join(work, "base"), os.path.join(work, "new")
        subprocess.run([BIN, "make-model", "--arch", "qwen3-moe", "--preset", "medium", "--out", base,
                        "--seed", "5"], check=True, stdout=subprocess.DEVNULL)
        shutil.copytree(base, new)
        files = [f for f in os.listdir(base) if f.endswith(".safetensors")]
        gen = torch.Generator(device="cuda").manual_seed(7)
        trainer = {}
        for f in files:
            tensors = load_file(os.path.join(base, f), device="cuda")
            out = {}
            for n, t in tensors.items():
                if t.is_floating_point():
                    noise = torch.randn(t.shape, generator=gen, device="cuda", dtype=torch.float32)
                    t = (t.float() + 0.5 * noise * t.float().std().clamp_min(1e-3)).to(t.dtype)
                out[n] = t.contiguous()
            trainer.update(out)
            save_file({n: t.cpu() for n, t in out.items()}, os.path.join(new, f))
        named = sorted(trainer.items())
        quant = ["--quantize", "int4-asym", "--group-size", "128"]
        prompts = [[5, 17, 300, 42, 9], [1000, 7, 7, 21], [3]]

        engine = Server(base, quant, os.path.join(work, "engine.log"))
        before = engine.digests()
        before_out = engine.greedy(prompts)

        # 4. refusals inside a session: each names the tensor, stages nothing, the session goes on.
        r = engine.call("begin_weight_update", {})
        check(r.get("success"), f"begin_weight_update: {r}")
        name, t = named[0]
        ref = ipc_ref(name, t)
        ref["ipc_handle"] = "ab" * 64  # no allocation has this handle
        r = engine.call("update_weights_from_tensor", {"device_tensors": [ref]})
        check(not r.get("success") and name in r.get("message", ""), f"invalid handle refused: {r.get('message')}")
        bad = ipc_ref(name, t)
        bad["nbytes"] += 2
        r = engine.call("update_weights_from_tensor", {"device_tensors": [bad]})
        check(not r.get("success") and name in r.get("message", ""), f"wrong byte count refused: {r.get('message')}")
        other = ipc_ref(name, t)
        other["device_uuid"] = "GPU-00000000-0000-0000-0000-000000000000"
        r = engine.call("update_weights_from_tensor", {"device_tensors": [other]})
        check(not r.get("success") and "GPU-00000000" in r.get("message", ""), f"another GPU refused: {r.get('message')}")
        nan_name, nan_t = next((n, t) for n, t in named if t.is_floating_point() and t.dim() == 2)
        poisoned = nan_t.clone()
        poisoned.view(-1)[3] = float("nan")
        r = engine.call("update_weights_from_tensor", {"device_tensors": [ipc_ref(nan_name, poisoned)]})
        check(not r.get("success") and nan_name in r.get("message", "") and "NaN" in r.get("message", ""),
              f"NaN refused: {r.get('message')}")

        # 1. the real update, in buckets; nothing serves before end.
        replies = push(engine, named)
        check(all(x.get("success") for x in replies), f"{len(replies)} IPC buckets staged (own form and "
              f"SGLang's flattened buckets): {[x.get('message') for x in replies if not x.get('success')][:2]}")
        check(SGLANG_RELEASES and all(a == b - 1 for b, a in SGLANG_RELEASES),
              f"the engine released the trainer's ref-counter slot of every SGLang bucket: {SGLANG_RELEASES[:3]}")
        mid = engine.digests()
        check(mid == before, "digests unchanged before end_weight_update")
        r = engine.call("end_weight_update", {"weight_version": "ipc-1"})
        check(r.get("success"), f"end_weight_update: {r.get('message')}")
        after = engine.digests()

        # 2. BF16 tensors: the trainer's bytes; everything: a fresh engine from the new checkpoint.
        bf16_ok = [n for n, t in named if n in after and
                   after[n] == xxhash.xxh3_64_hexdigest(t.contiguous().view(torch.uint8).cpu().numpy().tobytes())]
        bf16_names = [n for n, _ in named if n in after]
        check(len(bf16_ok) == len(bf16_names) and bf16_names,
              f"{len(bf16_ok)}/{len(bf16_names)} BF16 digests equal the trainer's xxhash")
        fresh = Server(new, quant, os.path.join(work, "fresh.log"))
        fresh_digests = fresh.digests()
        diff = [n for n in fresh_digests if fresh_digests[n] != after.get(n)]
        check(not diff and len(fresh_digests) == len(after),
              f"all {len(after)} digests equal a fresh engine's (INT4 quantized on the device; differ: {diff[:3]})")
        # 3. greedy output.
        check(engine.greedy(prompts) == fresh.greedy(prompts), "greedy output equals the fresh engine's")
        check(engine.greedy(prompts) != before_out, "and differs from before the update")
        fresh.stop()

        # 5. a failing last bucket: the session is aborted, the weights are those of after.
        r = engine.call("begin_weight_update", {})
        half = [(n, (t.float() * 1.01).to(t.dtype)) for n, t in named[: len(named) // 2]]
        replies = push(engine, half)
        ref = ipc_ref(name, t)
        ref["ipc_handle"] = "cd" * 64
        r = engine.call("update_weights_from_tensor", {"device_tensors": [ref]})
        check(not r.get("success"), "the last bucket's invalid handle fails")
        r = engine.call("end_weight_update", {"abort": True})
        check(r.get("success"), f"end_weight_update(abort): {r.get('message')}")
        check(engine.digests() == after, "digests after the aborted session equal those before it")
        engine.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{0 if FAILURES else 1} passed, {1 if FAILURES else 0} failed")
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
