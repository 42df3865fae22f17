// The pre-tokenizer's regex engine: the subset of Oniguruma's Ruby syntax that tokenizer.json
// Split patterns use, matched as Oniguruma matches (leftmost start, leftmost-first alternation,
// greedy or lazy quantifiers, backtracking, atomic lookahead), with its character classes taken
// from the project's Unicode table (unicode_data.hpp) rather than from any host library. Patterns
// outside the subset are refused at load, naming the construct, so that nothing is split in a way
// `tokenizers` would not split it. The supported subset is listed in bpe_tokenizer.hpp.
//
// A pattern compiles to a small program for a backtracking machine. One instruction repeats a
// single character class (`\p{L}+`, `\s*`, `[\r\n]+`): it consumes greedily and gives back one
// character at a time on backtracking, with one stack entry for the whole run, which is what keeps
// encoding fast on long words and whitespace runs.
#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "model/bpe_tokenizer_state.hpp"
#include "model/unicode_data.hpp"

namespace rlserve::model::bpe_detail {

using bpe_internal::utf8_decode;
using bpe_internal::utf8_is_valid;
namespace uni = rlserve::model::unicode;

namespace {

constexpr uint32_t k_unbounded = std::numeric_limits<uint32_t>::max();
// Counted repeats are unrolled; these bound the program a hostile tokenizer.json can make.
constexpr uint32_t k_max_count = 1000;
constexpr std::size_t k_max_program = 100'000;
constexpr int k_max_depth = 100; // nested groups (the parser and code generator recurse)
// Backtracks one match attempt may take: Oniguruma's default retry limit. A hostile pattern such
// as (a|a)*b stops there, and the rest of the text is left unmatched, as `tokenizers` leaves it
// when Oniguruma gives up (its find_iter ends).
constexpr uint64_t k_step_budget = 10'000'000;

struct char_class {
  std::array<uint64_t, 2> ascii{}; // the answer for c < 128, negation applied (finish())
  uni::property_mask props = 0;    // in the class when the code point's atoms meet this
  std::vector<uni::property_mask> negated_props; // \S, \P{L}, \D, \W inside brackets
  std::vector<std::pair<char32_t, char32_t>> ranges;
  bool negated = false;

  bool contains_raw(char32_t c) const {
    const uni::property_mask a = uni::atoms(c);
    if (a & props)
      return true;
    for (auto m : negated_props)
      if (!(a & m))
        return true;
    for (auto [lo, hi] : ranges)
      if (c >= lo && c <= hi)
        return true;
    return false;
  }
  void finish() {
    for (char32_t c = 0; c < 128; ++c)
      if (contains_raw(c) != negated)
        ascii[c >> 6] |= uint64_t(1) << (c & 63);
  }
  bool contains(char32_t c) const {
    if (c < 128)
      return (ascii[c >> 6] >> (c & 63)) & 1;
    return contains_raw(c) != negated;
  }
};

enum class assertion : uint8_t { line_begin, line_end, text_begin, text_end, text_end_newline };

enum class op : uint8_t {
  klass,      // a: class; one character in it
  repeat,     // a: class, min..max characters in it; flag: greedy
  split,      // try a, then b
  jump,       // a
  lookahead,  // sub-program at pc + 1 ends with match; a: pc after it; flag: negative
  assert_pos, // flag: assertion
  match,
};

struct inst {
  op code;
  uint8_t flag = 0;
  int32_t a = 0, b = 0;
  uint32_t min = 0, max = 0;
};

// ---- parsing --------------------------------------------------------------------------------

struct node {
  enum kind_t { klass, seq, alt, repeat, look, assert_pos };
  explicit node(kind_t k) : kind(k) {}
  kind_t kind;
  int cls = -1;
  std::vector<node> kids;
  uint32_t min = 0, max = 0;
  bool greedy = true;
  bool negative = false;
  assertion where = assertion::line_begin;
};

struct parse_error {
  std::string message;
};

class parser {
public:
  parser(std::string_view p, std::vector<char_class>& classes) : p_(p), classes_(classes) {}

