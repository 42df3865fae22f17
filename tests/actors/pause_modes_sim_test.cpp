// Pause modes under load. For each mode, 200 greedy requests with random
// prompt and output lengths: 120 submitted at once, then a pause, a weight-update session during
// which 80 more arrive, and continue. Every request ends exactly once (streamed chunks add up to
// the result; one final chunk), nothing is lost or duplicated, and every token is checked against
// the model library run directly with the weights its version span names:
//   abort    requests running at the pause end "abort" with a partial output from the old weights;
//   retract  their KV is recomputed after the update: tokens after the commit follow the new
//            weights on the whole prefix;
//   in_place their KV is kept: tokens after the commit follow the new weights on top of the
//            old-weight KV of the positions computed before it.
// Requests arriving during the session run entirely on the new weights. A retract with no
// update resumes exactly: every output equals an uninterrupted run.
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <future>
#include <mutex>
#include <random>
#include <set>

#include "tests/support/engine_support.hpp"
#include "tests/support/greedy_check.hpp"

using namespace rlserve;
using namespace rlserve::test;

namespace {

struct request_log {
  std::mutex mtx;
  std::map<std::string, std::vector<int32_t>> streamed;
  std::map<std::string, int> final_chunks;
  std::atomic<int> finished{0};
};

struct scenario_result {
  std::vector<GenerateReqInput> inputs;
  std::vector<GenerateReqOutput> outputs;
};

std::vector<GenerateReqInput> random_requests(int n, int first_id, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<GenerateReqInput> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> prompt(2 + rng() % 39);
    for (auto& t : prompt)
      t = static_cast<int32_t>(rng() % 500);
    auto r = greedy(std::move(prompt), static_cast<int32_t>(1 + rng() % 40));
    r.rid = "r" + std::to_string(first_id + i);
    out.push_back(std::move(r));
  }
  return out;
}

// The scenario of the file comment; `update` empty: the session commits nothing (no update).
scenario_result run_scenario(const fs::path& model, pause_mode mode,
                             const std::vector<NamedTensor>& update) {
  engine_config cfg;
  cfg.max_running_requests = 48;  // some requests wait in the queue
  cfg.max_batch_tokens = 1 << 14; // every prompt is prefilled in one step
  auto e = start(model, {}, cfg);
  request_log log;
  auto submit = [&](const GenerateReqInput& r) {
    return e->generate_async(r, [&log](const GenerateReqOutput& c) {
      std::lock_guard<std::mutex> guard{log.mtx};
      auto& s = log.streamed[c.rid];
      s.insert(s.end(), c.output_ids.begin(), c.output_ids.end());
      if (c.finished) {
        ++log.final_chunks[c.rid];
        ++log.finished;
      }
    });
  };
  scenario_result result;
  result.inputs = random_requests(120, 0, 7);
  auto wave2 = random_requests(80, 120, 8);
  std::vector<std::future<GenerateReqOutput>> futures;
  for (auto& r : result.inputs)
    futures.push_back(submit(r));
  while (log.finished < 40)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto paused = e->pause_generation({mode});
  BOOST_REQUIRE_MESSAGE(paused.success, paused.message);
  BOOST_REQUIRE(e->begin_weight_update({}).success);
  for (auto& r : wave2) { // they wait at the front door until the session ends
    futures.push_back(submit(r));
    result.inputs.push_back(r);
  }
  if (!update.empty()) {
    UpdateWeightsFromTensorReqInput u;
    u.named_tensors = update;
    auto staged = e->update_weights_from_tensor(u);
    BOOST_REQUIRE_MESSAGE(staged.success, staged.message);
  }
  auto ended = e->end_weight_update({});
  BOOST_REQUIRE_MESSAGE(ended.success, ended.message);
  BOOST_REQUIRE(e->continue_generation({}).success);
  for (auto& f : futures) {
    BOOST_REQUIRE(f.wait_for(std::chrono::seconds(120)) == std::future_status::ready);
    result.outputs.push_back(f.get());
  }
  // None lost, none duplicated: one final chunk each, chunks add up to the result.
  std::set<std::string> rids;
  for (std::size_t i = 0; i < result.outputs.size(); ++i) {
    auto& out = result.outputs[i];
    BOOST_TEST(out.rid == *result.inputs[i].rid);
    BOOST_TEST(rids.insert(out.rid).second);
    BOOST_TEST(log.final_chunks[out.rid] == 1);
    BOOST_TEST(log.streamed[out.rid] == out.output_ids);
    BOOST_TEST(out.finished);
  }
  auto info = e->get_server_info();
  BOOST_TEST(info.running_requests == 0);
  BOOST_TEST(info.waiting_requests == 0);
  return result;
}

} // namespace

