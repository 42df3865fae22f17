// The network front on real loopback sockets in front of a real engine (tiny model): the
// protocol, bad input and every limit of docs/protocol.md, auth levels, HTTP routes, and what a
// disconnecting client leaves behind (nothing: its requests are aborted, its session is
// aborted and the old weights serve).
#include "tests/net/net_test_support.hpp"

#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include "net/metrics.hpp"

using namespace rlserve;
using namespace rlserve::test;
using net::json;
using net::server_message;
namespace http = boost::beast::http;

namespace {

// The tiny model's final norm (64 bf16 values), with every value set to `value` (bf16 bits).
NamedTensor norm_tensor(uint16_t bits) {
  std::vector<uint16_t> v(64, bits);
  return {"model.norm.weight",
          HostTensor::copy_of(dtype::bf16, {64},
                              {reinterpret_cast<const std::byte*>(v.data()), v.size() * 2})};
}

std::string role_checksum(Engine& e) {
  auto out = e.check_weights({});
  BOOST_REQUIRE_MESSAGE(out.success, out.message);
  return to_json(out).dump();
}

bool idle(Engine& e) {
  auto info = e.get_server_info();
  return info.running_requests == 0 && info.waiting_requests == 0;
}

} // namespace

BOOST_AUTO_TEST_SUITE(server_sim_test)

BOOST_AUTO_TEST_CASE(generate_streams_and_multiplexes_by_client_id) {
  served_engine s;
  auto c = s.connect();
  auto reference = s.engine->generate(greedy_ids({1, 2, 3}, 8));
  BOOST_REQUIRE(reference.success);

  // Streamed: the chunks' text and ids add up to the final message.
  std::string streamed;
  std::vector<int32_t> ids;
  auto out = c->generate(greedy_ids({1, 2, 3}, 8), [&](const GenerateReqOutput& chunk) {
    streamed += chunk.text;
    ids.insert(ids.end(), chunk.output_ids.begin(), chunk.output_ids.end());
  });
  BOOST_REQUIRE_MESSAGE(out.has_value(), out.error());
  BOOST_TEST(out->success);
  BOOST_TEST(out->output_ids == reference.output_ids);
  BOOST_TEST(ids == reference.output_ids);
  BOOST_TEST(streamed == out->text);

  // Two requests with string ids in flight at once: every chunk and the final reply carry the
  // id they belong to; each request ends exactly once.
  auto a = greedy_ids({1, 2, 3}, 8);
  a.stream = true;
  auto b = greedy_ids({4, 5}, 5);
  b.stream = true;
  BOOST_REQUIRE(c->send_with_id("a", "generate", to_json(a)));
  BOOST_REQUIRE(c->send_with_id("b", "generate", to_json(b)));
  std::map<std::string, int> finals;
  std::map<std::string, std::vector<int32_t>> chunk_ids;
  while (finals.size() < 2) {
    auto m = c->receive();
    BOOST_REQUIRE_MESSAGE(m.has_value(), m.error());
    BOOST_REQUIRE(m->kind != server_message::error);
    auto key = m->id.get<std::string>();
    BOOST_TEST(finals.count(key) == 0u); // nothing after the final message
    auto body = from_json<GenerateReqOutput>(m->body);
    BOOST_REQUIRE(body.has_value());
    if (m->kind == server_message::chunk)
      chunk_ids[key].insert(chunk_ids[key].end(), body->output_ids.begin(), body->output_ids.end());
    else {
      ++finals[key];
      BOOST_TEST(body->output_ids == chunk_ids[key]);
    }
  }
  BOOST_TEST(chunk_ids["a"] == reference.output_ids);
  BOOST_TEST(chunk_ids["b"].size() == 5u);

  // cancel: the request ends with finish reason abort, and its final message still comes.
  auto long_req = greedy_ids({1, 2}, 1500);
  long_req.stream = true;
  BOOST_REQUIRE(c->send_with_id("long", "generate", to_json(long_req)));
  auto first = c->receive();
  BOOST_REQUIRE(first.has_value());
  auto cancelled = c->call("cancel", {{"id", "long"}});
  BOOST_REQUIRE_MESSAGE(cancelled.has_value(), cancelled.error());
  BOOST_TEST(cancelled->ok);
  auto final_long = c->wait_for("long");
  BOOST_REQUIRE_MESSAGE(final_long.has_value(), final_long.error());
  auto ended = from_json<GenerateReqOutput>(final_long->body);
  BOOST_REQUIRE(ended.has_value());
  BOOST_TEST(ended->finish_reason.has_value());
  BOOST_TEST(ended->finish_reason->type == "abort");
  BOOST_TEST(ended->completion_tokens < 1500);
}

