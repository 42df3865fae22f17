// Speculative decoding through the whole actor graph (draft runner proposes, target verifies):
// greedy output equal to target-only greedy from the model library run directly; sampled output
// distributed as target-only sampling, against distributions computed here from the target's
// logits (chi-square); acceptance reported per request and by the engine; a frozen draft after a
// target-only update.
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

// A model directory beside `dir` whose weights are `dir`'s moved by noise (a different but
// related model: a draft that agrees with the target often, not always).
fs::path perturbed_model(const fs::path& dir, const std::string& name, uint64_t seed, float scale) {
  return model_dir_with(dir, name, perturbed(dir, seed, scale));
}

std::vector<std::vector<int32_t>> random_prompts(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p(3 + rng() % 18);
    for (auto& t : p)
      t = static_cast<int32_t>(rng() % 500);
    out.push_back(std::move(p));
  }
  return out;
}

} // namespace

BOOST_AUTO_TEST_SUITE(speculative_sim_test)

BOOST_AUTO_TEST_CASE(greedy_with_a_draft_equals_target_only_greedy) {
  auto target = tiny_model("target", 21);
  auto prompts = random_prompts(8, 3);
  std::vector<std::vector<int32_t>> reference;
  for (auto& p : prompts)
    reference.push_back(reference_greedy(target, p, 24));
  auto related = perturbed_model(target, "related-draft", 5, 0.05f);
  auto unrelated = tiny_model("unrelated-draft", 22);
  for (const auto& draft : {target, related, unrelated}) {
    BOOST_TEST_CONTEXT("draft " << draft.filename()) {
      auto e = start(target, draft);
      std::vector<std::future<GenerateReqOutput>> running;
      for (auto& p : prompts)
        running.push_back(e->generate_async(greedy(p, 24)));
      int32_t verify = 0, accepted = 0, proposed = 0;
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        auto out = running[i].get();
        BOOST_REQUIRE_MESSAGE(out.success, out.message);
        BOOST_TEST(out.output_ids == reference[i]);
        BOOST_TEST(out.spec_verify_ct > 0);
        // A verification emits its accepted proposals plus one; the first token comes from
        // prefill, and plain decode steps (none proposed near the end) emit one each.
        BOOST_TEST(out.spec_accepted_tokens + out.spec_verify_ct <= 23);
        BOOST_TEST(out.spec_proposed_drafts >= out.spec_accepted_tokens);
        BOOST_TEST(out.spec_proposed_drafts <= 4 * out.spec_verify_ct);
        if (draft == target) {
          // Every proposal is the target's own argmax: 4 + 1 tokens per step from token 2 to
          // 21, then 2 + 1 (only 3 may still come).
          BOOST_TEST(out.spec_verify_ct == 5);
          BOOST_TEST(out.spec_accepted_tokens == 18);
          BOOST_TEST(out.spec_proposed_drafts == 18);
        }
        verify += out.spec_verify_ct;
        accepted += out.spec_accepted_tokens;
        proposed += out.spec_proposed_drafts;
      }
      auto info = e->get_server_info();
      BOOST_TEST(info.speculative_num_draft_tokens == 4);
      BOOST_TEST(info.spec_verify_steps == static_cast<uint64_t>(verify));
      BOOST_TEST(info.spec_accepted_tokens == static_cast<uint64_t>(accepted));
      BOOST_TEST(info.spec_proposed_drafts == static_cast<uint64_t>(proposed));
      BOOST_TEST(info.spec_accept_rate == double(accepted) / proposed, boost::test_tools::tolerance(1e-12));
      double length = double(accepted + verify) / verify;
      BOOST_TEST_MESSAGE("draft " << draft.filename() << ": " << length << " tokens per verification");
      BOOST_TEST(info.spec_accept_length == length, boost::test_tools::tolerance(1e-9));
    }
  }
}

