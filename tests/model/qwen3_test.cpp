// model/qwen3 (and the kernels/cpu_ops it runs on): loading and its errors, weight assignment,
// and KV-cache decoding against the full forward. Numerical parity with an independent numpy
// Qwen3 is tests/python/test_qwen3_parity.py.
#include <boost/test/unit_test.hpp>

#include "tests/support/test_support.hpp"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/cpu_ops.hpp"
#include "model/checkpoint.hpp"
#include "model/make_model.hpp"
#include "model/qwen3.hpp"

namespace fs = std::filesystem;
using rlserve::dtype;
using rlserve::HostTensor;
using rlserve::NamedTensor;
using namespace rlserve::model;
namespace kernels = rlserve::kernels;

namespace {

using rlserve::test::temp_dir;
using rlserve::test::why;

// Decoding with the cache runs the same float operations per row as the full forward (see
// kernels/cpu_ops.hpp), so the logits agree to the bit; the tolerance only guards against a
// compiler contracting differently in the two paths.
constexpr float k_decode_vs_full_max_abs = 1e-5f;
constexpr float k_matmul_vs_double_max_rel = 1e-5f;



model_config tiny_config() {
  auto c = preset_config("qwen3", "tiny");
  BOOST_REQUIRE_MESSAGE(c, why(c));
  return *c;
}

qwen3_model load_tiny(uint64_t seed = 1, dtype type = dtype::bf16) {
  auto config = tiny_config();
  auto tensors = random_parameters(config, seed, type);
  auto m = qwen3_model::load(config, tensors);
  BOOST_REQUIRE_MESSAGE(m, why(m));
  return std::move(*m);
}

void expect_error_contains(const std::string& error, std::initializer_list<std::string> parts) {
  for (const auto& p : parts)
    BOOST_TEST(error.find(p) != std::string::npos, "'" << p << "' not in: " << error);
}

NamedTensor* find(std::vector<NamedTensor>& ts, const std::string& name) {
  for (auto& t : ts)
    if (t.name == name)
      return &t;
  BOOST_FAIL("no tensor " << name);
  return nullptr;
}

// A bf16 tensor of `shape` filled with `value`.
HostTensor bf16_filled(std::vector<int64_t> shape, float value) {
  int64_t n = 1;
  for (auto d : shape)
    n *= d;
  std::vector<uint16_t> bits(n, kernels::float_to_bf16(value));
  return HostTensor::from_vector(dtype::bf16, std::move(shape), bits);
}

float max_abs_diff(const float* a, const float* b, std::size_t n) {
  float m = 0.0f;
  for (std::size_t i = 0; i < n; ++i)
    m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

std::vector<int32_t> some_tokens(int n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> ids(n);
  for (auto& id : ids)
    id = static_cast<int32_t>(g() % 512);
  return ids;
}

} // namespace

BOOST_AUTO_TEST_SUITE(qwen3_test)

BOOST_AUTO_TEST_CASE(parameters_are_the_hf_names_sorted) {
  auto m = load_tiny();
  auto params = m.parameters();
  BOOST_TEST(params.size() == 1u + 2u * 11u + 1u); // embed, 11 per layer, final norm; lm_head tied
  for (std::size_t i = 1; i < params.size(); ++i)
    BOOST_TEST((params[i - 1].name < params[i].name), params[i - 1].name << " before " << params[i].name);
  BOOST_TEST(params.front().name == "model.embed_tokens.weight");
  BOOST_TEST(params.back().name == "model.norm.weight");
  auto q = m.parameter("model.layers.1.self_attn.q_proj.weight");
  BOOST_REQUIRE_MESSAGE(q, why(q));
  BOOST_TEST((q->type == dtype::bf16));
  BOOST_TEST((q->shape == std::vector<int64_t>{64, 64}));
  auto k = m.parameter("model.layers.0.self_attn.k_proj.weight");
  BOOST_REQUIRE(k);
  BOOST_TEST((k->shape == std::vector<int64_t>{32, 64})); // 2 kv heads x 16
  auto lm = m.parameter("lm_head.weight");
  BOOST_REQUIRE(!lm);
  expect_error_contains(lm.error(), {"ties", "model.embed_tokens.weight"});
}

BOOST_AUTO_TEST_CASE(loads_from_a_checkpoint_directory) {
  temp_dir dir;
  auto config = tiny_config();
  auto tensors = random_parameters(config, 5, dtype::f32);
  BOOST_REQUIRE(write_checkpoint(dir.path, tensors, 20000)); // sharded
  auto ckpt = checkpoint::open(dir.path);
  BOOST_REQUIRE_MESSAGE(ckpt, why(ckpt));
  BOOST_TEST(ckpt->files().size() > 1u);
  auto from_disk = qwen3_model::load(config, *ckpt);
  BOOST_REQUIRE_MESSAGE(from_disk, why(from_disk));
  auto from_memory = qwen3_model::load(config, tensors);
  BOOST_REQUIRE_MESSAGE(from_memory, why(from_memory));
  auto ids = some_tokens(9, 3);
  auto a = from_disk->forward_all(ids), b = from_memory->forward_all(ids);
  BOOST_REQUIRE(a && b);
  BOOST_TEST(*a == *b);
}

BOOST_AUTO_TEST_CASE(load_errors_name_the_tensor) {
  auto config = tiny_config();
  auto good = random_parameters(config, 1, dtype::bf16);

  auto missing = good;
  missing.erase(missing.begin() + 3);
  auto m = qwen3_model::load(config, missing);
  BOOST_REQUIRE(!m);
  expect_error_contains(m.error(), {"missing 1 tensor", good[3].name});

  auto wrong_shape = good;
  find(wrong_shape, "model.layers.1.mlp.up_proj.weight")->tensor = bf16_filled({128, 63}, 0.f);
  m = qwen3_model::load(config, wrong_shape);
  BOOST_REQUIRE(!m);
  expect_error_contains(m.error(), {"'model.layers.1.mlp.up_proj.weight'", "shape [128, 63]",
                                    "implies [128, 64]"});

  auto wrong_dtype = good;
  find(wrong_dtype, "model.norm.weight")->tensor =
    HostTensor::from_vector(dtype::i32, {64}, std::vector<int32_t>(64, 1));
  m = qwen3_model::load(config, wrong_dtype);
  BOOST_REQUIRE(!m);
  expect_error_contains(m.error(), {"'model.norm.weight'", "dtype int32"});

  auto extra = good;
  extra.push_back({"model.layers.2.mlp.up_proj.weight", bf16_filled({128, 64}, 0.f)});
  extra.push_back({"model.layers.0.self_attn.q_proj.bias", bf16_filled({64}, 0.f)});
  m = qwen3_model::load(config, extra);
  BOOST_REQUIRE(!m);
  expect_error_contains(m.error(), {"2 tensor(s)", "model.layers.2.mlp.up_proj.weight",
                                    "model.layers.0.self_attn.q_proj.bias"});

  // Tolerated as transformers does: a stored lm_head under tied embeddings, rotary buffers.
  auto tolerated = good;
  tolerated.push_back({"lm_head.weight", bf16_filled({512, 64}, 0.f)});
  tolerated.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", bf16_filled({8}, 1.f)});
  m = qwen3_model::load(config, tolerated);
  BOOST_REQUIRE_MESSAGE(m, why(m));
}

BOOST_AUTO_TEST_CASE(untied_models_own_lm_head_and_dense_moe_fields_are_refused) {
  auto config = tiny_config();
  config.tie_word_embeddings = false;
  auto tensors = random_parameters(config, 2, dtype::bf16);
  BOOST_TEST(find(tensors, "lm_head.weight") != nullptr);
  auto m = qwen3_model::load(config, tensors);
  BOOST_REQUIRE_MESSAGE(m, why(m));
  BOOST_TEST(m->parameter("lm_head.weight").has_value());

  // MoE fields on a dense architecture are a mistake, not a model to run densely.
  auto moe = tiny_config();
  moe.num_experts = 4;
  moe.num_experts_per_tok = 2;
  auto refused = qwen3_model::load(moe, tensors);
  BOOST_REQUIRE(!refused);
  expect_error_contains(refused.error(), {"num_experts 4", "Qwen3ForCausalLM",
                                          "Qwen3MoeForCausalLM"});
}

BOOST_AUTO_TEST_CASE(validate_says_expected_versus_got) {
  auto m = load_tiny();
  auto s = m.validate({"model.norm.weight", HostTensor::from_vector(dtype::f32, {64},
                                                                    std::vector<float>(64, 1.f))});
  BOOST_REQUIRE(!s);
  BOOST_TEST(s.error() == "parameter 'model.norm.weight': expected bfloat16 [64], got float32 [64]");
  s = m.validate({"model.norm.weight", bf16_filled({65}, 1.f)});
  BOOST_REQUIRE(!s);
  BOOST_TEST(s.error() == "parameter 'model.norm.weight': expected bfloat16 [64], got bfloat16 [65]");
  s = m.validate({"model.nrom.weight", bf16_filled({64}, 1.f)});
  BOOST_REQUIRE(!s);
  expect_error_contains(s.error(), {"'model.nrom.weight'", "unknown"});
  HostTensor short_bytes = bf16_filled({64}, 1.f);
  short_bytes.nbytes = 100;
  s = m.validate({"model.norm.weight", short_bytes});
  BOOST_REQUIRE(!s);
  expect_error_contains(s.error(), {"needs 128 bytes, got 100"});
  BOOST_TEST(m.validate({"model.norm.weight", bf16_filled({64}, 1.f)}).has_value());
}

BOOST_AUTO_TEST_CASE(assign_is_all_or_nothing) {
  auto m = load_tiny();
  const auto ids = some_tokens(6, 11);
  auto before = m.forward_all(ids);
  BOOST_REQUIRE(before);
  auto norm_before = *m.parameter("model.norm.weight");

  // One good tensor, one with the wrong shape: nothing may change.
  std::vector<NamedTensor> batch{
    {"model.norm.weight", bf16_filled({64}, 2.0f)},
    {"model.layers.0.mlp.down_proj.weight", bf16_filled({64, 127}, 0.01f)},
  };
  auto s = m.assign(batch);
  BOOST_REQUIRE(!s);
  expect_error_contains(s.error(), {"model.layers.0.mlp.down_proj.weight", "[64, 128]",
                                    "[64, 127]"});
  auto after_failure = m.forward_all(ids);
  BOOST_REQUIRE(after_failure);
  BOOST_TEST(*after_failure == *before);
  BOOST_TEST(m.parameter("model.norm.weight")->data == norm_before.data);

  // The same name twice is refused too.
  std::vector<NamedTensor> twice{{"model.norm.weight", bf16_filled({64}, 2.0f)},
                                 {"model.norm.weight", bf16_filled({64}, 3.0f)}};
  s = m.assign(twice);
  BOOST_REQUIRE(!s);
  expect_error_contains(s.error(), {"given twice"});

  // A valid batch takes effect: canonical bytes and the forward both change.
  batch[1].tensor = bf16_filled({64, 128}, 0.01f);
  s = m.assign(batch);
  BOOST_REQUIRE_MESSAGE(s, why(s));
  auto norm_after = m.parameter("model.norm.weight");
  BOOST_REQUIRE(norm_after);
  BOOST_TEST(norm_after->data == batch[0].tensor.data); // shared, not copied
  BOOST_TEST(kernels::bf16_to_float(norm_after->as<uint16_t>()[0]) == 2.0f);
  auto after = m.forward_all(ids);
  BOOST_REQUIRE(after);
  BOOST_TEST(max_abs_diff(after->data(), before->data(), before->size()) > 0.1f);

  // Assigning the old values back restores the old logits exactly.
  std::vector<NamedTensor> restore;
  auto fresh = random_parameters(tiny_config(), 1, dtype::bf16);
  restore.push_back(*find(fresh, "model.norm.weight"));
  restore.push_back(*find(fresh, "model.layers.0.mlp.down_proj.weight"));
  BOOST_REQUIRE(m.assign(restore));
  BOOST_TEST(*m.forward_all(ids) == *before);
}

BOOST_AUTO_TEST_CASE(kv_cache_decode_equals_full_forward) {
  auto m = load_tiny(7);
  const int64_t V = m.config().vocab_size;
  const auto ids = some_tokens(40, 5);
  auto full = m.forward_all(ids);
  BOOST_REQUIRE_MESSAGE(full, why(full));
  BOOST_TEST(full->size() == ids.size() * V);

  // Prefill 5, then one token at a time.
  kv_cache cache = m.make_cache();
  std::vector<float> logits;
  auto s = m.forward(cache, std::span(ids).first(5), logits);
  BOOST_REQUIRE_MESSAGE(s, why(s));
  BOOST_TEST(cache.size() == 5);
  BOOST_TEST(max_abs_diff(logits.data(), full->data() + 4 * V, V) <= k_decode_vs_full_max_abs);
  for (std::size_t t = 5; t < ids.size(); ++t) {
    s = m.forward(cache, std::span(ids).subspan(t, 1), logits);
    BOOST_REQUIRE_MESSAGE(s, why(s));
    BOOST_TEST(max_abs_diff(logits.data(), full->data() + t * V, V) <= k_decode_vs_full_max_abs,
               "position " << t);
  }
  BOOST_TEST(cache.size() == int64_t(ids.size()));
  BOOST_TEST((std::vector<int32_t>(cache.tokens().begin(), cache.tokens().end()) == ids));

  // Uneven chunks (chunked prefill) and a rollback with truncate give the same rows.
  cache.truncate(17);
  s = m.forward(cache, std::span(ids).subspan(17, 6), logits);
  BOOST_REQUIRE(s);
  BOOST_TEST(max_abs_diff(logits.data(), full->data() + 22 * V, V) <= k_decode_vs_full_max_abs);
  cache.clear();
  BOOST_TEST(cache.size() == 0);
  s = m.forward(cache, std::span(ids).first(1), logits);
  BOOST_REQUIRE(s);
  BOOST_TEST(max_abs_diff(logits.data(), full->data(), V) <= k_decode_vs_full_max_abs);
}

BOOST_AUTO_TEST_CASE(forward_errors_leave_the_cache_unchanged) {
  auto m = load_tiny();
  kv_cache cache = m.make_cache();
  std::vector<float> logits;
  BOOST_REQUIRE(m.forward(cache, some_tokens(3, 1), logits));
  std::vector<int32_t> none;
  auto s = m.forward(cache, none, logits);
  BOOST_REQUIRE(!s);
  expect_error_contains(s.error(), {"no tokens"});
  std::vector<int32_t> bad{4, 512, 5};
  s = m.forward(cache, bad, logits);
  BOOST_REQUIRE(!s);
  expect_error_contains(s.error(), {"token id 512 at index 1", "[0, 512)"});
  BOOST_TEST(cache.size() == 3);

  auto other = tiny_config();
  other.num_hidden_layers = 3;
  kv_cache wrong(other);
  s = m.forward(wrong, some_tokens(1, 1), logits);
  BOOST_REQUIRE(!s);
  expect_error_contains(s.error(), {"3 layers"});

  auto short_config = tiny_config();
  short_config.max_position_embeddings = 8;
  auto short_model = qwen3_model::load(short_config, random_parameters(short_config, 1, dtype::bf16));
  BOOST_REQUIRE(short_model);
  kv_cache c2 = short_model->make_cache();
  BOOST_REQUIRE(short_model->forward(c2, some_tokens(6, 2), logits));
  s = short_model->forward(c2, some_tokens(3, 2), logits);
  BOOST_REQUIRE(!s);
  expect_error_contains(s.error(), {"6 cached + 3 new", "max_position_embeddings 8"});
  BOOST_TEST(c2.size() == 6);
}

BOOST_AUTO_TEST_CASE(logits_are_varied) {
  // The oracle guard for every other test here: a degenerate random model (all-equal logits)
  // would make equality checks pass vacuously.
  auto m = load_tiny(3);
  auto logits = m.forward_all(some_tokens(4, 9));
  BOOST_REQUIRE(logits);
  double sum = 0, sum_sq = 0;
  for (float v : *logits) {
    BOOST_REQUIRE(std::isfinite(v));
    sum += v;
    sum_sq += double(v) * v;
  }
  const double n = double(logits->size());
  const double std_dev = std::sqrt(sum_sq / n - (sum / n) * (sum / n));
  BOOST_TEST(std_dev > 1.0);
  BOOST_TEST(std_dev < 10.0);
}

// ---- kernels/cpu_ops ----------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(cpu_matmul_matches_double_loops_on_awkward_shapes) {
  std::mt19937 g(42);
  std::normal_distribution<float> normal;
  for (int64_t m : {1, 2, 3, 5})
    for (int64_t n : {1, 3, 4, 5, 67, 130})
      for (int64_t k : {1, 7, 8, 9, 33, 64}) {
        std::vector<float> x(m * k), w(n * k), y(m * n, -777.0f), y_threads(m * n, -777.0f);
        for (auto& v : x)
          v = normal(g);
        for (auto& v : w)
          v = normal(g);
        BOOST_REQUIRE(kernels::matmul_cpu({x.data(), w.data(), y.data(), m, n, k, 1}) ==
                      kernels::kernel_status::ok);
        BOOST_REQUIRE(kernels::matmul_cpu({x.data(), w.data(), y_threads.data(), m, n, k, 3}) ==
                      kernels::kernel_status::ok);
        BOOST_TEST(y == y_threads, "threads change the result at " << m << "x" << n << "x" << k);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double ref = 0, mag = 0;
            for (int64_t p = 0; p < k; ++p) {
              ref += double(x[i * k + p]) * w[j * k + p];
              mag += std::abs(double(x[i * k + p]) * w[j * k + p]);
            }
            BOOST_TEST(std::abs(y[i * n + j] - ref) <= k_matmul_vs_double_max_rel * (mag + 1e-6),
                       m << "x" << n << "x" << k << " at (" << i << ", " << j << ")");
          }
      }
  BOOST_TEST((kernels::matmul_cpu({nullptr, nullptr, nullptr, 1, 1, 1, 0}) ==
              kernels::kernel_status::invalid_problem));
}

