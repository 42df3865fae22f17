#include "net/http_session.hpp"

#include <cctype>
#include <sstream>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core/bind_handler.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket/rfc6455.hpp>
#include <fmt/format.h>

#include "net/fail.hpp"
#include "net/http_route.hpp"
#include "net/ws_session.hpp"

namespace rlserve::net::detail {

namespace beast = boost::beast;
namespace http = beast::http;
namespace asio = boost::asio;

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The host part of an authority ("host:port", "[v6]:port", "host") names this machine without
// DNS: an IP literal, localhost, or the address the server was told to listen on. A page whose
// origin is a DNS name of the attacker's can rebind that name to 127.0.0.1, and the browser then
// sends Origin and Host both naming it: same-origin by the letter, but not this server's page.
bool names_this_server(std::string_view authority, const server_options& opts) {
  std::string_view host = authority;
  if (host.starts_with("["))
    return host.find(']') != std::string_view::npos; // an IPv6 literal
  if (auto colon = host.rfind(':'); colon != std::string_view::npos)
    host = host.substr(0, colon);
  if (host.empty())
    return false;
  const bool dotted_ipv4 = host.find_first_not_of("0123456789.") == std::string_view::npos;
  return dotted_ipv4 || host == "localhost" || host == lower(opts.host);
}

// Only browsers send Origin. A request without one is a program's (curl, a trainer); one with
// it must come from a page of this server itself (its authority is the Host the request was
// sent to, named without DNS: see names_this_server) or from an origin the operator allowed.
// Otherwise any web page the user opens could drive the engine through the browser: with no
// keys configured, admin routes included.
bool origin_allowed(const http::request<http::string_body>& req, const server_options& opts) {
  auto it = req.find(http::field::origin);
  if (it == req.end())
    return true;
  auto origin = lower(std::string_view(it->value().data(), it->value().size()));
  for (const auto& allowed : opts.allowed_origins)
    if (origin == lower(allowed))
      return true;
  auto scheme = origin.find("://");
  if (scheme == std::string::npos)
    return false; // "null" (a sandboxed page, a file) or garbage
  auto host = lower(std::string_view(req[http::field::host].data(), req[http::field::host].size()));
  return !host.empty() && origin.substr(scheme + 3) == host && names_this_server(host, opts);
}

std::vector<std::string> request_tokens(const http::request<http::string_body>& req) {
  auto a = req[http::field::authorization];
  auto x = req["x-api-key"];
  return tokens_from_headers({a.data(), a.size()}, {x.data(), x.size()});
}

} // namespace

http_session::http_session(asio::ip::tcp::socket&& socket, std::shared_ptr<shared_state> st)
  : stream_(std::move(socket)), st_(std::move(st)) {
  st_->session_opened();
}

http_session::~http_session() {
  if (dropper_)
    st_->remove_dropper(dropper_);
  if (calling_ && call_)
    deliver_cancel(call_);
  st_->session_closed();
}

void http_session::run() {
  dropper_ = st_->add_dropper([weak = weak_from_this()] {
    if (auto self = weak.lock())
      asio::post(self->stream_.get_executor(), [self] { self->drop(); });
  });
  // One strand per connection (the listener made the socket on it): start there.
  asio::dispatch(stream_.get_executor(), beast::bind_front_handler(&http_session::do_read, shared_from_this()));
}

void http_session::do_read() {
  if (dropped_)
    return;
  parser_.emplace();
  parser_->body_limit(st_->opts.max_message_bytes);
  parser_->header_limit(64 * 1024);
  stream_.expires_after(st_->opts.request_timeout);
  http::async_read(stream_, buffer_, *parser_,
                   beast::bind_front_handler(&http_session::on_read, shared_from_this()));
}

