// Generation messages: SGLang's GenerateReqInput / TokenizedGenerateReqInput / AbortReq and the
// output chunks, by SGLang's field names and defaults (docs/sglang-contract.md, 'Generation') so
// a user can map this
// contract onto SGLang's documentation one to one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "caf/meta/type_name.hpp"
#include "messages/std_optional_inspect.hpp"

namespace rlserve {

// SGLang `SamplingParams` (sampling/sampling_params.py) — defaults as there.
struct SamplingParams {
  int32_t max_new_tokens = 128;
  std::vector<std::string> stop;       // JSON: a string or a list of strings
  std::vector<int32_t> stop_token_ids;
  float temperature = 1.0f;            // < 1e-6 means greedy
  float top_p = 1.0f;
  int32_t top_k = -1;                  // -1: the whole vocabulary
  float min_p = 0.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  int32_t min_new_tokens = 0;
  int32_t n = 1;
  bool ignore_eos = false;
  bool skip_special_tokens = true;
  bool spaces_between_special_tokens = true;
  bool no_stop_trim = false;
  std::optional<uint64_t> sampling_seed; // none: the engine picks one and reports it
  // A streaming request gets a chunk every stream_interval output tokens (and its last one at the
  // end); none: the server's --stream-interval (SGLang's, default 1). Tokens, logprobs and text
  // are the same either way: a chunk carries everything since the previous one.
  std::optional<int32_t> stream_interval;
  // slime's top-p replay (JSON: custom_params.return_top_p_token_ids, as slime's patched SGLang
  // reads it): each output token's kept set goes to meta_info.top_p_token_ids /
  // top_p_token_offsets and its logprob is renormalized over that set (returns_top_p_token_ids).
  bool return_top_p_token_ids = false;
};

// Whether a request returns kept sets: it asked, and its sampling filters something (greedy,
// top_k >= 1, top_p < 1 or min_p > 0). Without a filter the kept set would be the whole
// vocabulary; slime's patched SGLang then returns no fields either, and the logprobs stay as
// they are. The scheduler, the runners and the JSON writer all read this one rule.
bool returns_top_p_token_ids(const SamplingParams& p);

// What a caller sends: text or token ids (exactly one), one request per message.
struct GenerateReqInput {
  std::optional<std::string> rid; // generated (uuid-like hex) when missing
  std::optional<std::string> text;
  std::optional<std::vector<int32_t>> input_ids;
  SamplingParams sampling_params;
  bool return_logprob = false;
  int32_t logprob_start_len = -1; // -1: logprobs of output tokens only
  int32_t top_logprobs_num = 0;
  bool return_text_in_logprobs = false; // each logprob entry carries its token's text
  // Routing replay: the router's top-k expert ids of every layer for every position the model
  // ran, from position routed_experts_start_len on (0 .. prompt length).
  bool return_routed_experts = false;
  int32_t routed_experts_start_len = 0;
  bool stream = false;
  // Not SGLang's, and never read from or written to JSON: set by the server's call actors on a
  // request they stream and whose output they keep themselves (SGLang's cumulative streams fold
  // the chunks; OpenAI streams need only each delta). The output is then held once: the front
  // door folds only the metadata (finish reason, counts, versions), and the final reply carries
  // no tokens, texts, logprobs or routing rows. Without it (in-process and websocket callers) the
  // final reply is the whole result, as it has always been.
  bool output_through_sink_only = false;
};

// Request ids. A generate request is named by its rid from where it enters the engine to its
// last chunk: the HTTP, OpenAI and websocket call actors and the fan-out of batch and n > 1
// bodies name a request that came without one, and the front door (tokenizer_actor) names
// those of in-process callers; the front door refuses a rid that is still in flight.
//
// A fresh rid: 128 random bits as 32 hex digits (as long as SGLang's uuid4().hex), so rids
// picked by different connections and processes do not meet.
std::string random_rid();
// `req`'s rid, after giving it a fresh one if it has none.
const std::string& assign_rid(GenerateReqInput& req);
// Why a request whose rid names one still in flight is refused.
std::string rid_in_flight_message(const std::string& rid);

// What the tokenizer actor sends the scheduler: ids only, rid always set.
struct TokenizedGenerateReqInput {
  std::string rid;
  std::string input_text; // for logs and echo; may be empty for id input
  std::vector<int32_t> input_ids;
  SamplingParams sampling_params;
  bool return_logprob = false;
  int32_t logprob_start_len = -1;
  int32_t top_logprobs_num = 0;
  bool return_text_in_logprobs = false;
  bool return_routed_experts = false;
  int32_t routed_experts_start_len = 0;
  bool stream = false;
  uint64_t sampling_seed = 0; // resolved: from sampling_params or chosen by the front door
};

// Why a request ended. type: "stop" (EOS, stop token or stop string; `matched` says which),
// "length" (max_new_tokens or the context limit), "abort" (abort request or pause(abort)).
struct FinishReason {
  std::string type;
  std::optional<int32_t> matched_token;
  std::optional<std::string> matched_str;
  std::string message; // for abort: who aborted and why
};

struct TopLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
  std::optional<std::string> text{}; // return_text_in_logprobs: the token's text
};

