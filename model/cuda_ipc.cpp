#include "model/cuda_ipc.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstring>

#include <fmt/format.h>

namespace rlserve::model {

std::string normalize_gpu_uuid(std::string_view text) {
  std::string s(text);
  if (s.size() > 4 && (s.compare(0, 4, "GPU-") == 0 || s.compare(0, 4, "gpu-") == 0))
    s = s.substr(4);
  // 8-4-4-4-12 hex digits.
  static constexpr int groups[] = {8, 4, 4, 4, 12};
  std::size_t pos = 0;
  std::string out = "GPU-";
  for (int g = 0; g < 5; ++g) {
    for (int i = 0; i < groups[g]; ++i, ++pos) {
      if (pos >= s.size() || !std::isxdigit(static_cast<unsigned char>(s[pos])))
        return {};
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(s[pos])));
    }
    if (g < 4) {
      if (pos >= s.size() || s[pos] != '-')
        return {};
      out += '-';
      ++pos;
    }
  }
  return pos == s.size() ? out : std::string{};
}

status release_torch_ref_counter(const std::string& shm_name, uint64_t slot) {
  // Only files named as PyTorch names them: a client must not make the engine write into any
  // other shared-memory object.
  bool ok = shm_name.size() > 7 && shm_name.compare(0, 7, "/torch_") == 0 && shm_name.size() < 128;
  for (std::size_t i = 7; ok && i < shm_name.size(); ++i)
    ok = std::isalnum(static_cast<unsigned char>(shm_name[i])) || shm_name[i] == '_';
  if (!ok)
    return fail(fmt::format("ref counter '{}' is not a PyTorch CUDA IPC ref-counter file name", shm_name));
  if (slot >= k_torch_ref_counter_slots)
    return fail(fmt::format("ref counter '{}': slot {} is past the file's {} slots", shm_name, slot,
                            k_torch_ref_counter_slots));
  int fd = shm_open(shm_name.c_str(), O_RDWR | O_NOFOLLOW, 0);
  if (fd < 0)
    return fail(fmt::format("ref counter '{}': cannot open it ({}); the trainer process may have "
                            "exited", shm_name, std::strerror(errno)));
  struct stat info {};
  const std::size_t need = k_torch_ref_counter_header + 8 * (slot + 1);
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode) || static_cast<std::size_t>(info.st_size) < need) {
    ::close(fd);
    return fail(fmt::format("ref counter '{}' is not a ref-counter file of at least {} bytes",
                            shm_name, need));
  }
  void* p = mmap(nullptr, need, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED)
    return fail(fmt::format("ref counter '{}': mmap failed ({})", shm_name, std::strerror(errno)));
  auto* counter = reinterpret_cast<int64_t*>(static_cast<char*>(p) + k_torch_ref_counter_header + 8 * slot);
  std::atomic_ref<int64_t>(*counter).fetch_sub(1);
  munmap(p, need);
  return {};
}

} // namespace rlserve::model

#if RLSERVE_HAVE_CUDA

#include <cuda.h>
#include <cuda_runtime.h>

namespace rlserve::model {

namespace {

std::string cuda_text(cudaError_t e) { return cudaGetErrorString(e); }

// cuMemGetAddressRange through the runtime's driver entry point: the size of the allocation an
// address belongs to, without linking libcuda (a build machine without a driver still links).
using get_range_fn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
get_range_fn address_range_fn() {
  static get_range_fn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &p, 12000, cudaEnableDefault, &q) !=
          cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      return get_range_fn{nullptr};
    return reinterpret_cast<get_range_fn>(p);
  }();
  return fn;
}

// The 64 bytes of cudaIpcMemHandle_t inside `h`, or an error naming what the bytes are.
expected<std::vector<uint8_t>> raw_handle(const std::vector<uint8_t>& h) {
  if (h.size() == sizeof(cudaIpcMemHandle_t))
    return h;
  if (h.size() == sizeof(cudaIpcMemHandle_t) + 2) {
    if (h[0] != 2 && h[0] != 3)
      return fail(fmt::format("PyTorch shareable handle version {} is not supported (2 and 3 are)", h[0]));
    if (h[1] == 'e')
      return fail("the handle is an expandable segment (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                  "in the trainer); send memory from a plain cudaMalloc segment (unset "
                  "expandable_segments for the weight buffers)");
    if (h[1] != 'c')
      return fail(fmt::format("PyTorch shareable handle type '{}' is unknown ('c' is supported)",
                              static_cast<char>(h[1])));
    return std::vector<uint8_t>(h.begin() + 2, h.end());
  }
  return fail(fmt::format("an IPC handle has 64 bytes (or 66 in PyTorch's form), got {}", h.size()));
}

} // namespace

