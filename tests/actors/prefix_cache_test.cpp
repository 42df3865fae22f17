// The prefix cache as a data structure: allocation order, lookups in whole blocks, pins,
// eviction (least recently released leaves first, never a pinned block), epochs (no block of an
// earlier epoch is ever found again; pinned ones are freed when let go) and flush.
#include <boost/test/unit_test.hpp>

#include <numeric>

#include "actors/policy/prefix_cache.hpp"

using namespace rlserve::policy;

namespace {

using blocks = std::vector<int32_t>;

// Tokens base, base + 1, ... (n of them).
std::vector<int32_t> seq(int32_t base, int32_t n) {
  std::vector<int32_t> out(static_cast<std::size_t>(n));
  std::iota(out.begin(), out.end(), base);
  return out;
}

// Caches `tokens` (whole blocks) as one request would: allocate, insert block by block, and
// return the path it pins.
std::vector<prefix_cache::node*> cache_sequence(prefix_cache& c, const std::vector<int32_t>& tokens) {
  const auto bs = c.block_size();
  std::vector<prefix_cache::node*> path;
  for (std::size_t first = 0; first + bs <= tokens.size(); first += static_cast<std::size_t>(bs)) {
    auto b = c.allocate(1);
    BOOST_REQUIRE(b);
    auto* n = c.insert(path.empty() ? nullptr : path.back(),
                       std::span<const int32_t>(tokens).subspan(first, static_cast<std::size_t>(bs)),
                       b->front());
    BOOST_REQUIRE(n);
    path.push_back(n);
  }
  return path;
}

blocks blocks_of(const std::vector<prefix_cache::node*>& path) {
  blocks out;
  for (auto* n : path)
    out.push_back(prefix_cache::block_of(n));
  return out;
}

} // namespace

BOOST_AUTO_TEST_SUITE(prefix_cache_test)

BOOST_AUTO_TEST_CASE(allocates_lowest_first_and_all_or_nothing) {
  prefix_cache m(6, 16);
  BOOST_TEST(m.capacity_tokens() == 96);
  BOOST_TEST(m.blocks_for(33) == 3);
  auto a = m.allocate(2);
  BOOST_REQUIRE(a);
  BOOST_TEST((*a == blocks{0, 1}));
  auto b = m.allocate(3);
  BOOST_TEST((*b == blocks{2, 3, 4}));
  BOOST_TEST(!m.allocate(2));
  BOOST_TEST(m.free_blocks() == 1);
  m.release(*a);
  auto c = m.allocate(3);
  BOOST_TEST((*c == blocks{0, 1, 5}));
  BOOST_TEST(!m.allocate(-1));
}

BOOST_AUTO_TEST_CASE(lookup_finds_whole_blocks_up_to_the_limit) {
  prefix_cache c(8, 4);
  auto tokens = seq(100, 10); // two full blocks and a partial one
  auto path = cache_sequence(c, tokens);
  BOOST_REQUIRE_EQUAL(path.size(), 2u);
  BOOST_TEST(c.cached_blocks() == 2);
  c.unpin(path);
  BOOST_TEST(c.evictable_blocks() == 2);

  auto same = c.lookup(tokens, 9);
  BOOST_TEST(same.tokens == 8);
  BOOST_TEST(blocks_of(same.path) == blocks_of(path));
  BOOST_TEST(same.unpinned == 2);
  BOOST_TEST(c.lookup(tokens, 7).tokens == 4); // the limit cuts inside block 2: one block
  BOOST_TEST(c.lookup(tokens, 3).tokens == 0);

  auto other = tokens;
  other[5] = 7; // diverges inside the second block: only the first is shared
  BOOST_TEST(c.lookup(other, 100).tokens == 4);
  other[0] = 7;
  BOOST_TEST(c.lookup(other, 100).tokens == 0);
  BOOST_TEST(c.lookup(std::vector<int32_t>{100, 101}, 100).tokens == 0); // shorter than a block
}

