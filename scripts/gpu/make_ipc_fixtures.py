#!/usr/bin/env python3
"""Writes the CUDA IPC pickle fixtures of tests/data/torch_ipc/ on a GPU machine.

Each fixture is the byte stream PyTorch's multiprocessing pickler (ForkingPickler) writes for CUDA
tensors, in the shapes RL trainers send to an SGLang-compatible engine:

  plain_*.pkl        list[tuple[str, Tensor]] (update_weights_from_tensor without load_format)
  sglang_*.pkl       the same with SGLang's patched reduction (device as a UUID string, the
                     rebuild function under sglang's module name), as slime and miles send it
  bucket_*.pkl       {"flattened_tensor": Tensor, "metadata": [FlattenedTensorMetadata, ...]}
                     (load_format "flattened_bucket"), element-indexed (one dtype) and
                     byte-indexed (uint8) forms, and the empty filler bucket
  many.pkl           300 tensors (memo indices past 255, several pickle frames)
  large_offset.pkl   a tensor 2^31 + bytes into its allocation (ints past 32 bits)

expected.json records, per fixture, what a reader must recover (names, dtypes, shapes, strides,
element and byte offsets, handle bytes, device) plus facts the engine relies on: the UUID text
torch writes, and where the ref-counter slot sits in its shared-memory file.

The SGLang pieces (the patched reduction and the metadata dataclass) are stand-ins written here
under the module names SGLang uses, so the pickler emits the same globals; they do not come from
SGLang. The handles in the fixtures are dead once this process exits: the fixtures are for
parsing tests, not for opening.

Usage: python3 scripts/gpu/make_ipc_fixtures.py OUT_DIR
"""
import dataclasses
import io
import json
import os
import sys
import types

import torch
import torch.multiprocessing.reductions as reductions
from multiprocessing.reduction import ForkingPickler


def install_sglang_stand_ins():
    """Modules named as SGLang's: the metadata dataclass and the UUID-device rebuild function."""
    pkgs = ["sglang", "sglang.srt", "sglang.srt.utils", "sglang.srt.weight_sync"]
    for name in pkgs:
        sys.modules.setdefault(name, types.ModuleType(name))

    bucket_mod = types.ModuleType("sglang.srt.weight_sync.tensor_bucket")

    @dataclasses.dataclass
    class FlattenedTensorMetadata:
        name: str
        shape: torch.Size
        dtype: torch.dtype
        start_idx: int
        end_idx: int
        numel: int

    FlattenedTensorMetadata.__module__ = bucket_mod.__name__
    FlattenedTensorMetadata.__qualname__ = "FlattenedTensorMetadata"
    bucket_mod.FlattenedTensorMetadata = FlattenedTensorMetadata
    sys.modules[bucket_mod.__name__] = bucket_mod

    patch_mod = types.ModuleType("sglang.srt.utils.patch_torch")

    def _rebuild_cuda_tensor_modified(*args):  # never called here: only its name is pickled
        raise RuntimeError("stand-in")

    _rebuild_cuda_tensor_modified.__module__ = patch_mod.__name__
    _rebuild_cuda_tensor_modified.__qualname__ = "_rebuild_cuda_tensor_modified"
    patch_mod._rebuild_cuda_tensor_modified = _rebuild_cuda_tensor_modified
    sys.modules[patch_mod.__name__] = patch_mod
    return FlattenedTensorMetadata, _rebuild_cuda_tensor_modified


FlattenedTensorMetadata, sglang_rebuild = install_sglang_stand_ins()
DEVICE_ARG = 6  # storage_device in rebuild_cuda_tensor's argument tuple


def uuid_text(device):
    return str(torch.cuda.get_device_properties(device).uuid)


def dump(obj, sglang_patch=False):
    buf = io.BytesIO()
    pickler = ForkingPickler(buf)
    if sglang_patch:
        def reduce_patched(t):
            fn, args = reductions.reduce_tensor(t)
            args = list(args)
            args[DEVICE_ARG] = uuid_text(args[DEVICE_ARG])
            return sglang_rebuild, tuple(args)
        table = pickler.dispatch_table.copy()
        table[torch.Tensor] = reduce_patched
        table[torch.nn.parameter.Parameter] = reduce_patched
        pickler.dispatch_table = table
    pickler.dump(obj)
    return buf.getvalue()


