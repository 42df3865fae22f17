// The reading machinery of json_codec_detail.hpp and parse_json: value parsers, the object
// reader, paths and error texts. The per-family files (json_codec_generate.cpp, ...) hold only
// the field lists.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <mutex>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "messages/json_codec.hpp"
#include "messages/json_codec_detail.hpp"

namespace rlserve {

namespace json_codec_detail {

namespace {

constexpr std::size_t k_describe_limit = 80;

// Shortest text that reads back as the same double: 0.1 -> "0.1", 1e300 -> "1e+300".
std::string number_text(double x) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, res.ptr);
}

std::string describe_range(const num_rule& r) {
  const bool has_lo = std::isfinite(r.lo);
  const bool has_hi = std::isfinite(r.hi);
  if (has_lo && has_hi)
    return std::string("a number in ") + (r.lo_open ? "(" : "[") + number_text(r.lo) + ", " +
           number_text(r.hi) + (r.hi_open ? ")" : "]");
  if (has_lo)
    return std::string("a number ") + (r.lo_open ? "> " : ">= ") + number_text(r.lo);
  if (has_hi)
    return std::string("a number ") + (r.hi_open ? "< " : "<= ") + number_text(r.hi);
  return "a number";
}

bool in_range(double x, const num_rule& r) {
  if (r.lo_open ? !(x > r.lo) : !(x >= r.lo))
    return false;
  if (r.hi_open ? !(x < r.hi) : !(x <= r.hi))
    return false;
  return true;
}

// A finite JSON number as a double (integers included), or an error.
std::optional<double> parse_number(context& cx, const json& v, const path& p) {
  if (!v.is_number()) {
    cx.expected_but_got(p, "a number", v);
    return std::nullopt;
  }
  auto x = v.get<double>();
  if (!std::isfinite(x)) {
    cx.expected_but_got(p, "a finite number", v);
    return std::nullopt;
  }
  return x;
}

} // namespace

// ---- paths and errors ---------------------------------------------------------------------------

std::string path::str() const {
  std::vector<const path*> frames;
  for (auto f = this; f != nullptr && f->parent_ != nullptr; f = f->parent_)
    frames.push_back(f);
  std::string out;
  for (auto it = frames.rbegin(); it != frames.rend(); ++it) {
    const path& f = **it;
    if (f.index_ != npos) {
      out += '[';
      out += std::to_string(f.index_);
      out += ']';
    } else {
      if (!out.empty())
        out += '.';
      out += f.key_;
    }
  }
  return out;
}

std::string describe(const json& v) {
  auto text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > k_describe_limit) {
    text.resize(k_describe_limit);
    text += "...";
  }
  return text;
}

void context::fail(const path& p, std::string_view what) {
  if (!error_.empty())
    return;
  error_ = p.str();
  if (!error_.empty())
    error_ += ": ";
  error_ += what;
}

void context::expected_but_got(const path& p, std::string_view what, const json& v) {
  if (!error_.empty())
    return;
  fail(p, "expected " + std::string(what) + ", got " + describe(v));
}

// ---- value parsers ------------------------------------------------------------------------------

bool parse(context& cx, const json& v, const path& p, bool& out, no_rule) {
  if (!v.is_boolean()) {
    cx.expected_but_got(p, "a boolean", v);
    return false;
  }
  out = v.get<bool>();
  return true;
}

bool parse(context& cx, const json& v, const path& p, std::string& out, text_rule r) {
  if (!v.is_string()) {
    cx.expected_but_got(p, r.non_empty ? "a non-empty string" : "a string", v);
    return false;
  }
  const auto& s = v.get_ref<const std::string&>();
  if (r.non_empty && s.empty()) {
    cx.expected_but_got(p, "a non-empty string", v);
    return false;
  }
  out = s;
  return true;
}

bool parse(context& cx, const json& v, const path& p, double& out, num_rule r) {
  auto x = parse_number(cx, v, p);
  if (!x)
    return false;
  if (!in_range(*x, r)) {
    cx.expected_but_got(p, describe_range(r), v);
    return false;
  }
  out = *x;
  return true;
}

bool parse(context& cx, const json& v, const path& p, float& out, num_rule r) {
  double x = 0;
  if (!parse(cx, v, p, x, r))
    return false;
  if (std::fabs(x) > FLT_MAX) {
    cx.expected_but_got(p, "a number that fits in float32", v);
    return false;
  }
  out = static_cast<float>(x);
  return true;
}

