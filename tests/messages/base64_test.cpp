// messages/base64.hpp: RFC 4648 test vectors, every byte value, strictness with offsets, and
// hex both ways.
#include <boost/test/unit_test.hpp>

#include <string>
#include <vector>

#include "messages/base64.hpp"

using namespace rlserve;

namespace {

std::vector<std::byte> bytes_of(std::string_view s) {
  std::vector<std::byte> out;
  for (char c : s)
    out.push_back(static_cast<std::byte>(c));
  return out;
}

template <class T>
std::string error_text(const expected<T>& x) {
  return x.has_value() ? std::string() : x.error();
}

} // namespace

BOOST_AUTO_TEST_SUITE(base64_test)

// RFC 4648 §10.
BOOST_AUTO_TEST_CASE(rfc_vectors) {
  const std::pair<const char*, const char*> vectors[] = {
    {"", ""},         {"f", "Zg=="},        {"fo", "Zm8="},         {"foo", "Zm9v"},
    {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="}, {"foobar", "Zm9vYmFy"},
  };
  for (auto [plain, encoded] : vectors) {
    BOOST_TEST(base64_encode(bytes_of(plain)) == encoded);
    auto back = base64_decode(encoded);
    BOOST_TEST_REQUIRE(back.has_value(), error_text(back));
    BOOST_TEST((*back == bytes_of(plain)), encoded);
    BOOST_TEST(base64_decoded_size(encoded).value() == std::string_view(plain).size());
  }
}

BOOST_AUTO_TEST_CASE(every_byte_value_and_length) {
  std::vector<std::byte> all;
  for (int i = 0; i < 256; ++i)
    all.push_back(static_cast<std::byte>(i));
  for (std::size_t n = 0; n <= all.size(); n += (n < 8 ? 1 : 37)) {
    std::vector<std::byte> part(all.begin(), all.begin() + n);
    auto text = base64_encode(part);
    BOOST_TEST(text.size() % 4 == 0u);
    auto back = base64_decode(text);
    BOOST_TEST_REQUIRE(back.has_value(), error_text(back));
    BOOST_TEST((*back == part), "length " << n);
  }
}

BOOST_AUTO_TEST_CASE(strict_with_offsets) {
  BOOST_TEST(error_text(base64_decode("Zm9")) == "base64 length 3 is not a multiple of 4");
  BOOST_TEST(error_text(base64_decode("Zm9v Zg==")) == "base64 length 9 is not a multiple of 4");
  BOOST_TEST(error_text(base64_decode("Zm9vZ-==")) == "invalid base64 character '-' at offset 5");
  BOOST_TEST(error_text(base64_decode("Zm9vZ_==")) == "invalid base64 character '_' at offset 5");
  BOOST_TEST(error_text(base64_decode("Zm\tv")) == "invalid base64 character byte 0x09 at offset 2");
  BOOST_TEST(error_text(base64_decode("Z=9v")) == "misplaced '=' padding at offset 1");
  BOOST_TEST(error_text(base64_decode("Zg==Zg==")) == "misplaced '=' padding at offset 2");
  BOOST_TEST(error_text(base64_decode("====")) == "misplaced '=' padding at offset 0");
  BOOST_TEST(error_text(base64_decode("Z===")) == "misplaced '=' padding at offset 1");
}

BOOST_AUTO_TEST_CASE(hex_both_ways) {
  std::vector<uint8_t> data{0x00, 0x01, 0xab, 0xff};
  BOOST_TEST(hex_encode(data) == "0001abff");
  BOOST_TEST((hex_decode("0001ABff").value() == data));
  BOOST_TEST(hex_decode("").value().empty());
  BOOST_TEST(error_text(hex_decode("abc")) == "odd hex length 3");
  BOOST_TEST(error_text(hex_decode("0g")) == "invalid hex digit 'g' at offset 1");
  BOOST_TEST(error_text(hex_decode("g0")) == "invalid hex digit 'g' at offset 0");
}

BOOST_AUTO_TEST_SUITE_END()
