// plan_batch: what the next forward batch runs — a pure function of the scheduler's queues and
// the free KV blocks, so every scheduling decision can be table-tested without actors.
//
// Rules, in order:
//  1. Running requests first, oldest first. A decoding request runs 1 token, or 1 + k with
//     speculative decoding (the pending token and k draft proposals to verify; 1 when the budget
//     left is smaller); one still in prefill runs its next chunk (what is left of its prompt, cut to the token budget). A request that
//     needs more blocks than are free makes room by preempting the newest running requests (they
//     give up their KV and go back to the front of the queue, keeping their tokens); if it is the
//     newest itself, it is preempted.
//  2. Then waiting requests, strictly first come first served: the head of the queue is admitted
//     with its first chunk if a running slot, token budget and blocks for that chunk are free;
//     if it cannot be, nobody behind it is (no overtaking).
//  3. The tokens of one batch never exceed max_batch_tokens (decodes count one each).
//  4. Prefix cache: a waiting request whose prompt starts with cached blocks runs only the rest
//     (its cached blocks are not allocated again, but those nobody pins count against the free
//     blocks: they leave the evictable set; tokens copied from a partly shared block sit in its
//     first new block). A waiting request marked waits_for_prefix (a request
//     ahead of it is computing a prefix it can share) is skipped this step — the one exception
//     to no overtaking, so the samples of one prompt prefill it once.
// "Free blocks" are the blocks a step may take: free ones and cached ones nobody pins.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace rlserve::policy {

struct running_view {
  uint64_t id = 0;
  int64_t kv_tokens = 0;    // positions its KV holds
  int64_t held_blocks = 0;
  int64_t prefill_left = 0; // prompt tokens not yet run (0: decoding)
  int64_t decode_tokens = 1; // tokens a decode step runs: 1, or 1 + k proposals to verify
  // Blocks that become free (or evictable) when it is preempted; -1: held_blocks. Fewer when it
  // shares cached blocks with other requests.
  int64_t freed_if_preempted = -1;
};

struct waiting_view {
  uint64_t id = 0;
  int64_t prefill_tokens = 0; // tokens to run before its next sample (prompt + outputs so far,
                              // less the cached prefix)
  int64_t pinned_blocks = 0;  // cached blocks of its prefix nobody pins now
  bool waits_for_prefix = false;
  // Tokens of its prefix copied from a partly shared cached block into its own first block
  // (0 .. block_size - 1): that block holds them besides what it runs.
  int64_t copied_tokens = 0;
};

struct batch_limits {
  int64_t max_running = 64;
  int64_t max_batch_tokens = 2048;
  int64_t block_size = 16;
};

struct planned_work {
  uint64_t id = 0;
  int64_t tokens = 0;     // tokens this step
  int64_t new_blocks = 0; // blocks to allocate before it runs (not counting a cached prefix)
  bool admitted = false;  // came from the waiting queue this step
  bool samples = false;   // its tokens reach the end of its prefill: a token is sampled
};

struct batch_plan {
  std::vector<planned_work> work;  // running first (oldest first), then admitted (FCFS)
  std::vector<uint64_t> preempted; // oldest first; they rejoin the queue's front in this order
};

// Blocks a running request must add to run `want` more tokens.
[[nodiscard]] inline int64_t blocks_to_grow(const running_view& r, int64_t want, int64_t block_size) {
  return std::max<int64_t>((r.kv_tokens + want + block_size - 1) / block_size - r.held_blocks, 0);
}

[[nodiscard]] inline batch_plan plan_batch(std::span<const running_view> running,
                                           std::span<const waiting_view> waiting,
                                           int64_t free_blocks, const batch_limits& limits) {
  auto blocks_for = [&](int64_t tokens) {
    return (tokens + limits.block_size - 1) / limits.block_size;
  };
  auto freed = [](const running_view& r) {
    return r.freed_if_preempted >= 0 ? r.freed_if_preempted : r.held_blocks;
  };
  batch_plan plan;
  int64_t free = free_blocks;
  int64_t budget = limits.max_batch_tokens;
  std::vector<bool> out(running.size(), false); // preempted
  std::size_t newest = running.size();          // running[0, newest) are not preempted
  for (std::size_t i = 0; i < newest; ++i) {
    const auto& r = running[i];
    int64_t want = r.prefill_left > 0          ? std::min(r.prefill_left, budget)
                   : budget >= r.decode_tokens ? r.decode_tokens
                   : budget > 0                ? 1
                                               : 0;
    if (want == 0)
      continue; // the budget is spent; it runs next step
    int64_t need = blocks_to_grow(r, want, limits.block_size);
    while (need > free && newest > i + 1) {
      --newest;
      out[newest] = true;
      free += freed(running[newest]);
    }
    if (need > free) { // r is the newest left: it yields
      --newest;
      out[i] = true;
      free += freed(r);
      break;
    }
    free -= need;
    budget -= want;
    plan.work.push_back({r.id, want, need, false, r.prefill_left == 0 || want == r.prefill_left});
  }
  for (std::size_t i = 0; i < running.size(); ++i)
    if (out[i])
      plan.preempted.push_back(running[i].id);
  int64_t slots = limits.max_running - static_cast<int64_t>(running.size() - plan.preempted.size());
  // Preempted requests do not come back in the step that preempted them.
  if (plan.preempted.empty()) {
    for (const auto& w : waiting) {
      if (slots <= 0 || budget <= 0)
        break;
      if (w.waits_for_prefix)
        continue;
      int64_t want = std::min(w.prefill_tokens, budget);
      int64_t need = blocks_for(w.copied_tokens + want); // shared blocks are whole ones
      if (want <= 0 || need + w.pinned_blocks > free)
        break; // strict FCFS: nobody overtakes the head of the queue
      free -= need + w.pinned_blocks;
      budget -= want;
      --slots;
      plan.work.push_back({w.id, want, need, true, want == w.prefill_tokens});
    }
  }
  return plan;
}

// Whether plan_batch could preempt anyone for `running`: only when the running requests' block
// needs, each taken at its largest (a whole prefill chunk or a whole verification), exceed the
// free blocks. Otherwise no running_view::freed_if_preempted is read, and a caller may leave
// them unset (-1) instead of computing them: with the prefix cache that walk over every running
// request's blocks and cache path was a sixth of the scheduler's time per step at batch 256.
[[nodiscard]] inline bool preemption_possible(std::span<const running_view> running, int64_t free_blocks,
                                              const batch_limits& limits) {
  int64_t need = 0;
  for (const auto& r : running) {
    const int64_t want = r.prefill_left > 0 ? std::min(r.prefill_left, limits.max_batch_tokens) : r.decode_tokens;
    need += blocks_to_grow(r, want, limits.block_size);
    if (need > free_blocks)
      return true;
  }
  return false;
}

} // namespace rlserve::policy
