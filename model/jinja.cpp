// The Jinja subset of jinja.hpp: a lexer that applies jinja2's whitespace rules, a recursive
// descent parser into a tree, and a tree walker over Python-like values.
//
// Errors inside the walker are thrown as `template_error` and caught at render(): a template's
// evaluation nests as deep as its expressions, and every step can fail on a value of the wrong
// type, so unwinding is what keeps each step one line. Nothing else in rlserve sees them.
#include "model/jinja.hpp"
#include "model/python_text.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <functional>
#include <limits>
#include <optional>
#include <unordered_map>
#include <variant>
#include <vector>

#include <fmt/format.h>

namespace rlserve::model::jinja {

namespace {

struct template_error {
  std::string message;
};

[[noreturn]] void raise(std::string message) { throw template_error{std::move(message)}; }

// ---- values -------------------------------------------------------------------------------------

struct value;
using list_t = std::vector<value>;
using dict_t = std::vector<std::pair<std::string, value>>; // insertion order, as Python's dict

struct call_args {
  std::vector<value> positional;
  std::vector<std::pair<std::string, value>> keyword;
};
using function_t = std::function<value(call_args&)>;

struct undefined_t {
  std::string name; // what was looked up, for error messages
};
struct none_t {};
struct namespace_t {
  dict_t attrs;
};

struct value {
  std::variant<undefined_t, none_t, bool, int64_t, double, std::string, std::shared_ptr<const list_t>,
               std::shared_ptr<const dict_t>, std::shared_ptr<namespace_t>, std::shared_ptr<const function_t>>
    v;

  value() = default;
  value(undefined_t u) : v(std::move(u)) {}
  value(none_t n) : v(n) {}
  value(bool b) : v(b) {}
  value(int64_t i) : v(i) {}
  value(int i) : v(int64_t(i)) {}
  value(std::size_t i) : v(int64_t(i)) {}
  value(double d) : v(d) {}
  value(std::string s) : v(std::move(s)) {}
  value(const char* s) : v(std::string(s)) {}
  value(list_t l) : v(std::make_shared<const list_t>(std::move(l))) {}
  value(dict_t d) : v(std::make_shared<const dict_t>(std::move(d))) {}
  value(std::shared_ptr<namespace_t> n) : v(std::move(n)) {}
  value(function_t f) : v(std::make_shared<const function_t>(std::move(f))) {}

  bool is_undefined() const { return std::holds_alternative<undefined_t>(v); }
  bool is_none() const { return std::holds_alternative<none_t>(v); }
  bool is_bool() const { return std::holds_alternative<bool>(v); }
  bool is_int() const { return std::holds_alternative<int64_t>(v); }
  bool is_float() const { return std::holds_alternative<double>(v); }
  bool is_number() const { return is_int() || is_float(); }
  bool is_string() const { return std::holds_alternative<std::string>(v); }
  bool is_list() const { return std::holds_alternative<std::shared_ptr<const list_t>>(v); }
  bool is_dict() const { return std::holds_alternative<std::shared_ptr<const dict_t>>(v); }
  bool is_namespace() const { return std::holds_alternative<std::shared_ptr<namespace_t>>(v); }
  bool is_function() const { return std::holds_alternative<std::shared_ptr<const function_t>>(v); }

  const std::string& str() const { return std::get<std::string>(v); }
  const list_t& list() const { return *std::get<std::shared_ptr<const list_t>>(v); }
  const dict_t& dict() const { return *std::get<std::shared_ptr<const dict_t>>(v); }
  namespace_t& ns() const { return *std::get<std::shared_ptr<namespace_t>>(v); }
  const function_t& function() const { return *std::get<std::shared_ptr<const function_t>>(v); }
  // Numbers as double (bools count as 0 / 1, as in Python).
  double number() const {
    if (is_int())
      return double(std::get<int64_t>(v));
    if (is_bool())
      return std::get<bool>(v) ? 1.0 : 0.0;
    return std::get<double>(v);
  }
  int64_t integer() const { return is_bool() ? int64_t(std::get<bool>(v)) : std::get<int64_t>(v); }
};

const char* type_name(const value& x) {
  if (x.is_undefined())
    return "undefined";
  if (x.is_none())
    return "none";
  if (x.is_bool())
    return "bool";
  if (x.is_int())
    return "int";
  if (x.is_float())
    return "float";
  if (x.is_string())
    return "string";
  if (x.is_list())
    return "list";
  if (x.is_dict())
    return "dict";
  if (x.is_namespace())
    return "namespace";
  return "function";
}

const value* dict_find(const dict_t& d, std::string_view key) {
  for (const auto& [k, x] : d)
    if (k == key)
      return &x;
  return nullptr;
}

// UTF-8 code points: Python strings are indexed, sliced, measured and stripped by them.
std::vector<std::string_view> code_points(std::string_view s) {
  std::vector<std::string_view> out;
  for (std::size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

bool truthy(const value& x) {
  return std::visit(
    [](const auto& a) -> bool {
      using T = std::decay_t<decltype(a)>;
      if constexpr (std::is_same_v<T, undefined_t> || std::is_same_v<T, none_t>)
        return false;
      else if constexpr (std::is_same_v<T, bool>)
        return a;
      else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, double>)
        return a != 0;
      else if constexpr (std::is_same_v<T, std::string>)
        return !a.empty();
      else if constexpr (std::is_same_v<T, std::shared_ptr<const list_t>> ||
                         std::is_same_v<T, std::shared_ptr<const dict_t>>)
        return !a->empty();
      else
        return true;
    },
    x.v);
}

// Python's repr(float): the shortest digits that read back, fixed notation for exponents in
// [-4, 16), scientific otherwise, and always a '.0' or an exponent.
std::string python_float(double d) {
  if (std::isnan(d))
    return "nan";
  if (std::isinf(d))
    return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  auto e = sci.find('e');
  int exponent = std::stoi(sci.substr(e + 1));
  std::string mantissa = sci.substr(0, e);
  bool negative = mantissa[0] == '-';
  if (negative)
    mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa)
    if (c != '.')
      digits += c;
  std::string out;
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out = "0." + std::string(std::size_t(-exponent - 1), '0') + digits;
    } else if (std::size_t(exponent) + 1 >= digits.size()) {
      out = digits + std::string(std::size_t(exponent) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, std::size_t(exponent) + 1) + "." + digits.substr(std::size_t(exponent) + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1)
      out += "." + digits.substr(1);
    out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  }
  return negative ? "-" + out : out;
}

std::string python_repr(const value& x);

// Python's str().
std::string to_str(const value& x) {
  if (x.is_undefined())
    return "";
  if (x.is_none())
    return "None";
  if (x.is_bool())
    return std::get<bool>(x.v) ? "True" : "False";
  if (x.is_int())
    return std::to_string(std::get<int64_t>(x.v));
  if (x.is_float())
    return python_float(std::get<double>(x.v));
  if (x.is_string())
    return x.str();
  return python_repr(x);
}

std::string python_repr(const value& x) {
  if (x.is_string()) {
    const auto& s = x.str();
    char quote = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
    std::string out(1, quote);
    for (std::size_t i = 0; i < s.size();) {
      unsigned char c = static_cast<unsigned char>(s[i]);
      if (c == '\\' || c == static_cast<unsigned char>(quote)) {
        out += '\\', out += char(c), ++i;
      } else if (c == '\n' || c == '\r' || c == '\t') {
        out += c == '\n' ? "\\n" : c == '\r' ? "\\r" : "\\t", ++i;
      } else {
        // One UTF-8 sequence: copied when Python counts it printable, else escaped as repr does.
        std::size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        char32_t cp = n == 1 ? c : char32_t(c & (0x7F >> n));
        for (std::size_t k = 1; k < n && i + k < s.size(); ++k)
          cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
        if (python_printable(cp))
          out.append(s, i, n);
        else
          append_python_escape(out, cp);
        i += n;
      }
    }
    return out + quote;
  }
  if (x.is_list()) {
    std::string out = "[";
    for (std::size_t i = 0; i < x.list().size(); ++i)
      out += (i ? ", " : "") + python_repr(x.list()[i]);
    return out + "]";
  }
  if (x.is_dict()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, v] : x.dict()) {
      out += (first ? "" : ", ") + python_repr(value(k)) + ": " + python_repr(v);
      first = false;
    }
    return out + "}";
  }
  if (x.is_namespace())
    return "<Namespace>";
  if (x.is_function())
    return "<function>";
  return to_str(x);
}

// HF's `tojson` is json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False) with those four as its arguments, in that order; json_style holds them.
struct json_style {
  std::optional<std::string> indent; // per level; nullopt: all on one line
  std::string item_sep, key_sep;
  bool sort_keys = false;
  bool ensure_ascii = false;
};

// A string as json.dumps writes it: ensure_ascii escapes everything outside ' '..'~' as
// \uXXXX (UTF-16, so surrogate pairs above U+FFFF); without it only quotes, backslashes and
// control characters are escaped and the rest is copied.
void dump_json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (std::size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"': out += "\\\""; ++i; continue;
      case '\\': out += "\\\\"; ++i; continue;
      case '\n': out += "\\n"; ++i; continue;
      case '\r': out += "\\r"; ++i; continue;
      case '\t': out += "\\t"; ++i; continue;
      case '\b': out += "\\b"; ++i; continue;
      case '\f': out += "\\f"; ++i; continue;
      default: break;
    }
    if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
      out += fmt::format("\\u{:04x}", c);
      ++i;
    } else if (c < 0x80 || !ensure_ascii) {
      out += char(c);
      ++i;
    } else {
      // A UTF-8 sequence (the engine's strings are valid UTF-8: JSON input and literals).
      int n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
      uint32_t cp = c & (0x7f >> n);
      for (int k = 1; k < n && i + k < s.size(); ++k)
        cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
      i += n;
      if (cp >= 0x10000) {
        cp -= 0x10000;
        out += fmt::format("\\u{:04x}\\u{:04x}", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
      } else {
        out += fmt::format("\\u{:04x}", cp);
      }
    }
  }
  out += '"';
}

