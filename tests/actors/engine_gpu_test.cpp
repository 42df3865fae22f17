// The Engine with GPU runners (device "cuda"), end to end through the actor graph: greedy
// generation, a batch of concurrent requests, sampling with seeds, and the check of in-place
// updates: after a weight update with CUDA graphs on (captured before the update, replayed
// after it), greedy output equals a fresh engine loaded with the new weights, and the checksums
// are the trainer's. Last, the reproducibility properties (the checks of
// determinism_sim_test.cpp on the GPU runner) with --enable-deterministic-inference: see there.
#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <future>
#include <random>

#include "actors/engine.hpp"
#include "model/checkpoint.hpp"
#include "model/make_model.hpp"
#include "tests/support/engine_support.hpp"

using namespace rlserve;
using namespace rlserve::test;
namespace fs = std::filesystem;

namespace {

engine_config on_gpu() {
  engine_config c;
  c.device = "cuda";
  c.kv_cache_tokens = 8192;
  c.max_running_requests = 16;
  c.max_batch_tokens = 512;
  return c;
}

// ---- reproducible rollouts on the GPU runner (the determinism_* cases below) ----

// The models the properties are asked of: dense, MoE with BF16 experts, MoE with INT4-asym experts
// quantized at load (the W4A16 GEMM and fused-MoE kernels, as RL rollouts run them).
struct determinism_model {
  std::string name;
  fs::path dir;
  std::string quantize;
};

std::vector<determinism_model> determinism_models() {
  return {{"dense", medium_model("gpu-dense", "qwen3", 4), ""},
          {"moe bf16", medium_model("gpu-moe", "qwen3-moe", 21), ""},
          {"moe int4-asym", medium_model("gpu-moe", "qwen3-moe", 21), "int4-asym"}};
}

// Room for the probe and 31 others in one batch; no prefix cache, so every check compares one
// property (the cache's own check is samples_of_one_prompt_prefill_it_once_on_the_device); the
// batch-invariant forward (SGLang's --enable-deterministic-inference).
engine_config determinism_engine(const determinism_model& m) {
  auto c = on_gpu();
  c.max_running_requests = 32;
  c.disable_radix_cache = true;
  c.enable_deterministic_inference = true;
  c.quantize = m.quantize;
  return c;
}

// The requests of determinism_sim_test.cpp: seeded sampling with logprobs.
GenerateReqInput sampled(std::vector<int32_t> prompt, int32_t n, uint64_t seed, std::string rid) {
  GenerateReqInput r;
  r.rid = std::move(rid);
  r.input_ids = std::move(prompt);
  r.sampling_params.max_new_tokens = n;
  r.sampling_params.ignore_eos = true;
  r.sampling_params.temperature = 0.8f;
  r.sampling_params.top_p = 0.95f;
  r.sampling_params.sampling_seed = seed;
  r.return_logprob = true;
  return r;
}

GenerateReqInput determinism_probe() {
  std::vector<int32_t> prompt(90);
  for (std::size_t i = 0; i < prompt.size(); ++i)
    prompt[i] = static_cast<int32_t>((i * 37 + 11) % 500);
  return sampled(prompt, 24, 4242, "probe");
}

// 31 others of random prompt lengths (3..62) and output lengths (4..27), after the probe.
std::vector<GenerateReqInput> probe_among_others(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<GenerateReqInput> out{determinism_probe()};
  for (int i = 0; i < 31; ++i) {
    std::vector<int32_t> prompt(3 + rng() % 60);
    for (auto& t : prompt)
      t = static_cast<int32_t>(rng() % 500);
    out.push_back(sampled(std::move(prompt), static_cast<int32_t>(4 + rng() % 24), rng(),
                          "other-" + std::to_string(i)));
  }
  return out;
}

void same_bits(const GenerateReqOutput& a, const GenerateReqOutput& b) {
  BOOST_TEST(a.success);
  BOOST_TEST(b.success);
  BOOST_TEST(a.output_ids == b.output_ids);
  BOOST_TEST(a.output_token_logprobs == b.output_token_logprobs); // exact float equality
}

} // namespace