bool parse(context& cx, const json& v, const path& p, float& out, lenient_float_rule) {
  if (v.is_null()) {
    out = std::numeric_limits<float>::quiet_NaN();
    return true;
  }
  if (v.is_string()) {
    auto s = v.get_ref<const std::string&>();
    std::transform(s.begin(), s.end(), s.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (s == "nan") {
      out = std::numeric_limits<float>::quiet_NaN();
      return true;
    }
    if (s == "inf" || s == "infinity" || s == "-inf" || s == "-infinity") {
      out = s[0] == '-' ? -std::numeric_limits<float>::infinity()
                        : std::numeric_limits<float>::infinity();
      return true;
    }
  } else if (v.is_number()) {
    out = static_cast<float>(v.get<double>());
    return true;
  }
  cx.expected_but_got(p, R"(a number, "nan", "inf" or "-inf")", v);
  return false;
}

bool parse(context& cx, const json& v, const path& p, dtype& out, no_rule) {
  if (!v.is_string()) {
    cx.expected_but_got(p, "a dtype name (a string such as \"bfloat16\")", v);
    return false;
  }
  auto t = dtype_from_torch_name(v.get_ref<const std::string&>());
  if (!t) {
    cx.fail(p, "unknown dtype " + describe(v));
    return false;
  }
  out = *t;
  return true;
}

std::optional<wide_int> parse_integer(context& cx, const json& v, const path& p) {
  if (v.is_number_unsigned())
    return static_cast<wide_int>(v.get<uint64_t>());
  if (v.is_number_integer())
    return static_cast<wide_int>(v.get<int64_t>());
  if (v.is_number_float()) {
    auto d = v.get<double>();
    if (!std::isfinite(d) || d != std::trunc(d)) {
      cx.expected_but_got(p, "an integer", v);
      return std::nullopt;
    }
    // Beyond +-2^100 nothing fits any field; clamp there instead of overflowing the cast.
    constexpr double k_clamp = 1267650600228229401496703205376.0; // 2^100
    return static_cast<wide_int>(std::clamp(d, -k_clamp, k_clamp));
  }
  cx.expected_but_got(p, "an integer", v);
  return std::nullopt;
}

bool parse(context& cx, const json& v, const path& p, std::vector<int64_t>& out, shape_rule) {
  if (!expect_array(cx, v, p))
    return false;
  std::vector<int64_t> dims;
  dims.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    auto d = parse_integer(cx, v[i], p.index(i));
    if (!d)
      return false;
    if (*d < 0) {
      cx.fail(p.index(i), "negative dimension " + describe(v[i]));
      return false;
    }
    if (*d > std::numeric_limits<int64_t>::max()) {
      cx.expected_but_got(p.index(i), "a dimension that fits in int64", v[i]);
      return false;
    }
    dims.push_back(static_cast<int64_t>(*d));
  }
  // A zero dimension makes the tensor empty whatever the others are; otherwise the product
  // must fit in int64 (each factor does, so the running product never leaves 128 bits).
  if (std::find(dims.begin(), dims.end(), 0) == dims.end()) {
    wide_int n = 1;
    for (auto d : dims) {
      n *= d;
      if (n > std::numeric_limits<int64_t>::max()) {
        std::string text;
        for (auto x : dims)
          text += (text.empty() ? "" : " x ") + std::to_string(x);
        cx.fail(p, text + " elements overflow int64");
        return false;
      }
    }
  }
  out = std::move(dims);
  return true;
}

// Marks a binary value as compact input ids (little-endian int32s).
constexpr std::uint8_t k_compact_ids_subtype = 0x49;

std::optional<std::vector<int32_t>> compact_ids(const json& v) {
  if (!v.is_binary() || !v.get_binary().has_subtype() ||
      v.get_binary().subtype() != k_compact_ids_subtype)
    return std::nullopt;
  const auto& bytes = v.get_binary();
  std::vector<int32_t> ids(bytes.size() / sizeof(int32_t));
  if (!ids.empty()) // an empty array: no memcpy on null data
    std::memcpy(ids.data(), bytes.data(), ids.size() * sizeof(int32_t));
  return ids;
}

bool expect_array(context& cx, const json& v, const path& p) {
  if (v.is_array())
    return true;
  cx.expected_but_got(p, "a list", v);
  return false;
}

