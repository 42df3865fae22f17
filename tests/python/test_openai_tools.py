"""Tools and reasoning on /v1/chat/completions end to end (`serve --tool-call-parser qwen25
--reasoning-parser deepseek-r1`), over HTTP with the standard library.

The tiny test model cannot plan a tool call, so what it says is random; the checks are what
does not depend on it (the unit tests, tests/net/tool_call_parser_test.cpp, check the parsers on
recorded outputs of real models):

- tools reach the template: prompt_tokens equal the token count of jinja2's rendering of the
  model's chat template with `tools` = the offered functions (SGLang gives templates those).
- the reply's parts are the reference split below applied to the raw text /generate returns for
  the same greedy request: deepseek-r1 starts inside thinking, so up to </think> is
  reasoning_content; tool calls are read from what follows.
- streamed deltas (reasoning_content, content, tool_calls) add up to the whole reply.
- separate_reasoning: false and tool_choice "none" leave the text as it is.
- bad tools schemas and tool_choice "required" / named are refused naming the field; an unknown
  parser name stops `serve` at start, naming the accepted ones.
"""
import json
import os
import re
import subprocess
import sys

from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(__file__))
import rlserve_testlib as t  # noqa: E402
from test_chat_template import hf_environment  # noqa: E402
from test_openai import KEY, check_error, post, stream  # noqa: E402

CHAT = "/v1/chat/completions"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "get_time"}}]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


def reference_split(text, names):
    """(reasoning, content, [(name, arguments)]): deepseek-r1's forced thinking, then qwen25 calls."""
    head = text.lstrip()
    if head.startswith("<think>"):
        head = head[len("<think>"):]
    if "</think>" in head:
        reasoning, content = head.split("</think>", 1)
        content = content.lstrip()
    else:
        reasoning, content = head, ""
    # Whitespace next to a call is dropped; malformed blocks stay text.
    calls, kept, pos, after_call = [], [], 0, False
    for m in re.finditer(r"<tool_call>(.*?)</tool_call>", content, re.DOTALL):
        try:
            call = json.loads(m.group(1))
            ok = isinstance(call, dict) and call.get("name") in names and isinstance(call.get("arguments", {}), dict)
        except ValueError:
            ok = False
        before = content[pos:m.start()]
        if after_call:
            before = before.lstrip()
        if ok:
            kept.append(before.rstrip())
            calls.append((call["name"], json.dumps(call.get("arguments", {}), ensure_ascii=False)))
        else:
            kept.append(before + m.group(0))
        after_call = ok
        pos = m.end()
    rest = content[pos:]
    kept.append(rest.lstrip() if after_call else rest)
    return reasoning.strip(), "".join(kept), calls


