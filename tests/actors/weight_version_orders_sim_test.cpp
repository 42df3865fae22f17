// The weight version a trainer names, in every order it can name it (docs/protocol.md, 'Weight
// versions'), around a pause of each mode (abort, retract, in_place) with requests running:
//   update    the update request's weight_version (slime's buckets), committed at continue
//   relabel   update_weight_version after the last bucket of an implicit session, before
//             continue_generation (slime with a label of its own)
//   session   update_weight_version after the last bucket of a begun session, before
//             end_weight_update (miles)
//   end       end_weight_update's weight_version
// In each: get_server_info reports the old version until the commit and exactly the named one
// from it (never counted up past the name), every output's versions are the old or the named
// one, and the tokens stamped with the named version are the new weights' greedy choices (so
// no output reports the name before its weights serve). Also: an update committed while
// generation runs and named afterwards, a version named twice, a session aborted after naming
// one, and a name sent with nothing staged.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "tests/support/engine_support.hpp"
#include "tests/support/greedy_check.hpp"

using namespace rlserve;
using namespace rlserve::test;

namespace {

enum class order { update, relabel, session, end };

const char* name(order o) {
  switch (o) {
    case order::update: return "update";
    case order::relabel: return "relabel";
    case order::session: return "session";
    case order::end: return "end";
  }
  return "?";
}

const char* name(pause_mode m) {
  return m == pause_mode::abort ? "abort" : m == pause_mode::retract ? "retract" : "in_place";
}

std::string serving(Engine& e) { return e.get_server_info().weight_version; }

// Requests that are still running when the test pauses: each has produced a token, and each
// asks for more than the engine makes before the pause (it waits for the first token of all).
struct running_requests {
  struct counts {
    std::mutex mtx;
    std::map<std::string, std::size_t> tokens;
  };
  std::vector<GenerateReqInput> inputs;
  std::vector<std::future<GenerateReqOutput>> futures;
  std::shared_ptr<counts> seen = std::make_shared<counts>(); // outlives an early test exit

  running_requests(Engine& e, int n) {
    for (int i = 0; i < n; ++i) {
      auto r = greedy({3, 1, 4, 1, 5, i}, 300);
      r.rid = "run-" + std::to_string(i);
      inputs.push_back(r);
      futures.push_back(e.generate_async(r, [seen = seen](const GenerateReqOutput& c) {
        std::lock_guard<std::mutex> guard{seen->mtx};
        seen->tokens[c.rid] += c.output_ids.size();
      }));
    }
    // Observable state, not a sleep: every request has begun decoding.
    for (bool all = false; !all; std::this_thread::yield()) {
      std::lock_guard<std::mutex> guard{seen->mtx};
      all = seen->tokens.size() == inputs.size();
      for (auto& [rid, count] : seen->tokens)
        all = all && count > 0;
    }
  }

  std::vector<GenerateReqOutput> results() {
    std::vector<GenerateReqOutput> out;
    for (auto& f : futures) {
      BOOST_REQUIRE(f.wait_for(std::chrono::seconds(120)) == std::future_status::ready);
      out.push_back(f.get());
    }
    return out;
  }
};

UpdateWeightsFromTensorReqInput bucket(const std::vector<NamedTensor>& tensors, std::size_t from,
                                       std::size_t to, std::optional<std::string> version) {
  UpdateWeightsFromTensorReqInput u;
  u.named_tensors.assign(tensors.begin() + static_cast<std::ptrdiff_t>(from),
                         tensors.begin() + static_cast<std::ptrdiff_t>(to));
  u.flush_cache = false;
  u.weight_version = std::move(version);
  return u;
}

// Every output's spans name only `allowed` versions, in that order; its tokens follow the
// weights their version names. Returns how many outputs have tokens of both weights.
int check_outputs(const std::vector<GenerateReqInput>& inputs, const std::vector<GenerateReqOutput>& outputs,
                   const std::vector<std::string>& allowed, const model::qwen3_model& old_model,
                   const model::qwen3_model& new_model, pause_mode mode) {
  int spanning = 0;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const auto& out = outputs[i];
    BOOST_TEST_CONTEXT("request " << out.rid) {
      std::size_t at = 0;
      for (const auto& span : out.weight_version_spans) {
        auto it = std::find(allowed.begin() + static_cast<std::ptrdiff_t>(at), allowed.end(),
                            span.weight_version);
        BOOST_TEST((it != allowed.end()), "version " << span.weight_version << " was never named");
        if (it != allowed.end())
          at = static_cast<std::size_t>(it - allowed.begin());
      }
      if (!out.output_ids.empty())
        BOOST_TEST(out.weight_version == out.weight_version_spans.back().weight_version);
      // The first version after the old one is where the new weights begin.
      std::size_t split = out.output_ids.size();
      for (std::size_t v = 1; v < allowed.size(); ++v)
        split = std::min(split, first_token_of_version(out, allowed[v]));
      check_tokens_follow_their_weights(old_model, new_model, mode, inputs[i], out, split);
      spanning += split > 0 && split < out.output_ids.size() ? 1 : 0;
    }
  }
  BOOST_TEST_MESSAGE(spanning << " of " << outputs.size() << " outputs span both weights");
  return spanning;
}