  node parse() {
    node n = alternation(false);
    if (i_ < p_.size())
      fail(p_[i_] == ')' ? "unmatched ')'" : "unexpected character");
    return n;
  }

private:
  [[noreturn]] void fail(const std::string& what) const {
    throw parse_error{fmt::format("{} at byte {}", what, i_)};
  }
  bool at_end() const { return i_ >= p_.size(); }
  char peek() const { return p_[i_]; }
  char32_t next_char() {
    std::size_t j = i_;
    char32_t c = utf8_decode(p_, j);
    i_ = j;
    return c;
  }

  node alternation(bool case_insensitive) {
    node a{node::alt};
    bool ci = case_insensitive;
    a.kids.push_back(sequence(ci));
    while (!at_end() && peek() == '|') {
      ++i_;
      a.kids.push_back(sequence(ci));
    }
    if (a.kids.size() == 1)
      return std::move(a.kids.front());
    return a;
  }

  // `ci` is updated by an inline (?i) / (?-i), which lasts to the end of the enclosing group.
  node sequence(bool& ci) {
    node s{node::seq};
    while (!at_end() && peek() != '|' && peek() != ')') {
      std::optional<node> atom_node = atom(ci);
      if (!atom_node)
        continue; // an inline flag group
      s.kids.push_back(quantified(std::move(*atom_node)));
    }
    return s;
  }

  node quantified(node a) {
    while (!at_end()) {
      uint32_t mn = 0, mx = 0;
      const std::size_t start = i_;
      char c = peek();
      if (c == '*') {
        mn = 0, mx = k_unbounded, ++i_;
      } else if (c == '+') {
        mn = 1, mx = k_unbounded, ++i_;
      } else if (c == '?') {
        mn = 0, mx = 1, ++i_;
      } else if (c == '{') {
        if (!counted(mn, mx)) {
          i_ = start; // not a quantifier: Oniguruma reads the brace as a literal
          return a;
        }
      } else {
        return a;
      }
      if (a.kind == node::assert_pos || a.kind == node::look)
        fail("a quantifier after an assertion is not supported");
      bool greedy = true;
      if (!at_end() && peek() == '?') {
        greedy = false;
        ++i_;
      } else if (!at_end() && peek() == '+') {
        fail("possessive quantifiers are not supported");
      }
      if (mx != k_unbounded && mn > mx)
        fail("a {min,max} quantifier with min > max");
      if (mx == k_unbounded && nullable(a))
        fail("repeating something that can match the empty string is not supported");
      node r{node::repeat};
      r.min = mn, r.max = mx, r.greedy = greedy;
      r.kids.push_back(std::move(a));
      a = std::move(r);
    }
    return a;
  }

  // {n}, {n,}, {n,m}, {,m}; false (nothing consumed) when the brace is not a quantifier.
  bool counted(uint32_t& mn, uint32_t& mx) {
    std::size_t j = i_ + 1;
    auto number = [&](uint32_t& out) {
      std::size_t s = j;
      uint64_t v = 0;
      while (j < p_.size() && p_[j] >= '0' && p_[j] <= '9') {
        v = v * 10 + uint64_t(p_[j] - '0');
        if (v > k_max_count)
          fail(fmt::format("a repeat count above {} is not supported", k_max_count));
        ++j;
      }
      out = uint32_t(v);
      return j > s;
    };
    uint32_t a = 0, b = 0;
    bool has_a = number(a);
    if (j < p_.size() && p_[j] == '}') {
      if (!has_a)
        return false;
      mn = mx = a;
    } else if (j < p_.size() && p_[j] == ',') {
      ++j;
      bool has_b = number(b);
      if (j >= p_.size() || p_[j] != '}' || (!has_a && !has_b))
        return false;
      mn = has_a ? a : 0;
      mx = has_b ? b : k_unbounded;
    } else {
      return false;
    }
    i_ = j + 1;
    return true;
  }

