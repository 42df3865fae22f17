// What a chat reply's text becomes: reasoning, content and tool calls, the reasoning parser and
// then the tool-call parser over what follows the thinking (SGLang's order), whole and streamed.
// Pure: the call actor keeps one chat_output_stream per choice and writes its deltas as
// OpenAI's chunks (net/openai.hpp).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "net/reasoning_parser.hpp"
#include "net/tool_call_parser.hpp"

namespace rlserve::net {

// Which parsers run for one request (each absent: that part is not parsed).
struct chat_parsing {
  bool reasoning = false;           // split <think> ... </think>
  bool starts_in_reasoning = false; // the parser is forced, or the prompt opened <think>
  std::optional<tool_call_format> tool_format;
  tool_set tools;                   // the request's functions (tool_format set)
  bool any() const { return reasoning || tool_format.has_value(); }
};

struct chat_delta {
  std::string reasoning;
  std::string content;
  std::vector<tool_call> calls;
  bool empty() const { return reasoning.empty() && content.empty() && calls.empty(); }
};

class chat_output_stream {
public:
  explicit chat_output_stream(chat_parsing p);
  chat_delta feed(std::string_view text);
  chat_delta finish();
  // Calls given out so far (the next one's index).
  std::size_t calls() const { return calls_; }

private:
  chat_delta tools_over(reasoning_delta r, bool last);

  chat_parsing p_;
  std::optional<reasoning_stream> reasoning_;
  std::optional<tool_call_stream> tools_;
  std::size_t calls_ = 0;
};

// The whole text at once: the stream fed once.
chat_delta parse_chat_output(const chat_parsing& p, std::string_view text);

} // namespace rlserve::net
