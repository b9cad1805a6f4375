#include "util/unique_seed.h"

#include <atomic>
#include <random>

namespace agentkv {
namespace {

// SplitMix64's finalizer: a bijection, so distinct counters stay distinct.
uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t ProcessBase() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace

uint64_t UniqueSeed() {
  static const uint64_t base = ProcessBase();
  static std::atomic<uint64_t> counter{0};
  return Mix(base + counter.fetch_add(1, std::memory_order_relaxed) * 0x9e3779b97f4a7c15ull);
}

}  // namespace agentkv
