#include "model/safetensors.hpp"

#include "model/regular_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace rlserve::model {

namespace {

using json = nlohmann::json;

// The Rust reference implementation refuses headers above 100 MB; a real header is a few MB at
// most (one line per tensor), so a larger length is corruption, not a big model.
constexpr uint64_t k_max_header_bytes = 100ull << 20;

uint64_t read_le64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// An unsigned integer JSON value, or nullopt.
std::optional<uint64_t> as_offset(const json& v) {
  if (v.is_number_unsigned())
    return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0)
    return static_cast<uint64_t>(v.get<int64_t>());
  return std::nullopt;
}

} // namespace

std::string shape_string(std::span<const int64_t> shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

expected<uint64_t> tensor_byte_count(dtype type, std::span<const int64_t> shape) {
  uint64_t n = element_size(type);
  for (auto d : shape) {
    if (d < 0)
      return fail(fmt::format("shape {} has a negative dimension", shape_string(shape)));
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n))
      return fail(fmt::format("shape {} of {} has more bytes than 64 bits can count",
                              shape_string(shape), torch_name(type)));
  }
  return n;
}

expected<safetensors_file> safetensors_file::open(const std::filesystem::path& path) {
  const std::string where = path.string();
  // Read into owned memory, never mapped: see model/regular_file.hpp (a checkpoint may be
  // rewritten or truncated by the trainer while its tensors serve).
  auto file = regular_file::open(path);
  if (!file)
    return std::move(file).take_failure();
  const uint64_t file_size = file->size();
  if (file_size < 8)
    return fail(fmt::format("{}: file has {} bytes, fewer than the 8-byte header length prefix",
                            where, file_size));
  auto owned = read_whole_file(*file);
  if (!owned)
    return fail(fmt::format("{}: {}", where, owned.error()));
  std::shared_ptr<const void> mapping = owned->data;
  const auto* bytes = owned->data.get();

  const uint64_t header_len = read_le64(bytes);
  if (header_len > file_size - 8)
    return fail(fmt::format("{}: header length {} is larger than the {} bytes after the length "
                            "prefix (file size {})", where, header_len, file_size - 8, file_size));
  if (header_len > k_max_header_bytes)
    return fail(fmt::format("{}: header length {} exceeds the {}-byte limit", where, header_len,
                            k_max_header_bytes));

  // nlohmann keeps the last of duplicate keys silently; the callback sees every top-level key.
  std::set<std::string> seen;
  std::string duplicate;
  auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      auto key = parsed.get<std::string>();
      if (!seen.insert(key).second && duplicate.empty())
        duplicate = key;
    }
    return true;
  };
  const char* text = reinterpret_cast<const char*>(bytes + 8);
  json header = json::parse(text, text + header_len, on_event, /*allow_exceptions=*/false);
  if (header.is_discarded())
    return fail(fmt::format("{}: the {}-byte header is not valid JSON", where, header_len));
  if (!header.is_object())
    return fail(fmt::format("{}: the header is a JSON {}, not an object", where, header.type_name()));
  if (!duplicate.empty())
    return fail(fmt::format("{}: tensor name '{}' appears more than once in the header", where,
                            duplicate));

  safetensors_file f;
  f.path_ = path;
  f.data_ = bytes + 8 + header_len;
  const uint64_t data_size = file_size - 8 - header_len;

  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object())
        return fail(fmt::format("{}: __metadata__ must be an object of strings, got {}", where,
                                value.type_name()));
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string())
          return fail(fmt::format("{}: __metadata__ value of '{}' must be a string, got {}", where,
                                  k, v.type_name()));
        f.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string at = fmt::format("{}: tensor '{}'", where, name);
    if (!value.is_object())
      return fail(fmt::format("{}: entry must be an object with dtype, shape, data_offsets; got {}",
                              at, value.type_name()));
    entry e;
    auto dt = value.find("dtype");
    if (dt == value.end() || !dt->is_string())
      return fail(fmt::format("{}: missing or non-string 'dtype'", at));
    auto type = dtype_from_safetensors_name(dt->get<std::string>());
    if (!type)
      return fail(fmt::format("{}: unknown dtype '{}'", at, dt->get<std::string>()));
    e.type = *type;

    auto sh = value.find("shape");
    if (sh == value.end() || !sh->is_array())
      return fail(fmt::format("{}: missing 'shape' list", at));
    for (const auto& d : *sh) {
      if (!d.is_number_integer())
        return fail(fmt::format("{}: shape {} has a non-integer dimension", at, sh->dump()));
      if (d.is_number_unsigned() && d.get<uint64_t>() > uint64_t(INT64_MAX))
        return fail(fmt::format("{}: shape {} has a dimension above 2^63", at, sh->dump()));
      e.shape.push_back(d.get<int64_t>());
    }
    auto nbytes = tensor_byte_count(e.type, e.shape);
    if (!nbytes)
      return fail(fmt::format("{}: {}", at, nbytes.error()));

    auto off = value.find("data_offsets");
    if (off == value.end() || !off->is_array() || off->size() != 2)
      return fail(fmt::format("{}: data_offsets must be [begin, end], got {}", at,
                              off == value.end() ? std::string("nothing") : off->dump()));
    auto begin = as_offset((*off)[0]), end = as_offset((*off)[1]);
    if (!begin || !end)
      return fail(fmt::format("{}: data_offsets {} must be two non-negative integers", at,
                              off->dump()));
    if (*begin > *end)
      return fail(fmt::format("{}: data_offsets [{}, {}] begin after end", at, *begin, *end));
    if (*end > data_size)
      return fail(fmt::format("{}: data_offsets end {} is beyond the data section of {} bytes", at,
                              *end, data_size));
    if (*end - *begin != *nbytes)
      return fail(fmt::format("{}: data_offsets [{}, {}] hold {} bytes but shape {} of {} needs {}",
                              at, *begin, *end, *end - *begin, shape_string(e.shape),
                              safetensors_name(e.type), *nbytes));
    e.begin = *begin;
    e.end = *end;
    f.names_.push_back(name);
    f.entries_.emplace(name, std::move(e));
  }

  std::sort(f.names_.begin(), f.names_.end(), [&](const std::string& a, const std::string& b) {
    const auto &ea = f.entries_.at(a), &eb = f.entries_.at(b);
    return ea.begin != eb.begin ? ea.begin < eb.begin : (ea.end != eb.end ? ea.end < eb.end : a < b);
  });
  // Sorted by begin, two non-empty tensors overlap exactly when one starts before the previous
  // non-empty one ends.
  const std::string* previous = nullptr;
  for (const auto& name : f.names_) {
    const auto& e = f.entries_.at(name);
    if (e.begin == e.end)
      continue;
    if (previous != nullptr) {
      const auto& p = f.entries_.at(*previous);
      if (e.begin < p.end)
        return fail(fmt::format("{}: tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", where,
                                *previous, p.begin, p.end, name, e.begin, e.end));
    }
    previous = &name;
  }
  f.mapping_ = std::move(mapping);
  return f;
}