void dump_json(std::string& out, const value& x, const json_style& style, int level) {
  auto newline = [&](int at) {
    if (style.indent) {
      out += '\n';
      for (int k = 0; k < at; ++k)
        out += *style.indent;
    }
  };
  if (x.is_none()) {
    out += "null";
  } else if (x.is_bool()) {
    out += std::get<bool>(x.v) ? "true" : "false";
  } else if (x.is_int()) {
    out += std::to_string(std::get<int64_t>(x.v));
  } else if (x.is_float()) {
    double d = std::get<double>(x.v);
    out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d < 0 ? "-Infinity" : "Infinity") : python_float(d);
  } else if (x.is_string()) {
    dump_json_string(out, x.str(), style.ensure_ascii);
  } else if (x.is_list()) {
    if (x.list().empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (std::size_t i = 0; i < x.list().size(); ++i) {
      if (i)
        out += style.item_sep;
      newline(level + 1);
      dump_json(out, x.list()[i], style, level + 1);
    }
    newline(level);
    out += ']';
  } else if (x.is_dict() || x.is_namespace()) {
    const dict_t& d = x.is_dict() ? x.dict() : x.ns().attrs;
    if (d.empty()) {
      out += "{}";
      return;
    }
    std::vector<const std::pair<std::string, value>*> items;
    for (const auto& kv : d)
      items.push_back(&kv);
    if (style.sort_keys) // byte order of UTF-8 is code-point order, as Python sorts str
      std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
    out += '{';
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (i)
        out += style.item_sep;
      newline(level + 1);
      dump_json_string(out, items[i]->first, style.ensure_ascii);
      out += style.key_sep;
      dump_json(out, items[i]->second, style, level + 1);
    }
    newline(level);
    out += '}';
  } else {
    raise(fmt::format("tojson: a {} is not JSON serializable", type_name(x)));
  }
}

value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none_t{};
    case nlohmann::ordered_json::value_t::boolean: return j.get<bool>();
    case nlohmann::ordered_json::value_t::number_integer: return j.get<int64_t>();
    case nlohmann::ordered_json::value_t::number_unsigned: {
      auto u = j.get<uint64_t>();
      return u <= uint64_t(std::numeric_limits<int64_t>::max()) ? value(int64_t(u)) : value(double(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return j.get<double>();
    case nlohmann::ordered_json::value_t::string: return j.get<std::string>();
    case nlohmann::ordered_json::value_t::array: {
      list_t l;
      l.reserve(j.size());
      for (const auto& e : j)
        l.push_back(from_json(e));
      return l;
    }
    case nlohmann::ordered_json::value_t::object: {
      dict_t d;
      d.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it)
        d.emplace_back(it.key(), from_json(it.value()));
      return d;
    }
    default: return none_t{};
  }
}

bool equals(const value& a, const value& b) {
  if (a.is_number() && b.is_number())
    return a.number() == b.number();
  if ((a.is_bool() || a.is_number()) && (b.is_bool() || b.is_number()))
    return a.number() == b.number();
  if (a.is_string() && b.is_string())
    return a.str() == b.str();
  if (a.is_none() && b.is_none())
    return true;
  if (a.is_list() && b.is_list()) {
    if (a.list().size() != b.list().size())
      return false;
    for (std::size_t i = 0; i < a.list().size(); ++i)
      if (!equals(a.list()[i], b.list()[i]))
        return false;
    return true;
  }
  if (a.is_dict() && b.is_dict()) {
    if (a.dict().size() != b.dict().size())
      return false;
    for (const auto& [k, v] : a.dict()) {
      auto other = dict_find(b.dict(), k);
      if (!other || !equals(v, *other))
        return false;
    }
    return true;
  }
  if (a.is_namespace() && b.is_namespace())
    return &a.ns() == &b.ns();
  return false;
}

// -1, 0, 1 for numbers, strings and lists (Python's ordering); other pairs are a type error.
int order(const value& a, const value& b) {
  if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool()))
    return a.number() < b.number() ? -1 : a.number() > b.number() ? 1 : 0;
  if (a.is_string() && b.is_string())
    return a.str() < b.str() ? -1 : a.str() > b.str() ? 1 : 0;
  if (a.is_list() && b.is_list()) {
    const auto& x = a.list();
    const auto& y = b.list();
    for (std::size_t i = 0; i < std::min(x.size(), y.size()); ++i)
      if (int c = order(x[i], y[i]))
        return c;
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  raise(fmt::format("cannot compare a {} with a {}", type_name(a), type_name(b)));
}

bool contains(const value& container, const value& item) {
  if (container.is_string()) {
    if (!item.is_string())
      raise(fmt::format("'in <string>' requires a string on the left, not a {}", type_name(item)));
    return container.str().find(item.str()) != std::string::npos;
  }
  if (container.is_list())
    return std::any_of(container.list().begin(), container.list().end(),
                       [&](const value& x) { return equals(x, item); });
  if (container.is_dict())
    return item.is_string() && dict_find(container.dict(), item.str()) != nullptr;
  if (container.is_undefined())
    raise(fmt::format("'{}' is undefined", std::get<undefined_t>(container.v).name));
  raise(fmt::format("a {} cannot be searched with 'in'", type_name(container)));
}

// What `for` iterates and filters take as a sequence.
list_t as_list(const value& x) {
  if (x.is_list())
    return x.list();
  if (x.is_undefined())
    return {};
  if (x.is_dict()) {
    list_t keys;
    for (const auto& kv : x.dict())
      keys.emplace_back(kv.first);
    return keys;
  }
  if (x.is_string()) {
    list_t chars;
    for (auto c : code_points(x.str()))
      chars.emplace_back(std::string(c));
    return chars;
  }
  raise(fmt::format("a {} is not iterable", type_name(x)));
}

