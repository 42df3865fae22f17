// A reader for the CUDA tensors PyTorch's multiprocessing pickler (ForkingPickler) writes, as
// trainers send them in SGLang's `serialized_named_tensors`: no Python, no execution. A small
// pickle machine accepts only the opcodes PyTorch emits for these objects and only the globals
// they name (torch's and SGLang's CUDA-tensor rebuild functions, torch.Tensor / Parameter /
// Size / storage classes / dtypes, SGLang's FlattenedTensorMetadata); anything else is refused
// with the opcode or global and its byte offset. Calls are never made: REDUCE of a rebuild
// function records its 15 arguments, which are then checked and turned into DeviceTensorRefs.
// docs/formats.md ("PyTorch CUDA IPC pickles") describes the layout this reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "messages/expected.hpp"
#include "messages/weight_update.hpp"

namespace rlserve {

// What the pickle holds, chosen by the request's load_format.
enum class torch_pickle_form : uint8_t {
  named_list = 1,   // list[tuple[str, Tensor]] (load_format absent or "direct")
  flattened_bucket, // {"flattened_tensor": Tensor, "metadata": [FlattenedTensorMetadata, ...]}
};

// Bounds on what one pickle may make the reader hold, so hostile input cannot exhaust memory
// or time. The defaults are far above what a trainer sends (a 1 GiB bucket is a few hundred
// bytes of pickle; a 300-tensor list about 70 KB).
struct torch_pickle_limits {
  std::size_t max_bytes = std::size_t{64} << 20; // the pickle itself
  std::size_t max_objects = std::size_t{1} << 22; // values made (ints, strings, tuples, ...)
  std::size_t max_stack = std::size_t{1} << 16;   // values on the stack at once
  std::size_t max_marks = 64;                     // open MARKs (container nesting)
  std::size_t max_memo = std::size_t{1} << 20;    // memo entries (and the largest memo index)
  std::size_t max_items = std::size_t{1} << 20;   // elements of one list, tuple or dict
  std::size_t max_text = std::size_t{1} << 16;    // bytes of one string or bytes value
  std::size_t max_tensors = std::size_t{1} << 20; // tensors produced
};

// Reads one pickle into named device tensors, in pickle order.
//  - offset = storage_offset_bytes + storage_offset (elements) * itemsize, plus, for a bucket
//    entry, start_idx * itemsize(flattened_tensor's dtype); nbytes = numel * itemsize.
//  - device_uuid is "GPU-" + the UUID text SGLang's reduction sends instead of a device index
//    (torch writes it without the prefix); device is then 0. A plain index stays in device.
//  - ipc_handle is the storage handle as sent: PyTorch's 66 bytes (version 2 or 3, 'c', the
//    64-byte cudaIpcMemHandle_t) or a raw 64-byte handle.
//  - Every pickled tensor owns one decrement of its ref-counter slot. In a bucket the one
//    flattened tensor becomes many refs: only the first carries ref_counter_handle; all carry
//    the event handle, since every read must wait for it.
//  - A tensor without storage (handle None, numel 0: slime's empty filler bucket) yields
//    nothing.
// Errors name the tensor (or the byte offset and opcode / global for a malformed stream).
expected<std::vector<NamedDeviceTensor>> read_torch_ipc_pickle(std::span<const std::byte> pickle,
                                                              torch_pickle_form form,
                                                              const torch_pickle_limits& limits = {});

// The names (as Python's pickletools spells them) of the opcodes the reader accepts.
std::span<const std::string_view> torch_pickle_opcodes();

// The globals ("module.name") the reader accepts.
std::vector<std::string> torch_pickle_globals();

// Checks a storage handle as rlserve takes it (from a pickle or from device_tensors JSON):
// 64 raw bytes, or PyTorch's 66 bytes with version 2 or 3 and type 'c'. The error says what is
// wrong, e.g. that type 'e' comes from expandable segments.
status check_ipc_handle(std::span<const uint8_t> handle);

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (lowercase hex, nvidia-smi's form) from torch's
// text (no prefix) or from text that already has the "GPU-" prefix; an error otherwise.
expected<std::string> normalize_device_uuid(std::string_view text);

// A ref-counter shared-memory name as PyTorch makes them ("/torch_<pid>_<rand>_<n>"): a leading
// '/', then at most 250 of [A-Za-z0-9_.-]. Anything else (another '/', "..") is refused, so a
// name can only ever open a file directly under /dev/shm.
status check_ref_counter_handle(std::string_view name);

} // namespace rlserve
