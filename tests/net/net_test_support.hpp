// What the net/ tests share: a tiny model, an engine with a server in front of it on a free
// loopback port, a raw HTTP helper (so HTTP is tested without the client library), and polling.
#pragma once

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "actors/engine.hpp"
#include "model/make_model.hpp"
#include "net/client.hpp"
#include "net/server.hpp"

namespace rlserve::test {

namespace fs = std::filesystem;

// The tiny model (seed 0), made once per process.
inline const fs::path& tiny_model_dir() {
  static const fs::path dir = [] {
    auto d = fs::temp_directory_path() / ("rlserve-net-test-" + std::to_string(::getpid())) / "tiny";
    if (!fs::exists(d / "config.json")) {
      model::make_model_options o;
      o.out = d;
      o.seed = 0;
      auto ok = model::make_model(o);
      BOOST_REQUIRE_MESSAGE(ok.has_value(), (ok ? std::string() : ok.error()));
    }
    return d;
  }();
  return dir;
}

struct served_engine {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<net::server> server;

  // `cfg.model_path` empty: the tiny model.
  explicit served_engine(net::server_options opts = {}, engine_config cfg = {}) {
    if (cfg.model_path.empty())
      cfg.model_path = tiny_model_dir();
    auto e = Engine::start(cfg);
    BOOST_REQUIRE_MESSAGE(e.has_value(), (e ? std::string() : e.error()));
    engine = std::move(*e);
    opts.host = "127.0.0.1";
    opts.port = 0;
    auto s = net::server::start(*engine, opts);
    BOOST_REQUIRE_MESSAGE(s.has_value(), (s ? std::string() : s.error()));
    server = std::move(*s);
  }
  ~served_engine() {
    server->stop();
    server.reset();
    engine.reset();
  }

  uint16_t port() const { return server->port(); }

  net::client_options client_opts(std::string api_key = {}, std::string admin_key = {}) const {
    net::client_options o;
    o.port = port();
    o.api_key = std::move(api_key);
    o.admin_api_key = std::move(admin_key);
    o.timeout = std::chrono::seconds(60);
    return o;
  }

  std::unique_ptr<net::client> connect(std::string api_key = {}, std::string admin_key = {}) const {
    auto c = net::client::connect(client_opts(std::move(api_key), std::move(admin_key)));
    BOOST_REQUIRE_MESSAGE(c.has_value(), c.error());
    return std::move(*c);
  }
};

struct http_result {
  unsigned status = 0;
  std::string content_type;
  std::string body;
};

// One HTTP/1.1 request on a fresh connection; the whole response (an event stream is read to
// the end of the connection).
inline http_result http_request(uint16_t port, boost::beast::http::verb method, const std::string& target,
                                const std::string& body = {},
                                const std::map<std::string, std::string>& headers = {}) {
  namespace beast = boost::beast;
  namespace http = beast::http;
  boost::asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  stream.connect(boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), port));
  http::request<http::string_body> req{method, target, 11};
  req.set(http::field::host, "127.0.0.1");
  for (const auto& [k, v] : headers)
    req.set(k, v);
  if (!body.empty()) {
    req.set(http::field::content_type, "application/json");
    req.body() = body;
  }
  req.prepare_payload();
  beast::error_code ec;
  http::write(stream, req, ec); // may fail when the server refuses early (413); the reply is read
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(std::size_t{1} << 30);
  http::read(stream, buffer, parser, ec);
  http_result out;
  out.status = parser.get().result_int();
  out.content_type = std::string(parser.get()[http::field::content_type]);
  out.body = parser.get().body();
  return out;
}

// Polls `ready` every 20 ms for up to `limit`; true when it held.
inline bool eventually(const std::function<bool()>& ready,
                       std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (ready())
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return ready();
}

inline GenerateReqInput greedy_ids(std::vector<int32_t> ids, int32_t n) {
  GenerateReqInput r;
  r.input_ids = std::move(ids);
  r.sampling_params.temperature = 0.0f;
  r.sampling_params.max_new_tokens = n;
  r.sampling_params.ignore_eos = true;
  return r;
}

} // namespace rlserve::test