  static bool nullable(const node& n) {
    switch (n.kind) {
    case node::klass:
      return false;
    case node::seq:
      return std::all_of(n.kids.begin(), n.kids.end(), nullable);
    case node::alt:
      return std::any_of(n.kids.begin(), n.kids.end(), nullable);
    case node::repeat:
      return n.min == 0 || nullable(n.kids.front());
    case node::look:
    case node::assert_pos:
      return true;
    }
    return true;
  }

  node class_node(char_class c) {
    c.finish();
    classes_.push_back(std::move(c));
    node n{node::klass};
    n.cls = int(classes_.size() - 1);
    return n;
  }

  node assert_node(assertion a) {
    node n{node::assert_pos};
    n.where = a;
    return n;
  }

  std::optional<node> atom(bool& ci) {
    const char c = peek();
    if (c == '(')
      return group(ci);
    if (c == '[') {
      ++i_;
      return class_node(bracket(ci));
    }
    if (c == '*' || c == '+' || c == '?')
      fail("nothing to repeat");
    if (c == '^') {
      ++i_;
      return assert_node(assertion::line_begin);
    }
    if (c == '$') {
      ++i_;
      return assert_node(assertion::line_end);
    }
    if (c == '.') {
      ++i_;
      char_class cc; // any character but a newline (Oniguruma's Ruby syntax, no multiline)
      cc.ranges.push_back({U'\n', U'\n'});
      cc.negated = true;
      return class_node(std::move(cc));
    }
    char_class cc;
    if (c == '\\') {
      ++i_;
      if (at_end())
        fail("a pattern cannot end with a backslash");
      switch (peek()) {
      case 'A':
        ++i_;
        return assert_node(assertion::text_begin);
      case 'z':
        ++i_;
        return assert_node(assertion::text_end);
      case 'Z':
        ++i_;
        return assert_node(assertion::text_end_newline);
      default:
        break;
      }
      escape_into(cc, ci);
      return class_node(std::move(cc));
    }
    add_char(cc, next_char(), ci);
    return class_node(std::move(cc));
  }

  std::optional<node> group(bool& ci) {
    if (++depth_ > k_max_depth)
      fail(fmt::format("groups nested deeper than {}", k_max_depth));
    ++i_; // '('
    bool inner_ci = ci;
    std::optional<node> look;
    if (i_ < p_.size() && peek() == '?') {
      ++i_;
      if (at_end())
        fail("an unfinished group");
      const char k = peek();
      if (k == ':') {
        ++i_;
      } else if (k == '=' || k == '!') {
        ++i_;
        look = node{node::look};
        look->negative = k == '!';
      } else if (k == '<') {
        fail("lookbehind and named groups are not supported");
      } else if (k == 'i' || k == '-') {
        bool on = true;
        bool any = false;
        while (!at_end() && (peek() == 'i' || peek() == '-')) {
          if (peek() == '-')
            on = false;
          else
            inner_ci = on, any = true;
          ++i_;
        }
        if (!any || at_end() || (peek() != ':' && peek() != ')'))
          fail("only the i flag is supported in (?flags) and (?flags:...)");
        if (peek() == ')') { // (?i): to the end of the enclosing group
          ++i_;
          --depth_;
          ci = inner_ci;
          return std::nullopt;
        }
        ++i_;
      } else {
        fail(fmt::format("the group (?{} is not supported", k));
      }
    }
    node body = alternation(inner_ci);
    if (at_end() || peek() != ')')
      fail("missing ')'");
    ++i_;
    --depth_;
    if (look) {
      look->kids.push_back(std::move(body));
      return look;
    }
    return body;
  }

  // One character (or its case variants) into a class.
  void add_char(char_class& cc, char32_t c, bool ci) {
    cc.ranges.push_back({c, c});
    if (ci)
      add_case_variants(cc, c, c);
  }

