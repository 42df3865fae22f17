// Regression tests for what a careless trainer or a hostile client could do to the server when
// it was probed: each case is one defect found then, driven through real sockets against a real
// engine (tiny model). The engine must answer with an error naming what is wrong, keep every
// other client's requests running, and never be left locked, paused or dead.
#include "tests/net/net_test_support.hpp"

#include <atomic>
#include <cstring>
#include <fstream>

#include <sys/stat.h>

#include <boost/asio/write.hpp>

#include "messages/validate.hpp"
#include "model/checkpoint.hpp"
#include "net/metrics.hpp"
#include "net/protocol.hpp"
#include "tests/support/raw_frames.hpp"

using namespace rlserve;
using namespace rlserve::test;
using net::json;
using net::server_message;
namespace http = boost::beast::http;

namespace {

// The tiny model's final norm (64 bf16 values), every value the bf16 `bits`, under `name`.
NamedTensor norm_tensor(uint16_t bits, std::string name = "model.norm.weight") {
  std::vector<uint16_t> v(64, bits);
  return {std::move(name), HostTensor::copy_of(dtype::bf16, {64},
                                               {reinterpret_cast<const std::byte*>(v.data()), v.size() * 2})};
}

GenerateReqOutput final_generate(net::client& c, const json& id) {
  auto m = c.wait_for(id);
  BOOST_REQUIRE_MESSAGE(m.has_value(), (m ? std::string() : m.error()));
  BOOST_REQUIRE_MESSAGE(m->kind == server_message::reply, m->message);
  auto out = from_json<GenerateReqOutput>(m->body);
  BOOST_REQUIRE(out.has_value());
  return *out;
}

// A raw exchange on a fresh connection: `bytes` out, everything the server answers until it
// closes (or 10 s pass).
std::string raw_exchange(uint16_t port, const std::string& bytes) {
  namespace beast = boost::beast;
  boost::asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  stream.connect(boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), port));
  stream.expires_after(std::chrono::seconds(10));
  beast::error_code ec;
  boost::asio::write(stream.socket(), boost::asio::buffer(bytes), ec);
  std::string out;
  char buf[4096];
  for (;;) {
    auto n = stream.socket().read_some(boost::asio::buffer(buf), ec);
    out.append(buf, n);
    if (ec)
      break;
  }
  return out;
}

} // namespace

BOOST_AUTO_TEST_SUITE(hardening_sim_test)

// 1e400 made nlohmann throw out_of_range, which killed the connection actor: the websocket
// stopped answering, its disconnect clean-up never ran, and the session it had opened blocked
// every /generate. Over HTTP the request was never answered.
BOOST_AUTO_TEST_CASE(number_outside_double_range_is_an_error_not_a_dead_actor) {
  served_engine s;
  {
    auto c = s.connect();
    auto b = c->call<BeginWeightUpdateReqOutput>("begin_weight_update", BeginWeightUpdateReqInput{});
    BOOST_REQUIRE(b.has_value() && b->success);
    std::string text = R"({"id": 1, "type": "generate", "body": {"input_ids": [1],)"
                       R"( "sampling_params": {"temperature": 1e400}}})";
    BOOST_REQUIRE(c->send_raw(as_bytes(text), false));
    auto m = c->receive();
    BOOST_REQUIRE_MESSAGE(m.has_value(), m.error());
    BOOST_TEST(m->code == "bad_json");
    BOOST_TEST(m->message.find("1e400") != std::string::npos, m->message);
    // The same in a binary frame's header.
    auto frame = binary_frame_with_header(
      R"({"id": 2, "type": "update_weights_from_tensor", "body": {"named_tensors": [], "x": -1e400}})");
    BOOST_REQUIRE(c->send_raw(frame, true));
    m = c->receive();
    BOOST_REQUIRE_MESSAGE(m.has_value(), m.error());
    BOOST_TEST(m->code == "bad_frame");
    BOOST_TEST(m->message.find("1e400") != std::string::npos, m->message);
    // The connection still answers...
    auto ping = c->call("ping", {{"x", 1}});
    BOOST_REQUIRE_MESSAGE(ping.has_value(), ping.error());
    BOOST_TEST(ping->body == json({{"x", 1}}));
  } // ...and its disconnect clean-up runs: the session it opened is aborted.
  BOOST_TEST(eventually([&] { return !s.engine->get_server_info().weight_update_session_open; }));
  auto g = s.engine->generate(greedy_ids({1, 2}, 2));
  BOOST_TEST(g.success, g.message);

  // HTTP: in the body, and in a query parameter (which is then a string the codec refuses).
  auto r = http_request(s.port(), http::verb::post, "/generate",
                        R"({"input_ids": [1], "sampling_params": {"max_new_tokens": 1e400}})");
  BOOST_TEST(r.status == 400u);
  BOOST_TEST(r.body.find("1e400") != std::string::npos, r.body);
  r = http_request(s.port(), http::verb::post, "/flush_cache?timeout=1e400", "{}");
  BOOST_TEST(r.status == 400u);
  BOOST_TEST(r.body.find("timeout_s") != std::string::npos, r.body);
  r = http_request(s.port(), http::verb::post, "/pause_generation?mode=1e400");
  BOOST_TEST(r.status == 400u);
  BOOST_TEST(r.body.find("mode") != std::string::npos, r.body);
  BOOST_TEST(http_request(s.port(), http::verb::get, "/health").status == 200u);
}

