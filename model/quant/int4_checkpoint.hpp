// Quantizing a Hugging Face BF16 checkpoint to compressed-tensors `pack-quantized` INT4 (W4A16),
// the offline twin of what the engine does to a trainer's BF16 update: the same recipes
// (kernels/int4_quant.hpp), the same packing (docs/formats.md §3).
//
//   rlserve quantize --model IN --out OUT --recipe int4-asym --group-size 128 [--targets experts]
//
// For every target weight `<prefix>.weight` [n, k] the output holds `<prefix>.weight_packed`
// (I32 [n, k/8]), `<prefix>.weight_scale` (BF16 [n, k/G]), `<prefix>.weight_zero_point`
// (asymmetric: I32 [n/8, k/G], or [k/G, n/8] with the miles layout) and `<prefix>.weight_shape`
// (I64 [2]); every other tensor is copied unchanged. config.json gains a compressed-tensors
// `quantization_config` whose `ignore` lists the Linear modules left in BF16; every other file of
// the directory (tokenizer, generation config) is copied.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/int4_format.hpp"
#include "messages/expected.hpp"
#include "messages/tensor.hpp"

namespace rlserve::model::quant {

// Which weights become INT4.
enum class quant_targets : uint8_t {
  experts = 1, // routed MoE experts only: model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight
  linear,      // every Linear except lm_head, embeddings, routers (mlp.gate, *_gate) and norms
};

constexpr std::string_view to_string(quant_targets t) {
  switch (t) {
    case quant_targets::experts: return "experts";
    case quant_targets::linear: return "linear";
  }
  return "unknown";
}
std::optional<quant_targets> parse_quant_targets(std::string_view name);

// ---- name rules (pure; shapes are the tensor's) ------------------------------------------------

// model.layers.<int>.mlp.experts.<int>.{gate,up,down}_proj.weight
bool is_routed_expert_weight(std::string_view name);
// The weight of a Linear module: a 2-D "<module>.weight" that is not an embedding table.
bool is_linear_weight(std::string_view name, std::span<const int64_t> shape);
// A target under `targets` (routers, lm_head and embeddings are never targets).
bool is_quantization_target(std::string_view name, std::span<const int64_t> shape, quant_targets targets);

// The compressed-tensors `quantization_config` object: quant_method "compressed-tensors", format
// "pack-quantized", config_groups.group_0 = {targets ["Linear"], weights {num_bits 4, type int,
// strategy group|channel, group_size (null for channel), symmetric, actorder null, dynamic
// false}}, and `ignore` (module names, sorted).
nlohmann::json compressed_tensors_config(kernels::int4_recipe recipe, int32_t group_size,
                                         const std::vector<std::string>& ignore);

// ---- one weight, and a whole set of tensors in memory ----------------------------------------------

// The quantization a BF16 model gets (offline, at load with --quantize, and for a BF16 update of
// an INT4 model): one definition so all three give the same bytes.
struct quantize_options {
  kernels::int4_recipe recipe = kernels::int4_recipe::asym;
  int32_t group_size = 128; // 32, 64, 128, or kernels::k_int4_channel
  quant_targets targets = quant_targets::experts;
  kernels::zero_point_layout zp_layout = kernels::zero_point_layout::standard;
  int threads = 0; // quantization workers; 0 = std::thread::hardware_concurrency()
};

// `<prefix>.weight` [n, k] (bf16, f16 or f32; f16/f32 are rounded to bf16 first, as a trainer's
// bf16 cast would) -> `<prefix>.weight_packed`, `.weight_scale`, [`.weight_zero_point`],
// `.weight_shape`, in that order. Fails naming `name` on a shape the format cannot hold or a
// NaN/Inf element. (targets and threads of `o` are not used.)
expected<std::vector<NamedTensor>> quantize_weight(const std::string& name, const HostTensor& weight,
                                                   const quantize_options& o);

struct quantized_tensors {
  std::vector<NamedTensor> tensors;  // sorted by name: targets replaced, everything else as given
  int64_t quantized = 0;             // weights turned into INT4
  uint64_t quantized_input_bytes = 0;
  std::vector<std::string> ignored;  // Linear modules left in BF16 (sorted; always has lm_head)
};

// Quantizes every target of `tensors` on a pool of workers (deterministic output whatever the
// scheduling). Fails when nothing matches the targets, or with the first failing weight in name
// order. `progress` as in quantize_checkpoint_options.
expected<quantized_tensors> quantize_tensors(std::vector<NamedTensor> tensors, const quantize_options& o,
                                             const std::function<void(const std::string&)>& progress = {});

// ---- the whole checkpoint --------------------------------------------------------------------------

struct quantize_checkpoint_options {
  std::filesystem::path model; // input model directory (config.json + safetensors)
  std::filesystem::path out;   // output directory (created; must differ from `model`)
  kernels::int4_recipe recipe = kernels::int4_recipe::asym;
  int32_t group_size = 128; // 32, 64, 128, or kernels::k_int4_channel
  quant_targets targets = quant_targets::experts;
  kernels::zero_point_layout zp_layout = kernels::zero_point_layout::standard;
  std::size_t max_shard_bytes = 5ull << 30;
  int threads = 0; // quantization workers; 0 = std::thread::hardware_concurrency()
  // Called with one progress line at a time (about once a second, and at the end); may be empty.
  std::function<void(const std::string&)> progress;
};

struct quantize_checkpoint_report {
  int64_t quantized = 0;            // weights turned into INT4
  int64_t copied = 0;               // tensors copied unchanged
  uint64_t quantized_input_bytes = 0;
  uint64_t output_bytes = 0;        // all tensors written
  std::vector<std::string> ignored; // Linear modules left in BF16 (the config's ignore list)
  std::vector<std::string> copied_files; // non-weight files copied (tokenizer, ...)
};

// Fails, naming the tensor, on a target that is not 2-D, whose shape the format cannot hold
// (k % G, k % 8, n % 8 for zero points) or that holds a NaN/Inf; on an unreadable checkpoint or
// config; and when there is nothing to quantize (no tensor matches the targets).
expected<quantize_checkpoint_report> quantize_checkpoint(const quantize_checkpoint_options& options);

} // namespace rlserve::model::quant
