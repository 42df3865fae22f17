#include "model/vmm_arena.hpp"

#if RLSERVE_HAVE_CUDA

#include <algorithm>
#include <mutex>

#include <cuda.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

namespace rlserve::model {

namespace {

constexpr std::size_t k_min_chunk = 64u << 20;
constexpr std::size_t k_alignment = 256;

// The driver's virtual memory functions, looked up once through the runtime.
struct driver_vmm {
  CUresult (*get_granularity)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*address_reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*address_free)(CUdeviceptr, size_t) = nullptr;
  CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*error_string)(CUresult, const char**) = nullptr;
  std::string missing; // why the lookup failed, if it did
};

const driver_vmm& vmm() {
  static driver_vmm d;
  static std::once_flag once;
  std::call_once(once, [] {
    auto get = [](const char* name, auto& fn) {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult q{};
      if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
          q != cudaDriverEntryPointSuccess || !p)
        return false;
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
      return true;
    };
    const std::pair<const char*, bool> found[] = {
      {"cuMemGetAllocationGranularity", get("cuMemGetAllocationGranularity", d.get_granularity)},
      {"cuMemAddressReserve", get("cuMemAddressReserve", d.address_reserve)},
      {"cuMemAddressFree", get("cuMemAddressFree", d.address_free)},
      {"cuMemCreate", get("cuMemCreate", d.create)},
      {"cuMemRelease", get("cuMemRelease", d.release)},
      {"cuMemMap", get("cuMemMap", d.map)},
      {"cuMemUnmap", get("cuMemUnmap", d.unmap)},
      {"cuMemSetAccess", get("cuMemSetAccess", d.set_access)},
      {"cuGetErrorString", get("cuGetErrorString", d.error_string)},
    };
    for (auto& [name, ok] : found)
      if (!ok)
        d.missing += (d.missing.empty() ? "" : ", ") + std::string(name);
  });
  return d;
}

std::string cu_text(CUresult r) {
  const char* s = nullptr;
  if (vmm().error_string && vmm().error_string(r, &s) == CUDA_SUCCESS && s)
    return s;
  return fmt::format("CUresult {}", static_cast<int>(r));
}

CUmemAllocationProp device_prop(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

} // namespace

vmm_arena::~vmm_arena() {
  if (!vmm().missing.empty())
    return;
  cudaSetDevice(device_);
  cudaDeviceSynchronize();
  for (auto& c : chunks_) {
    unmap(c);
    if (c.host_copy)
      cudaFreeHost(c.host_copy);
    vmm().address_free(c.va, c.size);
  }
}

status vmm_arena::map(chunk& c) {
  const auto& d = vmm();
  auto prop = device_prop(device_);
  CUmemGenericAllocationHandle h{};
  if (auto r = d.create(&h, c.size, &prop, 0); r != CUDA_SUCCESS)
    return fail(fmt::format("cannot allocate {} MiB of {} memory on cuda:{}: {}", c.size >> 20, tag_, device_,
                            cu_text(r)));
  if (auto r = d.map(c.va, c.size, 0, h, 0); r != CUDA_SUCCESS) {
    d.release(h);
    return fail(fmt::format("cuMemMap of {} MiB ({}) failed: {}", c.size >> 20, tag_, cu_text(r)));
  }
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (auto r = d.set_access(c.va, c.size, &access, 1); r != CUDA_SUCCESS) {
    d.unmap(c.va, c.size);
    d.release(h);
    return fail(fmt::format("cuMemSetAccess ({}) failed: {}", tag_, cu_text(r)));
  }
  c.handle = h;
  c.mapped = true;
  return {};
}

void vmm_arena::unmap(chunk& c) {
  if (!c.mapped)
    return;
  vmm().unmap(c.va, c.size);
  vmm().release(c.handle);
  c.mapped = false;
  c.handle = 0;
}

expected<void*> vmm_arena::allocate(std::size_t bytes) {
  const auto& d = vmm();
  if (!d.missing.empty())
    return fail("the CUDA driver lacks the virtual memory functions (" + d.missing + ")");
  if (released_)
    return fail(fmt::format("the {} memory is released; resume it first", tag_));
  bytes = std::max<std::size_t>(bytes, 1);
  for (auto& c : chunks_) {
    const std::size_t at = (c.used + k_alignment - 1) / k_alignment * k_alignment;
    if (at + bytes <= c.size) {
      c.used = at + bytes;
      return reinterpret_cast<void*>(c.va + at);
    }
  }
  if (granularity_ == 0) {
    auto prop = device_prop(device_);
    if (auto r = d.get_granularity(&granularity_, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM); r != CUDA_SUCCESS)
      return fail("cuMemGetAllocationGranularity failed: " + cu_text(r));
  }
  chunk c;
  c.size = (std::max(bytes, k_min_chunk) + granularity_ - 1) / granularity_ * granularity_;
  CUdeviceptr va = 0;
  if (auto r = d.address_reserve(&va, c.size, 0, 0, 0); r != CUDA_SUCCESS)
    return fail(fmt::format("cannot reserve {} MiB of addresses for {} memory: {}", c.size >> 20, tag_, cu_text(r)));
  c.va = va;
  if (auto s = map(c); !s) {
    d.address_free(c.va, c.size);
    return std::move(s).take_failure();
  }
  c.used = bytes;
  chunks_.push_back(c);
  return reinterpret_cast<void*>(c.va);
}

status vmm_arena::release(bool backup) {
  if (released_)
    return {};
  if (auto e = cudaDeviceSynchronize(); e != cudaSuccess)
    return fail(std::string("cudaDeviceSynchronize before releasing memory: ") + cudaGetErrorString(e));
  if (backup) {
    for (auto& c : chunks_) {
      if (!c.host_copy)
        if (auto e = cudaMallocHost(&c.host_copy, c.used); e != cudaSuccess) {
          c.host_copy = nullptr;
          return fail(fmt::format("cannot allocate {} MiB of pinned host memory to back up {} memory: {}",
                                  c.used >> 20, tag_, cudaGetErrorString(e)));
        }
      if (auto e = cudaMemcpy(c.host_copy, reinterpret_cast<void*>(c.va), c.used, cudaMemcpyDeviceToHost);
          e != cudaSuccess)
        return fail(fmt::format("backing up {} memory failed: {}", tag_, cudaGetErrorString(e)));
    }
  }
  for (auto& c : chunks_)
    unmap(c);
  released_ = true;
  return {};
}

status vmm_arena::resume() {
  if (!released_)
    return {};
  for (auto& c : chunks_) {
    if (auto s = map(c); !s) {
      for (auto& m : chunks_)
        unmap(m); // all or nothing: still released
      return s;
    }
  }
  for (auto& c : chunks_) {
    if (!c.host_copy)
      continue;
    if (auto e = cudaMemcpy(reinterpret_cast<void*>(c.va), c.host_copy, c.used, cudaMemcpyHostToDevice);
        e != cudaSuccess)
      return fail(fmt::format("restoring {} memory failed: {}", tag_, cudaGetErrorString(e)));
    cudaFreeHost(c.host_copy);
    c.host_copy = nullptr;
  }
  released_ = false;
  return {};
}

std::size_t vmm_arena::mapped_bytes() const {
  std::size_t n = 0;
  for (const auto& c : chunks_)
    n += c.mapped ? c.size : 0;
  return n;
}

std::size_t vmm_arena::reserved_bytes() const {
  std::size_t n = 0;
  for (const auto& c : chunks_)
    n += c.size;
  return n;
}

} // namespace rlserve::model

#endif
