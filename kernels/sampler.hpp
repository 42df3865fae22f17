// The GPU sampler (model::sampler::sample's rule on the device): one of the GPU decoder forward's
// ops, under the conventions at the top of kernels/decoder_ops.hpp (args struct, *_ref / *_launch,
// graph-capturable launches, padding rows, numerics). CPU reference: kernels/cpu/sampler.cpp; CUDA
// twin: kernels/cuda/sampler.cu.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kernel_status.hpp"

using cudaStream_t = struct CUstream_st*;

namespace rlserve::kernels {

// ---- sampler -------------------------------------------------------------------------------------
// Row r, exactly the rule of model::sampler::sample (model/sampler.hpp):
//   temperature[r] < 1e-6: greedy, argmax of logits (NaN = -inf, ties -> lowest id), logprob =
//     log_softmax(logits)[token];
//   else p = softmax(logits / T); keep top-k (k most probable, ties -> lower id), then top-p (the
//     smallest most-probable-first prefix whose mass reaches top_p, at least one token), then
//     min-p (p >= min_p * p_max; if none, the most probable); walk the kept tokens in the CPU
//     sampler's order (most probable first when top-k or top-p is on, id order otherwise) and
//     return the first whose running mass exceeds uniform[r] * (kept mass); logprob =
//     log_softmax(logits / T)[token] (before filtering).
// The uniform is drawn by the host sampler of the request (one per non-greedy row), so the GPU
// and the CPU pick the same token from the same logits up to fp32-vs-double summation at the
// boundary. The logprob is computed as the host computes it (double exp and sum; only the order
// of the sum differs), so it has the host's bits but for a ~1e-9 chance per row of one ulp.
// Rows with temperature < 0 are padding: token -1.
//
// Top-p replay (slime; model/sampler.hpp): a row with want_kept[r] != 0 also lists its kept set,
// the ids the draw walked (most probable first when top-k or top-p is on; greedy: the token;
// no finite logit: id 0), in kept_ids[r * kept_cap ...] with kept_count[r] its size and -1 in
// the slots after it, and its logprob is the one over that set (log_softmax of logits / T
// restricted to it; greedy: 0). Bounded layout: the vocabulary is ~152k and a set at top_p near
// 1 can hold most of it, so each row has kept_cap slots (at most k_kept_cap_max, the candidates
// the device sorts in shared memory). kept_count[r] = -1 with every slot -1 says the set is not
// listed: larger than kept_cap, or (the device only) a row whose candidates did not fit the
// shared-memory sort, or one walked in id order (min-p without top-k / top-p); its token and
// the unfiltered logprob stand, and the caller samples that row on the host instead. The CPU
// twin lists every set that fits. Rows with want_kept[r] == 0, and padding rows, write count 0
// and -1 slots.
inline constexpr int32_t k_kept_cap_max = 8192;
struct sample_args {
  const float* logits = nullptr;      // fp32 [rows, vocab]
  const float* temperature = nullptr; // [rows]
  const int32_t* top_k = nullptr;     // [rows] (<= 0: off)
  const float* top_p = nullptr;       // [rows] (>= 1: off)
  const float* min_p = nullptr;       // [rows] (<= 0: off)
  const float* uniform = nullptr;     // [rows] in [0, 1)
  int32_t* token = nullptr;           // [rows] out
  float* logprob = nullptr;           // [rows] out
  int64_t rows = 0, vocab = 0;
  // Top-p replay (optional: want_kept null lists nothing and writes neither array).
  const int32_t* want_kept = nullptr; // [rows]
  int32_t* kept_ids = nullptr;        // [rows, kept_cap] out
  int32_t* kept_count = nullptr;      // [rows] out
  int32_t kept_cap = 0;               // 1 .. k_kept_cap_max
};
kernel_status sample_can_implement(const sample_args& a);
kernel_status sample_ref(const sample_args& a);
std::size_t sample_workspace_bytes(const sample_args& a);
kernel_status sample_launch(const sample_args& a, void* workspace, cudaStream_t stream);

} // namespace rlserve::kernels
