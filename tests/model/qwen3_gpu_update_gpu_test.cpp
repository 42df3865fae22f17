// Weight updates staged on the device (qwen3_gpu_model::stage / stage_host / commit_staged), held to
// the CPU model: the same tensors assigned to the host model (which quantizes BF16 weights of INT4
// modules with the CPU reference) must give, after the device commit, device digests equal to
// XXH3-64 of the host's canonical bytes for every parameter; nothing serves before the commit; a
// refused message (NaN, wrong shape or dtype, unknown name, over the staging budget) stages
// nothing; discard leaves the serving bytes as they were.
#include <boost/test/unit_test.hpp>

#include "tests/support/test_support.hpp"

#include <cuda_runtime.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "kernels/bf16.hpp"
#include "model/make_model.hpp"
#include "model/qwen3.hpp"
#include "model/qwen3_gpu.hpp"

using namespace rlserve;
using namespace rlserve::model;
using rlserve::test::why;

namespace {

std::shared_ptr<qwen3_model> int4_host(kernels::int4_recipe recipe, uint64_t seed) {
  auto c = preset_config("qwen3-moe", "medium");
  BOOST_REQUIRE_MESSAGE(c, why(c));
  c->mlp_only_layers = {1};
  qwen3_load_options lo;
  lo.quantize = quant::quantize_options{};
  lo.quantize->recipe = recipe;
  lo.quantize->group_size = 128;
  auto m = qwen3_model::load(*c, random_parameters(*c, seed, dtype::bf16), lo);
  BOOST_REQUIRE_MESSAGE(m, why(m));
  return std::make_shared<qwen3_model>(std::move(*m));
}

std::unique_ptr<qwen3_gpu_model> gpu_of(const qwen3_model& host, std::size_t budget = 0,
                                        std::size_t upload_chunk = std::size_t{1} << 30) {
  gpu_options o;
  o.upload_chunk_bytes = upload_chunk;
  o.kv_num_blocks = 64;
  o.max_batch_tokens = 256;
  o.max_sequences = 8;
  o.staging_budget_bytes = budget;
  auto g = qwen3_gpu_model::create(host, o);
  BOOST_REQUIRE_MESSAGE(g, why(g));
  return std::move(*g);
}

// The host's digest of every parameter the device serves.
std::map<std::string, uint64_t> host_digests(const qwen3_model& host) {
  std::map<std::string, uint64_t> out;
  for (const auto& p : host.parameters()) {
    if (p.name.ends_with(".weight_shape"))
      continue;
    auto t = host.parameter(p.name);
    BOOST_REQUIRE(t);
    out[p.name] = XXH3_64bits(t->data.get(), t->nbytes);
  }
  return out;
}

std::map<std::string, uint64_t> device_digests(qwen3_gpu_model& gpu, const qwen3_model& host) {
  std::vector<std::string> names;
  for (const auto& p : host.parameters())
    if (!p.name.ends_with(".weight_shape"))
      names.push_back(p.name);
  auto d = gpu.digests(names);
  BOOST_REQUIRE_MESSAGE(d, why(d));
  std::map<std::string, uint64_t> out;
  for (std::size_t i = 0; i < names.size(); ++i)
    out[names[i]] = (*d)[i];
  return out;
}

// Device copies of host tensors, freed with the object.
struct device_copies {
  std::vector<void*> buffers;
  std::vector<qwen3_gpu_model::update_source> sources;
  explicit device_copies(const std::vector<NamedTensor>& tensors, std::size_t misalign = 0) {
    for (const auto& t : tensors) {
      void* p = nullptr;
      BOOST_REQUIRE(cudaMalloc(&p, t.tensor.nbytes + 16) == cudaSuccess);
      auto* at = static_cast<std::byte*>(p) + misalign;
      BOOST_REQUIRE(cudaMemcpy(at, t.tensor.data.get(), t.tensor.nbytes, cudaMemcpyHostToDevice) == cudaSuccess);
      buffers.push_back(p);
      sources.push_back({t.name, at, t.tensor.type, t.tensor.shape});
    }
  }
  ~device_copies() {
    for (auto* p : buffers)
      cudaFree(p);
  }
};

// A mixed update: BF16 weights of INT4 experts (gate, up and down parts), an attention projection,
// a norm, the router, the embedding.
std::vector<NamedTensor> update_tensors(const model_config& c, uint64_t seed) {
  const std::vector<std::string> wanted = {
    "model.layers.0.mlp.experts.3.gate_proj.weight", "model.layers.0.mlp.experts.3.up_proj.weight",
    "model.layers.2.mlp.experts.5.down_proj.weight", "model.layers.2.mlp.experts.0.up_proj.weight",
    "model.layers.1.self_attn.k_proj.weight",        "model.layers.2.post_attention_layernorm.weight",
    "model.layers.0.mlp.gate.weight",                "model.embed_tokens.weight"};
  std::vector<NamedTensor> out;
  for (auto& t : random_parameters(c, seed, dtype::bf16))
    if (std::find(wanted.begin(), wanted.end(), t.name) != wanted.end())
      out.push_back(t);
  BOOST_REQUIRE_EQUAL(out.size(), wanted.size());
  return out;
}

} // namespace

