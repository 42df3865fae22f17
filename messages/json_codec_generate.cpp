// JSON codecs of generate.hpp: SamplingParams, GenerateReqInput, GenerateReqOutput (SGLang's
// /generate response shape), FinishReason, TopLogprob, AbortReq and AbortReqOutput.
#include "messages/base64.hpp"
#include "messages/json_codec.hpp"
#include "messages/json_codec_detail.hpp"
#include "messages/validate.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace rlserve {

using namespace json_codec_detail;

namespace {

const int_rule<int32_t> k_token_id{.lo = 0};
const int_rule<int32_t> k_count{.lo = 0};


// SGLang's logprob entry [logprob, token_id, token_text]: the logprob null where none was
// computed (the first scored prompt token; NaN here), the text null unless
// return_text_in_logprobs. [logprob, token_id] is read too.
bool parse_logprob_entry(context& cx, const json& v, const path& p, float& logprob,
                         int32_t& token_id, std::optional<std::string>* text = nullptr) {
  if (!v.is_array() || v.size() < 2 || v.size() > 3) {
    cx.expected_but_got(p, "[logprob, token_id, token_text]", v);
    return false;
  }
  if (v[0].is_null())
    logprob = std::numeric_limits<float>::quiet_NaN();
  else if (!parse(cx, v[0], p.index(0), logprob, lenient_float_rule{}))
    return false;
  if (!parse(cx, v[1], p.index(1), token_id, k_token_id))
    return false;
  if (v.size() == 3 && !v[2].is_null()) {
    if (!v[2].is_string()) {
      cx.expected_but_got(p.index(2), "the token's text or null", v[2]);
      return false;
    }
    if (text)
      *text = v[2].get<std::string>();
  }
  return true;
}

json logprob_entry(float logprob, int32_t token_id, const std::string* text) {
  return json::array({std::isnan(logprob) ? json(nullptr) : float_value(logprob), token_id,
                      text ? json(*text) : json(nullptr)});
}

// A list of logprob entries (output_token_logprobs, input_token_logprobs).
void read_logprob_list(object_reader& m, std::string_view key, std::vector<float>& logprobs,
                       std::vector<int32_t>& ids, std::vector<std::string>& texts) {
  auto v = m.get(key);
  if (!v)
    return;
  const path p = m.at(key);
  if (!expect_array(m.cx(), *v, p))
    return;
  bool any_text = false;
  for (std::size_t i = 0; i < v->size() && m.ok(); ++i) {
    float lp = 0;
    int32_t id = 0;
    std::optional<std::string> text;
    if (parse_logprob_entry(m.cx(), (*v)[i], p.index(i), lp, id, &text)) {
      logprobs.push_back(lp);
      ids.push_back(id);
      any_text = any_text || text.has_value();
      texts.push_back(text.value_or(std::string()));
    }
  }
  if (!any_text)
    texts.clear();
}

// Rows of top logprobs (output_top_logprobs, input_top_logprobs); a null row is an empty one.
void read_top_rows(object_reader& m, std::string_view key,
                   std::vector<std::vector<TopLogprob>>& rows) {
  auto v = m.get(key);
  if (!v)
    return;
  const path p = m.at(key);
  if (!expect_array(m.cx(), *v, p))
    return;
  for (std::size_t i = 0; i < v->size() && m.ok(); ++i) {
    const path pi = p.index(i);
    const json& row = (*v)[i];
    std::vector<TopLogprob> alternatives;
    if (!row.is_null() && expect_array(m.cx(), row, pi))
      for (std::size_t k = 0; k < row.size() && m.ok(); ++k) {
        TopLogprob t;
        if (parse_logprob_entry(m.cx(), row[k], pi.index(k), t.logprob, t.token_id, &t.text))
          alternatives.push_back(std::move(t));
      }
    rows.push_back(std::move(alternatives));
  }
}

json logprob_list(const std::vector<float>& logprobs, const std::vector<int32_t>& ids,
                  const std::vector<std::string>& texts) {
  auto out = json::array();
  for (std::size_t i = 0; i < logprobs.size(); ++i)
    // A logprob without its token (a malformed struct) is written with token id -1, which the
    // reader refuses, rather than silently dropped.
    out.push_back(logprob_entry(logprobs[i], i < ids.size() ? ids[i] : -1,
                                i < texts.size() ? &texts[i] : nullptr));
  return out;
}

json top_rows(const std::vector<std::vector<TopLogprob>>& rows, bool first_is_none) {
  auto out = json::array();
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (first_is_none && i == 0 && rows[i].empty()) {
      out.push_back(nullptr);
      continue;
    }
    auto alternatives = json::array();
    for (const auto& t : rows[i])
      alternatives.push_back(logprob_entry(t.logprob, t.token_id, t.text ? &*t.text : nullptr));
    out.push_back(std::move(alternatives));
  }
  return out;
}

