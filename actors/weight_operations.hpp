// The weight-operation interface: the request/reply pairs of RLSERVE_WEIGHT_OPERATIONS
// (messages/operations.hpp, where each one's comment is) as one typed-actor type. The
// weight_updater does the work; the scheduler and the tokenizer extend this interface with
// their own messages (`extend_with<weight_operations_actor>`) and forward every operation, so a
// new weight operation reaches all three from its one line in the table.
#pragma once

#include <cstdint>
#include <utility>

#include "caf/detail/type_list.hpp"
#include "caf/replies_to.hpp"
#include "caf/typed_actor.hpp"
#include "messages/all.hpp"
#include "messages/operations.hpp"

namespace rlserve {

// The "role" column of the table: what the front door waits for before the operation may run.
enum class session_role : uint8_t {
  session_begin,  // begin_weight_update: waits for generation to drain (or a pause)
  session_update, // inside a session (or a session of its own outside one)
  session_end,    // end_weight_update: reopens generation
  standalone,     // a session of its own: a whole checkpoint, generation-1 flags
  unordered,      // takes no lock: groups, checks, reads, relabelling
};

// One weight operation as a type, for handlers written once for all of them.
template <class In, class Out, session_role Role>
struct weight_operation {
  using input = In;
  using output = Out;
  static constexpr session_role role = Role;
};

#define RLSERVE_WEIGHT_OPERATION_TYPE(route, method, In, Out, auth, role)                        \
  weight_operation<In, Out, session_role::role>
using weight_operation_list = caf::detail::type_list<RLSERVE_WEIGHT_OPERATIONS(
  RLSERVE_WEIGHT_OPERATION_TYPE, RLSERVE_OP_COMMA)>;
#undef RLSERVE_WEIGHT_OPERATION_TYPE

#define RLSERVE_WEIGHT_OPERATION_SIGNATURE(route, method, In, Out, auth, role)                   \
  caf::replies_to<In>::with<Out>
using weight_operations_actor = caf::typed_actor<RLSERVE_WEIGHT_OPERATIONS(
  RLSERVE_WEIGHT_OPERATION_SIGNATURE, RLSERVE_OP_COMMA)>;
#undef RLSERVE_WEIGHT_OPERATION_SIGNATURE

// A behaviour of `Behavior` (an interface's behavior_type) made of
// `wrap(make_handler.template operator()<Op>())` for every weight operation Op, then
// `wrap(other)` for each of `others`. The actors pass guard_handler (actors/guard.hpp) as `wrap`,
// so a weight operation that throws answers with an error like any handler:
//
//   return wrapped_with_weight_operations<scheduler_actor::behavior_type>(
//     [](auto h) { return guard_handler(scheduler_state::name, std::move(h)); },
//     [self]<class Op>() { return forward_to_updater<Op>(self); },
//     [self](step_atom) { ... }, ...);
template <class Behavior, class Wrap, class MakeHandler, class... Others>
Behavior wrapped_with_weight_operations(Wrap wrap, MakeHandler make_handler, Others... others) {
  return [&]<class... Ops>(caf::detail::type_list<Ops...>) {
    return Behavior{wrap(make_handler.template operator()<Ops>())..., wrap(std::move(others))...};
  }(weight_operation_list{});
}

} // namespace rlserve
