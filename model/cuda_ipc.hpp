// A trainer's GPU memory, opened for one update message (CUDA IPC). The trainer process keeps
// its tensors; the runner maps them into its own address space, reads them on its stream, and
// closes them again before it replies, so the trainer may free or reuse the memory afterwards.
//
// What is checked before any byte is read, each failure naming the tensor:
//   - the memory is on this runner's GPU (device UUID, when the reference gives one);
//   - the handle is a 64-byte cudaIpcMemHandle_t or PyTorch's shareable handle (version 2 or 3,
//     type 'c', then the 64 bytes; expandable segments, type 'e', are refused);
//   - the handle opens (a closed, foreign or corrupt handle does not);
//   - the byte count equals numel(shape) x element size, and [offset, offset + nbytes) lies
//     inside the allocation the handle names.
// Each distinct handle is opened once per message (CUDA refuses a second open of the same handle
// in one process), however many tensors point into it. PyTorch producers also send a
// ref-counter slot per pickled tensor and an event recorded after their last write: the reads
// wait for the event, and close() decrements the slot once the reads are done, which is what
// lets the trainer's caching allocator take the block back.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "messages/expected.hpp"
#include "messages/weight_update.hpp"

namespace rlserve::model {

// "GPU-4b652ae2-0ec6-7dcb-611e-8bd2e51d9120" (nvidia-smi's form) from either that form or
// PyTorch's (the same without "GPU-"), lower-cased; empty when `text` is not a UUID.
std::string normalize_gpu_uuid(std::string_view text);
// The UUID of CUDA device `device`, in nvidia-smi's form.
expected<std::string> cuda_device_uuid(int device);

// Where PyTorch's ref-counter slot `slot` lives in its shared-memory file: after a 64-byte
// header, 8 bytes (int64) per slot, 10000 slots per file.
constexpr std::size_t k_torch_ref_counter_header = 64;
constexpr uint64_t k_torch_ref_counter_slots = 10000;
// Decrements one slot (the consumer's release of one pickled tensor). The name must look like
// the files PyTorch makes ("/torch_<digits and _>").
status release_torch_ref_counter(const std::string& shm_name, uint64_t slot);

class ipc_mapping {
public:
  // Opens every tensor of `tensors` on `device` (the runner's), after the checks above. On
  // failure everything already opened is closed again.
  static expected<std::unique_ptr<ipc_mapping>> open(std::span<const NamedDeviceTensor> tensors,
                                                     int device);
  ~ipc_mapping();
  ipc_mapping(const ipc_mapping&) = delete;
  ipc_mapping& operator=(const ipc_mapping&) = delete;

  // Device address of tensor i's first byte in this process.
  const void* data(std::size_t i) const { return pointers_[i]; }
  std::size_t size() const { return pointers_.size(); }
  // Waits (on the host) for every producer event that asks for it: the trainer's writes to the
  // memory are finished when this returns.
  status wait_for_producer();
  // After the last read of the memory has finished (the caller synchronized): closes the handles
  // and events and releases the PyTorch ref-counter slots. Runs once; the destructor calls it.
  status close();

  struct opened_handle {
    std::vector<uint8_t> handle; // the 64 bytes of cudaIpcMemHandle_t
    void* base = nullptr;        // where it is mapped in this process
    std::size_t bytes = 0;       // size of the allocation it names
  };
  struct opened_event {
    std::vector<uint8_t> handle;
    void* event = nullptr; // cudaEvent_t
  };

private:
  ipc_mapping() = default;
  int device_ = 0;
  std::vector<const void*> pointers_;
  std::vector<opened_handle> handles_;
  std::vector<opened_event> events_;
  std::vector<std::pair<std::string, uint64_t>> ref_counters_;
  bool closed_ = false;
};

} // namespace rlserve::model
