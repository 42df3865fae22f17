// Binary-to-text encodings for bytes inside JSON: base64 (RFC 4648 §4, standard alphabet, with
// '=' padding: what Python's base64.b64encode writes) for tensor payloads, and hex for short
// binary ids (ncclUniqueId, cudaIpcMemHandle_t).
//
// The decoders are strict: no whitespace, no line breaks, no URL-safe alphabet, no missing
// padding. A payload that is not exactly what an encoder writes is more likely corrupt than
// creative, and an error that names the offset beats a tensor with shifted bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "messages/expected.hpp"

namespace rlserve {

std::string base64_encode(std::span<const std::byte> bytes);

// The number of bytes `text` decodes to, from its length and padding alone (no validation of
// the characters), so a caller can reject a payload of the wrong size before decoding it.
// Errors: the length is not a multiple of 4.
expected<std::size_t> base64_decoded_size(std::string_view text);

// Errors name the offset: `invalid base64 character '%' at offset 12`,
// `base64 length 7 is not a multiple of 4`, `misplaced '=' padding at offset 4`.
expected<std::vector<std::byte>> base64_decode(std::string_view text);

// The value of one hex digit (either case), or -1.
int hex_digit_value(char c);

// Lowercase hex, two digits per byte.
std::string hex_encode(std::span<const uint8_t> bytes);

// Accepts upper- and lowercase digits. Errors: `odd hex length 5`,
// `invalid hex digit 'g' at offset 3`.
expected<std::vector<uint8_t>> hex_decode(std::string_view text);

} // namespace rlserve