BOOST_AUTO_TEST_CASE(bad_input_is_an_error_message_and_the_connection_lives_on) {
  served_engine s;
  auto c = s.connect();
  auto expect_error = [&](const std::string& text, const std::string& code, const std::string& words) {
    BOOST_REQUIRE(c->send_raw({reinterpret_cast<const std::byte*>(text.data()), text.size()}, false));
    auto m = c->receive();
    BOOST_REQUIRE_MESSAGE(m.has_value(), m.error());
    BOOST_TEST(m->kind == server_message::error);
    BOOST_TEST(m->code == code);
    BOOST_TEST_MESSAGE(code << ": " << m->message);
    BOOST_TEST(m->message.find(words) != std::string::npos, m->message);
    return *m;
  };
  auto m = expect_error("{\"id\": 1, \"type\": ", "bad_json", "invalid JSON");
  BOOST_TEST(m.id == json(1)); // read before the text broke off (error_id_sim_test has the rest)
  m = expect_error("{\"type\": ", "bad_json", "this reply carries no id");
  BOOST_TEST(m.id.is_null());
  m = expect_error(R"({"id": 2, "type": "generat", "body": {}})", "unknown_type", "generate");
  BOOST_TEST(m.id == json(2));
  expect_error(R"({"id": 3, "type": "generate", "body": {"text": "x", "sampling_params": {"max_tokens": 3}}})",
               "bad_request", "max_tokens");
  expect_error(R"({"type": "generate", "body": {}})", "bad_request", "id");
  expect_error(R"({"id": 4, "type": "generate", "body": [1]})", "bad_request", "body");
  expect_error(R"({"id": 5, "type": "pause_generation", "body": {"mode": "sideways"}})", "bad_request",
               "mode");
  // A binary frame that is not what it says.
  std::vector<std::byte> junk(16, std::byte{0xff});
  BOOST_REQUIRE(c->send_raw(junk, true));
  auto j = c->receive();
  BOOST_REQUIRE(j.has_value());
  BOOST_TEST(j->code == "bad_frame");
  // A duplicate id while the first is in flight.
  auto slow = greedy_ids({1}, 200);
  BOOST_REQUIRE(c->send_with_id(9, "generate", to_json(slow)));
  BOOST_REQUIRE(c->send_with_id(9, "generate", to_json(slow)));
  auto dup = c->receive();
  BOOST_REQUIRE(dup.has_value());
  BOOST_TEST(dup->code == "duplicate_id");
  // ...and the connection still serves.
  auto ping = c->call("ping", {{"x", 1}});
  BOOST_REQUIRE_MESSAGE(ping.has_value(), ping.error());
  BOOST_TEST(ping->body == json({{"x", 1}}));
  auto info = c->call<GetServerInfoReqOutput>("get_server_info", GetServerInfoReqInput{});
  BOOST_REQUIRE(info.has_value());
  BOOST_TEST(info->model_path == tiny_model_dir().string());
}

