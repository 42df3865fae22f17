// Names of the enums that travel in public messages: runner_selector, pause_mode,
// check_weights_action. One spelling everywhere: the JSON codecs read and write these names,
// and CAF's deep_to_string picks up to_string through argument-dependent lookup, so logs show
// "draft" rather than 3.
//
// The enums are declared opaquely here (same underlying type as their definitions) so that
// weight_update.hpp and control.hpp can include this header: then every translation unit that
// can name an enum also sees its to_string, and deep_to_string prints the same thing in all of
// them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace rlserve {

enum class runner_selector : uint8_t;      // messages/weight_update.hpp
enum class pause_mode : uint8_t;           // messages/control.hpp
enum class check_weights_action : uint8_t; // messages/weight_update.hpp

// The JSON name ("target", "in_place", "reset_tensors", ...). A value outside the enum (only a
// corrupt deserialized message can hold one) prints as "<invalid N>". Returns std::string
// because CAF's has_to_string trait wants something convertible to std::string.
std::string to_string(runner_selector x);
std::string to_string(pause_mode x);
std::string to_string(check_weights_action x);

// The value with that JSON name; nullopt for anything else (names are case-sensitive, as in
// SGLang). Usage: from_string<pause_mode>("retract").
template <class Enum>
std::optional<Enum> from_string(std::string_view name);
template <>
std::optional<runner_selector> from_string<runner_selector>(std::string_view name);
template <>
std::optional<pause_mode> from_string<pause_mode>(std::string_view name);
template <>
std::optional<check_weights_action> from_string<check_weights_action>(std::string_view name);

// Every accepted name, quoted, for error messages: "\"target\", \"draft\" or \"all\"".
template <class Enum>
std::string_view enum_choices();
template <>
std::string_view enum_choices<runner_selector>();
template <>
std::string_view enum_choices<pause_mode>();
template <>
std::string_view enum_choices<check_weights_action>();

} // namespace rlserve
