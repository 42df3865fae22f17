// model/qwen3 with Qwen3MoeForCausalLM configs: which layers are sparse (decoder_sparse_step,
// mlp_only_layers), the per-expert parameter names and load errors, routing (ties to the lower
// expert id, norm_topk_prob on and off) checked against the dense model with the experts made
// equal to its MLP, decoding against the full forward, and a one-expert weight update. Numerical
// parity with an independent numpy Qwen3-MoE is tests/python/test_qwen3_parity.py.
#include <boost/test/unit_test.hpp>

#include "tests/support/fused_experts.hpp"
#include "tests/support/test_support.hpp"

#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/bf16.hpp"
#include "model/checkpoint.hpp"
#include "model/kv_pool.hpp"
#include "model/make_model.hpp"
#include "model/qwen3.hpp"

using rlserve::dtype;
using rlserve::HostTensor;
using rlserve::NamedTensor;
using namespace rlserve::model;

namespace {

using rlserve::test::why;

// Decoding runs the same float operations per row as the full forward; see qwen3_test.cpp.
constexpr float k_decode_vs_full_max_abs = 1e-5f;
// Zero router, experts equal to the dense MLP: the MoE sum is w * y + w * y with w a power of two,
// exact in fp32, so the logits agree with the dense model's to the bit; the bound only allows a
// compiler contracting differently.
constexpr float k_moe_vs_dense_max_abs = 1e-5f;

model_config tiny_moe_config() {
  auto c = preset_config("qwen3-moe", "tiny");
  BOOST_REQUIRE_MESSAGE(c, why(c));
  return *c;
}

qwen3_model load(const model_config& config, const std::vector<NamedTensor>& tensors) {
  auto m = qwen3_model::load(config, tensors);
  BOOST_REQUIRE_MESSAGE(m, why(m));
  return std::move(*m);
}

void expect_error_contains(const std::string& error, std::initializer_list<std::string> parts) {
  for (const auto& p : parts)
    BOOST_TEST(error.find(p) != std::string::npos, "'" << p << "' not in: " << error);
}

const parameter_spec* find_spec(const std::vector<parameter_spec>& specs, const std::string& name) {
  for (const auto& s : specs)
    if (s.name == name)
      return &s;
  return nullptr;
}

HostTensor f32_tensor(std::vector<int64_t> shape, std::vector<float> values) {
  return HostTensor::from_vector(dtype::f32, std::move(shape), values);
}

std::vector<float> f32_values(const HostTensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  std::memcpy(v.data(), t.data.get(), v.size() * sizeof(float));
  return v;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  BOOST_REQUIRE_EQUAL(a.size(), b.size());
  float m = 0.0f;
  for (std::size_t i = 0; i < a.size(); ++i)
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

// A MoE twin of the dense tiny model: the same attention, norms and embeddings; in every sparse
// layer a zero router (all logits 0: top-k takes experts 0 .. k-1 by the tie rule) and experts
// 0 .. k-1 equal to the dense MLP. Experts k .. E-1 get `other_experts` in every element, so a
// wrong tie rule changes the output.
std::vector<NamedTensor> moe_twin_of_dense(const model_config& moe, const model_config& dense,
                                           uint64_t seed, float other_experts) {
  auto dense_tensors = random_parameters(dense, seed, dtype::f32);
  std::map<std::string, HostTensor> by_name;
  for (auto& t : dense_tensors)
    by_name.emplace(t.name, t.tensor);
  std::vector<NamedTensor> out;
  for (const auto& spec : qwen3_parameter_specs(moe, dtype::f32)) {
    const std::string& n = spec.name;
    int64_t numel = 1;
    for (auto d : spec.shape)
      numel *= d;
    if (auto it = by_name.find(n); it != by_name.end()) {
      out.push_back({n, it->second});
    } else if (n.ends_with("mlp.gate.weight")) {
      out.push_back({n, f32_tensor(spec.shape, std::vector<float>(numel, 0.0f))});
    } else {
      // model.layers.L.mlp.experts.E.<proj>.weight
      const auto experts_at = n.find("mlp.experts.") + std::string("mlp.experts.").size();
      const auto dot = n.find('.', experts_at);
      const int64_t e = std::stoll(n.substr(experts_at, dot - experts_at));
      const std::string dense_name = n.substr(0, n.find("experts.")) + n.substr(dot + 1);
      if (e < moe.num_experts_per_tok)
        out.push_back({n, by_name.at(dense_name)});
      else
        out.push_back({n, f32_tensor(spec.shape, std::vector<float>(numel, other_experts))});
    }
  }
  return out;
}

} // namespace

BOOST_AUTO_TEST_SUITE(qwen3_moe_test)

BOOST_AUTO_TEST_CASE(sparse_layers_follow_hf_rules) {
  auto c = tiny_moe_config();
  c.num_hidden_layers = 4;
  for (int64_t l = 0; l < 4; ++l)
    BOOST_TEST(qwen3_layer_is_sparse(c, l), "step 1: layer " << l << " sparse");
  c.decoder_sparse_step = 2; // (l + 1) % 2 == 0: layers 1 and 3
  BOOST_TEST(!qwen3_layer_is_sparse(c, 0));
  BOOST_TEST(qwen3_layer_is_sparse(c, 1));
  BOOST_TEST(!qwen3_layer_is_sparse(c, 2));
  BOOST_TEST(qwen3_layer_is_sparse(c, 3));
  c.mlp_only_layers = {3};
  BOOST_TEST(qwen3_layer_is_sparse(c, 1));
  BOOST_TEST(!qwen3_layer_is_sparse(c, 3));
  c.decoder_sparse_step = 1;
  c.mlp_only_layers = {0, 2};
  BOOST_TEST(!qwen3_layer_is_sparse(c, 0));
  BOOST_TEST(qwen3_layer_is_sparse(c, 1));
  BOOST_TEST(!qwen3_layer_is_sparse(c, 2));
  auto no_experts = c;
  no_experts.num_experts = 0;
  BOOST_TEST(!qwen3_layer_is_sparse(no_experts, 1));
  auto dense = preset_config("qwen3", "tiny");
  BOOST_REQUIRE(dense);
  BOOST_TEST(!qwen3_layer_is_sparse(*dense, 0));
}

BOOST_AUTO_TEST_CASE(parameters_are_per_expert_hf_names) {
  auto c = tiny_moe_config();
  BOOST_TEST(c.architecture == "Qwen3MoeForCausalLM");
  BOOST_TEST(c.model_type == "qwen3_moe");
  auto specs = qwen3_parameter_specs(c, dtype::bf16);
  // embed, final norm; per layer 8 attention/norm tensors, the router, 8 experts x 3.
  BOOST_TEST(specs.size() == 2u + 2u * (8u + 1u + 8u * 3u));
  const auto* router = find_spec(specs, "model.layers.0.mlp.gate.weight");
  BOOST_REQUIRE(router);
  BOOST_TEST((router->shape == std::vector<int64_t>{8, 64}));
  const auto* gate = find_spec(specs, "model.layers.1.mlp.experts.7.gate_proj.weight");
  const auto* up = find_spec(specs, "model.layers.1.mlp.experts.7.up_proj.weight");
  const auto* down = find_spec(specs, "model.layers.1.mlp.experts.7.down_proj.weight");
  BOOST_REQUIRE(gate && up && down);
  BOOST_TEST((gate->shape == std::vector<int64_t>{32, 64}));
  BOOST_TEST((up->shape == std::vector<int64_t>{32, 64}));
  BOOST_TEST((down->shape == std::vector<int64_t>{64, 32}));
  BOOST_TEST(!find_spec(specs, "model.layers.0.mlp.gate_proj.weight"));
  BOOST_TEST(!find_spec(specs, "model.layers.0.mlp.experts.8.gate_proj.weight"));

  // A layer in mlp_only_layers has the dense MLP of intermediate_size and no experts.
  c.mlp_only_layers = {1};
  specs = qwen3_parameter_specs(c, dtype::bf16);
  BOOST_TEST(specs.size() == 2u + (8u + 1u + 8u * 3u) + (8u + 3u));
  const auto* dense_gate = find_spec(specs, "model.layers.1.mlp.gate_proj.weight");
  BOOST_REQUIRE(dense_gate);
  BOOST_TEST((dense_gate->shape == std::vector<int64_t>{128, 64}));
  BOOST_TEST(!find_spec(specs, "model.layers.1.mlp.gate.weight"));
  BOOST_TEST(!find_spec(specs, "model.layers.1.mlp.experts.0.up_proj.weight"));

  auto m = load(c, random_parameters(c, 3, dtype::bf16));
  auto params = m.parameters();
  BOOST_TEST(params.size() == specs.size());
  for (std::size_t i = 0; i < params.size(); ++i)
    BOOST_TEST(params[i].name == specs[i].name);
}

// The same weights saved per expert (the hub format) and with each layer's experts fused the
// way transformers 5 holds them (gate_up_proj [E, 2I, H], down_proj [E, H, I]) load into the
// same model: the logits agree to the bit.
BOOST_AUTO_TEST_CASE(fused_expert_checkpoints_load_as_per_expert_ones) {
  const auto c = tiny_moe_config();
  const auto params = random_parameters(c, 5, dtype::bf16);
  const auto fused = rlserve::test::with_fused_experts(params);
  rlserve::test::temp_dir hub, v5;
  BOOST_REQUIRE(write_checkpoint(hub.path, params));
  BOOST_REQUIRE(write_checkpoint(v5.path, fused, 1 << 16)); // sharded, too
  auto a = checkpoint::open(hub.path), b = checkpoint::open(v5.path);
  BOOST_REQUIRE_MESSAGE(a, why(a));
  BOOST_REQUIRE_MESSAGE(b, why(b));
  BOOST_TEST(a->names() == b->names());
  auto ma = qwen3_model::load(c, *a), mb = qwen3_model::load(c, *b);
  BOOST_REQUIRE_MESSAGE(ma, why(ma));
  BOOST_REQUIRE_MESSAGE(mb, why(mb));
  const std::vector<int32_t> ids{3, 1, 4, 1, 5, 9, 2, 6};
  auto la = ma->forward_all(ids), lb = mb->forward_all(ids);
  BOOST_REQUIRE_MESSAGE(la, why(la));
  BOOST_REQUIRE_MESSAGE(lb, why(lb));
  BOOST_TEST((*la == *lb));
}

BOOST_AUTO_TEST_CASE(load_errors_name_expert_tensors) {
  const auto c = tiny_moe_config();
  const auto good = random_parameters(c, 1, dtype::bf16);

  auto missing = good;
  std::erase_if(missing, [](const NamedTensor& t) {
    return t.name == "model.layers.1.mlp.experts.3.up_proj.weight";
  });
  auto m = qwen3_model::load(c, missing);
  BOOST_REQUIRE(!m);
  expect_error_contains(m.error(), {"missing 1 tensor", "model.layers.1.mlp.experts.3.up_proj.weight"});

  // An expert beyond num_experts, and a dense MLP tensor in a sparse layer.
  auto extra = good;
  extra.push_back({"model.layers.0.mlp.experts.8.gate_proj.weight",
                   f32_tensor({32, 64}, std::vector<float>(32 * 64, 0.f))});
  extra.push_back({"model.layers.1.mlp.gate_proj.weight",
                   f32_tensor({128, 64}, std::vector<float>(128 * 64, 0.f))});
  m = qwen3_model::load(c, extra);
  BOOST_REQUIRE(!m);
  expect_error_contains(m.error(), {"2 tensor(s)", "Qwen3MoeForCausalLM",
                                    "model.layers.0.mlp.experts.8.gate_proj.weight",
                                    "model.layers.1.mlp.gate_proj.weight"});

  auto wrong_shape = good;
  for (auto& t : wrong_shape)
    if (t.name == "model.layers.0.mlp.experts.2.down_proj.weight")
      t.tensor = f32_tensor({64, 33}, std::vector<float>(64 * 33, 0.f));
  m = qwen3_model::load(c, wrong_shape);
  BOOST_REQUIRE(!m);
  expect_error_contains(m.error(), {"'model.layers.0.mlp.experts.2.down_proj.weight'",
                                    "shape [64, 33]", "implies [64, 32]"});

  // A dense checkpoint under a MoE config: the experts are missing.
  auto dense = preset_config("qwen3", "tiny");
  BOOST_REQUIRE(dense);
  m = qwen3_model::load(c, random_parameters(*dense, 1, dtype::bf16));
  BOOST_REQUIRE(!m);
  expect_error_contains(m.error(), {"missing", "mlp.experts.0.down_proj.weight"});

  // Configs the model would run wrong are refused.
  auto bad = c;
  bad.decoder_sparse_step = 0;
  m = qwen3_model::load(bad, good);
  BOOST_REQUIRE(!m);
  expect_error_contains(m.error(), {"decoder_sparse_step"});
  bad = c;
  bad.num_experts = 300;
  m = qwen3_model::load(bad, good);
  BOOST_REQUIRE(!m);
  expect_error_contains(m.error(), {"300 experts"});
}

BOOST_AUTO_TEST_CASE(routing_ties_to_lower_ids_and_norm_topk_prob) {
  auto dense = preset_config("qwen3", "tiny");
  BOOST_REQUIRE(dense);
  auto moe = tiny_moe_config();
  moe.moe_intermediate_size = dense->intermediate_size; // experts shaped like the dense MLP
  const auto ids = some_tokens(23, 9);

  const auto dense_logits = load(*dense, random_parameters(*dense, 4, dtype::f32)).forward_all(ids);
  BOOST_REQUIRE_MESSAGE(dense_logits, why(dense_logits));

  // norm_topk_prob: experts 0 and 1 each weigh 1/2 and equal the MLP: the dense model exactly.
  // Experts 2 .. 7 hold 3.0 everywhere; choosing any of them would change the logits by far more.
  moe.norm_topk_prob = true;
  auto twin = load(moe, moe_twin_of_dense(moe, *dense, 4, 3.0f));
  auto logits = twin.forward_all(ids);
  BOOST_REQUIRE_MESSAGE(logits, why(logits));
  BOOST_TEST(max_abs_diff(*logits, *dense_logits) <= k_moe_vs_dense_max_abs);

  // Without renormalization each chosen expert weighs softmax = 1/8: the block is 2/8 of the
  // MLP, i.e. the dense model with down_proj scaled by 1/4 (exact in fp32).
  moe.norm_topk_prob = false;
  twin = load(moe, moe_twin_of_dense(moe, *dense, 4, 3.0f));
  logits = twin.forward_all(ids);
  BOOST_REQUIRE_MESSAGE(logits, why(logits));
  BOOST_TEST(max_abs_diff(*logits, *dense_logits) > 0.1f, "norm_topk_prob = false had no effect");
  auto scaled = random_parameters(*dense, 4, dtype::f32);
  for (auto& t : scaled)
    if (t.name.ends_with("mlp.down_proj.weight")) {
      auto v = f32_values(t.tensor);
      for (auto& x : v)
        x *= 0.25f;
      t.tensor = f32_tensor(t.tensor.shape, v);
    }
  auto scaled_logits = load(*dense, scaled).forward_all(ids);
  BOOST_REQUIRE(scaled_logits);
  BOOST_TEST(max_abs_diff(*logits, *scaled_logits) <= k_moe_vs_dense_max_abs);

  // mlp_only_layers: layer 1 runs the dense MLP (here: the dense model's own), layer 0 the twin
  // experts; with norm_topk_prob the result is the dense model again.
  moe.norm_topk_prob = true;
  moe.mlp_only_layers = {1};
  twin = load(moe, moe_twin_of_dense(moe, *dense, 4, 3.0f));
  BOOST_TEST(twin.parameter("model.layers.1.mlp.gate_proj.weight").has_value());
  logits = twin.forward_all(ids);
  BOOST_REQUIRE(logits);
  BOOST_TEST(max_abs_diff(*logits, *dense_logits) <= k_moe_vs_dense_max_abs);
}

BOOST_AUTO_TEST_CASE(decode_equals_full_forward) {
  const auto c = tiny_moe_config();
  auto m = load(c, random_parameters(c, 7, dtype::bf16));
  const int64_t V = c.vocab_size;
  const auto ids = some_tokens(30, 5);
  auto full = m.forward_all(ids);
  BOOST_REQUIRE_MESSAGE(full, why(full));
  // Logits spread (a model routing nothing would not).
  double sum = 0, sq = 0;
  for (float x : *full)
    sum += x, sq += double(x) * x;
  const double mean = sum / full->size();
  BOOST_TEST(std::sqrt(sq / full->size() - mean * mean) > 0.5);

  kv_cache cache = m.make_cache();
  std::vector<float> logits;
  auto s = m.forward(cache, std::span(ids).first(7), logits);
  BOOST_REQUIRE_MESSAGE(s, why(s));
  std::vector<float> want(full->begin() + 6 * V, full->begin() + 7 * V);
  BOOST_TEST(max_abs_diff(logits, want) <= k_decode_vs_full_max_abs);
  for (std::size_t t = 7; t < ids.size(); ++t) {
    s = m.forward(cache, std::span(ids).subspan(t, 1), logits);
    BOOST_REQUIRE_MESSAGE(s, why(s));
    want.assign(full->begin() + t * V, full->begin() + (t + 1) * V);
    BOOST_TEST(max_abs_diff(logits, want) <= k_decode_vs_full_max_abs, "position " << t);
  }
}

BOOST_AUTO_TEST_CASE(rows_do_not_depend_on_the_batch) {
  // Three sequences in one pool forward (a prefill of 9, a prefill of 4, a decode after 5): the
  // experts see other row groups than alone, yet every logit row equals the one-sequence forward
  // to the bit (moe_block's batch-invariance argument).
  const auto c = tiny_moe_config();
  auto m = load(c, random_parameters(c, 8, dtype::bf16));
  const int64_t V = c.vocab_size, bs = 4;
  const std::vector<std::vector<int32_t>> seqs{some_tokens(9, 1), some_tokens(4, 2), some_tokens(6, 3)};
  std::vector<std::vector<float>> alone;
  for (const auto& ids : seqs) {
    auto full = m.forward_all(ids);
    BOOST_REQUIRE_MESSAGE(full, why(full));
    alone.push_back(*full);
  }
  kv_pool pool(c, bs, 16);
  std::vector<kv_sequence> kv(3);
  int32_t next = 0;
  for (auto& s : kv)
    for (int b = 0; b < 4; ++b)
      s.blocks.push_back(next++);
  std::vector<float> logits;
  // The third sequence's first 5 tokens first, alone.
  forward_item first{&kv[2], std::span(seqs[2]).first(5), 0};
  auto st = m.forward(pool, std::span(&first, 1), logits);
  BOOST_REQUIRE_MESSAGE(st, why(st));
  std::vector<forward_item> items{{&kv[0], seqs[0], 9}, {&kv[1], seqs[1], 1},
                                  {&kv[2], std::span(seqs[2]).subspan(5, 1), 1}};
  st = m.forward(pool, items, logits);
  BOOST_REQUIRE_MESSAGE(st, why(st));
  BOOST_REQUIRE_EQUAL(logits.size(), std::size_t(11 * V));
  auto row = [&](std::size_t r) { return std::vector<float>(logits.begin() + r * V, logits.begin() + (r + 1) * V); };
  auto alone_row = [&](int s, int64_t t) {
    return std::vector<float>(alone[s].begin() + t * V, alone[s].begin() + (t + 1) * V);
  };
  for (int64_t t = 0; t < 9; ++t)
    BOOST_TEST((row(t) == alone_row(0, t)), "sequence 0 position " << t);
  BOOST_TEST((row(9) == alone_row(1, 3)));
  BOOST_TEST((row(10) == alone_row(2, 5)));
}

BOOST_AUTO_TEST_CASE(updating_one_expert_changes_its_checksum_and_output) {
  const auto c = tiny_moe_config();
  auto m = load(c, random_parameters(c, 2, dtype::bf16));
  auto digests = [&] {
    std::map<std::string, uint64_t> out;
    for (const auto& p : m.parameters()) {
      auto t = m.parameter(p.name);
      BOOST_REQUIRE(t);
      out[p.name] = XXH3_64bits(t->data.get(), t->nbytes);
    }
    return out;
  };
  const auto ids = some_tokens(40, 3);
  const auto before = digests();
  auto logits_before = m.forward_all(ids);
  BOOST_REQUIRE(logits_before);

  const std::string name = "model.layers.1.mlp.experts.5.down_proj.weight";
  auto other = random_parameters(c, 99, dtype::bf16);
  std::vector<NamedTensor> update;
  for (auto& t : other)
    if (t.name == name)
      update.push_back(t);
  BOOST_REQUIRE_EQUAL(update.size(), 1u);
  auto s = m.assign(update);
  BOOST_REQUIRE_MESSAGE(s, why(s));

  const auto after = digests();
  for (const auto& [n, d] : before)
    BOOST_TEST((after.at(n) != d) == (n == name), n);
  auto t = m.parameter(name);
  BOOST_REQUIRE(t);
  BOOST_TEST(std::memcmp(t->data.get(), update[0].tensor.data.get(), t->nbytes) == 0);
  // 40 tokens, top-2 of 8: expert 5 of layer 1 serves some of them.
  auto logits_after = m.forward_all(ids);
  BOOST_REQUIRE(logits_after);
  BOOST_TEST(max_abs_diff(*logits_before, *logits_after) > 1e-3f);

  // A wrong shape for an expert tensor is refused, naming it.
  std::vector<NamedTensor> wrong{{name, f32_tensor({64, 32}, std::vector<float>(64 * 32, 0.f))}};
  s = m.assign(wrong);
  BOOST_REQUIRE(!s);
  expect_error_contains(s.error(), {name, "expected bfloat16 [64, 32]"});
}

BOOST_AUTO_TEST_SUITE_END()
