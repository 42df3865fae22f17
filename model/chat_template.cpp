#include "model/chat_template.hpp"

#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace rlserve::model {

namespace fs = std::filesystem;

namespace {

expected<std::string> read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return fail(path.string() + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad())
    return fail(path.string() + ": cannot read");
  return text.str();
}

// A special token in tokenizer_config.json: its text, or an AddedToken object {"content": ...}.
std::optional<std::string> token_text(const nlohmann::json& v) {
  if (v.is_string())
    return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return std::nullopt;
}

} // namespace

expected<chat_template> chat_template::from_source(std::string_view source,
                                                   const nlohmann::json& tokenizer_config,
                                                   std::string where) {
  auto program = jinja::template_program::parse(source);
  if (!program)
    return fail(where + ": " + program.error());
  nlohmann::ordered_json special = nlohmann::ordered_json::object();
  if (tokenizer_config.is_object()) {
    for (auto name : {"bos_token", "eos_token", "unk_token", "pad_token"})
      if (auto it = tokenizer_config.find(name); it != tokenizer_config.end())
        if (auto text = token_text(*it))
          special[name] = *text;
    if (auto it = tokenizer_config.find("additional_special_tokens");
        it != tokenizer_config.end() && it->is_array()) {
      auto list = nlohmann::ordered_json::array();
      for (const auto& t : *it)
        if (auto text = token_text(t))
          list.push_back(*text);
      special["additional_special_tokens"] = std::move(list);
    }
  }
  return chat_template(std::move(*program), std::move(special), std::move(where));
}

expected<std::optional<chat_template>> chat_template::load(const fs::path& model_dir) {
  std::error_code ec;
  nlohmann::json config = nlohmann::json::object();
  const fs::path config_path = model_dir / "tokenizer_config.json";
  if (fs::exists(config_path, ec)) {
    auto text = read_text(config_path);
    if (!text)
      return std::move(text).take_failure();
    config = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object())
      return fail(config_path.string() + ": not a JSON object");
  }
  const fs::path jinja_path = model_dir / "chat_template.jinja";
  if (fs::exists(jinja_path, ec)) {
    auto text = read_text(jinja_path);
    if (!text)
      return std::move(text).take_failure();
    auto t = from_source(*text, config, jinja_path.string());
    if (!t)
      return std::move(t).take_failure();
    return std::optional<chat_template>(std::move(*t));
  }
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null())
    return std::optional<chat_template>();
  std::string source;
  if (it->is_string()) {
    source = it->get<std::string>();
  } else if (it->is_array()) {
    // Several named templates (tool use, RAG, ...): the default one serves chat completions.
    for (const auto& named : *it)
      if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
          named["template"].is_string())
        source = named["template"].get<std::string>();
    if (source.empty())
      return fail(config_path.string() + ": chat_template is a list without an entry named \"default\"");
  } else {
    return fail(config_path.string() + ": chat_template is neither a string nor a list of named templates");
  }
  auto t = from_source(source, config, config_path.string());
  if (!t)
    return std::move(t).take_failure();
  return std::optional<chat_template>(std::move(*t));
}

expected<std::string> chat_template::render(const nlohmann::ordered_json& messages,
                                            const chat_render_options& options) const {
  nlohmann::ordered_json variables = special_tokens_;
  if (!options.kwargs.is_null() && !options.kwargs.is_object())
    return fail("chat_template_kwargs: expected an object");
  if (options.kwargs.is_object())
    for (auto it = options.kwargs.begin(); it != options.kwargs.end(); ++it) {
      if (it.key() == "messages" || it.key() == "tools" || it.key() == "add_generation_prompt")
        return fail(fmt::format("chat_template_kwargs.{}: set by the request itself, not by a keyword", it.key()));
      variables[it.key()] = it.value();
    }
  variables["messages"] = messages;
  variables["tools"] = options.tools;
  variables["documents"] = nullptr;
  variables["add_generation_prompt"] = options.add_generation_prompt;
  auto out = program_.render(variables);
  if (!out)
    return fail(where_ + ": " + out.error());
  return out;
}

} // namespace rlserve::model
