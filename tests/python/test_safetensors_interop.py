"""safetensors interop: the engine reads what the Python `safetensors` package writes, and the
package reads what the engine writes, byte for byte.

The engine side is `rlserve inspect-checkpoint --json` (name, dtype, shape, xxh64 of the bytes as
the engine's mmap reader sees them) and `rlserve forward`; the Python side is the `safetensors`
package (numpy API for ordinary dtypes, the raw serialize/deserialize API for bfloat16, which
numpy has no dtype for) and the `xxhash` package.
"""
import os
import sys

import numpy as np
import safetensors
import safetensors.numpy
import xxhash
from safetensors import safe_open

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rlserve_testlib import check, run, run_json_lines, temp_dir  # noqa: E402


def engine_view(model):
    """{name: (dtype, shape, xxh64)} as the engine reads the checkpoint."""
    (out,) = run_json_lines("inspect-checkpoint", "--model", model, "--json")
    return {t["name"]: (t["dtype"], list(t["shape"]), t["xxh64"]) for t in out["tensors"]}


def python_view(path):
    """{name: (dtype, shape, xxh64)} as the safetensors package reads the file."""
    with open(path, "rb") as f:
        entries = safetensors.deserialize(f.read())
    return {name: (e["dtype"], list(e["shape"]), xxhash.xxh64(bytes(e["data"])).hexdigest())
            for name, e in entries}


def forward(model, ids, out):
    run("forward", "--model", model, "--input-ids", ",".join(map(str, ids)), "--out", out)
    return np.load(out)


def rewrite_with_python(src_file, dst_file):
    """Re-serializes every tensor with the package's own writer (its layout and header order)."""
    with open(src_file, "rb") as f:
        entries = safetensors.deserialize(f.read())
    buffers = {}  # keeps the memory alive while serialize_file reads it
    specs = {}
    torch_names = {"BF16": "bfloat16", "F32": "float32", "F16": "float16"}
    for name, e in entries:
        buf = np.frombuffer(bytes(e["data"]), dtype=np.uint8).copy()
        buffers[name] = buf
        specs[name] = safetensors.TensorSpec(dtype=torch_names[e["dtype"]], shape=e["shape"],
                                             data_ptr=buf.ctypes.data, data_len=buf.nbytes)
    safetensors.serialize_file(specs, dst_file, metadata={"format": "pt", "writer": "python"})


def test_python_written_model_runs_identically():
    with temp_dir() as tmp:
        for dtype in ("bfloat16", "float32"):
            ours = os.path.join(tmp, f"ours-{dtype}")
            theirs = os.path.join(tmp, f"theirs-{dtype}")
            run("make-model", "--preset", "tiny", "--out", ours, "--seed", 11, "--dtype", dtype)
            os.makedirs(theirs)
            for name in os.listdir(ours):
                if name != "model.safetensors":
                    with open(os.path.join(ours, name), "rb") as src, \
                         open(os.path.join(theirs, name), "wb") as dst:
                        dst.write(src.read())
            if dtype == "float32":
                # The plain numpy API, as most users would write a checkpoint.
                with safe_open(os.path.join(ours, "model.safetensors"), framework="numpy") as f:
                    arrays = {k: f.get_tensor(k) for k in f.keys()}
                safetensors.numpy.save_file(arrays, os.path.join(theirs, "model.safetensors"),
                                            metadata={"format": "pt"})
            else:
                rewrite_with_python(os.path.join(ours, "model.safetensors"),
                                    os.path.join(theirs, "model.safetensors"))
            with open(os.path.join(ours, "model.safetensors"), "rb") as a, \
                 open(os.path.join(theirs, "model.safetensors"), "rb") as b:
                same_file = a.read() == b.read()
            print(f"  {dtype}: python-written file is {'identical' if same_file else 'different'}"
                  " bytes from the engine's")

            check(engine_view(ours) == engine_view(theirs),
                  f"{dtype}: the engine reads the Python-written checkpoint differently")
            ids = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
            a = forward(ours, ids, os.path.join(tmp, "a.npy"))
            b = forward(theirs, ids, os.path.join(tmp, "b.npy"))
            check(np.array_equal(a, b), f"{dtype}: logits differ between the two files")
    print("python-written checkpoints: ok")


def test_every_dtype_python_writes():
    with temp_dir() as tmp:
        rng = np.random.RandomState(0)
        arrays = {
            "f64": rng.randn(3, 2),
            "f32": rng.randn(5).astype(np.float32),
            "f16": rng.randn(2, 2, 2).astype(np.float16),
            "i64": np.arange(-3, 3, dtype=np.int64),
            "i32": np.arange(7, dtype=np.int32).reshape(7, 1),
            "i16": np.array([-1, 2, -3], dtype=np.int16),
            "i8": np.array([-128, 0, 127], dtype=np.int8),
            "u8": np.arange(9, dtype=np.uint8),
            "bool": np.array([True, False, True]),
            "empty": np.zeros((0, 4), dtype=np.float32),
            "scalar": np.array(2.5, dtype=np.float32),
        }
        path = os.path.join(tmp, "all.safetensors")
        safetensors.numpy.save_file(arrays, path, metadata={"k": "v"})
        engine = engine_view(path)
        python = python_view(path)
        check(engine == python, f"engine {engine}\n!= python {python}")
        print(f"all {len(arrays)} dtypes/shapes the numpy API writes: ok")


def test_engine_written_files_read_by_python():
    with temp_dir() as tmp:
        for dtype in ("bfloat16", "float32"):
            model = os.path.join(tmp, dtype)
            run("make-model", "--preset", "tiny", "--out", model, "--seed", 2, "--dtype", dtype)
            path = os.path.join(model, "model.safetensors")
            check(python_view(path) == engine_view(model),
                  f"{dtype}: Python reads the engine's file differently from the engine")
            with safe_open(path, framework="numpy") as f:
                meta = f.metadata()
                check(meta.get("format") == "pt", f"metadata {meta}")
                if dtype == "float32":
                    w = f.get_tensor("model.norm.weight")
                    check(w.dtype == np.float32 and w.shape == (64,), f"{w.dtype} {w.shape}")
                    check(0.5 < float(np.mean(w)) < 1.5, f"norm weights near 1, got {np.mean(w)}")
            # Layout the Rust reader insists on: 8-byte aligned header, contiguous data.
            with open(path, "rb") as f:
                header_len = int.from_bytes(f.read(8), "little")
            check((8 + header_len) % 8 == 0, f"header length {header_len} leaves data unaligned")
    print("engine-written files read by Python: ok")


def main():
    test_every_dtype_python_writes()
    test_engine_written_files_read_by_python()
    test_python_written_model_runs_identically()
    print("test_safetensors_interop: all passed")


if __name__ == "__main__":
    main()
