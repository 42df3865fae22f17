// Tensors in messages. A HostTensor is a dtype, a shape and shared immutable bytes: inside one
// process a tensor travels through actors without a copy (the bytes may alias an mmap'ed
// safetensors file or a trainer's buffer); it is copied only when serialized to cross a process
// or machine boundary. A DeviceTensorRef names GPU memory (a pointer in this process or a CUDA
// IPC handle from another) and never carries bytes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "caf/error.hpp"
#include "caf/meta/load_callback.hpp"
#include "caf/meta/type_name.hpp"
#include "caf/none.hpp"
#include "messages/dtype.hpp"

namespace rlserve {

// The element count of a shape that came from outside, or -1 when a dimension is negative or the
// count times `element_bytes` would not fit an int64 (so byte counts computed from it cannot
// overflow). Default: the widest element a tensor here can have.
inline int64_t checked_numel(std::span<const int64_t> shape, std::size_t element_bytes = 16) {
  const int64_t limit = INT64_MAX / static_cast<int64_t>(element_bytes == 0 ? 1 : element_bytes);
  int64_t n = 1;
  for (auto d : shape) {
    if (d < 0 || (d > 0 && n > limit / d))
      return -1;
    n *= d;
  }
  return n;
}

struct HostTensor {
  dtype type = dtype::f32;
  std::vector<int64_t> shape;
  // The bytes, row-major, exactly numel(shape) * element_size(type) of them. Shared and
  // immutable: whoever needs to change a tensor makes a new one.
  std::shared_ptr<const std::byte> data;
  std::size_t nbytes = 0;

  std::span<const std::byte> bytes() const { return {data.get(), nbytes}; }
  template <class T>
  std::span<const T> as() const {
    return {reinterpret_cast<const T*>(data.get()), nbytes / sizeof(T)};
  }
  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape)
      n *= d;
    return n;
  }
  // numel, or -1 when a dimension is negative or the byte count of the shape would overflow
  // (shapes come from the outside; check before trusting numel()).
  int64_t checked_numel() const { return rlserve::checked_numel(shape, element_size(type)); }

  // Makes a tensor owning a copy of `bytes`.
  static HostTensor copy_of(dtype type, std::vector<int64_t> shape, std::span<const std::byte> bytes);
  // Makes a tensor that takes ownership of `bytes` (no copy).
  static HostTensor adopt(dtype type, std::vector<int64_t> shape, std::vector<std::byte> bytes);
  // Makes a tensor that aliases memory kept alive by `owner` (no copy).
  static HostTensor alias(dtype type, std::vector<int64_t> shape, std::shared_ptr<const void> owner,
                          const std::byte* first, std::size_t nbytes);
  template <class T>
  static HostTensor from_vector(dtype type, std::vector<int64_t> shape, const std::vector<T>& values) {
    auto b = reinterpret_cast<const std::byte*>(values.data());
    return copy_of(type, std::move(shape), {b, values.size() * sizeof(T)});
  }
};

// The index of the first NaN or infinity in a floating-point tensor (f32, f16, bf16, f64), or
// nullopt when every value is finite or the dtype is not floating point. Reads only exponent
// bits, in blocks without branches, so checking a bucket costs about one pass over its bytes
// at memory speed (the weight updater runs it on every tensor of every update).
std::optional<std::size_t> first_non_finite(const HostTensor& t);

// One HostTensor under its checkpoint (Hugging Face) name.
struct NamedTensor {
  std::string name;
  HostTensor tensor;
};

// GPU memory owned elsewhere. `ipc_handle` is set (and `pointer` is 0) when the memory lives in
// another process; otherwise `pointer` is a device address valid in this process on `device`.
// The tensor is contiguous and starts `offset` bytes into the allocation the handle names (or
// past `pointer`). The GPU runner opens each distinct handle once per message, reads from it on
// the device, and closes it before it replies, so the producer may free or reuse the memory then.
struct DeviceTensorRef {
  int32_t device = 0;              // the producer's device ordinal (in its own process)
  // Always "GPU-" + 8-4-4-4-12 lowercase hex (nvidia-smi's form), or empty. PyTorch (via
  // SGLang's reduction) sends the UUID without the prefix; the readers add it. When set, it
  // names the GPU instead of `device`, and the runner refuses memory of any GPU but its own.
  std::string device_uuid;
  uint64_t pointer = 0;
  std::vector<uint8_t> ipc_handle; // 64 bytes (cudaIpcMemHandle_t) or PyTorch's 66-byte shareable
                                   // handle (version byte, 'c', then the 64 bytes)
  uint64_t offset = 0;             // byte offset of element 0 into the IPC allocation
  uint64_t nbytes = 0;             // bytes of the tensor: numel(shape) * element_size(type) (0:
                                   // not given; the runner computes it)
  dtype type = dtype::bf16;
  std::vector<int64_t> shape;
  // PyTorch's CUDA IPC bookkeeping, set for tensors read from its multiprocessing pickle:
  // a non-empty `ref_counter_handle` means this reference owns one decrement of slot
  // `ref_counter_offset` in that shared-memory file, made after the runner's last read of the
  // memory (the producer keeps the block out of its allocator until the count reaches 0).
  // The slot is the int64 at byte 64 + 8 * ref_counter_offset of /dev/shm/<name without '/'>.
  // One pickled tensor is one decrement: when a flattened bucket is split into many refs, only
  // the first carries the handle. "/name" is checked (a '/', then [A-Za-z0-9_.-]).
  std::string ref_counter_handle;
  uint64_t ref_counter_offset = 0;
  // cudaIpcEventHandle_t (64 bytes) recorded by the producer after it wrote the memory; the
  // runner's reads wait for it when `event_sync_required`.
  std::vector<uint8_t> event_handle;
  bool event_sync_required = false;
};

// ---- inspect (CAF 0.17 form) ------------------------------------------------------------------

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, HostTensor& x) {
  using caf::meta::type_name;
  if constexpr (Inspector::reads_state) {
    if constexpr (std::is_same_v<typename Inspector::result_type, void>) {
      // Printing (deep_to_string): the size, not megabytes of payload.
      auto nbytes = static_cast<uint64_t>(x.nbytes);
      return f(type_name("HostTensor"), x.type, x.shape, nbytes);
    } else {
      // Serializing: the one place where the bytes are copied (they leave the process).
      std::vector<uint8_t> payload(reinterpret_cast<const uint8_t*>(x.data.get()),
                                   reinterpret_cast<const uint8_t*>(x.data.get()) + x.nbytes);
      return f(type_name("HostTensor"), x.type, x.shape, payload);
    }
  } else {
    auto payload = std::make_shared<std::vector<uint8_t>>();
    auto adopt_payload = [&x, payload]() -> caf::error {
      x.nbytes = payload->size();
      x.data = std::shared_ptr<const std::byte>(
        payload, reinterpret_cast<const std::byte*>(payload->data()));
      return caf::none;
    };
    return f(type_name("HostTensor"), x.type, x.shape, *payload,
             caf::meta::load_callback(adopt_payload));
  }
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, NamedTensor& x) {
  return f(caf::meta::type_name("NamedTensor"), x.name, x.tensor);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, DeviceTensorRef& x) {
  return f(caf::meta::type_name("DeviceTensorRef"), x.device, x.device_uuid, x.pointer,
           x.ipc_handle, x.offset, x.nbytes, x.type, x.shape, x.ref_counter_handle,
           x.ref_counter_offset, x.event_handle, x.event_sync_required);
}

} // namespace rlserve
