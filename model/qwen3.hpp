// qwen3_model: Qwen3 on the CPU, dense (Hugging Face Qwen3ForCausalLM) or sparse
// (Qwen3MoeForCausalLM), fp32 compute, owned by one runner. Forward, exactly as transformers
// defines it:
//
//   x = embed_tokens[ids]                                              [T, hidden]
//   per layer:
//     h = input_layernorm(x)                                           RMSNorm
//     q, k, v = q_proj(h), k_proj(h), v_proj(h)                        no bias
//     q, k = q_norm(q), k_norm(k)                                      RMSNorm over head_dim, per head
//     q, k = rope(q), rope(k)                                          rotate_half, positions from the cache
//     a = softmax(q k^T / sqrt(head_dim) + causal) v                   GQA: kv head = q head / (heads / kv_heads)
//     x = x + o_proj(a)
//     h' = post_attention_layernorm(x)
//     dense layer:  x = x + down_proj(silu(gate_proj(h')) * up_proj(h'))      intermediate_size
//     sparse layer (Qwen3MoeSparseMoeBlock; qwen3_layer_is_sparse says which):
//       p = softmax(mlp.gate(h'))                                      over all experts, fp32
//       (e_s, w_s) s < k = top-k of p, ties to the lower expert id; w_s /= sum w_s iff norm_topk_prob
//       x = x + sum_s w_s * experts[e_s].down_proj(silu(gate_proj(h')) * up_proj(h'))
//                                                                      moe_intermediate_size
//   logits = lm_head(norm(x))                                          lm_head = embed_tokens when tied
//
// Weights: every parameter is held twice, in the checkpoint's own bytes and dtype (what
// `parameter` returns and a weight update must match) and as an fp32 compute copy (q/k/v and
// gate/up rows laid out back to back, per MLP and per expert, so each pair is one fused matmul).
// The compute copies can be left out (qwen3_load_options::compute_copies = false: a GPU runner
// needs only the canonical bytes on the host); forward then fails, everything else works.
//
// INT4 (W4A16) checkpoints: config.json carries a compressed-tensors `quantization_config`
// (model/config.hpp) and each quantized Linear `<prefix>` holds, instead of `<prefix>.weight`,
//   <prefix>.weight_packed      int32 [n, k/8]
//   <prefix>.weight_scale       bf16  [n, k/G]
//   <prefix>.weight_zero_point  int32 [n/8, k/G] (standard) or [k/G, n/8] (miles); asymmetric only
//   <prefix>.weight_shape       int64 [2] = (n, k)
// (docs/formats.md §3). These ARE the module's parameters: parameters() lists them, parameter()
// returns their bytes, updates write them. The compute copy is the kernels' reference
// dequantization bf16_rn((q - z) * scale) (kernels::ct_dequant_ref). Modules of the ignore list
// (attention, routers, lm_head, ... as the checkpoint says) stay in their float dtype.
// A BF16 checkpoint can also be quantized at load (qwen3_load_options::quantize), with the code
// `rlserve quantize` uses, so the result is byte-identical to loading that command's output.
//
// Updates of an INT4 model (validate/assign, all or nothing): a quantized module accepts EITHER
//   - its load-format tensors by name (any subset; each must have the canonical dtype and shape,
//     zero points in the model's layout, weight_shape equal to (n, k), scales finite): the
//     module's other tensors stay as they are; or
//   - `<prefix>.weight` [n, k] in bf16, f16 or f32: quantized with the model's update recipe
//     (model_quantization::recipe) into new weight_packed / weight_scale / weight_zero_point, as
//     `rlserve quantize` would; a NaN/Inf is refused naming the tensor and element.
// Both forms for one module in one update is an error (which one should win is not knowable).
//
// Thread safety: forward and forward_all are const and may run concurrently with each other
// (each call owns its scratch); assign must not overlap any of them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kernels/compressed_tensors.hpp"
#include "kernels/int4_format.hpp"
#include "messages/dtype.hpp"
#include "messages/expected.hpp"
#include "messages/tensor.hpp"
#include "model/checkpoint.hpp"
#include "model/config.hpp"
#include "model/kv_cache.hpp"
#include "model/kv_pool.hpp"
#include "model/quant/int4_checkpoint.hpp"

