// Fused MoE for decode and prefill with INT4 W4A16 experts in the serving layout (Qwen3-MoE:
// softmax router, top-k, norm_topk_prob, SwiGLU experts):
//
//   p        = softmax(router_logits[t, :])                   FP32
//   (e_s, w_s) s < k = top-k of p (ties: lower expert id), w_s /= sum_s w_s if norm_topk_prob
//   g | u    = x[t] W13[e_s]^T        W13 [2I, H]: gate rows [0, I), up rows [I, 2I)
//   h        = bf16( silu(bf16(g)) * bf16(u) )                [I]
//   y_s      = h W2[e_s]^T            W2 [H, I], kept in FP32
//   out[t]   = bf16( sum_s w_s * y_s )                        summed in slot order, FP32
//
// Every expert GEMM dequantizes like gemm_w4a16 (bf16_rn((q - z) * scale), FP32 accumulation).
// The CPU reference (fused_moe_ref) builds the layer from the stage references below and
// per-expert unfused gemm_w4a16_ref / gemm_w4a16_ref_f32 calls; the CUDA launch runs five kernels
// (four on the small-T GEMV path, below) on one stream, with no host synchronization (CUDA-graph capturable):
//   1. moe_topk     warp per token: softmax, top-k, renormalize          -> ids, weights [T, k]
//   2. moe_align    one CTA: flat ids t*k+s grouped by expert, each expert's run padded to the
//                   GEMM's m block (block_rows rows), one expert id per block
//   3. w13 GEMM     the W4A16 core over (m block x 256-column tile x k stage) stream-K units; a
//                   CTA tile holds 128 gate + the matching 128 up columns, so the epilogue
//                   computes h directly                                   -> h [T*k, I] bf16
//   4. w2 GEMM      the same core gathering rows of h                    -> y [T*k, H] FP32
//   5. combine      out[t] = bf16(sum_s w_s * y[t*k+s]) in slot order    -> out [T, H] bf16
// Results are deterministic (no atomics on data; the order of tokens inside an expert's run
// comes from atomics but every output row is computed independently of its position).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/int4_format.hpp"
#include "kernels/kernel_status.hpp"

using cudaStream_t = struct CUstream_st*;

namespace rlserve::kernels {

// ---- stage 1: router top-k --------------------------------------------------------------------------

struct moe_topk_args {
  int64_t tokens = 0;
  int64_t experts = 0;                  // <= 256
  int32_t top_k = 8;                    // 1 .. min(experts, 32)
  bool norm_topk_prob = true;           // renormalize the k weights to sum 1 (Qwen3-MoE)
  const float* router_logits = nullptr; // [tokens, experts], finite
  int32_t* topk_ids = nullptr;          // [tokens, top_k] out: experts by descending logit
  float* topk_weights = nullptr;        // [tokens, top_k] out
};

kernel_status moe_topk_can_implement(const moe_topk_args& args);
kernel_status moe_topk_ref(const moe_topk_args& args);
kernel_status moe_topk_launch(const moe_topk_args& args, cudaStream_t stream);

// ---- stage 2: token-to-expert alignment ----------------------------------------------------------

struct moe_align_args {
  int64_t num_ids = 0;               // tokens * top_k
  int64_t experts = 0;
  int32_t block = 16;                // rows per GEMM m block (a multiple of 8)
  const int32_t* topk_ids = nullptr; // [num_ids] expert of flat id i = token * top_k + slot
  int32_t* sorted_ids = nullptr;     // [moe_align_capacity] flat ids grouped by expert (ascending
                                     // expert), each run padded with num_ids to a multiple of block
  int32_t* block_expert = nullptr;   // [moe_align_capacity / block] expert of each block
  int32_t* num_padded = nullptr;     // [1] entries of sorted_ids in use
};

// Entries sorted_ids may need: block * (num_ids / block + min(experts, num_ids)).
int64_t moe_align_capacity(int64_t num_ids, int64_t experts, int32_t block);
kernel_status moe_align_can_implement(const moe_align_args& args);
// Ids inside each expert's run in ascending order, on the CPU and on the GPU (the order decides
// each row's GEMM tile, and so its summation order: kernels/cuda/fused_moe.cu).
kernel_status moe_align_ref(const moe_align_args& args);
kernel_status moe_align_launch(const moe_align_args& args, cudaStream_t stream);

// ---- the whole layer -----------------------------------------------------------------------------

struct fused_moe_args {
  int64_t tokens = 0;        // T (0 is a no-op)
  int64_t hidden = 0;        // H: multiple of 64 and of the group size
  int64_t intermediate = 0;  // I per expert: multiple of 64 and of the group size
  int64_t experts = 0;       // E <= 256
  int32_t top_k = 8;
  bool norm_topk_prob = true;
  int32_t group_size = 128;  // 32, 64, 128 or k_int4_channel, both projections
  bool has_zero_point = false;

