#include "messages/tensor.hpp"

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

} // namespace rlserve
