// The device half of speculative verification (model/speculative.hpp's verify_draft on the GPU):
// the filtered distributions of draft and target, and the acceptance / correction / bonus step
// over them, so that neither distribution leaves the device. Under the conventions at the top of
// kernels/decoder_ops.hpp (args struct, *_ref / *_launch, graph-capturable launches, padding rows).
// CPU references: kernels/cpu/spec_verify.cpp; CUDA twins: kernels/cuda/spec_verify.cu.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kernel_status.hpp"

using cudaStream_t = struct CUstream_st*;

namespace rlserve::kernels {

// ---- filtered_probs ------------------------------------------------------------------------------
// Row r: probs[r, :] = model::sampler::distribution(logits[r, :], {temperature[r], top_k[r],
// top_p[r], min_p[r]}): softmax(logits / T) (NaN = -inf) after top-k, top-p and min-p (the cuts
// of kernels/sampler.hpp, the same kept set the sampler draws from), renormalized, zero elsewhere.
//   temperature < 1e-6: greedy, one-hot at the argmax of the logits (ties -> lowest id);
//   no finite scaled logit (all -inf, or a +inf): one-hot at id 0 (as the CPU);
//   temperature < 0: padding, a row of zeros.
// The twin computes exactly what model::sampler::distribution does (double softmax, float
// probabilities, double kept mass). The CUDA kernel computes p = expf(z - lse) in fp32 as the GPU
// sampler does and the kept mass in fixed point, so its entries differ from the twin's by a few
// fp32 ulps (relative), and the kept set only where a cut falls within that of a boundary.
struct filtered_probs_args {
  const float* logits = nullptr;      // fp32 [rows, vocab]
  const float* temperature = nullptr; // [rows]
  const int32_t* top_k = nullptr;     // [rows] (<= 0: off)
  const float* top_p = nullptr;       // [rows] (>= 1: off)
  const float* min_p = nullptr;       // [rows] (<= 0: off)
  float* probs = nullptr;             // fp32 [rows, vocab] out
  int64_t rows = 0, vocab = 0;        // 0 < vocab < 2^31
  // Instead of probs: row r goes to row_out[r] (an array of `rows` row pointers; on the device
  // for the CUDA twin), so rows land where their consumer keeps them (a speculating sequence's
  // draft distributions, model/gpu_draft_distributions.hpp) without a copy.
  float* const* row_out = nullptr;
};
kernel_status filtered_probs_can_implement(const filtered_probs_args& a);
kernel_status filtered_probs_ref(const filtered_probs_args& a);
kernel_status filtered_probs_launch(const filtered_probs_args& a, cudaStream_t stream);

// ---- spec_verify ---------------------------------------------------------------------------------
// S sequences, sequence s with k_s = draft_offset[s + 1] - draft_offset[s] proposals
// (0 <= k_s <= max_draft <= k_spec_verify_max_draft). Its rows, flat over all sequences:
//   proposals, draft rows q:   draft_offset[s] + i,      i < k_s
//   target rows p and logits,  row_s + j with row_s = draft_offset[s] + s,  j <= k_s
//   uniforms and outputs:      the same rows as the target (k_s + 1 per sequence)
// Greedy (temperature[s] < 1e-6): keep d_i while it is the argmax of p_i (first maximum), the
// first mismatch is replaced by that argmax, and if all k_s match the argmax of p_{k_s} is added.
// Sampling: keep d_i iff u_i * q_i(d_i) < p_i(d_i) (u_i < p_i(d_i) when q_i(d_i) = 0, or d_i is out
// of the vocabulary: p and q count as 0 there); at the first rejection draw from
// residual = max(0, p_i - q_i) (elementwise in fp32), or from p_i when the residual's mass is 0;
// if all k_s are kept draw the bonus from p_{k_s}. Both draws use u_final.
//
// The uniforms (the draw-order contract; model::verify_draft follows it): for a sampled sequence
// the runner draws k_s + 1 uniforms from the request's own sampler (model::sampler::uniform) in
// this order and always consumes all of them, whatever is accepted:
//   uniform[row_s + i], i < k_s:   acceptance of proposal i
//   uniform[row_s + k_s]:          the final draw (correction or bonus)
// A greedy sequence draws none (its uniform rows are not read).
//
// A draw from a row v (all entries finite, >= 0, summing to at most 15: probability rows do) is
// the CPU sampler's draw rule (model::sampler::draw: the id-order walk, the first id whose running
// mass exceeds u * total mass) with masses in fixed point, floor(v * 2^60) in uint64 (exact and
// order-free, so twin and kernel agree bit for bit; model::sampler::draw sums in double, which
// can pick the neighbouring id only when u * total falls within ~1e-16 of a running mass). An
// entry below 2^-60 weighs nothing; nothing of positive weight draws -1.
//
// Outputs, row by row: token[row_s + j] = d_j for j < accepted[s], the corrected or bonus token
// at j = accepted[s], -1 after it; logprob = log_softmax(target_logits[row] / T)[token] (T = 1 when
// greedy; model::token_logprob: -inf for -1 and when no scaled logit is finite), -inf after it.
// Padding sequences (temperature < 0): accepted -1, every row token -1 and logprob -inf. The
// twin refuses a layout it can read as invalid_problem; the CUDA kernel, which reads the offsets
// on the device, writes accepted -1 (and nothing else) for a sequence whose offsets are out of
// range or k_s > max_draft.
//
// The twin uses the same rule step for step as the CUDA kernel: the same tokens and accepted
// counts from the same p, q and uniforms (bit-exact); its logprobs are model::token_logprob's
// (double sums), the kernel's those of the GPU sampler (fp32 exp, double across threads).
constexpr int64_t k_spec_verify_max_draft = 8;
struct spec_verify_args {
  const float* target_probs = nullptr;   // fp32 [drafts + sequences, vocab]: p rows
  const float* draft_probs = nullptr;    // fp32 [drafts, vocab]: q rows (read for sampled sequences)
  const float* target_logits = nullptr;  // fp32 [drafts + sequences, vocab]: for the logprobs
  const float* temperature = nullptr;    // [sequences]
  const int32_t* draft_offset = nullptr; // [sequences + 1], draft_offset[0] = 0, non-decreasing
  const int32_t* draft_tokens = nullptr; // [drafts]
  const float* uniform = nullptr;        // [drafts + sequences] in [0, 1)
  int32_t* accepted = nullptr;           // [sequences] out
  int32_t* token = nullptr;              // [drafts + sequences] out
  float* logprob = nullptr;              // [drafts + sequences] out
  int64_t sequences = 0, drafts = 0, vocab = 0;
  int64_t max_draft = k_spec_verify_max_draft; // the largest k_s (sizes the logprob grid)
  // Row pointers instead of the contiguous arrays (each optional; arrays of row pointers, on the
  // device for the CUDA twin): p row r is target_rows[r] ([drafts + sequences]), q row i is
  // draft_rows[i] ([drafts]). A GPU runner verifies against draft distributions kept per
  // sequence (model/gpu_draft_distributions.hpp) this way, and a draft draws its proposals from
  // rows filtered_probs wrote there.
  const float* const* target_rows = nullptr;
  const float* const* draft_rows = nullptr;
};
kernel_status spec_verify_can_implement(const spec_verify_args& a);
kernel_status spec_verify_ref(const spec_verify_args& a);
kernel_status spec_verify_launch(const spec_verify_args& a, cudaStream_t stream);

} // namespace rlserve::kernels
