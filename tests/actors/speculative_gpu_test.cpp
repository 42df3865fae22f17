// Speculative decoding with GPU runners (target and draft on one device): the draft draws its
// proposals on the device and keeps the distributions there (model/gpu_draft_distributions.hpp),
// the target verifies on the device (kernels/spec_verify.hpp). What speculative_sim_test.cpp asks
// of the CPU runners, asked here of the device:
// - greedy output equal to target-only greedy on the device (BF16, dense and INT4-expert drafts),
//   with the batch-invariant forward
//   (--enable-deterministic-inference: a verification's k + 1 rows compute each row as a
//   one-token decode does), and with KV blocks of 16 tokens (the smallest the device's paged
//   attention takes) so that over 3 to 32 prompt tokens and 24 new ones rejected proposals are
//   cut across block boundaries;
// - sampled output distributed as target-only sampling (chi-square against the distribution
//   computed from the device's own log-softmax of the target, through top logprobs, and the same
//   test on target-only GPU sampling; both with the batch-invariant forward, so that the
//   reference, scored one context at a time, sees the logits the batched draws see);
// - weight updates by selector reach the device runners: a target-only update leaves the draft
//   frozen and speculation still equals a fresh target-only engine; a draft-only update changes
//   only the draft's checksums and never the output.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <future>
#include <map>
#include <numeric>
#include <random>

#include "tests/support/distribution_check.hpp"
#include "tests/support/engine_support.hpp"

using namespace rlserve;
using namespace rlserve::test;

namespace {

engine_config on_gpu(bool deterministic) {
  engine_config c;
  c.device = "cuda";
  c.kv_cache_tokens = 8192;
  c.kv_block_size = 16; // the device's smallest: proposals (k = 4) and rejections cross its edges
  c.max_running_requests = 32;
  c.max_batch_tokens = 512;
  c.enable_deterministic_inference = deterministic;
  return c;
}

std::vector<std::vector<int32_t>> random_prompts(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p(3 + rng() % 30);
    for (auto& t : p)
      t = static_cast<int32_t>(rng() % 4000);
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<GenerateReqOutput> greedy_all(Engine& e, const std::vector<std::vector<int32_t>>& prompts, int n) {
  std::vector<GenerateReqInput> reqs;
  for (const auto& p : prompts)
    reqs.push_back(greedy(p, n));
  return run_together(e, reqs);
}


// The digests of a checksum map in name order (a draft's names may carry a role prefix).
std::vector<std::string> digests(const std::map<std::string, std::string>& checksums) {
  std::vector<std::string> out;
  for (const auto& [name, digest] : checksums)
    out.push_back(digest);
  return out;
}

// The distribution of the first three tokens under top-k sampling at `temperature`, from the
// engine's top logprobs (the device's log-softmax of the target's logits, computed on the host;
// no sampler involved): the top-k set at each of the 1 + k + k^2 contexts is the device's. The CPU
// model cannot serve here: a MoE's device logits differ from its CPU logits by up to a few 1e-2
// (bf16 roundings), enough to swap the k-th and the next token of a context, and every draw of
// the swapped one would count as an outcome the reference never produces. `min_gap` receives
// the smallest logprob gap between a context's k-th and (k+1)-th token: the reference stands
// while that gap is well above what batching changes in the logits (last bits).
std::map<std::vector<int32_t>, double> first_three_tokens_on(Engine& e, const std::vector<int32_t>& prompt, int top_k,
                                                            double temperature, double& min_gap) {
  min_gap = INFINITY;
  return three_token_tree(prompt, [&](const std::vector<int32_t>& context) {
    auto req = greedy(context, 1);
    req.return_logprob = true;
    req.top_logprobs_num = top_k + 1;
    auto outs = run_together(e, {req});
    BOOST_REQUIRE(outs.size() == 1u);
    BOOST_REQUIRE(outs[0].output_top_logprobs.size() == 1u);
    const auto& top = outs[0].output_top_logprobs[0];
    BOOST_REQUIRE(top.size() == static_cast<std::size_t>(top_k + 1));
    min_gap = std::min(min_gap, double(top[top_k - 1].logprob) - double(top[top_k].logprob));
    double m = top[0].logprob / temperature, z = 0;
    for (int i = 0; i < top_k; ++i)
      z += std::exp(top[i].logprob / temperature - m);
    std::map<int32_t, double> p;
    for (int i = 0; i < top_k; ++i)
      p[top[i].token_id] = std::exp(top[i].logprob / temperature - m) / z;
    return p;
  });
}

} // namespace

BOOST_AUTO_TEST_SUITE(speculative_gpu_test)

BOOST_AUTO_TEST_CASE(greedy_with_a_device_draft_equals_target_only_greedy) {
  auto target = medium_model("gpu-moe", "qwen3-moe", 21);
  auto related = model_dir_with(target, "gpu-moe-related-draft", perturbed(target, 5, 0.05f));
  auto unrelated = medium_model("gpu-dense-draft", "qwen3", 8);
  // The target's own weights with INT4-asym experts (its checkpoint says so): a draft quantized
  // by its own config, served by the W4A16 kernels on the device.
  auto int4 = medium_model("gpu-moe-int4-draft", "qwen3-moe", 21, "int4-asym");
  auto prompts = random_prompts(12, 3);
  auto alone = start(target, {}, on_gpu(true));
  std::vector<std::vector<int32_t>> reference;
  for (auto& out : greedy_all(*alone, prompts, 24))
    reference.push_back(out.output_ids);
  alone.reset();
  for (const auto& draft : {target, related, unrelated, int4}) {
    BOOST_TEST_CONTEXT("draft " << draft.filename()) {
      auto e = start(target, draft, on_gpu(true));
      BOOST_TEST(e->draft_manifest()->device.find("cuda") != std::string::npos);
      if (draft == int4)
        BOOST_TEST(e->draft_manifest()->capabilities.int4_modules > 0);
      auto outs = greedy_all(*e, prompts, 24);
      int32_t verify = 0, accepted = 0;
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        BOOST_TEST(outs[i].output_ids == reference[i], "request " << i);
        BOOST_TEST(outs[i].spec_verify_ct > 0);
        if (draft == target) {
          // Every proposal is the target's own argmax (as the CPU runner's test counts).
          BOOST_TEST(outs[i].spec_verify_ct == 5);
          BOOST_TEST(outs[i].spec_accepted_tokens == 18);
        }
        verify += outs[i].spec_verify_ct;
        accepted += outs[i].spec_accepted_tokens;
      }
      BOOST_TEST_MESSAGE("draft " << draft.filename() << ": " << double(accepted + verify) / verify
                                  << " tokens per verification");
    }
  }
}

