// CPU ops of the dense transformer forward (model/qwen3.cpp): matmul, RoPE, causal GQA attention,
// SiLU-gated product, softmax. fp32 throughout, row-major, no allocation inside the ops except the
// matmul's worker threads. Same API shape as kernels/rms_norm.hpp: an *_args struct whose pointer
// members carry their shapes, and a function returning kernel_status (never throwing), so a CUDA
// twin can later take the same arguments.
//
// Determinism: every output element is computed by the same sequence of float operations whatever
// m, the thread count or the position of the row in a batch. Decoding token by token with a KV
// cache therefore gives bit-identical logits to one forward over the whole sequence.
#pragma once

#include <cstdint>

#include "kernels/kernel_status.hpp"

namespace rlserve::kernels {

// y[i, j] = sum_p x[i, p] * w[j, p]: a torch Linear (y = x W^T) with W stored [out, in].
struct matmul_args {
  const float* x; // [m, k] row-major
  const float* w; // [n, k] row-major (out_features x in_features, as checkpoints store it)
  float* y;       // [m, n] row-major; must not overlap x or w
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  int threads = 0; // 0: one thread for small problems, up to hardware_concurrency for big ones
};
kernel_status matmul_can_implement(const matmul_args& args);
// Blocked: 4 rows of w against one row of x at a time, 8 independent partial sums per dot so the
// compiler vectorizes without -ffast-math; big problems split over std::thread by output columns.
kernel_status matmul_cpu(const matmul_args& args);

// Rotary position embedding, Hugging Face `rotate_half` convention: for pair i < d/2 of a head,
// (x[i], x[i + d/2]) is rotated by angle pos * theta^(-2i/d).
struct rope_args {
  float* x;               // [tokens, heads, head_dim], rotated in place
  int64_t tokens = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;   // even
  int64_t first_position = 0; // position of token 0; token t sits at first_position + t
  double theta = 10000.0;
};
kernel_status rope_can_implement(const rope_args& args);
// Angles and their sin/cos in double, rounded to float once (transformers computes them in fp32;
// the difference is far below bf16 resolution at any context length we serve).
kernel_status rope_cpu(const rope_args& args);

// Causal grouped-query attention of tq new queries against tk cached keys/values (the new tokens'
// keys included, at the end). Query t sits at position tk - tq + t and attends to keys
// 0 .. tk - tq + t. Query head h reads kv head h / (n_heads / n_kv_heads).
struct attention_args {
  const float* q; // [tq, n_heads, head_dim]
  const float* k; // [tk, n_kv_heads, head_dim]
  const float* v; // [tk, n_kv_heads, head_dim]
  float* out;     // [tq, n_heads, head_dim]; must not overlap q, k, v
  int64_t tq = 0;
  int64_t tk = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  float scale = 1.0f; // 1/sqrt(head_dim) for Qwen3
};
kernel_status attention_can_implement(const attention_args& args);
kernel_status attention_cpu(const attention_args& args);

// out[r, c] = silu(gate_up[r, c]) * gate_up[r, cols + c]: the SwiGLU of a fused gate/up projection
// (gate rows first, up rows second in the fused weight).
struct silu_mul_args {
  const float* gate_up; // [rows, 2 * cols]
  float* out;           // [rows, cols]
  int64_t rows = 0;
  int64_t cols = 0;
};
kernel_status silu_mul_can_implement(const silu_mul_args& args);
kernel_status silu_mul_cpu(const silu_mul_args& args);

// Row-wise softmax / log-softmax, max-subtracted, sums in double. y may alias x.
struct softmax_args {
  const float* x; // [rows, cols]
  float* y;       // [rows, cols]
  int64_t rows = 0;
  int64_t cols = 0;
};
kernel_status softmax_can_implement(const softmax_args& args);
kernel_status softmax_cpu(const softmax_args& args);
kernel_status log_softmax_cpu(const softmax_args& args);

} // namespace rlserve::kernels
