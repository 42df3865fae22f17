// model/safetensors: round trip, and every malformed header the reader must refuse, written by
// hand byte for byte.
#include <boost/test/unit_test.hpp>

#include "tests/support/test_support.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/bf16.hpp"
#include "model/safetensors.hpp"

namespace fs = std::filesystem;
using rlserve::dtype;
using rlserve::HostTensor;
using rlserve::NamedTensor;
using rlserve::model::safetensors_file;
using rlserve::model::write_safetensors;

namespace {

using rlserve::test::temp_dir;
using rlserve::test::why;



std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i)
    s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A file: length prefix (the header's size unless `claimed_len` is given), header, data bytes.
fs::path write_raw(const temp_dir& dir, const std::string& header, std::size_t data_bytes,
                   std::optional<uint64_t> claimed_len = std::nullopt) {
  static int n = 0;
  auto path = dir.path / ("raw" + std::to_string(n++) + ".safetensors");
  std::ofstream out(path, std::ios::binary);
  out << le64(claimed_len.value_or(header.size())) << header << std::string(data_bytes, '\x5a');
  return path;
}

// Opens a hand-written file and expects a failure mentioning every part.
void expect_error(const fs::path& path, std::initializer_list<std::string> parts) {
  auto f = safetensors_file::open(path);
  BOOST_REQUIRE_MESSAGE(!f, "expected " << path << " to be refused");
  BOOST_TEST(f.error().find(path.string()) != std::string::npos, "path missing: " << f.error());
  for (const auto& p : parts)
    BOOST_TEST(f.error().find(p) != std::string::npos, "'" << p << "' not in: " << f.error());
}

template <class T>
NamedTensor make(std::string name, dtype type, std::vector<int64_t> shape, std::vector<T> values) {
  return {std::move(name), HostTensor::from_vector(type, std::move(shape), values)};
}

} // namespace

BOOST_AUTO_TEST_SUITE(safetensors_test)