BOOST_AUTO_TEST_CASE(the_block_after_the_whole_ones_is_shared_by_copy) {
  prefix_cache c(8, 4);
  auto path = cache_sequence(c, seq(100, 12)); // three blocks
  c.unpin(path);
  // Same 11 tokens (the limit keeps the last one to run): 2 whole blocks, 3 tokens of the third.
  auto m = c.lookup(seq(100, 12), 11);
  BOOST_TEST(m.tokens == 8);
  BOOST_TEST(m.copy_tokens == 3);
  BOOST_REQUIRE(m.copy_from);
  BOOST_TEST(prefix_cache::block_of(m.copy_from) == prefix_cache::block_of(path[2]));
  BOOST_TEST(m.unpinned == 3); // the source leaves the evictable set while it is copied
  // Diverging inside the second block: one whole block and 2 tokens of the second.
  auto other = seq(100, 12);
  other[6] = 1;
  m = c.lookup(other, 100);
  BOOST_TEST(m.tokens == 4);
  BOOST_TEST(m.copy_tokens == 2);
  BOOST_TEST(prefix_cache::block_of(m.copy_from) == prefix_cache::block_of(path[1]));
  // Nothing in common after the whole blocks: no copy.
  other[4] = 1;
  m = c.lookup(other, 100);
  BOOST_TEST(m.tokens == 4);
  BOOST_TEST(m.copy_tokens == 0);
  BOOST_TEST(!m.copy_from);
  // child() finds a cached block by its tokens; a copy's owner goes on along it.
  auto first = seq(100, 4);
  BOOST_TEST(c.child(nullptr, first) == path[0]);
  BOOST_TEST(c.child(path[0], first) == nullptr);
}

BOOST_AUTO_TEST_CASE(a_cached_prefix_is_inserted_once) {
  prefix_cache c(8, 2);
  auto path = cache_sequence(c, {1, 2, 3, 4});
  auto b = c.allocate(1);
  std::vector<int32_t> first{1, 2};
  BOOST_TEST(c.insert(nullptr, first, b->front()) == nullptr); // someone cached it first
  BOOST_TEST(c.insert(nullptr, std::vector<int32_t>{1}, b->front()) == nullptr); // not a block
  BOOST_TEST(c.cached_blocks() == 2);
  auto* n = c.insert(path.front(), std::vector<int32_t>{9, 9}, b->front()); // a sibling branch
  BOOST_REQUIRE(n);
  BOOST_TEST(c.lookup(std::vector<int32_t>{1, 2, 9, 9}, 4).tokens == 4);
  BOOST_TEST(c.lookup(std::vector<int32_t>{1, 2, 3, 4}, 4).tokens == 4);
}

BOOST_AUTO_TEST_CASE(eviction_takes_least_recently_released_leaves_and_never_pinned_blocks) {
  prefix_cache c(6, 2);
  auto a = cache_sequence(c, {1, 2, 3, 4}); // blocks 0, 1
  auto b = cache_sequence(c, {5, 6, 7, 8}); // blocks 2, 3
  c.unpin(b);
  c.unpin(a); // a released after b: b goes first
  BOOST_TEST(c.free_blocks() == 2);
  BOOST_TEST(c.available_blocks() == 6);

  auto three = c.allocate(3); // 2 free + b's leaf (block 3)
  BOOST_REQUIRE(three);
  BOOST_TEST((*three == blocks{3, 4, 5})); // evicted first, then handed out lowest first
  BOOST_TEST(c.lookup(std::vector<int32_t>{5, 6, 7, 8}, 4).tokens == 2); // b's root block is left
  auto more = c.allocate(1);                                                // now a leaf itself
  BOOST_TEST((*more == blocks{2}));
  BOOST_TEST(c.lookup(std::vector<int32_t>{5, 6}, 2).tokens == 0);

  // A pinned prefix is never evicted: with a's blocks pinned nothing more is available.
  auto found = c.lookup(std::vector<int32_t>{1, 2, 3, 4}, 4);
  BOOST_REQUIRE_EQUAL(found.path.size(), 2u);
  c.pin(found.path);
  BOOST_TEST(c.available_blocks() == 0);
  BOOST_TEST(!c.allocate(1));
  c.unpin(found.path);
  BOOST_TEST(c.available_blocks() == 2);
  BOOST_TEST(c.allocate(2).has_value());
  BOOST_TEST(c.cached_blocks() == 0);
}

