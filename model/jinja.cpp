// The Jinja subset of jinja.hpp: the recursive-descent parser into the tree of
// model/jinja/tree.hpp, and the public parse / render. The lexer, values and builtins live beside
// it in model/jinja/ (model/jinja/internal.hpp says which file holds what).
#include "model/jinja.hpp"

#include <algorithm>
#include <charconv>
#include <limits>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "model/jinja/internal.hpp"
#include "model/jinja/lexer.hpp"
#include "model/jinja/tree.hpp"

namespace rlserve::model::jinja {

namespace detail {

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

} // namespace detail

using namespace detail;

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
