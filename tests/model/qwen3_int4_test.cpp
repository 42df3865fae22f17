// model/qwen3 with INT4 (compressed-tensors pack-quantized) experts: loading every recipe x group
// size x zero-point layout (oracle: a float model loaded from the reference dequantization of the
// same bytes gives bit-identical logits), the ignore list, every bad-input path (message names
// the module, nothing half-applied), quantize-at-load == `rlserve quantize` (bytes and logits),
// the load option without compute copies, and updates in both forms with per-tensor checksums.
// numpy parity of an INT4 checkpoint is tests/python/test_qwen3_int4_parity.py.
#include <boost/test/unit_test.hpp>

#include "tests/support/test_support.hpp"

#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/compressed_tensors.hpp"
#include "model/checkpoint.hpp"
#include "model/make_model.hpp"
#include "model/qwen3.hpp"
#include "model/quant/int4_checkpoint.hpp"

using rlserve::dtype;
using rlserve::HostTensor;
using rlserve::NamedTensor;
using namespace rlserve::model;
namespace k4 = rlserve::kernels;

namespace {

using rlserve::test::why;

// A one-layer MoE wide enough for every group size (k = hidden = moe_intermediate = 128) and for
// the kernels' 64-column tiles (w13 n = 256, w2 n = 128).
model_config wide_moe_config() {
  auto c = preset_config("qwen3-moe", "tiny");
  BOOST_REQUIRE_MESSAGE(c, why(c));
  c->vocab_size = 256;
  c->hidden_size = 128;
  c->num_hidden_layers = 1;
  c->num_attention_heads = 4;
  c->num_key_value_heads = 2;
  c->head_dim = 32;
  c->num_experts = 4;
  c->num_experts_per_tok = 2;
  c->moe_intermediate_size = 128;
  return *c;
}

model_config tiny_moe_config() {
  auto c = preset_config("qwen3-moe", "tiny");
  BOOST_REQUIRE_MESSAGE(c, why(c));
  return *c;
}

struct int4_checkpoint {
  model_config config; // with quantization (and raw.quantization_config)
  std::vector<NamedTensor> tensors;
};

// What `rlserve quantize` makes of random BF16 weights, in memory.
int4_checkpoint quantized(model_config config, uint64_t seed, k4::int4_recipe recipe, int32_t group,
                          k4::zero_point_layout layout = k4::zero_point_layout::standard,
                          quant::quant_targets targets = quant::quant_targets::experts) {
  quant::quantize_options o;
  o.targets = targets;
  o.recipe = recipe;
  o.group_size = group;
  o.zp_layout = layout;
  o.threads = 1;
  auto q = quant::quantize_tensors(random_parameters(config, seed, dtype::bf16), o);
  BOOST_REQUIRE_MESSAGE(q, why(q));
  config.raw["quantization_config"] = quant::compressed_tensors_config(recipe, group, q->ignored);
  auto qc = parse_quantization_config(config.raw["quantization_config"], "test");
  BOOST_REQUIRE_MESSAGE(qc, why(qc));
  config.quantization = *qc;
  return {config, std::move(q->tensors)};
}

qwen3_model load(const model_config& config, const std::vector<NamedTensor>& tensors,
                 const qwen3_load_options& options = {}) {
  auto m = qwen3_model::load(config, tensors, options);
  BOOST_REQUIRE_MESSAGE(m, why(m));
  return std::move(*m);
}

std::string load_error(const model_config& config, const std::vector<NamedTensor>& tensors,
                       const qwen3_load_options& options = {}) {
  auto m = qwen3_model::load(config, tensors, options);
  BOOST_REQUIRE_MESSAGE(!m, "expected a load failure");
  return m.error();
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

bool same_bytes(const HostTensor& a, const HostTensor& b) {
  return a.type == b.type && a.shape == b.shape && a.nbytes == b.nbytes &&
         std::memcmp(a.data.get(), b.data.get(), a.nbytes) == 0;
}

std::map<std::string, uint64_t> checksums(const qwen3_model& m) {
  std::map<std::string, uint64_t> out;
  for (const auto& p : m.parameters()) {
    auto t = m.parameter(p.name);
    BOOST_REQUIRE(t);
    out[p.name] = XXH3_64bits(t->data.get(), t->nbytes);
  }
  return out;
}

std::set<std::string> changed(const std::map<std::string, uint64_t>& before,
                              const std::map<std::string, uint64_t>& after) {
  BOOST_REQUIRE_EQUAL(before.size(), after.size());
  std::set<std::string> out;
  for (const auto& [name, sum] : before)
    if (after.at(name) != sum)
      out.insert(name);
  return out;
}

std::vector<int32_t> some_tokens(int n, int32_t vocab, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> ids(n);
  for (auto& id : ids)
    id = static_cast<int32_t>(g() % static_cast<uint32_t>(vocab));
  return ids;
}

std::vector<float> logits(const qwen3_model& m, const std::vector<int32_t>& tokens) {
  auto l = m.forward_all(tokens);
  BOOST_REQUIRE_MESSAGE(l, why(l));
  return *l;
}

// The float twin of an INT4 checkpoint: every quantized module replaced by the reference
// dequantization (kernels::ct_dequant_ref) of its bytes as a bf16 `.weight`, no quantization_config.
std::vector<NamedTensor> dequantized_twin(const int4_checkpoint& q, k4::zero_point_layout layout) {
  std::map<std::string, HostTensor> by_name;
  for (const auto& t : q.tensors)
    by_name.emplace(t.name, t.tensor);
  std::vector<NamedTensor> out;
  for (const auto& [name, t] : by_name) {
    if (!name.ends_with(".weight_packed")) {
      if (name.ends_with(".weight_scale") || name.ends_with(".weight_zero_point") ||
          name.ends_with(".weight_shape"))
        continue;
      out.push_back({name, t});
      continue;
    }
    const std::string prefix = name.substr(0, name.size() - std::string(".weight_packed").size());
    const auto& scale = by_name.at(prefix + ".weight_scale");
    k4::ct_dequant_args a;
    a.shape = {1, t.shape[0], t.shape[1] * 8, q.config.quantization->group_size};
    a.has_zero_point = !q.config.quantization->symmetric;
    a.zp_layout = layout;
    a.weight_packed = t.as<int32_t>().data();
    a.weight_scale = scale.as<uint16_t>().data();
    a.weight_zero_point = a.has_zero_point ? by_name.at(prefix + ".weight_zero_point").as<int32_t>().data() : nullptr;
    std::vector<uint16_t> w(static_cast<std::size_t>(a.shape.n * a.shape.k));
    a.out = w.data();
    BOOST_REQUIRE(k4::ct_dequant_ref(a) == k4::kernel_status::ok);
    out.push_back({prefix + ".weight", HostTensor::from_vector(dtype::bf16, {a.shape.n, a.shape.k}, w)});
  }
  return out;
}

// A BF16 version of `prefix`'s weight, perturbed: what a trainer sends.
HostTensor trainer_weight(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 0.2f);
  std::vector<uint16_t> w(static_cast<std::size_t>(n * k));
  for (auto& x : w)
    x = k4::float_to_bf16(d(g));
  return HostTensor::from_vector(dtype::bf16, {n, k}, w);
}

const std::string k_expert = "model.layers.0.mlp.experts.1.up_proj";

} // namespace

