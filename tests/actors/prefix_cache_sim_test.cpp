// The prefix cache in the whole actor graph (rlserve::Engine on the CPU runner, tiny seeded
// models). Prefill work is counted by the scheduler (get_server_info's prefill_tokens), reuse per
// request by meta_info.cached_tokens; outputs are held to the model library run directly and to
// the same requests on an engine with the cache off (--disable-radix-cache), bit for bit:
//   - the samples of one prompt prefill it once, whether they arrive together or one by one;
//   - the next turn of a conversation reuses the last one, its output included;
//   - a pool too small for the working set evicts and still serves every request exactly;
//   - after a weight update no block of the old weights is reused, in every pause mode, with
//     updates outside a session, and with a draft model (whose cached KV stays consistent);
//   - flush_cache empties the cache.
#include <boost/test/unit_test.hpp>

#include <future>
#include <random>

#include "model/checkpoint.hpp"
#include "tests/support/engine_support.hpp"
#include "tests/support/greedy_check.hpp"

using namespace rlserve;
using namespace rlserve::test;

namespace {

std::vector<int32_t> random_tokens(std::size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> out(n);
  for (auto& t : out)
    t = static_cast<int32_t>(rng() % 500);
  return out;
}

// Sample s of a GRPO group: seeded sampling (every fourth greedy), logprobs returned.
GenerateReqInput sample_of(const std::vector<int32_t>& prompt, int s, int32_t new_tokens) {
  GenerateReqInput r;
  r.rid = "sample-" + std::to_string(s);
  r.input_ids = prompt;
  r.sampling_params.max_new_tokens = new_tokens;
  r.sampling_params.ignore_eos = true;
  r.sampling_params.temperature = s % 4 == 0 ? 0.0f : 0.9f;
  r.sampling_params.sampling_seed = 1000 + static_cast<uint64_t>(s);
  r.return_logprob = true;
  return r;
}

engine_config no_cache() {
  engine_config cfg;
  cfg.disable_radix_cache = true;
  return cfg;
}

} // namespace

BOOST_AUTO_TEST_SUITE(prefix_cache_sim_test)

BOOST_AUTO_TEST_CASE(sixteen_samples_of_one_prompt_prefill_it_once_and_equal_the_uncached_run) {
  auto dir = tiny_model("target", 11);
  auto prompt = random_tokens(100, 1); // 6 whole blocks of 16 and 4 tokens
  std::vector<GenerateReqInput> group;
  for (int s = 0; s < 16; ++s)
    group.push_back(sample_of(prompt, s, 12));

  auto cached = start(dir);
  auto with_cache = run_together(*cached, group);
  auto info = cached->get_server_info();
  BOOST_TEST(info.prefix_cache);
  // One sample computes the prompt; every other reuses its 96 tokens and runs the last 4.
  BOOST_TEST(info.prefill_tokens == 100u + 15u * 4u);
  int computed = 0;
  for (const auto& out : with_cache) {
    BOOST_TEST((out.cached_tokens == 0 || out.cached_tokens == 96));
    computed += out.cached_tokens == 0 ? 1 : 0;
  }
  BOOST_TEST(computed == 1);
  BOOST_TEST(info.prefix_hit_tokens == 15u * 96u);
  BOOST_TEST(info.num_used_tokens == 0); // cached blocks nobody uses are free for the taking
  BOOST_TEST(info.prefix_cached_tokens > 0);

  auto uncached = start(dir, {}, no_cache());
  auto without = run_together(*uncached, group);
  auto plain = uncached->get_server_info();
  BOOST_TEST(!plain.prefix_cache);
  BOOST_TEST(plain.prefill_tokens == 1600u);
  BOOST_TEST(plain.prefix_cached_tokens == 0);
  auto reference = reference_greedy(dir, prompt, 12);
  for (std::size_t s = 0; s < group.size(); ++s) {
    BOOST_TEST_CONTEXT("sample " << s) {
      BOOST_TEST(without[s].cached_tokens == 0);
      BOOST_TEST(with_cache[s].output_ids == without[s].output_ids);
      BOOST_TEST(with_cache[s].output_token_logprobs == without[s].output_token_logprobs); // bits
      if (s % 4 == 0)
        BOOST_TEST(with_cache[s].output_ids == reference);
    }
  }

  // One by one, the same: the first caches, the others reuse.
  auto serial = start(dir);
  for (std::size_t s = 0; s < group.size(); ++s) {
    auto out = serial->generate(group[s]);
    BOOST_REQUIRE_MESSAGE(out.success, out.message);
    BOOST_TEST(out.cached_tokens == (s == 0 ? 0 : 96));
    BOOST_TEST(out.output_ids == without[s].output_ids);
  }
}

