// The CPU references of the decoder ops (kernels/decoder_ops.hpp and its siblings), which the CUDA
// twins are held to on the GPU machine (decoder_ops_gpu_test.cu), against computations written here
// from the definitions: paged attention against plain causal attention over contiguous K / V (GQA,
// shuffled blocks, prefill and decode rows, padding), q/k norm + RoPE against rotate_half in
// double, the residual add + RMSNorm, SiLU-mul, the BF16 GEMV against the CPU model's fp32 matmul,
// the BF16 MoE against a dense per-token evaluation, and bad arguments refused with
// invalid_problem.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/cpu_ops.hpp"
#include "kernels/decoder_ops.hpp"
#include "kernels/gemv_bf16.hpp"
#include "kernels/moe_bf16.hpp"
#include "kernels/paged_attention.hpp"
#include "kernels/sampler.hpp"
#include "tests/kernels/int4_test_util.hpp"

using namespace rlserve::kernels;
namespace t4 = rlserve::int4_test;

namespace {

// Seeded bf16 values of standard deviation `sigma` (tests/kernels/int4_test_util.hpp).
std::vector<uint16_t> random_bf16(std::size_t n, uint64_t seed, double sigma = 1.0) {
  return t4::gaussian_weights(n, seed, sigma);
}

// Both sides round once from a wider value: they may differ by one bf16 step where the wide values
// straddle a rounding boundary, never by more.
int64_t bf16_steps(uint16_t a, uint16_t b) {
  auto key = [](uint16_t x) { return (x & 0x8000) ? -static_cast<int64_t>(x & 0x7fff) : static_cast<int64_t>(x); };
  return std::abs(key(a) - key(b));
}

void check_close(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want, double min_exact) {
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  int64_t exact = 0, worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const int64_t d = bf16_steps(got[i], want[i]);
    exact += d == 0;
    worst = std::max(worst, d);
  }
  BOOST_TEST(worst <= 1);
  BOOST_TEST(double(exact) / double(got.size()) >= min_exact);
}

} // namespace

BOOST_AUTO_TEST_SUITE(decoder_ops_test)