expected<std::string> cuda_device_uuid(int device) {
  cudaDeviceProp prop{};
  if (auto e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess)
    return fail(fmt::format("CUDA device {}: {}", device, cuda_text(e)));
  const auto* b = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  std::string hex;
  for (int i = 0; i < 16; ++i)
    hex += fmt::format("{:02x}", b[i]);
  return fmt::format("GPU-{}-{}-{}-{}-{}", hex.substr(0, 8), hex.substr(8, 4), hex.substr(12, 4),
                     hex.substr(16, 4), hex.substr(20, 12));
}

expected<std::unique_ptr<ipc_mapping>> ipc_mapping::open(std::span<const NamedDeviceTensor> tensors,
                                                         int device) {
  std::unique_ptr<ipc_mapping> m(new ipc_mapping());
  m->device_ = device;
  if (auto e = cudaSetDevice(device); e != cudaSuccess)
    return fail(fmt::format("CUDA device {}: {}", device, cuda_text(e)));
  auto own_uuid = cuda_device_uuid(device);
  if (!own_uuid)
    return std::move(own_uuid).take_failure();
  // Every slot of the message is released when the mapping closes, also when the message is
  // refused: the engine consumed it, and the trainer's memory must not stay pinned.
  for (const auto& nt : tensors)
    if (!nt.tensor.ref_counter_handle.empty())
      m->ref_counters_.emplace_back(nt.tensor.ref_counter_handle, nt.tensor.ref_counter_offset);
  auto failed = [&](const std::string& name, const std::string& why) -> failure {
    (void)m->close(); // this failure is the one to report, not a later one of closing
    return fail(fmt::format("device tensor '{}': {}", name, why));
  };
  for (const auto& nt : tensors) {
    const auto& t = nt.tensor;
    const int64_t numel = checked_numel(t.shape);
    if (numel < 0)
      return failed(nt.name, "its shape has a negative or overflowing dimension");
    const uint64_t want = static_cast<uint64_t>(numel) * element_size(t.type);
    if (t.nbytes != 0 && t.nbytes != want)
      return failed(nt.name, fmt::format("{} bytes given for {} [{}] ({} expected)", t.nbytes,
                                         torch_name(t.type), fmt::join(t.shape, ", "), want));
    if (!t.device_uuid.empty()) {
      auto theirs = normalize_gpu_uuid(t.device_uuid);
      if (theirs.empty())
        return failed(nt.name, fmt::format("device_uuid '{}' is not a GPU UUID", t.device_uuid));
      if (theirs != *own_uuid)
        return failed(nt.name, fmt::format("its memory is on GPU {}, this runner is on {} (send each "
                                           "engine GPU the tensors of the trainer rank on the same GPU)",
                                           theirs, *own_uuid));
    }
    if (t.ipc_handle.empty()) {
      if (t.pointer == 0)
        return failed(nt.name, "neither an IPC handle nor a device pointer is given");
      cudaPointerAttributes attr{};
      if (cudaPointerGetAttributes(&attr, reinterpret_cast<void*>(t.pointer)) != cudaSuccess ||
          attr.type != cudaMemoryTypeDevice || attr.device != device) {
        cudaGetLastError();
        return failed(nt.name, fmt::format("pointer 0x{:x} is not device memory of CUDA device {}",
                                           t.pointer, device));
      }
      m->pointers_.push_back(reinterpret_cast<const std::byte*>(t.pointer) + t.offset);
      continue;
    }
    auto raw = raw_handle(t.ipc_handle);
    if (!raw)
      return failed(nt.name, raw.error());
    auto it = std::find_if(m->handles_.begin(), m->handles_.end(),
                           [&](const opened_handle& h) { return h.handle == *raw; });
    if (it == m->handles_.end()) {
      cudaIpcMemHandle_t h;
      std::memcpy(&h, raw->data(), sizeof h);
      void* base = nullptr;
      if (auto e = cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess); e != cudaSuccess) {
        cudaGetLastError();
        return failed(nt.name, fmt::format("its CUDA IPC handle does not open on CUDA device {} ({}): "
                                           "the producer may have freed it or exited, or it is "
                                           "memory of another GPU", device, cuda_text(e)));
      }
      opened_handle oh{*raw, base, 0};
      if (auto fn = address_range_fn()) {
        CUdeviceptr range_base = 0;
        size_t range_bytes = 0;
        if (fn(&range_base, &range_bytes, reinterpret_cast<CUdeviceptr>(base)) == CUDA_SUCCESS)
          oh.bytes = range_bytes - (reinterpret_cast<CUdeviceptr>(base) - range_base);
      }
      m->handles_.push_back(std::move(oh));
      it = m->handles_.end() - 1;
    }
    if (it->bytes != 0 && (t.offset > it->bytes || want > it->bytes - t.offset))
      return failed(nt.name, fmt::format("bytes [{}, {}) lie outside the {}-byte allocation its handle "
                                         "names", t.offset, t.offset + want, it->bytes));
    m->pointers_.push_back(static_cast<const std::byte*>(it->base) + t.offset);
    if (!t.event_handle.empty() && t.event_sync_required) {
      if (t.event_handle.size() != sizeof(cudaIpcEventHandle_t))
        return failed(nt.name, fmt::format("its event handle has {} bytes (64 expected)", t.event_handle.size()));
      bool known = std::any_of(m->events_.begin(), m->events_.end(),
                               [&](const opened_event& e) { return e.handle == t.event_handle; });
      if (!known) {
        cudaIpcEventHandle_t eh;
        std::memcpy(&eh, t.event_handle.data(), sizeof eh);
        cudaEvent_t ev = nullptr;
        if (auto e = cudaIpcOpenEventHandle(&ev, eh); e != cudaSuccess) {
          cudaGetLastError();
          return failed(nt.name, fmt::format("its CUDA IPC event does not open ({})", cuda_text(e)));
        }
        m->events_.push_back({t.event_handle, ev});
      }
    }
  }
  return m;
}

