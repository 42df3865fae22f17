"""INT4 formats: the engine against an independent numpy implementation, byte for byte.

Written from the specifications (docs/formats.md, compressed-tensors `pack-quantized`, the miles
AWQ-order zero points, Marlin's published packer in IST-DASLab/marlin `marlin/__init__.py`), not
from the C++: the recipes are vectorized float32 numpy (IEEE division, np.rint = half to even),
packing is shifts and sums over reshaped arrays, the serving layout is Marlin's tile/permute/
interleave pipeline. The engine runs through the hidden `rlserve int4` command.

Checked: every recipe x group size (32, 64, 128, per-channel) x zero-point layout, single matrices
and expert batches; the fused BF16 -> serving path; restore(repack(x)) == x on numpy-written
tensors; both reference dequantizers against numpy's; and the error paths (NaN/Inf naming the
tensor and element, group size 48, k % G, a square zero-point shape without a layout hint).
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rlserve_testlib import check, run, temp_dir  # noqa: E402

F32 = np.float32
AWQ_ORDER = np.array([0, 2, 4, 6, 1, 3, 5, 7])  # slot s holds element AWQ_ORDER[s]


# ---- bf16 ------------------------------------------------------------------------------------------

def to_bf16_bits(x):
    """float32 -> bf16 bits, round to nearest even (no NaN in the test data)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# ---- recipes (per group of G along k; x: float32 [..., groups, G]) -------------------------------

def quantize_groups(x, recipe):
    """Returns (codes uint8 [..., groups, G] stored nibbles, scale float32 [..., groups], zero [..., groups])."""
    if recipe == "int4-asym":
        lo = np.minimum(x.min(axis=-1), F32(0))
        hi = np.maximum(x.max(axis=-1), F32(0))
        scale = np.maximum((hi - lo) / F32(15), F32(1e-5)).astype(F32)
        zero = np.clip(np.rint(-lo / scale), 0, 15).astype(np.int32)
        q = np.rint(x / scale[..., None]).astype(np.int64) + zero[..., None]
        codes = np.clip(q, 0, 15)
    else:
        amax = np.abs(x).max(axis=-1)
        div = F32(7) if recipe == "int4-sym-qat" else F32(7.5)
        scale = np.maximum(amax / div, F32(1e-5)).astype(F32)
        lo = -7 if recipe == "int4-sym-qat" else -8
        codes = np.clip(np.rint(x / scale[..., None]).astype(np.int64), lo, 7) + 8
        zero = np.full(scale.shape, 8, dtype=np.int32)
    return codes.astype(np.uint8), scale, zero