BOOST_AUTO_TEST_SUITE(pause_modes_sim_test)

BOOST_AUTO_TEST_CASE(two_hundred_requests_around_an_update_in_every_pause_mode) {
  auto dir = tiny_model("target", 51);
  auto update = perturbed(dir, 52);
  auto old_model = load_model(dir);
  auto new_model = load_model(dir, &update);
  for (auto mode : {pause_mode::abort, pause_mode::retract, pause_mode::in_place}) {
    BOOST_TEST_CONTEXT("mode " << static_cast<int>(mode)) {
      auto run = run_scenario(dir, mode, update);
      int aborted = 0, spanning = 0, old_only = 0, new_only = 0;
      for (std::size_t i = 0; i < run.outputs.size(); ++i) {
        const auto& in = run.inputs[i];
        const auto& out = run.outputs[i];
        BOOST_TEST_CONTEXT("request " << out.rid) {
          auto n = out.output_ids.size();
          bool is_abort = out.finish_reason && out.finish_reason->type == "abort";
          if (is_abort) {
            ++aborted;
            BOOST_TEST((mode == pause_mode::abort));
            BOOST_TEST(i < 120u); // only requests submitted before the pause
            BOOST_TEST(n < static_cast<std::size_t>(in.sampling_params.max_new_tokens));
          } else {
            BOOST_TEST(out.success);
            BOOST_TEST(n == static_cast<std::size_t>(in.sampling_params.max_new_tokens));
          }
          const std::size_t split = first_token_of_version(out, "1"); // where the new weights begin
          if (n > 0) {
            BOOST_TEST(out.weight_version_start == (split == 0 ? "1" : "0"));
            BOOST_TEST(out.weight_version == (split < n ? "1" : "0"));
          }
          if (i >= 120u)
            BOOST_TEST(split == 0u); // arrived during the session: new weights only
          if (n == 0)
            ; // aborted before its first token
          else if (split == 0)
            ++new_only;
          else if (split == n)
            ++old_only;
          else
            ++spanning;
          if (mode == pause_mode::abort)
            BOOST_TEST((split == 0 || split == n)); // nothing survives the pause to span two
          check_tokens_follow_their_weights(*old_model, *new_model, mode, in, out, split);
        }
      }
      BOOST_TEST_MESSAGE("mode " << static_cast<int>(mode) << ": " << old_only << " old weights only, "
                                 << new_only << " new only, " << spanning << " spanning both, "
                                 << aborted << " aborted");
      BOOST_TEST(old_only > 0);
      BOOST_TEST(new_only >= 80);
      if (mode == pause_mode::abort)
        BOOST_TEST(aborted > 0);
      else
        BOOST_TEST(spanning > 0);
    }
  }
}

BOOST_AUTO_TEST_CASE(retract_without_an_update_resumes_every_request_exactly) {
  auto dir = tiny_model("target", 51);
  auto m = load_model(dir);
  auto run = run_scenario(dir, pause_mode::retract, {});
  for (std::size_t i = 0; i < run.outputs.size(); ++i) {
    const auto& out = run.outputs[i];
    BOOST_TEST_CONTEXT("request " << out.rid) {
      BOOST_TEST(out.success);
      BOOST_TEST(out.weight_version == "0");
      BOOST_TEST(out.output_ids.size() ==
                 static_cast<std::size_t>(run.inputs[i].sampling_params.max_new_tokens));
      BOOST_TEST(follows_from_scratch(*m, run.inputs[i], out, 0, out.output_ids.size()));
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