  // Case-insensitive matching as Oniguruma folds: ASCII letters both ways, plus the two
  // non-ASCII characters that fold onto them (CaseFolding.txt: U+017F -> s, U+212A -> k).
  void add_case_variants(char_class& cc, char32_t lo, char32_t hi) {
    for (char32_t c = std::max<char32_t>(lo, 'A'); c <= std::min<char32_t>(hi, 'z'); ++c) {
      char32_t lower = c, upper = c;
      if (c >= 'A' && c <= 'Z')
        lower = c + 32;
      else if (c >= 'a' && c <= 'z')
        upper = c - 32;
      else
        continue;
      cc.ranges.push_back({lower, lower});
      cc.ranges.push_back({upper, upper});
      if (lower == 's')
        cc.ranges.push_back({0x17F, 0x17F});
      if (lower == 'k')
        cc.ranges.push_back({0x212A, 0x212A});
    }
    // Non-ASCII letters have case variants this engine does not know; refuse rather than guess.
    for (char32_t c = std::max<char32_t>(lo, 0x80); c <= hi; ++c) {
      auto g = uni::category(c);
      if (g == uni::general_category::Lu || g == uni::general_category::Ll ||
          g == uni::general_category::Lt)
        fail("case-insensitive matching of non-ASCII letters is not supported");
    }
  }

  // After a backslash: a class escape or an escaped character, into `cc`.
  void escape_into(char_class& cc, bool ci) {
    const char e = peek();
    auto prop = [&](uni::property_mask m, bool negated) {
      ++i_;
      if (negated)
        cc.negated_props.push_back(m);
      else
        cc.props |= m;
    };
    switch (e) {
    case 's':
      return prop(uni::k_white_space_bit, false);
    case 'S':
      return prop(uni::k_white_space_bit, true);
    case 'd':
      return prop(uni::category_bit(uni::general_category::Nd), false);
    case 'D':
      return prop(uni::category_bit(uni::general_category::Nd), true);
    case 'w':
      return prop(onig_word(), false);
    case 'W':
      return prop(onig_word(), true);
    case 'h':
    case 'H': { // Oniguruma: a hexadecimal digit
      ++i_;
      char_class hex;
      for (auto [lo, hi] : {std::pair{U'0', U'9'}, {U'a', U'f'}, {U'A', U'F'}})
        hex.ranges.push_back({lo, hi});
      if (e == 'h') {
        cc.ranges.insert(cc.ranges.end(), hex.ranges.begin(), hex.ranges.end());
      } else {
        fail("\\H is not supported");
      }
      return;
    }
    case 'p':
    case 'P': {
      ++i_;
      if (at_end() || peek() != '{')
        fail("\\p needs a {Name}");
      const std::size_t close = p_.find('}', i_);
      if (close == std::string_view::npos)
        fail("\\p{ without '}'");
      std::string_view name = p_.substr(i_ + 1, close - i_ - 1);
      bool negated = e == 'P';
      if (!name.empty() && name.front() == '^') {
        negated = !negated;
        name.remove_prefix(1);
      }
      const uni::property_mask m = property(name);
      i_ = close + 1;
      if (negated)
        cc.negated_props.push_back(m);
      else
        cc.props |= m;
      return;
    }
    default:
      break;
    }
    add_char(cc, escaped_char(), ci);
  }

  // An escape that stands for one character (the backslash already read).
  char32_t escaped_char() {
    const char e = peek();
    switch (e) {
    case 't':
      ++i_;
      return U'\t';
    case 'n':
      ++i_;
      return U'\n';
    case 'r':
      ++i_;
      return U'\r';
    case 'f':
      ++i_;
      return U'\f';
    case 'v':
      ++i_;
      return U'\v';
    case 'a':
      ++i_;
      return 0x07;
    case 'e':
      ++i_;
      return 0x1B;
    case 'x':
      ++i_;
      if (!at_end() && peek() == '{')
        return hex_digits(1, 8, '}');
      return hex_digits(1, 2, 0);
    case 'u':
      ++i_;
      return hex_digits(4, 4, 0);
    default:
      break;
    }
    const auto b = static_cast<unsigned char>(e);
    if (b < 0x80 && (std::isalnum(b) != 0))
      fail(fmt::format("the escape \\{} is not supported", e));
    return next_char(); // an escaped punctuation or non-ASCII character stands for itself
  }

