// What the first input byte of json_codec_fuzz selects (the rest is JSON text), shared with
// write_json_seeds so the committed seeds keep their meaning:
//   byte % count():  [0, 2 * routes)  route (byte / 2) of codec_registry's table; even: the
//                                     request decoder, odd: the reply decoder
//                    [2 * routes, …)  a message part with its own decoder (k_part_names)
// New routes and parts are fuzzed without a change here; appending keeps old seeds valid
// except that the parts move when a route is added (write_json_seeds rewrites them).
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

#include "messages/codec_registry.hpp"

namespace rlserve_fuzz {

// The parts, in selector order: json_codec_fuzz.cpp's part_decoders follows this list.
inline constexpr std::array<std::string_view, 9> k_part_names{
  "SamplingParams", "FinishReason",    "TopLogprob",        "HostTensor",  "NamedTensor",
  "DeviceTensorRef", "NamedDeviceTensor", "ParallelismInfo", "ChecksumInfo"};

inline std::size_t route_count() { return rlserve::all_codecs().size(); }
inline std::size_t selector_count() { return 2 * route_count() + k_part_names.size(); }

} // namespace rlserve_fuzz
