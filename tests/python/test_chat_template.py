"""Chat templates rendered by rlserve's Jinja subset (model/jinja.hpp, through `rlserve
chat-template`) against the `jinja2` package set up as Hugging Face's apply_chat_template sets
it up: a sandboxed environment with trim_blocks, lstrip_blocks and loop controls, `tojson` as
json.dumps(ensure_ascii=False), and raise_exception.

Two sets: the Qwen3-style template that make-model writes, over conversations that reach every
branch of it (system prompts, reasoning kept or dropped, tool calls with dict and string
arguments, runs of tool results, enable_thinking on and off, no generation prompt), and small
templates for each construct of the subset (whitespace control, loops, filters, tests, methods,
macros, slices, numbers). Renders must be byte-identical; where jinja2 fails, rlserve must fail
too.
"""
import json
import os
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

sys.path.insert(0, os.path.dirname(__file__))
import rlserve_testlib as t  # noqa: E402


def hf_environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def reference(template, request, special_tokens=None):
    """jinja2's rendering of one request, or None when jinja2 fails."""
    variables = dict(special_tokens or {})
    variables.update(request.get("kwargs", {}))
    variables.update(messages=request.get("messages", []), tools=request.get("tools"), documents=None,
                     add_generation_prompt=request.get("add_generation_prompt", True))
    try:
        return hf_environment().from_string(template).render(**variables)
    except jinja2.exceptions.TemplateError:
        return None
    except (TypeError, ValueError, AttributeError, IndexError, KeyError, ZeroDivisionError):
        return None


def rlserve_renders(tmp, requests, model=None, template=None):
    path = os.path.join(tmp, "requests.jsonl")
    with open(path, "w") as f:
        for r in requests:
            f.write(json.dumps(r) + "\n")
    source = ["--model", model] if model else ["--template", template]
    return t.run_json_lines("chat-template", *source, "--requests", path)


def compare(name, template, requests, got, special_tokens=None):
    failures = 0
    for i, (request, answer) in enumerate(zip(requests, got)):
        want = reference(template, request, special_tokens)
        if want is None:
            t.check("error" in answer, f"{name} #{i}: jinja2 fails, rlserve rendered {answer.get('text')!r}")
            continue
        if answer.get("text") != want:
            failures += 1
            print(f"{name} #{i}: differs\n  request: {json.dumps(request)[:300]}\n  jinja2:  {want!r}\n"
                  f"  rlserve: {answer!r}")
    t.check(failures == 0, f"{name}: {failures} renders differ from jinja2")


USER = {"role": "user", "content": "What is 2 + 2?"}
SYSTEM = {"role": "system", "content": "You are terse."}
WEATHER_CALL = {"role": "assistant", "content": "",
                "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                                 "arguments": {"city": "Zürich", "days": 2}}},
                               {"function": {"name": "clock", "arguments": "{\"tz\": \"UTC\"}"}}]}

CONVERSATIONS = [
    {"messages": [USER]},
    {"messages": [USER], "kwargs": {"enable_thinking": False}},
    {"messages": [USER], "kwargs": {"enable_thinking": True}},
    {"messages": [SYSTEM, USER]},
    {"messages": [SYSTEM, USER, {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
                  {"role": "user", "content": "And 3 + 3?"}]},
    {"messages": [USER, {"role": "assistant", "content": "4", "reasoning_content": "2 and 2"}],
     "add_generation_prompt": False},
    {"messages": [SYSTEM, {"role": "user", "content": "Weather in Zürich?"}, WEATHER_CALL,
                  {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "12:00"},
                  {"role": "assistant", "content": "<think>sunny at noon</think>Sunny."}],
     "kwargs": {"enable_thinking": False}},
    {"messages": [{"role": "user", "content": "<tool_response>x</tool_response>"}, USER,
                  {"role": "assistant", "content": "a"}, {"role": "tool", "content": "r"}]},
    {"messages": [USER], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]},
    {"messages": [SYSTEM, USER], "tools": [{"type": "function", "function": {"name": "g"}}]},
    {"messages": [{"role": "system", "content": "a"}, {"role": "system", "content": "b"}, USER]},
    {"messages": [{"role": "user", "content": "emoji 😀 and\ttabs\nnewlines  "}, {"role": "assistant"}]},
    {"messages": [{"role": "assistant", "content": None}, {"role": "user", "content": ""}]},
]

