// agentkv bench resume [--model DIR] [--tokens 4096,32768] [--store DIR] [--json]
//
// Persist and resume agents of N history tokens. For each N: turn 1 prefills
// the N-token history as an agent (its KV is written behind to the store);
// the engine is then rebuilt on the same backend (the KV pool is wiped, as
// after a restart), the store closed and reopened, and (unless --cold
// false) its data file dropped from the page cache in between;
// turn 2 (the history plus a 16-token message) restores the stored prefix
// and prefills only the suffix. The same turn 2 on an engine without a store
// is the re-prefill it is compared with; both must produce the same greedy
// tokens. Turn 2 also runs with restore-or-recompute (prefill timed at
// start-up; a head recomputed while the rest loads), resident (on the engine
// that ran turn 1) and from the host-memory tier (another agent of the same
// length evicted it there from a pool of one sequence). Reported:
// compression ratio, the tier's raw load rate (read + checksum + decompress,
// timed alone), time to first token of each way, host-to-device GB/s.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "cli/command.h"
#include "cli/model_options.h"
#include "engine/engine.h"
#include "engine/model/model_files.h"
#include "store/store_kv_tier.h"

namespace agentkv::cli {
namespace {

struct ResumeArgs {
  ModelOptions model;
  std::string tokens = "4096,32768";
  std::string store_dir;
  int block_size = 16, message = 16, output = 4, max_step_tokens = 2048;
  int shuffle = 0;  // 0: the backend's KV element size
  int level = 1;
  int workers = 0;  // 0: one per hardware thread
  bool json = false;
  bool cold = true;  // drop the store's pages from the page cache before restoring
  uint64_t seed = 1;
};

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Evicts the store's data file from the page cache, so that a restore reads
// the device and not memory (best effort: clean pages only, after Flush).
void DropPageCache(const std::string& dir) {
  const std::string path = dir + "/data.mdb";
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

struct TurnResult {
  std::vector<int32_t> tokens;
  engine::RequestOutput finished;
  engine::EngineStats stats;
};

// How an engine of a turn differs from the plain one.
struct TurnEngine {
  std::shared_ptr<cache::KvTier> tier;
  bool split = false;          // restore or recompute (calibrated at start-up)
  uint64_t host_kv_bytes = 0;  // host-memory tier
  double pool_sequences = 2;   // pool blocks: this many sequences of the context
};

struct Turn {
  std::vector<int32_t> prompt;
  std::string agent;
};

// Requests one after the other on a fresh engine over `backend` (returned
// afterwards); the stats are the engine's after the last one.
Result<std::vector<TurnResult>> RunTurns(std::unique_ptr<backend::Backend>& backend,
                                         const ResumeArgs& a, const TurnEngine& te,
                                         const std::vector<Turn>& turns) {
  const cache::ModelCacheSpec spec = backend->cache_spec();
  engine::EngineOptions eo;
  eo.block_size = a.block_size;
  eo.scheduler.max_batch = 4;
  eo.scheduler.max_step_tokens = a.max_step_tokens;
  size_t longest = 0;
  for (const Turn& t : turns) longest = std::max(longest, t.prompt.size());
  eo.max_context = static_cast<int32_t>(longest) + a.output + 2;
  for (size_t g = 0; g < spec.groups.size(); ++g)
    eo.blocks_per_group.push_back(static_cast<int32_t>(
        te.pool_sequences * spec.BlocksFor(static_cast<int>(g), eo.max_context, a.block_size) + 8));
  eo.kv_tier = te.tier;
  eo.split_restores = te.split;
  eo.calibrate_prefill = te.split;
  eo.host_kv_memory_bytes = te.host_kv_bytes;
  ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine,
                   engine::Engine::Create(std::move(backend), nullptr, eo));
  std::vector<TurnResult> results;
  Status failed;
  for (const Turn& t : turns) {
    engine::EngineRequest r;
    r.prompt = t.prompt;
    r.params.temperature = 0.0f;
    r.params.ignore_eos = true;
    r.params.max_tokens = a.output;
    r.agent_key = t.agent;
    Result<engine::RequestHandle> h = engine->Submit(std::move(r));
    if (!h.ok()) {
      failed = h.status();
      break;
    }
    TurnResult out;
    while (true) {
      engine::RequestOutput ev = h->stream->Pop();
      if (ev.kind == engine::RequestOutput::Kind::kError) {
        failed = ev.error;
        break;
      }
      if (ev.kind == engine::RequestOutput::Kind::kDelta) {
        out.tokens.insert(out.tokens.end(), ev.tokens.begin(), ev.tokens.end());
        continue;
      }
      out.finished = std::move(ev);
      break;
    }
    if (!failed.ok()) break;
    out.stats = engine->Stats();
    results.push_back(std::move(out));
  }
  backend = engine->ReleaseBackend();
  if (!failed.ok()) return failed;
  return results;
}

// One request on a fresh engine.
Result<TurnResult> RunTurn(std::unique_ptr<backend::Backend>& backend, const ResumeArgs& a,
                           const TurnEngine& te, const std::vector<int32_t>& prompt,
                           const std::string& agent) {
  ASSIGN_OR_RETURN(std::vector<TurnResult> r, RunTurns(backend, a, te, {Turn{prompt, agent}}));
  return std::move(r.front());
}

Result<nlohmann::json> RunSize(std::unique_ptr<backend::Backend>& backend, const ResumeArgs& a,
                               const store::StoreOptions& so, const std::string& store_dir,
                               const std::string& fingerprint, int n) {
  const int32_t vocab = backend->config().vocab_size;
  std::mt19937_64 rng(a.seed + static_cast<uint64_t>(n));
  std::vector<int32_t> history(n);
  for (auto& t : history) t = static_cast<int32_t>(rng() % vocab);
  std::vector<int32_t> turn2 = history;
  for (int i = 0; i < a.message; ++i) turn2.push_back(static_cast<int32_t>(rng() % vocab));
  const uint32_t element =
      a.shuffle > 0 ? static_cast<uint32_t>(a.shuffle) : backend->kv_element_size();
  // Each phase opens the store as a new process would, so that a restore
  // reads through a fresh map (pages the process mapped earlier cannot be
  // dropped from the page cache).
  std::unique_ptr<store::AgentStore> st;
  std::shared_ptr<store::StoreKvTier> tier;
  auto open = [&]() -> Status {
    tier.reset();
    st.reset();
    ASSIGN_OR_RETURN(st, store::AgentStore::Open(store_dir, so));
    ASSIGN_OR_RETURN(std::unique_ptr<store::StoreKvTier> t,
                     store::StoreKvTier::Create(st.get(), fingerprint, backend->kv_format(),
                                                a.block_size, element));
    tier = std::move(t);
    return Status::Ok();
  };
  auto restart = [&]() -> Status {
    tier.reset();
    st.reset();
    if (a.cold) DropPageCache(store_dir);
    return open();
  };
  RETURN_IF_ERROR(open());
  const std::string agent = "bench-resume-" + std::to_string(n);
  const bool tty = isatty(STDERR_FILENO);
  auto progress = [&](const std::string& what) {
    if (tty) std::cerr << "\r\033[K" << n << " tokens: " << what << std::flush;
  };

  // Turn 1: prefill the history; its KV goes behind to the store.
  progress("prefilling the history");
  const store::KvStoreStats before = st->kv_stats();
  ASSIGN_OR_RETURN(TurnResult t1, RunTurn(backend, a, TurnEngine{tier}, history, agent));
  progress("persisting");
  const auto persist0 = Clock::now();
  RETURN_IF_ERROR(st->Flush());
  const double persist_s = Since(persist0);
  const store::KvStoreStats after = st->kv_stats();
  const uint64_t blocks = after.blocks_written - before.blocks_written;
  const uint64_t stored = after.bytes_written - before.bytes_written;
  const int group = 0;  // the full-attention group: tiers exist only for such models
  const uint64_t raw = blocks * backend->cache_spec().BytesPerBlock(group, a.block_size);

  // The tier's raw load rate, after a restart.
  RETURN_IF_ERROR(restart());
  progress("loading alone");
  const auto load0 = Clock::now();
  ASSIGN_OR_RETURN(cache::KvTierLoad load, tier->Load(turn2, cache::kRootBlockHash, a.block_size, 0,
                                                      static_cast<int32_t>(turn2.size())));
  const double load_s = Since(load0);
  uint64_t loaded_bytes = 0;
  for (const cache::KvTierBlock& b : load.blocks) loaded_bytes += b.data.size();
  RETURN_IF_ERROR(load.problem);

  // Turn 2 after a restart: everything loaded from the store, then with
  // restore-or-recompute (the head recomputed while the rest loads, where
  // the start-up timing says so), then re-prefilled for comparison.
  RETURN_IF_ERROR(restart());
  progress("resuming from the store");
  ASSIGN_OR_RETURN(TurnResult restored, RunTurn(backend, a, TurnEngine{tier}, turn2, agent));
  RETURN_IF_ERROR(restart());
  progress("resuming from the store, split");
  ASSIGN_OR_RETURN(TurnResult split, RunTurn(backend, a, TurnEngine{tier, true}, turn2, agent));
  progress("re-prefilling");
  ASSIGN_OR_RETURN(TurnResult reprefill, RunTurn(backend, a, TurnEngine{}, turn2, ""));
  // Resident: turn 2 on the engine that ran turn 1. Host tier: a second
  // agent of the same length runs in between on a pool of one sequence,
  // which evicts the first agent's blocks into host memory.
  progress("resident and host tier");
  ASSIGN_OR_RETURN(std::vector<TurnResult> resident,
                   RunTurns(backend, a, TurnEngine{}, {{history, "r"}, {turn2, "r"}}));
  std::vector<int32_t> other(history.size());
  for (auto& t : other) t = static_cast<int32_t>(rng() % vocab);
  TurnEngine host_engine;
  host_engine.host_kv_bytes = 3 * raw + (64ull << 20);
  host_engine.pool_sequences = 1;
  ASSIGN_OR_RETURN(std::vector<TurnResult> host,
                   RunTurns(backend, a, host_engine, {{history, "h"}, {other, "o"}, {turn2, "h"}}));
  if (tty) std::cerr << "\r\033[K";
  const size_t block_bytes = backend->cache_spec().BytesPerBlock(group, a.block_size);
  const TurnResult& h2 = host.back();

  nlohmann::json j;
  j["history_tokens"] = n;
  j["turn2_prompt_tokens"] = turn2.size();
  j["page_cache"] = a.cold ? "dropped" : "kept";
  j["turn1_prefill_ttft_s"] = t1.finished.ttft_s;
  j["persist_s"] = persist_s;
  j["blocks_written"] = blocks;
  j["raw_bytes"] = raw;
  j["stored_bytes"] = stored;
  j["compression_ratio"] = stored > 0 ? static_cast<double>(raw) / stored : 0.0;
  j["shuffle_element_size"] = element;
  j["load_s"] = load_s;
  j["load_bytes"] = loaded_bytes;
  j["load_bytes_per_s"] = load_s > 0 ? loaded_bytes / load_s : 0.0;
  j["restored_tokens"] = restored.finished.restored_tokens;
  j["cache_source"] = std::string(engine::CacheSourceName(restored.finished.cache_source));
  j["ttft_restored_s"] = restored.finished.ttft_s;
  j["ttft_reprefill_s"] = reprefill.finished.ttft_s;
  // Inside the restored TTFT: the loader's time reading and decoding into
  // staging, the engine thread's time issuing the copies of staging into
  // the pool, and the copies' time until seen done.
  j["restore_load_s"] = restored.stats.restore_load_seconds;
  j["restore_write_s"] = restored.stats.restore_write_seconds;
  j["restore_write_done_s"] = restored.stats.restore_write_done_seconds;
  j["restored_bytes_per_s"] =
      restored.finished.ttft_s > 0
          ? (static_cast<double>(restored.finished.restored_tokens) / a.block_size) *
                backend->cache_spec().BytesPerBlock(group, a.block_size) / restored.finished.ttft_s
          : 0.0;
  j["speedup"] =
      restored.finished.ttft_s > 0 ? reprefill.finished.ttft_s / restored.finished.ttft_s : 0.0;
  j["same_output"] = restored.tokens == reprefill.tokens;
  j["ttft_split_s"] = split.finished.ttft_s;
  j["split_recomputed_tokens"] = split.stats.split_recomputed_tokens;
  j["split_recomputed_all"] = split.stats.recomputed_restores > 0;
  j["split_restored_tokens"] = split.finished.restored_tokens;
  j["prefill_seconds_per_token"] = split.stats.prefill_seconds_per_token;
  j["prefill_seconds_per_token_context"] = split.stats.prefill_seconds_per_token_context;
  j["split_same_output"] = split.tokens == reprefill.tokens;
  j["ttft_resident_s"] = resident.back().finished.ttft_s;
  j["resident_cached_tokens"] = resident.back().finished.cached_tokens;
  j["resident_same_output"] = resident.back().tokens == reprefill.tokens;
  j["ttft_host_s"] = h2.finished.ttft_s;
  j["host_cache_source"] = std::string(engine::CacheSourceName(h2.finished.cache_source));
  j["host_cached_tokens"] = h2.finished.cached_tokens;
  j["host_restored_tokens"] = h2.stats.host_restored_tokens;
  // The copies are asynchronous: issuing them is what the engine thread
  // spends; the rate is over the time until they were seen done.
  j["host_write_issue_s"] = h2.stats.host_write_seconds;
  j["host_write_s"] = h2.stats.host_write_done_seconds;
  j["host_bytes_per_s"] = h2.stats.host_write_done_seconds > 0
                              ? static_cast<double>(h2.stats.host_restored_tokens) / a.block_size *
                                    static_cast<double>(block_bytes) /
                                    h2.stats.host_write_done_seconds
                              : 0.0;
  j["host_same_output"] = h2.tokens == reprefill.tokens;
  return j;
}

int RunResume(const ResumeArgs& a) {
  std::vector<int32_t> sizes;
  std::string err;
  if (!ParseIds(a.tokens, sizes, err) ||
      std::any_of(sizes.begin(), sizes.end(), [](int32_t n) { return n <= 0; })) {
    std::cerr << "error: bad --tokens '" << a.tokens << "'\n";
    return 2;
  }
  const std::string model_dir = a.model.model_dir.empty() ? DefaultModelDir() : a.model.model_dir;
  auto files = model::ModelFiles::Locate(model_dir);
  auto fingerprint = files.ok() ? files->Fingerprint() : Result<std::string>(files.status());
  if (!fingerprint.ok()) {
    std::cerr << "error: " << fingerprint.status().ToString() << "\n";
    return 1;
  }
  auto created = backend::CreateBackend(model_dir, a.model.backend);
  if (!created.ok()) {
    std::cerr << "error: " << created.status().ToString() << "\n";
    return 1;
  }
  std::unique_ptr<backend::Backend> backend = std::move(created).value();
  for (int32_t n : sizes) {
    if (n + a.message + a.output + 2 > backend->config().max_position_embeddings) {
      std::cerr << "error: " << n << " tokens do not fit the model's context ("
                << backend->config().max_position_embeddings << ")\n";
      return 2;
    }
  }
  std::string dir = a.store_dir;
  bool scratch = false;
  if (dir.empty()) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "agentkv-bench-resume-XXXXXX");
    if (::mkdtemp(tmpl.data()) == nullptr) {
      std::cerr << "error: cannot create a scratch store directory\n";
      return 1;
    }
    dir = tmpl;
    scratch = true;
  }
  int rc = 0;
  nlohmann::json out;
  {
    store::StoreOptions so;
    so.compression_level = a.level;
    so.worker_threads = a.workers > 0
                            ? a.workers
                            : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    out["model"] = model_dir;
    out["device"] = backend->name();
    out["kv_format"] = backend->kv_format();
    out["block_size"] = a.block_size;
    out["zstd_level"] = a.level;
    out["store_workers"] = so.worker_threads;
    out["sizes"] = nlohmann::json::array();
    for (int32_t n : sizes) {
      auto r = RunSize(backend, a, so, dir, *fingerprint, n);
      if (!r.ok()) {
        std::cerr << "error: " << r.status().ToString() << "\n";
        rc = 1;
        break;
      }
      out["sizes"].push_back(*r);
      if (!a.json) {
        const auto& j = *r;
        const bool same = j["same_output"].get<bool>() && j["split_same_output"].get<bool>() &&
                          j["resident_same_output"].get<bool>() &&
                          j["host_same_output"].get<bool>();
        std::cout << n << " tokens: TTFT resident " << j["ttft_resident_s"].get<double>()
                  << " s, host " << j["ttft_host_s"].get<double>() << " s ("
                  << j["host_bytes_per_s"].get<double>() / 1e9 << " GB/s), disk "
                  << j["ttft_restored_s"].get<double>() << " s, disk split "
                  << j["ttft_split_s"].get<double>() << " s ("
                  << j["split_recomputed_tokens"].get<int64_t>()
                  << " tokens recomputed), re-prefill " << j["ttft_reprefill_s"].get<double>()
                  << " s; compression " << j["compression_ratio"].get<double>() << "x, load "
                  << j["load_bytes_per_s"].get<double>() / 1e6 << " MB/s, same output "
                  << (same ? "yes" : "NO") << "\n";
      }
    }
  }
  if (scratch) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  if (a.json && rc == 0) std::cout << out.dump() << "\n";
  return rc;
}