// A client with the normal key aborted another client's request by sending a generate with the
// victim's rid and cancelling it (or disconnecting) before the duplicate rid was refused.
BOOST_AUTO_TEST_CASE(a_client_cannot_abort_another_clients_request) {
  served_engine s;
  // Paused in place, the victim's request waits in the queue for the whole attack: on a fast
  // machine its 200 tokens would otherwise be done before the attackers arrive.
  BOOST_REQUIRE(s.engine->pause_generation({pause_mode::in_place}).success);
  auto victim = s.connect();
  auto req = greedy_ids({1, 2, 3}, 200);
  req.rid = "victim-rid";
  BOOST_REQUIRE(victim->send_with_id("v", "generate", to_json(req)));
  BOOST_REQUIRE(eventually([&] {
    auto info = s.engine->get_server_info();
    return info.running_requests + info.waiting_requests == 1;
  }));
  for (int round = 0; round < 3; ++round) {
    auto attacker = s.connect();
    BOOST_REQUIRE(attacker->send_with_id("a", "generate", to_json(req)));
    BOOST_REQUIRE(attacker->send_with_id("c", "cancel", {{"id", "a"}}));
    if (round == 2)
      continue; // disconnects with its duplicate in flight
    for (int i = 0; i < 2; ++i) {
      auto m = attacker->receive();
      BOOST_REQUIRE_MESSAGE(m.has_value(), m.error());
    }
  }
  BOOST_TEST(s.engine->get_server_info().waiting_requests == 1);
  BOOST_REQUIRE(s.engine->continue_generation({}).success);
  // The admin route still aborts by rid (whoever made it): not used here.
  auto out = final_generate(*victim, "v");
  BOOST_TEST(out.success, out.message);
  BOOST_REQUIRE(out.finish_reason.has_value());
  BOOST_TEST(out.finish_reason->type == "length");
  BOOST_TEST(out.completion_tokens == 200);
}

namespace {

// The tiny model with room for a prompt of 64 KiB of text: a context of 8192 tokens (64 KiB of
// "<|endoftext|>" is 5042 of them).
fs::path long_context_model_dir() {
  auto dir = tiny_model_dir().parent_path() / "long-context";
  if (!fs::exists(dir / "config.json")) {
    fs::create_directories(dir);
    for (const auto& f : fs::directory_iterator(tiny_model_dir()))
      if (f.path().filename() != "config.json")
        fs::copy_file(f.path(), dir / f.path().filename());
    std::ifstream in(tiny_model_dir() / "config.json");
    auto config = json::parse(in);
    config["max_position_embeddings"] = 8192;
    std::ofstream(dir / "config.json") << config.dump(2);
  }
  return dir;
}

} // namespace

