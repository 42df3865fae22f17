"""`rlserve serve` driven by independent clients: the Python `websockets` package speaking the
protocol of docs/protocol.md (text envelopes, streamed chunks, a binary tensor frame built here
from the bytes of the model file), plain HTTP from the standard library (SGLang's routes and
shapes, server-sent events, auth levels), and `rlserve client` as a person would use it.

The trainer side checks what it sent against the engine's own XXH3-64 checksums with `xxhash`.
"""
import asyncio
import http.client as http_client
import json
import os
import struct
import sys
import time
import urllib.error
import urllib.request

import websockets
import xxhash

sys.path.insert(0, os.path.dirname(__file__))
import rlserve_testlib as t  # noqa: E402

USER, ADMIN = "user-secret-1", "admin-secret-2"


def http(port, method, path, body=None, key=None):
    """(status, content-type, body text) of one request."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read().decode()


def tensor_bytes(path):
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_len])
    base = 8 + header_len
    return {name: (info, data[base + info["data_offsets"][0]:base + info["data_offsets"][1]])
            for name, info in header.items() if name != "__metadata__"}


def binary_frame(req_id, body, tensors):
    """[u32 header length][JSON header][payload], tensors at 64-byte aligned offsets."""
    descs, payload = [], b""
    for name, dtype, shape, raw in tensors:
        payload += b"\0" * (-len(payload) % 64)
        descs.append({"name": name, "dtype": dtype, "shape": shape, "offset": len(payload), "nbytes": len(raw)})
        payload += raw
    header = json.dumps({"id": req_id, "type": "update_weights_from_tensor",
                         "body": dict(body, named_tensors=descs)}).encode()
    header += b" " * (-(4 + len(header)) % 64)
    return struct.pack("<I", len(header)) + header + payload


async def until_final(ws, req_id, chunks=None):
    while True:
        msg = json.loads(await ws.recv())
        if msg.get("id") != req_id:
            continue
        if msg.get("type", "").endswith(".chunk"):
            if chunks is not None:
                chunks.append(msg["body"])
            continue
        return msg


async def websocket_checks(port, model_dir):
    url = f"ws://127.0.0.1:{port}/"
    # Without a key the upgrade is refused.
    try:
        async with websockets.connect(url):
            raise AssertionError("connected without a key")
    except websockets.exceptions.InvalidStatus as e:
        t.check(e.response.status_code == 401, f"expected 401, got {e.response.status_code}")

    async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {USER}"}) as ws:
        gen = {"input_ids": [1, 2, 3], "stream": True,
               "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}}
        # Two requests multiplexed by the ids chosen here.
        await ws.send(json.dumps({"id": "first", "type": "generate", "body": gen}))
        await ws.send(json.dumps({"id": 2, "type": "generate", "body": dict(gen, input_ids=[4, 5])}))
        finals, chunks = {}, {"first": [], 2: []}
        while len(finals) < 2:
            msg = json.loads(await ws.recv())
            t.check(msg["id"] not in finals, f"a message after the final one: {msg}")
            if msg["type"] == "generate.chunk":
                chunks[msg["id"]].append(msg["body"])
            else:
                t.check(msg["type"] == "generate" and msg["ok"], msg)
                finals[msg["id"]] = msg["body"]
        for key, final in finals.items():
            t.check(len(final["output_ids"]) == 6, final)
            t.check(sum((c["output_ids"] for c in chunks[key]), []) == final["output_ids"], "chunks != final")
            t.check("".join(c["text"] for c in chunks[key]) == final["text"], "chunk text != final text")
            t.check(final["meta_info"]["weight_version"] == "0", final)
        # Errors: a code and a sentence, the id echoed, the connection kept.
        await ws.send("{not json")
        err = json.loads(await ws.recv())
        t.check(err["error"]["code"] == "bad_json" and err["id"] is None, err)
        await ws.send(json.dumps({"id": 5, "type": "make_coffee"}))
        err = json.loads(await ws.recv())
        t.check(err["id"] == 5 and err["error"]["code"] == "unknown_type", err)
        t.check("begin_weight_update" in err["error"]["message"], "the message lists the routes")
        await ws.send(json.dumps({"id": 6, "type": "begin_weight_update"}))
        err = json.loads(await ws.recv())
        t.check(err["error"]["code"] == "unauthorized", f"the normal key must not open a session: {err}")
        t.check(USER not in json.dumps(err) and ADMIN not in json.dumps(err), "a key in an error")
        await ws.send(json.dumps({"id": 7, "type": "get_server_info"}))
        info = await until_final(ws, 7)
        t.check(info["ok"] and USER not in json.dumps(info) and ADMIN not in json.dumps(info), info)

    # The trainer: a whole session with a binary tensor frame, verified with xxhash.
    tensors = tensor_bytes(os.path.join(model_dir, "model.safetensors"))
    info, raw = tensors["model.norm.weight"]
    new = bytes(b ^ 0x01 if i % 2 == 0 else b for i, b in enumerate(raw))  # nudge every low byte
    async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {ADMIN}"},
                                  max_size=2**28) as ws:
        for i, (route, body) in enumerate([("pause_generation", {"mode": "retract"}),
                                           ("begin_weight_update", {})]):
            await ws.send(json.dumps({"id": f"s{i}", "type": route, "body": body}))
            reply = await until_final(ws, f"s{i}")
            t.check(reply["ok"], reply)
        await ws.send(binary_frame("bin", {}, [("model.norm.weight", "bfloat16", info["shape"], new)]))
        reply = await until_final(ws, "bin")
        t.check(reply["ok"], reply)
        await ws.send(json.dumps({"id": "end", "type": "end_weight_update", "body": {"weight_version": "py-1"}}))
        reply = await until_final(ws, "end")
        t.check(reply["ok"] and reply["body"]["weight_version"] == "py-1", reply)
        await ws.send(json.dumps({"id": "go", "type": "continue_generation"}))
        t.check((await until_final(ws, "go"))["ok"], "continue")
        await ws.send(json.dumps({"id": "sum", "type": "weights_checker", "body": {"action": "checksum"}}))
        sums = (await until_final(ws, "sum"))["body"]["ranks"][0]["checksums"]
        t.check(sums["model.norm.weight"] == xxhash.xxh3_64(new).hexdigest(), "the engine holds other bytes")
        other = "model.embed_tokens.weight"
        t.check(sums[other] == xxhash.xxh3_64(tensors[other][1]).hexdigest(), "an untouched tensor changed")


def http_checks(port):
    # Probes and health monitors send no key: /health, /health_generate and /metrics are open (as
    # SGLang's); a wrong key does not matter there either.
    for path in ("/health", "/health_generate", "/metrics"):
        status, _, body = http(port, "GET", path)
        t.check(status == 200, f"{path} without a key: {status} {body}")
    status, _, body = http(port, "GET", "/health", key="wrong")
    t.check(status == 200, f"/health with a wrong key: {status} {body}")
    status, _, body = http(port, "GET", "/get_server_info")
    t.check(status == 401, f"/get_server_info without a key: {status}")
    status, ctype, body = http(port, "GET", "/metrics", key=USER)
    t.check(status == 200 and ctype.startswith("text/plain"), ctype)
    for name in ("rlserve_requests_total", "rlserve_completion_tokens_total", "rlserve_queue_depth",
                 "rlserve_running_requests", 'rlserve_update_phase_seconds_count{phase="begin"}',
                 'rlserve_weight_version_info{version="py-1"}', 'rlserve_update_sessions_total{result="committed"}'):
        t.check(name in body, f"/metrics lacks {name}")
    t.check(USER not in body and ADMIN not in body, "a key in /metrics")
    # A key SGLang's request dataclasses would ignore is ignored and counted, not an error.
    def ignored_total():
        _, _, text = http(port, "GET", "/metrics")
        line = [l for l in text.split("\n") if l.startswith("rlserve_ignored_request_fields_total ")]
        return int(line[0].split()[1])
    before = ignored_total()
    status, _, body = http(port, "POST", "/get_server_info", {"some_future_field": 1}, key=USER)
    t.check(status == 200, (status, body))
    t.check(ignored_total() == before + 1, "the ignored field was not counted")
    gen = {"text": "The policy", "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}}
    status, _, body = http(port, "POST", "/generate", gen, key=USER)
    out = json.loads(body)
    t.check(status == 200 and len(out["output_ids"]) == 5 and out["meta_info"]["weight_version"] == "py-1", out)
    status, ctype, body = http(port, "POST", "/generate", dict(gen, stream=True), key=USER)
    t.check(status == 200 and ctype == "text/event-stream", (status, ctype))
    events = [line[6:] for line in body.split("\n") if line.startswith("data: ")]
    t.check(events[-1] == "[DONE]", events[-1])
    t.check(json.loads(events[-2])["output_ids"] == out["output_ids"], "the last event is the whole result")
    # Admin routes: the normal key is refused, the admin key works, SGLang's reply shapes.
    status, _, body = http(port, "POST", "/pause_generation", {"mode": "abort"}, key=USER)
    t.check(status == 401 and USER not in body, (status, body))
    status, _, body = http(port, "POST", "/pause_generation", {"mode": "abort"}, key=ADMIN)
    t.check(status == 200 and json.loads(body)["status"] == "ok", body)
    status, _, body = http(port, "POST", "/continue_generation", {}, key=ADMIN)
    t.check(status == 200, body)
    status, _, body = http(port, "POST", "/end_weight_update", {}, key=ADMIN)
    t.check(status == 400 and json.loads(body)["success"] is False, "no session: 400 with success false")
    status, _, body = http(port, "GET", "/model_info", key=USER)
    t.check(json.loads(body)["weight_version"] == "py-1", body)
    status, _, body = http(port, "POST", "/update_weight_version", {"new_version": "py-2"}, key=ADMIN)
    t.check(status == 200, body)


def write_safetensors(path, tensors):
    """tensors: name -> (dtype code, shape, raw bytes); the format by hand (bf16 has no numpy dtype)."""
    header, offset, blob = {}, 0, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blob += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + blob)


def keep_alive_checks(port):
    """Several requests on one keep-alive connection (what `requests.Session` does)."""
    conn = http_client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Authorization": f"Bearer {USER}", "Content-Type": "application/json"}
    gen = json.dumps({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}})
    for path, body in [("/health", None), ("/generate", gen), ("/get_server_info", None), ("/generate", gen)]:
        conn.request("GET" if body is None else "POST", path, body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
        t.check(r.status == 200, f"{path} on a kept-alive connection: {r.status} {data[:200]}")
        t.check(r.getheader("Connection", "keep-alive").lower() != "close", f"{path} closed the connection")
    conn.close()


def cli_checks(port, env, tmp, model_dir):
    base = ["client", "--port", str(port)]
    cenv = dict(env, RLSERVE_API_KEY=USER, RLSERVE_ADMIN_API_KEY=ADMIN)
    out = t.run(*base, "generate", "--prompt", "Hello", "--max-new-tokens", "4", "--temperature", "0",
                "--ignore-eos", "--stream", env=cenv).stdout
    t.check("4 generated tokens" in out, out)
    lines = t.run(*base, "generate", "--input-ids", "1,2,3", "--max-new-tokens", "3", "--ignore-eos", "--json",
                  env=cenv).stdout.splitlines()
    t.check(len(json.loads(lines[0])["output_ids"]) == 3, lines)
    out = t.run(*base, "pause_generation", "mode=in_place", env=cenv).stdout
    t.check(out.startswith("ok"), out)
    info = json.loads(t.run(*base, "--json", "get_server_info", env=cenv).stdout)
    t.check(info["paused"] and info["pause_mode"] == "in_place", info)
    t.run(*base, "continue_generation", env=cenv)
    bad = t.run(*base, "pause_generation", env=dict(env, RLSERVE_API_KEY=USER), check=False)
    t.check(bad.returncode != 0 and "unauthorized" in bad.stderr, bad.stderr)
    # The trainer's cycle from the command line, checked against xxhash of the bytes sent.
    info, raw = tensor_bytes(os.path.join(model_dir, "model.safetensors"))["model.norm.weight"]
    new = bytes(b ^ 0x02 if i % 2 == 0 else b for i, b in enumerate(raw))
    path = os.path.join(tmp, "bucket.safetensors")
    write_safetensors(path, {"model.norm.weight": ("BF16", info["shape"], new)})
    out = t.run(*base, "update-weights", "--safetensors", path, "--weight-version", "cli-1",
                "--pause-mode", "in_place", env=cenv).stdout
    for phase in ("pause_generation", "begin_weight_update", "update_weights_from_tensor", "end_weight_update",
                  "continue_generation"):
        t.check(phase in out, f"update-weights output lacks {phase}:\n{out}")
    sums = json.loads(t.run(*base, "--json", "weights_checker", env=cenv).stdout)["ranks"][0]["checksums"]
    t.check(sums["model.norm.weight"] == xxhash.xxh3_64(new).hexdigest(), "the CLI update did not land")
    info = json.loads(t.run(*base, "--json", "get_server_info", env=cenv).stdout)
    t.check(info["weight_version"] == "cli-1" and not info["paused"], info)


def main():
    with t.temp_dir() as tmp:
        env = dict(os.environ, RLSERVE_CACHE_DIR=os.path.join(tmp, "cache"))
        # The keys come from the environment, as an operator would pass them.
        proc, port = t.start_server(dict(env, RLSERVE_API_KEY=USER, RLSERVE_ADMIN_API_KEY=ADMIN))
        try:
            model_dir = os.path.join(tmp, "cache", "tiny-qwen3")
            t0 = time.time()
            asyncio.run(websocket_checks(port, model_dir))
            http_checks(port)
            keep_alive_checks(port)
            cli_checks(port, env, tmp, model_dir)
            elapsed = time.time() - t0
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=30)
        t.check(proc.returncode == 0, f"serve exited with {proc.returncode}: {err}")
        t.check(USER not in err and ADMIN not in err, "a key in the server's log")
        print(f"ok: websockets, urllib and rlserve client against rlserve serve ({elapsed:.1f} s)")


if __name__ == "__main__":
    main()
