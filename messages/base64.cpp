#include "messages/base64.hpp"

#include <array>

namespace rlserve {

namespace {

constexpr std::string_view k_alphabet =
  "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr uint8_t k_invalid = 0xff;

// Character -> 6-bit value, k_invalid for anything outside the alphabet (including '=', which
// the decoder handles itself).
constexpr std::array<uint8_t, 256> make_decode_table() {
  std::array<uint8_t, 256> t{};
  for (auto& v : t)
    v = k_invalid;
  for (std::size_t i = 0; i < k_alphabet.size(); ++i)
    t[static_cast<uint8_t>(k_alphabet[i])] = static_cast<uint8_t>(i);
  return t;
}

constexpr auto k_decode = make_decode_table();

// Printable characters are shown as themselves, anything else by code, so an error message
// never carries a raw control byte.
std::string describe_char(char c) {
  auto u = static_cast<unsigned char>(c);
  if (u >= 0x20 && u < 0x7f)
    return std::string("'") + c + "'";
  static constexpr char digits[] = "0123456789abcdef";
  return std::string("byte 0x") + digits[u >> 4] + digits[u & 15];
}

} // namespace

int hex_digit_value(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

std::string base64_encode(std::span<const std::byte> bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  auto byte_at = [&](std::size_t k) { return static_cast<uint32_t>(bytes[k]); };
  for (; i + 3 <= bytes.size(); i += 3) {
    uint32_t v = byte_at(i) << 16 | byte_at(i + 1) << 8 | byte_at(i + 2);
    out += k_alphabet[v >> 18 & 63];
    out += k_alphabet[v >> 12 & 63];
    out += k_alphabet[v >> 6 & 63];
    out += k_alphabet[v & 63];
  }
  if (auto rest = bytes.size() - i; rest > 0) {
    uint32_t v = byte_at(i) << 16 | (rest == 2 ? byte_at(i + 1) << 8 : 0);
    out += k_alphabet[v >> 18 & 63];
    out += k_alphabet[v >> 12 & 63];
    out += rest == 2 ? k_alphabet[v >> 6 & 63] : '=';
    out += '=';
  }
  return out;
}

expected<std::size_t> base64_decoded_size(std::string_view text) {
  if (text.size() % 4 != 0)
    return fail("base64 length " + std::to_string(text.size()) + " is not a multiple of 4");
  std::size_t padding = 0;
  if (!text.empty() && text.back() == '=')
    padding = text.size() >= 2 && text[text.size() - 2] == '=' ? 2 : 1;
  return text.size() / 4 * 3 - padding;
}

expected<std::vector<std::byte>> base64_decode(std::string_view text) {
  auto size = base64_decoded_size(text);
  if (!size)
    return std::move(size).take_failure();
  // Padding may only fill the last one or two characters of the last quantum; the size above
  // counted it, so any '=' before that point is misplaced.
  const std::size_t data_chars = text.size() - (text.size() / 4 * 3 - *size);
  std::vector<std::byte> out;
  out.reserve(*size);
  uint32_t acc = 0;
  int bits = 0;
  for (std::size_t i = 0; i < data_chars; ++i) {
    auto c = text[i];
    auto v = k_decode[static_cast<unsigned char>(c)];
    if (v == k_invalid) {
      if (c == '=')
        return fail("misplaced '=' padding at offset " + std::to_string(i));
      return fail("invalid base64 character " + describe_char(c) + " at offset " +
                  std::to_string(i));
    }
    acc = acc << 6 | v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<std::byte>(acc >> bits & 0xff));
    }
  }
  // Bits left over under the padding are ignored (RFC 4648 §3.5 lets decoders accept them).
  return out;
}

std::string hex_encode(std::span<const uint8_t> bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (auto b : bytes) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

expected<std::vector<uint8_t>> hex_decode(std::string_view text) {
  if (text.size() % 2 != 0)
    return fail("odd hex length " + std::to_string(text.size()));
  std::vector<uint8_t> out;
  out.reserve(text.size() / 2);
  for (std::size_t i = 0; i < text.size(); i += 2) {
    int hi = hex_digit_value(text[i]);
    int lo = hex_digit_value(text[i + 1]);
    if (hi < 0 || lo < 0) {
      auto at = hi < 0 ? i : i + 1;
      return fail("invalid hex digit " + describe_char(text[at]) + " at offset " +
                  std::to_string(at));
    }
    out.push_back(static_cast<uint8_t>(hi << 4 | lo));
  }
  return out;
}

} // namespace rlserve
