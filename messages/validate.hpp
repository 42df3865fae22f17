// Semantic checks of requests, shared by every way in (the JSON codec after it has checked
// types, and the in-process C++ API, which has no JSON). Each failure names the field and the
// offending value.
#pragma once

#include <chrono>

#include "messages/expected.hpp"
#include "messages/generate.hpp"

namespace rlserve {

// Ranges of SamplingParams (SGLang's verify()): max_new_tokens >= 0, temperature >= 0,
// top_p in (0, 1], top_k == -1 or >= 1, min_p in [0, 1], n >= 1, min_new_tokens in
// [0, max_new_tokens], repetition_penalty > 0, frequency/presence_penalty in [-2, 2].
// Field paths are prefixed with `prefix` ("sampling_params.").
status validate(const SamplingParams& p, const std::string& prefix = "sampling_params.");

// Exactly one of text / input_ids, a non-empty input_ids, logprob fields in range, and
// validate(sampling_params).
status validate(const GenerateReqInput& req);

// A wait a client asked for (flush_cache's timeout_s, ...) as a duration the engine can add to
// a clock: negative and NaN become 0, anything above k_max_client_wait_s (and infinity) becomes
// k_max_client_wait_s. Converting 1e300 s to nanoseconds unclamped is undefined behaviour and
// in practice a negative deadline.
inline constexpr double k_max_client_wait_s = 86400.0;
std::chrono::nanoseconds client_wait(double seconds);

} // namespace rlserve