bool safetensors_file::contains(std::string_view name) const {
  return entries_.find(std::string(name)) != entries_.end();
}

expected<HostTensor> safetensors_file::tensor(std::string_view name) const {
  auto it = entries_.find(std::string(name));
  if (it == entries_.end())
    return fail(fmt::format("{}: no tensor named '{}'", path_.string(), name));
  const entry& e = it->second;
  return HostTensor::alias(e.type, e.shape, mapping_, data_ + e.begin, e.end - e.begin);
}

status write_safetensors(const std::filesystem::path& path, std::span<const NamedTensor> tensors,
                         const std::map<std::string, std::string>& metadata) {
  const std::string where = path.string();
  std::vector<const NamedTensor*> sorted;
  sorted.reserve(tensors.size());
  for (const auto& t : tensors)
    sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const NamedTensor* a, const NamedTensor* b) { return a->name < b->name; });

  json header = json::object();
  if (!metadata.empty())
    header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    const NamedTensor& t = *sorted[i];
    if (t.name.empty())
      return fail(fmt::format("{}: a tensor has an empty name", where));
    if (t.name == "__metadata__")
      return fail(fmt::format("{}: '__metadata__' is reserved and cannot name a tensor", where));
    if (i > 0 && sorted[i - 1]->name == t.name)
      return fail(fmt::format("{}: tensor '{}' given twice", where, t.name));
    auto nbytes = tensor_byte_count(t.tensor.type, t.tensor.shape);
    if (!nbytes)
      return fail(fmt::format("{}: tensor '{}': {}", where, t.name, nbytes.error()));
    if (*nbytes != t.tensor.nbytes || (t.tensor.nbytes > 0 && t.tensor.data == nullptr))
      return fail(fmt::format("{}: tensor '{}' has {} bytes but shape {} of {} needs {}", where,
                              t.name, t.tensor.nbytes, shape_string(t.tensor.shape),
                              torch_name(t.tensor.type), *nbytes));
    header[t.name] = {{"dtype", safetensors_name(t.tensor.type)},
                      {"shape", t.tensor.shape},
                      {"data_offsets", {offset, offset + *nbytes}}};
    offset += *nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception&) { // the one way dump() throws: a string that is not UTF-8
    return fail(fmt::format("{}: tensor names and metadata must be valid UTF-8", where));
  }
  // Pad with spaces (valid JSON whitespace) so the data section starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');

  std::byte prefix[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i)
    prefix[i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);

  auto tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
      return fail(fmt::format("{}: cannot open for writing: {}", tmp.string(), std::strerror(errno)));
    out.write(reinterpret_cast<const char*>(prefix), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const NamedTensor* t : sorted)
      out.write(reinterpret_cast<const char*>(t->tensor.data.get()),
                static_cast<std::streamsize>(t->tensor.nbytes));
    out.flush();
    if (!out) {
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      return fail(fmt::format("{}: write failed (disk full?)", tmp.string()));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return fail(fmt::format("{}: cannot rename {} into place", where, tmp.string()));
  }
  return {};
}

} // namespace rlserve::model
