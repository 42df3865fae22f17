// JSON codecs with validation for every public message (generate.hpp, weight_update.hpp,
// control.hpp, tensor.hpp): what the websocket server and clients speak. runner.hpp's internal
// messages and the tokenizer-to-scheduler ones (TokenizedGenerateReqInput, TokenChunks) have no
// JSON form: they never leave the engine except through CAF's binary serialization.
//
//   auto req = rlserve::from_json<rlserve::GenerateReqInput>(j); // expected<GenerateReqInput>
//   if (!req) reply_error(req.error());   // "sampling_params.temperature: expected a number, got \"hot\""
//   nlohmann::json out = rlserve::to_json(output);
//
// Conventions:
// - Keys are the struct members' names, which are SGLang's io_struct names. Exception: a
//   tensor's element type is "dtype" (the member is `type` because `dtype` names the enum).
// - A missing key and JSON null both mean "the default" (SGLang's rule); a key marked required
//   in the headers must be present and non-null. A body of `null` reads as `{}`.
// - A request's top level (…ReqInput, AbortReq) ignores keys it does not know, as SGLang's
//   request dataclasses do (trainers send fields of newer or patched SGLang versions); each one
//   is counted (ignored_request_fields()) and handed to the front end's log. The parts of a
//   request (sampling_params, tensors) are strict: an unknown key is an error naming it, so a
//   typo ("sampling_params.max_tokens") fails instead of being ignored (SGLang's
//   SamplingParams refuses unknown arguments too). SGLang fields that rlserve does not
//   implement and that would change results are accepted while inert (absent, null, false, "",
//   [], {} or SGLang's default) and rejected with "<path>: not supported by rlserve" otherwise;
//   those that change nothing rlserve returns (priority, log_metrics, custom_params but for
//   its return_top_p_token_ids, ...) are accepted and ignored.
// - Replies (…ReqOutput, GenerateReqOutput and their parts) are read leniently: unknown keys
//   are ignored, so a newer server can add fields without breaking older clients. Types and
//   ranges are still checked.
// - Every error starts with the path of the offending value ("shapes[1][0]: ...",
//   "named_tensors[2].data: ...") and says what was expected and what came.
// - Integers must be JSON integers or floats without a fraction, in the field's range (int32
//   fields reject 2^31; unsigned ones reject negatives). Floats must be finite; float32 fields
//   are written with the shortest decimal that reads back to the same float ("0.7", not
//   "0.699999988079071"). A non-finite float (a -inf logprob, a NaN weight) is written as the
//   string "nan", "inf" or "-inf", which Python's float() reads back; reply decoders accept
//   those strings (and null), request decoders refuse them.
// - Enums are their names (enums.hpp); dtypes are PyTorch names ("bfloat16"; "torch.bfloat16"
//   and PyTorch's aliases are accepted on input).
// - Bytes: base64 with padding (tensor data), lowercase hex (ipc_handle, nccl_unique_id).
// - to_json writes every field, unset optionals as null, except where SGLang's response shape
//   leaves a key out (GenerateReqOutput's logprob arrays, FinishReason's "matched"/"message").
// - A decoder never returns a half-filled struct: it decodes into a local and returns it only
//   when every field validated; on error the caller gets the message and nothing else.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "messages/control.hpp"
#include "messages/expected.hpp"
#include "messages/generate.hpp"
#include "messages/tensor.hpp"
#include "messages/weight_update.hpp"

