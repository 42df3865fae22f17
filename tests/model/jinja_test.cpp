// The Jinja subset (model/jinja.hpp): the semantics chat templates lean on, each with the output
// jinja2 gives (tests/python/test_chat_template.py compares many more renders with jinja2 itself),
// and errors that name the line and what went wrong.
#include <boost/test/unit_test.hpp>

#include "model/jinja.hpp"

using rlserve::model::jinja::template_program;
using ojson = nlohmann::ordered_json;

namespace {

std::string render(std::string_view source, const ojson& variables = ojson::object()) {
  auto t = template_program::parse(source);
  BOOST_REQUIRE_MESSAGE(t, t.error());
  auto out = t->render(variables);
  BOOST_REQUIRE_MESSAGE(out, out.error());
  return *out;
}

std::string render_error(std::string_view source, const ojson& variables = ojson::object()) {
  auto t = template_program::parse(source);
  if (!t)
    return t.error();
  auto out = t->render(variables);
  // (the message is built whether or not the check fails)
  BOOST_REQUIRE_MESSAGE(!out, "rendered " << (out ? *out : std::string()));
  return out.error();
}

} // namespace

BOOST_AUTO_TEST_SUITE(jinja_test)

BOOST_AUTO_TEST_CASE(whitespace_follows_trim_and_lstrip_blocks) {
  // trim_blocks drops the newline after a block tag; lstrip_blocks the indentation before it.
  BOOST_TEST(render("a\n  {% if true %}\n  b\n  {% endif %}\nc") == "a\n  b\nc");
  // '-' strips every whitespace on its side; expressions keep their newline.
  BOOST_TEST(render("x  {{- ' y ' -}}  \n z{{ 1 }}\nw") == "x y z1\nw");
  // '+' keeps the indentation lstrip_blocks would drop.
  BOOST_TEST(render("  {%+ if true %}y{% endif %}") == "  y");
  BOOST_TEST(render("{# note #}\nA") == "A");
}

BOOST_AUTO_TEST_CASE(loops_scopes_and_namespaces) {
  BOOST_TEST(render("{% for x in xs %}{{ loop.index0 }}{{ x }}{{ ',' if not loop.last }}{% endfor %}",
                    {{"xs", {"a", "b"}}}) == "0a,1b");
  // A `set` inside a loop ends with its iteration; a namespace carries state across.
  BOOST_TEST(render("{% set n = 0 %}{% set ns = namespace(n=0) %}{% for i in [1, 2] %}{% set n = n + i %}"
                    "{% set ns.n = ns.n + i %}{% endfor %}{{ n }} {{ ns.n }}") == "0 3");
  BOOST_TEST(render("{% for m in ms[::-1] if m != 'b' %}{{ m }}{% else %}none{% endfor %}",
                    {{"ms", {"a", "b", "c"}}}) == "ca");
  BOOST_TEST(render("{% for i in range(9) %}{% if i is odd %}{% continue %}{% endif %}{% if i > 5 %}{% break %}"
                    "{% endif %}{{ i }}{% endfor %}") == "024");
  BOOST_TEST(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {{"d", {{"z", 1}, {"a", 2}}}}) ==
             "z=1;a=2;");
}

BOOST_AUTO_TEST_CASE(values_print_as_python_prints_them) {
  BOOST_TEST(render("{{ none }} {{ true }} {{ 1.0 }} {{ 7 / 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 1e20 }} {{ 0.1 + 0.2 }}") ==
             "None True 1.0 3.5 -4 2 1e+20 0.30000000000000004");
  BOOST_TEST(render("{{ [1, 'a', none, {'k': \"it's\"}] }}") == "[1, 'a', None, {'k': \"it's\"}]");
  BOOST_TEST(render("{{ missing }}|{{ missing is defined }}|{{ d.nope is defined }}", {{"d", ojson::object()}}) ==
             "|False|False");
}

BOOST_AUTO_TEST_CASE(strings_methods_and_filters) {
  BOOST_TEST(render("{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}",
                    {{"c", "<think>\nwhy\n</think>\n\nanswer"}}) == "why");
  BOOST_TEST(render("{{ s.startswith('<t') and s.endswith('>') }} {{ s[1:3] }} {{ 'é'|length }}", {{"s", "<tool>"}}) ==
             "True to 1");
  BOOST_TEST(render("{{ xs|length - 1 }} {{ xs|join('+') }} {{ xs|map('upper')|list }}", {{"xs", {"a", "b"}}}) ==
             "1 a+b ['A', 'B']");
  BOOST_TEST(render("{{ d|tojson }} {{ 'é\"'|tojson }}", {{"d", {{"b", {1, 2.5}}, {"a", nullptr}}}}) ==
             "{\"b\": [1, 2.5], \"a\": null} \"é\\\"\"");
  BOOST_TEST(render("{{ d|tojson(indent=2) }}", {{"d", {{"a", {1}}}}}) == "{\n  \"a\": [\n    1\n  ]\n}");
  // HF's tojson arguments: ensure_ascii first (UTF-16 escapes, surrogate pairs), then indent,
  // separators, sort_keys.
  BOOST_TEST(render("{{ 'é😀'|tojson(true) }} {{ d|tojson(separators=(',', ':'), sort_keys=true) }}",
                    {{"d", {{"b", 1}, {"a", {1, 2}}}}}) == "\"\\u00e9\\ud83d\\ude00\" {\"a\":[1,2],\"b\":1}");
  BOOST_TEST(render("{{ d|tojson(indent='\\t') }}", {{"d", {{"a", 1}}}}) == "{\n\t\"a\": 1\n}");
  BOOST_TEST(render("{{ -3|abs }} {{ x|default('d') }} {{ ''|default('e', true) }}") == "3 d e");
}

BOOST_AUTO_TEST_CASE(macros_and_block_set) {
  BOOST_TEST(render("{% macro m(a, b='!') %}<{{ a }}{{ b }}>{% endmacro %}{{ m(1) }}{{ m(2, b='?') }}") ==
             "<1!><2?>");
  BOOST_TEST(render("{% set x %}in {{ 1 + 1 }}{% endset %}[{{ x }}]") == "[in 2]");
}

BOOST_AUTO_TEST_CASE(errors_name_the_line_and_the_cause) {
  BOOST_TEST(render_error("a\n{% for x in xs %}\n{% endif %}").find("line 3: expected 'endfor'") != std::string::npos);
  BOOST_TEST(render_error("{{ x + }}").find("line 1: expected an expression") != std::string::npos);
  BOOST_TEST(render_error("{% include 'x' %}").find("unsupported statement 'include'") != std::string::npos);
  BOOST_TEST(render_error("{{ raise_exception('roles must alternate') }}").find("roles must alternate") !=
             std::string::npos);
  BOOST_TEST(render_error("{{ m.content.strip() }}", {{"m", ojson::object()}}).find("'content' is undefined") !=
             std::string::npos);
  BOOST_TEST(render_error("{{ x|nosuchfilter }}").find("unknown filter 'nosuchfilter'") != std::string::npos);
  BOOST_TEST(render_error("{{ x|tojson(indnet=2) }}").find("unexpected keyword argument 'indnet'") != std::string::npos);
  BOOST_TEST(render_error("{{ 'a' + 1 }}").find("unsupported operand types for '+': string and int") !=
             std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
