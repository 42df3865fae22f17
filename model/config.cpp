#include "model/config.hpp"

#include <fstream>
#include <limits>
#include <sstream>

#include <fmt/format.h>

#include "kernels/int4_format.hpp"

namespace rlserve::model {

namespace {

using json = nlohmann::json;

// JSON's name for what a field holds, for "must be an integer, got string" messages.
std::string json_kind(const json& v) {
  if (v.is_number_integer())
    return "integer";
  return v.type_name();
}

// Reads the field `name` into `out`; a missing (or null) field leaves `out` alone unless it is
// required. Each reader reports the first problem only: one fix at a time reads better than a wall.
class field_reader {
public:
  field_reader(const json& j, const std::string& where) : j_(j), where_(where) {}

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }

  const json* find(const char* name) {
    auto it = j_.find(name);
    if (it == j_.end() || it->is_null())
      return nullptr;
    return &*it;
  }

  void missing(const char* name) {
    set_error(fmt::format("{}: missing required field '{}'", where_, name));
  }

  void wrong_type(const char* name, const char* wanted, const json& got) {
    set_error(fmt::format("{}: field '{}' must be {}, got {} {}", where_, name, wanted,
                          json_kind(got), got.dump()));
  }

  void integer(const char* name, int64_t& out, bool required) {
    const json* v = find(name);
    if (v == nullptr) {
      if (required)
        missing(name);
      return;
    }
    if (!v->is_number_integer()) {
      wrong_type(name, "an integer", *v);
      return;
    }
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) {
      wrong_type(name, "an integer that fits in 64 bits", *v);
      return;
    }
    out = v->get<int64_t>();
  }

  void number(const char* name, double& out) {
    const json* v = find(name);
    if (v == nullptr)
      return;
    if (!v->is_number()) {
      wrong_type(name, "a number", *v);
      return;
    }
    out = v->get<double>();
  }

  void boolean(const char* name, bool& out) {
    const json* v = find(name);
    if (v == nullptr)
      return;
    if (!v->is_boolean()) {
      wrong_type(name, "true or false", *v);
      return;
    }
    out = v->get<bool>();
  }

  void string(const char* name, std::string& out) {
    const json* v = find(name);
    if (v == nullptr)
      return;
    if (!v->is_string()) {
      wrong_type(name, "a string", *v);
      return;
    }
    out = v->get<std::string>();
  }

  // A token id: an integer in [0, 2^31).
  bool token_id(const char* name, const json& v, int32_t& out) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        v.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      wrong_type(name, "a token id (a non-negative integer) or a list of them", v);
      return false;
    }
    out = static_cast<int32_t>(v.get<int64_t>());
    return true;
  }

  void set_error(std::string message) {
    if (error_.empty())
      error_ = std::move(message);
  }

private:
  const json& j_;
  const std::string& where_;
  std::string error_;
};

} // namespace

bool quantization_config::ignores(std::string_view module) const {
  for (const auto& i : ignore)
    if (!i.starts_with("re:") && i == module)
      return true;
  const std::string name(module);
  for (const auto& re : ignore_patterns_)
    if (std::regex_search(name, re, std::regex_constants::match_continuous))
      return true;
  return false;
}

