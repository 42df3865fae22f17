// Paged attention (prefill chunks and decode rows in one launch): one of the GPU decoder forward's
// ops, under the conventions at the top of kernels/decoder_ops.hpp (args struct, *_ref / *_launch,
// graph-capturable launches, padding rows, numerics). CPU reference:
// kernels/cpu/paged_attention.cpp; CUDA twin: kernels/cuda/paged_attention.cu.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kernel_status.hpp"

using cudaStream_t = struct CUstream_st*;

namespace rlserve::kernels {

// ---- paged attention (prefill chunks and decode in one launch) ---------------------------------
// Query row t belongs to sequence s = row_seq[t] (-1: padding, output zeros) and sits at position
// p = row_pos[t]; it attends causally to that sequence's keys at positions 0 .. p, position j
// living in slot block_table[s * max_blocks + j / block_size] * block_size + j % block_size.
// Query head h reads kv head h / (q_heads / kv_heads). softmax(q k^T * scale) in fp32, P used in
// fp32 (the CUDA kernel: about 16 bits, as two bf16 parts on the tensor cores), one bf16 rounding
// of the output. The keys of the current step must already be written
// (qk_norm_rope_kv runs first).
struct paged_attention_args {
  const uint16_t* q = nullptr;        // bf16 [tokens, q_heads, head_dim]
  const uint16_t* k_cache = nullptr;  // bf16 [num_slots, kv_heads, head_dim]
  const uint16_t* v_cache = nullptr;
  const int32_t* block_table = nullptr; // [sequences, max_blocks]
  const int32_t* row_seq = nullptr;     // [tokens]
  const int32_t* row_pos = nullptr;     // [tokens]
  uint16_t* out = nullptr;              // bf16 [tokens, q_heads, head_dim]
  int64_t tokens = 0, sequences = 0, max_blocks = 0, block_size = 16;
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0; // head_dim in {64, 128}
  int64_t max_context = 0; // static upper bound on p + 1 (sizes split-KV work; 0 = max_blocks * block_size)
  // Workspace capacity in rows (0 = tokens). Launches of different token counts that share one
  // workspace must all pass the same max_tokens: the split merge's arrival counters persist
  // between launches, so their place may not move with the token count.
  int64_t max_tokens = 0;
  float scale = 1.0f;
};
kernel_status paged_attention_can_implement(const paged_attention_args& a);
kernel_status paged_attention_ref(const paged_attention_args& a);
// Scratch for split-KV partials and the merge's arrival counters; depends only on the static
// sizes. May be 0. The counters must be zero before the first launch (workspace_init, or a memset
// of the whole workspace); every launch leaves them zero again.
std::size_t paged_attention_workspace_bytes(const paged_attention_args& a);
kernel_status paged_attention_workspace_init(const paged_attention_args& a, void* workspace, cudaStream_t stream);
kernel_status paged_attention_launch(const paged_attention_args& a, void* workspace, cudaStream_t stream);

} // namespace rlserve::kernels