// A text prompt of 64 KiB or more is tokenized on a thread of its own, and its rid was taken only
// once its tokens came back: a generate from another connection under the same rid, arriving
// meanwhile, was accepted and ran; that connection's cancel (or hang-up) reached the rid, and the
// first request was refused as the duplicate when its tokens came back. The rid is now taken
// from the moment the request is accepted until it ends.
BOOST_AUTO_TEST_CASE(a_rid_is_taken_while_its_prompt_is_tokenized) {
  engine_config cfg;
  cfg.model_path = long_context_model_dir();
  served_engine s({}, cfg);
  // The duplicate must reach the front door after the long prompt and before its tokens come
  // back, which takes well under a millisecond: so by order, not by timing. The front door reads
  // one message at a time; prompts of 60000 spaces (just under the offload size, so the front
  // door tokenizes them itself, milliseconds each, then refuses their 15001 tokens) queue work
  // ahead of the long prompt, and the duplicate joins the queue behind it while that work is
  // still being done. A ping answered on a connection tells that the connection's earlier
  // frames have been handed to the front door.
  auto busy = s.connect();
  constexpr int k_busy = 32;
  for (int i = 0; i < k_busy; ++i) {
    GenerateReqInput w;
    w.text = std::string(60000, ' ') + "x";
    w.sampling_params.max_new_tokens = 1;
    BOOST_REQUIRE(busy->send_with_id("w" + std::to_string(i), "generate", to_json(w)));
  }
  BOOST_REQUIRE(busy->call("ping", json::object()).has_value());
  // The victim's 5100-token prompt is prefilled by the CPU model: tens of seconds under the
  // sanitizers (quadratic attention), more when other tests share the cores, so its connection
  // waits longer than the usual minute before it calls the server hung.
  auto victim_opts = s.client_opts();
  victim_opts.timeout = std::chrono::minutes(5);
  auto victim_conn = net::client::connect(victim_opts);
  BOOST_REQUIRE_MESSAGE(victim_conn.has_value(), victim_conn.error());
  auto victim = std::move(*victim_conn);
  GenerateReqInput v;
  v.rid = "long-prompt";
  v.text = std::string();
  for (int i = 0; i < 5100; ++i)
    *v.text += "<|endoftext|>";
  v.sampling_params.temperature = 0.0f;
  v.sampling_params.max_new_tokens = 4;
  v.sampling_params.ignore_eos = true;
  BOOST_REQUIRE(v.text->size() >= 64 * 1024);
  BOOST_REQUIRE(victim->send_with_id("v", "generate", to_json(v)));
  BOOST_REQUIRE(victim->call("ping", json::object()).has_value());
  auto dup = greedy_ids({1, 2, 3}, 200);
  dup.rid = "long-prompt";
  {
    auto attacker = s.connect();
    BOOST_REQUIRE(attacker->send_with_id("a", "generate", to_json(dup)));
    BOOST_REQUIRE(attacker->send_with_id("c", "cancel", {{"id", "a"}}));
    auto refused = attacker->wait_for("a");
    BOOST_REQUIRE_MESSAGE(refused.has_value(), (refused ? std::string() : refused.error()));
    BOOST_TEST(!refused->ok);
    const auto message = refused->body.value("message", std::string());
    BOOST_TEST(message == rid_in_flight_message("long-prompt"), message);
    auto cancelled = attacker->wait_for("c"); // whatever it says, it may not touch the victim
    BOOST_REQUIRE_MESSAGE(cancelled.has_value(), (cancelled ? std::string() : cancelled.error()));
    BOOST_REQUIRE(attacker->send_with_id("a2", "generate", to_json(dup)));
  } // hangs up with its second duplicate in flight (or already refused)
  auto out = final_generate(*victim, "v");
  BOOST_TEST(out.success, out.message);
  BOOST_REQUIRE(out.finish_reason.has_value());
  BOOST_TEST(out.finish_reason->type == "length");
  BOOST_TEST(out.prompt_tokens == 5100);
  BOOST_TEST(out.completion_tokens == 4);
  // The busy prompts were tokenized and refused for their length, nothing more.
  for (int i = 0; i < k_busy; ++i) {
    auto m = busy->wait_for("w" + std::to_string(i));
    BOOST_REQUIRE(m.has_value());
    BOOST_TEST(!m->ok);
  }
  // Once the request ended its rid is free: another connection may use it.
  dup.sampling_params.max_new_tokens = 2;
  auto again = s.connect()->generate(dup);
  BOOST_REQUIRE_MESSAGE(again.has_value(), (again ? std::string() : again.error()));
  BOOST_TEST(again->success, again->message);
  BOOST_TEST(again->rid == "long-prompt");
}

// Connection B could stage into and commit connection A's session. The weight updater checks
// the requester when the request executes, so no ordering of the two connections' requests
// gets past it (the orderings themselves: tests/actors/update_session_test.cpp).
BOOST_AUTO_TEST_CASE(a_websocket_session_takes_updates_and_end_from_its_connection_only) {
  served_engine s;
  auto a = s.connect();
  auto b = s.connect();
  auto begin = a->call<BeginWeightUpdateReqOutput>("begin_weight_update", BeginWeightUpdateReqInput{});
  BOOST_REQUIRE(begin.has_value() && begin->success);
  UpdateWeightsFromTensorReqInput bucket;
  bucket.named_tensors = {norm_tensor(0x4000)};
  auto refused = b->update_weights_from_tensor(bucket);
  BOOST_REQUIRE_MESSAGE(refused.has_value(), refused.error());
  BOOST_TEST(!refused->success);
  BOOST_TEST(refused->message.find("another websocket connection") != std::string::npos, refused->message);
  for (bool abort : {false, true}) {
    EndWeightUpdateReqInput end;
    end.abort = abort;
    auto refused_end = b->call<EndWeightUpdateReqOutput>("end_weight_update", end);
    BOOST_REQUIRE_MESSAGE(refused_end.has_value(), refused_end.error());
    BOOST_TEST(!refused_end->success);
    BOOST_TEST(refused_end->session_open);
    BOOST_TEST(refused_end->message.find("another websocket connection") != std::string::npos,
               refused_end->message);
    BOOST_TEST(s.engine->get_server_info().weight_update_session_open);
  }
  auto h = http_request(s.port(), http::verb::post, "/end_weight_update", "{}");
  BOOST_TEST(h.status == 400u);
  BOOST_TEST(h.body.find("another websocket connection") != std::string::npos, h.body);
  BOOST_TEST(s.engine->get_server_info().weight_update_session_open);
  auto b_begin = b->call<BeginWeightUpdateReqOutput>("begin_weight_update", BeginWeightUpdateReqInput{});
  BOOST_REQUIRE(b_begin.has_value());
  BOOST_TEST(!b_begin->success);
  // The owner's cycle is untouched.
  auto u = a->update_weights_from_tensor(bucket);
  BOOST_REQUIRE_MESSAGE((u.has_value() && u->success), (u.has_value() ? u->message : u.error()));
  auto end = a->call<EndWeightUpdateReqOutput>("end_weight_update", EndWeightUpdateReqInput{});
  BOOST_REQUIRE(end.has_value());
  BOOST_TEST(end->success, end->message);
  BOOST_TEST(!end->session_open);
  BOOST_TEST(s.engine->get_server_info().weight_version != "0");
}

