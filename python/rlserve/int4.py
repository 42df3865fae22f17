"""INT4 (W4A16) modules as the engine stores them (docs/formats.md: compressed-tensors
`pack-quantized`), from a trainer's float weight — to predict the checksums an INT4 engine reports
after it quantizes a BF16 update with its recipe. Needs NumPy.

Recipes per group of G input elements (float32 arithmetic, round half to even):
  int4-asym     scale = max((max(x,0) - min(x,0)) / 15, 1e-5), zero = clip(rint(-min/scale), 0, 15),
                code = clip(rint(x / scale) + zero, 0, 15)
  int4-sym-qat  scale = max(amax / 7, 1e-5), code = clip(rint(x / scale), -7, 7) + 8
  int4-sym      scale = max(amax / 7.5, 1e-5), code = clip(rint(x / scale), -8, 7) + 8
The input is what the engine quantizes: the weight rounded to bfloat16 first.

A PyTorch weight is quantized with PyTorch on its own device (fast on a GPU: a trainer can check
every step's checksums), anything else with NumPy; both follow the recipe above operation by
operation (IEEE float32 division, round half to even), so they give the same bytes."""
from typing import Dict

from .tensors import Tensor, bfloat16_bits, tensor_from_array

RECIPES = ("int4-asym", "int4-sym-qat", "int4-sym")


def _pack8(np, nibbles):
    v = nibbles.astype(np.uint32).reshape(*nibbles.shape[:-1], -1, 8)
    word = np.zeros(v.shape[:-1], dtype=np.uint32)
    for i in range(8):
        word |= v[..., i] << np.uint32(4 * i)
    return word.view(np.int32)


def quantize_module(weight, recipe: str = "int4-asym", group_size: int = 128,
                    zero_point_layout: str = "standard") -> Dict[str, Tensor]:
    """The load-format tensors of one INT4 Linear whose float weight is `weight` [n, k] (NumPy or
    PyTorch): suffix ("weight_packed", "weight_scale", "weight_shape", and "weight_zero_point"
    when asymmetric) -> Tensor. Prefix the names with the module's ("...down_proj.")."""
    if recipe not in RECIPES:
        raise ValueError(f"recipe {recipe!r}: expected one of {', '.join(RECIPES)}")
    if zero_point_layout not in ("standard", "miles"):
        raise ValueError(f"zero_point_layout {zero_point_layout!r}: expected standard or miles")
    is_torch = type(weight).__module__.startswith("torch")
    if not is_torch:
        import numpy as np
        weight = np.asarray(weight, dtype=np.float32)
    shape = tuple(weight.shape)
    if len(shape) != 2:
        raise ValueError(f"a Linear weight is [n, k], got shape {list(shape)}")
    n, k = shape
    g = k if group_size == -1 else group_size
    if g <= 0 or k % g or n % 8 or k % 8:
        raise ValueError(f"shape [{n}, {k}] with group size {group_size}: k must be a multiple of the "
                         "group size, and n and k of 8")
    if is_torch:
        return _quantize_torch(weight, recipe, g, zero_point_layout)
    w = weight
    x = (bfloat16_bits(w).astype(np.uint32) << 16).view(np.float32).reshape(n, k // g, g)
    f32 = np.float32
    if recipe == "int4-asym":
        lo = np.minimum(x.min(axis=-1), f32(0))
        hi = np.maximum(x.max(axis=-1), f32(0))
        scale = np.maximum((hi - lo) / f32(15), f32(1e-5)).astype(f32)
        zero = np.clip(np.rint(-lo / scale), 0, 15).astype(np.int32)
        codes = np.clip(np.rint(x / scale[..., None]).astype(np.int64) + zero[..., None], 0, 15)
    else:
        amax = np.abs(x).max(axis=-1)
        div = f32(7) if recipe == "int4-sym-qat" else f32(7.5)
        scale = np.maximum(amax / div, f32(1e-5)).astype(f32)
        low = -7 if recipe == "int4-sym-qat" else -8
        codes = np.clip(np.rint(x / scale[..., None]).astype(np.int64), low, 7) + 8
        zero = None
    out = {
        "weight_packed": tensor_from_array(_pack8(np, codes.reshape(n, k).astype(np.uint8))),
        "weight_scale": tensor_from_array(scale, "bfloat16"),
        "weight_shape": tensor_from_array(np.array([n, k], dtype=np.int64)),
    }
    if zero is not None:
        if zero_point_layout == "standard":  # [n/8, groups]: packed along n
            packed = np.swapaxes(_pack8(np, np.swapaxes(zero, 0, 1)), 0, 1)
        else:                                # miles: [groups, n/8], AWQ order within each word
            t = np.swapaxes(zero, 0, 1).reshape(k // g, n // 8, 8)[..., [0, 2, 4, 6, 1, 3, 5, 7]]
            packed = _pack8(np, t.reshape(k // g, n))
        out["weight_zero_point"] = tensor_from_array(np.ascontiguousarray(packed))
    return out


def _pack8_torch(torch, nibbles):
    """Eight 4-bit codes along the last axis -> one int32 (the first code in the low bits)."""
    v = nibbles.to(torch.int64).reshape(*nibbles.shape[:-1], -1, 8)
    shifts = torch.arange(0, 32, 4, device=v.device, dtype=torch.int64)
    word = (v << shifts).sum(-1)
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def _quantize_torch(weight, recipe, g, zero_point_layout):
    import torch
    x = weight.detach().to(torch.bfloat16).to(torch.float32)
    n, k = x.shape
    x = x.reshape(n, k // g, g)
    zero = None
    if recipe == "int4-asym":
        lo = torch.clamp(x.amin(-1), max=0.0)
        hi = torch.clamp(x.amax(-1), min=0.0)
        # A divisor given as a Python number makes PyTorch's CUDA kernel multiply by its
        # reciprocal, which is not IEEE division: a scale one ulp off changes codes and zeros.
        # Dividing by a tensor divides.
        scale = torch.clamp((hi - lo) / torch.full_like(hi, 15.0), min=1e-5)
        zero = torch.clamp(torch.round(-lo / scale), 0, 15).to(torch.int64)
        codes = torch.clamp(torch.round(x / scale[..., None]).to(torch.int64) + zero[..., None], 0, 15)
    else:
        div = 7.0 if recipe == "int4-sym-qat" else 7.5
        amax = x.abs().amax(-1)
        scale = torch.clamp(amax / torch.full_like(amax, div), min=1e-5)
        low = -7 if recipe == "int4-sym-qat" else -8
        codes = torch.clamp(torch.round(x / scale[..., None]).to(torch.int64), low, 7) + 8
    out = {
        "weight_packed": tensor_from_array(_pack8_torch(torch, codes.reshape(n, k))),
        "weight_scale": tensor_from_array(scale.to(torch.bfloat16)),
        "weight_shape": tensor_from_array(torch.tensor([n, k], dtype=torch.int64)),
    }
    if zero is not None:
        if zero_point_layout == "standard":
            packed = _pack8_torch(torch, zero.T.contiguous()).T.contiguous()
        else:
            t = zero.T.reshape(k // g, n // 8, 8)[..., [0, 2, 4, 6, 1, 3, 5, 7]]
            packed = _pack8_torch(torch, t.reshape(k // g, n))
        out["weight_zero_point"] = tensor_from_array(packed.contiguous())
    return out
