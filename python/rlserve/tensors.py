"""What a tensor travels as: a dtype name (PyTorch's: "bfloat16", "float32", ...), a shape and
its raw little-endian bytes in row-major order — the engine's load format for that name."""
from dataclasses import dataclass
from typing import Sequence, Tuple

# dtype name -> bytes per element
ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1, "uint8": 1,
                 "int16": 2, "int32": 4, "int64": 8, "bool": 1}


@dataclass(frozen=True)
class Tensor:
    dtype: str
    shape: Tuple[int, ...]
    data: bytes

    def __post_init__(self):
        if self.dtype not in ELEMENT_BYTES:
            raise ValueError(f"dtype {self.dtype!r}: expected one of {', '.join(ELEMENT_BYTES)}")
        numel = 1
        for d in self.shape:
            if d < 0:
                raise ValueError(f"shape {self.shape}: negative dimension")
            numel *= d
        if numel * ELEMENT_BYTES[self.dtype] != len(self.data):
            raise ValueError(f"shape {list(self.shape)} of {self.dtype} is {numel * ELEMENT_BYTES[self.dtype]} "
                             f"bytes, got {len(self.data)}")

    @property
    def nbytes(self):
        return len(self.data)


def tensor_from_bytes(dtype: str, shape: Sequence[int], data: bytes) -> Tensor:
    return Tensor(dtype, tuple(int(d) for d in shape), bytes(data))


def bfloat16_bits(array):
    """NumPy values -> their bfloat16 bit patterns (uint16, same shape): round to nearest even,
    NaN kept a quiet NaN, as the engine's and PyTorch's conversions do."""
    import numpy as np
    words = np.asarray(array).astype("<f4")
    w = words.view("<u4").astype(np.uint64)
    bits = ((w + 0x7FFF + ((w >> 16) & 1)) >> 16).astype(np.uint16)
    u = words.view("<u4")
    nan = ((u & 0x7F800000) == 0x7F800000) & ((u & 0x007FFFFF) != 0)
    bits[nan] = ((u[nan] >> 16) | 0x0040).astype(np.uint16)
    return bits


def tensor_from_array(array, dtype: str = None) -> Tensor:
    """A NumPy array or a PyTorch tensor (any device) as a Tensor of `dtype` (default: its own).
    float32 -> "bfloat16" rounds to nearest even, as torch.Tensor.to(torch.bfloat16) does."""
    mod = type(array).__module__
    if mod.startswith("torch"):
        import torch
        t = array.detach().to("cpu").contiguous()
        name = str(t.dtype).replace("torch.", "")
        if dtype is not None and dtype != name:
            t = t.to(getattr(torch, dtype))
            name = dtype
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return Tensor(name, tuple(t.shape), raw)
    import numpy as np
    a = np.ascontiguousarray(array)
    if dtype in (None, str(a.dtype)):
        name = str(a.dtype)
        if name not in ELEMENT_BYTES:
            raise ValueError(f"numpy dtype {name} has no engine dtype; pass dtype=")
        return Tensor(name, tuple(a.shape), a.astype(a.dtype.newbyteorder("<")).tobytes())
    if dtype == "bfloat16":
        return Tensor("bfloat16", tuple(a.shape), bfloat16_bits(a).astype("<u2").tobytes())
    return Tensor(dtype, tuple(a.shape), a.astype(np.dtype(dtype).newbyteorder("<")).tobytes())

