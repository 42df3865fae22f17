"""A safetensors checkpoint directory read on the trainer's side, in buckets of Tensors.

A fleet update from disk (rlserve.fleet) stages a checkpoint's tensors inside one session on every
engine; the engines' own update_weights_from_disk runs as a session of its own and commits at once,
so it cannot be held back until every engine has the update. Standard library only."""
import json
import os
import struct
from typing import Dict, Iterator, List

from .tensors import Tensor

# safetensors dtype names -> the engine's (PyTorch's) names
DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64", "I8": "int8",
          "U8": "uint8", "I16": "int16", "I32": "int32", "I64": "int64", "BOOL": "bool"}


def files(model_path: str) -> List[str]:
    """The checkpoint's safetensors files: those the index names (in its order), else every
    *.safetensors file of the directory, sorted."""
    index = os.path.join(model_path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            names = list(dict.fromkeys(json.load(f)["weight_map"].values()))
        return [os.path.join(model_path, n) for n in names]
    found = sorted(n for n in os.listdir(model_path) if n.endswith(".safetensors"))
    if not found:
        raise FileNotFoundError(f"{model_path}: no *.safetensors file")
    return [os.path.join(model_path, n) for n in found]


def read_file(path: str) -> Iterator[tuple]:
    """(name, Tensor) of each tensor of one safetensors file, in the file's order."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        entries = sorted(((k, v) for k, v in header.items() if k != "__metadata__"),
                         key=lambda kv: kv[1]["data_offsets"][0])
        for name, meta in entries:
            if meta["dtype"] not in DTYPES:
                raise ValueError(f"{path}: tensor {name!r} has dtype {meta['dtype']}, which no engine "
                                 f"takes (expected one of {', '.join(DTYPES)})")
            begin, end = meta["data_offsets"]
            f.seek(base + begin)
            yield name, Tensor(DTYPES[meta["dtype"]], tuple(meta["shape"]), f.read(end - begin))


def buckets(model_path: str, bucket_bytes: int = 512 << 20) -> Iterator[Dict[str, Tensor]]:
    """The checkpoint's tensors cut in order into buckets of at most `bucket_bytes` (a larger
    tensor goes alone)."""
    current: Dict[str, Tensor] = {}
    size = 0
    for path in files(model_path):
        for name, t in read_file(path):
            if current and size + t.nbytes > bucket_bytes:
                yield current
                current, size = {}, 0
            current[name] = t
            size += t.nbytes
    if current:
        yield current