// ---- objects ------------------------------------------------------------------------------------

object_reader::object_reader(context& cx, const json& j, const path& p, strictness s)
  : cx_(cx), p_(p), mode_(s) {
  if (j.is_object())
    obj_ = &j;
  else if (!j.is_null())
    cx_.expected_but_got(p_, "an object", j);
}

void object_reader::remember(std::string_view key) {
  known_.push_back(key);
}

const json* object_reader::get(std::string_view key) {
  remember(key);
  if (!cx_.ok() || obj_ == nullptr)
    return nullptr;
  auto it = obj_->find(key);
  if (it == obj_->end() || it->is_null())
    return nullptr;
  return &*it;
}

bool object_reader::present(std::string_view key) {
  return get(key) != nullptr;
}

void object_reader::unsupported(std::string_view key, const json& sglang_default,
                                std::string_view hint) {
  auto v = get(key);
  if (v == nullptr)
    return;
  // With SGLang's default being None, every "off" spelling is inert; with a real default
  // (log_metrics: true), only that value is.
  const bool off = (v->is_boolean() && !v->get<bool>()) ||
                   (v->is_string() && v->get_ref<const std::string&>().empty()) ||
                   ((v->is_array() || v->is_object()) && v->empty());
  const bool inert = *v == sglang_default || (sglang_default.is_null() && off);
  if (inert)
    return;
  std::string what = "not supported by rlserve (got " + describe(*v) + ")";
  if (!hint.empty()) {
    what += "; ";
    what += hint;
  }
  fail(key, what);
}

void object_reader::reject_batch(std::string_view key, bool nested_list) {
  auto v = get(key);
  if (v == nullptr || !v->is_array())
    return;
  if (nested_list && (v->empty() || !v->front().is_array()))
    return;
  fail(key, "a list is SGLang's batch form; rlserve takes one request per message (got " +
              describe(*v) + ")");
}

void object_reader::finish() {
  if (!cx_.ok() || obj_ == nullptr || mode_ == strictness::lenient)
    return;
  for (const auto& item : obj_->items()) {
    const auto& k = item.key();
    if (std::find(known_.begin(), known_.end(), std::string_view(k)) != known_.end())
      continue;
    if (mode_ == strictness::request) {
      note_ignored_request_field(k);
      continue;
    }
    cx_.fail(p_.key(k), "unknown field");
    return;
  }
}

// ---- writing ------------------------------------------------------------------------------------

json float_value(float x) {
  // JSON has no NaN or infinity, and nlohmann would write null, which reads back as "the
  // default": a NaN temperature would silently become 1.0. A string is refused by request
  // decoders and read back by reply decoders.
  if (std::isnan(x))
    return "nan";
  if (std::isinf(x))
    return x > 0 ? "inf" : "-inf";
  char buf[32];
  auto res = std::to_chars(buf, buf + sizeof buf, x);
  double d = 0;
  std::from_chars(buf, res.ptr, d);
  return json(d);
}

json float_list(const std::vector<float>& xs) {
  auto out = json::array();
  for (auto x : xs)
    out.push_back(float_value(x));
  return out;
}

json dtype_value(dtype t) {
  return std::string(torch_name(t));
}

json shape_value(const std::vector<int64_t>& shape) {
  return json(shape);
}

std::optional<int64_t> byte_count(const std::vector<int64_t>& shape, dtype t) {
  wide_int n = static_cast<wide_int>(element_size(t));
  for (auto d : shape) {
    n *= d;
    if (n > std::numeric_limits<int64_t>::max())
      return std::nullopt;
  }
  return static_cast<int64_t>(n);
}

namespace {
std::atomic<uint64_t> g_ignored_fields{0};
std::mutex g_hook_mutex;
std::function<void(std::string_view)> g_hook;
} // namespace

void note_ignored_request_field(std::string_view field) {
  g_ignored_fields.fetch_add(1, std::memory_order_relaxed);
  std::function<void(std::string_view)> hook;
  {
    std::lock_guard<std::mutex> guard{g_hook_mutex};
    hook = g_hook;
  }
  if (hook)
    hook(field);
}

