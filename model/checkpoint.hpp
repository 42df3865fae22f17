// checkpoint: a Hugging Face model directory's weights, as one name -> tensor view over
// `model.safetensors`, or over the shards that `model.safetensors.index.json` lists (its
// "weight_map" maps each tensor name to a shard file). Shards are read into owned memory; tensors alias it.
//
// MoE experts saved fused, the way transformers 5 holds them (save_pretrained with
// save_original_format=False, and checkpoints written from such models): `<p>.mlp.experts.gate_up_proj`
// [E, 2I, H] (gate the first I rows of each expert, up the last I) and `<p>.mlp.experts.down_proj`
// [E, H, I] are served as the per-expert tensors the hub format names, `<p>.mlp.experts.<e>.
// {gate,up,down}_proj.weight` (views of the fused bytes, no copy); the fused names themselves are
// not listed. A checkpoint naming an expert both ways is refused.
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "messages/expected.hpp"
#include "messages/tensor.hpp"
#include "model/safetensors.hpp"

namespace rlserve::model {

class checkpoint {
public:
  // `dir` is a model directory (or a single .safetensors file). With an index: every shard it
  // names must exist, every tensor it lists must be in its shard, and no tensor name may be in
  // two shards; tensors a shard holds beyond the index are served too (transformers loads whole
  // shards). Without an index, model.safetensors must exist; the error says what was looked for.
  static expected<checkpoint> open(const std::filesystem::path& dir);

  std::vector<std::string> names() const; // sorted
  bool contains(std::string_view name) const;
  expected<HostTensor> tensor(std::string_view name) const;
  // The shard files, in the order they were opened (one for an unsharded checkpoint).
  std::vector<std::filesystem::path> files() const;
  const std::filesystem::path& dir() const { return dir_; }

private:
  // A per-expert tensor inside a fused one: its bytes from `offset`, shaped `shape`.
  struct expert_view {
    std::string fused;
    std::size_t offset = 0;
    std::vector<int64_t> shape;
  };
  // Lists the per-expert views of the fused expert tensors in place of the fused names.
  static expected<checkpoint> with_expert_views(checkpoint c);

  std::filesystem::path dir_;
  std::vector<safetensors_file> shards_;
  std::unordered_map<std::string, std::size_t> where_; // name -> index into shards_
  std::unordered_map<std::string, expert_view> views_;  // per-expert name -> where in a fused tensor
};

// Writes `tensors` into `dir` (created if needed) the way transformers' save_pretrained does:
// model.safetensors when the total is at most `max_shard_bytes`, otherwise
// model-00001-of-0000N.safetensors shards (filled in sorted name order; a tensor bigger than the
// limit gets a shard of its own) plus model.safetensors.index.json {"metadata": {"total_size"},
// "weight_map"}. Checkpoint files of an earlier write in `dir` that this one does not produce are
// removed, so the directory never mixes two checkpoints. Every file gets `metadata` plus
// "format": "pt", which transformers requires to load it.
status write_checkpoint(const std::filesystem::path& dir, std::span<const NamedTensor> tensors,
                        std::size_t max_shard_bytes = 5ull << 30,
                        const std::map<std::string, std::string>& metadata = {});

} // namespace rlserve::model
