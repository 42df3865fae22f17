// JSON codecs of weight_update.hpp: the NCCL group, the three transports, the session,
// post-processing, versions and the weight checker (docs/sglang-contract.md, 'Weight updates').
#include <map>
#include <unordered_map>

#include "messages/base64.hpp"
#include "messages/json_codec.hpp"
#include "messages/json_codec_detail.hpp"
#include "messages/torch_pickle.hpp"

namespace rlserve {

using namespace json_codec_detail;

namespace {

// ncclUniqueId is 128 opaque bytes (NCCL_UNIQUE_ID_BYTES).
constexpr std::size_t k_nccl_unique_id_bytes = 128;

const text_rule k_name{.non_empty = true};
// A weight version is a label users read back; an empty one would be indistinguishable from
// "no version" in every reply, so it is refused (leave the key out instead).
const text_rule k_version{.non_empty = true};

// load_format values this engine implements; anything else fails here rather than deep in a
// loader. `allowed` lists them for the message.
void check_load_format(object_reader& r, const std::optional<std::string>& value,
                       std::initializer_list<std::string_view> allowed) {
  if (!r.ok() || !value)
    return;
  for (auto a : allowed)
    if (*value == a)
      return;
  std::string names;
  for (auto a : allowed) {
    names += '"';
    names += a;
    names += "\", ";
  }
  r.fail("load_format", "unknown value " + describe(json(*value)) + " (expected " + names +
                          "or null)");
}

// Tensor names within one update must be unique: the staging area is keyed by name, and a
// second tensor under the same name would silently replace the first.
class name_set {
public:
  // Returns false (and records the error at `p`) when `name` was seen before.
  bool add(context& cx, const path& p, const std::string& name, std::string where) {
    auto [it, inserted] = seen_.emplace(name, where);
    if (!inserted)
      cx.fail(p, "duplicate of " + it->second + " (\"" + name + "\")");
    return inserted;
  }

private:
  std::unordered_map<std::string, std::string> seen_;
};

bool parse_string_map(context& cx, const json& v, const path& p,
                      std::map<std::string, std::string>& out) {
  if (!v.is_object()) {
    cx.expected_but_got(p, "an object", v);
    return false;
  }
  std::map<std::string, std::string> tmp;
  for (const auto& item : v.items()) {
    if (!item.value().is_string()) {
      cx.expected_but_got(p.key(item.key()), "a string", item.value());
      return false;
    }
    tmp.emplace(item.key(), item.value().get<std::string>());
  }
  out = std::move(tmp);
  return true;
}

// Most replies are just {success, message}.
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

void read_fields(object_reader& r, ParallelismInfo& x) {
  const int_rule<int32_t> rank{.lo = 0};
  const int_rule<int32_t> size{.lo = 1};
  r.field("tp_rank", x.tp_rank, rank);
  r.field("tp_size", x.tp_size, size);
  r.field("dp_rank", x.dp_rank, rank);
  r.field("dp_size", x.dp_size, size);
  r.field("pp_rank", x.pp_rank, rank);
  r.field("pp_size", x.pp_size, size);
  r.field("rank", x.rank, rank);
  r.field("size", x.size, size);
  r.field("role", x.role);
}

json fields_of(const ParallelismInfo& x) {
  return {{"tp_rank", x.tp_rank}, {"tp_size", x.tp_size}, {"dp_rank", x.dp_rank},
          {"dp_size", x.dp_size}, {"pp_rank", x.pp_rank}, {"pp_size", x.pp_size},
          {"rank", x.rank},       {"size", x.size},       {"role", x.role}};
}

void read_fields(object_reader& r, ChecksumInfo& x) {
  if (auto v = r.get("checksums"))
    parse_string_map(r.cx(), *v, r.at("checksums"), x.checksums);
  if (auto v = r.get("role_checksums"))
    parse_string_map(r.cx(), *v, r.at("role_checksums"), x.role_checksums);
  r.field("per_gpu_checksum", x.per_gpu_checksum);
  r.object_list("parallelism_info", x.parallelism_info,
                [](object_reader& s, ParallelismInfo& p) { read_fields(s, p); });
}

json fields_of(const ChecksumInfo& x) {
  auto infos = json::array();
  for (const auto& p : x.parallelism_info)
    infos.push_back(fields_of(p));
  return {{"checksums", x.checksums},
          {"role_checksums", x.role_checksums},
          {"per_gpu_checksum", x.per_gpu_checksum},
          {"parallelism_info", std::move(infos)}};
}

} // namespace

// ---- NCCL group ---------------------------------------------------------------------------------

template <>
expected<InitWeightsUpdateGroupReqInput>
from_json<InitWeightsUpdateGroupReqInput>(const json& j) {
  return decode<InitWeightsUpdateGroupReqInput>(
    j, strictness::request, [](object_reader& r, InitWeightsUpdateGroupReqInput& x) {
      r.field("master_address", x.master_address);
      r.field("master_port", x.master_port, int_rule<int32_t>{.lo = 0, .hi = 65535});
      const bool has_port = r.present("master_port");
      r.required("rank_offset", x.rank_offset, int_rule<int32_t>{.lo = 0});
      r.required("world_size", x.world_size, int_rule<int32_t>{.lo = 1});
      r.field("group_name", x.group_name, k_name);
      r.field("backend", x.backend, k_name);
      r.field("nccl_unique_id", x.nccl_unique_id);
      r.field("timeout_s", x.timeout_s, num_rule{.lo = 0, .lo_open = true});
      if (!r.ok())
        return;
      if (x.backend != "nccl") {
        r.fail("backend", "not supported by rlserve (got " + describe(json(x.backend)) +
                            "); weight-update groups use \"nccl\"");
        return;
      }
      if (x.rank_offset >= x.world_size) {
        r.fail("rank_offset", "expected an integer in 0.." + std::to_string(x.world_size - 1) +
                                " (below world_size " + std::to_string(x.world_size) +
                                "), got " + std::to_string(x.rank_offset));
        return;
      }
      if (!x.nccl_unique_id.empty()) {
        auto bytes = hex_decode(x.nccl_unique_id);
        if (!bytes) {
          r.fail("nccl_unique_id", bytes.error());
        } else if (bytes->size() != k_nccl_unique_id_bytes) {
          r.fail("nccl_unique_id",
                 "expected " + std::to_string(k_nccl_unique_id_bytes) + " bytes (" +
                   std::to_string(2 * k_nccl_unique_id_bytes) + " hex digits), got " +
                   std::to_string(bytes->size()) + " bytes");
        } else {
          x.nccl_unique_id = hex_encode(*bytes); // canonical lowercase
        }
        return;
      }
      if (x.master_address.empty() && !has_port)
        r.cx().fail(r.where(), "no rendezvous: set nccl_unique_id, or master_address and "
                               "master_port");
      else if (x.master_address.empty())
        r.fail("master_address", "required field is missing (master_port is set and "
                                 "nccl_unique_id is not)");
      else if (!has_port)
        r.missing("master_port");
      else if (x.master_port == 0)
        r.fail("master_port", "expected a port in 1..65535 to connect to, got 0");
    });
}

json to_json(const InitWeightsUpdateGroupReqInput& x) {
  return {{"master_address", x.master_address}, {"master_port", x.master_port},
          {"rank_offset", x.rank_offset},       {"world_size", x.world_size},
          {"group_name", x.group_name},         {"backend", x.backend},
          {"nccl_unique_id", x.nccl_unique_id}, {"timeout_s", x.timeout_s}};
}

template <>
expected<InitWeightsUpdateGroupReqOutput>
from_json<InitWeightsUpdateGroupReqOutput>(const json& j) {
  return decode_status_reply<InitWeightsUpdateGroupReqOutput>(j);
}

json to_json(const InitWeightsUpdateGroupReqOutput& x) {
  return encode_status_reply(x);
}

template <>
expected<DestroyWeightsUpdateGroupReqInput>
from_json<DestroyWeightsUpdateGroupReqInput>(const json& j) {
  return decode<DestroyWeightsUpdateGroupReqInput>(
    j, strictness::request, [](object_reader& r, DestroyWeightsUpdateGroupReqInput& x) {
      r.field("group_name", x.group_name, k_name);
    });
}

json to_json(const DestroyWeightsUpdateGroupReqInput& x) {
  return {{"group_name", x.group_name}};
}

template <>
expected<DestroyWeightsUpdateGroupReqOutput>
from_json<DestroyWeightsUpdateGroupReqOutput>(const json& j) {
  return decode_status_reply<DestroyWeightsUpdateGroupReqOutput>(j);
}

json to_json(const DestroyWeightsUpdateGroupReqOutput& x) {
  return encode_status_reply(x);
}

// ---- transports ---------------------------------------------------------------------------------

template <>
expected<UpdateWeightsFromDistributedReqInput>
from_json<UpdateWeightsFromDistributedReqInput>(const json& j) {
  return decode<UpdateWeightsFromDistributedReqInput>(
    j, strictness::request, [](object_reader& r, UpdateWeightsFromDistributedReqInput& x) {
      r.required("names", x.names, list_rule<text_rule>{.elem = k_name});
      r.required("dtypes", x.dtypes, list_rule<no_rule>{});
      r.required("shapes", x.shapes, list_rule<shape_rule>{});
      r.field("group_name", x.group_name, k_name);
      r.field("flush_cache", x.flush_cache);
      r.field("abort_all_requests", x.abort_all_requests);
      r.field("weight_version", x.weight_version, k_version);
      r.field("load_format", x.load_format);
      check_load_format(r, x.load_format, {"flattened_bucket"});
      r.field("selector", x.selector);
      r.field("torch_empty_cache", x.torch_empty_cache);
      r.field("timeout_s", x.timeout_s, num_rule{.lo = 0, .lo_open = true});
      r.unsupported("disable_draft_model", nullptr, R"(use "selector": "target")");
      if (!r.ok())
        return;
      if (x.names.size() != x.dtypes.size() || x.names.size() != x.shapes.size()) {
        r.cx().fail(r.where(), "names, dtypes and shapes have different lengths (" +
                                 std::to_string(x.names.size()) + ", " +
                                 std::to_string(x.dtypes.size()) + ", " +
                                 std::to_string(x.shapes.size()) + ")");
        return;
      }
      name_set seen;
      const path names = r.at("names");
      const path shapes = r.at("shapes");
      for (std::size_t i = 0; i < x.names.size(); ++i) {
        const std::string here = "names[" + std::to_string(i) + "]";
        if (!seen.add(r.cx(), names.index(i), x.names[i], here))
          return;
        if (!byte_count(x.shapes[i], x.dtypes[i])) {
          int64_t numel = 1; // fits: shape_rule checked it
          for (auto d : x.shapes[i])
            numel *= d;
          r.cx().fail(shapes.index(i),
                      std::to_string(numel) + " elements x " +
                        std::to_string(element_size(x.dtypes[i])) + " bytes (" +
                        std::string(torch_name(x.dtypes[i])) + ") overflow int64");
          return;
        }
      }
    });
}

json to_json(const UpdateWeightsFromDistributedReqInput& x) {
  auto dtypes = json::array();
  for (auto t : x.dtypes)
    dtypes.push_back(dtype_value(t));
  return {{"names", x.names},
          {"dtypes", std::move(dtypes)},
          {"shapes", x.shapes},
          {"group_name", x.group_name},
          {"flush_cache", x.flush_cache},
          {"abort_all_requests", x.abort_all_requests},
          {"weight_version", optional_value(x.weight_version)},
          {"load_format", optional_value(x.load_format)},
          {"selector", to_string(x.selector)},
          {"torch_empty_cache", x.torch_empty_cache},
          {"timeout_s", optional_value(x.timeout_s)}};
}

template <>
expected<UpdateWeightsFromDistributedReqOutput>
from_json<UpdateWeightsFromDistributedReqOutput>(const json& j) {
  return decode_status_reply<UpdateWeightsFromDistributedReqOutput>(j);
}

json to_json(const UpdateWeightsFromDistributedReqOutput& x) {
  return encode_status_reply(x);
}

namespace {

// SGLang's serialized_named_tensors: one base64 pickle per engine GPU (element i holds handles
// to memory on engine GPU i, from the trainer rank colocated with it). Each SGLang rank reads
// only its own element; rlserve runs one GPU, reads element 0 and ignores the others the same
// way. The pickle's layout follows load_format: a list of (name, tensor) tuples, or one
// flattened bucket that is split back into its tensors here.
std::vector<NamedDeviceTensor> read_serialized_named_tensors(
  object_reader& r, const std::optional<std::string>& load_format) {
  const json* v = r.get("serialized_named_tensors");
  if (!v)
    return {};
  const path list = r.at("serialized_named_tensors");
  if (!expect_array(r.cx(), *v, list))
    return {};
  if (v->empty()) {
    r.cx().fail(list, "empty; expected one base64 pickle per engine GPU");
    return {};
  }
  for (std::size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_string()) {
      r.cx().expected_but_got(list.index(i), "a base64 string", (*v)[i]);
      return {};
    }
  }
  const path own = list.index(0);
  auto bytes = base64_decode((*v)[0].get_ref<const std::string&>());
  if (!bytes) {
    r.cx().fail(own, bytes.error());
    return {};
  }
  const auto form = load_format == std::optional<std::string>("flattened_bucket")
                      ? torch_pickle_form::flattened_bucket
                      : torch_pickle_form::named_list;
  auto tensors = read_torch_ipc_pickle(*bytes, form);
  if (!tensors) {
    r.cx().fail(own, tensors.error());
    return {};
  }
  return std::move(*tensors);
}

} // namespace