BOOST_AUTO_TEST_SUITE(qwen3_gpu_update_gpu_test)

BOOST_AUTO_TEST_CASE(staged_updates_commit_the_bytes_the_cpu_model_computes) {
  for (auto recipe : {kernels::int4_recipe::asym, kernels::int4_recipe::sym_qat}) {
    for (bool through_host : {false, true}) {
      auto host = int4_host(recipe, 13);
      // Host uploads in 64 KiB chunks: many chunks, each uploaded while the one before stages.
      auto gpu = gpu_of(*host, 0, through_host ? std::size_t{64} << 10 : std::size_t{1} << 30);
      BOOST_TEST((device_digests(*gpu, *host) == host_digests(*host)), "the device serves the loaded model");
      auto before = host_digests(*host);
      auto update = update_tensors(host->config(), 77);
      if (through_host) {
        auto s = gpu->stage_host(update, false);
        BOOST_REQUIRE_MESSAGE(s, why(s));
      } else {
        device_copies dev(update, 2); // 2-byte aligned sources: a tensor inside a flattened bucket
        auto s = gpu->stage(dev.sources, false);
        BOOST_REQUIRE_MESSAGE(s, why(s));
      }
      BOOST_TEST(gpu->staged_bytes() > 0u);
      BOOST_TEST((device_digests(*gpu, *host) == before), "nothing serves before the commit");
      auto done = gpu->commit_staged();
      BOOST_REQUIRE_MESSAGE(done, why(done));
      BOOST_TEST(gpu->staged_bytes() == 0u);
      BOOST_REQUIRE_MESSAGE(host->assign(update), "host assign");
      auto want = host_digests(*host), got = device_digests(*gpu, *host);
      int differ = 0;
      for (auto& [name, d] : want)
        if (got[name] != d && ++differ <= 5)
          BOOST_TEST_MESSAGE("differs: " << name);
      BOOST_TEST(differ == 0, differ << " parameters differ from the CPU model (recipe "
                                     << kernels::to_string(recipe) << ", through_host " << through_host << ")");
      BOOST_TEST(want != before);
    }
  }
}

BOOST_AUTO_TEST_CASE(load_format_tensors_stage_as_they_are) {
  auto host = int4_host(kernels::int4_recipe::asym, 21);
  auto other = int4_host(kernels::int4_recipe::asym, 22); // same shapes, other values
  auto gpu = gpu_of(*host);
  std::vector<NamedTensor> update;
  for (const char* part : {"gate_proj", "down_proj"})
    for (const char* suffix : {".weight_packed", ".weight_scale", ".weight_zero_point", ".weight_shape"}) {
      std::string name = std::string("model.layers.2.mlp.experts.4.") + part + suffix;
      auto t = other->parameter(name);
      BOOST_REQUIRE_MESSAGE(t, why(t));
      update.push_back({name, *t});
    }
  device_copies dev(update);
  auto s = gpu->stage(dev.sources, false);
  BOOST_REQUIRE_MESSAGE(s, why(s));
  BOOST_REQUIRE(gpu->commit_staged());
  BOOST_REQUIRE(host->assign(update));
  BOOST_TEST((device_digests(*gpu, *host) == host_digests(*host)));
}