BOOST_AUTO_TEST_CASE(round_trip_keeps_names_dtypes_shapes_bytes_and_metadata) {
  temp_dir dir;
  std::vector<uint16_t> bf16_values;
  for (float v : {1.0f, -2.5f, 0.1f})
    bf16_values.push_back(rlserve::kernels::float_to_bf16(v));
  std::vector<NamedTensor> tensors{
    make<float>("z.weight", dtype::f32, {2, 3}, {1, 2, 3, 4, 5, 6}),
    make<uint16_t>("a.bf16", dtype::bf16, {3}, bf16_values), // 6 bytes: the next one is unaligned
    make<int32_t>("m.ids", dtype::i32, {2}, {7, -8}),
    make<float>("empty", dtype::f32, {0, 4}, {}),
    make<float>("scalar", dtype::f32, {}, {42.0f}),
  };
  auto path = dir.path / "t.safetensors";
  auto s = write_safetensors(path, tensors, {{"format", "pt"}, {"note", "hi"}});
  BOOST_REQUIRE_MESSAGE(s, why(s));

  // The data section starts 8-byte aligned and tensors are laid out in name order.
  std::ifstream in(path, std::ios::binary);
  char prefix[8];
  in.read(prefix, 8);
  uint64_t header_len = 0;
  std::memcpy(&header_len, prefix, 8);
  BOOST_TEST((8 + header_len) % 8 == 0u);

  auto f = safetensors_file::open(path);
  BOOST_REQUIRE_MESSAGE(f, why(f));
  BOOST_TEST((f->names() ==
              std::vector<std::string>{"a.bf16", "empty", "m.ids", "scalar", "z.weight"}));
  BOOST_TEST(f->metadata().at("format") == "pt");
  BOOST_TEST(f->metadata().at("note") == "hi");
  for (const auto& t : tensors) {
    auto got = f->tensor(t.name);
    BOOST_REQUIRE_MESSAGE(got, why(got));
    BOOST_TEST((got->type == t.tensor.type));
    BOOST_TEST(got->shape == t.tensor.shape);
    BOOST_TEST(got->nbytes == t.tensor.nbytes);
    if (t.tensor.nbytes > 0) // memcmp on an empty tensor's null data is undefined
      BOOST_TEST(std::memcmp(got->data.get(), t.tensor.data.get(), t.tensor.nbytes) == 0);
  }
  auto missing = f->tensor("nope");
  BOOST_REQUIRE(!missing);
  BOOST_TEST(missing.error().find("'nope'") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(tensors_keep_the_mapping_alive) {
  temp_dir dir;
  auto path = dir.path / "t.safetensors";
  std::vector<NamedTensor> tensors{make<float>("w", dtype::f32, {4}, {1, 2, 3, 4})};
  BOOST_REQUIRE(write_safetensors(path, tensors));
  HostTensor t;
  {
    auto f = safetensors_file::open(path);
    BOOST_REQUIRE_MESSAGE(f, why(f));
    t = *f->tensor("w");
  }
  fs::remove(path); // the mapping outlives both the file object and the directory entry
  BOOST_TEST(t.as<float>()[3] == 4.0f);
}

// Served weights aliased the mapped file: rewriting it in place changed them with no committed
// update, and truncating it (what writing a new file to the same path does first) killed the
// process with SIGBUS at the next read. Tensors now own their bytes.
BOOST_AUTO_TEST_CASE(tensors_survive_the_file_being_rewritten_or_truncated) {
  temp_dir dir;
  auto path = dir.path / "t.safetensors";
  std::vector<NamedTensor> tensors{make<float>("w", dtype::f32, {1024}, std::vector<float>(1024, 2.0f))};
  BOOST_REQUIRE(write_safetensors(path, tensors));
  auto f = safetensors_file::open(path);
  BOOST_REQUIRE_MESSAGE(f, why(f));
  auto t = *f->tensor("w");
  {
    // Rewritten in place: same size, other bytes.
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(fs::file_size(path) - 4096));
    std::string zeros(4096, '\0');
    io.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
  }
  BOOST_TEST(t.as<float>()[1023] == 2.0f);
  std::ofstream(path, std::ios::binary | std::ios::trunc).close(); // truncated to 0 bytes
  float sum = 0;
  for (auto x : t.as<float>())
    sum += x;
  BOOST_TEST(sum == 2048.0f);
  BOOST_TEST(f->tensor("w")->as<float>()[0] == 2.0f);
}

// A FIFO (or any non-regular file) is refused at once, without blocking in open().
BOOST_AUTO_TEST_CASE(fifos_and_directories_are_refused_without_blocking) {
  temp_dir dir;
  auto fifo = dir.path / "pipe.safetensors";
  BOOST_REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto f = safetensors_file::open(fifo);
  BOOST_REQUIRE(!f);
  BOOST_TEST(f.error().find("FIFO") != std::string::npos, f.error());
  auto d = safetensors_file::open(dir.path);
  BOOST_REQUIRE(!d);
  BOOST_TEST(d.error().find("directory") != std::string::npos, d.error());
}

BOOST_AUTO_TEST_CASE(file_shorter_than_the_length_prefix) {
  temp_dir dir;
  auto empty = dir.path / "empty.safetensors";
  std::ofstream(empty, std::ios::binary).flush();
  expect_error(empty, {"0 bytes", "8-byte"});
  auto seven = dir.path / "seven.safetensors";
  std::ofstream(seven, std::ios::binary) << "1234567";
  expect_error(seven, {"7 bytes", "8-byte"});
}

BOOST_AUTO_TEST_CASE(header_length_beyond_the_file) {
  temp_dir dir;
  auto path = write_raw(dir, "{}", 0, 1000);
  expect_error(path, {"header length 1000", "file size 10"});
  // A huge length must not overflow into "fits".
  expect_error(write_raw(dir, "{}", 0, ~uint64_t{0}), {"header length 18446744073709551615"});
}

BOOST_AUTO_TEST_CASE(header_not_json_or_not_an_object) {
  temp_dir dir;
  expect_error(write_raw(dir, "{\"a\": ", 0), {"not valid JSON"});
  expect_error(write_raw(dir, "[1, 2]   ", 0), {"JSON array, not an object"});
  expect_error(write_raw(dir, "\"text\"", 0), {"JSON string, not an object"});
}

BOOST_AUTO_TEST_CASE(unknown_dtype) {
  temp_dir dir;
  expect_error(write_raw(dir, R"({"w":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", 2),
               {"tensor 'w'", "unknown dtype 'F8_E4M3'"});
  expect_error(write_raw(dir, R"({"w":{"dtype":7,"shape":[2],"data_offsets":[0,2]}})", 2),
               {"tensor 'w'", "dtype"});
}

BOOST_AUTO_TEST_CASE(negative_or_overflowing_shapes) {
  temp_dir dir;
  expect_error(write_raw(dir, R"({"w":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,8]}})", 8),
               {"tensor 'w'", "shape [2, -1]", "negative"});
  expect_error(
    write_raw(dir,
              R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
    {"tensor 'w'", "[4294967296, 4294967296]", "64 bits"});
  expect_error(write_raw(dir, R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8),
               {"tensor 'w'", "non-integer"});
  expect_error(write_raw(dir, R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", 8),
               {"tensor 'w'", "shape"});
}

BOOST_AUTO_TEST_CASE(data_offsets_must_be_begin_end) {
  temp_dir dir;
  expect_error(write_raw(dir, R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,1,2]}})", 4),
               {"tensor 'w'", "data_offsets must be [begin, end]", "[0,1,2]"});
  expect_error(write_raw(dir, R"({"w":{"dtype":"U8","shape":[2],"data_offsets":"0-2"}})", 4),
               {"tensor 'w'", "data_offsets must be [begin, end]"});
  expect_error(write_raw(dir, R"({"w":{"dtype":"U8","shape":[2]}})", 4),
               {"tensor 'w'", "data_offsets must be [begin, end], got nothing"});
  expect_error(write_raw(dir, R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[-2,0]}})", 4),
               {"tensor 'w'", "non-negative integers"});
  expect_error(write_raw(dir, R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[3,1]}})", 4),
               {"tensor 'w'", "[3, 1]", "begin after end"});
}

