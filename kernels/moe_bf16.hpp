// The BF16 fused MoE (the engine's BF16 expert baseline beside the INT4 one): one of the GPU
// decoder forward's ops, under the conventions at the top of kernels/decoder_ops.hpp (args struct,
// *_ref / *_launch, graph-capturable launches, padding rows, numerics). CPU reference:
// kernels/cpu/moe_bf16.cpp; CUDA twin: kernels/cuda/moe_bf16.cu.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kernel_status.hpp"

using cudaStream_t = struct CUstream_st*;

namespace rlserve::kernels {

// ---- BF16 fused MoE ------------------------------------------------------------------------------
// The same layer as kernels/fused_moe.hpp (routing, SwiGLU experts, weighted combine in slot
// order, h rounded to bf16, y in fp32, one bf16 rounding of out) with BF16 expert weights in the
// Hugging Face orientation. Tokens with router row all -inf never occur (padding rows carry a
// finite router row and their output is ignored by the caller).
struct moe_bf16_args {
  int64_t tokens = 0, hidden = 0, intermediate = 0, experts = 0; // hidden, intermediate % 64 == 0
  int32_t top_k = 8;
  bool norm_topk_prob = true;
  const float* router_logits = nullptr; // fp32 [tokens, experts]
  const uint16_t* x = nullptr;          // bf16 [tokens, hidden]
  const uint16_t* w13 = nullptr;        // bf16 [experts, 2 * intermediate, hidden] (gate rows, then up rows)
  const uint16_t* w2 = nullptr;         // bf16 [experts, hidden, intermediate]
  uint16_t* out = nullptr;              // bf16 [tokens, hidden]
  int64_t max_tokens = 0;               // workspace capacity (0 = tokens), as fused_moe_args
};
kernel_status moe_bf16_can_implement(const moe_bf16_args& a);
kernel_status moe_bf16_ref(const moe_bf16_args& a);
std::size_t moe_bf16_workspace_bytes(const moe_bf16_args& a);
kernel_status moe_bf16_workspace_init(const moe_bf16_args& a, void* workspace, cudaStream_t stream);
kernel_status moe_bf16_launch(const moe_bf16_args& a, void* workspace, cudaStream_t stream);
// Where the last launch left the router's top-k ids [tokens, top_k] in `workspace` (routing
// replay reads them), as fused_moe_workspace_parts(...).topk_ids for the INT4 MoE.
int32_t* moe_bf16_topk_ids(const moe_bf16_args& a, void* workspace);

} // namespace rlserve::kernels
