// Private to messages/json_codec_*.cpp: the reading machinery behind json_codec.hpp. Not for use
// outside messages/ (it pulls in all of nlohmann/json.hpp and may change at will).
//
// Decoding is written as straight-line code, one line per field:
//
//   void read_fields(object_reader& r, SamplingParams& x) {
//     r.field("max_new_tokens", x.max_new_tokens, int_rule<int32_t>{0});
//     r.field("top_p", x.top_p, num_rule{.lo = 0, .hi = 1, .lo_open = true});
//     ...
//   }
//
// The first error is recorded in the shared `context` and every later read becomes a no-op, so
// readers need no `if` after each field and report the first problem in document order. Paths
// ("shapes[1][0]") are chains of stack frames rendered only when an error is reported: reading
// a 100k-token input_ids list builds no strings.
#pragma once

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "messages/dtype.hpp"
#include "messages/enums.hpp"
#include "messages/expected.hpp"

namespace rlserve {
struct HostTensor;
struct NamedTensor;
struct DeviceTensorRef;
struct NamedDeviceTensor;
} // namespace rlserve

namespace rlserve::json_codec_detail {

using json = nlohmann::json;

// ---- paths and errors ---------------------------------------------------------------------------

// Where a value sits in the document: a key or an index below a parent. Each frame lives on
// the stack of the function reading that level and points at its parent frame, so a child
// must not outlive its parent. Children can only be made from named paths (the rvalue
// overloads are deleted): `r.at("x").index(i)` would point at a temporary that is gone by
// the next statement; write `const path list = r.at("x"); list.index(i)` instead.
class path {
public:
  path() = default; // the document root
  path key(std::string_view k) const& { return path(this, k, npos); }
  path index(std::size_t i) const& { return path(this, {}, i); }
  path key(std::string_view k) const&& = delete;
  path index(std::size_t i) const&& = delete;
  // "sampling_params.stop[2]"; empty at the root.
  std::string str() const;

private:
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
  path(const path* parent, std::string_view k, std::size_t i)
    : parent_(parent), key_(k), index_(i) {}
  const path* parent_ = nullptr;
  std::string_view key_;
  std::size_t index_ = npos;
};

// A short rendering of a JSON value for "got ..." (strings quoted, long values cut at ~80
// characters, invalid UTF-8 replaced rather than thrown on).
std::string describe(const json& v);

// The state of one decode: the first error, if any.
class context {
public:
  bool ok() const { return error_.empty(); }
  // Records "<path>: <what>" unless an error is already recorded.
  void fail(const path& p, std::string_view what);
  // Records "<path>: expected <what>, got <describe(v)>".
  void expected_but_got(const path& p, std::string_view what, const json& v);
  std::string take_error() { return std::move(error_); }

private:
  std::string error_;
};

// ---- value rules --------------------------------------------------------------------------------
// A rule says what a value must look like beyond its C++ type; parse() below takes one per type.

struct no_rule {};

template <class T>
struct int_rule {
  T lo = std::numeric_limits<T>::min();
  T hi = std::numeric_limits<T>::max();
};

struct num_rule {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false; // (lo, ...] instead of [lo, ...]
  bool hi_open = false;
};

// Replies only: a number, or "nan" / "inf" / "-inf" (how to_json writes non-finite floats), or
// null (how other JSON writers spell them).
struct lenient_float_rule {};

struct text_rule {
  bool non_empty = false;
};

// A tensor shape: non-negative int64 dimensions whose product fits in int64.
struct shape_rule {};

template <class ElemRule>
struct list_rule {
  ElemRule elem{};
  bool non_empty = false;
};

template <class T>
inline constexpr bool is_message_enum_v =
  std::is_same_v<T, runner_selector> || std::is_same_v<T, pause_mode> ||
  std::is_same_v<T, check_weights_action>;

template <class T>
struct is_vector : std::false_type {};
template <class T>
struct is_vector<std::vector<T>> : std::true_type {};
template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};

// The rule a field gets when the reader names none: any value of the C++ type.
template <class T>
auto default_rule() {
  if constexpr (std::is_same_v<T, std::string>)
    return text_rule{};
  else if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, dtype> || is_message_enum_v<T>)
    return no_rule{};
  else if constexpr (std::is_integral_v<T>)
    return int_rule<T>{};
  else if constexpr (std::is_floating_point_v<T>)
    return num_rule{};
  else if constexpr (is_optional<T>::value)
    return default_rule<typename T::value_type>();
  else if constexpr (is_vector<T>::value)
    return list_rule<decltype(default_rule<typename T::value_type>())>{};
  else
    static_assert(is_vector<T>::value, "no default JSON rule for this type");
}

// ---- value parsers ------------------------------------------------------------------------------
// Each returns true and writes `out` when `v` is valid, or records an error and leaves `out`
// alone.

