// The filters, tests and global functions of the Jinja subset (what jinja2 and transformers'
// chat-template environment provide that templates use).
#include "model/jinja/internal.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <limits>

#include <fmt/format.h>

namespace rlserve::model::jinja::detail {

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

} // namespace rlserve::model::jinja::detail
