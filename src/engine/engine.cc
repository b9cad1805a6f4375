#include "engine/engine.h"

#include <algorithm>
#include <chrono>

#include "engine/draft_verify.h"
#include "engine/finish_reason.h"
#include "engine/kv_pool_sizing.h"
#include "engine/pick_mode.h"
#include "engine/stop_checker.h"
#include "engine/text/stream_detokenizer.h"
#include "engine/text/tokenizer.h"

namespace agentkv::engine {

Engine::Engine(std::unique_ptr<backend::Backend> backend, const text::Tokenizer* tokenizer,
               EngineOptions options)
    : backend_(std::move(backend)), tokenizer_(tokenizer), options_(std::move(options)) {}

Result<std::unique_ptr<Engine>> Engine::Create(std::unique_ptr<backend::Backend> backend,
                                               const text::Tokenizer* tokenizer,
                                               EngineOptions options) {
  std::unique_ptr<Engine> e(new Engine(std::move(backend), tokenizer, std::move(options)));
  const model::ModelConfig& cfg = e->backend_->config();
  const cache::ModelCacheSpec& spec = e->backend_->cache_spec();
  e->max_context_ = e->options_.max_context > 0 ? e->options_.max_context
                                                : std::max(cfg.max_position_embeddings, 1);
  if (e->options_.scheduler.max_step_tokens <= 0)
    e->options_.scheduler.max_step_tokens = e->backend_->default_step_tokens();
  // A rejected draft's K/V lands in the sequence's blocks: below a block it
  // never overwrites a sliding window's ring slot still in use.
  SpeculativeOptions& spec_opts = e->options_.speculative;
  spec_opts.max_draft = std::clamp(spec_opts.max_draft, 0, std::max(e->options_.block_size - 1, 0));
  spec_opts.compute_bound_tokens = std::max(spec_opts.compute_bound_tokens, 0);
  KvPoolSize pool_size;
  pool_size.blocks_per_group = e->options_.blocks_per_group;
  pool_size.bytes = e->options_.kv_memory_bytes;
  pool_size.fraction = e->options_.kv_memory_fraction;
  ASSIGN_OR_RETURN(
      std::vector<int32_t> blocks,
      SizeKvPool(*e->backend_, e->options_.block_size, pool_size,
                 e->options_.scheduler.max_step_tokens, e->options_.scheduler.max_batch));
  if (blocks.size() != spec.groups.size())
    return InvalidArgument("engine: blocks_per_group must have one entry per cache group");
  backend::KvLayout layout;
  layout.block_size = e->options_.block_size;
  for (size_t g = 0; g < blocks.size(); ++g) layout.blocks_per_group[g] = blocks[g];
  RETURN_IF_ERROR(e->backend_->AllocateKv(layout));
  e->kv_blocks_ = blocks;
  e->kv_memory_bytes_ = PoolBytes(spec, e->options_.block_size, blocks);
  e->sequence_capacity_ = std::min<int64_t>(
      e->max_context_, SequenceCapacity(spec, e->options_.block_size, blocks, e->max_context_));
  RETURN_IF_ERROR(
      e->backend_->Reserve(e->options_.scheduler.max_step_tokens, e->options_.scheduler.max_batch));
  cache::KvCacheConfig kc;
  kc.block_size = e->options_.block_size;
  kc.blocks_per_group = blocks;
  kc.enable_prefix_caching = e->options_.prefix_caching;
  ASSIGN_OR_RETURN(e->kv_, cache::KvCacheManager::Create(spec, kc));
  e->scheduler_ = std::make_unique<Scheduler>(e->kv_.get(), e->options_.scheduler);
  KvTransferOptions to;
  to.block_size = e->options_.block_size;
  to.kv_tier = e->options_.kv_tier;
  to.restore_chunk_bytes = e->options_.restore_chunk_bytes;
  to.save_staging_bytes = e->options_.save_staging_bytes;
  to.host_kv_bytes = e->options_.host_kv_memory_bytes;
  to.split_restores = e->options_.split_restores;
  to.tier_bytes_per_s = e->options_.tier_bytes_per_s;
  to.tier_latency_s = e->options_.tier_latency_s;
  ASSIGN_OR_RETURN(e->transfer_, KvTransfer::Create(e->backend_.get(), e->kv_.get(), std::move(to),
                                                    [p = e.get()] {
                                                      {
                                                        std::lock_guard<std::mutex> lock(p->mu_);
                                                        p->transfer_ready_ = true;
                                                      }
                                                      p->cv_.notify_one();
                                                    }));
  e->scheduler_->SetAdmitHook([t = e->transfer_.get()](Sequence* s) { t->RestoreBeforeAdmit(s); });
  e->scheduler_->SetRemoveHook([t = e->transfer_.get()](Sequence* s) { t->CancelSplit(s->id); });
  // One logits row per sequence, plus one per draft token (at most the
  // compute-bound step size in all: StepDraftBudget).
  const int64_t logit_rows =
      e->options_.scheduler.max_batch +
      (e->speculation_on() ? e->options_.speculative.compute_bound_tokens : 0);
  const size_t logit_floats = static_cast<size_t>(logit_rows) * cfg.vocab_size;
  e->kept_logits_ =
      UseOptimisticGrammar(e->options_.optimistic_grammar, e->backend_->reads_kept_logits(),
                           e->backend_->picks_on_device());
  e->kept_in_flight_ = e->kept_logits_ && e->options_.pipeline && e->options_.pipeline_grammar &&
                       e->backend_->reads_kept_logits_in_flight();
  const size_t sets = e->kept_in_flight_ ? 2 : 1;
  ASSIGN_OR_RETURN(e->logits_buf_,
                   e->backend_->AllocateHostBuffer(sets * logit_floats * sizeof(float)));
  e->logits_ =
      std::span<float>(reinterpret_cast<float*>(e->logits_buf_.span().data()), logit_floats);
  e->step_logits_[0] = e->logits_;
  e->step_logits_[1] = e->kept_in_flight_
                           ? std::span<float>(e->logits_.data() + logit_floats, logit_floats)
                           : e->logits_;
  int sample_threads = e->options_.sample_threads;
  if (sample_threads <= 0) {
    sample_threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 8);
  }
  if (sample_threads > 1) e->sample_pool_ = std::make_unique<ThreadPool>(sample_threads);
  e->optimistic_procedure_ = e->options_.optimistic_grammar != OptimisticGrammar::kOff;
  PrefillCost cost = e->options_.prefill_cost;
  if (!cost.known() && e->options_.calibrate_prefill) cost = e->CalibratePrefill();
  e->transfer_->SetPrefillCost(cost);
  e->local_.prefill_seconds_per_token = cost.seconds_per_token;
  e->local_.prefill_seconds_per_token_context = cost.seconds_per_token_context;
  e->start_ = std::chrono::steady_clock::now();
  e->PublishStats();
  e->thread_ = std::thread([p = e.get()] { p->Loop(); });
  return e;
}

