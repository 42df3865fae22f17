// Private to net/: one HTTP/1.1 connection. Reads a request; a websocket upgrade (with a key
// that passes at least one level) becomes a ws_session; anything else is routed:
//
//   GET  /health, /health_generate, /metrics, /model_info, /get_server_info    (normal level)
//   POST /<route> (GET too, except generate)  for every route of codec_registry, with the
//        route's level; SGLang's request bodies and reply shapes (http_call_actor.cpp shape_reply)
//
// A routed request goes to a call actor (http_call_actor.cpp), which answers through link<http_outbound>
// with a whole reply or with server-sent events (POST /generate with "stream": true). While the
// call runs the session keeps one read open to notice a client that goes away; it then tells
// the call actor, which aborts the request. Keep-alive connections read the next request after
// the reply; reading a request (or waiting for one) is bounded by request_timeout.
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <string>

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "caf/actor.hpp"
#include "net/http_call_actor.hpp"

namespace rlserve::net::detail {

class http_session : public http_outbound, public std::enable_shared_from_this<http_session> {
public:
  http_session(boost::asio::ip::tcp::socket&& socket, std::shared_ptr<shared_state> st);
  ~http_session() override;

  void run();

  void post_event(std::shared_ptr<const std::string> data) override;
  void post_reply(http_reply reply) override;

private:
  void do_read();
  void on_read(boost::beast::error_code ec, std::size_t bytes);
  void route(boost::beast::http::request<boost::beast::http::string_body>& req);
  // A reply made here (not by an actor): errors, refusals.
  void answer(unsigned status, std::string content_type, std::string body);
  void write(std::shared_ptr<const std::string> bytes);
  void do_write();
  void on_write(boost::beast::error_code ec, std::size_t bytes);
  void watch_peer();
  void on_watch(boost::beast::error_code ec, std::size_t bytes);
  void drain();
  void drop();

  boost::beast::tcp_stream stream_;
  std::shared_ptr<shared_state> st_;
  boost::beast::flat_buffer buffer_;
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  std::deque<std::shared_ptr<const std::string>> queue_;
  std::size_t queued_bytes_ = 0;
  uint64_t dropper_ = 0;
  bool keep_alive_ = false;
  bool head_ = false; // the current request is a HEAD: replies carry no body
  // The current request's call.
  caf::actor call_;
  std::shared_ptr<link<http_outbound>> link_;
  bool calling_ = false;       // a call actor works on the current request
  bool events_started_ = false; // the reply is a server-sent event stream
  bool close_after_write_ = false;
  bool read_after_write_ = false;
  bool watching_ = false;       // the disconnect watch read is outstanding
  bool read_wanted_ = false;    // read the next request once the watch read has ended
  bool dropped_ = false;
};

} // namespace rlserve::net::detail
