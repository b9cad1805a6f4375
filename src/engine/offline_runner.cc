#include "engine/offline_runner.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <memory>

#include "engine/sampler.h"

namespace agentkv {

namespace {

using Clock = std::chrono::steady_clock;

struct Seq {
  size_t request = 0;
  std::vector<int32_t> tokens;  // prompt then output
  size_t prompt_len = 0;
  int32_t cached = 0;  // tokens whose KV is in the cache
  std::array<std::vector<int32_t>, kMaxCacheGroups> blocks;
  std::unique_ptr<Sampler> sampler;
  int32_t max_tokens = 0;
  bool first_token_seen = false;
};

}  // namespace

OfflineRunner::OfflineRunner(Backend& backend, std::vector<int32_t> eos_ids,
                             OfflineRunnerOptions options)
    : backend_(backend), eos_ids_(std::move(eos_ids)), options_(options) {}

Result<std::vector<GenResult>> OfflineRunner::Run(const std::vector<GenRequest>& requests,
                                                  const TokenCallback& on_token) {
  const ModelConfig& cfg = backend_.config();
  const ModelCacheSpec& spec = backend_.cache_spec();
  const int bs = options_.block_size;
  const int ngroups = static_cast<int>(spec.groups.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& p = requests[i].prompt;
    if (p.empty()) return InvalidArgument("request " + std::to_string(i) + ": empty prompt");
    if (static_cast<int64_t>(p.size()) >= options_.max_context)
      return InvalidArgument("request " + std::to_string(i) + ": prompt of " +
                             std::to_string(p.size()) + " tokens does not fit the context of " +
                             std::to_string(options_.max_context));
    for (int32_t t : p)
      if (t < 0 || t >= cfg.vocab_size)
        return InvalidArgument("request " + std::to_string(i) + ": token id " +
                               std::to_string(t) + " out of range");
  }
  if (!allocated_) {
    KvLayout layout;
    layout.block_size = bs;
    for (int g = 0; g < ngroups; ++g) {
      layout.blocks_per_group[g] =
          options_.blocks_per_group > 0
              ? options_.blocks_per_group
              : options_.max_batch * spec.BlocksFor(g, options_.max_context, bs);
    }
    RETURN_IF_ERROR(backend_.AllocateKv(layout));
    allocated_ = true;
  }
  std::array<std::vector<int32_t>, kMaxCacheGroups> free;
  for (int g = 0; g < ngroups; ++g) {
    for (int32_t b = backend_.kv_layout().blocks_per_group[g] - 1; b >= 0; --b)
      free[g].push_back(b);
  }

  std::vector<GenResult> results(requests.size());
  std::deque<size_t> waiting;
  for (size_t i = 0; i < requests.size(); ++i) waiting.push_back(i);
  std::vector<std::unique_ptr<Seq>> running;
  const auto t0 = Clock::now();
  auto since = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };

  std::vector<SeqStep> batch;
  std::vector<Seq*> in_batch;
  std::vector<float> logits(static_cast<size_t>(options_.max_batch) * cfg.vocab_size);
  steps_ = 0;

  auto release = [&](Seq& s) {
    for (int g = 0; g < ngroups; ++g) {
      for (int32_t b : s.blocks[g]) free[g].push_back(b);
      s.blocks[g].clear();
    }
  };

  while (!waiting.empty() || !running.empty()) {
    while (static_cast<int>(running.size()) < options_.max_batch && !waiting.empty()) {
      const size_t r = waiting.front();
      waiting.pop_front();
      auto s = std::make_unique<Seq>();
      s->request = r;
      s->tokens = requests[r].prompt;
      s->prompt_len = s->tokens.size();
      s->sampler = std::make_unique<Sampler>(requests[r].params, cfg.vocab_size);
      s->sampler->AddPrompt(s->tokens);
      const int32_t room = options_.max_context - static_cast<int32_t>(s->prompt_len);
      s->max_tokens = std::min(room, requests[r].params.max_tokens.value_or(room));
      running.push_back(std::move(s));
    }
    // Decode tokens first (one each), then prefill chunks in arrival order.
    batch.clear();
    in_batch.clear();
    int budget = options_.max_step_tokens;
    for (int pass = 0; pass < 2; ++pass) {
      for (auto& sp : running) {
        Seq& s = *sp;
        const int32_t pending = static_cast<int32_t>(s.tokens.size()) - s.cached;
        const bool decoding = s.cached >= static_cast<int32_t>(s.prompt_len);
        if ((pass == 0) != decoding || budget <= 0) continue;
        const int32_t n = std::min(pending, budget);
        const int64_t end = static_cast<int64_t>(s.cached) + n;
        for (int g = 0; g < ngroups; ++g) {
          const int need = spec.BlocksFor(g, end, bs);
          while (static_cast<int>(s.blocks[g].size()) < need) {
            if (free[g].empty())
              return ResourceExhausted("offline runner: out of KV blocks in group " +
                                       std::to_string(g));
            s.blocks[g].push_back(free[g].back());
            free[g].pop_back();
          }
        }
        SeqStep st;
        st.tokens = std::span<const int32_t>(s.tokens).subspan(s.cached, n);
        st.start_pos = s.cached;
        st.want_logits = end == static_cast<int64_t>(s.tokens.size());
        for (int g = 0; g < ngroups; ++g) st.block_tables[g] = s.blocks[g];
        batch.push_back(st);
        in_batch.push_back(&s);
        budget -= n;
      }
    }
    RETURN_IF_ERROR(backend_.Forward(batch, logits));
    ++steps_;
    size_t row = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      Seq& s = *in_batch[i];
      s.cached += static_cast<int32_t>(batch[i].tokens.size());
      if (!batch[i].want_logits) continue;
      std::span<float> l(logits.data() + row * cfg.vocab_size, cfg.vocab_size);
      ++row;
      const int32_t tok = s.sampler->Sample(l).token;
      GenResult& res = results[s.request];
      if (!s.first_token_seen) {
        s.first_token_seen = true;
        res.ttft_s = since();
      }
      const auto& p = requests[s.request].params;
      const bool is_eos = !p.ignore_eos && std::find(eos_ids_.begin(), eos_ids_.end(), tok) !=
                                               eos_ids_.end();
      const bool is_stop = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), tok) !=
                           p.stop_token_ids.end();
      if (is_eos || is_stop) {
        res.finish_reason = "stop";
      } else {
        res.output.push_back(tok);
        s.tokens.push_back(tok);
        if (on_token) on_token(s.request, tok);
        if (static_cast<int32_t>(res.output.size()) >= s.max_tokens) res.finish_reason = "length";
      }
      if (!res.finish_reason.empty()) res.total_s = since();
    }
    for (auto it = running.begin(); it != running.end();) {
      if (!results[(*it)->request].finish_reason.empty()) {
        release(**it);
        it = running.erase(it);
      } else {
        ++it;
      }
    }
  }
  return results;
}

}  // namespace agentkv
