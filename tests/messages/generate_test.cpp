// messages/generate: append_chunk folds chunks the way the front door and SGLang's cumulative
// stream need — per-token lists and text joined, prompt logprobs and routing kept once sent,
// version spans kept until they change, everything else the latest, a first chunk moved whole;
// request ids are given once.
#include <boost/test/unit_test.hpp>

#include "messages/generate.hpp"

using rlserve::append_chunk;
using rlserve::GenerateReqInput;
using rlserve::FinishReason;
using rlserve::GenerateReqOutput;
using rlserve::TopLogprob;

BOOST_AUTO_TEST_SUITE(generate_test)

BOOST_AUTO_TEST_CASE(chunks_fold_into_the_result_so_far) {
  GenerateReqOutput so_far;
  so_far.rid = "r";
  so_far.sampling_seed = 9;

  GenerateReqOutput first;
  first.rid = "r";
  first.text = "He";
  first.output_ids = {1, 2};
  first.output_token_logprobs = {-0.5f, -1.0f};
  first.output_top_logprobs = {{TopLogprob{1, -0.5f}}, {}};
  first.input_token_ids = {7, 8};
  first.input_token_logprobs = {0.0f, -2.0f};
  first.completion_tokens = 2;
  first.weight_version = "v1";
  first.weight_version_spans = {{"v1", 0}};
  first.sampling_seed = 9;
  append_chunk(so_far, first);

  GenerateReqOutput last;
  last.rid = "r";
  last.text = "llo";
  last.output_ids = {3};
  last.output_token_logprobs = {-0.25f};
  last.output_top_logprobs = {{}};
  last.completion_tokens = 3;
  last.weight_version = "v2";
  last.finished = true;
  last.finish_reason = FinishReason{"length", std::nullopt, std::nullopt, {}};
  last.routed_experts = std::vector<int32_t>{4, 5, 6};
  last.sampling_seed = 9;
  append_chunk(so_far, last);

  BOOST_TEST(so_far.text == "Hello");
  BOOST_TEST((so_far.output_ids == std::vector<int32_t>{1, 2, 3}));
  BOOST_TEST((so_far.output_token_logprobs == std::vector<float>{-0.5f, -1.0f, -0.25f}));
  BOOST_TEST(so_far.output_top_logprobs.size() == 3u);
  BOOST_TEST((so_far.input_token_ids == std::vector<int32_t>{7, 8})); // sent once, kept
  BOOST_TEST(so_far.weight_version_spans.size() == 1u);               // unchanged: kept
  BOOST_TEST(so_far.weight_version == "v2");                          // the latest
  BOOST_TEST(so_far.completion_tokens == 3);
  BOOST_TEST(so_far.finished);
  BOOST_REQUIRE(so_far.routed_experts.has_value());
  BOOST_TEST(so_far.routed_experts->size() == 3u);
  BOOST_TEST(so_far.sampling_seed == 9u);
}

// A request that does not stream gets one chunk, the scheduler's record of its output: folding
// it into the empty result moves its lists and text, it copies none of them.
BOOST_AUTO_TEST_CASE(an_only_chunk_becomes_the_result_without_a_copy) {
  GenerateReqOutput only;
  only.rid = "r";
  only.text = "a text longer than any short-string buffer holds";
  only.output_ids = {1, 2, 3};
  only.output_token_logprobs = {-0.5f, -1.0f, -0.25f};
  only.output_top_logprobs = {{TopLogprob{1, -0.5f}}, {}, {}};
  only.finished = true;
  const auto* text = only.text.data();
  const auto* ids = only.output_ids.data();
  const auto* logprobs = only.output_token_logprobs.data();
  const auto* tops = only.output_top_logprobs.data();
  GenerateReqOutput so_far;
  append_chunk(so_far, std::move(only));
  BOOST_TEST(so_far.text.data() == text);
  BOOST_TEST(so_far.output_ids.data() == ids);
  BOOST_TEST(so_far.output_token_logprobs.data() == logprobs);
  BOOST_TEST(so_far.output_top_logprobs.data() == tops);
  BOOST_TEST((so_far.output_ids == std::vector<int32_t>{1, 2, 3}));
  BOOST_TEST(so_far.finished);
}

BOOST_AUTO_TEST_CASE(a_request_without_a_rid_gets_one_and_keeps_it) {
  GenerateReqInput req;
  const std::string rid = rlserve::assign_rid(req);
  BOOST_REQUIRE(req.rid.has_value());
  BOOST_TEST(*req.rid == rid);
  BOOST_TEST(rid.size() == 32u);
  BOOST_TEST(rid.find_first_not_of("0123456789abcdef") == std::string::npos, rid);
  BOOST_TEST(rlserve::assign_rid(req) == rid); // named once
  GenerateReqInput named;
  named.rid = "mine";
  BOOST_TEST(rlserve::assign_rid(named) == "mine");
  BOOST_TEST(rlserve::random_rid() != rlserve::random_rid());
  BOOST_TEST(rlserve::rid_in_flight_message("mine") ==
             "rid: a request with rid \"mine\" is already in flight");
}

BOOST_AUTO_TEST_SUITE_END()