SNIPPETS = [
    ("a {{ x }} b\n  {% if x %}\n  yes\n  {% endif %}\nend", {"x": 1}),
    ("{% for i in range(3) %}{{ loop.index }}{{ loop.first }}{{ loop.last }},{% endfor %}", {}),
    ("{%- for k, v in d.items() -%} {{k}}={{v}} {%- endfor %}", {"d": {"b": 1, "a": [1, 2.5, None, True]}}),
    ("{{ 'a,b,,c'.split(',') }} {{ '  x y  '.split() }} {{ 'a b c'.split(None, 1) }} {{ 'a-b-c'.rsplit('-', 1) }}", {}),
    ("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.5e-7 }}", {}),
    ("{{ x is defined }} {{ y is defined }} {{ y }} {{ n is none }} {{ n }} {{ t is true }} {{ 3 is odd }} {{ 4 is divisibleby 2 }}",
     {"x": 0, "n": None, "t": True}),
    ("{{ xs | join(', ') }} {{ xs | length }} {{ xs | first }} {{ xs | last }} {{ xs[::-1] }} {{ xs[1:] }} {{ xs[-1] }}",
     {"xs": ["a", "b", "c"]}),
    ("{{ d | tojson }} {{ d | tojson(indent=2) }} {{ [] | tojson }} {{ 'é\"\\n' | tojson }}",
     {"d": {"z": 1, "a": {"q": [1, 2]}, "u": "ü"}}),
    ("{% set ns = namespace(n=0) %}{% for i in [1,2,3] %}{% set ns.n = ns.n + i %}{% set local = i %}{% endfor %}"
     "{{ ns.n }}|{{ local }}", {}),
    ("{% for m in ms if m.role == 'user' %}{{ loop.index }}:{{ m.content }} {% else %}none{% endfor %}",
     {"ms": [{"role": "user", "content": "a"}, {"role": "x"}, {"role": "user", "content": "b"}]}),
    ("{% for m in [] %}x{% else %}empty{% endfor %}", {}),
    ("{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}", {}),
    ("{{ 'yes' if x else 'no' }} {{ 'a' ~ 1 ~ none }} {{ x and 'b' }} {{ x or 'c' }} {{ not x }}", {"x": ""}),
    ("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', punct='?') }}", {}),
    ("  {%- if true %}\n\tx\n  {%+ if true %}y{% endif %}\n{% endif -%}\n  z", {}),
    ("{# comment #}\n  {# c2 #}\nA\n{{- ' B ' -}}\n C", {}),
    ("{{ '  hi  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ 'hi'.upper() }}|{{ 'Hello World'.lower() }}|"
     "{{ 'a'.startswith(('b','a')) }}|{{ 'abc'.endswith('c') }}", {}),
    ("{{ d.get('a') }} {{ d.get('z', 'dflt') }} {{ d.keys() | list }} {{ d['a'] }} {{ d.a }} {{ d.missing is defined }}",
     {"d": {"a": 1, "b": 2}}),
    ("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | join('+') }} {{ [3,1,2] | sort }} "
     "{{ [1,1,2] | unique | list }}",
     {"ms": [{"role": "user", "content": "a"}, {"role": "x", "content": "q"}, {"role": "user", "content": "b"}]}),
    ("{{ raise_exception('bad role') }}", {}),
    ("{{ x.y }}", {}),
    ("{{ 'abc'[0] }}{{ 'héllo'[1] }}{{ 'héllo' | length }}{{ 'héllo'[1:3] }}", {}),
    ("{{ [1, 'a', none, true, 1.5, {'k': 'v'}] }} {{ {'a': 1} }} {{ \"it's\" }}", {}),
    ("{{ 'x' * 3 }} {{ [0] * 2 }} {{ 10 - 3 - 2 }} {{ 2 + 3 * 4 }} {{ (2 + 3) * 4 }} {{ 1 < 2 < 3 }} {{ 'b' in 'abc' }} "
     "{{ 2 not in [1] }}", {}),
    ("{% set x %}inner {{ 1 + 1 }}{% endset %}[{{ x }}]", {}),
    ("{% if a %}A{% elif b %}B{% else %}C{% endif %}", {"b": 1}),
    ("{{ 'a b c' | wordcount }} {{ 'x\ny' | indent(2, true) }}", {}),
    ("{{ '\\u00e9\\x41\\t|' }}{{ 'a' 'b' }}", {}),
    ("{{ {'a': {'b': 1}}['a']['b'] }} {{ [[1,2],[3]][0][1] }} {{ ms[0].content | trim }}", {"ms": [{"content": "  x  "}]}),
    ("{{ 3 | string + 'x' }} {{ '5' | int + 1 }} {{ '2.5' | float }} {{ -3 | abs }} {{ 2.567 | round(1) }}", {}),
    ("{% for a in xs %}{{ loop.previtem | default('-') }}{{ a }}{{ loop.nextitem | default('-') }} {{ loop.revindex }}"
     "{{ loop.length }};{% endfor %}", {"xs": [1, 2, 3]}),
    ("{{ x | default('d') }} {{ '' | default('e', true) }} {{ none is none }} {{ x is string }} {{ 1 is number }} "
     "{{ xs is iterable }} {{ d is mapping }}", {"xs": [], "d": {}}),
    ("{%- for message in messages %}{{ message.content is string }}{% endfor %}",
     {"messages": [{"role": "user"}, {"role": "user", "content": None}, {"content": [{"type": "text", "text": "x"}]}]}),
    ("{{ true }}{{ True }}{{ none }}{{ False }}", {}),
    # tojson's arguments are HF's: ensure_ascii, indent, separators, sort_keys (positional too).
    ("{{ d | tojson(ensure_ascii=True) }}|{{ d | tojson(separators=(',', ':')) }}|{{ d | tojson(indent='\\t', sort_keys=true) }}|"
     "{{ d | tojson(true, 1) }}|{{ d | tojson(indent=0) }}|{{ d | tojson(indent=2, separators=(', ', ' = ')) }}|{{ d | tojson(2) }}",
     {"d": {"z": "é😀\u007f\u0001\u2028", "a": [1, {"b": None, "c": 1.5, "f": 1e-7}], "é": True}}),
    ("{{ d | tojson(bogus=1) }}", {"d": {}}),
    # repr escapes what str.isprintable rejects (controls, format characters, separators).
    ("{{ d }}|{{ d | string }}|{{ [d.b] }}", {"d": {"b": "é\u00a0\u2028\u200b\u00ad\x7f\x85😀", "c": [1, 2.0]}}),
    # round: half to even on the exact binary value; an int stays an int; floor and ceil.
    ("{{ 2.675 | round(2) }} {{ 2.5 | round }} {{ 3.5 | round }} {{ -0.5 | round }} {{ 1 | round }} {{ 1250 | round(-2) }} "
     "{{ 3.14159 | round(2, 'floor') }} {{ 3.1 | round(0, 'ceil') }} {{ 0.125 | round(2) }} {{ 1e-70 | round(80) }}", {}),
    ("{{ bos_token }}{% for m in messages %}{{ m['role'] | upper }}: {{ m['content'] | trim }}\n{% endfor %}", {}),
]


