// A Qwen3-MoE checkpoint's tensors with each layer's experts fused the way transformers 5 holds
// them (save_pretrained(save_original_format=False)), made from the hub's per-expert tensors:
// the model and engine tests load and update from both and expect the same weights.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "messages/tensor.hpp"

namespace rlserve::test {

// `per_expert` with every `...mlp.experts.<e>.{gate,up,down}_proj.weight` replaced by the layer's
// `...mlp.experts.gate_up_proj` [E, 2I, H] (expert by expert: its gate rows, then its up rows)
// and `...mlp.experts.down_proj` [E, H, I], in the experts' dtype; experts are numbered 0..E-1 in
// each layer. Every other tensor is kept as it is, in order, before the fused ones.
inline std::vector<NamedTensor> with_fused_experts(const std::vector<NamedTensor>& per_expert) {
  constexpr std::string_view marker = ".mlp.experts.";
  std::map<std::string, const HostTensor*> by_name;
  std::map<std::string, std::array<int64_t, 3>> dims; // "...mlp.experts." -> {E, I, H}
  std::vector<NamedTensor> out;
  for (const auto& t : per_expert) {
    by_name[t.name] = &t.tensor;
    const auto at = t.name.find(marker);
    if (at == std::string::npos) {
      out.push_back(t);
    } else if (t.name.ends_with(".gate_proj.weight")) {
      auto& d = dims[t.name.substr(0, at + marker.size())];
      d = {d[0] + 1, t.tensor.shape[0], t.tensor.shape[1]};
    }
  }
  for (const auto& [prefix, d] : dims) {
    const auto [E, I, H] = d;
    std::vector<std::byte> gate_up, down;
    dtype type = dtype::bf16;
    for (int64_t e = 0; e < E; ++e) {
      const std::string ex = prefix + std::to_string(e) + ".";
      for (const char* part : {"gate_proj.weight", "up_proj.weight"}) {
        const auto& t = *by_name.at(ex + part);
        type = t.type;
        gate_up.insert(gate_up.end(), t.bytes().begin(), t.bytes().end());
      }
      const auto& t = *by_name.at(ex + "down_proj.weight");
      down.insert(down.end(), t.bytes().begin(), t.bytes().end());
    }
    out.push_back({prefix + "gate_up_proj", HostTensor::adopt(type, {E, 2 * I, H}, std::move(gate_up))});
    out.push_back({prefix + "down_proj", HostTensor::adopt(type, {E, H, I}, std::move(down))});
  }
  return out;
}

} // namespace rlserve::test
