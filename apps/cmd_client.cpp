// `rlserve client`: talks to `rlserve serve` over the websocket protocol (net/client.hpp).
//
//   rlserve client generate --prompt "Hello" --max-new-tokens 16 --stream
//   rlserve client pause_generation mode=retract
//   rlserve client update-weights --safetensors new.safetensors --weight-version step-7
//   rlserve client continue_generation
//   rlserve client get_server_info --json
//
// One subcommand per route of messages/codec_registry (so a family registered later has its
// subcommand without code here); its body comes from --body JSON and/or key=value arguments
// (the value is read as JSON when it parses, else as a string). update_weights_from_tensor
// also takes --safetensors FILE: every tensor in the file goes in one binary frame.
// Exit status 1 when the server refuses the request or replies with success = false.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "apps/command.hpp"
#include "messages/codec_registry.hpp"
#include "model/safetensors.hpp"
#include "net/client.hpp"

namespace rlserve::apps {

namespace {

using net::json;

struct client_cli {
  net::client_options conn;
  double timeout_s = 600;
  bool json = false;
  // generate
  std::vector<std::string> prompts;
  std::string input_ids;
  SamplingParams sampling;
  std::optional<uint64_t> seed;
  bool stream = false;
  bool logprobs = false;
  // other routes
  std::string body;
  std::string safetensors;
  // update-weights
  std::string pause_mode = "retract";
  std::string weight_version;
  double bucket_mib = 256;
};

std::unique_ptr<net::client> connect(client_cli& o) {
  o.conn.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  auto c = net::client::connect(o.conn);
  if (!c)
    throw command_failed(c.error());
  return std::move(*c);
}

void run_generate(client_cli& o) {
  std::vector<GenerateReqInput> reqs;
  for (const auto& p : o.prompts) {
    GenerateReqInput r;
    r.text = p;
    reqs.push_back(std::move(r));
  }
  if (!o.input_ids.empty()) {
    GenerateReqInput r;
    std::vector<int32_t> ids;
    std::stringstream in(o.input_ids);
    std::string item;
    while (std::getline(in, item, ','))
      try {
        ids.push_back(static_cast<int32_t>(std::stol(item)));
      } catch (const std::exception&) {
        throw command_failed("--input-ids: \"" + item + "\" is not a token id (expected 1,2,3)");
      }
    r.input_ids = std::move(ids);
    reqs.push_back(std::move(r));
  }
  if (reqs.empty())
    throw command_failed("give --prompt TEXT (repeatable) or --input-ids 1,2,3");
  auto c = connect(o);
  // All requests go out at once (multiplexed on the one connection); results print in order.
  std::vector<int64_t> ids;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    auto& r = reqs[i];
    r.sampling_params = o.sampling;
    if (o.seed)
      r.sampling_params.sampling_seed = *o.seed + i;
    r.return_logprob = o.logprobs || o.json;
    r.stream = o.stream && !o.json && i == 0;
    auto id = c->send("generate", to_json(r));
    if (!id)
      throw command_failed(id.error());
    ids.push_back(*id);
  }
  const bool streamed_first = o.stream && !o.json;
  if (streamed_first && ids.size() > 1)
    std::printf("--- request 1 ---\n");
  std::map<int64_t, GenerateReqOutput> done;
  bool all_ok = true;
  while (done.size() < ids.size()) {
    auto m = c->receive();
    if (!m)
      throw command_failed(m.error());
    if (m->kind == net::server_message::error)
      throw command_failed(m->code + ": " + m->message);
    if (!m->id.is_number_integer())
      continue;
    auto id = m->id.get<int64_t>();
    auto out = from_json<GenerateReqOutput>(m->body);
    if (!out)
      throw command_failed("the server's reply does not decode: " + out.error());
    if (m->kind == net::server_message::chunk) {
      std::fwrite(out->text.data(), 1, out->text.size(), stdout);
      std::fflush(stdout);
      continue;
    }
    all_ok = all_ok && out->success;
    done[id] = std::move(*out);
  }
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto& out = done[ids[i]];
    if (o.json) {
      std::cout << to_json(out).dump() << "\n";
      continue;
    }
    if (ids.size() > 1 && !(streamed_first && i == 0))
      std::printf("--- request %zu ---\n", i + 1);
    if (!out.success) {
      std::printf("error: %s\n", out.message.c_str());
      continue;
    }
    if (!(streamed_first && i == 0))
      std::printf("%s", out.text.c_str());
    std::printf("\n[%s, %d prompt + %d generated tokens, weight version %s]\n",
                out.finish_reason ? out.finish_reason->type.c_str() : "?", out.prompt_tokens,
                out.completion_tokens, out.weight_version.c_str());
  }
  std::fflush(stdout);
  c->close();
  if (!all_ok)
    throw command_failed("some requests failed (see above)");
}