template <>
expected<UpdateWeightsFromTensorReqInput>
from_json<UpdateWeightsFromTensorReqInput>(const json& j) {
  return decode<UpdateWeightsFromTensorReqInput>(
    j, strictness::request, [](object_reader& r, UpdateWeightsFromTensorReqInput& x) {
      r.object_list("named_tensors", x.named_tensors,
                    [](object_reader& s, NamedTensor& t) { read_fields(s, t); });
      r.object_list("device_tensors", x.device_tensors,
                    [](object_reader& s, NamedDeviceTensor& t) { read_fields(s, t); });
      r.field("load_format", x.load_format);
      check_load_format(r, x.load_format, {"direct", "flattened_bucket"});
      r.field("flush_cache", x.flush_cache);
      r.field("abort_all_requests", x.abort_all_requests);
      r.field("weight_version", x.weight_version, k_version);
      r.field("selector", x.selector);
      r.field("torch_empty_cache", x.torch_empty_cache);
      r.unsupported("disable_draft_model", nullptr, R"(use "selector": "target")");
      auto pickled = read_serialized_named_tensors(r, x.load_format);
      if (!r.ok())
        return;
      name_set seen;
      const path named = r.at("named_tensors");
      for (std::size_t i = 0; i < x.named_tensors.size(); ++i) {
        const path p = named.index(i);
        if (!seen.add(r.cx(), p.key("name"), x.named_tensors[i].name,
                      "named_tensors[" + std::to_string(i) + "].name"))
          return;
      }
      const path device = r.at("device_tensors");
      for (std::size_t i = 0; i < x.device_tensors.size(); ++i) {
        const path p = device.index(i);
        if (!seen.add(r.cx(), p.key("name"), x.device_tensors[i].name,
                      "device_tensors[" + std::to_string(i) + "].name"))
          return;
      }
      const path serialized = r.at("serialized_named_tensors");
      const path own = serialized.index(0);
      for (auto& t : pickled) {
        if (!seen.add(r.cx(), own, t.name,
                      "an earlier tensor of serialized_named_tensors[0]"))
          return;
        x.device_tensors.push_back(std::move(t));
      }
    });
}