namespace rlserve {

// Parses JSON text without throwing, whatever the text: every exception of the parser (syntax,
// a number outside double's range such as 1e400, memory) becomes an error value. Errors say
// where when the parser knows: "invalid JSON at byte 17: ...". Nesting
// deeper than k_max_json_depth is refused, so a hostile "[[[[…" cannot exhaust the stack of
// code that walks the value recursively.
inline constexpr int k_max_json_depth = 64;
expected<nlohmann::json> parse_json(std::string_view text);

// Request fields ignored since the process started (top-level keys no decoder knows), and the
// hook that hears each one (its key, "flush_cache"): a front end installs
// its debug log. The hook runs on the decoding thread; it must be cheap and thread-safe.
uint64_t ignored_request_fields();
void on_ignored_request_field(std::function<void(std::string_view field)> hook);
// parse_json for a request a server reads: an "input_ids" array of non-negative 32-bit integers
// is kept compact (a binary value of 4 bytes per id instead of a JSON element of 16 or more,
// read by the codecs like the array) and refused once it holds more than `max_input_ids` ids
// (the model's context length: no more could be served). Any other "input_ids" (a nested list,
// a negative number) stays a plain array, so the codecs say what is wrong with it. The value
// is for decoding only: dumping it does not give the text back.
expected<nlohmann::json> parse_request_json(std::string_view text, std::size_t max_input_ids);

// Decodes and validates a T. Specialized for every type listed below; there is no generic
// definition, so an unsupported T fails at link time.
template <class T>
expected<T> from_json(const nlohmann::json& j);

// ---- generate.hpp -------------------------------------------------------------------------------

// `stop` reads a string or a list of strings and is written as a list.
template <> expected<SamplingParams> from_json<SamplingParams>(const nlohmann::json& j);
nlohmann::json to_json(const SamplingParams& x);

// Exactly one of text / input_ids; one request per message (SGLang's batch forms, a list in
// rid / text / input_ids / sampling_params, are refused with a message saying so).
template <> expected<GenerateReqInput> from_json<GenerateReqInput>(const nlohmann::json& j);
nlohmann::json to_json(const GenerateReqInput& x);

// {"type": "stop"|"length"|"abort", "matched": <token id> | "<stop string>", "message": "..."}
// "matched" only when set, "message" only when non-empty (SGLang's shape). In the impossible
// case that both matched_token and matched_str are set, "matched" holds the token and
// "matched_str" the string, so nothing is lost. SGLang's "length": N is accepted and ignored.
template <> expected<FinishReason> from_json<FinishReason>(const nlohmann::json& j);
nlohmann::json to_json(const FinishReason& x);

// [logprob, token_id], SGLang's tuple shape; a third element (SGLang's token text) is ignored.
template <> expected<TopLogprob> from_json<TopLogprob>(const nlohmann::json& j);
nlohmann::json to_json(const TopLogprob& x);

// SGLang's /generate response shape; struct member -> JSON:
//   text -> "text"                  output_ids -> "output_ids"
//   success -> "success"            message -> "message"          finished -> "finished"
//   rid -> "meta_info.id"           finish_reason -> "meta_info.finish_reason" (object or null)
//   prompt_tokens, completion_tokens, cached_tokens, weight_version, weight_version_start,
//   sampling_seed -> "meta_info.<same name>"
//   weight_version_spans -> "meta_info.weight_version_spans" = [{"weight_version", "first_token"}]
//   output_token_logprobs[i] -> "meta_info.output_token_logprobs"[i] = [logprob, output_ids[i]]
//   output_top_logprobs[i]   -> "meta_info.output_top_logprobs"[i] = [[logprob, token_id], ...]
// The two logprob keys are written only when non-empty. Reading checks that
// output_token_logprobs has one entry per output id and that each entry's token id matches.
template <> expected<GenerateReqOutput> from_json<GenerateReqOutput>(const nlohmann::json& j);
nlohmann::json to_json(const GenerateReqOutput& x);

// One request by rid, or every request (abort_all; then rid may be empty and is ignored).
template <> expected<AbortReq> from_json<AbortReq>(const nlohmann::json& j);
nlohmann::json to_json(const AbortReq& x);
template <> expected<AbortReqOutput> from_json<AbortReqOutput>(const nlohmann::json& j);
nlohmann::json to_json(const AbortReqOutput& x);

// ---- tensor.hpp ---------------------------------------------------------------------------------

// {"dtype": "bfloat16", "shape": [2, 3], "data": "<base64 of 12 bytes>"}; data must decode to
// exactly numel(shape) * element_size(dtype) bytes.
template <> expected<HostTensor> from_json<HostTensor>(const nlohmann::json& j);
nlohmann::json to_json(const HostTensor& x);

// {"name": "...", "dtype": ..., "shape": ..., "data": ...}: the tensor's keys flattened.
template <> expected<NamedTensor> from_json<NamedTensor>(const nlohmann::json& j);
nlohmann::json to_json(const NamedTensor& x);

// {"device": 0, "device_uuid": "GPU-..." | "", "pointer": 0, "ipc_handle": "<hex>" | "",
//  "offset": 0, "nbytes": 0, "dtype": "bfloat16", "shape": [...], "ref_counter_handle": "",
//  "ref_counter_offset": 0, "event_handle": "<128 hex digits>" | "", "event_sync_required": false};
// exactly one of pointer / ipc_handle is set; an ipc_handle is 64 bytes (cudaIpcMemHandle_t) or
// PyTorch's 66 (version 2 or 3, 'c', the 64 bytes); device_uuid is stored as "GPU-" + lowercase
// hex; nbytes 0 means not given, any other value must be numel x element size.
template <> expected<DeviceTensorRef> from_json<DeviceTensorRef>(const nlohmann::json& j);
nlohmann::json to_json(const DeviceTensorRef& x);

// ---- weight_update.hpp --------------------------------------------------------------------------

// {"name": "...", <DeviceTensorRef's keys>}.
template <> expected<NamedDeviceTensor> from_json<NamedDeviceTensor>(const nlohmann::json& j);
nlohmann::json to_json(const NamedDeviceTensor& x);

// The rendezvous is a non-empty nccl_unique_id (256 hex digits = 128 bytes; it wins when both
// are given) or master_address + master_port. 0 <= rank_offset < world_size.
template <>
expected<InitWeightsUpdateGroupReqInput>
from_json<InitWeightsUpdateGroupReqInput>(const nlohmann::json& j);
nlohmann::json to_json(const InitWeightsUpdateGroupReqInput& x);
template <>
expected<InitWeightsUpdateGroupReqOutput>
from_json<InitWeightsUpdateGroupReqOutput>(const nlohmann::json& j);
nlohmann::json to_json(const InitWeightsUpdateGroupReqOutput& x);

template <>
expected<DestroyWeightsUpdateGroupReqInput>
from_json<DestroyWeightsUpdateGroupReqInput>(const nlohmann::json& j);
nlohmann::json to_json(const DestroyWeightsUpdateGroupReqInput& x);
template <>
expected<DestroyWeightsUpdateGroupReqOutput>
from_json<DestroyWeightsUpdateGroupReqOutput>(const nlohmann::json& j);
nlohmann::json to_json(const DestroyWeightsUpdateGroupReqOutput& x);

// names / dtypes / shapes: required, equally long, names unique and non-empty.
template <>
expected<UpdateWeightsFromDistributedReqInput>
from_json<UpdateWeightsFromDistributedReqInput>(const nlohmann::json& j);
nlohmann::json to_json(const UpdateWeightsFromDistributedReqInput& x);
template <>
expected<UpdateWeightsFromDistributedReqOutput>
from_json<UpdateWeightsFromDistributedReqOutput>(const nlohmann::json& j);
nlohmann::json to_json(const UpdateWeightsFromDistributedReqOutput& x);

// named_tensors (inline bytes) and/or device_tensors (CUDA IPC) and/or SGLang's
// serialized_named_tensors (base64 PyTorch IPC pickles, one per engine GPU: element 0 is read by
// messages/torch_pickle.hpp's restricted reader, the others ignored, and its tensors appended to
// device_tensors); names unique across all three.
template <>
expected<UpdateWeightsFromTensorReqInput>
from_json<UpdateWeightsFromTensorReqInput>(const nlohmann::json& j);
nlohmann::json to_json(const UpdateWeightsFromTensorReqInput& x);
template <>
expected<UpdateWeightsFromTensorReqOutput>
from_json<UpdateWeightsFromTensorReqOutput>(const nlohmann::json& j);
nlohmann::json to_json(const UpdateWeightsFromTensorReqOutput& x);

template <>
expected<UpdateWeightFromDiskReqInput>
from_json<UpdateWeightFromDiskReqInput>(const nlohmann::json& j);
nlohmann::json to_json(const UpdateWeightFromDiskReqInput& x);
template <>
expected<UpdateWeightFromDiskReqOutput>
from_json<UpdateWeightFromDiskReqOutput>(const nlohmann::json& j);
nlohmann::json to_json(const UpdateWeightFromDiskReqOutput& x);

template <>
expected<BeginWeightUpdateReqInput> from_json<BeginWeightUpdateReqInput>(const nlohmann::json& j);
nlohmann::json to_json(const BeginWeightUpdateReqInput& x);
template <>
expected<BeginWeightUpdateReqOutput>
from_json<BeginWeightUpdateReqOutput>(const nlohmann::json& j);
nlohmann::json to_json(const BeginWeightUpdateReqOutput& x);

template <>
expected<EndWeightUpdateReqInput> from_json<EndWeightUpdateReqInput>(const nlohmann::json& j);
nlohmann::json to_json(const EndWeightUpdateReqInput& x);
template <>
expected<EndWeightUpdateReqOutput> from_json<EndWeightUpdateReqOutput>(const nlohmann::json& j);
nlohmann::json to_json(const EndWeightUpdateReqOutput& x);

// Also reads generation 1's "restore_weights_before_load" (an error if both spellings are
// given and disagree); writes restore_weights_before_loading.
template <>
expected<PostProcessWeightsReqInput>
from_json<PostProcessWeightsReqInput>(const nlohmann::json& j);
nlohmann::json to_json(const PostProcessWeightsReqInput& x);
template <>
expected<PostProcessWeightsReqOutput>
from_json<PostProcessWeightsReqOutput>(const nlohmann::json& j);
nlohmann::json to_json(const PostProcessWeightsReqOutput& x);

template <>
expected<UpdateWeightVersionReqInput>
from_json<UpdateWeightVersionReqInput>(const nlohmann::json& j);
nlohmann::json to_json(const UpdateWeightVersionReqInput& x);
template <>
expected<UpdateWeightVersionReqOutput>
from_json<UpdateWeightVersionReqOutput>(const nlohmann::json& j);
nlohmann::json to_json(const UpdateWeightVersionReqOutput& x);

template <> expected<CheckWeightsReqInput> from_json<CheckWeightsReqInput>(const nlohmann::json& j);
nlohmann::json to_json(const CheckWeightsReqInput& x);
template <> expected<ParallelismInfo> from_json<ParallelismInfo>(const nlohmann::json& j);
nlohmann::json to_json(const ParallelismInfo& x);
// checksums / role_checksums are JSON objects (name -> hex digest).
template <> expected<ChecksumInfo> from_json<ChecksumInfo>(const nlohmann::json& j);
nlohmann::json to_json(const ChecksumInfo& x);
// payload -> "ranks" (SGLang's HTTP reply names the per-GPU list so; "payload" is read too);
// "per_engine_checksum" only when set.
template <>
expected<CheckWeightsReqOutput> from_json<CheckWeightsReqOutput>(const nlohmann::json& j);
nlohmann::json to_json(const CheckWeightsReqOutput& x);

template <>
expected<GetWeightsByNameReqInput> from_json<GetWeightsByNameReqInput>(const nlohmann::json& j);
nlohmann::json to_json(const GetWeightsByNameReqInput& x);
// The member `type` is written as "dtype", as for tensors.
template <>
expected<GetWeightsByNameReqOutput>
from_json<GetWeightsByNameReqOutput>(const nlohmann::json& j);
nlohmann::json to_json(const GetWeightsByNameReqOutput& x);

// ---- control.hpp --------------------------------------------------------------------------------

template <>
expected<PauseGenerationReqInput> from_json<PauseGenerationReqInput>(const nlohmann::json& j);
nlohmann::json to_json(const PauseGenerationReqInput& x);
template <>
expected<PauseGenerationReqOutput> from_json<PauseGenerationReqOutput>(const nlohmann::json& j);
nlohmann::json to_json(const PauseGenerationReqOutput& x);

template <>
expected<ContinueGenerationReqInput>
from_json<ContinueGenerationReqInput>(const nlohmann::json& j);
nlohmann::json to_json(const ContinueGenerationReqInput& x);
template <>
expected<ContinueGenerationReqOutput>
from_json<ContinueGenerationReqOutput>(const nlohmann::json& j);
nlohmann::json to_json(const ContinueGenerationReqOutput& x);

template <> expected<FlushCacheReqInput> from_json<FlushCacheReqInput>(const nlohmann::json& j);
nlohmann::json to_json(const FlushCacheReqInput& x);
template <> expected<FlushCacheReqOutput> from_json<FlushCacheReqOutput>(const nlohmann::json& j);
nlohmann::json to_json(const FlushCacheReqOutput& x);
template <> expected<ReleaseMemoryOccupationReqInput> from_json<ReleaseMemoryOccupationReqInput>(const nlohmann::json& j);
nlohmann::json to_json(const ReleaseMemoryOccupationReqInput& x);
template <> expected<ReleaseMemoryOccupationReqOutput> from_json<ReleaseMemoryOccupationReqOutput>(const nlohmann::json& j);
nlohmann::json to_json(const ReleaseMemoryOccupationReqOutput& x);
template <> expected<ResumeMemoryOccupationReqInput> from_json<ResumeMemoryOccupationReqInput>(const nlohmann::json& j);
nlohmann::json to_json(const ResumeMemoryOccupationReqInput& x);
template <> expected<ResumeMemoryOccupationReqOutput> from_json<ResumeMemoryOccupationReqOutput>(const nlohmann::json& j);
nlohmann::json to_json(const ResumeMemoryOccupationReqOutput& x);

template <>
expected<GetServerInfoReqInput> from_json<GetServerInfoReqInput>(const nlohmann::json& j);
nlohmann::json to_json(const GetServerInfoReqInput& x);
template <>
expected<GetServerInfoReqOutput> from_json<GetServerInfoReqOutput>(const nlohmann::json& j);
nlohmann::json to_json(const GetServerInfoReqOutput& x);

template <> expected<HealthCheckReqInput> from_json<HealthCheckReqInput>(const nlohmann::json& j);
nlohmann::json to_json(const HealthCheckReqInput& x);
template <>
expected<HealthCheckReqOutput> from_json<HealthCheckReqOutput>(const nlohmann::json& j);
nlohmann::json to_json(const HealthCheckReqOutput& x);

} // namespace rlserve
