// Helpers shared by the engine-level simulation tests (tests/actors/*_sim_test.cpp): tiny seeded
// models on disk, engines over them, perturbed weights as a "trainer" would send, checksums
// computed here with XXH3, and greedy decoding with the model library run directly.
#pragma once

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <chrono>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>
#include <xxhash.h>

#include "actors/engine.hpp"
#include "kernels/bf16.hpp"
#include "model/checkpoint.hpp"
#include "model/config.hpp"
#include "model/make_model.hpp"
#include "model/qwen3.hpp"
#include "tests/support/distribution_check.hpp"

namespace rlserve::test {

namespace fs = std::filesystem;

inline fs::path scratch_dir(const std::string& name) {
  auto dir = fs::temp_directory_path() / ("rlserve-engine-sim-" + std::to_string(::getpid())) / name;
  fs::create_directories(dir.parent_path());
  return dir;
}

inline fs::path tiny_model(const std::string& name, uint64_t seed) {
  auto dir = scratch_dir(name);
  if (!fs::exists(dir / "config.json")) {
    model::make_model_options o;
    o.out = dir;
    o.seed = seed;
    auto ok = model::make_model(o);
    BOOST_REQUIRE_MESSAGE(ok.has_value(), (ok ? std::string() : ok.error()));
  }
  return dir;
}

// make-model's "medium" preset (the smallest the GPU kernels run), made once per name; with
// `quant` an INT4 checkpoint (make_model_options::quant).
inline fs::path medium_model(const std::string& name, const std::string& arch, uint64_t seed,
                             const std::string& quant = "") {
  auto dir = scratch_dir(name);
  if (!fs::exists(dir / "config.json")) {
    model::make_model_options o;
    o.out = dir;
    o.arch = arch;
    o.preset = "medium";
    o.seed = seed;
    o.quant = quant;
    auto ok = model::make_model(o);
    BOOST_REQUIRE_MESSAGE(ok.has_value(), (ok ? std::string() : ok.error()));
  }
  return dir;
}

inline std::unique_ptr<Engine> start(const fs::path& model, const fs::path& draft = {},
                                     engine_config cfg = {}) {
  cfg.model_path = model;
  cfg.draft_model_path = draft;
  if (cfg.device == "auto")
    cfg.device = "cpu"; // the simulation tests hold the CPU runner to the CPU model, on any machine
  auto e = Engine::start(cfg);
  BOOST_REQUIRE_MESSAGE(e.has_value(), (e ? std::string() : e.error()));
  return std::move(*e);
}

inline GenerateReqInput greedy(std::vector<int32_t> ids, int32_t n) {
  GenerateReqInput r;
  r.input_ids = std::move(ids);
  r.sampling_params.temperature = 0.0f;
  r.sampling_params.max_new_tokens = n;
  r.sampling_params.ignore_eos = true;
  return r;
}

inline std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Every parameter of `dir`'s checkpoint, each element moved by noise of `scale` x its RMS.
inline std::vector<NamedTensor> perturbed(const fs::path& dir, uint64_t seed, float scale = 0.5f) {
  auto ckpt = model::checkpoint::open(dir);
  BOOST_REQUIRE(ckpt.has_value());
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> noise;
  std::vector<NamedTensor> out;
  for (const auto& name : ckpt->names()) {
    auto t = ckpt->tensor(name);
    BOOST_REQUIRE(t.has_value());
    BOOST_REQUIRE(t->type == dtype::bf16);
    auto src = t->as<uint16_t>();
    double ss = 0;
    for (auto b : src)
      ss += double(kernels::bf16_to_float(b)) * kernels::bf16_to_float(b);
    auto s = scale * static_cast<float>(std::sqrt(ss / src.size()));
    std::vector<uint16_t> dst(src.size());
    for (std::size_t i = 0; i < src.size(); ++i)
      dst[i] = kernels::float_to_bf16(kernels::bf16_to_float(src[i]) + s * noise(rng));
    out.push_back({name, HostTensor::from_vector(dtype::bf16, t->shape, dst)});
  }
  return out;
}

inline std::map<std::string, std::string> checksums_of(const std::vector<NamedTensor>& ts) {
  std::map<std::string, std::string> out;
  for (auto& t : ts)
    out[t.name] = hex16(XXH3_64bits(t.tensor.data.get(), t.tensor.nbytes));
  return out;
}

inline std::map<std::string, std::string> engine_checksums(Engine& e, runner_selector sel = runner_selector::all) {
  CheckWeightsReqInput req;
  req.selector = sel;
  auto out = e.check_weights(req);
  BOOST_REQUIRE_MESSAGE(out.success, out.message);
  BOOST_REQUIRE_EQUAL(out.payload.size(), 1u);
  return out.payload[0].checksums;
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  bool ok = haystack.find(needle) != std::string::npos;
  if (!ok)
    BOOST_TEST_MESSAGE("\"" << haystack << "\" lacks \"" << needle << "\"");
  return ok;
}

// The model of `dir` loaded by the model library directly (the tests' reference), with its
// checkpoint's weights or, when given, `weights` instead.
inline std::unique_ptr<model::qwen3_model> load_model(const fs::path& dir,
                                                      const std::vector<NamedTensor>* weights = nullptr) {
  auto cfg = model::load_model_config(dir);
  BOOST_REQUIRE(cfg.has_value());
  if (weights) {
    auto m = model::qwen3_model::load(*cfg, *weights);
    BOOST_REQUIRE(m.has_value());
    return std::make_unique<model::qwen3_model>(std::move(*m));
  }
  auto ckpt = model::checkpoint::open(dir);
  BOOST_REQUIRE(ckpt.has_value());
  auto m = model::qwen3_model::load(*cfg, *ckpt);
  BOOST_REQUIRE(m.has_value());
  return std::make_unique<model::qwen3_model>(std::move(*m));
}

// Greedy decoding with the model library directly: the reference for the pipeline.
// A tiny Qwen3-MoE (make-model's tiny preset, every layer sparse), made once per name.
inline fs::path tiny_moe_model(const std::string& name, uint64_t seed) {
  auto dir = scratch_dir(name);
  if (!fs::exists(dir / "config.json")) {
    model::make_model_options o;
    o.arch = "qwen3-moe";
    o.out = dir;
    o.seed = seed;
    auto ok = model::make_model(o);
    BOOST_REQUIRE_MESSAGE(ok.has_value(), (ok ? std::string() : ok.error()));
  }
  return dir;
}

// A model directory `name` holding `tensors` with `base`'s config and tokenizer: an update
// written to disk, what a fresh engine on the new weights loads.
inline fs::path model_dir_with(const fs::path& base, const std::string& name,
                               const std::vector<NamedTensor>& tensors) {
  auto dir = scratch_dir(name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(base / "config.json", dir / "config.json");
  fs::copy_file(base / "tokenizer.json", dir / "tokenizer.json");
  BOOST_REQUIRE(model::write_checkpoint(dir, tensors).has_value());
  return dir;
}

// Sends every request at once and waits for all (a hang guard, not a timing assertion); each
// must succeed.
inline std::vector<GenerateReqOutput> run_together(Engine& e, const std::vector<GenerateReqInput>& reqs) {
  std::vector<std::future<GenerateReqOutput>> running;
  for (const auto& r : reqs)
    running.push_back(e.generate_async(r));
  std::vector<GenerateReqOutput> outs;
  for (auto& f : running) {
    BOOST_REQUIRE(f.wait_for(std::chrono::seconds(120)) == std::future_status::ready);
    outs.push_back(f.get());
    BOOST_REQUIRE_MESSAGE(outs.back().success, outs.back().message);
  }
  return outs;
}

inline std::vector<int32_t> reference_greedy(const fs::path& dir, std::vector<int32_t> prompt, int n) {
  auto m = load_model(dir);
  auto cache = m->make_cache();
  std::vector<float> logits;
  std::vector<int32_t> out;
  std::vector<int32_t> step = std::move(prompt);
  for (int i = 0; i < n; ++i) {
    BOOST_REQUIRE(m->forward(cache, step, logits).has_value());
    auto best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(best);
    step = {best};
  }
  return out;
}


// The distribution of the first three tokens after `prompt`, from `next`, which gives the
// distribution of the token after a sequence (std::map<int32_t, double>): the product over the
// tree of three levels.
template <class Next>
std::map<std::vector<int32_t>, double> three_token_tree(const std::vector<int32_t>& prompt, Next&& next) {
  std::map<std::vector<int32_t>, double> expected;
  for (auto [t1, p1] : next(prompt)) {
    auto s1 = prompt;
    s1.push_back(t1);
    for (auto [t2, p2] : next(s1)) {
      auto s2 = s1;
      s2.push_back(t2);
      for (auto [t3, p3] : next(s2))
        expected[{t1, t2, t3}] = p1 * p2 * p3;
    }
  }
  return expected;
}

// The exact distribution of the first three tokens after `prompt` under target-only top-k
// sampling at `temperature`, from the model library's logits (distribution_check.hpp's
// top_k_distribution over each prefix).
inline std::map<std::vector<int32_t>, double> first_three_tokens(const fs::path& dir, const std::vector<int32_t>& prompt,
                                                                 int top_k, double temperature) {
  auto m = load_model(dir);
  return three_token_tree(prompt, [&](const std::vector<int32_t>& seq) {
    auto all = m->forward_all(seq);
    BOOST_REQUIRE(all.has_value());
    auto V = static_cast<std::size_t>(m->config().vocab_size);
    std::vector<float> last(all->end() - static_cast<std::ptrdiff_t>(V), all->end());
    return top_k_distribution(last, top_k, temperature);
  });
}

} // namespace rlserve::test
