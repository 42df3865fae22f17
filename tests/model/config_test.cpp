// model/config: HF config.json parsing, defaults, and the errors users see for bad files.
#include <boost/test/unit_test.hpp>

#include "tests/support/test_support.hpp"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "model/config.hpp"

namespace fs = std::filesystem;
using rlserve::model::load_model_config;
using rlserve::model::model_config;
using rlserve::model::parse_model_config;
using json = nlohmann::json;

namespace {

using rlserve::test::temp_dir;
using rlserve::test::why;


// A directory under /tmp removed at the end of the test.

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

// The fields of Qwen3-0.6B's config.json (abridged to what matters).
json qwen3_0_6b() {
  return json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
    "sliding_window": null, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
    "vocab_size": 151936})");
}

// Parses `j` and expects a failure whose message contains every one of `parts`.
void expect_error(const json& j, std::initializer_list<std::string> parts) {
  auto c = parse_model_config(j, "cfg.json");
  BOOST_REQUIRE_MESSAGE(!c, "expected a failure for " << j.dump());
  for (const auto& p : parts)
    BOOST_TEST(c.error().find(p) != std::string::npos, "'" << p << "' not in: " << c.error());
}

} // namespace

BOOST_AUTO_TEST_SUITE(config_test)

BOOST_AUTO_TEST_CASE(parses_a_real_qwen3_config) {
  auto c = parse_model_config(qwen3_0_6b(), "cfg.json");
  BOOST_REQUIRE_MESSAGE(c, why(c));
  BOOST_TEST(c->architecture == "Qwen3ForCausalLM");
  BOOST_TEST(c->model_type == "qwen3");
  BOOST_TEST(c->vocab_size == 151936);
  BOOST_TEST(c->hidden_size == 1024);
  BOOST_TEST(c->intermediate_size == 3072);
  BOOST_TEST(c->num_hidden_layers == 28);
  BOOST_TEST(c->num_attention_heads == 16);
  BOOST_TEST(c->num_key_value_heads == 8);
  BOOST_TEST(c->head_dim == 128);
  BOOST_TEST(c->max_position_embeddings == 40960);
  BOOST_TEST(c->rms_norm_eps == 1e-6);
  BOOST_TEST(c->rope_theta == 1e6);
  BOOST_TEST(c->tie_word_embeddings);
  BOOST_TEST(c->bos_token_id.value() == 151643);
  BOOST_TEST((c->eos_token_ids == std::vector<int32_t>{151645}));
  BOOST_TEST(c->torch_dtype == "bfloat16");
  BOOST_TEST(!c->is_moe());
  BOOST_TEST(c->raw["transformers_version"] == "4.51.0");
}

BOOST_AUTO_TEST_CASE(eos_may_be_an_int_a_list_or_absent) {
  auto j = qwen3_0_6b();
  j["eos_token_id"] = json::array({151645, 151643});
  auto c = parse_model_config(j, "cfg.json");
  BOOST_REQUIRE_MESSAGE(c, why(c));
  BOOST_TEST((c->eos_token_ids == std::vector<int32_t>{151645, 151643}));

  j["eos_token_id"] = nullptr;
  c = parse_model_config(j, "cfg.json");
  BOOST_REQUIRE_MESSAGE(c, why(c));
  BOOST_TEST(c->eos_token_ids.empty());

  j.erase("eos_token_id");
  j["bos_token_id"] = nullptr;
  c = parse_model_config(j, "cfg.json");
  BOOST_REQUIRE_MESSAGE(c, why(c));
  BOOST_TEST(c->eos_token_ids.empty());
  BOOST_TEST(!c->bos_token_id.has_value());

  j["eos_token_id"] = json::array({1, "two"});
  expect_error(j, {"cfg.json", "eos_token_id", "\"two\""});
  j["eos_token_id"] = -3;
  expect_error(j, {"eos_token_id", "-3"});
  j["eos_token_id"] = 151936; // == vocab_size: outside the vocabulary
  expect_error(j, {"eos_token_id 151936", "vocab_size 151936"});
}

