// Actor-level simulation: the whole graph (tokenizer, scheduler, weight_updater, runners) in one
// process on tiny seeded models, driven through rlserve::Engine. References are independent of
// the actor pipeline: the model library run directly (greedy decoding), and XXH3-64 computed
// here over the bytes a "trainer" sends.
#include <boost/test/unit_test.hpp>

#include <cmath>

#include <chrono>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <xxhash.h>

#include "actors/engine.hpp"
#include "kernels/bf16.hpp"
#include "model/bpe_tokenizer.hpp"
#include "model/checkpoint.hpp"
#include "model/config.hpp"
#include "model/make_model.hpp"
#include "model/qwen3.hpp"
#include "tests/support/engine_support.hpp"
#include "tests/support/fused_experts.hpp"

using namespace rlserve;
namespace fs = std::filesystem;

using namespace rlserve::test;

namespace {

// 20 sampled tokens after {1, 2, 3}, seeded, with logprobs.
GenerateReqInput seeded_twenty_tokens(uint64_t seed) {
  GenerateReqInput r;
  r.input_ids = std::vector<int32_t>{1, 2, 3};
  r.sampling_params.max_new_tokens = 20;
  r.sampling_params.ignore_eos = true;
  r.sampling_params.sampling_seed = seed;
  r.return_logprob = true;
  return r;
}

// What a stream's chunks carry, joined in order, and each chunk's token count.
struct joined_chunks {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  std::string text;
  std::vector<std::size_t> sizes;
};
joined_chunks join(const std::vector<GenerateReqOutput>& chunks) {
  joined_chunks j;
  for (const auto& c : chunks) {
    j.sizes.push_back(c.output_ids.size());
    j.ids.insert(j.ids.end(), c.output_ids.begin(), c.output_ids.end());
    j.logprobs.insert(j.logprobs.end(), c.output_token_logprobs.begin(), c.output_token_logprobs.end());
    j.text += c.text;
  }
  return j;
}

} // namespace

BOOST_AUTO_TEST_SUITE(engine_sim_test)

BOOST_AUTO_TEST_CASE(greedy_generation_matches_the_model_run_directly) {
  auto dir = tiny_model("target", 11);
  auto e = start(dir);
  std::vector<int32_t> prompt{5, 17, 300, 42, 9};
  auto out = e->generate(greedy(prompt, 16));
  BOOST_REQUIRE_MESSAGE(out.success, out.message);
  BOOST_TEST(out.output_ids == reference_greedy(dir, prompt, 16));
  BOOST_TEST(out.prompt_tokens == 5);
  BOOST_TEST(out.completion_tokens == 16);
  BOOST_TEST(out.finish_reason->type == "length");
  BOOST_TEST(out.weight_version == "0");
  BOOST_TEST(out.weight_version_start == "0");
}

BOOST_AUTO_TEST_CASE(text_prompts_are_tokenized_and_results_detokenized) {
  auto dir = tiny_model("target", 11);
  auto e = start(dir);
  auto tok = model::bpe_tokenizer::from_file(dir / "tokenizer.json");
  BOOST_REQUIRE(tok.has_value());
  GenerateReqInput r;
  r.text = "Hello, world! 123";
  r.sampling_params.max_new_tokens = 12;
  r.sampling_params.sampling_seed = 3;
  r.return_logprob = true;
  auto out = e->generate(r);
  BOOST_REQUIRE_MESSAGE(out.success, out.message);
  BOOST_TEST(out.prompt_tokens == static_cast<int32_t>(tok->encode("Hello, world! 123").size()));
  BOOST_TEST(out.text == tok->decode(out.output_ids, true));
  BOOST_TEST(out.output_token_logprobs.size() == out.output_ids.size());
  for (float lp : out.output_token_logprobs)
    BOOST_TEST(lp <= 0.0f);
  BOOST_TEST(out.sampling_seed == 3u);
}

BOOST_AUTO_TEST_CASE(seeded_sampling_is_reproducible_and_streams_add_up) {
  auto e = start(tiny_model("target", 11));
  auto r = seeded_twenty_tokens(1234);
  auto a = e->generate(r);
  std::vector<GenerateReqOutput> chunks;
  auto b = e->generate(r, [&](const GenerateReqOutput& c) { chunks.push_back(c); });
  BOOST_REQUIRE(a.success && b.success);
  BOOST_TEST(a.output_ids == b.output_ids);
  BOOST_TEST(a.output_token_logprobs == b.output_token_logprobs);
  BOOST_REQUIRE(!chunks.empty());
  const auto streamed = join(chunks);
  BOOST_TEST(streamed.ids == b.output_ids);
  BOOST_TEST(streamed.text == b.text);
  BOOST_TEST(chunks.back().finished);
  BOOST_TEST(chunks.size() >= 20u); // one chunk per token

  // A caller that keeps the streamed output itself (the server's SGLang and OpenAI streams): the
  // same chunks, and a reply with the metadata only, so the output is held once.
  auto only = r;
  only.output_through_sink_only = true;
  std::vector<GenerateReqOutput> kept;
  auto c = e->generate(only, [&](const GenerateReqOutput& x) { kept.push_back(x); });
  BOOST_REQUIRE_MESSAGE(c.success, c.message);
  const auto through_sink = join(kept);
  BOOST_TEST(through_sink.ids == b.output_ids);
  BOOST_TEST(through_sink.logprobs == b.output_token_logprobs);
  BOOST_TEST(c.output_ids.empty());
  BOOST_TEST(c.output_token_logprobs.empty());
  BOOST_TEST(c.text.empty());
  BOOST_TEST(c.finished);
  BOOST_TEST(c.completion_tokens == b.completion_tokens);
  BOOST_TEST(c.prompt_tokens == b.prompt_tokens);
  BOOST_TEST((c.finish_reason && b.finish_reason && c.finish_reason->type == b.finish_reason->type));
  BOOST_TEST(c.weight_version == b.weight_version);
  r.sampling_params.sampling_seed = 99;
  BOOST_TEST(e->generate(r).output_ids != a.output_ids);
}

