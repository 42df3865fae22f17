// A chat reply's text split into reasoning, content and tool calls (see chat_output.hpp).
#include "net/chat_output.hpp"

namespace rlserve::net {

chat_output_stream::chat_output_stream(chat_parsing p) : p_(std::move(p)) {
  if (p_.reasoning)
    reasoning_.emplace(p_.starts_in_reasoning);
  if (p_.tool_format)
    tools_.emplace(*p_.tool_format, p_.tools);
}

// Tool calls are looked for in the answer only: a call written while thinking is part of the
// thinking (SGLang parses calls out of the text after the reasoning).
chat_delta chat_output_stream::tools_over(reasoning_delta r, bool last) {
  chat_delta out;
  out.reasoning = std::move(r.reasoning);
  if (!tools_) {
    out.content = std::move(r.content);
    return out;
  }
  auto t = tools_->feed(r.content);
  out.content = std::move(t.content);
  out.calls = std::move(t.calls);
  if (last) {
    auto f = tools_->finish();
    out.content += f.content;
    for (auto& c : f.calls)
      out.calls.push_back(std::move(c));
  }
  calls_ += out.calls.size();
  return out;
}

chat_delta chat_output_stream::feed(std::string_view text) {
  if (reasoning_)
    return tools_over(reasoning_->feed(text), false);
  return tools_over(reasoning_delta{{}, std::string(text)}, false);
}

chat_delta chat_output_stream::finish() {
  if (reasoning_)
    return tools_over(reasoning_->finish(), true);
  return tools_over({}, true);
}

chat_delta parse_chat_output(const chat_parsing& p, std::string_view text) {
  chat_output_stream s(p);
  auto a = s.feed(text);
  auto b = s.finish();
  a.reasoning += b.reasoning;
  a.content += b.content;
  for (auto& c : b.calls)
    a.calls.push_back(std::move(c));
  return a;
}

} // namespace rlserve::net
