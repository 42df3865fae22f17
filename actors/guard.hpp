// Exceptions never leave an actor's behaviour. Code an actor calls may throw (nlohmann on a
// client's JSON, std::bad_alloc on a huge request, a bug); an exception that leaves a handler
// kills the actor, and CAF 0.17 then answers nobody who waits on its promises: an HTTP client
// waits forever, a websocket stops answering, a session it had opened stays open. Handlers that
// call such code run it through `guarded`, which turns the exception into a sentence for the
// caller's error reply.
#pragma once

#include <exception>
#include <new>
#include <string>
#include <utility>

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

} // namespace rlserve
