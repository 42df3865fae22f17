// Reasoning split from the answer (see reasoning_parser.hpp). The tags and the names are SGLang's
// (python/sglang/srt/parser/reasoning_parser.py); whitespace handling follows its one-shot parse.
#include "net/reasoning_parser.hpp"

#include <algorithm>

#include "net/tool_call_parser.hpp" // partial_marker_suffix

namespace rlserve::net {

namespace {

constexpr std::string_view k_start = "<think>";
constexpr std::string_view k_end = "</think>";

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

std::string_view ltrim(std::string_view s) {
  while (!s.empty() && is_ws(s.front()))
    s.remove_prefix(1);
  return s;
}

} // namespace

std::optional<reasoning_format> find_reasoning_format(std::string_view name) {
  if (name == "qwen3" || name == "glm45")
    return reasoning_format{.forced = false, .gated_by_enable_thinking = true};
  if (name == "qwen3-thinking" || name == "deepseek-r1")
    return reasoning_format{.forced = true, .gated_by_enable_thinking = false};
  return std::nullopt;
}

std::string reasoning_format_names() { return "qwen3, glm45, qwen3-thinking, deepseek-r1"; }

bool prompt_opens_reasoning(std::string_view prompt) {
  while (!prompt.empty() && is_ws(prompt.back()))
    prompt.remove_suffix(1);
  return prompt.ends_with(k_start);
}

void reasoning_stream::emit_reasoning(std::string_view text, reasoning_delta& out) {
  if (!reasoning_started_) {
    text = ltrim(text);
    if (text.empty())
      return;
    reasoning_started_ = true;
  }
  std::size_t keep = text.size();
  while (keep > 0 && is_ws(text[keep - 1]))
    --keep;
  if (keep == 0) {
    pending_ws_ += text;
    return;
  }
  out.reasoning += pending_ws_;
  out.reasoning += text.substr(0, keep);
  pending_ws_.assign(text.substr(keep));
}

void reasoning_stream::emit_content(std::string_view text, reasoning_delta& out) {
  if (strip_content_ && !content_started_) {
    text = ltrim(text);
    if (text.empty())
      return;
    content_started_ = true;
  }
  out.content += text;
}

reasoning_delta reasoning_stream::feed(std::string_view text) {
  reasoning_delta out;
  if (state_ == state::content) {
    emit_content(text, out);
    return out;
  }
  held_.append(text);
  std::string_view rest = held_;
  if (state_ == state::opening) {
    auto head = ltrim(rest);
    if (head.starts_with(k_start)) {
      rest = head.substr(k_start.size());
      state_ = state::reasoning;
    } else if (head.empty() || k_start.starts_with(head)) {
      return out; // whitespace, or a partial <think>: wait
    } else {
      state_ = forced_ ? state::reasoning : state::content;
    }
  }
  if (state_ == state::content) {
    emit_content(rest, out);
    held_.clear();
    return out;
  }
  auto end = rest.find(k_end);
  if (end == std::string_view::npos) {
    auto partial = partial_marker_suffix(rest, k_end);
    emit_reasoning(rest.substr(0, rest.size() - partial), out);
    held_ = std::string(rest.substr(rest.size() - partial));
    return out;
  }
  emit_reasoning(rest.substr(0, end), out);
  pending_ws_.clear(); // the whitespace before </think> is not reasoning
  state_ = state::content;
  strip_content_ = true;
  auto after = std::string(rest.substr(end + k_end.size()));
  held_.clear();
  emit_content(after, out);
  return out;
}

reasoning_delta reasoning_stream::finish() {
  reasoning_delta out;
  if (state_ == state::opening) {
    // Never decided: whitespace or a partial "<think>" only.
    if (forced_)
      emit_reasoning(held_, out);
    else
      emit_content(held_, out);
  } else if (state_ == state::reasoning) {
    emit_reasoning(held_, out); // cut inside thinking: a partial "</think>" is reasoning text
  }
  held_.clear();
  pending_ws_.clear();
  return out;
}

reasoning_result parse_reasoning(bool starts_in_reasoning, std::string_view text) {
  reasoning_stream s(starts_in_reasoning);
  auto a = s.feed(text);
  auto b = s.finish();
  return {a.reasoning + b.reasoning, a.content + b.content};
}

} // namespace rlserve::net
