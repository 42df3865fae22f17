#include "net/protocol.hpp"

#include <algorithm>
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

std::size_t generate_bytes_limit(int64_t context_length) {
  return (std::size_t{1} << 20) + 64 * static_cast<std::size_t>(std::max<int64_t>(context_length, 0));
}

std::string peek_type(std::string_view text) {
  json::parser_callback_t keep_top = [](int depth, json::parse_event_t event, json&) {
    if (depth >= k_max_json_depth)
      return false;
    return event != json::parse_event_t::value || depth < 2;
  };
  json j;
  try {
    j = json::parse(text.begin(), text.end(), keep_top, /*allow_exceptions=*/false);
  } catch (...) { // bad_alloc; nlohmann reports everything else as a discarded value here
    return {};
  }
  if (!j.is_object())
    return {};
  auto type = j.find("type");
  return type != j.end() && type->is_string() ? type->get<std::string>() : std::string();
}

namespace {

// The SAX events of a frame, reduced to its top-level "id" and "type". Scanning stops at the
// first lexer or parser error (nlohmann calls parse_error, and a number beyond double's range
// is one of those in SAX mode), so only keys before the failure point are ever seen; values
// after them cannot change what was read.
class id_scanner {
public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  bool null() { return value(nullptr); }
  bool boolean(bool b) { return value(b); }
  bool number_integer(number_integer_t x) { return value(x); }
  bool number_unsigned(number_unsigned_t x) { return value(x); }
  bool number_float(number_float_t x, const string_t&) { return value(x); }
  bool string(string_t& s) { return value(s); }
  bool binary(binary_t&) { return value(nullptr); }
  bool start_object(std::size_t) { return open(true); }
  bool start_array(std::size_t) { return open(false); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(string_t& k) {
    slot_ = depth_ != 1 ? slot::none : k == "id" ? slot::id : k == "type" ? slot::type : slot::none;
    return true;
  }
  template <class Exception>
  bool parse_error(std::size_t, const std::string&, const Exception&) {
    return false;
  }

  recovered_ids result() const {
    recovered_ids out;
    out.type = type_;
    if (!top_object_)
      out.why_no_id = "the text does not start as a JSON object, so it has no \"id\"";
    else if (slot_ == slot::id)
      out.why_no_id = "the text goes wrong in the value of its \"id\"";
    else if (ids_ > 1)
      out.why_no_id = "the object has more than one \"id\" key before that point";
    else if (ids_ == 1 && id_.is_null())
      out.why_no_id = "its \"id\" is not a string or an integer";
    else if (ids_ == 0)
      out.why_no_id = "no top-level \"id\" key comes before that point";
    else
      out.id = id_;
    return out;
  }

private:
  enum class slot : uint8_t { none, id, type };

  bool open(bool object) {
    if (depth_ == 0)
      top_object_ = object;
    if (slot_ == slot::id) { // an id that is an object or array
      ++ids_;
      id_ = nullptr;
    }
    slot_ = slot::none;
    ++depth_;
    return true;
  }
  bool close() {
    --depth_;
    return true;
  }
  template <class T>
  bool value(T&& v) {
    if (slot_ == slot::id) {
      ++ids_;
      json j(std::forward<T>(v));
      id_ = j.is_string() || j.is_number_integer() ? std::move(j) : json(nullptr);
    } else if (slot_ == slot::type) {
      json j(std::forward<T>(v));
      type_ = j.is_string() ? j.get<std::string>() : std::string();
    }
    slot_ = slot::none;
    return true;
  }

  std::size_t depth_ = 0;
  bool top_object_ = false;
  slot slot_ = slot::none;
  int ids_ = 0;
  json id_;
  std::string type_;
};

} // namespace

recovered_ids recover_ids(std::string_view text) {
  // Only the head of the frame is scanned: ids come first in every client's frames, and a
  // hostile client must not make each refusal of a multi-megabyte frame parse all of it again
  // (a head cut inside a value fails there, like any other fault after the id).
  constexpr std::size_t k_scan_bytes = 64 * 1024;
  text = text.substr(0, std::min(text.size(), k_scan_bytes));
  id_scanner scan;
  try {
    // Strict: the same grammar as the parse that failed. Nesting costs no memory here (the
    // scanner keeps no values and nlohmann's SAX parser keeps one bit per level).
    json::sax_parse(text.begin(), text.end(), &scan, json::input_format_t::json, true);
  } catch (...) { // bad_alloc; every parse error comes to parse_error() instead
    return recovered_ids{nullptr, "", "the frame could not be scanned"};
  }
  return scan.result();
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
  if (!header) {
    auto ids = recover_ids(header_text); // the error still answers the request when it can
    id_out = ids.id;
    return fail("binary frame header: " + header.error() +
                (ids.id.is_null() ? "; this reply carries no id: " + ids.why_no_id : ""));
  }
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