BOOST_AUTO_TEST_CASE(defaults_follow_transformers) {
  json j = {{"architectures", {"Qwen3ForCausalLM"}}, {"model_type", "qwen3"},
            {"vocab_size", 100}, {"hidden_size", 64}, {"intermediate_size", 128},
            {"num_hidden_layers", 2}, {"num_attention_heads", 4}};
  auto c = parse_model_config(j, "cfg.json");
  BOOST_REQUIRE_MESSAGE(c, why(c));
  BOOST_TEST(c->num_key_value_heads == 4); // = num_attention_heads
  BOOST_TEST(c->head_dim == 16);           // hidden / heads
  BOOST_TEST(c->max_position_embeddings == 32768);
  BOOST_TEST(c->rope_theta == 10000.0);    // Qwen3Config's default
  BOOST_TEST(c->rms_norm_eps == 1e-6);
  BOOST_TEST(!c->tie_word_embeddings);
  BOOST_TEST(c->torch_dtype == "bfloat16");

  j["dtype"] = "float32"; // transformers >= 4.56 spelling
  c = parse_model_config(j, "cfg.json");
  BOOST_REQUIRE_MESSAGE(c, why(c));
  BOOST_TEST(c->torch_dtype == "float32");
}

BOOST_AUTO_TEST_CASE(moe_fields_are_parsed) {
  auto j = qwen3_0_6b();
  j["architectures"] = {"Qwen3MoeForCausalLM"};
  j["model_type"] = "qwen3_moe";
  j["num_experts"] = 128;
  j["num_experts_per_tok"] = 8;
  j["moe_intermediate_size"] = 768;
  j["decoder_sparse_step"] = 1;
  j["norm_topk_prob"] = true;
  j["mlp_only_layers"] = json::array({0, 3});
  auto c = parse_model_config(j, "cfg.json");
  BOOST_REQUIRE_MESSAGE(c, why(c));
  BOOST_TEST(c->is_moe());
  BOOST_TEST(c->num_experts == 128);
  BOOST_TEST(c->num_experts_per_tok == 8);
  BOOST_TEST(c->moe_intermediate_size == 768);
  BOOST_TEST((c->mlp_only_layers == std::vector<int64_t>{0, 3}));

  j["num_experts_per_tok"] = 129;
  expect_error(j, {"num_experts_per_tok 129"});
}

BOOST_AUTO_TEST_CASE(missing_required_fields_are_named) {
  for (const char* field : {"architectures", "vocab_size", "hidden_size", "intermediate_size",
                            "num_hidden_layers", "num_attention_heads"}) {
    auto j = qwen3_0_6b();
    j.erase(field);
    expect_error(j, {"cfg.json", "missing required field", std::string("'") + field + "'"});
  }
}

BOOST_AUTO_TEST_CASE(wrong_types_are_named) {
  auto j = qwen3_0_6b();
  j["hidden_size"] = "1024";
  expect_error(j, {"cfg.json", "'hidden_size'", "must be an integer", "got string"});
  j = qwen3_0_6b();
  j["num_hidden_layers"] = 28.5;
  expect_error(j, {"'num_hidden_layers'", "must be an integer", "28.5"});
  j = qwen3_0_6b();
  j["tie_word_embeddings"] = 1;
  expect_error(j, {"'tie_word_embeddings'", "true or false"});
  j = qwen3_0_6b();
  j["rope_theta"] = "1e6";
  expect_error(j, {"'rope_theta'", "a number"});
  j = qwen3_0_6b();
  j["architectures"] = "Qwen3ForCausalLM";
  expect_error(j, {"'architectures'", "list of strings"});
  expect_error(json::array({1, 2}), {"cfg.json", "JSON object"});
}

BOOST_AUTO_TEST_CASE(inconsistent_or_unsupported_configs_are_refused) {
  auto j = qwen3_0_6b();
  j["num_key_value_heads"] = 5;
  expect_error(j, {"num_attention_heads 16", "num_key_value_heads 5"});
  j = qwen3_0_6b();
  j["hidden_size"] = 0;
  expect_error(j, {"'hidden_size' must be positive"});
  j = qwen3_0_6b();
  j["head_dim"] = 15;
  expect_error(j, {"head_dim 15", "even"});
  j = qwen3_0_6b();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  expect_error(j, {"rope_scaling", "yarn"});
  j = qwen3_0_6b();
  j["hidden_act"] = "gelu";
  expect_error(j, {"hidden_act 'gelu'"});
  j = qwen3_0_6b();
  j["attention_bias"] = true;
  expect_error(j, {"attention_bias"});
}

