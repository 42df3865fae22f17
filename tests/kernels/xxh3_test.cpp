// XXH3-64: the CPU twin (kernels/cpu/xxh3.cpp) against libxxhash's XXH3_64bits on every length
// class and its boundaries, every start alignment, random lengths and seeds and multi-megabyte
// inputs; published digests; the committed vectors file the Python test checks against the
// `xxhash` package; the batch API's argument errors; and the CUDA kernel's warp schedule
// (kernels/xxh3_warp.hpp) run on the host with 32 threads as the lanes.
#include <boost/test/unit_test.hpp>

#include <array>
#include <barrier>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include <xxhash.h>

#include "kernels/xxh3.hpp"
#include "kernels/xxh3_warp.hpp"
#include "tests/kernels/xxh3_test_util.hpp"

using namespace rlserve::kernels;
namespace xt = rlserve::xxh3_test;

namespace {

uint64_t libxxhash(const std::byte* p, uint64_t n) { return XXH3_64bits(p, n); }

// 32 host threads standing in for a warp's lanes; a shuffle is a write to a shared slot and two
// barriers. A shuffle that not every lane reaches would hang here as it would on the device.
struct host_warp_shared {
  std::barrier<> barrier{k_xxh3_warp_size};
  std::array<uint64_t, k_xxh3_warp_size> slots{};
};

struct host_warp {
  host_warp_shared* shared;
  int lane_id;
  int lane() const { return lane_id; }
  uint64_t shfl(uint64_t v, int src_lane) {
    shared->slots[lane_id] = v;
    shared->barrier.arrive_and_wait();
    const uint64_t r = shared->slots[src_lane];
    shared->barrier.arrive_and_wait();
    return r;
  }
  uint64_t shfl_xor(uint64_t v, int lane_mask) { return shfl(v, lane_id ^ lane_mask); }
};

// xxh3_64_warp on 32 threads; every lane must return the same digest.
uint64_t warp_on_host(const std::byte* p, uint64_t n) {
  host_warp_shared shared;
  std::array<uint64_t, k_xxh3_warp_size> out{};
  std::vector<std::thread> lanes;
  for (int lane = 0; lane < k_xxh3_warp_size; ++lane)
    lanes.emplace_back([&, lane] {
      host_warp warp{&shared, lane};
      out[lane] = xxh3_64_warp(warp, p, n, k_xxh3_default_secret);
    });
  for (auto& t : lanes)
    t.join();
  for (int lane = 1; lane < k_xxh3_warp_size; ++lane)
    BOOST_TEST_REQUIRE(out[lane] == out[0], "length " << n << ": lane " << lane << " returned "
                                                      << xt::hex16(out[lane]) << ", lane 0 "
                                                      << xt::hex16(out[0]));
  return out[0];
}

std::string vectors_path() {
  const char* root = std::getenv("RLSERVE_SOURCE_DIR");
  return std::string(root != nullptr ? root : ".") + "/tests/data/xxh3_vectors.tsv";
}

} // namespace

BOOST_AUTO_TEST_SUITE(xxh3_test)

BOOST_AUTO_TEST_CASE(published_digests) {
  BOOST_TEST(xxh3_64(nullptr, 0) == 0x2d06800538d394c2ull);
  // From the Python xxhash package (xxh3_64_hexdigest).
  BOOST_TEST(xxh3_64("a", 1) == 0xe6c632b61e964e1full);
  BOOST_TEST(xxh3_64("abc", 3) == 0x78af5f94892f3950ull);
  const std::string fox = "The quick brown fox jumps over the lazy dog";
  BOOST_TEST(xxh3_64(fox.data(), fox.size()) == 0xce7d19a5418fb365ull);
}

BOOST_AUTO_TEST_CASE(every_length_up_to_five_blocks_matches_libxxhash) {
  const auto data = xt::random_bytes(5 * k_xxh3_block_len + 200, 1);
  int mismatches = 0;
  for (uint64_t n = 0; n <= data.size() && mismatches < 5; ++n) {
    const uint64_t mine = xxh3_64(data.data(), n), theirs = libxxhash(data.data(), n);
    if (mine != theirs) {
      ++mismatches;
      BOOST_ERROR("length " << n << ": twin " << xt::hex16(mine) << ", libxxhash " << xt::hex16(theirs));
    }
  }
  BOOST_TEST(mismatches == 0);
}

BOOST_AUTO_TEST_CASE(every_length_class_at_every_alignment_matches_libxxhash) {
  for (uint64_t n : xt::class_lengths()) {
    const auto data = xt::random_bytes(n + 8, 100 + n);
    for (int offset = 0; offset < 8; ++offset) {
      const std::byte* p = data.data() + offset;
      BOOST_TEST(xxh3_64(p, n) == libxxhash(p, n), "length " << n << " at offset " << offset);
    }
  }
}

BOOST_AUTO_TEST_CASE(random_lengths_and_data_match_libxxhash) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    // Short, medium and long inputs in equal parts.
    const uint64_t limit = trial % 3 == 0 ? 256 : trial % 3 == 1 ? 8192 : 200000;
    const uint64_t n = rng() % (limit + 1);
    const auto data = xt::random_bytes(n, rng());
    BOOST_TEST(xxh3_64(data.data(), n) == libxxhash(data.data(), n), "trial " << trial << ", length " << n);
  }
}