Engine::~Engine() { Stop(); }

double Engine::Now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

Result<RequestHandle> Engine::Submit(EngineRequest request) {
  RETURN_IF_ERROR(request.params.Validate());
  const model::ModelConfig& cfg = backend_->config();
  if (request.prompt.empty()) return InvalidArgument("the prompt is empty");
  for (int32_t t : request.prompt)
    if (t < 0 || t >= cfg.vocab_size)
      return InvalidArgument("token id " + std::to_string(t) + " is outside the vocabulary");
  if (static_cast<int64_t>(request.prompt.size()) >= max_context_)
    return InvalidArgument("the prompt has " + std::to_string(request.prompt.size()) +
                           " tokens; the context holds " + std::to_string(max_context_));
  if (static_cast<int64_t>(request.prompt.size()) >= sequence_capacity_)
    return InvalidArgument("the prompt has " + std::to_string(request.prompt.size()) +
                           " tokens; the KV pool holds at most " +
                           std::to_string(sequence_capacity_) + " tokens for one request");
  auto s = std::make_unique<Sequence>();
  s->request = std::move(request);
  s->tokens = s->request.prompt;
  s->prompt_len = s->tokens.size();
  s->cache_root = cache::ChainRoot(s->request.cache_salt);
  // Output is bounded by the pool too: a sequence that outgrew it alone
  // could only fail mid-stream.
  const auto room = static_cast<int32_t>(sequence_capacity_ - static_cast<int64_t>(s->prompt_len));
  s->max_new_tokens = std::min(room, s->request.params.max_tokens.value_or(room));
  // The Sampler's reasoning budget derives from max_tokens as clamped here.
  SamplingParams sampler_params = s->request.params;
  sampler_params.max_tokens = s->max_new_tokens;
  s->sampler = std::make_unique<Sampler>(sampler_params, cfg.vocab_size, cfg.eos_token_ids);
  s->speculate = speculation_on() && SpeculationEligible(options_.speculative, s->request.params);
  s->draft_length = DraftLength(options_.speculative.max_draft);
  s->sampler->AddPrompt(s->tokens);
  SamplingParams stop_params = s->request.params;
  stop_params.max_tokens = s->max_new_tokens;
  s->stop = std::make_unique<StopChecker>(stop_params, cfg.eos_token_ids);
  if (tokenizer_) s->detok = std::make_unique<text::StreamDetokenizer>(*tokenizer_);
  s->stream = std::make_shared<TokenStream>();
  s->submitted = std::chrono::steady_clock::now();
  RequestHandle h;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_ || stopping_) return Cancelled("the engine is draining; not accepting requests");
    s->id = next_id_++;
    h = RequestHandle{s->id, s->stream};
    submitted_.push_back(std::move(s));
    idle_ = false;
  }
  cv_.notify_one();
  return h;
}

void Engine::Cancel(RequestId id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_.push_back(id);
  }
  cv_.notify_one();
}

void Engine::DropAgent(const std::string& agent_key) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    dropped_agents_.push_back(agent_key);
  }
  cv_.notify_one();
}

bool Engine::Drain(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  draining_ = true;
  cv_.notify_one();
  auto done = [&] { return idle_ || stopping_; };
  if (timeout_s < 0) {
    idle_cv_.wait(lock, done);
    return true;
  }
  return idle_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), done);
}

void Engine::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_one();
  if (transfer_) transfer_->Stop();  // null when Create failed early
  if (thread_.joinable()) thread_.join();
}

