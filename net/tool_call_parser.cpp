// Tool calls in a model's output (see tool_call_parser.hpp). The facts of each format are
// SGLang's detectors' (python/sglang/srt/function_call/{qwen25,qwen3_coder,glm4_moe}_detector.py);
// what happens to a block that is not a call is rlserve's rule: it stays text.
#include "net/tool_call_parser.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>

namespace rlserve::net {

namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view k_open = "<tool_call>";
constexpr std::string_view k_close = "</tool_call>";
// Deeper arguments than this are not a call (a model looping on "[" must not cost a deep
// recursion to parse, dump or free).
constexpr int k_max_depth = 128;

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ws(s.front()))
    s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back()))
    s.remove_suffix(1);
  return s;
}

void skip_ws(std::string_view& s) {
  while (!s.empty() && is_ws(s.front()))
    s.remove_prefix(1);
}

bool consume(std::string_view& s, std::string_view token) {
  if (!s.starts_with(token))
    return false;
  s.remove_prefix(token.size());
  return true;
}

// The text up to `end` (consumed with it), or nullopt when `end` does not come.
std::optional<std::string_view> until(std::string_view& s, std::string_view end) {
  auto at = s.find(end);
  if (at == std::string_view::npos)
    return std::nullopt;
  auto head = s.substr(0, at);
  s.remove_prefix(at + end.size());
  return head;
}

bool nesting_within_limit(std::string_view text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"')
      in_string = true;
    else if (c == '[' || c == '{') {
      if (++depth > k_max_depth)
        return false;
    } else if (c == ']' || c == '}')
      --depth;
  }
  return true;
}