BOOST_AUTO_TEST_SUITE(qwen3_int4_test)

// Every recipe, group size and zero-point layout loads; the model's parameters are the
// load-format tensors byte for byte; int4_linear sees them; and the forward equals the forward of
// a float model holding the reference dequantization (so the compute copy is exactly that).
BOOST_AUTO_TEST_CASE(loads_every_recipe_group_size_and_zero_point_layout) {
  const auto config = wide_moe_config();
  const auto tokens = some_tokens(5, static_cast<int32_t>(config.vocab_size), 7);
  for (auto recipe : {k4::int4_recipe::asym, k4::int4_recipe::sym_qat, k4::int4_recipe::sym})
    for (int32_t group : {32, 64, 128, k4::k_int4_channel})
      for (auto layout : {k4::zero_point_layout::standard, k4::zero_point_layout::miles}) {
        if (k4::int4_symmetric(recipe) && layout == k4::zero_point_layout::miles)
          continue;
        BOOST_TEST_CONTEXT(k4::to_string(recipe) << " group " << group << " " << k4::to_string(layout)) {
          auto q = quantized(config, 3, recipe, group, layout);
          auto m = load(q.config, q.tensors);
          BOOST_REQUIRE(m.quantization().has_value());
          BOOST_TEST(m.quantization()->group_size == group);
          BOOST_TEST(m.quantization()->symmetric == k4::int4_symmetric(recipe));
          BOOST_TEST((m.quantization()->targets == quant::quant_targets::experts));
          if (!k4::int4_symmetric(recipe))
            BOOST_TEST((m.quantization()->zp_layout == layout));
          // A symmetric checkpoint's BF16 updates use the QAT recipe unless told otherwise.
          BOOST_TEST((m.quantization()->recipe ==
                      (k4::int4_symmetric(recipe) ? k4::int4_recipe::sym_qat : k4::int4_recipe::asym)));

          // parameters() is exactly the checkpoint, and parameter() its bytes.
          auto specs = m.parameters();
          BOOST_REQUIRE_EQUAL(specs.size(), q.tensors.size());
          for (std::size_t i = 0; i < specs.size(); ++i) {
            BOOST_TEST(specs[i].name == q.tensors[i].name);
            auto t = m.parameter(specs[i].name);
            BOOST_REQUIRE(t);
            BOOST_TEST(same_bytes(*t, q.tensors[i].tensor), specs[i].name);
          }
          BOOST_TEST(!m.parameter(k_expert + ".weight"));

          auto v = m.int4_linear(k_expert);
          BOOST_REQUIRE(v.has_value());
          BOOST_TEST(v->shape.batch == 1);
          BOOST_TEST(v->shape.n == config.moe_intermediate_size);
          BOOST_TEST(v->shape.k == config.hidden_size);
          BOOST_TEST(v->shape.group_size == group);
          BOOST_TEST(v->symmetric == k4::int4_symmetric(recipe));
          auto packed = find(q.tensors, k_expert + ".weight_packed")->tensor;
          BOOST_TEST(v->weight_packed.size() == static_cast<std::size_t>(packed.numel()));
          BOOST_TEST(std::memcmp(v->weight_packed.data(), packed.data.get(), packed.nbytes) == 0);
          auto scale = find(q.tensors, k_expert + ".weight_scale")->tensor;
          BOOST_TEST(std::memcmp(v->weight_scale.data(), scale.data.get(), scale.nbytes) == 0);
          BOOST_TEST(v->weight_zero_point.empty() == k4::int4_symmetric(recipe));
          BOOST_TEST(!m.int4_linear("model.layers.0.self_attn.q_proj").has_value());
          BOOST_TEST(!m.int4_linear("model.layers.0.mlp.gate").has_value());

          auto twin = load(config, dequantized_twin(q, layout));
          BOOST_TEST((logits(m, tokens) == logits(twin, tokens)));
        }
      }
}

