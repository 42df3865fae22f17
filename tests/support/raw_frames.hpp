// Websocket payloads written by hand for tests that send what no client library would: a text
// frame's bytes as they are, and a binary frame around any header text (malformed ones too),
// with the 4-byte little-endian header length of net/protocol.hpp's layout and no payload.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace rlserve::test {

inline std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

inline std::vector<std::byte> binary_frame_with_header(const std::string& header) {
  std::vector<std::byte> f(4 + header.size());
  const auto h = static_cast<uint32_t>(header.size());
  for (int i = 0; i < 4; ++i)
    f[static_cast<std::size_t>(i)] = static_cast<std::byte>((h >> (8 * i)) & 0xff);
  std::memcpy(f.data() + 4, header.data(), header.size());
  return f;
}

} // namespace rlserve::test