std::unique_ptr<backend::Backend> Engine::ReleaseBackend() {
  Stop();
  // Staging and the host tier are freed through the backend's allocator
  // while it lives (save staging still in the tier stays until released).
  if (transfer_) transfer_->ReleaseBuffers();
  return std::move(backend_);
}

EngineStats Engine::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

int64_t Engine::AgentResidentTokens(const std::string& agent_key) const {
  return transfer_->AgentResidentTokens(agent_key);
}

void Engine::PublishStats() {
  local_.waiting = static_cast<int64_t>(scheduler_->num_waiting());
  local_.running = static_cast<int64_t>(scheduler_->num_running());
  local_.preemptions = scheduler_->preemptions();
  const KvTransferStats t = transfer_->Stats();
  local_.resident_agents = t.resident_agents;
  local_.loading = t.loading;
  local_.restored_tokens = t.restored_tokens;
  local_.restore_problems = t.restore_problems;
  local_.saved_blocks = t.saved_blocks;
  local_.save_dropped_blocks = t.save_dropped_blocks;
  local_.restore_load_seconds = t.restore_load_seconds;
  local_.restore_write_seconds = t.restore_write_seconds;
  local_.restore_write_done_seconds = t.restore_write_done_seconds;
  local_.save_seconds = t.save_seconds;
  local_.host_restored_tokens = t.host_restored_tokens;
  local_.host_kv_capacity_bytes = t.host.capacity_bytes;
  local_.host_kv_bytes = t.host.bytes;
  local_.host_kv_blocks = t.host.blocks;
  local_.host_kv_hits = t.host.hits;
  local_.host_kv_inserts = t.host.inserts;
  local_.host_kv_evictions = t.host.evictions;
  local_.device_seconds = backend_->device_seconds();
  local_.graph_capture_seconds = backend_->graph_capture_seconds();
  local_.graphs_captured = backend_->graphs_captured();
  local_.graph_steps = backend_->graph_steps();
  local_.host_write_seconds = t.host_write_seconds;
  local_.host_write_done_seconds = t.host_write_done_seconds;
  local_.split_restores = t.split_restores;
  local_.split_recomputed_tokens = t.split_recomputed_tokens;
  local_.tier_bytes_per_s = t.tier_bytes_per_s;
  local_.tier_latency_s = t.tier_latency_s;
  local_.recomputed_restores = t.recomputed_restores;
  local_.pools.clear();
  for (int g = 0; g < kv_->num_groups(); ++g) local_.pools.push_back(kv_->Stats(g));
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = local_;
}

void Engine::Loop() {
  while (std::optional<Inbox> inbox = WaitForWork()) {
    const auto t0 = std::chrono::steady_clock::now();
    const double now = Now();
    if (inbox->restored) AdmitRestored(now);
    AdmitSubmitted(inbox->submitted, now);
    ApplyCancellations(inbox->cancelled);
    DropAgents(inbox->dropped);
    const double in_step = RunStep();
    if (!outbox_.empty()) Deliver();  // the phases' events when no step ran
    transfer_->CompleteSaves(/*wait=*/false);
    local_.between_steps_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - in_step;
    PublishStats();
    PublishIdle();
  }
  Shutdown();
}

std::optional<Engine::Inbox> Engine::WaitForWork() {
  Inbox inbox;
  {
    std::unique_lock<std::mutex> lock(mu_);
    // A step that found nothing to run while split restores load waits
    // for the loader (or anything else) instead of spinning. A step still
    // in flight after its sequences finished (one stopped on a sampled
    // stop token while the next step was already launched) is collected
    // now: left there, the engine would never report idle and a drain
    // would wait out its whole deadline.
    auto ready = [&] {
      return stopping_ || !submitted_.empty() || !cancelled_.empty() || !dropped_agents_.empty() ||
             transfer_ready_ || !launched_.empty() || (scheduler_->HasWork() && !waiting_on_loads_);
    };
    // Saves still copying off the device, or waiting for staging, and
    // restore copies holding their host sources are polled every
    // millisecond.
    if (!transfer_->SavesPending() && !transfer_->WritesPending()) {
      cv_.wait(lock, ready);
    } else {
      cv_.wait_for(lock, std::chrono::milliseconds(1), ready);
    }
    if (stopping_) return std::nullopt;
    inbox.submitted.swap(submitted_);
    inbox.cancelled.swap(cancelled_);
    inbox.dropped.swap(dropped_agents_);
    inbox.restored = transfer_ready_;
    transfer_ready_ = false;
  }
  waiting_on_loads_ = false;
  return inbox;
}

void Engine::AdmitRestored(double now) {
  for (auto& s : transfer_->TakeRestored()) scheduler_->Add(std::move(s), now);
}

void Engine::AdmitSubmitted(std::deque<std::unique_ptr<Sequence>>& submitted, double now) {
  // Recomputing a head delays the running agents: the busier the batch,
  // the dearer (engine/restore_policy.h).
  const double busy = 1.0 + static_cast<double>(scheduler_->num_running()) /
                                std::max(1, options_.scheduler.max_batch);
  for (auto& s : submitted)
    if (std::unique_ptr<Sequence> ready = transfer_->Admit(std::move(s), busy))
      scheduler_->Add(std::move(ready), now);
}