// The ignore list decides which float modules are allowed; "re:" patterns match from the start.
BOOST_AUTO_TEST_CASE(ignore_list_is_honoured) {
  auto q = quantized(tiny_moe_config(), 1, k4::int4_recipe::asym, 32);
  // As written: every attention projection and router is listed.
  for (const char* m : {"lm_head", "model.layers.0.mlp.gate", "model.layers.1.self_attn.o_proj"})
    BOOST_TEST(q.config.quantization->ignores(m), m);
  load(q.config, q.tensors);

  auto regex = q.config;
  regex.quantization->ignore = {"lm_head", "re:.*self_attn\\.", "re:.*mlp\\.gate$"};
  auto re = parse_quantization_config(
    nlohmann::json{{"quant_method", "compressed-tensors"}, {"format", "pack-quantized"},
                   {"config_groups", q.config.raw["quantization_config"]["config_groups"]},
                   {"ignore", regex.quantization->ignore}},
    "test");
  BOOST_REQUIRE_MESSAGE(re, why(re));
  regex.quantization = *re;
  load(regex, q.tensors);

  // A float module the list does not name.
  auto missing_router = q.config;
  std::erase(missing_router.quantization->ignore, std::string("model.layers.1.mlp.gate"));
  expect_error_contains(load_error(missing_router, q.tensors),
                        {"module 'model.layers.1.mlp.gate'", "neither ignores it"});
  // INT4 tensors for a module the list names.
  auto ignored_expert = q.config;
  ignored_expert.quantization->ignore.push_back("model.layers.0.mlp.experts.3.down_proj");
  expect_error_contains(load_error(ignored_expert, q.tensors),
                        {"module 'model.layers.0.mlp.experts.3.down_proj'", "ignore list names it"});
}