BOOST_AUTO_TEST_CASE(paged_attention_equals_plain_causal_attention) {
  t4::rng r(11);
  const int64_t D = 64, KH = 2, QH = 8, bs = 16, max_blocks = 8, S = 3;
  const std::vector<int64_t> len = {5, 33, 128};
  // Contiguous K / V per sequence, scattered into shuffled blocks of the paged cache.
  const int64_t num_blocks = S * max_blocks;
  std::vector<int32_t> table(static_cast<std::size_t>(num_blocks));
  std::iota(table.begin(), table.end(), 0);
  for (std::size_t i = table.size(); i > 1; --i)
    std::swap(table[i - 1], table[static_cast<std::size_t>(r.below(static_cast<int64_t>(i)))]);
  std::vector<std::vector<uint16_t>> k(S), v(S);
  std::vector<uint16_t> kc(static_cast<std::size_t>(num_blocks * bs * KH * D), 0), vc(kc.size(), 0);
  for (int64_t s = 0; s < S; ++s) {
    const auto n = static_cast<std::size_t>(len[static_cast<std::size_t>(s)] * KH * D);
    k[s] = random_bf16(n, 100 + s);
    v[s] = random_bf16(n, 200 + s);
    for (int64_t j = 0; j < len[static_cast<std::size_t>(s)]; ++j) {
      const int64_t slot = int64_t{table[static_cast<std::size_t>(s * max_blocks + j / bs)]} * bs + j % bs;
      std::copy_n(k[s].begin() + j * KH * D, KH * D, kc.begin() + slot * KH * D);
      std::copy_n(v[s].begin() + j * KH * D, KH * D, vc.begin() + slot * KH * D);
    }
  }
  std::vector<int32_t> row_seq, row_pos;
  for (int64_t s = 0; s < S; ++s)
    for (int64_t p = 0; p < len[static_cast<std::size_t>(s)]; p += 1 + s * 7)
      row_seq.push_back(static_cast<int32_t>(s)), row_pos.push_back(static_cast<int32_t>(p));
  row_seq.push_back(-1), row_pos.push_back(0); // padding
  const auto T = static_cast<int64_t>(row_seq.size());
  const auto q = random_bf16(static_cast<std::size_t>(T * QH * D), 300);
  std::vector<uint16_t> got(static_cast<std::size_t>(T * QH * D), 0x7777);
  paged_attention_args a;
  a.q = q.data(), a.k_cache = kc.data(), a.v_cache = vc.data(), a.block_table = table.data();
  a.row_seq = row_seq.data(), a.row_pos = row_pos.data(), a.out = got.data();
  a.tokens = T, a.sequences = S, a.max_blocks = max_blocks, a.block_size = bs;
  a.q_heads = QH, a.kv_heads = KH, a.head_dim = D, a.scale = 0.125f;
  BOOST_REQUIRE(paged_attention_ref(a) == kernel_status::ok);

  std::vector<uint16_t> want(got.size(), 0);
  for (int64_t t = 0; t < T - 1; ++t) {
    const auto s = static_cast<std::size_t>(row_seq[static_cast<std::size_t>(t)]);
    const int64_t p = row_pos[static_cast<std::size_t>(t)];
    for (int64_t h = 0; h < QH; ++h) {
      const int64_t g = h / (QH / KH);
      std::vector<double> w(static_cast<std::size_t>(p + 1));
      for (int64_t j = 0; j <= p; ++j) {
        double dot = 0;
        for (int64_t i = 0; i < D; ++i)
          dot += double(bf16_to_float(q[static_cast<std::size_t>((t * QH + h) * D + i)])) *
                 bf16_to_float(k[s][static_cast<std::size_t>((j * KH + g) * D + i)]);
        w[static_cast<std::size_t>(j)] = 0.125 * dot;
      }
      const double m = *std::max_element(w.begin(), w.end());
      double sum = 0;
      for (auto& x : w)
        sum += (x = std::exp(x - m));
      for (int64_t i = 0; i < D; ++i) {
        double o = 0;
        for (int64_t j = 0; j <= p; ++j)
          o += w[static_cast<std::size_t>(j)] * bf16_to_float(v[s][static_cast<std::size_t>((j * KH + g) * D + i)]);
        want[static_cast<std::size_t>((t * QH + h) * D + i)] = float_to_bf16(static_cast<float>(o / sum));
      }
    }
  }
  check_close(got, want, 0.99);

  // Refused: a group of 32 query heads per kv head, head_dim 96, block size 8, max_context too big.
  paged_attention_args bad = a;
  bad.q_heads = 64;
  BOOST_TEST((paged_attention_can_implement(bad) == kernel_status::invalid_problem));
  bad = a, bad.head_dim = 96;
  BOOST_TEST((paged_attention_can_implement(bad) == kernel_status::invalid_problem));
  bad = a, bad.block_size = 8;
  BOOST_TEST((paged_attention_can_implement(bad) == kernel_status::invalid_problem));
  bad = a, bad.max_context = max_blocks * bs + 1;
  BOOST_TEST((paged_attention_can_implement(bad) == kernel_status::invalid_problem));
  bad = a, bad.max_tokens = a.tokens - 1; // more rows than the workspace is laid out for
  BOOST_TEST((paged_attention_can_implement(bad) == kernel_status::invalid_problem));
}