json to_json(const UpdateWeightsFromTensorReqInput& x) {
  auto named = json::array();
  for (const auto& t : x.named_tensors)
    named.push_back(to_json(t));
  auto device = json::array();
  for (const auto& t : x.device_tensors)
    device.push_back(to_json(t));
  return {{"named_tensors", std::move(named)},
          {"device_tensors", std::move(device)},
          {"load_format", optional_value(x.load_format)},
          {"flush_cache", x.flush_cache},
          {"abort_all_requests", x.abort_all_requests},
          {"weight_version", optional_value(x.weight_version)},
          {"selector", to_string(x.selector)},
          {"torch_empty_cache", x.torch_empty_cache}};
}

template <>
expected<UpdateWeightsFromTensorReqOutput>
from_json<UpdateWeightsFromTensorReqOutput>(const json& j) {
  return decode_status_reply<UpdateWeightsFromTensorReqOutput>(j);
}

json to_json(const UpdateWeightsFromTensorReqOutput& x) {
  return encode_status_reply(x);
}

template <>
expected<UpdateWeightFromDiskReqInput> from_json<UpdateWeightFromDiskReqInput>(const json& j) {
  return decode<UpdateWeightFromDiskReqInput>(
    j, strictness::request, [](object_reader& r, UpdateWeightFromDiskReqInput& x) {
      r.required("model_path", x.model_path, k_name);
      r.field("load_format", x.load_format);
      // rlserve reads safetensors checkpoints only; "auto" is SGLang's default spelling.
      check_load_format(r, x.load_format, {"auto", "safetensors"});
      r.field("abort_all_requests", x.abort_all_requests);
      r.field("weight_version", x.weight_version, k_version);
      r.field("is_async", x.is_async);
      r.field("torch_empty_cache", x.torch_empty_cache);
      r.field("keep_pause", x.keep_pause);
      r.field("recapture_cuda_graph", x.recapture_cuda_graph);
      r.field("token_step", x.token_step, int_rule<int32_t>{.lo = 0});
      r.field("flush_cache", x.flush_cache);
      r.field("selector", x.selector);
      r.unsupported("manifest", nullptr, "rlserve loads every tensor of the checkpoint");
    });
}