BOOST_AUTO_TEST_CASE(sampling_with_a_device_draft_matches_the_target_distribution) {
  auto target = medium_model("gpu-moe", "qwen3-moe", 21);
  auto draft = model_dir_with(target, "gpu-moe-sampling-draft", perturbed(target, 7, 0.05f));
  constexpr int k_top = 4;
  constexpr double temperature = 0.8;
  constexpr int n = 3000;

  // Target-only first: the reference distribution from its top logprobs, then its own samples.
  // Both engines run the batch-invariant forward: the reference scores each context alone, the
  // samples come from batches of 250 (and verification chunks), and in the default forward a row's
  // logits depend on its batch by a few 1e-2 nats in this MoE (GEMV against tiled experts, bf16
  // roundings), enough to move a token across the top-k edge of some context; every draw of it
  // would then count as an outcome the reference never produces, and the test would measure the
  // batching instead of the sampler. A prompt whose tree of contexts still has a logprob within
  // 1e-3 nats of a top-k edge is skipped (the prompts are tried in order).
  auto alone = start(target, {}, on_gpu(true));
  std::vector<int32_t> prompt;
  std::map<std::vector<int32_t>, double> expected;
  for (int32_t shift = 0; shift < 8 && prompt.empty(); ++shift) {
    const std::vector<int32_t> candidate{5 + shift, 17 + shift, 42 + shift, 99 + shift};
    double min_gap = 0;
    auto reference = first_three_tokens_on(*alone, candidate, k_top, temperature, min_gap);
    BOOST_TEST_MESSAGE("prompt shift " << shift << ": " << reference.size() << " outcomes; smallest gap below a top-"
                                       << k_top << " set " << min_gap << " nats");
    if (min_gap > 1e-3) {
      prompt = candidate;
      expected = std::move(reference);
    }
  }
  BOOST_REQUIRE_MESSAGE(!prompt.empty(), "each of 8 prompts sits within 1e-3 nats of a top-k edge");

  auto sample_many = [&](Engine& e) {
    std::map<std::vector<int32_t>, int> counts;
    for (int base = 0; base < n; base += 250) {
      std::vector<GenerateReqInput> reqs;
      for (int i = base; i < std::min(n, base + 250); ++i) {
        GenerateReqInput r;
        r.input_ids = prompt;
        r.sampling_params.temperature = static_cast<float>(temperature);
        r.sampling_params.top_k = k_top;
        r.sampling_params.max_new_tokens = 3;
        r.sampling_params.ignore_eos = true;
        r.sampling_params.sampling_seed = 1000 + static_cast<uint64_t>(i);
        reqs.push_back(r);
      }
      for (auto& out : run_together(e, reqs)) {
        BOOST_REQUIRE_EQUAL(out.output_ids.size(), 3u);
        ++counts[out.output_ids];
      }
    }
    return counts;
  };

  // Draws of an outcome the reference does not hold: a top-k set that differs from the reference's.
  auto outside = [&](const std::map<std::vector<int32_t>, int>& counts) {
    int draws = 0;
    for (const auto& [ids, c] : counts)
      draws += expected.count(ids) ? 0 : c;
    return draws;
  };
  auto plain_counts = sample_many(*alone);
  auto [plain_stat, plain_df] = chi_square(expected, plain_counts, n);
  BOOST_TEST_MESSAGE("target only: chi2 = " << plain_stat << " on " << plain_df << " df; "
                                            << outside(plain_counts) << " draws outside the reference");
  BOOST_TEST(plain_stat < chi2_critical_p001(plain_df));
  alone.reset();

  auto cfg = on_gpu(true);
  cfg.speculative_num_draft_tokens = 2;
  auto with_draft = start(target, draft, cfg);
  auto spec_counts = sample_many(*with_draft);
  auto info = with_draft->get_server_info();
  BOOST_TEST_MESSAGE("device speculation: " << info.spec_verify_steps << " verifications, "
                                            << info.spec_accepted_tokens << " proposals accepted");
  BOOST_TEST(info.spec_verify_steps >= static_cast<uint64_t>(n));
  BOOST_TEST(info.spec_accepted_tokens > n / 10); // both acceptance and rejection happen
  BOOST_TEST(info.spec_accepted_tokens < 2 * n * 9 / 10);
  auto [stat, df] = chi_square(expected, spec_counts, n);
  BOOST_TEST_MESSAGE("with draft: chi2 = " << stat << " on " << df << " df (0.1% point " << chi2_critical_p001(df)
                                          << "); " << outside(spec_counts) << " draws outside the reference");
  BOOST_TEST(stat < chi2_critical_p001(df));
}

