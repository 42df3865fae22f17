// Bounded load on loopback: 64 websocket connections × 50 generate requests each,
// four in flight per connection, half of them streamed, with a whole weight-update session
// (pause → begin → binary tensor update → end → continue) in the middle — once per pause mode.
// Every request must end exactly once (no reply lost, none duplicated, no chunk after its
// final message); p50 and p99 latency are reported.
#include "tests/net/net_test_support.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>

#include <fmt/format.h>

using namespace rlserve;
using namespace rlserve::test;
using net::json;
using net::server_message;

namespace {

constexpr int k_connections = 64;
constexpr int k_requests_per_connection = 50;
constexpr int k_window = 4; // requests in flight per connection

struct connection_result {
  std::vector<double> latencies_s;
  int finished = 0;
  int aborted = 0;
  std::vector<std::string> problems;
  std::set<std::string> versions;
};

connection_result drive_connection(const served_engine& s, int conn, std::atomic<int>& finished_total) {
  connection_result r;
  auto c = net::client::connect(s.client_opts());
  if (!c) {
    r.problems.push_back("connect: " + c.error());
    return r;
  }
  using clock = std::chrono::steady_clock;
  std::map<int64_t, clock::time_point> in_flight;
  std::set<int64_t> done;
  int next = 0;
  auto send_next = [&] {
    auto req = greedy_ids({1 + conn % 97, 2 + next % 89, 3}, 4);
    req.stream = next % 2 == 0;
    auto id = (*c)->send("generate", to_json(req));
    if (!id) {
      r.problems.push_back("send: " + id.error());
      return false;
    }
    in_flight[*id] = clock::now();
    ++next;
    return true;
  };
  while (next < k_window && send_next()) {
  }
  while (!in_flight.empty()) {
    auto m = (*c)->receive();
    if (!m) {
      r.problems.push_back("receive: " + m.error());
      break;
    }
    if (!m->id.is_number_integer()) {
      r.problems.push_back("a message without a request id: " + m->message);
      continue;
    }
    auto id = m->id.get<int64_t>();
    if (done.count(id)) {
      r.problems.push_back("a message for request " + std::to_string(id) + " after its final message");
      continue;
    }
    auto it = in_flight.find(id);
    if (it == in_flight.end()) {
      r.problems.push_back("a message for unknown request " + std::to_string(id));
      continue;
    }
    if (m->kind == server_message::chunk)
      continue;
    if (m->kind == server_message::error) {
      r.problems.push_back("request " + std::to_string(id) + ": " + m->code + ": " + m->message);
    } else {
      auto out = from_json<GenerateReqOutput>(m->body);
      if (!out || !out->success) {
        r.problems.push_back("request " + std::to_string(id) + " failed: " + (out ? out->message : out.error()));
      } else {
        r.versions.insert(out->weight_version);
        if (out->finish_reason && out->finish_reason->type == "abort")
          ++r.aborted;
      }
    }
    r.latencies_s.push_back(std::chrono::duration<double>(clock::now() - it->second).count());
    in_flight.erase(it);
    done.insert(id);
    ++r.finished;
    ++finished_total;
    if (next < k_requests_per_connection)
      send_next();
  }
  (*c)->close();
  return r;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  auto i = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

void run_load(pause_mode mode) {
  served_engine s;
  constexpr int total = k_connections * k_requests_per_connection;
  std::atomic<int> finished{0};
  std::vector<connection_result> results(k_connections);
  std::vector<std::thread> threads;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < k_connections; ++i)
    threads.emplace_back([&, i] { results[i] = drive_connection(s, i, finished); });

  // The trainer, on its own admin connection, once half of the requests have ended.
  std::string update_problem;
  std::thread trainer([&] {
    while (finished < total / 2)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    auto c = net::client::connect(s.client_opts());
    if (!c) {
      update_problem = c.error();
      return;
    }
    auto step = [&](const char* route, const json& body) {
      auto m = (*c)->call(route, body);
      if (!m || !m->ok)
        update_problem += std::string(route) + ": " + (m ? m->body.dump() : m.error()) + "\n";
    };
    step("pause_generation", {{"mode", std::string(to_string(mode))}});
    step("begin_weight_update", json::object());
    std::vector<uint16_t> ones(64, 0x3f80);
    UpdateWeightsFromTensorReqInput bucket;
    bucket.named_tensors = {{"model.norm.weight",
                             HostTensor::copy_of(dtype::bf16, {64},
                                                 {reinterpret_cast<const std::byte*>(ones.data()), 128})}};
    auto u = (*c)->update_weights_from_tensor(bucket);
    if (!u || !u->success)
      update_problem += "update: " + (u ? u->message : u.error()) + "\n";
    step("end_weight_update", {{"weight_version", "after"}});
    step("continue_generation", json::object());
    (*c)->close();
  });
  for (auto& t : threads)
    t.join();
  trainer.join();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  BOOST_TEST(update_problem.empty(), update_problem);
  std::vector<double> all;
  int ended = 0, aborted = 0;
  std::set<std::string> versions;
  for (const auto& r : results) {
    for (const auto& p : r.problems)
      BOOST_ERROR(p);
    all.insert(all.end(), r.latencies_s.begin(), r.latencies_s.end());
    ended += r.finished;
    aborted += r.aborted;
    versions.insert(r.versions.begin(), r.versions.end());
  }
  BOOST_TEST(ended == total);
  BOOST_TEST(versions.count("0") == 1u);
  BOOST_TEST(versions.count("after") == 1u);
  BOOST_TEST(s.engine->get_server_info().weight_version == "after");
  auto line = fmt::format("load ({}): {} connections x {} requests in {:.2f} s ({:.0f} req/s); latency p50 "
                          "{:.1f} ms, p99 {:.1f} ms; {} ended by the abort pause",
                          to_string(mode), k_connections, k_requests_per_connection, seconds, total / seconds,
                          percentile(all, 0.5) * 1e3, percentile(all, 0.99) * 1e3, aborted);
  BOOST_TEST_MESSAGE(line);
  std::printf("%s\n", line.c_str());
}

} // namespace

BOOST_AUTO_TEST_SUITE(load_sim_test)

BOOST_AUTO_TEST_CASE(pause_abort) { run_load(pause_mode::abort); }
BOOST_AUTO_TEST_CASE(pause_retract) { run_load(pause_mode::retract); }
BOOST_AUTO_TEST_CASE(pause_in_place) { run_load(pause_mode::in_place); }

BOOST_AUTO_TEST_SUITE_END()
