// JSON codecs of tensor.hpp (HostTensor, NamedTensor, DeviceTensorRef) and of
// weight_update.hpp's NamedDeviceTensor, which is a DeviceTensorRef with a name.
#include "messages/base64.hpp"
#include "messages/json_codec.hpp"
#include "messages/json_codec_detail.hpp"
#include "messages/torch_pickle.hpp"

namespace rlserve {

using namespace json_codec_detail;

namespace {

// cudaIpcEventHandle_t is 64 opaque bytes (CUDA_IPC_HANDLE_SIZE).
constexpr std::size_t k_ipc_event_handle_bytes = 64;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i)
    out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::string tensor_label(std::string_view name) {
  return name.empty() ? std::string("tensor") : "tensor \"" + std::string(name) + "\"";
}

} // namespace

namespace json_codec_detail {

void read_fields(object_reader& r, HostTensor& x, std::string_view name) {
  dtype type = dtype::f32;
  std::vector<int64_t> shape;
  std::string data;
  r.required("dtype", type);
  r.required("shape", shape, shape_rule{});
  r.required("data", data);
  if (!r.ok())
    return;
  auto nbytes = byte_count(shape, type);
  if (!nbytes) {
    r.fail("shape", tensor_label(name) + ": " + shape_text(shape) + " x " +
                      std::to_string(element_size(type)) + " bytes overflow int64");
    return;
  }
  // Check the size from the text's length first: a mismatch is then reported without decoding
  // (and allocating) a payload that is going to be refused anyway.
  auto size = base64_decoded_size(data);
  if (!size) {
    r.fail("data", size.error());
    return;
  }
  if (static_cast<int64_t>(*size) != *nbytes) {
    r.fail("data", tensor_label(name) + " has " + std::to_string(*size) + " bytes, but shape " +
                     shape_text(shape) + " of " + std::string(torch_name(type)) + " needs " +
                     std::to_string(*nbytes));
    return;
  }
  auto bytes = base64_decode(data);
  if (!bytes) {
    r.fail("data", bytes.error());
    return;
  }
  x = HostTensor::adopt(type, std::move(shape), std::move(*bytes));
}

void read_fields(object_reader& r, NamedTensor& x) {
  NamedTensor tmp;
  r.required("name", tmp.name, text_rule{.non_empty = true});
  read_fields(r, tmp.tensor, tmp.name);
  if (r.ok())
    x = std::move(tmp);
}

void read_fields(object_reader& r, DeviceTensorRef& x, std::string_view name) {
  DeviceTensorRef tmp;
  std::string handle_hex, event_hex;
  r.field("device", tmp.device, int_rule<int32_t>{.lo = 0});
  r.field("device_uuid", tmp.device_uuid);
  r.field("pointer", tmp.pointer);
  r.field("ipc_handle", handle_hex);
  r.field("offset", tmp.offset);
  r.field("nbytes", tmp.nbytes);
  r.required("dtype", tmp.type);
  r.required("shape", tmp.shape, shape_rule{});
  r.field("ref_counter_handle", tmp.ref_counter_handle);
  r.field("ref_counter_offset", tmp.ref_counter_offset);
  r.field("event_handle", event_hex);
  r.field("event_sync_required", tmp.event_sync_required);
  if (!r.ok())
    return;
  if (!tmp.device_uuid.empty()) {
    // One spelling inside rlserve ("GPU-" + lowercase), whichever the sender used.
    auto uuid = normalize_device_uuid(tmp.device_uuid);
    if (!uuid) {
      r.fail("device_uuid", uuid.error());
      return;
    }
    tmp.device_uuid = std::move(*uuid);
  }
  if (!handle_hex.empty()) {
    auto handle = hex_decode(handle_hex);
    if (!handle) {
      r.fail("ipc_handle", handle.error());
      return;
    }
    if (auto ok = check_ipc_handle(*handle); !ok) {
      r.fail("ipc_handle", ok.error());
      return;
    }
    tmp.ipc_handle = std::move(*handle);
  }
  if (tmp.pointer != 0 && !tmp.ipc_handle.empty()) {
    r.cx().fail(r.where(), "pointer and ipc_handle are both set; send one (ipc_handle for "
                           "memory of another process, pointer for this process)");
    return;
  }
  if (tmp.pointer == 0 && tmp.ipc_handle.empty()) {
    r.cx().fail(r.where(), "neither pointer nor ipc_handle is set");
    return;
  }
  auto nbytes = byte_count(tmp.shape, tmp.type);
  if (!nbytes) {
    r.fail("shape", shape_text(tmp.shape) + " x " + std::to_string(element_size(tmp.type)) +
                      " bytes overflow int64");
    return;
  }
  // 0 means "not given" (the runner computes it); a given count is a check on dtype and shape.
  if (tmp.nbytes != 0 && tmp.nbytes != static_cast<uint64_t>(*nbytes)) {
    r.fail("nbytes", tensor_label(name) + " has nbytes " + std::to_string(tmp.nbytes) +
                       ", but shape " + shape_text(tmp.shape) + " of " +
                       std::string(torch_name(tmp.type)) + " is " + std::to_string(*nbytes) +
                       " bytes");
    return;
  }
  if (!tmp.ref_counter_handle.empty()) {
    if (auto ok = check_ref_counter_handle(tmp.ref_counter_handle); !ok) {
      r.fail("ref_counter_handle", ok.error());
      return;
    }
  }
  if (!event_hex.empty()) {
    auto event = hex_decode(event_hex);
    if (!event) {
      r.fail("event_handle", event.error());
      return;
    }
    if (event->size() != k_ipc_event_handle_bytes) {
      r.fail("event_handle", "expected " + std::to_string(k_ipc_event_handle_bytes) + " bytes (" +
                               std::to_string(2 * k_ipc_event_handle_bytes) +
                               " hex digits), got " + std::to_string(event->size()) + " bytes");
      return;
    }
    tmp.event_handle = std::move(*event);
  }
  if (tmp.event_sync_required && tmp.event_handle.empty()) {
    r.fail("event_sync_required", "true without an event_handle to wait for");
    return;
  }
  x = std::move(tmp);
}

void read_fields(object_reader& r, NamedDeviceTensor& x) {
  NamedDeviceTensor tmp;
  r.required("name", tmp.name, text_rule{.non_empty = true});
  read_fields(r, tmp.tensor, tmp.name);
  if (r.ok())
    x = std::move(tmp);
}

void write_fields(json& j, const HostTensor& x) {
  j["dtype"] = dtype_value(x.type);
  j["shape"] = shape_value(x.shape);
  j["data"] = base64_encode(x.bytes());
}

void write_fields(json& j, const DeviceTensorRef& x) {
  j["device"] = x.device;
  j["device_uuid"] = x.device_uuid;
  j["pointer"] = x.pointer;
  j["ipc_handle"] = hex_encode(x.ipc_handle);
  j["offset"] = x.offset;
  j["nbytes"] = x.nbytes;
  j["dtype"] = dtype_value(x.type);
  j["shape"] = shape_value(x.shape);
  j["ref_counter_handle"] = x.ref_counter_handle;
  j["ref_counter_offset"] = x.ref_counter_offset;
  j["event_handle"] = hex_encode(x.event_handle);
  j["event_sync_required"] = x.event_sync_required;
}

} // namespace json_codec_detail

