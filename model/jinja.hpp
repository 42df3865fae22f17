// A Jinja subset for chat templates (tokenizer_config.json's `chat_template`), rendering what
// Python's jinja2 renders in the environment Hugging Face's apply_chat_template sets up:
// trim_blocks and lstrip_blocks on, loop controls (break / continue), no autoescaping, the
// default Undefined, and HF's `tojson` (json.dumps with ensure_ascii=False). The published
// templates of tests/data/chat_templates/ (Qwen3, GLM-4.6, DeepSeek-V3.1, DeepSeek-R1) render
// byte-identically to jinja2 (tests/python/test_chat_template_parity.py).
//
//   auto t = rlserve::model::jinja::template_program::parse(source);
//   if (!t) ...t.error()...                      // "line 3: expected 'endfor', got 'endif'"
//   auto text = t->render({{"messages", msgs}, {"add_generation_prompt", true}});
//
// No C++ Jinja implementation can be installed where rlserve is built (Debian ships none, and
// the build machines reach only Debian's and PyPI's registries), so this one is sized for chat
// templates. What it supports (anything else is a parse or render error naming it):
//
// - Tags: {{ }}, {% %}, {# #}, with '-' and '+' whitespace control. Statements: if / elif /
//   else, for (tuple targets, `if` filter, `else`, the `loop` object: index, index0, revindex,
//   revindex0, first, last, length, previtem, nextitem), set (names, namespace attributes,
//   block set), break, continue, macro (positional and keyword arguments with defaults),
//   generation / endgeneration (HF's marker: renders its body).
// - Expressions: literals (strings with Python escapes, integers, floats, true / false / none
//   in both cases, lists, tuples, dicts), names, `.attr`, `[key]`, slices `[a:b:c]`, calls with
//   keyword arguments, `a if c else b`, or / and / not, comparisons (== != < <= > >= in, not in),
//   + - * / // % ** ~, unary - +.
// - Filters: abs, capitalize, count, d / default, dictsort, first, float, indent, int, items,
//   join, last, length, list, lower, map (attribute= or a filter name), reject, rejectattr,
//   replace, reverse, round, safe, select, selectattr, sort, string, title, tojson, trim, unique,
//   upper, wordcount. tojson takes HF's arguments: ensure_ascii, indent (spaces or a string),
//   separators, sort_keys, by position in that order or by name.
// - Tests: boolean, callable, defined, divisibleby, eq / equalto / ==, even, false, float, ge,
//   gt, in, integer, iterable, le, lower, lt, mapping, ne, none, number, odd, sameas, sequence,
//   string, true, undefined, upper.
// - Globals: namespace(...), range(...), raise_exception(message) (HF's: fails the render with
//   the message), strftime_now(format) (HF's: the local time).
// - Methods: strings: startswith, endswith, split, rsplit, strip, lstrip, rstrip, upper, lower,
//   title, capitalize, replace, find, count, join; dicts: items, keys, values, get.
// Not supported: extends / block / include / import, call / filter blocks, recursive loops,
// string % formatting, `is` tests beyond the list above.
//
// Values follow Python: an undefined variable renders as "" and is false; reading an attribute
// of it is an error (as jinja2's default Undefined); none renders "None"; dict attribute access
// falls back to the key; negative indexes count from the end.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "messages/expected.hpp"

namespace rlserve::model::jinja {

struct options {
  bool trim_blocks = true;   // a newline right after a block tag is dropped
  bool lstrip_blocks = true; // spaces and tabs before a block tag on its line are dropped
};

class template_program {
public:
  // Parses a whole template; the error names the line and what was expected.
  static expected<template_program> parse(std::string_view source, options opts = {});
  // Renders with `variables` (a JSON object) as the global names. Errors name what failed
  // (raise_exception's message, a type error, an undefined attribute).
  expected<std::string> render(const nlohmann::ordered_json& variables) const;

  struct program; // the parsed template; defined in jinja.cpp

private:
  explicit template_program(std::shared_ptr<const program> p) : program_(std::move(p)) {}
  std::shared_ptr<const program> program_;
};

} // namespace rlserve::model::jinja