  char32_t hex_digits(std::size_t min_digits, std::size_t max_digits, char close) {
    if (close)
      ++i_; // '{'
    uint32_t v = 0;
    std::size_t n = 0;
    while (!at_end() && n < max_digits && std::isxdigit(static_cast<unsigned char>(peek()))) {
      const char h = peek();
      v = v * 16 + uint32_t(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
      ++i_, ++n;
    }
    if (n < min_digits)
      fail("a hexadecimal escape without digits");
    if (close) {
      if (at_end() || peek() != close)
        fail("\\x{ without '}'");
      ++i_;
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
      fail(fmt::format("\\x{{{:X}}} is not a Unicode scalar value", v));
    return v;
  }

  static uni::property_mask onig_word() {
    using g = uni::general_category;
    uni::property_mask m = uni::k_onig_word_extra_bit;
    for (g c : {g::Lu, g::Ll, g::Lt, g::Lm, g::Lo, g::Mn, g::Mc, g::Me, g::Nd, g::Nl, g::Pc})
      m |= uni::category_bit(c);
    return m;
  }

  // General categories by short or long name, as Oniguruma accepts them (case, spaces,
  // underscores and hyphens ignored).
  uni::property_mask property(std::string_view raw) {
    std::string name;
    for (char c : raw)
      if (c != ' ' && c != '_' && c != '-')
        name += char(std::tolower(static_cast<unsigned char>(c)));
    using g = uni::general_category;
    struct entry {
      const char* short_name;
      const char* long_name;
      std::initializer_list<g> cats;
    };
    static const entry table[] = {
      {"l", "letter", {g::Lu, g::Ll, g::Lt, g::Lm, g::Lo}},
      {"lc", "casedletter", {g::Lu, g::Ll, g::Lt}},
      {"lu", "uppercaseletter", {g::Lu}},
      {"ll", "lowercaseletter", {g::Ll}},
      {"lt", "titlecaseletter", {g::Lt}},
      {"lm", "modifierletter", {g::Lm}},
      {"lo", "otherletter", {g::Lo}},
      {"m", "mark", {g::Mn, g::Mc, g::Me}},
      {"mn", "nonspacingmark", {g::Mn}},
      {"mc", "spacingmark", {g::Mc}},
      {"me", "enclosingmark", {g::Me}},
      {"n", "number", {g::Nd, g::Nl, g::No}},
      {"nd", "decimalnumber", {g::Nd}},
      {"nl", "letternumber", {g::Nl}},
      {"no", "othernumber", {g::No}},
      {"p", "punctuation", {g::Pc, g::Pd, g::Ps, g::Pe, g::Pi, g::Pf, g::Po}},
      {"pc", "connectorpunctuation", {g::Pc}},
      {"pd", "dashpunctuation", {g::Pd}},
      {"ps", "openpunctuation", {g::Ps}},
      {"pe", "closepunctuation", {g::Pe}},
      {"pi", "initialpunctuation", {g::Pi}},
      {"pf", "finalpunctuation", {g::Pf}},
      {"po", "otherpunctuation", {g::Po}},
      {"s", "symbol", {g::Sm, g::Sc, g::Sk, g::So}},
      {"sm", "mathsymbol", {g::Sm}},
      {"sc", "currencysymbol", {g::Sc}},
      {"sk", "modifiersymbol", {g::Sk}},
      {"so", "othersymbol", {g::So}},
      {"z", "separator", {g::Zs, g::Zl, g::Zp}},
      {"zs", "spaceseparator", {g::Zs}},
      {"zl", "lineseparator", {g::Zl}},
      {"zp", "paragraphseparator", {g::Zp}},
      {"c", "other", {g::Cc, g::Cf, g::Cs, g::Co, g::Cn}},
      {"cc", "control", {g::Cc}},
      {"cf", "format", {g::Cf}},
      {"cs", "surrogate", {g::Cs}},
      {"co", "privateuse", {g::Co}},
      {"cn", "unassigned", {g::Cn}},
    };
    for (const entry& e : table) {
      if (name == e.short_name || name == e.long_name) {
        uni::property_mask m = 0;
        for (g c : e.cats)
          m |= uni::category_bit(c);
        return m;
      }
    }
    if (name == "whitespace")
      return uni::k_white_space_bit;
    fail(fmt::format("the property \\p{{{}}} is not supported (general categories and "
                     "White_Space are)",
                     raw));
  }

  // After '[': the class up to its ']'.
  char_class bracket(bool ci) {
    char_class cc;
    if (!at_end() && peek() == '^') {
      cc.negated = true;
      ++i_;
    }
    bool first = true;
    while (true) {
      if (at_end())
        fail("missing ']'");
      const char c = peek();
      if (c == ']' && !first) {
        ++i_;
        break;
      }
      first = false;
      if (c == '[')
        fail("nested classes and POSIX brackets are not supported inside [...]");
      if (c == '&' && i_ + 1 < p_.size() && p_[i_ + 1] == '&')
        fail("class intersection (&&) is not supported");
      char32_t lo;
      if (c == '\\') {
        ++i_;
        if (at_end())
          fail("missing ']'");
        const char e = peek();
        if (e == 's' || e == 'S' || e == 'd' || e == 'D' || e == 'w' || e == 'W' || e == 'p' ||
            e == 'P' || e == 'h' || e == 'H') {
          escape_into(cc, ci);
          continue;
        }
        lo = escaped_char();
      } else {
        lo = next_char();
      }
      // A range lo-hi, unless the '-' is last in the class.
      if (i_ + 1 < p_.size() && peek() == '-' && p_[i_ + 1] != ']') {
        ++i_;
        char32_t hi;
        if (peek() == '\\') {
          ++i_;
          if (at_end())
            fail("missing ']'");
          hi = escaped_char();
        } else {
          hi = next_char();
        }
        if (hi < lo)
          fail("a class range out of order");
        cc.ranges.push_back({lo, hi});
        if (ci)
          add_case_variants(cc, lo, hi);
      } else {
        add_char(cc, lo, ci);
      }
    }
    return cc;
  }

  std::string_view p_;
  std::size_t i_ = 0;
  int depth_ = 0;
  std::vector<char_class>& classes_;
};

// ---- code generation --------------------------------------------------------------------------

class emitter {
public:
  explicit emitter(std::vector<inst>& prog) : prog_(prog) {}

  void emit(const node& n) {
    if (prog_.size() > k_max_program)
      throw parse_error{"the pattern compiles to too large a program"};
    switch (n.kind) {
    case node::klass:
      push({op::klass, 0, n.cls});
      return;
    case node::seq:
      for (const node& k : n.kids)
        emit(k);
      return;
    case node::alt: {
      std::vector<std::size_t> to_end;
      for (std::size_t i = 0; i < n.kids.size(); ++i) {
        if (i + 1 == n.kids.size()) {
          emit(n.kids[i]);
          break;
        }
        const std::size_t split = push({op::split});
        prog_[split].a = int32_t(prog_.size());
        emit(n.kids[i]);
        to_end.push_back(push({op::jump}));
        prog_[split].b = int32_t(prog_.size());
      }
      for (std::size_t j : to_end)
        prog_[j].a = int32_t(prog_.size());
      return;
    }
    case node::repeat:
      return emit_repeat(n);
    case node::look: {
      const std::size_t look = push({op::lookahead, uint8_t(n.negative)});
      emit(n.kids.front());
      push({op::match});
      prog_[look].a = int32_t(prog_.size());
      return;
    }
    case node::assert_pos:
      push({op::assert_pos, uint8_t(n.where)});
      return;
    }
  }

private:
  std::size_t push(inst i) {
    prog_.push_back(i);
    return prog_.size() - 1;
  }

  void emit_repeat(const node& n) {
    const node& body = n.kids.front();
    if (body.kind == node::klass) {
      inst r{op::repeat, uint8_t(n.greedy), body.cls};
      r.min = n.min, r.max = n.max;
      push(r);
      return;
    }
    for (uint32_t i = 0; i < n.min; ++i)
      emit(body);
    if (n.max == k_unbounded) {
      const std::size_t loop = push({op::split});
      const std::size_t first = prog_.size();
      emit(body);
      push({op::jump, 0, int32_t(loop)});
      set_choice(loop, first, prog_.size(), n.greedy);
      return;
    }
    std::vector<std::size_t> splits;
    for (uint32_t i = n.min; i < n.max; ++i) {
      splits.push_back(push({op::split}));
      emit(body);
    }
    for (std::size_t k = 0; k < splits.size(); ++k)
      set_choice(splits[k], splits[k] + 1, prog_.size(), n.greedy);
  }

  // A split that prefers `take` (greedy) or `skip` (lazy).
  void set_choice(std::size_t split, std::size_t take, std::size_t skip, bool greedy) {
    prog_[split].a = int32_t(greedy ? take : skip);
    prog_[split].b = int32_t(greedy ? skip : take);
  }

  std::vector<inst>& prog_;
};

// ---- matching ---------------------------------------------------------------------------------

struct frame {
  int32_t pc;
  uint32_t pos;
  // For a backtracking repeat: the class, how far it may give back to (greedy) or how many
  // more characters it may take (lazy). kind 0: a plain choice point.
  int32_t cls = -1;
  uint32_t limit = 0;
  uint8_t kind = 0; // 0 choice, 1 greedy repeat give-back, 2 lazy repeat take-more
};

std::size_t prev_char(std::string_view s, std::size_t i) {
  do
    --i;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80);
  return i;
}

} // namespace

struct regex::code {
  std::vector<char_class> classes;
  std::vector<inst> prog;

