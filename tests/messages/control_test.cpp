// messages/control.cpp: the memory tags of release/resume_memory_occupation, read alike by the
// codec, the scheduler and the runners.
#include <boost/test/unit_test.hpp>

#include <string>
#include <vector>

#include "messages/control.hpp"
#include "messages/json_codec.hpp"
#include <nlohmann/json.hpp>

using namespace rlserve;
using tags = std::vector<std::string>;

BOOST_AUTO_TEST_SUITE(control_test)

BOOST_AUTO_TEST_CASE(canonical_tags_are_ordered_unique_and_all_when_none) {
  BOOST_TEST(canonical_memory_tags({}) == (tags{"weights", "kv_cache", "cuda_graph"}));
  BOOST_TEST(canonical_memory_tags({"cuda_graph", "weights", "cuda_graph"}) == (tags{"weights", "cuda_graph"}));
  BOOST_TEST(canonical_memory_tags({"kv_cache"}) == (tags{"kv_cache"}));
}

BOOST_AUTO_TEST_CASE(unknown_tags_are_found_by_index) {
  BOOST_TEST(!find_unknown_memory_tag({}).has_value());
  BOOST_TEST(!find_unknown_memory_tag({"weights", "kv_cache", "cuda_graph"}).has_value());
  BOOST_TEST(find_unknown_memory_tag({"weights", "gpu", "kv"}).value() == 1u);
  BOOST_TEST(find_unknown_memory_tag({"Weights"}).value() == 0u); // names are exact
}

BOOST_AUTO_TEST_CASE(the_codec_names_the_unknown_tag_and_its_place) {
  const auto bad = from_json<ReleaseMemoryOccupationReqInput>(nlohmann::json::parse(R"({"tags": ["weights", "gpu"]})"));
  BOOST_REQUIRE(!bad);
  BOOST_TEST(bad.error().find("tags[1]") != std::string::npos, bad.error());
  BOOST_TEST(bad.error().find("\"gpu\"") != std::string::npos, bad.error());
  const auto good = from_json<ResumeMemoryOccupationReqInput>(nlohmann::json::parse(R"({"tags": null})"));
  BOOST_REQUIRE(good);
  BOOST_TEST(good->tags.empty());
}

BOOST_AUTO_TEST_SUITE_END()
