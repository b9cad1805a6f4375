// Damaged values (truncated at every offset, random byte flips, bytes flipped
// in the data file itself) are reported as Corruption, never crash and are
// never served. Run under -DAGENTKV_SANITIZE=ON too.
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "store/agent_store.h"
#include "store/kv_block_codec.h"
#include "store/record_envelope.h"
#include "store/records.h"
#include "store_test_util.h"

namespace agentkv::store {
namespace {

using testing::Fp;
using testing::MakeChainWrite;
using testing::TempDir;
using testing::Tokens;

constexpr int kBlock = 16;

class StoreCorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions o;
    o.sync = false;
    o.worker_threads = 2;
    auto s = AgentStore::Open(dir_.path(), o);
    ASSERT_TRUE(s.ok());
    store_ = std::move(*s);
    tokens_ = Tokens(kBlock * 4);
    ASSERT_TRUE(store_->AppendTurn("a", R"([{"role":"user","content":"hello"}])").ok());
    ASSERT_TRUE(store_->PutModel(Fp('1'), R"({"arch":"qwen3"})").ok());
    store_->PutKvBlocks(MakeChainWrite("a", Fp('1'), tokens_, kBlock, 3000));
    ASSERT_TRUE(store_->Flush().ok());
    hashes_ = cache::HashFullBlocks(tokens_, kBlock);
  }

  std::string Raw(Db db, const std::string& key) {
    auto r = store_->env().BeginRead();
    auto v = r->Get(db, key);
    return std::string(**v);
  }
  void PutRaw(Db db, const std::string& key, const std::string& value) {
    ASSERT_TRUE(
        store_->env().Write([&](LmdbEnv::WriteTxn& t) { return t.Put(db, key, value); }).ok());
  }
  // The KV prefix for the request, checking that nothing damaged is served:
  // every returned block is byte-identical to what was written.
  size_t ServedBlocks(Status* problem) {
    auto p = store_->LoadKvPrefixForTokens(Fp('1'), tokens_, kBlock);
    EXPECT_TRUE(p.ok());
    for (size_t i = 0; i < p->blocks.size(); ++i) {
      EXPECT_EQ(p->blocks[i].data, Decoded(i)) << "served a damaged block " << i;
    }
    *problem = p->problem;
    return p->blocks.size();
  }
  const std::string& Decoded(size_t i) {
    if (original_.empty()) {
      auto w = MakeChainWrite("a", Fp('1'), tokens_, kBlock, 3000);
      for (auto& b : w.blocks) original_.push_back(b.data.str());
    }
    return original_[i];
  }

  TempDir dir_;
  std::unique_ptr<AgentStore> store_;
  std::vector<int32_t> tokens_;
  std::vector<cache::BlockHash> hashes_;
  std::vector<std::string> original_;
};

TEST_F(StoreCorruptionTest, TruncatedKvRecordAtEveryOffset) {
  const std::string key = KvKey(Fp('1'), hashes_[3]);  // the last block written
  const std::string good = Raw(Db::kKv, key);
  ASSERT_GT(good.size(), 1000u);
  for (size_t len = 0; len < good.size(); ++len) {
    PutRaw(Db::kKv, key, good.substr(0, len));
    Status problem;
    ASSERT_EQ(ServedBlocks(&problem), 3u) << len;
    ASSERT_EQ(problem.code(), StatusCode::kCorruption) << len;
    ASSERT_NE(problem.message().find("kv fp 1111"), std::string::npos) << problem.message();
    if (len % 97 == 0) {
      auto v = store_->Verify();
      ASSERT_TRUE(v.ok());
      ASSERT_EQ(v->problems.size(), 1u) << len;
    }
  }
  PutRaw(Db::kKv, key, good);
  Status problem;
  EXPECT_EQ(ServedBlocks(&problem), 4u);
  EXPECT_TRUE(problem.ok());
}

TEST_F(StoreCorruptionTest, TruncatedTurnAndMetaRecords) {
  const std::string hk = HistoryKey("a", 1);
  const std::string turn = Raw(Db::kHistory, hk);
  for (size_t len = 0; len < turn.size(); ++len) {
    PutRaw(Db::kHistory, hk, turn.substr(0, len));
    auto h = store_->GetHistory("a");
    ASSERT_EQ(h.status().code(), StatusCode::kCorruption) << len;
    ASSERT_NE(h.status().message().find("history a turn 1"), std::string::npos);
  }
  PutRaw(Db::kHistory, hk, turn);
  const std::string meta = Raw(Db::kAgents, "a");
  for (size_t len = 0; len < meta.size(); ++len) {
    PutRaw(Db::kAgents, "a", meta.substr(0, len));
    ASSERT_EQ(store_->GetAgent("a").status().code(), StatusCode::kCorruption) << len;
  }
  // A turn appended over a corrupt meta rebuilds it from the history.
  auto t = store_->AppendTurn("a", "[]");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, 2u);
  EXPECT_EQ(store_->GetAgent("a")->turns, 2u);
}

