"""The public chat templates of the Qwen3, GLM-4.5 and DeepSeek-V3 families
(tests/data/chat_templates/, origins in its README) rendered by rlserve (`rlserve chat-template
--model DIR`, a model directory holding chat_template.jinja and tokenizer_config.json, as a
served model does) and by the `jinja2` package configured the way transformers'
apply_chat_template configures it, over conversations that reach the templates' branches:
single and multi-turn chats, system prompts, reasoning (reasoning_content and <think> inside
content), tool definitions with nested JSON-schema parameters and non-ASCII text, assistant
tool calls with arguments as a dict and as a JSON string, runs of tool results, generation
prompt on and off, and each family's keyword arguments (enable_thinking, thinking).

Every rendering must be byte-identical. Where jinja2 fails (a template that indexes a string
argument as a dict, say), rlserve must fail too, with an error rather than a crash. Each
template must also render most requests, so a template that fails everywhere cannot pass.
"""
import itertools
import json
import os
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

sys.path.insert(0, os.path.dirname(__file__))
import rlserve_testlib as t  # noqa: E402

TEMPLATE_DIR = os.path.join(os.environ.get("RLSERVE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                            "tests", "data", "chat_templates")


def transformers_environment():
    """jinja2 as transformers' chat_template_utils sets it up: a sandbox that cannot mutate
    its inputs, blocks that take their trailing newline and their indentation with them,
    break/continue, a tojson that is plain json.dumps (no HTML escaping, non-ASCII kept), and
    the two globals templates call."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def strftime_now(fmt):
        raise AssertionError("no template under test reads the clock")

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def reference(template, request, special_tokens):
    """transformers' rendering of one request (its variables in its order: the special tokens
    and the keyword arguments, then messages, tools, documents, add_generation_prompt), or None
    where the template fails."""
    variables = dict(special_tokens)
    variables.update(request.get("kwargs", {}))
    variables.update(messages=request["messages"], tools=request.get("tools"), documents=None,
                     add_generation_prompt=request.get("add_generation_prompt", True))
    try:
        return transformers_environment().from_string(template).render(**variables)
    except jinja2.exceptions.TemplateError:
        return None
    except (TypeError, ValueError, AttributeError, IndexError, KeyError):
        return None


# Tool definitions as OpenAI clients send them: nested schemas, enums, arrays of objects,
# floats, non-ASCII and escape-worthy text (tojson must write them as json.dumps does).
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Météo actuelle — 天气预报, in °C",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. \"Zürich\""},
            "days": {"type": "integer", "minimum": 1, "maximum": 14, "default": 2},
            "units": {"type": "string", "enum": ["metric", "imperial"]},
            "threshold": {"type": "number", "default": 0.5, "exclusiveMinimum": 1e-05, "multipleOf": 100.0},
        }, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "schedule",
        "description": "Plan events.\nTabs\tand back\\slashes, a control \u0001 and a line separator \u2028.",
        "parameters": {"type": "object", "properties": {
            "events": {"type": "array", "items": {"type": "object", "properties": {
                "title": {"type": "string"},
                "when": {"type": "object", "properties": {"start": {"type": "string", "format": "date-time"},
                                                           "hours": {"type": "array", "items": {"type": "integer"}}}},
                "tags": {"type": "array", "items": {"type": "string"}}}}},
            "dry_run": {"type": "boolean", "default": False},
            "note": {"type": ["string", "null"], "default": None},
        }, "required": ["events"]}}},
    {"type": "function", "function": {"name": "clock", "description": "The time.",
                                      "parameters": {"type": "object", "properties": {}}}},
]

WEATHER_ARGS = {"city": "Zürich", "days": 2, "units": "metric", "threshold": 0.5}
# Qwen3-Coder prints a non-string argument with Python's str(): the no-break space and the
# line separator must come out escaped, as repr escapes them.
SCHEDULE_ARGS = {"events": [{"title": "Lunch\u00a0🍜 at noon\u2028sharp", "when": {"start": "2025-01-02T12:00", "hours": [12, 13]},
                             "tags": ["food"]}], "dry_run": True, "note": None}


def tool_calls(as_string):
    def arguments(a):
        return json.dumps(a, ensure_ascii=False) if as_string else a
    return [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments(WEATHER_ARGS)}},
            {"id": "call_2", "type": "function", "function": {"name": "schedule", "arguments": arguments(SCHEDULE_ARGS)}}]


SYSTEM = {"role": "system", "content": "You are a careful assistant."}
USER = {"role": "user", "content": "What is 2 + 2?"}


def tool_turns(as_string, content):
    return [SYSTEM, {"role": "user", "content": "Weather in Zürich, and plan lunch?"},
            {"role": "assistant", "content": content, "tool_calls": tool_calls(as_string)},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21, \"sky\": \"sunny ☀\"}"},
            {"role": "tool", "tool_call_id": "call_2", "content": "scheduled"}]


# Conversations by name, so a difference names the one that differs.
CONVERSATIONS = {
    "single turn": [USER],
    "system prompt": [SYSTEM, USER],
    "multi-turn": [SYSTEM, USER, {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3 + 3?"}],
    "two system prompts": [SYSTEM, {"role": "system", "content": "Answer in French."}, USER],
    "reasoning_content, last turn": [USER, {"role": "assistant", "content": "4", "reasoning_content": "2 and 2 make 4"}],
    "reasoning_content, history": [USER, {"role": "assistant", "content": "4", "reasoning_content": "2 and 2"},
                                   {"role": "user", "content": "And 3 + 3?"}],
    "think in content, last turn": [SYSTEM, USER,
                                    {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"}],
    "think in content, history": [USER, {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
                                  {"role": "user", "content": "And 3 + 3?"},
                                  {"role": "assistant", "content": "<think>again</think>6"}],
    "tool calls, dict arguments": tool_turns(False, ""),
    "tool calls, string arguments": tool_turns(True, ""),
    "tool calls with text": tool_turns(False, "Let me check."),
}
# The templates disagree on the shape of a call's arguments (GLM iterates a dict, DeepSeek
# concatenates a string, Qwen3 takes either), so the longer tool conversations come in both.
for as_string, shape in ((False, "dict"), (True, "string")):
    CONVERSATIONS.update({
        f"tool calls, content none, {shape} arguments": tool_turns(as_string, None),
        f"tool calls, then answer, {shape} arguments": tool_turns(as_string, "") + [
            {"role": "assistant", "content": "<think>sunny</think>It is 21 °C and sunny; lunch is planned."},
            {"role": "user", "content": "Thanks!"}],
        f"tool result last, {shape} arguments": [
            USER, {"role": "assistant", "content": "", "tool_calls": tool_calls(as_string)[:1]},
            {"role": "tool", "content": "21"}],
    })
CONVERSATIONS.update({
    "non-ASCII and whitespace": [{"role": "user", "content": "emoji 😀, 中文, tabs\tand\nnewlines  "},
                                 {"role": "assistant", "content": "  réponse  \n"}],
    "user asks /nothink": [{"role": "user", "content": "quick answer /nothink"}],
    "content parts": [{"role": "user", "content": [{"type": "text", "text": "part one "}, {"type": "text", "text": "two"}]}],
    "assistant prefix": [USER, {"role": "assistant", "content": "The answer is", "prefix": True}],
})

# Each template with the special tokens of its model's tokenizer_config.json and the keyword
# arguments its model card documents.
TEMPLATES = {
    "qwen3.jinja": {
        "tokens": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        "kwargs": [{}, {"enable_thinking": True}, {"enable_thinking": False}],
    },
    "glm-4.6.jinja": {
        "tokens": {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
        "kwargs": [{}, {"enable_thinking": True}, {"enable_thinking": False}],
    },
    "deepseek-v3.1.jinja": {
        "tokens": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
        "kwargs": [{}, {"thinking": True}, {"thinking": False}, {"enable_thinking": True}],
    },
    "qwen3-coder.jinja": {
        "tokens": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        "kwargs": [{}],
    },
    "kimi-k2-thinking.jinja": {  # reads no special token
        "tokens": {},
        "kwargs": [{}],
    },
    "deepseek-r1-distill.jinja": {
        "tokens": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
        "kwargs": [{}],
    },
}


def requests_for(spec):
    out = []
    for (name, messages), kwargs, tools, generation in itertools.product(
            CONVERSATIONS.items(), spec["kwargs"], [None, TOOLS], [True, False]):
        out.append({"name": name, "messages": messages, "kwargs": kwargs, "tools": tools,
                    "add_generation_prompt": generation})
    return out


def model_dir(tmp, template_name, spec):
    """A model directory as a served model has it: the template beside tokenizer_config.json."""
    path = os.path.join(tmp, template_name.replace(".jinja", ""))
    os.makedirs(path)
    with open(os.path.join(TEMPLATE_DIR, template_name), encoding="utf-8") as f:
        source = f.read()
    with open(os.path.join(path, "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write(source)
    with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(dict(spec["tokens"], tokenizer_class="PreTrainedTokenizerFast"), f, ensure_ascii=False)
    return path, source


def bad_templates(tmp):
    """A template's own failure comes back as an error that says what failed, never a crash:
    raise_exception's message and an unknown filter per request, a template that does not
    parse as the command's failure naming the line."""
    cases = {
        "raises": ("{% if messages[0].role != 'user' %}{{ raise_exception('Conversation roles must start with user') }}"
                   "{% endif %}ok", "Conversation roles must start with user"),
        "unknown filter": ("{{ messages | nosuchfilter }}", "unknown filter 'nosuchfilter'"),
    }
    for name, (source, message) in cases.items():
        path = os.path.join(tmp, name.replace(" ", "_"))
        os.makedirs(path)
        with open(os.path.join(path, "chat_template.jinja"), "w") as f:
            f.write(source)
        lines = os.path.join(path, "requests.jsonl")
        with open(lines, "w") as f:
            f.write(json.dumps({"messages": [SYSTEM, USER]}) + "\n")
        got = t.run_json_lines("chat-template", "--model", path, "--requests", lines)
        t.check(len(got) == 1 and message in got[0].get("error", ""), f"{name}: expected an error naming {message!r}, got {got}")
    path = os.path.join(tmp, "unparsable")
    os.makedirs(path)
    with open(os.path.join(path, "chat_template.jinja"), "w") as f:
        f.write("{% for m in messages %}\n{{ m.content }}\n{% endif %}")
    proc = t.run("chat-template", "--model", path, "--messages", json.dumps([USER]), check=False)
    t.check(proc.returncode == 1 and "line 3" in proc.stderr and "endfor" in proc.stderr,
            f"an unparsable template: expected exit 1 naming line 3, got {proc.returncode}: {proc.stderr!r}")


def main():
    total_rendered = 0
    with t.temp_dir() as tmp:
        bad_templates(tmp)
        for template_name, spec in TEMPLATES.items():
            path, source = model_dir(tmp, template_name, spec)
            requests = requests_for(spec)
            lines = os.path.join(tmp, template_name + ".jsonl")
            with open(lines, "w", encoding="utf-8") as f:
                for r in requests:
                    f.write(json.dumps({k: v for k, v in r.items() if k != "name"}, ensure_ascii=False) + "\n")
            got = t.run_json_lines("chat-template", "--model", path, "--requests", lines)
            t.check(len(got) == len(requests), f"{template_name}: {len(got)} answers for {len(requests)} requests")
            rendered = failed_alike = 0
            differences = []
            for request, answer in zip(requests, got):
                want = reference(source, request, spec["tokens"])
                label = (f"{template_name} / {request['name']} / kwargs {request['kwargs']} / "
                         f"tools {'yes' if request['tools'] else 'no'} / generation prompt {request['add_generation_prompt']}")
                if want is None:
                    if "error" in answer:
                        failed_alike += 1
                    else:
                        differences.append(f"{label}: jinja2 fails, rlserve rendered {answer.get('text')!r}")
                    continue
                if answer.get("text") == want:
                    rendered += 1
                else:
                    differences.append(f"{label}:\n  jinja2:  {want!r}\n  rlserve: {answer!r}")
            for d in differences[:10]:
                print(d)
            print(f"{template_name}: {rendered} identical renders, {failed_alike} requests both refuse, "
                  f"{len(differences)} differ (of {len(requests)})")
            t.check(not differences, f"{template_name}: {len(differences)} renders differ from jinja2")
            t.check(rendered >= len(requests) // 2, f"{template_name}: only {rendered} requests render")
            total_rendered += rendered
    print(f"ok: {total_rendered} renders of {len(TEMPLATES)} public templates identical to jinja2's")


if __name__ == "__main__":
    main()