int64_t length(const value& x) {
  if (x.is_string())
    return int64_t(code_points(x.str()).size());
  if (x.is_list())
    return int64_t(x.list().size());
  if (x.is_dict())
    return int64_t(x.dict().size());
  if (x.is_undefined())
    return 0;
  raise(fmt::format("a {} has no length", type_name(x)));
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// str.strip / lstrip / rstrip: whitespace, or any of the code points of `chars`.
std::string strip(const std::string& s, const value& chars, bool left, bool right) {
  auto cps = code_points(s);
  std::vector<std::string_view> set;
  bool whitespace = chars.is_none() || chars.is_undefined();
  std::string chars_text = whitespace ? std::string() : to_str(chars);
  if (!whitespace)
    set = code_points(chars_text);
  auto strip_this = [&](std::string_view c) {
    if (whitespace)
      return c.size() == 1 && is_space(c[0]);
    return std::find(set.begin(), set.end(), c) != set.end();
  };
  std::size_t b = 0, e = cps.size();
  while (left && b < e && strip_this(cps[b]))
    ++b;
  while (right && e > b && strip_this(cps[e - 1]))
    --e;
  std::string out;
  for (std::size_t i = b; i < e; ++i)
    out += cps[i];
  return out;
}

list_t split(const std::string& s, const value& sep, int64_t maxsplit, bool from_right) {
  list_t parts;
  if (sep.is_none() || sep.is_undefined()) {
    // Runs of whitespace separate; leading and trailing whitespace gives no empty parts.
    std::vector<std::string> words;
    std::size_t i = 0;
    std::vector<std::pair<std::size_t, std::size_t>> spans;
    while (i < s.size()) {
      while (i < s.size() && is_space(s[i]))
        ++i;
      if (i >= s.size())
        break;
      std::size_t b = i;
      while (i < s.size() && !is_space(s[i]))
        ++i;
      spans.emplace_back(b, i);
    }
    if (maxsplit >= 0 && int64_t(spans.size()) > maxsplit + 1) {
      if (!from_right) {
        auto rest_begin = spans[std::size_t(maxsplit)].first;
        auto rest = s.substr(rest_begin);
        rest = strip(rest, none_t{}, false, true);
        spans.resize(std::size_t(maxsplit));
        for (auto [b, e] : spans)
          parts.emplace_back(s.substr(b, e - b));
        parts.emplace_back(rest);
        return parts;
      }
      auto keep = spans.size() - std::size_t(maxsplit);
      auto head = strip(s.substr(0, spans[keep - 1].second), none_t{}, true, false);
      parts.emplace_back(head);
      for (std::size_t k = keep; k < spans.size(); ++k)
        parts.emplace_back(s.substr(spans[k].first, spans[k].second - spans[k].first));
      return parts;
    }
    for (auto [b, e] : spans)
      parts.emplace_back(s.substr(b, e - b));
    return parts;
  }
  std::string d = to_str(sep);
  if (d.empty())
    raise("split: empty separator");
  std::vector<std::string> pieces;
  if (!from_right) {
    std::size_t start = 0;
    int64_t n = 0;
    while (maxsplit < 0 || n < maxsplit) {
      auto at = s.find(d, start);
      if (at == std::string::npos)
        break;
      pieces.push_back(s.substr(start, at - start));
      start = at + d.size();
      ++n;
    }
    pieces.push_back(s.substr(start));
  } else {
    std::size_t end = s.size();
    int64_t n = 0;
    std::vector<std::string> rev;
    while (maxsplit < 0 || n < maxsplit) {
      if (end < d.size())
        break;
      auto at = s.rfind(d, end - d.size());
      if (at == std::string::npos)
        break;
      rev.push_back(s.substr(at + d.size(), end - at - d.size()));
      end = at;
      ++n;
    }
    rev.push_back(s.substr(0, end));
    pieces.assign(rev.rbegin(), rev.rend());
  }
  for (auto& p : pieces)
    parts.emplace_back(std::move(p));
  return parts;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to, int64_t count = -1) {
  if (from.empty())
    return s;
  std::size_t at = 0;
  for (int64_t n = 0; (count < 0 || n < count) && (at = s.find(from, at)) != std::string::npos; ++n) {
    s.replace(at, from.size(), to);
    at += to.size();
  }
  return s;
}

std::string ascii_case(std::string s, bool upper) {
  for (auto& c : s)
    c = char(upper ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string title_case(const std::string& s) {
  std::string out = s;
  bool start = true;
  for (auto& c : out) {
    auto u = static_cast<unsigned char>(c);
    if (std::isalpha(u)) {
      c = char(start ? std::toupper(u) : std::tolower(u));
      start = false;
    } else {
      start = true;
    }
  }
  return out;
}

std::string capitalize(const std::string& s) {
  std::string out = ascii_case(s, false);
  if (!out.empty())
    out[0] = char(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

// ---- arguments ----------------------------------------------------------------------------------

// A call's argument `i` or keyword `name`, else `fallback`.
value arg(const call_args& a, std::size_t i, std::string_view name, value fallback = undefined_t{}) {
  for (const auto& [k, v] : a.keyword)
    if (k == name)
      return v;
  if (i < a.positional.size())
    return a.positional[i];
  return fallback;
}

// ---- methods ------------------------------------------------------------------------------------

std::optional<value> string_method(const std::string& s, const std::string& name) {
  auto m = [&](auto fn) { return std::optional<value>(value(function_t(fn))); };
  if (name == "startswith" || name == "endswith") {
    bool starts = name == "startswith";
    return m([s, starts](call_args& a) -> value {
      auto x = arg(a, 0, "prefix");
      list_t options = x.is_list() ? x.list() : list_t{x};
      for (const auto& o : options) {
        auto p = to_str(o);
        if (starts ? s.starts_with(p) : s.ends_with(p))
          return true;
      }
      return false;
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool left = name != "rstrip", right = name != "lstrip";
    return m([s, left, right](call_args& a) -> value { return strip(s, arg(a, 0, "chars", none_t{}), left, right); });
  }
  if (name == "split" || name == "rsplit") {
    bool from_right = name == "rsplit";
    return m([s, from_right](call_args& a) -> value {
      auto n = arg(a, 1, "maxsplit", int64_t(-1));
      return split(s, arg(a, 0, "sep", none_t{}), n.integer(), from_right);
    });
  }
  if (name == "upper" || name == "lower")
    return m([s, up = name == "upper"](call_args&) -> value { return ascii_case(s, up); });
  if (name == "title")
    return m([s](call_args&) -> value { return title_case(s); });
  if (name == "capitalize")
    return m([s](call_args&) -> value { return capitalize(s); });
  if (name == "replace")
    return m([s](call_args& a) -> value {
      return replace_all(s, to_str(arg(a, 0, "old")), to_str(arg(a, 1, "new")), arg(a, 2, "count", int64_t(-1)).integer());
    });
  if (name == "find")
    return m([s](call_args& a) -> value {
      auto at = s.find(to_str(arg(a, 0, "sub")));
      return at == std::string::npos ? int64_t(-1) : int64_t(code_points(s.substr(0, at)).size());
    });
  if (name == "count")
    return m([s](call_args& a) -> value {
      auto sub = to_str(arg(a, 0, "sub"));
      if (sub.empty())
        return int64_t(code_points(s).size() + 1);
      int64_t n = 0;
      for (std::size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size()))
        ++n;
      return n;
    });
  if (name == "join")
    return m([s](call_args& a) -> value {
      std::string out;
      auto items = as_list(arg(a, 0, "iterable"));
      for (std::size_t i = 0; i < items.size(); ++i)
        out += (i ? s : "") + to_str(items[i]);
      return out;
    });
  return std::nullopt;
}

std::optional<value> dict_method(const value& d, const std::string& name) {
  if (name == "items")
    return value(function_t([d](call_args&) -> value {
      list_t out;
      for (const auto& [k, v] : d.dict())
        out.emplace_back(list_t{value(k), v});
      return out;
    }));
  if (name == "keys" || name == "values")
    return value(function_t([d, keys = name == "keys"](call_args&) -> value {
      list_t out;
      for (const auto& [k, v] : d.dict())
        out.push_back(keys ? value(k) : v);
      return out;
    }));
  if (name == "get")
    return value(function_t([d](call_args& a) -> value {
      auto key = arg(a, 0, "key");
      auto found = key.is_string() ? dict_find(d.dict(), key.str()) : nullptr;
      return found ? *found : arg(a, 1, "default", none_t{});
    }));
  return std::nullopt;
}

std::string describe_undefined(const value& x) {
  return x.is_undefined() ? "'" + std::get<undefined_t>(x.v).name + "' is undefined" : "";
}

// obj.name: jinja2 tries the attribute (a method) first, then the item.
value get_attr(const value& obj, const std::string& name) {
  if (obj.is_undefined())
    raise(describe_undefined(obj) + " (reading its attribute '" + name + "')");
  if (obj.is_dict()) {
    if (auto m = dict_method(obj, name))
      return *m;
    if (auto found = dict_find(obj.dict(), name))
      return *found;
    return undefined_t{name};
  }
  if (obj.is_namespace()) {
    if (auto found = dict_find(obj.ns().attrs, name))
      return *found;
    return undefined_t{name};
  }
  if (obj.is_string())
    if (auto m = string_method(obj.str(), name))
      return *m;
  return undefined_t{name};
}

int64_t normalize_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

// obj[key]: jinja2 tries the item first, then the attribute.
value get_item(const value& obj, const value& key) {
  if (obj.is_undefined())
    raise(describe_undefined(obj) + " (reading an item of it)");
  if (obj.is_list() && (key.is_int() || key.is_bool())) {
    auto n = int64_t(obj.list().size());
    auto i = normalize_index(key.integer(), n);
    if (i < 0 || i >= n)
      return undefined_t{"[" + std::to_string(key.integer()) + "]"};
    return obj.list()[std::size_t(i)];
  }
  if (obj.is_string() && key.is_int()) {
    auto cps = code_points(obj.str());
    auto i = normalize_index(key.integer(), int64_t(cps.size()));
    if (i < 0 || i >= int64_t(cps.size()))
      return undefined_t{"[" + std::to_string(key.integer()) + "]"};
    return std::string(cps[std::size_t(i)]);
  }
  if (obj.is_dict() && key.is_string()) {
    if (auto found = dict_find(obj.dict(), key.str()))
      return *found;
  }
  if (key.is_string())
    return get_attr(obj, key.str());
  return undefined_t{python_repr(key)};
}

value slice(const value& obj, const value& start, const value& stop, const value& step_v) {
  int64_t step = step_v.is_none() || step_v.is_undefined() ? 1 : step_v.integer();
  if (step == 0)
    raise("slice step cannot be zero");
  list_t items;
  bool is_str = obj.is_string();
  if (is_str) {
    for (auto c : code_points(obj.str()))
      items.emplace_back(std::string(c));
  } else if (obj.is_list()) {
    items = obj.list();
  } else {
    raise(fmt::format("a {} cannot be sliced", type_name(obj)));
  }
  auto n = int64_t(items.size());
  auto bound = [&](const value& v, int64_t fallback) -> int64_t {
    if (v.is_none() || v.is_undefined())
      return fallback;
    int64_t i = v.integer();
    if (i < 0)
      i += n;
    if (step > 0)
      return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  int64_t b = bound(start, step > 0 ? 0 : n - 1);
  int64_t e = bound(stop, step > 0 ? n : -1);
  list_t out;
  for (int64_t i = b; step > 0 ? i < e : i > e; i += step)
    out.push_back(items[std::size_t(i)]);
  if (!is_str)
    return out;
  std::string s;
  for (const auto& c : out)
    s += c.str();
  return s;
}

// ---- lexer --------------------------------------------------------------------------------------

enum class tok : uint8_t { text, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof };

struct token {
  tok kind = tok::eof;
  std::string text; // text, name, string value, operator
  int64_t i = 0;
  double f = 0;
  std::size_t pos = 0;
};

int line_of(std::string_view src, std::size_t pos) {
  return 1 + int(std::count(src.begin(), src.begin() + std::ptrdiff_t(std::min(pos, src.size())), '\n'));
}

struct lexer {
  std::string_view src;
  options opts;
  std::vector<token> out;

  [[noreturn]] void error(std::size_t pos, const std::string& what) {
    raise(fmt::format("line {}: {}", line_of(src, pos), what));
  }

  static bool space_or_tab(std::string_view s) {
    return std::all_of(s.begin(), s.end(), [](char c) { return c != '\n' && is_space(c); });
  }

  void run() {
    std::size_t pos = 0;
    bool line_starting = true;
    while (pos <= src.size()) {
      auto open = src.find('{', pos);
      while (open != std::string_view::npos && open + 1 < src.size() && src[open + 1] != '{' &&
             src[open + 1] != '%' && src[open + 1] != '#')
        open = src.find('{', open + 1);
      if (open == std::string_view::npos || open + 1 >= src.size()) {
        if (pos < src.size())
          out.push_back({tok::text, std::string(src.substr(pos)), 0, 0, pos});
        break;
      }
      char kind = src[open + 1];
      char sign = open + 2 < src.size() ? src[open + 2] : '\0';
      std::string text(src.substr(pos, open - pos));
      if (sign == '-') {
        while (!text.empty() && is_space(text.back()))
          text.pop_back();
      } else if (opts.lstrip_blocks && kind != '{' && sign != '+') {
        auto l = text.rfind('\n');
        std::size_t l_pos = l == std::string::npos ? 0 : l + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() && space_or_tab(std::string_view(text).substr(l_pos)))
          text.resize(l_pos);
      }
      if (!text.empty())
        out.push_back({tok::text, std::move(text), 0, 0, pos});
      std::size_t p = open + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      std::size_t consumed_end; // one past the tag and what it strips after itself
      if (kind == '#') {
        auto close = src.find("#}", p);
        if (close == std::string_view::npos)
          error(open, "the comment is not closed ('#}' missing)");
        bool strip_after = close > p && src[close - 1] == '-';
        consumed_end = after_tag(close + 2, strip_after, true);
      } else {
        bool block = kind == '%';
        out.push_back({block ? tok::block_begin : tok::var_begin, "", 0, 0, open});
        consumed_end = lex_tag(p, block, open);
      }
      line_starting = consumed_end > 0 && src[consumed_end - 1] == '\n';
      pos = consumed_end;
    }
    out.push_back({tok::eof, "", 0, 0, src.size()});
  }

  // After a tag ends at `p`: '-' strips all whitespace; trim_blocks drops one newline after a
  // block tag or comment.
  std::size_t after_tag(std::size_t p, bool strip_after, bool block_like) {
    if (strip_after) {
      while (p < src.size() && is_space(src[p]))
        ++p;
    } else if (opts.trim_blocks && block_like && p < src.size() && src[p] == '\n') {
      ++p;
    }
    return p;
  }

  std::size_t lex_tag(std::size_t p, bool block, std::size_t open) {
    const std::string_view close = block ? "%}" : "}}";
    int depth = 0; // open ( [ {: a '}}' inside a dict literal does not end the tag
    while (true) {
      while (p < src.size() && is_space(src[p]))
        ++p;
      if (p >= src.size())
        error(open, block ? "the tag is not closed ('%}' missing)" : "the expression is not closed ('}}' missing)");
      // The end of the tag, possibly with whitespace control.
      for (char sign : {'-', '+', '\0'}) {
        std::size_t q = p + (sign ? 1 : 0);
        if (depth == 0 && (sign == '\0' || src[p] == sign) && src.substr(q, 2) == close) {
          out.push_back({block ? tok::block_end : tok::var_end, "", 0, 0, p});
          bool keep_newline = sign == '+';
          std::size_t end = q + 2;
          if (keep_newline)
            return end;
          return after_tag(end, sign == '-', block);
        }
      }
      char c = src[p];
      if (c == '\'' || c == '"') {
        p = lex_string(p);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        p = lex_number(p);
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        std::size_t b = p;
        while (p < src.size() && (std::isalnum(static_cast<unsigned char>(src[p])) || src[p] == '_'))
          ++p;
        out.push_back({tok::name, std::string(src.substr(b, p - b)), 0, 0, b});
      } else {
        static const std::string_view two[] = {"==", "!=", "<=", ">=", "//", "**"};
        std::string op;
        for (auto t : two)
          if (src.substr(p, 2) == t)
            op = std::string(t);
        if (op.empty()) {
          if (std::string_view("+-*/%~<>=|.,:()[]{}!").find(c) == std::string_view::npos)
            error(p, fmt::format("unexpected character '{}'", c));
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{")
          ++depth;
        else if ((op == ")" || op == "]" || op == "}") && depth > 0)
          --depth;
        out.push_back({tok::op, op, 0, 0, p});
        p += op.size();
      }
    }
  }

  std::size_t lex_number(std::size_t p) {
    std::size_t b = p;
    bool is_float = false;
    auto digits = [&] {
      while (p < src.size() && (std::isdigit(static_cast<unsigned char>(src[p])) || src[p] == '_'))
        ++p;
    };
    digits();
    if (p + 1 < src.size() && src[p] == '.' && std::isdigit(static_cast<unsigned char>(src[p + 1]))) {
      is_float = true;
      ++p;
      digits();
    }
    if (p < src.size() && (src[p] == 'e' || src[p] == 'E')) {
      std::size_t q = p + 1;
      if (q < src.size() && (src[q] == '+' || src[q] == '-'))
        ++q;
      if (q < src.size() && std::isdigit(static_cast<unsigned char>(src[q]))) {
        is_float = true;
        p = q;
        digits();
      }
    }
    std::string text;
    for (char c : src.substr(b, p - b))
      if (c != '_')
        text += c;
    token t{is_float ? tok::floating : tok::integer, text, 0, 0, b};
    if (is_float) {
      t.f = std::strtod(text.c_str(), nullptr);
    } else {
      auto r = std::from_chars(text.data(), text.data() + text.size(), t.i);
      if (r.ec != std::errc())
        error(b, "integer literal out of range");
    }
    out.push_back(std::move(t));
    return p;
  }

  static void append_utf8(std::string& s, uint32_t cp) {
    if (cp < 0x80) {
      s += char(cp);
    } else if (cp < 0x800) {
      s += char(0xC0 | (cp >> 6));
      s += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      s += char(0xE0 | (cp >> 12));
      s += char(0x80 | ((cp >> 6) & 0x3F));
      s += char(0x80 | (cp & 0x3F));
    } else {
      s += char(0xF0 | (cp >> 18));
      s += char(0x80 | ((cp >> 12) & 0x3F));
      s += char(0x80 | ((cp >> 6) & 0x3F));
      s += char(0x80 | (cp & 0x3F));
    }
  }

  // A string literal with Python's escapes (jinja2 decodes them with unicode-escape); an
  // unknown escape keeps its backslash, as Python does.
  std::size_t lex_string(std::size_t p) {
    char quote = src[p];
    std::size_t b = p++;
    std::string value;
    while (true) {
      if (p >= src.size())
        error(b, "the string literal is not closed");
      char c = src[p];
      if (c == quote) {
        ++p;
        break;
      }
      if (c != '\\') {
        value += c;
        ++p;
        continue;
      }
      if (p + 1 >= src.size())
        error(b, "the string literal is not closed");
      char e = src[p + 1];
      p += 2;
      auto hex = [&](int n) -> uint32_t {
        uint32_t cp = 0;
        for (int k = 0; k < n; ++k, ++p) {
          if (p >= src.size() || !std::isxdigit(static_cast<unsigned char>(src[p])))
            error(b, "a bad \\x, \\u or \\U escape in a string literal");
          char h = src[p];
          cp = cp * 16 + uint32_t(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
        }
        return cp;
      };
      switch (e) {
        case '\n': break; // a backslash-newline continues the line
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case 'n': value += '\n'; break;
        case 't': value += '\t'; break;
        case 'r': value += '\r'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'v': value += '\v'; break;
        case 'a': value += '\a'; break;
        case 'x': append_utf8(value, hex(2)); break;
        case 'u': append_utf8(value, hex(4)); break;
        case 'U': append_utf8(value, hex(8)); break;
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = uint32_t(e - '0');
            for (int k = 0; k < 2 && p < src.size() && src[p] >= '0' && src[p] <= '7'; ++k, ++p)
              cp = cp * 8 + uint32_t(src[p] - '0');
            append_utf8(value, cp);
          } else {
            value += '\\';
            value += e;
          }
      }
    }
    // Adjacent literals concatenate ('a' 'b' is 'ab'), as in Python.
    if (!out.empty() && out.back().kind == tok::string && out.back().pos != b) {
      std::size_t q = b;
      while (q > 0 && is_space(src[q - 1]))
        --q;
      if (q > 0 && (src[q - 1] == '\'' || src[q - 1] == '"')) {
        out.back().text += value;
        return p;
      }
    }
    out.push_back({tok::string, std::move(value), 0, 0, b});
    return p;
  }
};

// ---- tree ---------------------------------------------------------------------------------------

struct scope {
  std::unordered_map<std::string, value> vars;
  scope* parent = nullptr;

  const value* find(const std::string& name) const {
    for (const scope* s = this; s; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end())
        return &it->second;
    }
    return nullptr;
  }
};

struct render_state {
  std::string out;
  scope* root = nullptr;
  int depth = 0; // macro calls nested
};

struct expr {
  virtual ~expr() = default;
  virtual value eval(scope& s, render_state& st) const = 0;
};
using expr_ptr = std::unique_ptr<expr>;

enum class flow : uint8_t { normal, break_loop, continue_loop };

struct node {
  virtual ~node() = default;
  virtual flow render(scope& s, render_state& st) const = 0;
};
using node_ptr = std::unique_ptr<node>;
using body_t = std::vector<node_ptr>;

flow render_body(const body_t& body, scope& s, render_state& st) {
  for (const auto& n : body)
    if (auto f = n->render(s, st); f != flow::normal)
      return f;
  return flow::normal;
}

// Expressions

struct literal_expr : expr {
  value v;
  explicit literal_expr(value x) : v(std::move(x)) {}
  value eval(scope&, render_state&) const override { return v; }
};

value builtin_global(const std::string& name);

struct name_expr : expr {
  std::string name;
  value eval(scope& s, render_state&) const override {
    if (auto v = s.find(name))
      return *v;
    return builtin_global(name);
  }
};

struct list_expr : expr {
  std::vector<expr_ptr> items;
  value eval(scope& s, render_state& st) const override {
    list_t out;
    for (const auto& e : items)
      out.push_back(e->eval(s, st));
    return out;
  }
};

struct dict_expr : expr {
  std::vector<std::pair<expr_ptr, expr_ptr>> items;
  value eval(scope& s, render_state& st) const override {
    dict_t out;
    for (const auto& [k, v] : items) {
      auto key = k->eval(s, st);
      if (!key.is_string())
        raise("dict literals take string keys only");
      auto x = v->eval(s, st);
      bool replaced = false;
      for (auto& kv : out)
        if (kv.first == key.str())
          kv.second = x, replaced = true;
      if (!replaced)
        out.emplace_back(key.str(), std::move(x));
    }
    return out;
  }
};

struct attr_expr : expr {
  expr_ptr obj;
  std::string name;
  value eval(scope& s, render_state& st) const override { return get_attr(obj->eval(s, st), name); }
};

struct item_expr : expr {
  expr_ptr obj, key;
  value eval(scope& s, render_state& st) const override { return get_item(obj->eval(s, st), key->eval(s, st)); }
};

struct slice_expr : expr {
  expr_ptr obj, start, stop, step; // any of the last three may be null
  value eval(scope& s, render_state& st) const override {
    auto opt = [&](const expr_ptr& e) { return e ? e->eval(s, st) : value(none_t{}); };
    return slice(obj->eval(s, st), opt(start), opt(stop), opt(step));
  }
};

struct arg_exprs {
  std::vector<expr_ptr> positional;
  std::vector<std::pair<std::string, expr_ptr>> keyword;
  call_args eval(scope& s, render_state& st) const {
    call_args a;
    for (const auto& e : positional)
      a.positional.push_back(e->eval(s, st));
    for (const auto& [k, e] : keyword)
      a.keyword.emplace_back(k, e->eval(s, st));
    return a;
  }
};

struct call_expr : expr {
  expr_ptr fn;
  arg_exprs args;
  std::string what; // for errors
  value eval(scope& s, render_state& st) const override {
    auto f = fn->eval(s, st);
    if (!f.is_function())
      raise(f.is_undefined() ? describe_undefined(f) + " (called as a function)"
                             : fmt::format("{} is a {}, not a function", what, type_name(f)));
    auto a = args.eval(s, st);
    return f.function()(a);
  }
};

value apply_filter(const std::string& name, const value& x, call_args& a, scope& s, render_state& st);
bool apply_test(const std::string& name, const value& x, call_args& a);

struct filter_expr : expr {
  expr_ptr obj;
  std::string name;
  arg_exprs args;
  value eval(scope& s, render_state& st) const override {
    auto x = obj->eval(s, st);
    auto a = args.eval(s, st);
    return apply_filter(name, x, a, s, st);
  }
};

struct test_expr : expr {
  expr_ptr obj;
  std::string name;
  arg_exprs args;
  bool negated = false;
  value eval(scope& s, render_state& st) const override {
    auto x = obj->eval(s, st);
    auto a = args.eval(s, st);
    return apply_test(name, x, a) != negated;
  }
};

struct not_expr : expr {
  expr_ptr e;
  value eval(scope& s, render_state& st) const override { return !truthy(e->eval(s, st)); }
};

struct and_or_expr : expr {
  bool is_and = false;
  expr_ptr l, r;
  value eval(scope& s, render_state& st) const override {
    auto a = l->eval(s, st);
    if (truthy(a) != is_and)
      return a;
    return r->eval(s, st);
  }
};

struct cond_expr : expr {
  expr_ptr then, cond, otherwise; // otherwise may be null: undefined
  value eval(scope& s, render_state& st) const override {
    if (truthy(cond->eval(s, st)))
      return then->eval(s, st);
    return otherwise ? otherwise->eval(s, st) : value(undefined_t{"(conditional without else)"});
  }
};

struct unary_expr : expr {
  char op = '-';
  expr_ptr e;
  value eval(scope& s, render_state& st) const override {
    auto x = e->eval(s, st);
    if (!x.is_number() && !x.is_bool())
      raise(fmt::format("unary '{}' of a {}", op, type_name(x)));
    if (op == '+')
      return x;
    if (x.is_float())
      return -std::get<double>(x.v);
    return -x.integer();
  }
};

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

value binary(const std::string& op, const value& a, const value& b) {
  if (op == "~")
    return to_str(a) + to_str(b);
  if (a.is_undefined() || b.is_undefined())
    raise(describe_undefined(a.is_undefined() ? a : b) + " (used with '" + op + "')");
  bool numbers = (a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool());
  bool ints = numbers && !a.is_float() && !b.is_float();
  if (op == "+") {
    if (a.is_string() && b.is_string())
      return a.str() + b.str();
    if (a.is_list() && b.is_list()) {
      list_t out = a.list();
      out.insert(out.end(), b.list().begin(), b.list().end());
      return out;
    }
    if (ints)
      return a.integer() + b.integer();
    if (numbers)
      return a.number() + b.number();
  } else if (op == "-") {
    if (ints)
      return a.integer() - b.integer();
    if (numbers)
      return a.number() - b.number();
  } else if (op == "*") {
    if (ints)
      return a.integer() * b.integer();
    if (numbers)
      return a.number() * b.number();
    const value* s = a.is_string() || a.is_list() ? &a : &b;
    const value* n = s == &a ? &b : &a;
    if ((s->is_string() || s->is_list()) && (n->is_int() || n->is_bool())) {
      auto times = std::max<int64_t>(0, n->integer());
      if (s->is_string()) {
        std::string out;
        for (int64_t k = 0; k < times; ++k)
          out += s->str();
        return out;
      }
      list_t out;
      for (int64_t k = 0; k < times; ++k)
        out.insert(out.end(), s->list().begin(), s->list().end());
      return out;
    }
  } else if (op == "/") {
    if (numbers) {
      if (b.number() == 0)
        raise("division by zero");
      return a.number() / b.number();
    }
  } else if (op == "//" || op == "%") {
    if (numbers) {
      if (b.number() == 0)
        raise("division by zero");
      if (ints) {
        auto q = floor_div(a.integer(), b.integer());
        return op == "//" ? value(q) : value(a.integer() - q * b.integer());
      }
      double q = std::floor(a.number() / b.number());
      return op == "//" ? value(q) : value(a.number() - q * b.number());
    }
  } else if (op == "**") {
    if (ints && b.integer() >= 0) {
      int64_t r = 1;
      for (int64_t k = 0; k < b.integer(); ++k)
        r *= a.integer();
      return r;
    }
    if (numbers)
      return std::pow(a.number(), b.number());
  }
  raise(fmt::format("unsupported operand types for '{}': {} and {}", op, type_name(a), type_name(b)));
}

struct binary_expr : expr {
  std::string op;
  expr_ptr l, r;
  value eval(scope& s, render_state& st) const override { return binary(op, l->eval(s, st), r->eval(s, st)); }
};

struct compare_expr : expr {
  expr_ptr first;
  std::vector<std::pair<std::string, expr_ptr>> rest;
  value eval(scope& s, render_state& st) const override {
    auto a = first->eval(s, st);
    for (const auto& [op, e] : rest) {
      auto b = e->eval(s, st);
      bool ok;
      if (op == "==")
        ok = equals(a, b);
      else if (op == "!=")
        ok = !equals(a, b);
      else if (op == "in")
        ok = contains(b, a);
      else if (op == "not in")
        ok = !contains(b, a);
      else {
        int c = order(a, b);
        ok = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
      }
      if (!ok)
        return false;
      a = std::move(b);
    }
    return true;
  }
};

// Statements

struct text_node : node {
  std::string text;
  flow render(scope&, render_state& st) const override {
    st.out += text;
    return flow::normal;
  }
};

struct output_node : node {
  expr_ptr e;
  flow render(scope& s, render_state& st) const override {
    st.out += to_str(e->eval(s, st));
    return flow::normal;
  }
};

struct if_node : node {
  std::vector<std::pair<expr_ptr, body_t>> branches;
  body_t otherwise;
  flow render(scope& s, render_state& st) const override {
    for (const auto& [cond, body] : branches)
      if (truthy(cond->eval(s, st)))
        return render_body(body, s, st);
    return render_body(otherwise, s, st);
  }
};

void assign_targets(scope& s, const std::vector<std::string>& targets, const value& v) {
  if (targets.size() == 1) {
    s.vars[targets[0]] = v;
    return;
  }
  auto items = as_list(v);
  if (items.size() != targets.size())
    raise(fmt::format("cannot unpack {} values into {} names", items.size(), targets.size()));
  for (std::size_t i = 0; i < targets.size(); ++i)
    s.vars[targets[i]] = items[i];
}

struct for_node : node {
  std::vector<std::string> targets;
  expr_ptr iter, filter;
  body_t body, otherwise;
  flow render(scope& s, render_state& st) const override {
    auto all = as_list(iter->eval(s, st));
    list_t items;
    if (filter) {
      for (const auto& x : all) {
        scope probe;
        probe.parent = &s;
        assign_targets(probe, targets, x);
        if (truthy(filter->eval(probe, st)))
          items.push_back(x);
      }
    } else {
      items = std::move(all);
    }
    if (items.empty())
      return render_body(otherwise, s, st);
    const auto n = int64_t(items.size());
    for (int64_t i = 0; i < n; ++i) {
      // A fresh scope per iteration: `set` inside a loop does not outlive the iteration, as in
      // jinja2 (namespaces carry state across iterations).
      scope frame;
      frame.parent = &s;
      assign_targets(frame, targets, items[std::size_t(i)]);
      frame.vars["loop"] = value(dict_t{
        {"index", i + 1},
        {"index0", i},
        {"revindex", n - i},
        {"revindex0", n - i - 1},
        {"first", i == 0},
        {"last", i == n - 1},
        {"length", n},
        {"previtem", i > 0 ? items[std::size_t(i - 1)] : value(undefined_t{"loop.previtem"})},
        {"nextitem", i + 1 < n ? items[std::size_t(i + 1)] : value(undefined_t{"loop.nextitem"})},
      });
      if (render_body(body, frame, st) == flow::break_loop)
        break;
    }
    return flow::normal;
  }
};

struct set_node : node {
  std::string name;
  std::string attr; // set ns.attr = ...
  expr_ptr e;
  flow render(scope& s, render_state& st) const override {
    auto v = e->eval(s, st);
    if (attr.empty()) {
      s.vars[name] = std::move(v);
      return flow::normal;
    }
    auto target = s.find(name);
    if (!target || !target->is_namespace())
      raise(fmt::format("cannot set '{}.{}': '{}' is not a namespace", name, attr, name));
    auto& attrs = target->ns().attrs;
    for (auto& kv : attrs)
      if (kv.first == attr) {
        kv.second = std::move(v);
        return flow::normal;
      }
    attrs.emplace_back(attr, std::move(v));
    return flow::normal;
  }
};

struct set_block_node : node {
  std::string name;
  body_t body;
  flow render(scope& s, render_state& st) const override {
    std::string saved = std::move(st.out);
    st.out.clear();
    render_body(body, s, st);
    s.vars[name] = std::move(st.out);
    st.out = std::move(saved);
    return flow::normal;
  }
};

struct control_node : node {
  flow f = flow::break_loop;
  flow render(scope&, render_state&) const override { return f; }
};

struct macro_node : node {
  std::string name;
  std::vector<std::pair<std::string, expr_ptr>> params; // default may be null
  body_t body;
  flow render(scope& s, render_state& st) const override {
    // The macro runs in a scope of its own above the template's top level, with its arguments.
    s.vars[name] = value(function_t([this, &st](call_args& a) -> value {
      if (++st.depth > 64)
        raise("macros nested more than 64 deep");
      scope frame;
      frame.parent = st.root;
      for (std::size_t i = 0; i < params.size(); ++i) {
        const auto& [pname, def] = params[i];
        value v = arg(a, i, pname, undefined_t{pname});
        if (v.is_undefined() && def)
          v = def->eval(frame, st);
        frame.vars[pname] = v;
      }
      std::string saved = std::move(st.out);
      st.out.clear();
      render_body(body, frame, st);
      std::string result = std::move(st.out);
      st.out = std::move(saved);
      --st.depth;
      return result;
    }));
    return flow::normal;
  }
};

// ---- filters, tests, globals ----------------------------------------------------------------------

value builtin_global(const std::string& name) {
  if (name == "true" || name == "True")
    return true;
  if (name == "false" || name == "False")
    return false;
  if (name == "none" || name == "None")
    return none_t{};
  if (name == "namespace")
    return function_t([](call_args& a) -> value {
      auto ns = std::make_shared<namespace_t>();
      for (const auto& p : a.positional)
        if (p.is_dict())
          ns->attrs = p.dict();
      for (auto& [k, v] : a.keyword)
        ns->attrs.emplace_back(k, v);
      return ns;
    });
  if (name == "range")
    return function_t([](call_args& a) -> value {
      int64_t start = 0, stop = 0, step = 1;
      if (a.positional.size() == 1) {
        stop = a.positional[0].integer();
      } else if (a.positional.size() >= 2) {
        start = a.positional[0].integer();
        stop = a.positional[1].integer();
        if (a.positional.size() >= 3)
          step = a.positional[2].integer();
      }
      if (step == 0)
        raise("range: step cannot be zero");
      list_t out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (out.size() > 1'000'000)
          raise("range: more than a million items");
        out.emplace_back(i);
      }
      return out;
    });
  if (name == "raise_exception")
    return function_t([](call_args& a) -> value { raise("the chat template raised: " + to_str(arg(a, 0, "message"))); });
  if (name == "strftime_now")
    return function_t([](call_args& a) -> value {
      std::time_t now = std::time(nullptr);
      std::tm local{};
      localtime_r(&now, &local);
      char buf[256];
      auto n = std::strftime(buf, sizeof buf, to_str(arg(a, 0, "format")).c_str(), &local);
      return std::string(buf, n);
    });
  return undefined_t{name};
}

bool apply_test(const std::string& name, const value& x, call_args& a) {
  auto other = [&] { return arg(a, 0, "other"); };
  if (name == "defined")
    return !x.is_undefined();
  if (name == "undefined")
    return x.is_undefined();
  if (name == "none")
    return x.is_none();
  if (name == "string")
    return x.is_string();
  if (name == "number")
    return x.is_number() || x.is_bool();
  if (name == "integer")
    return x.is_int();
  if (name == "float")
    return x.is_float();
  if (name == "boolean")
    return x.is_bool();
  if (name == "true")
    return x.is_bool() && std::get<bool>(x.v);
  if (name == "false")
    return x.is_bool() && !std::get<bool>(x.v);
  if (name == "mapping")
    return x.is_dict();
  if (name == "sequence")
    return x.is_list() || x.is_string() || x.is_dict();
  if (name == "iterable")
    return x.is_list() || x.is_string() || x.is_dict();
  if (name == "callable")
    return x.is_function();
  if (name == "odd" || name == "even") {
    if (!x.is_int())
      raise(fmt::format("test '{}' of a {}", name, type_name(x)));
    return (x.integer() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    auto d = other().integer();
    if (d == 0)
      raise("divisibleby 0");
    return x.integer() % d == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==")
    return equals(x, other());
  if (name == "ne" || name == "!=")
    return !equals(x, other());
  if (name == "lt" || name == "<")
    return order(x, other()) < 0;
  if (name == "le" || name == "<=")
    return order(x, other()) <= 0;
  if (name == "gt" || name == ">")
    return order(x, other()) > 0;
  if (name == "ge" || name == ">=")
    return order(x, other()) >= 0;
  if (name == "in")
    return contains(arg(a, 0, "seq"), x);
  if (name == "sameas")
    return equals(x, other()) && x.v.index() == other().v.index();
  if (name == "lower" || name == "upper")
    return x.is_string() && x.str() == ascii_case(x.str(), name == "upper");
  raise("unknown test '" + name + "'");
}

// select / reject / selectattr / rejectattr: items passing (or failing) a test, by value or by
// one of their attributes.
value select_items(const value& x, call_args& a, bool by_attr, bool keep) {
  list_t out;
  std::size_t first = by_attr ? 1 : 0;
  std::string attr = by_attr ? to_str(arg(a, 0, "attribute")) : "";
  std::string test = a.positional.size() > first ? to_str(a.positional[first]) : "";
  call_args rest;
  for (std::size_t i = first + 1; i < a.positional.size(); ++i)
    rest.positional.push_back(a.positional[i]);
  for (const auto& item : as_list(x)) {
    value probe = by_attr ? get_attr(item, attr) : item;
    bool pass = test.empty() ? truthy(probe) : apply_test(test, probe, rest);
    if (pass == keep)
      out.push_back(item);
  }
  return out;
}

// HF's tojson filter: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False), arguments by position in that order or by name. As in json.dumps, an
// indent puts items on their own lines and drops the space after ',' unless separators say
// otherwise; an integer indent is that many spaces, a string is used as it is.
value tojson(const value& x, const call_args& a) {
  static constexpr std::string_view names[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
  if (a.positional.size() > std::size(names))
    raise(fmt::format("tojson takes at most {} arguments", std::size(names)));
  for (const auto& [k, v] : a.keyword)
    if (std::find(std::begin(names), std::end(names), k) == std::end(names))
      raise(fmt::format("tojson got an unexpected keyword argument '{}'", k));
  json_style style;
  style.ensure_ascii = truthy(arg(a, 0, "ensure_ascii", false));
  const value indent = arg(a, 1, "indent", none_t{});
  if (indent.is_int() || indent.is_bool())
    style.indent = std::string(std::size_t(std::max<int64_t>(indent.integer(), 0)), ' ');
  else if (indent.is_string())
    style.indent = indent.str();
  else if (!indent.is_none() && !indent.is_undefined())
    raise(fmt::format("tojson: indent must be an integer or a string, not {}", type_name(indent)));
  style.item_sep = style.indent ? "," : ", ";
  style.key_sep = ": ";
  const value separators = arg(a, 2, "separators", none_t{});
  if (!separators.is_none() && !separators.is_undefined()) {
    if (!separators.is_list() || separators.list().size() != 2 || !separators.list()[0].is_string() ||
        !separators.list()[1].is_string())
      raise("tojson: separators must be a pair of strings (item separator, key separator)");
    style.item_sep = separators.list()[0].str();
    style.key_sep = separators.list()[1].str();
  }
  style.sort_keys = truthy(arg(a, 3, "sort_keys", false));
  std::string out;
  dump_json(out, x, style, 0);
  return out;
}

value apply_filter(const std::string& name, const value& x, call_args& a, scope& s, render_state& st) {
  if (name == "length" || name == "count")
    return length(x);
  if (name == "tojson")
    return tojson(x, a);
  if (name == "safe")
    return x;
  if (name == "string")
    return to_str(x);
  if (name == "trim")
    return strip(to_str(x), arg(a, 0, "chars", none_t{}), true, true);
  if (name == "lower" || name == "upper")
    return ascii_case(to_str(x), name == "upper");
  if (name == "title")
    return title_case(to_str(x));
  if (name == "capitalize")
    return capitalize(to_str(x));
  if (name == "replace")
    return replace_all(to_str(x), to_str(arg(a, 0, "old")), to_str(arg(a, 1, "new")), arg(a, 2, "count", int64_t(-1)).integer());
  if (name == "default" || name == "d") {
    bool boolean = truthy(arg(a, 1, "boolean", false));
    if (x.is_undefined() || (boolean && !truthy(x)))
      return arg(a, 0, "default_value", std::string());
    return x;
  }
  if (name == "first" || name == "last") {
    auto items = as_list(x);
    if (items.empty())
      return undefined_t{name};
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    std::string sep = to_str(arg(a, 0, "d", std::string())), out;
    auto attr = arg(a, 1, "attribute");
    auto items = as_list(x);
    for (std::size_t i = 0; i < items.size(); ++i)
      out += (i ? sep : "") + to_str(attr.is_undefined() ? items[i] : get_attr(items[i], to_str(attr)));
    return out;
  }
  if (name == "list")
    return as_list(x);
  if (name == "items") {
    if (x.is_undefined())
      return list_t{};
    if (!x.is_dict())
      raise(fmt::format("items of a {}", type_name(x)));
    return (*dict_method(x, "items")).function()(a);
  }
  if (name == "dictsort") {
    if (!x.is_dict())
      raise(fmt::format("dictsort of a {}", type_name(x)));
    list_t out;
    auto items = x.dict();
    std::stable_sort(items.begin(), items.end(), [](const auto& p, const auto& q) { return p.first < q.first; });
    for (const auto& [k, v] : items)
      out.emplace_back(list_t{value(k), v});
    return out;
  }
  if (name == "reverse") {
    if (x.is_string()) {
      auto cps = code_points(x.str());
      std::string out;
      for (auto it = cps.rbegin(); it != cps.rend(); ++it)
        out += *it;
      return out;
    }
    auto items = as_list(x);
    std::reverse(items.begin(), items.end());
    return items;
  }
  if (name == "sort") {
    auto items = as_list(x);
    bool reverse = truthy(arg(a, 0, "reverse", false));
    auto attr = arg(a, 2, "attribute");
    auto key = [&](const value& v) { return attr.is_undefined() ? v : get_attr(v, to_str(attr)); };
    std::stable_sort(items.begin(), items.end(), [&](const value& p, const value& q) {
      return reverse ? order(key(q), key(p)) < 0 : order(key(p), key(q)) < 0;
    });
    return items;
  }
  if (name == "unique") {
    list_t out;
    for (const auto& v : as_list(x))
      if (std::none_of(out.begin(), out.end(), [&](const value& o) { return equals(o, v); }))
        out.push_back(v);
    return out;
  }
  if (name == "int") {
    if (x.is_string()) {
      int64_t i = 0;
      auto t = strip(x.str(), none_t{}, true, true);
      auto r = std::from_chars(t.data(), t.data() + t.size(), i);
      return r.ec == std::errc() && r.ptr == t.data() + t.size() ? i : arg(a, 0, "default", int64_t(0)).integer();
    }
    if (x.is_number() || x.is_bool())
      return x.is_float() ? int64_t(std::trunc(x.number())) : x.integer();
    return arg(a, 0, "default", int64_t(0));
  }
  if (name == "float") {
    if (x.is_string()) {
      char* end = nullptr;
      auto t = strip(x.str(), none_t{}, true, true);
      double d = std::strtod(t.c_str(), &end);
      return (!t.empty() && end == t.c_str() + t.size()) ? d : arg(a, 0, "default", 0.0).number();
    }
    if (x.is_number() || x.is_bool())
      return x.number();
    return arg(a, 0, "default", 0.0);
  }
  if (name == "abs") {
    if (x.is_int())
      return std::abs(x.integer());
    return std::fabs(x.number());
  }
  if (name == "round") {
    // jinja2: round(x, precision) for 'common' (an int stays an int), else floor/ceil of
    // x * 10**precision, divided back, as a float.
    int64_t precision = arg(a, 0, "precision", int64_t(0)).integer();
    std::string method = to_str(arg(a, 1, "method", std::string("common")));
    if (method != "common" && method != "floor" && method != "ceil")
      raise("round: method must be common, ceil or floor");
    double scale = std::pow(10.0, double(precision));
    if (method != "common")
      return (method == "floor" ? std::floor(x.number() * scale) : std::ceil(x.number() * scale)) / scale;
    if (precision < 0) { // to tens, hundreds...: half to even, an int stays an int
      double r = std::nearbyint(x.number() * scale) / scale;
      return x.is_float() ? value(r) : value(int64_t(r));
    }
    if (!x.is_float())
      return x.integer();
    // Python rounds the exact binary value half to even at `precision` digits, as glibc's
    // printf does; the decimal is then read back to the nearest double.
    int digits = int(std::min<int64_t>(precision, 400)); // past ~340 digits a double is exact
    std::string text(std::size_t(std::snprintf(nullptr, 0, "%.*f", digits, x.number())) + 1, '\0');
    std::snprintf(text.data(), text.size(), "%.*f", digits, x.number());
    return std::strtod(text.c_str(), nullptr);
  }
  if (name == "wordcount")
    return int64_t(split(to_str(x), none_t{}, -1, false).size());
  if (name == "indent") {
    auto width_v = arg(a, 0, "width", int64_t(4));
    std::string pad = width_v.is_string() ? width_v.str() : std::string(std::size_t(std::max<int64_t>(0, width_v.integer())), ' ');
    bool first = truthy(arg(a, 1, "first", false));
    bool blank = truthy(arg(a, 2, "blank", false));
    auto lines = split(to_str(x), std::string("\n"), -1, false);
    std::string out;
    for (std::size_t i = 0; i < lines.size(); ++i) {
      const auto& line = lines[i].str();
      if (i)
        out += "\n";
      if ((i > 0 || first) && (blank || !line.empty()))
        out += pad;
      out += line;
    }
    return out;
  }
  if (name == "map") {
    list_t out;
    auto attr = arg(a, 99, "attribute");
    for (const auto& v : as_list(x)) {
      if (!attr.is_undefined()) {
        auto got = get_attr(v, to_str(attr));
        if (got.is_undefined())
          got = arg(a, 99, "default");
        out.push_back(got);
      } else if (!a.positional.empty()) {
        call_args rest;
        for (std::size_t i = 1; i < a.positional.size(); ++i)
          rest.positional.push_back(a.positional[i]);
        out.push_back(apply_filter(to_str(a.positional[0]), v, rest, s, st));
      } else {
        out.push_back(v);
      }
    }
    return out;
  }
  if (name == "select" || name == "reject")
    return select_items(x, a, false, name == "select");
  if (name == "selectattr" || name == "rejectattr")
    return select_items(x, a, true, name == "selectattr");
  raise("unknown filter '" + name + "'");
}

// ---- parser -------------------------------------------------------------------------------------

struct parser {
  std::string_view src;
  std::vector<token> toks;
  std::size_t at = 0;

  const token& peek(std::size_t k = 0) const { return toks[std::min(at + k, toks.size() - 1)]; }
  const token& next() { return toks[std::min(at++, toks.size() - 1)]; }

  [[noreturn]] void error(const token& t, const std::string& what) {
    raise(fmt::format("line {}: {}", line_of(src, t.pos), what));
  }

  static std::string show(const token& t) {
    switch (t.kind) {
      case tok::eof: return "the end of the template";
      case tok::text: return "text";
      case tok::var_begin: return "'{{'";
      case tok::var_end: return "'}}'";
      case tok::block_begin: return "'{%'";
      case tok::block_end: return "'%}'";
      case tok::string: return "a string";
      case tok::integer:
      case tok::floating: return "a number";
      default: return "'" + t.text + "'";
    }
  }

  bool is_op(const char* op, std::size_t k = 0) const { return peek(k).kind == tok::op && peek(k).text == op; }
  bool is_name(const char* n, std::size_t k = 0) const { return peek(k).kind == tok::name && peek(k).text == n; }

  void expect_op(const char* op) {
    if (!is_op(op))
      error(peek(), fmt::format("expected '{}', got {}", op, show(peek())));
    ++at;
  }
  std::string expect_name() {
    if (peek().kind != tok::name)
      error(peek(), "expected a name, got " + show(peek()));
    return next().text;
  }
  void expect(tok kind, const char* what) {
    if (peek().kind != kind)
      error(peek(), fmt::format("expected {}, got {}", what, show(peek())));
    ++at;
  }

  // ---- statements ----

  // Parses nodes until a block tag whose keyword is in `ends` (left unconsumed, at the keyword)
  // or the end of the template when `ends` is empty.
  body_t parse_body(std::initializer_list<std::string_view> ends) {
    body_t body;
    while (true) {
      const token& t = peek();
      if (t.kind == tok::eof) {
        if (ends.size() == 0)
          return body;
        error(t, fmt::format("expected '{}' before the end of the template", *ends.begin()));
      }
      if (t.kind == tok::text) {
        auto n = std::make_unique<text_node>();
        n->text = next().text;
        body.push_back(std::move(n));
      } else if (t.kind == tok::var_begin) {
        ++at;
        auto n = std::make_unique<output_node>();
        n->e = parse_expression();
        expect(tok::var_end, "'}}'");
        body.push_back(std::move(n));
      } else if (t.kind == tok::block_begin) {
        const token& kw = peek(1);
        if (kw.kind != tok::name)
          error(kw, "expected a statement keyword, got " + show(kw));
        if (std::find(ends.begin(), ends.end(), kw.text) != ends.end()) {
          ++at; // at the keyword
          return body;
        }
        static constexpr std::string_view closers[] = {"elif", "else", "endif", "endfor", "endset", "endmacro",
                                                       "endgeneration"};
        if (std::find(std::begin(closers), std::end(closers), kw.text) != std::end(closers))
          error(kw, ends.size() == 0 ? "unexpected '" + kw.text + "'"
                                     : fmt::format("expected '{}', got '{}'", *(ends.end() - 1), kw.text));
        ++at;
        parse_statement(body);
      } else {
        error(t, "unexpected " + show(t));
      }
    }
  }

  void parse_statement(body_t& body) {
    const token kw = next();
    const std::string& k = kw.text;
    if (k == "if") {
      auto n = std::make_unique<if_node>();
      auto cond = parse_expression();
      expect(tok::block_end, "'%}'");
      while (true) {
        auto b = parse_body({"elif", "else", "endif"});
        n->branches.emplace_back(std::move(cond), std::move(b));
        std::string which = next().text;
        if (which == "elif") {
          cond = parse_expression();
          expect(tok::block_end, "'%}'");
          continue;
        }
        expect(tok::block_end, "'%}'");
        if (which == "else") {
          n->otherwise = parse_body({"endif"});
          ++at;
          expect(tok::block_end, "'%}'");
        }
        break;
      }
      body.push_back(std::move(n));
    } else if (k == "for") {
      auto n = std::make_unique<for_node>();
      n->targets.push_back(expect_name());
      while (is_op(",")) {
        ++at;
        n->targets.push_back(expect_name());
      }
      if (!is_name("in"))
        error(peek(), "expected 'in', got " + show(peek()));
      ++at;
      n->iter = parse_or_condition(/*allow_if=*/false);
      if (is_name("if")) {
        ++at;
        n->filter = parse_or_condition(false);
      }
      if (is_name("recursive"))
        error(peek(), "recursive loops are not supported");
      expect(tok::block_end, "'%}'");
      n->body = parse_body({"else", "endfor"});
      if (toks[at - 1].kind == tok::block_begin && peek().text == "else") {
        ++at;
        expect(tok::block_end, "'%}'");
        n->otherwise = parse_body({"endfor"});
      }
      ++at;
      expect(tok::block_end, "'%}'");
      body.push_back(std::move(n));
    } else if (k == "set") {
      std::string name = expect_name();
      std::string attr;
      if (is_op(".")) {
        ++at;
        attr = expect_name();
      }
      if (peek().kind == tok::block_end && attr.empty()) {
        ++at;
        auto n = std::make_unique<set_block_node>();
        n->name = name;
        n->body = parse_body({"endset"});
        ++at;
        expect(tok::block_end, "'%}'");
        body.push_back(std::move(n));
        return;
      }
      expect_op("=");
      auto n = std::make_unique<set_node>();
      n->name = name;
      n->attr = attr;
      n->e = parse_tuple_or_expression();
      expect(tok::block_end, "'%}'");
      body.push_back(std::move(n));
    } else if (k == "break" || k == "continue") {
      auto n = std::make_unique<control_node>();
      n->f = k == "break" ? flow::break_loop : flow::continue_loop;
      expect(tok::block_end, "'%}'");
      body.push_back(std::move(n));
    } else if (k == "macro") {
      auto n = std::make_unique<macro_node>();
      n->name = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        std::string p = expect_name();
        expr_ptr def;
        if (is_op("=")) {
          ++at;
          def = parse_expression();
        }
        n->params.emplace_back(p, std::move(def));
        if (!is_op(")"))
          expect_op(",");
      }
      ++at;
      expect(tok::block_end, "'%}'");
      n->body = parse_body({"endmacro"});
      ++at;
      expect(tok::block_end, "'%}'");
      body.push_back(std::move(n));
    } else if (k == "generation") {
      // HF's marker of the assistant's tokens (for assistant masks): its body renders as is.
      expect(tok::block_end, "'%}'");
      auto inner = parse_body({"endgeneration"});
      ++at;
      expect(tok::block_end, "'%}'");
      for (auto& n : inner)
        body.push_back(std::move(n));
    } else {
      error(kw, "unknown or unsupported statement '" + k + "'");
    }
  }

  // ---- expressions ----

  expr_ptr parse_tuple_or_expression() {
    auto first = parse_expression();
    if (!is_op(","))
      return first;
    auto l = std::make_unique<list_expr>();
    l->items.push_back(std::move(first));
    while (is_op(",")) {
      ++at;
      l->items.push_back(parse_expression());
    }
    return l;
  }

  expr_ptr parse_expression() { return parse_or_condition(true); }

  // `a if c else b` (allow_if), over or-expressions.
  expr_ptr parse_or_condition(bool allow_if) {
    auto e = parse_or();
    while (allow_if && is_name("if")) {
      ++at;
      auto c = std::make_unique<cond_expr>();
      c->then = std::move(e);
      c->cond = parse_or();
      if (is_name("else")) {
        ++at;
        c->otherwise = parse_or_condition(true);
      }
      e = std::move(c);
    }
    return e;
  }

  expr_ptr parse_or() {
    auto e = parse_and();
    while (is_name("or")) {
      ++at;
      auto n = std::make_unique<and_or_expr>();
      n->is_and = false;
      n->l = std::move(e);
      n->r = parse_and();
      e = std::move(n);
    }
    return e;
  }

  expr_ptr parse_and() {
    auto e = parse_not();
    while (is_name("and")) {
      ++at;
      auto n = std::make_unique<and_or_expr>();
      n->is_and = true;
      n->l = std::move(e);
      n->r = parse_not();
      e = std::move(n);
    }
    return e;
  }

  expr_ptr parse_not() {
    if (is_name("not")) {
      ++at;
      auto n = std::make_unique<not_expr>();
      n->e = parse_not();
      return n;
    }
    return parse_compare();
  }

  expr_ptr parse_compare() {
    auto first = parse_math1();
    std::vector<std::pair<std::string, expr_ptr>> rest;
    while (true) {
      std::string op;
      if (peek().kind == tok::op && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                     peek().text == "<=" || peek().text == ">" || peek().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        ++at;
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        at += 2;
        op = "not in";
      } else {
        break;
      }
      rest.emplace_back(op, parse_math1());
    }
    if (rest.empty())
      return first;
    auto c = std::make_unique<compare_expr>();
    c->first = std::move(first);
    c->rest = std::move(rest);
    return c;
  }

  expr_ptr make_binary(std::string op, expr_ptr l, expr_ptr r) {
    auto b = std::make_unique<binary_expr>();
    b->op = std::move(op);
    b->l = std::move(l);
    b->r = std::move(r);
    return b;
  }

  expr_ptr parse_math1() {
    auto e = parse_concat();
    while (is_op("+") || is_op("-")) {
      auto op = next().text;
      e = make_binary(op, std::move(e), parse_concat());
    }
    return e;
  }

  expr_ptr parse_concat() {
    auto e = parse_math2();
    while (is_op("~")) {
      ++at;
      e = make_binary("~", std::move(e), parse_math2());
    }
    return e;
  }

  expr_ptr parse_math2() {
    auto e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      auto op = next().text;
      e = make_binary(op, std::move(e), parse_pow());
    }
    return e;
  }

  expr_ptr parse_pow() {
    auto e = parse_unary();
    while (is_op("**")) {
      ++at;
      e = make_binary("**", std::move(e), parse_unary());
    }
    return e;
  }

  // As jinja2: a sign binds tighter than filters and tests (-3|abs is 3).
  expr_ptr parse_unary(bool with_filters = true) {
    expr_ptr e;
    if (is_op("-") || is_op("+")) {
      char op = next().text[0];
      auto u = std::make_unique<unary_expr>();
      u->op = op;
      u->e = parse_unary(false);
      e = std::move(u);
    } else {
      e = parse_postfix(parse_primary());
    }
    return with_filters ? parse_filters(std::move(e)) : std::move(e);
  }

  arg_exprs parse_call_args() {
    arg_exprs args;
    expect_op("(");
    while (!is_op(")")) {
      if (peek().kind == tok::name && is_op("=", 1)) {
        std::string k = next().text;
        ++at;
        args.keyword.emplace_back(k, parse_expression());
      } else {
        args.positional.push_back(parse_expression());
      }
      if (!is_op(")"))
        expect_op(",");
    }
    ++at;
    return args;
  }

  expr_ptr parse_postfix(expr_ptr e) {
    while (true) {
      if (is_op(".")) {
        ++at;
        auto a = std::make_unique<attr_expr>();
        a->obj = std::move(e);
        if (peek().kind == tok::integer) {
          auto i = std::make_unique<item_expr>();
          i->obj = std::move(a->obj);
          i->key = std::make_unique<literal_expr>(value(next().i));
          e = std::move(i);
          continue;
        }
        a->name = expect_name();
        e = std::move(a);
      } else if (is_op("[")) {
        ++at;
        expr_ptr parts[3];
        int colons = 0;
        while (!is_op("]")) {
          if (is_op(":")) {
            ++at;
            if (++colons > 2)
              error(peek(), "a slice takes at most two ':'");
            continue;
          }
          if (parts[colons])
            error(peek(), "expected ']' or ':', got " + show(peek()));
          parts[colons] = parse_expression();
        }
        ++at;
        if (colons == 0) {
          if (!parts[0])
            error(peek(), "empty subscript");
          auto i = std::make_unique<item_expr>();
          i->obj = std::move(e);
          i->key = std::move(parts[0]);
          e = std::move(i);
        } else {
          auto s = std::make_unique<slice_expr>();
          s->obj = std::move(e);
          s->start = std::move(parts[0]);
          s->stop = std::move(parts[1]);
          s->step = std::move(parts[2]);
          e = std::move(s);
        }
      } else if (is_op("(")) {
        auto c = std::make_unique<call_expr>();
        c->what = "the called value";
        c->fn = std::move(e);
        c->args = parse_call_args();
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  expr_ptr parse_filters(expr_ptr e) {
    while (true) {
      if (is_op("|")) {
        ++at;
        auto f = std::make_unique<filter_expr>();
        f->obj = std::move(e);
        f->name = expect_name();
        if (is_op("("))
          f->args = parse_call_args();
        e = parse_postfix(std::move(f));
      } else if (is_name("is")) {
        ++at;
        auto t = std::make_unique<test_expr>();
        t->obj = std::move(e);
        if (is_name("not")) {
          ++at;
          t->negated = true;
        }
        if (peek().kind == tok::name) {
          t->name = next().text;
        } else if (peek().kind == tok::op && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                              peek().text == "<=" || peek().text == ">" || peek().text == ">=")) {
          t->name = next().text;
        } else {
          error(peek(), "expected a test name after 'is', got " + show(peek()));
        }
        if (is_op("(")) {
          t->args = parse_call_args();
        } else if (peek().kind == tok::string || peek().kind == tok::integer || peek().kind == tok::floating ||
                   (peek().kind == tok::name && !is_name("and") && !is_name("or") && !is_name("else") &&
                    !is_name("if") && !is_name("in") && !is_name("is") && !is_name("not"))) {
          // `is divisibleby 3`, `is sameas none`: one argument without parentheses.
          t->args.positional.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  expr_ptr parse_primary() {
    const token& t = peek();
    switch (t.kind) {
      case tok::string: return std::make_unique<literal_expr>(value(next().text));
      case tok::integer: return std::make_unique<literal_expr>(value(next().i));
      case tok::floating: return std::make_unique<literal_expr>(value(next().f));
      case tok::name: {
        auto n = std::make_unique<name_expr>();
        n->name = next().text;
        return n;
      }
      case tok::op:
        if (t.text == "(") {
          ++at;
          if (is_op(")")) {
            ++at;
            return std::make_unique<literal_expr>(value(list_t{}));
          }
          auto e = parse_tuple_or_expression();
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          ++at;
          auto l = std::make_unique<list_expr>();
          while (!is_op("]")) {
            l->items.push_back(parse_expression());
            if (!is_op("]"))
              expect_op(",");
          }
          ++at;
          return l;
        }
        if (t.text == "{") {
          ++at;
          auto d = std::make_unique<dict_expr>();
          while (!is_op("}")) {
            auto k = parse_expression();
            expect_op(":");
            d->items.emplace_back(std::move(k), parse_expression());
            if (!is_op("}"))
              expect_op(",");
          }
          ++at;
          return d;
        }
        [[fallthrough]];
      default: error(t, "expected an expression, got " + show(t));
    }
  }
};

} // namespace

struct template_program::program {
  body_t body;
};

expected<template_program> template_program::parse(std::string_view source, options opts) {
  try {
    lexer lx{source, opts, {}};
    lx.run();
    parser p{source, std::move(lx.out), 0};
    auto prog = std::make_shared<program>();
    prog->body = p.parse_body({});
    return template_program(std::move(prog));
  } catch (const template_error& e) {
    return fail("chat template: " + e.message);
  }
}

expected<std::string> template_program::render(const nlohmann::ordered_json& variables) const {
  try {
    scope root;
    if (variables.is_object())
      for (auto it = variables.begin(); it != variables.end(); ++it)
        root.vars[it.key()] = from_json(it.value());
    render_state st;
    st.root = &root;
    render_body(program_->body, root, st);
    return std::move(st.out);
  } catch (const template_error& e) {
    return fail("chat template: " + e.message);
  }
}

} // namespace rlserve::model::jinja
