// A model's chat template: tokenizer_config.json's `chat_template` (or the chat_template.jinja
// file newer Hugging Face checkpoints save beside it) rendered as apply_chat_template renders it,
// with model/jinja.hpp.
//
//   auto t = chat_template::load(model_dir);        // nullopt inside: the model has none
//   auto prompt = (*t)->render(messages, {.kwargs = {{"enable_thinking", false}}});
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "messages/expected.hpp"
#include "model/jinja.hpp"

namespace rlserve::model {

struct chat_render_options {
  bool add_generation_prompt = true;
  // Tool definitions (a JSON list) or null: the template's `tools` variable.
  nlohmann::ordered_json tools = nullptr;
  // More variables (`enable_thinking`, ...): OpenAI's `chat_template_kwargs`. They may not name
  // messages, tools or add_generation_prompt.
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
};

class chat_template {
public:
  // The template of a model directory: chat_template.jinja when present, else
  // tokenizer_config.json's chat_template (a string, or a list of {name, template} of which the
  // one named "default" is used). nullopt when the model has none; an error when a file cannot
  // be read or the template does not parse (naming the file and the line).
  static expected<std::optional<chat_template>> load(const std::filesystem::path& model_dir);
  // From a template's text and tokenizer_config.json's JSON (for its special tokens; may be {}).
  static expected<chat_template> from_source(std::string_view source,
                                             const nlohmann::json& tokenizer_config, std::string where);

  // The prompt for `messages` (a JSON list of message objects, as the client sent them). The
  // variables are HF's: messages, tools, add_generation_prompt, the special tokens of
  // tokenizer_config.json (bos_token, eos_token, unk_token, pad_token,
  // additional_special_tokens), then the kwargs.
  expected<std::string> render(const nlohmann::ordered_json& messages,
                               const chat_render_options& options = {}) const;

  // Where the template came from ("DIR/tokenizer_config.json"), for messages.
  const std::string& where() const { return where_; }

private:
  chat_template(jinja::template_program program, nlohmann::ordered_json special_tokens, std::string where)
    : program_(std::move(program)), special_tokens_(std::move(special_tokens)), where_(std::move(where)) {}
  jinja::template_program program_;
  nlohmann::ordered_json special_tokens_; // name -> text
  std::string where_;
};

} // namespace rlserve::model
