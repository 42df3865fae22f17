// make-model: writes a complete Hugging Face model directory with seeded random weights, so every
// test, demo and benchmark has a real checkpoint without downloading one:
//
//   config.json             Qwen3ForCausalLM or Qwen3MoeForCausalLM, HF field names (transformers
//                           loads it)
//   model.safetensors       seeded random weights in `dtype`; metadata marks the file as ours
//   generation_config.json  eos_token_id and neutral sampling defaults
//   tokenizer files         from write_tiny_tokenizer (model/tiny_tokenizer.hpp)
//
// Weights (not HF's N(0, 0.02), which gives a random model with near-zero, uniform logits that
// would hide sampler bugs):
//   embeddings (tied to lm_head)   N(0, (2/sqrt(hidden))^2): logits spread with std ~2
//   q/k/v, gate/up projections     N(0, 1/fan_in): activations keep unit variance (MoE routers
//                                  too: logits of std ~1 spread the routing over the experts)
//   o_proj, down_proj              N(0, (3/sqrt(fan_in))^2): the residual branches dominate the
//                                  residual stream. With tied embeddings the current token's own
//                                  embedding adds |e|^2 / rms(x) to its logit; with a small
//                                  residual the model just repeats its input (how often, with
//                                  these scales and without: docs/performance.md, 'Random model
//                                  weight scales').
//   norm scales                    1 + N(0, 0.1^2)
// The normals are sums of 12 24-bit uniforms minus 6 from a per-tensor xoshiro stream (seed x
// tensor name): integer and exact float arithmetic only, so the same seed gives byte-identical
// files on every machine.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "messages/dtype.hpp"
#include "messages/expected.hpp"
#include "messages/tensor.hpp"
#include "model/config.hpp"

namespace rlserve::model {

struct make_model_options {
  std::string arch = "qwen3"; // "qwen3" | "qwen3-moe"
  std::string preset = "tiny"; // "tiny" | "small" | "medium"
  std::filesystem::path out;
  uint64_t seed = 0;
  std::string dtype = "bfloat16"; // "bfloat16" | "float16" | "float32"
  // INT4 checkpoint: "" (none) | "int4-asym" | "int4-sym-qat" | "int4-sym". The routed experts
  // are quantized with model/quant's quantize_tensors (what `rlserve quantize --targets experts`
  // runs) and config.json gets the matching compressed-tensors quantization_config and ignore
  // list: the tensors are byte-identical to make-model followed by `rlserve quantize`.
  std::string quant;
  int32_t group_size = 128; // with `quant`: 32, 64, 128, or -1 (per channel)
};

// Writes the directory. Refuses a non-empty `out` unless it holds an earlier make-model output
// (model.safetensors whose metadata says so), whose files it then overwrites.
status make_model(const make_model_options& options);

// The preset's config: "tiny" (vocab 512, hidden 64, 2 layers, 4 q / 2 kv heads, head_dim 16,
// intermediate 128) or "small" (vocab 2048, hidden 256, 4 layers, 8 / 4 heads, head_dim 32,
// intermediate 512) or "medium" (vocab 4096, hidden 512, 4 layers, 8 / 2 heads, head_dim 64,
// intermediate 1024: the smallest the GPU kernels run); all max_position_embeddings 2048,
// rope_theta 1e6, tied embeddings; or "a3b-slice" (Qwen3-30B-A3B's layer shapes: hidden 2048,
// 32 / 4 heads of 128, intermediate 6144, 128 experts of 768 top-8; 4 layers, vocab 4096,
// max_position_embeddings 40960, untied) for whole-engine GPU benchmarks.
// eos_token_ids is left empty (it comes from the tokenizer). arch "qwen3-moe" gives the same
// shapes as Qwen3MoeForCausalLM with every layer sparse: tiny 8 experts top-2,
// moe_intermediate_size 32; small 16 experts top-4, moe_intermediate_size 128; medium 32 experts
// top-4, moe_intermediate_size 256; norm_topk_prob,
// decoder_sparse_step 1, mlp_only_layers [].
expected<model_config> preset_config(std::string_view arch, std::string_view preset);

// The seeded random parameters described above, for every name the config implies, in `type`
// (bf16, f16 or f32), sorted by name.
std::vector<NamedTensor> random_parameters(const model_config& config, uint64_t seed, dtype type);

// Metadata key in model.safetensors that marks a make-model output (value "rlserve make-model").
inline constexpr std::string_view k_make_model_marker = "rlserve.generator";

} // namespace rlserve::model