expected<quantization_config> parse_quantization_config(const nlohmann::json& j, const std::string& where) {
  const std::string at = where + ": quantization_config";
  auto refuse = [&](const std::string& what) {
    return fail(fmt::format("{}: {}; rlserve runs compressed-tensors pack-quantized INT4 weights "
                            "(W4A16: num_bits 4, type int, strategy group or channel)", at, what));
  };
  if (!j.is_object())
    return fail(fmt::format("{} must be an object, got {}", at, j.type_name()));
  auto str = [&](const json& o, const char* key) -> std::string {
    auto it = o.find(key);
    return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  auto null_or_absent = [](const json& o, const char* key) {
    auto it = o.find(key);
    return it == o.end() || it->is_null();
  };
  if (auto m = str(j, "quant_method"); m != "compressed-tensors")
    return refuse(fmt::format("quant_method {} is not supported", j.value("quant_method", json()).dump()));
  if (auto f = str(j, "format"); f != "pack-quantized")
    return refuse(fmt::format("format {} is not supported", j.value("format", json()).dump()));
  if (!null_or_absent(j, "kv_cache_scheme"))
    return refuse("kv_cache_scheme (KV-cache quantization) is not supported");
  auto groups = j.find("config_groups");
  if (groups == j.end() || !groups->is_object() || groups->size() != 1)
    return refuse("config_groups must hold exactly one group");
  // Not `*groups->items().begin()`: that dereferences a temporary iterator proxy, which is gone
  // before its key and value are read (ASan: stack-use-after-scope).
  const auto first_group = groups->begin();
  const std::string& gname = first_group.key();
  const json& group = first_group.value();
  const std::string gat = "config_groups." + gname;
  if (!group.is_object())
    return refuse(gat + " is not an object");
  if (auto gf = group.find("format"); gf != group.end() && !gf->is_null() && *gf != "pack-quantized")
    return refuse(fmt::format("{}.format {} is not supported", gat, gf->dump()));
  quantization_config q;
  auto targets = group.find("targets");
  if (targets == group.end() || *targets != json::array({"Linear"}))
    return refuse(fmt::format("{}.targets {} is not supported (only [\"Linear\"])", gat,
                              targets == group.end() ? "(absent)" : targets->dump()));
  if (!null_or_absent(group, "input_activations") || !null_or_absent(group, "output_activations"))
    return refuse(gat + " quantizes activations");
  auto w = group.find("weights");
  if (w == group.end() || !w->is_object())
    return refuse(gat + ".weights is missing");
  const std::string wat = gat + ".weights";
  if (auto b = w->find("num_bits"); b == w->end() || *b != 4)
    return refuse(fmt::format("{}.num_bits {} is not supported", wat, b == w->end() ? "(absent)" : b->dump()));
  if (auto t = str(*w, "type"); t != "int")
    return refuse(fmt::format("{}.type {} is not supported", wat, w->value("type", json()).dump()));
  if (auto a = w->find("actorder"); a != w->end() && !a->is_null() && *a != false)
    return refuse(fmt::format("{}.actorder {} is not supported (activation-ordered groups need "
                              "g_idx, which the kernels do not read)", wat, a->dump()));
  if (auto d = w->find("dynamic"); d != w->end() && !d->is_null() && *d != false)
    return refuse(fmt::format("{}.dynamic {} is not supported", wat, d->dump()));
  auto sym = w->find("symmetric");
  if (sym == w->end() || !sym->is_boolean())
    return refuse(wat + ".symmetric must be true or false");
  q.symmetric = sym->get<bool>();
  const std::string strategy = str(*w, "strategy");
  auto gs = w->find("group_size");
  if (strategy == "group") {
    if (gs == w->end() || !gs->is_number_integer() || !kernels::int4_group_size_supported(gs->get<int32_t>()) ||
        gs->get<int32_t>() == kernels::k_int4_channel)
      return refuse(fmt::format("{}.group_size {} is not supported (32, 64 or 128)", wat,
                                gs == w->end() ? "(absent)" : gs->dump()));
    q.group_size = gs->get<int32_t>();
  } else if (strategy == "channel") {
    if (gs != w->end() && !gs->is_null() && *gs != -1)
      return refuse(fmt::format("{}.group_size {} does not go with strategy channel", wat, gs->dump()));
    q.group_size = kernels::k_int4_channel;
  } else {
    return refuse(fmt::format("{}.strategy {} is not supported (group or channel)", wat,
                              w->value("strategy", json()).dump()));
  }
  if (auto ig = j.find("ignore"); ig != j.end() && !ig->is_null()) {
    if (!ig->is_array())
      return fail(fmt::format("{}.ignore must be a list of module names", at));
    for (const auto& e : *ig) {
      if (!e.is_string())
        return fail(fmt::format("{}.ignore must be a list of module names, got {}", at, e.dump()));
      auto name = e.get<std::string>();
      if (name.starts_with("re:")) {
        try {
          q.ignore_patterns_.emplace_back(name.substr(3));
        } catch (const std::regex_error& err) {
          return fail(fmt::format("{}.ignore: '{}' is not a valid regular expression: {}", at, name, err.what()));
        }
      }
      q.ignore.push_back(std::move(name));
    }
  }
  return q;
}

expected<model_config> parse_model_config(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object())
    return fail(fmt::format("{}: expected a JSON object, got {}", where, j.type_name()));
  model_config c;
  c.raw = j;
  field_reader r(j, where);

  if (const json* archs = r.find("architectures")) {
    if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string())
      r.wrong_type("architectures", "a non-empty list of strings", *archs);
    else
      c.architecture = (*archs)[0].get<std::string>();
  } else {
    r.missing("architectures");
  }
  r.string("model_type", c.model_type);

  r.integer("vocab_size", c.vocab_size, true);
  r.integer("hidden_size", c.hidden_size, true);
  r.integer("intermediate_size", c.intermediate_size, true);
  r.integer("num_hidden_layers", c.num_hidden_layers, true);
  r.integer("num_attention_heads", c.num_attention_heads, true);
  c.num_key_value_heads = c.num_attention_heads;
  r.integer("num_key_value_heads", c.num_key_value_heads, false);
  r.integer("head_dim", c.head_dim, false);
  c.max_position_embeddings = 32768;
  r.integer("max_position_embeddings", c.max_position_embeddings, false);
  r.number("rms_norm_eps", c.rms_norm_eps);
  c.rope_theta = 10000.0;
  r.number("rope_theta", c.rope_theta);
  // transformers 5 writes RoPE as rope_parameters {rope_theta, rope_type} instead of a top-level
  // rope_theta; reading only the latter would silently run theta 10000.
  if (const json* rp = r.find("rope_parameters"); rp && !rp->is_null()) {
    if (!rp->is_object())
      return fail(fmt::format("{}: rope_parameters must be an object, got {}", where, rp->dump()));
    if (auto t = rp->find("rope_type"); t != rp->end() && !(t->is_string() && *t == "default"))
      return fail(fmt::format("{}: rope_parameters.rope_type {} is not supported (only plain RoPE, "
                              "\"default\")", where, t->dump()));
    if (auto th = rp->find("rope_theta"); th != rp->end()) {
      if (!th->is_number())
        return fail(fmt::format("{}: rope_parameters.rope_theta must be a number, got {}", where,
                                th->dump()));
      c.rope_theta = th->get<double>();
    }
  }
  r.boolean("tie_word_embeddings", c.tie_word_embeddings);

  if (const json* bos = r.find("bos_token_id")) {
    int32_t id = 0;
    if (r.token_id("bos_token_id", *bos, id))
      c.bos_token_id = id;
  }
  if (const json* eos = r.find("eos_token_id")) {
    if (eos->is_array()) {
      for (const auto& e : *eos) {
        int32_t id = 0;
        if (!r.token_id("eos_token_id", e, id))
          break;
        c.eos_token_ids.push_back(id);
      }
    } else {
      int32_t id = 0;
      if (r.token_id("eos_token_id", *eos, id))
        c.eos_token_ids.push_back(id);
    }
  }
  // transformers >= 4.56 writes "dtype"; older versions "torch_dtype".
  if (r.find("torch_dtype") != nullptr)
    r.string("torch_dtype", c.torch_dtype);
  else
    r.string("dtype", c.torch_dtype);

  if (c.architecture == "Qwen3MoeForCausalLM") {
    // transformers' Qwen3MoeConfig defaults (configuration_qwen3_moe.py): a field the file leaves
    // out means these, not "dense".
    c.num_experts = 128;
    c.num_experts_per_tok = 8;
    c.moe_intermediate_size = 768;
    c.decoder_sparse_step = 1;
    c.norm_topk_prob = false;
  }
  r.integer("num_experts", c.num_experts, false);
  // transformers 5 names it num_local_experts in the config.json it saves.
  if (r.find("num_local_experts") && !r.find("num_experts"))
    r.integer("num_local_experts", c.num_experts, false);
  r.integer("num_experts_per_tok", c.num_experts_per_tok, false);
  r.integer("moe_intermediate_size", c.moe_intermediate_size, false);
  r.integer("decoder_sparse_step", c.decoder_sparse_step, false);
  r.boolean("norm_topk_prob", c.norm_topk_prob);
  if (const json* layers = r.find("mlp_only_layers")) {
    if (!layers->is_array()) {
      r.wrong_type("mlp_only_layers", "a list of layer indices", *layers);
    } else {
      for (const auto& l : *layers) {
        if (!l.is_number_integer()) {
          r.wrong_type("mlp_only_layers", "a list of layer indices", *layers);
          break;
        }
        c.mlp_only_layers.push_back(l.get<int64_t>());
      }
    }
  }

  // Features Qwen3 configs can switch on that this engine does not implement: refuse rather than
  // run a different model than the checkpoint describes.
  std::string act = "silu";
  r.string("hidden_act", act);
  bool attention_bias = false, sliding = false;
  r.boolean("attention_bias", attention_bias);
  r.boolean("use_sliding_window", sliding);
  if (!r.ok())
    return fail(r.error());
  if (act != "silu")
    return fail(fmt::format("{}: hidden_act '{}' is not supported (Qwen3 uses silu)", where, act));
  if (attention_bias)
    return fail(fmt::format("{}: attention_bias = true is not supported (Qwen3 projections "
                            "have no bias)", where));
  if (sliding)
    return fail(fmt::format("{}: use_sliding_window = true is not supported", where));
  if (const json* rs = r.find("rope_scaling"))
    return fail(fmt::format("{}: rope_scaling {} is not supported (only plain RoPE)", where,
                            rs->dump()));

  if (const json* q = r.find("quantization_config")) {
    auto qc = parse_quantization_config(*q, where);
    if (!qc)
      return std::move(qc).take_failure();
    c.quantization = std::move(*qc);
  }

  // Sizes.
  auto positive = [&](const char* name, int64_t v) -> bool {
    if (v > 0)
      return true;
    r.set_error(fmt::format("{}: '{}' must be positive, got {}", where, name, v));
    return false;
  };
  if (!positive("vocab_size", c.vocab_size) || !positive("hidden_size", c.hidden_size) ||
      !positive("intermediate_size", c.intermediate_size) ||
      !positive("num_hidden_layers", c.num_hidden_layers) ||
      !positive("num_attention_heads", c.num_attention_heads) ||
      !positive("num_key_value_heads", c.num_key_value_heads) ||
      !positive("max_position_embeddings", c.max_position_embeddings))
    return fail(r.error());
  if (c.head_dim == 0) {
    if (c.hidden_size % c.num_attention_heads != 0)
      return fail(fmt::format("{}: no head_dim, and hidden_size {} is not a multiple of "
                              "num_attention_heads {}", where, c.hidden_size,
                              c.num_attention_heads));
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (!positive("head_dim", c.head_dim))
    return fail(r.error());
  if (c.head_dim % 2 != 0)
    return fail(fmt::format("{}: head_dim {} must be even (RoPE rotates pairs)", where, c.head_dim));
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    return fail(fmt::format("{}: num_attention_heads {} is not a multiple of "
                            "num_key_value_heads {}", where, c.num_attention_heads,
                            c.num_key_value_heads));
  if (!(c.rms_norm_eps >= 0.0))
    return fail(fmt::format("{}: rms_norm_eps must be >= 0, got {}", where, c.rms_norm_eps));
  if (!(c.rope_theta > 0.0))
    return fail(fmt::format("{}: rope_theta must be positive, got {}", where, c.rope_theta));
  for (auto id : c.eos_token_ids)
    if (id >= c.vocab_size)
      return fail(fmt::format("{}: eos_token_id {} is outside the vocabulary (vocab_size {})",
                              where, id, c.vocab_size));
  if (c.bos_token_id && *c.bos_token_id >= c.vocab_size)
    return fail(fmt::format("{}: bos_token_id {} is outside the vocabulary (vocab_size {})",
                            where, *c.bos_token_id, c.vocab_size));
  if (c.num_experts < 0 || c.num_experts_per_tok < 0 || c.moe_intermediate_size < 0 ||
      c.decoder_sparse_step < 0)
    return fail(fmt::format("{}: MoE sizes must not be negative", where));
  if (c.num_experts > 0 && (c.num_experts_per_tok <= 0 || c.num_experts_per_tok > c.num_experts))
    return fail(fmt::format("{}: num_experts_per_tok {} must be in [1, num_experts {}]", where,
                            c.num_experts_per_tok, c.num_experts));
  return c;
}