// Groups of several prompts at once with a small token budget: first samples are prefilled in
// chunks, interleaved with other groups; the other samples still wait for their prompt's last
// block and run one token each.
BOOST_AUTO_TEST_CASE(chunked_prefills_of_several_groups_still_prefill_each_prompt_once) {
  auto dir = tiny_model("target", 11);
  engine_config cfg;
  // 64 + 52: the second group's first sample is cut inside its prompt's last block, which the
  // others then wait for (to copy 15 of its tokens) rather than compute.
  cfg.max_batch_tokens = 116;
  auto e = start(dir, {}, cfg);
  std::vector<GenerateReqInput> all;
  for (int p = 0; p < 4; ++p) {
    auto prompt = random_tokens(64, 20 + static_cast<uint64_t>(p));
    for (int s = 0; s < 8; ++s) {
      auto r = sample_of(prompt, s, 6);
      r.rid = "p" + std::to_string(p) + "s" + std::to_string(s);
      all.push_back(r);
    }
  }
  auto outs = run_together(*e, all);
  BOOST_TEST(e->get_server_info().prefill_tokens == 4u * 64u + 4u * 7u); // 63 reused by the others
  for (const auto& out : outs)
    BOOST_TEST((out.cached_tokens == 0 || out.cached_tokens == 63));
}

BOOST_AUTO_TEST_CASE(the_next_turn_reuses_the_last_one_output_included) {
  auto dir = tiny_model("target", 11);
  auto e = start(dir);
  auto first = greedy(random_tokens(40, 2), 30);
  auto turn1 = e->generate(first);
  BOOST_REQUIRE(turn1.success);
  auto next = *first.input_ids;
  next.insert(next.end(), turn1.output_ids.begin(), turn1.output_ids.end());
  next.insert(next.end(), {7, 8, 9});
  auto before = e->get_server_info().prefill_tokens;
  auto turn2 = e->generate(greedy(next, 10));
  BOOST_REQUIRE(turn2.success);
  // Turn 1 ran 40 + 29 positions (its last token never ran): 4 whole blocks.
  BOOST_TEST(turn2.cached_tokens == 64);
  BOOST_TEST(e->get_server_info().prefill_tokens - before == next.size() - 64);
  BOOST_TEST(turn2.output_ids == reference_greedy(dir, next, 10));
}

BOOST_AUTO_TEST_CASE(a_tiny_pool_evicts_least_recently_used_prefixes_and_serves_everything) {
  auto dir = tiny_model("target", 11);
  engine_config cfg;
  cfg.kv_cache_tokens = 256; // 16 blocks; each request below holds 4 at most
  auto e = start(dir, {}, cfg);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 12; ++i)
    prompts.push_back(random_tokens(40, 100 + i));
  for (auto& p : prompts) { // one by one: each leaves 3 whole blocks behind
    auto out = e->generate(greedy(p, 20));
    BOOST_REQUIRE_MESSAGE(out.success, out.message);
    BOOST_TEST(out.cached_tokens == 0);
    BOOST_TEST(out.output_ids == reference_greedy(dir, p, 20));
  }
  auto info = e->get_server_info();
  BOOST_TEST(info.prefix_cached_tokens <= 256);
  BOOST_TEST(info.num_used_tokens == 0);
  // The newest prefixes stayed (2 whole blocks and 7 tokens copied from the third: all of the
  // prompt but its last token), the oldest were evicted.
  BOOST_TEST(e->generate(greedy(prompts[11], 20)).cached_tokens == 39);
  BOOST_TEST(e->generate(greedy(prompts[0], 20)).cached_tokens == 0);

  // Together they need twice the pool: requests wait, are preempted and resume; all exact.
  std::vector<GenerateReqInput> wave;
  for (int i = 0; i < 8; ++i) {
    auto r = greedy(prompts[static_cast<std::size_t>(i)], 20);
    r.rid = "wave-" + std::to_string(i);
    wave.push_back(r);
  }
  auto outs = run_together(*e, wave);
  for (std::size_t i = 0; i < outs.size(); ++i)
    BOOST_TEST(outs[i].output_ids == reference_greedy(dir, prompts[i], 20));
  BOOST_TEST(e->get_server_info().num_used_tokens == 0);
}

