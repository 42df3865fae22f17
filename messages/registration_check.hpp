// A compile-time check that every message of a typed-actor interface has a CAF type ID.
// CAF 0.17.6 as Debian builds it does not check (CAF_ENABLE_TYPE_ID_CHECKS is off): a type
// missing from messages/type_ids.hpp works inside one process and fails only across processes
// or on migration to 0.18+. Put this next to each interface's behaviour:
//
//   static_assert(rlserve::interface_registered<scheduler_actor>::value,
//                 "a message of scheduler_actor is missing from messages/type_ids.hpp");
//
// It reads CAF 0.17 internals (typed_mpi, output_tuple); delete it on migration, because
// 0.18+ enforces type IDs itself.
//
// Include order matters: caf::has_type_id is decided the first time it is asked about a type,
// so this header includes the type-ID block itself, before anything can ask.
#pragma once

#include <type_traits>

#include "caf/detail/type_list.hpp"
#include "caf/replies_to.hpp"
#include "caf/type_id.hpp"
#include "messages/type_ids.hpp"

namespace rlserve {

template <class T>
inline constexpr bool has_type_id_v = caf::has_type_id<std::decay_t<T>>::value;

// Replies may be void (reacts_to<...> is replies_to<...>::with<void>).
template <class T>
inline constexpr bool has_type_id_or_void_v = std::is_void_v<T> || has_type_id_v<T>;

template <class Signature>
struct signature_registered;

template <class... Ins, class... Outs>
struct signature_registered<
  caf::typed_mpi<caf::detail::type_list<Ins...>, caf::output_tuple<Outs...>>>
  : std::bool_constant<(has_type_id_v<Ins> && ...) && (has_type_id_or_void_v<Outs> && ...)> {};

template <class Handle>
struct interface_registered;

template <class... Signatures>
struct interface_registered<caf::typed_actor<Signatures...>>
  : std::bool_constant<(signature_registered<Signatures>::value && ...)> {};

} // namespace rlserve
