// The pure parts of net/: envelopes, binary frames, auth levels (the admin level never falls back
// to the normal key), the receive buffer, the Prometheus rendering. No sockets here; those are
// in server_sim_test.
#include <boost/test/unit_test.hpp>

#include <cstring>

#include "messages/json_codec.hpp"
#include "net/auth.hpp"
#include "net/message_buffer.hpp"
#include "net/metrics.hpp"
#include "net/protocol.hpp"

using namespace rlserve;
using namespace rlserve::net;

namespace {

shared_bytes as_frame(const std::vector<std::byte>& v) {
  std::shared_ptr<std::byte[]> p(new std::byte[v.size()]);
  std::memcpy(p.get(), v.data(), v.size());
  return {std::shared_ptr<const std::byte>(p, p.get()), v.size()};
}

NamedTensor f32_tensor(std::string name, std::vector<float> values) {
  auto n = static_cast<int64_t>(values.size());
  return {std::move(name), HostTensor::copy_of(dtype::f32, {n},
                                               {reinterpret_cast<const std::byte*>(values.data()),
                                                values.size() * sizeof(float)})};
}

} // namespace

BOOST_AUTO_TEST_SUITE(protocol_test)

BOOST_AUTO_TEST_CASE(envelopes) {
  json id;
  auto ok = read_envelope(json::parse(R"({"id": "a-1", "type": "generate", "body": {"text": "x"}})"), id);
  BOOST_REQUIRE(ok.has_value());
  BOOST_TEST(ok->id == json("a-1"));
  BOOST_TEST(ok->type == "generate");
  BOOST_TEST(read_envelope(json::parse(R"({"id": 3, "type": "health"})"), id)->body == json::object());
  auto no_id = read_envelope(json::parse(R"({"type": "health"})"), id);
  BOOST_TEST(!no_id.has_value());
  BOOST_TEST(no_id.error().find("id") == 0u);
  auto extra = read_envelope(json::parse(R"({"id": 1, "type": "health", "route": "x"})"), id);
  BOOST_TEST(!extra.has_value());
  BOOST_TEST(id == json(1)); // the id is kept for the error reply
  auto bad_body = read_envelope(json::parse(R"({"id": 1, "type": "health", "body": 5})"), id);
  BOOST_TEST(bad_body.error().find("body") == 0u);

  auto err = json::parse(error_text(7, "generate", error_code::unknown_type, "no route"));
  BOOST_TEST(err["id"] == 7);
  BOOST_TEST(err["error"]["code"] == "unknown_type");
  auto chunk = json::parse(chunk_text("x", "generate", {{"text", "hi"}}));
  BOOST_TEST(chunk["type"] == "generate.chunk");
  // Invalid UTF-8 (a chunk cut inside a character) does not throw.
  BOOST_TEST(dump(json("\xe2\x82")).size() > 0u);
}