// Memory pressure with sharing: 40 requests over 5 shared prefixes of 16-60 tokens and varied
// tails, through a 16-block pool — evictions, preemptions and reuse in the same steps (blocks an
// admitted request reuses are pinned before anything is allocated). Every output is exact.
BOOST_AUTO_TEST_CASE(a_tiny_pool_under_shared_prefixes_stays_exact) {
  auto dir = tiny_model("target", 11);
  engine_config cfg;
  cfg.kv_cache_tokens = 256;
  cfg.max_batch_tokens = 96;
  auto e = start(dir, {}, cfg);
  std::mt19937_64 rng(17);
  std::vector<std::vector<int32_t>> stems;
  for (int i = 0; i < 5; ++i)
    stems.push_back(random_tokens(16 + 11 * static_cast<std::size_t>(i), 300 + static_cast<uint64_t>(i)));
  std::vector<GenerateReqInput> reqs;
  for (int i = 0; i < 40; ++i) {
    auto prompt = stems[rng() % stems.size()];
    auto tail = random_tokens(rng() % 20, 400 + static_cast<uint64_t>(i));
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    auto r = greedy(prompt, static_cast<int32_t>(4 + rng() % 40));
    r.rid = "t" + std::to_string(i);
    reqs.push_back(r);
  }
  auto outs = run_together(*e, reqs);
  int reused = 0;
  for (std::size_t i = 0; i < outs.size(); ++i) {
    BOOST_TEST(outs[i].output_ids ==
                 reference_greedy(dir, *reqs[i].input_ids, reqs[i].sampling_params.max_new_tokens),
               "request " << i);
    reused += outs[i].cached_tokens > 0 ? 1 : 0;
  }
  BOOST_TEST_MESSAGE(reused << " of 40 reused a cached prefix");
  BOOST_TEST(reused > 0);
  BOOST_TEST(e->get_server_info().num_used_tokens == 0);
}

