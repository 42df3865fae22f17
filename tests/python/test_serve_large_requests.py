"""Large requests against `rlserve serve`: a text prompt of tens of megabytes is tokenized off
the front door's thread, so /health keeps answering while it is; the request then ends with the
context-length refusal, and the server serves on. An input_ids body of tens of megabytes is read
without a JSON element per id and no further than the context length: the server's peak memory
grows by little more than the body itself (a JSON document of it would take about ten times).
While a text prompt of 64 KiB is tokenized, its rid is taken: a generate under it from another
websocket connection is refused, that connection's cancel and hang-up leave the prompt's request
alone, and the rid is free again once that request ended.

The model is the tiny one with its context length raised to a million tokens, so that the size
limit of generate requests (bounded by the context length) lets a prompt this large in.
"""
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request

from websockets.sync.client import connect as ws_connect

sys.path.insert(0, os.path.dirname(__file__))
import rlserve_testlib as t  # noqa: E402

CONTEXT = 1_000_000
TEXT_BYTES = 40 << 20


def http(port, method, path, data=None):
    """(status, body text) of one request; `data` is the body's bytes."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def long_context_model(tmp):
    model = os.path.join(tmp, "long-context")
    t.run("make-model", "--preset", "tiny", "--out", model, "--seed", "0")
    path = os.path.join(model, "config.json")
    with open(path) as f:
        config = json.load(f)
    config["max_position_embeddings"] = CONTEXT
    with open(path, "w") as f:
        json.dump(config, f)
    return model


def health_while_tokenizing(port):
    words = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")
    text = " ".join(words[i % len(words)] + str(i % 977) for i in range(TEXT_BYTES // 10))
    body = json.dumps({"text": text, "sampling_params": {"max_new_tokens": 1}}).encode()
    result = {}

    def big_request():
        result["reply"] = http(port, "POST", "/generate", body)

    sender = threading.Thread(target=big_request)
    sender.start()
    time.sleep(1.0)  # the body is on its way and then being tokenized (that takes seconds)
    answered_during = 0
    for _ in range(5):
        status, _ = http(port, "GET", "/health")
        t.check(status == 200, f"/health while a large prompt is tokenized: {status}")
        if sender.is_alive():
            answered_during += 1
    sender.join(timeout=600)
    t.check(not sender.is_alive(), "the large request was never answered")
    # Tokenizing 40 MB takes seconds; /health takes milliseconds. Had the front door tokenized
    # on its own thread, /health would have waited for the large request to end.
    t.check(answered_during > 0, "/health answered only after the large prompt was tokenized")
    status, reply = result["reply"]
    t.check(status == 400 and "context length" in reply, f"the large prompt: {status} {reply[:300]}")


def ws_final(ws, req_id, kept):
    """The final message (reply or error) of request `req_id` on a websocket. Chunks are
    skipped; other requests' final messages are kept in `kept` (by id) for their turn."""
    if req_id in kept:
        return kept.pop(req_id)
    while True:
        msg = json.loads(ws.recv(timeout=600))
        if msg.get("type", "").endswith(".chunk"):
            continue
        if msg.get("id") == req_id:
            return msg
        kept[msg.get("id")] = msg


