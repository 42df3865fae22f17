// The HTTP request path of net/ on untrusted bytes, up to the engine call: Beast's request
// parser with http_session's limits, the websocket-upgrade check, the API-key headers, then
// route_http_request (path, query, method, route) and, for a routed call, http_request_body and
// the route's request decoder (after /generate's fan-out of batches and n > 1; the profile
// request's reader for /start_profile), as http_session and http_call_actor run them.
#include <cstddef>
#include <cstdint>
#include <variant>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/websocket/rfc6455.hpp>

#include "caf/message.hpp"
#include "fuzz/fuzz_support.hpp"
#include "messages/generate_fanout.hpp"
#include "net/auth.hpp"
#include "net/http_route.hpp"

namespace http = boost::beast::http;
using namespace rlserve::net;
using namespace rlserve::net::detail;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  http::request_parser<http::string_body> parser;
  parser.eager(true);
  parser.body_limit(1 << 20);
  parser.header_limit(64 * 1024);
  boost::beast::error_code ec;
  std::size_t used = 0;
  while (used < size && !parser.is_done()) {
    std::size_t n = parser.put(boost::asio::buffer(data + used, size - used), ec);
    if (ec == http::error::need_more)
      break;
    if (ec)
      return 0;
    if (n == 0)
      break;
    used += n;
  }
  if (!parser.is_done()) {
    // The connection closed here (a body without a length ends at EOF); Beast requires that
    // some of the message came first.
    if (!parser.got_some())
      return 0;
    parser.put_eof(ec);
    if (ec || !parser.is_done())
      return 0;
  }
  auto req = parser.release();
  (void)boost::beast::websocket::is_upgrade(req);
  auto a = req[http::field::authorization];
  auto x = req["x-api-key"];
  (void)tokens_from_headers({a.data(), a.size()}, {x.data(), x.size()});

  auto content_type = req[http::field::content_type];
  auto routed = route_http_request(req.method(), {req.target().data(), req.target().size()},
                                   std::move(req.body()),
                                   json_media_type({content_type.data(), content_type.size()}));
  auto* r = std::get_if<http_routed>(&routed);
  if (r && r->call.kind == http_call::start_profile)
    (void)parse_profile_request(r->call.body, r->call.query);
  if (!r || r->call.kind != http_call::route)
    return 0;
  auto body = http_request_body(*r->call.codec, r->call.body, r->call.query);
  if (!body)
    return 0;
  // /generate's batch and n > 1 forms fan out first (http_call_actor), then each part decodes.
  if (r->call.codec->route == "generate" && body->is_object())
    if (auto fan = rlserve::expand_generate_request(*body); fan && !fan->single) {
      for (const auto& one : fan->requests)
        (void)r->call.codec->decode(one);
      return 0;
    }
  (void)r->call.codec->decode(*body);
  return 0;
}
