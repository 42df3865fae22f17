"""The trainer-side Python package (python/rlserve), installed with pip from the repository as a
user would (`pip install ./python`, into a scratch directory), against a real `rlserve serve`
with separate user and admin keys; references are independent of the package: `xxhash` over the
checkpoint's own bytes, NumPy for bfloat16 rounding, raw urllib for generation.

- HttpClient: generate equals a raw call; the streamed events end with the same tokens; a wrong
  key is RlserveError with status 401; an inline update outside a session commits at once and
  the engine's checksum is tensor_checksum of the bytes sent.
- WebSocketClient: a whole session (pause, begin, a binary-frame update, end with a version,
  continue); the engine's per-tensor checksums and role checksum equal tensor_checksum /
  role_checksum of the trainer's bytes; a refused update names the tensor, stages nothing, and
  the session goes on; streamed chunks add up to the final result.
- int4.quantize_module: an INT4 engine (quantized at load, int4-asym g32) takes a BF16 expert
  update; the served weight_packed / weight_scale / weight_zero_point / weight_shape checksums are
  those of the package's tensors from the trainer's float weight.
- ipc (host side): buckets are cut in order; a host array given to update_weights_from_device is
  refused by name before anything is sent.
- tensor_from_array: float32 -> bfloat16 rounds to nearest even (ties, NaN, infinities) as NumPy
  bit arithmetic written here does; Tensor refuses a byte count that does not match its shape.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import urllib.request

import numpy as np
import xxhash

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rlserve_testlib as t  # noqa: E402

USER, ADMIN = "pkg-user-1", "pkg-admin-2"
REPO = os.environ.get("RLSERVE_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def install(tmp):
    """pip install of a copy of python/ (the build writes beside the sources). pip builds it with
    setuptools' bdist_wheel, which older setuptools take from the `wheel` package (setup.sh
    installs it when it can); without it, offline, the package is copied into place instead."""
    src = os.path.join(tmp, "src")
    shutil.copytree(os.path.join(REPO, "python"), src,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = os.path.join(tmp, "site")
    try:
        import wheel  # noqa: F401
        p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                            "--target", target, src], capture_output=True, text=True)
        t.check(p.returncode == 0, f"pip install ./python failed: {p.stderr[-2000:]}")
        print("  installed with pip")
    except ImportError:
        print("  NOTE: the wheel package is missing: python/rlserve copied, not pip-installed")
        shutil.copytree(os.path.join(src, "rlserve"), os.path.join(target, "rlserve"))
    sys.path.insert(0, target)
    import rlserve
    t.check(os.path.dirname(rlserve.__file__).startswith(target), "imported the installed package")
    return rlserve


def safetensors_bytes(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    return {k: (v, data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__"}


def bf16_reference(values):
    """Round-to-nearest-even of float32 to bfloat16 by integer arithmetic on the bits."""
    out = []
    for v in np.asarray(values, dtype=np.float32).reshape(-1):
        bits = int(v.view(np.uint32))
        if (bits & 0x7F800000) == 0x7F800000 and bits & 0x7FFFFF:
            out.append(((bits >> 16) | 0x40) & 0xFFFF)
            continue
        upper, lower = bits >> 16, bits & 0xFFFF
        if lower > 0x8000 or (lower == 0x8000 and upper & 1):
            upper += 1
        out.append(upper & 0xFFFF)
    return out


def check_tensors(rlserve):
    values = np.array([1.0, 1.00390625, 1.01171875, -2.5, 3.0e38, np.inf, -np.inf, np.nan, 1e-40,
                       0.1, -0.3333], dtype=np.float32)
    got = rlserve.tensor_from_array(values, "bfloat16")
    t.check(got.dtype == "bfloat16" and got.shape == (11,), got)
    t.check(list(struct.unpack("<11H", got.data)) == bf16_reference(values), "bfloat16 rounding")
    t.check(struct.unpack("<H", got.data[2:4])[0] == 0x3F80, "a tie rounds to even (down)")
    t.check(struct.unpack("<H", got.data[4:6])[0] == 0x3F82, "a tie rounds to even (up)")
    try:
        rlserve.tensor_from_bytes("bfloat16", [3], b"\0" * 4)
        raise AssertionError("a short tensor was accepted")
    except ValueError as e:
        t.check("6 bytes, got 4" in str(e), str(e))
    i32 = rlserve.tensor_from_array(np.arange(6, dtype=np.int32).reshape(2, 3))
    t.check(i32.dtype == "int32" and i32.shape == (2, 3) and len(i32.data) == 24, i32)
    print("  tensors: bfloat16 rounding, shapes, sizes")


class Sized:
    """What rlserve.ipc reads of a tensor to cut buckets (the device path itself needs a GPU:
    tests/gpu/test_grpo_qat.py)."""
    def __init__(self, numel):
        self.n = numel

    def numel(self):
        return self.n

    def element_size(self):
        return 2


def check_ipc_host_side(rlserve):
    cut = rlserve.ipc.buckets({"a": Sized(10), "b": Sized(10), "c": Sized(30), "d": Sized(1)}, 40)
    t.check([[n for n, _ in b] for b in cut] == [["a", "b"], ["c"], ["d"]], cut)
    client = rlserve.HttpClient("http://127.0.0.1:9")  # nothing listens: no request may leave
    try:
        client.update_weights_from_device({"model.norm.weight": np.zeros(4, np.float32)})
        raise AssertionError("a host array was sent by CUDA IPC")
    except ValueError as e:
        t.check("model.norm.weight" in str(e) and "CUDA" in str(e), str(e))
    print("  ipc: buckets in order, a host tensor refused by name before anything is sent")


def raw_generate(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=json.dumps(body).encode(),
                                 method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", f"Bearer {USER}")
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def check_http(rlserve, port, model):
    user = rlserve.HttpClient(f"http://127.0.0.1:{port}", api_key=USER)
    admin = rlserve.HttpClient(f"http://127.0.0.1:{port}", api_key=ADMIN)
    params = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    out = user.generate(input_ids=[5, 6, 7], sampling_params=params)
    t.check(out["output_ids"] == raw_generate(port, {"input_ids": [5, 6, 7], "sampling_params": params})["output_ids"],
            "the client's generate is the route's")
    events = list(user.generate_stream(input_ids=[5, 6, 7], sampling_params=params))
    t.check(events and events[-1]["output_ids"] == out["output_ids"], f"streamed: {events[-1:]}")
    try:
        rlserve.HttpClient(f"http://127.0.0.1:{port}", api_key="wrong").generate(input_ids=[1])
        raise AssertionError("a wrong key was accepted")
    except rlserve.RlserveError as e:
        t.check(e.status == 401, f"status {e.status}: {e}")
    try:
        user.pause_generation()
        raise AssertionError("the user key paused generation")
    except rlserve.RlserveError as e:
        t.check(e.status in (401, 403), f"status {e.status}: {e}")
    # Inline, outside a session: commits at once.
    info, raw = safetensors_bytes(os.path.join(model, "model.safetensors"))["model.norm.weight"]
    new = rlserve.tensor_from_array(np.frombuffer(raw, dtype="<u2").astype(np.uint32).__lshift__(16)
                                    .view(np.float32) * 1.5, "bfloat16")
    admin.update_weights({"model.norm.weight": new}, weight_version="http-1")
    sums = admin.check_weights()["ranks"][0]["checksums"]
    t.check(sums["model.norm.weight"] == rlserve.tensor_checksum(new), "the engine holds the bytes sent")
    t.check(admin.get_weight_version() == "http-1", admin.get_weight_version())
    t.check(user.health(), "healthy")
    print("  http: generate, stream, keys, inline update, checksums")
    return new


def check_websocket(rlserve, port, model, after_http):
    tensors = safetensors_bytes(os.path.join(model, "model.safetensors"))
    info, raw = tensors["model.layers.0.input_layernorm.weight"]
    values = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
    update = {"model.layers.0.input_layernorm.weight":
              rlserve.tensor_from_array(values.view(np.float32) - 0.25, "bfloat16")}
    chunks = []
    with rlserve.WebSocketClient(f"ws://127.0.0.1:{port}/", api_key=ADMIN) as ws:
        ws.pause_generation("retract")
        # A colocated trainer's sleep and wake around its update (the weights first).
        ws.release_memory_occupation(["kv_cache", "weights"])
        ws.resume_memory_occupation(["weights"])
        ws.begin_weight_update()
        try:
            ws.update_weights({"model.no_such.weight": rlserve.tensor_from_bytes("bfloat16", [2], b"\0" * 4)})
            raise AssertionError("an unknown tensor was staged")
        except rlserve.RlserveError as e:
            t.check("model.no_such.weight" in e.message, e.message)
        ws.update_weights(update)  # the session went on
        end = ws.end_weight_update(weight_version="ws-2")
        t.check(end["weight_version"] == "ws-2", end)
        ws.resume_memory_occupation()
        ws.continue_generation()
        out = ws.generate(input_ids=[9, 8, 7], sampling_params={"max_new_tokens": 5, "temperature": 0,
                                                                  "ignore_eos": True},
                          on_chunk=chunks.append)
        t.check(sum((c["output_ids"] for c in chunks), []) == out["output_ids"], "chunks add up")
        rank = ws.check_weights()["ranks"][0]
    sums = rank["checksums"]
    name = "model.layers.0.input_layernorm.weight"
    t.check(sums[name] == rlserve.tensor_checksum(update[name]), "the engine holds the update's bytes")
    t.check(sums["model.norm.weight"] == rlserve.tensor_checksum(after_http), "the earlier update stays")
    untouched = "model.embed_tokens.weight"
    t.check(sums[untouched] == xxhash.xxh3_64_hexdigest(tensors[untouched][1]), "an untouched tensor")
    roles = rank["role_checksums"]
    target = {k: v for k, v in sums.items() if not k.startswith("draft.")}
    t.check(roles["target"] == rlserve.role_checksum(target), f"role checksum {roles}")
    print("  websocket: release/resume, session, refusal, binary update, checksums, streaming")


def check_int4(rlserve, tmp):
    """An INT4 engine quantizes a BF16 expert update with its recipe: the package predicts the
    served load-format tensors' checksums from the trainer's float weight."""
    model = os.path.join(tmp, "moe")
    t.run("make-model", "--arch", "qwen3-moe", "--preset", "tiny", "--out", model, "--seed", "6")
    proc, port = t.start_server(dict(os.environ), "--model", model, "--device", "cpu", "--admin-api-key",
                                ADMIN, "--quantize", "int4-asym", "--group-size", "32")
    try:
        prefix = "model.layers.1.mlp.experts.3.down_proj"
        with open(os.path.join(model, "config.json")) as f:
            cfg = json.load(f)
        n, k = cfg["hidden_size"], cfg["moe_intermediate_size"]
        rng = np.random.default_rng(3)
        weight = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
        admin = rlserve.HttpClient(f"http://127.0.0.1:{port}", api_key=ADMIN)
        admin.update_weights({prefix + ".weight": rlserve.tensor_from_array(weight, "bfloat16")})
        sums = admin.check_weights()["ranks"][0]["checksums"]
        want = rlserve.int4.quantize_module(weight, "int4-asym", 32)
        t.check(sorted(want) == ["weight_packed", "weight_scale", "weight_shape", "weight_zero_point"], sorted(want))
        for suffix, tensor in want.items():
            t.check(sums[f"{prefix}.{suffix}"] == rlserve.tensor_checksum(tensor), f"{prefix}.{suffix}")
        sym = rlserve.int4.quantize_module(weight, "int4-sym-qat", -1)
        t.check("weight_zero_point" not in sym and sym["weight_scale"].shape == (n, 1), sym["weight_scale"])
        try:
            rlserve.int4.quantize_module(weight, "int4-asym", 48)
            raise AssertionError("group size 48 accepted")
        except ValueError as e:
            t.check("group size" in str(e), str(e))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print("  int4: the package predicts the INT4 engine's checksums of a quantized BF16 update")


def main():
    with t.temp_dir() as tmp:
        rlserve = install(tmp)
        check_tensors(rlserve)
        check_ipc_host_side(rlserve)
        model = os.path.join(tmp, "model")
        t.run("make-model", "--preset", "tiny", "--out", model, "--seed", "5")
        proc, port = t.start_server(dict(os.environ), "--model", model, "--device", "cpu",
                                    "--api-key", USER, "--admin-api-key", ADMIN)
        try:
            after_http = check_http(rlserve, port, model)
            check_websocket(rlserve, port, model, after_http)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        check_int4(rlserve, tmp)
    print("test_python_package: all passed")


if __name__ == "__main__":
    main()