// SGLang's int32 payloads (routed_experts, top_p_token_ids / top_p_token_offsets): base64 of the
// little-endian int32 array.
std::string base64_int32(const std::vector<int32_t>& values) {
  std::vector<std::byte> bytes(values.size() * 4);
  for (std::size_t i = 0; i < values.size(); ++i) {
    auto v = static_cast<uint32_t>(values[i]);
    for (int b = 0; b < 4; ++b)
      bytes[i * 4 + b] = static_cast<std::byte>((v >> (8 * b)) & 0xff);
  }
  return base64_encode(bytes);
}

std::optional<std::vector<int32_t>> read_base64_int32(object_reader& m, std::string_view key) {
  auto v = m.get(key);
  if (!v)
    return std::nullopt;
  std::string text;
  if (!parse(m.cx(), *v, m.at(key), text, text_rule{}))
    return std::nullopt;
  auto bytes = base64_decode(text);
  if (!bytes || bytes->size() % 4 != 0) {
    m.fail(key, bytes ? "is not a whole number of int32 values" : "is not base64: " + bytes.error());
    return std::nullopt;
  }
  std::vector<int32_t> ids(bytes->size() / 4);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    uint32_t u = 0;
    for (int b = 0; b < 4; ++b)
      u |= static_cast<uint32_t>((*bytes)[i * 4 + b]) << (8 * b);
    ids[i] = static_cast<int32_t>(u);
  }
  return ids;
}

// Top-p replay's pair: the flat kept ids and offsets (0, then one running end per output token),
// as counts per token here. Both or neither; the offsets must start at 0, not decrease and end
// at the number of ids.
void read_top_p_token_ids(object_reader& m, GenerateReqOutput& x) {
  auto ids = read_base64_int32(m, "top_p_token_ids");
  auto offsets = read_base64_int32(m, "top_p_token_offsets");
  if (!m.ok() || (!ids && !offsets))
    return;
  if (!ids || !offsets) {
    m.fail(ids ? "top_p_token_offsets" : "top_p_token_ids", "missing (the two come together)");
    return;
  }
  if (offsets->empty() || offsets->front() != 0 ||
      offsets->back() != static_cast<int32_t>(ids->size()) ||
      !std::is_sorted(offsets->begin(), offsets->end())) {
    m.fail("top_p_token_offsets", "expected 0, then non-decreasing ends up to the " +
                                    std::to_string(ids->size()) + " top_p_token_ids");
    return;
  }
  std::vector<int32_t> counts(offsets->size() - 1);
  for (std::size_t i = 0; i + 1 < offsets->size(); ++i)
    counts[i] = (*offsets)[i + 1] - (*offsets)[i];
  x.top_p_token_ids = std::move(*ids);
  x.top_p_token_counts = std::move(counts);
}

