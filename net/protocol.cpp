#include "net/protocol.hpp"

#include <cstring>
#include <unordered_set>

#include "messages/dtype.hpp"
#include "messages/json_codec.hpp"

namespace rlserve::net {

std::string_view to_string(error_code code) {
  switch (code) {
    case error_code::bad_json: return "bad_json";
    case error_code::bad_request: return "bad_request";
    case error_code::bad_frame: return "bad_frame";
    case error_code::unknown_type: return "unknown_type";
    case error_code::unauthorized: return "unauthorized";
    case error_code::forbidden: return "forbidden";
    case error_code::duplicate_id: return "duplicate_id";
    case error_code::too_many_requests: return "too_many_requests";
    case error_code::too_large: return "too_large";
    case error_code::engine_error: return "engine_error";
    case error_code::shutting_down: return "shutting_down";
    case error_code::internal_error: return "internal_error";
  }
  return "unknown";
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

expected<request_envelope> read_envelope(const json& frame, json& id_out) {
  id_out = nullptr;
  if (!frame.is_object())
    return fail("a request is a JSON object {\"id\", \"type\", \"body\"}, got " +
                std::string(frame.type_name()));
  request_envelope out;
  auto id = frame.find("id");
  if (id == frame.end() || !(id->is_string() || id->is_number_integer()))
    return fail("id: expected a string or an integer chosen by the client");
  out.id = *id;
  id_out = *id;
  auto type = frame.find("type");
  if (type == frame.end() || !type->is_string() || type->get_ref<const std::string&>().empty())
    return fail("type: expected the route name as a string (\"generate\", \"begin_weight_update\", ...)");
  out.type = type->get<std::string>();
  auto body = frame.find("body");
  if (body == frame.end() || body->is_null())
    out.body = json::object();
  else if (body->is_object())
    out.body = *body;
  else
    return fail("body: expected an object, got " + std::string(body->type_name()));
  for (auto it = frame.begin(); it != frame.end(); ++it)
    if (it.key() != "id" && it.key() != "type" && it.key() != "body")
      return fail(it.key() + ": unknown key in the request envelope (keys: id, type, body)");
  return out;
}

std::string reply_text(const json& id, std::string_view type, bool ok, const json& body) {
  json j = json::object();
  j["id"] = id;
  j["type"] = type;
  j["ok"] = ok;
  j["body"] = body;
  return dump(j);
}

std::string chunk_text(const json& id, std::string_view type, const json& body) {
  json j = json::object();
  j["id"] = id;
  j["type"] = std::string(type) + ".chunk";
  j["body"] = body;
  return dump(j);
}

std::string error_text(const json& id, std::string_view type, error_code code,
                       std::string_view message) {
  json j = json::object();
  j["id"] = id;
  if (!type.empty())
    j["type"] = type;
  j["error"] = {{"code", to_string(code)}, {"message", message}};
  return dump(j);
}

namespace {

// A non-negative integer that fits `max`.
expected<uint64_t> read_u64(const json& j, const std::string& path) {
  if (j.is_number_unsigned())
    return j.get<uint64_t>();
  if (j.is_number_integer()) {
    auto v = j.get<int64_t>();
    if (v >= 0)
      return static_cast<uint64_t>(v);
  }
  return fail(path + ": expected a non-negative integer, got " + dump(j));
}

} // namespace

expected<binary_request> read_binary_frame(const shared_bytes& frame, json& id_out) {
  id_out = nullptr;
  const auto f = frame.bytes();
  if (f.size() < 4)
    return fail("binary frame of " + std::to_string(f.size()) +
                " bytes: expected a 4-byte header length, a JSON header and the payload");
  uint32_t h = 0;
  for (int i = 3; i >= 0; --i)
    h = (h << 8) | static_cast<uint8_t>(f[static_cast<std::size_t>(i)]);
  if (h == 0 || h > f.size() - 4)
    return fail("binary frame: header length " + std::to_string(h) + " does not fit the frame of " +
                std::to_string(f.size()) + " bytes");
  std::string_view header_text(reinterpret_cast<const char*>(f.data()) + 4, h);
  auto header = parse_json(header_text);
  if (!header)
    return fail("binary frame header: " + header.error());
  binary_request out;
  auto env = read_envelope(*header, id_out);
  if (!env)
    return std::move(env).take_failure();
  out.envelope = std::move(*env);
  auto& body = out.envelope.body;
  auto nt = body.find("named_tensors");
  if (nt == body.end() || !nt->is_array())
    return fail("body.named_tensors: expected a list of {name, dtype, shape, offset, nbytes} "
                "describing the payload");
  const std::byte* payload = f.data() + 4 + h;
  const std::size_t payload_size = f.size() - 4 - h;
  std::unordered_set<std::string> names;
  for (std::size_t i = 0; i < nt->size(); ++i) {
    const auto& d = (*nt)[i];
    std::string path = "body.named_tensors[" + std::to_string(i) + "]";
    if (!d.is_object())
      return fail(path + ": expected an object");
    for (auto it = d.begin(); it != d.end(); ++it)
      if (it.key() != "name" && it.key() != "dtype" && it.key() != "shape" &&
          it.key() != "offset" && it.key() != "nbytes")
        return fail(path + "." + it.key() + ": unknown key (keys: name, dtype, shape, offset, nbytes)");
    auto name = d.find("name");
    if (name == d.end() || !name->is_string() || name->get_ref<const std::string&>().empty())
      return fail(path + ".name: expected a non-empty string");
    if (!names.insert(name->get<std::string>()).second)
      return fail(path + ".name: \"" + name->get<std::string>() + "\" appears twice");
    auto dt = d.find("dtype");
    if (dt == d.end() || !dt->is_string())
      return fail(path + ".dtype: expected a PyTorch dtype name (\"bfloat16\", ...)");
    auto type = dtype_from_torch_name(dt->get<std::string>());
    if (!type)
      return fail(path + ".dtype: unknown dtype \"" + dt->get<std::string>() + "\"");
    auto sh = d.find("shape");
    if (sh == d.end() || !sh->is_array())
      return fail(path + ".shape: expected a list of non-negative integers");
    std::vector<int64_t> shape;
    uint64_t numel = 1;
    bool overflow = false;
    for (std::size_t k = 0; k < sh->size(); ++k) {
      auto dim = read_u64((*sh)[k], path + ".shape[" + std::to_string(k) + "]");
      if (!dim)
        return std::move(dim).take_failure();
      if (*dim > static_cast<uint64_t>(INT64_MAX))
        return fail(path + ".shape[" + std::to_string(k) + "]: too large");
      shape.push_back(static_cast<int64_t>(*dim));
      if (*dim != 0 && numel > UINT64_MAX / *dim)
        overflow = true;
      else
        numel *= *dim;
    }
    auto es = element_size(*type);
    if (overflow || numel > UINT64_MAX / es)
      return fail(path + ".shape: the byte count overflows");
    uint64_t expect = numel * es;
    auto off = d.find("offset");
    if (off == d.end())
      return fail(path + ".offset: required (the tensor's first byte in the payload)");
    auto offset = read_u64(*off, path + ".offset");
    if (!offset)
      return std::move(offset).take_failure();
    uint64_t nbytes = expect;
    if (auto nb = d.find("nbytes"); nb != d.end() && !nb->is_null()) {
      auto v = read_u64(*nb, path + ".nbytes");
      if (!v)
        return std::move(v).take_failure();
      if (*v != expect)
        return fail(path + ".nbytes: " + std::to_string(*v) + " bytes, but shape and dtype make " +
                    std::to_string(expect));
      nbytes = *v;
    }
    if (*offset > payload_size || nbytes > payload_size - *offset)
      return fail(path + ": bytes [" + std::to_string(*offset) + ", " +
                  std::to_string(*offset + nbytes) + ") lie outside the payload of " +
                  std::to_string(payload_size) + " bytes");
    const std::byte* first = payload + *offset;
    NamedTensor t;
    t.name = name->get<std::string>();
    if (reinterpret_cast<uintptr_t>(first) % es == 0) {
      t.tensor = HostTensor::alias(*type, std::move(shape), frame.data, first, nbytes);
    } else {
      t.tensor = HostTensor::copy_of(*type, std::move(shape), {first, nbytes});
      ++out.copied_tensors;
    }
    out.tensor_bytes += nbytes;
    out.tensors.push_back(std::move(t));
  }
  body.erase("named_tensors");
  return out;
}

std::vector<std::byte> make_binary_frame(const json& id, std::string_view type, const json& body,
                                         std::span<const NamedTensor> tensors) {
  auto align = [](std::size_t n) {
    return (n + k_binary_alignment - 1) / k_binary_alignment * k_binary_alignment;
  };
  json b = body.is_object() ? body : json::object();
  json descs = json::array();
  std::size_t offset = 0;
  for (const auto& t : tensors) {
    descs.push_back({{"name", t.name},
                     {"dtype", std::string(torch_name(t.tensor.type))},
                     {"shape", t.tensor.shape},
                     {"offset", offset},
                     {"nbytes", t.tensor.nbytes}});
    offset = align(offset + t.tensor.nbytes);
  }
  b["named_tensors"] = std::move(descs);
  json header = {{"id", id}, {"type", type}, {"body", std::move(b)}};
  std::string text = dump(header);
  std::size_t h = align(4 + text.size()) - 4;
  text.resize(h, ' ');
  std::size_t payload_size = 0;
  if (!tensors.empty())
    payload_size = offset;
  std::vector<std::byte> frame(4 + h + payload_size);
  for (int i = 0; i < 4; ++i)
    frame[static_cast<std::size_t>(i)] = static_cast<std::byte>((h >> (8 * i)) & 0xff);
  std::memcpy(frame.data() + 4, text.data(), h);
  offset = 0;
  for (const auto& t : tensors) {
    if (t.tensor.nbytes)
      std::memcpy(frame.data() + 4 + h + offset, t.tensor.data.get(), t.tensor.nbytes);
    offset = align(offset + t.tensor.nbytes);
  }
  return frame;
}

} // namespace rlserve::net
