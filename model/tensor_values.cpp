#include "model/tensor_values.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "kernels/bf16.hpp"

namespace rlserve::model {

namespace {

template <class T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

} // namespace

expected<std::vector<float>> tensor_values(const HostTensor& t, int64_t count) {
  auto numel = t.numel();
  if (numel < 0 || static_cast<std::size_t>(numel) * element_size(t.type) != t.nbytes)
    return fail("tensor holds " + std::to_string(t.nbytes) + " bytes, not the " +
                std::to_string(numel) + " x " + std::to_string(element_size(t.type)) +
                " its shape and dtype imply");
  auto n = static_cast<std::size_t>(std::clamp<int64_t>(count, 0, numel));
  std::vector<float> out(n);
  const std::byte* p = t.data.get();
  for (std::size_t i = 0; i < n; ++i) {
    switch (t.type) {
      case dtype::f32: out[i] = load<float>(p + 4 * i); break;
      case dtype::f64: out[i] = static_cast<float>(load<double>(p + 8 * i)); break;
      case dtype::bf16: out[i] = kernels::bf16_to_float(load<uint16_t>(p + 2 * i)); break;
      case dtype::f16: out[i] = kernels::f16_to_float(load<uint16_t>(p + 2 * i)); break;
      case dtype::i8: out[i] = static_cast<float>(load<int8_t>(p + i)); break;
      case dtype::u8: out[i] = static_cast<float>(load<uint8_t>(p + i)); break;
      case dtype::boolean: out[i] = load<uint8_t>(p + i) != 0 ? 1.0f : 0.0f; break;
      case dtype::i16: out[i] = static_cast<float>(load<int16_t>(p + 2 * i)); break;
      case dtype::i32: out[i] = static_cast<float>(load<int32_t>(p + 4 * i)); break;
      case dtype::i64: out[i] = static_cast<float>(load<int64_t>(p + 8 * i)); break;
    }
  }
  return out;
}

} // namespace rlserve::model
