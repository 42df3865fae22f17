// OpenAI request bodies (messages/openai.hpp) and the chat template they are rendered with
// (model/chat_template.hpp, model/jinja.hpp): the first byte picks the completion reader (even)
// or the chat reader (odd); an accepted chat is rendered with make-model's Qwen3-style template,
// as /v1/chat/completions renders it. Beyond "no crash, no sanitizer report": an accepted
// completion has exactly one prompt form, and a render either succeeds or says why.
#include <cstddef>
#include <cstdint>
#include <optional>

#include "fuzz/fuzz_support.hpp"
#include "messages/openai.hpp"
#include "model/chat_template.hpp"
#include "model/tiny_tokenizer.hpp"

namespace {

const rlserve::model::chat_template* qwen3_style_template() {
  static const std::optional<rlserve::model::chat_template> t = []() -> std::optional<rlserve::model::chat_template> {
    auto dir = rlserve_fuzz::scratch_dir() / "tiny_tokenizer";
    if (!rlserve::model::write_tiny_tokenizer(dir, 1024))
      rlserve_fuzz::broken("cannot write the tiny tokenizer");
    auto loaded = rlserve::model::chat_template::load(dir);
    if (!loaded || !*loaded)
      rlserve_fuzz::broken("make-model's chat template does not load");
    return std::move(**loaded);
  }();
  return &*t;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size == 0)
    return 0;
  auto body = rlserve_fuzz::as_text(data + 1, size - 1);
  if (data[0] % 2 == 0) {
    auto r = rlserve::parse_openai_completion_request(body, 4096);
    if (r && r->generate.text.has_value() == r->generate.input_ids.has_value())
      rlserve_fuzz::broken("a completion with both or neither prompt forms");
    return 0;
  }
  auto r = rlserve::parse_openai_chat_request(body);
  if (!r)
    return 0;
  rlserve::model::chat_render_options options;
  options.kwargs = r->chat_template_kwargs;
  auto text = qwen3_style_template()->render(r->messages, options);
  if (!text && text.error().empty())
    rlserve_fuzz::broken("a failed render without a message");
  return 0;
}
