// Python-like values for the Jinja interpreter: truthiness, str() and repr(), JSON in and out,
// comparisons, and the string, list and dict operations templates call.
#include "model/jinja/internal.hpp"
#include "model/python_text.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include <fmt/format.h>

namespace rlserve::model::jinja::detail {

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

std::string replace_all(std::string s, const std::string& from, const std::string& to, int64_t count) {
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
value arg(const call_args& a, std::size_t i, std::string_view name, value fallback) {
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

} // namespace rlserve::model::jinja::detail
