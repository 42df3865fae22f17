// kernel_status: what every kernel's host API returns (mirrors cutlass::Status). Kernels never
// throw and never abort; the caller turns a status into a sentence for the user.
#pragma once

#include <string_view>

namespace rlserve::kernels {

enum class kernel_status {
  ok,
  invalid_problem,    // a shape or parameter the op does not define (zero rows, k % 8 != 0, ...)
  misaligned_operand, // a pointer or leading dimension below the alignment the kernel vectorizes to
  workspace_null,     // workspace_bytes(args) > 0 but no workspace was given
  not_supported,      // defined, but this build or device has no kernel for it
  cuda_error,         // a CUDA / cuBLAS / NCCL call failed; see cudaGetLastError() text in logs
};

constexpr std::string_view to_string(kernel_status s) {
  switch (s) {
    case kernel_status::ok: return "ok";
    case kernel_status::invalid_problem: return "invalid problem";
    case kernel_status::misaligned_operand: return "misaligned operand";
    case kernel_status::workspace_null: return "workspace is null";
    case kernel_status::not_supported: return "not supported";
    case kernel_status::cuda_error: return "CUDA error";
  }
  return "unknown";
}

} // namespace rlserve::kernels