BOOST_AUTO_TEST_CASE(auth_levels_and_no_fallback_to_the_normal_key) {
  net::server_options o;
  o.keys = {"user-key", "admin-key"};
  served_engine s(o);
  // No key, a wrong key: the upgrade is refused.
  BOOST_TEST(!net::client::connect(s.client_opts()).has_value());
  auto wrong = net::client::connect(s.client_opts("nope"));
  BOOST_REQUIRE(!wrong.has_value());
  BOOST_TEST(wrong.error().find("401") != std::string::npos, wrong.error());
  BOOST_TEST(wrong.error().find("user-key") == std::string::npos);
  // The normal key generates but cannot pause.
  auto user = s.connect("user-key");
  auto g = user->generate(greedy_ids({1, 2}, 2));
  BOOST_REQUIRE_MESSAGE(g.has_value(), g.error());
  auto p = user->call("pause_generation", {{"mode", "retract"}});
  BOOST_REQUIRE(!p.has_value());
  BOOST_TEST(p.error().find("unauthorized") == 0u, p.error());
  BOOST_TEST(p.error().find("admin-key") == std::string::npos);
  // The admin key does both.
  auto admin = s.connect({}, "admin-key");
  BOOST_TEST(admin->generate(greedy_ids({1, 2}, 2)).has_value());
  auto ok = admin->call<PauseGenerationReqOutput>("pause_generation", PauseGenerationReqInput{pause_mode::retract});
  BOOST_REQUIRE_MESSAGE(ok.has_value(), ok.error());
  BOOST_TEST(ok->success);
  BOOST_TEST(admin->call("continue_generation", json::object()).has_value());

  // HTTP: the same levels; health and metrics need no key (probes send none).
  BOOST_TEST(http_request(s.port(), http::verb::get, "/health").status == 200u);
  BOOST_TEST(http_request(s.port(), http::verb::get, "/metrics").status == 200u);
  BOOST_TEST(http_request(s.port(), http::verb::get, "/get_server_info").status == 401u);
  BOOST_TEST(http_request(s.port(), http::verb::get, "/health", {}, {{"Authorization", "Bearer user-key"}}).status ==
             200u);
  auto refused = http_request(s.port(), http::verb::post, "/pause_generation", "{}",
                              {{"Authorization", "Bearer user-key"}});
  BOOST_TEST(refused.status == 401u);
  BOOST_TEST(refused.body.find("user-key") == std::string::npos);
  BOOST_TEST(http_request(s.port(), http::verb::post, "/flush_cache", "{}", {{"x-api-key", "admin-key"}}).status ==
             200u);

  // Only the normal key configured: it opens admin routes too (SGLang's rule: miles polls
  // GET /flush_cache with it at start-up); no key or another key is still refused.
  s.server->stop();
  net::server_options only_user;
  only_user.keys = {"user-key", ""};
  only_user.port = 0;
  auto srv = net::server::start(*s.engine, only_user);
  BOOST_REQUIRE(srv.has_value());
  auto port = (*srv)->port();
  auto f = http_request(port, http::verb::get, "/flush_cache", {}, {{"Authorization", "Bearer user-key"}});
  BOOST_TEST(f.status == 200u, f.body);
  auto nokey = http_request(port, http::verb::post, "/pause_generation", "{}");
  BOOST_TEST(nokey.status == 401u);
  auto other = http_request(port, http::verb::post, "/pause_generation", "{}", {{"Authorization", "Bearer admin-key"}});
  BOOST_TEST(other.status == 401u);
  BOOST_TEST(other.body.find("Unauthorized") != std::string::npos);
  auto co = s.client_opts("user-key");
  co.port = port;
  auto u = net::client::connect(co);
  BOOST_REQUIRE(u.has_value());
  auto fw = (*u)->call<BeginWeightUpdateReqOutput>("begin_weight_update", BeginWeightUpdateReqInput{});
  BOOST_REQUIRE_MESSAGE(fw.has_value(), fw.error());
  BOOST_TEST(fw->success, fw->message);
  auto ended = (*u)->call<EndWeightUpdateReqOutput>("end_weight_update", EndWeightUpdateReqInput{});
  BOOST_REQUIRE_MESSAGE(ended.has_value(), ended.error());
  // Nothing secret in any info response.
  auto info = http_request(port, http::verb::get, "/get_server_info", {}, {{"Authorization", "Bearer user-key"}});
  BOOST_TEST(info.status == 200u);
  BOOST_TEST(info.body.find("user-key") == std::string::npos);
  auto metrics = http_request(port, http::verb::get, "/metrics", {}, {{"Authorization", "Bearer user-key"}});
  BOOST_TEST(metrics.body.find("user-key") == std::string::npos);
  (*srv)->stop();
}

