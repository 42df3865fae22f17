"""The trainer side of update_bench: a PyTorch process on the engine's GPU that holds a random BF16
model of the given shape and hands it over by CUDA IPC, one bucket at a time.

Protocol (stdin/stdout, one JSON object per line):
  trainer -> bench   {"bucket": i, "tensors": [rlserve's own device-tensor form, ...], "bytes": B}
  bench -> trainer   "next" once it has read the bucket (the trainer then reuses the buffer)
  trainer -> bench   {"done": true, "buckets": n, "bytes": total} after the last bucket
Two bucket buffers are allocated once and reused alternately, as trainers do; their contents are
regenerated for every bucket (not timed by the bench: the bench times its own side only).

Usage: python3 ipc_trainer.py --layers 48 --bucket-mib 1024 [--dense-experts]
"""
import argparse
import json
import sys

import torch


def shapes(layers):
    H, V, nq, nkv, D, E, MI = 2048, 151936, 32, 4, 128, 128, 768
    out = [("model.embed_tokens.weight", (V, H)), ("lm_head.weight", (V, H)), ("model.norm.weight", (H,))]
    for l in range(layers):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", (H,)), (p + "post_attention_layernorm.weight", (H,)),
                (p + "self_attn.q_proj.weight", (nq * D, H)), (p + "self_attn.k_proj.weight", (nkv * D, H)),
                (p + "self_attn.v_proj.weight", (nkv * D, H)), (p + "self_attn.o_proj.weight", (H, nq * D)),
                (p + "self_attn.q_norm.weight", (D,)), (p + "self_attn.k_norm.weight", (D,)),
                (p + "mlp.gate.weight", (E, H))]
        for x in range(E):
            xp = f"{p}mlp.experts.{x}."
            out += [(xp + "gate_proj.weight", (MI, H)), (xp + "up_proj.weight", (MI, H)),
                    (xp + "down_proj.weight", (H, MI))]
    return out


def ref(name, view, uuid):
    shared = view.untyped_storage()._share_cuda_()
    handle, offset = shared[1], shared[3]
    return {"name": name, "dtype": "bfloat16", "shape": list(view.shape), "ipc_handle": handle[2:].hex(),
            "offset": offset + view.storage_offset() * 2, "nbytes": view.numel() * 2, "device_uuid": uuid}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--bucket-mib", type=int, default=1024)
    a = ap.parse_args()
    torch.cuda.set_device(0)
    uuid = "GPU-" + str(torch.cuda.get_device_properties(0).uuid)
    cap = a.bucket_mib << 20
    buffers = [torch.empty(cap // 2, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
    gen = torch.Generator(device="cuda").manual_seed(1)
    todo = shapes(a.layers)
    bucket, used, i, total = [], 0, 0, 0

    def send():
        nonlocal bucket, used, i, total
        buf = buffers[i % 2]
        refs, off = [], 0
        for name, shape in bucket:
            n = 1
            for d in shape:
                n *= d
            view = buf[off:off + n].view(shape)
            view.normal_(0.0, 0.02 if len(shape) == 2 else 1.0, generator=gen)
            refs.append(ref(name, view, uuid))
            off += (n + 127) // 128 * 128  # 256-byte aligned starts
        torch.cuda.synchronize()
        print(json.dumps({"bucket": i, "tensors": refs, "bytes": used}), flush=True)
        if sys.stdin.readline().strip() != "next":
            sys.exit(1)
        total += used
        i += 1
        bucket, used = [], 0

    for name, shape in todo:
        n = 1
        for d in shape:
            n *= d
        b = (n + 127) // 128 * 128 * 2
        if used + b > cap and bucket:
            send()
        if b > cap:
            raise SystemExit(f"{name} ({b} bytes) is larger than a bucket")
        bucket.append((name, shape))
        used += b
    if bucket:
        send()
    print(json.dumps({"done": True, "buckets": i, "bytes": total}), flush=True)


if __name__ == "__main__":
    main()
