// `rlserve inspect-checkpoint`: the tensors of a checkpoint directory (name, dtype, shape, bytes,
// xxh64 of the bytes) as the engine reads them; the safetensors interop test compares this with
// what the Python `safetensors` package reads.
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "apps/command.hpp"
#include "model/checkpoint.hpp"

namespace rlserve::apps {

namespace {

struct inspect_options {
  std::string model;
  bool json = false;
};

void run_inspect(const inspect_options& o) {
  auto ckpt = model::checkpoint::open(o.model);
  if (!ckpt)
    throw command_failed(ckpt.error());
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& name : ckpt->names()) {
    auto t = ckpt->tensor(name);
    if (!t)
      throw command_failed(t.error());
    const auto hash = fmt::format("{:016x}", XXH64(t->data.get(), t->nbytes, 0));
    if (o.json) {
      tensors.push_back({{"name", name}, {"dtype", safetensors_name(t->type)},
                         {"shape", t->shape}, {"nbytes", t->nbytes}, {"xxh64", hash}});
    } else {
      std::printf("%-60s %-5s %-16s %s\n", name.c_str(),
                  std::string(safetensors_name(t->type)).c_str(),
                  model::shape_string(t->shape).c_str(), hash.c_str());
    }
  }
  if (o.json) {
    nlohmann::json files = nlohmann::json::array();
    for (const auto& f : ckpt->files())
      files.push_back(f.filename().string());
    nlohmann::json out = {{"model", o.model}, {"files", files}, {"tensors", tensors}};
    std::printf("%s\n", out.dump().c_str());
  }
}

void add_inspect(CLI::App& app) {
  auto options = std::make_shared<inspect_options>();
  auto* cmd = app.add_subcommand("inspect-checkpoint", "List the tensors of a checkpoint "
                                                       "directory (name, dtype, shape, xxh64)");
  cmd->add_option("--model", options->model, "Model directory or .safetensors file")->required();
  cmd->add_flag("--json", options->json, "One JSON object on stdout");
  cmd->callback([options] { run_inspect(*options); });
}

const command_registrar registrar{91, add_inspect};

} // namespace

} // namespace rlserve::apps
