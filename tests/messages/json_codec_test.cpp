// JSON codecs (messages/json_codec.hpp): every public type round-trips with every field set;
// missing keys and nulls mean defaults; and a table of malformed bodies, each of which must be
// refused with a message naming the field path and the offending value.
#include <boost/test/unit_test.hpp>

#include <cctype>
#include <cmath>
#include <deque>
#include <typeinfo>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <boost/core/demangle.hpp>
#include <nlohmann/json.hpp>

#include "message_samples.hpp"
#include "messages/base64.hpp"
#include "messages/json_codec.hpp"
#include "messages/validate.hpp"

using namespace rlserve;
using namespace rlserve_test;
using nlohmann::json;

namespace {

template <class... Ts>
struct type_list {};

// Every type json_codec.hpp declares a codec for.
using public_types = type_list<
  SamplingParams, GenerateReqInput, FinishReason, TopLogprob, GenerateReqOutput, AbortReq,
  AbortReqOutput, HostTensor, NamedTensor, DeviceTensorRef, NamedDeviceTensor,
  InitWeightsUpdateGroupReqInput, InitWeightsUpdateGroupReqOutput,
  DestroyWeightsUpdateGroupReqInput, DestroyWeightsUpdateGroupReqOutput,
  UpdateWeightsFromDistributedReqInput, UpdateWeightsFromDistributedReqOutput,
  UpdateWeightsFromTensorReqInput, UpdateWeightsFromTensorReqOutput, UpdateWeightFromDiskReqInput,
  UpdateWeightFromDiskReqOutput, BeginWeightUpdateReqInput, BeginWeightUpdateReqOutput,
  EndWeightUpdateReqInput, EndWeightUpdateReqOutput, PostProcessWeightsReqInput,
  PostProcessWeightsReqOutput, UpdateWeightVersionReqInput, UpdateWeightVersionReqOutput,
  CheckWeightsReqInput, ParallelismInfo, ChecksumInfo, CheckWeightsReqOutput,
  GetWeightsByNameReqInput, GetWeightsByNameReqOutput, PauseGenerationReqInput,
  PauseGenerationReqOutput, ContinueGenerationReqInput, ContinueGenerationReqOutput,
  FlushCacheReqInput, FlushCacheReqOutput, GetServerInfoReqInput, GetServerInfoReqOutput,
  HealthCheckReqInput, HealthCheckReqOutput>;

template <class T>
std::string label_of() {
  return boost::core::demangle(typeid(T).name());
}

// The decoder's error, or nullopt when it accepted the body. A codec returns either a complete
// value or only an error (never a struct with some fields applied), so "refused" is simply
// "has no value".
template <class T>
std::optional<std::string> error_of(const json& j) {
  auto r = from_json<T>(j);
  if (r)
    return std::nullopt;
  return r.error();
}

template <class T>
void check_json_roundtrip(const T& x, const std::string& label) {
  const json j = to_json(x);
  auto back = from_json<T>(j);
  BOOST_TEST_REQUIRE(back.has_value(), label << ": refused its own encoding: "
                                             << error_text(back) << "\n  " << j.dump());
  BOOST_TEST((*back == x), label << ": round trip changed the value: " << j.dump());
  BOOST_TEST(to_json(*back) == j, label << ": re-encoding differs");
  // Through text, as the websocket carries it: floats must survive printing and parsing.
  auto reparsed = parse_json(j.dump());
  BOOST_TEST_REQUIRE(reparsed.has_value());
  auto from_text = from_json<T>(*reparsed);
  BOOST_TEST_REQUIRE(from_text.has_value(), label << ": " << error_text(from_text));
  BOOST_TEST((*from_text == x), label << ": text round trip changed the value: " << j.dump());
}

template <class T>
void check_type_roundtrips() {
  const auto label = label_of<T>();
  const auto xs = samples<T>::json();
  int i = 0;
  for (const auto& x : xs)
    check_json_roundtrip(x, label + " sample " + std::to_string(i++));
  // Between them the samples set every field that JSON can carry to a non-default value.
  auto uncovered = uncovered_fields(xs);
  auto allowed = samples<T>::json_default_only();
  BOOST_TEST(uncovered == allowed, label << ": fields no JSON sample sets: "
                                         << json(uncovered).dump());
}

template <class... Ts>
void check_all_roundtrips(type_list<Ts...>) {
  (check_type_roundtrips<Ts>(), ...);
}

// Keys that must be present (null counts as missing) per type; every other key of to_json()
// may be left out or null and then reads as the default.
template <class T>
std::set<std::string> required_keys() {
  if constexpr (std::is_same_v<T, HostTensor>)
    return {"dtype", "shape", "data"};
  else if constexpr (std::is_same_v<T, NamedTensor>)
    return {"name", "dtype", "shape", "data"};
  else if constexpr (std::is_same_v<T, DeviceTensorRef>)
    return {"dtype", "shape"};
  else if constexpr (std::is_same_v<T, NamedDeviceTensor>)
    return {"name", "dtype", "shape"};
  else if constexpr (std::is_same_v<T, InitWeightsUpdateGroupReqInput>)
    return {"rank_offset", "world_size"};
  else if constexpr (std::is_same_v<T, UpdateWeightsFromDistributedReqInput>)
    return {"names", "dtypes", "shapes"};
  else if constexpr (std::is_same_v<T, UpdateWeightFromDiskReqInput>)
    return {"model_path"};
  else if constexpr (std::is_same_v<T, UpdateWeightVersionReqInput>)
    return {"new_version"};
  else if constexpr (std::is_same_v<T, GetWeightsByNameReqInput>)
    return {"name"};
  else if constexpr (std::is_same_v<T, FinishReason>)
    return {"type"};
  else
    return {};
}

// Leaving out (or nulling) one key of a valid body gives that key's default and changes
// nothing else; for a required key it is an error naming the key.
template <class T>
void check_missing_and_null_keys(const T& sample, const std::string& label) {
  const json full = to_json(sample);
  const json defaults = to_json(T{});
  const auto required = required_keys<T>();
  for (const auto& item : full.items()) {
    const auto& key = item.key();
    for (bool as_null : {false, true}) {
      json body = full;
      if (as_null)
        body[key] = nullptr;
      else
        body.erase(key);
      auto err = error_of<T>(body);
      const std::string what = label + (as_null ? " with null " : " without ") + key;
      if (required.count(key)) {
        BOOST_TEST_REQUIRE(err.has_value(), what << ": accepted");
        BOOST_TEST(*err == key + ": required field is missing", what << ": " << *err);
        continue;
      }
      BOOST_TEST_REQUIRE(!err.has_value(), what << ": " << err.value_or(""));
      json expected = full;
      if (defaults.contains(key))
        expected[key] = defaults[key];
      else
        expected.erase(key); // a key to_json writes only when set
      BOOST_TEST(to_json(*from_json<T>(body)) == expected, what << ": " << body.dump());
    }
  }
}

// The sample whose keys are dropped one by one: one where every key is independent.
template <class T>
T droppable_sample() {
  if constexpr (std::is_same_v<T, GenerateReqOutput>)
    return samples<T>::sparse(); // full() has logprobs tied to output_ids
  else if constexpr (std::is_same_v<T, FinishReason>)
    return samples<T>::json()[1]; // matched_token only: "matched" maps back one to one
  else
    return samples<T>::json().front();
}

template <class T>
void check_defaults() {
  const auto label = label_of<T>();
  if (required_keys<T>().empty()) {
    for (const json& body : {json::object(), json(nullptr)}) {
      auto x = from_json<T>(body);
      BOOST_TEST_REQUIRE(x.has_value(), label << " from " << body.dump() << ": " << error_text(x));
      BOOST_TEST((*x == T{}), label << " from " << body.dump() << " is not the default");
    }
  }
  check_missing_and_null_keys(droppable_sample<T>(), label);
}

// Object-shaped types whose keys can each be dropped on their own. GenerateReqInput,
// DeviceTensorRef and NamedDeviceTensor have either-or rules and get their own cases below.
using droppable_types = type_list<
  SamplingParams, FinishReason, GenerateReqOutput, AbortReq, AbortReqOutput, HostTensor,
  NamedTensor, InitWeightsUpdateGroupReqInput, InitWeightsUpdateGroupReqOutput, DestroyWeightsUpdateGroupReqInput,
  DestroyWeightsUpdateGroupReqOutput, UpdateWeightsFromDistributedReqInput,
  UpdateWeightsFromDistributedReqOutput, UpdateWeightsFromTensorReqInput,
  UpdateWeightsFromTensorReqOutput, UpdateWeightFromDiskReqInput, UpdateWeightFromDiskReqOutput,
  BeginWeightUpdateReqInput, BeginWeightUpdateReqOutput, EndWeightUpdateReqInput,
  EndWeightUpdateReqOutput, PostProcessWeightsReqInput, PostProcessWeightsReqOutput,
  UpdateWeightVersionReqInput, UpdateWeightVersionReqOutput, CheckWeightsReqInput,
  ParallelismInfo, ChecksumInfo, CheckWeightsReqOutput, GetWeightsByNameReqInput,
  GetWeightsByNameReqOutput, PauseGenerationReqInput, PauseGenerationReqOutput,
  ContinueGenerationReqInput, ContinueGenerationReqOutput, FlushCacheReqInput,
  FlushCacheReqOutput, GetServerInfoReqInput, GetServerInfoReqOutput, HealthCheckReqInput,
  HealthCheckReqOutput>;

template <class... Ts>
void check_all_defaults(type_list<Ts...>) {
  (check_defaults<Ts>(), ...);
}

// ---- the malformed-input table ------------------------------------------------------------------

using decoder = std::optional<std::string> (*)(const json&);

struct bad_case {
  const char* label;
  decoder decode;
  const char* body;
  // Each must occur in the error; the first is the start of the message (the field path).
  std::vector<std::string> expect;
};

const std::string k_uid = nccl_unique_id_hex();

std::string tensor_body(const std::string& tensor_json) {
  return R"({"named_tensors": [)" + tensor_json + "]}";
}

std::string init_group_body(const std::string& extra) {
  return R"({"rank_offset": 1, "world_size": 2)" + extra + "}";
}

std::string device_tensor_body(const std::string& fields) {
  return R"({"device_tensors": [{"name": "w", "dtype": "bfloat16", "shape": [2])" + fields +
         "}]}";
}

std::string distributed_body(const std::string& names, const std::string& dtypes,
                             const std::string& shapes) {
  return R"({"names": )" + names + R"(, "dtypes": )" + dtypes + R"(, "shapes": )" + shapes + "}";
}

// Storage for bodies built at run time (the table holds const char*); a deque never moves
// its elements, so the pointers stay valid.
std::deque<std::string>& owned() {
  static std::deque<std::string> strings;
  return strings;
}

const char* keep(std::string s) {
  owned().push_back(std::move(s));
  return owned().back().c_str();
}

std::vector<bad_case> bad_cases() {
  auto gen = &error_of<GenerateReqInput>;
  auto sp = &error_of<SamplingParams>;
  auto dist = &error_of<UpdateWeightsFromDistributedReqInput>;
  auto tens = &error_of<UpdateWeightsFromTensorReqInput>;
  auto init = &error_of<InitWeightsUpdateGroupReqInput>;
  auto disk = &error_of<UpdateWeightFromDiskReqInput>;
  auto check = &error_of<CheckWeightsReqInput>;
  auto pause = &error_of<PauseGenerationReqInput>;
  auto begin = &error_of<BeginWeightUpdateReqInput>;
  auto by_name = &error_of<GetWeightsByNameReqInput>;
  auto out = &error_of<GenerateReqOutput>;
  const std::string ok_w = R"({"name": "w", "dtype": "bfloat16", "shape": [2, 3], "data": )";
  return {
    // -- required fields missing (or null, which is the same)
    {"disk model_path", disk, "{}", {"model_path: required field is missing"}},
    {"disk model_path null", disk, R"({"model_path": null})", {"model_path: required field"}},
    {"init rank_offset", init, R"({"world_size": 2, "nccl_unique_id": "00"})",
     {"rank_offset: required field is missing"}},
    {"init world_size", init, R"({"rank_offset": 0, "master_address": "h", "master_port": 1})",
     {"world_size: required field is missing"}},
    {"version new_version", &error_of<UpdateWeightVersionReqInput>, "{}",
     {"new_version: required field is missing"}},
    {"by_name name", by_name, R"({"truncate_size": 3})", {"name: required field is missing"}},
    {"dist names", dist, R"({"dtypes": [], "shapes": []})", {"names: required field is missing"}},
    {"dist dtypes", dist, R"({"names": [], "shapes": []})", {"dtypes: required field is missing"}},
    {"dist shapes", dist, R"({"names": [], "dtypes": []})", {"shapes: required field is missing"}},
    {"tensor data", tens, keep(tensor_body(R"({"name": "w", "dtype": "int8", "shape": [1]})")),
     {"named_tensors[0].data: required field is missing"}},
    {"tensor name", tens, keep(tensor_body(R"({"dtype": "int8", "shape": [1], "data": "AA=="})")),
     {"named_tensors[0].name: required field is missing"}},

    // -- wrong JSON types
    {"string for number", gen, R"({"text": "a", "sampling_params": {"temperature": "hot"}})",
     {R"(sampling_params.temperature: expected a number, got "hot")"}},
    {"number for bool", gen, R"({"text": "a", "stream": 1})",
     {"stream: expected a boolean, got 1"}},
    {"string for bool", disk, R"({"model_path": "/m", "flush_cache": "yes"})",
     {R"(flush_cache: expected a boolean, got "yes")"}},
    {"object for list", sp, R"({"stop_token_ids": {"a": 1}})",
     {R"(stop_token_ids: expected a list, got {"a":1})"}},
    {"float for int", sp, R"({"max_new_tokens": 1.5})",
     {"max_new_tokens: expected an integer, got 1.5"}},
    {"negative for unsigned", sp, R"({"sampling_seed": -1})",
     {"sampling_seed: expected an integer in 0..18446744073709551615, got -1"}},
    {"uint64 overflow", sp, R"({"sampling_seed": 18446744073709551616})",
     {"sampling_seed: expected an integer in 0..18446744073709551615, got 1.8446744073709552e+19"}},
    {"string for object", gen, R"({"text": "a", "sampling_params": "greedy"})",
     {R"(sampling_params: expected an object, got "greedy")"}},
    {"list for string", disk, R"({"model_path": ["/m"]})",
     {R"(model_path: expected a non-empty string, got ["/m"])"}},
    {"number for string", gen, R"({"text": 5})", {"text: expected a string, got 5"}},
    {"body not an object", gen, "[1, 2]", {"expected an object, got [1,2]"}},
    {"element type", gen, R"({"input_ids": [1, "2"]})",
     {R"(input_ids[1]: expected an integer, got "2")"}},
    {"dtype not a string", dist, keep(distributed_body(R"(["a"])", "[16]", "[[1]]")),
     {"dtypes[0]: expected a dtype name"}},
    {"finish_reason matched", out, R"({"meta_info": {"finish_reason": {"type": "stop", "matched": true}}})",
     {"meta_info.finish_reason.matched: expected a token id or a stop string, got true"}},

    // -- enums
    {"selector", begin, R"({"selector": "drafts"})",
     {R"(selector: unknown value "drafts" (expected "target", "draft" or "all"))"}},
    {"mode", pause, R"({"mode": "later"})",
     {R"(mode: unknown value "later" (expected "abort", "retract", "in_place" or "drain"))"}},
    {"action", check, R"({"action": "checksums"})",
     {R"(action: unknown value "checksums" (expected "checksum", "snapshot", "compare" or "reset_tensors"))"}},
    {"selector case", begin, R"({"selector": "Target"})", {R"(selector: unknown value "Target")"}},
    {"selector number", begin, R"({"selector": 2})", {"selector: expected a string, got 2"}},

    // -- shapes, lengths, dtypes
    {"negative dimension", dist,
     keep(distributed_body(R"(["a", "b", "c"])", R"(["int8", "int8", "int8"])", "[[2], [-3], [4]]")),
     {"shapes[1][0]: negative dimension -3"}},
    {"element overflow", dist,
     keep(distributed_body(R"(["a", "b", "c"])", R"(["int8", "int8", "int8"])",
                           "[[1], [2], [1099511627776, 1099511627776]]")),
     {"shapes[2]: 1099511627776 x 1099511627776 elements overflow int64"}},
    {"byte overflow", dist, keep(distributed_body(R"(["a"])", R"(["float32"])", "[[4611686018427387904]]")),
     {"shapes[0]: 4611686018427387904 elements x 4 bytes (float32) overflow int64"}},
    {"dimension float", dist, keep(distributed_body(R"(["a"])", R"(["int8"])", "[[1.5]]")),
     {"shapes[0][0]: expected an integer, got 1.5"}},
    {"shape not a list", dist, keep(distributed_body(R"(["a"])", R"(["int8"])", "[3]")),
     {"shapes[0]: expected a list, got 3"}},
    {"lengths", dist,
     keep(distributed_body(R"(["a", "b", "c"])", R"(["int8", "int8"])", "[[1], [1], [1]]")),
     {"names, dtypes and shapes have different lengths (3, 2, 3)"}},
    {"duplicate name", dist,
     keep(distributed_body(R"(["a", "b", "a"])", R"(["int8", "int8", "int8"])", "[[1], [1], [1]]")),
     {R"(names[2]: duplicate of names[0] ("a"))"}},
    {"empty name", dist, keep(distributed_body(R"([""])", R"(["int8"])", "[[1]]")),
     {R"(names[0]: expected a non-empty string, got "")"}},
    {"unknown dtype", dist, keep(distributed_body(R"(["a"])", R"(["bf16x"])", "[[1]]")),
     {R"(dtypes[0]: unknown dtype "bf16x")"}},
    {"tensor dtype", tens, keep(tensor_body(R"({"name": "w", "dtype": "bfloat", "shape": [1], "data": "AAA="})")),
     {R"(named_tensors[0].dtype: unknown dtype "bfloat")"}},

    // -- generate: text / input_ids, batches
    {"both", gen, R"({"text": "a", "input_ids": [1]})",
     {"text and input_ids are both set; send exactly one"}},
    {"neither", gen, R"({"sampling_params": {}})", {"neither text nor input_ids is set"}},
    {"neither (nulls)", gen, R"({"text": null, "input_ids": null})",
     {"neither text nor input_ids is set"}},
    {"empty input_ids", gen, R"({"input_ids": []})", {"input_ids: empty"}},
    {"negative token", gen, R"({"input_ids": [5, -1]})",
     {"input_ids[1]: expected an integer in 0..2147483647, got -1"}},
    {"batch text", gen, R"({"text": ["a", "b"]})",
     {"text: a list is SGLang's batch form; rlserve takes one request per message", R"(["a","b"])"}},
    {"batch input_ids", gen, R"({"input_ids": [[1, 2], [3]]})",
     {"input_ids: a list is SGLang's batch form", "[[1,2],[3]]"}},
    {"batch rid", gen, R"({"rid": ["r1", "r2"], "text": "a"})",
     {"rid: a list is SGLang's batch form", R"(["r1","r2"])"}},
    {"batch sampling_params", gen, R"({"text": "a", "sampling_params": [{}, {}]})",
     {"sampling_params: a list is SGLang's batch form"}},
    {"empty rid", gen, R"({"rid": "", "text": "a"})",
     {R"(rid: expected a non-empty string, got "")"}},
    {"abort batch", &error_of<AbortReq>, R"({"rid": ["a"]})",
     {"rid: a list is SGLang's batch form"}},

    // -- unknown keys
    {"typo in sampling_params", gen, R"({"text": "a", "sampling_params": {"max_tokens": 5}})",
     {"sampling_params.max_tokens: unknown field"}},
    {"unknown key in a tensor", tens,
     keep(tensor_body(R"({"name": "w", "dtype": "int8", "shape": [1], "data": "AA==", "extra": 1})")),
     {"named_tensors[0].extra: unknown field"}},
    {"unknown key in a nested sampling_params of generate", gen,
     R"({"text": "a", "future_flag": 1, "sampling_params": {"temprature": 0}})",
     {"sampling_params.temprature: unknown field"}},

    // -- SGLang features rlserve does not implement
    {"lora_path", gen, R"({"text": "a", "lora_path": "adapter"})",
     {R"(lora_path: not supported by rlserve (got "adapter"))"}},
    {"return_hidden_states", gen, R"({"text": "a", "return_hidden_states": true})",
     {"return_hidden_states: not supported by rlserve (got true)"}},
    // miles' distillation teacher (a patched SGLang): per-position logprobs of given token ids.
    {"token_ids_logprob_positions", gen, R"({"text": "a", "token_ids_logprob_positions": [[0, 1]]})",
     {"token_ids_logprob_positions: not supported by rlserve"}},
    {"input_embeds", gen, R"({"input_embeds": [[0.1]]})",
     {"input_embeds: not supported by rlserve (got [[0.1]]); send text or input_ids"}},
    {"regex", gen, R"({"text": "a", "sampling_params": {"regex": "a+"}})",
     {R"(sampling_params.regex: not supported by rlserve (got "a+"))"}},
    // slime's top-p replay switch (sglang_rollout.py sends it whenever --rollout-top-p < 1): a
    // bool or null; anything else is refused rather than read as SGLang's truthiness.
    {"top-p replay not a bool", gen,
     R"({"input_ids": [1], "sampling_params": {"top_p": 0.9, "custom_params": {"return_top_p_token_ids": "yes"}}})",
     {R"(sampling_params.custom_params.return_top_p_token_ids: expected true, false or null, got "yes")"}},
    // miles' DSA indexer replay: no served model has an indexer (false is inert).
    {"indexer replay", gen, R"({"input_ids": [1], "return_indexer_topk": true})",
     {"return_indexer_topk: not supported by rlserve (got true); no model rlserve serves has a DSA indexer"}},
    {"custom_params not an object", sp, R"({"custom_params": [1]})",
     {"custom_params: expected an object, got [1]"}},
    {"logit_bias", sp, R"({"logit_bias": {"42": -100}})",
     {R"(logit_bias: not supported by rlserve (got {"42":-100}))"}},
    {"json_schema", sp, R"({"json_schema": "{}"})", {"json_schema: not supported by rlserve"}},
    // -- serialized_named_tensors: base64 PyTorch pickles (torch_pickle_test reads real ones)
    {"serialized not a list", tens, R"({"serialized_named_tensors": "gASV"})",
     {R"(serialized_named_tensors: expected a list, got "gASV")"}},
    {"serialized empty", tens, R"({"serialized_named_tensors": []})",
     {"serialized_named_tensors: empty; expected one base64 pickle per engine GPU"}},
    {"serialized not a string", tens, R"({"serialized_named_tensors": ["gASV", 7]})",
     {"serialized_named_tensors[1]: expected a base64 string, got 7"}},
    {"serialized base64", tens, R"({"serialized_named_tensors": ["gAS*"]})",
     {"serialized_named_tensors[0]: invalid base64 character '*' at offset 3"}},
    {"serialized truncated", tens, R"({"serialized_named_tensors": ["gASV"]})",
     {"serialized_named_tensors[0]: byte 2: the pickle ends inside FRAME"}},
    {"serialized os.system", tens, R"({"serialized_named_tensors": ["Y29zCnN5c3RlbQooUydscycKdFIu"]})",
     {"serialized_named_tensors[0]: byte 0: global os.system (GLOBAL) is not allowed"}},
    {"disable_draft_model", dist, R"({"names": [], "dtypes": [], "shapes": [], "disable_draft_model": true})",
     {"disable_draft_model: not supported by rlserve (got true)", "selector"}},
    {"manifest", disk, R"({"model_path": "/m", "manifest": {"a": 1}})",
     {"manifest: not supported by rlserve"}},
    {"backend", init, keep(init_group_body(R"(, "nccl_unique_id": ")" + k_uid + R"(", "backend": "gloo")")),
     {R"(backend: not supported by rlserve (got "gloo"))"}},
    {"load_format distributed", dist, R"({"names": [], "dtypes": [], "shapes": [], "load_format": "pt"})",
     {R"(load_format: unknown value "pt" (expected "flattened_bucket", or null))"}},
    {"load_format disk", disk, R"({"model_path": "/m", "load_format": "gguf"})",
     {R"(load_format: unknown value "gguf")"}},

    // -- base64 payloads and byte counts
    {"base64 length", tens, keep(tensor_body(ok_w + R"("AAAAAAAAAAAAAAAA="})")),
     {"named_tensors[0].data: base64 length 17 is not a multiple of 4"}},
    {"base64 character", tens, keep(tensor_body(ok_w + R"("AAAA*AAAAAAAAAAA"})")),
     {"named_tensors[0].data: invalid base64 character '*' at offset 4"}},
    {"base64 whitespace", tens, keep(tensor_body(ok_w + R"("AAAA\nAAAAAAAAAAA"})")),
     {"named_tensors[0].data: invalid base64 character byte 0x0a at offset 4"}},
    {"base64 padding", tens, keep(tensor_body(ok_w + R"("AA=AAAAAAAAAAAAA"})")),
     {"named_tensors[0].data: misplaced '=' padding at offset 2"}},
    {"byte count", tens, keep(tensor_body(ok_w + R"("AAAAAAAAAAAAAA=="})")),
     {R"(named_tensors[0].data: tensor "w" has 10 bytes, but shape [2, 3] of bfloat16 needs 12)"}},
    {"byte count (empty shape)", tens,
     keep(tensor_body(R"({"name": "s", "dtype": "float32", "shape": [], "data": ""})")),
     {R"(named_tensors[0].data: tensor "s" has 0 bytes, but shape [] of float32 needs 4)"}},
    {"duplicate tensor", tens,
     keep(R"({"named_tensors": [{"name": "w", "dtype": "int8", "shape": [1], "data": "AA=="}],
             "device_tensors": [{"name": "w", "dtype": "int8", "shape": [1], "pointer": 1}]})"),
     {R"(device_tensors[0].name: duplicate of named_tensors[0].name ("w"))"}},

    // -- hex: nccl_unique_id, ipc_handle
    {"uid bad digit", init, keep(init_group_body(R"(, "nccl_unique_id": "zz)" + k_uid.substr(2) + "\"")),
     {"nccl_unique_id: invalid hex digit 'z' at offset 0"}},
    {"uid short", init, keep(init_group_body(R"(, "nccl_unique_id": "0123456789")")),
     {"nccl_unique_id: expected 128 bytes (256 hex digits), got 5 bytes"}},
    {"uid odd", init, keep(init_group_body(R"(, "nccl_unique_id": "abc")")),
     {"nccl_unique_id: odd hex length 3"}},
    {"ipc bad digit", tens, keep(device_tensor_body(R"(, "ipc_handle": "0g")")),
     {"device_tensors[0].ipc_handle: invalid hex digit 'g' at offset 1"}},
    {"ipc short", tens, keep(device_tensor_body(R"(, "ipc_handle": "0011")")),
     {"device_tensors[0].ipc_handle: 2 bytes; expected 64 (cudaIpcMemHandle_t) or 66"}},
    {"ipc expandable", tens, keep(device_tensor_body(R"(, "ipc_handle": "0265)" + std::string(128, 'a') + "\"")),
     {"device_tensors[0].ipc_handle: this handle is an expandable segment (type 'e')",
      "unset expandable_segments"}},
    {"ipc version", tens, keep(device_tensor_body(R"(, "ipc_handle": "0463)" + std::string(128, 'a') + "\"")),
     {"device_tensors[0].ipc_handle: handle version 4; rlserve reads versions 2 and 3"}},
    {"nbytes", tens, keep(device_tensor_body(R"(, "pointer": 1, "nbytes": 2)")),
     {R"(device_tensors[0].nbytes: tensor "w" has nbytes 2, but shape [2] of bfloat16 is 4 bytes)"}},
    {"device_uuid", tens, keep(device_tensor_body(R"(, "pointer": 1, "device_uuid": "GPU-0")")),
     {R"(device_tensors[0].device_uuid: "GPU-0" is not a GPU UUID)"}},
    {"ref_counter_handle", tens, keep(device_tensor_body(R"(, "pointer": 1, "ref_counter_handle": "/../etc/x")")),
     {R"(device_tensors[0].ref_counter_handle: "/../etc/x" is not a shared-memory name)"}},
    {"event_handle", tens, keep(device_tensor_body(R"(, "pointer": 1, "event_handle": "00")")),
     {"device_tensors[0].event_handle: expected 64 bytes (128 hex digits), got 1 bytes"}},
    {"event_sync_required", tens, keep(device_tensor_body(R"(, "pointer": 1, "event_sync_required": true)")),
     {"device_tensors[0].event_sync_required: true without an event_handle to wait for"}},
    {"ipc and pointer", tens,
     keep(device_tensor_body(R"(, "pointer": 4096, "ipc_handle": ")" + std::string(128, 'a') + "\"")),
     {"device_tensors[0]: pointer and ipc_handle are both set"}},
    {"neither ipc nor pointer", tens, keep(device_tensor_body("")),
     {"device_tensors[0]: neither pointer nor ipc_handle is set"}},
    {"device negative", tens, keep(device_tensor_body(R"(, "pointer": 1, "device": -1)")),
     {"device_tensors[0].device: expected an integer in 0..2147483647, got -1"}},

    // -- ranges
    {"max_new_tokens < 0", sp, R"({"max_new_tokens": -1})",
     {"max_new_tokens: expected an integer in 0..2147483647, got -1"}},
    {"max_new_tokens int32 overflow", sp, R"({"max_new_tokens": 2147483648})",
     {"max_new_tokens: expected an integer in 0..2147483647, got 2147483648"}},
    {"top_k 0", sp, R"({"top_k": 0})",
     {"top_k: expected -1 (the whole vocabulary) or an integer >= 1, got 0"}},
    {"top_k -2", sp, R"({"top_k": -2})", {"top_k: expected -1", "got -2"}},
    {"temperature < 0", sp, R"({"temperature": -0.5})",
     {"temperature: expected a number >= 0, got -0.5"}},
    {"temperature float32", sp, R"({"temperature": 1e300})",
     {"temperature: expected a number that fits in float32, got 1e+300"}},
    {"top_p 0", sp, R"({"top_p": 0})", {"top_p: expected a number in (0, 1], got 0"}},
    {"top_p > 1", sp, R"({"top_p": 1.5})", {"top_p: expected a number in (0, 1], got 1.5"}},
    {"min_p > 1", sp, R"({"min_p": 1.01})", {"min_p: expected a number in [0, 1], got 1.01"}},
    {"min_p < 0", sp, R"({"min_p": -0.1})", {"min_p: expected a number in [0, 1], got -0.1"}},
    {"n 0", sp, R"({"n": 0})", {"n: expected an integer in 1..2147483647, got 0"}},
    {"frequency_penalty", sp, R"({"frequency_penalty": 2.5})",
     {"frequency_penalty: expected a number in [-2, 2], got 2.5"}},
    {"repetition_penalty", sp, R"({"repetition_penalty": 0})",
     {"repetition_penalty: expected a number in (0, 2], got 0"}},
    {"min_new_tokens > max", sp, R"({"max_new_tokens": 4, "min_new_tokens": 5})",
     {"min_new_tokens: expected at most max_new_tokens (4), got 5"}},
    {"stop token id", sp, R"({"stop_token_ids": [-7]})",
     {"stop_token_ids[0]: expected an integer in 0..2147483647, got -7"}},
    {"stop type", sp, R"({"stop": 5})", {"stop: expected a string or a list of strings, got 5"}},
    {"stop empty", sp, R"({"stop": ["a", ""]})", {R"(stop[1]: expected a non-empty string, got "")"}},
    {"logprob_start_len", gen, R"({"text": "a", "logprob_start_len": -2})",
     {"logprob_start_len: expected an integer in -1..2147483647, got -2"}},
    {"top_logprobs_num", gen, R"({"text": "a", "top_logprobs_num": -1})",
     {"top_logprobs_num: expected an integer in 0..2147483647, got -1"}},
    {"truncate_size", by_name, R"({"name": "w", "truncate_size": -1})",
     {"truncate_size: expected an integer in 0..2147483647, got -1"}},
    {"master_port high", init, keep(init_group_body(R"(, "master_address": "h", "master_port": 70000)")),
     {"master_port: expected an integer in 0..65535, got 70000"}},
    {"master_port negative", init, keep(init_group_body(R"(, "master_address": "h", "master_port": -1)")),
     {"master_port: expected an integer in 0..65535, got -1"}},
    {"master_port zero", init, keep(init_group_body(R"(, "master_address": "h", "master_port": 0)")),
     {"master_port: expected a port in 1..65535 to connect to, got 0"}},
    {"world_size 0", init, R"({"rank_offset": 0, "world_size": 0, "nccl_unique_id": "00"})",
     {"world_size: expected an integer in 1..2147483647, got 0"}},
    {"rank_offset < 0", init, R"({"rank_offset": -1, "world_size": 2, "nccl_unique_id": "00"})",
     {"rank_offset: expected an integer in 0..2147483647, got -1"}},
    {"rank_offset >= world_size", init, keep(R"({"rank_offset": 2, "world_size": 2, "nccl_unique_id": ")" + k_uid + "\"}"),
     {"rank_offset: expected an integer in 0..1 (below world_size 2), got 2"}},
    {"timeout_s", init, keep(init_group_body(R"(, "nccl_unique_id": ")" + k_uid + R"(", "timeout_s": 0)")),
     {"timeout_s: expected a number > 0, got 0"}},
    {"timeout_s negative", init, keep(init_group_body(R"(, "nccl_unique_id": ")" + k_uid + R"(", "timeout_s": -3)")),
     {"timeout_s: expected a number > 0, got -3"}},
    {"distributed timeout_s negative", dist, R"({"names": [], "dtypes": [], "shapes": [], "timeout_s": -1})",
     {"timeout_s: expected a number > 0, got -1"}},
    {"distributed timeout_s 0", dist, R"({"names": [], "dtypes": [], "shapes": [], "timeout_s": 0})",
     {"timeout_s: expected a number > 0, got 0"}},
    {"flush timeout_s", &error_of<FlushCacheReqInput>, R"({"timeout_s": -1})",
     {"timeout_s: expected a number >= 0, got -1"}},
    {"token_step", disk, R"({"model_path": "/m", "token_step": -5})",
     {"token_step: expected an integer in 0..2147483647, got -5"}},

    // -- rendezvous, versions, other cross-field rules
    {"no rendezvous", init, keep(init_group_body("")),
     {"no rendezvous: set nccl_unique_id, or master_address and master_port"}},
    {"address without port", init, keep(init_group_body(R"(, "master_address": "h")")),
     {"master_port: required field is missing"}},
    {"port without address", init, keep(init_group_body(R"(, "master_port": 29500)")),
     {"master_address: required field is missing"}},
    {"empty weight_version", &error_of<EndWeightUpdateReqInput>, R"({"weight_version": ""})",
     {R"(weight_version: expected a non-empty string, got "")"}},
    {"empty new_version", &error_of<UpdateWeightVersionReqInput>, R"({"new_version": ""})",
     {R"(new_version: expected a non-empty string, got "")"}},
    {"empty group_name", &error_of<DestroyWeightsUpdateGroupReqInput>, R"({"group_name": ""})",
     {R"(group_name: expected a non-empty string, got "")"}},
    {"post-process spellings disagree", &error_of<PostProcessWeightsReqInput>,
     R"({"restore_weights_before_loading": true, "restore_weights_before_load": false})",
     {"restore_weights_before_loading and restore_weights_before_load disagree"}},
    {"skip_tensor_list empty entry", check, R"({"skip_tensor_list": ["a", ""]})",
     {R"(skip_tensor_list[1]: expected a non-empty string, got "")"}},

    // -- replies: types are still checked, and logprobs must line up with output_ids
    {"logprob count", out,
     R"({"output_ids": [1, 2], "meta_info": {"output_token_logprobs": [[-0.5, 1]]}})",
     {"meta_info.output_token_logprobs: has 1 entries for 2 output_ids"}},
    {"logprob token", out,
     R"({"output_ids": [10, 11], "meta_info": {"output_token_logprobs": [[-0.5, 10], [-0.1, 9]]}})",
     {"meta_info.output_token_logprobs[1][1]: token id 9 does not match output_ids[1] = 11"}},
    {"logprob shape", out, R"({"output_ids": [1], "meta_info": {"output_token_logprobs": [-0.5]}})",
     {"meta_info.output_token_logprobs[0]: expected [logprob, token_id, token_text], got -0.5"}},
    {"reply field type", &error_of<AbortReqOutput>, R"({"success": "true"})",
     {R"(success: expected a boolean, got "true")"}},
  };
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

} // namespace

