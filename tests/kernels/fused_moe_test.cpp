// Fused MoE CPU reference (kernels/fused_moe.hpp): the top-k router (ties, renormalization), the
// token-to-expert alignment, an oracle layer whose experts turn routing into exact integers
// (identity-diagonal weights, scale = expert id + 1: a wrong expert or weight shows up as a wrong
// integer), and a random layer against an independent double-precision model that dequantizes
// from the LOAD format.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/fused_moe.hpp"
#include "kernels/serving_layout.hpp"
#include "tests/kernels/int4_test_util.hpp"

using namespace rlserve::kernels;
namespace t4 = rlserve::int4_test;

namespace {

// Random layer vs the double model: both round g, u, h and out to bf16 at the same points; they
// differ by FP32 vs FP64 sums, which flips a bf16 rounding now and then (~1e-3 relative).
constexpr double k_moe_ref_max_rel_error = 1e-2;
constexpr double k_topk_weight_tolerance = 1e-6;

// E matrices [n, k] of one projection as codes, then in both formats.
struct int4_set {
  int4_shape shape;
  bool asym = false;
  std::vector<uint8_t> codes;   // [E, n, k]
  std::vector<uint8_t> zeros;   // [E, n, groups]
  std::vector<uint16_t> scales; // bf16 [E, n, groups]
  std::vector<int32_t> s_weight;
  std::vector<uint16_t> s_scale;
  std::vector<int32_t> s_zp;