BOOST_AUTO_TEST_CASE(updates_by_selector_reach_the_device_runners) {
  auto target = medium_model("gpu-moe", "qwen3-moe", 21);
  auto prompts = random_prompts(6, 9);
  auto e = start(target, target, on_gpu(true)); // the draft starts equal to the target
  const auto draft_before = engine_checksums(*e, runner_selector::draft);
  auto update = [&](runner_selector sel, const std::vector<NamedTensor>& tensors) {
    BOOST_REQUIRE(e->begin_weight_update({sel}).success);
    UpdateWeightsFromTensorReqInput req;
    req.named_tensors = tensors;
    req.selector = sel;
    auto r = e->update_weights_from_tensor(req);
    BOOST_REQUIRE_MESSAGE(r.success, r.message);
    auto end = e->end_weight_update({});
    BOOST_REQUIRE_MESSAGE(end.success, end.message);
  };
  auto outputs = [&](Engine& engine) {
    std::vector<std::vector<int32_t>> ids;
    for (auto& out : greedy_all(engine, prompts, 20))
      ids.push_back(out.output_ids);
    return ids;
  };

  // A target-only RL step: the draft stays frozen, speculation equals a fresh target-only engine.
  auto step = perturbed(target, 77, 0.05f);
  update(runner_selector::target, step);
  BOOST_TEST(engine_checksums(*e, runner_selector::draft) == draft_before);
  BOOST_TEST(engine_checksums(*e, runner_selector::target) == checksums_of(step));
  auto fresh_dir = model_dir_with(target, "gpu-moe-frozen-draft-fresh", step);
  const auto after_target = outputs(*e);
  {
    auto fresh = start(fresh_dir, {}, on_gpu(true));
    BOOST_TEST(outputs(*fresh) == after_target);
  }

  // A draft-only update: the draft's checksums move, the output does not (greedy speculation
  // emits the target's tokens whatever the draft proposes).
  auto draft_step = perturbed(target, 78, 0.5f);
  update(runner_selector::draft, draft_step);
  BOOST_TEST(digests(engine_checksums(*e, runner_selector::draft)) == digests(checksums_of(draft_step)));
  BOOST_TEST(engine_checksums(*e, runner_selector::target) == checksums_of(step));
  BOOST_TEST(outputs(*e) == after_target);

  // Both at once: the draft equals the target again, so every proposal is accepted.
  update(runner_selector::all, step);
  BOOST_TEST(digests(engine_checksums(*e, runner_selector::draft)) == digests(checksums_of(step)));
  const auto before = e->get_server_info();
  BOOST_TEST(outputs(*e) == after_target);
  const auto after = e->get_server_info();
  const auto steps = after.spec_verify_steps - before.spec_verify_steps;
  const auto accepted = after.spec_accepted_tokens - before.spec_accepted_tokens;
  BOOST_TEST(double(accepted + steps) / double(steps) > 4.0);
}

BOOST_AUTO_TEST_SUITE_END()