status ipc_mapping::wait_for_producer() {
  for (auto& e : events_)
    if (auto err = cudaEventSynchronize(static_cast<cudaEvent_t>(e.event)); err != cudaSuccess)
      return fail(fmt::format("waiting for the trainer's CUDA IPC event failed: {}", cuda_text(err)));
  return {};
}

status ipc_mapping::close() {
  if (closed_)
    return {};
  closed_ = true;
  std::string errors;
  cudaSetDevice(device_);
  for (auto& e : events_)
    cudaEventDestroy(static_cast<cudaEvent_t>(e.event));
  events_.clear();
  for (auto& h : handles_)
    if (auto e = cudaIpcCloseMemHandle(h.base); e != cudaSuccess)
      errors += fmt::format("closing a CUDA IPC handle failed: {}; ", cuda_text(e));
  handles_.clear();
  // Released only after the reads finished: the trainer may reuse the block from here on.
  if (errors.empty())
    for (auto& [name, slot] : ref_counters_)
      if (auto s = release_torch_ref_counter(name, slot); !s)
        errors += s.error() + "; ";
  ref_counters_.clear();
  if (!errors.empty())
    return fail(errors.substr(0, errors.size() - 2));
  return {};
}

// A destructor has no one to tell: close() reports its failures to callers that close first.
ipc_mapping::~ipc_mapping() { (void)close(); }

} // namespace rlserve::model

#else // no CUDA in this build

namespace rlserve::model {

expected<std::string> cuda_device_uuid(int) { return fail("this build has no CUDA"); }
expected<std::unique_ptr<ipc_mapping>> ipc_mapping::open(std::span<const NamedDeviceTensor>, int) {
  return fail("CUDA IPC tensors need a build with CUDA");
}
status ipc_mapping::wait_for_producer() { return {}; }
status ipc_mapping::close() { return {}; }
ipc_mapping::~ipc_mapping() = default;

} // namespace rlserve::model

#endif