BOOST_AUTO_TEST_SUITE(engine_gpu_test)

BOOST_AUTO_TEST_CASE(greedy_after_an_in_place_update_with_graphs_equals_a_fresh_engine) {
  auto dir = medium_model("gpu-moe", "qwen3-moe", 21);
  auto e = start(dir, {}, on_gpu());
  BOOST_TEST(e->target_manifest().device.find("cuda") != std::string::npos, e->target_manifest().device);
  std::vector<int32_t> prompt{5, 17, 300, 42, 9, 1000, 7};
  // Several requests at once so decode runs batched (graph buckets), before the update.
  std::vector<std::future<GenerateReqOutput>> before;
  for (int i = 0; i < 3; ++i) {
    auto p = prompt;
    p.push_back(100 + i);
    before.push_back(e->generate_async(greedy(p, 24)));
  }
  std::vector<std::vector<int32_t>> before_ids;
  for (auto& f : before) {
    auto out = f.get();
    BOOST_REQUIRE_MESSAGE(out.success, out.message);
    BOOST_TEST(out.output_ids.size() == 24u);
    before_ids.push_back(out.output_ids);
  }
  // The same request alone gives the same tokens as inside the batch.
  auto p0 = prompt;
  p0.push_back(100);
  BOOST_TEST(e->generate(greedy(p0, 24)).output_ids == before_ids[0]);

  auto update = perturbed(dir, 9);
  BOOST_REQUIRE(e->begin_weight_update({}).success);
  UpdateWeightsFromTensorReqInput req;
  req.named_tensors = update;
  auto r = e->update_weights_from_tensor(req);
  BOOST_REQUIRE_MESSAGE(r.success, r.message);
  auto end = e->end_weight_update({});
  BOOST_REQUIRE_MESSAGE(end.success, end.message);
  BOOST_TEST(engine_checksums(*e) == checksums_of(update));

  std::vector<std::vector<int32_t>> after_ids;
  for (int i = 0; i < 3; ++i) {
    auto p = prompt;
    p.push_back(100 + i);
    auto out = e->generate(greedy(p, 24));
    BOOST_REQUIRE_MESSAGE(out.success, out.message);
    after_ids.push_back(out.output_ids);
  }
  BOOST_TEST(after_ids != before_ids);

  auto fresh = start(model_dir_with(dir, "gpu-moe-fresh", update), {}, on_gpu());
  for (int i = 0; i < 3; ++i) {
    auto p = prompt;
    p.push_back(100 + i);
    BOOST_TEST(fresh->generate(greedy(p, 24)).output_ids == after_ids[i], "request " << i);
  }
}

BOOST_AUTO_TEST_CASE(seeded_sampling_is_reproducible_and_a_dense_model_runs) {
  auto dir = medium_model("gpu-dense", "qwen3", 4);
  auto e = start(dir, {}, on_gpu());
  GenerateReqInput r;
  r.input_ids = std::vector<int32_t>{3, 1, 4, 1, 5, 9, 2, 6};
  r.sampling_params.temperature = 0.8f;
  r.sampling_params.top_p = 0.9f;
  r.sampling_params.top_k = 50;
  r.sampling_params.max_new_tokens = 20;
  r.sampling_params.ignore_eos = true;
  r.sampling_params.sampling_seed = 1234;
  r.return_logprob = true;
  auto a = e->generate(r);
  auto b = e->generate(r);
  BOOST_REQUIRE_MESSAGE(a.success, a.message);
  BOOST_TEST(a.output_ids == b.output_ids);
  BOOST_TEST(a.output_ids.size() == 20u);
  for (auto lp : a.output_token_logprobs)
    BOOST_TEST(lp <= 0.0f);
}

