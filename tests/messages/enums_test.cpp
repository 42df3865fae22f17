// messages/enums.hpp: names both ways for every value, the choice lists error messages quote,
// and deep_to_string printing names (through argument-dependent lookup of to_string).
#include <boost/test/unit_test.hpp>

#include <string>

#include "caf/deep_to_string.hpp"
#include "messages/all.hpp"
#include "messages/enums.hpp"

using namespace rlserve;

namespace {

template <class Enum>
void check_names(std::initializer_list<std::pair<Enum, const char*>> table) {
  for (auto [value, name] : table) {
    BOOST_TEST(to_string(value) == name);
    BOOST_TEST((from_string<Enum>(name) == value));
    BOOST_TEST(std::string(enum_choices<Enum>()).find(std::string("\"") + name + "\"") !=
               std::string::npos);
  }
  // One past the last value (only a corrupt message can carry it) prints, and never parses.
  auto bad = static_cast<Enum>(table.size() + 1);
  BOOST_TEST(to_string(bad) == "<invalid " + std::to_string(table.size() + 1) + ">");
  BOOST_TEST(!from_string<Enum>(to_string(bad)).has_value());
  BOOST_TEST(!from_string<Enum>("").has_value());
}

} // namespace

BOOST_AUTO_TEST_SUITE(enums_test)

BOOST_AUTO_TEST_CASE(every_value_has_one_name) {
  check_names<runner_selector>({{runner_selector::all, "all"},
                                {runner_selector::target, "target"},
                                {runner_selector::draft, "draft"}});
  check_names<pause_mode>({{pause_mode::abort, "abort"},
                           {pause_mode::retract, "retract"},
                           {pause_mode::in_place, "in_place"},
                           {pause_mode::drain, "drain"}});
  check_names<check_weights_action>({{check_weights_action::checksum, "checksum"},
                                     {check_weights_action::snapshot, "snapshot"},
                                     {check_weights_action::compare, "compare"},
                                     {check_weights_action::reset_tensors, "reset_tensors"}});
  BOOST_TEST(!from_string<runner_selector>("Target").has_value()); // case-sensitive, as SGLang
  BOOST_TEST(!from_string<pause_mode>("in-place").has_value());
}

BOOST_AUTO_TEST_CASE(choice_lists_read_as_sentences) {
  BOOST_TEST(enum_choices<runner_selector>() == R"("target", "draft" or "all")");
  BOOST_TEST(enum_choices<pause_mode>() == R"("abort", "retract", "in_place" or "drain")");
  BOOST_TEST(enum_choices<check_weights_action>() ==
             R"("checksum", "snapshot", "compare" or "reset_tensors")");
}

BOOST_AUTO_TEST_CASE(deep_to_string_prints_names) {
  BOOST_TEST(caf::deep_to_string(PauseGenerationReqInput{pause_mode::in_place}) ==
             "PauseGenerationReqInput(in_place)");
  BOOST_TEST(caf::deep_to_string(BeginWeightUpdateReqInput{runner_selector::draft}) ==
             "BeginWeightUpdateReqInput(draft, 0)");
  CheckWeightsReqInput check;
  check.action = check_weights_action::reset_tensors;
  BOOST_TEST(caf::deep_to_string(check).find("reset_tensors") != std::string::npos,
             caf::deep_to_string(check));
}

BOOST_AUTO_TEST_SUITE_END()