struct fixture {
  fs::path dir = tiny_model("target", 71);
  std::vector<NamedTensor> update = perturbed(dir, 72);
  std::unique_ptr<model::qwen3_model> old_model = load_model(dir);
  std::unique_ptr<model::qwen3_model> new_model = load_model(dir, &update);
};

// A request after the commit runs on the new weights under the named version alone.
void check_fresh_request(Engine& e, const fixture& f, const std::string& version) {
  auto in = greedy({2, 7, 1, 8}, 6);
  auto out = e.generate(in);
  BOOST_TEST(out.weight_version == version);
  BOOST_TEST(out.weight_version_start == version);
  BOOST_TEST(follows_from_scratch(*f.new_model, in, out, 0, out.output_ids.size()));
}

} // namespace

BOOST_AUTO_TEST_SUITE(weight_version_orders_sim_test)

BOOST_AUTO_TEST_CASE(every_order_of_naming_the_version_in_every_pause_mode) {
  fixture f;
  const auto half = f.update.size() / 2;
  for (auto mode : {pause_mode::abort, pause_mode::retract, pause_mode::in_place}) {
    for (auto o : {order::update, order::relabel, order::session, order::end}) {
      BOOST_TEST_CONTEXT(name(o) << ", paused " << name(mode)) {
        const std::string named = std::string("step-") + name(o) + "-" + name(mode);
        auto e = start(f.dir);
        running_requests running(*e, 4);
        BOOST_REQUIRE(e->pause_generation({mode}).success);
        BOOST_TEST(serving(*e) == "0");
        if (o == order::session || o == order::end)
          BOOST_REQUIRE(e->begin_weight_update({}).success);
        // Two buckets; the update order names the version on both, as slime does.
        auto version_on_buckets = o == order::update ? std::optional<std::string>(named) : std::nullopt;
        for (auto [from, to] : {std::pair{std::size_t{0}, half}, std::pair{half, f.update.size()}}) {
          auto staged = e->update_weights_from_tensor(bucket(f.update, from, to, version_on_buckets));
          BOOST_REQUIRE_MESSAGE(staged.success, staged.message);
          BOOST_TEST(serving(*e) == "0"); // staged, not serving: the name waits too
        }
        if (o == order::relabel || o == order::session) {
          UpdateWeightVersionReqInput v;
          v.new_version = named;
          auto relabelled = e->update_weight_version(v);
          BOOST_TEST(relabelled.success, relabelled.message);
          BOOST_TEST(relabelled.new_version == "0"); // the serving version, still the old one
          BOOST_TEST(contains(relabelled.message, "published when the staged update commits"),
                     relabelled.message);
          BOOST_TEST(serving(*e) == "0");
        }
        if (o == order::session || o == order::end) {
          EndWeightUpdateReqInput end;
          if (o == order::end)
            end.weight_version = named;
          auto ended = e->end_weight_update(end);
          BOOST_REQUIRE_MESSAGE(ended.success, ended.message);
          BOOST_TEST(ended.weight_version == named);
          BOOST_TEST(serving(*e) == named); // committed: the new weights serve, paused or not
        }
        auto resumed = e->continue_generation({});
        BOOST_REQUIRE_MESSAGE(resumed.success, resumed.message);
        BOOST_TEST(serving(*e) == named);
        check_outputs(running.inputs, running.results(), {"0", named}, *f.old_model, *f.new_model, mode);
        check_fresh_request(*e, f, named);
        BOOST_TEST(serving(*e) == named);
      }
    }
  }
}

// SGLang applies an update at once and keeps its version; rlserve commits it at once too (once
// the requests running when it came have finished: outside a pause an update takes the writer
// lock, as in SGLang) and, with no name on it, counts the version up ("0" -> "1",
// docs/protocol.md). A name sent after it applies at once (no session is open), and nothing
// counts it up again.
BOOST_AUTO_TEST_CASE(a_version_named_after_an_update_applied_while_generation_runs) {
  fixture f;
  auto e = start(f.dir);
  running_requests running(*e, 4);
  auto staged = e->update_weights_from_tensor(bucket(f.update, 0, f.update.size(), std::nullopt));
  BOOST_REQUIRE_MESSAGE(staged.success, staged.message);
  BOOST_TEST(serving(*e) == "1");
  check_fresh_request(*e, f, "1");
  UpdateWeightVersionReqInput v;
  v.new_version = "step-3";
  auto relabelled = e->update_weight_version(v);
  BOOST_TEST(relabelled.success, relabelled.message);
  BOOST_TEST(relabelled.new_version == "step-3");
  BOOST_TEST(serving(*e) == "step-3");
  check_outputs(running.inputs, running.results(), {"0"}, *f.old_model, *f.old_model,
                pause_mode::in_place);
  check_fresh_request(*e, f, "step-3");
}

