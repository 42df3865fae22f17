// Checks of greedy outputs against the model library run directly, for tests where a request's
// tokens may span a weight update (tests/actors/pause_modes_sim_test.cpp,
// tests/actors/seeded_orderings_sim_test.cpp). A result's weight_version_spans say where each
// version's tokens begin; these say whether the tokens are what those weights produce.
#pragma once

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "messages/control.hpp"
#include "messages/generate.hpp"
#include "model/qwen3.hpp"

namespace rlserve::test {

inline int32_t argmax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// Greedy decoding picks the argmax; a tie within rounding would be the only excuse.
inline bool is_greedy_choice(std::span<const float> row, int32_t token) {
  auto best = argmax(row);
  return best == token || row[best] - row[token] < 1e-5f;
}

// Outputs [from, to) of `out` are the greedy choices of `m` run on prompt + outputs from scratch.
inline bool follows_from_scratch(const model::qwen3_model& m, const GenerateReqInput& in,
                                 const GenerateReqOutput& out, std::size_t from, std::size_t to) {
  if (from >= to)
    return true;
  auto seq = *in.input_ids;
  seq.insert(seq.end(), out.output_ids.begin(),
             out.output_ids.begin() + static_cast<std::ptrdiff_t>(to - 1));
  auto all = m.forward_all(seq);
  BOOST_REQUIRE(all.has_value());
  auto V = static_cast<std::size_t>(m.config().vocab_size);
  for (std::size_t i = from; i < to; ++i) {
    std::span<const float> row(all->data() + (in.input_ids->size() - 1 + i) * V, V);
    if (!is_greedy_choice(row, out.output_ids[i]))
      return false;
  }
  return true;
}

// Outputs [from, n) follow `fresh` run on top of KV that `old` computed for every position
// before output from - 1 (what pausing in place and updating does).
inline bool follows_on_old_kv(const model::qwen3_model& old, const model::qwen3_model& fresh,
                              const GenerateReqInput& in, const GenerateReqOutput& out,
                              std::size_t from) {
  auto cache = old.make_cache();
  std::vector<float> logits;
  auto prefix = *in.input_ids;
  prefix.insert(prefix.end(), out.output_ids.begin(),
                out.output_ids.begin() + static_cast<std::ptrdiff_t>(from - 1));
  BOOST_REQUIRE(old.forward(cache, prefix, logits).has_value());
  for (std::size_t i = from; i < out.output_ids.size(); ++i) {
    std::vector<int32_t> step{out.output_ids[i - 1]};
    BOOST_REQUIRE(fresh.forward(cache, step, logits).has_value());
    if (!is_greedy_choice(logits, out.output_ids[i]))
      return false;
  }
  return true;
}

// Where the tokens of weight version `version` begin in `out` (its span), or the token count
// when no token came from that version.
inline std::size_t first_token_of_version(const GenerateReqOutput& out, const std::string& version) {
  std::size_t first = out.output_ids.size();
  for (const auto& span : out.weight_version_spans)
    if (span.weight_version == version)
      first = static_cast<std::size_t>(span.first_token);
  return first;
}

// Around one update paused in `mode`: tokens [0, split) are the old weights' greedy choices,
// tokens [split, n) the new weights', on top of the old weights' KV when paused in place (and
// the request had begun), else from scratch (retract recomputes; later requests start anew).
inline void check_tokens_follow_their_weights(const model::qwen3_model& old_model,
                                              const model::qwen3_model& new_model, pause_mode mode,
                                              const GenerateReqInput& in,
                                              const GenerateReqOutput& out, std::size_t split) {
  const auto n = out.output_ids.size();
  BOOST_TEST(follows_from_scratch(old_model, in, out, 0, split));
  if (split < n) {
    if (mode == pause_mode::in_place && split > 0)
      BOOST_TEST(follows_on_old_kv(old_model, new_model, in, out, split));
    else
      BOOST_TEST(follows_from_scratch(new_model, in, out, split, n));
  }
}

} // namespace rlserve::test