void http_session::on_read(beast::error_code ec, std::size_t) {
  if (ec == http::error::body_limit) {
    st_->stats.protocol_error("too_large");
    close_after_write_ = true;
    return answer(413, "application/json",
                  json_error_body("Payload Too Large",
                                  fmt::format("the request body is larger than the server's limit of "
                                              "{} bytes (server option max_message_bytes)",
                                              st_->opts.max_message_bytes)));
  }
  if (ec == http::error::header_limit) {
    st_->stats.protocol_error("too_large");
    close_after_write_ = true;
    return answer(431, "application/json",
                  json_error_body("Request Header Fields Too Large",
                                  "the request's headers are larger than the server's limit of 64 KiB"));
  }
  if (ec.category() == http::make_error_code(http::error::bad_method).category() &&
      ec != http::error::end_of_stream && ec != http::error::partial_message) {
    // Not HTTP the parser can read (a bad method, target, version, header line, chunk size...).
    st_->stats.protocol_error("bad_request");
    close_after_write_ = true;
    return answer(400, "application/json",
                  json_error_body("Bad Request", "malformed HTTP request: " + ec.message()));
  }
  if (ec)
    return fail(ec, "http read");
  auto req = parser_->release();
  keep_alive_ = req.keep_alive();
  head_ = req.method() == http::verb::head;
  if (!origin_allowed(req, st_->opts)) {
    st_->stats.protocol_error("forbidden");
    auto origin = req[http::field::origin];
    log_info("request from a foreign browser origin refused");
    if (beast::websocket::is_upgrade(req))
      st_->stats.connection_refused();
    close_after_write_ = true;
    return answer(403, "application/json",
                  json_error_body("Forbidden",
                                  "requests from the browser origin " + std::string(origin) +
                                    " are refused: only pages of this server, or origins given "
                                    "with --allowed-origin, may call it"));
  }
  if (beast::websocket::is_upgrade(req)) {
    auto tokens = request_tokens(req);
    if (st_->stopping) {
      close_after_write_ = true;
      return answer(503, "application/json", json_error_body("Service Unavailable", "the server is stopping"));
    }
    if (!may_connect(st_->opts.keys, tokens)) {
      st_->stats.connection_refused();
      close_after_write_ = true;
      log_info("websocket upgrade refused: no valid API key presented");
      return answer(401, "application/json",
                    json_error_body("Unauthorized",
                                    refusal_message(st_->opts.keys, route_auth::normal)));
    }
    // The websocket session takes the connection (and any bytes already read are the
    // handshake's, which Beast's accept(request) does not need again).
    stream_.expires_never();
    std::make_shared<ws_session>(std::move(stream_), st_)->run(std::move(req), std::move(tokens));
    return;
  }
  route(req);
}

void http_session::route(http::request<http::string_body>& req) {
  auto content_type = req[http::field::content_type];
  auto routed = route_http_request(req.method(), {req.target().data(), req.target().size()},
                                   std::move(req.body()),
                                   json_media_type({content_type.data(), content_type.size()}));
  if (auto* refusal = std::get_if<http_refusal>(&routed))
    return answer(refusal->status, "application/json", std::move(refusal->body));
  auto& r = std::get<http_routed>(routed);
  auto& call = r.call;
  const auto level = r.level;
  const std::string& path = r.path;
  if (authorize(st_->opts.keys, level, request_tokens(req)) != auth_result::ok) {
    st_->stats.protocol_error("unauthorized");
    log_info("HTTP " + path + " refused: unauthorized");
    return answer(401, "application/json",
                  json_error_body("Unauthorized", refusal_message(st_->opts.keys, level)));
  }
  if (st_->stopping) {
    close_after_write_ = true;
    return answer(503, "application/json", json_error_body("Service Unavailable", "the server is stopping"));
  }
  link_ = std::make_shared<link<http_outbound>>(st_);
  link_->attach(weak_from_this());
  calling_ = true;
  events_started_ = false;
  stream_.expires_never(); // the engine takes the time it takes; the watch notices a hang-up
  call_ = spawn_http_call(st_, link_, std::move(call));
  watch_peer();
}

void http_session::answer(unsigned status, std::string content_type, std::string body) {
  http::response<http::string_body> res{static_cast<http::status>(status), 11};
  res.set(http::field::server, "rlserve");
  res.set(http::field::content_type, content_type);
  res.keep_alive(keep_alive_ && !close_after_write_);
  res.body() = std::move(body);
  res.prepare_payload();
  if (head_)
    res.body().clear(); // Content-Length stays that of the GET's body (RFC 9110 9.3.2)
  if (!res.keep_alive())
    close_after_write_ = true;
  else
    read_after_write_ = true;
  std::ostringstream out;
  out << res;
  write(std::make_shared<const std::string>(out.str()));
}

