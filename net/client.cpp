#include "net/client.hpp"

#include <optional>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <fmt/format.h>

namespace rlserve::net {

namespace beast = boost::beast;
namespace websocket = beast::websocket;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

expected<server_message> parse_server_message(std::string_view text) {
  auto j = parse_json(text);
  if (!j)
    return fail("the server sent a frame that is not JSON: " + j.error());
  if (!j->is_object())
    return fail("the server sent a frame that is not a JSON object: " + dump(*j));
  server_message m;
  m.id = j->value("id", json(nullptr));
  m.type = j->value("type", std::string());
  if (auto e = j->find("error"); e != j->end()) {
    m.kind = server_message::error;
    if (e->is_object()) {
      m.code = e->value("code", std::string("unknown"));
      m.message = e->value("message", std::string());
    }
    return m;
  }
  m.body = j->value("body", json::object());
  if (m.type.size() > 6 && m.type.ends_with(".chunk")) {
    m.kind = server_message::chunk;
    m.type.resize(m.type.size() - 6);
    return m;
  }
  m.kind = server_message::reply;
  m.ok = j->value("ok", false);
  return m;
}

struct client::impl {
  asio::io_context ioc;
  websocket::stream<beast::tcp_stream> ws{ioc};
  client_options opts;
  beast::flat_buffer buffer;
  std::deque<server_message> set_aside;
  int64_t next_id = 1;
  bool broken = false;
  std::string broken_why;

  // Runs one asynchronous operation to its end or until the timeout; a timed-out operation
  // leaves the connection unusable (Beast cannot resume a cancelled websocket read).
  template <class Start>
  beast::error_code run(Start start) {
    std::optional<beast::error_code> result;
    start([&](beast::error_code ec, auto&&...) { result = ec; });
    ioc.restart();
    ioc.run_for(opts.timeout);
    if (!result) {
      beast::error_code ignored;
      beast::get_lowest_layer(ws).socket().close(ignored);
      ioc.restart();
      ioc.run();
      broken = true;
      broken_why = fmt::format("no answer from the server within {} ms", opts.timeout.count());
      return beast::error::timeout;
    }
    return *result;
  }

