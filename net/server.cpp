// The server: a listener on one port, a fixed pool of Asio threads, and the shared state its
// sessions and actors use. See server.hpp for what it serves.
#include "net/server.hpp"

#include <algorithm>
#include <ctime>
#include <thread>
#include <vector>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core/bind_handler.hpp>
#include <fmt/format.h>

#include "actors/engine.hpp"
#include "caf/actor_system.hpp"
#include "caf/scoped_actor.hpp"
#include "caf/send.hpp"
#include "messages/json_codec.hpp"
#include "net/fail.hpp"
#include "net/http_session.hpp"
#include "net/session_watchdog.hpp"
#include "net/shared_state.hpp"

namespace rlserve::net {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

// Accepts connections; each gets its own strand and starts as an HTTP session (which may
// upgrade to a websocket).
class listener : public std::enable_shared_from_this<listener> {
public:
  listener(asio::io_context& ioc, std::shared_ptr<detail::shared_state> st)
    : ioc_(ioc), acceptor_(asio::make_strand(ioc)), st_(std::move(st)) {}

  expected<uint16_t> open(const std::string& host, uint16_t port) {
    boost::system::error_code ec;
    auto address = asio::ip::make_address(host, ec);
    if (ec)
      return rlserve::fail("--host " + host + ": not an IP address (" + ec.message() + ")");
    tcp::endpoint endpoint{address, port};
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec)
      acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec)
      acceptor_.bind(endpoint, ec);
    if (!ec)
      acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec)
      return rlserve::fail(fmt::format("cannot listen on {}:{}: {}", host, port, ec.message()));
    return acceptor_.local_endpoint().port();
  }

  void run() { do_accept(); }

  void stop() {
    asio::post(acceptor_.get_executor(), [self = shared_from_this()] {
      boost::system::error_code ignored;
      self->acceptor_.close(ignored);
    });
  }

private:
  void do_accept() {
    acceptor_.async_accept(asio::make_strand(ioc_),
                           boost::beast::bind_front_handler(&listener::on_accept, shared_from_this()));
  }

  void on_accept(boost::beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open())
      return;
    if (ec) {
      fail(ec, "accept");
    } else {
      // Replies and streamed chunks are small and latency-bound: never wait for Nagle.
      boost::system::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      std::make_shared<detail::http_session>(std::move(socket), st_)->run();
    }
    do_accept();
  }

  asio::io_context& ioc_;
  tcp::acceptor acceptor_;
  std::shared_ptr<detail::shared_state> st_;
};

} // namespace

struct server::impl {
  explicit impl(std::size_t threads) : ioc(static_cast<int>(threads)) {}

  asio::io_context ioc;
  std::shared_ptr<detail::shared_state> st;
  std::shared_ptr<listener> lst;
  caf::actor watchdog; // net/session_watchdog.hpp (its keeper); none when its timeout is 0
  std::vector<std::thread> threads;
  uint16_t port = 0;
  std::string host;
  bool stopped = false;
};

