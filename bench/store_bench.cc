// KV block compression: ratio and (de)compression throughput for fp32 and
// bf16 KV-like data, with and without the byte shuffle.
//   store_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstring>
#include <random>

#include "store/kv_block_codec.h"
#include "util/bf16.h"

namespace agentkv::store {
namespace {

// One block of 16 tokens x 8 KV heads x 128 dims x K and V: per-channel
// scale and offset plus noise, like the rows of a K/V cache.
std::string Block(bool bf16) {
  const int channels = 128, rows = 16 * 8 * 2;
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<float> scale(channels), offset(channels);
  for (int c = 0; c < channels; ++c) {
    scale[c] = 0.05f + 2.f * std::abs(n(rng));
    offset[c] = 0.5f * n(rng);
  }
  std::string out;
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < channels; ++c) {
      const float v = offset[c] + scale[c] * n(rng);
      if (bf16) {
        const uint16_t b = F32ToBf16(v);
        out.append(reinterpret_cast<const char*>(&b), 2);
      } else {
        out.append(reinterpret_cast<const char*>(&v), 4);
      }
    }
  }
  return out;
}

ModelFingerprint Fp() { return *ModelFingerprint::FromHex(std::string(32, '7')); }

void BM_Decompress(benchmark::State& state) {
  const bool bf16 = state.range(0) == 2;
  const uint32_t es = state.range(1) ? static_cast<uint32_t>(state.range(0)) : 1;
  const int level = static_cast<int>(state.range(2));
  const std::string data = Block(bf16);
  KvBlockCodec codec(level);
  auto rec = codec.Encode(Fp(), cache::BlockHash{}, {}, data, es);
  auto view = KvBlockCodec::Parse(*rec, Fp(), cache::BlockHash{}, 1 << 30, "bench");
  std::string out;
  for (auto _ : state) {
    if (!codec.Decode(*view, &out, "bench").ok()) state.SkipWithError("decode");
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * data.size()));
  state.counters["ratio"] = static_cast<double>(data.size()) / rec->size();
  state.SetLabel(std::string(bf16 ? "bf16" : "fp32") + (es > 1 ? " shuffled" : " plain") +
                 " level " + std::to_string(level));
}

void BM_Compress(benchmark::State& state) {
  const bool bf16 = state.range(0) == 2;
  const uint32_t es = state.range(1) ? static_cast<uint32_t>(state.range(0)) : 1;
  const std::string data = Block(bf16);
  KvBlockCodec codec(static_cast<int>(state.range(2)));
  size_t size = 0;
  for (auto _ : state) {
    auto rec = codec.Encode(Fp(), cache::BlockHash{}, {}, data, es);
    size = rec->size();
    benchmark::DoNotOptimize(rec->data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * data.size()));
  state.counters["ratio"] = static_cast<double>(data.size()) / size;
}

#define KV_ARGS ArgsProduct({{2, 4}, {0, 1}, {1, 3}})->ArgNames({"elem", "shuffle", "level"})
BENCHMARK(BM_Decompress)->KV_ARGS;
BENCHMARK(BM_Compress)->KV_ARGS;

}  // namespace
}  // namespace agentkv::store