  int64_t groups() const { return int4_groups(shape); }
  double dequant(int64_t e, int64_t n, int64_t k) const {
    const int64_t g = k / int4_group_len(shape);
    const auto gi = static_cast<std::size_t>((e * shape.n + n) * groups() + g);
    const int32_t z = asym ? zeros[gi] : 8;
    const int32_t q = codes[static_cast<std::size_t>((e * shape.n + n) * shape.k + k)];
    return bf16_to_float(float_to_bf16(static_cast<float>(q - z) * bf16_to_float(scales[gi])));
  }
};

int4_set make_set(const int4_shape& s, bool asym) {
  int4_set m;
  m.shape = s;
  m.asym = asym;
  m.codes.assign(static_cast<std::size_t>(s.batch * s.n * s.k), 8);
  m.zeros.assign(static_cast<std::size_t>(s.batch * s.n * int4_groups(s)), 8);
  m.scales.assign(m.zeros.size(), float_to_bf16(1.0f));
  return m;
}

// Load format (standard zero points) -> serving_repack_ref.
void repack(int4_set& m) {
  const auto& s = m.shape;
  const int64_t groups = int4_groups(s);
  std::vector<int32_t> packed(static_cast<std::size_t>(ct_weight_packed_words(s)), 0);
  for (int64_t r = 0; r < s.batch * s.n; ++r)
    for (int64_t k = 0; k < s.k; ++k) {
      auto& w = packed[static_cast<std::size_t>(r * (s.k / 8) + k / 8)];
      w = static_cast<int32_t>(int4_put_nibble(static_cast<uint32_t>(w), static_cast<int>(k % 8),
                                               m.codes[static_cast<std::size_t>(r * s.k + k)]));
    }
  std::vector<int32_t> zp(m.asym ? static_cast<std::size_t>(ct_zero_point_words(s)) : 0, 0);
  if (m.asym)
    for (int64_t e = 0; e < s.batch; ++e)
      for (int64_t n = 0; n < s.n; ++n)
        for (int64_t g = 0; g < groups; ++g) {
          auto& w = zp[static_cast<std::size_t>(e * (s.n / 8) * groups + (n / 8) * groups + g)];
          w = static_cast<int32_t>(int4_put_nibble(static_cast<uint32_t>(w), static_cast<int>(n % 8),
                                                   m.zeros[static_cast<std::size_t>((e * s.n + n) * groups + g)]));
        }
  m.s_weight.resize(static_cast<std::size_t>(serving_weight_words(s)));
  m.s_scale.resize(static_cast<std::size_t>(serving_scale_count(s)));
  m.s_zp.resize(m.asym ? static_cast<std::size_t>(serving_zero_point_words(s)) : 0);
  serving_repack_args r{s, m.asym, zero_point_layout::standard, packed.data(), m.scales.data(),
                        m.asym ? zp.data() : nullptr, m.s_weight.data(), m.s_scale.data(),
                        m.asym ? m.s_zp.data() : nullptr};
  BOOST_REQUIRE(serving_repack_ref(r) == kernel_status::ok);
}

// Sets code (e, n, k) so that q - z = v, keeping z.
void set_value(int4_set& m, int64_t e, int64_t n, int64_t k, int v) {
  const int64_t g = k / int4_group_len(m.shape);
  const int z = m.asym ? m.zeros[static_cast<std::size_t>((e * m.shape.n + n) * m.groups() + g)] : 8;
  m.codes[static_cast<std::size_t>((e * m.shape.n + n) * m.shape.k + k)] = static_cast<uint8_t>(z + v);
}
void set_scale(int4_set& m, int64_t e, int64_t n, int64_t k, float s) {
  const int64_t g = k / int4_group_len(m.shape);
  m.scales[static_cast<std::size_t>((e * m.shape.n + n) * m.groups() + g)] = float_to_bf16(s);
}

// Oracle experts (the GPU test builds the same ones): with x = 1, expert e gives gate = 64 (64 ones),
// up_j = (e + 1) x_j (identity diagonal, scale e + 1), h = silu(64) (e + 1) = 64 (e + 1) exactly,
// and w2 (identity diagonal, scale 1/64) returns y_j = e + 1 in every column. The layer output is
// then sum_s w_s (e_s + 1): with top-1 exactly e + 1, with 8 equal logits the mean of e_s + 1.
struct oracle_layer {
  int4_set w13, w2;
};

oracle_layer make_oracle_layer(int64_t experts, int64_t hidden, int64_t inter, int32_t gs, bool asym, uint64_t seed) {
  t4::rng r(seed);
  oracle_layer l;
  l.w13 = make_set({experts, 2 * inter, hidden, gs}, asym);
  l.w2 = make_set({experts, hidden, inter, gs}, asym);
  for (int4_set* m : {&l.w13, &l.w2})
    if (asym)
      for (auto& z : m->zeros)
        z = static_cast<uint8_t>(r.below(15)); // any zero point; q = z + value stays <= 15
  for (int64_t e = 0; e < experts; ++e) {
    for (int4_set* m : {&l.w13, &l.w2})
      for (int64_t n = 0; n < m->shape.n; ++n)
        for (int64_t k = 0; k < m->shape.k; ++k)
          set_value(*m, e, n, k, 0);
    for (int64_t j = 0; j < inter; ++j) {
      for (int64_t k = 0; k < 64; ++k)
        set_value(l.w13, e, j, k, 1); // gate
      set_value(l.w13, e, inter + j, j, 1); // up: diagonal
      set_scale(l.w13, e, inter + j, j, static_cast<float>(e + 1));
    }
    for (int64_t j = 0; j < hidden; ++j) {
      set_value(l.w2, e, j, j % inter, 1);
      set_scale(l.w2, e, j, j % inter, 1.0f / 64);
    }
  }
  repack(l.w13);
  repack(l.w2);
  return l;
}

fused_moe_args moe_args(const oracle_layer& l, int64_t tokens, int32_t top_k, const std::vector<float>& logits,
                        const std::vector<uint16_t>& x, std::vector<uint16_t>& out) {
  fused_moe_args a;
  a.tokens = tokens;
  a.hidden = l.w2.shape.n;
  a.intermediate = l.w2.shape.k;
  a.experts = l.w2.shape.batch;
  a.top_k = top_k;
  a.group_size = l.w2.shape.group_size;
  a.has_zero_point = l.w2.asym;
  a.router_logits = logits.data();
  a.x = x.data();
  a.w13 = l.w13.s_weight.data();
  a.w13_scale = l.w13.s_scale.data();
  a.w13_zero_point = l.w13.asym ? l.w13.s_zp.data() : nullptr;
  a.w2 = l.w2.s_weight.data();
  a.w2_scale = l.w2.s_scale.data();
  a.w2_zero_point = l.w2.asym ? l.w2.s_zp.data() : nullptr;
  a.out = out.data();
  return a;
}

} // namespace

BOOST_AUTO_TEST_SUITE(fused_moe_test)