// The prefix cache on the device runner: 16 samples of one prompt prefill it once, and their
// tokens equal an engine without the cache (greedy tokens exactly; the reused prefix's KV was
// computed in a batch of another shape, so logprobs may differ in the last bits). After an
// update nothing cached before it is reused and greedy tokens are the new weights'.
BOOST_AUTO_TEST_CASE(samples_of_one_prompt_prefill_it_once_on_the_device) {
  auto dir = medium_model("gpu-moe", "qwen3-moe", 21);
  std::vector<int32_t> prompt(200);
  for (std::size_t i = 0; i < prompt.size(); ++i)
    prompt[i] = static_cast<int32_t>((i * 7919 + 13) % 1000);
  std::vector<GenerateReqInput> group;
  for (int s = 0; s < 16; ++s) {
    auto r = greedy(prompt, 16);
    r.rid = "s" + std::to_string(s);
    if (s % 2 == 1) {
      r.sampling_params.temperature = 0.8f;
      r.sampling_params.sampling_seed = 100 + static_cast<uint64_t>(s);
    }
    r.return_logprob = true;
    group.push_back(r);
  }
  auto run = [&](Engine& e) {
    std::vector<std::future<GenerateReqOutput>> fs;
    for (auto& r : group)
      fs.push_back(e.generate_async(r));
    std::vector<GenerateReqOutput> outs;
    for (auto& f : fs) {
      outs.push_back(f.get());
      BOOST_REQUIRE_MESSAGE(outs.back().success, outs.back().message);
    }
    return outs;
  };
  auto cached = start(dir, {}, on_gpu());
  auto with_cache = run(*cached);
  // The others reuse the 12 whole blocks each; the 13th (7 prompt positions) is copied when the
  // first sample has filled and cached it by their admission, else computed: each runs 1 to 8.
  const auto prefill = cached->get_server_info().prefill_tokens;
  BOOST_TEST(prefill >= 200u + 15u);
  BOOST_TEST(prefill <= 200u + 15u * 8u);
  auto off = on_gpu();
  off.disable_radix_cache = true;
  auto uncached = start(dir, {}, off);
  auto without = run(*uncached);
  BOOST_TEST(uncached->get_server_info().prefill_tokens == 16u * 200u);
  for (std::size_t s = 0; s < group.size(); s += 2)
    BOOST_TEST(with_cache[s].output_ids == without[s].output_ids, "sample " << s);

  auto update = perturbed(dir, 9, 0.3f);
  UpdateWeightsFromTensorReqInput u;
  u.named_tensors = update;
  BOOST_REQUIRE(cached->update_weights_from_tensor(u).success);
  auto after = cached->generate(group[0]);
  BOOST_TEST(after.cached_tokens == 0);
  auto fresh = start(model_dir_with(dir, "gpu-moe-prefix-fresh", update), {}, off);
  BOOST_TEST(after.output_ids == fresh->generate(group[0]).output_ids);
}

// What `rlserve generate|demo|serve --model DIR` do without --device: "auto" serves on the GPU
// when one is visible (the CPU-only CI machines cover the other branch through the CLI tests).
BOOST_AUTO_TEST_CASE(auto_device_picks_the_gpu_when_one_is_present) {
  auto dir = medium_model("gpu-moe", "qwen3-moe", 21);
  engine_config c = on_gpu();
  c.device = "auto";
  c.model_path = dir;
  auto e = Engine::start(c); // not test::start, which pins "auto" to the CPU
  BOOST_REQUIRE_MESSAGE(e.has_value(), (e ? std::string() : e.error()));
  BOOST_TEST((*e)->target_manifest().device.find("cuda") != std::string::npos, (*e)->target_manifest().device);
  auto out = (*e)->generate(greedy({5, 6, 7, 8}, 8));
  BOOST_REQUIRE_MESSAGE(out.success, out.message);
  BOOST_TEST(out.output_ids.size() == 8u);
  // get_server_info says what the runner states of itself: this device, CUDA IPC updates, NCCL
  // groups (this build has NCCL).
  auto info = (*e)->get_server_info();
  BOOST_TEST(info.device == (*e)->target_manifest().device);
  BOOST_TEST((info.weight_transports == std::vector<std::string>{"inline", "disk", "cuda_ipc", "nccl"}));
  BOOST_TEST((*e)->target_manifest().capabilities.device_checksums);
}