void Engine::ApplyCancellations(const std::vector<RequestId>& cancelled) {
  for (RequestId id : cancelled) {
    std::unique_ptr<Sequence> s = scheduler_->Remove(id);
    if (!s) s = transfer_->CancelParked(id);
    if (!s) continue;
    RequestOutput ev;
    ev.kind = RequestOutput::Kind::kFinished;
    ev.cancelled = true;
    ev.prompt_tokens = static_cast<int64_t>(s->prompt_len);
    ev.cached_tokens = s->cached_prompt_tokens;
    ev.completion_tokens = s->output_len();
    Emit(s.get(), std::move(ev));
  }
}

void Engine::DropAgents(const std::vector<std::string>& agents) {
  for (const std::string& a : agents) transfer_->DropAgent(a);
}

double Engine::RunStep() {
  if (transfer_->splits() > 0) AttachSplits();
  if (!scheduler_->HasWork() && launched_.empty()) return 0;
  const auto s0 = std::chrono::steady_clock::now();
  Step();
  Deliver();
  const double in_step =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
  local_.step_seconds += in_step;
  return in_step;
}

void Engine::PublishIdle() {
  if (scheduler_->HasWork() || !launched_.empty() || transfer_->parked() != 0 ||
      transfer_->SavesPending() || transfer_->WritesPending())
    return;
  std::lock_guard<std::mutex> lock(mu_);
  if (submitted_.empty() && !transfer_ready_) {
    idle_ = true;
    idle_cv_.notify_all();
  }
}

void Engine::Shutdown() {
  // Everything still queued or running ends as cancelled, after the steps
  // in flight, whose tokens are delivered.
  CollectAll();
  CancelEverything();
  transfer_->ReleaseAgents();
  Deliver();
  // Every turn's KV is handed over before the backend goes back (SIGTERM
  // and hot-swap persist).
  transfer_->DrainSaves();
  PublishStats();
  std::lock_guard<std::mutex> lock(mu_);
  idle_ = true;
  idle_cv_.notify_all();
}

void Engine::CancelEverything() {
  std::deque<std::unique_ptr<Sequence>> rest;
  {
    std::lock_guard<std::mutex> lock(mu_);
    rest.swap(submitted_);
  }
  for (auto& s : rest) scheduler_->Add(std::move(s), Now());
  for (auto& s : transfer_->TakeParked()) scheduler_->Add(std::move(s), Now());
  std::vector<RequestId> ids;
  for (Sequence* s : scheduler_->running()) ids.push_back(s->id);
  while (Sequence* s = scheduler_->PeekWaiting()) {
    ids.push_back(s->id);
    std::unique_ptr<Sequence> gone = scheduler_->Remove(s->id);
    Finish(gone.get(), FinishReason::kNone, true, "");
  }
  for (RequestId id : ids) {
    // A running agent's turn is cut off: its KV so far is kept like a
    // finished turn's (pinned now, saved by DrainSaves in Shutdown).
    if (Sequence* s = scheduler_->Find(id);
        s != nullptr && !s->request.agent_key.empty() && s->computed > 0)
      transfer_->RetireAgent(s);
    if (std::unique_ptr<Sequence> s = scheduler_->Remove(id))
      Finish(s.get(), FinishReason::kNone, true, "");
  }
}

void Engine::Finish(Sequence* s, FinishReason reason, bool cancelled, std::string tail) {
  RequestOutput ev;
  ev.kind = RequestOutput::Kind::kFinished;
  ev.finish = reason;
  ev.cancelled = cancelled;
  ev.text = std::move(tail);
  ev.prompt_tokens = static_cast<int64_t>(s->prompt_len);
  ev.cached_tokens = s->cached_prompt_tokens;
  // Tokens brought back from a tier (host or store) that the request used;
  // the deepest tier used names the source.
  ev.restored_tokens = std::clamp<int64_t>(s->cached_prompt_tokens - s->resident_before_restore, 0,
                                           s->restored_tokens + s->host_restored_tokens);
  ev.cache_source = ev.restored_tokens > 0
                        ? (s->restored_tokens > 0 ? CacheSource::kDisk : CacheSource::kHost)
                    : ev.cached_tokens > 0 ? CacheSource::kResident
                                           : CacheSource::kNone;
  if (!cancelled) {
    switch (ev.cache_source) {
      case CacheSource::kDisk:
        ++local_.resumed_disk;
        break;
      case CacheSource::kHost:
        ++local_.resumed_host;
        break;
      case CacheSource::kResident:
        ++local_.resumed_resident;
        break;
      default:
        ++local_.resumed_none;
        break;
    }
  }
  ev.completion_tokens = s->output_len();
  ev.ttft_s = s->ttft_s;
  Emit(s, std::move(ev));
}

void Engine::Fail(Sequence* s, const Status& error) {
  RequestOutput ev;
  ev.kind = RequestOutput::Kind::kError;
  ev.error = error;
  Emit(s, std::move(ev));
}

void Engine::Emit(Sequence* s, RequestOutput ev) { outbox_.emplace_back(s->stream, std::move(ev)); }

