#include "messages/enums.hpp"

#include <array>

#include "messages/control.hpp"
#include "messages/weight_update.hpp"

namespace rlserve {

namespace {

std::string invalid(uint8_t raw) {
  return "<invalid " + std::to_string(raw) + ">";
}

// Every value of each enum, in the order error messages list them. A value added to an enum
// must be added here too: to_string below fails the build (-Werror=switch) until it is named,
// and enums_test checks that from_string(to_string(v)) == v for every entry of these arrays.
constexpr std::array k_selectors{runner_selector::target, runner_selector::draft,
                                 runner_selector::all};
constexpr std::array k_pause_modes{pause_mode::abort, pause_mode::retract, pause_mode::in_place,
                                   pause_mode::drain};
constexpr std::array k_actions{check_weights_action::checksum, check_weights_action::snapshot,
                               check_weights_action::compare,
                               check_weights_action::reset_tensors};

template <class Enum, std::size_t N>
std::optional<Enum> lookup(const std::array<Enum, N>& values, std::string_view name) {
  for (auto v : values)
    if (to_string(v) == name)
      return v;
  return std::nullopt;
}

} // namespace

std::string to_string(runner_selector x) {
  switch (x) {
    case runner_selector::all: return "all";
    case runner_selector::target: return "target";
    case runner_selector::draft: return "draft";
  }
  return invalid(static_cast<uint8_t>(x));
}

std::string to_string(pause_mode x) {
  switch (x) {
    case pause_mode::abort: return "abort";
    case pause_mode::retract: return "retract";
    case pause_mode::in_place: return "in_place";
    case pause_mode::drain: return "drain";
  }
  return invalid(static_cast<uint8_t>(x));
}

std::string to_string(check_weights_action x) {
  switch (x) {
    case check_weights_action::checksum: return "checksum";
    case check_weights_action::snapshot: return "snapshot";
    case check_weights_action::compare: return "compare";
    case check_weights_action::reset_tensors: return "reset_tensors";
  }
  return invalid(static_cast<uint8_t>(x));
}

template <>
std::optional<runner_selector> from_string<runner_selector>(std::string_view name) {
  return lookup(k_selectors, name);
}

template <>
std::optional<pause_mode> from_string<pause_mode>(std::string_view name) {
  return lookup(k_pause_modes, name);
}

template <>
std::optional<check_weights_action> from_string<check_weights_action>(std::string_view name) {
  return lookup(k_actions, name);
}

template <>
std::string_view enum_choices<runner_selector>() {
  return R"("target", "draft" or "all")";
}

template <>
std::string_view enum_choices<pause_mode>() {
  return R"("abort", "retract", "in_place" or "drain")";
}

template <>
std::string_view enum_choices<check_weights_action>() {
  return R"("checksum", "snapshot", "compare" or "reset_tensors")";
}

} // namespace rlserve