TEST_F(StoreCorruptionTest, TenThousandRandomByteFlipsAreAllDetected) {
  struct Target {
    Db db;
    std::string key;
    std::string good;
  };
  std::vector<Target> targets;
  for (Db db :
       {Db::kKv, Db::kKvMeta, Db::kChains, Db::kHistory, Db::kAgents, Db::kModels, Db::kMeta}) {
    auto r = store_->env().BeginRead();
    ASSERT_TRUE(r->Scan(db, {}, [&](std::string_view k, std::string_view v) -> Result<bool> {
                   targets.push_back({db, std::string(k), std::string(v)});
                   return true;
                 }).ok());
  }
  ASSERT_GE(targets.size(), 15u);
  std::mt19937 rng(7);
  int served_checks = 0;
  for (int i = 0; i < 10000; ++i) {
    const Target& t = targets[rng() % targets.size()];
    std::string bad = t.good;
    const size_t at = rng() % bad.size();
    bad[at] = static_cast<char>(bad[at] ^ (1 + rng() % 255));
    PutRaw(t.db, t.key, bad);
    auto v = store_->Verify();
    ASSERT_TRUE(v.ok());
    ASSERT_EQ(v->problems.size(), 1u) << DbName(t.db) << " offset " << at;
    if (t.db == Db::kKv) {
      ++served_checks;
      Status problem;
      const size_t n = ServedBlocks(&problem);
      ASSERT_LT(n, 4u);
      ASSERT_EQ(KvKey(Fp('1'), hashes_[n]), t.key);
      ASSERT_EQ(problem.code(), StatusCode::kCorruption);
    } else if (t.db == Db::kHistory) {
      ASSERT_EQ(store_->GetHistory("a").status().code(), StatusCode::kCorruption);
    } else if (t.db == Db::kChains) {
      ASSERT_LT(store_->GetKvChain("a", Fp('1'))->size(), 4u);
    } else if (t.db == Db::kModels) {
      ASSERT_EQ(store_->GetModel(Fp('1')).status().code(), StatusCode::kCorruption);
    }
    PutRaw(t.db, t.key, t.good);
  }
  EXPECT_GT(served_checks, 500);
  EXPECT_TRUE(store_->Verify()->ok());
}

TEST_F(StoreCorruptionTest, TouchLeavesADamagedKvMetaForVerify) {
  // A resume read queues an LRU touch; the writer must not paper over a
  // damaged meta (Verify would miss it and the block would lose its size).
  const std::string key = KvKey(Fp('1'), hashes_[0]);
  std::string bad = Raw(Db::kKvMeta, key);
  bad[bad.size() - 4] ^= 0x01;  // the stored size
  PutRaw(Db::kKvMeta, key, bad);
  Status problem;
  EXPECT_EQ(ServedBlocks(&problem), 4u);
  ASSERT_TRUE(store_->Flush().ok());
  EXPECT_EQ(Raw(Db::kKvMeta, key), bad);
  auto v = store_->Verify();
  ASSERT_TRUE(v.ok());
  ASSERT_EQ(v->problems.size(), 1u);
  EXPECT_NE(v->problems[0].find("kvmeta fp 1111"), std::string::npos) << v->problems[0];

  // A write that changes the meta rebuilds it with the block's real size.
  store_->PutKvBlocks(MakeChainWrite("b", Fp('1'), tokens_, kBlock, 3000));
  ASSERT_TRUE(store_->Flush().ok());
  auto m = DecodeKvMeta(Raw(Db::kKvMeta, key), "k");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->stored_bytes, Raw(Db::kKv, key).size());
  EXPECT_EQ(m->refcount, 1u);
  EXPECT_TRUE(store_->Verify()->ok());
}

TEST_F(StoreCorruptionTest, WriterRepairsADamagedBlockOnRewrite) {
  const std::string key = KvKey(Fp('1'), hashes_[1]);
  std::string bad = Raw(Db::kKv, key);
  bad[bad.size() / 2] ^= 0x40;
  PutRaw(Db::kKv, key, bad);
  store_->PutKvBlocks(MakeChainWrite("a", Fp('1'), tokens_, kBlock, 3000));
  ASSERT_TRUE(store_->Flush().ok());
  Status problem;
  EXPECT_EQ(ServedBlocks(&problem), 4u);
}

