// The one fail() of net/: every Beast completion handler starts with
// `if (ec) return fail(ec, "read");`. Ends of a connection that are not errors — our own cancel
// (operation_aborted), a websocket closed by the peer, an end of stream, a reset peer — are
// logged at debug level only; anything else as a warning with what failed.
#pragma once

#include <string>

#include <boost/asio/error.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/websocket/error.hpp>

#include "net/log.hpp"

namespace rlserve::net {

inline bool is_normal_end(const boost::beast::error_code& ec) {
  namespace asio = boost::asio;
  return ec == asio::error::operation_aborted || ec == boost::beast::websocket::error::closed ||
         ec == asio::error::eof || ec == boost::beast::http::error::end_of_stream ||
         ec == asio::error::connection_reset || ec == asio::error::broken_pipe ||
         ec == boost::beast::error::timeout;
}

inline void fail(const boost::beast::error_code& ec, const char* what) {
  if (is_normal_end(ec))
    log_debug(std::string(what) + ": " + ec.message());
  else
    log_warn(std::string(what) + ": " + ec.message());
}

} // namespace rlserve::net