void read_fields(object_reader& r, SamplingParams& x) {
  r.field("max_new_tokens", x.max_new_tokens, k_count);
  read_stop(r, x.stop);
  r.field("stop_token_ids", x.stop_token_ids, list_rule<int_rule<int32_t>>{.elem = k_token_id});
  r.field("temperature", x.temperature, num_rule{.lo = 0});
  r.field("top_p", x.top_p, num_rule{.lo = 0, .hi = 1, .lo_open = true});
  r.field("top_k", x.top_k);
  if (r.ok() && (x.top_k == 0 || x.top_k < -1))
    r.fail("top_k", "expected -1 (the whole vocabulary) or an integer >= 1, got " +
                      std::to_string(x.top_k));
  r.field("min_p", x.min_p, num_rule{.lo = 0, .hi = 1});
  // Ranges as SGLang's SamplingParams.verify() checks them.
  r.field("frequency_penalty", x.frequency_penalty, num_rule{.lo = -2, .hi = 2});
  r.field("presence_penalty", x.presence_penalty, num_rule{.lo = -2, .hi = 2});
  r.field("repetition_penalty", x.repetition_penalty, num_rule{.lo = 0, .hi = 2, .lo_open = true});
  r.field("min_new_tokens", x.min_new_tokens, k_count);
  if (r.ok() && x.min_new_tokens > x.max_new_tokens)
    r.fail("min_new_tokens", "expected at most max_new_tokens (" +
                               std::to_string(x.max_new_tokens) + "), got " +
                               std::to_string(x.min_new_tokens));
  r.field("n", x.n, int_rule<int32_t>{.lo = 1});
  r.field("ignore_eos", x.ignore_eos);
  r.field("skip_special_tokens", x.skip_special_tokens);
  r.field("spaces_between_special_tokens", x.spaces_between_special_tokens);
  r.field("no_stop_trim", x.no_stop_trim);
  r.field("sampling_seed", x.sampling_seed);
  // SGLang features rlserve does not implement and that would change the tokens (constrained
  // decoding, logit biases) are refused when set. custom_params reach a custom logit processor
  // (refused at the top level) and are ignored, but for slime's top-p replay switch
  // (read_custom_params).
  for (auto key : {"json_schema", "regex", "ebnf", "structural_tag", "stop_regex", "logit_bias"})
    r.unsupported(key);
  read_custom_params(r, &x.return_top_p_token_ids);
  r.field("stream_interval", x.stream_interval, int_rule<int32_t>{.lo = 1});
}

void read_fields(object_reader& r, GenerateReqInput& x) {
  for (auto key : {"rid", "text", "sampling_params", "return_logprob", "logprob_start_len",
                   "top_logprobs_num"})
    r.reject_batch(key);
  r.reject_batch("input_ids", /*nested_list=*/true);
  r.field("rid", x.rid, text_rule{.non_empty = true});
  r.field("text", x.text);
  r.field("input_ids", x.input_ids, list_rule<int_rule<int32_t>>{.elem = k_token_id});
  r.object("sampling_params", [&](object_reader& s) { read_fields(s, x.sampling_params); });
  r.field("return_logprob", x.return_logprob);
  r.field("logprob_start_len", x.logprob_start_len, int_rule<int32_t>{.lo = -1});
  r.field("top_logprobs_num", x.top_logprobs_num, k_count);
  r.field("return_text_in_logprobs", x.return_text_in_logprobs);
  r.field("return_routed_experts", x.return_routed_experts);
  r.field("routed_experts_start_len", x.routed_experts_start_len, k_count);
  r.field("stream", x.stream);
  r.unsupported("input_embeds", nullptr, "send text or input_ids");
  // miles' DSA indexer replay (--use-rollout-indexer-replay) reads meta_info.indexer_topk; no
  // model rlserve serves has an indexer, so asking for it is refused rather than answered
  // without it. false (what miles sends otherwise) is inert.
  r.unsupported("return_indexer_topk", false, "no model rlserve serves has a DSA indexer");
  // Would change what comes back (other inputs, adapters, sessions, extra outputs, a
  // disaggregated prefill elsewhere): refused when set.
  for (auto key : {"image_data", "video_data", "audio_data", "return_hidden_states",
                   "lora_path", "lora_id", "session_params",
                   "custom_logit_processor", "token_ids_logprob", "token_ids_logprob_positions",
                   "bootstrap_host", "bootstrap_port", "bootstrap_room"})
    r.unsupported(key);
  // Change nothing rlserve returns (scheduling, logging, routing between engines, cache
  // namespaces of a shared prefix cache): accepted and ignored.
  for (auto key : {"priority", "log_metrics", "no_logs", "custom_labels", "routed_dp_rank",
                   "data_parallel_rank", "http_worker_ipc", "extra_key", "cache_salt"})
    r.ignore(key);
  if (!r.ok())
    return;
  if (x.text && x.input_ids)
    r.cx().fail(r.where(), "text and input_ids are both set; send exactly one");
  else if (!x.text && !x.input_ids)
    r.cx().fail(r.where(), "neither text nor input_ids is set; send exactly one");
  else if (x.input_ids && x.input_ids->empty())
    r.fail("input_ids", "empty");
}

