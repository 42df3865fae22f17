// model/quant/int4_method: the SERVING / LOAD_FORMAT state machine. restore∘post_process is the
// identity bit for bit on random words; both are idempotent by state and say so; buffer
// addresses never change; loading is refused in the serving layout; a partial update leaves the
// other experts' serving bytes identical; w13 = gate rows then up rows, checked by dequantizing
// (kernels' reference dequantizer) in both zero-point layouts; shapes the kernels cannot run are
// refused at creation with the module's name.
#include <boost/test/unit_test.hpp>

#include <random>

#include "kernels/compressed_tensors.hpp"
#include "model/quant/int4_method.hpp"

using namespace rlserve;
using namespace rlserve::model::quant;
namespace k = rlserve::kernels;

namespace {

struct random_tensors {
  std::vector<int32_t> packed;
  std::vector<uint16_t> scale;
  std::vector<int32_t> zp;
  int4_load_tensors view() const { return {packed, scale, zp}; }
};

// Random load-format words for one [n, k] matrix. Scales are finite positive bf16 values;
// zero-point words are packed from codes 0..15 in `layout`.
random_tensors make_random(int64_t n, int64_t kk, int32_t g, bool sym, k::zero_point_layout layout,
                           uint64_t seed) {
  std::mt19937_64 rng(seed);
  random_tensors t;
  k::int4_shape s{1, n, kk, g};
  t.packed.resize(static_cast<std::size_t>(n * kk / 8));
  for (auto& w : t.packed)
    w = static_cast<int32_t>(rng());
  t.scale.resize(static_cast<std::size_t>(n * k::int4_groups(s)));
  for (auto& w : t.scale)
    w = static_cast<uint16_t>(0x3c00 + rng() % 0x200); // bf16 in [0.0078, 0.03)
  if (!sym) {
    std::vector<uint8_t> codes(static_cast<std::size_t>(n * k::int4_groups(s)));
    for (auto& c : codes)
      c = static_cast<uint8_t>(rng() % 16);
    t.zp.resize(static_cast<std::size_t>(n / 8 * k::int4_groups(s)));
    BOOST_REQUIRE(k::ct_pack_zero_point_ref(codes.data(), t.zp.data(), s, layout) == k::kernel_status::ok);
  }
  return t;
}

std::vector<uint16_t> dequant(const int32_t* packed, const uint16_t* scale, const int32_t* zp,
                              int64_t n, int64_t kk, int32_t g, bool sym, k::zero_point_layout layout) {
  k::ct_dequant_args a;
  a.shape = {1, n, kk, g};
  a.has_zero_point = !sym;
  a.zp_layout = layout;
  a.weight_packed = packed;
  a.weight_scale = scale;
  a.weight_zero_point = sym ? nullptr : zp;
  std::vector<uint16_t> out(static_cast<std::size_t>(n * kk));
  a.out = out.data();
  BOOST_REQUIRE(k::ct_dequant_ref(a) == k::kernel_status::ok);
  return out;
}

} // namespace

BOOST_AUTO_TEST_SUITE(int4_method_test)

