// sampler: per-request seeded sampling of the next token, with the logprob RL needs.
//
//   temperature < 1e-6   greedy: argmax of the logits (ties -> lowest id).
//   otherwise            p = softmax(logits / T); then top-k (keep the k most probable), top-p
//                        (keep the smallest most-probable-first set whose cumulative probability
//                        reaches top_p; at least one token), min-p (drop tokens with
//                        p < min_p * p_max); the survivors are renormalized and one is drawn with
//                        the request's own generator.
//
// The reported logprob is log_softmax(logits / T)[token], computed BEFORE top-k / top-p / min-p
// filtering (SGLang's default: the policy's probability of the token, which is what the trainer
// recomputes); for greedy it is log_softmax(logits)[token].
//
// Top-p replay (slime's --rollout-top-p; the caller passes `kept` when the request returns kept
// sets, messages/generate.hpp returns_top_p_token_ids): sample() also writes the KEPT SET its
// token was drawn from, the survivors of top-k / top-p / min-p above, in the order the draw walks
// them (most probable first, ties to the lower id, when top-k or top-p is on; by id otherwise;
// greedy: the token alone), so the token is always in it. The logprob is then the one over that
// set: log_softmax of logits / T restricted to the kept ids, at the token (greedy: 0), which is
// what slime's loss recomputes over the same set (its patched SGLang renormalizes the same way).
//
// The generator is xoshiro256** seeded through splitmix64, and uniforms are 24-bit floats: the
// same seed gives the same tokens on every platform and compiler (std:: distributions do not).
// Ties in the top-k / top-p ordering are broken by the lower id, so filtering is deterministic too.
//
// Penalties (SGLang's, over the tokens the request has GENERATED so far, not its prompt) change
// the logits before all of the above, and the reported logprob is taken from the changed logits
// (the distribution the token was drawn from), in SGLang's order:
//   frequency       logit -= frequency_penalty * count(token)
//   presence        logit -= presence_penalty * (count(token) > 0)
//   repetition      then, for tokens with count > 0: logit / r when logit > 0, logit * r otherwise
//   min_new_tokens  until that many tokens are generated, the stop ids (EOS and stop_token_ids)
//                   are -inf, so the request cannot stop early
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace rlserve::model {

struct sampling_config {
  float temperature = 1.0f;
  int32_t top_k = -1;  // <= 0: off
  float top_p = 1.0f;  // >= 1: off
  float min_p = 0.0f;  // <= 0: off
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  int32_t min_new_tokens = 0;
  std::vector<int32_t> stop_ids{}; // masked while fewer than min_new_tokens are generated
  // Whether sampling depends on the tokens generated so far (see generation_history).
  bool uses_history() const {
    return frequency_penalty != 0.0f || presence_penalty != 0.0f || repetition_penalty != 1.0f ||
           (min_new_tokens > 0 && !stop_ids.empty());
  }
};

// What penalties read: the tokens a request has generated so far, counted.
struct generation_history {
  std::unordered_map<int32_t, int32_t> counts;
  int32_t generated = 0;
  void add(int32_t token) {
    ++counts[token];
    ++generated;
  }
};

// Applies cfg's penalties and the min_new_tokens mask to `logits` in place; a no-op when
// !cfg.uses_history(). Ids outside the span are ignored.
void apply_penalties(std::span<float> logits, const generation_history& history,
                     const sampling_config& cfg);

struct sampled_token {
  int32_t token;
  float logprob;
};

// xoshiro256** (Blackman & Vigna), state from splitmix64(seed). Small, fast, and the same
// sequence everywhere.
class rng {
public:
  explicit rng(uint64_t seed);
  uint64_t next();
  // Uniform in [0, 1) with 24 random bits: exactly representable floats, no rounding surprises.
  float uniform();

private:
  std::array<uint64_t, 4> s_;
};

class sampler {
public:
  explicit sampler(uint64_t seed);
  // `logits` has one entry per vocabulary id (NaN counts as -inf). An empty span returns
  // {-1, -inf}. Draws exactly one uniform per non-greedy call, so a request's token stream
  // depends only on its seed and its logits.
  // With `kept`: the kept set and the logprob over it (top-p replay, above).
  sampled_token sample(std::span<const float> logits, const sampling_config& cfg,
                       std::vector<int32_t>* kept = nullptr);

  // For speculative decoding, which needs the distributions themselves. `distribution` writes
  // the distribution sample() draws from: softmax(logits / T) after top-k / top-p / min-p,
  // renormalized, zero elsewhere (greedy: 1 at the argmax). It draws nothing.
  void distribution(std::span<const float> logits, const sampling_config& cfg,
                    std::vector<float>& probs);
  // Draws one id from `probs` (need not sum to 1; non-positive entries are never drawn) with one
  // uniform, walking ids in order. -1 when nothing is positive.
  int32_t draw(std::span<const float> probs);
  // The same draw with a uniform already taken from the generator (speculative verification
  // takes all of its uniforms up front: model/speculative.hpp).
  static int32_t draw(std::span<const float> probs, float uniform);
  float uniform() { return rng_.uniform(); }
  // The uniform the next draw will use, without using it, and the step that uses it: a GPU
  // runner samples on the device with the request's own uniform and advances the generator only
  // when the step ran, so the stream of draws is the one sample() would make.
  float peek_uniform() const {
    rng copy = rng_;
    return copy.uniform();
  }
  void consume_uniform() { rng_.uniform(); }

private:
  rng rng_;
  std::vector<float> probs_;     // [vocab] scratch, reused across calls
  std::vector<int32_t> order_;   // [vocab] candidate ids
};

// log_softmax(logits / T)[token], the logprob sample() reports (T = 1 for greedy).
float token_logprob(std::span<const float> logits, float temperature, int32_t token);

// The `n` most likely tokens of log_softmax(logits / T) (T = 1 for greedy), most likely first,
// ties to the lower id, NaN logits as -inf: each logprob is the bits token_logprob gives its token.
struct token_and_logprob {
  int32_t token = 0;
  float logprob = 0.0f;
};
std::vector<token_and_logprob> top_logprobs(std::span<const float> logits, float temperature, int32_t n);

} // namespace rlserve::model
