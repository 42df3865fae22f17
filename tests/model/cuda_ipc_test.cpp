// model/cuda_ipc on the CPU: GPU UUID text in both forms (nvidia-smi's and PyTorch's), and the
// release of PyTorch's ref-counter slots in a shared-memory file laid out as PyTorch lays it out
// (a 64-byte header, then int64 slots): the right slot is decremented, nothing else is touched,
// and names or slots outside PyTorch's files are refused. Opening IPC handles needs a GPU
// (tests/gpu/test_ipc_update.py).
#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "model/cuda_ipc.hpp"

using namespace rlserve;
using namespace rlserve::model;

namespace {

// A ref-counter file as PyTorch makes it: header, then `slots` int64 counters set to 1.
struct ref_file {
  std::string name;
  std::size_t bytes;
  explicit ref_file(uint64_t slots) {
    name = "/torch_" + std::to_string(getpid()) + "_424242_0";
    bytes = k_torch_ref_counter_header + 8 * slots;
    int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    BOOST_REQUIRE(fd >= 0);
    BOOST_REQUIRE(ftruncate(fd, static_cast<off_t>(bytes)) == 0);
    std::vector<int64_t> v(bytes / 8, 1);
    BOOST_REQUIRE(write(fd, v.data(), bytes) == static_cast<ssize_t>(bytes));
    close(fd);
  }
  std::vector<int64_t> read() const {
    std::vector<int64_t> v(bytes / 8);
    int fd = shm_open(name.c_str(), O_RDONLY, 0);
    BOOST_REQUIRE(fd >= 0);
    BOOST_REQUIRE(pread(fd, v.data(), bytes, 0) == static_cast<ssize_t>(bytes));
    close(fd);
    return v;
  }
  ~ref_file() { shm_unlink(name.c_str()); }
};

} // namespace

BOOST_AUTO_TEST_SUITE(cuda_ipc_test)

BOOST_AUTO_TEST_CASE(gpu_uuids_normalise_to_nvidia_smi_form) {
  const std::string smi = "GPU-4b652ae2-0ec6-7dcb-611e-8bd2e51d9120";
  BOOST_TEST(normalize_gpu_uuid("4b652ae2-0ec6-7dcb-611e-8bd2e51d9120") == smi); // PyTorch's text
  BOOST_TEST(normalize_gpu_uuid(smi) == smi);
  BOOST_TEST(normalize_gpu_uuid("GPU-4B652AE2-0EC6-7DCB-611E-8BD2E51D9120") == smi);
  for (const char* bad : {"", "GPU-", "4b652ae2", "4b652ae2-0ec6-7dcb-611e-8bd2e51d912",
                          "4b652ae2-0ec6-7dcb-611e-8bd2e51d91200", "4b652ae2_0ec6-7dcb-611e-8bd2e51d9120",
                          "zb652ae2-0ec6-7dcb-611e-8bd2e51d9120", "MIG-4b652ae2-0ec6-7dcb-611e-8bd2e51d9120"})
    BOOST_TEST(normalize_gpu_uuid(bad).empty(), bad);
}

BOOST_AUTO_TEST_CASE(a_ref_counter_slot_is_decremented_once_and_nothing_else) {
  ref_file f(16);
  auto s = release_torch_ref_counter(f.name, 5);
  BOOST_REQUIRE_MESSAGE(s, (s ? "" : s.error()));
  auto v = f.read();
  for (std::size_t i = 0; i < v.size(); ++i)
    BOOST_TEST(v[i] == (i == k_torch_ref_counter_header / 8 + 5 ? 0 : 1), "int64 " << i);
}

BOOST_AUTO_TEST_CASE(other_files_and_slots_are_refused) {
  ref_file f(4);
  auto err = [](const status& s) { return s ? std::string() : s.error(); };
  BOOST_TEST(err(release_torch_ref_counter(f.name, 4)).find("at least") != std::string::npos);
  BOOST_TEST(err(release_torch_ref_counter(f.name, k_torch_ref_counter_slots)).find("past") != std::string::npos);
  for (const char* name : {"/etc_passwd", "torch_1_2_3", "/torch_../x", "/torch_1/2", "/torch_"})
    BOOST_TEST(err(release_torch_ref_counter(name, 0)).find("not a PyTorch") != std::string::npos, name);
  BOOST_TEST(err(release_torch_ref_counter("/torch_0_0_999999", 0)).find("cannot open") != std::string::npos);
  auto v = f.read();
  for (auto x : v)
    BOOST_TEST(x == 1);
}

BOOST_AUTO_TEST_SUITE_END()
