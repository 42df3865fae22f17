// `rlserve chat-template`: render a model's chat template (model/chat_template.hpp) outside the
// engine, as /v1/chat/completions renders it, to see the exact prompt a chat becomes. The Python
// test tests/python/test_chat_template.py drives it with --requests and compares every line with
// the `jinja2` package.
//
//   rlserve chat-template --model DIR --messages '[{"role": "user", "content": "Hi"}]'
//   rlserve chat-template --template FILE --requests chats.jsonl     -> one JSON line each
//
// A line of --requests is {"messages": [...], "add_generation_prompt": true, "tools": null,
// "kwargs": {...}}; the answer is {"text": ...} or {"error": ...} (ASCII-only JSON, so a
// U+2028 in a prompt cannot split the line).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "apps/command.hpp"
#include "model/chat_template.hpp"

namespace rlserve::apps {

namespace {

struct chat_template_options {
  std::string model;
  std::string template_file;
  std::string messages;
  std::string requests;
  bool no_generation_prompt = false;
};

model::chat_template load(const chat_template_options& o) {
  if (!o.template_file.empty()) {
    std::ifstream in(o.template_file, std::ios::binary);
    if (!in)
      throw command_failed(o.template_file + ": cannot open");
    std::ostringstream text;
    text << in.rdbuf();
    auto t = model::chat_template::from_source(text.str(), nlohmann::json::object(), o.template_file);
    if (!t)
      throw command_failed(t.error());
    return std::move(*t);
  }
  auto t = model::chat_template::load(o.model);
  if (!t)
    throw command_failed(t.error());
  if (!*t)
    throw command_failed(o.model + ": the model has no chat template");
  return std::move(**t);
}

nlohmann::ordered_json render_one(const model::chat_template& t, const nlohmann::ordered_json& request) {
  model::chat_render_options options;
  options.add_generation_prompt = request.value("add_generation_prompt", true);
  if (request.contains("tools"))
    options.tools = request["tools"];
  if (request.contains("kwargs"))
    options.kwargs = request["kwargs"];
  auto text = t.render(request.value("messages", nlohmann::ordered_json::array()), options);
  if (!text)
    return {{"error", text.error()}};
  return {{"text", *text}};
}

void run(const chat_template_options& o) {
  auto t = load(o);
  if (o.requests.empty()) {
    auto messages = nlohmann::ordered_json::parse(o.messages, nullptr, false);
    if (messages.is_discarded())
      throw command_failed("--messages: not JSON");
    nlohmann::ordered_json request = {{"messages", messages}, {"add_generation_prompt", !o.no_generation_prompt}};
    auto out = render_one(t, request);
    if (out.contains("error"))
      throw command_failed(out["error"].get<std::string>());
    std::fwrite(out["text"].get_ref<const std::string&>().data(), 1, out["text"].get_ref<const std::string&>().size(),
                stdout);
    return;
  }
  std::ifstream in(o.requests, std::ios::binary);
  if (!in)
    throw command_failed(o.requests + ": cannot open");
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty())
      continue;
    auto request = nlohmann::ordered_json::parse(line, nullptr, false);
    if (request.is_discarded() || !request.is_object())
      throw command_failed(o.requests + ": line " + std::to_string(n) + " is not a JSON object");
    std::cout << render_one(t, request).dump(-1, ' ', true, nlohmann::ordered_json::error_handler_t::replace)
              << "\n";
  }
  std::cout.flush();
}

void add_chat_template(CLI::App& app) {
  auto o = std::make_shared<chat_template_options>();
  auto* cmd = app.add_subcommand("chat-template", "Render a model's chat template as /v1/chat/completions does");
  auto* model = cmd->add_option("--model", o->model, "model directory (tokenizer_config.json, chat_template.jinja)");
  auto* file = cmd->add_option("--template", o->template_file, "a template file instead of a model's");
  auto* messages = cmd->add_option("--messages", o->messages, "the messages as a JSON list (prints the prompt)");
  auto* requests = cmd->add_option("--requests", o->requests, "a JSON-lines file of requests (prints a JSON line each)");
  cmd->add_flag("--no-generation-prompt", o->no_generation_prompt, "with --messages: add_generation_prompt false");
  model->excludes(file);
  messages->excludes(requests);
  cmd->callback([o, model, file, messages, requests] {
    if (model->count() + file->count() == 0)
      throw command_failed("give --model or --template");
    if (messages->count() + requests->count() == 0)
      throw command_failed("give --messages or --requests");
    run(*o);
  });
}

const command_registrar registrar{85, add_chat_template};

} // namespace

} // namespace rlserve::apps
