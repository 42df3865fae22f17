// vmm_arena: device memory whose physical pages can be given back and taken again while every
// address stays the same — how a colocated engine releases its GPU memory to the trainer between
// rollouts (release_memory_occupation) without re-capturing its CUDA graphs or re-pointing its
// kernels. Built on CUDA's virtual memory management: each chunk is a virtual address range
// reserved once (cuMemAddressReserve); its physical memory is created and mapped there
// (cuMemCreate, cuMemMap, cuMemSetAccess), unmapped and released on release (cuMemUnmap,
// cuMemRelease), and created and mapped at the same address again on resume. Allocations are
// carved from chunks (256-byte aligned; a chunk is at least 64 MiB, or one allocation's size
// rounded to the granularity), so tens of thousands of small tensors do not each cost a
// 2 MiB page. What the memory held is lost by a release unless it was copied to pinned host
// memory first (`backup` true), which resume copies back.
//
// The driver functions come through the runtime (cudaGetDriverEntryPointByVersion), so nothing
// links libcuda: a CUDA build still runs on a machine without a driver (the CPU tests). Internal
// to the GPU model (model/qwen3_gpu_impl.hpp); call from the thread that owns the device.
#pragma once

#if RLSERVE_HAVE_CUDA

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "messages/expected.hpp"

namespace rlserve::model {

class vmm_arena {
public:
  vmm_arena(int device, std::string tag) : device_(device), tag_(std::move(tag)) {}
  ~vmm_arena();
  vmm_arena(const vmm_arena&) = delete;
  vmm_arena& operator=(const vmm_arena&) = delete;

  // `bytes` of device memory, 256-byte aligned, valid until the arena goes (refused while
  // released).
  expected<void*> allocate(std::size_t bytes);

  // Gives the physical memory back (after the device finished with it); with `backup` its
  // contents go to pinned host memory first. Addresses stay reserved.
  status release(bool backup);
  // Maps fresh physical memory at the same addresses; restores the contents if the release
  // backed them up.
  status resume();

  bool released() const { return released_; }
  std::size_t mapped_bytes() const; // physical memory held now
  std::size_t reserved_bytes() const;
  const std::string& tag() const { return tag_; }

private:
  struct chunk {
    uint64_t va = 0;
    std::size_t size = 0;
    std::size_t used = 0;
    uint64_t handle = 0; // CUmemGenericAllocationHandle while mapped
    bool mapped = false;
    void* host_copy = nullptr; // pinned backup while released
  };
  status map(chunk& c);
  void unmap(chunk& c);

  int device_;
  std::string tag_;
  std::size_t granularity_ = 0;
  std::vector<chunk> chunks_;
  bool released_ = false;
};

} // namespace rlserve::model

#endif
