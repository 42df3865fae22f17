// The weight_group actor (actors/weight_group_actor.hpp) with a trainer's TCPStore played by
// the test (tests/support/fake_tcp_store.hpp): what runs without a GPU — joining through the
// store, a receive whose trainer never creates its communicator (it fails at its deadline and
// breaks the group), a destroy that cuts a wait short, a trainer that dies, impossible
// requests, timeouts out of range (clamped in the group, refused by the weight_updater). Creating the communicator and the broadcasts need NCCL and GPUs: see
// tests/gpu/test_nccl_update.py and tests/model/nccl_group_gpu_test.cpp.
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <future>
#include <thread>

#include "actors/runner_actor.hpp"
#include "actors/weight_group_actor.hpp"
#include "actors/weight_updater_actor.hpp"
#include "caf/all.hpp"
#include "messages/all.hpp"
#include "messages/base64.hpp"
#include "model/tcp_store.hpp"
#include "tests/support/engine_support.hpp"
#include "tests/support/fake_tcp_store.hpp"

using namespace rlserve;
using namespace std::chrono_literals;

namespace {

using seconds = std::chrono::duration<double>;

struct fixture {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  test::fake_tcp_store store;
  std::shared_ptr<std::atomic<bool>> cancel = std::make_shared<std::atomic<bool>>(false);
  weight_group_actor group = spawn_weight_group(sys, cancel);

  ~fixture() {
    cancel->store(true);
    caf::anon_send_exit(group, caf::exit_reason::user_shutdown);
  }

  InitWeightsUpdateGroupReqInput request(int port, double timeout_s = 5) {
    return test::join_request(port, timeout_s);
  }

  template <class Out, class In>
  Out ask(In msg) {
    caf::scoped_actor self{sys};
    Out out;
    self->request(group, caf::infinite, std::move(msg))
      .receive([&](Out& o) { out = std::move(o); },
               [&](caf::error& e) {
                 out.success = false;
                 out.message = "CAF error: " + sys.render(e);
               });
    return out;
  }

  InitWeightsUpdateGroupReqOutput join(InitWeightsUpdateGroupReqInput r) {
    return ask<InitWeightsUpdateGroupReqOutput>(JoinWeightGroup{std::move(r), 0, 1});
  }

  ReceivedBroadcast receive(double timeout_s, std::vector<TensorSpec> tensors = {{"w", dtype::bf16, {4, 8}}}) {
    return ask<ReceivedBroadcast>(ReceiveBroadcast{std::move(tensors), false, timeout_s, true});
  }

  DestroyWeightsUpdateGroupReqOutput destroy() {
    cancel->store(true); // as the weight_updater does
    return ask<DestroyWeightsUpdateGroupReqOutput>(DestroyWeightsUpdateGroupReqInput{"G"});
  }
};

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

} // namespace

BOOST_AUTO_TEST_SUITE(weight_group_test)

BOOST_FIXTURE_TEST_CASE(joins_through_the_store_and_counts_itself_in, fixture) {
  auto joined = join(request(store.port()));
  BOOST_TEST(joined.success, joined.message);
  BOOST_TEST(contains(joined.message, "rank 1 of 2"), joined.message);
  // The engine adds its 1 to the join counter (a fake store has no rank 0 that counts itself).
  BOOST_TEST(store.counter(std::string(model::tcp_store_join_key)) == 1);
  // Nothing to receive needs no communicator.
  auto empty = receive(1, {});
  BOOST_TEST(empty.success, empty.message);
  auto left = destroy();
  BOOST_TEST(left.success, left.message);
  BOOST_TEST(contains(left.message, "left weight-update group \"G\""), left.message);
}

BOOST_FIXTURE_TEST_CASE(a_receive_gives_up_at_its_deadline_when_the_trainer_never_creates_its_communicator,
                        fixture) {
  BOOST_TEST(join(request(store.port())).success);
  auto started = std::chrono::steady_clock::now();
  auto r = receive(0.3);
  auto took = seconds(std::chrono::steady_clock::now() - started).count();
  BOOST_TEST(!r.success);
  BOOST_TEST(r.group_broken);
  BOOST_TEST(contains(r.message, model::nccl_unique_id_key("G")), r.message);
  BOOST_TEST(contains(r.message, "has not created its communicator"), r.message);
  BOOST_TEST(took < 30.0); // bounded: no hang (the deadline was 0.3 s)
  // The group is broken now: a later broadcast could not be matched with the trainer's.
  auto again = receive(5);
  BOOST_TEST(!again.success);
  BOOST_TEST(again.group_broken);
  BOOST_TEST(contains(again.message, "is broken"), again.message);
  BOOST_TEST(destroy().success);
}

