#include "messages/generate.hpp"

#include <random>
#include <utility>

#include <fmt/format.h>

namespace rlserve {

std::string random_rid() {
  // One engine per thread: actors on CAF's workers and the I/O threads draw without a lock.
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{:016x}{:016x}", rng(), rng());
}

const std::string& assign_rid(GenerateReqInput& req) {
  if (!req.rid)
    req.rid = random_rid();
  return *req.rid;
}

bool returns_top_p_token_ids(const SamplingParams& p) {
  return p.return_top_p_token_ids &&
         (!(p.temperature >= 1e-6f) || p.top_k >= 1 || p.top_p < 1.0f || p.min_p > 0.0f);
}

std::string rid_in_flight_message(const std::string& rid) {
  return "rid: a request with rid \"" + rid + "\" is already in flight";
}

void append_chunk(GenerateReqOutput& so_far, GenerateReqOutput chunk) {
  // Moves only: with nothing so far (a request's first or only chunk) the chunk's lists and
  // text are kept as they are.
  auto join = [](auto& head, auto& tail) {
    if (head.empty())
      return;
    head.insert(head.end(), std::make_move_iterator(tail.begin()), std::make_move_iterator(tail.end()));
    tail = std::move(head);
  };
  join(so_far.text, chunk.text);
  join(so_far.output_ids, chunk.output_ids);
  join(so_far.output_token_logprobs, chunk.output_token_logprobs);
  join(so_far.output_top_logprobs, chunk.output_top_logprobs);
  join(so_far.output_token_texts, chunk.output_token_texts);
  join(so_far.top_p_token_ids, chunk.top_p_token_ids);
  if (so_far.top_p_token_counts && chunk.top_p_token_counts)
    join(*so_far.top_p_token_counts, *chunk.top_p_token_counts);
  else if (!chunk.top_p_token_counts)
    chunk.top_p_token_counts = std::move(so_far.top_p_token_counts);
  if (chunk.input_token_ids.empty()) { // prompt logprobs come once, in one chunk
    chunk.input_token_ids = std::move(so_far.input_token_ids);
    chunk.input_token_logprobs = std::move(so_far.input_token_logprobs);
    chunk.input_top_logprobs = std::move(so_far.input_top_logprobs);
    chunk.input_token_texts = std::move(so_far.input_token_texts);
  }
  if (!chunk.routed_experts) { // with the last chunk only
    chunk.routed_experts = std::move(so_far.routed_experts);
    chunk.routed_experts_start_len = so_far.routed_experts_start_len;
  }
  if (chunk.weight_version_spans.empty()) // they travel when they change
    chunk.weight_version_spans = std::move(so_far.weight_version_spans);
  so_far = std::move(chunk);
}

void drop_output(GenerateReqOutput& chunk) {
  chunk.text.clear();
  chunk.output_ids.clear();
  chunk.output_token_logprobs.clear();
  chunk.output_top_logprobs.clear();
  chunk.output_token_texts.clear();
  chunk.input_token_ids.clear();
  chunk.input_token_logprobs.clear();
  chunk.input_top_logprobs.clear();
  chunk.input_token_texts.clear();
  chunk.routed_experts.reset();
  chunk.top_p_token_ids.clear();
  chunk.top_p_token_counts.reset();
}

} // namespace rlserve