def quantize(w_bits, recipe, group_size):
    """w_bits: uint16 [E, n, k]. Returns codes [E, n, k], scale bf16 bits [E, n, groups], zero [E, n, groups]."""
    e, n, k = w_bits.shape
    g = k if group_size == -1 else group_size
    x = from_bf16_bits(w_bits).reshape(e, n, k // g, g)
    codes, scale, zero = quantize_groups(x, recipe)
    return codes.reshape(e, n, k), to_bf16_bits(scale), zero


# ---- compressed-tensors packing --------------------------------------------------------------------

def pack8(nibbles):
    """[..., 8m] codes -> [..., m] int32, element i of each run of 8 in bits 4i..4i+3."""
    v = nibbles.astype(np.uint32).reshape(*nibbles.shape[:-1], -1, 8)
    word = np.zeros(v.shape[:-1], dtype=np.uint32)
    for i in range(8):
        word |= v[..., i] << np.uint32(4 * i)
    return word.view(np.int32)


def pack_zero_points(zero, layout):
    """zero [E, n, groups] -> standard [E, n/8, groups] or miles [E, groups, n/8]."""
    if layout == "standard":
        t = np.swapaxes(zero, 1, 2)          # [E, groups, n]: pack along n
        return np.swapaxes(pack8(t), 1, 2)   # [E, n/8, groups]
    t = np.swapaxes(zero, 1, 2)              # [E, groups, n]
    e, groups, n = t.shape
    t = t.reshape(e, groups, n // 8, 8)[..., AWQ_ORDER].reshape(e, groups, n)
    return pack8(t)                          # [E, groups, n/8]


# ---- Marlin serving layout (IST-DASLab/marlin `_get_perms`, `Layer.pack`; vLLM marlin_zero_points)

def marlin_perms():
    perm = []
    for i in range(32):
        perm1 = []
        col = i // 4
        for block in [0, 1]:
            for row in [2 * (i % 4), 2 * (i % 4) + 1, 2 * (i % 4 + 4), 2 * (i % 4 + 4) + 1]:
                perm1.append(16 * row + col + 8 * block)
        for j in range(4):
            perm.extend([p + 256 * j for p in perm1])
    perm = np.array(perm).reshape(-1, 8)[:, AWQ_ORDER].ravel()
    scale_perm = [i + 8 * j for i in range(8) for j in range(8)]
    scale_perm_single = [2 * i + j for i in range(4) for j in [0, 1, 8, 9, 16, 17, 24, 25]]
    return perm, np.array(scale_perm), np.array(scale_perm_single)


PERM, SCALE_PERM, SCALE_PERM_SINGLE = marlin_perms()


def marlin_weight(codes_nk):
    """codes [n, k] (HF orientation) -> int32 [k/16, 2n]."""
    w = codes_nk.T.astype(np.uint32)  # [k, n]
    k, n = w.shape
    w = w.reshape(k // 16, 16, n // 16, 16).transpose(0, 2, 1, 3).reshape(k // 16, n * 16)
    w = w.reshape(-1, PERM.size)[:, PERM].reshape(k // 16, n * 16)
    q = np.zeros((k // 16, n * 2), dtype=np.uint32)
    for i in range(8):
        q |= w[:, i::8] << np.uint32(4 * i)
    return q.view(np.int32)


def marlin_scales(scale_ng, groups):
    """scale bits [n, groups] -> [groups, n], permuted (single permutation when groups == 1)."""
    s = scale_ng.T.copy()
    perm = SCALE_PERM if groups > 1 else SCALE_PERM_SINGLE
    return s.reshape(-1, perm.size)[:, perm].reshape(s.shape)


def marlin_zero_points(zero_ng):
    """zero [n, groups] -> int32 [groups, n/8]."""
    z = zero_ng.T.copy()
    groups, n = z.shape
    z = z.reshape(-1, SCALE_PERM.size)[:, SCALE_PERM]
    z = z.reshape(-1, 8)[:, AWQ_ORDER].reshape(groups, n)
    return pack8(z)


def serving(codes, scale, zero, asym):
    e = codes.shape[0]
    groups = scale.shape[-1]
    sw = np.stack([marlin_weight(codes[i]) for i in range(e)])
    ss = np.stack([marlin_scales(scale[i], groups) for i in range(e)])
    sz = np.stack([marlin_zero_points(zero[i]) for i in range(e)]) if asym else None
    return sw, ss, sz


def dequant(codes, scale_bits, zero, group_size):
    """bf16_rn((q - z) * scale) as bf16 bits [E, n, k]."""
    e, n, k = codes.shape
    g = k if group_size == -1 else group_size
    s = np.repeat(from_bf16_bits(scale_bits), g, axis=-1)
    z = np.repeat(zero, g, axis=-1)
    return to_bf16_bits((codes.astype(np.int32) - z).astype(F32) * s)


# ---- test data -----------------------------------------------------------------------------------

def weights(rng, e, n, k, group_size):
    """Gaussian weights with adversarial groups mixed in: ties, all-zero, constants, one-signed."""
    x = (0.02 * rng.standard_normal((e, n, k))).astype(F32)
    g = k if group_size == -1 else group_size
    v = x.reshape(e, n, k // g, g)
    kinds = rng.integers(0, 7, size=v.shape[:3])
    v[kinds == 1] = 0
    v[kinds == 2] = F32(0.375)
    v[kinds == 3] = F32(-0.375)
    v[kinds == 4] = np.abs(v[kinds == 4]) + F32(0.01)
    ties = (rng.integers(-7, 8, size=v[kinds == 5].shape) + 0.5).astype(F32)  # x.5 steps
    ties[:, 0], ties[:, 1] = F32(7.5), F32(-7.5)
    v[kinds == 5] = ties
    return to_bf16_bits(v.reshape(e, n, k))


def save(path, array):
    np.save(path, np.ascontiguousarray(array), allow_pickle=False)  # C order: the engine reads no other


def load(d, name):
    return np.load(os.path.join(d, name), allow_pickle=False)


def same_bytes(got, want, what):
    check(got.dtype.itemsize == want.dtype.itemsize and got.shape == want.shape,
          f"{what}: got {got.dtype}{got.shape}, want {want.dtype}{want.shape}")
    g, w = np.ascontiguousarray(got).view(np.uint8), np.ascontiguousarray(want).view(np.uint8)
    if not np.array_equal(g, w):
        bad = np.flatnonzero(g.ravel() != w.ravel())
        raise AssertionError(f"{what}: {bad.size} of {g.size} bytes differ, first at byte {bad[0]}")


# ---- tests ---------------------------------------------------------------------------------------

def test_quantize_matches_numpy(work):
    rng = np.random.default_rng(1234)
    cases = 0
    for recipe in ["int4-sym-qat", "int4-sym", "int4-asym"]:
        for group_size in [32, 64, 128, -1]:
            layouts = ["standard", "miles"] if recipe == "int4-asym" else ["standard"]
            for layout in layouts:
                for e, n, k in [(1, 64, 256), (2, 128, 384)]:
                    w = weights(rng, e, n, k, group_size)
                    src = os.path.join(work, f"w_{cases}.npy")
                    save(src, w if e > 1 else w[0])
                    out = os.path.join(work, f"q_{cases}")
                    run("int4", "quantize", "--in", src, "--recipe", recipe, "--group-size", group_size,
                        "--zp-layout", layout, "--serving", "--out", out)
                    codes, scale, zero = quantize(w, recipe, group_size)
                    asym = recipe == "int4-asym"
                    squeeze = (lambda a: a) if e > 1 else (lambda a: a[0])
                    tag = f"{recipe} g{group_size} {layout} {e}x{n}x{k}"
                    same_bytes(load(out, "weight_packed.npy"), squeeze(pack8(codes)), "weight_packed " + tag)
                    same_bytes(load(out, "weight_scale.npy"), squeeze(scale), "weight_scale " + tag)
                    same_bytes(load(out, "weight_shape.npy"), np.array([n, k], dtype=np.int64), "weight_shape")
                    if asym:
                        same_bytes(load(out, "weight_zero_point.npy"), squeeze(pack_zero_points(zero, layout)),
                                   "weight_zero_point " + tag)
                    else:
                        check(not os.path.exists(os.path.join(out, "weight_zero_point.npy")),
                              "symmetric output has no zero points")
                    sw, ss, sz = serving(codes, scale, zero, asym)
                    same_bytes(load(out, "serving_weight.npy"), squeeze(sw), "serving_weight " + tag)
                    same_bytes(load(out, "serving_scale.npy"), squeeze(ss), "serving_scale " + tag)
                    if asym:
                        same_bytes(load(out, "serving_zero_point.npy"), squeeze(sz), "serving_zero_point " + tag)
                    check(np.count_nonzero(sw) > 0, "non-trivial serving weights")
                    cases += 1
    check(cases == 2 * (4 + 4 + 8), f"ran {cases} cases")


def test_roundtrip_of_numpy_written_tensors(work):
    """numpy packs (both zero-point layouts, float16 scales too); the engine repacks and restores."""
    rng = np.random.default_rng(99)
    for group_size, layout, e in [(128, "standard", 1), (32, "miles", 2), (64, "miles", 1), (-1, "standard", 2),
                                  (128, "sym", 1)]:
        n, k = 128, 256
        asym = layout != "sym"
        w = weights(rng, e, n, k, group_size)
        codes, scale, zero = quantize(w, "int4-asym" if asym else "int4-sym", group_size)
        d = os.path.join(work, f"rt_{group_size}_{layout}_{e}")
        os.makedirs(d)
        squeeze = (lambda a: a) if e > 1 else (lambda a: a[0])
        save(os.path.join(d, "weight_packed.npy"), squeeze(pack8(codes)))
        save(os.path.join(d, "weight_scale.npy"), squeeze(scale))
        save(os.path.join(d, "weight_shape.npy"), np.array([n, k], dtype=np.int64))
        if asym:
            save(os.path.join(d, "weight_zero_point.npy"), squeeze(pack_zero_points(zero, layout)))
        out = d + "_out"
        res = run("int4", "roundtrip", "--in", d, "--group-size", group_size, "--out", out)
        check(f'"zero_point_layout": "{layout if asym else "none"}"' in res.stdout, res.stdout)
        for name in ["weight_packed.npy", "weight_scale.npy", "weight_shape.npy"] + (
                ["weight_zero_point.npy"] if asym else []):
            same_bytes(load(out, name), load(d, name), f"restored {name} g{group_size} {layout}")
        sw, ss, sz = serving(codes, scale, zero, asym)
        same_bytes(load(out, "serving_weight.npy"), squeeze(sw), "serving_weight")
        same_bytes(load(out, "serving_scale.npy"), squeeze(ss), "serving_scale")
        if asym:
            same_bytes(load(out, "serving_zero_point.npy"), squeeze(sz), "serving_zero_point")
        want = squeeze(dequant(codes, scale, zero, group_size))
        same_bytes(load(out, "dequant_load.npy"), want, "dequant of the load format")
        same_bytes(load(out, "dequant_serving.npy"), want, "dequant of the serving layout")
        check(np.count_nonzero(want) > 0, "non-zero dequant")

    # float16 scales (an f16 checkpoint): the 16-bit words move unchanged; dequant reads them as f16.
    n, k, g = 64, 128, 64
    codes = rng.integers(0, 16, size=(1, n, k)).astype(np.uint8)
    zero = rng.integers(0, 16, size=(1, n, k // g)).astype(np.int32)
    scale16 = (0.001 + 0.01 * rng.random((n, k // g))).astype(np.float16)
    d = os.path.join(work, "rt_f16")
    os.makedirs(d)
    save(os.path.join(d, "weight_packed.npy"), pack8(codes)[0])
    save(os.path.join(d, "weight_scale.npy"), scale16)
    save(os.path.join(d, "weight_shape.npy"), np.array([n, k], dtype=np.int32))
    save(os.path.join(d, "weight_zero_point.npy"), pack_zero_points(zero, "standard")[0])
    run("int4", "roundtrip", "--in", d, "--group-size", g, "--out", d + "_out")
    same_bytes(load(d + "_out", "weight_scale.npy"), scale16, "f16 scales restored")
    s = np.repeat(scale16.astype(F32), g, axis=-1)
    want = to_bf16_bits((codes[0].astype(np.int32) - np.repeat(zero[0], g, axis=-1)).astype(F32) * s)
    same_bytes(load(d + "_out", "dequant_serving.npy"), want, "f16 dequant")


def test_errors_name_the_tensor(work):
    rng = np.random.default_rng(5)
    w = weights(rng, 1, 64, 256, 128)[0]
    for bits, word in [(0x7FC0, "NaN"), (0x7F80, "+Inf"), (0xFF80, "-Inf")]:
        bad = w.copy()
        bad[3, 17] = bits
        src = os.path.join(work, f"bad_{word}.npy")
        save(src, bad)
        res = run("int4", "quantize", "--in", src, "--name", "model.layers.0.mlp.experts.3.up_proj.weight",
                  "--out", os.path.join(work, "never"), check=False)
        check(res.returncode == 1, f"exit code {res.returncode}")
        want = f"model.layers.0.mlp.experts.3.up_proj.weight: element [3, 17] is {word}"
        check(want in res.stderr, res.stderr)
    src = os.path.join(work, "good.npy")
    save(src, w)
    res = run("int4", "quantize", "--in", src, "--group-size", 48, "--out", os.path.join(work, "x"), check=False)
    check(res.returncode == 1 and "group size 48 is not supported" in res.stderr, res.stderr)
    res = run("int4", "quantize", "--in", src, "--group-size", 0, "--out", os.path.join(work, "x"), check=False)
    check(res.returncode == 1 and "group size 0 is not supported" in res.stderr, res.stderr)
    odd = os.path.join(work, "odd.npy")
    save(odd, w[:, :96])
    res = run("int4", "quantize", "--in", odd, "--group-size", 64, "--out", os.path.join(work, "x"), check=False)
    check(res.returncode == 1 and "k (input features) = 96 is not a multiple of the group size 64" in res.stderr,
          res.stderr)
    res = run("int4", "quantize", "--in", src, "--serving", "--out", os.path.join(work, "x"), check=False)
    check(res.returncode == 0, res.stderr)  # 64 x 256 fits the tiles
    narrow = os.path.join(work, "narrow.npy")
    save(narrow, weights(rng, 1, 96, 128, 32)[0])
    res = run("int4", "quantize", "--in", narrow, "--group-size", 32, "--serving", "--out", os.path.join(work, "y"),
              check=False)
    check(res.returncode == 1 and "n (output features) = 96 is not a multiple of 64" in res.stderr, res.stderr)

    # Square zero points (n/8 == k/G): the layout must be named.
    sq = os.path.join(work, "square.npy")
    save(sq, weights(rng, 1, 64, 256, 32)[0])
    qdir = os.path.join(work, "square_q")
    run("int4", "quantize", "--in", sq, "--group-size", 32, "--zp-layout", "miles", "--out", qdir)
    res = run("int4", "roundtrip", "--in", qdir, "--group-size", 32, "--out", qdir + "_a", check=False)
    check(res.returncode == 1 and "the zero-point layout must be given explicitly" in res.stderr, res.stderr)
    res = run("int4", "roundtrip", "--in", qdir, "--group-size", 32, "--zp-layout", "miles", "--out", qdir + "_b")
    check('"zero_point_layout": "miles"' in res.stdout, res.stdout)
    same_bytes(load(qdir + "_b", "weight_zero_point.npy"), load(qdir, "weight_zero_point.npy"), "square restore")
    # A configured group size that does not match the scales.
    res = run("int4", "roundtrip", "--in", qdir, "--group-size", 64, "--zp-layout", "miles", "--out", qdir + "_c",
              check=False)
    check(res.returncode == 1 and "weight_scale has shape [64, 8]" in res.stderr, res.stderr)


# ---- rlserve quantize: a whole checkpoint (safetensors read and written by hand) -----------------

ST_DTYPES = {"BF16": np.uint16, "F32": np.float32, "I32": np.int32, "I64": np.int64, "F16": np.float16}


def write_safetensors(path, tensors):
    """tensors: {name: (dtype name, numpy array)}; bf16 arrays are uint16 bits."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        dt, arr = tensors[name]
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    body = data[8 + n:]
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        out[name] = (e["dtype"], np.frombuffer(body[b:end], dtype=ST_DTYPES[e["dtype"]]).reshape(e["shape"]))
    return out, meta


def make_moe_checkpoint(d, rng, nan_in=None):
    os.makedirs(d, exist_ok=True)
    h, inter, experts, vocab = 128, 64, 2, 256

    def bf16(*shape):
        return ("BF16", to_bf16_bits((0.05 * rng.standard_normal(shape)).astype(F32)))

    t = {
        "model.embed_tokens.weight": bf16(vocab, h),
        "lm_head.weight": bf16(vocab, h),
        "model.norm.weight": ("F32", np.ones(h, dtype=F32)),
        "model.layers.0.input_layernorm.weight": bf16(h),
        "model.layers.0.self_attn.q_proj.weight": bf16(h, h),
        "model.layers.0.self_attn.q_norm.weight": bf16(16),
        "model.layers.0.mlp.gate.weight": bf16(experts, h),
        "model.layers.0.mlp.shared_expert_gate.weight": bf16(1, h),
    }
    for e in range(experts):
        p = f"model.layers.0.mlp.experts.{e}."
        t[p + "gate_proj.weight"] = bf16(inter, h)
        t[p + "up_proj.weight"] = bf16(inter, h)
        t[p + "down_proj.weight"] = bf16(h, inter)
    if nan_in:
        arr = t[nan_in][1].copy()
        arr[5, 7] = 0x7FC0
        t[nan_in] = ("BF16", arr)
    write_safetensors(os.path.join(d, "model.safetensors"), t)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": h,
                   "num_experts": experts, "moe_intermediate_size": inter, "torch_dtype": "bfloat16"}, f)
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        f.write('{"version": "1.0"}')
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        f.write('{"eos_token_id": 1}')
    return t


def test_quantize_checkpoint(work):
    rng = np.random.default_rng(77)
    src = os.path.join(work, "moe_bf16")
    t = make_moe_checkpoint(src, rng)
    experts = sorted(n for n in t if ".mlp.experts." in n)
    for recipe, group_size, targets, layout in [("int4-asym", 32, "experts", "standard"),
                                                ("int4-asym", 64, "linear", "miles"),
                                                ("int4-sym-qat", -1, "experts", "standard"),
                                                ("int4-sym", 32, "linear", "standard")]:
        out = os.path.join(work, f"moe_{recipe}_{group_size}_{targets}_{layout}")
        res = run("quantize", "--model", src, "--out", out, "--recipe", recipe, "--group-size", group_size,
                  "--targets", targets, "--zp-layout", layout)
        check("quantize: " in res.stderr, "progress lines on stderr: " + res.stderr)
        got, meta = read_safetensors(os.path.join(out, "model.safetensors"))
        check(meta.get("format") == "pt", f"metadata {meta}")
        quantized = experts + (["model.layers.0.self_attn.q_proj.weight"] if targets == "linear" else [])
        asym = recipe == "int4-asym"
        for name in quantized:
            prefix = name[:-len(".weight")]
            check(name not in got, f"{name} replaced by its packed form")
            codes, scale, zero = quantize(t[name][1][None], recipe, group_size)
            n, k = t[name][1].shape
            same_bytes(got[prefix + ".weight_packed"][1], pack8(codes)[0], f"{prefix}.weight_packed")
            check(got[prefix + ".weight_scale"][0] == "BF16", "scales are BF16")
            same_bytes(got[prefix + ".weight_scale"][1], scale[0], f"{prefix}.weight_scale")
            same_bytes(got[prefix + ".weight_shape"][1], np.array([n, k], dtype=np.int64), f"{prefix}.weight_shape")
            if asym:
                same_bytes(got[prefix + ".weight_zero_point"][1], pack_zero_points(zero, layout)[0],
                           f"{prefix}.weight_zero_point")
            else:
                check(prefix + ".weight_zero_point" not in got, "no zero points when symmetric")
        for name, (dt, arr) in t.items():
            if name not in quantized:
                check(got[name][0] == dt, f"{name} keeps its dtype")
                same_bytes(got[name][1], arr, f"{name} copied unchanged")
        with open(os.path.join(out, "config.json")) as f:
            cfg = json.load(f)
        qc = cfg["quantization_config"]
        w = qc["config_groups"]["group_0"]["weights"]
        check(qc["quant_method"] == "compressed-tensors" and qc["format"] == "pack-quantized", str(qc))
        check(qc["config_groups"]["group_0"]["targets"] == ["Linear"], str(qc))
        check(w["num_bits"] == 4 and w["type"] == "int" and w["symmetric"] == (not asym), str(w))
        check(w["strategy"] == ("channel" if group_size == -1 else "group"), str(w))
        check(w["group_size"] == (None if group_size == -1 else group_size), str(w))
        check(w["actorder"] is None and w["dynamic"] is False, str(w))
        want_ignore = ["lm_head", "model.layers.0.mlp.gate", "model.layers.0.mlp.shared_expert_gate"]
        if targets == "experts":
            want_ignore.append("model.layers.0.self_attn.q_proj")
        check(qc["ignore"] == sorted(want_ignore), f"ignore {qc['ignore']}")
        check(cfg["model_type"] == "qwen3_moe", "the rest of config.json is kept")
        for name in ["tokenizer.json", "generation_config.json"]:
            with open(os.path.join(src, name)) as a, open(os.path.join(out, name)) as b:
                check(a.read() == b.read(), f"{name} copied")

    # Errors: a dense model has no experts; a NaN names its tensor; bad group size; re-quantizing.
    bad = os.path.join(work, "moe_nan")
    make_moe_checkpoint(bad, rng, nan_in="model.layers.0.mlp.experts.1.down_proj.weight")
    res = run("quantize", "--model", bad, "--out", bad + "_q", "--group-size", 32, "--quiet", check=False)
    check(res.returncode == 1 and "model.layers.0.mlp.experts.1.down_proj.weight: element [5, 7] is NaN"
          in res.stderr, res.stderr)
    res = run("quantize", "--model", src, "--out", os.path.join(work, "g48"), "--group-size", 48, check=False)
    check(res.returncode == 1 and "--group-size 48 is not supported" in res.stderr, res.stderr)
    res = run("quantize", "--model", src, "--out", os.path.join(work, "g128"), "--group-size", 128, check=False)
    check(res.returncode == 1 and "model.layers.0.mlp.experts.0.down_proj.weight" in res.stderr
          and "is not a multiple of the group size 128" in res.stderr, res.stderr)
    done = os.path.join(work, "moe_int4-asym_32_experts_standard")
    res = run("quantize", "--model", done, "--out", os.path.join(work, "twice"), check=False)
    check(res.returncode == 1 and "already has a quantization_config" in res.stderr, res.stderr)
    dense = os.path.join(work, "dense")
    os.makedirs(dense)
    write_safetensors(os.path.join(dense, "model.safetensors"),
                      {"model.layers.0.mlp.gate_proj.weight": ("BF16", to_bf16_bits(np.ones((64, 64), F32)))})
    with open(os.path.join(dense, "config.json"), "w") as f:
        f.write("{}")
    res = run("quantize", "--model", dense, "--out", dense + "_q", check=False)
    check(res.returncode == 1 and "no tensor matches --targets experts" in res.stderr, res.stderr)
    run("quantize", "--model", dense, "--out", dense + "_q", "--targets", "linear", "--group-size", 64, "--quiet")
    got, _ = read_safetensors(os.path.join(dense + "_q", "model.safetensors"))
    check(sorted(got) == ["model.layers.0.mlp.gate_proj." + x for x in
                          ["weight_packed", "weight_scale", "weight_shape", "weight_zero_point"]], str(sorted(got)))


def main():
    with temp_dir() as work:
        test_quantize_matches_numpy(work)
        test_roundtrip_of_numpy_written_tensors(work)
        test_errors_name_the_tensor(work)
        test_quantize_checkpoint(work)
    print("test_int4_formats: ok")


if __name__ == "__main__":
    main()