// Around an update, in each way weights can change while generation goes on: no request after
// it reuses a block computed before it (its cached_tokens say so, and its tokens are the new
// weights' from scratch); a request that ran through it in place does not leave its mixed KV
// behind; the new weights' blocks are then cached again.
BOOST_AUTO_TEST_CASE(no_block_of_old_weights_is_reused_after_an_update_in_any_mode) {
  auto dir = tiny_model("target", 51);
  auto update = perturbed(dir, 52);
  auto new_model = load_model(dir, &update);
  auto prompt = random_tokens(48, 3);
  auto longer = prompt;
  auto tail = random_tokens(40, 4);
  longer.insert(longer.end(), tail.begin(), tail.end());
  enum class way { abort, retract, in_place, unpaused_tensor_update };
  for (auto how : {way::abort, way::retract, way::in_place, way::unpaused_tensor_update}) {
    BOOST_TEST_CONTEXT("way " << static_cast<int>(how)) {
      auto e = start(dir);
      BOOST_REQUIRE(e->generate(greedy(prompt, 8)).success);
      // All but the last token: 2 whole blocks, 15 tokens copied from the third.
      BOOST_TEST(e->generate(greedy(prompt, 8)).cached_tokens == 47);
      // A long request on the same prefix runs through the update.
      auto through = longer;
      auto running = e->generate_async(greedy(through, 400));
      while (e->get_server_info().running_requests == 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      UpdateWeightsFromTensorReqInput u;
      u.named_tensors = update;
      if (how == way::unpaused_tensor_update) {
        auto ok = e->update_weights_from_tensor(u); // commits at once, between two batches
        BOOST_REQUIRE_MESSAGE(ok.success, ok.message);
      } else {
        auto mode = how == way::abort ? pause_mode::abort
                    : how == way::retract ? pause_mode::retract
                                          : pause_mode::in_place;
        BOOST_REQUIRE(e->pause_generation({mode}).success);
        BOOST_REQUIRE(e->begin_weight_update({}).success);
        BOOST_REQUIRE(e->update_weights_from_tensor(u).success);
        BOOST_REQUIRE(e->end_weight_update({}).success);
        BOOST_REQUIRE(e->continue_generation({}).success);
      }
      auto after = e->generate(greedy(prompt, 8));
      BOOST_REQUIRE(after.success);
      BOOST_TEST(after.weight_version_start == "1");
      // Retracted, the long request ran its prefix again on the new weights: that is reused.
      BOOST_TEST(after.cached_tokens == (how == way::retract ? 47 : 0));
      GenerateReqInput in = greedy(prompt, 8);
      BOOST_TEST(follows_from_scratch(*new_model, in, after, 0, after.output_ids.size()));

      auto through_out = running.get();
      BOOST_TEST(through_out.finished);
      // What the long request computed before the update is gone; so is what it computed after
      // on top of it (in place, or through an unpaused update): only `after`'s 3 blocks of
      // `prompt` are found along `longer`. Retracted, it recomputed everything on the new
      // weights: all of `longer` but its last token.
      auto again = e->generate(greedy(longer, 4));
      BOOST_REQUIRE(again.success);
      BOOST_TEST(again.cached_tokens == (how == way::retract ? 87 : 48));
      GenerateReqInput again_in = greedy(longer, 4);
      BOOST_TEST(follows_from_scratch(*new_model, again_in, again, 0, again.output_ids.size()));
    }
  }
}

BOOST_AUTO_TEST_CASE(a_draft_reuses_its_cached_kv_and_drops_it_with_the_targets) {
  auto target = tiny_model("target", 41);
  auto e = start(target, target); // the draft equals the target: every proposal is kept
  auto prompt = random_tokens(100, 5);
  auto check_full_acceptance = [&](const std::vector<GenerateReqOutput>& outs) {
    for (const auto& out : outs) {
      // 24 tokens: the first from prefill, then 4 + 1 per verification up to token 21, then
      // 2 + 1 — unless the draft's cached KV were not the target's.
      BOOST_TEST(out.spec_verify_ct == 5);
      BOOST_TEST(out.spec_accepted_tokens == 18);
    }
  };
  std::vector<GenerateReqInput> group;
  for (int s = 0; s < 8; ++s) {
    auto r = greedy(prompt, 24);
    r.rid = "g" + std::to_string(s);
    group.push_back(r);
  }
  auto first = run_together(*e, group);
  check_full_acceptance(first);
  auto reference = reference_greedy(target, prompt, 24);
  for (const auto& out : first)
    BOOST_TEST(out.output_ids == reference);
  // Again: every sample reuses the prompt, the draft its own KV of it (marked as its pool
  // filled) — a draft running on blocks it never filled would propose garbage.
  auto again = run_together(*e, group);
  check_full_acceptance(again);
  for (const auto& out : again) {
    BOOST_TEST(out.cached_tokens == 99); // the last block is copied, the last token run
    BOOST_TEST(out.output_ids == reference);
  }

  // The target and the draft take the same new weights: both caches start over.
  auto step = perturbed(target, 77, 0.3f);
  BOOST_REQUIRE(e->begin_weight_update({runner_selector::all}).success);
  UpdateWeightsFromTensorReqInput update;
  update.named_tensors = step;
  update.selector = runner_selector::all;
  BOOST_REQUIRE(e->update_weights_from_tensor(update).success);
  BOOST_REQUIRE(e->end_weight_update({}).success);
  auto second = run_together(*e, group);
  check_full_acceptance(second);
  auto fresh = model_dir_with(target, "prefix-cache-draft-fresh", step);
  auto new_reference = reference_greedy(fresh, prompt, 24);
  int reused = 0;
  for (const auto& out : second) {
    BOOST_TEST(out.output_ids == new_reference);
    reused += out.cached_tokens > 0 ? 1 : 0;
  }
  BOOST_TEST(reused == 7); // one computed the new prompt's KV again, the others reused it

  // Seeded sampling with a different draft: the same tokens and logprobs as without the cache.
  auto related = perturbed(target, 78, 0.05f);
  auto draft = model_dir_with(target, "prefix-cache-draft-related", related);
  std::vector<GenerateReqInput> sampled;
  for (int s = 0; s < 8; ++s)
    sampled.push_back(sample_of(prompt, s, 20));
  auto with_cache = start(target, draft);
  auto draft_only = engine_config{};
  draft_only.disable_radix_cache = true;
  auto without_cache = start(target, draft, draft_only);
  auto a = run_together(*with_cache, sampled);
  auto b = run_together(*without_cache, sampled);
  for (std::size_t s = 0; s < a.size(); ++s) {
    BOOST_TEST(a[s].output_ids == b[s].output_ids, "sample " << s);
    BOOST_TEST(a[s].output_token_logprobs == b[s].output_token_logprobs, "sample " << s);
  }
}

// Routing replay with the cache: the samples of a MoE prompt reuse its KV and its blocks' kept
// router choices, and report the same routed_experts as an engine without the cache. A request
// that does not replay routing caches blocks without choices, which a replaying one skips.
BOOST_AUTO_TEST_CASE(routing_replay_reuses_blocks_that_kept_the_routers_choices) {
  auto dir = tiny_moe_model("prefix-cache-moe", 13);
  auto prompt = random_tokens(70, 8);
  std::vector<GenerateReqInput> group;
  for (int s = 0; s < 6; ++s) {
    auto r = sample_of(prompt, s, 10);
    r.return_routed_experts = true;
    r.routed_experts_start_len = s % 2 == 0 ? 0 : 30;
    group.push_back(r);
  }
  auto cached = start(dir);
  auto plain = cached->generate(sample_of(prompt, 99, 4)); // caches blocks without choices
  BOOST_REQUIRE(plain.success);
  auto with_cache = run_together(*cached, group);
  auto uncached = start(dir, {}, no_cache());
  auto without = run_together(*uncached, group);
  int reused = 0;
  for (std::size_t s = 0; s < group.size(); ++s) {
    BOOST_TEST_CONTEXT("sample " << s) {
      BOOST_REQUIRE(with_cache[s].routed_experts.has_value());
      BOOST_TEST(*with_cache[s].routed_experts == *without[s].routed_experts);
      BOOST_TEST(with_cache[s].routed_experts_start_len == without[s].routed_experts_start_len);
      BOOST_TEST(with_cache[s].output_ids == without[s].output_ids);
      reused += with_cache[s].cached_tokens > 0 ? 1 : 0;
    }
  }
  BOOST_TEST(reused == 5); // not from the plain request's blocks: from the first sample's
}

BOOST_AUTO_TEST_CASE(flush_cache_empties_it) {
  auto dir = tiny_model("target", 11);
  auto e = start(dir);
  auto prompt = random_tokens(64, 6);
  BOOST_REQUIRE(e->generate(greedy(prompt, 4)).success);
  BOOST_TEST(e->get_server_info().prefix_cached_tokens == 64);
  auto flushed = e->flush_cache({});
  BOOST_REQUIRE_MESSAGE(flushed.success, flushed.message);
  BOOST_TEST(e->get_server_info().prefix_cached_tokens == 0);
  auto out = e->generate(greedy(prompt, 4));
  BOOST_TEST(out.cached_tokens == 0);
  BOOST_TEST(out.output_ids == reference_greedy(dir, prompt, 4));
}

BOOST_AUTO_TEST_SUITE_END()