bool parse(context& cx, const json& v, const path& p, bool& out, no_rule);
bool parse(context& cx, const json& v, const path& p, std::string& out, text_rule r);
bool parse(context& cx, const json& v, const path& p, float& out, num_rule r);
bool parse(context& cx, const json& v, const path& p, double& out, num_rule r);
bool parse(context& cx, const json& v, const path& p, float& out, lenient_float_rule);
bool parse(context& cx, const json& v, const path& p, dtype& out, no_rule);
bool parse(context& cx, const json& v, const path& p, std::vector<int64_t>& out, shape_rule);

// Integers arrive as int64, uint64 or (from some writers) integral doubles. They are read into
// a 128-bit integer (a GCC/Clang extension) that holds every one of them exactly, so the range
// check below is a plain comparison for any field type, uint64 included.
using wide_int = __int128;
std::optional<wide_int> parse_integer(context& cx, const json& v, const path& p);

template <class T>
  requires(std::is_integral_v<T> && !std::is_same_v<T, bool>)
bool parse(context& cx, const json& v, const path& p, T& out, int_rule<T> r) {
  auto x = parse_integer(cx, v, p);
  if (!x)
    return false;
  if (*x < static_cast<wide_int>(r.lo) || *x > static_cast<wide_int>(r.hi)) {
    cx.expected_but_got(p, "an integer in " + std::to_string(r.lo) + ".." + std::to_string(r.hi),
                        v);
    return false;
  }
  out = static_cast<T>(*x);
  return true;
}

template <class E>
  requires is_message_enum_v<E>
bool parse(context& cx, const json& v, const path& p, E& out, no_rule) {
  if (!v.is_string()) {
    cx.expected_but_got(p, "a string", v);
    return false;
  }
  auto value = from_string<E>(v.get_ref<const std::string&>());
  if (!value) {
    cx.fail(p, "unknown value " + describe(v) + " (expected " + std::string(enum_choices<E>()) +
                 ")");
    return false;
  }
  out = *value;
  return true;
}

bool expect_array(context& cx, const json& v, const path& p);

// The ids of a compact "input_ids" value (parse_request_json); nullopt for any other value.
std::optional<std::vector<int32_t>> compact_ids(const json& v);

template <class T, class R>
bool parse(context& cx, const json& v, const path& p, std::vector<T>& out, list_rule<R> r) {
  if constexpr (std::is_same_v<T, int32_t> && std::is_same_v<R, int_rule<int32_t>>) {
    if (auto ids = compact_ids(v)) {
      // Every id is a non-negative int32 already; only the rule's bounds remain to check.
      bool in_bounds = !(r.non_empty && ids->empty());
      for (auto id : *ids)
        in_bounds = in_bounds && id >= r.elem.lo && id <= r.elem.hi;
      if (in_bounds) {
        out = std::move(*ids);
        return true;
      }
      return parse(cx, json(*ids), p, out, r); // the plain path says what is wrong
    }
  }
  if (!expect_array(cx, v, p))
    return false;
  if (r.non_empty && v.empty()) {
    cx.fail(p, "empty");
    return false;
  }
  std::vector<T> tmp;
  tmp.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    T elem{};
    if (!parse(cx, v[i], p.index(i), elem, r.elem))
      return false;
    tmp.push_back(std::move(elem));
  }
  out = std::move(tmp);
  return true;
}

template <class T, class R>
bool parse(context& cx, const json& v, const path& p, std::optional<T>& out, R r) {
  T tmp{};
  if (!parse(cx, v, p, tmp, r))
    return false;
  out = std::move(tmp);
  return true;
}

// ---- objects ------------------------------------------------------------------------------------

// Counts one ignored top-level request field and tells the hook (json_codec.hpp).
void note_ignored_request_field(std::string_view field);

enum class strictness : uint8_t {
  strict = 1, // parts of requests (sampling_params, tensors): an unknown key is an error
  lenient,    // replies: unknown keys are ignored (forward compatibility)
  request,    // a request's top level: unknown keys are ignored and counted (SGLang's request
              // dataclasses take fields they do not know; trainers send such fields)
};

// Reads one JSON object (null reads as {}). Every key the decoder asks about is remembered, so
// finish() can name the keys nobody asked about.
class object_reader {
public:
  object_reader(context& cx, const json& j, const path& p, strictness s);

  context& cx() { return cx_; }
  bool ok() const { return cx_.ok(); }
  strictness mode() const { return mode_; }
  // The path of a key of this object, to pass down (see `path`).
  path at(std::string_view key) const { return p_.key(key); }
  const path& where() const { return p_; }

  // The value under `key`, or nullptr when it is missing or null (SGLang: null = default).
  // Also nullptr once an error is recorded, which is what makes later reads no-ops.
  const json* get(std::string_view key);
  // Like get(), but the key counts as present even when null (for "is it set" checks).
  bool present(std::string_view key);

  template <class T>
  void field(std::string_view key, T& out) {
    field(key, out, default_rule<T>());
  }
  template <class T, class R>
  void field(std::string_view key, T& out, R rule) {
    if (auto v = get(key))
      parse(cx_, *v, p_.key(key), out, rule);
  }
  template <class T>
  void required(std::string_view key, T& out) {
    required(key, out, default_rule<T>());
  }
  template <class T, class R>
  void required(std::string_view key, T& out, R rule) {
    if (auto v = get(key))
      parse(cx_, *v, p_.key(key), out, rule);
    else
      missing(key);
  }