// Every bad input fails, naming the module or tensor and what is wrong.
BOOST_AUTO_TEST_CASE(bad_int4_checkpoints_are_refused_naming_the_module) {
  const auto good = quantized(tiny_moe_config(), 2, k4::int4_recipe::asym, 32);
  const std::string p = "model.layers.1.mlp.experts.5.gate_proj";
  auto edit = [&](auto&& f) {
    auto ts = good.tensors;
    f(ts);
    return ts;
  };
  auto drop = [&](const std::string& name) {
    return edit([&](std::vector<NamedTensor>& ts) { std::erase_if(ts, [&](const NamedTensor& t) { return t.name == name; }); });
  };
  expect_error_contains(load_error(good.config, drop(p + ".weight_scale")), {"missing 1 tensor", p + ".weight_scale"});
  expect_error_contains(load_error(good.config, drop(p + ".weight_zero_point")),
                        {"module '" + p + "'", "no weight_zero_point", "asymmetric"});
  // Neither float nor INT4.
  auto neither = edit([&](std::vector<NamedTensor>& ts) {
    std::erase_if(ts, [&](const NamedTensor& t) { return t.name.starts_with(p + "."); });
  });
  expect_error_contains(load_error(good.config, neither), {"module '" + p + "'", "neither"});
  // Both.
  auto both = good.tensors;
  both.push_back({p + ".weight", trainer_weight(32, 64, 1)});
  expect_error_contains(load_error(good.config, both), {"module '" + p + "'", "both"});
  // Wrong dtype / shape / weight_shape.
  expect_error_contains(load_error(good.config, edit([&](std::vector<NamedTensor>& ts) {
                          auto& t = find(ts, p + ".weight_packed")->tensor;
                          t.type = dtype::f32;
                        })),
                        {p + ".weight_packed", "float32", "int32"});
  expect_error_contains(load_error(good.config, edit([&](std::vector<NamedTensor>& ts) {
                          auto& t = find(ts, p + ".weight_packed")->tensor;
                          t.shape = {64, 4};
                        })),
                        {p, "weight_packed has shape [64, 4]"});
  expect_error_contains(load_error(good.config, edit([&](std::vector<NamedTensor>& ts) {
                          find(ts, p + ".weight_shape")->tensor =
                            HostTensor::from_vector(dtype::i64, {2}, std::vector<int64_t>{32, 128});
                        })),
                        {p + ".weight_shape", "[32, 128]", "[32, 64]"});
  expect_error_contains(load_error(good.config, edit([&](std::vector<NamedTensor>& ts) {
                          auto& t = find(ts, p + ".weight_scale")->tensor;
                          t.type = dtype::f16;
                        })),
                        {p + ".weight_scale", "float16", "bfloat16"});
  expect_error_contains(load_error(good.config, edit([&](std::vector<NamedTensor>& ts) {
                          auto& t = find(ts, p + ".weight_zero_point")->tensor;
                          t.shape = {2, 2};
                          t.nbytes = 16;
                        })),
                        {p + ".weight_zero_point", "has shape [2, 2]", "standard layout"});
  // A symmetric config over asymmetric tensors.
  auto sym_config = good.config;
  sym_config.quantization->symmetric = true;
  expect_error_contains(load_error(sym_config, good.tensors), {"has a weight_zero_point", "symmetric"});
  // INT4 tensors without a quantization_config.
  auto plain = good.config;
  plain.quantization.reset();
  expect_error_contains(load_error(plain, good.tensors), {"weight_packed", "no quantization_config"});
  // A group size the kernels cannot run: tiny experts' down_proj has k = 32 < 64.
  auto g64 = quantized(tiny_moe_config(), 2, k4::int4_recipe::sym, k4::k_int4_channel);
  g64.config.quantization->group_size = 64;
  expect_error_contains(load_error(g64.config, g64.tensors), {"model.layers.0.mlp.experts", "group size 64"});
  // A shape the serving layout cannot hold (quant::int4_module::create): the tiny k_proj has
  // n = 32, the kernels' tiles are 64 columns wide.
  auto linear = quantized(tiny_moe_config(), 2, k4::int4_recipe::sym, 32, k4::zero_point_layout::standard,
                          quant::quant_targets::linear);
  expect_error_contains(load_error(linear.config, linear.tensors),
                        {"INT4 kernels cannot run", "model.layers.0.self_attn.k_proj", "multiple of 64"});
  // --quantize on an INT4 checkpoint.
  qwen3_load_options again;
  again.quantize = quant::quantize_options{};
  expect_error_contains(load_error(good.config, good.tensors, again), {"already quantized", "quantization_config"});
}

