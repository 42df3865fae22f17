"""Served weights do not alias the checkpoint file they were read from.

A trainer may rewrite a checkpoint at any time, in place or by writing a new file to the same
path (which truncates it first). Were the served tensors a mapping of the file, the first would
change checksums and get_weights_by_name with no committed update, and the second would kill the
server with SIGBUS at its next read. Here `rlserve serve` runs on a make-model checkpoint, and
then on a directory loaded by update_weights_from_disk; each file is overwritten in place with
other bytes and then truncated, and after each step weights_checker's checksums (compared with
xxhash of the bytes the file held when it was loaded) and get_weights_by_name's values must be
what they were, and the server must still generate.
"""
import json
import os
import struct
import sys

import xxhash

sys.path.insert(0, os.path.dirname(__file__))
import rlserve_testlib as t  # noqa: E402

READ = ("model.norm.weight", "model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight")


def tensor_bytes(path):
    """name -> raw bytes of every tensor of a safetensors file (header parsed by hand)."""
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    base = 8 + header_len
    return {name: data[base + info["data_offsets"][0] : base + info["data_offsets"][1]]
            for name, info in header.items() if name != "__metadata__"}


def served(port):
    """(checksums, {name: get_weights_by_name values}) as the server reports them now."""
    status, report = t.http(port, "POST", "/weights_checker", {"action": "checksum"})
    t.check(status == 200 and report.get("success"), f"weights_checker -> {status} {report}")
    values = {}
    for name in READ:
        status, out = t.http(port, "POST", "/get_weights_by_name", {"name": name, "truncate_size": 64})
        t.check(status == 200 and isinstance(out, list) and out, f"get_weights_by_name {name} -> {status} {out}")
        values[name] = out
    return report["ranks"][0]["checksums"], values


def still_serving(proc, port, before, label):
    t.check(proc.poll() is None, f"{label}: the server died ({proc.returncode})")
    now = served(port)
    t.check(now[0] == before[0], f"{label}: checksums changed with no update")
    t.check(now[1] == before[1], f"{label}: get_weights_by_name changed with no update")
    status, out = t.http(port, "POST", "/generate",
                         {"input_ids": [1, 2, 3], "sampling_params": {"temperature": 0, "max_new_tokens": 4}})
    t.check(status == 200 and len(out["output_ids"]) == 4, f"{label}: /generate -> {status} {out}")


def overwrite_in_place(path):
    """Same size, every byte after the 8-byte length changed (header included): no truncation."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(8)
        f.write(bytes((i * 7 + 1) & 0xFF for i in range(size - 8)))
    t.check(os.path.getsize(path) == size, "rewritten at the same size")


def rewrite_and_truncate(proc, port, path, expected, label):
    """The server's weights are `expected` (xxhash by name); the file under it changes twice."""
    before = served(port)
    t.check(before[0] == expected, f"{label}: served checksums are not the file's xxhash")
    overwrite_in_place(path)
    still_serving(proc, port, before, f"{label}, file rewritten in place")
    os.truncate(path, 0)
    still_serving(proc, port, before, f"{label}, file truncated to 0 bytes")
    print(f"  {label}: rewritten in place and truncated, checksums and values unchanged")


def xxhashes(path):
    return {name: xxhash.xxh3_64(raw).hexdigest() for name, raw in tensor_bytes(path).items()}


def main():
    with t.temp_dir() as tmp:
        model, other = os.path.join(tmp, "model"), os.path.join(tmp, "other")
        t.run("make-model", "--preset", "tiny", "--out", model, "--seed", "11")
        t.run("make-model", "--preset", "tiny", "--out", other, "--seed", "12")
        model_file, other_file = (os.path.join(d, "model.safetensors") for d in (model, other))
        model_sums, other_sums = xxhashes(model_file), xxhashes(other_file)
        t.check(model_sums != other_sums, "the two checkpoints differ")

        proc, port = t.start_server(dict(os.environ), "--model", model, "--device", "cpu")
        try:
            rewrite_and_truncate(proc, port, model_file, model_sums, "--model checkpoint")
            status, out = t.http(port, "POST", "/update_weights_from_disk", {"model_path": other})
            t.check(status == 200 and out["success"], f"update_weights_from_disk -> {status} {out}")
            rewrite_and_truncate(proc, port, other_file, other_sums, "update_weights_from_disk directory")
            # Loading the truncated file again is refused with a message; the old weights serve.
            before = served(port)
            status, out = t.http(port, "POST", "/update_weights_from_disk", {"model_path": other})
            t.check(not (status == 200 and out.get("success")), f"a truncated checkpoint loaded: {status} {out}")
            t.check("model.safetensors" in json.dumps(out), f"the refusal names the file: {out}")
            still_serving(proc, port, before, "after the refused reload")
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=60)
        t.check(proc.returncode == 0, f"serve exited with {proc.returncode}: {err[-2000:]}")
    print("test_checkpoint_rewrite: all passed")


if __name__ == "__main__":
    main()
