#include "cache/block_pool.h"

#include <cassert>
#include <string>

namespace agentkv::cache {

BlockPool::BlockPool(int32_t num_blocks) : blocks_(num_blocks > 0 ? num_blocks : 0) {
  free_.reserve(blocks_.size());
  // Reversed so that a fresh pool hands out 0, 1, 2, ...: easier to read in
  // logs and tests.
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

void BlockPool::Misuse() {
  assert(false && "BlockPool misuse: reference count of a block went wrong");
  ++misuses_;
}

void BlockPool::PushBack(IdleList& list, int32_t block) {
  Block& blk = blocks_[block];
  blk.prev = list.tail;
  blk.next = -1;
  if (list.tail >= 0) {
    blocks_[list.tail].next = block;
  } else {
    list.head = block;
  }
  list.tail = block;
  ++list.size;
}

void BlockPool::Unlink(IdleList& list, int32_t block) {
  Block& blk = blocks_[block];
  if (blk.prev >= 0) {
    blocks_[blk.prev].next = blk.next;
  } else {
    list.head = blk.next;
  }
  if (blk.next >= 0) {
    blocks_[blk.next].prev = blk.prev;
  } else {
    list.tail = blk.prev;
  }
  blk.prev = blk.next = -1;
  --list.size;
}

void BlockPool::MakeIdle(int32_t block) {
  Block& blk = blocks_[block];
  if (blk.cached) {
    blk.state = blk.pins > 0 ? State::kPinned : State::kCached;
    PushBack(ListFor(blk.state), block);
  } else {
    blk.state = State::kFree;
    blk.pins = 0;
    ++blk.generation;
    free_.push_back(block);
  }
}

void BlockPool::EvictOne(int32_t block) {
  Block& blk = blocks_[block];
  Unlink(ListFor(blk.state), block);
  blk.cached = false;
  blk.pins = 0;
  ++blk.generation;
  blk.state = State::kFree;
  ++evictions_;
  if (evict_cb_) evict_cb_(block);
}

Result<int32_t> BlockPool::Allocate() {
  int32_t block;
  if (!free_.empty()) {
    block = free_.back();
    free_.pop_back();
  } else if (cached_.head >= 0 || pinned_.head >= 0) {
    block = cached_.head >= 0 ? cached_.head : pinned_.head;
    EvictOne(block);
  } else {
    return ResourceExhausted("KV block pool: all " + std::to_string(num_blocks()) +
                             " blocks are in use");
  }
  Block& blk = blocks_[block];
  blk.refs = 1;
  blk.state = State::kInUse;
  ++in_use_;
  return block;
}

void BlockPool::AddRef(int32_t block) {
  if (!Valid(block)) return Misuse();
  Block& blk = blocks_[block];
  switch (blk.state) {
    case State::kFree:
      return Misuse();
    case State::kCached:
    case State::kPinned:
      Unlink(ListFor(blk.state), block);
      blk.state = State::kInUse;
      ++in_use_;
      break;
    case State::kInUse:
      break;
  }
  ++blk.refs;
}

void BlockPool::Release(int32_t block) {
  if (!Valid(block)) return Misuse();
  Block& blk = blocks_[block];
  if (blk.state != State::kInUse || blk.refs <= 0) return Misuse();
  if (--blk.refs == 0) {
    --in_use_;
    MakeIdle(block);
  }
}

int32_t BlockPool::RefCount(int32_t block) const { return Valid(block) ? blocks_[block].refs : 0; }

bool BlockPool::MarkCached(int32_t block) {
  if (!Valid(block) || blocks_[block].state != State::kInUse) return false;
  blocks_[block].cached = true;
  return true;
}

void BlockPool::Uncache(int32_t block) {
  if (!Valid(block)) return;
  Block& blk = blocks_[block];
  if (!blk.cached) return;
  if (blk.state == State::kCached || blk.state == State::kPinned) {
    Unlink(ListFor(blk.state), block);
    blk.cached = false;
    MakeIdle(block);  // to the free list, new generation
    return;
  }
  blk.cached = false;
  blk.pins = 0;
  ++blk.generation;
}

bool BlockPool::IsCached(int32_t block) const { return Valid(block) && blocks_[block].cached; }

std::optional<PinRef> BlockPool::Pin(int32_t block) {
  if (!Valid(block) || !blocks_[block].cached) return std::nullopt;
  Block& blk = blocks_[block];
  if (++blk.pins == 1 && blk.state == State::kCached) {
    Unlink(cached_, block);
    blk.state = State::kPinned;
    PushBack(pinned_, block);
  }
  return PinRef{block, blk.generation};
}

void BlockPool::Unpin(const PinRef& pin) {
  if (!IsPinValid(pin)) return;
  Block& blk = blocks_[pin.block];
  if (blk.pins <= 0) return Misuse();
  if (--blk.pins == 0 && blk.state == State::kPinned) {
    Unlink(pinned_, pin.block);
    blk.state = State::kCached;
    PushBack(cached_, pin.block);
  }
}

bool BlockPool::IsPinValid(const PinRef& pin) const {
  return Valid(pin.block) && blocks_[pin.block].cached &&
         blocks_[pin.block].generation == pin.generation;
}

int32_t BlockPool::EvictIdle(int32_t max_blocks) {
  int32_t n = 0;
  while (n < max_blocks && (cached_.head >= 0 || pinned_.head >= 0)) {
    int32_t block = cached_.head >= 0 ? cached_.head : pinned_.head;
    EvictOne(block);
    free_.push_back(block);
    ++n;
  }
  return n;
}

void BlockPool::RecordPrefixLookup(int64_t hit_blocks, int64_t miss_blocks) {
  prefix_hits_ += hit_blocks;
  prefix_misses_ += miss_blocks;
}

int32_t BlockPool::NumAvailable() const {
  return static_cast<int32_t>(free_.size()) + cached_.size + pinned_.size;
}

BlockPoolStats BlockPool::Stats() const {
  BlockPoolStats s;
  s.total = num_blocks();
  s.free = static_cast<int32_t>(free_.size());
  s.in_use = in_use_;
  s.cached = cached_.size;
  s.pinned = pinned_.size;
  s.prefix_hits = prefix_hits_;
  s.prefix_misses = prefix_misses_;
  s.evictions = evictions_;
  return s;
}

Status BlockPool::CheckInvariants() const {
  auto fail = [](const std::string& what) { return Internal("BlockPool: " + what); };
  if (misuses_ > 0) return fail(std::to_string(misuses_) + " misuse(s) (double release?)");
  const int32_t n = num_blocks();
  std::vector<uint8_t> seen(n, 0);
  for (int32_t b : free_) {
    if (!Valid(b)) return fail("bad id on free list");
    if (seen[b]++) return fail("block " + std::to_string(b) + " twice on the free list");
    const Block& blk = blocks_[b];
    if (blk.state != State::kFree || blk.refs != 0 || blk.cached || blk.pins != 0)
      return fail("block " + std::to_string(b) + " on the free list is not free");
  }
  auto walk = [&](const IdleList& list, State want, const char* name) -> Status {
    int32_t count = 0;
    int32_t prev = -1;
    for (int32_t b = list.head; b >= 0; b = blocks_[b].next) {
      if (!Valid(b) || seen[b]++) return fail(std::string("loop or overlap in ") + name);
      const Block& blk = blocks_[b];
      if (blk.prev != prev) return fail(std::string("broken back link in ") + name);
      if (blk.state != want || blk.refs != 0 || !blk.cached)
        return fail("block " + std::to_string(b) + " misplaced in " + name);
      if ((want == State::kPinned) != (blk.pins > 0))
        return fail("pin count disagrees with tier of block " + std::to_string(b));
      prev = b;
      if (++count > n) return fail(std::string("loop in ") + name);
    }
    if (prev != list.tail || count != list.size)
      return fail(std::string("bad size/tail of ") + name);
    return Status::Ok();
  };
  RETURN_IF_ERROR(walk(cached_, State::kCached, "cached list"));
  RETURN_IF_ERROR(walk(pinned_, State::kPinned, "pinned list"));
  int32_t in_use = 0;
  for (int32_t b = 0; b < n; ++b) {
    const Block& blk = blocks_[b];
    if (blk.state == State::kInUse) {
      if (blk.refs <= 0) return fail("in-use block " + std::to_string(b) + " has no reference");
      if (seen[b]) return fail("in-use block " + std::to_string(b) + " is also idle");
      ++in_use;
    } else if (!seen[b]) {
      return fail("block " + std::to_string(b) + " is lost (in no list)");
    }
    if (!blk.cached && blk.pins != 0) return fail("uncached block with pins");
  }
  if (in_use != in_use_) return fail("in-use counter is off");
  if (in_use_ + NumAvailable() != n) return fail("states do not add up to the total");
  return Status::Ok();
}

}  // namespace agentkv::cache
