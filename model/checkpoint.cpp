#include "model/checkpoint.hpp"

#include "model/regular_file.hpp"

#include <algorithm>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace rlserve::model {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* k_single_file = "model.safetensors";
constexpr const char* k_index_file = "model.safetensors.index.json";

// "model-00002-of-00005.safetensors", transformers' shard naming.
std::string shard_name(std::size_t i, std::size_t n) {
  return fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n);
}

bool is_shard_name(const std::string& name) {
  static const std::regex pattern(R"(model-\d{5}-of-\d{5}\.safetensors)");
  return std::regex_match(name, pattern);
}

std::vector<std::string> safetensors_in(const fs::path& dir) {
  std::vector<std::string> found;
  std::error_code ec;
  // increment(ec), not ++: a directory that changes under us must not throw out of the API.
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec))
    if (it->path().extension() == ".safetensors")
      found.push_back(it->path().filename().string());
  std::sort(found.begin(), found.end());
  return found;
}

} // namespace

expected<checkpoint> checkpoint::open(const fs::path& dir) {
  std::error_code ec;
  checkpoint c;
  c.dir_ = dir;
  if (!fs::exists(dir, ec))
    return fail(fmt::format("{}: no such file or directory", dir.string()));

  // A single file given directly.
  if (!fs::is_directory(dir, ec)) {
    auto f = safetensors_file::open(dir);
    if (!f)
      return std::move(f).take_failure();
    for (const auto& n : f->names())
      c.where_.emplace(n, 0);
    c.shards_.push_back(std::move(*f));
    return with_expert_views(std::move(c));
  }

  const fs::path index_path = dir / k_index_file;
  if (fs::exists(index_path, ec)) {
    const std::string where = index_path.string();
    // Opened like the shards (model/regular_file.hpp): a FIFO named like the index must not
    // block the engine. An index lists one line per tensor; 256 MiB is far beyond any real one.
    auto text = read_text_file(index_path, 256ull << 20);
    if (!text)
      return std::move(text).take_failure();
    auto index = json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object())
      return fail(fmt::format("{}: not a JSON object", where));
    auto wm = index.find("weight_map");
    if (wm == index.end() || !wm->is_object())
      return fail(fmt::format("{}: missing 'weight_map' object (tensor name -> shard file)", where));

    std::map<std::string, std::size_t> shard_of_file;
    std::vector<std::pair<std::string, std::string>> listed; // (tensor, file)
    for (const auto& [name, file] : wm->items()) {
      if (!file.is_string())
        return fail(fmt::format("{}: weight_map['{}'] must be a file name, got {}", where, name,
                                file.dump()));
      listed.emplace_back(name, file.get<std::string>());
      shard_of_file.emplace(file.get<std::string>(), 0);
    }
    for (auto& [file, slot] : shard_of_file) {
      fs::path shard_path = dir / file;
      if (!fs::exists(shard_path, ec))
        return fail(fmt::format("{}: names shard '{}', which does not exist ({})", where, file,
                                shard_path.string()));
      auto f = safetensors_file::open(shard_path);
      if (!f)
        return std::move(f).take_failure();
      slot = c.shards_.size();
      c.shards_.push_back(std::move(*f));
    }
    for (const auto& [name, file] : listed) {
      std::size_t s = shard_of_file.at(file);
      if (!c.shards_[s].contains(name))
        return fail(fmt::format("{}: lists tensor '{}' in shard '{}', but that shard has no such "
                                "tensor", where, name, file));
    }
    for (std::size_t s = 0; s < c.shards_.size(); ++s) {
      for (const auto& name : c.shards_[s].names()) {
        auto [it, inserted] = c.where_.emplace(name, s);
        if (!inserted)
          return fail(fmt::format("{}: tensor '{}' is in two shards, '{}' and '{}'", dir.string(),
                                  name, c.shards_[it->second].path().filename().string(),
                                  c.shards_[s].path().filename().string()));
      }
    }
    return with_expert_views(std::move(c));
  }

  const fs::path single = dir / k_single_file;
  if (!fs::exists(single, ec)) {
    auto found = safetensors_in(dir);
    if (found.empty())
      return fail(fmt::format("{}: no {} and no {} (and no other .safetensors file)", dir.string(),
                              k_single_file, k_index_file));
    return fail(fmt::format("{}: no {} and no {}; found {} without an index to say which to load",
                            dir.string(), k_single_file, k_index_file, fmt::join(found, ", ")));
  }
  auto f = safetensors_file::open(single);
  if (!f)
    return std::move(f).take_failure();
  for (const auto& n : f->names())
    c.where_.emplace(n, 0);
  c.shards_.push_back(std::move(*f));
  return with_expert_views(std::move(c));
}