  bool class_at(int32_t cls, std::string_view s, std::size_t& pos) const {
    if (pos >= s.size())
      return false;
    std::size_t j = pos;
    const char32_t c = utf8_decode(s, j);
    if (!classes[std::size_t(cls)].contains(c))
      return false;
    pos = j;
    return true;
  }

  bool assertion_holds(assertion a, std::string_view s, std::size_t pos) const {
    switch (a) {
    case assertion::line_begin:
      return pos == 0 || s[pos - 1] == '\n';
    case assertion::line_end:
      return pos == s.size() || s[pos] == '\n';
    case assertion::text_begin:
      return pos == 0;
    case assertion::text_end:
      return pos == s.size();
    case assertion::text_end_newline:
      return pos == s.size() || (pos + 1 == s.size() && s[pos] == '\n');
    }
    return false;
  }

  // Runs from `pc` at `pos` to the first match instruction reached in priority order; the end
  // position, or npos. `stack` is shared with nested lookaheads, above `base`.
  // `budget` counts down one per backtrack; at zero the run fails (see k_step_budget).
  std::size_t run(int32_t pc, std::size_t pos, std::string_view s, std::vector<frame>& stack,
                  uint64_t& budget) const {
    const std::size_t base = stack.size();
    while (true) {
      bool ok = true;
      const inst& in = prog[std::size_t(pc)];
      switch (in.code) {
      case op::klass:
        ok = class_at(in.a, s, pos);
        ++pc;
        break;
      case op::repeat: {
        uint32_t n = 0;
        while (n < in.min && class_at(in.a, s, pos))
          ++n;
        if (n < in.min) {
          ok = false;
          break;
        }
        if (in.flag) { // greedy: take all, give back one at a time down to `min`
          const std::size_t floor = pos;
          while (n < in.max && class_at(in.a, s, pos))
            ++n;
          if (pos > floor)
            stack.push_back({pc + 1, uint32_t(pos), -1, uint32_t(floor), 1});
        } else if (in.max > n) { // lazy: take `min`, more only on backtracking
          stack.push_back({pc + 1, uint32_t(pos), in.a, in.max == k_unbounded ? k_unbounded
                                                                              : in.max - n, 2});
        }
        ++pc;
        break;
      }
      case op::split:
        stack.push_back({in.b, uint32_t(pos)});
        pc = in.a;
        break;
      case op::jump:
        pc = in.a;
        break;
      case op::lookahead: {
        const bool found = run(pc + 1, pos, s, stack, budget) != std::string_view::npos;
        ok = found != bool(in.flag);
        pc = in.a;
        break;
      }
      case op::assert_pos:
        ok = assertion_holds(assertion(in.flag), s, pos);
        ++pc;
        break;
      case op::match:
        stack.resize(base);
        return pos;
      }
      if (ok)
        continue;
      // Backtrack to the newest choice point of this run.
      while (true) {
        if (stack.size() == base)
          return std::string_view::npos;
        if (budget == 0) {
          stack.resize(base);
          return std::string_view::npos;
        }
        --budget;
        frame& f = stack.back();
        if (f.kind == 0) {
          pc = f.pc, pos = f.pos;
          stack.pop_back();
          break;
        }
        if (f.kind == 1) { // give back one character
          const std::size_t p = prev_char(s, f.pos);
          pc = f.pc, pos = p;
          if (p > f.limit)
            f.pos = uint32_t(p);
          else
            stack.pop_back();
          break;
        }
        // kind 2: take one more character
        std::size_t p = f.pos;
        if (f.limit == 0 || !class_at(f.cls, s, p)) {
          stack.pop_back();
          continue;
        }
        pc = f.pc, pos = p;
        f.pos = uint32_t(p);
        if (f.limit != k_unbounded)
          --f.limit;
        break;
      }
    }
  }
};

expected<regex> regex::compile(std::string_view pattern, bool literal) {
  if (!utf8_is_valid(pattern))
    return fail("the pattern is not valid UTF-8");
  auto c = std::make_shared<code>();
  try {
    node root{node::seq};
    if (literal) {
      std::size_t i = 0;
      while (i < pattern.size()) {
        char_class cc;
        const char32_t ch = utf8_decode(pattern, i);
        cc.ranges.push_back({ch, ch});
        cc.finish();
        c->classes.push_back(std::move(cc));
        node k{node::klass};
        k.cls = int(c->classes.size() - 1);
        root.kids.push_back(std::move(k));
      }
    } else {
      root = parser(pattern, c->classes).parse();
    }
    emitter(c->prog).emit(root);
    c->prog.push_back({op::match});
  } catch (const parse_error& e) {
    return fail(fmt::format("the pattern is not supported: {}", e.message));
  }
  if (pattern.size() >= std::numeric_limits<uint32_t>::max())
    return fail("the pattern is too long");
  regex r;
  r.code_ = std::move(c);
  return r;
}

// Iterates like onig's find_iter (what `tokenizers` uses): at each start the leftmost-first
// match; after an empty match the next search starts at the same place, and an empty match right
// at the previous match's end is skipped by one character.
std::vector<std::pair<std::size_t, std::size_t>> regex::find_all(std::string_view text) const {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  if (text.size() >= std::numeric_limits<uint32_t>::max())
    return out; // positions are 32-bit; the tokenizer never hands a piece this large
  thread_local std::vector<frame> stack;
  uint64_t budget = k_step_budget;
  std::size_t pos = 0;
  std::optional<std::size_t> last_end;
  while (pos <= text.size()) {
    // Leftmost start at or after pos.
    std::size_t b = pos, e = std::string_view::npos;
    while (true) {
      stack.clear();
      budget = k_step_budget;
      e = code_->run(0, b, text, stack, budget);
      if (e != std::string_view::npos || b >= text.size() || budget == 0)
        break;
      b += bpe_internal::utf8_char_len(text, b);
    }
    if (e == std::string_view::npos)
      break;
    if (b == e && last_end && *last_end == e) {
      if (e >= text.size())
        break;
      pos = e + bpe_internal::utf8_char_len(text, e);
      continue;
    }
    out.emplace_back(b, e);
    last_end = e;
    pos = e;
  }
  return out;
}

} // namespace rlserve::model::bpe_detail
