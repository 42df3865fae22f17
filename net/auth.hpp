// Who may call what: SGLang's rules (its utils/auth.py), with every route that changes weights,
// pauses, flushes, aborts or reads weights at its admin level (docs/protocol.md has the table).
//
//   api_keys keys{.api_key = "k", .admin_api_key = "a"};
//   auto tokens = tokens_from_headers(authorization_header, x_api_key_header);
//   if (authorize(keys, route_auth::admin, tokens) != auth_result::ok) ...401...
//
// Levels:
//   exempt  (/health, /health_generate, /metrics): always open, as SGLang's, for liveness probes,
//           load balancers, Prometheus and the trainers' health monitors, which send no key.
//   normal  (generate, get_server_info, /model_info): open when no api_key is configured; else
//           the api_key, or the admin key (an admin may do what a user may; SGLang refuses it).
//   admin   (every route that changes, reads or checks weights, pauses, resumes, flushes or
//           aborts): the admin_api_key when one is configured, and then never the api_key;
//           with only an api_key configured, the api_key (SGLang's ADMIN_OPTIONAL: trainers
//           that know one key call admin routes with it). With no key at all everything is
//           open (the default bind is loopback).
// A token is presented as `Authorization: Bearer <t>` and/or `x-api-key: <t>`; it matches when
// either header carries the expected key, so one client can present both keys at once.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "messages/codec_registry.hpp"

namespace rlserve::net {

struct api_keys {
  std::string api_key;       // empty: not configured
  std::string admin_api_key; // empty: not configured
  bool any() const { return !api_key.empty() || !admin_api_key.empty(); }
};

enum class route_auth { exempt, normal, admin };

route_auth to_route_auth(auth_level level);

// The tokens a request presents: the bearer token of `authorization` (scheme compared
// case-insensitively) and the whole of `x_api_key`. Empty headers give no token.
std::vector<std::string> tokens_from_headers(std::string_view authorization,
                                             std::string_view x_api_key);

// unauthorized: a key is needed and none presented matches (HTTP 401).
enum class auth_result { ok, unauthorized };

auth_result authorize(const api_keys& keys, route_auth level, const std::vector<std::string>& tokens);

// Whether a websocket upgrade may proceed: the tokens pass at least one level (a client with no
// token still connects when generation is open, i.e. when no api_key is configured; every
// message is then checked against its own route's level).
bool may_connect(const api_keys& keys, const std::vector<std::string>& tokens);

// Equality in time that depends only on the lengths, never on where the strings differ.
bool constant_time_equal(std::string_view a, std::string_view b);

// The sentence that goes with a refusal (never containing a key).
std::string refusal_message(const api_keys& keys, route_auth level);

} // namespace rlserve::net