expected<checkpoint> checkpoint::with_expert_views(checkpoint c) {
  static const std::string gate_up = "mlp.experts.gate_up_proj", down = "mlp.experts.down_proj";
  std::vector<std::string> fused;
  for (const auto& [name, _] : c.where_)
    if (name.ends_with(gate_up) || name.ends_with(down))
      fused.push_back(name);
  std::sort(fused.begin(), fused.end());
  for (const auto& name : fused) {
    auto t = c.shards_[c.where_.at(name)].tensor(name);
    if (!t)
      return std::move(t).take_failure();
    const bool is_gate_up = name.ends_with(gate_up);
    const auto& sh = t->shape;
    if (sh.size() != 3 || sh[0] < 1 || (is_gate_up && sh[1] % 2 != 0))
      return fail(fmt::format("{}: fused expert tensor '{}' has shape [{}]; expected {}", c.dir_.string(), name,
                              fmt::join(sh, ", "),
                              is_gate_up ? "[experts, 2 x intermediate, hidden]" : "[experts, hidden, intermediate]"));
    const std::string prefix = name.substr(0, name.size() - (is_gate_up ? gate_up : down).size()) + "mlp.experts.";
    const auto esize = static_cast<std::size_t>(element_size(t->type));
    const auto rows = is_gate_up ? sh[1] / 2 : sh[1];
    const auto part = static_cast<std::size_t>(rows * sh[2]) * esize; // one [rows, cols] matrix
    auto add = [&](const std::string& view, std::size_t offset) -> status {
      if (c.where_.count(view) || c.views_.count(view))
        return fail(fmt::format("{}: '{}' is both in the fused tensor '{}' and saved on its own", c.dir_.string(),
                                view, name));
      c.views_.emplace(view, expert_view{name, offset, {rows, sh[2]}});
      return {};
    };
    for (int64_t e = 0; e < sh[0]; ++e) {
      const std::string ex = prefix + std::to_string(e) + ".";
      const auto at = static_cast<std::size_t>(e) * (is_gate_up ? 2 : 1) * part;
      if (is_gate_up) {
        if (auto s = add(ex + "gate_proj.weight", at); !s)
          return std::move(s).take_failure();
        if (auto s = add(ex + "up_proj.weight", at + part); !s)
          return std::move(s).take_failure();
      } else if (auto s = add(ex + "down_proj.weight", at); !s) {
        return std::move(s).take_failure();
      }
    }
  }
  for (const auto& [view, v] : c.views_)
    c.where_.emplace(view, c.where_.at(v.fused));
  for (const auto& name : fused)
    c.where_.erase(name);
  return c;
}

std::vector<std::string> checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, _] : where_)
    out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

bool checkpoint::contains(std::string_view name) const {
  return where_.find(std::string(name)) != where_.end();
}

expected<HostTensor> checkpoint::tensor(std::string_view name) const {
  auto it = where_.find(std::string(name));
  if (it == where_.end())
    return fail(fmt::format("{}: checkpoint has no tensor named '{}'", dir_.string(), name));
  if (auto v = views_.find(std::string(name)); v != views_.end()) {
    auto fused = shards_[it->second].tensor(v->second.fused);
    if (!fused)
      return std::move(fused).take_failure();
    const auto nbytes = static_cast<std::size_t>(v->second.shape[0] * v->second.shape[1]) *
                        static_cast<std::size_t>(element_size(fused->type));
    return HostTensor::alias(fused->type, v->second.shape, fused->data, fused->data.get() + v->second.offset, nbytes);
  }
  return shards_[it->second].tensor(name);
}

std::vector<fs::path> checkpoint::files() const {
  std::vector<fs::path> out;
  for (const auto& s : shards_)
    out.push_back(s.path());
  return out;
}

status write_checkpoint(const fs::path& dir, std::span<const NamedTensor> tensors,
                        std::size_t max_shard_bytes,
                        const std::map<std::string, std::string>& metadata) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return fail(fmt::format("{}: cannot create directory: {}", dir.string(), ec.message()));
  if (max_shard_bytes == 0)
    return fail("write_checkpoint: max_shard_bytes must be positive");

  std::vector<const NamedTensor*> sorted;
  for (const auto& t : tensors)
    sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const NamedTensor* a, const NamedTensor* b) { return a->name < b->name; });
  for (std::size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i - 1]->name == sorted[i]->name)
      return fail(fmt::format("{}: tensor '{}' given twice", dir.string(), sorted[i]->name));

  // Greedy packing in name order: a shard closes when the next tensor would push it over.
  std::vector<std::vector<NamedTensor>> shards(1);
  std::size_t shard_bytes = 0, total = 0;
  for (const NamedTensor* t : sorted) {
    if (!shards.back().empty() && shard_bytes + t->tensor.nbytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(*t);
    shard_bytes += t->tensor.nbytes;
    total += t->tensor.nbytes;
  }

  auto meta = metadata;
  meta["format"] = "pt";
  std::set<std::string> written;
  if (shards.size() == 1) {
    if (auto s = write_safetensors(dir / k_single_file, shards[0], meta); !s)
      return s;
    written.insert(k_single_file);
  } else {
    json weight_map = json::object();
    for (std::size_t i = 0; i < shards.size(); ++i) {
      const std::string file = shard_name(i, shards.size());
      if (auto s = write_safetensors(dir / file, shards[i], meta); !s)
        return s;
      written.insert(file);
      for (const auto& t : shards[i])
        weight_map[t.name] = file;
    }
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    // The shards were written, so every name is valid UTF-8 and dump() cannot throw here.
    const std::string text = index.dump(2);
    const fs::path tmp = dir / (std::string(k_index_file) + ".tmp");
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << text << '\n';
      if (!out)
        return fail(fmt::format("{}: write failed", tmp.string()));
    }
    fs::rename(tmp, dir / k_index_file, ec);
    if (ec)
      return fail(fmt::format("{}: cannot rename into place: {}", tmp.string(), ec.message()));
    written.insert(k_index_file);
  }

  // Leftovers of an earlier write with a different layout would make the directory ambiguous
  // (an old index wins over a new model.safetensors).
  std::vector<fs::path> stale;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (written.count(name) == 0 &&
        (name == k_single_file || name == k_index_file || is_shard_name(name)))
      stale.push_back(it->path());
  }
  for (const auto& path : stale) {
    std::error_code rm;
    fs::remove(path, rm);
    if (rm)
      return fail(fmt::format("{}: cannot remove stale checkpoint file: {}", path.string(),
                              rm.message()));
  }
  return {};
}

} // namespace rlserve::model