// B's refused end does not count as the session's end: when A disconnects afterwards, its
// session is still aborted on its behalf and generation goes on.
BOOST_AUTO_TEST_CASE(a_refused_end_does_not_hide_the_owners_disconnect) {
  served_engine s;
  auto b = s.connect();
  {
    auto a = s.connect();
    auto begin = a->call<BeginWeightUpdateReqOutput>("begin_weight_update", BeginWeightUpdateReqInput{});
    BOOST_REQUIRE(begin.has_value() && begin->success);
    auto refused_end = b->call<EndWeightUpdateReqOutput>("end_weight_update", EndWeightUpdateReqInput{});
    BOOST_REQUIRE(refused_end.has_value());
    BOOST_TEST(!refused_end->success);
  } // A disconnects inside its session
  BOOST_REQUIRE(eventually([&] { return !s.engine->get_server_info().weight_update_session_open; }));
  auto out = b->generate(greedy_ids({1, 2, 3}, 4));
  BOOST_REQUIRE_MESSAGE(out.has_value(), out.error());
  BOOST_TEST(out->success, out->message);
}

// Refused buckets counted against --max-session-tensor-bytes.
BOOST_AUTO_TEST_CASE(refused_buckets_do_not_count_against_the_session_budget) {
  net::server_options o;
  o.max_session_tensor_bytes = 300; // two norm tensors of 128 bytes
  served_engine s(o);
  auto c = s.connect();
  auto begin = c->call<BeginWeightUpdateReqOutput>("begin_weight_update", BeginWeightUpdateReqInput{});
  BOOST_REQUIRE(begin.has_value() && begin->success);
  for (int i = 0; i < 4; ++i) {
    UpdateWeightsFromTensorReqInput bad;
    bad.named_tensors = {norm_tensor(0x4000, "model.no_such_tensor")};
    auto u = c->update_weights_from_tensor(bad);
    BOOST_REQUIRE(u.has_value());
    BOOST_TEST(!u->success);
    BOOST_TEST(u->message.find("no_such_tensor") != std::string::npos, u->message);
  }
  UpdateWeightsFromTensorReqInput good;
  good.named_tensors = {norm_tensor(0x4000)};
  for (int i = 0; i < 2; ++i) {
    auto u = c->update_weights_from_tensor(good);
    BOOST_REQUIRE_MESSAGE((u.has_value() && u->success), (u.has_value() ? u->message : u.error()));
  }
  auto over = c->update_weights_from_tensor(good); // the third good one passes the limit
  BOOST_TEST(!over.has_value());
  BOOST_TEST(over.error().find("too_large") != std::string::npos, over.error());
  auto end = c->call<EndWeightUpdateReqOutput>("end_weight_update", EndWeightUpdateReqInput{});
  BOOST_REQUIRE(end.has_value() && end->success);
}

// A huge timeout_s overflowed the float -> nanoseconds conversion (a deadline in the past).
BOOST_AUTO_TEST_CASE(client_durations_are_clamped) {
  served_engine s;
  auto c = s.connect();
  BOOST_REQUIRE(c->send_with_id("g", "generate", to_json(greedy_ids({1, 2}, 1500))));
  BOOST_REQUIRE(eventually([&] { return s.engine->get_server_info().running_requests == 1; }));
  for (double t : {1e300, 1e19, 9.3e9}) {
    auto out = s.engine->flush_cache(FlushCacheReqInput{t});
    BOOST_TEST(out.success, out.message); // waited for the request instead of failing at once
  }
  BOOST_TEST(client_wait(1e300) == std::chrono::nanoseconds(std::chrono::seconds(86400)));
  BOOST_TEST(client_wait(-5).count() == 0);
  BOOST_TEST(client_wait(std::nan("")).count() == 0);
  BOOST_TEST(client_wait(0.5) == std::chrono::nanoseconds(500'000'000));
  final_generate(*c, "g");
}