void read_stop(object_reader& r, std::vector<std::string>& out) {
  auto v = r.get("stop");
  if (v == nullptr)
    return;
  if (v->is_string()) {
    std::string s;
    if (parse(r.cx(), *v, r.at("stop"), s, text_rule{.non_empty = true}))
      out = {std::move(s)};
  } else if (v->is_array()) {
    parse(r.cx(), *v, r.at("stop"), out, list_rule<text_rule>{.elem = {.non_empty = true}});
  } else {
    r.cx().expected_but_got(r.at("stop"), "a string or a list of strings", *v);
  }
}

void read_custom_params(object_reader& r, bool* top_p_replay) {
  auto v = r.get("custom_params");
  if (v == nullptr)
    return;
  if (!v->is_object()) {
    r.cx().expected_but_got(r.at("custom_params"), "an object", *v);
    return;
  }
  auto it = v->find("return_top_p_token_ids");
  if (it == v->end() || it->is_null())
    return;
  const path params = r.at("custom_params");
  const path field = params.key("return_top_p_token_ids");
  if (!it->is_boolean()) {
    // SGLang's patch takes any truthy value; a string "false" would then ask for it.
    r.cx().expected_but_got(field, "true, false or null", *it);
    return;
  }
  if (top_p_replay) {
    *top_p_replay = it->get<bool>();
    return;
  }
  if (it->get<bool>())
    r.cx().fail(field, "not supported by rlserve on this route (got true): the kept sets of top-p "
                       "replay are returned in /generate's meta_info only");
}

} // namespace json_codec_detail

uint64_t ignored_request_fields() {
  return json_codec_detail::g_ignored_fields.load(std::memory_order_relaxed);
}

void on_ignored_request_field(std::function<void(std::string_view field)> hook) {
  std::lock_guard<std::mutex> guard{json_codec_detail::g_hook_mutex};
  json_codec_detail::g_hook = std::move(hook);
}

// ---- parse_json ---------------------------------------------------------------------------------

namespace {

struct too_deep {};
struct too_many_ids {};

// nlohmann's DOM builder, with the events of an "input_ids" array of non-negative int32s kept
// aside as bytes and handed to it as one compact binary value (see parse_request_json); the
// first event that is not such an id hands it the array as it was instead. Nesting is limited
// as parse_json's callback does.
class request_dom_builder {
public:
  using json = nlohmann::json;
  using dom = nlohmann::detail::json_sax_dom_parser<json>;

  request_dom_builder(json& root, std::size_t max_ids) : dom_(root, true), max_ids_(max_ids) {}

  bool null() { return value([&] { return dom_.null(); }); }
  bool boolean(bool b) { return value([&] { return dom_.boolean(b); }); }
  bool number_integer(json::number_integer_t x) {
    if (compact_ && x >= 0 && x <= std::numeric_limits<int32_t>::max())
      return keep(static_cast<int32_t>(x));
    return value([&] { return dom_.number_integer(x); });
  }
  bool number_unsigned(json::number_unsigned_t x) {
    if (compact_ && x <= static_cast<json::number_unsigned_t>(std::numeric_limits<int32_t>::max()))
      return keep(static_cast<int32_t>(x));
    return value([&] { return dom_.number_unsigned(x); });
  }
  bool number_float(json::number_float_t x, const json::string_t& s) {
    return value([&] { return dom_.number_float(x, s); });
  }
  bool string(json::string_t& s) { return value([&] { return dom_.string(s); }); }
  bool binary(json::binary_t& b) { return value([&] { return dom_.binary(b); }); }
  bool start_object(std::size_t n) {
    materialize();
    enter();
    return dom_.start_object(n);
  }
  bool key(json::string_t& k) {
    check_depth();
    ids_key_ = (depth_ == 1 || depth_ == 2) && k == "input_ids";
    return dom_.key(k);
  }
  bool end_object() {
    --depth_;
    return dom_.end_object();
  }
  bool start_array(std::size_t n) {
    materialize();
    if (ids_key_) { // collected here until it ends or turns out not to be ids
      ids_key_ = false;
      check_depth();
      ++depth_;
      compact_ = true;
      ids_.clear();
      return true;
    }
    enter();
    return dom_.start_array(n);
  }
  bool end_array() {
    --depth_;
    if (compact_) {
      compact_ = false;
      json::binary_t bytes(std::vector<std::uint8_t>(ids_.size() * sizeof(int32_t)),
                           json_codec_detail::k_compact_ids_subtype);
      if (!ids_.empty()) // an empty array: no memcpy on null data
        std::memcpy(bytes.data(), ids_.data(), bytes.size());
      ids_ = {};
      return dom_.binary(bytes);
    }
    return dom_.end_array();
  }
  // A template, as nlohmann's own: it throws `ex` as its own type (parse_error, out_of_range).
  template <class Exception>
  bool parse_error(std::size_t position, const std::string& last_token, const Exception& ex) {
    return dom_.parse_error(position, last_token, ex);
  }

private:
  void check_depth() const {
    if (depth_ >= static_cast<std::size_t>(k_max_json_depth))
      throw too_deep{};
  }
  void enter() {
    check_depth();
    ++depth_;
  }
  template <class F>
  bool value(F f) {
    ids_key_ = false;
    materialize();
    check_depth();
    return f();
  }
  bool keep(int32_t id) {
    if (ids_.size() >= max_ids_)
      throw too_many_ids{};
    ids_.push_back(id);
    return true;
  }
  // The array was not all ids: the DOM gets it as it was, and the event at hand follows.
  void materialize() {
    if (!compact_)
      return;
    compact_ = false;
    dom_.start_array(ids_.size());
    for (auto id : ids_)
      dom_.number_integer(id);
    ids_ = {};
  }

