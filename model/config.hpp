// model_config: the Hugging Face config.json of a Qwen3 checkpoint (Qwen3ForCausalLM, and the MoE
// fields Qwen3MoeForCausalLM adds, run by model/qwen3.hpp). Field names and defaults follow
// transformers' Qwen3Config / Qwen3MoeConfig, so a config.json written by `save_pretrained` loads
// as-is and `to_json` writes one transformers loads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "messages/expected.hpp"

namespace rlserve::model {

// A checkpoint's compressed-tensors `quantization_config`, restricted to what the engine runs:
// quant_method "compressed-tensors", format "pack-quantized", one config group targeting
// ["Linear"] with weights {num_bits 4, type int, strategy group (group_size 32/64/128) or channel,
// symmetric true|false, actorder null, dynamic false}, no activation or KV-cache quantization.
// (W4A16 INT4, docs/formats.md §3.) Anything else is refused by the parser, naming the field.
struct quantization_config {
  int32_t group_size = 128; // 32, 64, 128, or -1 (kernels::k_int4_channel) for strategy "channel"
  bool symmetric = true;    // false: asymmetric, every module carries weight_zero_point
  std::vector<std::string> targets = {"Linear"};
  // Modules left unquantized: exact module names ("lm_head", "model.layers.0.mlp.gate"), or
  // "re:<regex>" matched from the start of the name, as compressed-tensors matches them.
  std::vector<std::string> ignore;

  bool ignores(std::string_view module) const;

  std::vector<std::regex> ignore_patterns_; // the "re:" entries, compiled once by the parser
};

// Parses the `quantization_config` object; `where` names the file in messages.
expected<quantization_config> parse_quantization_config(const nlohmann::json& j, const std::string& where);

struct model_config {
  std::string architecture; // architectures[0]: "Qwen3ForCausalLM" (or "Qwen3MoeForCausalLM")
  std::string model_type;   // "qwen3" / "qwen3_moe"
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0,
          num_attention_heads = 0, num_key_value_heads = 0, head_dim = 0,
          max_position_embeddings = 0;
  double rms_norm_eps = 1e-6, rope_theta = 1000000.0;
  bool tie_word_embeddings = false;
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids; // eos_token_id may be an int or a list in HF configs
  std::string torch_dtype = "bfloat16";
  // Qwen3MoeForCausalLM only (0 for dense models). A Qwen3MoeForCausalLM config that leaves a
  // field out gets transformers' Qwen3MoeConfig default: num_experts 128, num_experts_per_tok 8,
  // moe_intermediate_size 768, decoder_sparse_step 1, norm_topk_prob false, mlp_only_layers [].
  int64_t num_experts = 0, num_experts_per_tok = 0, moe_intermediate_size = 0,
          decoder_sparse_step = 1;
  bool norm_topk_prob = true;
  std::vector<int64_t> mlp_only_layers;
  // The checkpoint is INT4 (compressed-tensors pack-quantized); nullopt: BF16/F16/F32 weights.
  std::optional<quantization_config> quantization;
  nlohmann::json raw; // the whole file, for fields not modelled

  bool is_moe() const { return num_experts > 0; }
};

// Reads `dir/config.json` (or the file itself when given a path to a .json file) and checks it:
// required fields present with the right JSON type, sizes positive, heads divisible by kv heads,
// head_dim even (RoPE rotates pairs), and no feature the engine would silently get wrong
// (rope_scaling, attention_bias, sliding windows, an activation other than silu).
//
// Required: architectures, vocab_size, hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads. Defaults when absent, as transformers has them: num_key_value_heads =
// num_attention_heads; head_dim = hidden_size / num_attention_heads (the fallback of HF attention
// modules; real Qwen3 configs always set it); max_position_embeddings = 32768; rms_norm_eps =
// 1e-6; rope_theta = 10000 (Qwen3Config's default, not the struct's); tie_word_embeddings =
// false; torch_dtype from "torch_dtype" or the newer "dtype", else "bfloat16"; the MoE fields of
// a Qwen3MoeForCausalLM config as Qwen3MoeConfig has them (see model_config).
// `quantization_config`, when present, must be one the engine runs (parse_quantization_config).
expected<model_config> load_model_config(const std::filesystem::path& dir_or_config_json);

// Parses an already-read config object; `where` names it in error messages.
expected<model_config> parse_model_config(const nlohmann::json& j, const std::string& where);

// What make-model writes as config.json (HF field names). Fields of `raw` that are not modelled
// are kept; modelled ones are written from the struct. The MoE fields appear only for MoE models.
nlohmann::json to_json(const model_config& config);

} // namespace rlserve::model