void Engine::Deliver() {
  PublishStats();
  for (auto& [stream, ev] : outbox_) stream->Push(std::move(ev));
  outbox_.clear();
}

bool Engine::speculation_on() const {
  return options_.speculative.mode != SpeculativeMode::kNone &&
         options_.speculative.max_draft > 0 && backend_->multi_logit_rows();
}

bool Engine::AdmissionLikely() const {
  // Waiting requests are admitted, with their prefill, while the batch has
  // room.
  return scheduler_->num_waiting() > 0 &&
         static_cast<int>(scheduler_->num_running()) < options_.scheduler.max_batch;
}

void Engine::Step() {
  bool stuck = false;
  if (speculation_on()) ProposeDrafts();
  StepPlan plan = scheduler_->Schedule(&stuck);
  if (stuck && !launched_.empty()) {
    CollectAll();  // what it finishes may change the plan
    return;
  }
  if (stuck) {
    // The head request cannot fit even in an empty pool: fail it.
    Sequence* head = scheduler_->PeekWaiting();
    std::unique_ptr<Sequence> s = scheduler_->Remove(head->id);
    Fail(s.get(), ResourceExhausted("the request needs more KV blocks than the pool has"));
    return;
  }
  if (plan.seqs.empty()) {
    CollectAll();
    waiting_on_loads_ = transfer_->splits_loading() > 0;
    return;
  }
  // Blocks the plan's allocations evicted are read into the host tier
  // before the copies and the step can overwrite them.
  transfer_->FlushEvictions();
  Status st = backend_->CopyBlocks(plan.copies);
  kv_->CopiesDone();
  // Scheduled drafts join the tokens (verified, and cut back, at collection).
  for (const ScheduledSeq& sc : plan.seqs) {
    if (sc.logit_rows <= 1) continue;
    Sequence* s = sc.seq;
    s->tokens.insert(s->tokens.end(), s->draft.begin(), s->draft.begin() + (sc.logit_rows - 1));
  }
  for (Sequence* s : scheduler_->running()) s->draft.clear();
  steps_buf_.clear();
  pick_buf_.clear();
  LaunchedStep launched;
  bool all_on_backend = true;
  int decoding = 0;
  int64_t prefill = 0;
  bool could_draft = false;
  for (const ScheduledSeq& sc : plan.seqs) {
    Sequence* s = sc.seq;
    backend::SeqStep step;
    step.tokens = std::span<const int32_t>(s->tokens).subspan(s->computed, sc.num_tokens);
    step.start_pos = static_cast<int32_t>(s->computed);
    step.want_logits = sc.want_logits;
    step.logit_rows = sc.logit_rows;
    // What the next step will hold: every row with logits decodes then
    // (a prompt's last chunk included); the others still prefill.
    if (sc.want_logits) {
      ++decoding;
    } else {
      prefill += sc.num_tokens;
    }
    could_draft = could_draft || s->speculate;
    for (int g = 0; g < kv_->num_groups(); ++g)
      step.block_tables[g] = kv_->Table(s->id, g).blocks();
    // Only the newest step launched can still owe a pick (the one before it
    // was collected right after it launched).
    if (s->in_flight > 0 && s->computed + sc.num_tokens == static_cast<int64_t>(s->tokens.size()))
      step.prev_row = s->pick_row;
    steps_buf_.push_back(step);
    LaunchedRow row{s->id, s->computed, sc.num_tokens, sc.want_logits, false, 0};
    if (sc.want_logits && sc.logit_rows > 1) {
      // A drafted sequence: greedy rows are argmax'd by the backend, sampled
      // ones verified there (RowPick::draft), so only the picks come back;
      // rows whose draw needs the host (none today: such requests are not
      // drafted) are verified on the host from their logits. Either way the
      // step is collected before the next is planned.
      row.draft = sc.logit_rows - 1;
      const backend::PickMode mode = s->sampler->params().greedy()
                                         ? backend::PickMode::kGreedy
                                         : ChoosePickMode(s->sampler->params());
      row.backend_pick = mode != backend::PickMode::kHost;
      all_on_backend = false;
      if (mode == backend::PickMode::kDevice) {
        const std::span<const int32_t> draft =
            std::span<const int32_t>(s->tokens).subspan(s->computed + 1, row.draft);
        PlanSampledDraft(
            draft, [&] { return s->sampler->NextDraw(); }, &pick_buf_);
      } else {
        for (int32_t j = 0; j < sc.logit_rows; ++j) {
          backend::RowPick pick;
          pick.mode = mode;
          pick_buf_.push_back(pick);
        }
      }
      launched.picks += sc.logit_rows;
      ++local_.draft_steps;
    } else if (sc.want_logits) {
      // Greedy and plain sampled rows are picked by the backend (on the GPU
      // for cuda), so their logits need not reach the host. A drawn row's
      // uniform comes from its Sampler now, one per token in token order,
      // as Sample() would draw it.
      // Rows asking for logprobs stay with the backend where it computes
      // them next to its picks.
      // Constrained rows picked optimistically keep their logits on the
      // backend until the grammar has checked the pick. Unless
      // kept_in_flight_, the step is collected before the next launches
      // (which would overwrite them, and would take a pick the grammar may
      // reject as its token); with it, a rejected pick rolls its sequence
      // back (RollBack).
      backend::RowPick pick =
          PlanRowPick(s->sampler->params(), backend_->picks_logprobs(), kept_logits_);
      row.rng_before = s->sampler->rng_state();
      if (pick.mode == backend::PickMode::kDevice) pick.sample = s->sampler->NextDraw();
      row.backend_pick = pick.mode != backend::PickMode::kHost;
      row.kept = pick.keep_logits != 0;
      all_on_backend = all_on_backend && RowPipelines(pick, kept_in_flight_);
      pick_buf_.push_back(pick);
      ++launched.picks;
    }
    launched.rows.push_back(row);
  }
  launched.logits = step_logits_[next_logits_];
  if (kept_in_flight_) next_logits_ ^= 1;
  const auto f0 = std::chrono::steady_clock::now();
  if (st.ok()) st = backend_->LaunchStep(steps_buf_, pick_buf_, launched.logits);
  local_.forward_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - f0).count();
  if (!st.ok()) {
    for (const ScheduledSeq& sc : plan.seqs) {
      std::unique_ptr<Sequence> s = scheduler_->Remove(sc.seq->id);
      Fail(s.get(), st);
    }
    CollectAll();
    return;
  }
  // The next plan continues after this step's tokens; its picks are
  // placeholders until it is collected.
  int pick = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    Sequence* s = plan.seqs[i].seq;
    LaunchedRow& row = launched.rows[i];
    if (s->computed < static_cast<int64_t>(s->prompt_len))
      local_.prompt_tokens += std::min<int64_t>(row.num_tokens, s->prompt_len - s->computed);
    s->computed += row.num_tokens;
    if (!row.want_logits) continue;
    row.pick_at = static_cast<int64_t>(s->tokens.size());
    s->tokens.push_back(0);
    ++s->in_flight;
    pick += row.draft;
    s->pick_row = pick++;
    const int64_t len = static_cast<int64_t>(s->tokens.size());
    if (len - static_cast<int64_t>(s->prompt_len) >= s->max_new_tokens || len >= max_context_)
      s->hold = true;
  }
  launched_.push_back(std::move(launched));
  // The previous step's picks complete this one's tokens.
  if (launched_.size() > 1) {
    ++local_.pipelined_steps;
    CollectOldest();
  }
  CommitNewest();
  // While a sequence of the step could be drafted for next time, the step
  // is collected now: a draft is looked up in real tokens, not placeholders.
  if (AdmissionLikely()) ++prefill;
  const bool drafting_next =
      could_draft && StepDraftBudget(options_.speculative, decoding, prefill) > 0;
  if (!options_.pipeline || !all_on_backend || drafting_next) CollectAll();
}