BOOST_AUTO_TEST_CASE(restore_after_post_process_is_the_identity_and_both_are_idempotent) {
  for (int32_t g : {32, 64, 128, k::k_int4_channel})
    for (bool sym : {false, true})
      for (auto layout : {k::zero_point_layout::standard, k::zero_point_layout::miles}) {
        BOOST_TEST_CONTEXT("g " << g << " sym " << sym << " layout " << int(layout)) {
          const int64_t experts = 3, n = 128, kk = 256;
          auto m = int4_module::create({"layers.0.mlp.experts.w2", {experts, n, kk, g}, sym, layout});
          BOOST_REQUIRE_MESSAGE(m.has_value(), m.error());
          std::vector<random_tensors> loaded;
          for (int64_t e = 0; e < experts; ++e) {
            loaded.push_back(make_random(n, kk, g, sym, layout, 100 * e + g + sym));
            BOOST_REQUIRE(m->load_expert(e, loaded.back().view()).has_value());
          }
          auto load_words = std::vector<int32_t>(m->weight_words().begin(), m->weight_words().end());
          auto load_scales = std::vector<uint16_t>(m->scale_words().begin(), m->scale_words().end());
          auto load_zps = std::vector<int32_t>(m->zero_point_words().begin(), m->zero_point_words().end());
          const void* weight_address = m->weight_words().data();
          const void* scale_address = m->scale_words().data();

          auto restored_noop = m->restore();
          BOOST_TEST(restored_noop.value().find("nothing done") != std::string::npos);
          auto pp = m->post_process();
          BOOST_REQUIRE(pp.has_value());
          BOOST_TEST(pp.value().find("repacked") != std::string::npos);
          BOOST_TEST((m->state() == weight_layout_state::serving));
          BOOST_TEST(m->weight_words().data() == weight_address);
          BOOST_TEST(m->scale_words().data() == scale_address);
          auto serving = std::vector<int32_t>(m->weight_words().begin(), m->weight_words().end());
          BOOST_TEST((serving != load_words)); // it did move the nibbles
          BOOST_TEST(m->post_process().value().find("nothing done") != std::string::npos);
          BOOST_TEST((std::vector<int32_t>(m->weight_words().begin(), m->weight_words().end()) == serving));
          // Loading is refused in the serving layout, and changes nothing.
          auto refused = m->load_expert(0, loaded[0].view());
          BOOST_TEST(!refused.has_value());
          BOOST_TEST(refused.error().find("restore it before loading") != std::string::npos);

          BOOST_REQUIRE(m->restore().has_value());
          BOOST_TEST((m->state() == weight_layout_state::load_format));
          BOOST_TEST(m->weight_words().data() == weight_address);
          BOOST_TEST((std::vector<int32_t>(m->weight_words().begin(), m->weight_words().end()) == load_words));
          BOOST_TEST((std::vector<uint16_t>(m->scale_words().begin(), m->scale_words().end()) == load_scales));
          BOOST_TEST((std::vector<int32_t>(m->zero_point_words().begin(), m->zero_point_words().end()) == load_zps));
        }
      }
}

BOOST_AUTO_TEST_CASE(a_partial_update_leaves_other_experts_serving_bytes_identical) {
  const int64_t experts = 4, n = 64, kk = 128;
  const int32_t g = 64;
  auto m = int4_module::create({"w13", {experts, n, kk, g}, false, k::zero_point_layout::standard});
  BOOST_REQUIRE(m.has_value());
  for (int64_t e = 0; e < experts; ++e)
    BOOST_REQUIRE(m->load_expert(e, make_random(n, kk, g, false, k::zero_point_layout::standard, e).view()).has_value());
  BOOST_REQUIRE(m->post_process().has_value());
  auto before = std::vector<int32_t>(m->weight_words().begin(), m->weight_words().end());
  BOOST_REQUIRE(m->restore().has_value());
  BOOST_REQUIRE(m->load_expert(2, make_random(n, kk, g, false, k::zero_point_layout::standard, 99).view()).has_value());
  BOOST_REQUIRE(m->post_process().has_value());
  auto after = std::vector<int32_t>(m->weight_words().begin(), m->weight_words().end());
  const auto per = static_cast<std::size_t>(n * kk / 8);
  for (int64_t e = 0; e < experts; ++e) {
    bool same = std::equal(before.begin() + e * per, before.begin() + (e + 1) * per, after.begin() + e * per);
    BOOST_TEST(same == (e != 2), "expert " << e);
  }
}

