// The kernel op harness: every case is one op at one shape, stated as data — the arrays the op
// reads and writes, how each starts, how close the CUDA kernel must come to the CPU twin on each
// array it writes — plus one call that fills the op's args struct from the arrays' pointers and
// runs the CPU reference (`*_ref`) or the CUDA kernel (`*_launch`). Adding a shape is one entry in
// op_cases(); adding an op is one function here. op_harness_test.cpp runs every case on the CPU
// (twice: the same bits; what it writes finite and not all zeros); op_harness_gpu_test.cu runs every
// case on both and compares every written array.
//
// The hand-written *_gpu_test.cu files keep what a table does not state well: refusals, padding
// and poison checks beyond an array, scheduling branches, sampling distributions.
// Header-only and Boost-free: the CPU test (g++) and the GPU test (nvcc) both include it.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/decoder_ops.hpp"
#include "kernels/gemm_bf16_invariant.hpp"
#include "kernels/gemv_bf16.hpp"
#include "kernels/rms_norm.hpp"
#include "kernels/sampler.hpp"
#include "tests/kernels/int4_test_util.hpp"

namespace rlserve::test::ops {

enum class elem { f32, bf16, i32 };

inline std::size_t elem_size(elem e) { return e == elem::bf16 ? 2 : 4; }

enum class role {
  input,  // read only
  output, // written whole by the op: on the device it starts as 0xD5 poison, on the host as zeros
  inout,  // starts from its fill and is compared after the call (a KV cache the op writes slots of)
};

struct array {
  std::string name;
  elem type = elem::f32;
  int64_t count = 0;
  role use = role::input;
  double sigma = 1.0;     // gaussian fill of f32 / bf16 arrays (0: zeros)
  int64_t lo = 0, hi = 0; // i32 arrays: uniform in [lo, hi)
  // Written arrays: the relative L2 distance allowed between the CUDA result and the CPU twin's;
  // 0 means the same bits.
  double max_rel_l2 = 0.0;
};

enum class backend { cpu, cuda };

using host_arrays = std::vector<std::vector<std::byte>>;

struct op_case {
  std::string name; // op and shape
  std::vector<array> arrays;
  // After the fill: contents a fill cannot say (padding ids, RoPE tables, slot lists). Optional.
  std::function<void(host_arrays&)> adjust;
  // Runs the op on the arrays' pointers (host pointers for the CPU, device pointers for CUDA on
  // the default stream), in the order of `arrays`.
  std::function<kernels::kernel_status(backend, const std::vector<void*>&)> call;
};

template <class T>
T* as(void* p) {
  return static_cast<T*>(p);
}

template <class T>
T* at(host_arrays& a, std::size_t i) {
  return reinterpret_cast<T*>(a[i].data());
}

// The arrays' host contents before the call, from the case's name (so every case has its own
// numbers and the same ones on every run).
inline host_arrays make_arrays(const op_case& c) {
  uint64_t seed = 1469598103934665603ull;
  for (char ch : c.name)
    seed = (seed ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  host_arrays out;
  for (std::size_t i = 0; i < c.arrays.size(); ++i) {
    const auto& a = c.arrays[i];
    int4_test::rng r(seed + i);
    std::vector<std::byte> bytes(static_cast<std::size_t>(a.count) * elem_size(a.type));
    if (a.use != role::output) {
      for (int64_t k = 0; k < a.count; ++k) {
        const auto at_k = bytes.data() + static_cast<std::size_t>(k) * elem_size(a.type);
        if (a.type == elem::i32) {
          const auto v = static_cast<int32_t>(a.lo + (a.hi > a.lo ? r.below(a.hi - a.lo) : 0));
          std::memcpy(at_k, &v, 4);
        } else if (a.type == elem::f32) {
          const auto v = static_cast<float>(a.sigma * r.gaussian());
          std::memcpy(at_k, &v, 4);
        } else {
          const auto v = kernels::float_to_bf16(static_cast<float>(a.sigma * r.gaussian()));
          std::memcpy(at_k, &v, 2);
        }
      }
    }
    out.push_back(std::move(bytes));
  }
  if (c.adjust)
    c.adjust(out);
  return out;
}

inline double value_at(elem e, const std::vector<std::byte>& v, std::size_t i) {
  if (e == elem::f32) {
    float f;
    std::memcpy(&f, v.data() + 4 * i, 4);
    return f;
  }
  if (e == elem::bf16) {
    uint16_t b;
    std::memcpy(&b, v.data() + 2 * i, 2);
    return kernels::bf16_to_float(b);
  }
  int32_t n;
  std::memcpy(&n, v.data() + 4 * i, 4);
  return n;
}

// ||got - want|| / ||want|| (1 when want is all zeros and got is not; infinite on a non-finite
// value in got where want is finite).
inline double rel_l2(elem e, const std::vector<std::byte>& got, const std::vector<std::byte>& want) {
  double num = 0, den = 0;
  const std::size_t n = want.size() / elem_size(e);
  for (std::size_t i = 0; i < n; ++i) {
    const double g = value_at(e, got, i), w = value_at(e, want, i);
    if (!std::isfinite(g) && std::isfinite(w))
      return INFINITY;
    num += (g - w) * (g - w);
    den += w * w;
  }
  return den > 0 ? std::sqrt(num / den) : (num > 0 ? 1.0 : 0.0);
}

inline bool all_finite(elem e, const std::vector<std::byte>& v) {
  for (std::size_t i = 0; i < v.size() / elem_size(e); ++i)
    if (!std::isfinite(value_at(e, v, i)))
      return false;
  return true;
}

inline bool any_nonzero(elem e, const std::vector<std::byte>& v) {
  for (std::size_t i = 0; i < v.size() / elem_size(e); ++i)
    if (value_at(e, v, i) != 0.0)
      return true;
  return false;
}

// ---- the ops ----------------------------------------------------------------------------------------
// Tolerances: fp32 math on both sides with one bf16 rounding per stored value, so the differences
// are summation order and expf / rsqrtf ulps — a bf16 ulp flip on a few elements (2e-3 relative
// L2); fp32 outputs of fp32 sums over k terms differ by the order alone (about 1e-7 * sqrt(k)
// relative; 5e-5 leaves room at k = 4096 and still sees any wrong term); copies and gathers are
// exact.

constexpr double k_bf16_out = 2e-3;
constexpr double k_f32_sum = 5e-5;

inline op_case rms_norm_case(int64_t rows, int64_t cols) {
  op_case c;
  c.name = "rms_norm " + std::to_string(rows) + "x" + std::to_string(cols);
  c.arrays = {{"x", elem::f32, rows * cols, role::input, 2.0},
              {"weight", elem::f32, cols, role::input, 0.1},
              {"y", elem::f32, rows * cols, role::output, 0, 0, 0, 1e-6}};
  c.adjust = [](host_arrays& a) { // Qwen3 stores the scale itself: around 1
    for (std::size_t i = 0; i < a[1].size() / 4; ++i)
      at<float>(a, 1)[i] += 1.0f;
  };
  c.call = [rows, cols](backend b, const std::vector<void*>& p) {
    const kernels::rms_norm_args args{as<float>(p[0]), as<float>(p[1]), as<float>(p[2]), rows, cols, 1e-6f};
    return b == backend::cpu ? kernels::rms_norm_ref(args) : kernels::rms_norm_launch(args, nullptr);
  };
  return c;
}

// Ids outside [0, vocab) are padding: zeros.
inline op_case embed_case(int64_t tokens, int64_t vocab, int64_t hidden) {
  op_case c;
  c.name = "embed " + std::to_string(tokens) + " of " + std::to_string(vocab) + "x" + std::to_string(hidden);
  c.arrays = {{"ids", elem::i32, tokens, role::input, 0, 0, vocab},
              {"table", elem::bf16, vocab * hidden, role::input, 1.0},
              {"residual", elem::f32, tokens * hidden, role::output, 0, 0, 0, 0.0}};
  c.adjust = [tokens, vocab](host_arrays& a) {
    at<int32_t>(a, 0)[tokens / 2] = -1;
    at<int32_t>(a, 0)[tokens - 1] = static_cast<int32_t>(vocab);
  };
  c.call = [tokens, vocab, hidden](backend b, const std::vector<void*>& p) {
    const kernels::embed_args args{as<int32_t>(p[0]), as<uint16_t>(p[1]), as<float>(p[2]), tokens, vocab, hidden};
    return b == backend::cpu ? kernels::embed_ref(args) : kernels::embed_launch(args, nullptr);
  };
  return c;
}

// With delta: residual += delta, then the norm. Without: the norm of rows picked by an index (the
// last-token rows before lm_head), one of them padding (-1: zeros).
inline op_case add_rms_norm_case(int64_t rows, int64_t cols, bool with_delta) {
  op_case c;
  c.name = "add_rms_norm " + std::to_string(rows) + "x" + std::to_string(cols) +
           (with_delta ? " +delta" : " indexed");
  c.arrays = {{"residual", elem::f32, rows * cols, role::inout, 3.0, 0, 0, 1e-6},
              {"delta", elem::bf16, with_delta ? rows * cols : 0, role::input, 1.0},
              {"weight", elem::bf16, cols, role::input, 0.5},
              {"rows_index", elem::i32, with_delta ? 0 : rows, role::input, 0, 0, rows},
              {"out", elem::bf16, rows * cols, role::output, 0, 0, 0, k_bf16_out}};
  if (!with_delta)
    c.adjust = [](host_arrays& a) { at<int32_t>(a, 3)[a[3].size() / 8] = -1; };
  c.call = [rows, cols, with_delta](backend b, const std::vector<void*>& p) {
    const kernels::add_rms_norm_args args{as<float>(p[0]), with_delta ? as<uint16_t>(p[1]) : nullptr,
                                          as<uint16_t>(p[2]), with_delta ? nullptr : as<int32_t>(p[3]),
                                          as<uint16_t>(p[4]), rows, cols, 1e-6f};
    return b == backend::cpu ? kernels::add_rms_norm_ref(args) : kernels::add_rms_norm_launch(args, nullptr);
  };
  return c;
}

// Tokens at scattered positions write their K and V into scattered slots of a zeroed cache; one
// token is padding (slot -1: q only, no KV write).
inline op_case qk_norm_rope_kv_case(int64_t tokens, int64_t q_heads, int64_t kv_heads, int64_t head_dim) {
  const int64_t positions = 512, slots = 4 * tokens;
  op_case c;
  c.name = "qk_norm_rope_kv " + std::to_string(tokens) + " tokens, heads " + std::to_string(q_heads) + "/" +
           std::to_string(kv_heads) + " x " + std::to_string(head_dim);
  c.arrays = {{"qkv", elem::bf16, tokens * (q_heads + 2 * kv_heads) * head_dim, role::input, 2.0},
              {"q_norm", elem::bf16, head_dim, role::input, 0.5},
              {"k_norm", elem::bf16, head_dim, role::input, 0.5},
              {"rope_cos", elem::f32, positions * head_dim / 2, role::input, 0.0},
              {"rope_sin", elem::f32, positions * head_dim / 2, role::input, 0.0},
              {"positions", elem::i32, tokens, role::input, 0, 0, positions},
              {"slots", elem::i32, tokens, role::input},
              {"q_out", elem::bf16, tokens * q_heads * head_dim, role::output, 0, 0, 0, k_bf16_out},
              {"k_cache", elem::bf16, slots * kv_heads * head_dim, role::inout, 0.0, 0, 0, k_bf16_out},
              {"v_cache", elem::bf16, slots * kv_heads * head_dim, role::inout, 0.0, 0, 0, 0.0}};
  c.adjust = [=](host_arrays& a) {
    for (int64_t p = 0; p < positions; ++p)
      for (int64_t i = 0; i < head_dim / 2; ++i) {
        const double angle = double(p) * std::pow(1e6, -2.0 * double(i) / double(head_dim));
        at<float>(a, 3)[p * head_dim / 2 + i] = static_cast<float>(std::cos(angle));
        at<float>(a, 4)[p * head_dim / 2 + i] = static_cast<float>(std::sin(angle));
      }
    for (int64_t t = 0; t < tokens; ++t) // distinct slots, spread over the cache
      at<int32_t>(a, 6)[t] = static_cast<int32_t>((t * 4 + 3 * (t % 3)) % slots);
    at<int32_t>(a, 6)[tokens / 2] = -1;
  };
  c.call = [=](backend b, const std::vector<void*>& p) {
    const kernels::qk_norm_rope_kv_args args{
      as<uint16_t>(p[0]), as<uint16_t>(p[1]), as<uint16_t>(p[2]), as<float>(p[3]),
      as<float>(p[4]),    as<int32_t>(p[5]),  as<int32_t>(p[6]),  as<uint16_t>(p[7]),
      as<uint16_t>(p[8]), as<uint16_t>(p[9]), tokens,             q_heads,
      kv_heads,           head_dim,           positions,          slots,
      1e-6f};
    return b == backend::cpu ? kernels::qk_norm_rope_kv_ref(args) : kernels::qk_norm_rope_kv_launch(args, nullptr);
  };
  return c;
}

inline op_case silu_mul_case(int64_t rows, int64_t cols) {
  op_case c;
  c.name = "silu_mul_bf16 " + std::to_string(rows) + "x" + std::to_string(cols);
  c.arrays = {{"gate_up", elem::bf16, rows * 2 * cols, role::input, 3.0},
              {"out", elem::bf16, rows * cols, role::output, 0, 0, 0, k_bf16_out}};
  c.call = [rows, cols](backend b, const std::vector<void*>& p) {
    const kernels::silu_mul_bf16_args args{as<uint16_t>(p[0]), as<uint16_t>(p[1]), rows, cols};
    return b == backend::cpu ? kernels::silu_mul_bf16_ref(args) : kernels::silu_mul_bf16_launch(args, nullptr);
  };
  return c;
}

// y = x w^T for decode-size batches; fp32 or bf16 output.
inline op_case gemv_bf16_case(int64_t rows, int64_t n, int64_t k, bool f32_out) {
  op_case c;
  c.name = "gemv_bf16 " + std::to_string(rows) + "x" + std::to_string(k) + " by " + std::to_string(n) + "x" +
           std::to_string(k) + (f32_out ? " fp32 out" : " bf16 out");
  c.arrays = {{"x", elem::bf16, rows * k, role::input, 1.0},
              {"w", elem::bf16, n * k, role::input, 0.05},
              {"y", f32_out ? elem::f32 : elem::bf16, rows * n, role::output, 0, 0, 0,
               f32_out ? k_f32_sum : k_bf16_out}};
  c.call = [=](backend b, const std::vector<void*>& p) {
    const kernels::gemv_bf16_args args{as<uint16_t>(p[0]), as<uint16_t>(p[1]), p[2], rows, n, k, n, f32_out};
    return b == backend::cpu ? kernels::gemv_bf16_ref(args) : kernels::gemv_bf16_launch(args, nullptr);
  };
  return c;
}

// y = x w^T whose rows do not depend on each other (the batch-invariant forward's linears): one
// row-block variant up to 16 rows, another above; fp32 or bf16 output.
inline op_case gemm_bf16_invariant_case(int64_t rows, int64_t n, int64_t k, bool f32_out) {
  op_case c;
  c.name = "gemm_bf16_invariant " + std::to_string(rows) + "x" + std::to_string(k) + " by " + std::to_string(n) +
           "x" + std::to_string(k) + (f32_out ? " fp32 out" : " bf16 out");
  c.arrays = {{"x", elem::bf16, rows * k, role::input, 1.0},
              {"w", elem::bf16, n * k, role::input, 0.05},
              {"y", f32_out ? elem::f32 : elem::bf16, rows * n, role::output, 0, 0, 0,
               f32_out ? k_f32_sum : k_bf16_out}};
  c.call = [=](backend b, const std::vector<void*>& p) {
    const kernels::gemm_bf16_invariant_args args{as<uint16_t>(p[0]), as<uint16_t>(p[1]), p[2], rows, n, k, n, f32_out};
    return b == backend::cpu ? kernels::gemm_bf16_invariant_ref(args)
                             : kernels::gemm_bf16_invariant_launch(args, nullptr);
  };
  return c;
}

// The table: small shapes that reach the edges of each kernel, then the Qwen3-30B-A3B ones (hidden
// 2048, 32 query and 4 KV heads of 128, experts of 768, the 128-expert router).
// The GPU sampler with top-p replay's kept sets (kernels/sampler.hpp): one row per rule (greedy,
// top-p, top-k with top-p, top-p with min-p, a row that does not ask, top-k alone), logits peaked
// enough that every set fits kept_cap and the sorted path runs (the id-order walk and the
// bisection answer -1 on the device only, so a table case keeps to rows both list alike). Token
// and sets exact; the logprob over the set as close as the two sums' orders allow.
inline op_case sample_kept_case(int64_t vocab, int32_t kept_cap) {
  constexpr int64_t rows = 6;
  op_case c;
  c.name = "sample_kept " + std::to_string(vocab) + " cap " + std::to_string(kept_cap);
  c.arrays = {{"logits", elem::f32, rows * vocab, role::input, 3.0},
              {"temperature", elem::f32, rows, role::input, 0},
              {"top_k", elem::i32, rows, role::input},
              {"top_p", elem::f32, rows, role::input, 0},
              {"min_p", elem::f32, rows, role::input, 0},
              {"uniform", elem::f32, rows, role::input, 0},
              {"want_kept", elem::i32, rows, role::input},
              {"token", elem::i32, rows, role::output},
              {"logprob", elem::f32, rows, role::output, 0, 0, 0, 1e-6},
              {"kept_ids", elem::i32, rows * kept_cap, role::output},
              {"kept_count", elem::i32, rows, role::output}};
  c.adjust = [](host_arrays& a) {
    const float temperature[rows] = {0.0f, 0.8f, 1.0f, 0.7f, 1.0f, 1.2f};
    const int32_t top_k[rows] = {-1, -1, 20, -1, -1, 5};
    const float top_p[rows] = {1.0f, 0.6f, 0.9f, 0.8f, 0.5f, 1.0f};
    const float min_p[rows] = {0.0f, 0.0f, 0.0f, 0.05f, 0.0f, 0.0f};
    const float uniform[rows] = {0.0f, 0.37f, 0.91f, 0.05f, 0.5f, 0.73f};
    const int32_t want[rows] = {1, 1, 1, 1, 0, 1};
    for (int64_t r = 0; r < rows; ++r) {
      at<float>(a, 1)[r] = temperature[r];
      at<int32_t>(a, 2)[r] = top_k[r];
      at<float>(a, 3)[r] = top_p[r];
      at<float>(a, 4)[r] = min_p[r];
      at<float>(a, 5)[r] = uniform[r];
      at<int32_t>(a, 6)[r] = want[r];
    }
  };
  c.call = [vocab, kept_cap](backend b, const std::vector<void*>& p) {
    kernels::sample_args args{as<float>(p[0]), as<float>(p[1]), as<int32_t>(p[2]), as<float>(p[3]),
                              as<float>(p[4]), as<float>(p[5]), as<int32_t>(p[7]), as<float>(p[8]),
                              rows, vocab};
    args.want_kept = as<int32_t>(p[6]);
    args.kept_ids = as<int32_t>(p[9]);
    args.kept_count = as<int32_t>(p[10]);
    args.kept_cap = kept_cap;
    return b == backend::cpu ? kernels::sample_ref(args) : kernels::sample_launch(args, nullptr, nullptr);
  };
  return c;
}

inline std::vector<op_case> op_cases() {
  std::vector<op_case> out;
  for (auto [r, c] : {std::pair<int64_t, int64_t>{1, 64}, {3, 100}, {5, 1}, {2, 12345}, {17, 4096}, {128, 2048}})
    out.push_back(rms_norm_case(r, c));
  out.push_back(embed_case(9, 1000, 256));
  out.push_back(embed_case(64, 4096, 2048));
  for (int64_t cols : {64, 2048})
    for (bool delta : {true, false})
      out.push_back(add_rms_norm_case(37, cols, delta));
  out.push_back(add_rms_norm_case(1, 2048, true));
  out.push_back(qk_norm_rope_kv_case(11, 8, 2, 64));
  out.push_back(qk_norm_rope_kv_case(11, 8, 2, 128));
  out.push_back(qk_norm_rope_kv_case(40, 32, 4, 128));
  for (int64_t rows : {1, 13, 64})
    out.push_back(silu_mul_case(rows, 768));
  for (bool f32 : {true, false}) {
    out.push_back(gemv_bf16_case(1, 5120, 2048, f32)); // q/k/v fused
    out.push_back(gemv_bf16_case(1, 2048, 4096, f32)); // o_proj
    out.push_back(gemv_bf16_case(8, 128, 2048, f32));  // the router
    out.push_back(gemv_bf16_case(3, 37, 296, f32));    // odd sizes
    out.push_back(gemm_bf16_invariant_case(1, 5120, 2048, f32)); // q/k/v fused, one row
    out.push_back(gemm_bf16_invariant_case(33, 2048, 1024, f32)); // 64-row blocks, the last partial
    out.push_back(gemm_bf16_invariant_case(16, 128, 2048, f32));  // the router at 16 rows
    out.push_back(gemm_bf16_invariant_case(70, 48, 80, f32));     // k not a multiple of the 64 staged
    out.push_back(gemm_bf16_invariant_case(20, 60, 128, f32));    // n % 16: a partial column group
    out.push_back(gemm_bf16_invariant_case(64, 60, 80, f32));     // the ring's 4 row blocks, both tails
  }
  out.push_back(sample_kept_case(4096, 512));
  out.push_back(sample_kept_case(1000, 8)); // sets beyond the cap: -1 on both
  return out;
}

} // namespace rlserve::test::ops
