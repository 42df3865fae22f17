// Private to net/: one websocket connection (Beast 1.74 chat-multi shape, with the `return`s).
//
//   http_session --upgrade request--> ws_session::run --accept--> do_read <-> on_read
//                                                                   |  every message
//                                                                   v
//                                    connection actor (ws_connection_actor.cpp) --post_text--> write queue
//
// The session only reads, writes and hands complete messages to its connection actor; the actor
// parses them off the I/O threads. Actors reach the session through link<ws_outbound>, which
// posts to the session's strand. One async_write at a time, from a queue; a client that lets
// more than max_queued_bytes_per_connection pile up is disconnected. The connection actor hears
// of the end of the connection exactly once, from on_read's error or from the destructor.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/websocket/stream.hpp>

#include "caf/actor.hpp"
#include "net/ws_connection_actor.hpp"
#include "net/message_buffer.hpp"

namespace rlserve::net::detail {

class ws_session : public ws_outbound, public std::enable_shared_from_this<ws_session> {
public:
  ws_session(boost::beast::tcp_stream&& stream, std::shared_ptr<shared_state> st);
  ~ws_session() override;

  // Completes the upgrade that `request` asked for; `tokens` are the keys it presented.
  void run(boost::beast::http::request<boost::beast::http::string_body> request,
           std::vector<std::string> tokens);

  void post_text(std::shared_ptr<const std::string> text) override;
  void post_close(std::string reason) override;
  void post_consumed(std::size_t bytes) override;
  // Server shutdown: drops the TCP connection (from any thread).
  void post_shutdown();

private:
  void on_accept(boost::beast::error_code ec);
  void do_read();
  void on_read(boost::beast::error_code ec, std::size_t bytes);
  void enqueue(std::shared_ptr<const std::string> text);
  void do_write();
  void on_write(boost::beast::error_code ec, std::size_t bytes);
  void drop_connection(const char* why);
  void tell_closed();

  boost::beast::websocket::stream<boost::beast::tcp_stream> ws_;
  std::shared_ptr<shared_state> st_;
  message_buffer buffer_;
  std::deque<std::shared_ptr<const std::string>> queue_;
  std::size_t queued_bytes_ = 0;
  std::size_t unanswered_bytes_ = 0; // delivered to the actor, not yet consumed
  bool read_paused_ = false;
  // While reading is paused no handler holds the session; this does, until reads resume or the
  // connection is dropped.
  std::shared_ptr<ws_session> paused_hold_;
  std::vector<std::string> tokens_;
  std::shared_ptr<link<ws_outbound>> link_;
  caf::actor conn_;
  uint64_t id_ = 0;
  uint64_t dropper_ = 0;
  bool told_closed_ = false;
  bool dropped_ = false;
};

} // namespace rlserve::net::detail
