// Internal to the Jinja interpreter (model/jinja.hpp): the values templates compute with, the
// evaluation state, and the operations the interpreter's files share (values.cpp: Python-like
// values; builtins.cpp: filters, tests, globals; tree.hpp: the syntax tree and its walker;
// lexer.hpp: jinja2's tokens and whitespace rules; ../jinja.cpp: the parser and the public API).
//
// Errors inside the walker are thrown as `template_error` and caught at render(): a template's
// evaluation nests as deep as its expressions, and every step can fail on a value of the wrong
// type, so unwinding is what keeps each step one line. Nothing else in rlserve sees them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/jinja.hpp"

namespace rlserve::model::jinja::detail {

struct template_error {
  std::string message;
};

[[noreturn]] inline void raise(std::string message) { throw template_error{std::move(message)}; }

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

struct json_style {
  std::optional<std::string> indent; // per level; nullopt: all on one line
  std::string item_sep, key_sep;
  bool sort_keys = false;
  bool ensure_ascii = false;
};

// ---- operations on values (values.cpp) --------------------------------------------------------

bool is_space(char c); // Python's str.isspace() for ASCII
int64_t normalize_index(int64_t i, int64_t n);
const char* type_name(const value& x);
const value* dict_find(const dict_t& d, std::string_view key);
std::vector<std::string_view> code_points(std::string_view s);
bool truthy(const value& x);
std::string python_float(double d);
std::string to_str(const value& x);
std::string python_repr(const value& x);
void dump_json_string(std::string& out, std::string_view s, bool ensure_ascii);
void dump_json(std::string& out, const value& x, const json_style& style, int level);
value from_json(const nlohmann::ordered_json& j);
bool equals(const value& a, const value& b);
int order(const value& a, const value& b);
bool contains(const value& container, const value& item);
list_t as_list(const value& x);
int64_t length(const value& x);
std::string strip(const std::string& s, const value& chars, bool left, bool right);
list_t split(const std::string& s, const value& sep, int64_t maxsplit, bool from_right);
std::string replace_all(std::string s, const std::string& from, const std::string& to, int64_t count = -1);
std::string ascii_case(std::string s, bool upper);
std::string title_case(const std::string& s);
std::string capitalize(const std::string& s);
value arg(const call_args& a, std::size_t i, std::string_view name, value fallback = undefined_t{});
std::optional<value> string_method(const std::string& s, const std::string& name);
std::optional<value> dict_method(const value& d, const std::string& name);
std::string describe_undefined(const value& x);
value get_attr(const value& obj, const std::string& name);
value get_item(const value& obj, const value& key);
value slice(const value& obj, const value& start, const value& stop, const value& step_v);

// ---- evaluation state ------------------------------------------------------------------------

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

inline flow render_body(const body_t& body, scope& s, render_state& st) {
  for (const auto& n : body)
    if (auto f = n->render(s, st); f != flow::normal)
      return f;
  return flow::normal;
}

// ---- filters, tests, globals (builtins.cpp) ---------------------------------------------------

value builtin_global(const std::string& name);
bool apply_test(const std::string& name, const value& x, call_args& a);
value select_items(const value& x, call_args& a, bool by_attr, bool keep);
value tojson(const value& x, const call_args& a);
value apply_filter(const std::string& name, const value& x, call_args& a, scope& s, render_state& st);

} // namespace rlserve::model::jinja::detail
