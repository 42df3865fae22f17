// The NCCL weight-update group on one GPU (label gpu). NCCL cannot put two ranks of one group on
// one GPU, so what one GPU allows:
//   - a one-rank group broadcasts (a copy in place) in every dtype a trainer sends;
//   - 50 create/destroy cycles leak no device memory beyond a small slack, no file descriptors,
//     no threads;
//   - a group of two whose other rank never comes fails at the deadline with a message, and the
//     next group is created normally (abort left nothing behind that blocks).
// The broadcast between a trainer and the engine is tested on two GPUs (tests/gpu/).
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <filesystem>

#include <cuda_runtime.h>

#include "model/nccl_group.hpp"

using namespace rlserve;
using namespace rlserve::model;

namespace {

std::size_t count_entries(const char* dir) {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir))
    ++n;
  return n;
}

std::size_t device_free() {
  std::size_t free = 0, total = 0;
  BOOST_REQUIRE(cudaMemGetInfo(&free, &total) == cudaSuccess);
  return free;
}

auto in(double s) {
  return nccl_group::clock::now() + std::chrono::duration_cast<nccl_group::clock::duration>(std::chrono::duration<double>(s));
}

} // namespace

BOOST_AUTO_TEST_SUITE(nccl_group_gpu_test)

BOOST_AUTO_TEST_CASE(a_one_rank_group_broadcasts_and_cycles_leak_nothing) {
  BOOST_TEST_MESSAGE(nccl_group::version());
  auto id = nccl_group::new_unique_id();
  BOOST_REQUIRE_MESSAGE(id.has_value(), id.error());
  auto g = nccl_group::create(*id, 1, 0, 0, "one", in(60));
  BOOST_REQUIRE_MESSAGE(g.has_value(), g.error());
  std::vector<uint16_t> host(1000);
  for (std::size_t i = 0; i < host.size(); ++i)
    host[i] = static_cast<uint16_t>(i * 7);
  void* dev = nullptr;
  BOOST_REQUIRE(cudaMalloc(&dev, host.size() * 2) == cudaSuccess);
  BOOST_REQUIRE(cudaMemcpy(dev, host.data(), host.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
  std::vector<nccl_buffer> bufs{{dev, 1000, dtype::bf16}, {dev, 500, dtype::f32}, {dev, 2000, dtype::u8}};
  auto ok = (*g)->broadcast(bufs, 0, in(60));
  BOOST_REQUIRE_MESSAGE(ok.has_value(), ok.error());
  std::vector<uint16_t> back(host.size());
  BOOST_REQUIRE(cudaMemcpy(back.data(), dev, back.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
  BOOST_TEST(back == host); // the root keeps its bytes
  std::vector<nccl_buffer> bad{{dev, 10, dtype::i16}};
  auto refused = (*g)->broadcast(bad, 0, in(60));
  BOOST_TEST(!refused.has_value());
  BOOST_TEST(refused.error().find("int16") != std::string::npos, refused.error());
  BOOST_TEST(!(*g)->broken()); // refused before anything was enqueued
  g->reset();
  cudaFree(dev);

  // Warm-up cycle, then measure.
  { auto w = nccl_group::create(*nccl_group::new_unique_id(), 1, 0, 0, "warm", in(60)); BOOST_REQUIRE(w.has_value()); }
  const auto fds = count_entries("/proc/self/fd");
  const auto threads = count_entries("/proc/self/task");
  const auto free_before = device_free();
  for (int i = 0; i < 50; ++i) {
    auto cycle = nccl_group::create(*nccl_group::new_unique_id(), 1, 0, 0, "cycle", in(60));
    BOOST_REQUIRE_MESSAGE(cycle.has_value(), cycle.error());
  }
  const auto free_after = device_free();
  BOOST_TEST_MESSAGE("50 cycles: fds " << fds << " -> " << count_entries("/proc/self/fd") << ", threads "
                                       << threads << " -> " << count_entries("/proc/self/task")
                                       << ", device free " << free_before << " -> " << free_after);
  BOOST_TEST(count_entries("/proc/self/fd") <= fds);
  BOOST_TEST(count_entries("/proc/self/task") <= threads + 1);
  BOOST_TEST(free_after + (64u << 20) >= free_before); // under 64 MiB over 50 cycles
}

BOOST_AUTO_TEST_CASE(a_rank_whose_peer_never_comes_fails_at_the_deadline) {
  auto id = nccl_group::new_unique_id();
  BOOST_REQUIRE(id.has_value());
  const auto t0 = std::chrono::steady_clock::now();
  auto g = nccl_group::create(*id, 2, 1, 0, "lonely", in(3));
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  BOOST_REQUIRE(!g.has_value());
  BOOST_TEST(g.error().find("did not join before the deadline") != std::string::npos, g.error());
  BOOST_TEST_MESSAGE("gave up after " << waited << " s (deadline 3 s)");
  BOOST_TEST(waited < 60.0); // a hang guard, not a timing assertion
  auto next = nccl_group::create(*nccl_group::new_unique_id(), 1, 0, 0, "after", in(60));
  BOOST_TEST(next.has_value(), (next ? std::string() : next.error()));
}

BOOST_AUTO_TEST_SUITE_END()
