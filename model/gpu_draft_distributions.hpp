// The draft distributions of speculative decoding on the device. A draft runner on the GPU draws
// each proposal from a distribution q (the draft's logits after temperature, top-k, top-p and
// min-p) and writes q here; the target runner on the same device reads the rows when it verifies
// (qwen3_gpu_model::forward's speculation items), so no distribution crosses PCIe or travels in
// a message (a row is vocab floats: 600 KB at Qwen3's vocabulary). Both runners live in one
// process on one device; the scheduler runs a step's draft before its target and waits for the
// draft's reply (the draft synchronizes its stream before replying), so a row is complete when
// the target reads it and is not rewritten before the target's verification returns.
//
// Rows are per sequence (the runners' sequence ids): row i is the distribution proposal i of the
// sequence's latest proposal round was drawn from. Memory is taken per sequence on first use
// (max_draft rows) and reused after release; thread-safe (the runners are separate actors).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "messages/expected.hpp"

namespace rlserve::model {

class gpu_draft_distributions {
public:
  // Rows of `vocab` floats, up to `max_draft` per sequence, on CUDA device `device`.
  static expected<std::shared_ptr<gpu_draft_distributions>> create(int device, int64_t vocab,
                                                                   int64_t max_draft);
  ~gpu_draft_distributions();
  gpu_draft_distributions(const gpu_draft_distributions&) = delete;
  gpu_draft_distributions& operator=(const gpu_draft_distributions&) = delete;

  int device() const { return device_; }
  int64_t vocab() const { return vocab_; }
  int64_t max_draft() const { return max_draft_; }

  // The draft: the device row proposal `index` of `seq_id` writes. Index 0 starts a new round
  // (the rows of the previous round are no longer readable); index i > 0 must follow i - 1.
  expected<float*> row_for_writing(uint64_t seq_id, int64_t index);
  // The target: the device rows of the latest round's first k proposals. Fails naming why when
  // the round has fewer (the draft did not write them, or the sequence was released).
  expected<std::vector<const float*>> rows(uint64_t seq_id, int64_t k) const;
  // The same rows on the host ([k, vocab]), for a verification that runs on the host.
  expected<std::vector<float>> download(uint64_t seq_id, int64_t k) const;
  // The sequence ended on the draft: its memory goes back to the free list.
  void release(uint64_t seq_id);
  // Gives the memory of released sequences back to the driver (release_memory_occupation).
  void trim();
  std::size_t bytes() const; // device memory held (in use or free)

private:
  gpu_draft_distributions(int device, int64_t vocab, int64_t max_draft)
      : device_(device), vocab_(vocab), max_draft_(max_draft) {}
  struct sequence_rows {
    float* rows = nullptr; // [max_draft, vocab]
    int64_t written = 0;   // rows of the latest round
  };
  int device_ = 0;
  int64_t vocab_ = 0, max_draft_ = 0;
  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, sequence_rows> sequences_;
  std::vector<float*> free_;
  std::size_t blocks_ = 0;
};

} // namespace rlserve::model