namespace rlserve::model {

// One sequence's share of a batched forward.
struct forward_item {
  kv_sequence* kv;                 // its blocks must cover kv->length + tokens.size() positions
  std::span<const int32_t> tokens; // run at positions kv->length, kv->length + 1, ...
  int64_t logit_rows = 1;          // logits of its last `logit_rows` tokens (0: none, as for a
                                   // prefill chunk; tokens.size(): all, as for draft verification)
};

struct parameter_spec {
  std::string name; // Hugging Face name, "model.layers.0.self_attn.q_proj.weight"
  dtype type;       // the checkpoint's dtype (bf16, f16 or f32; i32/i64/bf16 for INT4 tensors)
  std::vector<int64_t> shape;
};

// One quantized Linear's load-format tensors, for a GPU runner that uploads them as they are.
struct int4_linear_view {
  kernels::int4_shape shape; // batch 1, n, k, group_size (as in kernels/int4_format.hpp)
  bool symmetric = false;
  kernels::zero_point_layout zp_layout = kernels::zero_point_layout::standard;
  std::span<const int32_t> weight_packed;     // [n, k/8]
  std::span<const uint16_t> weight_scale;     // [n, k/G] bf16 bits
  std::span<const int32_t> weight_zero_point; // asym only, in zp_layout; empty when symmetric
};

// How an INT4 model is quantized.
struct model_quantization {
  // What a BF16 `<prefix>.weight` update of a quantized module is quantized with: the load
  // recipe when the model was quantized at load; otherwise int4-asym for asymmetric checkpoints
  // and int4-sym-qat for symmetric ones (RL with QAT is the user; qwen3_load_options can say
  // otherwise).
  kernels::int4_recipe recipe = kernels::int4_recipe::asym;
  int32_t group_size = 128; // 32, 64, 128, or kernels::k_int4_channel
  bool symmetric = false;
  kernels::zero_point_layout zp_layout = kernels::zero_point_layout::standard; // asym only
  // experts: only routed experts are INT4; linear: some other Linear is too.
  quant::quant_targets targets = quant::quant_targets::experts;
};

struct qwen3_load_options {
  // Build the fp32 compute copies (what forward runs on). Off: only the canonical bytes are
  // kept (a GPU runner's host side); forward fails with a message saying so.
  bool compute_copies = true;
  // Quantize a BF16 checkpoint at load, exactly as `rlserve quantize` with these options would
  // (threads only changes the speed). Refused for a checkpoint that is already quantized.
  std::optional<quant::quantize_options> quantize;
  // Recipe for BF16 updates of a checkpoint that came quantized (default: see model_quantization).
  std::optional<kernels::int4_recipe> update_recipe;
  // Zero-point layout of an asymmetric checkpoint whose every module has n/8 == k/G (the shape
  // cannot tell standard from miles then); otherwise the shapes decide.
  kernels::zero_point_layout_hint zp_layout_hint = kernels::zero_point_layout_hint::auto_detect;
};

inline constexpr std::string_view k_qwen3_moe_architecture = "Qwen3MoeForCausalLM";


// Whether decoder layer `layer` has a sparse MoE block, as Qwen3MoeDecoderLayer decides: the
// architecture is Qwen3MoeForCausalLM, num_experts > 0, the layer is not in mlp_only_layers and
// (layer + 1) % decoder_sparse_step == 0. Sparse layers own model.layers.L.mlp.gate.weight
// [experts, hidden] (the router) and model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight
// ([moe_intermediate, hidden], [moe_intermediate, hidden], [hidden, moe_intermediate]); the
// others own the dense mlp.{gate,up,down}_proj.weight of intermediate_size.
bool qwen3_layer_is_sparse(const model_config& config, int64_t layer);

// The parameters a Qwen3 / Qwen3-MoE config implies, every one of dtype `type`, sorted by name
// (what qwen3_model::parameters() returns for a checkpoint saved in `type`; make-model writes
// these).
std::vector<parameter_spec> qwen3_parameter_specs(const model_config& config, dtype type);

class qwen3_model {
public:
  // Loads the parameters the config implies from `ckpt`. Fails, naming the tensors, when one is
  // missing, has another shape, has a dtype other than bf16/f16/f32, or when the checkpoint holds
  // tensors the model does not own. Tolerated and ignored, as transformers and vLLM do:
  // lm_head.weight when the config ties embeddings, and legacy rotary_emb.inv_freq buffers.
  // Refuses configs it would run wrong (another architecture, MoE fields on a dense architecture,
  // more than 256 experts or top-k above 32).
  // INT4 checkpoints (config.quantization): every Linear is either quantized (all its load-format
  // tensors present, consistent with weight_shape and the group size, zero points present iff
  // asymmetric) or in float and named by the ignore list; a quantized module the ignore list
  // names, a module with both forms or neither, f16 scales, and shapes or group sizes the INT4
  // kernels cannot run (quant::int4_module::create) are refused naming the module.
  static expected<qwen3_model> load(const model_config& config, const checkpoint& ckpt,
                                    const qwen3_load_options& options = {});
  // The same from tensors in memory (tests, and weights that never touched a file).
  static expected<qwen3_model> load(const model_config& config, std::span<const NamedTensor> tensors,
                                    const qwen3_load_options& options = {});

