// Every JSON decoder of messages/ on untrusted text: parse_json, then the request or reply
// decoder of one codec_registry route, or the decoder of one message part, chosen by the first
// byte (json_codec_selectors.hpp). Besides "no crash, no sanitizer report, no exception", a
// value that decodes must survive encode -> decode -> encode with the same JSON text: a body
// the engine accepts and writes back differently would break clients that resend it.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "caf/message.hpp"
#include "fuzz/fuzz_support.hpp"
#include "fuzz/json_codec_selectors.hpp"
#include "messages/json_codec.hpp"

namespace {

using namespace rlserve;
using nlohmann::json;
using rlserve_fuzz::broken;

std::string text_of(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// decode -> encode -> decode -> encode through one registry direction.
void check_route(const std::string& what, const json& body,
                 expected<caf::message> (*decode)(const json&),
                 expected<json> (*encode)(const caf::message&)) {
  auto msg = decode(body);
  if (!msg)
    return;
  auto once = encode(*msg);
  if (!once)
    broken(what + ": decoded but does not encode: " + once.error());
  auto again = decode(*once);
  if (!again)
    broken(what + ": its own encoding " + text_of(*once) + " does not decode: " + again.error());
  auto twice = encode(*again);
  if (!twice || text_of(*twice) != text_of(*once))
    broken(what + ": encoding changed on the round trip: " + text_of(*once) + " -> " +
           (twice ? text_of(*twice) : twice.error()));
}

template <class T>
void check_part(const json& body) {
  auto x = from_json<T>(body);
  if (!x)
    return;
  json once = to_json(*x);
  auto again = from_json<T>(once);
  if (!again)
    broken("part: its own encoding " + text_of(once) + " does not decode: " + again.error());
  if (text_of(to_json(*again)) != text_of(once))
    broken("part: encoding changed on the round trip: " + text_of(once) + " -> " +
           text_of(to_json(*again)));
}

// In the order of rlserve_fuzz::k_part_names.
constexpr void (*part_decoders[])(const json&) = {
  &check_part<SamplingParams>,  &check_part<FinishReason>,      &check_part<TopLogprob>,
  &check_part<HostTensor>,      &check_part<NamedTensor>,       &check_part<DeviceTensorRef>,
  &check_part<NamedDeviceTensor>, &check_part<ParallelismInfo>, &check_part<ChecksumInfo>};
static_assert(std::size(part_decoders) == rlserve_fuzz::k_part_names.size());

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size < 1)
    return 0;
  const std::size_t selector = data[0] % rlserve_fuzz::selector_count();
  auto j = parse_json(rlserve_fuzz::as_text(data + 1, size - 1));
  if (!j)
    return 0;
  const std::size_t routes = rlserve_fuzz::route_count();
  if (selector < 2 * routes) {
    const codec_entry& c = all_codecs()[selector / 2];
    if (selector % 2 == 0)
      check_route(std::string(c.route) + " request", *j, c.decode, c.encode_request);
    else
      check_route(std::string(c.route) + " reply", *j, c.decode_reply, c.encode_reply);
  } else {
    part_decoders[selector - 2 * routes](*j);
  }
  return 0;
}
