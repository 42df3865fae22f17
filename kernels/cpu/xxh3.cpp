// XXH3-64 on the CPU, written from the published algorithm (see kernels/xxh3.hpp): the reference
// the CUDA kernel is checked against. The long path below keeps the specification's order,
// stripe after stripe over 8 accumulator lanes; the kernel regroups the same additions.
#include "kernels/xxh3.hpp"

namespace rlserve::kernels {

namespace {

// One 64-byte stripe into the 8 lanes, with the key at `secret`.
void accumulate_stripe(uint64_t acc[8], const uint8_t* stripe, const uint8_t* secret) {
  for (int i = 0; i < 8; ++i) {
    const uint64_t word = xxh3_read64(stripe + 8 * i);
    acc[i ^ 1] += word;
    acc[i] += xxh3_stripe_product(word, xxh3_read64(secret + 8 * i));
  }
}

uint64_t xxh3_64_long(const uint8_t* in, uint64_t len, const uint8_t* secret) {
  uint64_t acc[8];
  for (int i = 0; i < 8; ++i)
    acc[i] = xxh3_initial_acc(i);
  const uint64_t full_blocks = (len - 1) / k_xxh3_block_len;
  for (uint64_t b = 0; b < full_blocks; ++b) {
    const uint8_t* block = in + b * k_xxh3_block_len;
    for (int n = 0; n < k_xxh3_stripes_per_block; ++n)
      accumulate_stripe(acc, block + n * k_xxh3_stripe_len, secret + 8 * n);
    for (int i = 0; i < 8; ++i)
      acc[i] = xxh3_scramble(acc[i], xxh3_read64(secret + k_xxh3_scramble_offset + 8 * i));
  }
  // The last block is never scrambled: its whole stripes, then the input's last 64 bytes.
  const uint8_t* rest = in + full_blocks * k_xxh3_block_len;
  const uint64_t rest_stripes = (len - 1 - full_blocks * k_xxh3_block_len) / k_xxh3_stripe_len;
  for (uint64_t n = 0; n < rest_stripes; ++n)
    accumulate_stripe(acc, rest + n * k_xxh3_stripe_len, secret + 8 * n);
  accumulate_stripe(acc, in + len - k_xxh3_stripe_len, secret + k_xxh3_last_stripe_offset);
  return xxh3_merge(acc, len, secret);
}

} // namespace

uint64_t xxh3_64(const void* data, uint64_t length) {
  const auto* in = static_cast<const uint8_t*>(data);
  if (length <= k_xxh3_midsize_max)
    return xxh3_64_short(in, length, k_xxh3_default_secret);
  return xxh3_64_long(in, length, k_xxh3_default_secret);
}

std::string xxh3_batch_problem(const xxh3_batch_args& a) {
  if (a.count < 0)
    return "the number of buffers to hash is negative (" + std::to_string(a.count) + ")";
  if (a.count > 0 && (a.data == nullptr || a.lengths == nullptr || a.digests == nullptr))
    return "the data, lengths and digests arrays are required for " + std::to_string(a.count) +
           " buffers";
  return {};
}

kernel_status xxh3_batch_ref(const xxh3_batch_args& a) {
  if (!xxh3_batch_problem(a).empty())
    return kernel_status::invalid_problem;
  for (int64_t t = 0; t < a.count; ++t)
    if (a.data[t] == nullptr && a.lengths[t] > 0)
      return kernel_status::invalid_problem;
  for (int64_t t = 0; t < a.count; ++t)
    a.digests[t] = xxh3_64(a.data[t], a.lengths[t]);
  return kernel_status::ok;
}

} // namespace rlserve::kernels
