#include "messages/validate.hpp"

#include <cmath>
#include <string>

#include <fmt/format.h>

namespace rlserve {

status validate(const SamplingParams& p, const std::string& prefix) {
  auto bad = [&](const char* field, auto value, const char* rule) {
    return fail(fmt::format("{}{}: {} is out of range ({})", prefix, field, value, rule));
  };
  if (p.max_new_tokens < 0)
    return bad("max_new_tokens", p.max_new_tokens, "must be >= 0");
  if (!(p.temperature >= 0.0f) || std::isinf(p.temperature))
    return bad("temperature", p.temperature, "must be a finite number >= 0");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
    return bad("top_p", p.top_p, "must be in (0, 1]");
  if (p.top_k == 0 || p.top_k < -1)
    return bad("top_k", p.top_k, "must be -1 (whole vocabulary) or >= 1");
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f))
    return bad("min_p", p.min_p, "must be in [0, 1]");
  if (p.n < 1)
    return bad("n", p.n, "must be >= 1");
  if (p.min_new_tokens < 0 || p.min_new_tokens > p.max_new_tokens)
    return bad("min_new_tokens", p.min_new_tokens, "must be in [0, max_new_tokens]");
  if (!(p.repetition_penalty > 0.0f && p.repetition_penalty <= 2.0f))
    return bad("repetition_penalty", p.repetition_penalty, "must be in (0, 2]");
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f))
    return bad("frequency_penalty", p.frequency_penalty, "must be in [-2, 2]");
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f))
    return bad("presence_penalty", p.presence_penalty, "must be in [-2, 2]");
  if (p.stream_interval && *p.stream_interval < 1)
    return bad("stream_interval", *p.stream_interval, "must be >= 1");
  for (std::size_t i = 0; i < p.stop_token_ids.size(); ++i)
    if (p.stop_token_ids[i] < 0)
      return fail(fmt::format("{}stop_token_ids[{}]: {} is negative", prefix, i, p.stop_token_ids[i]));
  return {};
}

status validate(const GenerateReqInput& req) {
  if (req.text && req.input_ids)
    return fail("text and input_ids are both set; send exactly one");
  if (!req.text && !req.input_ids)
    return fail("neither text nor input_ids is set; send exactly one");
  if (req.input_ids && req.input_ids->empty())
    return fail("input_ids: empty (a prompt needs at least one token)");
  if (req.input_ids)
    for (std::size_t i = 0; i < req.input_ids->size(); ++i)
      if ((*req.input_ids)[i] < 0)
        return fail(fmt::format("input_ids[{}]: {} is negative", i, (*req.input_ids)[i]));
  if (req.top_logprobs_num < 0)
    return fail(fmt::format("top_logprobs_num: {} is out of range (must be >= 0)", req.top_logprobs_num));
  if (req.logprob_start_len < -1)
    return fail(fmt::format("logprob_start_len: {} is out of range (must be >= -1)", req.logprob_start_len));
  if (req.rid && req.rid->empty())
    return fail("rid: empty (omit it to have one generated)");
  return validate(req.sampling_params);
}

std::chrono::nanoseconds client_wait(double seconds) {
  if (!(seconds > 0.0)) // NaN included
    return std::chrono::nanoseconds{0};
  if (seconds > k_max_client_wait_s)
    seconds = k_max_client_wait_s;
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(seconds));
}

} // namespace rlserve
