// A reasoning model's thinking, <think> ... </think>, split from its answer as SGLang's
// --reasoning-parser does, as pure functions. The names are SGLang's:
//
//   qwen3, glm45      thinking when the output opens with <think> (or the prompt ends with it)
//   qwen3-thinking,   always starts thinking: everything up to </think> is reasoning
//   deepseek-r1
//
// Rules (docs/protocol.md, 'Tool calls and reasoning'):
// - Reasoning is what comes before </think>; a leading <think> (after whitespace) is dropped, and
//   so is the whitespace around the reasoning and at the start of the answer.
// - When the prompt ends inside thinking (a template that writes "<think>\n" after the
//   assistant's header, as Qwen3-Thinking-2507's does) the output starts inside it too: the
//   caller says so with `starts_in_reasoning`.
// - An output that never closes its thinking (cut by max_tokens) is all reasoning.
// - Output that does not open with <think>, when thinking is not forced, is all answer.
// The streamed form gives, over any split of the text, deltas whose concatenation is the whole
// parse: parse_reasoning is the stream fed once.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace rlserve::net {

struct reasoning_format {
  bool forced = false; // the output starts inside thinking
  // SGLang gates its qwen3 and glm45 parsers on chat_template_kwargs.enable_thinking (default
  // true): with false the template closes the thinking in the prompt, and nothing is parsed.
  bool gated_by_enable_thinking = false;
};

// SGLang's names: "qwen3", "glm45", "qwen3-thinking", "deepseek-r1". nullopt for another.
std::optional<reasoning_format> find_reasoning_format(std::string_view name);
// The accepted names, for a refusal.
std::string reasoning_format_names();

// Whether a rendered prompt leaves the model inside <think> (it ends with "<think>" and
// whitespace).
bool prompt_opens_reasoning(std::string_view prompt);

struct reasoning_delta {
  std::string reasoning;
  std::string content;
};

class reasoning_stream {
public:
  explicit reasoning_stream(bool starts_in_reasoning) : forced_(starts_in_reasoning) {}
  // The next piece of output (any split).
  reasoning_delta feed(std::string_view text);
  // The output ended: what was held back comes out.
  reasoning_delta finish();

private:
  void emit_reasoning(std::string_view text, reasoning_delta& out);
  void emit_content(std::string_view text, reasoning_delta& out);

  enum class state { opening, reasoning, content };
  bool forced_;
  state state_ = state::opening;
  std::string held_;            // undecided text: the opening, or a partial "</think>"
  bool reasoning_started_ = false; // leading whitespace of the reasoning is dropped
  std::string pending_ws_;      // trailing whitespace of the reasoning so far
  bool content_started_ = false; // leading whitespace of the answer after </think> is dropped
  bool strip_content_ = false;   // the answer follows </think>
};

struct reasoning_result {
  std::string reasoning;
  std::string content;
};
reasoning_result parse_reasoning(bool starts_in_reasoning, std::string_view text);

} // namespace rlserve::net
