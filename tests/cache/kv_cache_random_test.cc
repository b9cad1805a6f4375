// Randomised operations on KvCacheManager against a model of the KV memory:
// every block is simulated as block_size token slots, copies and writes are
// applied as the backend would, and after every operation each sequence must
// read its own tokens back through its block tables (so sharing, prefix hits,
// copy-on-write and ring reuse can never hand a sequence someone else's KV).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "cache/kv_cache_manager.h"
#include "test_specs.h"

namespace agentkv::cache {
namespace {

constexpr int kBs = 4;

class Harness {
 public:
  Harness(const ModelCacheSpec& spec, std::vector<int32_t> blocks, uint32_t seed)
      : spec_(spec), rng_(seed) {
    KvCacheConfig cfg;
    cfg.block_size = kBs;
    cfg.blocks_per_group = blocks;
    m_ = std::move(KvCacheManager::Create(spec, cfg)).value();
    for (int32_t n : blocks) mem_.emplace_back(n, std::vector<int32_t>(kBs, -1));
    // A few shared system prompts so that prefix hits happen.
    for (int i = 0; i < 4; ++i) {
      std::vector<int32_t> p(6 * kBs);
      for (auto& t : p) t = Rand(0, 5);
      bases_.push_back(p);
    }
  }

  int Rand(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  void Run(int ops) {
    for (int i = 0; i < ops; ++i) {
      Step();
      Status st = m_->CheckInvariants();
      ASSERT_TRUE(st.ok()) << "op " << i << ": " << st.ToString();
      ASSERT_NO_FATAL_FAILURE(Verify(i));
    }
    Drain();
  }

  void Drain() {
    for (auto& [id, cache] : agents_) m_->ReleaseAgentCache(&cache);
    agents_.clear();
    while (!seqs_.empty()) Free(seqs_.begin()->first);
    m_->CopiesDone();
    ASSERT_TRUE(m_->CheckInvariants().ok());
    for (int g = 0; g < m_->num_groups(); ++g) {
      BlockPoolStats s = m_->Stats(g);
      EXPECT_EQ(s.in_use, 0);
      EXPECT_EQ(s.pinned, 0);
      m_->EvictIdle(g, s.total);
      s = m_->Stats(g);
      EXPECT_EQ(s.free, s.total) << "group " << g;
    }
    ASSERT_TRUE(m_->CheckInvariants().ok());
  }

  int64_t prefix_hit_tokens() const { return prefix_hit_tokens_; }
  int64_t exhausted() const { return exhausted_; }
  int64_t copies() const { return copies_; }
  int64_t evicted_agent_tokens() const { return evicted_agent_tokens_; }

 private:
  void Step() {
    const int op = Rand(0, 99);
    if (seqs_.empty() || (op < 15 && seqs_.size() < 10)) return NewSeq();
    if (op < 60) return AppendTo(PickSeq(), Rand(0, 3) == 0 ? Rand(5, 30) : Rand(1, 3));
    if (op < 68) return ForkSeq(PickSeq());
    if (op < 80) return Free(PickSeq(), /*as_agent=*/Rand(0, 1) == 1);
    if (op < 86) {
      m_->EvictIdle(Rand(0, m_->num_groups() - 1), Rand(0, 4));
      return;
    }
    if (op < 92) return m_->CopiesDone();
    if (!agents_.empty()) {
      auto it = agents_.begin();
      std::advance(it, Rand(0, static_cast<int>(agents_.size()) - 1));
      m_->ReleaseAgentCache(&it->second);
      agent_tokens_.erase(it->first);
      agents_.erase(it);
    }
  }

  KvCacheManager::SeqId PickSeq() {
    auto it = seqs_.begin();
    std::advance(it, Rand(0, static_cast<int>(seqs_.size()) - 1));
    return it->first;
  }

  void NewSeq() {
    const KvCacheManager::SeqId id = next_id_++;
    ASSERT_TRUE(m_->AddSequence(id).ok());
    seqs_[id] = {};
    // A prompt: a shared base prefix (or an agent's previous tokens), then noise.
    std::vector<int32_t> prompt;
    if (!agent_tokens_.empty() && Rand(0, 2) == 0) {
      auto it = agent_tokens_.begin();
      std::advance(it, Rand(0, static_cast<int>(agent_tokens_.size()) - 1));
      prompt = it->second;
    } else {
      const auto& base = bases_[Rand(0, static_cast<int>(bases_.size()) - 1)];
      prompt.assign(base.begin(), base.begin() + Rand(0, static_cast<int>(base.size())));
    }
    for (int n = Rand(1, 6); n > 0; --n) prompt.push_back(Rand(0, 5));
    Result<int64_t> hit = m_->AttachCachedPrefix(id, prompt);
    ASSERT_TRUE(hit.ok());
    ASSERT_LT(*hit, static_cast<int64_t>(prompt.size()));
    ASSERT_EQ(*hit % kBs, 0);
    prefix_hit_tokens_ += *hit;
    seqs_[id].assign(prompt.begin(), prompt.begin() + *hit);
    AppendTokens(id, {prompt.begin() + *hit, prompt.end()});
  }

  void AppendTo(KvCacheManager::SeqId id, int n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = Rand(0, 5);
    AppendTokens(id, t);
  }

  void AppendTokens(KvCacheManager::SeqId id, const std::vector<int32_t>& tokens) {
    std::vector<int32_t>& model = seqs_[id];
    const int64_t have = static_cast<int64_t>(model.size());
    std::vector<std::vector<int32_t>> before;
    for (int g = 0; g < m_->num_groups(); ++g) before.push_back(m_->Table(id, g).blocks());
    std::vector<KvBlockCopy> copies;
    Status st = m_->EnsureCapacity(id, have + static_cast<int64_t>(tokens.size()), &copies);
    if (st.code() == StatusCode::kResourceExhausted) {
      ++exhausted_;
      for (int g = 0; g < m_->num_groups(); ++g)
        ASSERT_EQ(m_->Table(id, g).blocks(), before[g]) << "failed EnsureCapacity changed state";
      ASSERT_TRUE(copies.empty());
      // Preempt someone else (drop and recompute, as the scheduler would).
      if (seqs_.size() > 1) {
        KvCacheManager::SeqId victim = PickSeq();
        if (victim != id) Free(victim);
      }
      return;
    }
    ASSERT_TRUE(st.ok()) << st.ToString();
    copies_ += static_cast<int64_t>(copies.size());
    // The backend: copies first, then the step's writes.
    for (const KvBlockCopy& c : copies) mem_[c.group][c.dst] = mem_[c.group][c.src];
    // The step's attention reads the cached window before the new K/V is written.
    for (int g = 0; g < m_->num_groups(); ++g) {
      const BlockTable& t = m_->Table(id, g);
      const int window = spec_.groups[g].window;
      for (int64_t p = window > 0 ? std::max<int64_t>(0, have - window + 1) : 0; p < have; ++p)
        ASSERT_EQ(mem_[g][t.BlockAt(p)][p % kBs], model[p]) << "group " << g << " pos " << p;
    }
    for (int g = 0; g < m_->num_groups(); ++g) {
      const BlockTable& t = m_->Table(id, g);
      for (size_t i = 0; i < tokens.size(); ++i) {
        const int64_t pos = have + static_cast<int64_t>(i);
        const int32_t b = t.BlockAt(pos);
        ASSERT_GE(b, 0);
        ASSERT_EQ(m_->pool(g).RefCount(b), 1) << "writing a shared block";
        ASSERT_FALSE(m_->pool(g).IsCached(b)) << "writing a prefix-cached block";
        mem_[g][b][pos % kBs] = tokens[i];
      }
    }
    ASSERT_TRUE(m_->CommitTokens(id, tokens).ok());
    model.insert(model.end(), tokens.begin(), tokens.end());
  }

  void ForkSeq(KvCacheManager::SeqId parent) {
    const KvCacheManager::SeqId id = next_id_++;
    ASSERT_TRUE(m_->Fork(parent, id).ok());
    seqs_[id] = seqs_[parent];
  }

  void Free(KvCacheManager::SeqId id, bool as_agent = false) {
    if (as_agent && m_->prefix_caching()) {
      AgentCache cache = m_->PinForAgent(id);
      EXPECT_LE(m_->ResidentTokens(cache), static_cast<int64_t>(seqs_[id].size()));
      agent_tokens_[id] = seqs_[id];
      agents_[id] = std::move(cache);
      agent_resident_[id] = m_->ResidentTokens(agents_[id]);
    }
    m_->FreeSequence(id);
    seqs_.erase(id);
  }

  void Verify(int op) {
    for (const auto& [id, tokens] : seqs_) {
      ASSERT_EQ(m_->NumTokens(id), static_cast<int64_t>(tokens.size()));
      for (int g = 0; g < m_->num_groups(); ++g) {
        const BlockTable& t = m_->Table(id, g);
        const int window = spec_.groups[g].window;
        const int64_t n = static_cast<int64_t>(tokens.size());
        const int64_t from = window > 0 ? std::max<int64_t>(0, n - window) : 0;
        if (t.is_ring()) {
          ASSERT_LE(t.size(), t.ring_blocks());
        }
        for (int64_t p = from; p < n; ++p)
          ASSERT_EQ(mem_[g][t.BlockAt(p)][p % kBs], tokens[p])
              << "op " << op << " seq " << id << " group " << g << " pos " << p;
      }
    }
    // An agent's resident cache only shrinks, and what it claims is findable.
    for (const auto& [id, cache] : agents_) {
      const int64_t r = m_->ResidentTokens(cache);
      ASSERT_LE(r, agent_resident_[id]);
      if (r < agent_resident_[id]) evicted_agent_tokens_ += agent_resident_[id] - r;
      agent_resident_[id] = r;
      std::vector<int32_t> probe = agent_tokens_[id];
      probe.push_back(0);
      ASSERT_GE(m_->CachedPrefixTokens(probe, kRootBlockHash), r);
    }
  }

  ModelCacheSpec spec_;
  std::mt19937 rng_;
  std::unique_ptr<KvCacheManager> m_;
  std::vector<std::vector<std::vector<int32_t>>> mem_;  // [group][block][slot] -> token
  std::vector<std::vector<int32_t>> bases_;
  std::map<KvCacheManager::SeqId, std::vector<int32_t>> seqs_;
  std::map<KvCacheManager::SeqId, AgentCache> agents_;
  std::map<KvCacheManager::SeqId, std::vector<int32_t>> agent_tokens_;
  std::map<KvCacheManager::SeqId, int64_t> agent_resident_;
  KvCacheManager::SeqId next_id_ = 1;
  int64_t prefix_hit_tokens_ = 0;
  int64_t exhausted_ = 0;
  int64_t copies_ = 0;
  int64_t evicted_agent_tokens_ = 0;
};

TEST(KvCacheRandomTest, FullAttentionTenThousandOps) {
  for (uint32_t seed : {1u, 2u}) {
    SCOPED_TRACE(seed);
    Harness h(testing::FullSpec(), {40}, seed);
    ASSERT_NO_FATAL_FAILURE(h.Run(10000));
    // The test must actually exercise the interesting paths.
    EXPECT_GT(h.prefix_hit_tokens(), 0);
    EXPECT_GT(h.exhausted(), 0);
    EXPECT_GT(h.copies(), 0);
    EXPECT_GT(h.evicted_agent_tokens(), 0);
  }
}

TEST(KvCacheRandomTest, SlidingAndFullTenThousandOps) {
  for (uint32_t seed : {3u}) {
    SCOPED_TRACE(seed);
    Harness h(testing::SlidingSpec(/*window=*/6), {24, 48}, seed);
    ASSERT_NO_FATAL_FAILURE(h.Run(10000));
    EXPECT_GT(h.exhausted(), 0);
    EXPECT_GT(h.copies(), 0);
  }
}

}  // namespace
}  // namespace agentkv::cache