  dom dom_;
  std::size_t max_ids_;
  std::size_t depth_ = 0; // containers open, the compact array included
  // The next value is that of an "input_ids" key of the top-level object or of an object one
  // level down (a websocket envelope's "body"); ids elsewhere are left as they are.
  bool ids_key_ = false;
  bool compact_ = false;  // inside an "input_ids" array that is all ids so far
  std::vector<int32_t> ids_;
};

// "[json.exception.parse_error.101] parse error at ..." -> "parse error at ...": the bracketed
// id means nothing to a user.
std::string strip_exception_id(std::string what) {
  if (auto pos = what.find("] "); pos != std::string::npos && what.front() == '[')
    what.erase(0, pos + 2);
  return what;
}

} // namespace

namespace {

// Runs `parse`, turning every exception into an error value.
template <class Parse>
expected<nlohmann::json> parse_without_throwing(std::string_view text, std::size_t max_ids,
                                                Parse parse) {
  using nlohmann::json;
  try {
    return parse();
  } catch (const too_many_ids&) {
    return fail("input_ids: more than " + std::to_string(max_ids) +
                " token ids, more than the model's context length; the rest was not read");
  } catch (const too_deep&) {
    return fail("invalid JSON: nested deeper than " + std::to_string(k_max_json_depth) +
                " levels");
  } catch (const json::parse_error& e) {
    return fail("invalid JSON at byte " + std::to_string(e.byte) + ": " + strip_exception_id(e.what()));
  } catch (const json::out_of_range& e) {
    // A number outside double's range ("1e400"): nlohmann says "number overflow parsing
    // '1e400'" without a position.
    return fail("invalid JSON: " + strip_exception_id(e.what()) +
                " (a number outside the range of a 64-bit float)");
  } catch (const json::exception& e) {
    // No other nlohmann exception is known to come out of parse(); whatever does is still the
    // client's text that could not be read, never a reason for the caller to die.
    return fail("invalid JSON: " + strip_exception_id(e.what()));
  } catch (const std::bad_alloc&) {
    return fail("invalid JSON: the document of " + std::to_string(text.size()) +
                " bytes does not fit in the server's memory");
  } catch (const std::length_error&) {
    return fail("invalid JSON: the document of " + std::to_string(text.size()) +
                " bytes holds a value too large for the server");
  }
}

} // namespace

expected<nlohmann::json> parse_json(std::string_view text) {
  using nlohmann::json;
  json::parser_callback_t limit_depth = [](int depth, json::parse_event_t, json&) {
    // `depth` counts from 0 at the top level, so depth k is the (k+1)-th nesting level.
    if (depth >= k_max_json_depth)
      throw too_deep{};
    return true;
  };
  return parse_without_throwing(text, 0, [&] {
    return json::parse(text.begin(), text.end(), limit_depth);
  });
}

expected<nlohmann::json> parse_request_json(std::string_view text, std::size_t max_input_ids) {
  using nlohmann::json;
  return parse_without_throwing(text, max_input_ids, [&] {
    json root;
    request_dom_builder builder(root, max_input_ids);
    json::sax_parse(text.begin(), text.end(), &builder);
    return root;
  });
}

} // namespace rlserve