// A frame that is not valid JSON still has its id read when the id comes before the point
// where the text goes wrong, and only then; every case is first checked to fail the full parse.
BOOST_AUTO_TEST_CASE(the_id_of_a_broken_frame_is_recovered_when_read_before_the_failure) {
  const std::string big_int = std::string(400, '7');
  struct id_case {
    std::string name, text;
    json id;            // null: none may be taken
    std::string why;    // a part of why_no_id when id is null
  };
  const std::vector<id_case> cases = {
    {"1e400 after the id", R"({"id": 7, "type": "generate", "body": {"x": 1e400}})", 7, ""},
    {"a 400-digit integer after the id", R"({"id": "r-1", "type": "generate", "body": {"x": )" + big_int + "}}",
     "r-1", ""},
    {"a bad escape after the id", R"({"id": 8, "type": "generate", "body": {"text": "a\xb"}})", 8, ""},
    {"a lone surrogate after the id", R"({"id": "s", "type": "generate", "body": {"text": "\ud800"}})",
     "s", ""},
    {"truncated after the id", R"({"id": 9, "type": "generate", "body": {"text": "ab)", 9, ""},
    {"invalid UTF-8 after the id", "{\"id\": 10, \"body\": {\"text\": \"\xff\xfe\"}}", 10, ""},
    {"a negative integer id", R"({"id": -3, "body": {"x": 1e400}})", -3, ""},
    {"the id after the broken part", R"({"type": "generate", "body": {"x": 1e400}, "id": 11})", nullptr,
     "no top-level \"id\" key comes before"},
    {"an id nested in the body only", R"({"body": {"id": 12, "x": 1e400}})", nullptr, "no top-level"},
    {"two ids before the failure", R"({"id": 1, "id": 2, "body": {"x": 1e400}})", nullptr,
     "more than one"},
    {"a float id", R"({"id": 1.5, "body": {"x": 1e400}})", nullptr, "not a string or an integer"},
    {"an object id", R"({"id": {"a": 1}, "body": {"x": 1e400}})", nullptr, "not a string or an integer"},
    {"the id itself beyond double", R"({"id": 1e400})", nullptr, "in the value of its"},
    {"the id string broken", R"({"id": "a\x", "type": "x"})", nullptr, "in the value of its"},
    {"an array", R"([{"id": 1}, 1e400])", nullptr, "not start as a JSON object"},
    {"empty text", "", nullptr, "not start as a JSON object"},
  };
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.name) {
      BOOST_TEST(!parse_request_json(c.text, 1000).has_value());
      auto r = recover_ids(c.text);
      BOOST_TEST(r.id == c.id, r.id.dump());
      if (c.id.is_null())
        BOOST_TEST(r.why_no_id.find(c.why) != std::string::npos, r.why_no_id);
      else
        BOOST_TEST(r.why_no_id.empty());
    }
  }
  BOOST_TEST(recover_ids(R"({"id": 1, "type": "generate", "body": {"x": 1e400}})").type == "generate");
  BOOST_TEST(recover_ids(R"({"id": 1, "body": {"type": "t", "x": 1e400}})").type.empty());
  // Deep nesting after the id costs the scan nothing and does not hide the id.
  BOOST_TEST(recover_ids(R"({"id": 4, "body": )" + std::string(100000, '[')).id == json(4));
}

BOOST_AUTO_TEST_CASE(binary_frames_round_trip_and_alias_the_payload) {
  std::vector<NamedTensor> tensors = {f32_tensor("a", {1, 2, 3}), f32_tensor("b", {4, 5})};
  auto bytes = make_binary_frame(11, "update_weights_from_tensor", {{"weight_version", "v2"}}, tensors);
  auto frame = as_frame(bytes);
  json id;
  auto req = read_binary_frame(frame, id);
  BOOST_REQUIRE_MESSAGE(req.has_value(), req.error());
  BOOST_TEST(id == 11);
  BOOST_TEST(req->envelope.body["weight_version"] == "v2");
  BOOST_TEST(!req->envelope.body.contains("named_tensors"));
  BOOST_REQUIRE_EQUAL(req->tensors.size(), 2u);
  BOOST_TEST(req->tensors[1].name == "b");
  BOOST_TEST(req->copied_tensors == 0u);
  BOOST_TEST(req->tensor_bytes == 20u);
  auto* b = reinterpret_cast<const float*>(req->tensors[1].tensor.data.get());
  BOOST_TEST(b[1] == 5.0f);
  // Aliased, not copied: the tensor points into the frame.
  auto first = reinterpret_cast<uintptr_t>(frame.data.get());
  auto at = reinterpret_cast<uintptr_t>(req->tensors[0].tensor.data.get());
  BOOST_TEST((at >= first && at < first + frame.size));
}