// Quantizing at load gives the model that loading `rlserve quantize`'s output gives: the same
// parameters byte for byte and the same logits bit for bit.
BOOST_AUTO_TEST_CASE(quantize_at_load_equals_rlserve_quantize) {
  rlserve::test::temp_dir dir("rlserve-int4-load");
  make_model_options mo;
  mo.arch = "qwen3-moe";
  mo.out = dir.path / "bf16";
  mo.seed = 5;
  BOOST_REQUIRE(make_model(mo));
  const auto tokens = some_tokens(6, 512, 3);
  struct combo {
    k4::int4_recipe recipe;
    int32_t group;
    k4::zero_point_layout layout;
  };
  for (auto c : {combo{k4::int4_recipe::asym, 32, k4::zero_point_layout::standard},
                 combo{k4::int4_recipe::asym, k4::k_int4_channel, k4::zero_point_layout::miles},
                 combo{k4::int4_recipe::sym_qat, 32, k4::zero_point_layout::standard}}) {
    BOOST_TEST_CONTEXT(k4::to_string(c.recipe) << " group " << c.group) {
      quant::quantize_checkpoint_options qo;
      qo.model = mo.out;
      qo.out = dir.path / "int4";
      qo.recipe = c.recipe;
      qo.group_size = c.group;
      qo.zp_layout = c.layout;
      auto report = quant::quantize_checkpoint(qo);
      BOOST_REQUIRE_MESSAGE(report, why(report));
      auto qconfig = load_model_config(qo.out);
      BOOST_REQUIRE_MESSAGE(qconfig, why(qconfig));
      auto qckpt = checkpoint::open(qo.out);
      BOOST_REQUIRE(qckpt);
      auto from_file = qwen3_model::load(*qconfig, *qckpt);
      BOOST_REQUIRE_MESSAGE(from_file, why(from_file));

      auto config = load_model_config(mo.out);
      auto ckpt = checkpoint::open(mo.out);
      BOOST_REQUIRE(config && ckpt);
      qwen3_load_options lo;
      lo.quantize = quant::quantize_options{c.recipe, c.group, quant::quant_targets::experts, c.layout, 2};
      auto at_load = qwen3_model::load(*config, *ckpt, lo);
      BOOST_REQUIRE_MESSAGE(at_load, why(at_load));

      auto a = from_file->parameters(), b = at_load->parameters();
      BOOST_REQUIRE_EQUAL(a.size(), b.size());
      for (std::size_t i = 0; i < a.size(); ++i) {
        BOOST_TEST(a[i].name == b[i].name);
        BOOST_TEST(same_bytes(*from_file->parameter(a[i].name), *at_load->parameter(b[i].name)), a[i].name);
      }
      BOOST_TEST(at_load->config().raw["quantization_config"] == qconfig->raw["quantization_config"]);
      BOOST_TEST((at_load->quantization()->recipe == c.recipe));
      BOOST_TEST((logits(*from_file, tokens) == logits(*at_load, tokens)));
    }
  }
}

// Without compute copies the model still lists, returns, validates and takes weights; forward
// says why it cannot run.
BOOST_AUTO_TEST_CASE(without_compute_copies_only_forward_fails) {
  auto q = quantized(tiny_moe_config(), 4, k4::int4_recipe::sym_qat, 32);
  qwen3_load_options o;
  o.compute_copies = false;
  auto m = load(q.config, q.tensors, o);
  BOOST_TEST(!m.has_compute_copies());
  BOOST_TEST(m.parameters().size() == q.tensors.size());
  BOOST_TEST(m.int4_linear(k_expert).has_value());
  auto f = m.forward_all(std::vector<int32_t>{1, 2});
  BOOST_REQUIRE(!f);
  expect_error_contains(f.error(), {"compute copies", "compute_copies = false"});
  std::vector<NamedTensor> update = {{k_expert + ".weight", trainer_weight(32, 64, 9)}};
  BOOST_REQUIRE_MESSAGE(m.validate(update[0]), why(m.validate(update[0])));
  auto st = m.assign(update);
  BOOST_REQUIRE_MESSAGE(st, why(st));
}