// sampling_params.stream_interval (and the server's default for requests without one): a chunk
// every that many tokens, the rest with the last; the tokens, logprobs and text add up to the
// unstreamed reply's.
BOOST_AUTO_TEST_CASE(stream_interval_paces_chunks_and_changes_nothing_else) {
  engine_config cfg;
  cfg.stream_interval = 5;
  auto e = start(tiny_model("target", 11), {}, cfg);
  const auto r = seeded_twenty_tokens(77);
  const auto whole = e->generate(r);
  BOOST_REQUIRE_MESSAGE(whole.success, whole.message);
  for (auto [interval, want] : {std::pair<std::optional<int32_t>, std::vector<std::size_t>>{6, {6, 6, 6, 2}},
                                {std::nullopt, {5, 5, 5, 5}}, // the server's 5; the 20th token ends it
                                {1, std::vector<std::size_t>(20, 1)}}) {
    auto s = r;
    s.sampling_params.stream_interval = interval;
    std::vector<GenerateReqOutput> chunks;
    const auto out = e->generate(s, [&](const GenerateReqOutput& c) { chunks.push_back(c); });
    BOOST_REQUIRE_MESSAGE(out.success, out.message);
    const auto j = join(chunks);
    BOOST_TEST_INFO("stream_interval " << (interval ? std::to_string(*interval) : "unset"));
    if (!interval || *interval > 1) // interval 1: a chunk per token (the last one may close empty)
      BOOST_TEST(j.sizes == want);
    else
      BOOST_TEST(j.ids.size() == 20u);
    BOOST_TEST(j.ids == whole.output_ids);
    BOOST_TEST(j.logprobs == whole.output_token_logprobs);
    BOOST_TEST(j.text == whole.text);
    BOOST_TEST(chunks.back().finished);
  }
  // A server default below one is refused at start.
  engine_config bad;
  bad.model_path = tiny_model("target", 11);
  bad.device = "cpu";
  bad.stream_interval = 0;
  auto refused = Engine::start(bad);
  BOOST_REQUIRE(!refused.has_value());
  BOOST_TEST(contains(refused.error(), "stream_interval must be at least 1"), refused.error());
}

BOOST_AUTO_TEST_CASE(many_concurrent_requests_all_finish_as_if_alone) {
  auto e = start(tiny_model("target", 11));
  std::vector<GenerateReqInput> reqs;
  for (int i = 0; i < 96; ++i) {
    GenerateReqInput r;
    r.input_ids = std::vector<int32_t>{1 + i % 50, 7, 2 + i % 11};
    r.sampling_params.max_new_tokens = 4 + i % 13;
    r.sampling_params.sampling_seed = 1000 + i;
    r.sampling_params.temperature = i % 3 == 0 ? 0.0f : 0.9f;
    r.sampling_params.ignore_eos = true;
    r.rid = "req-" + std::to_string(i);
    reqs.push_back(r);
  }
  std::vector<std::future<GenerateReqOutput>> fs;
  for (auto& r : reqs)
    fs.push_back(e->generate_async(r));
  std::set<std::string> rids;
  for (std::size_t i = 0; i < fs.size(); ++i) {
    auto out = fs[i].get();
    BOOST_REQUIRE_MESSAGE(out.success, out.message);
    BOOST_TEST(out.rid == reqs[i].rid.value());
    BOOST_TEST(out.completion_tokens == reqs[i].sampling_params.max_new_tokens);
    rids.insert(out.rid);
    if (i % 12 == 0) // batched with 95 others, or alone: the same tokens
      BOOST_TEST(e->generate(reqs[i]).output_ids == out.output_ids);
  }
  BOOST_TEST(rids.size() == reqs.size());
}

