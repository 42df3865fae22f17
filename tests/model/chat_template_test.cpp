// Finding and rendering a model's chat template (model/chat_template.hpp): chat_template.jinja
// before tokenizer_config.json, named templates, the special tokens a template sees, the
// variables the request sets, and make-model's Qwen3-style template on a conversation.
#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "model/chat_template.hpp"
#include "model/make_model.hpp"

namespace fs = std::filesystem;
using rlserve::model::chat_render_options;
using rlserve::model::chat_template;
using ojson = nlohmann::ordered_json;

namespace {

struct temp_model_dir {
  fs::path dir;
  temp_model_dir() {
    dir = fs::temp_directory_path() / ("rlserve-chat-template-" + std::to_string(::getpid()) + "-" +
                                       std::to_string(reinterpret_cast<uintptr_t>(this)));
    fs::create_directories(dir);
  }
  ~temp_model_dir() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(dir / name) << text;
  }
};

ojson user(const std::string& text) { return ojson::array({{{"role", "user"}, {"content", text}}}); }

} // namespace

BOOST_AUTO_TEST_SUITE(chat_template_test)

BOOST_AUTO_TEST_CASE(tokenizer_config_template_sees_its_special_tokens) {
  temp_model_dir m;
  m.write("tokenizer_config.json",
          R"({"chat_template": "{{ bos_token }}{% for x in messages %}{{ x.content }}{{ eos_token }}{% endfor %})"
          R"({{ '>' if add_generation_prompt }}", "bos_token": {"content": "<s>"}, "eos_token": "</s>"})");
  auto t = chat_template::load(m.dir);
  BOOST_REQUIRE_MESSAGE(t, t.error());
  BOOST_REQUIRE(t->has_value());
  auto out = (*t)->render(user("hi"));
  BOOST_REQUIRE_MESSAGE(out, out.error());
  BOOST_TEST(*out == "<s>hi</s>>");
  chat_render_options no_prompt;
  no_prompt.add_generation_prompt = false;
  BOOST_TEST(*(*t)->render(user("hi"), no_prompt) == "<s>hi</s>");
}

BOOST_AUTO_TEST_CASE(chat_template_jinja_comes_first_and_named_lists_use_default) {
  temp_model_dir m;
  m.write("tokenizer_config.json",
          R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  auto t = chat_template::load(m.dir);
  BOOST_REQUIRE_MESSAGE(t && t->has_value(), t.error());
  BOOST_TEST(*(*t)->render(user("x")) == "D");
  m.write("chat_template.jinja", "J{{ messages|length }}");
  t = chat_template::load(m.dir);
  BOOST_REQUIRE_MESSAGE(t && t->has_value(), t.error());
  BOOST_TEST(*(*t)->render(user("x")) == "J1");
}

BOOST_AUTO_TEST_CASE(missing_and_broken_templates) {
  temp_model_dir m;
  auto none = chat_template::load(m.dir);
  BOOST_REQUIRE(none);
  BOOST_TEST(!none->has_value());
  m.write("tokenizer_config.json", R"({"chat_template": "{% if x %}"})");
  auto broken = chat_template::load(m.dir);
  BOOST_REQUIRE(!broken);
  BOOST_TEST(broken.error().find("tokenizer_config.json: chat template: line 1: expected 'elif'") != std::string::npos,
             broken.error());
}

BOOST_AUTO_TEST_CASE(kwargs_reach_the_template_but_not_over_the_request) {
  temp_model_dir m;
  m.write("chat_template.jinja", "{{ 'off' if enable_thinking is defined and enable_thinking is false else 'on' }}");
  auto t = chat_template::load(m.dir);
  BOOST_REQUIRE(t && t->has_value());
  chat_render_options o;
  BOOST_TEST(*(*t)->render(user("x"), o) == "on");
  o.kwargs = {{"enable_thinking", false}};
  BOOST_TEST(*(*t)->render(user("x"), o) == "off");
  o.kwargs = {{"messages", ojson::array()}};
  auto refused = (*t)->render(user("x"), o);
  BOOST_REQUIRE(!refused);
  BOOST_TEST(refused.error().find("chat_template_kwargs.messages") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(make_model_writes_a_qwen3_style_template) {
  temp_model_dir m;
  rlserve::model::make_model_options o;
  o.out = m.dir;
  o.preset = "tiny";
  auto made = rlserve::model::make_model(o);
  BOOST_REQUIRE_MESSAGE(made, made.error());
  auto t = chat_template::load(m.dir);
  BOOST_REQUIRE_MESSAGE(t && t->has_value(), t.error());
  ojson messages = ojson::array({{{"role", "system"}, {"content", "S"}},
                                 {{"role", "user"}, {"content", "Q"}},
                                 {{"role", "assistant"}, {"content", "<think>\nr\n</think>\n\nA"}},
                                 {{"role", "user"}, {"content", "Q2"}}});
  chat_render_options opts;
  opts.kwargs = {{"enable_thinking", false}};
  auto out = (*t)->render(messages, opts);
  BOOST_REQUIRE_MESSAGE(out, out.error());
  // Reasoning before the last query is dropped; thinking off closes an empty <think> block.
  BOOST_TEST(*out == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nA"
                     "<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

BOOST_AUTO_TEST_SUITE_END()
