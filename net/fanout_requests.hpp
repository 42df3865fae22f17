// Private to net/: the sibling generate requests of one client call that fans out into several
// engine requests, shared by both call actors: SGLang's batch and n > 1 /generate
// (http_call_actor) and OpenAI's n > 1 choices (openai_call_actor). It sends them to the front
// door, keeps each one's result, aborts the siblings when one fails (their tokens would be thrown
// away) or when the client goes away, and tells its actor when the last has answered. What the
// client hears is the actor's: nothing here knows a reply shape.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "caf/fwd.hpp"
#include "messages/generate.hpp"
#include "net/shared_state.hpp"

namespace rlserve::net::detail {

// How the client's reply names one request of the fan-out: SGLang's batches say "request 2 (rid
// x)" of "the same batch", OpenAI's n says "choice 2" of "the same request".
struct fanout_names {
  std::string_view item;  // "request", "choice"
  std::string_view whole; // "batch", "request"
  bool with_rid = false;  // failures name the rid too (SGLang's rids are the client's)
};

class fanout_requests {
public:
  explicit fanout_requests(fanout_names names) : names_(names) {}
  // The replies' handlers point at this object: it stays where it was made (in its actor's state).
  fanout_requests(const fanout_requests&) = delete;
  fanout_requests& operator=(const fanout_requests&) = delete;

  // Sends `reqs` to the front door from `self`, in order (a request without a rid gets a random
  // one); their streamed chunks go to `self` when `stream`. `on_last` runs once, in `self`, when
  // every request has answered or failed: then results() and failure() are complete.
  void send(caf::event_based_actor* self, std::shared_ptr<shared_state> st,
            std::vector<GenerateReqInput> reqs, bool stream, std::function<void()> on_last);

  // The request a streamed chunk belongs to; none for a chunk of no request here, or a failure
  // (its request's reply reports it).
  std::optional<std::size_t> index_of(const GenerateReqOutput& chunk) const;
  // index_of, and the chunk folded into that request's result (append_chunk), for replies that
  // stream whole results so far (SGLang's).
  std::optional<std::size_t> fold(GenerateReqOutput chunk);

  // Aborts every request, saying why in their replies (the client went away).
  void abort_all(const std::string& reason);

  // By request: its streamed chunks folded so far (fold), then its final reply.
  const std::vector<GenerateReqOutput>& results() const { return results_; }
  // The first request to fail, named ("request 2 (rid x): ...", "choice 2: ..."); empty while
  // none has.
  const std::string& failure() const { return failure_; }

private:
  // Request j's reply (`answered` false: the engine did not answer, `error` says why).
  void finish(std::size_t j, GenerateReqOutput out, bool answered, const std::string& error);

  fanout_names names_;
  caf::event_based_actor* self_ = nullptr;
  std::shared_ptr<shared_state> st_;
  std::function<void()> on_last_;
  std::vector<std::string> rids_; // by request index
  std::unordered_map<std::string, std::size_t> index_of_;
  std::vector<GenerateReqOutput> results_;
  std::size_t pending_ = 0;
  std::string failure_;
};

} // namespace rlserve::net::detail