void Engine::CommitNewest() {
  if (launched_.empty()) return;
  for (const LaunchedRow& r : launched_.back().rows) {
    Sequence* s = scheduler_->Find(r.id);
    // Drafts: once verified; a discarded row's KV is overwritten later.
    if (s == nullptr || r.draft > 0 || r.discarded) continue;
    if (Status c = kv_->CommitTokens(
            s->id, std::span<const int32_t>(s->tokens).subspan(r.first, r.num_tokens));
        !c.ok()) {
      std::unique_ptr<Sequence> gone = scheduler_->Remove(r.id);
      Fail(gone.get(), c);
    }
  }
}

void Engine::Settle(Sequence* s, int64_t real_tokens) {
  s->tokens.resize(static_cast<size_t>(real_tokens));
  s->in_flight = 0;
  s->hold = false;
  s->computed = std::min<int64_t>(kv_->NumTokens(s->id), real_tokens);
}

void Engine::RollBack(Sequence* s, int64_t pick_at) {
  // The steps launched after the one being collected (one at most) hold
  // this sequence's next row, fed the rejected pick. Its KV at pick_at is
  // not committed (CommitNewest skips discarded rows) and is overwritten
  // when the next step feeds the corrected token there, as a rejected
  // draft's is.
  for (LaunchedStep& later : launched_) {
    for (LaunchedRow& lr : later.rows) {
      if (lr.id != s->id || lr.discarded) continue;
      lr.discarded = true;
      if (lr.want_logits) s->sampler->set_rng_state(lr.rng_before);
      break;
    }
  }
  ++local_.grammar_rolled_back_rows;
  s->tokens.resize(static_cast<size_t>(pick_at + 1));
  s->in_flight = 1;  // the pick at pick_at, filled in by the caller
  s->hold = false;
  s->computed = pick_at;
}

void Engine::CollectAll() {
  while (!launched_.empty()) CollectOldest();
}

