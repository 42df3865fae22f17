// The Qwen3-30B-A3B shape the GPU benchmarks run at (random weights, made on the device):
// hidden 2048, 32 query / 4 KV heads of 128, 128 experts of 768 (top-8), vocabulary 151936,
// every layer sparse; `layers` of them (48 in the real model).
#pragma once

#include <cstdint>

#include "model/config.hpp"

namespace rlserve::bench {

inline model::model_config qwen3_30b_a3b(int64_t layers) {
  model::model_config c;
  c.architecture = "Qwen3MoeForCausalLM";
  c.model_type = "qwen3_moe";
  c.vocab_size = 151936;
  c.hidden_size = 2048;
  c.intermediate_size = 6144;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 4;
  c.head_dim = 128;
  c.max_position_embeddings = 40960;
  c.rope_theta = 1e6;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = false;
  c.num_experts = 128;
  c.num_experts_per_tok = 8;
  c.moe_intermediate_size = 768;
  c.decoder_sparse_step = 1;
  c.norm_topk_prob = true;
  return c;
}

} // namespace rlserve::bench
