// Tool calls in a model's output, as SGLang's --tool-call-parser finds them, as pure functions:
// the text a chat model wrote (after its reasoning, net/reasoning_parser.hpp) becomes content
// and calls. Three formats, all wrapped in <tool_call> ... </tool_call>:
//
//   qwen25       <tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>   (Qwen2.5, Qwen3)
//   qwen3_coder  <tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>
//   glm45        <tool_call>f\n<arg_key>x</arg_key>\n<arg_value>1</arg_value>\n</tool_call>  (GLM-4.5/4.6)
//
// Rules (docs/protocol.md, 'Tool calls and reasoning'):
// - A block that does not parse (bad JSON, stray tags), that calls a function the request did not
//   offer, or that is never closed is not a call: it stays in the content as the model wrote it,
//   so nothing the model said is lost and no output can fail the request.
// - Whitespace next to a call (the newlines a template puts between blocks) is dropped; all other
//   text, before, between or after calls, is content.
// - `arguments` is the JSON text of an object, written as Python's json.dumps writes it (SGLang's
//   ", " and ": " separators, non-ASCII kept), in the model's key order.
// The streamed form (tool_call_stream) gives, over any split of the text, deltas whose
// concatenation is the whole parse: parse_tool_calls is the stream fed once.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace rlserve::net {

enum class tool_call_format { qwen25, qwen3_coder, glm45 };

// SGLang's parser names: "qwen25" and "qwen" (qwen25), "qwen3_coder", "glm45" and "glm"
// (glm45). nullopt for any other name.
std::optional<tool_call_format> find_tool_call_format(std::string_view name);
// The accepted names, for a refusal: "qwen25, qwen, qwen3_coder, glm45, glm".
std::string tool_call_format_names();

// The functions a request offers: name -> its `parameters` schema (null when it has none).
// qwen3_coder and glm45 write argument values as text; the schema says which are strings.
struct tool_set {
  std::vector<std::pair<std::string, nlohmann::ordered_json>> functions;
  // The function's schema, or null when the request does not offer `name`.
  const nlohmann::ordered_json* find(std::string_view name) const;
};

struct tool_call {
  std::string id;        // set by the caller (the reply's "call_..."); the parser leaves it empty
  std::string name;
  std::string arguments; // a JSON object's text
};

// What a piece of output adds: content text and the calls closed in it.
struct tool_parse_delta {
  std::string content;
  std::vector<tool_call> calls;
};

class tool_call_stream {
public:
  tool_call_stream(tool_call_format format, tool_set tools) : format_(format), tools_(std::move(tools)) {}
  // The next piece of output (any split: bytes, tokens, chunks).
  tool_parse_delta feed(std::string_view text);
  // The output ended: what was held back (a partial tag, an unclosed block) comes out as text.
  tool_parse_delta finish();

private:
  void emit_text(std::string_view text, tool_parse_delta& out);
  void close_block(std::string_view inner, tool_parse_delta& out);

  tool_call_format format_;
  tool_set tools_;
  std::string held_;        // undecided text: a partial "<tool_call>", or an open block's inside
  bool in_block_ = false;   // held_ is the inside of an open <tool_call> block
  std::size_t scanned_ = 0; // of an open block: the bytes known not to start "</tool_call>"
  std::string pending_ws_;  // trailing whitespace of the content so far (dropped before a call)
  bool after_call_ = false; // the last thing out was a call: leading whitespace is dropped
};

struct tool_parse_result {
  std::string content;
  std::vector<tool_call> calls;
};
// The whole output at once.
tool_parse_result parse_tool_calls(tool_call_format format, const tool_set& tools, std::string_view text);

// One block's inside (between <tool_call> and </tool_call>) as a call, or nullopt when it is
// not one (malformed, or a function `tools` does not offer).
std::optional<tool_call> parse_tool_call_block(tool_call_format format, const tool_set& tools,
                                               std::string_view inner);

// JSON written as Python's json.dumps(x, ensure_ascii=False) writes it: ", " and ": ".
std::string python_json_dumps(const nlohmann::ordered_json& x);

// How many trailing characters of `text` are a proper prefix of `marker` (a marker that may be
// completed by the next piece of output).
std::size_t partial_marker_suffix(std::string_view text, std::string_view marker);

} // namespace rlserve::net