// An update in load format: only the named tensors change (checksums), the module's other tensors
// stay, and the forward equals that of a model loaded with the same bytes.
BOOST_AUTO_TEST_CASE(update_with_load_format_tensors) {
  const auto config = tiny_moe_config();
  auto q = quantized(config, 6, k4::int4_recipe::asym, 32);
  auto m = load(q.config, q.tensors);
  const auto tokens = some_tokens(5, 512, 11);
  // New bytes for one whole module, and only the scale of another.
  quant::quantize_options qo;
  qo.group_size = 32;
  auto fresh = quant::quantize_weight(k_expert + ".weight", trainer_weight(32, 64, 4), qo);
  BOOST_REQUIRE(fresh);
  const std::string other = "model.layers.1.mlp.experts.2.down_proj";
  auto other_fresh = quant::quantize_weight(other + ".weight", trainer_weight(64, 32, 5), qo);
  BOOST_REQUIRE(other_fresh);
  std::vector<NamedTensor> update;
  for (auto& t : *fresh)
    if (!t.name.ends_with("weight_shape"))
      update.push_back(t);
  update.push_back((*other_fresh)[1]); // weight_scale only
  BOOST_REQUIRE(update.back().name == other + ".weight_scale");

  auto before = checksums(m);
  auto st = m.assign(update);
  BOOST_REQUIRE_MESSAGE(st, why(st));
  std::set<std::string> names;
  for (const auto& t : update)
    names.insert(t.name);
  BOOST_TEST((changed(before, checksums(m)) == names));

  auto expected = q.tensors;
  for (const auto& t : update)
    find(expected, t.name)->tensor = t.tensor;
  for (const auto& t : expected)
    BOOST_TEST(same_bytes(*m.parameter(t.name), t.tensor), t.name);
  BOOST_TEST((logits(m, tokens) == logits(load(q.config, expected), tokens)));
}

// An update with a float `.weight` of an INT4 module: quantized with the model's recipe into
// exactly what `rlserve quantize` makes of that weight; only that module's tensors change.
BOOST_AUTO_TEST_CASE(update_with_bf16_weight_is_quantized_like_rlserve_quantize) {
  const auto config = tiny_moe_config();
  const auto tokens = some_tokens(5, 512, 12);
  struct combo {
    k4::int4_recipe checkpoint_recipe;
    std::optional<k4::int4_recipe> at_load; // quantized at load with this recipe instead
    k4::int4_recipe update_recipe;
  };
  for (auto c : {combo{k4::int4_recipe::asym, std::nullopt, k4::int4_recipe::asym},
                 combo{k4::int4_recipe::sym, std::nullopt, k4::int4_recipe::sym_qat},
                 combo{k4::int4_recipe::asym, k4::int4_recipe::sym, k4::int4_recipe::sym}}) {
    BOOST_TEST_CONTEXT(k4::to_string(c.checkpoint_recipe) << " -> " << k4::to_string(c.update_recipe)) {
      std::optional<qwen3_model> m;
      std::vector<NamedTensor> base;
      model_config base_config;
      if (c.at_load) {
        qwen3_load_options o;
        o.quantize = quant::quantize_options{*c.at_load, 32};
        m.emplace(load(config, random_parameters(config, 8, dtype::bf16), o));
        base_config = m->config();
        for (const auto& p : m->parameters())
          base.push_back({p.name, *m->parameter(p.name)});
      } else {
        auto q = quantized(config, 8, c.checkpoint_recipe, 32);
        m.emplace(load(q.config, q.tensors));
        base = q.tensors;
        base_config = q.config;
      }
      BOOST_TEST((m->quantization()->recipe == c.update_recipe));
      const auto w = trainer_weight(32, 64, 21);
      // A float32 copy of the same values is the same update.
      std::vector<float> w32(static_cast<std::size_t>(w.numel()));
      for (std::size_t i = 0; i < w32.size(); ++i)
        w32[i] = k4::bf16_to_float(w.as<uint16_t>()[i]);
      for (const auto& sent : {w, HostTensor::from_vector(dtype::f32, {32, 64}, w32)}) {
        auto before = checksums(*m);
        auto st = m->assign(std::vector<NamedTensor>{{k_expert + ".weight", sent}});
        BOOST_REQUIRE_MESSAGE(st, why(st));
        quant::quantize_options qo;
        qo.recipe = c.update_recipe;
        qo.group_size = 32;
        auto want = quant::quantize_weight(k_expert + ".weight", w, qo);
        BOOST_REQUIRE(want);
        std::set<std::string> names;
        auto expected = base;
        for (const auto& t : *want) {
          BOOST_TEST(same_bytes(*m->parameter(t.name), t.tensor), t.name);
          if (!t.name.ends_with("weight_shape")) {
            names.insert(t.name);
            find(expected, t.name)->tensor = t.tensor;
          }
        }
        auto diff = changed(before, checksums(*m));
        // The second send (f32 of the same values) changes nothing.
        if (sent.type == dtype::bf16)
          BOOST_TEST((diff == names));
        else
          BOOST_TEST(diff.empty());
        BOOST_TEST((logits(*m, tokens) == logits(load(base_config, expected), tokens)));
      }
    }
  }
}