json to_json(const UpdateWeightFromDiskReqInput& x) {
  return {{"model_path", x.model_path},
          {"load_format", optional_value(x.load_format)},
          {"abort_all_requests", x.abort_all_requests},
          {"weight_version", optional_value(x.weight_version)},
          {"is_async", x.is_async},
          {"torch_empty_cache", x.torch_empty_cache},
          {"keep_pause", x.keep_pause},
          {"recapture_cuda_graph", x.recapture_cuda_graph},
          {"token_step", x.token_step},
          {"flush_cache", x.flush_cache},
          {"selector", to_string(x.selector)}};
}

template <>
expected<UpdateWeightFromDiskReqOutput> from_json<UpdateWeightFromDiskReqOutput>(const json& j) {
  return decode<UpdateWeightFromDiskReqOutput>(
    j, strictness::lenient, [](object_reader& r, UpdateWeightFromDiskReqOutput& x) {
      r.field("success", x.success);
      r.field("message", x.message);
      r.field("num_paused_requests", x.num_paused_requests, int_rule<int32_t>{.lo = 0});
    });
}

json to_json(const UpdateWeightFromDiskReqOutput& x) {
  return {{"success", x.success},
          {"message", x.message},
          {"num_paused_requests", x.num_paused_requests}};
}

// ---- the session --------------------------------------------------------------------------------

