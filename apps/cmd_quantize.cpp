// `rlserve quantize`: a BF16 Hugging Face checkpoint -> compressed-tensors pack-quantized INT4
// (W4A16), with the engine's own recipes (docs/formats.md §2). See model/quant/int4_checkpoint.hpp.
//
//   rlserve quantize --model IN --out OUT --recipe int4-asym --group-size 128
//   rlserve quantize --model IN --out OUT --recipe int4-sym-qat --group-size 32 --targets linear
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "apps/command.hpp"
#include "model/quant/int4_checkpoint.hpp"

namespace rlserve::apps {

namespace {

namespace k4 = rlserve::kernels;

struct quantize_cli {
  std::string model, out, recipe = "int4-asym", targets = "experts", zp_layout = "standard";
  int32_t group_size = 128;
  double max_shard_gib = 5.0;
  int threads = 0;
  bool quiet = false;
};

void run_quantize(const quantize_cli& c) {
  model::quant::quantize_checkpoint_options o;
  o.model = c.model;
  o.out = c.out;
  auto recipe = k4::parse_int4_recipe(c.recipe);
  if (!recipe)
    throw command_failed(fmt::format("--recipe {}: use int4-asym, int4-sym or int4-sym-qat", c.recipe));
  o.recipe = *recipe;
  auto targets = model::quant::parse_quant_targets(c.targets);
  if (!targets)
    throw command_failed(fmt::format("--targets {}: use experts or linear", c.targets));
  o.targets = *targets;
  auto layout = k4::parse_zero_point_layout(c.zp_layout);
  if (!layout)
    throw command_failed(fmt::format("--zp-layout {}: use standard or miles", c.zp_layout));
  o.zp_layout = *layout;
  o.group_size = c.group_size;
  if (!(c.max_shard_gib > 0))
    throw command_failed("--max-shard-size must be positive");
  o.max_shard_bytes = static_cast<std::size_t>(c.max_shard_gib * (1ull << 30));
  o.threads = c.threads;
  if (!c.quiet)
    o.progress = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  auto report = model::quant::quantize_checkpoint(o);
  if (!report)
    throw command_failed(report.error());
  std::printf("wrote %s: %lld weights quantized (%s, group size %d, %s), %lld tensors copied, "
              "%zu Linear modules left in BF16\n",
              c.out.c_str(), static_cast<long long>(report->quantized), c.recipe.c_str(), c.group_size,
              c.targets.c_str(), static_cast<long long>(report->copied), report->ignored.size());
}

void add_quantize(CLI::App& app) {
  auto c = std::make_shared<quantize_cli>();
  auto* cmd = app.add_subcommand("quantize", "Quantize a BF16 checkpoint to compressed-tensors INT4 "
                                             "(pack-quantized, W4A16)");
  cmd->add_option("--model", c->model, "Input model directory (config.json + safetensors)")->required();
  cmd->add_option("--out", c->out, "Output model directory")->required();
  cmd->add_option("--recipe", c->recipe, "int4-asym, int4-sym (amax/7.5) or int4-sym-qat (amax/7, [-7, 7])")
    ->capture_default_str();
  cmd->add_option("--group-size", c->group_size, "32, 64, 128, or -1 for per-channel")->capture_default_str();
  cmd->add_option("--targets", c->targets,
                  "experts (routed MoE experts) or linear (every Linear but lm_head, embeddings, routers)")
    ->capture_default_str();
  cmd->add_option("--zp-layout", c->zp_layout,
                  "asymmetric zero points: standard (compressed-tensors [n/8, k/G]) or miles ([k/G, n/8])")
    ->capture_default_str();
  cmd->add_option("--max-shard-size", c->max_shard_gib, "Shard size in GiB")->capture_default_str();
  cmd->add_option("--threads", c->threads, "Quantization threads (0 = all cores)")->capture_default_str();
  cmd->add_flag("--quiet", c->quiet, "No progress lines on stderr");
  cmd->callback([c] { run_quantize(*c); });
}

const command_registrar registrar{60, add_quantize};

} // namespace

} // namespace rlserve::apps
