// Batched weight copies for updates on the device: many tensors of one update message in one
// launch. Two operations, each over a list of tensors:
//
//   scan:     for every floating tensor, the least flat index of a NaN or Inf (or
//             k_weight_all_finite). Read only: an update message is checked whole before any
//             byte of it is written, so a refused message stages nothing.
//   to_bf16:  dst[i] = bf16_rn(src[i]) for bf16 / f16 / f32 sources (bf16 is a plain copy), the
//             rounding of kernels/bf16.hpp (round to nearest even).
//
// Tensors are contiguous; pointers may have any alignment a dtype allows (a tensor of a flattened
// bucket starts wherever the trainer put it). The per-tensor arrays of the CUDA twin live in
// device memory (weight_batch_device uploads them).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/kernel_status.hpp"
#include "messages/dtype.hpp"
#include "messages/expected.hpp"

using cudaStream_t = struct CUstream_st*;

namespace rlserve::kernels {

constexpr uint64_t k_weight_all_finite = ~uint64_t{0};

// dtype codes the kernels understand (a subset of rlserve::dtype; integer tensors are never
// scanned: every bit pattern is a value).
enum class weight_type : uint8_t { bf16 = 1, f16 = 2, f32 = 3, other = 0 };
weight_type weight_type_of(dtype t);

struct weight_batch_args {
  int64_t tensors = 0;
  const void* const* src = nullptr;  // [tensors]
  void* const* dst = nullptr;        // [tensors] bf16 outputs (to_bf16); unused by scan
  const int64_t* count = nullptr;    // [tensors] elements
  const uint8_t* type = nullptr;     // [tensors] weight_type of src
  uint64_t* nonfinite = nullptr;     // [tensors] scan output: least flat index, or k_weight_all_finite
};

kernel_status weight_batch_can_implement(const weight_batch_args& a, bool convert);
// CPU references.
kernel_status weight_scan_ref(const weight_batch_args& a);
kernel_status weight_to_bf16_ref(const weight_batch_args& a);
// CUDA twins: every array is in device memory. scan initialises `nonfinite` itself.
kernel_status weight_scan_launch(const weight_batch_args& a, cudaStream_t stream);
kernel_status weight_to_bf16_launch(const weight_batch_args& a, cudaStream_t stream);

// One tensor of a device batch, by host-side description.
struct weight_batch_item {
  const void* src = nullptr; // device pointer
  void* dst = nullptr;       // device pointer (to_bf16)
  int64_t count = 0;
  dtype type = dtype::bf16;
};

// Host wrappers for the device: upload the per-tensor arrays (through `table`, a device buffer
// the caller keeps until the stream passes this point; weight_batch_table_bytes sizes it), launch,
// and for scan read the flags back (waits for the stream). Returns, per tensor, the least
// non-finite index or k_weight_all_finite.
std::size_t weight_batch_table_bytes(std::size_t tensors);
rlserve::expected<std::vector<uint64_t>> weight_scan_device(std::span<const weight_batch_item> items,
                                                             void* table, cudaStream_t stream);
rlserve::status weight_to_bf16_device(std::span<const weight_batch_item> items, void* table,
                                      cudaStream_t stream);

} // namespace rlserve::kernels
