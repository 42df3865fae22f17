// speculative: the target's side of speculative decoding — given the draft's k proposed tokens
// (and, when sampling, the draft distributions they were drawn from) and the target's logits at
// the k + 1 positions [last token, d1 .. dk], decide which proposals to keep and which token
// follows them.
//
//   greedy (temperature < 1e-6): keep d_i while it is the target's argmax; the first mismatch is
//     replaced by the argmax; if all k match, the argmax after dk is added (the "bonus"). The
//     output equals target-only greedy decoding token for token.
//   sampling: standard speculative rejection sampling (Leviathan et al. 2023; Chen et al. 2023):
//     p_i and q_i are the target's and the draft's distributions after temperature, top-k,
//     top-p and min-p (sampler::distribution). d_i is kept with probability
//     min(1, p_i(d_i) / q_i(d_i)); at the first rejection a token is drawn from
//     normalize(max(0, p_i - q_i)) (from p_i if that is all zero) and the rest is dropped; if all
//     k are kept, a bonus token is drawn from p_{k+1}. Every emitted token is then distributed
//     exactly as target-only sampling would draw it.
//
// Logprobs of emitted tokens are the target's log_softmax(logits / T) (as sampler::sample
// reports them), so a trainer sees the same numbers with and without speculation.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/sampler.hpp"

namespace rlserve::model {

struct verify_result {
  std::vector<int32_t> tokens;  // accepted proposals, then one corrected or bonus token
  std::vector<float> logprobs;  // target logprob of each
  int32_t accepted = 0;         // proposals kept (tokens.size() - 1)
};

// `target_logits`: [k + 1, vocab]; `draft_tokens`: k ids; `draft_probs`: [k, vocab] (ignored and
// may be empty when greedy). Uses the target request's own sampler (its seeded generator): when
// sampling, exactly k + 1 uniforms, taken up front (u[i] accepts or rejects proposal i, u[k] draws
// the correction or the bonus; the order kernels/spec_verify.hpp's GPU twin is given them in);
// none when greedy.
verify_result verify_draft(sampler& target_sampler, const sampling_config& cfg,
                           std::span<const float> target_logits, int64_t vocab,
                           std::span<const int32_t> draft_tokens,
                           std::span<const float> draft_probs);

// True when `cfg` samples greedily (temperature below the greedy threshold).
bool is_greedy(const sampling_config& cfg);

} // namespace rlserve::model
