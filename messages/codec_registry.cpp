#include "messages/codec_registry.hpp"

#include <array>

#include <nlohmann/json.hpp>

#include "caf/actor.hpp"
#include "caf/actor_system.hpp"
#include "caf/deep_to_string.hpp"
#include "caf/event_based_actor.hpp"
#include "caf/make_message.hpp"
#include "caf/message.hpp"
#include "messages/enums.hpp"
#include "messages/json_codec.hpp"
#include "messages/operations.hpp"
#include "messages/type_ids.hpp"

namespace rlserve {

namespace {

using nlohmann::json;

// "rlserve::GenerateReqInput" -> "GenerateReqInput": the name from the type-ID block, so a
// renamed struct cannot leave a stale string here.
template <class T>
constexpr std::string_view short_name() {
  std::string_view name = caf::type_name<T>::value;
  if (auto pos = name.rfind("::"); pos != std::string_view::npos)
    name.remove_prefix(pos + 2);
  return name;
}

template <class T>
expected<caf::message> decode_as(const json& body) {
  auto x = from_json<T>(body);
  if (!x)
    return std::move(x).take_failure();
  return caf::make_message(std::move(*x));
}

template <class T>
expected<json> encode_as(const caf::message& msg) {
  if (msg.match_elements<T>())
    return to_json(msg.get_as<T>(0));
  return fail("expected a message holding one " + std::string(short_name<T>()) + ", got " +
              caf::to_string(msg));
}

template <class In, class Out>
void ask_as(caf::event_based_actor* self, const caf::actor& dest, caf::message request,
            json_reply_callback done) {
  if (!request.match_elements<In>()) {
    done(fail("expected a message holding one " + std::string(short_name<In>()) + ", got " +
              caf::to_string(request)));
    return;
  }
  // The front door takes generate together with a result sink; none here (no streaming).
  if constexpr (std::is_same_v<In, GenerateReqInput>)
    request = caf::make_message(std::move(request.get_mutable_as<In>(0)), caf::actor{});
  self->request(dest, caf::infinite, std::move(request))
    .then([done](Out& out) { done(to_json(out)); },
          [self, done](caf::error& err) {
            done(fail("the engine did not answer: " + self->system().render(err)));
          });
}

template <class In, class Out>
constexpr codec_entry entry(std::string_view route, auth_level auth) {
  return codec_entry{route,           auth,          short_name<In>(), short_name<Out>(),
                     &decode_as<In>,  &encode_as<Out>, &encode_as<In>,   &decode_as<Out>,
                     &ask_as<In, Out>};
}

constexpr auto normal = auth_level::normal;
constexpr auto admin = auth_level::admin;

// generate, then one entry per line of messages/operations.hpp, whose auth column is the
// security boundary. constexpr: the table is built at compile time, so find_codec works even
// from another translation unit's static initialisation.
#define RLSERVE_CODEC_ENTRY(route, method, In, Out, auth, role) entry<In, Out>(#route, auth),
constexpr std::array k_codecs{
  entry<GenerateReqInput, GenerateReqOutput>("generate", normal),
  RLSERVE_CONTROL_OPERATIONS(RLSERVE_CODEC_ENTRY, RLSERVE_OP_NOTHING)
  RLSERVE_WEIGHT_OPERATIONS(RLSERVE_CODEC_ENTRY, RLSERVE_OP_NOTHING)
};
#undef RLSERVE_CODEC_ENTRY

} // namespace

std::string to_string(auth_level x) {
  switch (x) {
    case auth_level::normal: return "normal";
    case auth_level::admin: return "admin";
  }
  return "<invalid " + std::to_string(static_cast<int>(x)) + ">";
}

const codec_entry* find_codec(std::string_view route) {
  for (const auto& c : k_codecs)
    if (c.route == route)
      return &c;
  return nullptr;
}

std::span<const codec_entry> all_codecs() {
  return k_codecs;
}

} // namespace rlserve