BOOST_AUTO_TEST_CASE(a_version_named_twice_before_the_commit_is_the_last_one) {
  fixture f;
  for (auto mode : {pause_mode::abort, pause_mode::retract, pause_mode::in_place}) {
    BOOST_TEST_CONTEXT("paused " << name(mode)) {
      auto e = start(f.dir);
      running_requests running(*e, 2);
      BOOST_REQUIRE(e->pause_generation({mode}).success);
      BOOST_REQUIRE(e->begin_weight_update({}).success);
      auto staged = e->update_weights_from_tensor(bucket(f.update, 0, f.update.size(), "a"));
      BOOST_REQUIRE_MESSAGE(staged.success, staged.message);
      UpdateWeightVersionReqInput v;
      v.new_version = "b";
      BOOST_TEST(e->update_weight_version(v).success);
      v.new_version = "c";
      auto second = e->update_weight_version(v);
      BOOST_TEST(contains(second.message, "replacing b"), second.message);
      BOOST_TEST(serving(*e) == "0");
      auto ended = e->end_weight_update({});
      BOOST_REQUIRE_MESSAGE(ended.success, ended.message);
      BOOST_TEST(ended.weight_version == "c");
      BOOST_REQUIRE(e->continue_generation({}).success);
      check_outputs(running.inputs, running.results(), {"0", "c"}, *f.old_model, *f.new_model, mode);
      check_fresh_request(*e, f, "c");
    }
  }
}

BOOST_AUTO_TEST_CASE(a_session_aborted_after_naming_a_version_keeps_the_old_one) {
  fixture f;
  for (auto mode : {pause_mode::abort, pause_mode::retract, pause_mode::in_place}) {
    for (bool begun : {true, false}) {
      BOOST_TEST_CONTEXT("paused " << name(mode) << (begun ? ", begun session" : ", implicit session")) {
        auto e = start(f.dir);
        running_requests running(*e, 2);
        BOOST_REQUIRE(e->pause_generation({mode}).success);
        if (begun)
          BOOST_REQUIRE(e->begin_weight_update({}).success);
        auto staged = e->update_weights_from_tensor(bucket(f.update, 0, f.update.size(), std::nullopt));
        BOOST_REQUIRE_MESSAGE(staged.success, staged.message);
        UpdateWeightVersionReqInput v;
        v.new_version = "never";
        BOOST_TEST(e->update_weight_version(v).success);
        auto aborted = e->end_weight_update(EndWeightUpdateReqInput{std::nullopt, true});
        BOOST_REQUIRE_MESSAGE(aborted.success, aborted.message);
        BOOST_TEST(contains(aborted.message, "the version named for them (never)"), aborted.message);
        BOOST_TEST(aborted.weight_version == "0");
        BOOST_REQUIRE(e->continue_generation({}).success);
        BOOST_TEST(serving(*e) == "0");
        // Nothing was committed: every token is the old weights', under the old version.
        check_outputs(running.inputs, running.results(), {"0"}, *f.old_model, *f.old_model, mode);
        auto out = e->generate(greedy({2, 7}, 3));
        BOOST_TEST(out.weight_version == "0");
      }
    }
  }
}

// As SGLang: with no session open and nothing staged, a name relabels the serving weights at
// once, paused or not.
BOOST_AUTO_TEST_CASE(a_version_named_with_nothing_staged_applies_at_once) {
  fixture f;
  auto e = start(f.dir);
  UpdateWeightVersionReqInput v;
  v.new_version = "label-1";
  auto relabelled = e->update_weight_version(v);
  BOOST_TEST(relabelled.success, relabelled.message);
  BOOST_TEST(relabelled.new_version == "label-1");
  BOOST_TEST(serving(*e) == "label-1");
  BOOST_REQUIRE(e->pause_generation({pause_mode::retract}).success);
  v.new_version = "label-2";
  BOOST_TEST(e->update_weight_version(v).success);
  BOOST_TEST(serving(*e) == "label-2");
  BOOST_REQUIRE(e->continue_generation({}).success);
  auto in = greedy({2, 7, 1}, 4);
  auto out = e->generate(in);
  BOOST_TEST(out.weight_version == "label-2");
  BOOST_TEST(follows_from_scratch(*f.old_model, in, out, 0, out.output_ids.size()));
  // An empty name is refused and changes nothing.
  v.new_version = "";
  BOOST_TEST(!e->update_weight_version(v).success);
  BOOST_TEST(serving(*e) == "label-2");
}

BOOST_AUTO_TEST_SUITE_END()