  // The config the model runs: a model quantized at load has its quantization_config here.
  const model_config& config() const { return config_; }
  // Every Hugging Face name the model owns, sorted. No lm_head.weight when embeddings are tied.
  // Quantized modules contribute their load-format tensors, not `<prefix>.weight`.
  std::vector<parameter_spec> parameters() const;
  // The parameter in canonical load-format bytes (checkpoint dtype), as last loaded or assigned.
  expected<HostTensor> parameter(std::string_view name) const;
  // Known name, same dtype, same shape, byte count consistent; the message names the tensor and
  // gives expected vs got ("parameter 'model.norm.weight': expected bfloat16 [64], got float32 [64]").
  // For a quantized module also `<prefix>.weight` (see the header comment), whose check includes
  // quantizing it (NaN/Inf, shape).
  status validate(const NamedTensor& t) const;
  // All or nothing: validates every tensor (and that no name repeats, and no module comes in
  // both forms) before writing any; then replaces each one's canonical bytes and recomputes the
  // fp32 copies it feeds.
  status assign(std::span<const NamedTensor> tensors);

  // The load-format tensors of quantized Linear `prefix` ("model.layers.3.mlp.experts.17.gate_proj"),
  // or nullopt when that module is BF16. Valid until the next assign().
  std::optional<int4_linear_view> int4_linear(std::string_view prefix) const;
  // The model's quantization (nullopt: BF16 model): recipe used to quantize BF16 updates, group
  // size, symmetric, zp layout, targets.
  const std::optional<model_quantization>& quantization() const { return quantization_; }
  // Whether the fp32 compute copies exist (qwen3_load_options::compute_copies).
  bool has_compute_copies() const { return compute_copies_; }

  // Runs a batch over a shared paged pool: every linear layer is one matmul over all items'
  // tokens; attention runs per item over its own blocks. On success each item's kv->length grows
  // by its token count and `logits` holds, item after item, the rows each asked for
  // ([sum of logit_rows, vocab_size]). Fails, changing no length, on an empty item, an id outside
  // the vocabulary, blocks that do not cover the new positions or lie outside the pool, a pool
  // shaped for another config, or a sequence longer than max_position_embeddings. Results do not
  // depend on how sequences are batched: every row is computed by the same float operations.
  //
  // `routed_experts` (optional): the router's choices for routing replay (SGLang's
  // return_routed_experts), [tokens of all items in order, num_hidden_layers, num_experts_per_tok]:
  // each position's top-k expert ids per layer, by descending weight; -1 in dense layers. Left
  // empty for a model without experts.
  status forward(kv_pool& pool, std::span<forward_item> items, std::vector<float>& logits,
                 std::vector<int32_t>* routed_experts = nullptr) const;
  // One sequence in its own growing cache: runs `tokens` after what `cache` holds and writes the
  // logits of the LAST position into `logits` (vocab_size).
  status forward(kv_cache& cache, std::span<const int32_t> tokens, std::vector<float>& logits) const;
  // Logits of every position, [tokens.size() * vocab_size] row-major, from an empty cache
  // (parity tests and `rlserve forward`). Row t equals what forward() returns after token t.
  expected<std::vector<float>> forward_all(std::span<const int32_t> tokens) const;