BOOST_AUTO_TEST_CASE(bad_binary_frames_say_what_is_wrong) {
  json id;
  auto check = [&](std::vector<std::byte> bytes, const std::string& words) {
    auto r = read_binary_frame(as_frame(bytes), id);
    BOOST_REQUIRE(!r.has_value());
    BOOST_TEST(r.error().find(words) != std::string::npos, r.error());
  };
  check({std::byte{1}}, "4-byte header length");
  check({std::byte{200}, std::byte{0}, std::byte{0}, std::byte{0}, std::byte{'{'}}, "does not fit");
  auto good = make_binary_frame(1, "update_weights_from_tensor", json::object(), std::vector{f32_tensor("a", {1, 2})});
  auto truncated = good;
  truncated.resize(truncated.size() - 60); // the payload is padded to 64 bytes; 4 are left

  check(truncated, "outside the payload");
  // A header whose nbytes disagrees with shape x dtype.
  std::string header = R"({"id": 1, "type": "update_weights_from_tensor", "body": {"named_tensors": [)"
                       R"({"name": "a", "dtype": "float32", "shape": [2], "offset": 0, "nbytes": 12}]}})";
  std::vector<std::byte> f(4 + header.size() + 12);
  f[0] = static_cast<std::byte>(header.size() & 0xff);
  f[1] = static_cast<std::byte>(header.size() >> 8);
  std::memcpy(f.data() + 4, header.data(), header.size());
  check(f, "nbytes");
  // A number outside double's range in the header (nlohmann's out_of_range, not parse_error).
  for (std::string number : {"1e400", "-1e400"}) {
    std::string h = R"({"id": )" + number + R"(, "type": "update_weights_from_tensor", "body": {}})";
    std::vector<std::byte> g(4 + h.size());
    g[0] = static_cast<std::byte>(h.size() & 0xff);
    std::memcpy(g.data() + 4, h.data(), h.size());
    BOOST_CHECK_NO_THROW(check(g, "binary frame header: invalid JSON: number overflow parsing '" + number));
  }
}

BOOST_AUTO_TEST_CASE(auth_levels) {
  const std::vector<std::string> none, user{"u"}, admin{"a"}, both{"u", "a"}, wrong{"x"};
  const api_keys open{}, keyed{"u", "a"}, only_user{"u", ""}, only_admin{"", "a"};
  using enum auth_result;
  // No keys: everything open.
  BOOST_TEST((authorize(open, route_auth::admin, none) == ok));
  // Both keys.
  BOOST_TEST((authorize(keyed, route_auth::normal, none) == unauthorized));
  BOOST_TEST((authorize(keyed, route_auth::normal, user) == ok));
  BOOST_TEST((authorize(keyed, route_auth::normal, admin) == ok)); // an admin may generate
  BOOST_TEST((authorize(keyed, route_auth::admin, user) == unauthorized));
  BOOST_TEST((authorize(keyed, route_auth::admin, admin) == ok));
  BOOST_TEST((authorize(keyed, route_auth::admin, both) == ok));
  BOOST_TEST((authorize(keyed, route_auth::admin, wrong) == unauthorized));
  // Only the normal key: it opens admin routes too (SGLang's rule; trainers rely on it).
  BOOST_TEST((authorize(only_user, route_auth::admin, user) == ok));
  BOOST_TEST((authorize(only_user, route_auth::admin, none) == unauthorized));
  BOOST_TEST((authorize(only_user, route_auth::admin, wrong) == unauthorized));
  BOOST_TEST((authorize(only_user, route_auth::normal, user) == ok));
  BOOST_TEST((authorize(only_user, route_auth::exempt, none) == ok));
  // Only the admin key: generation is open, admin routes need the key.
  BOOST_TEST((authorize(only_admin, route_auth::normal, none) == ok));
  BOOST_TEST((authorize(only_admin, route_auth::admin, none) == unauthorized));
  BOOST_TEST((authorize(only_admin, route_auth::admin, admin) == ok));
  BOOST_TEST((authorize(keyed, route_auth::exempt, none) == ok));
  // Upgrades.
  BOOST_TEST(!may_connect(keyed, wrong));
  BOOST_TEST(may_connect(keyed, admin));
  BOOST_TEST(may_connect(only_admin, none));
  // Headers.
  auto t = tokens_from_headers("bearer  u ", "a");
  BOOST_TEST(t == both);
  BOOST_TEST(tokens_from_headers("Basic u", "").empty());
  BOOST_TEST(constant_time_equal("abc", "abc"));
  BOOST_TEST(!constant_time_equal("abc", "abcd"));
  BOOST_TEST(!constant_time_equal("abc", "abd"));
  BOOST_TEST(!constant_time_equal("", "a"));
  // No refusal sentence carries a key.
  for (auto level : {route_auth::normal, route_auth::admin})
    for (const auto& keys : {keyed, only_user, only_admin}) {
      auto m = refusal_message(keys, level);
      BOOST_TEST(m.find("\"u\"") == std::string::npos);
      BOOST_TEST(m.find("\"a\"") == std::string::npos);
      BOOST_TEST(!m.empty());
    }
  BOOST_TEST(refusal_message(keyed, route_auth::admin).find("admin API key") != std::string::npos);
  BOOST_TEST(refusal_message(only_user, route_auth::admin).find("admin") == std::string::npos);
  // Every route that changes, reads or checks weights, pauses, resumes, flushes or aborts is admin.
  for (const auto& c : all_codecs()) {
    bool normal = c.route == "generate" || c.route == "health" || c.route == "get_server_info";
    BOOST_TEST((c.auth == (normal ? auth_level::normal : auth_level::admin)), c.route);
  }
}