// ---- public codecs ------------------------------------------------------------------------------

template <>
expected<HostTensor> from_json<HostTensor>(const json& j) {
  return decode<HostTensor>(j, strictness::strict,
                            [](object_reader& r, HostTensor& x) { read_fields(r, x); });
}

json to_json(const HostTensor& x) {
  json j = json::object();
  write_fields(j, x);
  return j;
}

template <>
expected<NamedTensor> from_json<NamedTensor>(const json& j) {
  return decode<NamedTensor>(j, strictness::strict,
                             [](object_reader& r, NamedTensor& x) { read_fields(r, x); });
}

json to_json(const NamedTensor& x) {
  json j = {{"name", x.name}};
  write_fields(j, x.tensor);
  return j;
}

template <>
expected<DeviceTensorRef> from_json<DeviceTensorRef>(const json& j) {
  return decode<DeviceTensorRef>(j, strictness::strict,
                                 [](object_reader& r, DeviceTensorRef& x) { read_fields(r, x); });
}

json to_json(const DeviceTensorRef& x) {
  json j = json::object();
  write_fields(j, x);
  return j;
}

template <>
expected<NamedDeviceTensor> from_json<NamedDeviceTensor>(const json& j) {
  return decode<NamedDeviceTensor>(
    j, strictness::strict, [](object_reader& r, NamedDeviceTensor& x) { read_fields(r, x); });
}

json to_json(const NamedDeviceTensor& x) {
  json j = {{"name", x.name}};
  write_fields(j, x.tensor);
  return j;
}

} // namespace rlserve
