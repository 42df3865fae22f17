// JSON codecs of control.hpp: pause / continue, cache flush, server info and health.
#include "messages/json_codec.hpp"
#include "messages/json_codec_detail.hpp"

namespace rlserve {

using namespace json_codec_detail;

namespace {

template <class T>
expected<T> decode_status_reply(const json& j) {
  return decode<T>(j, strictness::lenient, [](object_reader& r, T& x) {
    r.field("success", x.success);
    r.field("message", x.message);
  });
}

template <class T>
json encode_status_reply(const T& x) {
  return {{"success", x.success}, {"message", x.message}};
}

// Requests without fields: `{}` or null; any key is an error (a typo or a misrouted body).
template <class T>
expected<T> decode_empty_request(const json& j) {
  return decode<T>(j, strictness::request, [](object_reader&, T&) {});
}

} // namespace

template <>
expected<PauseGenerationReqInput> from_json<PauseGenerationReqInput>(const json& j) {
  return decode<PauseGenerationReqInput>(
    j, strictness::request,
    [](object_reader& r, PauseGenerationReqInput& x) { r.field("mode", x.mode); });
}

json to_json(const PauseGenerationReqInput& x) {
  return {{"mode", to_string(x.mode)}};
}

template <>
expected<PauseGenerationReqOutput> from_json<PauseGenerationReqOutput>(const json& j) {
  return decode_status_reply<PauseGenerationReqOutput>(j);
}

json to_json(const PauseGenerationReqOutput& x) {
  return encode_status_reply(x);
}

template <>
expected<ContinueGenerationReqInput> from_json<ContinueGenerationReqInput>(const json& j) {
  return decode<ContinueGenerationReqInput>(
    j, strictness::request, [](object_reader& r, ContinueGenerationReqInput& x) {
      r.field("torch_empty_cache", x.torch_empty_cache);
    });
}

json to_json(const ContinueGenerationReqInput& x) {
  return {{"torch_empty_cache", x.torch_empty_cache}};
}

template <>
expected<ContinueGenerationReqOutput> from_json<ContinueGenerationReqOutput>(const json& j) {
  return decode_status_reply<ContinueGenerationReqOutput>(j);
}

json to_json(const ContinueGenerationReqOutput& x) {
  return encode_status_reply(x);
}

template <>
expected<FlushCacheReqInput> from_json<FlushCacheReqInput>(const json& j) {
  return decode<FlushCacheReqInput>(j, strictness::request,
                                    [](object_reader& r, FlushCacheReqInput& x) {
                                      r.field("timeout_s", x.timeout_s, num_rule{.lo = 0});
                                    });
}

json to_json(const FlushCacheReqInput& x) {
  return {{"timeout_s", optional_value(x.timeout_s)}};
}

template <>
expected<FlushCacheReqOutput> from_json<FlushCacheReqOutput>(const json& j) {
  return decode_status_reply<FlushCacheReqOutput>(j);
}

json to_json(const FlushCacheReqOutput& x) {
  return encode_status_reply(x);
}

namespace {
// release/resume tags: SGLang's names; none (or null) means all.
template <class In>
expected<In> decode_memory_tags(const json& j) {
  return decode<In>(j, strictness::request, [](object_reader& r, In& x) {
    r.field("tags", x.tags, list_rule<text_rule>{.elem = {.non_empty = true}});
    if (!r.ok())
      return;
    if (const auto i = find_unknown_memory_tag(x.tags)) {
      const path tags = r.at("tags");
      r.cx().fail(tags.index(*i), "unknown memory tag " + describe(json(x.tags[*i])) +
                                              " (expected \"weights\", \"kv_cache\" or \"cuda_graph\")");
    }
  });
}
} // namespace

template <>
expected<ReleaseMemoryOccupationReqInput> from_json<ReleaseMemoryOccupationReqInput>(const json& j) {
  return decode_memory_tags<ReleaseMemoryOccupationReqInput>(j);
}

json to_json(const ReleaseMemoryOccupationReqInput& x) {
  return {{"tags", x.tags}};
}

template <>
expected<ReleaseMemoryOccupationReqOutput> from_json<ReleaseMemoryOccupationReqOutput>(const json& j) {
  return decode_status_reply<ReleaseMemoryOccupationReqOutput>(j);
}

json to_json(const ReleaseMemoryOccupationReqOutput& x) {
  return encode_status_reply(x);
}

template <>
expected<ResumeMemoryOccupationReqInput> from_json<ResumeMemoryOccupationReqInput>(const json& j) {
  return decode_memory_tags<ResumeMemoryOccupationReqInput>(j);
}

json to_json(const ResumeMemoryOccupationReqInput& x) {
  return {{"tags", x.tags}};
}

template <>
expected<ResumeMemoryOccupationReqOutput> from_json<ResumeMemoryOccupationReqOutput>(const json& j) {
  return decode_status_reply<ResumeMemoryOccupationReqOutput>(j);
}

json to_json(const ResumeMemoryOccupationReqOutput& x) {
  return encode_status_reply(x);
}

template <>
expected<GetServerInfoReqInput> from_json<GetServerInfoReqInput>(const json& j) {
  return decode_empty_request<GetServerInfoReqInput>(j);
}

json to_json(const GetServerInfoReqInput&) {
  return json::object();
}

template <>
expected<GetServerInfoReqOutput> from_json<GetServerInfoReqOutput>(const json& j) {
  return decode<GetServerInfoReqOutput>(
    j, strictness::lenient, [](object_reader& r, GetServerInfoReqOutput& x) {
      const int_rule<int32_t> count{.lo = 0};
      r.field("success", x.success);
      r.field("message", x.message);
      r.field("model_path", x.model_path);
      r.field("draft_model_path", x.draft_model_path);
      r.field("weight_version", x.weight_version);
      r.field("device", x.device);
      r.field("architecture", x.architecture);
      r.field("vocab_size", x.vocab_size, int_rule<int64_t>{.lo = 0});
      r.field("max_context_length", x.max_context_length, int_rule<int64_t>{.lo = 0});
      r.field("paused", x.paused);
      r.field("pause_mode", x.pause_mode);
      r.field("weight_update_session_open", x.weight_update_session_open);
      r.field("running_requests", x.running_requests, count);
      r.field("waiting_requests", x.waiting_requests, count);
      r.field("committed_updates", x.committed_updates);
      r.field("scheduler_steps", x.scheduler_steps);
      r.field("scheduler_cpu_us", x.scheduler_cpu_us);
      r.field("speculative_num_draft_tokens", x.speculative_num_draft_tokens, count);
      r.field("spec_verify_steps", x.spec_verify_steps);
      r.field("spec_accepted_tokens", x.spec_accepted_tokens);
      r.field("spec_proposed_drafts", x.spec_proposed_drafts);
      r.field("spec_accept_rate", x.spec_accept_rate);
      r.field("spec_accept_length", x.spec_accept_length);
      r.field("spec_recent_accept_length", x.spec_recent_accept_length);
      r.field("weight_transports", x.weight_transports);
      r.field("int4_modules", x.int4_modules, count);
      r.field("int4_update_recipe", x.int4_update_recipe);
      r.field("int4_quantized_on", x.int4_quantized_on);
      r.field("max_running_requests", x.max_running_requests, count);
      r.field("max_total_num_tokens", x.max_total_num_tokens, int_rule<int64_t>{.lo = 0});
      r.field("num_used_tokens", x.num_used_tokens, int_rule<int64_t>{.lo = 0});
      r.field("prefix_cache", x.prefix_cache);
      r.field("prefix_cached_tokens", x.prefix_cached_tokens, int_rule<int64_t>{.lo = 0});
      r.field("prefix_query_tokens", x.prefix_query_tokens);
      r.field("prefix_hit_tokens", x.prefix_hit_tokens);
      r.field("prefill_tokens", x.prefill_tokens);
    });
}

json to_json(const GetServerInfoReqOutput& x) {
  return {{"success", x.success},
          {"message", x.message},
          {"model_path", x.model_path},
          {"draft_model_path", x.draft_model_path},
          {"weight_version", x.weight_version},
          {"device", x.device},
          {"architecture", x.architecture},
          {"vocab_size", x.vocab_size},
          {"max_context_length", x.max_context_length},
          {"paused", x.paused},
          {"pause_mode", x.pause_mode},
          {"weight_update_session_open", x.weight_update_session_open},
          {"running_requests", x.running_requests},
          {"waiting_requests", x.waiting_requests},
          {"committed_updates", x.committed_updates},
          {"scheduler_steps", x.scheduler_steps},
          {"scheduler_cpu_us", x.scheduler_cpu_us},
          {"speculative_num_draft_tokens", x.speculative_num_draft_tokens},
          {"spec_verify_steps", x.spec_verify_steps},
          {"spec_accepted_tokens", x.spec_accepted_tokens},
          {"spec_proposed_drafts", x.spec_proposed_drafts},
          {"spec_accept_rate", x.spec_accept_rate},
          {"spec_accept_length", x.spec_accept_length},
          {"spec_recent_accept_length", x.spec_recent_accept_length},
          {"weight_transports", x.weight_transports},
          {"int4_modules", x.int4_modules},
          {"int4_update_recipe", x.int4_update_recipe},
          {"int4_quantized_on", x.int4_quantized_on},
          {"max_running_requests", x.max_running_requests},
          {"max_total_num_tokens", x.max_total_num_tokens},
          {"num_used_tokens", x.num_used_tokens},
          {"prefix_cache", x.prefix_cache},
          {"prefix_cached_tokens", x.prefix_cached_tokens},
          {"prefix_query_tokens", x.prefix_query_tokens},
          {"prefix_hit_tokens", x.prefix_hit_tokens},
          {"prefill_tokens", x.prefill_tokens}};
}

template <>
expected<HealthCheckReqInput> from_json<HealthCheckReqInput>(const json& j) {
  return decode_empty_request<HealthCheckReqInput>(j);
}

json to_json(const HealthCheckReqInput&) {
  return json::object();
}

template <>
expected<HealthCheckReqOutput> from_json<HealthCheckReqOutput>(const json& j) {
  return decode_status_reply<HealthCheckReqOutput>(j);
}

json to_json(const HealthCheckReqOutput& x) {
  return encode_status_reply(x);
}

} // namespace rlserve