void Engine::CollectOldest() {
  LaunchedStep step = std::move(launched_.front());
  launched_.pop_front();
  picks_buf_.assign(static_cast<size_t>(step.picks), 0);
  const auto f0 = std::chrono::steady_clock::now();
  const Status st = backend_->CollectStep(picks_buf_);
  local_.forward_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - f0).count();
  if (!st.ok()) {
    // Later steps took their tokens from these picks: they fail too.
    auto fail = [&](const LaunchedStep& l) {
      for (const LaunchedRow& r : l.rows)
        if (std::unique_ptr<Sequence> s = scheduler_->Remove(r.id)) Fail(s.get(), st);
    };
    fail(step);
    while (!launched_.empty()) {
      fail(launched_.front());
      picks_buf_.assign(static_cast<size_t>(launched_.front().picks), 0);
      launched_.pop_front();
      (void)backend_->CollectStep(picks_buf_);
    }
    return;
  }
  const model::ModelConfig& cfg = backend_->config();
  ++local_.steps;
  local_.last_batch_size = static_cast<int64_t>(step.rows.size());
  local_.max_batch_size = std::max(local_.max_batch_size, local_.last_batch_size);
  // Sampled rows first, in parallel: each has its own sampler (its own
  // random stream), so the picks do not depend on the threads.
  // Optimistic picks of constrained rows are checked against their
  // grammar here (accepted ones recorded); the rejected ones join the host
  // rows, their logits read back from the backend first.
  sample_rows_.clear();
  kept_rows_.clear();
  host_picked_.assign(step.rows.size(), 0);
  {
    int row = 0;
    for (size_t i = 0; i < step.rows.size(); ++i) {
      const LaunchedRow& r = step.rows[i];
      if (!r.want_logits) continue;
      const int first = row;
      row += 1 + r.draft;
      if (r.draft > 0 || r.discarded) continue;
      Sequence* s = scheduler_->Find(r.id);
      if (s == nullptr) continue;
      if (r.kept) {
        ++local_.grammar_optimistic_rows;
        if (s->sampler->AcceptPick(picks_buf_[static_cast<size_t>(first)])) continue;
        ++local_.grammar_rejected_rows;
        kept_rows_.push_back(first);
        // The next step ran this sequence on the rejected pick: back to
        // before it (its draw replayed), before the host picks again.
        if (s->in_flight > 1) RollBack(s, r.pick_at);
      } else if (r.backend_pick) {
        continue;
      }
      host_picked_[i] = 1;
      sample_rows_.emplace_back(first, s);
    }
  }
  if (!kept_rows_.empty()) {
    if (Status rd = backend_->ReadKeptLogits(kept_rows_, step.logits); !rd.ok()) {
      // Without their logits the rejected picks have no replacement: those
      // sequences fail.
      auto rejected = [&](int row) {
        return std::find(kept_rows_.begin(), kept_rows_.end(), row) != kept_rows_.end();
      };
      for (const auto& [row, s] : sample_rows_) {
        if (!rejected(row)) continue;
        std::unique_ptr<Sequence> gone = scheduler_->Remove(s->id);
        Fail(gone.get(), rd);
      }
      std::erase_if(sample_rows_, [&](const auto& e) { return rejected(e.first); });
    }
  }
  // Each SampledToken's top logprobs point into its own Sampler, which
  // samples once per step: valid until the events below are built.
  sample_picks_.assign(sample_rows_.size(), SampledToken{});
  auto sample = [&](int64_t i, int) {
    const auto [row, s] = sample_rows_[static_cast<size_t>(i)];
    const std::span<float> logits(step.logits.data() + static_cast<int64_t>(row) * cfg.vocab_size,
                                  cfg.vocab_size);
    // A host row the backend could have picked optimistically takes the
    // same procedure here (the same tokens for a seeded draw); a kept row
    // the grammar rejected goes on with the masked pick.
    const bool optimistic_here = optimistic_procedure_ &&
                                 !std::binary_search(kept_rows_.begin(), kept_rows_.end(), row) &&
                                 OptimisticGrammarPick(s->sampler->params());
    sample_picks_[static_cast<size_t>(i)] =
        optimistic_here ? s->sampler->SampleOptimistic(logits) : s->sampler->Sample(logits);
  };
  if (sample_pool_ && sample_rows_.size() > 1) {
    sample_pool_->ParallelFor(static_cast<int64_t>(sample_rows_.size()), 1, sample);
  } else {
    for (size_t i = 0; i < sample_rows_.size(); ++i) sample(static_cast<int64_t>(i), 0);
  }
  int next_row = 0;
  size_t sampled = 0;
  std::vector<RequestId> done;
  for (size_t i = 0; i < step.rows.size(); ++i) {
    const LaunchedRow& r = step.rows[i];
    if (!r.want_logits) continue;
    const int row = next_row;
    next_row += 1 + r.draft;
    if (r.discarded) continue;  // rolled back: ran on a rejected pick
    Sequence* s = scheduler_->Find(r.id);
    if (s == nullptr) continue;  // cancelled, failed or finished meanwhile
    if (r.draft > 0) {
      if (CollectDrafted(s, r, row, step.logits)) done.push_back(s->id);
      continue;
    }
    int32_t tok;
    const SampledToken* picked = nullptr;
    const backend::RowLogprobs* row_lp = nullptr;
    if (!host_picked_[i]) {
      tok = picks_buf_[row];
      if (!r.kept) s->sampler->AddOutput(tok);  // (a kept pick: AcceptPick recorded it)
      const std::span<const backend::RowLogprobs> lps = backend_->collected_logprobs();
      if (s->request.params.logprobs && static_cast<size_t>(row) < lps.size() &&
          lps[static_cast<size_t>(row)].count >= 0)
        row_lp = &lps[static_cast<size_t>(row)];
    } else {
      picked = &sample_picks_[sampled++];
      tok = picked->token;
    }
    s->tokens[r.pick_at] = tok;
    --s->in_flight;
    if (s->in_flight == 0) s->hold = false;
    if (EmitToken(s, tok, r.pick_at, picked, row_lp)) done.push_back(s->id);
  }
  for (RequestId id : done) {
    Sequence* s = scheduler_->Find(id);
    if (s && !s->request.agent_key.empty() && s->computed > 0) transfer_->RetireAgent(s);
    scheduler_->Remove(id);
  }
}