BOOST_AUTO_TEST_CASE(sampling_with_a_draft_matches_the_target_distribution) {
  auto target = tiny_model("target", 31);
  auto draft = perturbed_model(target, "sampling-draft", 7, 0.05f);
  const std::vector<int32_t> prompt{5, 17, 42, 99};
  constexpr int k_top = 4;
  constexpr double temperature = 0.8;
  constexpr int n = 3000;

  // The exact distribution of the first three tokens under target-only top-4 sampling.
  const auto expected = first_three_tokens(target, prompt, k_top, temperature);

  auto sample_many = [&](Engine& e) {
    std::map<std::vector<int32_t>, int> counts;
    for (int base = 0; base < n; base += 200) {
      std::vector<std::future<GenerateReqOutput>> running;
      for (int i = base; i < std::min(n, base + 200); ++i) {
        GenerateReqInput r;
        r.input_ids = prompt;
        r.sampling_params.temperature = static_cast<float>(temperature);
        r.sampling_params.top_k = k_top;
        r.sampling_params.max_new_tokens = 3;
        r.sampling_params.ignore_eos = true;
        r.sampling_params.sampling_seed = 1000 + static_cast<uint64_t>(i);
        r.return_logprob = true;
        running.push_back(e.generate_async(r));
      }
      for (auto& f : running) {
        auto out = f.get();
        BOOST_REQUIRE_MESSAGE(out.success, out.message);
        BOOST_REQUIRE_EQUAL(out.output_ids.size(), 3u);
        ++counts[out.output_ids];
      }
    }
    return counts;
  };

  auto with_draft = start(target, draft);
  auto spec_counts = sample_many(*with_draft);
  auto info = with_draft->get_server_info();
  BOOST_TEST_MESSAGE("speculative: " << info.spec_verify_steps << " verifications, "
                                     << info.spec_accepted_tokens << " proposals accepted");
  // One verification per request (one proposal, then a correction or bonus token); both
  // acceptance and rejection happen often, so both branches are under test.
  BOOST_TEST(info.spec_verify_steps == static_cast<uint64_t>(n));
  BOOST_TEST(info.spec_accepted_tokens > n / 10);
  BOOST_TEST(info.spec_accepted_tokens < n * 9 / 10);
  auto [stat, df] = chi_square(expected, spec_counts, n);
  BOOST_TEST_MESSAGE("with draft: chi2 = " << stat << " on " << df << " df (0.1% point "
                                           << chi2_critical_p001(df) << ")");
  BOOST_TEST(stat < chi2_critical_p001(df));

  // The same test on target-only sampling, so the bound is known to hold where it must.
  auto alone = start(target);
  auto plain_counts = sample_many(*alone);
  auto [plain_stat, plain_df] = chi_square(expected, plain_counts, n);
  BOOST_TEST_MESSAGE("target only: chi2 = " << plain_stat << " on " << plain_df << " df");
  BOOST_TEST(plain_stat < chi2_critical_p001(plain_df));
}

BOOST_AUTO_TEST_CASE(logprobs_with_a_draft_are_the_targets) {
  auto target = tiny_model("target", 31);
  auto draft = perturbed_model(target, "logprob-draft", 8, 0.5f);
  auto e = start(target, draft);
  GenerateReqInput r;
  r.input_ids = {3, 1, 4, 1, 5};
  r.sampling_params.temperature = 0.7f;
  r.sampling_params.max_new_tokens = 12;
  r.sampling_params.ignore_eos = true;
  r.sampling_params.sampling_seed = 9;
  r.return_logprob = true;
  auto out = e->generate(r);
  BOOST_REQUIRE_MESSAGE(out.success, out.message);
  BOOST_REQUIRE_EQUAL(out.output_token_logprobs.size(), 12u);
  BOOST_TEST(out.spec_verify_ct > 0);
  // log_softmax(logits / T) of the target at each position, from the model run directly.
  auto m = load_model(target);
  auto seq = *r.input_ids;
  seq.insert(seq.end(), out.output_ids.begin(), out.output_ids.end());
  auto all = m->forward_all(seq);
  BOOST_REQUIRE(all.has_value());
  auto V = static_cast<std::size_t>(m->config().vocab_size);
  for (std::size_t i = 0; i < out.output_ids.size(); ++i) {
    auto row = all->data() + (r.input_ids->size() - 1 + i) * V;
    double mx = -1e30, z = 0;
    for (std::size_t v = 0; v < V; ++v)
      mx = std::max(mx, double(row[v]) / 0.7);
    for (std::size_t v = 0; v < V; ++v)
      z += std::exp(double(row[v]) / 0.7 - mx);
    double want = double(row[out.output_ids[i]]) / 0.7 - mx - std::log(z);
    BOOST_TEST(out.output_token_logprobs[i] == want, boost::test_tools::tolerance(1e-4));
  }
}