BOOST_AUTO_TEST_SUITE(json_codec_test)

BOOST_AUTO_TEST_CASE(every_public_type_round_trips) {
  check_all_roundtrips(public_types{});
}

BOOST_AUTO_TEST_CASE(missing_or_null_keys_mean_defaults) {
  check_all_defaults(droppable_types{});
}

BOOST_AUTO_TEST_CASE(malformed_inputs_name_the_field_and_the_value) {
  for (const auto& c : bad_cases()) {
    BOOST_TEST_CONTEXT(c.label << ": " << c.body) {
      auto body = json::parse(c.body);
      auto err = c.decode(body);
      BOOST_TEST_REQUIRE(err.has_value(), "accepted");
      BOOST_TEST(err->rfind(c.expect.front(), 0) == 0, "message: " << *err);
      for (const auto& part : c.expect)
        BOOST_TEST(contains(*err, part), "missing \"" << part << "\" in: " << *err);
    }
  }
}

// The same rules accept their boundaries and SGLang's spellings.
BOOST_AUTO_TEST_CASE(accepted_edges_and_sglang_forms) {
  auto sp = [](const char* text) {
    auto x = from_json<SamplingParams>(json::parse(text));
    BOOST_TEST_REQUIRE(x.has_value(), text << ": " << error_text(x));
    return *x;
  };
  BOOST_TEST(sp(R"({"top_p": 1, "min_p": 0})").top_p == 1.0f);
  BOOST_TEST(sp(R"({"min_p": 1})").min_p == 1.0f);
  BOOST_TEST(sp(R"({"max_new_tokens": 0})").max_new_tokens == 0);
  BOOST_TEST(sp(R"({"max_new_tokens": 2147483647})").max_new_tokens == 2147483647);
  BOOST_TEST(sp(R"({"max_new_tokens": 16.0})").max_new_tokens == 16); // integral float
  BOOST_TEST(sp(R"({"top_k": -1})").top_k == -1);
  BOOST_TEST(sp(R"({"temperature": 0})").temperature == 0.0f);
  BOOST_TEST(sp(R"({"sampling_seed": 18446744073709551615})").sampling_seed.value() ==
             UINT64_MAX);
  BOOST_TEST(sp(R"({"stop": "###"})").stop == std::vector<std::string>{"###"});
  // Inert values of unsupported SGLang fields.
  sp(R"({"regex": null, "json_schema": "", "custom_params": {}, "logit_bias": {}})");
  BOOST_TEST(!sp(R"({"custom_params": {"return_top_p_token_ids": false, "k": 1}})").return_top_p_token_ids);
  BOOST_TEST(sp(R"({"custom_params": {"return_top_p_token_ids": true}})").return_top_p_token_ids);
  BOOST_TEST(!sp(R"({"custom_params": {"return_top_p_token_ids": null}})").return_top_p_token_ids);

  auto gen = from_json<GenerateReqInput>(json::parse(
    R"({"text": "a", "input_ids": null, "lora_path": null, "return_hidden_states": false,
        "log_metrics": true, "priority": 0, "custom_labels": {}, "stream": false})"));
  BOOST_TEST_REQUIRE(gen.has_value(), error_text(gen));
  BOOST_TEST(gen->text.value() == "a");
  BOOST_TEST(!gen->input_ids.has_value());

  auto dist = from_json<UpdateWeightsFromDistributedReqInput>(json::parse(
    R"({"names": ["a", "b", "c"], "dtypes": ["torch.bfloat16", "float", "int"],
        "shapes": [[2, 0], [], [3]]})"));
  BOOST_TEST_REQUIRE(dist.has_value(), error_text(dist));
  BOOST_TEST((dist->dtypes == std::vector<dtype>{dtype::bf16, dtype::f32, dtype::i32}));

  auto init = from_json<InitWeightsUpdateGroupReqInput>(
    json{{"rank_offset", 1}, {"world_size", 2}, {"master_address", "h"}, {"master_port", 65535}});
  BOOST_TEST_REQUIRE(init.has_value(), error_text(init));
  std::string upper = k_uid;
  for (auto& c : upper)
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  init = from_json<InitWeightsUpdateGroupReqInput>(
    json{{"rank_offset", 1}, {"world_size", 2}, {"nccl_unique_id", upper}});
  BOOST_TEST_REQUIRE(init.has_value(), error_text(init));
  BOOST_TEST(init->nccl_unique_id == k_uid); // canonical lowercase

  // Generation 1's spelling of the restore flag.
  auto pp = from_json<PostProcessWeightsReqInput>(json{{"restore_weights_before_load", true}});
  BOOST_TEST_REQUIRE(pp.has_value(), error_text(pp));
  BOOST_TEST(pp->restore_weights_before_loading);
  pp = from_json<PostProcessWeightsReqInput>(
    json{{"restore_weights_before_load", true}, {"restore_weights_before_loading", true}});
  BOOST_TEST_REQUIRE(pp.has_value(), error_text(pp));

  // abort_all with SGLang's empty rid.
  auto abort = from_json<AbortReq>(json{{"rid", ""}, {"abort_all", true}});
  BOOST_TEST_REQUIRE(abort.has_value(), error_text(abort));
  // output_through_sink_only is the server's own: a client cannot set it (ignored, as any unknown
  // field), and it is never written.
  auto internal = from_json<GenerateReqInput>(json{{"text", "a"}, {"output_through_sink_only", true}});
  BOOST_TEST_REQUIRE(internal.has_value(), error_text(internal));
  BOOST_TEST(!internal->output_through_sink_only);
  GenerateReqInput marked;
  marked.text = "a";
  marked.output_through_sink_only = true;
  BOOST_TEST(!to_json(marked).contains("output_through_sink_only"));

  // Neither rid nor abort_all (verl's client defaults): decoded, a no-op for the front door.
  abort = from_json<AbortReq>(json{{"rid", ""}, {"abort_all", false}});
  BOOST_TEST_REQUIRE(abort.has_value(), error_text(abort));
  BOOST_TEST((abort->rid.empty() && !abort->abort_all));

  // End is {}-able.
  BOOST_TEST(from_json<EndWeightUpdateReqInput>(json::object()).has_value());
  BOOST_TEST(from_json<EndWeightUpdateReqInput>(json(nullptr)).has_value());
}

// Replies are read leniently (a newer server may add keys) and carry non-finite floats.
// SGLang's request dataclasses take keys they do not know, and trainers send some (newer SGLang
// fields, their own patches): a request's top level ignores them and counts them; its parts
// stay strict, and fields that change nothing rlserve returns are accepted whatever their value.
BOOST_AUTO_TEST_CASE(unknown_top_level_request_keys_are_ignored_and_counted) {
  std::vector<std::string> heard;
  on_ignored_request_field([&](std::string_view k) { heard.emplace_back(k); });
  const auto before = ignored_request_fields();
  auto pause = from_json<PauseGenerationReqInput>(json::parse(R"({"mode": "retract", "force": true})"));
  BOOST_TEST_REQUIRE(pause.has_value(), error_text(pause));
  BOOST_TEST((pause->mode == pause_mode::retract));
  BOOST_TEST(from_json<GetServerInfoReqInput>(json::parse(R"({"verbose": true})")).has_value());
  auto end = from_json<EndWeightUpdateReqInput>(json::parse(R"({"commit": true, "abort": true})"));
  BOOST_TEST_REQUIRE(end.has_value(), error_text(end));
  BOOST_TEST(end->abort);
  // slime's generate: custom_params with top_p < 1, priority and log_metrics set.
  auto gen = from_json<GenerateReqInput>(json::parse(R"({
    "input_ids": [1, 2], "priority": 3, "log_metrics": false, "return_prompt_token_ids": true,
    "sampling_params": {"top_p": 0.9, "custom_params": {"k": 1}, "stream_interval": 4}})"));
  BOOST_TEST_REQUIRE(gen.has_value(), error_text(gen));
  BOOST_TEST(gen->sampling_params.top_p == 0.9f);
  BOOST_TEST((gen->sampling_params.stream_interval == std::optional<int32_t>(4)));
  BOOST_TEST(ignored_request_fields() - before == 4u);
  BOOST_TEST((heard == std::vector<std::string>{"force", "verbose", "commit", "return_prompt_token_ids"}));
  on_ignored_request_field({});
  // A part of a request is strict, and what would change the tokens is refused.
  BOOST_TEST(error_text(from_json<GenerateReqInput>(json::parse(
               R"({"text": "a", "sampling_params": {"max_tokens": 5}})"))) ==
             "sampling_params.max_tokens: unknown field");
  BOOST_TEST(error_text(from_json<GenerateReqInput>(json::parse(
               R"({"text": "a", "sampling_params": {"stream_interval": 0}})"))).find(
               "sampling_params.stream_interval") == 0u);
  BOOST_TEST(error_text(from_json<GenerateReqInput>(json::parse(
               R"({"text": "a", "custom_logit_processor": "x"})"))) ==
             R"(custom_logit_processor: not supported by rlserve (got "x"))");
}

BOOST_AUTO_TEST_CASE(replies_are_forward_compatible) {
  auto out = from_json<GenerateReqOutput>(json::parse(R"({
    "text": "x", "output_ids": [5], "e2e_latency": 0.3,
    "meta_info": {"id": "r", "finish_reason": {"type": "length", "length": 16},
                  "output_token_logprobs": [[-0.5, 5, null]], "new_field": [1]},
    "success": true, "message": "", "finished": true})"));
  BOOST_TEST_REQUIRE(out.has_value(), error_text(out));
  BOOST_TEST(out->finish_reason.value().type == "length");
  BOOST_TEST(out->output_token_logprobs == std::vector<float>{-0.5f});

  GetWeightsByNameReqOutput w;
  w.parameter = {std::nanf(""), INFINITY, -INFINITY, 1.5f};
  const json j = to_json(w);
  BOOST_TEST(j["parameter"] == json::parse(R"(["nan", "inf", "-inf", 1.5])"));
  auto back = from_json<GetWeightsByNameReqOutput>(j);
  BOOST_TEST_REQUIRE(back.has_value(), error_text(back));
  BOOST_TEST(std::isnan(back->parameter[0]));
  BOOST_TEST(back->parameter[1] == INFINITY);
  BOOST_TEST(back->parameter[2] == -INFINITY);
  // A request never turns a NaN into "the default": the string is refused.
  SamplingParams nan_params;
  nan_params.temperature = std::nanf("");
  const json nan_json = to_json(nan_params);
  BOOST_TEST(nan_json["temperature"] == "nan");
  BOOST_TEST(error_text(from_json<SamplingParams>(json::parse(nan_json.dump()))) ==
             R"(temperature: expected a number, got "nan")");

  auto from_null = from_json<GetWeightsByNameReqOutput>(json::parse(R"({"parameter": [null]})"));
  BOOST_TEST_REQUIRE(from_null.has_value());
  BOOST_TEST(std::isnan(from_null->parameter[0]));
}

// SGLang's /generate response shape (json_codec.hpp documents the mapping).
BOOST_AUTO_TEST_CASE(generate_output_has_sglang_shape) {
  auto x = samples<GenerateReqOutput>::full();
  x.finish_reason->matched_str.reset();
  const json j = to_json(x);
  BOOST_TEST(j["text"] == "Hi there");
  BOOST_TEST(j["output_ids"] == json::parse("[10, 11, 12]"));
  BOOST_TEST(j["finished"] == true);
  const json& meta = j["meta_info"];
  BOOST_TEST(meta["id"] == "req-1");
  BOOST_TEST(meta["finish_reason"] ==
             json::parse(R"({"type": "stop", "matched": 151643, "message": "stopped"})"));
  BOOST_TEST(meta["prompt_tokens"] == 5);
  BOOST_TEST(meta["weight_version"] == "v2");
  BOOST_TEST(meta["weight_version_start"] == "v1");
  // SGLang's entries: [logprob, token_id, text or null].
  BOOST_TEST(meta["output_token_logprobs"] ==
             json::parse(R"([[-0.125, 10, "Hi"], [-2.5, 11, " the"], [-0.3, 12, "re"]])"));
  BOOST_TEST(meta["output_top_logprobs"][0] == json::parse(R"([[-0.125, 10, "Hi"], [-3.0, 99, "Ho"]])"));
  BOOST_TEST(meta["output_top_logprobs"][1] == json::array());
  // Prompt logprobs: the first entry has no logprob (null) and no top row (null).
  auto scored = samples<GenerateReqOutput>::full();
  scored.input_token_logprobs[0] = std::nanf("");
  scored.input_token_texts.clear();
  const json scored_meta = to_json(scored)["meta_info"];
  BOOST_TEST(scored_meta["input_token_logprobs"] == json::parse("[[null, 3, null], [-0.75, 4, null]]"));
  BOOST_TEST(scored_meta["input_top_logprobs"] ==
             json::parse(R"([null, [[-0.75, 4, "x"], [-1.25, 5, "y"]]])"));
  auto back = from_json<GenerateReqOutput>(to_json(scored));
  BOOST_TEST_REQUIRE(back.has_value());
  BOOST_TEST(std::isnan(back->input_token_logprobs[0]));
  BOOST_TEST(back->input_token_ids == scored.input_token_ids);
  BOOST_TEST(back->input_top_logprobs[0].empty());
  BOOST_TEST((back->input_top_logprobs[1][0].text == std::optional<std::string>("x")));
  // Placeholder rows (return_logprob without top_logprobs_num) are not written.
  auto no_tops = samples<GenerateReqOutput>::full();
  for (auto& row : no_tops.output_top_logprobs)
    row.clear();
  no_tops.input_top_logprobs.clear(); // prompt rows exist only when top logprobs were asked for
  BOOST_TEST(!to_json(no_tops)["meta_info"].contains("output_top_logprobs"));
  BOOST_TEST(j.dump().find("0.30000001") == std::string::npos); // floats print shortest

  // Speculation: SGLang's names for the counts and rates (2 verifications, 1 of 8 drafts kept).
  const auto spec_meta = to_json(samples<GenerateReqOutput>::full())["meta_info"];
  BOOST_TEST(spec_meta["spec_verify_ct"] == 2);
  BOOST_TEST(spec_meta["spec_num_correct_drafts"] == 1);
  BOOST_TEST(spec_meta["spec_num_proposed_drafts"] == 8);
  BOOST_TEST(spec_meta["spec_accept_rate"].get<double>() == 0.125);
  BOOST_TEST(spec_meta["spec_accept_length"].get<double>() == 1.5);

  const json sparse = to_json(samples<GenerateReqOutput>::sparse());
  BOOST_TEST(sparse["meta_info"]["finish_reason"].is_null());
  BOOST_TEST(!to_json(GenerateReqOutput{})["meta_info"].contains("spec_accept_rate")); // not speculated
  BOOST_TEST(!sparse["meta_info"].contains("output_token_logprobs"));
  BOOST_TEST(!sparse["meta_info"].contains("output_top_logprobs"));
}

BOOST_AUTO_TEST_CASE(either_or_fields_drop_cleanly) {
  // GenerateReqInput: dropping the prompt's only source is the "neither" error; the rest
  // fall back to defaults.
  auto text = to_json(samples<GenerateReqInput>::json().front());
  for (const auto& key : {"rid", "sampling_params", "return_logprob", "logprob_start_len",
                          "top_logprobs_num", "stream", "input_ids"}) {
    json body = text;
    body.erase(key);
    auto x = from_json<GenerateReqInput>(body);
    BOOST_TEST(x.has_value(), key << ": " << error_text(x));
  }
  json body = text;
  body.erase("text");
  BOOST_TEST(error_of<GenerateReqInput>(body).value_or("") ==
             "neither text nor input_ids is set; send exactly one");
  // DeviceTensorRef: dropping the only address is the "neither" error.
  for (const auto& sample : samples<DeviceTensorRef>::json()) {
    json j = to_json(sample);
    const char* address = sample.pointer != 0 ? "pointer" : "ipc_handle";
    j.erase(address);
    BOOST_TEST(error_of<DeviceTensorRef>(j).value_or("") ==
               "neither pointer nor ipc_handle is set");
    j = to_json(sample);
    j.erase("device");
    j.erase("offset");
    BOOST_TEST(!error_of<DeviceTensorRef>(j).has_value());
    // Without the event to wait for, the flag that asks for the wait is an error.
    j = to_json(sample);
    j.erase("event_handle");
    BOOST_TEST(error_of<DeviceTensorRef>(j).value_or("") ==
               "event_sync_required: true without an event_handle to wait for");
  }
}

// The forms a sender may use that rlserve stores in one spelling: torch's UUID text (no
// "GPU-", any case) and a raw 64-byte cudaIpcMemHandle_t next to PyTorch's 66-byte handle.
BOOST_AUTO_TEST_CASE(device_tensor_refs_accept_torch_spellings) {
  json j = to_json(samples<DeviceTensorRef>::ipc());
  j["device_uuid"] = "4B652AE2-0EC6-7DCB-611E-8BD2E51D9120";
  auto x = from_json<DeviceTensorRef>(j);
  BOOST_TEST_REQUIRE(x.has_value(), error_text(x));
  BOOST_TEST(x->device_uuid == "GPU-4b652ae2-0ec6-7dcb-611e-8bd2e51d9120");
  j["ipc_handle"] = hex_encode(ipc_handle_bytes());
  x = from_json<DeviceTensorRef>(j);
  BOOST_TEST_REQUIRE(x.has_value(), error_text(x));
  BOOST_TEST(x->ipc_handle.size() == 64u);
  j["ipc_handle"] = "03" + j["ipc_handle"].get<std::string>().insert(0, "63");
  x = from_json<DeviceTensorRef>(j);
  BOOST_TEST(x.has_value(), error_text(x)); // version 3 reads as 2 does
  j["nbytes"] = 0; // 0: not given
  BOOST_TEST(from_json<DeviceTensorRef>(j).has_value());
}

// Whatever the codec accepts also passes messages/validate.hpp, the checks the in-process API
// runs: the two ways in cannot drift apart silently.
BOOST_AUTO_TEST_CASE(accepted_requests_pass_validate) {
  for (const auto& x : samples<GenerateReqInput>::json()) {
    auto back = from_json<GenerateReqInput>(to_json(x));
    BOOST_TEST_REQUIRE(back.has_value());
    auto st = validate(*back);
    BOOST_TEST(st.has_value(), error_text(st));
  }
}

BOOST_AUTO_TEST_CASE(parse_json_reports_position_and_depth) {
  auto bad = parse_json(R"({"text": "a",})");
  BOOST_TEST_REQUIRE(!bad.has_value());
  BOOST_TEST(error_text(bad).rfind("invalid JSON at byte 14: ", 0) == 0, error_text(bad));
  BOOST_TEST(error_text(bad).find("[json.exception") == std::string::npos);
  std::string deep(k_max_json_depth + 1, '[');
  deep += std::string(k_max_json_depth + 1, ']');
  auto too_deep = parse_json(deep);
  BOOST_TEST_REQUIRE(!too_deep.has_value());
  BOOST_TEST(error_text(too_deep) == "invalid JSON: nested deeper than 64 levels");
  std::string ok(k_max_json_depth, '[');
  ok += std::string(k_max_json_depth, ']');
  BOOST_TEST(parse_json(ok).has_value());
}

// nlohmann throws out_of_range (not parse_error) for a number outside double's range; it must
// come back as an error value naming the number, wherever the number sits.
BOOST_AUTO_TEST_CASE(parse_json_refuses_numbers_outside_double_range) {
  for (std::string text : {"1e400", "-1e400", "[1, 2, 1e400]", R"({"sampling_params": {"temperature": 1e400}})",
                           R"({"a": {"b": [-12e99999]}})"}) {
    BOOST_TEST_CONTEXT(text) {
      expected<nlohmann::json> r = fail("not run");
      BOOST_CHECK_NO_THROW(r = parse_json(text));
      BOOST_TEST_REQUIRE(!r.has_value());
      BOOST_TEST(error_text(r).rfind("invalid JSON: number overflow parsing '", 0) == 0, error_text(r));
      BOOST_TEST(error_text(r).find("e") != std::string::npos);
      BOOST_TEST(error_text(r).find("[json.exception") == std::string::npos);
    }
  }
  // Large but representable numbers still parse; integers beyond 64 bits become doubles.
  BOOST_TEST(parse_json("1e308").has_value());
  BOOST_TEST(parse_json("123456789012345678901234567890").has_value());
  BOOST_TEST(parse_json("1e-400").has_value()); // underflows to 0, as strtod does
}

// parse_request_json keeps input_ids compact but must decode exactly as parse_json does: the same
// requests, the same errors, the same depth limit; and it stops reading at the ids limit.
BOOST_AUTO_TEST_CASE(parse_request_json_decodes_as_parse_json) {
  const std::vector<std::string> bodies = {
    R"({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}})",
    R"({"input_ids": [0, 2147483647]})",
    R"({"input_ids": []})",
    R"({"input_ids": [[1, 2], [3]]})",        // a batch: refused by the codec
    R"({"input_ids": [1, [2]]})",             // turns nested after an id
    R"({"input_ids": [1, -2]})",              // negative
    R"({"input_ids": [1, 2147483648]})",      // outside int32
    R"({"input_ids": [1, 2.5]})",
    R"({"input_ids": [1, "2"]})",
    R"({"input_ids": [1, null]})",
    R"({"input_ids": [1, {"a": 1}]})",
    R"({"input_ids": 7})",
    R"({"text": "hi", "input_ids": [4]})",
    R"({"sampling_params": {"input_ids": [1]}, "input_ids": [5]})",
  };
  for (const auto& body : bodies) {
    BOOST_TEST_CONTEXT(body) {
      auto dom = parse_json(body);
      auto compact = parse_request_json(body, 1000);
      BOOST_TEST_REQUIRE(dom.has_value());
      BOOST_TEST_REQUIRE(compact.has_value(), error_text(compact));
      auto a = from_json<GenerateReqInput>(*dom);
      auto b = from_json<GenerateReqInput>(*compact);
      BOOST_TEST_REQUIRE(a.has_value() == b.has_value());
      if (a)
        BOOST_TEST(to_json(*a) == to_json(*b));
      else
        BOOST_TEST(a.error() == b.error());
    }
  }
  // A websocket envelope's body, one level down.
  auto env = parse_request_json(R"({"id": 1, "type": "generate", "body": {"input_ids": [7, 8]}})", 1000);
  BOOST_TEST_REQUIRE(env.has_value());
  BOOST_TEST((*env)["body"]["input_ids"].is_binary()); // kept compact
  auto decoded = from_json<GenerateReqInput>((*env)["body"]);
  BOOST_TEST_REQUIRE(decoded.has_value());
  BOOST_TEST((*decoded->input_ids == std::vector<int32_t>{7, 8}));
  // The limit: no more ids are read than it allows.
  auto many = parse_request_json(R"({"input_ids": [1, 2, 3, 4]})", 3);
  BOOST_TEST_REQUIRE(!many.has_value());
  BOOST_TEST(error_text(many).find("more than 3 token ids") != std::string::npos, error_text(many));
  BOOST_TEST(parse_request_json(R"({"input_ids": [1, 2, 3]})", 3).has_value());
  // The same depth limit and error values as parse_json.
  std::string deep(k_max_json_depth + 1, '[');
  deep += std::string(k_max_json_depth + 1, ']');
  BOOST_TEST(error_text(parse_request_json(deep, 10)) == "invalid JSON: nested deeper than 64 levels");
  std::string ok(k_max_json_depth, '[');
  ok += std::string(k_max_json_depth, ']');
  BOOST_TEST(parse_request_json(ok, 10).has_value());
  std::string deep_ids = "{\"input_ids\": " + std::string(k_max_json_depth, '[') + "1" +
                         std::string(k_max_json_depth, ']') + "}";
  BOOST_TEST(error_text(parse_request_json(deep_ids, 10)) == error_text(parse_json(deep_ids)));
  for (std::string text : {R"({"input_ids": [1, 1e400]})", R"({"input_ids": [1, 2,]})", "{"}) {
    BOOST_TEST_CONTEXT(text) {
      BOOST_TEST(error_text(parse_request_json(text, 10)) == error_text(parse_json(text)));
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
