// messages/codec_registry.hpp: every route decodes a minimal body into its request type,
// encodes its reply type, and the admin routes are exactly those that touch weights, pause,
// flush or abort.
#include <boost/test/unit_test.hpp>

#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "caf/make_message.hpp"
#include "caf/message.hpp"
#include "message_samples.hpp"
#include "messages/codec_registry.hpp"
#include "messages/json_codec.hpp"

using namespace rlserve;
using namespace rlserve_test;
using nlohmann::json;

namespace {

// The smallest valid body per route (required fields only), and the type it must decode to.
template <class In, class Out>
struct route_case {
  const char* route;
  const char* body;
  auth_level auth;
};

template <class In, class Out>
void check_route(const route_case<In, Out>& c) {
  BOOST_TEST_CONTEXT(c.route) {
    const codec_entry* e = find_codec(c.route);
    BOOST_TEST_REQUIRE(e != nullptr);
    BOOST_TEST(e->route == c.route);
    BOOST_TEST((e->auth == c.auth), "auth is " << to_string(e->auth));
    BOOST_TEST(e->request_type == boost::core::demangle(typeid(In).name()).substr(9));
    BOOST_TEST(e->reply_type == boost::core::demangle(typeid(Out).name()).substr(9));

    // Request: JSON -> message holding In, equal to what from_json gives.
    auto msg = e->decode(json::parse(c.body));
    BOOST_TEST_REQUIRE(msg.has_value(), error_text(msg));
    BOOST_TEST_REQUIRE(msg->template match_elements<In>(), caf::to_string(*msg));
    BOOST_TEST((msg->template get_as<In>(0) == *from_json<In>(json::parse(c.body))));
    // ... and back (the client side).
    auto body = e->encode_request(*msg);
    BOOST_TEST_REQUIRE(body.has_value(), error_text(body));
    BOOST_TEST(*body == to_json(msg->template get_as<In>(0)));

    // Reply: message holding Out -> JSON, and back.
    const Out reply = samples<Out>::full();
    auto j = e->encode_reply(caf::make_message(reply));
    BOOST_TEST_REQUIRE(j.has_value(), error_text(j));
    BOOST_TEST(*j == to_json(reply));
    auto back = e->decode_reply(*j);
    BOOST_TEST_REQUIRE(back.has_value(), error_text(back));
    BOOST_TEST_REQUIRE(back->template match_elements<Out>());
    BOOST_TEST((back->template get_as<Out>(0) == reply));

    // A body the codec refuses gives its message, not a caf::message (an unknown top-level
    // key is ignored, as SGLang does; a value of the wrong kind is not).
    auto bad = e->decode(json::parse(R"([1])"));
    BOOST_TEST(!bad.has_value());
    // A reply of the wrong type is a clear error, not a crash.
    auto wrong = e->encode_reply(caf::make_message(std::string("oops")));
    BOOST_TEST_REQUIRE(!wrong.has_value());
    BOOST_TEST(error_text(wrong).find("expected a message holding one " + std::string(e->reply_type)) == 0,
               error_text(wrong));
  }
}

constexpr auto normal = auth_level::normal;
constexpr auto admin = auth_level::admin;

} // namespace

BOOST_AUTO_TEST_SUITE(codec_registry_test)

