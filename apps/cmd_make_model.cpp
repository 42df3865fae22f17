// `rlserve make-model`: writes a Hugging Face model directory with seeded random weights (see
// model/make_model.hpp for what goes into it).
#include <cstdio>
#include <memory>
#include <string>

#include "apps/command.hpp"
#include "model/make_model.hpp"

namespace rlserve::apps {

namespace {

void add_make_model(CLI::App& app) {
  auto options = std::make_shared<model::make_model_options>();
  auto* cmd = app.add_subcommand("make-model", "Write a model directory (config, seeded random "
                                               "weights, tokenizer) for tests and demos");
  cmd->add_option("--arch", options->arch, "Architecture: qwen3 or qwen3-moe")
    ->capture_default_str();
  cmd->add_option("--preset", options->preset,
                  "Size: tiny, small, medium (the smallest the GPU kernels run) or a3b-slice "
                  "(4 layers of Qwen3-30B-A3B's shape, for GPU benchmarks)")
    ->capture_default_str();
  cmd->add_option("--out", options->out, "Output directory (new, empty, or an earlier make-model "
                                         "output)")->required();
  cmd->add_option("--seed", options->seed, "Seed of the random weights")->capture_default_str();
  cmd->add_option("--dtype", options->dtype, "Weight dtype: bfloat16, float16 or float32")
    ->capture_default_str();
  cmd->add_option("--quant", options->quant,
                  "Write an INT4 checkpoint (routed experts quantized): int4-asym, int4-sym-qat or int4-sym");
  cmd->add_option("--group-size", options->group_size, "With --quant: 32, 64, 128, or -1 (per channel)")
    ->capture_default_str();
  cmd->callback([options] {
    if (auto s = model::make_model(*options); !s)
      throw command_failed(s.error());
    std::printf("wrote %s: %s %s, %s weights%s, seed %llu\n", options->out.string().c_str(),
                options->arch.c_str(), options->preset.c_str(), options->dtype.c_str(),
                options->quant.empty()
                  ? ""
                  : (" (experts " + options->quant + ", group size " + std::to_string(options->group_size) + ")").c_str(),
                static_cast<unsigned long long>(options->seed));
  });
}

const command_registrar registrar{10, add_make_model};

} // namespace

} // namespace rlserve::apps