// Output tokens first_token, first_token + 1, ... (up to the next span) were computed with
// weight_version. One span unless an update committed while the request was paused in place or
// retracted (miles' per-token version provenance).
struct WeightVersionSpan {
  std::string weight_version;
  int32_t first_token = 0;
};

// A generation result. Non-streaming: one message with everything. Streaming: chunks whose
// text / output_ids / logprobs hold only what is new since the previous chunk, the last one
// with finished = true and the finish reason. Versions: the weight version the request's
// first token was computed with, and the one its last token was computed with (they differ
// only when an update committed while the request was paused in place).
struct GenerateReqOutput {
  bool success = true;
  std::string message;
  std::string rid;
  std::string text;
  std::vector<int32_t> output_ids;
  std::vector<float> output_token_logprobs;            // one per entry of output_ids
  std::vector<std::vector<TopLogprob>> output_top_logprobs;
  // return_logprob: the prompt from logprob_start_len on (-1: its last token), each token's
  // logprob given the tokens before it, and its top logprobs when top_logprobs_num > 0. The first
  // entry has none (NaN, and an empty list; SGLang's None): nothing before it was scored.
  std::vector<int32_t> input_token_ids;
  std::vector<float> input_token_logprobs;
  std::vector<std::vector<TopLogprob>> input_top_logprobs;
  // return_text_in_logprobs: the text of each output_ids / input_token_ids entry.
  std::vector<std::string> output_token_texts;
  std::vector<std::string> input_token_texts;
  // return_routed_experts (with the finished result): [positions, num_hidden_layers, top_k]
  // expert ids of positions routed_experts_start_len .. prompt + output tokens - 2 (every
  // position the model ran; the last token never ran), -1 in dense layers. SGLang's
  // meta_info.routed_experts, there as base64 of little-endian int32.
  std::optional<std::vector<int32_t>> routed_experts;
  int32_t routed_experts_start_len = 0;
  // Top-p replay (returns_top_p_token_ids): the kept set of every output token, in output order,
  // flattened (top_p_token_ids) with one count per output token (top_p_token_counts, as long
  // as output_ids); none when the request does not return them. SGLang's meta_info.top_p_token_ids
  // and top_p_token_offsets (offsets = 0 then the running sums of the counts), base64 of
  // little-endian int32. Chunks carry the sets of their own tokens.
  std::vector<int32_t> top_p_token_ids;
  std::optional<std::vector<int32_t>> top_p_token_counts;
  bool finished = false;
  std::optional<FinishReason> finish_reason;
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0; // so far, for chunks
  int32_t cached_tokens = 0;
  std::string weight_version_start;
  std::string weight_version; // at the end (SGLang's meta_info.weight_version)
  std::vector<WeightVersionSpan> weight_version_spans; // (rlserve) which tokens came from which
  uint64_t sampling_seed = 0;
  // Speculative decoding (SGLang's meta_info.spec_verify_ct): verification steps, draft tokens
  // the target accepted and draft tokens it was given to verify. Tokens per verification =
  // (accepted + verify_ct) / verify_ct; acceptance rate = accepted / proposed.
  int32_t spec_verify_ct = 0;
  int32_t spec_accepted_tokens = 0;
  int32_t spec_proposed_drafts = 0;
};