  status write(asio::const_buffer bytes, bool binary) {
    if (broken)
      return fail("the connection is unusable: " + broken_why);
    ws.binary(binary);
    auto ec = run([&](auto handler) { ws.async_write(bytes, std::move(handler)); });
    if (ec) {
      broken = true;
      broken_why = "sending failed: " + ec.message();
      return fail(broken_why);
    }
    return {};
  }
};

client::client(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

client::~client() = default;

expected<std::unique_ptr<client>> client::connect(const client_options& options) {
  auto p = std::make_unique<impl>();
  p->opts = options;
  tcp::resolver resolver{p->ioc};
  beast::error_code ec;
  auto endpoints = resolver.resolve(options.host, std::to_string(options.port), ec);
  if (ec)
    return fail(fmt::format("cannot resolve {}: {}", options.host, ec.message()));
  ec = p->run([&](auto handler) {
    beast::get_lowest_layer(p->ws).async_connect(endpoints, [h = std::move(handler)](beast::error_code e, auto) mutable { h(e); });
  });
  if (ec)
    return fail(fmt::format("cannot connect to {}:{}: {}", options.host, options.port, ec.message()));
  beast::get_lowest_layer(p->ws).socket().set_option(tcp::no_delay(true), ec);
  p->ws.set_option(websocket::stream_base::decorator([o = options](websocket::request_type& req) {
    req.set(beast::http::field::user_agent, "rlserve-client");
    if (!o.api_key.empty())
      req.set(beast::http::field::authorization, "Bearer " + o.api_key);
    if (!o.admin_api_key.empty()) {
      if (o.api_key.empty())
        req.set(beast::http::field::authorization, "Bearer " + o.admin_api_key);
      else
        req.set("x-api-key", o.admin_api_key);
    }
  }));
  p->ws.read_message_max(options.max_message_bytes);
  // Masking copies outgoing payloads through this buffer; the default (4 KB) makes a large
  // binary frame thousands of small writes.
  p->ws.write_buffer_bytes(std::size_t{1} << 20);
  p->ws.auto_fragment(false);
  websocket::response_type res;
  std::string host = options.host + ":" + std::to_string(options.port);
  ec = p->run([&](auto handler) { p->ws.async_handshake(res, host, "/", std::move(handler)); });
  if (ec) {
    if (res.result_int() == 401 || res.result_int() == 403)
      return fail(fmt::format("the server refused the connection ({}): {}", res.result_int(),
                              res.body().empty() ? "check --api-key / --admin-api-key" : res.body()));
    return fail(fmt::format("websocket handshake with {} failed: {}", host, ec.message()));
  }
  return std::unique_ptr<client>(new client(std::move(p)));
}

status client::send_with_id(const json& id, std::string_view type, const json& body) {
  json frame = {{"id", id}, {"type", type}, {"body", body}};
  auto text = dump(frame);
  return impl_->write(asio::buffer(text), false);
}

expected<int64_t> client::send(std::string_view type, const json& body) {
  auto id = impl_->next_id++;
  auto sent = send_with_id(id, type, body);
  if (!sent)
    return std::move(sent).take_failure();
  return id;
}

expected<int64_t> client::send_tensors(const UpdateWeightsFromTensorReqInput& req) {
  auto id = impl_->next_id++;
  json body = to_json(req);
  body.erase("named_tensors");
  auto frame = make_binary_frame(id, "update_weights_from_tensor", body, req.named_tensors);
  auto sent = impl_->write(asio::buffer(frame.data(), frame.size()), true);
  if (!sent)
    return std::move(sent).take_failure();
  return id;
}

status client::send_raw(std::span<const std::byte> bytes, bool binary) {
  return impl_->write(asio::buffer(bytes.data(), bytes.size()), binary);
}

expected<server_message> client::receive() {
  auto& p = *impl_;
  if (!p.set_aside.empty()) {
    auto m = std::move(p.set_aside.front());
    p.set_aside.pop_front();
    return m;
  }
  return read_frame();
}

expected<server_message> client::read_frame() {
  auto& p = *impl_;
  if (p.broken)
    return fail("the connection is unusable: " + p.broken_why);
  p.buffer.clear();
  auto ec = p.run([&](auto handler) { p.ws.async_read(p.buffer, std::move(handler)); });
  if (ec) {
    p.broken = true;
    if (ec == websocket::error::closed)
      p.broken_why = fmt::format("the server closed the connection (code {}{}{})",
                                 static_cast<int>(p.ws.reason().code),
                                 p.ws.reason().reason.empty() ? "" : ": ",
                                 std::string(p.ws.reason().reason.data(), p.ws.reason().reason.size()));
    else if (p.broken_why.empty())
      p.broken_why = "the connection ended: " + ec.message();
    return fail(p.broken_why);
  }
  auto data = p.buffer.data();
  return parse_server_message({static_cast<const char*>(data.data()), data.size()});
}

expected<server_message> client::wait_for(const json& id, const std::function<void(const json&)>& on_chunk) {
  auto& p = *impl_;
  // What is already set aside comes first, in arrival order; other requests' messages stay.
  for (auto it = p.set_aside.begin(); it != p.set_aside.end();) {
    if (it->id != id) {
      ++it;
      continue;
    }
    auto m = std::move(*it);
    it = p.set_aside.erase(it);
    if (m.kind == server_message::chunk) {
      if (on_chunk)
        on_chunk(m.body);
      continue;
    }
    if (m.kind == server_message::error)
      return fail(m.code + ": " + m.message);
    return m;
  }
  for (;;) {
    auto m = read_frame();
    if (!m)
      return m;
    if (m->id != id) {
      p.set_aside.push_back(std::move(*m));
      continue;
    }
    if (m->kind == server_message::chunk) {
      if (on_chunk)
        on_chunk(m->body);
      continue;
    }
    if (m->kind == server_message::error)
      return fail(m->code + ": " + m->message);
    return m;
  }
}

expected<server_message> client::call(std::string_view type, const json& body,
                                      const std::function<void(const json&)>& on_chunk) {
  auto id = send(type, body);
  if (!id)
    return std::move(id).take_failure();
  return wait_for(*id, on_chunk);
}

expected<GenerateReqOutput> client::generate(GenerateReqInput req,
                                             const std::function<void(const GenerateReqOutput&)>& on_chunk) {
  if (on_chunk)
    req.stream = true;
  std::optional<failure> bad_chunk;
  auto m = call("generate", to_json(req), [&](const json& body) {
    auto c = from_json<GenerateReqOutput>(body);
    if (!c) {
      bad_chunk = fail("a streamed chunk does not decode: " + c.error());
      return;
    }
    if (on_chunk)
      on_chunk(*c);
  });
  if (!m)
    return std::move(m).take_failure();
  if (bad_chunk)
    return *bad_chunk;
  return from_json<GenerateReqOutput>(m->body);
}

expected<UpdateWeightsFromTensorReqOutput>
client::update_weights_from_tensor(const UpdateWeightsFromTensorReqInput& req) {
  auto id = send_tensors(req);
  if (!id)
    return std::move(id).take_failure();
  auto m = wait_for(*id, {});
  if (!m)
    return std::move(m).take_failure();
  return from_json<UpdateWeightsFromTensorReqOutput>(m->body);
}

void client::close() {
  auto& p = *impl_;
  if (p.broken)
    return;
  p.run([&](auto handler) { p.ws.async_close(websocket::close_code::normal, std::move(handler)); });
  p.broken = true;
  p.broken_why = "closed by this client";
}

int client::close_code() const { return static_cast<int>(impl_->ws.reason().code); }

} // namespace rlserve::net