BOOST_AUTO_TEST_CASE(cpu_rope_rotates_pairs_half_a_head_apart) {
  // head_dim 4: pairs (x0, x2) at frequency 1 and (x1, x3) at theta^(-1/2).
  std::vector<float> x{1, 0, 0, 1,  1, 0, 0, 1};
  BOOST_REQUIRE(kernels::rope_cpu({x.data(), 2, 1, 4, 0, 100.0}) == kernels::kernel_status::ok);
  // Position 0 is the identity; position 1 rotates pair 0 by 1 rad, pair 1 by 0.1 rad.
  BOOST_TEST(x[0] == 1.0f);
  BOOST_TEST(x[3] == 1.0f);
  BOOST_TEST(std::abs(x[4] - std::cos(1.0f)) < 1e-6f);
  BOOST_TEST(std::abs(x[6] - std::sin(1.0f)) < 1e-6f);  // x2' = x2 cos + x0 sin
  BOOST_TEST(std::abs(x[5] + std::sin(0.1f)) < 1e-6f);  // x1' = x1 cos - x3 sin
  BOOST_TEST(std::abs(x[7] - std::cos(0.1f)) < 1e-6f);
}

BOOST_AUTO_TEST_CASE(cpu_attention_is_causal_and_groups_heads) {
  // 2 query heads share 1 kv head; 2 tokens; head_dim 2. The first query sees only key 0, so its
  // output is v0 exactly whatever the scores.
  std::vector<float> q{1, 0, 0, 1,  1, 0, 0, 1}; // [2 tokens, 2 heads, 2]
  std::vector<float> k{1, 0,  0, 1};              // [2 tokens, 1 kv head, 2]
  std::vector<float> v{10, 20,  30, 40};
  std::vector<float> out(8, -1.f);
  BOOST_REQUIRE(kernels::attention_cpu({q.data(), k.data(), v.data(), out.data(), 2, 2, 2, 1, 2,
                                        1.0f}) == kernels::kernel_status::ok);
  BOOST_TEST(out[0] == 10.f);
  BOOST_TEST(out[1] == 20.f);
  BOOST_TEST(out[2] == 10.f);
  BOOST_TEST(out[3] == 20.f);
  // Token 1, head 0: scores (1, 0) -> p = (e/(1+e), 1/(1+e)).
  const float p0 = std::exp(1.f) / (1.f + std::exp(1.f));
  BOOST_TEST(std::abs(out[4] - (p0 * 10 + (1 - p0) * 30)) < 1e-4f);
  // Head 1 scores (0, 1): the mirror image.
  BOOST_TEST(std::abs(out[6] - ((1 - p0) * 10 + p0 * 30)) < 1e-4f);
}

BOOST_AUTO_TEST_SUITE_END()