bool Engine::EmitToken(Sequence* s, int32_t tok, int64_t at, const SampledToken* picked,
                       const backend::RowLogprobs* row_lp) {
  if (!s->first_token_sent) {
    s->first_token_sent = true;
    s->ttft_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - s->submitted).count();
  }
  ++local_.generated_tokens;
  std::string piece = s->detok ? s->detok->Push(tok) : std::string();
  StopUpdate up = s->stop->Append(tok, piece);
  const bool stop_token = up.finish == FinishReason::kStop && up.stop_token_id == tok;
  RequestOutput ev;
  ev.kind = RequestOutput::Kind::kDelta;
  if (!stop_token) {
    ev.tokens.push_back(tok);
    if (picked != nullptr && picked->logprob) {
      ev.logprobs.push_back(
          {*picked->logprob, {picked->top_logprobs.begin(), picked->top_logprobs.end()}});
    } else if (row_lp != nullptr) {
      OutputLogprobs o;
      o.logprob = row_lp->chosen;
      for (int32_t k = 0; k < row_lp->count; ++k)
        o.top.push_back({row_lp->ids[k], row_lp->logprobs[k]});
      ev.logprobs.push_back(std::move(o));
    }
  }
  ev.text = std::move(up.text);
  const int64_t real = at + (stop_token ? 0 : 1);
  const bool full = real >= max_context_;
  if (!ev.tokens.empty() || !ev.text.empty()) Emit(s, std::move(ev));
  if (up.finish == FinishReason::kNone && !full) return false;
  Settle(s, real);
  std::string tail;
  if (up.finish == FinishReason::kNone) {
    if (s->detok) tail = s->detok->Flush();
    tail = s->stop->Flush() + tail;
  }
  Finish(s, up.finish == FinishReason::kNone ? FinishReason::kLength : up.finish, false,
         std::move(tail));
  return true;
}

void Engine::AttachSplits() {
  for (RequestId id : transfer_->LoadedSplits()) {
    Sequence* s = scheduler_->Find(id);
    if (s == nullptr) {
      transfer_->CancelSplit(id);
      continue;
    }
    transfer_->AttachSplit(s);
  }
}

PrefillCost Engine::CalibratePrefill() {
  // Chunks of a full step, at position 0 and as deep as the pool allows
  // (up to 32k tokens, where attention shows); scratch blocks, nothing
  // committed, so the prefix cache never sees them.
  const int bs = options_.block_size;
  const int64_t chunk = options_.scheduler.max_step_tokens / bs * bs;
  const int64_t pool_tokens =
      static_cast<int64_t>(kv_->pool(std::max(0, kv_->prefix_group())).NumAvailable()) * bs;
  const int64_t deep =
      std::min<int64_t>({32768, pool_tokens - chunk, sequence_capacity_ - chunk - 1});
  const int64_t pos = deep / bs * bs;
  if (kv_->prefix_group() < 0 || chunk <= 0 || pos < chunk) return {};
  const cache::KvCacheManager::SeqId id = -1;
  if (!kv_->AddSequence(id).ok()) return {};
  std::vector<cache::KvBlockCopy> copies;
  if (!kv_->EnsureCapacity(id, pos + chunk, &copies).ok()) {
    kv_->FreeSequence(id);
    return {};
  }
  const int32_t vocab = backend_->config().vocab_size;
  std::vector<int32_t> tokens(static_cast<size_t>(chunk));
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<int32_t>((i * 7919 + 13) % static_cast<size_t>(vocab));
  auto timed = [&](int64_t start) -> double {
    backend::SeqStep step;
    step.tokens = tokens;
    step.start_pos = static_cast<int32_t>(start);
    step.want_logits = true;
    for (int g = 0; g < kv_->num_groups(); ++g) step.block_tables[g] = kv_->Table(id, g).blocks();
    const uint8_t greedy = 1;
    int32_t pick = 0;
    const auto t0 = std::chrono::steady_clock::now();
    Status st = backend_->LaunchStep(std::span<const backend::SeqStep>(&step, 1),
                                     std::span<const uint8_t>(&greedy, 1), logits_);
    if (st.ok()) st = backend_->CollectStep(std::span<int32_t>(&pick, 1));
    if (!st.ok()) return -1;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // The first run pays one-time set-up; the best of two after it counts.
  timed(0);
  const double at0 = std::min(timed(0), timed(0));
  const double at_pos = std::min(timed(pos), timed(pos));
  kv_->FreeSequence(id);
  return PrefillCost::FromTimings(chunk, at0, pos, at_pos);
}

}  // namespace agentkv::engine
