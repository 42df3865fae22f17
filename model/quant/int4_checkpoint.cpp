#include "model/quant/int4_checkpoint.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "kernels/bf16.hpp"
#include "kernels/int4_quant.hpp"
#include "model/checkpoint.hpp"
#include "model/safetensors.hpp"

namespace rlserve::model::quant {

namespace {

namespace fs = std::filesystem;
namespace k4 = rlserve::kernels;
using json = nlohmann::json;

std::vector<std::string_view> split_dots(std::string_view s) {
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  while (true) {
    auto dot = s.find('.', start);
    parts.push_back(s.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
    if (dot == std::string_view::npos)
      return parts;
    start = dot + 1;
  }
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string module_of(std::string_view weight_name) {
  return std::string(weight_name.substr(0, weight_name.size() - std::string_view(".weight").size()));
}

// A router: the MoE gate (mlp.gate) or a shared-expert gate (mlp.shared_expert_gate).
bool is_router(std::string_view name) {
  return ends_with(name, ".mlp.gate.weight") || ends_with(name, "_gate.weight");
}

bool is_lm_head(std::string_view name) { return name == "lm_head.weight" || ends_with(name, ".lm_head.weight"); }

std::string human_bytes(uint64_t b) {
  if (b >= (1ull << 30))
    return fmt::format("{:.1f} GiB", static_cast<double>(b) / (1ull << 30));
  if (b >= (1ull << 20))
    return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1ull << 20));
  return fmt::format("{} B", b);
}

// The weight as bf16 bits (aliasing the mapping when it already is bf16).
expected<std::vector<uint16_t>> bf16_bits(const std::string& name, const HostTensor& t) {
  const auto n = static_cast<std::size_t>(t.numel());
  std::vector<uint16_t> out(n);
  switch (t.type) {
    case dtype::bf16: std::memcpy(out.data(), t.data.get(), n * 2); break;
    case dtype::f16: {
      auto v = t.as<uint16_t>();
      for (std::size_t i = 0; i < n; ++i)
        out[i] = k4::float_to_bf16(k4::f16_to_float(v[i]));
      break;
    }
    case dtype::f32: {
      auto v = t.as<float>();
      for (std::size_t i = 0; i < n; ++i)
        out[i] = k4::float_to_bf16(v[i]);
      break;
    }
    default:
      return fail(fmt::format("{}: dtype {} is not a floating-point weight", name, static_cast<int>(t.type)));
  }
  return out;
}

status copy_one_file(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
  if (ec)
    return fail(fmt::format("copying {} to {}: {}", from.string(), to.string(), ec.message()));
  return {};
}

bool is_checkpoint_file(const fs::path& p) {
  const auto name = p.filename().string();
  return p.extension() == ".safetensors" || name == "model.safetensors.index.json" || name == "config.json";
}

} // namespace

std::optional<quant_targets> parse_quant_targets(std::string_view name) {
  for (auto t : {quant_targets::experts, quant_targets::linear})
    if (name == to_string(t))
      return t;
  return std::nullopt;
}

bool is_routed_expert_weight(std::string_view name) {
  auto p = split_dots(name);
  return p.size() == 8 && p[0] == "model" && p[1] == "layers" && all_digits(p[2]) && p[3] == "mlp" &&
         p[4] == "experts" && all_digits(p[5]) &&
         (p[6] == "gate_proj" || p[6] == "up_proj" || p[6] == "down_proj") && p[7] == "weight";
}

bool is_linear_weight(std::string_view name, std::span<const int64_t> shape) {
  return shape.size() == 2 && ends_with(name, ".weight") && name.find("embed_tokens") == std::string_view::npos &&
         !ends_with(name, "norm.weight");
}

bool is_quantization_target(std::string_view name, std::span<const int64_t> shape, quant_targets targets) {
  if (!is_linear_weight(name, shape) || is_router(name) || is_lm_head(name))
    return false;
  return targets == quant_targets::linear || is_routed_expert_weight(name);
}

expected<std::vector<NamedTensor>> quantize_weight(const std::string& name, const HostTensor& t,
                                                   const quantize_options& o) {
  if (t.shape.size() != 2)
    return fail(fmt::format("{}: shape {} is not a 2-D Linear weight", name, shape_string(t.shape)));
  auto bits = bf16_bits(name, t);
  if (!bits)
    return std::move(bits).take_failure();
  k4::int4_shape s{1, t.shape[0], t.shape[1], o.group_size};
  const bool asym = o.recipe == k4::int4_recipe::asym;
  if (auto m = k4::int4_check_load_shape(s, asym); !m.empty())
    return fail(k4::int4_shape_message(name, std::string(k4::to_string(o.recipe)) + " quantization", m));
  const int64_t groups = k4::int4_groups(s);
  std::vector<std::byte> packed(static_cast<std::size_t>(k4::ct_weight_packed_words(s)) * 4);
  std::vector<std::byte> scale(static_cast<std::size_t>(k4::ct_scale_count(s)) * 2);
  std::vector<std::byte> zp(asym ? static_cast<std::size_t>(k4::ct_zero_point_words(s)) * 4 : 0);
  k4::int4_quant_args a;
  a.shape = s;
  a.recipe = o.recipe;
  a.zp_layout = o.zp_layout;
  a.w = bits->data();
  a.weight_packed = reinterpret_cast<int32_t*>(packed.data());
  a.weight_scale = reinterpret_cast<uint16_t*>(scale.data());
  a.weight_zero_point = asym ? reinterpret_cast<int32_t*>(zp.data()) : nullptr;
  if (auto st = k4::int4_quantize(a, name); !st)
    return std::move(st).take_failure();
  const std::string prefix = module_of(name);
  std::vector<NamedTensor> q;
  q.push_back({prefix + ".weight_packed", HostTensor::adopt(dtype::i32, {s.n, s.k / 8}, std::move(packed))});
  q.push_back({prefix + ".weight_scale", HostTensor::adopt(dtype::bf16, {s.n, groups}, std::move(scale))});
  if (asym) {
    std::vector<int64_t> zshape = o.zp_layout == k4::zero_point_layout::standard
                                    ? std::vector<int64_t>{s.n / 8, groups}
                                    : std::vector<int64_t>{groups, s.n / 8};
    q.push_back({prefix + ".weight_zero_point", HostTensor::adopt(dtype::i32, zshape, std::move(zp))});
  }
  std::vector<int64_t> nk = {s.n, s.k};
  q.push_back({prefix + ".weight_shape", HostTensor::from_vector(dtype::i64, {2}, nk)});
  return q;
}

json compressed_tensors_config(k4::int4_recipe recipe, int32_t group_size, const std::vector<std::string>& ignore) {
  const bool channel = group_size == k4::k_int4_channel;
  json weights = {{"num_bits", 4},
                  {"type", "int"},
                  {"strategy", channel ? "channel" : "group"},
                  {"group_size", channel ? json(nullptr) : json(group_size)},
                  {"symmetric", k4::int4_symmetric(recipe)},
                  {"actorder", nullptr},
                  {"dynamic", false},
                  {"observer", "minmax"},
                  {"block_structure", nullptr}};
  json group = {{"targets", json::array({"Linear"})},
                {"weights", weights},
                {"input_activations", nullptr},
                {"output_activations", nullptr}};
  std::vector<std::string> sorted = ignore;
  std::sort(sorted.begin(), sorted.end());
  return {{"quant_method", "compressed-tensors"},
          {"format", "pack-quantized"},
          {"quantization_status", "compressed"},
          {"config_groups", {{"group_0", group}}},
          {"ignore", sorted},
          {"kv_cache_scheme", nullptr}};
}

expected<quantized_tensors> quantize_tensors(std::vector<NamedTensor> tensors, const quantize_options& o,
                                             const std::function<void(const std::string&)>& progress) {
  if (!k4::int4_group_size_supported(o.group_size))
    return fail(fmt::format("group size {} is not supported (use 32, 64, 128, or -1 for per-channel)",
                            o.group_size));
  // Sort the tensors into targets and copies; collect the Linear modules left in BF16.
  std::sort(tensors.begin(), tensors.end(), [](const NamedTensor& a, const NamedTensor& b) { return a.name < b.name; });
  std::vector<std::string> targets;
  std::vector<HostTensor> target_tensors;
  std::vector<NamedTensor> kept;
  std::set<std::string> ignored = {"lm_head"}; // the module exists even when tied to the embeddings
  quantized_tensors report;
  for (auto& t : tensors) {
    if (is_quantization_target(t.name, t.tensor.shape, o.targets)) {
      targets.push_back(t.name);
      report.quantized_input_bytes += t.tensor.nbytes;
      target_tensors.push_back(std::move(t.tensor));
    } else {
      if (is_linear_weight(t.name, t.tensor.shape))
        ignored.insert(module_of(t.name));
      kept.push_back(std::move(t));
    }
  }
  if (targets.empty())
    return fail(fmt::format("no tensor matches --targets {} ({})", to_string(o.targets),
                            o.targets == quant_targets::experts
                              ? "model.layers.*.mlp.experts.*.{gate,up,down}_proj.weight; a dense model needs "
                                "--targets linear"
                              : "2-D *.weight Linear modules other than lm_head, embeddings and routers"));

  // Quantize on a pool of workers; results land at their index, so the output is deterministic.
  const int threads = std::max(1, std::min<int>(o.threads > 0 ? o.threads
                                                               : static_cast<int>(std::thread::hardware_concurrency()),
                                                static_cast<int>(targets.size())));
  std::vector<std::vector<NamedTensor>> results(targets.size());
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::vector<std::string> errors(targets.size());
  std::size_t done = 0;
  uint64_t done_bytes = 0;
  auto last_report = std::chrono::steady_clock::now();
  auto worker = [&] {
    while (!failed.load()) {
      const std::size_t i = next.fetch_add(1);
      if (i >= targets.size())
        return;
      auto q = quantize_weight(targets[i], target_tensors[i], o);
      std::lock_guard lock(mu);
      if (!q) {
        errors[i] = q.error();
        failed = true;
        return;
      }
      results[i] = std::move(*q);
      ++done;
      done_bytes += target_tensors[i].nbytes;
      const auto now = std::chrono::steady_clock::now();
      if (progress && (now - last_report > std::chrono::seconds(1) || done == targets.size())) {
        last_report = now;
        progress(fmt::format("quantize: {}/{} weights ({} of {})", done, targets.size(), human_bytes(done_bytes),
                             human_bytes(report.quantized_input_bytes)));
      }
    }
  };
  {
    std::vector<std::thread> pool;
    for (int i = 0; i < threads; ++i)
      pool.emplace_back(worker);
    for (auto& th : pool)
      th.join();
  }
  // Indices are taken in increasing order, so every index below a failed one was finished: the
  // first failure in name order is the same whatever the scheduling.
  for (const auto& e : errors)
    if (!e.empty())
      return fail(e);

  report.tensors = std::move(kept);
  for (auto& r : results)
    for (auto& t : r)
      report.tensors.push_back(std::move(t));
  std::sort(report.tensors.begin(), report.tensors.end(),
            [](const NamedTensor& a, const NamedTensor& b) { return a.name < b.name; });
  report.quantized = static_cast<int64_t>(targets.size());
  report.ignored.assign(ignored.begin(), ignored.end());
  return report;
}

expected<quantize_checkpoint_report> quantize_checkpoint(const quantize_checkpoint_options& o) {
  if (!k4::int4_group_size_supported(o.group_size))
    return fail(fmt::format("--group-size {} is not supported (use 32, 64, 128, or -1 for per-channel)",
                            o.group_size));
  std::error_code ec;
  if (fs::exists(o.out, ec) && fs::equivalent(o.model, o.out, ec))
    return fail(fmt::format("{}: the output directory must differ from the model directory", o.out.string()));

  // config.json first: a directory without one is not a model.
  json config;
  {
    std::ifstream f(o.model / "config.json");
    if (!f)
      return fail(fmt::format("{}: no config.json", o.model.string()));
    try {
      config = json::parse(f);
    } catch (const json::exception& e) {
      return fail(fmt::format("{}: config.json is not JSON: {}", o.model.string(), e.what()));
    }
    if (!config.is_object())
      return fail(fmt::format("{}: config.json is not a JSON object", o.model.string()));
    if (config.contains("quantization_config"))
      return fail(fmt::format("{}: config.json already has a quantization_config; quantize a BF16 checkpoint",
                              o.model.string()));
  }
  auto ckpt = checkpoint::open(o.model);
  if (!ckpt)
    return std::move(ckpt).take_failure();
  std::vector<NamedTensor> all;
  for (const auto& name : ckpt->names()) {
    auto t = ckpt->tensor(name);
    if (!t)
      return std::move(t).take_failure();
    all.push_back({name, std::move(*t)});
  }
  quantize_options qo{o.recipe, o.group_size, o.targets, o.zp_layout, o.threads};
  auto q = quantize_tensors(std::move(all), qo, o.progress);
  if (!q)
    return fail(fmt::format("{}: {}", o.model.string(), q.error()));
  std::vector<NamedTensor> out = std::move(q->tensors);
  quantize_checkpoint_report report;
  for (const auto& t : out)
    report.output_bytes += t.tensor.nbytes;
  report.quantized = q->quantized;
  report.quantized_input_bytes = q->quantized_input_bytes;
  report.copied = static_cast<int64_t>(out.size()) - q->quantized * (k4::int4_symmetric(o.recipe) ? 3 : 4);
  report.ignored = std::move(q->ignored);

  fs::create_directories(o.out, ec);
  if (ec)
    return fail(fmt::format("{}: cannot create: {}", o.out.string(), ec.message()));
  if (o.progress)
    o.progress(fmt::format("quantize: writing {} tensors ({}) to {}", out.size(), human_bytes(report.output_bytes),
                           o.out.string()));
  const std::map<std::string, std::string> metadata = {
    {"rlserve.quantize", fmt::format("{} group_size={} zero_point_layout={} targets={}", k4::to_string(o.recipe),
                                     o.group_size, k4::int4_symmetric(o.recipe) ? "none" : k4::to_string(o.zp_layout),
                                     to_string(o.targets))}};
  if (auto st = write_checkpoint(o.out, out, o.max_shard_bytes, metadata); !st)
    return std::move(st).take_failure();

  config["quantization_config"] = compressed_tensors_config(o.recipe, o.group_size, report.ignored);
  {
    std::ofstream f(o.out / "config.json");
    f << config.dump(2) << "\n";
    if (!f)
      return fail(fmt::format("{}: cannot write config.json", o.out.string()));
  }
  for (const auto& entry : fs::directory_iterator(o.model, ec)) {
    if (!entry.is_regular_file() || is_checkpoint_file(entry.path()))
      continue;
    if (auto st = copy_one_file(entry.path(), o.out / entry.path().filename()); !st)
      return std::move(st).take_failure();
    report.copied_files.push_back(entry.path().filename().string());
  }
  std::sort(report.copied_files.begin(), report.copied_files.end());
  return report;
}

} // namespace rlserve::model::quant