  // A nested object: `read(object_reader&)` reads its fields; unknown keys in it are checked.
  template <class F>
  void object(std::string_view key, F&& read) {
    if (auto v = get(key)) {
      object_reader sub(cx_, *v, p_.key(key), nested_mode());
      read(sub);
      sub.finish();
    }
  }

  // A list of objects, each read into a fresh T by `read(object_reader&, T&)`.
  template <class T, class F>
  void object_list(std::string_view key, std::vector<T>& out, F&& read) {
    auto v = get(key);
    if (!v)
      return;
    const path lp = p_.key(key);
    if (!expect_array(cx_, *v, lp))
      return;
    std::vector<T> tmp;
    tmp.reserve(v->size());
    for (std::size_t i = 0; i < v->size() && cx_.ok(); ++i) {
      object_reader sub(cx_, (*v)[i], lp.index(i), nested_mode());
      T elem{};
      read(sub, elem);
      sub.finish();
      tmp.push_back(std::move(elem));
    }
    if (cx_.ok())
      out = std::move(tmp);
  }

  // An SGLang field rlserve does not implement: fine while inert (missing, null, equal to
  // `sglang_default`, or, when that default is None, false / "" / [] / {}), otherwise
  // "<key>: not supported by rlserve (got ...)" followed by `hint` when given.
  void unsupported(std::string_view key, const json& sglang_default = nullptr,
                   std::string_view hint = {});

  // An SGLang field that changes nothing rlserve returns (a scheduling priority, a logging
  // switch, a routing hint for a single engine): accepted whatever its value, and ignored.
  void ignore(std::string_view key) { remember(key); }

  // An SGLang batch form (a list where rlserve takes one value) gets its own message rather
  // than a type error. `nested_list`: only a list of lists is a batch (input_ids).
  void reject_batch(std::string_view key, bool nested_list = false);

  void fail(std::string_view key, std::string_view what) { cx_.fail(p_.key(key), what); }
  void missing(std::string_view key) { fail(key, "required field is missing"); }

  // Strict mode: the first key nobody asked about is an error ("max_tokens: unknown field").
  void finish();

private:
  void remember(std::string_view key);
  // The parts of a request are strict even when its top level ignores unknown keys.
  strictness nested_mode() const {
    return mode_ == strictness::request ? strictness::strict : mode_;
  }

  context& cx_;
  const json* obj_ = nullptr; // null when the value was JSON null or not an object
  path p_;
  strictness mode_;
  std::vector<std::string_view> known_;
};

// Decodes a whole document into a local T: the value comes back only when everything
// validated, so a caller never sees a half-filled struct.
template <class T, class F>
expected<T> decode(const json& j, strictness s, F&& read) {
  context cx;
  path root;
  T x{};
  {
    object_reader r(cx, j, root, s);
    read(r, x);
    r.finish();
  }
  if (!cx.ok())
    return fail(cx.take_error());
  return x;
}

// ---- writing ------------------------------------------------------------------------------------

// The shortest decimal that reads back as the same float: 0.7f is written 0.7. NaN and
// infinities become "nan", "inf", "-inf" (see lenient_float_rule).
json float_value(float x);
template <class T>
json optional_value(const std::optional<T>& x) {
  return x ? json(*x) : json(nullptr);
}
json float_list(const std::vector<float>& xs);
json dtype_value(dtype t);
json shape_value(const std::vector<int64_t>& shape);

// ---- shared between the family files ------------------------------------------------------------

// Tensor readers (json_codec_tensor.cpp), used by UpdateWeightsFromTensorReqInput. `name`
// (optional) goes into error messages so a bad payload names its tensor.
void read_fields(object_reader& r, HostTensor& x, std::string_view name = {});
void read_fields(object_reader& r, NamedTensor& x);
void read_fields(object_reader& r, DeviceTensorRef& x, std::string_view name = {});
void read_fields(object_reader& r, NamedDeviceTensor& x);
void write_fields(json& j, const HostTensor& x);
void write_fields(json& j, const DeviceTensorRef& x);

// `stop` (SGLang's and OpenAI's): one string or a list of them, none empty (an empty stop
// string would end every request at its first token).
void read_stop(object_reader& r, std::vector<std::string>& out);

// `custom_params` (SGLang's SamplingParams and OpenAI requests): an object, or null, whose keys
// reach a custom logit processor (refused elsewhere), so they are ignored, except
// `return_top_p_token_ids`, slime's top-p replay switch (a bool or null). With `top_p_replay`
// (/generate's SamplingParams) it is read into it; without (OpenAI's routes, whose replies have no
// place for the kept sets) a true value is refused, before the rollout rather than failing
// slime's training step after it.
void read_custom_params(object_reader& r, bool* top_p_replay = nullptr);

// Numbers of elements and bytes of a shape that passed shape_rule, or nullopt when the byte
// count overflows int64.
std::optional<int64_t> byte_count(const std::vector<int64_t>& shape, dtype t);

} // namespace rlserve::json_codec_detail