BOOST_AUTO_TEST_CASE(frozen_draft_keeps_accepting_after_a_target_only_update) {
  auto target = tiny_model("target", 41);
  auto e = start(target, target); // the draft starts equal to the target
  auto draft_before = engine_checksums(*e, runner_selector::draft);
  auto prompts = random_prompts(6, 9);
  auto run_all = [&](Engine& engine) {
    std::vector<std::vector<int32_t>> outs;
    for (auto& p : prompts) {
      auto out = engine.generate(greedy(p, 20));
      BOOST_REQUIRE_MESSAGE(out.success, out.message);
      outs.push_back(out.output_ids);
    }
    return outs;
  };
  run_all(*e);
  auto before = e->get_server_info();
  BOOST_TEST(before.spec_recent_accept_length > 4.0); // k = 4: nearly every proposal kept

  // An RL step on the target only: small changes, the draft frozen (miles #1926).
  auto step = perturbed(target, 77, 0.05f);
  BOOST_REQUIRE(e->begin_weight_update({runner_selector::target}).success);
  UpdateWeightsFromTensorReqInput update;
  update.named_tensors = step;
  update.selector = runner_selector::target;
  BOOST_REQUIRE(e->update_weights_from_tensor(update).success);
  BOOST_REQUIRE(e->end_weight_update({}).success);
  BOOST_TEST(engine_checksums(*e, runner_selector::draft) == draft_before);

  auto outs = run_all(*e);
  auto after = e->get_server_info();
  auto steps = after.spec_verify_steps - before.spec_verify_steps;
  auto accepted = after.spec_accepted_tokens - before.spec_accepted_tokens;
  double length = double(accepted + steps) / double(steps);
  BOOST_TEST_MESSAGE("tokens per verification: " << before.spec_recent_accept_length
                                                  << " before the update, " << length << " after");
  BOOST_TEST(length > 1.0);
  // Speculation on equals speculation off: a fresh engine on the new weights without a draft.
  auto fresh_dir = model_dir_with(target, "frozen-draft-fresh", step);
  auto fresh = start(fresh_dir);
  BOOST_TEST(run_all(*fresh) == outs);
}

BOOST_AUTO_TEST_CASE(speculation_respects_stops_and_max_new_tokens) {
  auto target = tiny_model("target", 21);
  auto e = start(target, target);
  auto prompt = std::vector<int32_t>{7, 7, 7};
  auto ref = reference_greedy(target, prompt, 30);
  // Stop at the 6th token: it is in the middle of an accepted run, and nothing after it shows.
  auto r = greedy(prompt, 30);
  r.sampling_params.stop_token_ids = {ref[5]};
  auto out = e->generate(r);
  BOOST_REQUIRE(out.success);
  auto first_stop = std::find(ref.begin(), ref.end(), ref[5]) - ref.begin();
  BOOST_TEST(out.output_ids == std::vector<int32_t>(ref.begin(), ref.begin() + first_stop + 1));
  BOOST_TEST(out.finish_reason->type == "stop");
  for (int n : {1, 2, 3, 5, 6, 7}) {
    auto o = e->generate(greedy(prompt, n));
    BOOST_TEST(o.output_ids == std::vector<int32_t>(ref.begin(), ref.begin() + n));
    BOOST_TEST(o.finish_reason->type == "length");
  }
  // Streaming: the chunks add up to the whole output, proposals arrive as several tokens.
  std::vector<int32_t> streamed;
  std::size_t chunks = 0;
  auto whole = e->generate(greedy(prompt, 30), [&](const GenerateReqOutput& c) {
    streamed.insert(streamed.end(), c.output_ids.begin(), c.output_ids.end());
    ++chunks;
  });
  BOOST_TEST(streamed == ref);
  BOOST_TEST(whole.output_ids == ref);
  BOOST_TEST(chunks < ref.size()); // several tokens per step
}

BOOST_AUTO_TEST_CASE(a_negative_number_of_draft_tokens_is_refused_at_start) {
  engine_config cfg;
  cfg.model_path = tiny_model("target", 21);
  cfg.draft_model_path = cfg.model_path;
  cfg.speculative_num_draft_tokens = -1;
  auto e = Engine::start(cfg);
  BOOST_REQUIRE(!e.has_value());
  BOOST_TEST(contains(e.error(), "speculative_num_draft_tokens must be 0 (off) or more, got -1"));
}

BOOST_AUTO_TEST_SUITE_END()
