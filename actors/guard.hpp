// Exceptions never leave an actor's behaviour. Code an actor calls may throw (nlohmann on a
// client's JSON, std::bad_alloc on a huge request, a bug); an exception that leaves a handler
// kills the actor, and CAF 0.17 then answers nobody who waits on its promises: an HTTP client
// waits forever, a websocket stops answering, a session it had opened stays open.
//
// Two tools, one rule:
// - `guarded_behavior<behavior_type>(name, handler...)` builds an actor's behaviour with every
//   handler wrapped: an exception becomes the handler's error reply (success = false and a
//   message for replies that have them, a CAF error otherwise; logged for handlers without a
//   reply), and the actor lives on. Every actor of actors/ builds its behaviour this way.
// - `guarded(body, on_error)` does the same for a block of code whose error answer is not a
//   reply (a frame handler of a connection, the start of an HTTP call).
// Response handlers are guarded where they are set: pending_requests (actors/watch.hpp) turns an
// exception in a reply handler into its error handler's call, and the front door's own requests
// are wrapped with `guarded`. What escapes anyway (a down handler) still ends the actor; the
// actors that wait on it watch it and answer their own callers, and the network front's actors
// answer or disconnect their clients as they end (net/http_call_actor.hpp,
// net/ws_connection_actor.cpp).
#pragma once

#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <type_traits>
#include <utility>

#include "caf/delegated.hpp"
#include "caf/error.hpp"
#include "caf/make_message.hpp"
#include "caf/result.hpp"
#include "caf/sec.hpp"
#include "messages/generate.hpp"

namespace rlserve {

// "out of memory" / the exception's what() / "an unknown exception".
inline std::string exception_text(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::bad_alloc&) {
    return "out of memory";
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an unknown exception";
  }
}

// Runs `body`; if it throws, runs `on_error(sentence)` instead of letting the exception out.
// `on_error` must not throw itself (it answers with an error, nothing more).
template <class Body, class OnError>
void guarded(Body&& body, OnError&& on_error) noexcept {
  try {
    std::forward<Body>(body)();
  } catch (...) {
    auto text = exception_text(std::current_exception());
    try {
      std::forward<OnError>(on_error)(text);
    } catch (...) {
      // Nothing left to tell anyone; the actor lives on.
    }
  }
}

namespace guard_detail {

// The reply type a handler returning R promises: Out for Out, result<Out> and delegated<Out>.
template <class R>
struct reply_of {
  using type = R;
};
template <class T>
struct reply_of<caf::result<T>> {
  using type = T;
};
template <class T>
struct reply_of<caf::delegated<T>> {
  using type = T;
};

// The error reply of a handler that threw `text`.
template <class Out>
caf::result<Out> failure(const char* actor, const std::string& text) {
  auto message = std::string("the ") + actor + " failed handling this request: " + text;
  if constexpr (requires(Out o) {
                  o.success = false;
                  o.message = message;
                }) {
    Out out{};
    out.success = false;
    out.message = message;
    if constexpr (std::is_same_v<Out, GenerateReqOutput>) {
      out.finished = true;
      out.finish_reason = FinishReason{"abort", std::nullopt, std::nullopt, message};
    }
    return out;
  } else {
    return caf::make_error(caf::sec::runtime_error, std::move(message));
  }
}

template <class F>
struct signature : signature<decltype(&F::operator())> {};
template <class C, class R, class... Ts>
struct signature<R (C::*)(Ts...) const> {
  using result = R;
  template <class Fn>
  static auto wrap(const char* actor, Fn f) {
    using Out = typename reply_of<R>::type;
    if constexpr (std::is_void_v<R>) {
      return [actor, f = std::move(f)](Ts... xs) mutable {
        guarded([&] { f(std::forward<Ts>(xs)...); },
                [actor](const std::string& text) {
                  std::fprintf(stderr, "rlserve: the %s failed handling a message: %s\n", actor,
                               text.c_str());
                });
      };
    } else {
      return [actor, f = std::move(f)](Ts... xs) mutable -> caf::result<Out> {
        try {
          return f(std::forward<Ts>(xs)...);
        } catch (...) {
          // When the handler had made its response promise before it threw, CAF drops this
          // reply: whoever holds the promise answers (or the actor's watchers, if it dies).
          return failure<Out>(actor, exception_text(std::current_exception()));
        }
      };
    }
  }
};
template <class C, class R, class... Ts>
struct signature<R (C::*)(Ts...)> : signature<R (C::*)(Ts...) const> {};

} // namespace guard_detail

// `handler`, with the same message signature, turning an exception into its error reply.
template <class F>
auto guard_handler(const char* actor, F handler) {
  return guard_detail::signature<F>::wrap(actor, std::move(handler));
}

// A behaviour whose every handler is guarded (see above). `actor` names it in the error
// replies ("the scheduler failed handling this request: out of memory").
template <class Behavior, class... Fs>
Behavior guarded_behavior(const char* actor, Fs... handlers) {
  return Behavior{guard_handler(actor, std::move(handlers))...};
}

} // namespace rlserve
