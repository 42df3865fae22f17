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

#include "kernels/int4_format.hpp"
#include "messages/dtype.hpp"
#include "messages/expected.hpp"
#include "messages/tensor.hpp"
#include "model/checkpoint.hpp"
#include "model/config.hpp"
#include "model/kv_cache.hpp"
#include "model/kv_pool.hpp"

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
  dtype type;       // the checkpoint's dtype (bf16, f16 or f32)
  std::vector<int64_t> shape;
};

inline constexpr std::string_view k_qwen3_moe_architecture = "Qwen3MoeForCausalLM";

// The load-format (compressed-tensors) tensors of one quantized Linear module.
struct int4_linear_view {
  kernels::int4_shape shape;        // batch 1, n, k, group_size
  bool symmetric = false;
  kernels::zero_point_layout zp_layout = kernels::zero_point_layout::standard;
  std::span<const int32_t> weight_packed;     // [n, k/8]
  std::span<const uint16_t> weight_scale;     // [n, k/G] bf16 bits
  std::span<const int32_t> weight_zero_point; // asym only, in zp_layout; empty when symmetric
};

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
  static expected<qwen3_model> load(const model_config& config, const checkpoint& ckpt);
  // The same from tensors in memory (tests, and weights that never touched a file).
  static expected<qwen3_model> load(const model_config& config, std::span<const NamedTensor> tensors);

  const model_config& config() const { return config_; }
  // Every Hugging Face name the model owns, sorted. No lm_head.weight when embeddings are tied.
  std::vector<parameter_spec> parameters() const;
  // The parameter in canonical load-format bytes (checkpoint dtype), as last loaded or assigned.
  expected<HostTensor> parameter(std::string_view name) const;
  // Known name, same dtype, same shape, byte count consistent; the message names the tensor and
  // gives expected vs got ("parameter 'model.norm.weight': expected bfloat16 [64], got float32 [64]").
  status validate(const NamedTensor& t) const;
  // All or nothing: validates every tensor (and that no name repeats) before writing any; then
  // replaces each one's canonical bytes and recomputes its fp32 copy.
  status assign(std::span<const NamedTensor> tensors);

  // Runs a batch over a shared paged pool: every linear layer is one matmul over all items'
  // tokens; attention runs per item over its own blocks. On success each item's kv->length grows
  // by its token count and `logits` holds, item after item, the rows each asked for
  // ([sum of logit_rows, vocab_size]). Fails, changing no length, on an empty item, an id outside
  // the vocabulary, blocks that do not cover the new positions or lie outside the pool, a pool
  // shaped for another config, or a sequence longer than max_position_embeddings. Results do not
  // depend on how sequences are batched: every row is computed by the same float operations.
  status forward(kv_pool& pool, std::span<forward_item> items, std::vector<float>& logits) const;
  // One sequence in its own growing cache: runs `tokens` after what `cache` holds and writes the
  // logits of the LAST position into `logits` (vocab_size).
  status forward(kv_cache& cache, std::span<const int32_t> tokens, std::vector<float>& logits) const;
  // Logits of every position, [tokens.size() * vocab_size] row-major, from an empty cache
  // (parity tests and `rlserve forward`). Row t equals what forward() returns after token t.
  expected<std::vector<float>> forward_all(std::span<const int32_t> tokens) const;

  // The load-format tensors of quantized Linear `prefix` ("model.layers.3.mlp.experts.17.gate_proj"),
  // or nullopt when that module is BF16. Valid until the next assign().
  std::optional<int4_linear_view> int4_linear(std::string_view prefix) const;

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

  template <class Lookup>
  static expected<qwen3_model> load_from(const model_config& config,
                                         const std::vector<std::string>& available, Lookup&& get,
                                         const std::string& where);
  const float* w(std::size_t offset) const { return weights_.data() + offset; }

  model_config config_;
  std::vector<param_entry> params_;                      // sorted by name
  std::unordered_map<std::string, std::size_t> by_name_; // name -> index into params_
  std::vector<float> weights_;                           // fp32 compute copies, one arena
  std::vector<layer_weights> layers_;
  std::size_t embed_ = 0;   // [vocab, hidden]
  std::size_t norm_ = 0;    // [hidden]
  std::size_t lm_head_ = 0; // [vocab, hidden]; == embed_ when tied
};

} // namespace rlserve::model