std::optional<ojson> parse_json(std::string_view text) {
  if (!nesting_within_limit(text))
    return std::nullopt;
  auto j = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return std::nullopt;
  return j;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The declared JSON-schema type of argument `key` of a function ("" when not declared): the
// `type` of parameters.properties[key] (or of parameters[key], as SGLang also reads), the
// first non-null one of a list of types.
std::string declared_type(const ojson* schema, const std::string& key) {
  if (schema == nullptr || !schema->is_object())
    return {};
  const ojson* props = schema;
  if (auto it = schema->find("properties"); it != schema->end() && it->is_object())
    props = &*it;
  auto p = props->find(key);
  if (p == props->end() || !p->is_object())
    return {};
  auto t = p->find("type");
  if (t == p->end())
    return {};
  if (t->is_string())
    return lower(t->get<std::string>());
  if (t->is_array())
    for (const auto& one : *t)
      if (one.is_string() && one != "null")
        return lower(one.get<std::string>());
  return {};
}

bool is_string_type(const std::string& t) {
  return t == "string" || t == "str" || t == "text" || t == "varchar" || t == "char" || t == "enum";
}

// A qwen3_coder parameter's text as a JSON value, by its declared type (SGLang's conversions:
// integers and numbers parsed, booleans by "true", objects and arrays as JSON; a value that does
// not convert stays the text).
ojson coder_value(const std::string& text, const std::string& type) {
  if (lower(text) == "null")
    return nullptr;
  if (type.empty() || is_string_type(type))
    return text;
  if (type.starts_with("int") || type.starts_with("uint") || type.starts_with("long") ||
      type.starts_with("short") || type.starts_with("unsigned")) {
    int64_t v = 0;
    auto r = std::from_chars(text.data(), text.data() + text.size(), v);
    if (r.ec == std::errc() && r.ptr == text.data() + text.size())
      return v;
    return text;
  }
  if (type.starts_with("num") || type.starts_with("float")) {
    double v = 0;
    auto r = std::from_chars(text.data(), text.data() + text.size(), v);
    if (r.ec != std::errc() || r.ptr != text.data() + text.size() || !std::isfinite(v))
      return text;
    const bool integral_text = text.find_first_of(".eE") == std::string::npos;
    if (integral_text && v == std::floor(v) && std::abs(v) < 9e15)
      return static_cast<int64_t>(v);
    return v;
  }
  if (type == "boolean" || type == "bool" || type == "binary")
    return lower(text) == "true";
  if (auto j = parse_json(text))
    return *j;
  return text;
}

// A glm45 value: a string-typed argument is the text as written; any other is read as JSON when
// it is JSON, else kept as text.
ojson glm_value(const std::string& text, const std::string& type) {
  if (is_string_type(type))
    return text;
  if (auto j = parse_json(text))
    return *j;
  return text;
}

std::optional<tool_call> qwen25_block(const tool_set& tools, std::string_view inner) {
  auto j = parse_json(trim(inner));
  if (!j || !j->is_object())
    return std::nullopt;
  auto name = j->find("name");
  if (name == j->end() || !name->is_string() || tools.find(name->get_ref<const std::string&>()) == nullptr)
    return std::nullopt;
  ojson args = ojson::object();
  if (auto a = j->find("arguments"); a != j->end())
    args = *a;
  else if (auto p = j->find("parameters"); p != j->end())
    args = *p;
  if (!args.is_object())
    return std::nullopt;
  return tool_call{{}, name->get<std::string>(), python_json_dumps(args)};
}

std::optional<tool_call> qwen3_coder_block(const tool_set& tools, std::string_view s) {
  s = trim(s);
  if (!consume(s, "<function="))
    return std::nullopt;
  auto name = until(s, ">");
  if (!name || name->empty() || name->find_first_of("<\n") != std::string_view::npos)
    return std::nullopt;
  const ojson* schema = tools.find(*name);
  if (schema == nullptr)
    return std::nullopt;
  ojson args = ojson::object();
  for (;;) {
    skip_ws(s);
    if (consume(s, "</function>"))
      break;
    if (!consume(s, "<parameter="))
      return std::nullopt;
    auto key = until(s, ">");
    auto value = key ? until(s, "</parameter>") : std::nullopt;
    if (!key || key->empty() || !value)
      return std::nullopt;
    std::string_view v = *value;
    // The template writes each value on lines of its own: one newline each side is framing.
    if (v.starts_with('\n'))
      v.remove_prefix(1);
    if (v.ends_with('\n'))
      v.remove_suffix(1);
    std::string k(*key);
    args[k] = coder_value(std::string(v), declared_type(schema, k));
  }
  if (!trim(s).empty())
    return std::nullopt;
  return tool_call{{}, std::string(*name), python_json_dumps(args)};
}

std::optional<tool_call> glm45_block(const tool_set& tools, std::string_view s) {
  auto newline = s.find('\n');
  std::string_view name = trim(s.substr(0, newline));
  s = newline == std::string_view::npos ? std::string_view() : s.substr(newline + 1);
  if (name.empty() || name.find('<') != std::string_view::npos)
    return std::nullopt;
  const ojson* schema = tools.find(name);
  if (schema == nullptr)
    return std::nullopt;
  ojson args = ojson::object();
  for (;;) {
    skip_ws(s);
    if (s.empty())
      break;
    if (!consume(s, "<arg_key>"))
      return std::nullopt;
    auto key = until(s, "</arg_key>");
    if (!key)
      return std::nullopt;
    skip_ws(s);
    if (!consume(s, "<arg_value>"))
      return std::nullopt;
    auto value = until(s, "</arg_value>");
    if (!value)
      return std::nullopt;
    std::string k(trim(*key));
    if (k.empty())
      return std::nullopt;
    args[k] = glm_value(std::string(*value), declared_type(schema, k));
  }
  return tool_call{{}, std::string(name), python_json_dumps(args)};
}

void append_python_json(const ojson& x, std::string& out) {
  switch (x.type()) {
  case ojson::value_t::object: {
    out += '{';
    bool first = true;
    for (auto it = x.begin(); it != x.end(); ++it) {
      if (!first)
        out += ", ";
      first = false;
      out += ojson(it.key()).dump(-1, ' ', false, ojson::error_handler_t::replace);
      out += ": ";
      append_python_json(it.value(), out);
    }
    out += '}';
    return;
  }
  case ojson::value_t::array: {
    out += '[';
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (i)
        out += ", ";
      append_python_json(x[i], out);
    }
    out += ']';
    return;
  }
  default:
    out += x.dump(-1, ' ', false, ojson::error_handler_t::replace);
  }
}

} // namespace

std::optional<tool_call_format> find_tool_call_format(std::string_view name) {
  if (name == "qwen25" || name == "qwen")
    return tool_call_format::qwen25;
  if (name == "qwen3_coder")
    return tool_call_format::qwen3_coder;
  if (name == "glm45" || name == "glm")
    return tool_call_format::glm45;
  return std::nullopt;
}