// Bad updates fail naming the tensor, and nothing of the update is applied.
BOOST_AUTO_TEST_CASE(bad_updates_change_nothing) {
  auto q = quantized(tiny_moe_config(), 9, k4::int4_recipe::asym, 32);
  auto m = load(q.config, q.tensors);
  const auto tokens = some_tokens(4, 512, 13);
  const auto before = checksums(m);
  const auto before_logits = logits(m, tokens);
  // A good tensor goes first in every batch: it must not be applied either.
  const NamedTensor good{"model.norm.weight", trainer_weight(1, 64, 3)};
  NamedTensor good_norm = good;
  good_norm.tensor.shape = {64};
  auto nan_weight = trainer_weight(32, 64, 4);
  {
    std::vector<uint16_t> bits(nan_weight.as<uint16_t>().begin(), nan_weight.as<uint16_t>().end());
    bits[3 * 64 + 17] = 0x7fc0; // NaN at [3, 17]
    nan_weight = HostTensor::from_vector(dtype::bf16, {32, 64}, bits);
  }
  auto inf_scale = *m.parameter(k_expert + ".weight_scale");
  {
    std::vector<uint16_t> bits(inf_scale.as<uint16_t>().begin(), inf_scale.as<uint16_t>().end());
    bits[5] = 0x7f80;
    inf_scale = HostTensor::from_vector(dtype::bf16, inf_scale.shape, bits);
  }
  struct bad {
    NamedTensor t;
    std::vector<std::string> parts;
  };
  const std::vector<bad> cases = {
    {{k_expert + ".weight", nan_weight}, {k_expert + ".weight", "NaN", "[3, 17]"}},
    {{k_expert + ".weight", trainer_weight(64, 32, 1)}, {k_expert + ".weight", "INT4", "[32, 64]", "[64, 32]"}},
    {{k_expert + ".weight_scale", inf_scale}, {k_expert + ".weight_scale", "Inf"}},
    {{k_expert + ".weight_shape", HostTensor::from_vector(dtype::i64, {2}, std::vector<int64_t>{64, 32})},
     {k_expert + ".weight_shape", "cannot change"}},
    {{k_expert + ".weight_packed", HostTensor::from_vector(dtype::i32, {32, 4}, std::vector<int32_t>(128))},
     {k_expert + ".weight_packed", "expected int32 [32, 8]"}},
  };
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.t.name) {
      auto v = m.validate(c.t);
      BOOST_REQUIRE(!v);
      auto st = m.assign(std::vector<NamedTensor>{good_norm, c.t});
      BOOST_REQUIRE(!st);
      for (const auto& p : c.parts)
        BOOST_TEST(st.error().find(p) != std::string::npos, "'" << p << "' not in: " << st.error());
      BOOST_TEST((checksums(m) == before));
    }
  }
  // Both forms of one module in one update.
  auto st = m.assign(std::vector<NamedTensor>{
    good_norm, {k_expert + ".weight_scale", *m.parameter(k_expert + ".weight_scale")},
    {k_expert + ".weight", trainer_weight(32, 64, 2)}});
  BOOST_REQUIRE(!st);
  expect_error_contains(st.error(), {"module '" + k_expert + "'", "both"});
  BOOST_TEST((checksums(m) == before));
  BOOST_TEST((logits(m, tokens) == before_logits));
}

BOOST_AUTO_TEST_SUITE_END()