BOOST_AUTO_TEST_CASE(qk_norm_rope_is_rmsnorm_then_rotate_half) {
  const int64_t D = 128, QH = 4, KH = 2, T = 5, P = 64, slots = 16;
  const auto qkv = random_bf16(static_cast<std::size_t>(T * (QH + 2 * KH) * D), 400, 2.0);
  const auto qn = random_bf16(static_cast<std::size_t>(D), 401, 0.5), kn = random_bf16(static_cast<std::size_t>(D), 402, 0.5);
  std::vector<float> cosv(static_cast<std::size_t>(P * D / 2)), sinv(cosv.size());
  for (int64_t p = 0; p < P; ++p)
    for (int64_t i = 0; i < D / 2; ++i) {
      const double ang = double(p) * std::pow(1e6, -2.0 * double(i) / double(D));
      cosv[static_cast<std::size_t>(p * D / 2 + i)] = static_cast<float>(std::cos(ang));
      sinv[static_cast<std::size_t>(p * D / 2 + i)] = static_cast<float>(std::sin(ang));
    }
  const std::vector<int32_t> pos = {0, 1, 17, 63, 5}, slot = {3, -1, 0, 15, 7};
  std::vector<uint16_t> q(static_cast<std::size_t>(T * QH * D)), kc(static_cast<std::size_t>(slots * KH * D), 0),
    vc(kc.size(), 0);
  qk_norm_rope_kv_args a{qkv.data(), qn.data(), kn.data(), cosv.data(), sinv.data(), pos.data(), slot.data(),
                         q.data(), kc.data(), vc.data(), T, QH, KH, D, P, slots, 1e-6f};
  BOOST_REQUIRE(qk_norm_rope_kv_ref(a) == kernel_status::ok);
  auto head = [&](int64_t t, int64_t col_head, const std::vector<uint16_t>& w) {
    const int64_t width = (QH + 2 * KH) * D;
    std::vector<double> x(static_cast<std::size_t>(D));
    double ss = 0;
    for (int64_t i = 0; i < D; ++i) {
      x[static_cast<std::size_t>(i)] = bf16_to_float(qkv[static_cast<std::size_t>(t * width + col_head * D + i)]);
      ss += x[static_cast<std::size_t>(i)] * x[static_cast<std::size_t>(i)];
    }
    const double inv = 1.0 / std::sqrt(ss / double(D) + 1e-6);
    for (int64_t i = 0; i < D; ++i)
      x[static_cast<std::size_t>(i)] *= inv * bf16_to_float(w[static_cast<std::size_t>(i)]);
    std::vector<uint16_t> out(static_cast<std::size_t>(D));
    const int64_t p = pos[static_cast<std::size_t>(t)];
    for (int64_t i = 0; i < D / 2; ++i) { // rotate_half: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)
      const double c = cosv[static_cast<std::size_t>(p * D / 2 + i)], s = sinv[static_cast<std::size_t>(p * D / 2 + i)];
      const double lo = x[static_cast<std::size_t>(i)], hi = x[static_cast<std::size_t>(i + D / 2)];
      out[static_cast<std::size_t>(i)] = float_to_bf16(static_cast<float>(lo * c - hi * s));
      out[static_cast<std::size_t>(i + D / 2)] = float_to_bf16(static_cast<float>(hi * c + lo * s));
    }
    return out;
  };
  std::vector<uint16_t> want_q, got_q(q), want_k, got_k;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < QH; ++h) {
      const auto o = head(t, h, qn);
      want_q.insert(want_q.end(), o.begin(), o.end());
    }
    const int32_t sl = slot[static_cast<std::size_t>(t)];
    for (int64_t h = 0; h < KH && sl >= 0; ++h) {
      const auto o = head(t, QH + h, kn);
      want_k.insert(want_k.end(), o.begin(), o.end());
      got_k.insert(got_k.end(), kc.begin() + (sl * KH + h) * D, kc.begin() + (sl * KH + h + 1) * D);
      // V lands in the slot unchanged.
      BOOST_TEST(std::equal(vc.begin() + (sl * KH + h) * D, vc.begin() + (sl * KH + h + 1) * D,
                            qkv.begin() + t * (QH + 2 * KH) * D + (QH + KH + h) * D));
    }
  }
  check_close(got_q, want_q, 0.97);
  check_close(got_k, want_k, 0.97);
  // Slot 1..2 (no token wrote there) stays zero; a slot past the cache is refused.
  BOOST_TEST(std::all_of(kc.begin() + 1 * KH * D, kc.begin() + 2 * KH * D, [](uint16_t x) { return x == 0; }));
  std::vector<int32_t> far = slot;
  far[0] = static_cast<int32_t>(slots);
  a.slots = far.data();
  BOOST_TEST((qk_norm_rope_kv_ref(a) == kernel_status::invalid_problem));
}