Registrar reg(
    "bench resume", "Persist agents of N tokens and resume them: TTFT restored vs re-prefilled",
    [](CLI::App& app) -> Runner {
      auto a = std::make_shared<ResumeArgs>();
      a->model.Add(app, /*model_required=*/false);
      app.add_option("--tokens", a->tokens, "Comma-separated history lengths")
          ->capture_default_str();
      app.add_option("--store", a->store_dir,
                     "Store directory (default: a scratch directory, removed after)");
      app.add_option("--message", a->message, "Tokens of the new message in turn 2")
          ->capture_default_str();
      app.add_option("--output", a->output, "Tokens generated per turn")->capture_default_str();
      app.add_option("--block-size", a->block_size)->capture_default_str();
      app.add_option("--max-step-tokens", a->max_step_tokens, "Token budget of one engine step")
          ->capture_default_str();
      app.add_option("--shuffle", a->shuffle,
                     "Byte-shuffle width before zstd (1, 2, 4; 0 = the KV element "
                     "size)")
          ->capture_default_str();
      app.add_option("--zstd-level", a->level, "zstd compression level")->capture_default_str();
      app.add_option("--workers", a->workers,
                     "Store compression / decompression threads (0 = one per hardware thread)")
          ->capture_default_str();
      app.add_option("--seed", a->seed, "Seed of the random histories")->capture_default_str();
      app.add_option("--cold", a->cold,
                     "Drop the store's pages from the page cache before restoring (false: a "
                     "process restart on a machine whose page cache still holds them)")
          ->capture_default_str();
      app.add_flag("--json", a->json, "Print one JSON object");
      return [a] { return RunResume(*a); };
    });

}  // namespace
}  // namespace agentkv::cli
