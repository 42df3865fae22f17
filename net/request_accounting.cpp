#include "net/request_accounting.hpp"

#include <fmt/format.h>

#include "caf/message.hpp"
#include "messages/json_codec.hpp"

namespace rlserve::net::detail {

double seconds_since(clock::time_point t0) {
  return std::chrono::duration<double>(clock::now() - t0).count();
}

// A reply body's `success`, true when it has none (GenerateReqOutput has one; every mutating
// reply has one).
bool success_of(const json& body) {
  if (!body.is_object())
    return true;
  auto it = body.find("success");
  return it == body.end() || !it->is_boolean() || it->get<bool>();
}

bool session_open_of(const json& body) {
  if (!body.is_object())
    return false;
  auto it = body.find("session_open");
  return it != body.end() && it->is_boolean() && it->get<bool>();
}

// The update phase a route times in /metrics, or empty.
std::string_view phase_of(std::string_view route) {
  if (route == "begin_weight_update")
    return "begin";
  if (route == "update_weights_from_tensor" || route == "update_weights_from_distributed")
    return "update";
  if (route == "end_weight_update")
    return "end";
  if (route == "post_process_weights")
    return "post_process";
  if (route == "update_weights_from_disk")
    return "disk";
  return {};
}

template <class... Session>
void set_requester(caf::message& req, uint64_t owner) {
  ((req.match_elements<Session>() ? void(req.get_mutable_as<Session>(0).requester = owner) : void()), ...);
}

// Limits and bookkeeping before a request goes to the front door. `copied`: tensors of a
// binary frame that had to be copied (metrics only).
std::optional<refusal> before_send(shared_state& st, call_info& info, caf::message& req,
                                   uint64_t owner, std::size_t copied) {
  const bool in_session = req.match_elements<UpdateWeightsFromTensorReqInput>() ||
                          req.match_elements<UpdateWeightsFromDistributedReqInput>() ||
                          req.match_elements<EndWeightUpdateReqInput>();
  // Who sends it: the weight updater checks, when the request executes, that a session begun on
  // a websocket connection takes its updates and its end from that connection only.
  set_requester<BeginWeightUpdateReqInput, UpdateWeightsFromTensorReqInput,
                UpdateWeightsFromDistributedReqInput, EndWeightUpdateReqInput>(req, owner);
  if (req.match_elements<UpdateWeightsFromTensorReqInput>()) {
    uint64_t bytes = 0;
    for (const auto& t : req.get_as<UpdateWeightsFromTensorReqInput>(0).named_tensors)
      bytes += t.tensor.nbytes;
    if (!st.owners.add_tensor_bytes(bytes, st.opts.max_session_tensor_bytes, &info.session_epoch))
      return refusal{error_code::too_large,
                     fmt::format("this update carries {} tensor bytes, which would pass the limit of "
                                 "{} bytes per weight-update session (server option "
                                 "max_session_tensor_bytes)",
                                 bytes, st.opts.max_session_tensor_bytes)};
    info.tensor_bytes = bytes;
    st.stats.tensor_bytes(bytes, copied);
  } else if (req.match_elements<EndWeightUpdateReqInput>()) {
    info.end_abort = req.get_as<EndWeightUpdateReqInput>(0).abort;
    info.end_counted = st.owners.end_sent(owner);
  } else if (req.match_elements<ContinueGenerationReqInput>()) {
    st.owners.continue_sent();
  }
  if (in_session || req.match_elements<BeginWeightUpdateReqInput>()) {
    info.session_request = true;
    st.owners.session_request_sent();
  }
  return std::nullopt;
}

// Bookkeeping after a reply: ownership of sessions and pauses, metrics.
void after_reply(shared_state& st, const call_info& info, std::string_view transport, bool answered,
                 bool ok, uint64_t owner, bool session_open) {
  auto secs = seconds_since(info.t0);
  const auto& r = info.route;
  // A refused bucket staged nothing: its bytes do not count against the session.
  if (info.tensor_bytes > 0 && !(answered && ok))
    st.owners.refund_tensor_bytes(info.tensor_bytes, info.session_epoch);
  if (info.session_request)
    st.owners.session_request_answered();
  if (r == "begin_weight_update" && ok)
    st.owners.begin_succeeded(owner);
  else if (r == "end_weight_update" && !info.end_counted) {
    // From a connection that does not own the session: the engine refused it.
  } else if (r == "end_weight_update" && answered && session_open) {
    st.owners.end_refused(); // the engine kept the session open (a commit was under way)
  } else if (r == "end_weight_update") {
    if (auto length = st.owners.end_finished()) {
      st.stats.update_phase("session", *length);
      st.stats.update_session_ended(info.end_abort ? "aborted" : ok ? "committed" : "failed");
    }
  } else if (r == "pause_generation" && ok)
    st.owners.pause_succeeded(owner);
  if (auto phase = phase_of(r); !phase.empty() && answered)
    st.stats.update_phase(phase, secs);
  st.stats.request_done(transport, r,
                        !answered ? request_result::error
                        : ok      ? request_result::ok
                                  : request_result::failed,
                        secs);
}

void note_generate(shared_state& st, const GenerateReqOutput& out) {
  st.stats.generate_done(out.prompt_tokens, out.completion_tokens,
                         out.finish_reason ? std::string_view(out.finish_reason->type)
                                           : std::string_view(out.success ? "none" : "error"));
}

std::string routes_list() {
  std::string out;
  for (const auto& c : all_codecs()) {
    if (!out.empty())
      out += ", ";
    out += c.route;
  }
  return out + ", ping, cancel";
}

} // namespace rlserve::net::detail