BOOST_AUTO_TEST_CASE(add_rms_norm_and_silu_mul_follow_their_formulas) {
  const int64_t rows = 6, cols = 256;
  std::vector<float> residual(static_cast<std::size_t>(rows * cols));
  t4::rng r(500);
  for (auto& x : residual)
    x = static_cast<float>(4 * r.gaussian());
  const auto delta = random_bf16(residual.size(), 501), weight = random_bf16(static_cast<std::size_t>(cols), 502, 0.3);
  std::vector<float> res = residual;
  std::vector<uint16_t> out(residual.size());
  BOOST_REQUIRE(add_rms_norm_ref({res.data(), delta.data(), weight.data(), nullptr, out.data(), rows, cols, 1e-5f}) ==
                kernel_status::ok);
  std::vector<uint16_t> want(out.size());
  for (int64_t i = 0; i < rows; ++i) {
    double ss = 0;
    std::vector<double> x(static_cast<std::size_t>(cols));
    for (int64_t c = 0; c < cols; ++c) {
      const auto k = static_cast<std::size_t>(i * cols + c);
      x[static_cast<std::size_t>(c)] = double(residual[k] + bf16_to_float(delta[k])); // the fp32 residual add
      BOOST_TEST(res[k] == static_cast<float>(x[static_cast<std::size_t>(c)]));
      ss += x[static_cast<std::size_t>(c)] * x[static_cast<std::size_t>(c)];
    }
    const double inv = 1.0 / std::sqrt(ss / double(cols) + 1e-5);
    for (int64_t c = 0; c < cols; ++c)
      want[static_cast<std::size_t>(i * cols + c)] =
        float_to_bf16(static_cast<float>(x[static_cast<std::size_t>(c)] * inv * bf16_to_float(weight[static_cast<std::size_t>(c)])));
  }
  check_close(out, want, 0.97);
  const std::vector<int32_t> index = {0};
  add_rms_norm_args both{res.data(), delta.data(), weight.data(), index.data(), out.data(), 1, cols};
  BOOST_TEST((add_rms_norm_can_implement(both) == kernel_status::invalid_problem)); // delta with rows_index
  add_rms_norm_args odd{res.data(), nullptr, weight.data(), nullptr, out.data(), rows, 100};
  BOOST_TEST((add_rms_norm_can_implement(odd) == kernel_status::invalid_problem)); // cols % 8

  // SiLU-mul: transformers' bf16(bf16(silu(g)) * u).
  const auto gu = random_bf16(static_cast<std::size_t>(rows * 2 * cols), 503, 3.0);
  std::vector<uint16_t> h(static_cast<std::size_t>(rows * cols));
  BOOST_REQUIRE(silu_mul_bf16_ref({gu.data(), h.data(), rows, cols}) == kernel_status::ok);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < cols; ++c) {
      const double g = bf16_to_float(gu[static_cast<std::size_t>(i * 2 * cols + c)]);
      const double u = bf16_to_float(gu[static_cast<std::size_t>(i * 2 * cols + cols + c)]);
      const float act = bf16_to_float(float_to_bf16(static_cast<float>(g / (1 + std::exp(-g)))));
      BOOST_TEST(bf16_steps(h[static_cast<std::size_t>(i * cols + c)], float_to_bf16(static_cast<float>(act * u))) <= 1);
    }
}

// The GEMV reference is the CPU forward's linear layer (matmul_cpu over the same bf16 values in
// fp32) up to summation order, honours ldy, and refuses shapes the GPU kernel does not define.
BOOST_AUTO_TEST_CASE(gemv_bf16_equals_the_cpu_matmul) {
  const int64_t rows = 5, n = 37, k = 296, ldy = 40;
  const auto x = random_bf16(static_cast<std::size_t>(rows * k), 700);
  const auto w = random_bf16(static_cast<std::size_t>(n * k), 701, 0.1);
  std::vector<float> xf(x.size()), wf(w.size()), want(static_cast<std::size_t>(rows * n));
  std::transform(x.begin(), x.end(), xf.begin(), bf16_to_float);
  std::transform(w.begin(), w.end(), wf.begin(), bf16_to_float);
  BOOST_REQUIRE(matmul_cpu({xf.data(), wf.data(), want.data(), rows, n, k}) == kernel_status::ok);
  std::vector<float> y32(static_cast<std::size_t>(rows * ldy), -7.0f);
  std::vector<uint16_t> y16(y32.size(), 0x7fc1);
  gemv_bf16_args a{x.data(), w.data(), y32.data(), rows, n, k, ldy, true};
  BOOST_REQUIRE(gemv_bf16_ref(a) == kernel_status::ok);
  gemv_bf16_args b{x.data(), w.data(), y16.data(), rows, n, k, ldy, false};
  BOOST_REQUIRE(gemv_bf16_ref(b) == kernel_status::ok);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < ldy; ++c) {
      const auto i = static_cast<std::size_t>(r * ldy + c);
      if (c >= n) { // past n: untouched
        BOOST_TEST(y32[i] == -7.0f);
        BOOST_TEST(y16[i] == 0x7fc1);
        continue;
      }
      const float m = want[static_cast<std::size_t>(r * n + c)];
      BOOST_TEST(std::abs(y32[i] - m) <= 1e-5f * (1.0f + std::abs(m)));
      BOOST_TEST(bf16_steps(y16[i], float_to_bf16(m)) <= 1);
    }
  for (auto bad : {gemv_bf16_args{x.data(), w.data(), y32.data(), 0, n, k, ldy, true},
                   gemv_bf16_args{x.data(), w.data(), y32.data(), k_gemv_max_rows + 1, n, k, ldy, true},
                   gemv_bf16_args{x.data(), w.data(), y32.data(), rows, n, k - 4, ldy, true},
                   gemv_bf16_args{x.data(), w.data(), y32.data(), rows, n, k, n - 1, true},
                   gemv_bf16_args{x.data(), nullptr, y32.data(), rows, n, k, ldy, true}})
    BOOST_TEST((gemv_bf16_ref(bad) == kernel_status::invalid_problem));
}