template <>
expected<BeginWeightUpdateReqInput> from_json<BeginWeightUpdateReqInput>(const json& j) {
  return decode<BeginWeightUpdateReqInput>(
    j, strictness::request, [](object_reader& r, BeginWeightUpdateReqInput& x) {
      r.field("selector", x.selector);
      // Later miles: adapter-only sessions that skip the base weights.
      r.unsupported("sync_base");
    });
}

json to_json(const BeginWeightUpdateReqInput& x) {
  return {{"selector", to_string(x.selector)}};
}

template <>
expected<BeginWeightUpdateReqOutput> from_json<BeginWeightUpdateReqOutput>(const json& j) {
  return decode_status_reply<BeginWeightUpdateReqOutput>(j);
}

json to_json(const BeginWeightUpdateReqOutput& x) {
  return encode_status_reply(x);
}

template <>
expected<EndWeightUpdateReqInput> from_json<EndWeightUpdateReqInput>(const json& j) {
  return decode<EndWeightUpdateReqInput>(
    j, strictness::request, [](object_reader& r, EndWeightUpdateReqInput& x) {
      r.field("weight_version", x.weight_version, k_version);
      r.field("abort", x.abort);
      r.unsupported("expected_lora_checksums");
    });
}

json to_json(const EndWeightUpdateReqInput& x) {
  return {{"weight_version", optional_value(x.weight_version)}, {"abort", x.abort}};
}