json body_from(const client_cli& o, const std::vector<std::string>& pairs) {
  json body = json::object();
  if (!o.body.empty()) {
    auto j = parse_json(o.body);
    if (!j || !j->is_object())
      throw command_failed("--body: expected a JSON object" + (j ? std::string() : ": " + j.error()));
    body = std::move(*j);
  }
  for (const auto& kv : pairs) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      throw command_failed("\"" + kv + "\": expected key=value (the value as JSON, or a string)");
    auto value = parse_json(kv.substr(eq + 1));
    body[kv.substr(0, eq)] = value ? *value : json(kv.substr(eq + 1));
  }
  return body;
}

void run_route(client_cli& o, std::string_view route, const std::vector<std::string>& pairs) {
  json body = body_from(o, pairs);
  auto c = connect(o);
  expected<net::server_message> m = fail("not sent");
  if (route == "update_weights_from_tensor" && !o.safetensors.empty()) {
    auto file = model::safetensors_file::open(o.safetensors);
    if (!file)
      throw command_failed(file.error());
    body["named_tensors"] = json::array();
    auto req = from_json<UpdateWeightsFromTensorReqInput>(body);
    if (!req)
      throw command_failed(req.error());
    for (const auto& name : file->names()) {
      auto t = file->tensor(name);
      if (!t)
        throw command_failed(t.error());
      req->named_tensors.push_back({name, std::move(*t)});
    }
    auto id = c->send_tensors(*req);
    if (!id)
      throw command_failed(id.error());
    m = c->wait_for(*id);
  } else {
    m = c->call(route, body);
  }
  if (!m)
    throw command_failed(m.error());
  if (o.json) {
    std::cout << m->body.dump() << "\n";
  } else if (m->body.is_object() && m->body.contains("message") && m->body.size() <= 3) {
    std::printf("%s: %s\n", m->ok ? "ok" : "failed", m->body["message"].get<std::string>().c_str());
  } else {
    std::cout << m->body.dump(2) << "\n";
  }
  std::fflush(stdout);
  c->close();
  if (!m->ok)
    throw command_failed(std::string(route) + " failed");
}

// The trainer's whole cycle on one connection: a session belongs to the connection that opened
// it (it is aborted when that connection ends), so begin, update and end must share one.
void run_update_weights(client_cli& o) {
  if (o.safetensors.empty())
    throw command_failed("give --safetensors FILE (the tensors to send, under their HF names)");
  auto file = model::safetensors_file::open(o.safetensors);
  if (!file)
    throw command_failed(file.error());
  auto c = connect(o);
  using clock = std::chrono::steady_clock;
  auto step = [&](const char* route, const json& body) {
    auto t0 = clock::now();
    auto m = c->call(route, body);
    if (!m)
      throw command_failed(std::string(route) + ": " + m.error());
    double s = std::chrono::duration<double>(clock::now() - t0).count();
    if (!m->ok)
      throw command_failed(std::string(route) + " failed: " + m->body.value("message", std::string()));
    if (!o.json)
      std::printf("%-28s %8.3f s  %s\n", route, s, m->body.value("message", std::string()).c_str());
    return *m;
  };
  if (o.pause_mode != "none")
    step("pause_generation", {{"mode", o.pause_mode}});
  step("begin_weight_update", json::object());
  const auto bucket_limit = static_cast<std::size_t>(o.bucket_mib * 1024 * 1024);
  UpdateWeightsFromTensorReqInput bucket;
  std::size_t bucket_bytes = 0, buckets = 0, total = 0;
  auto t0 = clock::now();
  auto flush = [&] {
    if (bucket.named_tensors.empty())
      return;
    auto r = c->update_weights_from_tensor(bucket);
    if (!r)
      throw command_failed("update_weights_from_tensor: " + r.error());
    if (!r->success) {
      (void)c->call("end_weight_update", {{"abort", true}});
      throw command_failed("update_weights_from_tensor failed (session aborted): " + r->message);
    }
    ++buckets;
    bucket.named_tensors.clear();
    bucket_bytes = 0;
  };
  for (const auto& name : file->names()) {
    auto t = file->tensor(name);
    if (!t)
      throw command_failed(t.error());
    if (bucket_bytes + t->nbytes > bucket_limit)
      flush();
    bucket_bytes += t->nbytes;
    total += t->nbytes;
    bucket.named_tensors.push_back({name, std::move(*t)});
  }
  flush();
  double secs = std::chrono::duration<double>(clock::now() - t0).count();
  if (!o.json)
    std::printf("%-28s %8.3f s  %zu tensors, %zu bytes in %zu binary frames\n", "update_weights_from_tensor",
                secs, file->names().size(), total, buckets);
  json end = json::object();
  if (!o.weight_version.empty())
    end["weight_version"] = o.weight_version;
  auto e = step("end_weight_update", end);
  if (o.pause_mode != "none")
    step("continue_generation", json::object());
  if (o.json)
    std::cout << e.body.dump() << "\n";
  c->close();
}

