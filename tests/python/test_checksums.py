"""The engine's weight checksums against the Python `xxhash` package.

check_weights(checksum) promises XXH3-64 of each tensor's load-format bytes, and per role an
XXH3-64 over the sorted lines "name:digest\\n" (docs/formats.md). Here the bytes come straight
from the safetensors file, parsed by hand (the header is JSON; the numpy backend of `safetensors`
cannot read bfloat16), and hashed with `xxhash`.
"""
import json
import os
import struct
import sys

import xxhash

sys.path.insert(0, os.path.dirname(__file__))
import rlserve_testlib as t  # noqa: E402


def tensor_bytes(path):
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    base = 8 + header_len
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        out[name] = data[base + begin : base + end]
    return out


def main():
    for arch in ("qwen3", "qwen3-moe"):
        check_arch(arch)


def check_arch(arch):
    with t.temp_dir() as tmp:
        model = os.path.join(tmp, "m")
        t.run("make-model", "--arch", arch, "--preset", "tiny", "--out", model, "--seed", "77")
        report = json.loads(t.run("check-weights", "--model", model, "--json").stdout)
        t.check(report["success"], report)
        ranks = report["ranks"]
        t.check(len(ranks) == 1, "one rank on the CPU")
        engine = ranks[0]["checksums"]
        tensors = tensor_bytes(os.path.join(model, "model.safetensors"))
        t.check(set(engine) == set(tensors), f"names differ: {set(engine) ^ set(tensors)}")
        for name, raw in tensors.items():
            mine = xxhash.xxh3_64(raw).hexdigest()
            t.check(engine[name] == mine, f"{name}: engine {engine[name]}, xxhash {mine}")
        stream = "".join(f"{n}:{engine[n]}\n" for n in sorted(engine)).encode()
        role = xxhash.xxh3_64(stream).hexdigest()
        t.check(ranks[0]["role_checksums"]["target"] == role, "role checksum differs")
        t.check(ranks[0]["per_gpu_checksum"] == role, "overall checksum differs (one role)")
        # The engine's checksum: over every GPU's overall checksum in rank order (one GPU here).
        engine_sum = xxhash.xxh3_64(ranks[0]["per_gpu_checksum"].encode()).hexdigest()
        t.check(report["per_engine_checksum"] == engine_sum, "per_engine_checksum differs")
        # --skip leaves tensors out by substring, as skip_tensor_list does.
        skipped = json.loads(t.run("check-weights", "--model", model, "--json", "--skip", "norm").stdout)
        names = skipped["ranks"][0]["checksums"]
        t.check(names and all("norm" not in n for n in names), "skip_tensor_list not honoured")
        print(f"ok: {arch}: {len(tensors)} tensor checksums and the role checksum match xxhash")


if __name__ == "__main__":
    main()