BOOST_AUTO_TEST_CASE(topk_picks_by_logit_with_ties_to_the_lower_id_and_renormalizes) {
  const std::vector<float> logits = {0.5f, 2.0f, 2.0f, -1.0f, 1.0f, //
                                     3.0f, 3.0f, 3.0f, 3.0f, 3.0f};
  std::vector<int32_t> ids(6);
  std::vector<float> w(6);
  moe_topk_args a{2, 5, 3, true, logits.data(), ids.data(), w.data()};
  BOOST_REQUIRE(moe_topk_ref(a) == kernel_status::ok);
  BOOST_TEST((ids == std::vector<int32_t>{1, 2, 4, 0, 1, 2}));
  const double e1 = std::exp(-1.0), tot = 2 + e1;
  BOOST_TEST(w[0] == 1 / tot, boost::test_tools::tolerance(k_topk_weight_tolerance));
  BOOST_TEST(w[2] == e1 / tot, boost::test_tools::tolerance(k_topk_weight_tolerance));
  BOOST_TEST(w[3] == 1.0f / 3, boost::test_tools::tolerance(k_topk_weight_tolerance));
  a.norm_topk_prob = false; // plain softmax probabilities of the picked experts
  BOOST_REQUIRE(moe_topk_ref(a) == kernel_status::ok);
  const double all = std::exp(-1.5) + 2 + std::exp(-3.0) + std::exp(-1.0);
  BOOST_TEST(w[1] == 1 / all, boost::test_tools::tolerance(k_topk_weight_tolerance));
  BOOST_TEST(w[4] == 0.2f, boost::test_tools::tolerance(k_topk_weight_tolerance));
  a.top_k = 6;
  BOOST_TEST((moe_topk_can_implement(a) == kernel_status::invalid_problem));
}

BOOST_AUTO_TEST_CASE(align_groups_ids_by_expert_and_pads_each_run) {
  // 4 tokens x top-2 over 5 experts; expert 3 unused.
  const std::vector<int32_t> ids = {0, 2, 2, 4, 0, 1, 2, 0};
  const int32_t block = 16;
  std::vector<int32_t> sorted(moe_align_capacity(8, 5, block), -7), bexp(sorted.size() / block, -7);
  int32_t num = -7;
  moe_align_args a{8, 5, block, ids.data(), sorted.data(), bexp.data(), &num};
  BOOST_REQUIRE(moe_align_ref(a) == kernel_status::ok);
  BOOST_TEST(num == 4 * block); // experts 0, 1, 2, 4
  const std::vector<int32_t> runs[] = {{0, 4, 7}, {5}, {1, 2, 6}, {3}};
  for (int b = 0; b < 4; ++b) {
    BOOST_TEST(bexp[b] == (b < 3 ? b : 4));
    for (int i = 0; i < block; ++i)
      BOOST_TEST(sorted[b * block + i] == (i < static_cast<int>(runs[b].size()) ? runs[b][i] : 8));
  }
  BOOST_TEST(moe_align_capacity(2048, 128, 16) == 16 * (128 + 128));
}

BOOST_AUTO_TEST_CASE(oracle_layer_routes_to_exact_integers) {
  for (int32_t gs : {32, 64, 128, k_int4_channel})
    for (int asym = 0; asym < 2; ++asym) {
      const int64_t E = 16, H = 256, I = 128, T = 6;
      const oracle_layer l = make_oracle_layer(E, H, I, gs, asym, 3 + gs);
      std::vector<uint16_t> x(T * H, float_to_bf16(1.0f)), out(T * H);
      t4::rng r(11);
      // top-1: token t goes to expert (5t + 3) % 16.
      std::vector<float> logits(T * E);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t e = 0; e < E; ++e)
          logits[t * E + e] = e == (5 * t + 3) % E ? 4.0f : static_cast<float>(-2.0 * r.uniform());
      t4::poison(out);
      BOOST_REQUIRE(fused_moe_ref(moe_args(l, T, 1, logits, x, out)) == kernel_status::ok);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < H; ++j)
          BOOST_TEST(bf16_to_float(out[t * H + j]) == static_cast<float>((5 * t + 3) % E + 1));
      // top-8 with 8 equal logits (experts of the token's parity): the mean of (e + 1).
      for (int64_t t = 0; t < T; ++t)
        for (int64_t e = 0; e < E; ++e)
          logits[t * E + e] = (e + t) % 2 == 0 ? 1.5f : -3.0f;
      t4::poison(out);
      BOOST_REQUIRE(fused_moe_ref(moe_args(l, T, 8, logits, x, out)) == kernel_status::ok);
      for (int64_t t = 0; t < T; ++t) {
        float acc = 0;
        for (int64_t e = 0; e < E; ++e)
          if ((e + t) % 2 == 0)
            acc += 0.125f * static_cast<float>(e + 1);
        for (int64_t j = 0; j < H; ++j)
          BOOST_TEST(out[t * H + j] == float_to_bf16(acc));
      }
    }
}

