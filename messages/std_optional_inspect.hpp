// CAF 0.17 can serialize caf::optional but not std::optional. These overloads live in namespace
// caf so argument-dependent lookup finds them through the inspector type (every CAF inspector
// is a caf:: class), whatever T is. Same wire format as caf::optional: a flag, then the value.
// Delete on migration to CAF 0.18+, which supports std::optional itself.
#pragma once

#include <optional>
#include <type_traits>

#include "caf/detail/scope_guard.hpp"

namespace caf {

template <class Inspector, class T>
typename std::enable_if<Inspector::reads_state, typename Inspector::result_type>::type
inspect(Inspector& f, std::optional<T>& x) {
  return x ? f(true, *x) : f(false);
}

template <class T>
struct std_optional_inspect_helper {
  bool& enabled;
  T& storage;
  template <class Inspector>
  friend typename Inspector::result_type inspect(Inspector& f, std_optional_inspect_helper& x) {
    return x.enabled ? f(x.storage) : f();
  }
};

template <class Inspector, class T>
typename std::enable_if<Inspector::writes_state, typename Inspector::result_type>::type
inspect(Inspector& f, std::optional<T>& x) {
  bool flag = false;
  T tmp{};
  std_optional_inspect_helper<T> helper{flag, tmp};
  auto guard = detail::make_scope_guard([&] {
    if (flag)
      x = std::move(tmp);
    else
      x = std::nullopt;
  });
  return f(flag, helper);
}

} // namespace caf