def describe(t):
    """What the reader must recover from one pickled CUDA tensor."""
    fn, args = reductions.reduce_tensor(t)
    handle = args[7]
    return {
        "dtype": str(t.dtype).replace("torch.", ""),
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "storage_offset_elements": t.storage_offset(),
        "storage_size_bytes": args[8],
        "storage_offset_bytes": args[9],
        "handle_hex": handle.hex() if handle is not None else None,
        "device": t.device.index,
        "requires_grad": t.requires_grad,
        "class": type(t).__name__,
    }


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    dev = torch.device("cuda", 0)
    expected = {
        "torch_version": torch.__version__,
        "device_uuid_text": uuid_text(0),
        "device_uuid_bytes_hex": bytes(torch.cuda.get_device_properties(0).uuid.bytes).hex()
        if hasattr(torch.cuda.get_device_properties(0).uuid, "bytes") else None,
        "fixtures": {},
    }
    keep = []  # tensors stay alive until every fixture is written

    def record(name, data, tensors, **extra):
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data)
        expected["fixtures"][name] = dict(tensors=tensors, nbytes=len(data), **extra)

    # Plain list of (name, tensor): separate allocations, a slice with a storage offset, several
    # dtypes, a 3-D shape, a Parameter.
    big = torch.randn(64, 32, device=dev, dtype=torch.bfloat16)
    named = [
        ("model.layers.0.self_attn.q_proj.weight", torch.randn(8, 16, device=dev, dtype=torch.bfloat16)),
        ("model.norm.weight", torch.ones(16, device=dev, dtype=torch.float32)),
        ("model.layers.0.mlp.experts.w", torch.randn(2, 3, 4, device=dev, dtype=torch.float16)),
        ("model.slice", big[10:20]),
        ("model.ids", torch.arange(12, device=dev, dtype=torch.int32).reshape(3, 4)),
        ("model.param", torch.nn.Parameter(torch.randn(4, 4, device=dev, dtype=torch.bfloat16),
                                           requires_grad=False)),
    ]
    keep += [t for _, t in named] + [big]
    for patched in (False, True):
        name = ("sglang" if patched else "plain") + "_list.pkl"
        record(name, dump(named, sglang_patch=patched),
               [dict(name=n, **describe(t)) for n, t in named], sglang_patch=patched)

    # Two views of one allocation: one handle, different byte offsets.
    base = torch.randn(1024, device=dev, dtype=torch.bfloat16)
    shared = [("a", base[:256]), ("b", base[512:768].view(16, 16))]
    keep.append(base)
    record("plain_shared_storage.pkl", dump(shared),
           [dict(name=n, **describe(t)) for n, t in shared], sglang_patch=False)

    # Flattened buckets.
    parts = [("w1", torch.randn(4, 8, device=dev, dtype=torch.bfloat16)),
             ("w2", torch.randn(16, device=dev, dtype=torch.bfloat16)),
             ("w3", torch.randn(2, 2, 2, device=dev, dtype=torch.bfloat16))]
    for form in ("elements", "bytes"):
        flats, meta, idx = [], [], 0
        for n, t in parts:
            f = t.flatten() if form == "elements" else t.flatten().view(torch.uint8)
            meta.append(FlattenedTensorMetadata(n, t.shape, t.dtype, idx, idx + f.numel(), f.numel()))
            idx += f.numel()
            flats.append(f)
        flat = torch.cat(flats)
        keep.append(flat)
        obj = {"flattened_tensor": flat, "metadata": meta}
        for patched in (False, True):
            name = f"{'sglang' if patched else 'plain'}_bucket_{form}.pkl"
            record(name, dump(obj, sglang_patch=patched), [dict(name="flattened_tensor", **describe(flat))],
                   sglang_patch=patched,
                   metadata=[dict(name=m.name, shape=list(m.shape), dtype=str(m.dtype).replace("torch.", ""),
                                  start_idx=m.start_idx, end_idx=m.end_idx, numel=m.numel) for m in meta],
                   values_hex={n: t.contiguous().view(torch.uint8).cpu().numpy().tobytes().hex() for n, t in parts})

    # The empty filler bucket slime sends to ranks with fewer buckets.
    empty = torch.empty(0, dtype=torch.uint8, device=dev)
    keep.append(empty)
    record("sglang_bucket_empty.pkl", dump({"flattened_tensor": empty, "metadata": []}, sglang_patch=True),
           [dict(name="flattened_tensor", **describe(empty))], sglang_patch=True, metadata=[])

    # Many tensors: memo indices past 255 and several frames.
    many = [(f"model.layers.{i}.w", torch.full((i % 7 + 1,), float(i), device=dev, dtype=torch.bfloat16))
            for i in range(300)]
    keep += [t for _, t in many]
    record("plain_many.pkl", dump(many), [dict(name=n, **describe(t)) for n, t in many], sglang_patch=False)

    # Offsets and sizes past 2^31 (LONG1 ints).
    huge = torch.empty((1 << 31) + (1 << 20), dtype=torch.uint8, device=dev)
    tail = huge[(1 << 31) + 4096:].view(torch.bfloat16)[:1000]
    keep += [huge, tail]
    record("plain_large_offset.pkl", dump([("model.tail", tail)]), [dict(name="model.tail", **describe(tail))],
           sglang_patch=False)

    # Where the ref-counter slot sits: the pickled args name a shared-memory file and a slot.
    probe = torch.randn(8, device=dev)
    keep.append(probe)
    fn, args = reductions.reduce_tensor(probe)
    rc_name, rc_slot = args[11], args[12]
    rc_info = {"handle": rc_name.decode() if isinstance(rc_name, bytes) else rc_name, "slot": rc_slot}
    path = "/dev/shm/" + rc_info["handle"].lstrip("/")
    try:
        raw = open(path, "rb").read()
        ints = [int.from_bytes(raw[i:i + 8], "little", signed=True) for i in range(0, min(len(raw), 4096), 8)]
        rc_info["file_bytes"] = len(raw)
        nonzero = [(str(8 * i), v) for i, v in enumerate(ints) if v]
        rc_info["first_nonzero_int64_at_byte"] = dict(nonzero[:4])
    except OSError as e:
        rc_info["error"] = str(e)
    rc_info["event_handle_len"] = len(args[13]) if args[13] is not None else None
    rc_info["event_sync_required"] = args[14]
    expected["ref_counter_probe"] = rc_info

    with open(os.path.join(out_dir, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    print(json.dumps({k: v for k, v in expected.items() if k != "fixtures"}, indent=1))
    print("fixtures:", ", ".join(sorted(expected["fixtures"])))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "ipc_fixtures")
