// XXH3-64 on the device (kernels/cuda/xxh3.cu) against the CPU twin and libxxhash: a batch of a
// few thousand buffers of every length class at every start alignment (slices of one arena, as
// tensors of a bigger allocation are), through the raw launch and through the host helper (which
// reorders by length); one buffer of ~200 MB, aligned and not; the helper's refusals; and a
// timing printout (not an assertion) of ~16 GB in ~50,000 tensors of ~300 KB.
// Needs a GPU (CTest label gpu).
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include <xxhash.h>

#include "kernels/xxh3.hpp"
#include "tests/kernels/xxh3_test_util.hpp"
#include "tests/support/device_buffer.cuh"

using namespace rlserve::kernels;
namespace xt = rlserve::xxh3_test;
using rlserve::test::device_buffer;

namespace {

// Buffers placed in one arena: buffer t starts at byte starts[t] (offset t % 8 past an 8-byte
// boundary) and has lengths[t] bytes.
struct arena_layout {
  std::vector<uint64_t> starts;
  std::vector<uint64_t> lengths;
  uint64_t bytes = 0;
};

arena_layout layout_of(const std::vector<uint64_t>& lengths) {
  arena_layout a;
  uint64_t at = 0;
  for (std::size_t t = 0; t < lengths.size(); ++t) {
    at = (at + 7) / 8 * 8 + t % 8;
    a.starts.push_back(at);
    a.lengths.push_back(lengths[t]);
    at += lengths[t];
  }
  a.bytes = at + 8;
  return a;
}

// Index of the first differing digest, or -1; the failure names the buffer, its length and
// alignment and both digests.
int64_t first_mismatch(const std::vector<uint64_t>& device, const std::vector<uint64_t>& expected,
                       const arena_layout& a, const char* what) {
  BOOST_REQUIRE_EQUAL(device.size(), expected.size());
  int64_t first = -1, count = 0;
  for (std::size_t t = 0; t < device.size(); ++t) {
    if (device[t] == expected[t])
      continue;
    if (first < 0)
      first = static_cast<int64_t>(t);
    ++count;
  }
  if (first >= 0)
    BOOST_ERROR(what << ": " << count << " of " << device.size() << " digests differ; first: buffer "
                     << first << ", length " << a.lengths[first] << ", start address % 8 = "
                     << a.starts[first] % 8 << ", device " << xt::hex16(device[first]) << ", CPU twin "
                     << xt::hex16(expected[first]));
  return first;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

} // namespace

BOOST_AUTO_TEST_SUITE(xxh3_gpu_test)

BOOST_AUTO_TEST_CASE(a_batch_of_every_length_class_at_every_alignment_matches_the_twin) {
  rlserve::test::require_device();
  // Each class length 8 times (so at each of the 8 alignments, see layout_of), then random
  // lengths up to 40 KB: ~3,000 buffers.
  std::vector<uint64_t> lengths;
  for (uint64_t n : xt::class_lengths())
    for (int k = 0; k < 8; ++k)
      lengths.push_back(n);
  std::mt19937_64 rng(11);
  while (lengths.size() < 3000)
    lengths.push_back(rng() % (lengths.size() % 2 ? 300 : 40000));
  const arena_layout a = layout_of(lengths);
  const auto host = xt::random_bytes(a.bytes, 12);

  std::vector<uint64_t> expected(lengths.size());
  for (std::size_t t = 0; t < lengths.size(); ++t) {
    expected[t] = xxh3_64(host.data() + a.starts[t], a.lengths[t]);
    BOOST_REQUIRE_EQUAL(expected[t], XXH3_64bits(host.data() + a.starts[t], a.lengths[t])); // twin sane
  }

  device_buffer<std::byte> arena(host);
  std::vector<const std::byte*> pointers(lengths.size());
  std::vector<xxh3_device_span> spans(lengths.size());
  for (std::size_t t = 0; t < lengths.size(); ++t) {
    pointers[t] = arena.get() + a.starts[t];
    spans[t] = {pointers[t], a.lengths[t]};
  }

  // The raw launch, tables in device memory (digests poisoned first).
  device_buffer<const std::byte*> d_pointers(pointers);
  device_buffer<uint64_t> d_lengths(a.lengths), d_digests(lengths.size());
  const xxh3_batch_args args{d_pointers.get(), d_lengths.get(), d_digests.get(),
                             static_cast<int64_t>(lengths.size())};
  BOOST_REQUIRE(xxh3_batch_launch(args, nullptr) == kernel_status::ok);
  BOOST_TEST(first_mismatch(d_digests.download(), expected, a, "xxh3_batch_launch") == -1);

  // The host helper (sorts by length, un-sorts the digests).
  auto digests = xxh3_device_digests(spans, nullptr);
  BOOST_REQUIRE_MESSAGE(digests, digests.error());
  BOOST_TEST(first_mismatch(*digests, expected, a, "xxh3_device_digests") == -1);
}

BOOST_AUTO_TEST_CASE(two_hundred_megabytes_match_the_twin_and_libxxhash) {
  rlserve::test::require_device();
  const uint64_t n = (uint64_t{200} << 20) + 13;
  const auto host = xt::random_bytes(n, 21);
  device_buffer<std::byte> d(host);
  for (uint64_t offset : {uint64_t{0}, uint64_t{3}}) {
    const uint64_t len = n - offset;
    const uint64_t twin = xxh3_64(host.data() + offset, len);
    BOOST_REQUIRE_EQUAL(twin, XXH3_64bits(host.data() + offset, len));
    const auto start = std::chrono::steady_clock::now();
    auto digests = xxh3_device_digests({{d.get() + offset, len}}, nullptr);
    const double s = seconds_since(start);
    BOOST_REQUIRE_MESSAGE(digests, digests.error());
    BOOST_TEST((*digests)[0] == twin, "offset " << offset << ", length " << len << ": device "
                                                << xt::hex16((*digests)[0]) << ", CPU twin " << xt::hex16(twin));
    BOOST_TEST_MESSAGE("one buffer of " << len / 1e6 << " MB at offset " << offset << ": " << s * 1e3
                                        << " ms (" << len / s / 1e9 << " GB/s, one warp)");
  }
}

BOOST_AUTO_TEST_CASE(the_helper_refuses_a_null_buffer_and_accepts_an_empty_batch) {
  rlserve::test::require_device();
  auto empty = xxh3_device_digests({}, nullptr);
  BOOST_REQUIRE_MESSAGE(empty, empty.error());
  BOOST_TEST(empty->empty());
  auto zero = xxh3_device_digests({{nullptr, 0}}, nullptr);
  BOOST_REQUIRE_MESSAGE(zero, zero.error());
  BOOST_TEST((*zero)[0] == 0x2d06800538d394c2ull);
  auto bad = xxh3_device_digests({{nullptr, 0}, {nullptr, 10}}, nullptr);
  BOOST_REQUIRE(!bad);
  BOOST_TEST(bad.error() == "XXH3 on the device: buffer 1 has 10 bytes but a null address");
  BOOST_CHECK(xxh3_batch_launch({nullptr, nullptr, nullptr, 3}, nullptr) == kernel_status::invalid_problem);
  BOOST_CHECK(xxh3_batch_launch({nullptr, nullptr, nullptr, 0}, nullptr) == kernel_status::ok);
}

// ~16 GB in ~50,000 tensors of 250-350 KB (a Qwen3-30B-A3B-sized model's experts), timed with
// events; a sample of them is checked against the twin.
BOOST_AUTO_TEST_CASE(timing_of_a_model_sized_batch) {
  rlserve::test::require_device();
  constexpr int64_t k_tensors = 50000;
  std::mt19937_64 rng(31);
  std::vector<uint64_t> lengths(k_tensors), starts(k_tensors);
  uint64_t total = 0;
  for (int64_t t = 0; t < k_tensors; ++t) {
    lengths[t] = 250000 + rng() % 100000;
    starts[t] = total;
    total += (lengths[t] + 255) / 256 * 256;
  }
  std::byte* arena = nullptr;
  BOOST_REQUIRE_MESSAGE(cudaMalloc(&arena, total) == cudaSuccess, "cannot allocate " << total / 1e9 << " GB");
  // Bytes that vary: a byte pattern from the index, written by cudaMemset in 64 MB strips.
  for (uint64_t at = 0, strip = 0; at < total; at += uint64_t{64} << 20, ++strip)
    BOOST_REQUIRE(cudaMemset(arena + at, static_cast<int>(strip * 37 % 251),
                             std::min<uint64_t>(uint64_t{64} << 20, total - at)) == cudaSuccess);
  std::vector<xxh3_device_span> spans(k_tensors);
  std::vector<const std::byte*> pointers(k_tensors);
  for (int64_t t = 0; t < k_tensors; ++t) {
    pointers[t] = arena + starts[t];
    spans[t] = {pointers[t], lengths[t]};
  }
  device_buffer<const std::byte*> d_pointers(pointers);
  device_buffer<uint64_t> d_lengths(lengths), d_digests(k_tensors);
  const xxh3_batch_args args{d_pointers.get(), d_lengths.get(), d_digests.get(), k_tensors};
  cudaEvent_t begin, end;
  cudaEventCreate(&begin);
  cudaEventCreate(&end);
  BOOST_REQUIRE(xxh3_batch_launch(args, nullptr) == kernel_status::ok); // warm-up
  BOOST_REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  constexpr int k_runs = 3;
  cudaEventRecord(begin);
  for (int r = 0; r < k_runs; ++r)
    BOOST_REQUIRE(xxh3_batch_launch(args, nullptr) == kernel_status::ok);
  cudaEventRecord(end);
  BOOST_REQUIRE(cudaEventSynchronize(end) == cudaSuccess);
  float ms = 0;
  cudaEventElapsedTime(&ms, begin, end);
  ms /= k_runs;
  BOOST_TEST_MESSAGE("xxh3_batch_launch: " << k_tensors << " tensors, " << total / 1e9 << " GB in " << ms
                                           << " ms (" << total / (ms * 1e-3) / 1e9 << " GB/s)");
  const auto start = std::chrono::steady_clock::now();
  auto digests = xxh3_device_digests(spans, nullptr);
  BOOST_REQUIRE_MESSAGE(digests, digests.error());
  BOOST_TEST_MESSAGE("xxh3_device_digests (tables up, digests down, synchronized): "
                     << seconds_since(start) * 1e3 << " ms");
  BOOST_TEST(*digests == d_digests.download());

  std::vector<std::byte> host;
  for (int64_t t = 0; t < k_tensors; t += 4999) {
    host.resize(lengths[t]);
    BOOST_REQUIRE(cudaMemcpy(host.data(), pointers[t], lengths[t], cudaMemcpyDeviceToHost) == cudaSuccess);
    const uint64_t twin = xxh3_64(host.data(), lengths[t]);
    BOOST_TEST((*digests)[t] == twin, "tensor " << t << ", length " << lengths[t] << ": device "
                                                << xt::hex16((*digests)[t]) << ", CPU twin " << xt::hex16(twin));
  }
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  cudaFree(arena);
}

BOOST_AUTO_TEST_SUITE_END()