BOOST_AUTO_TEST_CASE(w13_is_gate_rows_then_up_rows_in_both_zero_point_layouts) {
  const int64_t inter = 64, hidden = 128;
  const int32_t g = 32;
  for (auto layout : {k::zero_point_layout::standard, k::zero_point_layout::miles}) {
    BOOST_TEST_CONTEXT("layout " << int(layout)) {
      auto m = int4_module::create({"w13", {2, 2 * inter, hidden, g}, false, layout});
      BOOST_REQUIRE(m.has_value());
      auto gate = make_random(inter, hidden, g, false, layout, 1);
      auto up = make_random(inter, hidden, g, false, layout, 2);
      auto ok = m->load_gate_up(1, gate.view(), up.view());
      BOOST_REQUIRE_MESSAGE(ok.has_value(), ok.error());
      const auto per_w = static_cast<std::size_t>(2 * inter * hidden / 8);
      const auto per_s = static_cast<std::size_t>(2 * inter * hidden / g);
      const auto per_z = per_s / 8;
      auto w13 = dequant(m->weight_words().data() + per_w, m->scale_words().data() + per_s,
                         m->zero_point_words().data() + per_z, 2 * inter, hidden, g, false, layout);
      auto want_gate = dequant(gate.packed.data(), gate.scale.data(), gate.zp.data(), inter, hidden, g, false, layout);
      auto want_up = dequant(up.packed.data(), up.scale.data(), up.zp.data(), inter, hidden, g, false, layout);
      auto half = static_cast<std::ptrdiff_t>(inter * hidden);
      BOOST_TEST((std::vector<uint16_t>(w13.begin(), w13.begin() + half) == want_gate));
      BOOST_TEST((std::vector<uint16_t>(w13.begin() + half, w13.end()) == want_up));
    }
  }
  // A half of the wrong shape is refused, naming what it expected.
  auto m = int4_module::create({"layers.1.mlp.experts.w13", {1, 128, 128, 32}, false, k::zero_point_layout::standard});
  auto small = make_random(32, 128, 32, false, k::zero_point_layout::standard, 3);
  auto refused = m->load_gate_up(0, small.view(), small.view());
  BOOST_TEST(!refused.has_value());
  BOOST_TEST(refused.error().find("gate_proj of expert 0 does not have the shape [64, 128]") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(shapes_the_kernels_cannot_run_are_refused_at_creation) {
  auto bad_n = int4_module::create({"layers.0.self_attn.o_proj", {1, 100, 128, 32}, true, k::zero_point_layout::standard});
  BOOST_TEST(!bad_n.has_value());
  BOOST_TEST(bad_n.error().find("layers.0.self_attn.o_proj") != std::string::npos);
  BOOST_TEST(bad_n.error().find("multiple of 64") != std::string::npos);
  auto bad_g = int4_module::create({"x", {1, 64, 128, 48}, true, k::zero_point_layout::standard});
  BOOST_TEST(bad_g.error().find("group size 48 is not supported") != std::string::npos);
  auto bad_k = int4_module::create({"x", {1, 64, 96, 64}, true, k::zero_point_layout::standard});
  BOOST_TEST(bad_k.error().find("not a multiple of the group size 64") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(the_model_restores_and_post_processes_its_int4_modules_and_skips_the_rest) {
  quantized_modules all;
  for (int layer = 0; layer < 2; ++layer)
    for (const char* which : {"w13", "w2"}) {
      auto m = int4_module::create({"model.layers." + std::to_string(layer) + ".mlp.experts." + which,
                                    {2, 64, 128, 128}, false, k::zero_point_layout::standard});
      BOOST_REQUIRE(m.has_value());
      all.add(std::move(*m));
    }
  all.add_unquantized("model.norm");
  all.add_unquantized("model.embed_tokens");
  all.add_unquantized("model.layers.0.self_attn.q_proj.lora_A");
  auto pp = all.post_process_all();
  BOOST_REQUIRE(pp.has_value());
  BOOST_TEST(*pp == "post-processed 4 INT4 modules (0 already were); skipped 3 without a "
                    "quantization method (norms, embeddings, BF16 layers, LoRA wrappers)");
  BOOST_TEST(all.post_process_all().value().find("post-processed 0 INT4 modules (4 already were)") == 0u);
  BOOST_TEST(all.restore_all().value().find("restored 4 INT4 modules") == 0u);
  BOOST_TEST((all.find("model.layers.1.mlp.experts.w2")->state() == weight_layout_state::load_format));
  BOOST_TEST(all.find("nope") == nullptr);
}

BOOST_AUTO_TEST_SUITE_END()
