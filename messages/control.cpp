// The memory tags of release/resume_memory_occupation, read the same way by the codec, the
// scheduler (in-process callers skip the codec) and the runners.
#include "messages/control.hpp"

#include <algorithm>

namespace rlserve {

std::optional<std::size_t> find_unknown_memory_tag(const std::vector<std::string>& tags) {
  for (std::size_t i = 0; i < tags.size(); ++i)
    if (std::find(k_memory_tags.begin(), k_memory_tags.end(), tags[i]) == k_memory_tags.end())
      return i;
  return std::nullopt;
}

std::vector<std::string> canonical_memory_tags(const std::vector<std::string>& tags) {
  std::vector<std::string> out;
  for (auto known : k_memory_tags)
    if (tags.empty() || std::find(tags.begin(), tags.end(), known) != tags.end())
      out.emplace_back(known);
  return out;
}

} // namespace rlserve