BOOST_AUTO_TEST_CASE(loads_from_a_directory_or_a_file) {
  temp_dir dir;
  write_text(dir.path / "config.json", qwen3_0_6b().dump(2));
  auto from_dir = load_model_config(dir.path);
  BOOST_REQUIRE_MESSAGE(from_dir, why(from_dir));
  auto from_file = load_model_config(dir.path / "config.json");
  BOOST_REQUIRE_MESSAGE(from_file, why(from_file));
  BOOST_TEST(from_dir->hidden_size == from_file->hidden_size);

  auto missing = load_model_config(dir.path / "nope");
  BOOST_REQUIRE(!missing);
  BOOST_TEST(missing.error().find("nope/config.json") == std::string::npos); // a file path, not a dir
  BOOST_TEST(missing.error().find("no such file") != std::string::npos, missing.error());

  write_text(dir.path / "config.json", "{\"vocab_size\": 12,");
  auto broken = load_model_config(dir.path);
  BOOST_REQUIRE(!broken);
  BOOST_TEST(broken.error().find("config.json: not valid JSON") != std::string::npos,
             broken.error());
}

BOOST_AUTO_TEST_CASE(to_json_round_trips) {
  auto c = parse_model_config(qwen3_0_6b(), "cfg.json");
  BOOST_REQUIRE_MESSAGE(c, why(c));
  c->eos_token_ids = {7, 9};
  c->bos_token_id.reset();
  json j = rlserve::model::to_json(*c);
  BOOST_TEST(j["architectures"] == json::array({"Qwen3ForCausalLM"}));
  BOOST_TEST(j["eos_token_id"] == json::array({7, 9}));
  BOOST_TEST(j["bos_token_id"].is_null());
  BOOST_TEST(j["transformers_version"] == "4.51.0"); // unmodelled fields survive
  BOOST_TEST(!j.contains("num_experts"));           // dense: no MoE fields
  auto back = parse_model_config(j, "round trip");
  BOOST_REQUIRE_MESSAGE(back, why(back));
  BOOST_TEST(back->head_dim == c->head_dim);
  BOOST_TEST(back->rope_theta == c->rope_theta);
  BOOST_TEST(back->eos_token_ids == c->eos_token_ids);
  BOOST_TEST(back->tie_word_embeddings == c->tie_word_embeddings);

  c->eos_token_ids = {7};
  BOOST_TEST(rlserve::model::to_json(*c)["eos_token_id"] == 7); // one id: an int, as HF writes it
}

BOOST_AUTO_TEST_CASE(transformers_5_rope_parameters_and_num_local_experts_are_read) {
  // What transformers 5's save_pretrained writes: no top-level rope_theta, and the MoE expert
  // count as num_local_experts. Missing either would silently run another model.
  auto j = qwen3_0_6b();
  j.erase("rope_theta");
  j["rope_parameters"] = json{{"rope_theta", 1000000.0}, {"rope_type", "default"}};
  auto c = parse_model_config(j, "cfg.json");
  BOOST_REQUIRE_MESSAGE(c, why(c));
  BOOST_TEST(c->rope_theta == 1000000.0);
  j["rope_parameters"]["rope_type"] = "yarn";
  c = parse_model_config(j, "cfg.json");
  BOOST_REQUIRE(!c);
  BOOST_TEST(c.error().find("rope_type") != std::string::npos);

  auto m = qwen3_0_6b();
  m["architectures"] = json::array({"Qwen3MoeForCausalLM"});
  m["model_type"] = "qwen3_moe";
  m["num_local_experts"] = 16;
  m["num_experts_per_tok"] = 4;
  m["moe_intermediate_size"] = 128;
  c = parse_model_config(m, "cfg.json");
  BOOST_REQUIRE_MESSAGE(c, why(c));
  BOOST_TEST(c->num_experts == 16);
}

BOOST_AUTO_TEST_SUITE_END()

// A Qwen3MoeForCausalLM config that leaves MoE fields out means transformers' Qwen3MoeConfig
// defaults (configuration_qwen3_moe.py), not a dense model.
BOOST_AUTO_TEST_CASE(missing_moe_fields_take_qwen3_moe_config_defaults) {
  auto j = qwen3_0_6b();
  j["architectures"] = {"Qwen3MoeForCausalLM"};
  j["model_type"] = "qwen3_moe";
  auto c = parse_model_config(j, "cfg.json");
  BOOST_REQUIRE_MESSAGE(c, why(c));
  BOOST_TEST(c->is_moe());
  BOOST_TEST(c->num_experts == 128);
  BOOST_TEST(c->num_experts_per_tok == 8);
  BOOST_TEST(c->moe_intermediate_size == 768);
  BOOST_TEST(c->decoder_sparse_step == 1);
  BOOST_TEST(c->norm_topk_prob == false);
  BOOST_TEST(c->mlp_only_layers.empty());
  // Given fields still win.
  j["num_experts"] = 16;
  j["num_experts_per_tok"] = 2;
  j["norm_topk_prob"] = true;
  c = parse_model_config(j, "cfg.json");
  BOOST_REQUIRE_MESSAGE(c, why(c));
  BOOST_TEST(c->num_experts == 16);
  BOOST_TEST(c->num_experts_per_tok == 2);
  BOOST_TEST(c->norm_topk_prob == true);
  // A dense architecture stays dense.
  c = parse_model_config(qwen3_0_6b(), "cfg.json");
  BOOST_REQUIRE_MESSAGE(c, why(c));
  BOOST_TEST(!c->is_moe());
}

