// Reading a HostTensor's elements as floats, whatever its dtype (debug routes such as
// get_weights_by_name, and tests).
#pragma once

#include <cstdint>
#include <vector>

#include "messages/expected.hpp"
#include "messages/tensor.hpp"

namespace rlserve::model {

// The first `count` elements (clamped to numel) converted to float; integers convert exactly up
// to 2^24. Fails when the tensor's byte count does not match its shape.
expected<std::vector<float>> tensor_values(const HostTensor& t, int64_t count);

} // namespace rlserve::model