def rid_taken_while_tokenizing(port):
    url = f"ws://127.0.0.1:{port}/"
    rid = "long-prompt"
    in_flight = f'rid: a request with rid "{rid}" is already in flight'
    # Replies wait unread on `busy` while the test waits on `victim`. The client library stops
    # reading a socket once 16 messages wait (max_queue), and then misses the server's pongs to
    # its keep-alive pings and hangs up after 20 s: on a slow (sanitized) run the long prompt
    # takes that long. Unbounded queues keep both connections reading.
    with ws_connect(url, max_size=1 << 30, max_queue=None) as busy, \
            ws_connect(url, max_size=1 << 30, max_queue=None) as victim:
        # The duplicate must reach the front door after the long prompt and before its tokens
        # come back (well under a millisecond): so by order, not by timing. The front door reads
        # one message at a time; prompts of 60000 spaces (under 64 KiB, so the front door
        # tokenizes them itself, milliseconds each; then refused, as their 15001 tokens and
        # max_new_tokens do not fit the KV pool) queue work ahead of the long prompt, and the
        # duplicate joins the queue behind it while that work is still being done. A ping
        # answered on a connection tells that its earlier frames have been handed to the front
        # door.
        busy_kept, victim_kept = {}, {}
        for i in range(32):
            busy.send(json.dumps({"id": f"w{i}", "type": "generate", "body": {
                "text": " " * 60000 + "x", "sampling_params": {"max_new_tokens": 30000}}}))
        busy.send(json.dumps({"id": "p", "type": "ping", "body": {}}))
        ws_final(busy, "p", busy_kept)
        prompt = "<|endoftext|>" * 5100  # 66 KB of text, 5100 tokens
        victim.send(json.dumps({"id": "v", "type": "generate", "body": {
            "rid": rid, "text": prompt,
            "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}}}))
        victim.send(json.dumps({"id": "p", "type": "ping", "body": {}}))
        ws_final(victim, "p", victim_kept)
        duplicate = {"rid": rid, "input_ids": [1, 2, 3],
                     "sampling_params": {"max_new_tokens": 200, "temperature": 0, "ignore_eos": True}}
        with ws_connect(url) as other:
            other.send(json.dumps({"id": "a", "type": "generate", "body": duplicate}))
            other.send(json.dumps({"id": "c", "type": "cancel", "body": {"id": "a"}}))
            kept = {}
            refused = ws_final(other, "a", kept)
            t.check(refused.get("ok") is False and refused["body"]["message"] == in_flight,
                    f"a duplicate rid while the first prompt is tokenized: {refused}")
            ws_final(other, "c", kept)  # whatever it says, it may not touch the first request
            other.send(json.dumps({"id": "a2", "type": "generate", "body": duplicate}))
        # ...and it hung up with its second duplicate in flight or refused.
        reply = ws_final(victim, "v", victim_kept)
        body = reply.get("body", {})
        meta = body.get("meta_info", {})
        t.check(reply.get("ok") is True and len(body.get("output_ids", [])) == 4
                and meta.get("finish_reason", {}).get("type") == "length"
                and meta.get("prompt_tokens") == 5100,
                f"the long prompt's request: {json.dumps(reply)[:500]}")
        for i in range(32):
            w = ws_final(busy, f"w{i}", busy_kept)
            t.check(w.get("ok") is False, f"a busy prompt (too large for the KV pool) was not refused: {w}")
    # Its request ended: the rid is free for anyone.
    status, again = http(port, "POST", "/generate", json.dumps(dict(duplicate, sampling_params={
        "max_new_tokens": 2, "temperature": 0, "ignore_eos": True})).encode())
    t.check(status == 200 and json.loads(again)["meta_info"]["id"] == rid,
            f"the rid after its request ended: {status} {again[:300]}")


def peak_rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/PID/status")


def large_ids_body(proc, port):
    ids = 25_000_000  # 50 MB of "1,": within the size limit, 25 times the context length
    body = b'{"input_ids": [' + b"1," * ids + b'1], "sampling_params": {"max_new_tokens": 1}}'
    before = peak_rss_bytes(proc.pid)
    status, reply = http(port, "POST", "/generate", body)
    t.check(status == 400 and f"more than {CONTEXT} token ids" in reply, f"{status} {reply[:300]}")
    growth = peak_rss_bytes(proc.pid) - before
    # The body is held while it is read (its buffer may be up to twice its size); the ids read
    # take 4 bytes each, up to the context length. A JSON element per id would take 16 bytes
    # or more each: 400 MB here.
    bound = 3 * len(body) + 8 * CONTEXT
    if os.environ.get("RLSERVE_SANITIZED"):
        # AddressSanitizer's redzones and quarantine add a multiple of every allocation: the
        # bound says nothing there (the test still checks the refusal and the server's health).
        bound *= 4
    t.check(growth < bound, f"peak memory grew by {growth >> 20} MiB for a {len(body) >> 20} MiB ids body "
                            f"(bound {bound >> 20} MiB)")
    return growth


def main():
    with t.temp_dir() as tmp:
        env = dict(os.environ, RLSERVE_CACHE_DIR=os.path.join(tmp, "cache"))
        model = long_context_model(tmp)
        proc, port = t.start_server(env, "--device", "cpu", "--model", model)
        try:
            growth = large_ids_body(proc, port)  # first: the peak is not yet the text prompt's
            health_while_tokenizing(port)
            rid_taken_while_tokenizing(port)
            gen = json.dumps({"text": "Hello", "sampling_params": {"max_new_tokens": 2}}).encode()
            status, reply = http(port, "POST", "/generate", gen)
            t.check(status == 200, f"a small prompt after the large one: {status} {reply}")
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=60)
        t.check(proc.returncode == 0, f"serve exited with {proc.returncode}: {err}")
        print("ok: /health answers while a large prompt is tokenized; a rid is taken while its "
              "prompt is; a 50 MB ids body raised peak "
              f"memory by {growth >> 20} MiB")


if __name__ == "__main__":
    main()