// The BF16 MoE reference against a dense evaluation: every expert computed for every token, the
// router's softmax / top-k / renormalization written out here.
BOOST_AUTO_TEST_CASE(moe_bf16_equals_a_dense_evaluation) {
  const int64_t T = 7, E = 8, H = 64, I = 64;
  const int32_t K = 2;
  const auto w13 = random_bf16(static_cast<std::size_t>(E * 2 * I * H), 600, 0.1);
  const auto w2 = random_bf16(static_cast<std::size_t>(E * H * I), 601, 0.1);
  const auto x = random_bf16(static_cast<std::size_t>(T * H), 602);
  std::vector<float> logits(static_cast<std::size_t>(T * E));
  t4::rng r(603);
  for (auto& l : logits)
    l = static_cast<float>(3 * r.gaussian());
  for (int norm = 0; norm < 2; ++norm) {
    std::vector<uint16_t> got(static_cast<std::size_t>(T * H));
    moe_bf16_args a;
    a.tokens = T, a.hidden = H, a.intermediate = I, a.experts = E, a.top_k = K, a.norm_topk_prob = norm == 1;
    a.router_logits = logits.data(), a.x = x.data(), a.w13 = w13.data(), a.w2 = w2.data(), a.out = got.data();
    BOOST_REQUIRE(moe_bf16_ref(a) == kernel_status::ok);
    std::vector<uint16_t> want(got.size());
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> p(static_cast<std::size_t>(E));
      const double m = *std::max_element(logits.begin() + t * E, logits.begin() + (t + 1) * E);
      double all = 0;
      for (int64_t e = 0; e < E; ++e)
        all += (p[static_cast<std::size_t>(e)] = std::exp(double(logits[static_cast<std::size_t>(t * E + e)]) - m));
      std::vector<int64_t> order(static_cast<std::size_t>(E));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t l, int64_t rr) {
        return logits[static_cast<std::size_t>(t * E + l)] > logits[static_cast<std::size_t>(t * E + rr)];
      });
      double picked = 0;
      for (int32_t s = 0; s < K; ++s)
        picked += p[static_cast<std::size_t>(order[static_cast<std::size_t>(s)])];
      std::vector<double> out(static_cast<std::size_t>(H), 0.0);
      for (int32_t s = 0; s < K; ++s) {
        const int64_t e = order[static_cast<std::size_t>(s)];
        const double wgt = p[static_cast<std::size_t>(e)] / (norm ? picked : all);
        std::vector<float> hbuf(static_cast<std::size_t>(I));
        for (int64_t i = 0; i < I; ++i) {
          double g = 0, u = 0;
          for (int64_t c = 0; c < H; ++c) {
            const double xv = bf16_to_float(x[static_cast<std::size_t>(t * H + c)]);
            g += xv * bf16_to_float(w13[static_cast<std::size_t>((e * 2 * I + i) * H + c)]);
            u += xv * bf16_to_float(w13[static_cast<std::size_t>((e * 2 * I + I + i) * H + c)]);
          }
          const float gb = bf16_to_float(float_to_bf16(static_cast<float>(g)));
          const float ub = bf16_to_float(float_to_bf16(static_cast<float>(u)));
          hbuf[static_cast<std::size_t>(i)] = bf16_to_float(float_to_bf16(gb / (1.0f + std::exp(-gb)) * ub));
        }
        for (int64_t n = 0; n < H; ++n) {
          double y = 0;
          for (int64_t i = 0; i < I; ++i)
            y += double(hbuf[static_cast<std::size_t>(i)]) * bf16_to_float(w2[static_cast<std::size_t>((e * H + n) * I + i)]);
          out[static_cast<std::size_t>(n)] += wgt * y;
        }
      }
      for (int64_t n = 0; n < H; ++n)
        want[static_cast<std::size_t>(t * H + n)] = float_to_bf16(static_cast<float>(out[static_cast<std::size_t>(n)]));
    }
    BOOST_TEST_INFO("norm_topk_prob " << norm);
    check_close(got, want, 0.9);
  }
  moe_bf16_args bad;
  bad.tokens = 1, bad.hidden = 100, bad.intermediate = 64, bad.experts = 8, bad.top_k = 2;
  BOOST_TEST((moe_bf16_can_implement(bad) == kernel_status::invalid_problem)); // hidden % 64
  bad.hidden = 64, bad.top_k = 9;
  BOOST_TEST((moe_bf16_can_implement(bad) == kernel_status::invalid_problem)); // top-k > experts
}

BOOST_AUTO_TEST_SUITE_END()
