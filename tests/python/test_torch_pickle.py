"""`rlserve inspect-ipc` against Python's own pickle machinery, on the PyTorch 2.11 fixtures.

Independent reference: `pickletools` lists every opcode of each fixture (all must be in the
reader's accepted list), and `pickle.Unpickler` with a find_class that hands out inert stand-ins
(nothing of torch or SGLang is imported) recovers the globals and the 15 arguments of every
rebuild call. From those this file computes the device tensors itself (offset = storage offset
bytes + element offset * itemsize, buckets split by start_idx) and compares them with what the
engine's reader prints. Hostile streams must be refused with the global or opcode named.
"""
import base64
import io
import json
import os
import pickle
import pickletools
import sys

sys.path.insert(0, os.path.dirname(__file__))
import rlserve_testlib as t  # noqa: E402

ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1, "uint8": 1,
            "int16": 2, "int32": 4, "int64": 8, "bool": 1}
REBUILDS = {("torch.multiprocessing.reductions", "rebuild_cuda_tensor"),
            ("sglang.srt.utils.patch_torch", "_rebuild_cuda_tensor_modified"),
            ("sglang.srt.patch_torch", "_rebuild_cuda_tensor_modified")}


class Rebuilt:
    """What a rebuild call would have made: just its arguments."""
    def __init__(self, args):
        self.args = args


class Global:
    def __init__(self, module, name):
        self.module, self.name = module, name


class Metadata:  # NEWOBJ + BUILD fill __dict__ with the dataclass fields
    pass


class Recorder(pickle.Unpickler):
    def __init__(self, data):
        super().__init__(io.BytesIO(data))
        self.globals = set()

    def find_class(self, module, name):
        self.globals.add(f"{module}.{name}")
        if (module, name) in REBUILDS:
            return lambda *args: Rebuilt(args)
        if (module, name) == ("torch", "Size"):
            return tuple
        if name == "FlattenedTensorMetadata":
            return Metadata
        return Global(module, name)


def tensor_of(args):
    """The device tensor a Rebuilt stands for, in rlserve's JSON spelling (None: no storage)."""
    (_cls, size, _stride, elem_offset, _scls, dtype, device, handle, storage_bytes, storage_offset,
     _grad, rc_handle, rc_offset, event, sync) = args
    if handle is None or storage_bytes == 0:
        return None
    item = ITEMSIZE[dtype.name]
    numel = 1
    for d in size:
        numel *= d
    out = {"dtype": dtype.name, "shape": list(size), "offset": storage_offset + elem_offset * item,
           "nbytes": numel * item, "ipc_handle": handle.hex(), "pointer": 0,
           "ref_counter_handle": rc_handle.decode() if rc_handle else "",
           "ref_counter_offset": rc_offset if rc_handle else 0,
           "event_handle": event.hex() if event else "", "event_sync_required": bool(sync)}
    if isinstance(device, str):
        out.update(device=0, device_uuid="GPU-" + device.lower())
    else:
        out.update(device=device, device_uuid="")
    return out


def reference(obj, bucket):
    if not bucket:
        result = []
        for name, rebuilt in obj:
            tensor = tensor_of(rebuilt.args)
            if tensor is not None:
                result.append(dict(name=name, **tensor))
        return result
    flat = tensor_of(obj["flattened_tensor"].args)
    if flat is None:
        return []
    flat_item = ITEMSIZE[flat["dtype"]]
    result = []
    for i, m in enumerate(obj["metadata"]):
        numel = 1
        for d in m.shape:
            numel *= d
        entry = dict(flat, name=m.name, dtype=m.dtype.name, shape=list(m.shape),
                     offset=flat["offset"] + m.start_idx * flat_item, nbytes=numel * ITEMSIZE[m.dtype.name])
        if i > 0:  # the one decrement rides on the first tensor
            entry.update(ref_counter_handle="", ref_counter_offset=0)
        result.append(entry)
    return result