def main():
    with t.temp_dir() as tmp:
        env = dict(os.environ, RLSERVE_CACHE_DIR=os.path.join(tmp, "cache"), RLSERVE_API_KEY=KEY)
        bad = subprocess.run([t.rlserve_bin(), "serve", "--port", "0", "--tool-call-parser", "hermes"], env=env,
                             capture_output=True, text=True, timeout=120)
        t.check(bad.returncode != 0 and "qwen25" in bad.stderr and "hermes" in bad.stderr,
                f"an unknown parser must stop serve naming the accepted ones: {bad.returncode} {bad.stderr}")
        proc, port = t.start_server(env, "--tool-call-parser", "qwen25", "--reasoning-parser", "deepseek-r1")
        try:
            model_dir = os.path.join(tmp, "cache", "tiny-qwen3")
            tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
            with open(os.path.join(model_dir, "tokenizer_config.json")) as f:
                template = json.load(f)["chat_template"]
            functions = [x["function"] for x in TOOLS]
            rendering = hf_environment().from_string(template).render(
                messages=MESSAGES, tools=functions, documents=None, add_generation_prompt=True)
            t.check("get_weather" in rendering, "the template does not render tools")
            body = {"messages": MESSAGES, "tools": TOOLS, "max_tokens": 24, "temperature": 0}
            out = post(port, CHAT, body)
            t.check(out["usage"]["prompt_tokens"] == len(tok.encode(rendering, add_special_tokens=False).ids),
                    f"tools did not reach the template as SGLang passes them: {out['usage']}")
            raw = post(port, "/generate", {"text": rendering,
                                           "sampling_params": {"max_new_tokens": 24, "temperature": 0}})["text"]
            reasoning, content, calls = reference_split(raw, {"get_weather", "get_time"})
            msg = out["choices"][0]["message"]
            t.check(msg["reasoning_content"] == (reasoning or None), (msg, raw))
            t.check(msg["content"] == (None if calls and not content else content), (msg, raw))
            got = [(c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"] or []]
            t.check(got == calls, (got, calls, raw))
            for i, c in enumerate(msg["tool_calls"] or []):
                t.check(c["type"] == "function" and c["index"] == i and c["id"].startswith("call_"), c)
            t.check(out["choices"][0]["finish_reason"] == ("tool_calls" if calls and out["choices"][0]["finish_reason"]
                                                           != "length" else out["choices"][0]["finish_reason"]), out)

            # Streamed: the deltas add up to the whole reply.
            chunks = stream(port, CHAT, body)
            deltas = [c["choices"][0]["delta"] for c in chunks[1:-1]]
            t.check("".join(d.get("reasoning_content", "") for d in deltas) == (msg["reasoning_content"] or ""), deltas)
            t.check("".join(d.get("content", "") for d in deltas) == (msg["content"] or ""), deltas)
            streamed_calls = [(tc["function"]["name"], tc["function"]["arguments"])
                              for d in deltas for tc in d.get("tool_calls", [])]
            t.check(streamed_calls == got, (streamed_calls, got))
            t.check(chunks[-1]["choices"][0]["finish_reason"] == out["choices"][0]["finish_reason"], chunks[-1])

            # separate_reasoning false, tool_choice none: the text as the model wrote it.
            plain = post(port, CHAT, dict(body, separate_reasoning=False, tool_choice="none"))
            plain_raw = post(port, "/generate", {"text": hf_environment().from_string(template).render(
                messages=MESSAGES, tools=None, documents=None, add_generation_prompt=True),
                "sampling_params": {"max_new_tokens": 24, "temperature": 0}})["text"]
            t.check(plain["choices"][0]["message"]["content"] == plain_raw, (plain, plain_raw))
            t.check("reasoning_content" not in plain["choices"][0]["message"], plain)

            # Bad schemas and what rlserve cannot do are refused naming the field.
            hi = [{"role": "user", "content": "hi"}]
            check_error(port, CHAT, {"messages": hi, "tools": [TOOLS[0], {"type": "function", "function": {"name": ""}}]},
                        400, "tools[1].function.name", ["non-empty string"])
            check_error(port, CHAT, {"messages": hi, "tools": [{"type": "function", "function": {
                "name": "f", "parameters": "not a schema"}}]}, 400, "tools[0].function.parameters", ["schema"])
            check_error(port, CHAT, {"messages": hi, "tools": [{"type": "code_interpreter"}]}, 400, "tools[0].type",
                        ["function"])
            check_error(port, CHAT, {"messages": hi, "tools": TOOLS, "tool_choice": "required"}, 400, "tool_choice",
                        ["constrained decoding"])
            check_error(port, CHAT, {"messages": hi, "tools": TOOLS, "tool_choice": {
                "type": "function", "function": {"name": "get_time"}}}, 400, "tool_choice", ["constrained decoding"])
            code, info = t.http(port, "GET", "/server_info")
            t.check(code in (200, 401), info)
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=30)
        t.check(proc.returncode == 0, f"serve exited with {proc.returncode}: {err}")
        print("ok: tools and reasoning on /v1/chat/completions (template, split, stream, refusals)")


if __name__ == "__main__":
    main()