BOOST_AUTO_TEST_CASE(frame_body_and_in_flight_limits) {
  net::server_options o;
  o.max_message_bytes = 64 * 1024;
  o.max_inflight_per_connection = 2;
  served_engine s(o);
  auto c = s.connect();
  // Just over the limit, so the whole frame usually sits in the socket buffers before the
  // server reads its header and closes; when the close beats the write, the write fails instead.
  std::string big = R"({"id": 1, "type": "ping", "body": {"pad": ")" + std::string(70 * 1024, 'x') + "\"}}";
  if (c->send_raw({reinterpret_cast<const std::byte*>(big.data()), big.size()}, false)) {
    auto m = c->receive();
    BOOST_REQUIRE(!m.has_value());
    BOOST_TEST_MESSAGE("after the oversized frame: " << m.error());
    if (c->close_code() != 0)
      BOOST_TEST(c->close_code() == 1009); // message too big
  }
  BOOST_TEST(eventually([&] {
    return s.server->stats().render(nullptr).find("code=\"too_large\"} 1") != std::string::npos;
  }));
  auto h = http_request(s.port(), http::verb::post, "/generate", big);
  BOOST_TEST(h.status == 413u);
  // Under the limit all is well.
  auto c2 = s.connect();
  BOOST_TEST(c2->call("ping", {{"pad", std::string(1000, 'x')}}).has_value());
  // Requests in flight per connection (2 here): the third is refused, the two run on.
  auto long_req = greedy_ids({1, 2}, 1500);
  BOOST_REQUIRE(c2->send_with_id("one", "generate", to_json(long_req)));
  BOOST_REQUIRE(c2->send_with_id("two", "generate", to_json(long_req)));
  BOOST_REQUIRE(c2->send_with_id("three", "generate", to_json(long_req)));
  auto third = c2->wait_for("three");
  BOOST_REQUIRE(!third.has_value());
  BOOST_TEST(third.error().find("too_many_requests") == 0u, third.error());
  BOOST_TEST(c2->call("cancel", {{"id", "one"}}).has_value());
  BOOST_TEST(c2->call("cancel", {{"id", "two"}}).has_value());
  BOOST_TEST(c2->wait_for("one").has_value());
  BOOST_TEST(c2->wait_for("two").has_value());
}

BOOST_AUTO_TEST_CASE(tensor_bytes_per_session_limit) {
  net::server_options o;
  o.max_session_tensor_bytes = 200; // one norm tensor (128 bytes) fits, two do not
  served_engine s(o);
  auto before = role_checksum(*s.engine);
  auto c = s.connect();
  BOOST_REQUIRE(c->call("begin_weight_update", json::object()).has_value());
  UpdateWeightsFromTensorReqInput bucket;
  bucket.named_tensors = {norm_tensor(0x3f80)};
  auto first = c->update_weights_from_tensor(bucket);
  BOOST_REQUIRE_MESSAGE(first.has_value(), first.error());
  BOOST_TEST(first->success, first->message);
  auto second = c->update_weights_from_tensor(bucket);
  BOOST_REQUIRE(!second.has_value());
  BOOST_TEST(second.error().find("too_large") == 0u, second.error());
  auto end = c->call<EndWeightUpdateReqOutput>("end_weight_update", EndWeightUpdateReqInput{.weight_version = std::nullopt, .abort = true});
  BOOST_REQUIRE(end.has_value());
  BOOST_TEST(role_checksum(*s.engine) == before);
  // A new session has its own budget.
  BOOST_REQUIRE(c->call("begin_weight_update", json::object()).has_value());
  auto again = c->update_weights_from_tensor(bucket);
  BOOST_REQUIRE_MESSAGE(again.has_value(), again.error());
  BOOST_TEST(c->call("end_weight_update", json::object()).has_value());
  BOOST_TEST(s.engine->get_server_info().weight_version == "1");
}

BOOST_AUTO_TEST_CASE(pipelined_binary_frames_meet_backpressure_not_deadlock) {
  net::server_options o;
  o.max_unanswered_bytes_per_connection = 256 * 1024; // each frame below passes it alone
  served_engine s(o);
  auto c = s.connect();
  std::vector<std::byte> bytes(300 * 1024, std::byte{7});
  UpdateWeightsFromTensorReqInput req;
  req.named_tensors = {{"bench.payload", HostTensor::copy_of(dtype::u8, {static_cast<int64_t>(bytes.size())}, bytes)}};
  std::vector<int64_t> ids;
  for (int i = 0; i < 4; ++i) {
    auto id = c->send_tensors(req);
    BOOST_REQUIRE_MESSAGE(id.has_value(), id.error());
    ids.push_back(*id);
  }
  // Every frame is answered (no session is open, so each is refused), one at a time as the
  // server reads the next only after the previous one's reply.
  for (auto id : ids) {
    auto m = c->wait_for(id);
    BOOST_REQUIRE_MESSAGE(m.has_value(), m.error());
    BOOST_TEST(!m->ok);
  }
  BOOST_TEST(s.server->stats().render(nullptr).find("rlserve_ws_reads_paused_total 0") == std::string::npos);
  BOOST_TEST(c->call("ping", json::object()).has_value());
}

