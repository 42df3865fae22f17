// The Jinja syntax tree and its walker: expressions evaluate to values, nodes render into the
// output. Built by the parser (../jinja.cpp), which is the only file that includes this.
#pragma once

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "model/jinja/internal.hpp"

namespace rlserve::model::jinja::detail {

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

inline int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

inline value binary(const std::string& op, const value& a, const value& b) {
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

inline void assign_targets(scope& s, const std::vector<std::string>& targets, const value& v) {
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

} // namespace rlserve::model::jinja::detail
