#include "model/make_model.hpp"

#include <optional>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/bf16.hpp"
#include "kernels/int4_format.hpp"
#include "model/checkpoint.hpp"
#include "model/quant/int4_checkpoint.hpp"
#include "model/qwen3.hpp"
#include "model/safetensors.hpp"
#include "model/sampler.hpp"
#include "model/tiny_tokenizer.hpp"

namespace rlserve::model {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr std::string_view k_marker_value = "rlserve make-model";

uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// N(0, 1) as the sum of 12 uniforms minus 6 (Irwin-Hall: mean 0, variance 1, tails cut at 6).
// Every uniform is k * 2^-24, so the double sum is exact and identical on every machine, unlike
// Box-Muller's log/cos.
double standard_normal(rng& r) {
  double s = 0.0;
  for (int i = 0; i < 12; ++i)
    s += r.uniform();
  return s - 6.0;
}

HostTensor encode(const std::vector<float>& values, std::vector<int64_t> shape, dtype type) {
  std::vector<std::byte> bytes(values.size() * element_size(type));
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (type == dtype::f32) {
      std::memcpy(&bytes[4 * i], &values[i], 4);
    } else {
      const uint16_t bits = type == dtype::bf16 ? kernels::float_to_bf16(values[i])
                                                : kernels::float_to_f16(values[i]);
      std::memcpy(&bytes[2 * i], &bits, 2);
    }
  }
  return HostTensor::adopt(type, std::move(shape), std::move(bytes));
}

status write_json(const fs::path& path, const json& j) {
  auto tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << j.dump(2) << '\n';
    if (!out)
      return fail(fmt::format("{}: write failed", tmp.string()));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec)
    return fail(fmt::format("{}: cannot rename into place: {}", path.string(), ec.message()));
  return {};
}

// A non-empty `out` may only be overwritten when it is an earlier make-model output.
status check_output_dir(const fs::path& out) {
  std::error_code ec;
  if (!fs::exists(out, ec))
    return {};
  if (!fs::is_directory(out, ec))
    return fail(fmt::format("{} exists and is not a directory", out.string()));
  if (fs::is_empty(out, ec))
    return {};
  const fs::path weights = out / "model.safetensors";
  if (fs::exists(weights, ec)) {
    auto f = safetensors_file::open(weights);
    if (f) {
      auto it = f->metadata().find(std::string(k_make_model_marker));
      if (it != f->metadata().end() && it->second == k_marker_value)
        return {};
    }
  }
  return fail(fmt::format("{} is not empty and is not an earlier `rlserve make-model` output (no "
                          "model.safetensors marked '{}': {}); refusing to overwrite it — choose "
                          "a new or empty directory", out.string(), k_make_model_marker,
                          k_marker_value));
}

} // namespace

expected<model_config> preset_config(std::string_view arch, std::string_view preset) {
  const bool moe = arch == "qwen3-moe";
  if (arch != "qwen3" && !moe)
    return fail(fmt::format("unknown --arch '{}' (known: qwen3, qwen3-moe)", arch));
  model_config c;
  c.architecture = moe ? std::string(k_qwen3_moe_architecture) : "Qwen3ForCausalLM";
  c.model_type = moe ? "qwen3_moe" : "qwen3";
  c.max_position_embeddings = 2048;
  c.rope_theta = 1000000.0;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = true;
  if (preset == "tiny") {
    c.vocab_size = 512;
    c.hidden_size = 64;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c.intermediate_size = 128;
  } else if (preset == "small") {
    c.vocab_size = 2048;
    c.hidden_size = 256;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 4;
    c.head_dim = 32;
    c.intermediate_size = 512;
  } else if (preset == "medium") {
    // The smallest shapes the GPU kernels run (head_dim 64, INT4 group 128 dividing every
    // quantized dimension): GPU tests and transformers parity.
    c.vocab_size = 4096;
    c.hidden_size = 512;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 2;
    c.head_dim = 64;
    c.intermediate_size = 1024;
  } else if (preset == "a3b-slice") {
    // Qwen3-30B-A3B's layer shapes (hidden 2048, 32 query / 4 KV heads of 128, 128 experts of
    // 768, top-8) in 4 of its 48 layers, with the tiny tokenizer's 4096 tokens: whole-engine GPU
    // benchmarks at that shape from a checkpoint of a few GB.
    c.vocab_size = 4096;
    c.hidden_size = 2048;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 4;
    c.head_dim = 128;
    c.intermediate_size = 6144;
    c.max_position_embeddings = 40960;
    c.tie_word_embeddings = false;
  } else {
    return fail(fmt::format("unknown --preset '{}' (known: tiny, small, medium, a3b-slice)", preset));
  }
  if (moe) {
    // Every layer sparse, as Qwen3-30B-A3B; tests switch layers to dense through mlp_only_layers
    // or decoder_sparse_step.
    const bool a3b = preset == "a3b-slice";
    c.num_experts = preset == "tiny" ? 8 : preset == "small" ? 16 : a3b ? 128 : 32;
    c.num_experts_per_tok = preset == "tiny" ? 2 : a3b ? 8 : 4;
    c.moe_intermediate_size = preset == "tiny" ? 32 : preset == "small" ? 128 : a3b ? 768 : 256;
    c.decoder_sparse_step = 1;
    c.norm_topk_prob = true;
    c.mlp_only_layers = {};
  }
  return c;
}