BOOST_AUTO_TEST_CASE(message_buffer_hands_out_and_reuses_storage) {
  message_buffer buf(1 << 20);
  auto put = [&](std::string_view s) {
    auto m = buf.prepare(s.size());
    std::memcpy(m.data(), s.data(), s.size());
    buf.commit(s.size());
  };
  put("hello ");
  put("world");
  auto first = buf.take();
  BOOST_TEST(first.text() == "hello world");
  BOOST_TEST(buf.size() == 0u);
  put("next");
  auto second = buf.take();
  BOOST_TEST(first.text() == "hello world"); // still held: not overwritten
  BOOST_TEST(second.text() == "next");
  const void* storage = second.data.get();
  second = {};
  put("third");
  BOOST_TEST(buf.data().data() == storage); // released: reused
  BOOST_CHECK_THROW(buf.prepare(2 << 20), std::length_error);
}

BOOST_AUTO_TEST_CASE(metrics_render_prometheus_text) {
  metrics m;
  m.request_done("ws", "generate", request_result::ok, 0.5);
  m.generate_done(3, 7, "length");
  m.update_phase("begin", 0.01);
  m.update_session_ended("committed");
  GetServerInfoReqOutput info;
  info.weight_version = "step \"7\"";
  info.running_requests = 2;
  info.speculative_num_draft_tokens = 4;
  info.spec_verify_steps = 10;
  info.spec_accepted_tokens = 25;
  info.spec_proposed_drafts = 40;
  info.spec_accept_rate = 0.625;
  info.spec_accept_length = 3.5;
  info.spec_recent_accept_length = 1.25;
  auto text = m.render(&info);
  for (const char* line : {"rlserve_spec_num_draft_tokens 4", "rlserve_spec_verify_steps_total 10",
                           "rlserve_spec_accepted_tokens_total 25", "rlserve_spec_accept_length 3.500000",
                           "rlserve_spec_recent_accept_length 1.250000", "rlserve_spec_proposed_drafts_total 40",
                           "rlserve_spec_accept_rate 0.625000"})
    BOOST_TEST(text.find(line) != std::string::npos, line);
  BOOST_TEST(text.find("rlserve_requests_total{transport=\"ws\",route=\"generate\",result=\"ok\"} 1") !=
             std::string::npos);
  BOOST_TEST(text.find("rlserve_prompt_tokens_total 3") != std::string::npos);
  BOOST_TEST(text.find("rlserve_completion_tokens_total 7") != std::string::npos);
  BOOST_TEST(text.find("rlserve_running_requests 2") != std::string::npos);
  BOOST_TEST(text.find("version=\"step \\\"7\\\"\"") != std::string::npos);
  BOOST_TEST(text.find("rlserve_update_sessions_total{result=\"committed\"} 1") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