// update_weights_from_disk on a FIFO blocked in open() while holding the front door's lock.
BOOST_AUTO_TEST_CASE(disk_updates_refuse_fifos_without_blocking) {
  served_engine s;
  auto dir = fs::temp_directory_path() / ("rlserve-fifo-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto fifo = dir / "model.safetensors";
  fs::remove(fifo);
  BOOST_REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  for (auto path : {fifo, dir}) {
    UpdateWeightFromDiskReqInput req;
    req.model_path = path.string();
    auto out = s.engine->update_weights_from_disk(req);
    BOOST_TEST(!out.success);
    BOOST_TEST(out.message.find("FIFO") != std::string::npos, out.message);
  }
  auto index = dir / "model.safetensors.index.json";
  BOOST_REQUIRE(::mkfifo(index.c_str(), 0600) == 0);
  UpdateWeightFromDiskReqInput req;
  req.model_path = dir.string();
  auto out = s.engine->update_weights_from_disk(req);
  BOOST_TEST(!out.success);
  BOOST_TEST(out.message.find("FIFO") != std::string::npos, out.message);
  BOOST_TEST(s.engine->generate(greedy_ids({1}, 2)).success);
  fs::remove_all(dir);
}

// Non-finite weights were accepted silently; now refused, unless the engine allows them.
BOOST_AUTO_TEST_CASE(non_finite_weights_are_refused_unless_allowed) {
  for (bool allow : {false, true}) {
    engine_config cfg;
    cfg.allow_non_finite_weights = allow;
    served_engine s({}, cfg);
    for (uint16_t bits : {uint16_t{0x7fc0}, uint16_t{0x7f80}, uint16_t{0xff80}}) { // NaN, +inf, -inf
      auto t = norm_tensor(0x3f80);
      std::vector<uint16_t> v(64, 0x3f80);
      v[17] = bits;
      t.tensor = HostTensor::copy_of(dtype::bf16, {64}, {reinterpret_cast<const std::byte*>(v.data()), 128});
      UpdateWeightsFromTensorReqInput req;
      req.named_tensors = {t};
      auto b = s.engine->begin_weight_update();
      BOOST_REQUIRE(b.success);
      auto u = s.engine->update_weights_from_tensor(req);
      BOOST_TEST(u.success == allow, u.message);
      if (!allow) {
        BOOST_TEST(u.message.find("model.norm.weight") != std::string::npos, u.message);
        BOOST_TEST(u.message.find("element 17") != std::string::npos, u.message);
      }
      auto e = s.engine->end_weight_update(EndWeightUpdateReqInput{std::nullopt, true});
      BOOST_TEST(e.success, e.message);
    }
  }
}

// The same through update_weights_from_disk: a checkpoint holding one non-finite value is refused
// naming the tensor and element, nothing of it is applied (the served checksums stay), the
// engine keeps answering; an engine that allows non-finite weights loads it.
BOOST_AUTO_TEST_CASE(non_finite_weights_on_disk_are_refused_unless_allowed) {
  auto base = tiny_model_dir();
  auto ckpt = model::checkpoint::open(base);
  BOOST_REQUIRE_MESSAGE(ckpt.has_value(), (ckpt ? std::string() : ckpt.error()));
  // Every tensor of the tiny model with 1.0 as its final norm (so the load is visible in the
  // checksums when allowed), then one NaN, +inf or -inf at element 17.
  auto with_norm = [&](uint16_t bad_bits) {
    std::vector<NamedTensor> tensors;
    for (const auto& name : ckpt->names()) {
      auto t = ckpt->tensor(name);
      BOOST_REQUIRE(t.has_value());
      tensors.push_back({name, std::move(*t)});
    }
    std::vector<uint16_t> v(64, 0x3f80);
    v[17] = bad_bits;
    for (auto& t : tensors)
      if (t.name == "model.norm.weight")
        t.tensor = HostTensor::copy_of(dtype::bf16, {64}, {reinterpret_cast<const std::byte*>(v.data()), 128});
    return tensors;
  };
  auto dir = fs::temp_directory_path() / ("rlserve-nonfinite-" + std::to_string(::getpid()));
  auto checksums = [](Engine& e) {
    auto out = e.check_weights(CheckWeightsReqInput{});
    BOOST_REQUIRE_MESSAGE(out.success, out.message);
    BOOST_REQUIRE_EQUAL(out.payload.size(), 1u);
    return out.payload[0].checksums;
  };
  for (bool allow : {false, true}) {
    engine_config cfg;
    cfg.allow_non_finite_weights = allow;
    served_engine s({}, cfg);
    auto c = s.connect(); // the refusal must reach a client as well as the engine's API
    for (uint16_t bits : {uint16_t{0x7fc0}, uint16_t{0x7f80}, uint16_t{0xff80}}) { // NaN, +inf, -inf
      fs::remove_all(dir);
      fs::create_directories(dir);
      fs::copy_file(base / "config.json", dir / "config.json");
      fs::copy_file(base / "tokenizer.json", dir / "tokenizer.json");
      BOOST_REQUIRE(model::write_checkpoint(dir, with_norm(bits)).has_value());
      const auto before = checksums(*s.engine);
      UpdateWeightFromDiskReqInput req;
      req.model_path = dir.string();
      auto u = c->call<UpdateWeightFromDiskReqOutput>("update_weights_from_disk", req);
      BOOST_REQUIRE_MESSAGE(u.has_value(), (u ? std::string() : u.error()));
      BOOST_TEST(u->success == allow, u->message);
      const auto after = checksums(*s.engine);
      if (!allow) {
        BOOST_TEST(u->message.find("model.norm.weight") != std::string::npos, u->message);
        BOOST_TEST(u->message.find("element 17") != std::string::npos, u->message);
        BOOST_TEST(u->message.find("allow-non-finite-weights") != std::string::npos, u->message);
        BOOST_TEST((after == before)); // nothing applied, not even the finite tensors
      } else {
        BOOST_TEST(after.at("model.norm.weight") != before.at("model.norm.weight"));
      }
      BOOST_TEST(s.engine->generate(greedy_ids({1, 2}, 2)).success);
    }
  }
  fs::remove_all(dir);
}

// A 100 MB input_ids body took 2 GB of memory to parse: generate requests are bounded by what
// the model can serve before they are parsed.
BOOST_AUTO_TEST_CASE(generate_requests_are_bounded_by_the_context_length) {
  served_engine s;
  auto ctx = s.engine->get_server_info().max_context_length;
  std::string ids = "[1";
  while (ids.size() < net::generate_bytes_limit(ctx) + 10)
    ids += ", 1";
  ids += "]";
  std::string body = R"({"input_ids": )" + ids + "}";
  auto r = http_request(s.port(), http::verb::post, "/generate", body);
  BOOST_TEST(r.status == 413u);
  BOOST_TEST(r.body.find("context length") != std::string::npos, r.body);
  auto c = s.connect();
  std::string text = R"({"id": 1, "type": "generate", "body": )" + body + "}";
  BOOST_REQUIRE(c->send_raw(as_bytes(text), false));
  auto m = c->receive();
  BOOST_REQUIRE(m.has_value());
  BOOST_TEST(m->code == "too_large");
  BOOST_TEST(m->id == json(1)); // the refusal answers the request
  // A large frame of another route is still read (and refused for what it is).
  std::string other = R"({"id": 2, "type": "pause_generation", "body": {"mode": )" + ids + "}}";
  BOOST_REQUIRE(c->send_raw(as_bytes(other), false));
  m = c->receive();
  BOOST_REQUIRE(m.has_value());
  BOOST_TEST(m->code == "bad_request");
  BOOST_TEST(c->call("ping", json::object()).has_value());
}

// With no keys, a web page could drive admin routes through the browser; HEAD ran admin routes;
// malformed HTTP got no answer.
BOOST_AUTO_TEST_CASE(http_front_refuses_browser_tricks_and_malformed_requests) {
  served_engine s;
  const std::string self_host = "127.0.0.1:" + std::to_string(s.port());
  auto foreign = std::map<std::string, std::string>{{"Origin", "http://evil.example"}};
  auto r = http_request(s.port(), http::verb::post, "/pause_generation", R"({"mode": "abort"})", foreign);
  BOOST_TEST(r.status == 403u);
  auto same = std::map<std::string, std::string>{{"Origin", "http://" + self_host}, {"Host", self_host}};
  r = http_request(s.port(), http::verb::get, "/get_server_info", "", same);
  BOOST_TEST(r.status == 200u);
  // DNS rebinding: the attacker's name resolves to this machine, so Origin and Host agree, but
  // the name is not one that designates this server without DNS.
  const std::string rebound = "evil.example:" + std::to_string(s.port());
  r = http_request(s.port(), http::verb::post, "/pause_generation", R"({"mode": "abort"})",
                   {{"Origin", "http://" + rebound}, {"Host", rebound}});
  BOOST_TEST(r.status == 403u);
  BOOST_TEST(!s.engine->get_server_info().paused);
  const std::string local = "localhost:" + std::to_string(s.port());
  r = http_request(s.port(), http::verb::get, "/get_server_info", "", {{"Origin", "http://" + local}, {"Host", local}});
  BOOST_TEST(r.status == 200u);
  const std::string v6 = "[::1]:" + std::to_string(s.port());
  r = http_request(s.port(), http::verb::get, "/get_server_info", "", {{"Origin", "http://" + v6}, {"Host", v6}});
  BOOST_TEST(r.status == 200u);
  // A foreign-origin websocket upgrade.
  auto up = raw_exchange(s.port(), "GET / HTTP/1.1\r\nHost: " + self_host +
                                     "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                                     "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                                     "Sec-WebSocket-Version: 13\r\nOrigin: http://evil.example\r\n\r\n");
  BOOST_TEST(up.rfind("HTTP/1.1 403", 0) == 0, up);
  // Side effects need POST; GET stays for SGLang's GET routes.
  r = http_request(s.port(), http::verb::get, "/pause_generation?mode=abort");
  BOOST_TEST(r.status == 405u);
  BOOST_TEST(!s.engine->get_server_info().paused);
  BOOST_TEST(http_request(s.port(), http::verb::get, "/flush_cache").status == 200u);
  BOOST_TEST(http_request(s.port(), http::verb::get, "/get_server_info").status == 200u);
  BOOST_TEST(http_request(s.port(), http::verb::get, "/health_generate").status == 200u);
  // A body must be JSON.
  // (Raw: the test helper always sends JSON's content type with a body.)
  auto plain = raw_exchange(s.port(), "POST /pause_generation HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                      "Content-Type: text/plain\r\nContent-Length: 17\r\n\r\n{\"mode\": \"abort\"}");
  BOOST_TEST(plain.rfind("HTTP/1.1 415", 0) == 0, plain);
  BOOST_TEST(!s.engine->get_server_info().paused);
  // HEAD never runs a route with side effects and never carries a body.
  // (Raw: a HEAD reply has a Content-Length and no body, which the test helper would wait for.)
  auto head_pause = raw_exchange(s.port(), "HEAD /pause_generation?mode=abort HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  BOOST_TEST(head_pause.rfind("HTTP/1.1 405", 0) == 0, head_pause);
  auto head_flush = raw_exchange(s.port(), "HEAD /flush_cache HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  BOOST_TEST(head_flush.rfind("HTTP/1.1 405", 0) == 0, head_flush);
  BOOST_TEST(!s.engine->get_server_info().paused);
  auto head = raw_exchange(s.port(), "HEAD /get_server_info HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  BOOST_TEST(head.rfind("HTTP/1.1 200", 0) == 0, head);
  BOOST_TEST(head.find("\r\n\r\n") + 4 == head.size(), head); // nothing after the headers
  // Malformed HTTP and oversized headers are answered, then the connection closes.
  auto bad = raw_exchange(s.port(), "NOT HTTP AT ALL\r\n\r\n");
  BOOST_TEST(bad.rfind("HTTP/1.1 400", 0) == 0, bad);
  auto big = raw_exchange(s.port(), "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(70000, 'a') + "\r\n\r\n");
  BOOST_TEST(big.rfind("HTTP/1.1 431", 0) == 0, big.substr(0, 200));
  BOOST_TEST(http_request(s.port(), http::verb::get, "/health").status == 200u);
}

// An HTTP begin_weight_update with no end blocked /generate forever.
BOOST_AUTO_TEST_CASE(an_abandoned_http_session_is_aborted_after_its_idle_deadline) {
  net::server_options o;
  o.update_session_idle_timeout = std::chrono::milliseconds(300);
  served_engine s(o);
  auto sum_before = s.engine->check_weights({}).payload.at(0).per_gpu_checksum;
  BOOST_REQUIRE(http_request(s.port(), http::verb::post, "/begin_weight_update", "{}").status == 200u);
  BOOST_TEST(eventually([&] { return !s.engine->get_server_info().weight_update_session_open; }));
  auto g = s.engine->generate(greedy_ids({1, 2}, 2));
  BOOST_TEST(g.success, g.message);
  BOOST_TEST(s.engine->get_server_info().weight_version == "0");
  BOOST_TEST(s.engine->check_weights({}).payload.at(0).per_gpu_checksum == sum_before);
  auto m = s.server->stats().render(nullptr);
  BOOST_TEST(m.find("action=\"abort_idle_session\"} 1") != std::string::npos, m);
}

// Mixed bad traffic from several hostile clients (malformed JSON, 1e400, unknown routes, bad
// binary frames, foreign origins, GET with side effects, wrong content types, duplicate rids
// with cancels, malformed HTTP, FIFO-like disk paths, oversized generates) while
// a well-behaved trainer runs generate requests and a whole update cycle on its websocket:
// every one of its requests succeeds and the update commits.
BOOST_AUTO_TEST_CASE(hostile_clients_do_not_disturb_a_well_behaved_one) {
  net::server_options o;
  o.update_session_idle_timeout = std::chrono::milliseconds(500);
  served_engine s(o);
  std::atomic<bool> stop{false};
  std::atomic<int> hostile_rounds{0};
  auto ctx = s.engine->get_server_info().max_context_length;
  std::string huge = R"({"id": 9, "type": "generate", "body": {"input_ids": [1)";
  while (huge.size() < net::generate_bytes_limit(ctx) + 10)
    huge += ", 1";
  huge += "]}}";
  auto hostile_ws = [&] {
    while (!stop) {
      auto c = net::client::connect(s.client_opts());
      if (!c)
        continue;
      auto& h = **c;
      for (const std::string& text :
           {std::string("{\"id\": 1, \"type\": "), std::string(R"({"id": 2, "type": "generate", "body": {"input_ids": [1e400]}})"),
            std::string(R"({"id": 3, "type": "make_coffee"})"),
            std::string(R"({"id": 5, "type": "update_weights_from_tensor", "body": {"named_tensors": [{"name": "x"}]}})"),
            std::string(R"({"id": 6, "type": "generate", "body": {"input_ids": [1], "rid": "trainer-x", "sampling_params": {"max_new_tokens": 1}}})"),
            std::string(R"({"id": 7, "type": "cancel", "body": {"id": 6}})"), huge})
        (void)h.send_raw(as_bytes(text), false);
      std::vector<std::byte> junk(64, std::byte{0x7f});
      (void)h.send_raw(junk, true);
      (void)h.send_raw(binary_frame_with_header(R"({"id": 8, "type": "update_weights_from_tensor", "body": {"named_tensors": 1e400}})"), true);
      ++hostile_rounds;
      // Leaves with requests in flight half of the time.
      if (hostile_rounds % 2 == 0)
        (void)h.call("ping", json::object());
    }
  };
  auto hostile_http = [&] {
    while (!stop) {
      http_request(s.port(), http::verb::post, "/generate", R"({"input_ids": [1], "sampling_params": {"temperature": 1e400}})");
      http_request(s.port(), http::verb::get, "/pause_generation?mode=abort");
      raw_exchange(s.port(), "HEAD /continue_generation HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
      raw_exchange(s.port(), "POST /pause_generation HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                             "Content-Type: text/plain\r\nContent-Length: 17\r\n\r\n{\"mode\": \"abort\"}");
      http_request(s.port(), http::verb::post, "/abort_request", R"({"abort_all": true})", {{"Origin", "http://evil.example"}});
      http_request(s.port(), http::verb::post, "/flush_cache?timeout=1e300", "{}");
      raw_exchange(s.port(), "BREW /pot HTTP/1.1\r\nConnection: close\r\n\r\n");
      raw_exchange(s.port(), "GET /health HTTP/1.1\r\nX: " + std::string(70000, 'x') + "\r\n\r\n");
      http_request(s.port(), http::verb::post, "/update_weights_from_disk", R"({"model_path": "/dev/null"})");
    }
  };
  std::vector<std::thread> threads;
  struct join_all { // also when a REQUIRE below ends the test early
    std::atomic<bool>& stop;
    std::vector<std::thread>& threads;
    ~join_all() {
      stop = true;
      for (auto& t : threads)
        if (t.joinable())
          t.join();
    }
  } joiner{stop, threads};
  threads.emplace_back(hostile_ws);
  threads.emplace_back(hostile_ws);
  threads.emplace_back(hostile_http);

  // Three hostile threads keep both cores of a CI machine busy; under the sanitizers a round of
  // the well-behaved client's work can take longer than the usual minute before it calls the
  // server hung, so it waits up to five (what is tested is that it is answered, not how fast).
  auto good_opts = s.client_opts();
  good_opts.timeout = std::chrono::minutes(5);
  auto good_conn = net::client::connect(good_opts);
  BOOST_REQUIRE_MESSAGE(good_conn.has_value(), good_conn.error());
  auto good = std::move(*good_conn);
  for (int round = 0; round < 3; ++round) {
    BOOST_TEST_CONTEXT("round " << round) {
      std::vector<json> ids;
      for (int i = 0; i < 4; ++i) {
        auto req = greedy_ids({1, 2, 3, static_cast<int32_t>(i)}, 16);
        req.rid = "trainer-" + std::to_string(round * 4 + i);
        json id = "g" + std::to_string(i);
        BOOST_REQUIRE(good->send_with_id(id, "generate", to_json(req)));
        ids.push_back(id);
      }
      for (const auto& id : ids) {
        auto out = final_generate(*good, id);
        BOOST_TEST(out.success, out.message);
        BOOST_REQUIRE(out.finish_reason.has_value());
        BOOST_TEST(out.finish_reason->type == "length");
        BOOST_TEST(out.completion_tokens == 16);
      }
      // (A session someone else holds makes begin fail rather than wait: try again.)
      std::string last;
      BOOST_REQUIRE_MESSAGE(eventually([&] {
        auto b = good->call<BeginWeightUpdateReqOutput>("begin_weight_update", BeginWeightUpdateReqInput{});
        last = b.has_value() ? b->message : b.error();
        return b.has_value() && b->success;
      }, std::chrono::seconds(30)), last);
      UpdateWeightsFromTensorReqInput bucket;
      bucket.named_tensors = {norm_tensor(static_cast<uint16_t>(0x3f80 + round + 1))};
      auto u = good->update_weights_from_tensor(bucket);
      BOOST_REQUIRE_MESSAGE((u.has_value() && u->success), (u.has_value() ? u->message : u.error()));
      EndWeightUpdateReqInput end;
      end.weight_version = "good-" + std::to_string(round);
      auto e = good->call<EndWeightUpdateReqOutput>("end_weight_update", end);
      BOOST_REQUIRE(e.has_value());
      BOOST_TEST(e->success, e->message);
      BOOST_TEST(s.engine->get_server_info().weight_version == "good-" + std::to_string(round));
    }
  }
  stop = true;
  for (auto& t : threads)
    t.join();
  BOOST_TEST(hostile_rounds > 0);
  BOOST_TEST(http_request(s.port(), http::verb::get, "/health").status == 200u);
}

BOOST_AUTO_TEST_SUITE_END()