template <>
expected<EndWeightUpdateReqOutput> from_json<EndWeightUpdateReqOutput>(const json& j) {
  return decode<EndWeightUpdateReqOutput>(
    j, strictness::lenient, [](object_reader& r, EndWeightUpdateReqOutput& x) {
      r.field("success", x.success);
      r.field("message", x.message);
      r.field("weight_version", x.weight_version);
      r.field("session_open", x.session_open);
    });
}

json to_json(const EndWeightUpdateReqOutput& x) {
  return {{"success", x.success},
          {"message", x.message},
          {"weight_version", x.weight_version},
          {"session_open", x.session_open}};
}

template <>
expected<PostProcessWeightsReqInput> from_json<PostProcessWeightsReqInput>(const json& j) {
  return decode<PostProcessWeightsReqInput>(
    j, strictness::request, [](object_reader& r, PostProcessWeightsReqInput& x) {
      std::optional<bool> current;
      std::optional<bool> gen1; // the v0.5.8 patch's spelling
      r.field("restore_weights_before_loading", current);
      r.field("restore_weights_before_load", gen1);
      r.field("post_process_quantization", x.post_process_quantization);
      r.field("selector", x.selector);
      if (!r.ok())
        return;
      if (current && gen1 && *current != *gen1) {
        r.cx().fail(r.where(), "restore_weights_before_loading and restore_weights_before_load "
                               "disagree; send one");
        return;
      }
      x.restore_weights_before_loading = current.value_or(gen1.value_or(false));
    });
}

json to_json(const PostProcessWeightsReqInput& x) {
  return {{"restore_weights_before_loading", x.restore_weights_before_loading},
          {"post_process_quantization", x.post_process_quantization},
          {"selector", to_string(x.selector)}};
}

template <>
expected<PostProcessWeightsReqOutput> from_json<PostProcessWeightsReqOutput>(const json& j) {
  return decode_status_reply<PostProcessWeightsReqOutput>(j);
}

json to_json(const PostProcessWeightsReqOutput& x) {
  return encode_status_reply(x);
}

template <>
expected<UpdateWeightVersionReqInput> from_json<UpdateWeightVersionReqInput>(const json& j) {
  return decode<UpdateWeightVersionReqInput>(
    j, strictness::request, [](object_reader& r, UpdateWeightVersionReqInput& x) {
      r.required("new_version", x.new_version, k_version);
      r.field("abort_all_requests", x.abort_all_requests);
    });
}

json to_json(const UpdateWeightVersionReqInput& x) {
  return {{"new_version", x.new_version}, {"abort_all_requests", x.abort_all_requests}};
}

template <>
expected<UpdateWeightVersionReqOutput> from_json<UpdateWeightVersionReqOutput>(const json& j) {
  return decode<UpdateWeightVersionReqOutput>(
    j, strictness::lenient, [](object_reader& r, UpdateWeightVersionReqOutput& x) {
      r.field("success", x.success);
      r.field("message", x.message);
      r.field("new_version", x.new_version);
    });
}

json to_json(const UpdateWeightVersionReqOutput& x) {
  return {{"success", x.success}, {"message", x.message}, {"new_version", x.new_version}};
}

// ---- verification -------------------------------------------------------------------------------

