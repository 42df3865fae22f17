// Requests to actors that may die. CAF 0.17 answers a request to an actor that is already gone
// with an error, but not one the actor had taken and then died holding (its promise is simply
// dropped): the caller would wait forever. An actor that waits on another's answers therefore
// monitors it and sends its requests through `pending_requests`; when the down_msg comes, every
// request still waiting on the dead actor gets its error handler called with why.
//
// The reply handler runs guarded (actors/guard.hpp): if it throws, the error handler is called
// with why instead, so the waiting actor answers its own caller and lives on.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "caf/actor_addr.hpp"
#include "caf/actor_cast.hpp"
#include "caf/error.hpp"
#include "caf/fwd.hpp"
#include "actors/guard.hpp"

namespace rlserve {

class pending_requests {
public:
  // Sends `msg` to `dest` (which the caller monitors) and calls exactly one of
  // `on_reply(Out&)` or `on_error(const std::string& why)`.
  template <class Out, class Self, class Dest, class Msg, class OnReply, class OnError>
  void request(Self self, const Dest& dest, Msg&& msg, OnReply on_reply, OnError on_error) {
    request_of<Out>(self, dest, std::move(on_reply), std::move(on_error), std::forward<Msg>(msg));
  }

  // The same for a request of several values (`msgs`, sent as one message).
  template <class Out, class Self, class Dest, class OnReply, class OnError, class... Msgs>
  void request_of(Self self, const Dest& dest, OnReply on_reply, OnError on_error, Msgs&&... msgs) {
    auto id = next_++;
    auto error = std::make_shared<OnError>(std::move(on_error));
    waits_.emplace(id, wait{caf::actor_cast<caf::actor_addr>(dest),
                            [error](const std::string& why) { (*error)(why); }});
    self->request(dest, caf::infinite, std::forward<Msgs>(msgs)...)
      .then(
        [this, id, error, on_reply = std::move(on_reply)](Out& out) mutable {
          if (waits_.erase(id) != 0)
            guarded([&] { on_reply(out); },
                    [&](const std::string& why) { (*error)("handling the reply failed: " + why); });
        },
        [this, self, id, error](caf::error& err) {
          if (waits_.erase(id) != 0)
            (*error)(self->system().render(err));
        });
  }

  // From the owner's down handler: every request waiting on `gone` fails with `why`.
  void peer_down(const caf::actor_addr& gone, const std::string& why) {
    std::vector<std::function<void(const std::string&)>> failed;
    for (auto it = waits_.begin(); it != waits_.end();) {
      if (it->second.dest == gone) {
        failed.push_back(std::move(it->second.on_error));
        it = waits_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& f : failed) // after the loop: a handler may send new requests
      f(why);
  }

private:
  struct wait {
    caf::actor_addr dest;
    std::function<void(const std::string&)> on_error;
  };
  uint64_t next_ = 1;
  std::unordered_map<uint64_t, wait> waits_;
};

} // namespace rlserve