BOOST_AUTO_TEST_CASE(megabytes_match_libxxhash) {
  for (uint64_t n : {uint64_t{1} << 20, (uint64_t{3} << 20) + 77}) {
    const auto data = xt::random_bytes(n, n);
    BOOST_TEST(xxh3_64(data.data(), n) == libxxhash(data.data(), n), "length " << n);
  }
  // Constant bytes: all-zero and all-ones stripes, where a wrong lane swap would not show in a
  // product term alone.
  for (uint8_t fill : {uint8_t{0x00}, uint8_t{0xff}}) {
    const std::vector<std::byte> data(70000, std::byte{fill});
    BOOST_TEST(xxh3_64(data.data(), data.size()) == libxxhash(data.data(), data.size()),
               "70000 bytes of " << int(fill));
  }
}

BOOST_AUTO_TEST_CASE(batch_ref_hashes_each_buffer) {
  const auto a = xt::random_bytes(3000, 3), b = xt::random_bytes(17, 4);
  const std::byte* data[] = {a.data(), b.data(), nullptr, a.data() + 1};
  const uint64_t lengths[] = {3000, 17, 0, 2999};
  uint64_t digests[4] = {};
  BOOST_REQUIRE(xxh3_batch_ref({data, lengths, digests, 4}) == kernel_status::ok);
  for (int t = 0; t < 4; ++t)
    BOOST_TEST(digests[t] == XXH3_64bits(data[t], lengths[t]), "buffer " << t);
  BOOST_CHECK(xxh3_batch_ref({data, lengths, digests, 0}) == kernel_status::ok);
}

BOOST_AUTO_TEST_CASE(bad_batches_are_refused_with_a_sentence) {
  const std::byte* data[] = {nullptr};
  const uint64_t lengths[] = {5};
  uint64_t digests[1] = {};
  BOOST_CHECK(xxh3_batch_ref({data, lengths, digests, 1}) == kernel_status::invalid_problem);
  BOOST_CHECK(xxh3_batch_ref({data, lengths, digests, -1}) == kernel_status::invalid_problem);
  BOOST_TEST(xxh3_batch_problem({data, lengths, digests, -1}).find("negative") != std::string::npos);
  BOOST_CHECK(xxh3_batch_ref({data, nullptr, digests, 1}) == kernel_status::invalid_problem);
  BOOST_TEST(xxh3_batch_problem({nullptr, lengths, digests, 1}) ==
             "the data, lengths and digests arrays are required for 1 buffers");
  BOOST_TEST(xxh3_batch_problem({nullptr, nullptr, nullptr, 0}).empty());
}

// The device schedule, lanes as threads: equal to the twin for every length class at every
// start alignment (the load width follows the alignment; the last stripe's has its own).
BOOST_AUTO_TEST_CASE(warp_schedule_on_the_host_equals_the_twin) {
  for (uint64_t n : xt::class_lengths()) {
    const auto data = xt::random_bytes(n + 8, 900 + n);
    for (int offset : {0, 1, 2, 3, 4, 6, 7}) {
      const std::byte* p = data.data() + offset;
      const uint64_t twin = xxh3_64(p, n), warp = warp_on_host(p, n);
      BOOST_TEST(warp == twin, "length " << n << " at offset " << offset << ": warp " << xt::hex16(warp)
                                         << ", twin " << xt::hex16(twin));
    }
  }
}

// tests/data/xxh3_vectors.tsv: "length<TAB>digest" of xt::vector_bytes(length), which
// tests/python/test_xxh3.py checks with the xxhash package. RLSERVE_XXH3_WRITE_VECTORS=path
// writes the file from the twin instead.
BOOST_AUTO_TEST_CASE(committed_vectors_match) {
  if (const char* out_path = std::getenv("RLSERVE_XXH3_WRITE_VECTORS")) {
    std::ofstream out(out_path);
    out << "# XXH3-64 (seed 0) of n bytes: state = n; per byte state = state * 6364136223846793005 +\n"
           "# 1442695040888963407 (mod 2^64), byte = state >> 56. Written by tests/kernels/xxh3_test.cpp.\n";
    for (uint64_t n : xt::vector_lengths()) {
      const auto bytes = xt::vector_bytes(n);
      out << n << "\t" << xt::hex16(xxh3_64(bytes.data(), n)) << "\n";
    }
    BOOST_TEST_MESSAGE("wrote " << out_path);
  }
  std::ifstream in(vectors_path());
  BOOST_REQUIRE_MESSAGE(in, "cannot open " << vectors_path() << " (set RLSERVE_SOURCE_DIR)");
  std::string line;
  int checked = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#')
      continue;
    std::istringstream fields(line);
    uint64_t n = 0;
    std::string digest;
    BOOST_REQUIRE_MESSAGE(fields >> n >> digest, "bad line: " << line);
    const auto bytes = xt::vector_bytes(n);
    BOOST_TEST(xt::hex16(xxh3_64(bytes.data(), n)) == digest, "length " << n);
    BOOST_TEST(xt::hex16(libxxhash(bytes.data(), n)) == digest, "length " << n << " (libxxhash)");
    ++checked;
  }
  BOOST_TEST(checked == static_cast<int>(xt::vector_lengths().size()));
}

BOOST_AUTO_TEST_SUITE_END()
