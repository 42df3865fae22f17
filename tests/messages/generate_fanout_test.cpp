// messages/generate_fanout: SGLang's batch and parallel-sampling /generate bodies expanded into
// single requests — order, rids, seeds, per-prompt fields, and the refusals that name the field.
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <string>

#include "messages/generate_fanout.hpp"

using nlohmann::json;
using rlserve::expand_generate_request;

namespace {

std::string error_of(const json& body) {
  auto r = expand_generate_request(body);
  return r.has_value() ? std::string() : r.error();
}

} // namespace

BOOST_AUTO_TEST_SUITE(generate_fanout_test)

BOOST_AUTO_TEST_CASE(a_single_request_is_left_alone) {
  auto r = expand_generate_request(json::parse(R"({"input_ids": [1, 2], "sampling_params": {"n": 1}})"));
  BOOST_REQUIRE(r.has_value());
  BOOST_TEST(r->single);
  BOOST_TEST(r->requests.empty());
}

BOOST_AUTO_TEST_CASE(samples_are_prompt_major_with_rids_and_seeds) {
  auto r = expand_generate_request(json::parse(R"({
    "text": ["a", "b"], "rid": "g", "return_logprob": true,
    "sampling_params": {"n": 3, "sampling_seed": 10, "temperature": 0.5}})"));
  BOOST_REQUIRE(r.has_value());
  BOOST_TEST(!r->single);
  BOOST_REQUIRE(r->requests.size() == 6u);
  for (std::size_t j = 0; j < 6; ++j) {
    const auto& q = r->requests[j];
    BOOST_TEST(q["text"] == (j < 3 ? "a" : "b"));
    BOOST_TEST(q["rid"] == "g_" + std::to_string(j));
    BOOST_TEST(q["sampling_params"]["sampling_seed"] == 10 + j % 3);
    BOOST_TEST(!q["sampling_params"].contains("n"));
    BOOST_TEST(q["sampling_params"]["temperature"] == 0.5);
    BOOST_TEST(q["return_logprob"] == true);
  }
}

// OpenAI's n (net/openai_call_actor.cpp) names and seeds its choices through the same two
// functions; the JSON fan-out must agree with them, seeds wrapping as uint64.
BOOST_AUTO_TEST_CASE(samples_are_named_and_seeded_by_the_shared_rule) {
  BOOST_TEST(rlserve::fanout_rid("g", 2) == "g_2");
  BOOST_TEST(rlserve::sample_seed(10, 3) == 13u);
  BOOST_TEST(rlserve::sample_seed(UINT64_MAX, 1) == 0u);
  auto r = expand_generate_request(json::parse(R"({
    "input_ids": [1], "rid": "g", "sampling_params": {"n": 2, "sampling_seed": 18446744073709551615}})"));
  BOOST_REQUIRE(r.has_value());
  BOOST_REQUIRE(r->requests.size() == 2u);
  for (std::size_t s = 0; s < 2; ++s) {
    BOOST_TEST(r->requests[s]["rid"] == rlserve::fanout_rid("g", s));
    BOOST_TEST(r->requests[s]["sampling_params"]["sampling_seed"] == rlserve::sample_seed(UINT64_MAX, s));
  }
  // A seed that is not one is left for the reader to refuse.
  auto neg = expand_generate_request(json::parse(R"({
    "input_ids": [1], "sampling_params": {"n": 2, "sampling_seed": -1}})"));
  BOOST_REQUIRE(neg.has_value());
  BOOST_TEST(neg->requests[1]["sampling_params"]["sampling_seed"] == -1);
}

BOOST_AUTO_TEST_CASE(per_prompt_lists_and_rid_lists) {
  auto r = expand_generate_request(json::parse(R"({
    "input_ids": [[1, 2], [3]], "rid": ["p", "q"], "logprob_start_len": [0, -1],
    "sampling_params": [{"max_new_tokens": 4}, {"max_new_tokens": 5}]})"));
  BOOST_REQUIRE(r.has_value());
  BOOST_REQUIRE(r->requests.size() == 2u);
  BOOST_TEST(r->requests[0]["input_ids"] == json::parse("[1, 2]"));
  BOOST_TEST(r->requests[1]["rid"] == "q");
  BOOST_TEST(r->requests[1]["logprob_start_len"] == -1);
  BOOST_TEST(r->requests[1]["sampling_params"]["max_new_tokens"] == 5);
  // n > 1 with a rid list: "{rid_b}_{s}".
  auto n2 = expand_generate_request(json::parse(R"({
    "input_ids": [[1], [2]], "rid": ["p", "q"], "sampling_params": {"n": 2}})"));
  BOOST_REQUIRE(n2.has_value());
  BOOST_TEST(n2->requests[3]["rid"] == "q_1");
  BOOST_TEST(n2->requests[3]["input_ids"] == json::parse("[2]"));
  // Without a rid the engine picks each; without a seed too.
  auto bare = expand_generate_request(json::parse(R"({"input_ids": [5], "sampling_params": {"n": 2}})"));
  BOOST_REQUIRE(bare.has_value());
  BOOST_TEST(!bare->requests[1].contains("rid"));
  BOOST_TEST(!bare->requests[1]["sampling_params"].contains("sampling_seed"));
}

BOOST_AUTO_TEST_CASE(bad_bodies_name_the_field) {
  BOOST_TEST(error_of(json::parse(R"({"input_ids": [1], "sampling_params": {"n": 0}})"))
               .find("sampling_params.n: 0") == 0u);
  BOOST_TEST(error_of(json::parse(R"({"input_ids": [1], "sampling_params": {"n": "2"}})"))
               .find("sampling_params.n") == 0u);
  BOOST_TEST(error_of(json::parse(R"({"text": []})")).find("text: an empty list") == 0u);
  BOOST_TEST(error_of(json::parse(R"({"text": ["a", "b"], "rid": ["x"]})")).find("rid: 1 entries for 2") == 0u);
  BOOST_TEST(error_of(json::parse(R"({"text": ["a", "b"], "rid": ["x", "x"]})")).find("rid: \"x\"") == 0u);
  BOOST_TEST(error_of(json::parse(R"({"text": ["a", "b"], "rid": ["x", 3]})")).find("rid[1]") == 0u);
  BOOST_TEST(error_of(json::parse(R"({"text": "a", "rid": ["x"], "sampling_params": {"n": 2}})"))
               .find("rid: a list is for a batch") == 0u);
  BOOST_TEST(error_of(json::parse(R"({"text": ["a", "b"], "sampling_params": [{"n": 2}, {}]})"))
               .find("sampling_params[1].n: 1 differs") == 0u);
  BOOST_TEST(error_of(json::parse(R"({"text": ["a", "b"], "top_logprobs_num": [1, 2],
                                      "sampling_params": {"n": 2}})"))
               .find("top_logprobs_num: a list cannot be combined") == 0u);
  BOOST_TEST(error_of(json::parse(R"({"text": ["a"], "sampling_params": {"n": 5000}})")).find("at most") !=
             std::string::npos);
  BOOST_TEST(error_of(json::parse("[1, 2]")).find("not a JSON object") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