BOOST_AUTO_TEST_CASE(refused_messages_stage_nothing_and_discard_changes_nothing) {
  auto host = int4_host(kernels::int4_recipe::asym, 31);
  auto gpu = gpu_of(*host);
  const auto before = host_digests(*host);
  auto update = update_tensors(host->config(), 5);
  {
    device_copies first(std::vector<NamedTensor>{update[0]});
    BOOST_REQUIRE(gpu->stage(first.sources, false));
  }
  const auto staged = gpu->staged_bytes();
  auto refused = [&](std::vector<NamedTensor> tensors, const std::string& words) {
    device_copies dev(tensors);
    auto s = gpu->stage(dev.sources, false);
    BOOST_TEST(!s.has_value(), words);
    BOOST_TEST(why(s).find(words) != std::string::npos, why(s));
    BOOST_TEST(why(s).find("nothing from this message was staged") != std::string::npos, why(s));
    BOOST_TEST(gpu->staged_bytes() == staged);
  };
  // A NaN in the last tensor of a message: the whole message is refused.
  auto nan = update;
  {
    std::vector<std::byte> bytes(nan.back().tensor.bytes().begin(), nan.back().tensor.bytes().end());
    uint16_t bits = 0x7fc0; // bf16 NaN
    std::memcpy(bytes.data() + 2 * 17, &bits, 2);
    nan.back().tensor = HostTensor::adopt(dtype::bf16, nan.back().tensor.shape, std::move(bytes));
  }
  refused(nan, "element 17");
  auto inf = update;
  {
    std::vector<std::byte> bytes(inf[1].tensor.bytes().begin(), inf[1].tensor.bytes().end());
    uint16_t bits = 0xff80; // bf16 -Inf
    std::memcpy(bytes.data(), &bits, 2);
    inf[1].tensor = HostTensor::adopt(dtype::bf16, inf[1].tensor.shape, std::move(bytes));
  }
  refused(inf, inf[1].name);
  auto wrong_shape = update;
  wrong_shape[2].tensor.shape = {wrong_shape[2].tensor.shape[1], wrong_shape[2].tensor.shape[0]};
  refused(wrong_shape, "the INT4 module expects");
  auto unknown = update;
  unknown[3].name = "model.layers.9.mlp.experts.0.up_proj.weight";
  refused(unknown, "not a parameter");
  auto ints = update;
  ints[4].tensor.type = dtype::i16;
  refused(ints, "cannot be served as bfloat16");
  // The NaN is accepted when allowed (the engine's option), staged, then dropped by discard.
  {
    device_copies dev(nan);
    auto s = gpu->stage(dev.sources, true);
    BOOST_TEST(s.has_value(), why(s));
  }
  gpu->discard_staged();
  BOOST_TEST(gpu->staged_bytes() == 0u);
  BOOST_TEST((device_digests(*gpu, *host) == before));
  // Over the staging budget: refused, naming the budget.
  auto small = gpu_of(*host, 1 << 20);
  device_copies dev(update);
  auto s = small->stage(dev.sources, false);
  BOOST_TEST(why(s).find("staging budget") != std::string::npos, why(s));
  BOOST_TEST(small->staged_bytes() == 0u);
  BOOST_TEST((device_digests(*small, *host) == before));
}

BOOST_AUTO_TEST_CASE(a_refusal_in_a_later_upload_chunk_drops_the_session_staging) {
  auto host = int4_host(kernels::int4_recipe::asym, 51);
  auto gpu = gpu_of(*host, 0, std::size_t{64} << 10);
  const auto before = host_digests(*host);
  auto update = update_tensors(host->config(), 6);
  std::vector<std::byte> bytes(update.back().tensor.bytes().begin(), update.back().tensor.bytes().end());
  uint16_t nan = 0x7fc0;
  std::memcpy(bytes.data() + 2 * 5, &nan, 2);
  update.back().tensor = HostTensor::adopt(dtype::bf16, update.back().tensor.shape, std::move(bytes));
  auto s = gpu->stage_host(update, false);
  BOOST_TEST(!s.has_value());
  BOOST_TEST(why(s).find("were dropped") != std::string::npos, why(s));
  BOOST_TEST(gpu->staged_bytes() == 0u);
  BOOST_TEST((device_digests(*gpu, *host) == before));
}

BOOST_AUTO_TEST_CASE(download_returns_the_served_bytes) {
  auto host = int4_host(kernels::int4_recipe::asym, 41);
  auto gpu = gpu_of(*host);
  for (const char* name : {"model.norm.weight", "model.layers.0.mlp.experts.1.up_proj.weight_packed",
                           "model.layers.0.mlp.experts.1.up_proj.weight_zero_point",
                           "model.layers.2.mlp.experts.7.down_proj.weight_scale"}) {
    auto d = gpu->download(name);
    BOOST_REQUIRE_MESSAGE(d, why(d));
    auto h = host->parameter(name);
    BOOST_REQUIRE(h);
    BOOST_TEST(d->nbytes == h->nbytes, name);
    BOOST_TEST(std::memcmp(d->data.get(), h->data.get(), h->nbytes) == 0, name);
  }
  BOOST_TEST(!gpu->download("model.layers.0.mlp.experts.1.up_proj.weight").has_value());
}

BOOST_AUTO_TEST_SUITE_END()
