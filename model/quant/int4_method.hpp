// int4_method: the quantization method of INT4 (W4A16) modules with the SERVING / LOAD_FORMAT
// state machine (docs/formats.md, '5a') — what a runner does to its quantized weights around an
// update.
//
//   LOAD_FORMAT  the module's buffers hold compressed-tensors `pack-quantized` tensors
//                (weight_packed [E, n, k/8], weight_scale [E, n, k/G], weight_zero_point in the
//                layout the checkpoint used): what checkpoints and trainers send, so an update
//                writes tensors straight in.
//   SERVING      the same buffers hold the serving layout the W4A16 GEMM / fused-MoE kernels
//                read (kernels/serving_layout.hpp).
//
// restore() goes SERVING -> LOAD_FORMAT, post_process() LOAD_FORMAT -> SERVING; each is idempotent
// by state and reports what it did. Both are exact permutations (restore(post_process(x)) == x
// bit for bit), so tensors an update does not touch come back identical. The buffers are
// allocated once and rewritten in place: their addresses never change, so CUDA graphs captured
// over them stay valid (a GPU runner keeps the same buffers on the device).
//
// A fused MoE layer is two modules, `w13` (E experts of [2I, H]: gate_proj in output rows
// [0, I), up_proj in [I, 2I)) and `w2` (E experts of [H, I]: down_proj), loaded per expert.
// Zero points are copied in the layout they came in and never transposed by the expert loader:
// concatenating gate and up happens along n, which is dim 0 of the standard [n/8, k/G] layout and
// dim 1 of the miles [k/G, n/8] one.
//
// Shapes and group sizes the kernels cannot run are refused by create(), at load time, with the
// module's name, the dimension and the multiple it needs.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/int4_format.hpp"
#include "messages/expected.hpp"

namespace rlserve::model::quant {

enum class weight_layout_state : uint8_t { load_format = 1, serving };

struct int4_module_spec {
  std::string name;     // "model.layers.3.mlp.experts.w13", "model.layers.3.self_attn.q_proj"
  kernels::int4_shape shape;  // batch = experts (1 for a linear layer), n, k, group size
  bool symmetric = false;     // true: no zero point (z = 8)
  kernels::zero_point_layout zp_layout = kernels::zero_point_layout::standard;
};

// One expert's (or a linear layer's) load-format tensors, as 32-bit / 16-bit words.
struct int4_load_tensors {
  std::span<const int32_t> weight_packed;     // [n, k/8]
  std::span<const uint16_t> weight_scale;     // [n, k/G] bf16 bits
  std::span<const int32_t> weight_zero_point; // asym: [n/8, k/G] or [k/G, n/8]; empty if sym
};

class int4_module {
public:
  // Buffers sized for `spec`, zeroed, in LOAD_FORMAT. Refuses shapes the kernels cannot run.
  static expected<int4_module> create(int4_module_spec spec);

  const int4_module_spec& spec() const { return spec_; }
  weight_layout_state state() const { return state_; }

  // Writes expert `expert`'s load-format tensors. Only in LOAD_FORMAT (restore first); sizes
  // must match the spec; all or nothing.
  status load_expert(int64_t expert, const int4_load_tensors& t);
  // Fused MoE w13: gate_proj and up_proj of one expert, each [I, k] with I = n / 2, concatenated
  // along n (gate first) without transposing anything.
  status load_gate_up(int64_t expert, const int4_load_tensors& gate, const int4_load_tensors& up);

  // SERVING -> LOAD_FORMAT; in LOAD_FORMAT nothing happens. Returns what it did, as a sentence.
  expected<std::string> restore();
  // LOAD_FORMAT -> SERVING; in SERVING nothing happens.
  expected<std::string> post_process();

  // The buffers, read in the current state's layout. Their addresses never change.
  std::span<const int32_t> weight_words() const { return weight_; }
  std::span<const uint16_t> scale_words() const { return scale_; }
  std::span<const int32_t> zero_point_words() const { return zero_point_; }

private:
  int4_module() = default;
  int64_t packed_per_expert() const;
  int64_t scales_per_expert() const;
  int64_t zps_per_expert() const;

  int4_module_spec spec_;
  weight_layout_state state_ = weight_layout_state::load_format;
  std::vector<int32_t> weight_;
  std::vector<uint16_t> scale_;
  std::vector<int32_t> zero_point_;
};

// The modules of one model, quantized or not, so a runner restores and post-processes them as a
// whole. Modules without a quantization method (norms, embeddings, BF16 layers) and LoRA
// wrappers are listed by name and skipped, and the report says so.
class quantized_modules {
public:
  void add(int4_module m) { int4_.push_back(std::move(m)); }
  void add_unquantized(std::string name) { unquantized_.push_back(std::move(name)); }

  expected<std::string> restore_all();
  expected<std::string> post_process_all();

  int4_module* find(std::string_view name);
  std::size_t size() const { return int4_.size(); }

private:
  template <class Op>
  expected<std::string> apply(const char* verb, Op&& op);

  std::vector<int4_module> int4_;
  std::vector<std::string> unquantized_;
};

} // namespace rlserve::model::quant