def main():
    with t.temp_dir() as tmp:
        model = os.path.join(tmp, "model")
        t.run("make-model", "--out", model, "--preset", "tiny", "--seed", "0")
        with open(os.path.join(model, "tokenizer_config.json")) as f:
            config = json.load(f)
        specials = {k: config[k] for k in ("eos_token", "pad_token") if isinstance(config.get(k), str)}
        specials["additional_special_tokens"] = config.get("additional_special_tokens", [])
        got = rlserve_renders(tmp, CONVERSATIONS, model=model)
        compare("qwen3-style template", config["chat_template"], CONVERSATIONS, got, specials)

        snippet_requests = []
        for i, (template, variables) in enumerate(SNIPPETS):
            path = os.path.join(tmp, f"snippet{i}.jinja")
            with open(path, "w") as f:
                f.write(template)
            request = {"messages": variables.get("messages", [{"role": "user", "content": " hi "}]),
                       "kwargs": {k: v for k, v in variables.items() if k != "messages"}}
            answer = rlserve_renders(tmp, [request], template=path)
            compare(f"snippet {i} {template[:40]!r}", template, [request], answer)
            snippet_requests.append(request)
        print(f"ok: {len(CONVERSATIONS)} conversations and {len(SNIPPETS)} templates render as jinja2 renders them")


if __name__ == "__main__":
    main()