std::vector<NamedTensor> random_parameters(const model_config& config, uint64_t seed, dtype type) {
  std::vector<NamedTensor> out;
  for (const auto& spec : qwen3_parameter_specs(config, type)) {
    rng r(fnv1a64(spec.name) ^ (seed * 0x9e3779b97f4a7c15ull));
    int64_t n = 1;
    for (auto d : spec.shape)
      n *= d;
    std::vector<float> values(static_cast<std::size_t>(n));
    const bool is_norm = spec.shape.size() == 1;
    const bool is_embedding =
      spec.name == "model.embed_tokens.weight" || spec.name == "lm_head.weight";
    if (is_norm) {
      for (auto& v : values)
        v = static_cast<float>(1.0 + 0.1 * standard_normal(r));
    } else {
      // See the header for why these scales.
      const bool is_residual_output =
        spec.name.ends_with("o_proj.weight") || spec.name.ends_with("down_proj.weight");
      const double fan_in = double(spec.shape[1]);
      const double std_dev = is_embedding ? 2.0 / std::sqrt(double(config.hidden_size))
                             : is_residual_output ? 3.0 / std::sqrt(fan_in)
                                                  : 1.0 / std::sqrt(fan_in);
      for (auto& v : values)
        v = static_cast<float>(std_dev * standard_normal(r));
    }
    out.push_back({spec.name, encode(values, spec.shape, type)});
  }
  return out;
}

status make_model(const make_model_options& o) {
  if (o.out.empty())
    return fail("no output directory (--out DIR)");
  auto type = dtype_from_torch_name(o.dtype);
  if (!type || !(*type == dtype::bf16 || *type == dtype::f16 || *type == dtype::f32))
    return fail(fmt::format("unsupported --dtype '{}' (bfloat16, float16 or float32)", o.dtype));
  auto config = preset_config(o.arch, o.preset);
  if (!config)
    return std::move(config).take_failure();
  if (auto s = check_output_dir(o.out); !s)
    return s;
  std::error_code ec;
  fs::create_directories(o.out, ec);
  if (ec)
    return fail(fmt::format("{}: cannot create directory: {}", o.out.string(), ec.message()));

  // Weights first: they carry the marker, so an interrupted run can simply be repeated.
  auto tensors = random_parameters(*config, o.seed, *type);
  std::optional<json> quantization_config;
  if (!o.quant.empty()) {
    auto recipe = kernels::parse_int4_recipe(o.quant);
    if (!recipe)
      return fail(fmt::format("unknown --quant '{}' (int4-asym, int4-sym-qat or int4-sym)", o.quant));
    quant::quantize_options qo;
    qo.recipe = *recipe;
    qo.group_size = o.group_size;
    auto q = quant::quantize_tensors(std::move(tensors), qo);
    if (!q)
      return fail(fmt::format("--quant {} --group-size {}: {}", o.quant, o.group_size, q.error()));
    tensors = std::move(q->tensors);
    quantization_config = quant::compressed_tensors_config(*recipe, o.group_size, q->ignored);
  }
  std::map<std::string, std::string> metadata{
    {std::string(k_make_model_marker), std::string(k_marker_value)},
    {"rlserve.arch", o.arch},
    {"rlserve.preset", o.preset},
    {"rlserve.seed", std::to_string(o.seed)},
  };
  if (auto s = write_checkpoint(o.out, tensors, 5ull << 30, metadata); !s)
    return s;

  auto tokenizer = write_tiny_tokenizer(o.out, static_cast<int32_t>(config->vocab_size));
  if (!tokenizer)
    return fail(fmt::format("{}: writing the tokenizer failed: {}", o.out.string(),
                            tokenizer.error()));
  if (tokenizer->vocab_size != config->vocab_size)
    return fail(fmt::format("tiny tokenizer has {} tokens but preset '{}' needs {}",
                            tokenizer->vocab_size, o.preset, config->vocab_size));
  config->eos_token_ids = {tokenizer->eos_token_id};
  config->torch_dtype = std::string(torch_name(*type));

  json cfg = to_json(*config);
  cfg["max_window_layers"] = config->num_hidden_layers;
  cfg["sliding_window"] = nullptr;
  if (quantization_config)
    cfg["quantization_config"] = *quantization_config;
  if (auto s = write_json(o.out / "config.json", cfg); !s)
    return s;
  json gen = {{"eos_token_id", tokenizer->eos_token_id},
              {"do_sample", true},
              {"temperature", 1.0},
              {"top_p", 1.0}};
  return write_json(o.out / "generation_config.json", gen);
}

} // namespace rlserve::model