BOOST_AUTO_TEST_CASE(random_layer_matches_double_precision_model) {
  for (int32_t gs : {32, 128, k_int4_channel})
    for (int asym = 0; asym < 2; ++asym) {
      const int64_t E = 8, H = 128, I = 128, T = 5;
      const int32_t K = 3;
      t4::rng r(100 + gs + asym);
      oracle_layer l;
      l.w13 = make_set({E, 2 * I, H, gs}, asym);
      l.w2 = make_set({E, H, I, gs}, asym);
      for (int4_set* m : {&l.w13, &l.w2}) {
        for (auto& c : m->codes)
          c = static_cast<uint8_t>(r.below(16));
        for (auto& z : m->zeros)
          z = static_cast<uint8_t>(r.below(16));
        for (auto& s : m->scales)
          s = float_to_bf16(static_cast<float>(0.002 + 0.01 * r.uniform()));
        repack(*m);
      }
      std::vector<uint16_t> x(T * H), out(T * H);
      for (auto& v : x)
        v = t4::bf16(r.gaussian());
      std::vector<float> logits(T * E);
      for (auto& v : logits)
        v = static_cast<float>(2 * r.gaussian());
      t4::poison(out);
      BOOST_REQUIRE(fused_moe_ref(moe_args(l, T, K, logits, x, out)) == kernel_status::ok);

      std::vector<int32_t> ids(T * K);
      std::vector<float> w(T * K);
      moe_topk_args ta{T, E, K, true, logits.data(), ids.data(), w.data()};
      BOOST_REQUIRE(moe_topk_ref(ta) == kernel_status::ok);
      double num = 0, den = 0;
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> acc(H, 0.0);
        for (int s = 0; s < K; ++s) {
          const int e = ids[t * K + s];
          std::vector<double> h(I);
          for (int64_t j = 0; j < I; ++j) {
            double g = 0, u = 0;
            for (int64_t k = 0; k < H; ++k) {
              const double xv = bf16_to_float(x[t * H + k]);
              g += xv * l.w13.dequant(e, j, k);
              u += xv * l.w13.dequant(e, I + j, k);
            }
            const double gb = bf16_to_float(t4::bf16(g)), ub = bf16_to_float(t4::bf16(u));
            h[j] = bf16_to_float(t4::bf16(gb / (1 + std::exp(-gb)) * ub));
          }
          for (int64_t j = 0; j < H; ++j) {
            double y = 0;
            for (int64_t k = 0; k < I; ++k)
              y += h[k] * l.w2.dequant(e, j, k);
            acc[j] += w[t * K + s] * y;
          }
        }
        for (int64_t j = 0; j < H; ++j) {
          const double ref = bf16_to_float(t4::bf16(acc[j])), got = bf16_to_float(out[t * H + j]);
          num += (got - ref) * (got - ref);
          den += ref * ref;
        }
      }
      BOOST_TEST_INFO("g" << gs << (asym ? " asym" : " sym"));
      BOOST_TEST(den > 0);
      BOOST_TEST(std::sqrt(num / den) < k_moe_ref_max_rel_error);
    }
}

BOOST_AUTO_TEST_CASE(can_implement_names_the_shapes_it_needs) {
  fused_moe_args a;
  a.tokens = 0, a.hidden = 2048, a.intermediate = 768, a.experts = 128, a.top_k = 8;
  BOOST_TEST((fused_moe_can_implement(a) == kernel_status::ok));
  a.intermediate = 96; // gate / up tiles need I % 64
  BOOST_TEST((fused_moe_can_implement(a) == kernel_status::invalid_problem));
  a.intermediate = 192, a.group_size = 128; // I % G
  BOOST_TEST((fused_moe_can_implement(a) == kernel_status::invalid_problem));
  a.intermediate = 768, a.experts = 300;
  BOOST_TEST((fused_moe_can_implement(a) == kernel_status::invalid_problem));
  a.experts = 4; // top-8 of 4 experts
  BOOST_TEST((fused_moe_can_implement(a) == kernel_status::invalid_problem));
  // The batch-invariant mode fixes the block rows at 8 and the tiled path: hooks that ask
  // otherwise contradict it.
  a.experts = 128, a.batch_invariant = true;
  BOOST_TEST((fused_moe_can_implement(a) == kernel_status::ok));
  a.block_rows = 8;
  BOOST_TEST((fused_moe_can_implement(a) == kernel_status::ok));
  a.block_rows = 16;
  BOOST_TEST((fused_moe_can_implement(a) == kernel_status::invalid_problem));
  a.block_rows = 0, a.gemv = 1;
  BOOST_TEST((fused_moe_can_implement(a) == kernel_status::invalid_problem));
  a.gemv = -1;
  BOOST_TEST((fused_moe_can_implement(a) == kernel_status::ok));
  BOOST_TEST(!fused_moe_takes_gemv_path(a));
  a.batch_invariant = false, a.gemv = 0, a.tokens = 1; // T * k = 8: the GEMV path by default
  BOOST_TEST(fused_moe_takes_gemv_path(a));
  a.batch_invariant = true;
  BOOST_TEST(!fused_moe_takes_gemv_path(a));
}

BOOST_AUTO_TEST_SUITE_END()
