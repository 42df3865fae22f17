// SGLang's batch and parallel-sampling forms of /generate, expanded into single requests.
//
// A /generate body may hold a list of prompts (`text` a list, or `input_ids` a list of lists)
// and ask for `sampling_params.n` samples of each. SGLang fans such a body out into one request
// per prompt and sample and answers with a list of results, prompt-major (the samples of
// prompt 0, then of prompt 1, ...). This does the same on the JSON, before decoding, so every
// expanded request is read by the one GenerateReqInput reader:
//   - per-prompt fields may be lists of the batch's length (rid, sampling_params,
//     return_logprob, logprob_start_len, top_logprobs_num, return_text_in_logprobs); with n > 1
//     only rid and sampling_params may (as SGLang);
//   - rids: a string rid becomes "{rid}_{j}" for result j; a list gives prompt b its rid_b, or
//     "{rid_b}_{s}" for sample s when n > 1; none: the engine picks each;
//   - seeds: with n > 1 and a sampling_seed, sample s uses sampling_seed + s (SGLang would give
//     every sample the same seed, and so the same tokens), so each sample can be reproduced as a
//     single request with the seed its result reports.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "messages/expected.hpp"

namespace rlserve {

// Most results one /generate body may fan out into.
inline constexpr std::size_t k_max_fanout = 4096;

struct generate_fanout {
  bool single = true;                   // one prompt, n == 1: answered with one object
  std::vector<nlohmann::json> requests; // single requests, in result order
};

// `body` must be a JSON object. A single request comes back unchanged (single = true).
expected<generate_fanout> expand_generate_request(const nlohmann::json& body);

// How a fanned-out request is named and seeded, in one place for the two fan-outs (the JSON one
// above and OpenAI's n > 1 choices in net/openai_call_actor.cpp), so that a sample reported by
// either can be reproduced by a single /generate request:
//   - result k of a fan-out from `rid` has rid "{rid}_{k}" (SGLang's naming; for the samples of
//     one prompt, k is the sample);
//   - sample s of a request with a sampling seed is seeded seed + s (modulo 2^64).
std::string fanout_rid(std::string_view rid, std::size_t k);
uint64_t sample_seed(uint64_t seed, std::size_t s);

} // namespace rlserve
