// Sequence: one request's state inside the engine, from submission to its
// last token. Owned by the Scheduler; touched only by the engine thread.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "cache/block_hash.h"
#include "engine/draft_policy.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "engine/stop_checker.h"
#include "engine/token_stream.h"

namespace agentkv::text {
class StreamDetokenizer;
}  // namespace agentkv::text

namespace agentkv::engine {

struct Sequence {
  Sequence();
  ~Sequence();  // out of line: StreamDetokenizer is incomplete here

  RequestId id = 0;
  EngineRequest request;
  std::shared_ptr<TokenStream> stream;

  // Scheduling: the waiting-queue key (priority + aging * arrival), ties by
  // arrival order.
  double key = 0;
  uint64_t arrival = 0;
  std::chrono::steady_clock::time_point submitted;

  std::vector<int32_t> tokens;  // prompt, then output
  size_t prompt_len = 0;
  // Where the KV hash chain of `tokens` starts: ChainRoot(request.cache_salt).
  cache::BlockHash cache_root;
  int64_t computed = 0;              // leading tokens whose KV is in the cache
  int64_t cached_prompt_tokens = 0;  // found in the cache at first admission
  bool admitted_once = false;
  // Restore from the KV tier: prompt tokens already cached when the restore
  // was applied, and how many tokens it wrote after them.
  int64_t resident_before_restore = 0;
  int64_t restored_tokens = 0;
  bool restore_broken = false;  // a chunk could not be restored: skip the rest
  // Tokens written back from the host-memory tier (on arrival, and before
  // each admission after that).
  int64_t host_restored_tokens = 0;
  // The scheduler's admit hook runs before its next admission (set for
  // requests that passed through the tiers, and on each preemption), so
  // that blocks the pool evicted while it waited come back from host memory.
  bool restore_before_admit = false;
  // A split restore (engine/restore_policy.h) is under way: the head of the
  // prompt up to this many tokens is recomputed while the rest comes from
  // the store; prefill stops here until KvTransfer attaches the rest.
  // -1: none.
  int64_t prefill_limit = -1;
  int preemptions = 0;
  int32_t max_new_tokens = 0;

  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<StopChecker> stop;
  std::unique_ptr<text::StreamDetokenizer> detok;  // null without a tokenizer
  bool first_token_sent = false;
  double ttft_s = 0;

  // Pipelined steps (Engine): the last `in_flight` entries of `tokens` are
  // placeholders for picks of launched steps not collected yet; the newest
  // is want_logits row `pick_row` of the newest launched step. `hold`: the
  // newest pick ends the sequence by length, so it is not scheduled again.
  int32_t in_flight = 0;
  int32_t pick_row = -1;
  bool hold = false;

  // Speculative decoding: whether this sequence is drafted for at all
  // (SpeculationEligible), its adaptive draft length, and the draft
  // proposed for the next step (not in `tokens`: the scheduler runs the
  // last token and up to all of it, one logits row each, and the engine
  // appends what it scheduled; empty: a plain decode step).
  bool speculate = false;
  DraftLength draft_length{0};
  std::vector<int32_t> draft;

  int64_t pending() const { return static_cast<int64_t>(tokens.size()) - computed; }
  int64_t output_len() const {
    return static_cast<int64_t>(tokens.size() - prompt_len) - in_flight;
  }
};

}  // namespace agentkv::engine
