#include "model/speculative.hpp"

#include <algorithm>

namespace rlserve::model {

bool is_greedy(const sampling_config& cfg) { return !(cfg.temperature >= 1e-6f); }

verify_result verify_draft(sampler& target_sampler, const sampling_config& cfg,
                           std::span<const float> target_logits, int64_t vocab,
                           std::span<const int32_t> draft_tokens,
                           std::span<const float> draft_probs) {
  verify_result out;
  const auto k = static_cast<int64_t>(draft_tokens.size());
  const auto V = static_cast<std::size_t>(vocab);
  const bool greedy = is_greedy(cfg);
  auto row = [&](int64_t i) { return target_logits.subspan(static_cast<std::size_t>(i) * V, V); };
  auto emit = [&](int64_t i, int32_t token) {
    out.tokens.push_back(token);
    out.logprobs.push_back(token_logprob(row(i), cfg.temperature, token));
  };
  // The draw order the GPU runner shares (kernels/spec_verify.hpp): a sampled verification takes
  // k + 1 uniforms up front, u[i] decides proposal i and u[k] makes the final draw (correction or
  // bonus), and all k + 1 are used up whatever is accepted; greedy takes none. So the generator
  // advances by a count the runner knows before the device has decided anything.
  std::vector<float> u;
  if (!greedy)
    for (int64_t i = 0; i <= k; ++i)
      u.push_back(target_sampler.uniform());
  std::vector<float> p;
  for (int64_t i = 0; i < k; ++i) {
    const int32_t d = draft_tokens[static_cast<std::size_t>(i)];
    target_sampler.distribution(row(i), cfg, p);
    if (greedy) {
      auto best = static_cast<int32_t>(std::max_element(p.begin(), p.end()) - p.begin());
      if (best != d) {
        emit(i, best);
        return out;
      }
      emit(i, d);
      ++out.accepted;
      continue;
    }
    auto q = draft_probs.subspan(static_cast<std::size_t>(i) * V, V);
    const float pd = d >= 0 && static_cast<std::size_t>(d) < V ? p[d] : 0.0f;
    const float qd = d >= 0 && static_cast<std::size_t>(d) < V ? q[d] : 0.0f;
    // Accept with min(1, p/q). The draft drew d from q, so qd > 0 unless q was not its
    // distribution; then p alone decides (accept iff p > 0 with probability p).
    const float ui = u[static_cast<std::size_t>(i)];
    const bool keep = qd > 0.0f ? double(ui) * qd < pd : double(ui) < pd;
    if (keep) {
      emit(i, d);
      ++out.accepted;
      continue;
    }
    std::vector<float> residual(V);
    double mass = 0.0;
    for (std::size_t j = 0; j < V; ++j) {
      residual[j] = std::max(0.0f, p[j] - q[j]);
      mass += residual[j];
    }
    const float last = u[static_cast<std::size_t>(k)];
    int32_t token = mass > 0.0 ? sampler::draw(residual, last) : sampler::draw(p, last);
    emit(i, token);
    return out;
  }
  target_sampler.distribution(row(k), cfg, p);
  if (greedy)
    emit(k, static_cast<int32_t>(std::max_element(p.begin(), p.end()) - p.begin()));
  else
    emit(k, sampler::draw(p, u[static_cast<std::size_t>(k)]));
  return out;
}

} // namespace rlserve::model