TEST_F(StoreCorruptionTest, FlippedBytesInTheDataFile) {
  // Damage the bytes of one KV record's zstd frame and of one turn's text
  // in data.mdb itself (found by content, so LMDB's page structure is left
  // alone), then reopen.
  const std::string kv = Raw(Db::kKv, KvKey(Fp('1'), hashes_[2]));
  const std::string frame_tail = kv.substr(kv.size() - 24);
  store_.reset();
  const std::string path = dir_.sub("data.mdb");
  std::string file;
  {
    std::ifstream in(path, std::ios::binary);
    file.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t at = file.find(frame_tail);
  ASSERT_NE(at, std::string::npos);
  ASSERT_EQ(file.find(frame_tail, at + 1), std::string::npos);
  const size_t turn_at = file.find("hello");
  ASSERT_NE(turn_at, std::string::npos);
  {
    std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(at + 5));
    f.put(static_cast<char>(file[at + 5] ^ 0x10));
    f.seekp(static_cast<std::streamoff>(turn_at));
    f.put('j');
  }
  StoreOptions o;
  o.sync = false;
  auto s = AgentStore::Open(dir_.path(), o);
  ASSERT_TRUE(s.ok());
  store_ = std::move(*s);
  Status problem;
  EXPECT_EQ(ServedBlocks(&problem), 2u);
  EXPECT_EQ(problem.code(), StatusCode::kCorruption);
  EXPECT_EQ(store_->GetHistory("a").status().code(), StatusCode::kCorruption);
  auto v = store_->Verify();
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->problems.size(), 2u);
}

TEST(KvBlockCodecTest, DecompressionIsBounded) {
  KvBlockCodec codec(1);
  const std::string data(1 << 20, 'z');  // compresses to almost nothing
  const cache::BlockHash h{1, 2};
  const std::vector<int32_t> toks = {5, 6};
  auto rec = codec.Encode(Fp('1'), h, toks, data, 1);
  ASSERT_TRUE(rec.ok());
  // Over the reader's limit: refused before any decompression.
  auto big = KvBlockCodec::Parse(*rec, Fp('1'), h, (1 << 20) - 1, "k");
  EXPECT_EQ(big.status().code(), StatusCode::kCorruption);
  auto ok = KvBlockCodec::Parse(*rec, Fp('1'), h, 1 << 20, "k");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->Tokens(), toks);
  std::string out;
  ASSERT_TRUE(codec.Decode(*ok, &out, "k").ok());
  EXPECT_EQ(out, data);
  // A header that understates the frame's size (with a valid checksum, as a
  // buggy or hostile writer could produce) is refused, not overrun.
  KvBlockView lie = *ok;
  lie.uncompressed_size = 4096;
  EXPECT_EQ(codec.Decode(lie, &out, "k").code(), StatusCode::kCorruption);
  EXPECT_LE(out.size(), size_t{1} << 20);
  // Wrong hash or fingerprint for the key.
  EXPECT_FALSE(KvBlockCodec::Parse(*rec, Fp('2'), h, 1 << 20, "k").ok());
  EXPECT_FALSE(KvBlockCodec::Parse(*rec, Fp('1'), cache::BlockHash{1, 3}, 1 << 20, "k").ok());
}

TEST(KvBlockCodecTest, ShuffledRoundTrip) {
  KvBlockCodec codec(3);
  for (uint32_t es : {1u, 2u, 4u}) {
    const std::string data = testing::Fp32Bytes(testing::KvLikeFloats(4096, es));
    auto rec = codec.Encode(Fp('1'), cache::BlockHash{}, {}, data, es);
    ASSERT_TRUE(rec.ok());
    auto v = KvBlockCodec::Parse(*rec, Fp('1'), cache::BlockHash{}, 1 << 20, "k");
    ASSERT_TRUE(v.ok());
    std::string out;
    ASSERT_TRUE(codec.Decode(*v, &out, "k").ok());
    EXPECT_EQ(out, data) << es;
  }
  EXPECT_FALSE(codec.Encode(Fp('1'), cache::BlockHash{}, {}, "abc", 2).ok());
  EXPECT_FALSE(codec.Encode(Fp('1'), cache::BlockHash{}, {}, "abcd", 3).ok());
}

}  // namespace
}  // namespace agentkv::store