BOOST_FIXTURE_TEST_CASE(a_destroy_cuts_a_waiting_receive_short, fixture) {
  BOOST_TEST(join(request(store.port(), 600)).success);
  auto started = std::chrono::steady_clock::now();
  auto waiting = std::async(std::launch::async, [&] { return receive(600); });
  std::this_thread::sleep_for(200ms);
  auto left = destroy();
  auto r = waiting.get();
  BOOST_TEST(left.success, left.message);
  BOOST_TEST(!r.success);
  BOOST_TEST(contains(r.message, "destroyed while it waited"), r.message);
  BOOST_TEST(seconds(std::chrono::steady_clock::now() - started).count() < 60.0);
}

BOOST_FIXTURE_TEST_CASE(a_trainer_that_dies_breaks_the_group, fixture) {
  BOOST_TEST(join(request(store.port())).success);
  store.close_all();
  std::this_thread::sleep_for(300ms); // the group looks for the id every 20 ms
  auto r = receive(600);
  BOOST_TEST(!r.success);
  BOOST_TEST(r.group_broken);
  BOOST_TEST(contains(r.message, "store went away"), r.message);
}

BOOST_FIXTURE_TEST_CASE(a_published_id_without_a_peer_fails_and_breaks_the_group, fixture) {
  BOOST_TEST(join(request(store.port())).success);
  // The trainer publishes its unique id but never joins NCCL itself (or, in CI, there is no GPU
  // or no NCCL): the communicator cannot be made, and the receive says why.
  store.set(model::nccl_unique_id_key("G"), std::vector<uint8_t>(model::nccl_unique_id_bytes, 7));
  auto r = receive(1);
  BOOST_TEST(!r.success);
  BOOST_TEST(r.group_broken);
  BOOST_TEST(!r.message.empty());
  BOOST_TEST(destroy().success);
}

BOOST_FIXTURE_TEST_CASE(a_wrong_sized_id_is_named, fixture) {
  BOOST_TEST(join(request(store.port())).success);
  store.set(model::nccl_unique_id_key("G"), std::vector<uint8_t>(5, 1));
  auto r = receive(2);
  BOOST_TEST(!r.success);
  BOOST_TEST(contains(r.message, "not an NCCL unique id"), r.message);
}

BOOST_FIXTURE_TEST_CASE(an_impossible_shape_breaks_the_group, fixture) {
  BOOST_TEST(join(request(store.port())).success);
  auto r = receive(1, {{"w", dtype::bf16, {-1, 4}}});
  BOOST_TEST(!r.success);
  BOOST_TEST(r.group_broken);
  BOOST_TEST(contains(r.message, "'w'"), r.message);
}

BOOST_FIXTURE_TEST_CASE(joining_a_store_nobody_serves_fails_at_the_deadline, fixture) {
  const int port = store.port();
  store.close_all(); // nothing listens on the port now
  auto started = std::chrono::steady_clock::now();
  auto joined = join(request(port, 0.5));
  BOOST_TEST(!joined.success);
  BOOST_TEST(contains(joined.message, "127.0.0.1:" + std::to_string(port)), joined.message);
  BOOST_TEST(seconds(std::chrono::steady_clock::now() - started).count() < 30.0);
}

BOOST_FIXTURE_TEST_CASE(a_unique_id_join_without_a_peer_fails_with_a_sentence, fixture) {
  auto r = request(0, 1);
  r.master_address.clear();
  r.nccl_unique_id = hex_encode(std::vector<uint8_t>(model::nccl_unique_id_bytes, 3));
  auto joined = join(r);
  BOOST_TEST(!joined.success);
  BOOST_TEST(!joined.message.empty());
}

