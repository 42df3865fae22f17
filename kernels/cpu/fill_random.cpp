#include "kernels/fill_random.hpp"

#include "kernels/bf16.hpp"
#include "kernels/fill_random_value.hpp"

namespace rlserve::kernels {

kernel_status fill_random_can_implement(const fill_random_args& a) {
  if (a.count < 0 || (a.count > 0 && a.out == nullptr) || !(a.lo <= a.hi))
    return kernel_status::invalid_problem;
  if (a.kind != fill_random_args::bf16_uniform && a.kind != fill_random_args::word32)
    return kernel_status::invalid_problem;
  return kernel_status::ok;
}

kernel_status fill_random_ref(const fill_random_args& a) {
  if (auto s = fill_random_can_implement(a); s != kernel_status::ok)
    return s;
  for (int64_t i = 0; i < a.count; ++i) {
    const uint64_t r = fill_random_bits(a.seed, static_cast<uint64_t>(i));
    if (a.kind == fill_random_args::word32)
      static_cast<uint32_t*>(a.out)[i] = static_cast<uint32_t>(r);
    else
      static_cast<uint16_t*>(a.out)[i] = float_to_bf16(fill_random_uniform(r, a.lo, a.hi));
  }
  return kernel_status::ok;
}

} // namespace rlserve::kernels
