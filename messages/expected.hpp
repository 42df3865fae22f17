// expected<T>: a value or a sentence saying what went wrong — rlserve's error-as-value type for
// code outside actor handlers (files, codecs, model loading, kernels' host wrappers).
// Actor replies carry `success` + `message` fields instead (see messages/*.hpp).
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace rlserve {

// What went wrong, in words a user can act on ("model.safetensors: tensor 'x' ends at byte 90
// but the data section has 64 bytes"). Never empty.
struct failure {
  std::string message;
};

inline failure fail(std::string message) { return failure{std::move(message)}; }

template <class T>
class [[nodiscard]] expected {
public:
  expected(T value) : state_(std::in_place_index<0>, std::move(value)) {}
  expected(failure error) : state_(std::in_place_index<1>, std::move(error)) {}

  bool has_value() const noexcept { return state_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }

  T& value() & { return std::get<0>(state_); }
  const T& value() const& { return std::get<0>(state_); }
  T&& value() && { return std::get<0>(std::move(state_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  // The failure's sentence; empty when there is a value (so test macros that always evaluate
  // their message, like BOOST_REQUIRE_MESSAGE(x, x.error()), stay safe).
  const std::string& error() const {
    static const std::string none;
    return has_value() ? none : std::get<1>(state_).message;
  }
  failure take_failure() && { return std::get<1>(std::move(state_)); }

private:
  std::variant<T, failure> state_;
};

template <>
class [[nodiscard]] expected<void> {
public:
  expected() = default;
  expected(failure error) : error_(std::move(error.message)), ok_(false) {}

  bool has_value() const noexcept { return ok_; }
  explicit operator bool() const noexcept { return ok_; }
  const std::string& error() const { return error_; }
  failure take_failure() && { return failure{std::move(error_)}; }

private:
  std::string error_;
  bool ok_ = true;
};

using status = expected<void>;

} // namespace rlserve
