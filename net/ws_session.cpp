#include "net/ws_session.hpp"

#include <algorithm>

#include <boost/asio/post.hpp>
#include <boost/beast/core/bind_handler.hpp>
#include <boost/beast/websocket.hpp>
#include <fmt/format.h>

#include "net/fail.hpp"

namespace rlserve::net::detail {

namespace beast = boost::beast;
namespace websocket = beast::websocket;
namespace http = beast::http;

ws_session::ws_session(beast::tcp_stream&& stream, std::shared_ptr<shared_state> st)
  : ws_(std::move(stream)), st_(std::move(st)), buffer_(st_->opts.max_message_bytes) {
  st_->session_opened();
}

ws_session::~ws_session() {
  if (dropper_)
    st_->remove_dropper(dropper_);
  tell_closed();
  st_->session_closed();
}

void ws_session::run(http::request<http::string_body> request, std::vector<std::string> tokens) {
  tokens_ = std::move(tokens);
  id_ = st_->next_connection++;
  dropper_ = st_->add_dropper([weak = weak_from_this()] {
    if (auto self = weak.lock())
      self->post_shutdown();
  });
  // Beast's own timer replaces the tcp_stream's from here on.
  beast::get_lowest_layer(ws_).expires_never();
  websocket::stream_base::timeout t{};
  t.handshake_timeout = st_->opts.request_timeout;
  t.idle_timeout = st_->opts.idle_timeout.count() > 0
                     ? std::chrono::duration_cast<websocket::stream_base::duration>(st_->opts.idle_timeout)
                     : websocket::stream_base::none();
  t.keep_alive_pings = true;
  ws_.set_option(t);
  ws_.set_option(websocket::stream_base::decorator(
    [](websocket::response_type& res) { res.set(http::field::server, "rlserve"); }));
  ws_.read_message_max(st_->opts.max_message_bytes);
  // Replies go out whole: a frame per message, written straight from the queued string.
  ws_.auto_fragment(false);
  ws_.async_accept(request, beast::bind_front_handler(&ws_session::on_accept, shared_from_this()));
}

void ws_session::on_accept(beast::error_code ec) {
  if (ec)
    return fail(ec, "websocket accept");
  link_ = std::make_shared<link<ws_outbound>>(st_);
  link_->attach(weak_from_this());
  conn_ = spawn_ws_connection(st_, link_, id_, std::move(tokens_));
  st_->stats.connection_opened();
  log_debug(fmt::format("connection {} open", id_));
  do_read();
}

void ws_session::do_read() {
  ws_.async_read(buffer_, beast::bind_front_handler(&ws_session::on_read, shared_from_this()));
}

void ws_session::on_read(beast::error_code ec, std::size_t) {
  if (ec) {
    if (ec == websocket::error::message_too_big)
      st_->stats.protocol_error("too_large");
    tell_closed();
    return fail(ec, "websocket read");
  }
  auto frame = buffer_.take();
  unanswered_bytes_ += frame.size;
  if (ws_.got_text())
    deliver_text(conn_, std::move(frame));
  else
    deliver_binary(conn_, std::move(frame));
  if (unanswered_bytes_ > st_->opts.max_unanswered_bytes_per_connection) {
    // Backpressure: TCP holds the client's next frames until the engine catches up.
    read_paused_ = true;
    paused_hold_ = shared_from_this();
    st_->stats.reads_paused();
    return;
  }
  do_read();
}

void ws_session::post_consumed(std::size_t bytes) {
  boost::asio::post(ws_.get_executor(), [self = shared_from_this(), bytes] {
    self->unanswered_bytes_ -= std::min(bytes, self->unanswered_bytes_);
    if (self->read_paused_ && !self->dropped_ &&
        self->unanswered_bytes_ <= self->st_->opts.max_unanswered_bytes_per_connection) {
      self->read_paused_ = false;
      self->paused_hold_.reset(); // `self` keeps the session alive here
      self->do_read();
    }
  });
}

void ws_session::post_text(std::shared_ptr<const std::string> text) {
  boost::asio::post(ws_.get_executor(), [self = shared_from_this(), text = std::move(text)]() mutable {
    self->enqueue(std::move(text));
  });
}

void ws_session::post_close(std::string reason) {
  boost::asio::post(ws_.get_executor(), [self = shared_from_this(), reason = std::move(reason)] {
    log_warn(fmt::format("connection {}: {}", self->id_, reason));
    self->drop_connection("closed by the server");
  });
}

void ws_session::post_shutdown() {
  boost::asio::post(ws_.get_executor(),
                    [self = shared_from_this()] { self->drop_connection("server stopping"); });
}

void ws_session::enqueue(std::shared_ptr<const std::string> text) {
  if (dropped_)
    return;
  queued_bytes_ += text->size();
  if (queued_bytes_ > st_->opts.max_queued_bytes_per_connection) {
    // The client does not read its replies: a close frame would queue behind them, so the
    // connection is dropped; the actor then aborts everything the client had running.
    st_->stats.protocol_error("slow_client");
    log_warn(fmt::format("connection {}: more than {} bytes of replies wait for the client to read "
                         "them; disconnecting it",
                         id_, st_->opts.max_queued_bytes_per_connection));
    return drop_connection("slow client");
  }
  queue_.push_back(std::move(text));
  if (queue_.size() == 1)
    do_write();
}

void ws_session::do_write() {
  ws_.text(true);
  ws_.async_write(boost::asio::buffer(*queue_.front()),
                  beast::bind_front_handler(&ws_session::on_write, shared_from_this()));
}

void ws_session::on_write(beast::error_code ec, std::size_t) {
  if (ec) {
    queue_.clear();
    queued_bytes_ = 0;
    return fail(ec, "websocket write");
  }
  queued_bytes_ -= queue_.front()->size();
  queue_.pop_front();
  if (!queue_.empty())
    do_write();
}

void ws_session::drop_connection(const char* why) {
  if (dropped_)
    return;
  dropped_ = true;
  log_debug(fmt::format("connection {}: dropping ({})", id_, why));
  beast::error_code ignored;
  beast::get_lowest_layer(ws_).socket().shutdown(boost::asio::ip::tcp::socket::shutdown_both, ignored);
  beast::get_lowest_layer(ws_).socket().close(ignored);
  tell_closed();
  paused_hold_.reset(); // callers hold the session (posted handlers capture it)
}

void ws_session::tell_closed() {
  if (told_closed_ || !conn_)
    return;
  told_closed_ = true;
  st_->stats.connection_closed();
  deliver_closed(conn_);
  log_debug(fmt::format("connection {} closed", id_));
}

} // namespace rlserve::net::detail
