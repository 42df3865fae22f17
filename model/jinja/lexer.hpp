// The Jinja lexer: template text to tokens, with jinja2's whitespace rules (trim_blocks,
// lstrip_blocks, the '-' and '+' markers) applied as the text is cut. Included by the parser only.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "model/jinja/internal.hpp"

namespace rlserve::model::jinja::detail {

// ---- lexer --------------------------------------------------------------------------------------

enum class tok : uint8_t { text, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof };

struct token {
  tok kind = tok::eof;
  std::string text; // text, name, string value, operator
  int64_t i = 0;
  double f = 0;
  std::size_t pos = 0;
};

inline int line_of(std::string_view src, std::size_t pos) {
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

} // namespace rlserve::model::jinja::detail
