// prefix_cache: the blocks of the target runner's KV pool — which are free, which hold a cached
// prefix — as a pure data structure the scheduler owns (no actors: table-tested on its own).
//
// Cached blocks form a radix tree over token ids, one node per full block: the path from the root
// to a node spells the tokens of positions 0 .. depth * block_size - 1, and the node's block holds
// their keys and values. A request that reuses a prefix pins its nodes (reference counts) and runs
// the rest in blocks of its own; it never writes into a node's block, because it only runs
// positions after its cached prefix. Its full blocks join the tree as they fill (insert), so later
// requests — the other samples of a prompt, the next turn of a conversation — find them.
//
// Memory: a node nobody pins is evictable. allocate() takes free blocks first, then evicts the
// least recently released unpinned leaves (a parent becomes a leaf once its children are gone).
// available_blocks() = free + evictable is what the scheduler plans with.
//
// Version safety: every node belongs to the tree of the current epoch (one epoch per set of
// served weights). new_epoch() — called after anything that may have changed weights — replaces
// the tree by an empty one: unpinned nodes of the old tree are freed at once, pinned ones (still
// read by requests that ran through the change, in_place) when their last user unpins them. A
// lookup only ever sees the current tree, so no KV computed with other weights is ever reused.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <vector>

namespace rlserve::policy {

class prefix_cache {
public:
  struct node;

  // What lookup() found: the nodes of the longest cached prefix, root first, and the block
  // that goes on sharing some tokens after them (copy-on-write: its first copy_tokens slots are
  // copied into the request's own next block, which it then fills).
  struct match {
    std::vector<node*> path;
    int64_t tokens = 0;       // path.size() * block_size
    int64_t unpinned = 0;     // nodes of the path (and copy_from) nobody pins now
    node* copy_from = nullptr;
    int64_t copy_tokens = 0;  // 1 .. block_size - 1 with copy_from, else 0
  };

  prefix_cache(int64_t num_blocks, int64_t block_size);
  ~prefix_cache();
  prefix_cache(const prefix_cache&) = delete;
  prefix_cache& operator=(const prefix_cache&) = delete;

  int64_t block_size() const { return block_size_; }
  int64_t total_blocks() const { return total_; }
  int64_t capacity_tokens() const { return total_ * block_size_; }
  int64_t blocks_for(int64_t tokens) const { return (std::max<int64_t>(tokens, 0) + block_size_ - 1) / block_size_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t evictable_blocks() const { return unpinned_; }
  int64_t available_blocks() const { return free_blocks() + evictable_blocks(); }
  // Blocks in the current tree (pinned or not), and blocks of older trees still pinned.
  int64_t cached_blocks() const { return cached_; }
  int64_t stale_blocks() const { return stale_; }
  uint64_t epoch() const { return epoch_; }

  // `n` blocks no node holds (lowest free ids first, then evicting), or nullopt and nothing taken
  // when fewer than n are available.
  [[nodiscard]] std::optional<std::vector<int32_t>> allocate(int64_t n);
  // Blocks that are no node's (a request's own, not inserted) back to the free list.
  void release(std::span<const int32_t> blocks);

  // The longest prefix of `tokens` the current tree holds, of at most `max_tokens` tokens: whole
  // blocks, then the part of one more block it shares. With `with_routing`, only blocks that
  // keep the router's choices of their positions (routing replay). Changes nothing (pin() what
  // you use).
  match lookup(std::span<const int32_t> tokens, int64_t max_tokens, bool with_routing = false) const;
  // One more user of each node of `path` (root first; every node of the current tree).
  void pin(std::span<node* const> path);
  // One user fewer of each node of `path` (root first, as pinned): unpinned nodes of the current
  // tree become evictable, those of an older tree are freed.
  void unpin(std::span<node* const> path);

  // Makes `block`, holding the `block_size` tokens `block_tokens` after `parent`'s path (null:
  // the root), a node of the current tree, pinned once for the caller, and returns it. Returns
  // null and takes nothing when that prefix is cached already (the caller's block stays its own)
  // or `parent` is not in the current tree.
  node* insert(node* parent, std::span<const int32_t> block_tokens, int32_t block);
  // Routing replay: the router's expert ids of a node's positions (block_size rows of equal
  // length; empty when the request that cached it did not record them). Set once.
  static std::span<const int32_t> routing(const node* n);
  static void set_routing(node* n, std::span<const int32_t> rows);
  // The block a node holds, and how many pin it.
  static int32_t block_of(const node* n);
  static int64_t users(const node* n);
  // The node after `parent`'s path (null: the root) holding `block_tokens`, if cached.
  node* child(node* parent, std::span<const int32_t> block_tokens) const;
  // Records that the draft runner's pool holds this node's block too (same block id).
  static void set_draft_ready(node* n);
  static bool draft_ready(const node* n);

  // Every node becomes unreachable (weights changed): unpinned ones are freed now, pinned ones
  // when unpinned.
  void new_epoch();
  // Frees every unpinned node of the current tree (flush_cache); returns how many blocks.
  int64_t flush();

private:
  int64_t free_subtree(node* n);        // n and every node below it (all unpinned) freed: how many
  // Frees every unpinned subtree below `top` (whose pinned nodes `on_kept` sees): how many nodes.
  int64_t free_unpinned_below(node* top, const std::function<void(node*)>& on_kept);
  void make_evictable(node* n);         // n is an unpinned leaf of the current tree
  void erase_node(node* n);             // n (a childless node) out of its parent, block freed
  bool evict_one();

  int64_t block_size_;
  int64_t total_;
  std::vector<int32_t> free_; // descending; back() is the next to hand out
  std::unique_ptr<node> root_;
  std::vector<std::unique_ptr<node>> old_roots_; // trees of earlier epochs with pinned nodes
  // Unpinned leaves of the current tree by the tick they were last unpinned at (unique: one
  // tick per unpinning), the eviction order.
  std::set<std::pair<uint64_t, node*>> evictable_;
  uint64_t tick_ = 0;
  uint64_t epoch_ = 0;
  int64_t unpinned_ = 0; // nodes of the current tree nobody pins
  int64_t cached_ = 0;   // nodes of the current tree
  int64_t stale_ = 0;    // nodes of earlier trees (all pinned)
};

} // namespace rlserve::policy