template <>
expected<CheckWeightsReqInput> from_json<CheckWeightsReqInput>(const json& j) {
  return decode<CheckWeightsReqInput>(
    j, strictness::request, [](object_reader& r, CheckWeightsReqInput& x) {
      r.field("action", x.action);
      r.field("allow_quant_error", x.allow_quant_error);
      // An empty substring would match, and so skip, every tensor.
      r.field("skip_tensor_list", x.skip_tensor_list, list_rule<text_rule>{.elem = k_name});
      r.field("selector", x.selector);
      r.unsupported("include_draft", nullptr, R"(use "selector": "all")");
    });
}

json to_json(const CheckWeightsReqInput& x) {
  return {{"action", to_string(x.action)},
          {"allow_quant_error", x.allow_quant_error},
          {"skip_tensor_list", x.skip_tensor_list},
          {"selector", to_string(x.selector)}};
}

template <>
expected<ParallelismInfo> from_json<ParallelismInfo>(const json& j) {
  return decode<ParallelismInfo>(j, strictness::lenient,
                                 [](object_reader& r, ParallelismInfo& x) { read_fields(r, x); });
}

json to_json(const ParallelismInfo& x) {
  return fields_of(x);
}

template <>
expected<ChecksumInfo> from_json<ChecksumInfo>(const json& j) {
  return decode<ChecksumInfo>(j, strictness::lenient,
                              [](object_reader& r, ChecksumInfo& x) { read_fields(r, x); });
}

json to_json(const ChecksumInfo& x) {
  return fields_of(x);
}

template <>
expected<CheckWeightsReqOutput> from_json<CheckWeightsReqOutput>(const json& j) {
  return decode<CheckWeightsReqOutput>(
    j, strictness::lenient, [](object_reader& r, CheckWeightsReqOutput& x) {
      r.field("success", x.success);
      r.field("message", x.message);
      // "payload": what rlserve wrote before it took SGLang's HTTP name.
      const char* ranks = r.present("ranks") ? "ranks" : "payload";
      r.object_list(ranks, x.payload,
                    [](object_reader& s, ChecksumInfo& c) { read_fields(s, c); });
      r.field("per_engine_checksum", x.per_engine_checksum);
      r.field("changed", x.changed);
      r.field("unchanged", x.unchanged);
    });
}

json to_json(const CheckWeightsReqOutput& x) {
  auto ranks = json::array();
  for (const auto& c : x.payload)
    ranks.push_back(fields_of(c));
  json out = {{"success", x.success},
              {"message", x.message},
              {"ranks", std::move(ranks)},
              {"changed", x.changed},
              {"unchanged", x.unchanged}};
  // SGLang writes it only for a checksum.
  if (!x.per_engine_checksum.empty())
    out["per_engine_checksum"] = x.per_engine_checksum;
  return out;
}

template <>
expected<GetWeightsByNameReqInput> from_json<GetWeightsByNameReqInput>(const json& j) {
  return decode<GetWeightsByNameReqInput>(
    j, strictness::request, [](object_reader& r, GetWeightsByNameReqInput& x) {
      r.required("name", x.name, k_name);
      r.field("truncate_size", x.truncate_size, int_rule<int32_t>{.lo = 0});
      r.field("selector", x.selector);
    });
}

json to_json(const GetWeightsByNameReqInput& x) {
  return {{"name", x.name},
          {"truncate_size", x.truncate_size},
          {"selector", to_string(x.selector)}};
}

template <>
expected<GetWeightsByNameReqOutput> from_json<GetWeightsByNameReqOutput>(const json& j) {
  return decode<GetWeightsByNameReqOutput>(
    j, strictness::lenient, [](object_reader& r, GetWeightsByNameReqOutput& x) {
      r.field("success", x.success);
      r.field("message", x.message);
      // Weights can be NaN or infinite (that is often why someone reads them).
      r.field("parameter", x.parameter, list_rule<lenient_float_rule>{});
      r.field("dtype", x.type);
      r.field("shape", x.shape, shape_rule{});
    });
}

json to_json(const GetWeightsByNameReqOutput& x) {
  return {{"success", x.success},
          {"message", x.message},
          {"parameter", float_list(x.parameter)},
          {"dtype", dtype_value(x.type)},
          {"shape", shape_value(x.shape)}};
}

} // namespace rlserve
