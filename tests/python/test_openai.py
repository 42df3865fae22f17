"""rlserve's OpenAI routes (/v1/models, /v1/completions, /v1/chat/completions) driven over HTTP
with the standard library, against independent references:

- /generate of the same engine: a completion's text, tokens and logprobs (sampled, same seed)
  equal what SGLang's route returns for the same request; streamed chunks add up to the whole.
- `tokenizers`: logprobs' token strings are the tokenizer's decoding of each id; a token-id
  prompt equals its text.
- `jinja2`, set up as Hugging Face's apply_chat_template sets it up: a chat's prompt_tokens
  equal the token count of jinja2's rendering of the model's chat template, and a greedy chat
  answers exactly what /generate answers for that rendering.
- Bad requests get OpenAI's error shape ({"error": {message, type, param, code}}) with a 4xx
  status, naming the field, and the server keeps answering.
"""
import json
import os
import sys
import urllib.error
import urllib.request

from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(__file__))
import rlserve_testlib as t  # noqa: E402
from test_chat_template import hf_environment  # noqa: E402

KEY = "openai-user-key"


def http(port, method, path, body=None, key=KEY, raw=None):
    """(status, content-type, body text) of one request."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read().decode()


def post(port, path, body, status=200):
    code, _, text = http(port, "POST", path, body)
    t.check(code == status, f"POST {path} {json.dumps(body)[:200]}: HTTP {code} (wanted {status}): {text[:500]}")
    return json.loads(text)


def stream(port, path, body):
    """The JSON events of a streamed request; checks the event stream ends with [DONE]."""
    code, ctype, text = http(port, "POST", path, dict(body, stream=True))
    t.check(code == 200 and ctype == "text/event-stream", (code, ctype, text[:300]))
    events = [e[len("data: "):] for e in text.split("\n\n") if e.startswith("data: ")]
    t.check(events and events[-1] == "[DONE]", f"no [DONE] at the end: {events[-3:]}")
    return [json.loads(e) for e in events[:-1]]


def check_error(port, path, body, status, param, words, raw=None):
    code, _, text = http(port, "POST", path, body, raw=raw)
    t.check(code == status, f"{path} {body}: HTTP {code}, wanted {status}: {text[:300]}")
    err = json.loads(text).get("error")
    t.check(isinstance(err, dict) and set(err) == {"message", "type", "param", "code"},
            f"not OpenAI's error shape: {text}")
    t.check(err["param"] == param, f"{body}: param {err['param']!r}, wanted {param!r} ({err['message']})")
    t.check(all(w in err["message"] for w in words), f"{body}: message {err['message']!r} lacks {words}")
    t.check(err["type"] == "invalid_request_error", err)


def generate(port, body):
    return post(port, "/generate", body)


def completion_checks(port, tok):
    # Greedy text prompt: the same tokens and text as /generate.
    prompt = "The policy gradient"
    ref = generate(port, {"text": prompt, "sampling_params": {"max_new_tokens": 12, "temperature": 0}})
    out = post(port, "/v1/completions", {"model": "whatever", "prompt": prompt, "max_tokens": 12, "temperature": 0})
    t.check(out["object"] == "text_completion" and out["id"].startswith("cmpl-") and out["model"] == "whatever", out)
    choice = out["choices"][0]
    t.check(choice["index"] == 0 and choice["text"] == ref["text"], (choice, ref["text"]))
    t.check(choice["finish_reason"] == ref["meta_info"]["finish_reason"]["type"], choice)
    t.check(choice["logprobs"] is None, choice)
    u = out["usage"]
    # The same prompt ran just before: the prefix cache serves all of it but its last token.
    t.check(u == {"prompt_tokens": ref["meta_info"]["prompt_tokens"], "completion_tokens": len(ref["output_ids"]),
                  "total_tokens": ref["meta_info"]["prompt_tokens"] + len(ref["output_ids"]),
                  "prompt_tokens_details": {"cached_tokens": ref["meta_info"]["prompt_tokens"] - 1}}, u)

    # Token-id prompt: the ids of the same text give the same completion.
    ids = tok.encode(prompt, add_special_tokens=False).ids
    by_ids = post(port, "/v1/completions", {"prompt": ids, "max_tokens": 12, "temperature": 0})
    t.check(by_ids["choices"][0]["text"] == ref["text"], by_ids)
    t.check(by_ids["usage"]["prompt_tokens"] == len(ids), by_ids["usage"])
    nested = post(port, "/v1/completions", {"prompt": [ids], "max_tokens": 12, "temperature": 0})
    t.check(nested["choices"][0]["text"] == ref["text"], nested)

    # Sampled with a seed and logprobs: tokens, logprobs and alternatives equal /generate's.
    sp = {"max_new_tokens": 10, "temperature": 0.9, "top_p": 0.95, "sampling_seed": 1234}
    ref = generate(port, {"text": prompt, "sampling_params": sp, "return_logprob": True, "top_logprobs_num": 3})
    out = post(port, "/v1/completions", {"prompt": prompt, "max_tokens": 10, "temperature": 0.9, "top_p": 0.95,
                                         "seed": 1234, "logprobs": 3})
    choice = out["choices"][0]
    t.check(choice["text"] == ref["text"], (choice["text"], ref["text"]))
    lp = choice["logprobs"]
    n = len(ref["output_ids"])
    t.check(all(len(lp[k]) == n for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")), lp)
    t.check(lp["tokens"] == [tok.decode([i], skip_special_tokens=False) for i in ref["output_ids"]], lp["tokens"])
    want = [p[0] for p in ref["meta_info"]["output_token_logprobs"]]
    t.check(all(abs(a - b) <= 1e-6 for a, b in zip(lp["token_logprobs"], want)), (lp["token_logprobs"], want))
    for got, alternatives in zip(lp["top_logprobs"], ref["meta_info"]["output_top_logprobs"]):
        expect = {}
        for logprob, tid, _ in alternatives:
            expect.setdefault(tok.decode([tid], skip_special_tokens=False), logprob)
        t.check(set(got) == set(expect) and all(abs(got[k] - expect[k]) <= 1e-6 for k in got), (got, expect))
    offset = 0
    for token, at in zip(lp["tokens"], lp["text_offset"]):
        t.check(at == offset, lp["text_offset"])
        offset += len(token)

    # Streaming: chunks add up to the whole; the last carries the finish reason; usage after it.
    whole = post(port, "/v1/completions", {"prompt": prompt, "max_tokens": 10, "temperature": 0.9, "seed": 7,
                                           "logprobs": 1})["choices"][0]
    chunks = stream(port, "/v1/completions", {"prompt": prompt, "max_tokens": 10, "temperature": 0.9, "seed": 7,
                                              "logprobs": 1, "stream_options": {"include_usage": True}})
    t.check(chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 10, chunks[-1])
    body = chunks[:-1]
    t.check(len(body) >= 2 and all(c["object"] == "text_completion" for c in body), body)
    t.check(len({c["id"] for c in chunks}) == 1, "chunks of one request carry one id")
    t.check("".join(c["choices"][0]["text"] for c in body) == whole["text"], (body, whole))
    t.check([c["choices"][0]["finish_reason"] for c in body] == [None] * (len(body) - 1) + ["length"], body)
    t.check(all(c["usage"] is None for c in body), "usage is null before the last chunk")
    streamed = [x for c in body if c["choices"][0]["logprobs"] for x in c["choices"][0]["logprobs"]["token_logprobs"]]
    t.check(streamed == whole["logprobs"]["token_logprobs"], (streamed, whole["logprobs"]))
    offsets = [x for c in body if c["choices"][0]["logprobs"] for x in c["choices"][0]["logprobs"]["text_offset"]]
    t.check(offsets == whole["logprobs"]["text_offset"], (offsets, whole["logprobs"]["text_offset"]))

    # Stop strings and echo.
    full = post(port, "/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0})["choices"][0]["text"]
    stop = full[3:6]
    stopped = post(port, "/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0, "stop": [stop]})
    c = stopped["choices"][0]
    t.check(c["finish_reason"] == "stop" and c["matched_stop"] == stop and stop not in c["text"], c)
    echoed = post(port, "/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0, "echo": True})
    t.check(echoed["choices"][0]["text"] == prompt + full, echoed)
    chunks = stream(port, "/v1/completions", {"prompt": ids, "max_tokens": 12, "temperature": 0, "echo": True})
    t.check("".join(c["choices"][0]["text"] for c in chunks) == prompt + full, chunks)


CHATS = [
    ([{"role": "user", "content": "Hi there"}], {}),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}],
     {"enable_thinking": False}),
    ([{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>\nsum\n</think>\n\n4"},
      {"role": "user", "content": [{"type": "text", "text": "and"}, {"type": "text", "text": "3+3?"}]}], {}),
    ([{"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "w", "arguments": {"c": "Oslo"}}}]},
      {"role": "tool", "content": "rain"}], {"enable_thinking": False}),
]


def chat_checks(port, tok, template):
    env = hf_environment()
    for messages, kwargs in CHATS:
        # What the template sees: text parts joined by newlines into one string.
        flat = [dict(m, content="\n".join(p["text"] for p in m["content"])) if isinstance(m.get("content"), list)
                else m for m in messages]
        rendering = env.from_string(template).render(messages=flat, tools=None, documents=None,
                                                     add_generation_prompt=True, **kwargs)
        body = {"model": "m", "messages": messages, "max_tokens": 8, "temperature": 0}
        if kwargs:
            body["chat_template_kwargs"] = kwargs
        out = post(port, "/v1/chat/completions", body)
        t.check(out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-"), out)
        prompt_tokens = len(tok.encode(rendering, add_special_tokens=False).ids)
        t.check(out["usage"]["prompt_tokens"] == prompt_tokens,
                f"{messages}: prompt_tokens {out['usage']['prompt_tokens']}, jinja2's rendering has {prompt_tokens}")
        ref = generate(port, {"text": rendering, "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
        msg = out["choices"][0]["message"]
        t.check(msg["role"] == "assistant" and msg["content"] == ref["text"], (msg, ref["text"]))
        t.check(out["choices"][0]["finish_reason"] == ref["meta_info"]["finish_reason"]["type"], out)

    # Logprobs: one entry per token with its bytes and alternatives, equal to /generate's.
    messages = CHATS[0][0]
    rendering = env.from_string(template).render(messages=messages, tools=None, documents=None,
                                                 add_generation_prompt=True)
    out = post(port, "/v1/chat/completions", {"messages": messages, "max_tokens": 6, "temperature": 0.8,
                                              "seed": 99, "logprobs": True, "top_logprobs": 2})
    ref = generate(port, {"text": rendering, "return_logprob": True, "top_logprobs_num": 2,
                          "sampling_params": {"max_new_tokens": 6, "temperature": 0.8, "sampling_seed": 99}})
    content = out["choices"][0]["logprobs"]["content"]
    t.check(len(content) == len(ref["output_ids"]), content)
    for entry, tid, (logprob, _, _), alternatives in zip(content, ref["output_ids"], ref["meta_info"]["output_token_logprobs"],
                                                      ref["meta_info"]["output_top_logprobs"]):
        t.check(entry["token"] == tok.decode([tid], skip_special_tokens=False), entry)
        t.check(abs(entry["logprob"] - logprob) <= 1e-6, (entry, logprob))
        t.check(bytes(entry["bytes"]).decode("utf-8", errors="replace") == entry["token"], entry)
        t.check([(a["token"], round(a["logprob"], 5)) for a in entry["top_logprobs"]] ==
                [(tok.decode([i], skip_special_tokens=False), round(lp, 5)) for lp, i, _ in alternatives], entry)

    # Streaming: a role chunk, content chunks adding up to the whole, a finish chunk, usage.
    body = {"messages": messages, "max_tokens": 8, "temperature": 0}
    whole = post(port, "/v1/chat/completions", body)["choices"][0]["message"]["content"]
    chunks = stream(port, "/v1/chat/completions", dict(body, stream_options={"include_usage": True}))
    t.check(all(c["object"] == "chat.completion.chunk" for c in chunks), chunks)
    t.check(chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}, chunks[0])
    t.check(chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8, chunks[-1])
    t.check(chunks[-2]["choices"][0]["delta"] == {} and chunks[-2]["choices"][0]["finish_reason"] == "length", chunks[-2])
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-2])
    t.check(text == whole, (text, whole))
    plain = stream(port, "/v1/chat/completions", body)
    t.check(all("usage" not in c for c in plain), "usage without include_usage")


def error_checks(port):
    C, CHAT = "/v1/completions", "/v1/chat/completions"
    hi = [{"role": "user", "content": "hi"}]
    check_error(port, C, {"prompt": 5}, 400, "prompt", ["expected a string or a list of token ids"])
    check_error(port, C, {}, 400, "prompt", ["required"])
    check_error(port, C, {"prompt": ""}, 400, "prompt", ["empty"])
    check_error(port, C, {"prompt": ["a", "b"]}, 400, "prompt", ["batch"])
    check_error(port, C, {"prompt": "x", "temperature": "hot"}, 400, "temperature", ["expected a number"])
    check_error(port, C, {"prompt": "x", "max_tokens": -1}, 400, "max_tokens", [])
    check_error(port, C, {"prompt": "x", "logit_bias": {"5": 1}}, 400, "logit_bias", ["not supported by rlserve"])
    check_error(port, C, {"prompt": "x", "suffix": "y"}, 400, "suffix", ["not supported by rlserve"])
    check_error(port, C, {"prompt": "x", "logprobs": 3, "echo": True}, 400, "echo", ["logprob_start_len"])
    check_error(port, C, {"prompt": "x", "stream_options": {"include_usage": "yes"}}, 400,
                "stream_options.include_usage", ["expected"])
    check_error(port, C, None, 400, None, ["invalid JSON"], raw=b"{not json")
    check_error(port, CHAT, {"messages": "hi"}, 400, "messages", ["expected a list of messages"])
    check_error(port, CHAT, {"messages": []}, 400, "messages", ["empty"])
    check_error(port, CHAT, {}, 400, "messages", ["required"])
    check_error(port, CHAT, {"messages": [{"content": "x"}]}, 400, "messages[0].role", ["required"])
    check_error(port, CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content", ["expected"])
    check_error(port, CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 400,
                "messages[0].content[0].type", ["text only"])
    check_error(port, CHAT, {"messages": hi, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400,
                "tools", ["parses no tool calls", "--tool-call-parser"])
    check_error(port, CHAT, {"messages": hi, "top_logprobs": 2}, 400, "top_logprobs", ["needs logprobs"])
    check_error(port, CHAT, {"messages": hi, "chat_template_kwargs": [1]}, 400, "chat_template_kwargs", ["an object"])
    check_error(port, CHAT, {"messages": hi, "chat_template_kwargs": {"messages": []}}, 400, "messages",
                ["set by the request itself"])
    check_error(port, CHAT, {"messages": hi, "response_format": {"type": "json_object"}}, 400, "response_format",
                ["not supported by rlserve"])
    # n > 1: n choices, choice k seeded seed + k (each equal to /generate with that seed);
    # streamed n > 1 is refused naming n.
    out = post(port, C, {"prompt": "x y", "n": 3, "max_tokens": 4, "temperature": 0.9, "seed": 7})
    t.check([c["index"] for c in out["choices"]] == [0, 1, 2], out)
    for k, choice in enumerate(out["choices"]):
        ref = generate(port, {"text": "x y", "sampling_params": {"max_new_tokens": 4, "temperature": 0.9,
                                                                 "sampling_seed": 7 + k}})
        t.check(choice["text"] == ref["text"], (k, choice, ref["text"]))
    t.check(out["usage"]["completion_tokens"] == 12 and
            out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + 12, out["usage"])
    chat = post(port, CHAT, {"messages": hi, "n": 2, "max_tokens": 3, "seed": 1, "temperature": 0.9})
    t.check([c["index"] for c in chat["choices"]] == [0, 1], chat)
    # Streamed n > 1: each choice's chunks carry its index and add up to its non-streamed text.
    body = {"prompt": "x y", "n": 3, "max_tokens": 4, "temperature": 0.9, "seed": 7,
            "stream_options": {"include_usage": True}}
    events = stream(port, C, body)
    texts = {}
    for e in events[:-1]:
        t.check(len(e["choices"]) == 1, e)
        texts.setdefault(e["choices"][0]["index"], []).append(e["choices"][0]["text"])
    t.check(sorted(texts) == [0, 1, 2], sorted(texts))
    for k in range(3):
        t.check("".join(texts[k]) == out["choices"][k]["text"], (k, texts[k], out["choices"][k]["text"]))
    t.check(events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 12, events[-1])
    chat_events = stream(port, CHAT, {"messages": hi, "n": 2, "max_tokens": 3, "seed": 1, "temperature": 0.9})
    roles = sorted(e["choices"][0]["index"] for e in chat_events if e["choices"][0]["delta"].get("role"))
    t.check(roles == [0, 1], f"one role chunk per choice: {roles}")
    for k in range(2):
        content = "".join(e["choices"][0]["delta"].get("content", "") for e in chat_events
                          if e["choices"][0]["index"] == k)
        t.check(content == chat["choices"][k]["message"]["content"], (k, content))
    # Unknown fields are ignored; any model name is taken (one model is served) and echoed.
    out = post(port, C, {"prompt": "x", "max_tokens": 1, "model": "not-a-model", "frobnicate": 1})
    t.check(out["model"] == "not-a-model", out)
    # Methods and auth: completions take POST only; every route needs the API key.
    code, _, _ = http(port, "GET", C)
    t.check(code == 405, code)
    code, _, text = http(port, "GET", "/v1/models", key=None)
    t.check(code == 401, (code, text))
    code, _, _ = http(port, "POST", C, {"prompt": "x"}, key=None)
    t.check(code == 401, code)


def sglext_checks(port, tok, template):
    """SGLang's sglext ids (serving_chat.py): the body's sglext, or streamed one chunk with no
    choices before the usage chunk; input_ids once, output_ids one list per choice, equal to
    /generate's output_ids for the same seeded request."""
    messages = CHATS[0][0]
    rendering = hf_environment().from_string(template).render(messages=messages, tools=None, documents=None,
                                                              add_generation_prompt=True)
    prompt_ids = tok.encode(rendering, add_special_tokens=False).ids
    flags = {"return_input_ids_in_sglext": True, "return_output_ids_in_sglext": True}
    for n in (1, 3):
        body = dict(flags, messages=messages, max_tokens=7, temperature=0.8, seed=11, n=n)
        whole = post(port, "/v1/chat/completions", body)
        ext = whole["sglext"]
        t.check(ext["input_ids"] == prompt_ids, (ext["input_ids"], prompt_ids))
        t.check(len(ext["output_ids"]) == n and all(len(ids) == 7 for ids in ext["output_ids"]), ext)
        t.check(all("token_ids" not in c and "prompt_token_ids" not in c for c in whole["choices"]), whole)
        if n == 1:
            ref = generate(port, {"text": rendering, "sampling_params": {"max_new_tokens": 7, "temperature": 0.8,
                                                                         "sampling_seed": 11}})
            t.check(ext["output_ids"][0] == ref["output_ids"], (ext, ref["output_ids"]))
        chunks = stream(port, "/v1/chat/completions", dict(body, stream_options={"include_usage": True}))
        t.check(chunks[-1]["choices"] == [] and "usage" in chunks[-1] and "sglext" not in chunks[-1], chunks[-1])
        carrying = [c for c in chunks if "sglext" in c]
        t.check(len(carrying) == 1 and carrying[0] is chunks[-2] and carrying[0]["choices"] == [], chunks[-3:])
        t.check(carrying[0]["sglext"] == ext, (carrying[0]["sglext"], ext))
        # Each choice's ids are those of the text it streamed.
        for k in range(n):
            text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                           if c["choices"] and c["choices"][0]["index"] == k)
            t.check(text == tok.decode(ext["output_ids"][k], skip_special_tokens=True), (k, text))
    # One flag alone brings its field only; none, no sglext (streamed or not).
    only_out = post(port, "/v1/chat/completions", {"messages": messages, "max_tokens": 3,
                                                   "return_output_ids_in_sglext": True})
    t.check(set(only_out["sglext"]) == {"output_ids"}, only_out)
    only_in = stream(port, "/v1/chat/completions", {"messages": messages, "max_tokens": 3,
                                                    "return_input_ids_in_sglext": True})
    t.check([c["sglext"] for c in only_in if "sglext" in c] == [{"input_ids": prompt_ids}], only_in[-2:])
    t.check("sglext" not in post(port, "/v1/chat/completions", {"messages": messages, "max_tokens": 3}), "sglext unasked")
    t.check(all("sglext" not in c for c in stream(port, "/v1/chat/completions", {"messages": messages, "max_tokens": 3})),
            "sglext unasked, streamed")
    # return_token_ids also brings each choice's prompt_token_ids (SGLang's rule).
    ids = post(port, "/v1/chat/completions", {"messages": messages, "max_tokens": 3, "return_token_ids": True})
    t.check(ids["choices"][0]["prompt_token_ids"] == prompt_ids and len(ids["choices"][0]["token_ids"]) == 3, ids)
    for key in flags:
        for bad in ("yes", 1, [True]):
            check_error(port, "/v1/chat/completions", {"messages": messages, key: bad}, 400, key, [key])


def main():
    with t.temp_dir() as tmp:
        env = dict(os.environ, RLSERVE_CACHE_DIR=os.path.join(tmp, "cache"), RLSERVE_API_KEY=KEY)
        proc, port = t.start_server(env)
        try:
            model_dir = os.path.join(tmp, "cache", "tiny-qwen3")
            tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
            with open(os.path.join(model_dir, "tokenizer_config.json")) as f:
                template = json.load(f)["chat_template"]
            code, _, text = http(port, "GET", "/v1/models")
            models = json.loads(text)
            t.check(code == 200 and models["object"] == "list" and models["data"][0]["id"] == model_dir, text)
            completion_checks(port, tok)
            chat_checks(port, tok, template)
            sglext_checks(port, tok, template)
            error_checks(port)
            code, _, _ = http(port, "GET", "/health", key=None)
            t.check(code == 200, "the server stopped answering after the bad requests")
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=30)
        t.check(proc.returncode == 0, f"serve exited with {proc.returncode}: {err}")
        print("ok: /v1/models, /v1/completions and /v1/chat/completions against /generate, tokenizers and jinja2")


if __name__ == "__main__":
    main()
