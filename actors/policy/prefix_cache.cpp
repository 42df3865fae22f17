#include "actors/policy/prefix_cache.hpp"

#include <algorithm>
#include <functional>

namespace rlserve::policy {

namespace {

struct tokens_less {
  bool operator()(std::span<const int32_t> a, std::span<const int32_t> b) const {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
  }
};

} // namespace

struct prefix_cache::node {
  node* parent = nullptr; // null for a root
  std::vector<int32_t> tokens; // the block's tokens: its key under the parent
  int32_t block = -1;
  int64_t refs = 0;
  uint64_t released_at = 0; // the tick of its last unpinning (eviction order)
  bool stale = false;       // in a tree of an earlier epoch
  bool draft_ready = false;
  std::vector<int32_t> routing; // block_size rows of the router's choices, or empty
  // Keys view the children's own `tokens`.
  std::map<std::span<const int32_t>, std::unique_ptr<node>, tokens_less> children;

  node() = default;
  node(const node&) = delete;
  node& operator=(const node&) = delete;
  // Iterative: a path is as deep as the longest cached sequence has blocks.
  ~node() {
    std::vector<std::unique_ptr<node>> below;
    for (auto& child : children)
      below.push_back(std::move(child.second));
    children.clear();
    while (!below.empty()) {
      auto n = std::move(below.back());
      below.pop_back();
      for (auto& child : n->children)
        below.push_back(std::move(child.second));
      n->children.clear();
    }
  }
};

prefix_cache::prefix_cache(int64_t num_blocks, int64_t block_size)
    : block_size_(std::max<int64_t>(block_size, 1)), total_(std::max<int64_t>(num_blocks, 0)),
      root_(std::make_unique<node>()) {
  free_.reserve(static_cast<std::size_t>(total_));
  for (int64_t b = total_ - 1; b >= 0; --b)
    free_.push_back(static_cast<int32_t>(b)); // back() is the lowest id
}

prefix_cache::~prefix_cache() = default;

std::optional<std::vector<int32_t>> prefix_cache::allocate(int64_t n) {
  if (n < 0 || n > available_blocks())
    return std::nullopt;
  while (free_blocks() < n)
    if (!evict_one())
      return std::nullopt; // not reached: every unpinned node is a leaf or above one
  std::vector<int32_t> out(static_cast<std::size_t>(n));
  for (auto& b : out) {
    b = free_.back();
    free_.pop_back();
  }
  return out;
}

void prefix_cache::release(std::span<const int32_t> blocks) {
  // Lowest ids stay at the back so allocation order does not depend on release order: sort the
  // few released ids and merge them in (linear in the free list, not n log n).
  auto mid = static_cast<std::ptrdiff_t>(free_.size());
  free_.insert(free_.end(), blocks.begin(), blocks.end());
  std::sort(free_.begin() + mid, free_.end(), std::greater<int32_t>());
  std::inplace_merge(free_.begin(), free_.begin() + mid, free_.end(), std::greater<int32_t>());
}

prefix_cache::match prefix_cache::lookup(std::span<const int32_t> tokens, int64_t max_tokens,
                                         bool with_routing) const {
  match m;
  const auto limit = std::min<int64_t>(max_tokens, static_cast<int64_t>(tokens.size()));
  const node* at = root_.get();
  for (int64_t end = block_size_; end <= limit; end += block_size_) {
    auto it = at->children.find(tokens.subspan(static_cast<std::size_t>(end - block_size_),
                                               static_cast<std::size_t>(block_size_)));
    if (it == at->children.end() || (with_routing && it->second->routing.empty()))
      break;
    node* n = it->second.get();
    m.path.push_back(n);
    if (n->refs == 0)
      ++m.unpinned;
    at = n;
  }
  m.tokens = static_cast<int64_t>(m.path.size()) * block_size_;
  // The block after them sharing the most leading tokens (within the limit) is copied from.
  const auto room = std::min<int64_t>(limit - m.tokens, block_size_);
  if (room > 0) {
    auto next = tokens.subspan(static_cast<std::size_t>(m.tokens), static_cast<std::size_t>(room));
    for (const auto& entry : at->children) {
      if (with_routing && entry.second->routing.empty())
        continue;
      const auto& key = entry.first;
      auto shared = std::mismatch(next.begin(), next.end(), key.begin()).first - next.begin();
      if (shared > m.copy_tokens) {
        m.copy_tokens = shared;
        m.copy_from = entry.second.get();
      }
    }
    if (m.copy_from && m.copy_from->refs == 0)
      ++m.unpinned;
  }
  return m;
}

void prefix_cache::pin(std::span<node* const> path) {
  for (node* n : path) {
    if (n->refs == 0 && !n->stale) {
      --unpinned_;
      evictable_.erase({n->released_at, n});
    }
    ++n->refs;
  }
}

void prefix_cache::unpin(std::span<node* const> path) {
  // Leaf first: a child never has more users than its parent.
  for (auto it = path.rbegin(); it != path.rend(); ++it) {
    node* n = *it;
    if (--n->refs > 0)
      continue;
    if (n->stale) {
      node* parent = n->parent;
      --stale_;
      erase_node(n);
      if (parent->parent == nullptr && parent->children.empty()) // an old root, now empty
        std::erase_if(old_roots_, [&](const auto& r) { return r.get() == parent; });
      continue;
    }
    ++unpinned_;
    n->released_at = ++tick_;
    if (n->children.empty())
      make_evictable(n);
  }
}

prefix_cache::node* prefix_cache::insert(node* parent, std::span<const int32_t> block_tokens,
                                         int32_t block) {
  node* p = parent ? parent : root_.get();
  if (p->stale || static_cast<int64_t>(block_tokens.size()) != block_size_ ||
      p->children.count(block_tokens) != 0)
    return nullptr;
  auto child = std::make_unique<node>();
  child->parent = p;
  child->tokens.assign(block_tokens.begin(), block_tokens.end());
  child->block = block;
  child->refs = 1;
  node* out = child.get();
  if (p != root_.get() && p->refs == 0) // an unpinned leaf no more
    evictable_.erase({p->released_at, p});
  p->children.emplace(std::span<const int32_t>(out->tokens), std::move(child));
  ++cached_;
  return out;
}

prefix_cache::node* prefix_cache::child(node* parent, std::span<const int32_t> block_tokens) const {
  const node* p = parent ? parent : root_.get();
  auto it = p->children.find(block_tokens);
  return it == p->children.end() || p->stale ? nullptr : it->second.get();
}

std::span<const int32_t> prefix_cache::routing(const node* n) {
  return n->routing;
}

void prefix_cache::set_routing(node* n, std::span<const int32_t> rows) {
  if (n->routing.empty())
    n->routing.assign(rows.begin(), rows.end());
}

int32_t prefix_cache::block_of(const node* n) {
  return n->block;
}

int64_t prefix_cache::users(const node* n) {
  return n->refs;
}

void prefix_cache::set_draft_ready(node* n) {
  n->draft_ready = true;
}

bool prefix_cache::draft_ready(const node* n) {
  return n->draft_ready;
}

void prefix_cache::new_epoch() {
  ++epoch_;
  auto old = std::move(root_);
  root_ = std::make_unique<node>();
  evictable_.clear();
  unpinned_ = 0;
  cached_ = 0;
  old->stale = true;
  // Unpinned subtrees are freed now; pinned nodes stay, stale, until unpinned.
  free_unpinned_below(old.get(), [this](node* kept) {
    kept->stale = true;
    ++stale_;
  });
  if (!old->children.empty())
    old_roots_.push_back(std::move(old));
}

int64_t prefix_cache::flush() {
  const auto freed = free_unpinned_below(root_.get(), [](node*) {});
  // Every unpinned node was below a pinned one or the root: none is left.
  evictable_.clear();
  unpinned_ = 0;
  cached_ -= freed;
  return freed;
}

int64_t prefix_cache::free_unpinned_below(node* top, const std::function<void(node*)>& on_kept) {
  int64_t freed = 0;
  std::vector<node*> todo{top};
  while (!todo.empty()) {
    node* n = todo.back();
    todo.pop_back();
    for (auto it = n->children.begin(); it != n->children.end();) {
      node* c = it->second.get();
      if (c->refs == 0) {
        freed += free_subtree(c);
        it = n->children.erase(it);
      } else {
        on_kept(c);
        todo.push_back(c);
        ++it;
      }
    }
  }
  return freed;
}

int64_t prefix_cache::free_subtree(node* n) {
  std::vector<int32_t> blocks;
  std::vector<const node*> todo{n};
  while (!todo.empty()) {
    const node* at = todo.back();
    todo.pop_back();
    blocks.push_back(at->block);
    for (const auto& child : at->children)
      todo.push_back(child.second.get());
  }
  release(blocks);
  return static_cast<int64_t>(blocks.size());
}

void prefix_cache::make_evictable(node* n) {
  evictable_.insert({n->released_at, n});
}

void prefix_cache::erase_node(node* n) {
  node* parent = n->parent;
  int32_t block = n->block;
  parent->children.erase(std::span<const int32_t>(n->tokens)); // destroys n
  release(std::span<const int32_t>(&block, 1));
}

bool prefix_cache::evict_one() {
  if (evictable_.empty())
    return false;
  node* n = evictable_.begin()->second;
  evictable_.erase(evictable_.begin());
  node* parent = n->parent;
  erase_node(n);
  --unpinned_;
  --cached_;
  if (parent != root_.get() && parent->refs == 0 && parent->children.empty())
    make_evictable(parent);
  return true;
}

} // namespace rlserve::policy
