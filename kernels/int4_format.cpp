#include "kernels/int4_format.hpp"

namespace rlserve::kernels {

std::optional<int4_recipe> parse_int4_recipe(std::string_view name) {
  for (auto r : {int4_recipe::sym_qat, int4_recipe::sym, int4_recipe::asym})
    if (name == to_string(r))
      return r;
  return std::nullopt;
}

std::optional<zero_point_layout> parse_zero_point_layout(std::string_view name) {
  for (auto l : {zero_point_layout::standard, zero_point_layout::miles})
    if (name == to_string(l))
      return l;
  return std::nullopt;
}

namespace {

// Largest element count one call accepts: keeps every int64 index product far from overflow.
constexpr int64_t k_max_elements = int64_t{1} << 46;

std::string dim(const char* name, int64_t v) { return std::string(name) + " = " + std::to_string(v); }

} // namespace

std::string int4_check_load_shape(const int4_shape& s, bool has_zero_point) {
  if (s.batch < 1)
    return dim("batch", s.batch) + " must be at least 1";
  if (s.n < 1)
    return dim("n (output features)", s.n) + " must be at least 1";
  if (s.k < 1)
    return dim("k (input features)", s.k) + " must be at least 1";
  if (s.batch > k_max_elements / s.n / s.k)
    return "batch x n x k = " + std::to_string(s.batch) + " x " + std::to_string(s.n) + " x " +
           std::to_string(s.k) + " is too large for one call (at most 2^46 weights)";
  if (!int4_group_size_supported(s.group_size))
    return "group size " + std::to_string(s.group_size) +
           " is not supported (use 32, 64, 128, or -1 for one group per output channel)";
  if (s.k % k_int4_per_word != 0)
    return dim("k (input features)", s.k) +
           " is not a multiple of 8 (8 codes pack into one int32 along k)";
  if (s.k % int4_group_len(s) != 0)
    return dim("k (input features)", s.k) + " is not a multiple of the group size " +
           std::to_string(s.group_size);
  if (has_zero_point && s.n % k_int4_per_word != 0)
    return dim("n (output features)", s.n) +
           " is not a multiple of 8 (zero points pack 8 output channels into one int32)";
  return {};
}

std::string int4_check_serving_shape(const int4_shape& s) {
  if (auto m = int4_check_load_shape(s, false); !m.empty())
    return m;
  if (s.k % k_serving_tile_k != 0)
    return dim("k (input features)", s.k) +
           " is not a multiple of 16 (the serving layout stores 16 (k) x 64 (n) tiles)";
  if (s.n % k_serving_tile_n != 0)
    return dim("n (output features)", s.n) +
           " is not a multiple of 64 (the serving layout stores 16 (k) x 64 (n) tiles)";
  return {};
}

} // namespace rlserve::kernels
