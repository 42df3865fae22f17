// `rlserve demo` — the main job (`make run`): the whole RL weight-update cycle on one engine.
// Rollouts with the current weights; rollouts in flight paused (retract); a "trainer" pushes
// perturbed copies of every tensor in buckets inside a begin/end session; the engine's XXH3-64
// checksums are checked against the trainer's own; a bad update is refused without changing
// anything; generation continues on the new version; timings at the end.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <string_view>
#include <random>
#include <thread>

#include <xxhash.h>

#include "actors/engine.hpp"
#include "apps/command.hpp"
#include "kernels/bf16.hpp"
#include "model/checkpoint.hpp"
#include "model/config.hpp"
#include "model/qwen3_gpu.hpp"
#include "model/quant/int4_checkpoint.hpp"

namespace rlserve::apps {

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string shorten(const std::string& s, std::size_t n = 48) {
  std::string out;
  for (char c : s)
    out += c == '\n' ? ' ' : c;
  return out.size() > n ? out.substr(0, n) + "..." : out;
}

struct demo_options {
  std::string device = "auto";
  std::filesystem::path model;
  int32_t rollouts = 4;
  int32_t max_new_tokens = 24;
  int32_t buckets = 3;
  uint64_t seed = 1;
  std::string quantize; // --quantize: INT4 experts, quantized at load and at every update
  int32_t group_size = 128;
};

// What the trainer computes on its side: new weights (the served ones, perturbed by noise of
// 50% of each tensor's RMS) and its own checksum of every byte it sends.
struct trainer_update {
  std::vector<NamedTensor> tensors;
  std::map<std::string, std::string> checksums; // name -> XXH3-64 hex
  std::size_t bytes = 0;
};

// With --quantize the engine holds INT4 experts: the trainer sends their BF16 `.weight` (the
// engine quantizes it, as it quantized the checkpoint at load) and expects the checksums of what
// the same quantizer makes of it.
expected<trainer_update> make_trainer_update(const Engine& engine, const demo_options& o, uint64_t seed) {
  auto ckpt = model::checkpoint::open(engine.model_path());
  if (!ckpt)
    return std::move(ckpt).take_failure();
  trainer_update out;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  for (const auto& manifest_spec : engine.target_manifest().parameters) {
    std::string name = manifest_spec.name;
    const bool int4 = name.ends_with(".weight_packed");
    if (!int4 && (name.ends_with(".weight_scale") || name.ends_with(".weight_zero_point") ||
                  name.ends_with(".weight_shape")))
      continue; // sent as the module's `.weight` with its weight_packed
    if (int4) {
      if (o.quantize.empty())
        return fail("the demo perturbs BF16 weights and '" + name + "' is INT4: start from a BF16 "
                    "checkpoint and pass --quantize");
      name = name.substr(0, name.size() - std::string_view("_packed").size());
    }
    auto t = ckpt->tensor(name);
    if (!t)
      return std::move(t).take_failure();
    if (t->type != dtype::bf16 && t->type != dtype::f32)
      return fail("the demo perturbs bfloat16 or float32 weights; '" + name + "' is " +
                  std::string(torch_name(t->type)));
    auto n = static_cast<std::size_t>(t->numel());
    std::vector<float> w(n);
    for (std::size_t i = 0; i < n; ++i)
      w[i] = t->type == dtype::bf16 ? kernels::bf16_to_float(t->as<uint16_t>()[i]) : t->as<float>()[i];
    double sum_sq = 0;
    for (float v : w)
      sum_sq += double(v) * v;
    auto scale = static_cast<float>(0.5 * std::sqrt(sum_sq / std::max<std::size_t>(n, 1)));
    std::vector<std::byte> bytes(t->nbytes);
    for (std::size_t i = 0; i < n; ++i) {
      float v = w[i] + scale * noise(rng);
      if (t->type == dtype::bf16) {
        uint16_t b = kernels::float_to_bf16(v);
        std::memcpy(bytes.data() + 2 * i, &b, 2);
      } else {
        std::memcpy(bytes.data() + 4 * i, &v, 4);
      }
    }
    auto sent = HostTensor::adopt(t->type, t->shape, std::move(bytes));
    if (int4) {
      model::quant::quantize_options q;
      q.recipe = *kernels::parse_int4_recipe(o.quantize); // the engine accepted it
      q.group_size = o.group_size;
      auto held = model::quant::quantize_weight(name, sent, q);
      if (!held)
        return std::move(held).take_failure();
      for (const auto& h : *held)
        out.checksums[h.name] = hex16(XXH3_64bits(h.tensor.data.get(), h.tensor.nbytes));
    } else {
      out.checksums[name] = hex16(XXH3_64bits(sent.data.get(), sent.nbytes));
    }
    out.bytes += sent.nbytes;
    out.tensors.push_back({name, std::move(sent)});
  }
  return out;
}

std::vector<GenerateReqInput> rollout_requests(const demo_options& o, bool greedy) {
  static const char* prompts[] = {"The weights of a policy", "Once upon a time",
                                  "def reward(sample):", "Reinforcement learning is",
                                  "2 + 2 =", "A rollout engine"};
  std::vector<GenerateReqInput> out;
  for (int32_t i = 0; i < o.rollouts; ++i) {
    GenerateReqInput r;
    r.text = prompts[i % 6];
    r.sampling_params.max_new_tokens = o.max_new_tokens;
    r.sampling_params.temperature = greedy ? 0.0f : 0.8f;
    r.sampling_params.sampling_seed = o.seed + static_cast<uint64_t>(i);
    r.sampling_params.ignore_eos = true;
    r.return_logprob = true;
    out.push_back(std::move(r));
  }
  return out;
}

struct rollout_stats {
  std::vector<GenerateReqOutput> outputs;
  double seconds = 0;
  int64_t tokens = 0;
};

rollout_stats run_rollouts(Engine& engine, const std::vector<GenerateReqInput>& reqs) {
  rollout_stats s;
  auto t0 = clock_type::now();
  std::vector<std::future<GenerateReqOutput>> futures;
  for (const auto& r : reqs)
    futures.push_back(engine.generate_async(r));
  for (auto& f : futures) {
    s.outputs.push_back(f.get());
    s.tokens += s.outputs.back().completion_tokens;
  }
  s.seconds = seconds_since(t0);
  return s;
}

void check(bool ok, const std::string& what) {
  if (!ok)
    throw command_failed(what);
}

void run_on(const demo_options& o, bool on_gpu);

void run(const demo_options& o) {
  // On a GPU (--device auto finds one, or cuda asked for) without a model: the built-in GPU model
  // with INT4 experts, quantized on the device at load and at the update.
  const bool on_gpu = o.device != "cpu" && (o.device != "auto" || model::gpu_available());
  auto opts = o;
  if (on_gpu && opts.model.empty() && opts.quantize.empty())
    opts.quantize = "int4-asym";
  run_on(opts, on_gpu);
}

void run_on(const demo_options& o, bool on_gpu) {
  // Phase -> seconds, in the order the phases ran.
  struct phase_timings {
    std::vector<std::pair<std::string, double>> rows;
    double& operator[](const std::string& name) {
      for (auto& [n, secs] : rows)
        if (n == name)
          return secs;
      rows.emplace_back(name, 0.0);
      return rows.back().second;
    }
  } timings;
  std::printf("rlserve demo: serve rollouts, take new weights from a trainer, verify them, serve "
              "again (%s)\n\n", on_gpu ? "GPU" : "CPU");

  // 1. the model
  auto t = clock_type::now();
  std::filesystem::path path = o.model;
  if (path.empty()) {
    bool exists = std::filesystem::exists(builtin_model_dir(on_gpu) / "config.json");
    if (!exists)
      std::printf("[1/7] building the built-in %s model in %s ...\n", on_gpu ? "GPU" : "tiny",
                  builtin_model_dir(on_gpu).string().c_str());
    auto dir = ensure_builtin_model(on_gpu);
    check(dir.has_value(), dir ? "" : dir.error());
    path = *dir;
  }
  auto config = model::load_model_config(path);
  check(config.has_value(), config ? "" : config.error());
  std::printf("[1/7] model %s\n      %s: %lld layers, hidden %lld, vocab %lld (%.2f s)\n",
              path.string().c_str(), config->architecture.c_str(),
              static_cast<long long>(config->num_hidden_layers),
              static_cast<long long>(config->hidden_size), static_cast<long long>(config->vocab_size),
              seconds_since(t));

  // 2. the engine
  t = clock_type::now();
  engine_config cfg;
  cfg.model_path = path;
  cfg.device = o.device;
  cfg.quantize = o.quantize;
  cfg.quantize_group_size = o.group_size;
  auto started = Engine::start(cfg);
  check(started.has_value(), started ? "" : started.error());
  auto& engine = **started;
  timings["engine start"] = seconds_since(t);
  auto info = engine.get_server_info();
  std::printf("[2/7] engine up in %.3f s: %zu tensors on %s, weight version %s\n",
              timings["engine start"], engine.target_manifest().parameters.size(),
              info.device.c_str(), info.weight_version.c_str());

  // 3. rollouts on the initial weights
  auto greedy = rollout_requests(o, true);
  auto before = run_rollouts(engine, greedy);
  timings["rollouts before"] = before.seconds;
  std::printf("[3/7] %d greedy rollouts on weight version %s: %lld tokens in %.3f s (%.0f tok/s)\n",
              o.rollouts, info.weight_version.c_str(), static_cast<long long>(before.tokens),
              before.seconds, before.tokens / std::max(before.seconds, 1e-9));
  for (std::size_t i = 0; i < before.outputs.size(); ++i) {
    check(before.outputs[i].success, before.outputs[i].message);
    std::printf("      \"%s\" -> \"%s\"\n", greedy[i].text->c_str(),
                shorten(before.outputs[i].text).c_str());
  }

  // 4. long rollouts in flight, then pause (retract)
  auto long_reqs = rollout_requests(o, false);
  for (auto& r : long_reqs)
    r.sampling_params.max_new_tokens = 4 * o.max_new_tokens;
  std::vector<std::future<GenerateReqOutput>> in_flight;
  for (const auto& r : long_reqs)
    in_flight.push_back(engine.generate_async(r));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  t = clock_type::now();
  auto paused = engine.pause_generation({pause_mode::retract});
  check(paused.success, paused.message);
  timings["pause (retract)"] = seconds_since(t);
  auto during = engine.get_server_info();
  std::printf("[4/7] %d sampled rollouts in flight; pause_generation(retract): %s "
              "(%d queued with their tokens so far)\n",
              o.rollouts, paused.message.c_str(), during.waiting_requests);

  // 5. the trainer's update, in buckets, inside a session
  t = clock_type::now();
  auto update = make_trainer_update(engine, o, o.seed * 7919);
  check(update.has_value(), update ? "" : update.error());
  timings["trainer: make new weights"] = seconds_since(t);
  std::printf("[5/7] trainer: %zu new tensors (%.2f MB) -> begin / %d buckets / end\n",
              update->tensors.size(), update->bytes / 1e6, o.buckets);
  t = clock_type::now();
  auto begun = engine.begin_weight_update({runner_selector::all});
  check(begun.success, begun.message);
  timings["begin_weight_update"] = seconds_since(t);
  std::printf("      begin_weight_update(selector=all): %s (%.2f ms)\n", begun.message.c_str(),
              timings["begin_weight_update"] * 1e3);
  auto per_bucket = (update->tensors.size() + o.buckets - 1) / o.buckets;
  double staging = 0;
  for (int32_t b = 0; b < o.buckets; ++b) {
    UpdateWeightsFromTensorReqInput req;
    auto first = std::min(update->tensors.size(), b * per_bucket);
    auto last = std::min(update->tensors.size(), first + per_bucket);
    req.named_tensors.assign(update->tensors.begin() + first, update->tensors.begin() + last);
    auto tb = clock_type::now();
    auto staged = engine.update_weights_from_tensor(std::move(req));
    check(staged.success, staged.message);
    staging += seconds_since(tb);
    std::printf("      bucket %d/%d: %s (%.2f ms)\n", b + 1, o.buckets, staged.message.c_str(),
                seconds_since(tb) * 1e3);
  }
  timings["update_weights_from_tensor (all buckets)"] = staging;
  t = clock_type::now();
  auto ended = engine.end_weight_update({});
  check(ended.success, ended.message);
  timings["end_weight_update (commit)"] = seconds_since(t);
  std::printf("      end_weight_update: %s (%.2f ms)\n", ended.message.c_str(),
              timings["end_weight_update (commit)"] * 1e3);

  // 6. verification
  t = clock_type::now();
  auto sums = engine.check_weights({});
  timings["check_weights (checksum)"] = seconds_since(t);
  check(sums.success && sums.payload.size() == 1, "check_weights failed: " + sums.message);
  std::size_t matching = 0;
  std::string role_stream;
  for (const auto& [name, digest] : update->checksums) {
    auto it = sums.payload[0].checksums.find(name);
    matching += it != sums.payload[0].checksums.end() && it->second == digest;
    role_stream += name + ":" + digest + "\n";
  }
  auto trainer_role = hex16(XXH3_64bits(role_stream.data(), role_stream.size()));
  auto engine_role = sums.payload[0].role_checksums["target"];
  std::printf("[6/7] check_weights(checksum) against the trainer's XXH3-64 of what it sent:\n"
              "      %zu/%zu tensors match; role checksum: engine %s, trainer %s -> %s (%.2f ms)\n",
              matching, update->checksums.size(), engine_role.c_str(), trainer_role.c_str(),
              engine_role == trainer_role ? "match" : "MISMATCH",
              timings["check_weights (checksum)"] * 1e3);
  check(matching == update->checksums.size() && engine_role == trainer_role,
        "the engine's weights differ from what the trainer sent");
  // A bad update changes nothing: one wrong name sinks the whole message.
  auto begun2 = engine.begin_weight_update({});
  check(begun2.success, begun2.message);
  UpdateWeightsFromTensorReqInput bad;
  bad.named_tensors.push_back(update->tensors.front());
  bad.named_tensors.push_back({"model.layers.0.mlp.gate_projj.weight", update->tensors.front().tensor});
  auto refused = engine.update_weights_from_tensor(bad);
  auto aborted = engine.end_weight_update({std::nullopt, true});
  auto sums_after = engine.check_weights({});
  check(!refused.success, "a bad tensor name was accepted");
  check(sums_after.payload.size() == 1 && sums_after.payload[0].per_gpu_checksum ==
                                            sums.payload[0].per_gpu_checksum,
        "a refused update changed the weights");
  std::printf("      a bad update is refused: \"%s\"\n      %s; checksums unchanged\n",
              refused.message.c_str(), aborted.message.c_str());

  // 7. continue: the paused rollouts finish on the new weights
  t = clock_type::now();
  auto resumed = engine.continue_generation({});
  check(resumed.success, resumed.message);
  std::size_t spanning = 0;
  for (auto& f : in_flight) {
    auto out = f.get();
    check(out.success, out.message);
    spanning += out.weight_version_start != out.weight_version;
  }
  timings["paused rollouts finish"] = seconds_since(t);
  auto after = run_rollouts(engine, greedy);
  std::size_t changed = 0;
  for (std::size_t i = 0; i < after.outputs.size(); ++i) {
    check(after.outputs[i].success, after.outputs[i].message);
    changed += after.outputs[i].output_ids != before.outputs[i].output_ids;
  }
  auto version = engine.get_server_info().weight_version;
  std::printf("[7/7] continue_generation: the %zu paused rollouts finished (%zu started on "
              "version %s and ended on %s)\n",
              in_flight.size(), spanning, info.weight_version.c_str(), version.c_str());
  std::printf("      the same greedy prompts again: %zu/%zu completions changed, weight version %s\n",
              changed, after.outputs.size(), version.c_str());
  for (std::size_t i = 0; i < after.outputs.size(); ++i)
    std::printf("      \"%s\" -> \"%s\"\n", greedy[i].text->c_str(),
                shorten(after.outputs[i].text).c_str());
  check(changed > 0, "new weights did not change any greedy completion");
  check(version != info.weight_version, "the weight version did not advance");

  std::printf("\ntimings\n");
  for (const auto& [what, secs] : timings.rows)
    std::printf("  %-42s %9.3f ms\n", what.c_str(), secs * 1e3);
  std::printf("\nok: the update landed, verified, and generation goes on with version %s\n",
              version.c_str());
}

void add_demo(CLI::App& app) {
  auto o = std::make_shared<demo_options>();
  auto* cmd = app.add_subcommand("demo", "The RL weight-update cycle end to end (what `make run` "
                                         "shows)");
  cmd->add_option("--model", o->model, "Model directory (default: the built-in tiny model)");
  cmd->add_option("--device", o->device, "Where to run: auto (the GPU when one is visible), cpu, cuda or cuda:N")->capture_default_str();
  add_quantize_options(*cmd, o->quantize, o->group_size);
  cmd->add_option("--rollouts", o->rollouts, "Rollouts per round")->capture_default_str();
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "Tokens per rollout")->capture_default_str();
  cmd->add_option("--buckets", o->buckets, "Update buckets")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of sampling and of the new weights")->capture_default_str();
  cmd->callback([o] { run(*o); });
}

const command_registrar registrar{1, add_demo};

} // namespace

} // namespace rlserve::apps