expected<model_config> load_model_config(const std::filesystem::path& dir_or_config_json) {
  std::error_code ec;
  auto path = dir_or_config_json;
  if (std::filesystem::is_directory(path, ec))
    path /= "config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (!std::filesystem::exists(path, ec))
      return fail(fmt::format("{}: no such file", path.string()));
    return fail(fmt::format("{}: cannot be opened for reading", path.string()));
  }
  std::stringstream text;
  text << in.rdbuf();
  auto j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return fail(fmt::format("{}: not valid JSON", path.string()));
  return parse_model_config(j, path.string());
}

nlohmann::json to_json(const model_config& c) {
  json j = c.raw.is_object() ? c.raw : json::object();
  j["architectures"] = json::array({c.architecture});
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["bos_token_id"] = c.bos_token_id ? json(*c.bos_token_id) : json(nullptr);
  if (c.eos_token_ids.size() == 1)
    j["eos_token_id"] = c.eos_token_ids[0];
  else if (c.eos_token_ids.empty())
    j["eos_token_id"] = nullptr;
  else
    j["eos_token_id"] = c.eos_token_ids;
  j["torch_dtype"] = c.torch_dtype;
  // Fields Qwen3Config has that the engine fixes; written so transformers builds the same model.
  if (!j.contains("hidden_act"))
    j["hidden_act"] = "silu";
  if (!j.contains("attention_bias"))
    j["attention_bias"] = false;
  if (!j.contains("attention_dropout"))
    j["attention_dropout"] = 0.0;
  if (!j.contains("use_sliding_window"))
    j["use_sliding_window"] = false;
  if (!j.contains("rope_scaling"))
    j["rope_scaling"] = nullptr;
  if (!j.contains("use_cache"))
    j["use_cache"] = true;
  if (c.is_moe()) {
    j["num_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["decoder_sparse_step"] = c.decoder_sparse_step;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["mlp_only_layers"] = c.mlp_only_layers;
  }
  return j;
}

} // namespace rlserve::model