void read_fields(object_reader& r, FinishReason& x) {
  r.required("type", x.type, text_rule{.non_empty = true});
  if (auto v = r.get("matched")) {
    if (v->is_string())
      x.matched_str = v->get<std::string>();
    else if (v->is_number())
      parse(r.cx(), *v, r.at("matched"), x.matched_token, k_token_id);
    else
      r.cx().expected_but_got(r.at("matched"), "a token id or a stop string", *v);
  }
  r.field("matched_str", x.matched_str);
  r.field("message", x.message);
}

json fields_of(const FinishReason& x) {
  json j = {{"type", x.type}};
  if (x.matched_token)
    j["matched"] = *x.matched_token;
  if (x.matched_str)
    j[x.matched_token ? "matched_str" : "matched"] = *x.matched_str;
  if (!x.message.empty())
    j["message"] = x.message;
  return j;
}

void read_fields(object_reader& r, GenerateReqOutput& x) {
  r.field("text", x.text);
  r.field("output_ids", x.output_ids, list_rule<int_rule<int32_t>>{.elem = k_token_id});
  r.field("success", x.success);
  r.field("message", x.message);
  r.field("finished", x.finished);
  std::vector<int32_t> logprob_ids;
  r.object("meta_info", [&](object_reader& m) {
    m.field("id", x.rid);
    m.object("finish_reason", [&](object_reader& f) {
      FinishReason reason;
      read_fields(f, reason);
      x.finish_reason = std::move(reason);
    });
    m.field("prompt_tokens", x.prompt_tokens, k_count);
    m.field("completion_tokens", x.completion_tokens, k_count);
    m.field("cached_tokens", x.cached_tokens, k_count);
    m.field("weight_version", x.weight_version);
    m.field("weight_version_start", x.weight_version_start);
    m.object_list("weight_version_spans", x.weight_version_spans,
                  [](object_reader& s, WeightVersionSpan& span) {
                    s.field("weight_version", span.weight_version);
                    s.field("first_token", span.first_token, k_count);
                  });
    m.field("sampling_seed", x.sampling_seed);
    m.field("spec_verify_ct", x.spec_verify_ct, k_count);
    m.field("spec_accepted_tokens", x.spec_accepted_tokens, k_count);
    m.field("spec_num_proposed_drafts", x.spec_proposed_drafts, k_count);
    read_logprob_list(m, "output_token_logprobs", x.output_token_logprobs, logprob_ids,
                      x.output_token_texts);
    read_top_rows(m, "output_top_logprobs", x.output_top_logprobs);
    read_logprob_list(m, "input_token_logprobs", x.input_token_logprobs, x.input_token_ids,
                      x.input_token_texts);
    read_top_rows(m, "input_top_logprobs", x.input_top_logprobs);
    m.field("routed_experts_start_len", x.routed_experts_start_len, k_count);
    if (auto ids = read_base64_int32(m, "routed_experts"))
      x.routed_experts = std::move(*ids);
    read_top_p_token_ids(m, x);
    if (!m.ok() || logprob_ids.empty())
      return;
    if (logprob_ids.size() != x.output_ids.size()) {
      m.fail("output_token_logprobs", "has " + std::to_string(logprob_ids.size()) +
                                          " entries for " + std::to_string(x.output_ids.size()) +
                                          " output_ids");
      return;
    }
    const path list = m.at("output_token_logprobs");
    for (std::size_t i = 0; i < logprob_ids.size(); ++i)
      if (logprob_ids[i] != x.output_ids[i]) {
        const path entry = list.index(i);
        m.cx().fail(entry.index(1),
                    "token id " + std::to_string(logprob_ids[i]) + " does not match output_ids[" +
                      std::to_string(i) + "] = " + std::to_string(x.output_ids[i]));
        return;
      }
  });
}

} // namespace

// ---- SamplingParams -----------------------------------------------------------------------------