BOOST_AUTO_TEST_CASE(every_route_decodes_and_encodes_its_types) {
  const std::string uid = nccl_unique_id_hex();
  const std::string init_body = R"({"rank_offset": 1, "world_size": 2, "nccl_unique_id": ")" + uid + "\"}";
  check_route(route_case<GenerateReqInput, GenerateReqOutput>{"generate", R"({"text": "hi"})", normal});
  check_route(route_case<HealthCheckReqInput, HealthCheckReqOutput>{"health", "{}", normal});
  check_route(route_case<GetServerInfoReqInput, GetServerInfoReqOutput>{"get_server_info", "{}", normal});
  check_route(route_case<AbortReq, AbortReqOutput>{"abort_request", R"({"rid": "r1"})", admin});
  check_route(route_case<InitWeightsUpdateGroupReqInput, InitWeightsUpdateGroupReqOutput>{
    "init_weights_update_group", init_body.c_str(), admin});
  check_route(route_case<DestroyWeightsUpdateGroupReqInput, DestroyWeightsUpdateGroupReqOutput>{
    "destroy_weights_update_group", "{}", admin});
  check_route(route_case<UpdateWeightsFromDistributedReqInput, UpdateWeightsFromDistributedReqOutput>{
    "update_weights_from_distributed", R"({"names": ["w"], "dtypes": ["bfloat16"], "shapes": [[2]]})", admin});
  check_route(route_case<UpdateWeightsFromTensorReqInput, UpdateWeightsFromTensorReqOutput>{
    "update_weights_from_tensor",
    R"({"named_tensors": [{"name": "w", "dtype": "int8", "shape": [2], "data": "AQI="}]})", admin});
  check_route(route_case<UpdateWeightFromDiskReqInput, UpdateWeightFromDiskReqOutput>{
    "update_weights_from_disk", R"({"model_path": "/ckpt"})", admin});
  check_route(route_case<BeginWeightUpdateReqInput, BeginWeightUpdateReqOutput>{
    "begin_weight_update", "{}", admin});
  check_route(route_case<EndWeightUpdateReqInput, EndWeightUpdateReqOutput>{"end_weight_update", "{}", admin});
  check_route(route_case<PostProcessWeightsReqInput, PostProcessWeightsReqOutput>{
    "post_process_weights", "{}", admin});
  check_route(route_case<UpdateWeightVersionReqInput, UpdateWeightVersionReqOutput>{
    "update_weight_version", R"({"new_version": "v2"})", admin});
  check_route(route_case<CheckWeightsReqInput, CheckWeightsReqOutput>{"weights_checker", "{}", admin});
  check_route(route_case<GetWeightsByNameReqInput, GetWeightsByNameReqOutput>{
    "get_weights_by_name", R"({"name": "lm_head.weight"})", admin});
  check_route(route_case<PauseGenerationReqInput, PauseGenerationReqOutput>{"pause_generation", "{}", admin});
  check_route(route_case<ContinueGenerationReqInput, ContinueGenerationReqOutput>{
    "continue_generation", "{}", admin});
  check_route(route_case<FlushCacheReqInput, FlushCacheReqOutput>{"flush_cache", "{}", admin});
  check_route(route_case<ReleaseMemoryOccupationReqInput, ReleaseMemoryOccupationReqOutput>{
    "release_memory_occupation", R"({"tags": ["kv_cache"]})", admin});
  check_route(route_case<ResumeMemoryOccupationReqInput, ResumeMemoryOccupationReqOutput>{
    "resume_memory_occupation", "{}", admin});
  BOOST_TEST(all_codecs().size() == 20u);
}

// The security boundary as a set: only generation and read-only server state are normal.
BOOST_AUTO_TEST_CASE(admin_routes_are_exactly_the_privileged_ones) {
  std::set<std::string> normal_routes;
  std::set<std::string> admin_routes;
  for (const auto& e : all_codecs())
    (e.auth == auth_level::admin ? admin_routes : normal_routes).insert(std::string(e.route));
  BOOST_TEST((normal_routes == std::set<std::string>{"generate", "health", "get_server_info"}));
  BOOST_TEST((admin_routes ==
              std::set<std::string>{
                "abort_request", "init_weights_update_group", "destroy_weights_update_group",
                "update_weights_from_distributed", "update_weights_from_tensor",
                "update_weights_from_disk", "begin_weight_update", "end_weight_update",
                "post_process_weights", "update_weight_version", "weights_checker",
                "get_weights_by_name", "pause_generation", "continue_generation", "flush_cache",
                "release_memory_occupation", "resume_memory_occupation"}));
}

BOOST_AUTO_TEST_CASE(routes_are_unique_and_unknown_routes_are_null) {
  std::set<std::string_view> seen;
  for (const auto& e : all_codecs()) {
    BOOST_TEST(seen.insert(e.route).second, "duplicate route " << e.route);
    BOOST_TEST(e.route.find('/') == std::string_view::npos);
    BOOST_TEST(find_codec(e.route) == &e);
  }
  BOOST_TEST(find_codec("") == nullptr);
  BOOST_TEST(find_codec("/generate") == nullptr); // names carry no slash
  BOOST_TEST(find_codec("Generate") == nullptr);
  BOOST_TEST(find_codec("update_weights_from_ipc") == nullptr);
  BOOST_TEST(find_codec("generate ") == nullptr);
}

BOOST_AUTO_TEST_CASE(decode_errors_are_the_codec_messages) {
  auto e = find_codec("generate");
  BOOST_TEST_REQUIRE(e != nullptr);
  auto r = e->decode(json::parse(R"({"text": "a", "sampling_params": {"top_p": 2}})"));
  BOOST_TEST_REQUIRE(!r.has_value());
  BOOST_TEST(error_text(r) == "sampling_params.top_p: expected a number in (0, 1], got 2");
}

BOOST_AUTO_TEST_SUITE_END()