BOOST_AUTO_TEST_CASE(a_new_epoch_makes_every_cached_block_unreachable) {
  prefix_cache c(8, 2);
  auto held = cache_sequence(c, {1, 2, 3, 4});   // still pinned by a running request
  auto done = cache_sequence(c, {5, 6});         // released
  c.unpin(done);
  BOOST_TEST(c.free_blocks() == 5);

  c.new_epoch();
  BOOST_TEST(c.epoch() == 1u);
  BOOST_TEST(c.free_blocks() == 6);  // the unpinned block is freed at once
  BOOST_TEST(c.stale_blocks() == 2); // the pinned ones stay until let go
  BOOST_TEST(c.cached_blocks() == 0);
  BOOST_TEST(c.lookup(std::vector<int32_t>{1, 2, 3, 4}, 4).tokens == 0);
  BOOST_TEST(c.lookup(std::vector<int32_t>{5, 6}, 2).tokens == 0);
  // The running request's KV is of the old weights: nothing of it joins the new tree.
  auto b = c.allocate(1);
  BOOST_TEST(c.insert(held.back(), std::vector<int32_t>{7, 8}, b->front()) == nullptr);
  c.release(*b);

  c.unpin(held);
  BOOST_TEST(c.stale_blocks() == 0);
  BOOST_TEST(c.free_blocks() == 8);

  // The same tokens cached again belong to the new epoch.
  auto again = cache_sequence(c, {1, 2, 3, 4});
  c.unpin(again);
  BOOST_TEST(c.lookup(std::vector<int32_t>{1, 2, 3, 4}, 4).tokens == 4);
}

BOOST_AUTO_TEST_CASE(flush_frees_what_nobody_pins) {
  prefix_cache c(8, 2);
  auto held = cache_sequence(c, {1, 2, 3, 4});
  // A second request shares held's prefix and caches one more block, then ends.
  auto shared = c.lookup(std::vector<int32_t>{1, 2, 3, 4, 5, 6}, 6);
  BOOST_REQUIRE_EQUAL(shared.path.size(), 2u);
  c.pin(shared.path);
  auto b = c.allocate(1);
  auto* tail = c.insert(shared.path.back(), std::vector<int32_t>{5, 6}, b->front());
  BOOST_REQUIRE(tail);
  shared.path.push_back(tail);
  c.unpin(shared.path);

  BOOST_TEST(c.flush() == 1); // only the tail: held's blocks are pinned
  BOOST_TEST(c.lookup(std::vector<int32_t>{1, 2, 3, 4, 5, 6}, 6).tokens == 4);
  c.unpin(held);
  BOOST_TEST(c.flush() == 2);
  BOOST_TEST(c.free_blocks() == 8);
  BOOST_TEST(c.cached_blocks() == 0);
}

BOOST_AUTO_TEST_CASE(draft_marks_stay_with_their_blocks) {
  prefix_cache c(8, 2);
  auto path = cache_sequence(c, {1, 2, 3, 4, 5, 6});
  prefix_cache::set_draft_ready(path[0]);
  prefix_cache::set_draft_ready(path[2]); // the draft lacks block 1
  auto m = c.lookup(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7}, 6);
  BOOST_TEST(m.tokens == 6);
  BOOST_REQUIRE_EQUAL(m.path.size(), 3u);
  // What a new draft sequence reuses is the leading run of marked blocks (the scheduler's
  // draft_cached_prefix): here block 0 only.
  BOOST_TEST(prefix_cache::draft_ready(m.path[0]));
  BOOST_TEST(!prefix_cache::draft_ready(m.path[1]));
  BOOST_TEST(prefix_cache::draft_ready(m.path[2]));
  BOOST_TEST(m.unpinned == 0);
}

BOOST_AUTO_TEST_CASE(deep_paths_are_freed_without_recursion) {
  const int32_t n = 20000;
  prefix_cache c(n, 1);
  auto path = cache_sequence(c, seq(0, n));
  c.unpin(path);
  c.new_epoch();
  BOOST_TEST(c.free_blocks() == n);
}

BOOST_AUTO_TEST_SUITE_END()
