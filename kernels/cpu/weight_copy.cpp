#include "kernels/weight_copy.hpp"

#include <cmath>
#include <cstring>

#include "kernels/bf16.hpp"

namespace rlserve::kernels {

weight_type weight_type_of(dtype t) {
  switch (t) {
    case dtype::bf16: return weight_type::bf16;
    case dtype::f16: return weight_type::f16;
    case dtype::f32: return weight_type::f32;
    default: return weight_type::other;
  }
}

kernel_status weight_batch_can_implement(const weight_batch_args& a, bool convert) {
  if (a.tensors < 0)
    return kernel_status::invalid_problem;
  if (a.tensors == 0)
    return kernel_status::ok;
  if (!a.src || !a.count || !a.type || (convert ? !a.dst : !a.nonfinite))
    return kernel_status::invalid_problem;
  return kernel_status::ok;
}

namespace {

// The float value of element i of a floating tensor (bytes read with memcpy: any alignment).
float element(const void* src, weight_type t, int64_t i) {
  const auto* b = static_cast<const unsigned char*>(src);
  if (t == weight_type::f32) {
    float v;
    std::memcpy(&v, b + 4 * i, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, b + 2 * i, 2);
  return t == weight_type::bf16 ? bf16_to_float(h) : f16_to_float(h);
}

} // namespace

kernel_status weight_scan_ref(const weight_batch_args& a) {
  if (auto s = weight_batch_can_implement(a, false); s != kernel_status::ok)
    return s;
  for (int64_t t = 0; t < a.tensors; ++t) {
    a.nonfinite[t] = k_weight_all_finite;
    const auto type = static_cast<weight_type>(a.type[t]);
    if (type == weight_type::other)
      continue;
    for (int64_t i = 0; i < a.count[t]; ++i)
      if (!std::isfinite(element(a.src[t], type, i))) {
        a.nonfinite[t] = static_cast<uint64_t>(i);
        break;
      }
  }
  return kernel_status::ok;
}

kernel_status weight_to_bf16_ref(const weight_batch_args& a) {
  if (auto s = weight_batch_can_implement(a, true); s != kernel_status::ok)
    return s;
  for (int64_t t = 0; t < a.tensors; ++t) {
    const auto type = static_cast<weight_type>(a.type[t]);
    if (type == weight_type::other)
      return kernel_status::invalid_problem;
    auto* out = static_cast<unsigned char*>(a.dst[t]);
    for (int64_t i = 0; i < a.count[t]; ++i) {
      uint16_t v;
      if (type == weight_type::bf16)
        std::memcpy(&v, static_cast<const unsigned char*>(a.src[t]) + 2 * i, 2);
      else
        v = float_to_bf16(element(a.src[t], type, i));
      std::memcpy(out + 2 * i, &v, 2);
    }
  }
  return kernel_status::ok;
}

std::size_t weight_batch_table_bytes(std::size_t tensors) {
  // src, dst, count (8 bytes each), nonfinite (8), type (1), rounded up to 16.
  return (tensors * 33 + 15) / 16 * 16;
}

} // namespace rlserve::kernels