// Both decoders end with validate() (messages/validate.hpp), the checks the in-process API
// runs. The field rules above already enforce the same ranges with JSON paths; this backstop
// keeps the two ways in from drifting apart when a rule is added only there.
template <>
expected<SamplingParams> from_json<SamplingParams>(const json& j) {
  auto x = decode<SamplingParams>(
    j, strictness::strict, [](object_reader& r, SamplingParams& x) { read_fields(r, x); });
  if (x)
    if (auto st = validate(*x, ""); !st)
      return std::move(st).take_failure();
  return x;
}

json to_json(const SamplingParams& x) {
  return {
    {"max_new_tokens", x.max_new_tokens},
    {"stop", x.stop},
    {"stop_token_ids", x.stop_token_ids},
    {"temperature", float_value(x.temperature)},
    {"top_p", float_value(x.top_p)},
    {"top_k", x.top_k},
    {"min_p", float_value(x.min_p)},
    {"frequency_penalty", float_value(x.frequency_penalty)},
    {"presence_penalty", float_value(x.presence_penalty)},
    {"repetition_penalty", float_value(x.repetition_penalty)},
    {"min_new_tokens", x.min_new_tokens},
    {"n", x.n},
    {"ignore_eos", x.ignore_eos},
    {"skip_special_tokens", x.skip_special_tokens},
    {"spaces_between_special_tokens", x.spaces_between_special_tokens},
    {"no_stop_trim", x.no_stop_trim},
    {"sampling_seed", optional_value(x.sampling_seed)},
    {"stream_interval", optional_value(x.stream_interval)},
    {"custom_params", x.return_top_p_token_ids ? json{{"return_top_p_token_ids", true}} : json(nullptr)},
  };
}

// ---- GenerateReqInput ---------------------------------------------------------------------------

template <>
expected<GenerateReqInput> from_json<GenerateReqInput>(const json& j) {
  auto x = decode<GenerateReqInput>(
    j, strictness::request, [](object_reader& r, GenerateReqInput& x) { read_fields(r, x); });
  if (x)
    if (auto st = validate(*x); !st)
      return std::move(st).take_failure();
  return x;
}

json to_json(const GenerateReqInput& x) {
  return {
    {"rid", optional_value(x.rid)},
    {"text", optional_value(x.text)},
    {"input_ids", optional_value(x.input_ids)},
    {"sampling_params", to_json(x.sampling_params)},
    {"return_logprob", x.return_logprob},
    {"logprob_start_len", x.logprob_start_len},
    {"top_logprobs_num", x.top_logprobs_num},
    {"return_text_in_logprobs", x.return_text_in_logprobs},
    {"return_routed_experts", x.return_routed_experts},
    {"routed_experts_start_len", x.routed_experts_start_len},
    {"stream", x.stream},
  };
}

// ---- FinishReason, TopLogprob -------------------------------------------------------------------

template <>
expected<FinishReason> from_json<FinishReason>(const json& j) {
  return decode<FinishReason>(j, strictness::lenient,
                              [](object_reader& r, FinishReason& x) { read_fields(r, x); });
}

json to_json(const FinishReason& x) {
  return fields_of(x);
}

template <>
expected<TopLogprob> from_json<TopLogprob>(const json& j) {
  context cx;
  TopLogprob x;
  if (!parse_logprob_entry(cx, j, path{}, x.logprob, x.token_id, &x.text))
    return fail(cx.take_error());
  return x;
}

json to_json(const TopLogprob& x) {
  return logprob_entry(x.logprob, x.token_id, x.text ? &*x.text : nullptr);
}

// ---- GenerateReqOutput --------------------------------------------------------------------------

template <>
expected<GenerateReqOutput> from_json<GenerateReqOutput>(const json& j) {
  return decode<GenerateReqOutput>(
    j, strictness::lenient, [](object_reader& r, GenerateReqOutput& x) { read_fields(r, x); });
}

