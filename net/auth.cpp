#include "net/auth.hpp"

#include <cctype>
#include <cstdint>

namespace rlserve::net {

route_auth to_route_auth(auth_level level) {
  switch (level) {
    case auth_level::normal: return route_auth::normal;
    case auth_level::admin: return route_auth::admin;
  }
  return route_auth::admin; // an unknown level is the strictest one
}

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size())
    return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

// Any of `tokens` equals `key`. Every token is compared, matched or not.
bool presents(const std::vector<std::string>& tokens, const std::string& key) {
  bool found = false;
  for (const auto& t : tokens)
    found |= constant_time_equal(t, key);
  return found;
}

} // namespace

std::vector<std::string> tokens_from_headers(std::string_view authorization,
                                             std::string_view x_api_key) {
  std::vector<std::string> out;
  auto auth = trim(authorization);
  if (auth.size() > 7 && iequals(auth.substr(0, 7), "bearer ")) {
    auto token = trim(auth.substr(7));
    if (!token.empty())
      out.emplace_back(token);
  }
  auto x = trim(x_api_key);
  if (!x.empty())
    out.emplace_back(x);
  return out;
}

auth_result authorize(const api_keys& keys, route_auth level, const std::vector<std::string>& tokens) {
  switch (level) {
    case route_auth::exempt: return auth_result::ok;
    case route_auth::normal: {
      if (keys.api_key.empty())
        return auth_result::ok;
      // Both compared, always, so the time does not say which key matched.
      bool user = presents(tokens, keys.api_key);
      bool admin = !keys.admin_api_key.empty() && presents(tokens, keys.admin_api_key);
      return user || admin ? auth_result::ok : auth_result::unauthorized;
    }
    case route_auth::admin:
      // With an admin key configured, only it (the normal key never stands in for it); with
      // only the normal key, that key, as SGLang does, so a trainer that knows one key (miles'
      // start-up loop on /flush_cache) works unchanged.
      if (!keys.admin_api_key.empty())
        return presents(tokens, keys.admin_api_key) ? auth_result::ok : auth_result::unauthorized;
      if (!keys.api_key.empty())
        return presents(tokens, keys.api_key) ? auth_result::ok : auth_result::unauthorized;
      return auth_result::ok;
  }
  return auth_result::unauthorized;
}

std::string refusal_message(const api_keys& keys, route_auth level) {
  if (level == route_auth::admin && !keys.admin_api_key.empty())
    return "this route needs the admin API key, presented as \"Authorization: Bearer <key>\" or "
           "\"x-api-key: <key>\" (on a websocket: when connecting); the normal API key is not "
           "accepted";
  return "this route needs the API key, presented as \"Authorization: Bearer <key>\" or "
         "\"x-api-key: <key>\" (on a websocket: when connecting)";
}

bool may_connect(const api_keys& keys, const std::vector<std::string>& tokens) {
  return authorize(keys, route_auth::normal, tokens) == auth_result::ok ||
         authorize(keys, route_auth::admin, tokens) == auth_result::ok;
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  // Walk the longer length so the time depends on the lengths only; fold the length difference
  // into the result so a prefix never matches.
  std::size_t n = a.size() > b.size() ? a.size() : b.size();
  volatile uint8_t diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < n; ++i) {
    uint8_t x = i < a.size() ? static_cast<uint8_t>(a[i]) : 0;
    uint8_t y = i < b.size() ? static_cast<uint8_t>(b[i]) : 0;
    diff = diff | static_cast<uint8_t>(x ^ y);
  }
  return diff == 0;
}

} // namespace rlserve::net