std::string tool_call_format_names() { return "qwen25, qwen, qwen3_coder, glm45, glm"; }

const nlohmann::ordered_json* tool_set::find(std::string_view name) const {
  for (const auto& [n, schema] : functions)
    if (n == name)
      return &schema;
  return nullptr;
}

std::string python_json_dumps(const nlohmann::ordered_json& x) {
  std::string out;
  append_python_json(x, out);
  return out;
}

std::size_t partial_marker_suffix(std::string_view text, std::string_view marker) {
  for (std::size_t k = std::min(text.size(), marker.size() - 1); k > 0; --k)
    if (text.substr(text.size() - k) == marker.substr(0, k))
      return k;
  return 0;
}

std::optional<tool_call> parse_tool_call_block(tool_call_format format, const tool_set& tools,
                                               std::string_view inner) {
  switch (format) {
  case tool_call_format::qwen25:
    return qwen25_block(tools, inner);
  case tool_call_format::qwen3_coder:
    return qwen3_coder_block(tools, inner);
  case tool_call_format::glm45:
    return glm45_block(tools, inner);
  }
  return std::nullopt;
}

void tool_call_stream::emit_text(std::string_view text, tool_parse_delta& out) {
  if (after_call_) {
    while (!text.empty() && is_ws(text.front()))
      text.remove_prefix(1);
    if (text.empty())
      return;
    after_call_ = false;
  }
  std::size_t keep = text.size();
  while (keep > 0 && is_ws(text[keep - 1]))
    --keep;
  if (keep == 0) { // whitespace only: held until what follows decides
    pending_ws_ += text;
    return;
  }
  out.content += pending_ws_;
  out.content += text.substr(0, keep);
  pending_ws_.assign(text.substr(keep));
}

void tool_call_stream::close_block(std::string_view inner, tool_parse_delta& out) {
  if (auto call = parse_tool_call_block(format_, tools_, inner)) {
    pending_ws_.clear();
    after_call_ = true;
    out.calls.push_back(std::move(*call));
    return;
  }
  std::string raw;
  raw.reserve(k_open.size() + inner.size() + k_close.size());
  raw.append(k_open).append(inner).append(k_close);
  emit_text(raw, out);
}

tool_parse_delta tool_call_stream::feed(std::string_view text) {
  tool_parse_delta out;
  held_.append(text);
  std::string_view rest = held_;
  for (;;) {
    if (!in_block_) {
      auto at = rest.find(k_open);
      if (at == std::string_view::npos) {
        auto partial = partial_marker_suffix(rest, k_open);
        emit_text(rest.substr(0, rest.size() - partial), out);
        rest.remove_prefix(rest.size() - partial);
        break;
      }
      emit_text(rest.substr(0, at), out);
      rest.remove_prefix(at + k_open.size());
      in_block_ = true;
      scanned_ = 0;
      continue;
    }
    auto end = rest.find(k_close, scanned_);
    if (end == std::string_view::npos) {
      // A long block is searched once, not again at every piece.
      scanned_ = rest.size() - std::min(rest.size(), k_close.size() - 1);
      break;
    }
    close_block(rest.substr(0, end), out);
    rest.remove_prefix(end + k_close.size());
    in_block_ = false;
  }
  held_ = std::string(rest);
  return out;
}

tool_parse_delta tool_call_stream::finish() {
  tool_parse_delta out;
  if (in_block_) { // never closed: not a call
    std::string raw(k_open);
    raw += held_;
    emit_text(raw, out);
  } else {
    emit_text(held_, out);
  }
  held_.clear();
  in_block_ = false;
  if (!after_call_)
    out.content += pending_ws_;
  pending_ws_.clear();
  return out;
}

tool_parse_result parse_tool_calls(tool_call_format format, const tool_set& tools, std::string_view text) {
  tool_call_stream stream(format, tools);
  auto a = stream.feed(text);
  auto b = stream.finish();
  tool_parse_result r{std::move(a.content), std::move(a.calls)};
  r.content += b.content;
  for (auto& c : b.calls)
    r.calls.push_back(std::move(c));
  return r;
}

} // namespace rlserve::net