def refused(tmp, data, *needles, load_format="direct"):
    path = os.path.join(tmp, "hostile.pkl")
    with open(path, "wb") as f:
        f.write(data)
    proc = t.run("inspect-ipc", path, "--load-format", load_format, check=False)
    t.check(proc.returncode != 0, f"accepted a hostile stream: {proc.stdout}")
    for needle in needles:
        t.check(needle in proc.stderr, f"{needle!r} not in: {proc.stderr}")


def main():
    fixtures = os.path.join(os.environ.get("RLSERVE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                            "tests", "data", "torch_ipc")
    accepted = json.loads(t.run("inspect-ipc").stdout)
    opcodes, globals_ = set(accepted["opcodes"]), set(accepted["globals"])
    names = sorted(f for f in os.listdir(fixtures) if f.endswith(".pkl"))
    t.check(len(names) == 10, names)
    seen_ops = set()
    for name in names:
        path = os.path.join(fixtures, name)
        data = open(path, "rb").read()
        ops = {op.name for op, _arg, _pos in pickletools.genops(data)}
        seen_ops |= ops
        t.check(ops <= opcodes, f"{name}: opcodes the reader refuses: {sorted(ops - opcodes)}")
        rec = Recorder(data)
        obj = rec.load()
        t.check(rec.globals <= globals_, f"{name}: globals the reader refuses: {sorted(rec.globals - globals_)}")
        bucket = "bucket" in name
        want = reference(obj, bucket)
        fmt = "flattened_bucket" if bucket else "direct"
        got = json.loads(t.run("inspect-ipc", path, "--load-format", fmt).stdout)["device_tensors"]
        t.check(len(got) == len(want), f"{name}: {len(got)} tensors, the reference has {len(want)}")
        for g, w in zip(got, want):
            t.check(g == w, f"{name}: {g['name']}:\n engine    {g}\n reference {w}")
        # The same bytes as base64 text, as they arrive in serialized_named_tensors.
        with t.temp_dir() as tmp:
            b64 = os.path.join(tmp, "x.b64")
            with open(b64, "w") as f:
                f.write(base64.b64encode(data).decode())
            again = json.loads(t.run("inspect-ipc", b64, "--base64", "--load-format", fmt).stdout)
            t.check(again["device_tensors"] == got, f"{name}: base64 form differs")
    # The fixtures exercise what a big payload needs: memo past 255, several frames, wide ints.
    for op in ("LONG_BINGET", "FRAME", "LONG1", "NEWOBJ", "BUILD", "STACK_GLOBAL"):
        t.check(op in seen_ops, f"no fixture uses {op}")

    with t.temp_dir() as tmp:
        refused(tmp, b"cos\nsystem\n(S'ls'\ntR.", "global os.system (GLOBAL) is not allowed")
        refused(tmp, pickle.dumps(eval, protocol=4), "global builtins.eval (STACK_GLOBAL) is not allowed")
        refused(tmp, pickle.dumps(os.system, protocol=2), "global posix.system (GLOBAL) is not allowed")
        refused(tmp, pickle.dumps([("w", 1.5)], protocol=4), "opcode BINFLOAT")
        refused(tmp, pickle.dumps([("w", bytearray(b"x"))], protocol=5), "opcode BYTEARRAY8")
        refused(tmp, pickle.dumps({"flattened_tensor": None, "metadata": []}, protocol=4),
                "flattened_tensor is None; expected a CUDA tensor", load_format="flattened_bucket")
        plain = open(os.path.join(fixtures, "plain_list.pkl"), "rb").read()
        refused(tmp, plain[:-1], "the pickle ends without STOP")
        refused(tmp, plain, "expected a dict", load_format="flattened_bucket")
    print("ok: inspect-ipc matches pickle's own reading of", len(names), "fixtures")


if __name__ == "__main__":
    main()