BOOST_AUTO_TEST_CASE(end_beyond_the_data_section) {
  temp_dir dir;
  expect_error(write_raw(dir, R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 12),
               {"tensor 'w'", "end 16", "data section of 12 bytes"});
}

BOOST_AUTO_TEST_CASE(byte_count_must_match_the_shape) {
  temp_dir dir;
  expect_error(write_raw(dir, R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}})", 16),
               {"tensor 'w'", "hold 8 bytes", "shape [2, 3] of BF16 needs 12"});
}

BOOST_AUTO_TEST_CASE(overlapping_tensors_are_refused_and_gaps_allowed) {
  temp_dir dir;
  expect_error(write_raw(dir, R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},
                                  "b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})", 8),
               {"'a' [0, 4]", "'b' [2, 6]", "overlap"});
  // b lies inside a, listed first.
  expect_error(write_raw(dir, R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]},
                                  "a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", 8),
               {"overlap"});

  auto gaps = write_raw(dir, R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]},
                                 "a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},
                                 "z":{"dtype":"U8","shape":[0],"data_offsets":[1,1]}})", 8);
  auto f = safetensors_file::open(gaps);
  BOOST_REQUIRE_MESSAGE(f, why(f));
  BOOST_TEST((f->names() == std::vector<std::string>{"a", "z", "b"})); // file order = offsets
}

BOOST_AUTO_TEST_CASE(duplicate_names_are_refused) {
  temp_dir dir;
  expect_error(write_raw(dir, R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},
                                  "w":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", 4),
               {"'w'", "more than once"});
}

BOOST_AUTO_TEST_CASE(metadata_must_be_strings) {
  temp_dir dir;
  expect_error(write_raw(dir, R"({"__metadata__":{"format":"pt","n":3}})", 0),
               {"__metadata__", "'n'", "string"});
  expect_error(write_raw(dir, R"({"__metadata__":["pt"]})", 0), {"__metadata__", "object"});
  auto ok = write_raw(dir, R"({"__metadata__":{"format":"pt"}})", 0);
  auto f = safetensors_file::open(ok);
  BOOST_REQUIRE_MESSAGE(f, why(f));
  BOOST_TEST(f->names().empty());
  BOOST_TEST(f->metadata().at("format") == "pt");
}

BOOST_AUTO_TEST_CASE(writer_refuses_inconsistent_input) {
  temp_dir dir;
  auto path = dir.path / "w.safetensors";
  std::vector<NamedTensor> twice{make<float>("a", dtype::f32, {1}, {1}),
                                 make<float>("a", dtype::f32, {1}, {2})};
  auto s = write_safetensors(path, twice);
  BOOST_REQUIRE(!s);
  BOOST_TEST(s.error().find("'a' given twice") != std::string::npos, s.error());

  std::vector<NamedTensor> short_bytes{make<float>("a", dtype::f32, {3}, {1, 2})};
  s = write_safetensors(path, short_bytes);
  BOOST_REQUIRE(!s);
  BOOST_TEST(s.error().find("tensor 'a' has 8 bytes but shape [3] of float32 needs 12") !=
               std::string::npos, s.error());

  std::vector<NamedTensor> not_utf8{make<float>("w\xff", dtype::f32, {1}, {1})};
  s = write_safetensors(path, not_utf8);
  BOOST_REQUIRE(!s);
  BOOST_TEST(s.error().find("UTF-8") != std::string::npos, s.error());

  std::vector<NamedTensor> reserved{make<float>("__metadata__", dtype::f32, {1}, {1})};
  BOOST_TEST(!write_safetensors(path, reserved));
  BOOST_TEST(!fs::exists(path)); // nothing half-written left behind
}

BOOST_AUTO_TEST_SUITE_END()