BOOST_AUTO_TEST_CASE(an_int4_engine_states_that_it_quantizes_updates_on_the_device) {
  auto dir = medium_model("gpu-moe", "qwen3-moe", 21);
  engine_config c = on_gpu();
  c.quantize = "int4-asym";
  auto e = start(dir, {}, c);
  auto info = e->get_server_info();
  BOOST_TEST(info.int4_modules > 0);
  BOOST_TEST(info.int4_update_recipe == "int4-asym g128");
  BOOST_TEST(info.int4_quantized_on == "device");
}

BOOST_AUTO_TEST_CASE(a_missing_device_or_a_bad_device_name_fails_start_clearly) {
  auto dir = medium_model("gpu-dense", "qwen3", 4);
  engine_config c = on_gpu();
  c.device = "cuda:99";
  c.model_path = dir;
  auto e = Engine::start(c);
  BOOST_TEST(!e.has_value());
  BOOST_TEST(contains(e.error(), "device 99"));
  c.device = "tpu";
  e = Engine::start(c);
  BOOST_TEST(!e.has_value());
  BOOST_TEST(contains(e.error(), "expected auto, cpu, cuda or cuda:N"));
}

// On the GPU runner, the three properties determinism_sim_test.cpp holds on the CPU:
// bit-identical tokens and logprobs (1) from two engine instances given the same seeded requests,
// (2) for a request alone and among 31 random others, (3) for a prompt prefilled in chunks of 16
// tokens and in one chunk.
//
// With the batch-invariant forward (gpu_options::batch_invariant: BF16 linears on
// kernels::gemm_bf16_invariant, INT4 GEMMs and the fused MoE with whole tiles at one block size;
// the device sampler reporting the host's logprob bits). They pass on an H200
// (docs/performance.md, 'Run to run, batch invariance, routing, speculation'). Each check
// reports per model and request and goes on after a mismatch.
BOOST_AUTO_TEST_CASE(determinism_two_engine_instances_give_the_same_bits) {
  for (const auto& m : determinism_models()) {
    BOOST_TEST_CONTEXT("model " << m.name) {
      const auto batch = probe_among_others(9);
      auto first = start(m.dir, {}, determinism_engine(m));
      auto a = run_together(*first, batch);
      first.reset(); // one engine on the device at a time
      auto second = start(m.dir, {}, determinism_engine(m));
      auto b = run_together(*second, batch);
      for (std::size_t i = 0; i < batch.size(); ++i)
        BOOST_TEST_CONTEXT("request " << i << " (" << batch[i].rid.value_or("") << ")") { same_bits(a[i], b[i]); }
    }
  }
}

BOOST_AUTO_TEST_CASE(determinism_a_request_alone_equals_it_among_31_others) {
  for (const auto& m : determinism_models()) {
    BOOST_TEST_CONTEXT("model " << m.name) {
      auto e = start(m.dir, {}, determinism_engine(m));
      auto alone = e->generate(determinism_probe());
      BOOST_REQUIRE_MESSAGE(alone.success, alone.message);
      // The probe first, so the others arrive with it and share its batches.
      auto together = run_together(*e, probe_among_others(9));
      same_bits(together[0], alone);
    }
  }
}

BOOST_AUTO_TEST_CASE(determinism_chunked_prefill_equals_one_chunk) {
  for (const auto& m : determinism_models()) {
    BOOST_TEST_CONTEXT("model " << m.name) {
      const auto probe = determinism_probe();
      auto whole = start(m.dir, {}, determinism_engine(m)); // 90 prompt tokens in one forward
      auto one_chunk = whole->generate(probe);
      whole.reset();
      auto c = determinism_engine(m);
      c.max_batch_tokens = 16; // the prompt in 6 chunks (16 x 5 + 10)
      c.max_running_requests = 16;
      auto chunked = start(m.dir, {}, c);
      same_bits(chunked->generate(probe), one_chunk);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