json to_json(const GenerateReqOutput& x) {
  json meta = {
    {"id", x.rid},
    {"finish_reason", x.finish_reason ? fields_of(*x.finish_reason) : json(nullptr)},
    {"prompt_tokens", x.prompt_tokens},
    {"completion_tokens", x.completion_tokens},
    {"cached_tokens", x.cached_tokens},
    {"weight_version", x.weight_version},
    {"weight_version_start", x.weight_version_start},
    {"sampling_seed", x.sampling_seed},
  };
  if (x.spec_verify_ct > 0) {
    meta["spec_verify_ct"] = x.spec_verify_ct;
    meta["spec_accepted_tokens"] = x.spec_accepted_tokens;
    meta["spec_accept_length"] =
      double(x.spec_accepted_tokens + x.spec_verify_ct) / double(x.spec_verify_ct);
    // SGLang's names for the counts and the rate of drafts kept (the bonus token not counted).
    meta["spec_num_correct_drafts"] = x.spec_accepted_tokens;
    meta["spec_num_proposed_drafts"] = x.spec_proposed_drafts;
    meta["spec_accept_rate"] =
      x.spec_proposed_drafts > 0 ? double(x.spec_accepted_tokens) / double(x.spec_proposed_drafts) : 0.0;
  }
  auto spans = json::array();
  for (const auto& span : x.weight_version_spans)
    spans.push_back({{"weight_version", span.weight_version}, {"first_token", span.first_token}});
  meta["weight_version_spans"] = std::move(spans);
  if (!x.output_token_logprobs.empty() || !x.input_token_ids.empty()) {
    meta["output_token_logprobs"] =
      logprob_list(x.output_token_logprobs, x.output_ids, x.output_token_texts);
    meta["input_token_logprobs"] =
      logprob_list(x.input_token_logprobs, x.input_token_ids, x.input_token_texts);
  }
  if (x.routed_experts) { // SGLang's routing replay payload
    meta["routed_experts"] = base64_int32(*x.routed_experts);
    meta["routed_experts_start_len"] = x.routed_experts_start_len;
  }
  if (x.top_p_token_counts) { // slime's top-p replay (its patched SGLang's names and encoding)
    std::vector<int32_t> offsets(x.top_p_token_counts->size() + 1, 0);
    for (std::size_t i = 0; i < x.top_p_token_counts->size(); ++i)
      offsets[i + 1] = offsets[i] + (*x.top_p_token_counts)[i];
    meta["top_p_token_ids"] = base64_int32(x.top_p_token_ids);
    meta["top_p_token_offsets"] = base64_int32(offsets);
  }
  // Top logprobs only when asked for: output rows without alternatives are placeholders, and the
  // prompt rows exist only when top_logprobs_num > 0.
  auto has_alternatives = [](const std::vector<std::vector<TopLogprob>>& rows) {
    return std::any_of(rows.begin(), rows.end(), [](const auto& row) { return !row.empty(); });
  };
  if (has_alternatives(x.output_top_logprobs) || !x.input_top_logprobs.empty()) {
    meta["output_top_logprobs"] = top_rows(x.output_top_logprobs, false);
    meta["input_top_logprobs"] = top_rows(x.input_top_logprobs, true);
  }
  return {
    {"text", x.text},           {"output_ids", x.output_ids}, {"meta_info", std::move(meta)},
    {"success", x.success},     {"message", x.message},       {"finished", x.finished},
  };
}

// ---- AbortReq -----------------------------------------------------------------------------------

template <>
expected<AbortReq> from_json<AbortReq>(const json& j) {
  return decode<AbortReq>(j, strictness::request, [](object_reader& r, AbortReq& x) {
    r.reject_batch("rid");
    r.field("rid", x.rid);
    r.field("abort_all", x.abort_all);
    r.field("abort_message", x.abort_message);
    // SGLang's AbortReq also carries fields its front end fills in for the scheduler.
    for (auto key : {"finished_reason", "weight_versions", "http_worker_ipc"})
      r.unsupported(key);
    // Neither rid nor abort_all: SGLang answers 200 and aborts nothing (verl's client defaults
    // send it); so does rlserve, saying so in the reply (the front door's AbortReq handler).
  });
}

json to_json(const AbortReq& x) {
  return {{"rid", x.rid}, {"abort_all", x.abort_all}, {"abort_message", x.abort_message}};
}

template <>
expected<AbortReqOutput> from_json<AbortReqOutput>(const json& j) {
  return decode<AbortReqOutput>(j, strictness::lenient, [](object_reader& r, AbortReqOutput& x) {
    r.field("success", x.success);
    r.field("message", x.message);
    r.field("num_aborted", x.num_aborted, k_count);
  });
}

json to_json(const AbortReqOutput& x) {
  return {{"success", x.success}, {"message", x.message}, {"num_aborted", x.num_aborted}};
}

} // namespace rlserve
