#include "messages/tensor.hpp"

#include <algorithm>
#include <cstring>

namespace rlserve {

HostTensor HostTensor::copy_of(dtype type, std::vector<int64_t> shape,
                               std::span<const std::byte> bytes) {
  return adopt(type, std::move(shape), std::vector<std::byte>(bytes.begin(), bytes.end()));
}

HostTensor HostTensor::adopt(dtype type, std::vector<int64_t> shape, std::vector<std::byte> bytes) {
  auto owner = std::make_shared<std::vector<std::byte>>(std::move(bytes));
  HostTensor t;
  t.type = type;
  t.shape = std::move(shape);
  t.nbytes = owner->size();
  t.data = std::shared_ptr<const std::byte>(owner, owner->data());
  return t;
}

HostTensor HostTensor::alias(dtype type, std::vector<int64_t> shape,
                             std::shared_ptr<const void> owner, const std::byte* first,
                             std::size_t nbytes) {
  HostTensor t;
  t.type = type;
  t.shape = std::move(shape);
  t.nbytes = nbytes;
  t.data = std::shared_ptr<const std::byte>(std::move(owner), first);
  return t;
}

namespace {

// Element i of the tensor is non-finite iff its exponent field is all ones.
template <class Bits>
std::optional<std::size_t> first_all_ones(const std::byte* p, std::size_t n, Bits exponent) {
  constexpr std::size_t k_block = 4096;
  for (std::size_t start = 0; start < n; start += k_block) {
    const std::size_t end = std::min(n, start + k_block);
    bool any = false;
    for (std::size_t i = start; i < end; ++i) {
      Bits v;
      std::memcpy(&v, p + i * sizeof(Bits), sizeof(Bits)); // data may be unaligned
      any |= (v & exponent) == exponent;
    }
    if (!any)
      continue;
    for (std::size_t i = start; i < end; ++i) {
      Bits v;
      std::memcpy(&v, p + i * sizeof(Bits), sizeof(Bits));
      if ((v & exponent) == exponent)
        return i;
    }
  }
  return std::nullopt;
}

} // namespace

std::optional<std::size_t> first_non_finite(const HostTensor& t) {
  const auto* p = t.data.get();
  if (p == nullptr)
    return std::nullopt;
  switch (t.type) {
    case dtype::f32: return first_all_ones<uint32_t>(p, t.nbytes / 4, 0x7f800000u);
    case dtype::f16: return first_all_ones<uint16_t>(p, t.nbytes / 2, uint16_t{0x7c00});
    case dtype::bf16: return first_all_ones<uint16_t>(p, t.nbytes / 2, uint16_t{0x7f80});
    case dtype::f64: return first_all_ones<uint64_t>(p, t.nbytes / 8, 0x7ff0000000000000ull);
    case dtype::i8:
    case dtype::u8:
    case dtype::i16:
    case dtype::i32:
    case dtype::i64:
    case dtype::boolean: return std::nullopt;
  }
  return std::nullopt;
}

} // namespace rlserve