server::server(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

server::~server() { stop(); }

expected<std::unique_ptr<server>> server::start(Engine& engine, server_options options) {
  if (options.io_threads < 1 || options.io_threads > 256)
    return rlserve::fail("io_threads must be between 1 and 256, got " + std::to_string(options.io_threads));
  if (options.max_message_bytes < 1024)
    return rlserve::fail("max_message_bytes must be at least 1024");
  std::optional<tool_call_format> tool_format;
  if (!options.tool_call_parser.empty() && !(tool_format = find_tool_call_format(options.tool_call_parser)))
    return rlserve::fail("--tool-call-parser: unknown parser \"" + options.tool_call_parser +
                         "\"; rlserve has " + tool_call_format_names());
  std::optional<reasoning_format> reasoning;
  if (!options.reasoning_parser.empty() && !(reasoning = find_reasoning_format(options.reasoning_parser)))
    return rlserve::fail("--reasoning-parser: unknown parser \"" + options.reasoning_parser +
                         "\"; rlserve has " + reasoning_format_names());
  auto p = std::make_unique<impl>(options.io_threads);
  p->host = options.host;
  p->st = std::make_shared<detail::shared_state>(engine.system(), engine.front_door(), options);
  auto context = engine.get_server_info().max_context_length;
  p->st->max_generate_bytes = generate_bytes_limit(context);
  p->st->max_input_ids = static_cast<std::size_t>(std::max<int64_t>(context, 0));
  p->st->max_context_length = context;
  p->st->model_name = options.served_model_name.empty() ? engine.model_path().string() : options.served_model_name;
  p->st->started_at = static_cast<int64_t>(std::time(nullptr));
  p->st->tokenizer = engine.tokenizer();
  p->st->tool_format = tool_format;
  p->st->reasoning = reasoning;
  p->st->profile = engine.profile();
  // A model without a usable chat template still serves every other route; chat completions
  // then answer with the reason.
  if (auto chat = model::chat_template::load(engine.model_path()); !chat)
    p->st->chat_template_error = "the model's chat template cannot be used: " + chat.error();
  else if (!*chat)
    p->st->chat_template_error = "the model has no chat template (tokenizer_config.json has no chat_template "
                                 "and there is no chat_template.jinja); use /v1/completions";
  else
    p->st->chat = std::move(**chat);
  if (!p->st->chat_template_error.empty())
    log_info(p->st->chat_template_error);
  p->lst = std::make_shared<listener>(p->ioc, p->st);
  auto port = p->lst->open(options.host, options.port);
  if (!port)
    return std::move(port).take_failure();
  p->port = *port;
  p->st->port = *port;
  p->lst->run();
  p->watchdog = detail::spawn_session_watchdog(p->st);
  for (std::size_t i = 0; i < options.io_threads; ++i)
    p->threads.emplace_back([ioc = &p->ioc] { ioc->run(); });
  // Keys a request's top level does not know are ignored, as SGLang does; say which at debug.
  on_ignored_request_field([](std::string_view field) {
    log_debug("request field \"" + std::string(field) + "\" is not one rlserve knows; ignored");
  });
  if (!options.keys.any())
    log_warn("no --api-key and no --admin-api-key: every route, admin ones included, is open to "
             "anyone who can reach " + options.host);
  return std::unique_ptr<server>(new server(std::move(p)));
}

uint16_t server::port() const { return impl_->port; }

std::string server::address() const {
  return (impl_->host.find(':') != std::string::npos ? "[" + impl_->host + "]" : impl_->host) + ":" +
         std::to_string(impl_->port);
}

const metrics& server::stats() const { return impl_->st->stats; }

std::size_t server::kill_connection_actors() { return impl_->st->kill_actors(caf::exit_reason::kill); }

uint64_t server::kill_session_watchdog() {
  if (!impl_->watchdog)
    return 0;
  caf::actor helper;
  caf::scoped_actor self{impl_->st->sys};
  self->request(impl_->watchdog, std::chrono::seconds(10), caf::get_atom_v)
    .receive([&](caf::actor& a) { helper = std::move(a); }, [](caf::error&) {});
  if (!helper)
    return 0;
  caf::anon_send_exit(helper, caf::exit_reason::kill);
  return helper.id();
}

void server::stop() {
  auto& p = *impl_;
  if (p.stopped)
    return;
  p.stopped = true;
  p.st->stopping = true;
  p.lst->stop();
  if (p.watchdog) {
    caf::anon_send_exit(p.watchdog, caf::exit_reason::user_shutdown);
    p.watchdog = caf::actor{};
  }
  // Dropping a connection makes its actor abort what the client had running; wait a little
  // for the sessions to go, then for the actors to finish their clean-ups.
  if (auto left = p.st->drop_sessions(std::chrono::seconds(3)))
    log_warn(fmt::format("{} connections did not close in 3 s", left));
  if (auto left = p.st->wait_for_actors(std::chrono::seconds(5)))
    log_warn(fmt::format("{} connection actors still busy after 5 s; ending them", left));
  {
    std::unique_lock<std::shared_mutex> io{p.st->io_mtx};
    p.st->io_alive = false;
  }
  p.ioc.stop();
  for (auto& t : p.threads)
    t.join();
  p.threads.clear();
  p.st->kill_actors();
}

} // namespace rlserve::net