void add_client(CLI::App& app) {
  auto o = std::make_shared<client_cli>();
  auto* cmd = app.add_subcommand("client", "Talk to `rlserve serve` (every route; see docs/protocol.md)");
  cmd->require_subcommand(1);
  cmd->add_option("--host", o->conn.host, "Server address")->capture_default_str();
  cmd->add_option("--port", o->conn.port, "Server port")->capture_default_str();
  cmd->add_option("--api-key", o->conn.api_key, "API key")->envname("RLSERVE_API_KEY");
  cmd->add_option("--admin-api-key", o->conn.admin_api_key, "Admin API key")
    ->envname("RLSERVE_ADMIN_API_KEY");
  cmd->add_option("--timeout", o->timeout_s, "Seconds to wait for the server")->capture_default_str();
  cmd->add_flag("--json", o->json, "Print the reply body as one JSON line");

  auto* gen = cmd->add_subcommand("generate", "Generate (streams with --stream)");
  gen->add_option("--prompt", o->prompts, "Prompt text (repeatable: requests share the connection)");
  gen->add_option("--input-ids", o->input_ids, "Prompt token ids, comma-separated");
  gen->add_option("--max-new-tokens", o->sampling.max_new_tokens, "Tokens to generate at most")
    ->capture_default_str();
  gen->add_option("--temperature", o->sampling.temperature, "0 means greedy")->capture_default_str();
  gen->add_option("--top-k", o->sampling.top_k, "-1: whole vocabulary");
  gen->add_option("--top-p", o->sampling.top_p, "Nucleus sampling mass");
  gen->add_option("--seed", o->seed, "Sampling seed (request i gets seed + i)");
  gen->add_option("--stop", o->sampling.stop, "Stop string (repeatable)");
  gen->add_flag("--ignore-eos", o->sampling.ignore_eos, "Keep going after EOS");
  gen->add_flag("--logprobs", o->logprobs, "Return per-token logprobs (see --json)");
  gen->add_flag("--stream", o->stream, "Print the first request's text as it is generated");
  gen->add_flag("--json", o->json, "One JSON object per request (SGLang's response shape)");
  gen->callback([o] { run_generate(*o); });

  auto* upd = cmd->add_subcommand(
    "update-weights", "The whole update on one connection: pause, begin, tensors in binary frames, end, continue");
  upd->add_option("--safetensors", o->safetensors, "The tensors to send (HF names)")->required();
  upd->add_option("--pause-mode", o->pause_mode, "abort, retract, in_place, or none (no pause)")
    ->capture_default_str();
  upd->add_option("--weight-version", o->weight_version, "The label the new weights get");
  upd->add_option("--bucket-mib", o->bucket_mib, "Tensor bytes per binary frame")->capture_default_str();
  upd->add_flag("--json", o->json, "Print end_weight_update's reply as one JSON line");
  upd->callback([o] { run_update_weights(*o); });

  for (const auto& c : all_codecs()) {
    if (c.route == "generate")
      continue;
    std::string route(c.route);
    auto* sub = cmd->add_subcommand(
      route, std::string(c.request_type) + " -> " + std::string(c.reply_type) + " (" +
               to_string(c.auth) + " level)");
    auto pairs = std::make_shared<std::vector<std::string>>();
    sub->add_option("fields", *pairs, "Body fields as key=value (value read as JSON when it parses)");
    sub->add_option("--body", o->body, "The whole body as a JSON object");
    sub->add_flag("--json", o->json, "Print the reply body as one JSON line");
    if (route == "update_weights_from_tensor")
      sub->add_option("--safetensors", o->safetensors,
                      "Send every tensor of this file (HF names) in one binary frame");
    sub->callback([o, route, pairs] { run_route(*o, route, *pairs); });
  }
}

const command_registrar registrar{45, add_client};

} // namespace

} // namespace rlserve::apps
