// `rlserve check-weights`: starts the engine on a model and prints what check_weights(checksum)
// reports — per-tensor XXH3-64 of the load-format bytes and the per-role checksums — so a
// trainer (or a test) can compare them with its own numbers.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "actors/engine.hpp"
#include "apps/command.hpp"
#include "messages/json_codec.hpp"

namespace rlserve::apps {

namespace {

struct check_options {
  std::filesystem::path model;
  std::filesystem::path draft_model;
  std::vector<std::string> skip;
  bool json = false;
  std::string device = "auto";
};

void run(const check_options& o) {
  engine_config cfg;
  cfg.model_path = o.model;
  cfg.draft_model_path = o.draft_model;
  cfg.device = o.device;
  auto engine = Engine::start(cfg);
  if (!engine)
    throw command_failed(engine.error());
  CheckWeightsReqInput req;
  req.skip_tensor_list = o.skip;
  auto out = (*engine)->check_weights(req);
  if (!out.success)
    throw command_failed(out.message);
  if (o.json) {
    std::cout << to_json(out).dump(2) << "\n";
    return;
  }
  for (const auto& info : out.payload) {
    for (const auto& [name, digest] : info.checksums)
      std::printf("%s  %s\n", digest.c_str(), name.c_str());
    for (const auto& [role, digest] : info.role_checksums)
      std::printf("%s  (role %s)\n", digest.c_str(), role.c_str());
    std::printf("%s  (all)\n", info.per_gpu_checksum.c_str());
  }
}

void add_check_weights(CLI::App& app) {
  auto o = std::make_shared<check_options>();
  auto* cmd = app.add_subcommand("check-weights", "Print the engine's weight checksums (XXH3-64 "
                                                  "of each tensor's load-format bytes)");
  cmd->add_option("--model", o->model, "Model directory (default: the built-in tiny model)");
  cmd->add_option("--draft-model", o->draft_model, "Draft model directory");
  cmd->add_option("--device", o->device, "Where to run: auto (the GPU when one is visible), cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--skip", o->skip, "Leave out tensors whose name contains this (repeatable)");
  cmd->add_flag("--json", o->json, "The CheckWeightsReqOutput as JSON");
  cmd->callback([o] { run(*o); });
}

const command_registrar registrar{30, add_check_weights};

} // namespace

} // namespace rlserve::apps