// The chunks of one scheduler step for one sink (the front door): one message per step, not one
// per request. A chunk is a GenerateReqOutput holding what is new since the request's previous
// chunk (tokens, logprobs) and the state so far (counts, versions, finish); its text is empty:
// the front door detokenizes, and folds chunks into the result with append_chunk. A request's
// last chunk is the scheduler's record of its output itself, moved: a request that does not
// stream reaches its caller as that one object, never copied.
struct TokenChunks {
  std::vector<GenerateReqOutput> chunks;
};

// Folds `chunk` (what is new since the previous one) into `so_far`: per-token lists and the text
// are joined, the prompt logprobs (sent once) kept, everything else taken from the chunk as the
// state so far. Only moves: into an empty `so_far` the chunk's lists go as they are. The front
// door builds results this way, and SGLang-style streams (each event the whole result so far)
// are built by the HTTP front the same way.
void append_chunk(GenerateReqOutput& so_far, GenerateReqOutput chunk);
// Empties what append_chunk joins or keeps from one chunk (the text, the per-token lists, the
// prompt logprobs, the routing rows), leaving the metadata: a chunk whose output has gone to a
// sink that keeps it (GenerateReqInput::output_through_sink_only).
void drop_output(GenerateReqOutput& chunk);

// SGLang AbortReq: one request by rid, or every request.
struct AbortReq {
  std::string rid;
  bool abort_all = false;
  std::string abort_message;
};

struct AbortReqOutput {
  bool success = true;
  std::string message;
  int32_t num_aborted = 0;
};

// ---- inspect (CAF 0.17 form) ------------------------------------------------------------------

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SamplingParams& x) {
  return f(caf::meta::type_name("SamplingParams"), x.max_new_tokens, x.stop, x.stop_token_ids,
           x.temperature, x.top_p, x.top_k, x.min_p, x.frequency_penalty, x.presence_penalty,
           x.repetition_penalty, x.min_new_tokens, x.n, x.ignore_eos, x.skip_special_tokens,
           x.spaces_between_special_tokens, x.no_stop_trim, x.sampling_seed, x.stream_interval,
           x.return_top_p_token_ids);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, GenerateReqInput& x) {
  return f(caf::meta::type_name("GenerateReqInput"), x.rid, x.text, x.input_ids,
           x.sampling_params, x.return_logprob, x.logprob_start_len, x.top_logprobs_num,
           x.return_text_in_logprobs, x.return_routed_experts, x.routed_experts_start_len,
           x.stream, x.output_through_sink_only);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TokenizedGenerateReqInput& x) {
  return f(caf::meta::type_name("TokenizedGenerateReqInput"), x.rid, x.input_text, x.input_ids,
           x.sampling_params, x.return_logprob, x.logprob_start_len, x.top_logprobs_num,
           x.return_text_in_logprobs, x.return_routed_experts, x.routed_experts_start_len,
           x.stream, x.sampling_seed);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, FinishReason& x) {
  return f(caf::meta::type_name("FinishReason"), x.type, x.matched_token, x.matched_str,
           x.message);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TopLogprob& x) {
  return f(caf::meta::type_name("TopLogprob"), x.token_id, x.logprob, x.text);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WeightVersionSpan& x) {
  return f(caf::meta::type_name("WeightVersionSpan"), x.weight_version, x.first_token);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, GenerateReqOutput& x) {
  return f(caf::meta::type_name("GenerateReqOutput"), x.success, x.message, x.rid, x.text,
           x.output_ids, x.output_token_logprobs, x.output_top_logprobs, x.input_token_ids,
           x.input_token_logprobs, x.input_top_logprobs, x.output_token_texts,
           x.input_token_texts, x.routed_experts, x.routed_experts_start_len, x.top_p_token_ids,
           x.top_p_token_counts, x.finished,
           x.finish_reason, x.prompt_tokens,
           x.completion_tokens, x.cached_tokens, x.weight_version_start, x.weight_version,
           x.weight_version_spans, x.sampling_seed, x.spec_verify_ct, x.spec_accepted_tokens,
           x.spec_proposed_drafts);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TokenChunks& x) {
  return f(caf::meta::type_name("TokenChunks"), x.chunks);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, AbortReq& x) {
  return f(caf::meta::type_name("AbortReq"), x.rid, x.abort_all, x.abort_message);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, AbortReqOutput& x) {
  return f(caf::meta::type_name("AbortReqOutput"), x.success, x.message, x.num_aborted);
}

} // namespace rlserve
