// Prefill attention on one core: a run of 16 query tokens times a GQA group
// of 3 heads (the default model: 6 query / 2 KV heads, head_dim 32) against
// N keys, tiled (AttendRows) versus one (token, head) at a time (AttendOne).
// Flops counted as 4 * rows * keys * head_dim (QK and PV multiply-adds).
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "engine/backend/cpu/cpu_attention.h"
#include "engine/backend/cpu/cpu_kernels.h"

namespace agentkv::backend::cpu::kernels {
namespace {

struct Inputs {
  int D = 32, tokens = 16, heads = 3, keys;
  std::vector<float> k, v, q, out, scratch;
  std::vector<AttnRow> rows;
  explicit Inputs(int n) : keys(n) {
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    k.resize(static_cast<size_t>(keys) * D);
    v.resize(k.size());
    for (float& x : k) x = nd(rng);
    for (float& x : v) x = nd(rng);
    q.resize(static_cast<size_t>(tokens) * heads * D);
    for (float& x : q) x = nd(rng);
    out.resize(q.size());
    scratch.resize(std::max<int64_t>(AttendRowsScratch(tokens * heads, D), keys));
    for (int t = 0; t < tokens; ++t)
      for (int h = 0; h < heads; ++h) {
        const size_t r = static_cast<size_t>(t) * heads + h;
        rows.push_back(AttnRow{q.data() + r * D, out.data() + r * D, keys - tokens + t, 0});
      }
  }
};

void SetCounters(benchmark::State& state, const Inputs& in) {
  const double flops = 4.0 * in.tokens * in.heads * in.keys * in.D;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

void BM_AttendRows(benchmark::State& state) {
  Inputs in(static_cast<int>(state.range(0)));
  const float scale = 0.17677669f;
  for (auto _ : state) {
    AttendRows(
        in.rows.data(), static_cast<int>(in.rows.size()), in.D, scale, 0.f,
        [&](int32_t p) { return in.k.data() + static_cast<size_t>(p) * in.D; },
        [&](int32_t p) { return in.v.data() + static_cast<size_t>(p) * in.D; }, in.scratch.data());
    benchmark::DoNotOptimize(in.out.data());
  }
  SetCounters(state, in);
}
BENCHMARK(BM_AttendRows)->Arg(4096)->Arg(32768);

void BM_AttendOne(benchmark::State& state) {
  Inputs in(static_cast<int>(state.range(0)));
  const float scale = 0.17677669f;
  for (auto _ : state) {
    for (const AttnRow& r : in.rows) {
      AttendOne(
          r.q, r.pos + 1, in.D, scale, 0.f,
          [&](int j) { return in.k.data() + static_cast<size_t>(j) * in.D; },
          [&](int j) { return in.v.data() + static_cast<size_t>(j) * in.D; }, in.scratch.data(),
          r.out);
    }
    benchmark::DoNotOptimize(in.out.data());
  }
  SetCounters(state, in);
}
BENCHMARK(BM_AttendOne)->Arg(4096)->Arg(32768);

}  // namespace
}  // namespace agentkv::backend::cpu::kernels