  // An empty cache shaped for this model.
  kv_cache make_cache() const { return kv_cache(config_); }

private:
  struct param_entry {
    parameter_spec spec;
    HostTensor canonical;
    std::size_t offset = 0; // into weights_, where the fp32 copy starts
  };
  // Offsets into weights_ of one decoder layer's fp32 weights.
  struct layer_weights {
    std::size_t input_norm;  // [hidden]
    std::size_t qkv;         // [(heads + 2 kv_heads) * head_dim, hidden]: q_proj, k_proj, v_proj rows
    std::size_t q_norm;      // [head_dim]
    std::size_t k_norm;      // [head_dim]
    std::size_t o;           // [hidden, heads * head_dim]
    std::size_t post_norm;   // [hidden]
    bool sparse = false;     // a MoE block (qwen3_layer_is_sparse) instead of the dense MLP
    std::size_t gate_up = 0; // dense: [2 * intermediate, hidden]: gate_proj rows, then up_proj rows
    std::size_t down = 0;    // dense: [hidden, intermediate]
    std::size_t router = 0;  // sparse: [experts, hidden]
    std::vector<std::size_t> expert_gate_up; // sparse, per expert: [2 * moe_intermediate, hidden]
    std::vector<std::size_t> expert_down;    // sparse, per expert: [hidden, moe_intermediate]
  };
  // A sparse block's buffers, owned by one forward call.
  struct moe_scratch {
    std::vector<float> router_logits;        // [T, experts]
    std::vector<int32_t> ids;                // [T, top_k] chosen experts, by descending weight
    std::vector<float> weights;              // [T, top_k]
    std::vector<float> y;                    // [T * top_k, hidden] each slot's expert output
    std::vector<int64_t> rows;               // slots routed to the current expert
    std::vector<float> xe, gate_up, act, ye; // the current expert's gathered rows
  };
  status moe_block(const layer_weights& L, int64_t layer, const float* h, int64_t T, float* out,
                   moe_scratch& scratch) const;

  // A quantized Linear: its tensors are param entries; its fp32 copy sits at `offset`.
  struct int4_entry {
    std::string prefix;
    kernels::int4_shape shape;
    std::size_t packed = 0, scale = 0, shape_param = 0; // indices into params_
    std::optional<std::size_t> zero_point;              // asymmetric only
    std::size_t offset = 0;                             // into weights_
  };
  // One tensor of an update, checked and ready to write (see stage()).
  struct staged_tensor {
    std::size_t param;                 // index into params_
    HostTensor tensor;                 // the new canonical bytes
  };
  struct staged_update {
    std::vector<staged_tensor> tensors;
    std::vector<std::size_t> float_params; // float params whose fp32 copy to rebuild
    std::vector<std::size_t> int4_modules; // int4_ entries whose fp32 copy to rebuild
  };
  // Checks one update tensor and appends what it writes to `out` (a BF16 `.weight` of a
  // quantized module is quantized here). `module_form` records which form each INT4 module came
  // in (index -> true for the `.weight` form), to refuse mixing.
  status stage(const NamedTensor& t, staged_update& out,
               std::unordered_map<std::size_t, bool>* module_form) const;
  status dequantize_into_arena(const int4_entry& e);

  static expected<qwen3_model> load_named(const model_config& config,
                                          std::vector<NamedTensor> tensors,
                                          const qwen3_load_options& options, const std::string& where);
  template <class Lookup>
  static expected<qwen3_model> load_from(const model_config& config,
                                         const std::vector<std::string>& available, Lookup&& get,
                                         const std::string& where, const qwen3_load_options& options);
  const float* w(std::size_t offset) const { return weights_.data() + offset; }

  model_config config_;
  std::vector<param_entry> params_;                      // sorted by name
  std::unordered_map<std::string, std::size_t> by_name_; // name -> index into params_
  std::vector<float> weights_;                           // fp32 compute copies, one arena
  std::vector<layer_weights> layers_;
  std::size_t embed_ = 0;   // [vocab, hidden]
  std::size_t norm_ = 0;    // [hidden]
  std::size_t lm_head_ = 0; // [vocab, hidden]; == embed_ when tied
  bool compute_copies_ = true;
  std::optional<model_quantization> quantization_;
  std::vector<int4_entry> int4_;                              // sorted by prefix
  std::unordered_map<std::string, std::size_t> int4_by_prefix_; // prefix -> index into int4_
  std::vector<std::optional<std::size_t>> int4_of_param_;       // param index -> its int4_ entry
};

} // namespace rlserve::model