namespace {
json int4_quant_config() {
  return json::parse(R"({
    "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
    "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": null, "output_activations": null,
      "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 64, "symmetric": false,
                  "actorder": null, "dynamic": false, "observer": "minmax"}}},
    "ignore": ["lm_head", "re:.*mlp\\.gate$"], "kv_cache_scheme": null})");
}
} // namespace

BOOST_AUTO_TEST_CASE(compressed_tensors_quantization_config_is_parsed) {
  auto j = qwen3_0_6b();
  j["quantization_config"] = int4_quant_config();
  auto c = parse_model_config(j, "cfg.json");
  BOOST_REQUIRE_MESSAGE(c, why(c));
  BOOST_REQUIRE(c->quantization.has_value());
  BOOST_TEST(c->quantization->group_size == 64);
  BOOST_TEST(!c->quantization->symmetric);
  BOOST_TEST(c->quantization->ignores("lm_head"));
  BOOST_TEST(c->quantization->ignores("model.layers.3.mlp.gate"));
  BOOST_TEST(!c->quantization->ignores("model.layers.3.mlp.gate_proj"));
  BOOST_TEST(!c->quantization->ignores("model.layers.3.mlp.experts.0.gate_proj"));

  auto channel = int4_quant_config();
  channel["config_groups"]["group_0"]["weights"]["strategy"] = "channel";
  channel["config_groups"]["group_0"]["weights"]["group_size"] = nullptr;
  channel["config_groups"]["group_0"]["weights"]["symmetric"] = true;
  j["quantization_config"] = channel;
  c = parse_model_config(j, "cfg.json");
  BOOST_REQUIRE_MESSAGE(c, why(c));
  BOOST_TEST(c->quantization->group_size == -1);
  BOOST_TEST(c->quantization->symmetric);
  BOOST_TEST(!parse_model_config(qwen3_0_6b(), "cfg.json")->quantization.has_value());
}

BOOST_AUTO_TEST_CASE(unsupported_quantization_configs_are_refused_naming_the_field) {
  struct bad_case {
    std::function<void(json&)> edit;
    std::vector<std::string> parts;
  };
  auto W = [](json& q) -> json& { return q["config_groups"]["group_0"]["weights"]; };
  std::vector<bad_case> cases = {
    {[](json& q) { q["quant_method"] = "gptq"; }, {"quant_method \"gptq\""}},
    {[](json& q) { q["format"] = "marlin-24"; }, {"format \"marlin-24\""}},
    {[&](json& q) { W(q)["num_bits"] = 8; }, {"num_bits 8"}},
    {[&](json& q) { W(q)["type"] = "float"; }, {"type \"float\""}},
    {[&](json& q) { W(q)["actorder"] = "group"; }, {"actorder \"group\""}},
    {[&](json& q) { W(q)["dynamic"] = true; }, {"dynamic true"}},
    {[&](json& q) { W(q)["group_size"] = 16; }, {"group_size 16"}},
    {[&](json& q) { W(q)["strategy"] = "tensor"; }, {"strategy \"tensor\""}},
    {[](json& q) { q["config_groups"]["group_0"]["input_activations"] = {{"num_bits", 8}}; }, {"activations"}},
    {[](json& q) { q["config_groups"]["group_0"]["targets"] = {"Attention"}; }, {"targets"}},
    {[](json& q) { q["config_groups"]["group_1"] = q["config_groups"]["group_0"]; }, {"exactly one group"}},
    {[](json& q) { q["kv_cache_scheme"] = {{"num_bits", 8}}; }, {"kv_cache_scheme"}},
    {[](json& q) { q["ignore"] = {"re:("}; }, {"not a valid regular expression"}},
  };
  for (auto& bc : cases) {
    auto j = qwen3_0_6b();
    auto q = int4_quant_config();
    bc.edit(q);
    j["quantization_config"] = q;
    auto parts = bc.parts;
    parts.push_back("quantization_config");
    auto c = parse_model_config(j, "cfg.json");
    BOOST_REQUIRE(!c);
    for (const auto& p : parts)
      BOOST_TEST(c.error().find(p) != std::string::npos, "'" << p << "' not in: " << c.error());
  }
}
