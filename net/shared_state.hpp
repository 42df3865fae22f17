// Private to net/: what the listener, the sessions and the actors of one server share. No Beast
// here and no caf/all.hpp, so both sides include it cheaply.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "actors/profiler.hpp"
#include "actors/tokenizer_actor.hpp"
#include "caf/actor.hpp"
#include "caf/exit_reason.hpp"
#include "model/chat_template.hpp"
#include "net/reasoning_parser.hpp"
#include "net/tool_call_parser.hpp"
#include "net/metrics.hpp"
#include "net/ownership.hpp"
#include "net/server.hpp"

namespace rlserve::net::detail {

struct shared_state {
  shared_state(caf::actor_system& s, tokenizer_actor f, server_options o)
    : sys(s), front(std::move(f)), opts(std::move(o)) {}

  caf::actor_system& sys;
  tokenizer_actor front;
  const server_options opts;
  uint16_t port = 0; // the port listened on (opts.port, or the one the system chose for 0)
  metrics stats;
  ownership owners;
  std::atomic<uint64_t> next_connection{1};
  std::atomic<bool> stopping{false};
  // Largest generate request parsed (generate_bytes_limit of the model's context length).
  std::size_t max_generate_bytes = SIZE_MAX;
  // Most input_ids a request is read with (the model's context length; parse_request_json).
  std::size_t max_input_ids = SIZE_MAX;
  // The OpenAI routes (net/openai_call_actor.cpp): the model's name in replies and /v1/models
  // (server_options::served_model_name, else its path; /server_info's served_model_name too),
  // its context length, tokenizer (token texts of logprobs; null without
  // tokenizer.json) and chat template (none: chat_template_error says why).
  std::string model_name;
  int64_t max_context_length = 0;
  int64_t started_at = 0; // seconds since the epoch: /v1/models' `created`
  std::shared_ptr<const model::bpe_tokenizer> tokenizer;
  // /start_profile, /stop_profile: the engine's recorder.
  std::shared_ptr<profiler> profile;
  std::optional<model::chat_template> chat;
  std::string chat_template_error;
  // vLLM's /sleep and /wake_up (net/vllm_call_actor.cpp): the vLLM tags asleep, and whether a
  // sleep paused generation (a level-0 sleep sleeps no tag). Under vllm_mu.
  std::mutex vllm_mu;
  std::set<std::string> vllm_asleep;
  bool vllm_sleep_paused = false;
  // From server_options' parser names (checked at start); absent: not parsed.
  std::optional<tool_call_format> tool_format;
  std::optional<reasoning_format> reasoning;

  // Held shared by an actor while it posts to a session, exclusively by stop() when it turns
  // io_alive off: after that no actor touches the I/O side again.
  std::shared_mutex io_mtx;
  bool io_alive = true;

  // Live sessions (websocket and HTTP): counted from construction to destruction, so stop()
  // can wait for them; each registers how to drop its connection once it runs.
  void session_opened();
  void session_closed();
  uint64_t add_dropper(std::function<void()> drop);
  void remove_dropper(uint64_t id);
  // Calls every dropper, then waits until no session is left or `timeout` passed.
  std::size_t drop_sessions(std::chrono::milliseconds timeout);

  // Live actors of the front (one per websocket connection, one per HTTP call): stop() waits for
  // them and then ends the stragglers, so none outlives the server.
  uint64_t reserve_actor();
  void set_actor(uint64_t id, caf::actor handle);
  void remove_actor(uint64_t id);
  // Waits until no actor is left or `timeout` passed; returns how many are left.
  std::size_t wait_for_actors(std::chrono::milliseconds timeout);
  // Sends an exit with `reason` to every actor left and forgets them; returns how many.
  std::size_t kill_actors(caf::exit_reason reason = caf::exit_reason::user_shutdown);

private:
  std::mutex sessions_mtx_;
  std::condition_variable sessions_cv_;
  std::size_t sessions_ = 0;
  std::unordered_map<uint64_t, std::function<void()>> droppers_;
  uint64_t next_dropper_ = 1;

  std::mutex actors_mtx_;
  std::condition_variable actors_cv_;
  std::unordered_map<uint64_t, caf::actor> actors_;
  uint64_t next_actor_ = 1;
};

// The thread-safe way from an actor to a session: it holds the session weakly, so a closed
// connection goes away whatever its actor still holds, and posts nothing once the server
// stopped its I/O.
template <class Outbound>
class link {
public:
  explicit link(std::shared_ptr<shared_state> st) : st_(std::move(st)) {}

  void attach(std::weak_ptr<Outbound> s) {
    std::lock_guard<std::mutex> guard{mtx_};
    s_ = std::move(s);
  }

  // Runs f(session) if the session and the I/O side are still there; f posts to its strand.
  template <class F>
  bool with(F&& f) {
    std::shared_lock<std::shared_mutex> io{st_->io_mtx};
    if (!st_->io_alive)
      return false;
    std::shared_ptr<Outbound> s;
    {
      std::lock_guard<std::mutex> guard{mtx_};
      s = s_.lock();
    }
    if (!s)
      return false;
    f(*s);
    return true;
  }

private:
  std::shared_ptr<shared_state> st_;
  std::mutex mtx_;
  std::weak_ptr<Outbound> s_;
};

} // namespace rlserve::net::detail