void http_session::post_reply(http_reply reply) {
  asio::post(stream_.get_executor(), [self = shared_from_this(), reply = std::move(reply)]() mutable {
    if (self->dropped_ || !self->calling_)
      return;
    self->calling_ = false;
    self->call_ = caf::actor{};
    self->link_.reset();
    if (reply.end_of_stream) {
      // SGLang ends its /generate event stream with [DONE]; the connection then closes (the
      // stream has no length, so its end is the end of the connection).
      self->close_after_write_ = true;
      return self->write(std::make_shared<const std::string>("data: [DONE]\n\n"));
    }
    self->answer(reply.status, std::move(reply.content_type), std::move(reply.body));
  });
}

void http_session::post_event(std::shared_ptr<const std::string> data) {
  asio::post(stream_.get_executor(), [self = shared_from_this(), data = std::move(data)] {
    if (self->dropped_ || !self->calling_)
      return;
    std::string bytes;
    if (!self->events_started_) {
      self->events_started_ = true;
      bytes = "HTTP/1.1 200 OK\r\nServer: rlserve\r\nContent-Type: text/event-stream\r\n"
              "Cache-Control: no-cache\r\nConnection: close\r\n\r\n";
    }
    bytes += "data: ";
    bytes += *data;
    bytes += "\n\n";
    self->write(std::make_shared<const std::string>(std::move(bytes)));
  });
}

void http_session::write(std::shared_ptr<const std::string> bytes) {
  if (dropped_)
    return;
  queued_bytes_ += bytes->size();
  if (queued_bytes_ > st_->opts.max_queued_bytes_per_connection) {
    st_->stats.protocol_error("slow_client");
    log_warn("an HTTP client does not read its event stream; disconnecting it");
    return drop();
  }
  queue_.push_back(std::move(bytes));
  if (queue_.size() == 1)
    do_write();
}

void http_session::do_write() {
  asio::async_write(stream_, asio::buffer(*queue_.front()),
                    beast::bind_front_handler(&http_session::on_write, shared_from_this()));
}

void http_session::on_write(beast::error_code ec, std::size_t) {
  if (ec) {
    drop();
    return fail(ec, "http write");
  }
  queued_bytes_ -= queue_.front()->size();
  queue_.pop_front();
  if (!queue_.empty())
    return do_write();
  if (calling_)
    return; // more events to come
  if (close_after_write_) {
    beast::error_code ignored;
    stream_.socket().shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
    // Read what the client still sends (the rest of a refused body) until it closes: closing
    // with unread bytes would reset the connection and could destroy the reply in flight.
    if (!watching_)
      drain();
    return;
  }
  if (read_after_write_) {
    read_after_write_ = false;
    if (watching_) {
      // The watch read must end first (one read at a time); cancel it and read afterwards.
      read_wanted_ = true;
      beast::error_code ignored;
      stream_.socket().cancel(ignored);
      return;
    }
    do_read();
  }
}

void http_session::drain() {
  stream_.expires_after(st_->opts.request_timeout);
  buffer_.clear();
  stream_.async_read_some(buffer_.prepare(64 * 1024), [self = shared_from_this()](beast::error_code ec, std::size_t) {
    if (!ec)
      self->drain();
  });
}

void http_session::watch_peer() {
  watching_ = true;
  stream_.async_read_some(buffer_.prepare(4096),
                          beast::bind_front_handler(&http_session::on_watch, shared_from_this()));
}

void http_session::on_watch(beast::error_code ec, std::size_t bytes) {
  watching_ = false;
  if (!ec) {
    // The client sent its next request already (pipelining); it is parsed after this reply.
    buffer_.commit(bytes);
  } else if (ec != asio::error::operation_aborted) {
    // The client went away while its request ran: abort it.
    if (calling_ && call_) {
      deliver_cancel(call_);
      calling_ = false;
      call_ = caf::actor{};
    }
    return drop();
  }
  if (read_wanted_) {
    read_wanted_ = false;
    do_read();
  }
}

void http_session::drop() {
  if (dropped_)
    return;
  dropped_ = true;
  if (calling_ && call_) {
    deliver_cancel(call_);
    calling_ = false;
    call_ = caf::actor{};
  }
  beast::error_code ignored;
  stream_.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  stream_.socket().close(ignored);
}

} // namespace rlserve::net::detail
