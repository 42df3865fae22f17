// safetensors files: read whole into memory the engine owns (one allocation and one pass of
// reads per file; tensors alias that buffer, no further copy), written for make-model,
// checkpoints and tests. Never mapped: a trainer may rewrite or truncate a checkpoint file while
// its tensors serve (model/regular_file.hpp).
//
// Format: 8 bytes little-endian u64 N, then N bytes of JSON header, then the data section.
// The header maps each tensor name to {"dtype": "BF16", "shape": [..], "data_offsets": [begin,
// end]} (offsets relative to the data section) plus an optional "__metadata__" string map.
// The reader checks every one of these facts and says which one failed, where, with the numbers:
// a checkpoint from a trainer is untrusted input and must never make the engine read out of bounds.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "messages/expected.hpp"
#include "messages/tensor.hpp"

namespace rlserve::model {

class safetensors_file {
public:
  // Reads `path` (a regular file; a FIFO or device is refused without blocking) and validates
  // the header: length prefix within the file, JSON object,
  // known dtypes, non-negative shapes whose byte count does not overflow, data_offsets [begin,
  // end] with begin <= end inside the data section, end - begin == numel * element size, no two
  // tensors overlapping (gaps are allowed), unique names, __metadata__ a string -> string map.
  static expected<safetensors_file> open(const std::filesystem::path& path);

  // In file order: by data offset (ties, which only zero-sized tensors can have, by name).
  const std::vector<std::string>& names() const { return names_; }
  bool contains(std::string_view name) const;
  // Aliases the file's buffer (no copy); the tensor keeps the buffer alive after this object is
  // gone.
  expected<HostTensor> tensor(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::filesystem::path& path() const { return path_; }

private:
  struct entry {
    dtype type;
    std::vector<int64_t> shape;
    uint64_t begin = 0; // offsets into the data section
    uint64_t end = 0;
  };

  std::filesystem::path path_;
  std::shared_ptr<const void> mapping_; // the file's bytes; freed with the last tensor aliasing them
  const std::byte* data_ = nullptr;     // start of the data section inside it
  std::vector<std::string> names_;
  std::unordered_map<std::string, entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Writes a file the Python `safetensors` package reads: header padded with spaces so the data
// section starts 8-byte aligned, tensors laid out back to back in sorted name order. Writes to
// `path` + ".tmp" and renames, so a reader never sees half a file. Fails on duplicate or empty
// names, the reserved name "__metadata__", or a tensor whose byte count does not match its shape.
status write_safetensors(const std::filesystem::path& path, std::span<const NamedTensor> tensors,
                         const std::map<std::string, std::string>& metadata = {});

// Byte count of a tensor of `shape` and `type`; a failure names the shape when a dimension is
// negative or the count overflows 64 bits.
expected<uint64_t> tensor_byte_count(dtype type, std::span<const int64_t> shape);

// "[2, 3]" for messages.
std::string shape_string(std::span<const int64_t> shape);

} // namespace rlserve::model