// timeout_s had no upper bound: 1e300 s converted to the clock's nanoseconds is undefined
// behaviour, in practice a deadline in the past, so the receive failed at once. Clamped to a
// day now, it waits like any long deadline until the destroy cuts it short. A receive's
// non-positive timeout_s means the group's (the weight_updater sends 0 for "none given").
BOOST_FIXTURE_TEST_CASE(huge_timeouts_are_clamped_not_overflowed, fixture) {
  BOOST_TEST(join(request(store.port(), 1e300)).success);
  auto waiting = std::async(std::launch::async, [&] { return receive(1e300); });
  BOOST_TEST((waiting.wait_for(500ms) == std::future_status::timeout)); // still waiting
  auto left = destroy();
  auto r = waiting.get();
  BOOST_TEST(left.success, left.message);
  BOOST_TEST(!r.success);
  BOOST_TEST(contains(r.message, "destroyed while it waited"), r.message);
}

BOOST_FIXTURE_TEST_CASE(a_receive_without_a_positive_timeout_waits_as_long_as_the_group, fixture) {
  BOOST_TEST(join(request(store.port(), 0.3)).success);
  auto started = std::chrono::steady_clock::now();
  auto r = receive(-5);
  BOOST_TEST(!r.success);
  BOOST_TEST(contains(r.message, "has not created its communicator"), r.message);
  BOOST_TEST(seconds(std::chrono::steady_clock::now() - started).count() < 30.0);
}

// Through the weight_updater, which the in-process API reaches without the JSON codec (that
// refuses these): a timeout_s of update_weights_from_distributed that is not a positive number
// is refused naming it, and the broadcast is still received and dropped so that the group stays
// in step with the trainer. A CPU runner stands in for a GPU one (its manifest says cuda:0):
// the updater joins through the fake store on the CPU, and an update of no tensors receives
// without NCCL.
BOOST_FIXTURE_TEST_CASE(a_non_positive_timeout_of_a_distributed_update_is_refused, fixture) {
  const auto dir = test::tiny_model("weight-group-updater", 5);
  std::shared_ptr<model::qwen3_model> model = test::load_model(dir);
  runner_options ro;
  ro.model_path = dir;
  auto runner = spawn_cpu_runner(sys, ro, model);
  caf::scoped_actor self{sys};
  RunnerManifest manifest;
  self->request(runner, caf::infinite, manifest_atom_v)
    .receive([&](RunnerManifest& m) { manifest = std::move(m); },
             [&](caf::error& e) { BOOST_FAIL(sys.render(e)); });
  manifest.device = "cuda:0";
  manifest.capabilities.weight_update_groups = true;
  manifest.capabilities.device_tensors = true;
  auto updater = spawn_weight_updater(sys, {{runner, manifest}}, "0");
  auto ask_updater = [&](auto msg, auto out) {
    self->request(updater, caf::infinite, std::move(msg))
      .receive([&](decltype(out)& o) { out = std::move(o); },
               [&](caf::error& e) { out.message = "CAF error: " + sys.render(e); });
    return out;
  };
  auto joined = ask_updater(request(store.port(), 5), InitWeightsUpdateGroupReqOutput{});
  BOOST_REQUIRE_MESSAGE(joined.success, joined.message);
  for (double t : {-1.0, 0.0, std::nan("")}) {
    UpdateWeightsFromDistributedReqInput req;
    req.group_name = "G";
    req.timeout_s = t;
    auto out = ask_updater(req, UpdateWeightsFromDistributedReqOutput{});
    BOOST_TEST(!out.success);
    BOOST_TEST(contains(out.message, "timeout_s: "), out.message);
    BOOST_TEST(contains(out.message, "is not a number of seconds > 0"), out.message);
    BOOST_TEST(contains(out.message, "stays in step with the trainer"), out.message);
  }
  // The group is still there (a refusal does not break it): destroying it succeeds.
  auto left = ask_updater(DestroyWeightsUpdateGroupReqInput{"G"}, DestroyWeightsUpdateGroupReqOutput{});
  BOOST_TEST(left.success, left.message);
  caf::anon_send_exit(updater, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(runner, caf::exit_reason::user_shutdown);
}

BOOST_AUTO_TEST_SUITE_END()