  const float* router_logits = nullptr;     // [T, E] FP32
  const uint16_t* x = nullptr;              // bf16 [T, H]
  const int32_t* w13 = nullptr;             // serving [E, H/16, 4I]   (n = 2I, k = H)
  const uint16_t* w13_scale = nullptr;      // bf16 [E, H/G, 2I]
  const int32_t* w13_zero_point = nullptr;  // asym: [E, H/G, 2I/8]
  const int32_t* w2 = nullptr;              // serving [E, I/16, 2H]   (n = H, k = I)
  const uint16_t* w2_scale = nullptr;       // bf16 [E, I/G, H]
  const int32_t* w2_zero_point = nullptr;   // asym: [E, I/G, H/8]
  uint16_t* out = nullptr;                  // bf16 [T, H]

  // Token capacity the workspace is laid out for (0 = tokens). A workspace sized for N tokens
  // serves every launch with tokens <= N that passes max_tokens = N (its regions, the GEMM tile
  // counters among them, then sit at the same offsets).
  int64_t max_tokens = 0;

  // Test and tuning hooks (0 = automatic): rows per GEMM m block (8, 16, 32, 48, 64; automatic
  // picks the smallest with tokens-per-expert / rows < 0.9), and a cap on the persistent GEMM grid.
  int32_t block_rows = 0;
  int32_t max_ctas = 0;
  // Decode path (test and tuning hook): 0 automatic (the GEMV path below when tokens * top_k <=
  // k_moe_gemv_auto_ids, block_rows is 0 and H, I <= k_moe_gemv_max_dim), 1 always the GEMV path
  // (needs tokens * top_k <= k_moe_gemv_max_ids and the same H, I), -1 never.
  int32_t gemv = 0;

  // Batch invariance: a token's output bits do not depend on the other tokens of the launch
  // (their number, order or routing). The tiled path alone (no GEMV path), 8-row m blocks at
  // every T, and GEMM tiles never split along k (w4a16 whole tiles), so each output element is
  // summed in one order wherever its row lands. Slower at large T (weights are read once per 8
  // rows of an expert); refused with a block_rows other than 0 or 8, or gemv = 1.
  bool batch_invariant = false;
};

// Small-T decode path: with few (token, slot) pairs the tiled GEMMs run 1.5-3 units per CTA and
// pay pipeline fill and split-K ends for only a few experts' bytes. The GEMV path instead runs,
// after the top-k: one CTA per (pair, 64-column tile) of w13 (warps split k, gate | up in FP32),
// one per (pair, 64-column tile) of w2 (h = bf16(silu(bf16 g) * bf16 u) staged in shared memory,
// FP32 rows of y), and the combine. Each lane reads 16 B of a serving tile, sums x * code per
// group in FP32 and applies the scale and zero point once per group:
// sum_k x (q - z) s = s (sum_k x q - z sum_k x), so its products are not bf16-rounded like the
// tiled path's; the tests bound the difference with the same relative error.
// Automatic up to T = 1 at top-8: the GEMV path is the faster there, the tiled one already at
// T = 4 (both timed in docs/performance.md, 'Fused MoE at decode sizes').
constexpr int64_t k_moe_gemv_auto_ids = 8;
constexpr int64_t k_moe_gemv_max_ids = 64;
constexpr int64_t k_moe_gemv_max_dim = 8192; // H and I: x and h are staged in shared memory (FP32)

// Whether fused_moe_launch takes the GEMV path for `args` (the rule of fused_moe_args::gemv).
inline bool fused_moe_takes_gemv_path(const fused_moe_args& a) {
  if (a.batch_invariant)
    return false;
  return a.gemv == 1 || (a.gemv == 0 && a.block_rows == 0 && a.tokens * a.top_k <= k_moe_gemv_auto_ids &&
                         a.hidden <= k_moe_gemv_max_dim && a.intermediate <= k_moe_gemv_max_dim);
}

kernel_status fused_moe_can_implement(const fused_moe_args& args);
// CPU reference (host pointers): moe_topk_ref, then per expert gemm_w4a16_ref (w13), SiLU-mul,
// gemm_w4a16_ref_f32 (w2), weighted sum in slot order.
kernel_status fused_moe_ref(const fused_moe_args& args);

// Workspace for T up to the capacity (max_tokens, else tokens) on the current device (routing
// buffers, h, y, GEMM partials and tile counters). Zero it once with fused_moe_workspace_init; launches leave it
// reusable (same rules as gemm_w4a16: one launch at a time per workspace).
std::size_t fused_moe_workspace_bytes(const fused_moe_args& args);
kernel_status fused_moe_workspace_init(const fused_moe_args& args, void* workspace, cudaStream_t stream);
kernel_status fused_moe_launch(const fused_moe_args& args, void* workspace, cudaStream_t stream);

// Where the intermediate results of the last launch sit inside the workspace (for tests and
// debugging): topk ids / weights [T, k], sorted ids, block experts, num_padded [1].
struct fused_moe_workspace_view {
  int32_t* topk_ids = nullptr;
  float* topk_weights = nullptr;
  int32_t* sorted_ids = nullptr;
  int32_t* block_expert = nullptr;
  int32_t* num_padded = nullptr;
  uint16_t* h = nullptr; // bf16 [T*k, I]
  float* y = nullptr;    // [T*k, H]
  int32_t block = 0;     // rows per m block used by the launch
};
fused_moe_workspace_view fused_moe_workspace_parts(const fused_moe_args& args, void* workspace);

} // namespace rlserve::kernels
