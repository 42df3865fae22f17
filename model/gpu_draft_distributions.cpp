// gpu_draft_distributions: per-sequence device rows, cudaMalloc'd on first use and kept on a
// free list after release. A build without CUDA gets a create() that fails.
#include "model/gpu_draft_distributions.hpp"

#include <string>

#include <fmt/format.h>

#if RLSERVE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace rlserve::model {

#if RLSERVE_HAVE_CUDA

expected<std::shared_ptr<gpu_draft_distributions>> gpu_draft_distributions::create(int device, int64_t vocab,
                                                                                  int64_t max_draft) {
  if (vocab < 1 || max_draft < 1)
    return fail(fmt::format("draft distributions on the device: vocab {} and max_draft {} must be positive",
                            vocab, max_draft));
  return std::shared_ptr<gpu_draft_distributions>(new gpu_draft_distributions(device, vocab, max_draft));
}

gpu_draft_distributions::~gpu_draft_distributions() {
  cudaSetDevice(device_);
  for (auto& [id, s] : sequences_)
    cudaFree(s.rows);
  for (auto* p : free_)
    cudaFree(p);
}

expected<float*> gpu_draft_distributions::row_for_writing(uint64_t seq_id, int64_t index) {
  std::lock_guard lock(mutex_);
  if (index < 0 || index >= max_draft_)
    return fail(fmt::format("sequence {}: draft proposal {} is outside the {} the device keeps "
                            "distributions for", seq_id, index, max_draft_));
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) {
    float* rows = nullptr;
    if (!free_.empty()) {
      rows = free_.back();
      free_.pop_back();
    } else {
      if (auto e = cudaSetDevice(device_); e != cudaSuccess)
        return fail(std::string("draft distributions: cudaSetDevice failed: ") + cudaGetErrorString(e));
      const auto bytes = static_cast<std::size_t>(max_draft_ * vocab_) * sizeof(float);
      if (auto e = cudaMalloc(&rows, bytes); e != cudaSuccess)
        return fail(fmt::format("draft distributions: cannot allocate {} MiB on cuda:{} for sequence {}: {}",
                                bytes >> 20, device_, seq_id, cudaGetErrorString(e)));
      ++blocks_;
    }
    it = sequences_.emplace(seq_id, sequence_rows{rows, 0}).first;
  }
  auto& s = it->second;
  if (index == 0)
    s.written = 0;
  if (index != s.written)
    return fail(fmt::format("sequence {}: draft proposal {} written after {} of this round", seq_id,
                            index, s.written));
  s.written = index + 1;
  return s.rows + index * vocab_;
}

expected<std::vector<const float*>> gpu_draft_distributions::rows(uint64_t seq_id, int64_t k) const {
  std::lock_guard lock(mutex_);
  auto it = sequences_.find(seq_id);
  const int64_t have = it == sequences_.end() ? 0 : it->second.written;
  if (k < 0 || k > have)
    return fail(fmt::format("sequence {}: {} draft distributions asked for, the draft kept {} on the device",
                            seq_id, k, have));
  std::vector<const float*> out;
  for (int64_t i = 0; i < k; ++i)
    out.push_back(it->second.rows + i * vocab_);
  return out;
}

expected<std::vector<float>> gpu_draft_distributions::download(uint64_t seq_id, int64_t k) const {
  auto r = rows(seq_id, k);
  if (!r)
    return std::move(r).take_failure();
  std::vector<float> out(static_cast<std::size_t>(k * vocab_));
  if (k == 0)
    return out;
  if (auto e = cudaSetDevice(device_); e != cudaSuccess)
    return fail(std::string("draft distributions: cudaSetDevice failed: ") + cudaGetErrorString(e));
  // The rows of one sequence are contiguous.
  if (auto e = cudaMemcpy(out.data(), (*r)[0], out.size() * sizeof(float), cudaMemcpyDeviceToHost);
      e != cudaSuccess)
    return fail(std::string("draft distributions: copy to the host failed: ") + cudaGetErrorString(e));
  return out;
}

void gpu_draft_distributions::release(uint64_t seq_id) {
  std::lock_guard lock(mutex_);
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end())
    return;
  free_.push_back(it->second.rows);
  sequences_.erase(it);
}

void gpu_draft_distributions::trim() {
  std::lock_guard lock(mutex_);
  cudaSetDevice(device_);
  for (auto* p : free_)
    cudaFree(p);
  blocks_ -= free_.size();
  free_.clear();
}

std::size_t gpu_draft_distributions::bytes() const {
  std::lock_guard lock(mutex_);
  return blocks_ * static_cast<std::size_t>(max_draft_ * vocab_) * sizeof(float);
}

#else

expected<std::shared_ptr<gpu_draft_distributions>> gpu_draft_distributions::create(int, int64_t, int64_t) {
  return fail("draft distributions on the device: this build has no CUDA");
}
gpu_draft_distributions::~gpu_draft_distributions() = default;
expected<float*> gpu_draft_distributions::row_for_writing(uint64_t, int64_t) {
  return fail("draft distributions on the device: this build has no CUDA");
}
expected<std::vector<const float*>> gpu_draft_distributions::rows(uint64_t, int64_t) const {
  return fail("draft distributions on the device: this build has no CUDA");
}
expected<std::vector<float>> gpu_draft_distributions::download(uint64_t, int64_t) const {
  return fail("draft distributions on the device: this build has no CUDA");
}
void gpu_draft_distributions::release(uint64_t) {}
void gpu_draft_distributions::trim() {}
std::size_t gpu_draft_distributions::bytes() const { return 0; }

#endif

} // namespace rlserve::model