BOOST_AUTO_TEST_CASE(idle_and_slow_clients_are_disconnected) {
  net::server_options o;
  o.idle_timeout = std::chrono::milliseconds(600);
  o.request_timeout = std::chrono::milliseconds(600);
  o.max_queued_bytes_per_connection = 256 * 1024;
  served_engine s(o);

  // Idle websocket: it neither reads (so answers no ping) nor writes.
  auto idle_client = s.connect();
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  auto r = idle_client->receive();
  BOOST_TEST(!r.has_value());

  // A slow HTTP client: half a request line, then silence.
  {
    boost::asio::io_context ioc;
    boost::asio::ip::tcp::socket sock(ioc);
    sock.connect({boost::asio::ip::make_address("127.0.0.1"), s.port()});
    boost::asio::write(sock, boost::asio::buffer(std::string("GET /heal")));
    auto t0 = std::chrono::steady_clock::now();
    char buf[256];
    boost::system::error_code ec;
    sock.read_some(boost::asio::buffer(buf), ec);
    BOOST_TEST(ec == boost::asio::error::eof);
    BOOST_TEST((std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)));
  }

  // A client that sends but never reads: its replies pile up past the limit and it is dropped.
  auto slow = s.connect();
  std::string pad(64 * 1024, 'y');
  bool dropped = false;
  for (int i = 0; i < 400 && !dropped; ++i)
    dropped = !slow->send("ping", {{"pad", pad}}).has_value();
  for (int i = 0; i < 1000 && !dropped; ++i)
    dropped = !slow->receive().has_value();
  BOOST_TEST(dropped);
  BOOST_TEST(s.server->stats().render(nullptr).find("code=\"slow_client\"") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(disconnect_mid_stream_aborts_and_frees_kv) {
  // A KV pool of 2048 tokens: the request below needs three quarters of it, so a second one as
  // long runs only once the first one's blocks are free.
  engine_config cfg;
  cfg.kv_cache_tokens = 2048;
  served_engine s({}, cfg);
  auto aborted = [&](int n) {
    return s.server->stats().render(nullptr).find("rlserve_generate_finished_total{reason=\"abort\"} " +
                                                  std::to_string(n)) != std::string::npos;
  };
  {
    auto c = s.connect();
    auto long_req = greedy_ids({1, 2, 3}, 1500);
    long_req.stream = true;
    BOOST_REQUIRE(c->send("generate", to_json(long_req)).has_value());
    auto first = c->receive(); // the first chunk: it runs
    BOOST_REQUIRE(first.has_value());
    BOOST_TEST(first->kind == server_message::chunk);
  } // the client goes away without a close frame
  // It ends by abort (not by running to its length) and the engine is idle.
  BOOST_TEST(eventually([&] { return aborted(1); }, std::chrono::seconds(5)));
  BOOST_TEST(eventually([&] { return idle(*s.engine); }, std::chrono::seconds(5)));
  BOOST_TEST(s.server->stats().render(nullptr).find("action=\"abort_request\"} 1") != std::string::npos);
  // Its KV is free: a request as long runs to its end.
  auto out = s.engine->generate(greedy_ids({4, 5, 6}, 1500));
  BOOST_TEST(out.success, out.message);
  BOOST_TEST(out.completion_tokens == 1500);

  // The same over HTTP: an event stream whose reader hangs up.
  {
    boost::asio::io_context ioc;
    boost::asio::ip::tcp::socket sock(ioc);
    sock.connect({boost::asio::ip::make_address("127.0.0.1"), s.port()});
    auto body = to_json(greedy_ids({7, 8}, 1500));
    body["stream"] = true;
    std::string text = body.dump();
    std::string req = "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                      std::to_string(text.size()) + "\r\n\r\n" + text;
    boost::asio::write(sock, boost::asio::buffer(req));
    char buf[512];
    auto n = sock.read_some(boost::asio::buffer(buf));
    BOOST_TEST(std::string(buf, n).find("text/event-stream") != std::string::npos);
  }
  BOOST_TEST(eventually([&] { return aborted(2); }, std::chrono::seconds(5)));
  BOOST_TEST(eventually([&] { return idle(*s.engine); }, std::chrono::seconds(5)));
}

BOOST_AUTO_TEST_CASE(disconnect_mid_session_aborts_it_and_old_weights_serve) {
  net::server_options o;
  o.resume_on_disconnect = true;
  served_engine s(o);
  auto before_out = s.engine->generate(greedy_ids({1, 2, 3}, 8));
  auto before_sum = role_checksum(*s.engine);
  {
    auto c = s.connect();
    auto b = c->call<BeginWeightUpdateReqOutput>("begin_weight_update", BeginWeightUpdateReqInput{});
    BOOST_REQUIRE(b.has_value() && b->success);
    UpdateWeightsFromTensorReqInput bucket;
    bucket.named_tensors = {norm_tensor(0x4000)}; // 2.0 everywhere: a different model
    auto u = c->update_weights_from_tensor(bucket);
    BOOST_REQUIRE_MESSAGE((u.has_value() && u->success), (u.has_value() ? u->message : u.error()));
    BOOST_TEST(s.engine->get_server_info().weight_update_session_open);
  } // gone without end_weight_update
  BOOST_TEST(eventually([&] { return !s.engine->get_server_info().weight_update_session_open; }));
  auto info = s.engine->get_server_info();
  BOOST_TEST(info.weight_version == "0");
  BOOST_TEST(role_checksum(*s.engine) == before_sum);
  auto after_out = s.engine->generate(greedy_ids({1, 2, 3}, 8));
  BOOST_TEST(after_out.output_ids == before_out.output_ids);
  // With resume_on_disconnect, a client that paused and vanished does not leave generation
  // paused.
  {
    auto c = s.connect();
    BOOST_REQUIRE(c->call("pause_generation", {{"mode", "in_place"}}).has_value());
  }
  BOOST_TEST(eventually([&] { return !s.engine->get_server_info().paused; }));
  auto m = s.server->stats().render(nullptr);
  BOOST_TEST(m.find("action=\"abort_session\"} 1") != std::string::npos, m);
  BOOST_TEST(m.find("result=\"aborted\"} 1") != std::string::npos, m);
}

// The trainer's connection drops after step n = 0, 1, 2, ... of its cycle;
// every time the engine ends unlocked and unpaused, on the old weights unless end was answered.
BOOST_AUTO_TEST_CASE(connection_dropped_at_every_step_of_an_update) {
  net::server_options o;
  o.resume_on_disconnect = true;
  served_engine s(o);
  const std::vector<std::pair<std::string, json>> steps = {
    {"pause_generation", {{"mode", "retract"}}}, {"begin_weight_update", json::object()},
    {"update_weights_from_tensor", json::object()}, {"end_weight_update", json::object()},
    {"continue_generation", json::object()}};
  for (std::size_t n = 0; n <= steps.size(); ++n) {
    auto version_before = s.engine->get_server_info().weight_version;
    auto sum_before = role_checksum(*s.engine);
    {
      auto c = s.connect();
      for (std::size_t i = 0; i < n; ++i) {
        if (steps[i].first == "update_weights_from_tensor") {
          UpdateWeightsFromTensorReqInput bucket;
          bucket.named_tensors = {norm_tensor(static_cast<uint16_t>(0x3f80 + n))};
          auto u = c->update_weights_from_tensor(bucket);
          BOOST_REQUIRE_MESSAGE((u.has_value() && u->success), (u.has_value() ? u->message : u.error()));
        } else {
          auto m = c->call(steps[i].first, steps[i].second);
          BOOST_REQUIRE_MESSAGE((m.has_value() && m->ok), steps[i].first);
        }
      }
    } // dropped here, after n steps
    BOOST_TEST_CONTEXT("dropped after " << n << " steps") {
      BOOST_TEST(eventually([&] {
        auto info = s.engine->get_server_info();
        return !info.weight_update_session_open && !info.paused;
      }));
      bool committed = n >= 4; // end_weight_update was answered
      BOOST_TEST((s.engine->get_server_info().weight_version != version_before) == committed);
      BOOST_TEST((role_checksum(*s.engine) != sum_before) == committed);
      auto g = s.engine->generate(greedy_ids({1, 2}, 2)); // not stuck behind a lock or a pause
      BOOST_TEST(g.success, g.message);
    }
  }
}

BOOST_AUTO_TEST_CASE(http_routes_in_sglang_shapes) {
  served_engine s;
  auto health = http_request(s.port(), http::verb::get, "/health");
  BOOST_TEST(health.status == 200u);
  auto gen = http_request(s.port(), http::verb::post, "/generate",
                          R"({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4, "temperature": 0,
                              "ignore_eos": true}})");
  BOOST_REQUIRE_EQUAL(gen.status, 200u);
  auto g = json::parse(gen.body);
  BOOST_TEST(g["output_ids"].size() == 4u);
  BOOST_TEST(g["meta_info"]["weight_version"] == "0");
  // Streamed: server-sent events, each the whole result so far, then [DONE].
  auto sse = http_request(s.port(), http::verb::post, "/generate",
                          R"({"input_ids": [1, 2, 3], "stream": true, "sampling_params": {"max_new_tokens": 4,
                              "temperature": 0, "ignore_eos": true}})");
  BOOST_TEST(sse.status == 200u);
  BOOST_TEST(sse.content_type == "text/event-stream");
  BOOST_TEST(sse.body.ends_with("data: [DONE]\n\n"));
  auto last = sse.body.rfind("data: {");
  BOOST_REQUIRE(last != std::string::npos);
  auto last_event = json::parse(sse.body.substr(last + 6, sse.body.find("\n\n", last) - last - 6));
  BOOST_TEST(last_event["output_ids"] == g["output_ids"]);
  // Control routes.
  auto pause = http_request(s.port(), http::verb::post, "/pause_generation", R"({"mode": "retract"})");
  BOOST_TEST(pause.status == 200u);
  BOOST_TEST(json::parse(pause.body)["status"] == "ok");
  auto resume = http_request(s.port(), http::verb::post, "/continue_generation", "{}");
  BOOST_TEST(resume.status == 200u);
  auto flush = http_request(s.port(), http::verb::get, "/flush_cache?timeout=1");
  BOOST_TEST(flush.status == 200u);
  auto end = http_request(s.port(), http::verb::post, "/end_weight_update", "{}");
  BOOST_TEST(end.status == 400u); // no session: SGLang's failure shape
  BOOST_TEST(json::parse(end.body)["success"] == false);
  auto check = http_request(s.port(), http::verb::post, "/weights_checker", R"({"action": "checksum"})");
  BOOST_TEST(check.status == 200u);
  auto checked = json::parse(check.body);
  BOOST_TEST(checked["success"] == true);
  BOOST_TEST(checked["ranks"].size() == 1u); // SGLang's name for the per-GPU list
  BOOST_TEST(checked["ranks"][0]["checksums"].size() > 0u);
  BOOST_TEST(checked["per_engine_checksum"].get<std::string>().size() == 16u);
  auto version = http_request(s.port(), http::verb::get, "/get_weight_version");
  BOOST_TEST(json::parse(version.body) == json({{"weight_version", "0"}}));
  auto loads = http_request(s.port(), http::verb::get, "/v1/loads?include=core");
  BOOST_TEST(loads.status == 200u);
  BOOST_TEST(json::parse(loads.body)["loads"][0]["num_total_reqs"] == 0);
  auto model = http_request(s.port(), http::verb::get, "/model_info");
  BOOST_TEST(json::parse(model.body)["weight_version"] == "0");
  BOOST_TEST(http_request(s.port(), http::verb::get, "/no_such_route").status == 404u);
  BOOST_TEST(http_request(s.port(), http::verb::get, "/generate").status == 405u);
  auto bad = http_request(s.port(), http::verb::post, "/generate", "{\"text\": ");
  BOOST_TEST(bad.status == 400u);
  auto metrics = http_request(s.port(), http::verb::get, "/metrics");
  BOOST_TEST(metrics.status == 200u);
  for (const char* name : {"rlserve_requests_total", "rlserve_prompt_tokens_total", "rlserve_completion_tokens_total",
                           "rlserve_queue_depth", "rlserve_running_requests", "rlserve_update_phase_seconds",
                           "rlserve_weight_version_info{version=\"0\"}"})
    BOOST_TEST(metrics.body.find(name) != std::string::npos, name);
}

BOOST_AUTO_TEST_SUITE_END()
