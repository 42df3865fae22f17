"""Helpers for the trainer replay tests (tests/python/test_trainer_*.py).

Each replay test sends one RL trainer's HTTP calls for one training step, with the trainer's own
request bodies, to a real `rlserve serve`, and reads the reply fields the trainer reads. The
trainers speak HTTP through `requests` / `aiohttp`; urllib sends the same bytes (JSON bodies with
Content-Type application/json, GETs without a body).

Two checkpoints of the same tiny model play the weights before and after the training step:
`model_a` serves at start, `model_b` (another seed) is what the trainer sends, from disk or as
tensors.
"""
import base64
import json
import os
import struct
import urllib.error
import urllib.request

import rlserve_testlib as t

# safetensors dtype names -> PyTorch names (what trainers put into "dtype").
TORCH_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "I32": "int32", "I64": "int64",
                "U8": "uint8", "I8": "int8"}


class Reply:
    def __init__(self, status, content_type, text):
        self.status, self.content_type, self.text = status, content_type, text

    def json(self):
        return json.loads(self.text)

    def raise_for_status(self, what):
        """requests' raise_for_status: the trainers stop on any 4xx/5xx."""
        t.check(self.status < 400, f"{what}: HTTP {self.status} {self.text}")
        return self


class Engine:
    """One rlserve server at http://127.0.0.1:port."""

    def __init__(self, port):
        self.port = port
        self.base = f"http://127.0.0.1:{port}"

    def request(self, method, path, payload=None, headers=None, timeout=300):
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return Reply(r.status, r.headers.get("Content-Type", ""), r.read().decode())
        except urllib.error.HTTPError as e:
            return Reply(e.code, e.headers.get("Content-Type", ""), e.read().decode())

    def get(self, path, headers=None):
        return self.request("GET", path, headers=headers)

    def post(self, path, payload, headers=None):
        """requests.post(url, json=payload)."""
        return self.request("POST", path, payload if payload is not None else {}, headers=headers)


def make_models(tmp):
    """Two Qwen3 checkpoints of the same shapes: (model_a, model_b). Tiny on the CPU; on a GPU the
    `medium` preset, the smallest shapes the GPU kernels run (head_dim 64)."""
    a, b = os.path.join(tmp, "model_a"), os.path.join(tmp, "model_b")
    default = "tiny" if os.environ.get("RLSERVE_REPLAY_DEVICE", "cpu") == "cpu" else "medium"
    preset = os.environ.get("RLSERVE_REPLAY_PRESET", default)
    t.run("make-model", "--arch", "qwen3", "--preset", preset, "--out", a, "--seed", "11")
    t.run("make-model", "--arch", "qwen3", "--preset", preset, "--out", b, "--seed", "22")
    return a, b


def start(tmp, model, *extra):
    """`rlserve serve` on the CPU, or on the device RLSERVE_REPLAY_DEVICE names (the GPU machine
    replays the same trainers' calls against a GPU runner: tests/gpu/test_trainer_replays_gpu.py)."""
    env = dict(os.environ, RLSERVE_CACHE_DIR=os.path.join(tmp, "cache"))
    device = os.environ.get("RLSERVE_REPLAY_DEVICE", "cpu")
    more = os.environ.get("RLSERVE_REPLAY_ARGS", "").split()
    proc, port = t.start_server(env, "--model", model, "--device", device, *more, *extra)
    return proc, Engine(port)


def stop(proc):
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    t.check(proc.returncode == 0, f"serve exited with {proc.returncode}: {err}")


def safetensors_tensors(model_dir):
    """{name: (torch dtype, shape, raw bytes)} of every *.safetensors file in a model directory,
    read by hand (the header is JSON), so no torch is needed."""
    out = {}
    for file in sorted(os.listdir(model_dir)):
        if not file.endswith(".safetensors"):
            continue
        with open(os.path.join(model_dir, file), "rb") as f:
            data = f.read()
        (header_len,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + header_len])
        base = 8 + header_len
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            out[name] = (TORCH_DTYPES[info["dtype"]], info["shape"], data[base + begin : base + end])
    return out


def inline_buckets(model_dir, bucket_bytes=64 * 1024):
    """The checkpoint as rlserve's inline tensors ({name, dtype, shape, data: base64}), split into
    buckets of about bucket_bytes, as trainers split their updates."""
    buckets, current, size = [], [], 0
    for name, (dtype, shape, raw) in safetensors_tensors(model_dir).items():
        current.append({"name": name, "dtype": dtype, "shape": shape, "data": base64.b64encode(raw).decode()})
        size += len(raw)
        if size >= bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


def checkpoint_checksums(model_dir):
    """What weights_checker(checksum) must say once model_dir's weights serve: rlserve's own
    check-weights over the checkpoint."""
    report = json.loads(t.run("check-weights", "--model", model_dir, "--json").stdout)
    t.check(report["success"], report)
    return report["ranks"][0]["checksums"]


def prompt_ids():
    return [1, 2, 3, 4, 5, 6, 7, 8]


def check_output_length(meta, generated, max_new_tokens):
    """A sampled request may stop early: the seeded model's EOS can be drawn. It then ends on the
    matched stop token; otherwise it ran to max_new_tokens."""
    reason = meta["finish_reason"]
    if reason["type"] == "stop":
        t.check(1 <= generated <= max_new_tokens, meta)
        if isinstance(reason.get("matched"), int):
            t.check(meta["output_token_logprobs"][-1][1] == reason["matched"], meta)
    else:
        t.check(generated == max_new_tokens, meta)