BOOST_AUTO_TEST_CASE(bad_generate_requests_fail_with_a_message) {
  auto e = start(tiny_model("target", 11));
  auto expect_error = [&](GenerateReqInput r, const std::string& needle) {
    auto out = e->generate(std::move(r));
    BOOST_TEST(!out.success);
    BOOST_TEST(out.finished);
    BOOST_TEST(contains(out.message, needle));
  };
  GenerateReqInput both;
  both.text = "x";
  both.input_ids = std::vector<int32_t>{1};
  expect_error(both, "both set");
  expect_error(GenerateReqInput{}, "neither text nor input_ids");
  expect_error(greedy({}, 4), "input_ids: empty");
  expect_error(greedy({1, 512}, 4), "input_ids[1]: token id 512 is outside the vocabulary");
  expect_error(greedy(std::vector<int32_t>(2048, 3), 4), "context length is 2048");
  auto n2 = greedy({1}, 4);
  n2.sampling_params.n = 2;
  expect_error(n2, "sampling_params.n");
  auto penalty = greedy({1}, 4);
  penalty.sampling_params.repetition_penalty = 0.0f;
  expect_error(penalty, "repetition_penalty");
  auto scored = greedy({1, 2, 3}, 4);
  scored.return_logprob = true;
  scored.logprob_start_len = 3;
  expect_error(scored, "logprob_start_len: 3 is not a position of the prompt");
  auto hot = greedy({1}, 4);
  hot.sampling_params.top_p = 0.0f;
  expect_error(hot, "sampling_params.top_p");
  auto paced = greedy({1}, 4); // the in-process API skips the JSON codec's check of this field
  paced.sampling_params.stream_interval = 0;
  expect_error(paced, "sampling_params.stream_interval: 0 is out of range");
  // a rid in flight twice (the first waits in the queue under an in_place pause meanwhile)
  BOOST_REQUIRE(e->pause_generation({pause_mode::in_place}).success);
  auto slow = greedy({1}, 400);
  slow.rid = "same";
  auto first = e->generate_async(slow);
  for (int i = 0; i < 500 && e->get_server_info().waiting_requests == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  BOOST_REQUIRE(e->get_server_info().waiting_requests == 1);
  expect_error(slow, "already in flight");
  BOOST_REQUIRE(e->continue_generation({}).success);
  BOOST_TEST(first.get().success);
}

BOOST_AUTO_TEST_CASE(update_session_changes_weights_version_and_generations) {
  auto dir = tiny_model("target", 11);
  auto e = start(dir);
  auto prompt = std::vector<int32_t>{4, 8, 15, 16, 23, 42};
  auto before = e->generate(greedy(prompt, 16));
  auto update = perturbed(dir, 5);
  BOOST_REQUIRE(e->begin_weight_update({}).success);
  // Old weights serve while tensors are staged.
  std::vector<NamedTensor> half(update.begin(), update.begin() + update.size() / 2);
  std::vector<NamedTensor> rest(update.begin() + update.size() / 2, update.end());
  UpdateWeightsFromTensorReqInput b1, b2;
  b1.named_tensors = half;
  b2.named_tensors = rest;
  auto r1 = e->update_weights_from_tensor(b1);
  BOOST_REQUIRE_MESSAGE(r1.success, r1.message);
  auto r2 = e->update_weights_from_tensor(b2);
  BOOST_REQUIRE_MESSAGE(r2.success, r2.message);
  BOOST_TEST(e->get_server_info().weight_version == "0");
  auto end = e->end_weight_update({});
  BOOST_REQUIRE_MESSAGE(end.success, end.message);
  BOOST_TEST(end.weight_version == "1");
  BOOST_TEST(engine_checksums(*e) == checksums_of(update));
  auto after = e->generate(greedy(prompt, 16));
  BOOST_TEST(after.weight_version == "1");
  BOOST_TEST(after.output_ids != before.output_ids);
  // A fresh engine on a checkpoint of the new weights generates the same tokens.
  auto fresh_dir = scratch_dir("fresh-from-update");
  fs::remove_all(fresh_dir);
  fs::create_directories(fresh_dir);
  fs::copy_file(dir / "config.json", fresh_dir / "config.json");
  fs::copy_file(dir / "tokenizer.json", fresh_dir / "tokenizer.json");
  BOOST_REQUIRE(model::write_checkpoint(fresh_dir, update).has_value());
  auto fresh = start(fresh_dir);
  BOOST_TEST(fresh->generate(greedy(prompt, 16)).output_ids == after.output_ids);
  // A labelled session.
  BOOST_REQUIRE(e->begin_weight_update({}).success);
  EndWeightUpdateReqInput labelled;
  labelled.weight_version = "step-7";
  BOOST_TEST(e->end_weight_update(labelled).weight_version == "step-7");
  BOOST_TEST(e->get_server_info().weight_version == "step-7");
}

BOOST_AUTO_TEST_CASE(session_rules_and_bad_tensors_are_refused_without_half_applying) {
  auto dir = tiny_model("target", 11);
  auto e = start(dir);
  auto original = engine_checksums(*e);
  auto update = perturbed(dir, 6);
  UpdateWeightsFromTensorReqInput good;
  good.named_tensors = {update[0]};

  BOOST_TEST(contains(e->end_weight_update({}).message, "no weight-update session is open"));
  BOOST_REQUIRE(e->begin_weight_update({}).success);
  BOOST_TEST(contains(e->begin_weight_update({}).message, "already open"));
  BOOST_TEST(contains(e->begin_weight_update({runner_selector::draft}).message, "already open"));

  auto refused = [&](std::vector<NamedTensor> ts, const std::string& needle) {
    UpdateWeightsFromTensorReqInput req;
    req.named_tensors = std::move(ts);
    auto out = e->update_weights_from_tensor(req);
    BOOST_TEST(!out.success);
    BOOST_TEST(contains(out.message, needle));
  };
  NamedTensor t;
  for (auto& x : update)
    if (x.tensor.shape.size() == 2 && x.tensor.shape[0] != x.tensor.shape[1] && x.name != update[0].name)
      t = x;
  BOOST_REQUIRE(!t.name.empty());
  refused({update[0], {"model.layers.0.mlp.gate_projj.weight", t.tensor}},
          "unknown tensor name 'model.layers.0.mlp.gate_projj.weight'");
  auto wrong_shape = t;
  wrong_shape.tensor.shape = {t.tensor.shape[1], t.tensor.shape[0]};
  refused({update[0], wrong_shape}, "expects bfloat16");
  auto huge = t;
  huge.tensor.shape = {int64_t{1} << 40, int64_t{1} << 40};
  refused({update[0], huge}, "overflows");
  auto negative = t;
  negative.tensor.shape = {-1, t.tensor.numel() * -1};
  refused({update[0], negative}, "negative dimension");
  auto wrong_dtype = t;
  wrong_dtype.tensor.type = dtype::f16;
  refused({update[0], wrong_dtype}, "the update sent float16");
  auto short_bytes = t;
  short_bytes.tensor.nbytes -= 2;
  refused({update[0], short_bytes}, "bytes of data");
  refused({update[0], update[0]}, "appears twice");
  UpdateWeightsFromTensorReqInput draft_only = good;
  draft_only.selector = runner_selector::draft;
  BOOST_TEST(contains(e->update_weights_from_tensor(draft_only).message, "no draft model"));

  // The session is still open and consistent: a good bucket lands, and only it.
  auto ok = e->update_weights_from_tensor(good);
  BOOST_REQUIRE_MESSAGE(ok.success, ok.message);
  auto end = e->end_weight_update({});
  BOOST_REQUIRE_MESSAGE(end.success, end.message);
  auto now = engine_checksums(*e);
  for (auto& [name, digest] : now) {
    if (name == update[0].name)
      BOOST_TEST(digest == checksums_of({update[0]})[name]);
    else
      BOOST_TEST(digest == original[name]);
  }
}

// CUDA IPC tensors on a CPU engine: the manifest checks run first (unknown name, wrong shape, a
// byte count that does not match), then the CPU runner refuses the rest whole; the session stays
// open and a good inline bucket still lands.
BOOST_AUTO_TEST_CASE(device_tensors_on_a_cpu_engine_are_refused_and_the_session_goes_on) {
  auto dir = tiny_model("target", 11);
  auto e = start(dir);
  auto original = engine_checksums(*e);
  auto update = perturbed(dir, 9);
  BOOST_REQUIRE(e->begin_weight_update({}).success);
  auto device = [&](const NamedTensor& t) {
    NamedDeviceTensor d;
    d.name = t.name;
    d.tensor.type = t.tensor.type;
    d.tensor.shape = t.tensor.shape;
    d.tensor.ipc_handle.assign(64, 0xab);
    d.tensor.nbytes = t.tensor.nbytes;
    return d;
  };
  auto send = [&](std::vector<NamedDeviceTensor> ts) {
    UpdateWeightsFromTensorReqInput req;
    req.device_tensors = std::move(ts);
    return e->update_weights_from_tensor(req);
  };
  auto info = e->get_server_info();
  BOOST_TEST(info.device == "cpu");
  BOOST_TEST((info.weight_transports == std::vector<std::string>{"inline", "disk"}));
  BOOST_TEST(info.int4_modules == 0);
  BOOST_TEST(info.int4_update_recipe.empty());
  auto out = send({device(update[0])});
  BOOST_TEST(!out.success);
  BOOST_TEST(contains(out.message, "runs on the CPU"), out.message);
  BOOST_TEST(contains(out.message, "send them inline"), out.message);
  InitWeightsUpdateGroupReqInput group;
  group.group_name = "g";
  auto joined = e->init_weights_update_group(group);
  BOOST_TEST(!joined.success);
  BOOST_TEST(contains(joined.message, "runs on the CPU and cannot join NCCL"), joined.message);
  // Without a group, an NCCL update names what is missing; destroying one that is not there too.
  UpdateWeightsFromDistributedReqInput dist;
  dist.names = {"model.norm.weight"};
  dist.dtypes = {dtype::bf16};
  dist.shapes = {{8}};
  dist.group_name = "g";
  auto received = e->update_weights_from_distributed(dist);
  BOOST_TEST(!received.success);
  BOOST_TEST(contains(received.message, "no weight-update group named \"g\""), received.message);
  BOOST_TEST(contains(received.message, "init_weights_update_group first"), received.message);
  auto destroyed = e->destroy_weights_update_group({"g"});
  BOOST_TEST(!destroyed.success);
  BOOST_TEST(contains(destroyed.message, "does not exist"), destroyed.message);
  BOOST_TEST(contains(out.message, "session stays open"), out.message);
  auto unknown = device(update[0]);
  unknown.name = "model.layers.0.mlp.gate_projj.weight";
  BOOST_TEST(contains(send({unknown}).message, "unknown tensor name 'model.layers.0.mlp.gate_projj.weight'"));
  auto wrong = device(update[0]);
  wrong.tensor.nbytes += 2;
  BOOST_TEST(contains(send({wrong}).message, "bytes for"));
  auto twice = device(update[0]);
  BOOST_TEST(contains(send({twice, twice}).message, "appears twice"));
  UpdateWeightsFromTensorReqInput good;
  good.named_tensors = {update[0]};
  auto ok = e->update_weights_from_tensor(good);
  BOOST_REQUIRE_MESSAGE(ok.success, ok.message);
  BOOST_REQUIRE(e->end_weight_update({}).success);
  auto now = engine_checksums(*e);
  for (auto& [name, digest] : now)
    BOOST_TEST(digest == (name == update[0].name ? checksums_of({update[0]})[name] : original[name]), name);
}

// Updates outside begin/end (SGLang's way; slime sends its buckets so): while generation runs each
// call commits at once; while paused the buckets accumulate and commit at continue_generation,
// or at post_process_weights(post_process_quantization) after post_process_weights(restore).
BOOST_AUTO_TEST_CASE(updates_outside_a_session_commit_at_once_or_when_generation_continues) {
  auto dir = tiny_model("target", 11);
  auto e = start(dir);
  auto original = engine_checksums(*e);
  auto update = perturbed(dir, 12);
  const std::size_t half = update.size() / 2;
  auto bucket = [&](std::size_t from, std::size_t to, std::optional<std::string> label = {}) {
    UpdateWeightsFromTensorReqInput req;
    req.named_tensors.assign(update.begin() + from, update.begin() + to);
    req.weight_version = label;
    auto out = e->update_weights_from_tensor(req);
    BOOST_REQUIRE_MESSAGE(out.success, out.message);
    return out;
  };
  // Generation runs: committed by the call itself.
  auto one = bucket(0, 1);
  BOOST_TEST(contains(one.message, "committed"), one.message);
  auto now = engine_checksums(*e);
  BOOST_TEST(now[update[0].name] == checksums_of({update[0]})[update[0].name]);
  BOOST_TEST(e->get_server_info().weight_version == "1");

  // Paused: two buckets, nothing serves until continue.
  PauseGenerationReqInput pause;
  pause.mode = pause_mode::retract;
  BOOST_REQUIRE(e->pause_generation(pause).success);
  auto staged = bucket(0, half, std::string("step-7"));
  BOOST_TEST(contains(staged.message, "outside begin/end"), staged.message);
  bucket(half, update.size(), std::string("step-7"));
  BOOST_TEST((engine_checksums(*e) == now));
  BOOST_TEST(contains(e->begin_weight_update({}).message, "outside begin/end"));
  auto cont = e->continue_generation({});
  BOOST_REQUIRE_MESSAGE(cont.success, cont.message);
  BOOST_TEST(contains(cont.message, "committed"), cont.message);
  BOOST_TEST((engine_checksums(*e) == checksums_of(update)));
  BOOST_TEST(e->get_server_info().weight_version == "step-7");

  // slime's compressed-tensors sequence: restore, buckets, post-process (commits), continue.
  auto back = perturbed(dir, 13);
  BOOST_REQUIRE(e->pause_generation(pause).success);
  PostProcessWeightsReqInput restore;
  restore.restore_weights_before_loading = true;
  auto r = e->post_process_weights(restore);
  BOOST_REQUIRE_MESSAGE(r.success, r.message);
  UpdateWeightsFromTensorReqInput all;
  all.named_tensors = back;
  BOOST_REQUIRE(e->update_weights_from_tensor(all).success);
  BOOST_TEST((engine_checksums(*e) == checksums_of(update)));
  PostProcessWeightsReqInput post;
  post.post_process_quantization = true;
  auto p = e->post_process_weights(post);
  BOOST_REQUIRE_MESSAGE(p.success, p.message);
  BOOST_TEST((engine_checksums(*e) == checksums_of(back)));
  BOOST_REQUIRE(e->continue_generation({}).success);

  // Dropped with end_weight_update(abort): the weights stay.
  BOOST_REQUIRE(e->pause_generation(pause).success);
  UpdateWeightsFromTensorReqInput again;
  again.named_tensors = {update[0]};
  BOOST_REQUIRE(e->update_weights_from_tensor(again).success);
  EndWeightUpdateReqInput abort;
  abort.abort = true;
  BOOST_TEST(e->end_weight_update(abort).success);
  BOOST_REQUIRE(e->continue_generation({}).success);
  BOOST_TEST((engine_checksums(*e) == checksums_of(back)));
  (void)original;
}

BOOST_AUTO_TEST_CASE(aborted_session_leaves_weights_and_version) {
  auto dir = tiny_model("target", 11);
  auto e = start(dir);
  auto original = engine_checksums(*e);
  BOOST_REQUIRE(e->begin_weight_update({}).success);
  UpdateWeightsFromTensorReqInput all;
  all.named_tensors = perturbed(dir, 8);
  BOOST_REQUIRE(e->update_weights_from_tensor(all).success);
  EndWeightUpdateReqInput abort;
  abort.abort = true;
  auto out = e->end_weight_update(abort);
  BOOST_TEST(out.success);
  BOOST_TEST(contains(out.message, "aborted"));
  BOOST_TEST(engine_checksums(*e) == original);
  BOOST_TEST(e->get_server_info().weight_version == "0");
  BOOST_TEST(e->begin_weight_update({}).success); // the next session opens normally
  BOOST_TEST(e->end_weight_update({}).success);
  BOOST_TEST(e->get_server_info().weight_version == "0"); // nothing staged, no label: unchanged
}

BOOST_AUTO_TEST_CASE(checker_self_test_snapshot_reset_update_compare) {
  // miles' --check-weight-update-equal: snapshot, poison, resend the same weights, compare.
  auto dir = tiny_model("target", 11);
  auto e = start(dir);
  CheckWeightsReqInput snap;
  snap.action = check_weights_action::snapshot;
  BOOST_REQUIRE(e->check_weights(snap).success);
  CheckWeightsReqInput reset;
  reset.action = check_weights_action::reset_tensors;
  reset.skip_tensor_list = {"norm"};
  BOOST_REQUIRE(e->check_weights(reset).success);
  CheckWeightsReqInput compare;
  compare.action = check_weights_action::compare;
  auto poisoned = e->check_weights(compare);
  BOOST_REQUIRE(poisoned.success);
  for (auto& name : poisoned.changed)
    BOOST_TEST(name.find("norm") == std::string::npos);
  for (auto& name : poisoned.unchanged)
    BOOST_TEST(name.find("norm") != std::string::npos);
  BOOST_TEST(!poisoned.changed.empty());

  auto ckpt = model::checkpoint::open(dir);
  UpdateWeightsFromTensorReqInput same;
  for (auto& name : ckpt->names())
    same.named_tensors.push_back({name, *ckpt->tensor(name)});
  BOOST_REQUIRE(e->begin_weight_update({}).success);
  BOOST_REQUIRE(e->update_weights_from_tensor(same).success);
  BOOST_REQUIRE(e->end_weight_update({}).success);
  auto restored = e->check_weights(compare);
  BOOST_TEST(restored.changed.empty());
  BOOST_TEST(restored.unchanged.size() == ckpt->names().size());
}

BOOST_AUTO_TEST_CASE(compare_without_snapshot_says_what_to_do) {
  auto e = start(tiny_model("target", 11));
  CheckWeightsReqInput compare;
  compare.action = check_weights_action::compare;
  auto out = e->check_weights(compare);
  BOOST_TEST(!out.success);
  BOOST_TEST(contains(out.message, "snapshot"));
}

BOOST_AUTO_TEST_CASE(tied_lm_head_is_an_alias_of_the_embedding) {
  auto dir = tiny_model("target", 11);
  auto e = start(dir);
  auto update = perturbed(dir, 9);
  NamedTensor embed;
  for (auto& t : update)
    if (t.name == "model.embed_tokens.weight")
      embed = t;
  BOOST_REQUIRE(!embed.name.empty());
  BOOST_REQUIRE(e->begin_weight_update({}).success);
  UpdateWeightsFromTensorReqInput via_lm_head;
  via_lm_head.named_tensors = {{"lm_head.weight", embed.tensor}};
  BOOST_REQUIRE(e->update_weights_from_tensor(via_lm_head).success);
  auto other = update.front().name == embed.name ? update.back() : update.front();
  UpdateWeightsFromTensorReqInput conflicting;
  auto bad_lm_head = perturbed(dir, 10);
  for (auto& t : bad_lm_head)
    if (t.name == "model.embed_tokens.weight")
      conflicting.named_tensors = {embed, {"lm_head.weight", t.tensor}};
  auto refused = e->update_weights_from_tensor(conflicting);
  BOOST_TEST(!refused.success);
  BOOST_TEST(contains(refused.message, "tied"));
  BOOST_REQUIRE(e->end_weight_update({}).success);
  BOOST_TEST(engine_checksums(*e)["model.embed_tokens.weight"] == checksums_of({embed})[embed.name]);
}

BOOST_AUTO_TEST_CASE(disk_updates_load_whole_checkpoints_or_nothing) {
  auto dir = tiny_model("target", 11);
  auto e = start(dir);
  auto original = engine_checksums(*e);
  auto update = perturbed(dir, 12);
  auto good = scratch_dir("disk-good");
  fs::remove_all(good);
  BOOST_REQUIRE(model::write_checkpoint(good, update, 40000).has_value()); // sharded
  BOOST_REQUIRE(fs::exists(good / "model.safetensors.index.json"));
  UpdateWeightFromDiskReqInput req;
  req.model_path = good.string();
  auto out = e->update_weights_from_disk(req);
  BOOST_REQUIRE_MESSAGE(out.success, out.message);
  BOOST_TEST(engine_checksums(*e) == checksums_of(update));
  BOOST_TEST(e->get_server_info().weight_version == "1");

  auto missing = scratch_dir("disk-missing");
  fs::remove_all(missing);
  std::vector<NamedTensor> partial(update.begin() + 1, update.end());
  BOOST_REQUIRE(model::write_checkpoint(missing, partial).has_value());
  req.model_path = missing.string();
  out = e->update_weights_from_disk(req);
  BOOST_TEST(!out.success);
  BOOST_TEST(contains(out.message, "lacks tensor '" + update[0].name + "'"));
  req.model_path = (scratch_dir("no-such-dir")).string();
  BOOST_TEST(!e->update_weights_from_disk(req).success);
  BOOST_TEST(engine_checksums(*e) == checksums_of(update));
  BOOST_TEST(e->get_server_info().weight_version == "1");

  BOOST_REQUIRE(e->begin_weight_update({}).success);
  req.model_path = dir.string();
  BOOST_TEST(contains(e->update_weights_from_disk(req).message, "a session is open"));
  BOOST_REQUIRE(e->end_weight_update({}).success);
  BOOST_TEST(e->update_weights_from_disk(req).success);
  BOOST_TEST(engine_checksums(*e) == original);
}

// A trainer on transformers 5 saving with save_original_format=False writes each layer's experts
// fused (gate_up_proj [E, 2I, H], down_proj [E, H, I]): update_weights_from_disk takes that
// checkpoint as it takes the hub's per-expert one, to the same checksums.
BOOST_AUTO_TEST_CASE(disk_updates_take_fused_expert_checkpoints) {
  auto dir = tiny_moe_model("moe-fused-disk", 5);
  auto e = start(dir);
  const auto update = perturbed(dir, 21);
  const auto fused = with_fused_experts(update);
  auto out_dir = scratch_dir("disk-fused");
  fs::remove_all(out_dir);
  BOOST_REQUIRE(model::write_checkpoint(out_dir, fused).has_value());
  UpdateWeightFromDiskReqInput req;
  req.model_path = out_dir.string();
  auto out = e->update_weights_from_disk(req);
  BOOST_REQUIRE_MESSAGE(out.success, out.message);
  BOOST_TEST(engine_checksums(*e) == checksums_of(update));
}

// A trainer's BF16 checkpoint into an engine serving INT4 experts: the experts' `.weight` are
// quantized with the engine's recipe, so the result equals an engine started from that
// checkpoint with the same quantization.
BOOST_AUTO_TEST_CASE(a_bf16_checkpoint_loads_into_an_int4_engine) {
  auto dir = tiny_moe_model("moe-bf16", 3);
  engine_config int4;
  int4.quantize = "int4-asym";
  int4.quantize_group_size = 32;
  auto e = start(dir, {}, int4);
  auto before = engine_checksums(*e);
  BOOST_TEST(before.count("model.layers.0.mlp.experts.0.gate_proj.weight_packed") == 1u);
  // What the engine says of itself is what its runner states: INT4 experts, quantized here.
  auto info = e->get_server_info();
  BOOST_TEST(info.int4_modules == e->target_manifest().capabilities.int4_modules);
  BOOST_TEST(info.int4_modules > 0);
  BOOST_TEST(info.int4_update_recipe == "int4-asym g32");
  BOOST_TEST(info.int4_quantized_on == "host");
  auto update = perturbed(dir, 21);
  auto bf16 = scratch_dir("moe-bf16-new");
  fs::remove_all(bf16);
  BOOST_REQUIRE(model::write_checkpoint(bf16, update).has_value());
  fs::copy_file(dir / "config.json", bf16 / "config.json", fs::copy_options::overwrite_existing);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    if (fs::exists(dir / f))
      fs::copy_file(dir / f, bf16 / f, fs::copy_options::overwrite_existing);
  UpdateWeightFromDiskReqInput req;
  req.model_path = bf16.string();
  auto out = e->update_weights_from_disk(req);
  BOOST_REQUIRE_MESSAGE(out.success, out.message);
  auto fresh = start(bf16, {}, int4);
  auto now = engine_checksums(*e);
  BOOST_TEST((now == engine_checksums(*fresh)));
  BOOST_TEST((now != before));
  std::vector<int32_t> prompt{3, 14, 15, 92, 65};
  BOOST_TEST((e->generate(greedy(prompt, 12)).output_ids == fresh->generate(greedy(prompt, 12)).output_ids));
}

BOOST_AUTO_TEST_CASE(pause_abort_ends_running_requests_and_holds_new_ones) {
  auto e = start(tiny_model("target", 11));
  std::vector<std::future<GenerateReqOutput>> running;
  for (int i = 0; i < 8; ++i)
    running.push_back(e->generate_async(greedy({1, 2, 3 + i}, 1500)));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  auto paused = e->pause_generation({pause_mode::abort});
  BOOST_REQUIRE_MESSAGE(paused.success, paused.message);
  for (auto& f : running) {
    // Every request has ended when pause returns; its future is set a moment later by the
    // engine's reply actor.
    BOOST_REQUIRE(f.wait_for(std::chrono::seconds(5)) == std::future_status::ready);
    auto out = f.get();
    BOOST_TEST(out.finish_reason->type == "abort");
    BOOST_TEST(out.completion_tokens < 1500);
    BOOST_TEST(out.output_ids.size() == static_cast<std::size_t>(out.completion_tokens));
  }
  auto waiting = e->generate_async(greedy({1, 2}, 4));
  BOOST_TEST((waiting.wait_for(std::chrono::milliseconds(100)) == std::future_status::timeout));
  BOOST_TEST(e->get_server_info().waiting_requests == 1);
  BOOST_REQUIRE(e->continue_generation({}).success);
  BOOST_TEST(waiting.get().success);
}

BOOST_AUTO_TEST_CASE(a_pause_mode_outside_the_enum_is_refused_and_pauses_nothing) {
  // The JSON codec makes only the three modes; the in-process API takes any byte.
  auto e = start(tiny_model("target", 11));
  auto out = e->pause_generation({static_cast<pause_mode>(0)});
  BOOST_TEST(!out.success);
  BOOST_TEST(contains(out.message, "mode: expected abort, retract, in_place or drain"));
  BOOST_TEST(!e->get_server_info().paused);
  BOOST_TEST(e->generate(greedy({1, 2}, 2)).success);
}

BOOST_AUTO_TEST_CASE(retract_resumes_greedy_requests_exactly) {
  auto e = start(tiny_model("target", 11));
  std::vector<GenerateReqInput> reqs;
  for (int i = 0; i < 6; ++i)
    reqs.push_back(greedy({3, 1, 4, 1, 5 + i}, 200));
  std::vector<std::vector<int32_t>> uninterrupted;
  for (auto& r : reqs)
    uninterrupted.push_back(e->generate(r).output_ids);
  std::vector<std::future<GenerateReqOutput>> fs;
  for (auto& r : reqs)
    fs.push_back(e->generate_async(r));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  BOOST_REQUIRE(e->pause_generation({pause_mode::retract}).success);
  auto info = e->get_server_info();
  BOOST_TEST(info.running_requests == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  BOOST_REQUIRE(e->continue_generation({}).success);
  for (std::size_t i = 0; i < fs.size(); ++i) {
    auto out = fs[i].get();
    BOOST_REQUIRE(out.success);
    BOOST_TEST(out.output_ids == uninterrupted[i]);
  }
}

// What a request carries besides its tokens survives a retract: the penalties' history (the
// runner gets the generated tokens back), the prompt logprobs (scored once), the routing rows
// (one per position run).
BOOST_AUTO_TEST_CASE(retract_keeps_penalties_prompt_logprobs_and_routing) {
  auto dir = tiny_moe_model("moe", 11);
  auto e = start(dir);
  std::vector<GenerateReqInput> reqs;
  for (int i = 0; i < 6; ++i) {
    auto r = greedy({3, 1, 4, 1, 5 + i, 9, 2}, 150);
    r.sampling_params.repetition_penalty = 1.3f;
    r.sampling_params.frequency_penalty = 0.2f;
    r.sampling_params.min_new_tokens = 20;
    r.return_logprob = true;
    r.logprob_start_len = 1;
    r.top_logprobs_num = 2;
    r.return_routed_experts = true;
    reqs.push_back(r);
  }
  std::vector<GenerateReqOutput> uninterrupted;
  for (auto& r : reqs)
    uninterrupted.push_back(e->generate(r));
  std::vector<std::future<GenerateReqOutput>> fs;
  for (auto& r : reqs)
    fs.push_back(e->generate_async(r));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  BOOST_REQUIRE(e->pause_generation({pause_mode::retract}).success);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  BOOST_REQUIRE(e->continue_generation({}).success);
  for (std::size_t i = 0; i < fs.size(); ++i) {
    auto out = fs[i].get();
    const auto& want = uninterrupted[i];
    BOOST_REQUIRE_MESSAGE(out.success, out.message);
    BOOST_TEST(out.output_ids == want.output_ids);
    BOOST_TEST(out.output_token_logprobs == want.output_token_logprobs);
    BOOST_TEST(out.input_token_ids == want.input_token_ids);
    BOOST_TEST(out.input_token_ids.size() == 6u); // prompt from position 1
    BOOST_TEST(out.input_token_logprobs.size() == 6u);
    BOOST_TEST(std::isnan(out.input_token_logprobs[0]));
    BOOST_TEST(out.input_token_logprobs[5] == want.input_token_logprobs[5]);
    BOOST_TEST(out.input_top_logprobs.size() == 6u);
    // One row (layers x top_k) per position that ran: prompt + outputs - 1.
    BOOST_REQUIRE(out.routed_experts.has_value());
    BOOST_REQUIRE(want.routed_experts.has_value());
    const auto positions = 7 + out.output_ids.size() - 1;
    BOOST_TEST(out.routed_experts->size() % positions == 0u);
    BOOST_TEST(out.routed_experts->size() > 0u);
    BOOST_TEST(*out.routed_experts == *want.routed_experts);
  }
}

// Prompt logprobs over a prefill split into chunks (of 7 tokens here): every position from
// logprob_start_len is scored once, with the same values as an unchunked prefill, and the sampled
// position's row is not mistaken for a score.
BOOST_AUTO_TEST_CASE(prompt_logprobs_over_chunked_prefill_match_one_chunk) {
  auto dir = tiny_model("target", 11);
  engine_config chunked;
  chunked.max_batch_tokens = 7;
  auto small = start(dir, {}, chunked);
  auto whole = start(dir);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 30; ++i)
    prompt.push_back(1 + (i * 37) % 500);
  for (int32_t from : {0, 3, 6, 7, 13, 28, 29}) {
    auto r = greedy(prompt, 3);
    r.return_logprob = true;
    r.logprob_start_len = from;
    r.top_logprobs_num = 3;
    auto a = small->generate(r);
    auto b = whole->generate(r);
    BOOST_REQUIRE_MESSAGE(a.success, a.message);
    BOOST_REQUIRE_MESSAGE(b.success, b.message);
    BOOST_TEST_CONTEXT("logprob_start_len " << from) {
      BOOST_TEST(a.input_token_ids.size() == 30u - from);
      BOOST_TEST(a.input_token_ids == b.input_token_ids);
      BOOST_TEST(std::isnan(a.input_token_logprobs[0]));
      BOOST_REQUIRE(a.input_token_logprobs.size() == b.input_token_logprobs.size());
      for (std::size_t k = 1; k < a.input_token_logprobs.size(); ++k)
        BOOST_TEST(a.input_token_logprobs[k] == b.input_token_logprobs[k]);
      BOOST_TEST(a.input_top_logprobs.size() == a.input_token_ids.size());
      BOOST_TEST(a.output_ids == b.output_ids);
    }
  }
}

BOOST_AUTO_TEST_CASE(in_place_pause_update_continue_spans_two_versions) {
  auto dir = tiny_model("target", 11);
  auto e = start(dir);
  // Paused after its first token (a fixed sleep raced a fast machine that finished all 300).
  auto first = std::make_shared<std::promise<void>>();
  auto first_seen = first->get_future();
  auto once = std::make_shared<std::once_flag>();
  auto on_chunk = [first, once](const GenerateReqOutput&) {
    std::call_once(*once, [&] { first->set_value(); });
  };
  auto request = e->generate_async(greedy({2, 7, 1, 8}, 300), on_chunk);
  BOOST_REQUIRE(first_seen.wait_for(std::chrono::seconds(120)) == std::future_status::ready);
  BOOST_REQUIRE(e->pause_generation({pause_mode::in_place}).success);
  BOOST_TEST(e->get_server_info().running_requests == 1);
  // The session runs under the pause: it does not wait for the frozen request.
  BOOST_REQUIRE(e->begin_weight_update({}).success);
  UpdateWeightsFromTensorReqInput all;
  all.named_tensors = perturbed(dir, 13);
  all.flush_cache = false;
  BOOST_REQUIRE(e->update_weights_from_tensor(all).success);
  BOOST_REQUIRE(e->end_weight_update({}).success);
  // flush refuses while a request holds KV.
  auto flush = e->flush_cache({});
  BOOST_TEST(!flush.success);
  BOOST_TEST(contains(flush.message, "1 requests are running"));
  BOOST_REQUIRE(e->continue_generation({}).success);
  auto out = request.get();
  BOOST_REQUIRE(out.success);
  BOOST_TEST(out.weight_version_start == "0");
  BOOST_TEST(out.weight_version == "1");
  BOOST_TEST(e->flush_cache({}).success);
}

BOOST_AUTO_TEST_CASE(continue_inside_a_session_takes_effect_at_its_end) {
  auto dir = tiny_model("target", 11);
  auto e = start(dir);
  BOOST_REQUIRE(e->pause_generation({pause_mode::retract}).success);
  BOOST_REQUIRE(e->begin_weight_update({}).success);
  // Answered at once (a trainer calling continue before end from one thread must not hang),
  // but generation stays paused until the session ends.
  auto resumed = e->continue_generation({});
  BOOST_TEST(resumed.success);
  BOOST_TEST(contains(resumed.message, "continues when end_weight_update closes it"));
  BOOST_TEST(e->get_server_info().paused);
  auto held = e->generate_async(greedy({1, 2}, 3));
  BOOST_TEST((held.wait_for(std::chrono::milliseconds(50)) == std::future_status::timeout));
  BOOST_REQUIRE(e->end_weight_update({}).success);
  BOOST_TEST(held.get().success);
  BOOST_TEST(!e->get_server_info().paused);
  // A pause after a deferred continue wins: the session's end leaves generation paused.
  BOOST_REQUIRE(e->pause_generation({pause_mode::in_place}).success);
  BOOST_REQUIRE(e->begin_weight_update({}).success);
  BOOST_TEST(e->continue_generation({}).success);
  BOOST_REQUIRE(e->pause_generation({pause_mode::in_place}).success);
  BOOST_REQUIRE(e->end_weight_update({}).success);
  BOOST_TEST(e->get_server_info().paused);
  BOOST_TEST(e->continue_generation({}).success);
  BOOST_TEST(!e->get_server_info().paused);
}

BOOST_AUTO_TEST_CASE(unpaused_session_waits_for_running_requests_then_holds_new_ones) {
  auto dir = tiny_model("target", 11);
  auto e = start(dir);
  auto running = e->generate_async(greedy({9, 9, 9}, 300));
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  auto begun = e->begin_weight_update({}); // waits for the running request (writer lock)
  BOOST_REQUIRE(begun.success);
  BOOST_TEST((running.wait_for(std::chrono::seconds(0)) == std::future_status::ready));
  BOOST_TEST(running.get().completion_tokens == 300);
  auto held = e->generate_async(greedy({1}, 2));
  BOOST_TEST((held.wait_for(std::chrono::milliseconds(100)) == std::future_status::timeout));
  BOOST_REQUIRE(e->end_weight_update({}).success);
  BOOST_TEST(held.get().success);
}

BOOST_AUTO_TEST_CASE(abort_by_rid_running_or_queued) {
  auto e = start(tiny_model("target", 11));
  auto r = greedy({1, 2}, 2000);
  r.rid = "long-one";
  auto running = e->generate_async(r);
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  AbortReq abort;
  abort.rid = "long-one";
  BOOST_TEST(e->abort(abort).num_aborted == 1);
  auto out = running.get();
  BOOST_TEST(out.finish_reason->type == "abort");
  BOOST_TEST(out.completion_tokens < 2000);

  BOOST_REQUIRE(e->pause_generation({pause_mode::abort}).success);
  auto q = greedy({1}, 3);
  q.rid = "queued-one";
  auto queued = e->generate_async(q);
  for (int i = 0; i < 500 && e->get_server_info().waiting_requests == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  abort.rid = "queued-one";
  BOOST_TEST(e->abort(abort).num_aborted == 1);
  BOOST_TEST(queued.get().finish_reason->type == "abort");
  BOOST_TEST(e->abort(abort).num_aborted == 0);
}

BOOST_AUTO_TEST_CASE(draft_runner_follows_the_selector) {
  auto target = tiny_model("target", 11);
  auto draft = tiny_model("draft", 21);
  auto e = start(target, draft);
  auto sums = e->check_weights({});
  BOOST_REQUIRE(sums.success);
  BOOST_TEST(sums.payload[0].role_checksums.count("target") == 1u);
  BOOST_TEST(sums.payload[0].role_checksums.count("draft") == 1u);
  BOOST_TEST(sums.payload[0].checksums.count("draft.model.norm.weight") == 1u);
  BOOST_TEST(sums.payload[0].parallelism_info.size() == 2u);
  auto draft_before = engine_checksums(*e, runner_selector::draft);

  // target only: the frozen draft is untouched (miles #1926)
  BOOST_REQUIRE(e->begin_weight_update({runner_selector::target}).success);
  UpdateWeightsFromTensorReqInput t_update;
  t_update.named_tensors = perturbed(target, 14);
  t_update.selector = runner_selector::target;
  BOOST_REQUIRE(e->update_weights_from_tensor(t_update).success);
  UpdateWeightsFromTensorReqInput wider = t_update;
  wider.selector = runner_selector::all;
  BOOST_TEST(contains(e->update_weights_from_tensor(wider).message, "did not open"));
  BOOST_REQUIRE(e->end_weight_update({}).success);
  BOOST_TEST(engine_checksums(*e, runner_selector::draft) == draft_before);
  BOOST_TEST(engine_checksums(*e, runner_selector::target) == checksums_of(t_update.named_tensors));

  // draft only
  BOOST_REQUIRE(e->begin_weight_update({runner_selector::draft}).success);
  UpdateWeightsFromTensorReqInput d_update;
  d_update.named_tensors = perturbed(draft, 15);
  d_update.selector = runner_selector::draft;
  BOOST_REQUIRE(e->update_weights_from_tensor(d_update).success);
  BOOST_REQUIRE(e->end_weight_update({}).success);
  auto after = engine_checksums(*e, runner_selector::draft);
  for (auto& [name, digest] : checksums_of(d_update.named_tensors))
    BOOST_TEST(after["draft." + name] == digest);
  BOOST_TEST(engine_checksums(*e, runner_selector::target) == checksums_of(t_update.named_tensors));
}

BOOST_AUTO_TEST_CASE(get_weights_by_name_and_other_routes) {
  auto dir = tiny_model("target", 11);
  auto e = start(dir);
  GetWeightsByNameReqInput req;
  req.name = "model.norm.weight";
  req.truncate_size = 5;
  auto out = e->get_weights_by_name(req);
  BOOST_REQUIRE_MESSAGE(out.success, out.message);
  auto ckpt = model::checkpoint::open(dir);
  auto t = ckpt->tensor("model.norm.weight");
  BOOST_REQUIRE_EQUAL(out.parameter.size(), 5u);
  for (std::size_t i = 0; i < 5; ++i)
    BOOST_TEST(out.parameter[i] == kernels::bf16_to_float(t->as<uint16_t>()[i]));
  req.name = "model.nope";
  BOOST_TEST(!e->get_weights_by_name(req).success);
  BOOST_TEST(!e->init_weights_update_group({}).success);
  BOOST_TEST(!e->update_weights_from_distributed({}).success);
  BOOST_TEST(e->post_process_weights({true, true, runner_selector::all}).success);
  BOOST_TEST(e->health().success);
  UpdateWeightVersionReqInput v;
  v.new_version = "rl-step-3";
  BOOST_TEST(e->update_weight_version(v).success);
  BOOST_TEST(e->generate(greedy({1}, 1)).weight_version == "rl-step-3");
  v.new_version = "";
  BOOST_TEST(!e->update_weight_version(v).success);
}

BOOST_AUTO_TEST_SUITE_END()
