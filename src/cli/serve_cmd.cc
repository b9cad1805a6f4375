// agentkv serve [--model DIR] [--store DIR] [--host H] [--port P] [--device cpu|cuda]
//               [--threads N] [--max-batch N] [--max-step-tokens N]
//               [--kv-memory BYTES] [--api-key K] ...
//
// Loads the model, serves the HTTP API (OpenAI, Anthropic, agents, admin) and
// prints "listening on http://HOST:PORT" once it accepts connections. Every
// flag may also come from AGENTKV_<FLAG> (flags win). SIGINT / SIGTERM stop
// accepting, drain the engine and exit 0.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <thread>

#include "agent/agent_manager.h"
#include "api/api_service.h"
#include "api/http_server.h"
#include "api/metrics.h"
#include "api/model_host.h"
#include "api/request_guard.h"
#include "api/served_model.h"
#include "api/tenant_keys.h"
#include "cli/command.h"
#include "cli/model_options.h"
#include "store/agent_store.h"
#include "util/memory_size.h"
#include "util/system_memory.h"
#include "util/task_pool.h"

namespace agentkv::cli {
namespace {

struct ServeArgs {
  ModelOptions model;
  std::string host = "127.0.0.1";
  int port = 8080;
  int max_batch = 64;
  int max_step_tokens = 0;
  std::string kv_memory;
  std::string host_kv_memory;  // empty: api::DefaultHostKvMemoryBytes
  std::string kv_restore = "auto";
  // Off until measured on the GPU: drafting costs pipelining (a drafted
  // step is collected before the next is planned) and the CUDA backend
  // does not verify drafts yet (one logits row per sequence), so it would
  // only slow serving there.
  std::string speculative = "none";
  int speculative_max_draft = engine::SpeculativeOptions().max_draft;
  double drain_seconds = 30;
  std::string api_key;
  std::string api_keys_file;  // --api-keys: key -> tenant
  int max_json_depth = 64;
  std::vector<std::string> allow_origin, allow_host;
  std::string admin_key, models_dir;
  bool insecure_no_key = false;
  int http_threads = 0;
  int workers = 0;  // 0: 2 per core, 8 to 64
  int max_connections = api::HttpServerOptions().max_connections;
  int max_queue = 512;
  std::string store_dir = "data/store";
  std::string store_max_bytes;
  std::string history_memory = "512M";  // --store none: in-memory histories
  // A 128k-token conversation is at most ~2 MiB of text (tokens average 3
  // to 4 bytes; 16 at most, for runs of blanks or repeated characters), and
  // JSON escaping at most doubles it: 8M holds that with room for tool
  // definitions and message framing.
  std::string max_body = "8M";
  int read_timeout_s = 60;
  int write_timeout_s = 30;
  int sse_keepalive_s = 15;
  std::string tls_cert, tls_key;
};

// "268435456", "256M", "1G", "512K" -> bytes; 0 on bad input (shares such
// as "0.5" included: these flags take byte counts only).
uint64_t ParseBytes(const std::string& s) {
  Result<MemorySize> r = ParseMemorySize(s, "");
  return r.ok() ? r->bytes : 0;
}

// One line per cache group: what the pool holds, so that a user sees at
// start-up how much context fits without reading the docs.
void PrintKvPool(const api::ServedModel& m) {
  const engine::Engine& e = m.engine();
  const cache::ModelCacheSpec& spec = e.cache_spec();
  std::cout << "KV pool: " << FormatBytes(e.kv_memory_bytes()) << ", " << e.sequence_capacity()
            << " tokens at most for one request\n";
  for (size_t g = 0; g < spec.groups.size() && g < e.kv_blocks().size(); ++g) {
    const cache::CacheGroupSpec& group = spec.groups[g];
    const int64_t blocks = e.kv_blocks()[g];
    std::cout << "  group " << g << " (" << group.layers.size() << " layers, "
              << (group.kind == cache::AttentionKind::kFull
                      ? std::string("full attention")
                      : "sliding window " + std::to_string(group.window))
              << "): " << blocks << " blocks = " << blocks * e.block_size() << " tokens\n";
  }
}

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The thread that waits for signals (sigwait in RunServe).
pthread_t g_signal_waiter;

// Threads that libraries start before main (OpenBLAS's workers) do not
// block the signals RunServe waits for. One delivered there, while the
// waiting thread is busy (starting up, reloading the keys), would take its
// default action and end the process without draining. The handler gives it
// to the waiting thread instead, which has it blocked, so it stays pending
// until sigwait takes it. pthread_kill is async-signal-safe.
extern "C" void ForwardToSignalWaiter(int sig) { pthread_kill(g_signal_waiter, sig); }

int RunServe(const ServeArgs& a) {
  // Signals go to this thread only (sigwait below), never to workers.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);  // reloads --api-keys
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  g_signal_waiter = pthread_self();
  struct sigaction forward {};
  forward.sa_handler = ForwardToSignalWaiter;
  sigemptyset(&forward.sa_mask);
  forward.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &forward, nullptr);

  std::shared_ptr<const api::TenantKeys> tenants;
  if (!a.api_keys_file.empty()) {
    if (!a.api_key.empty()) {
      std::cerr << "error: --api-key and --api-keys exclude each other (give the key a tenant "
                   "in the file)\n";
      return 2;
    }
    auto loaded = api::TenantKeys::Load(a.api_keys_file);
    if (!loaded.ok()) {
      std::cerr << "error: " << loaded.status().message() << "\n";
      return 2;
    }
    tenants = std::move(loaded).value();
  }
  // Anyone who can reach a non-loopback address could use (and read) every
  // agent: that takes a key, or saying so.
  if (!api::IsLoopbackName(a.host) && a.api_key.empty() && !tenants && !a.insecure_no_key) {
    std::cerr << "error: --host " << a.host
              << " is reachable from other machines: set --api-key (or --insecure-no-key to "
                 "serve without one)\n";
    return 2;
  }
  api::ServedModelOptions mo;
  mo.model_dir = a.model.model_dir.empty() ? DefaultModelDir() : a.model.model_dir;
  mo.backend = a.model.backend;
  mo.max_batch = a.max_batch;
  mo.max_step_tokens = a.max_step_tokens;
  mo.max_waiting = a.max_queue;
  if (!a.kv_memory.empty()) {
    Result<MemorySize> kv = ParseMemorySize(a.kv_memory, "--kv-memory");
    if (!kv.ok() || kv->is_zero) {
      std::cerr << "error: "
                << (kv.ok() ? "--kv-memory must be more than 0" : kv.status().message()) << "\n";
      return 2;
    }
    mo.kv_memory_bytes = kv->bytes;
    mo.kv_memory_fraction = kv->fraction;
  }
  {
    const Result<uint64_t> mem = AvailableHostMemoryBytes();
    const uint64_t avail = mem.ok() ? *mem : 0;
    auto host_kv = a.host_kv_memory.empty() ? Result<uint64_t>(api::DefaultHostKvMemoryBytes(avail))
                                            : api::ParseHostKvMemory(a.host_kv_memory, avail);
    if (!host_kv.ok()) {
      std::cerr << "error: " << host_kv.status().message() << "\n";
      return 2;
    }
    mo.host_kv_memory_bytes = *host_kv;
  }
  // Restore or recompute needs the device's prefill cost, timed at start-up
  // (two prefill chunks: well under a second on a GPU). A CPU prefills far
  // slower than the store decodes, so there it always loads (no timing).
  mo.drain_seconds = a.drain_seconds;
  mo.split_restores = a.kv_restore == "auto";
  mo.calibrate_prefill = mo.split_restores && mo.backend.device != "cpu";
  mo.speculative.mode =
      a.speculative == "ngram" ? engine::SpeculativeMode::kNgram : engine::SpeculativeMode::kNone;
  mo.speculative.max_draft = a.speculative_max_draft;
  std::unique_ptr<store::AgentStore> agent_store;
  if (!a.store_dir.empty() && a.store_dir != "none") {
    store::StoreOptions sopt;
    // Resume decompresses an agent's blocks in parallel: a 32k-token agent of
    // a 1B model is 1 GiB of KV, so use every core for it.
    sopt.worker_threads = std::max(4, static_cast<int>(std::thread::hardware_concurrency()));
    if (!a.store_max_bytes.empty()) {
      sopt.max_bytes = ParseBytes(a.store_max_bytes);
      if (sopt.max_bytes == 0) {
        std::cerr << "error: bad --store-max-bytes '" << a.store_max_bytes << "'\n";
        return 2;
      }
    }
    std::error_code ec;
    std::filesystem::create_directories(a.store_dir, ec);
    auto opened = store::AgentStore::Open(a.store_dir, sopt);
    if (!opened.ok()) {
      std::cerr << "error: store " << a.store_dir << ": " << opened.status().ToString() << "\n";
      return 1;
    }
    agent_store = std::move(opened).value();
    mo.store = agent_store.get();
  }
  auto model = api::ServedModel::Load(mo);
  if (!model.ok()) {
    std::cerr << "error: " << model.status().ToString() << "\n";
    return 1;
  }
  PrintKvPool(**model);
  api::ModelHost host(mo, std::move(model).value());
  // Blocking work of requests (parsing, rendering and tokenizing bodies,
  // history fsyncs, deletes waiting for the store, agents' turns starting)
  // runs here, never on the HTTP io threads.
  // Much of the workers' time is spent waiting on history fsyncs, and the
  // history commits together only the appends waiting at once: with 4
  // workers, 64 agents finishing together made 2 appends per commit and
  // their last events waited 10-25 ms in line. So more threads than cores.
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int num_workers = a.workers > 0 ? a.workers : std::clamp(2 * hw, 8, 64);
  TaskPool workers(num_workers, "request workers");
  auto run_on_workers = [&workers](std::function<void()> f) { workers.Post(std::move(f)); };
  agent::AgentManagerOptions agent_options;
  agent_options.executor = run_on_workers;
  agent_options.max_memory_history_bytes = ParseBytes(a.history_memory);
  if (agent_options.max_memory_history_bytes == 0) {
    std::cerr << "error: bad --history-memory '" << a.history_memory << "'\n";
    return 2;
  }
  agent::AgentManager agents(agent_store.get(), agent_options);
  api::Metrics metrics;
  if (auto known = api::AgentBinding::RememberStoredAgents(*host.Current(), agents); !known.ok()) {
    std::cerr << "store: " << known.status().ToString() << "\n";
  }
  api::ApiServiceOptions service_options;
  service_options.api_key = a.api_key;
  service_options.max_json_depth = a.max_json_depth;
  service_options.guard.loopback = api::IsLoopbackName(a.host);
  service_options.guard.allowed_origins = a.allow_origin;
  service_options.guard.allowed_hosts = a.allow_host;
  service_options.admin_key = a.admin_key;
  service_options.tenants = tenants;
  // Swaps load from --models-dir; by default the folder the served model is
  // in (its siblings).
  service_options.models_dir =
      !a.models_dir.empty()
          ? a.models_dir
          : std::filesystem::weakly_canonical(mo.model_dir).parent_path().string();
  if (service_options.models_dir.empty()) service_options.models_dir = ".";
  api::ApiService service({&host, &agents, &metrics, &workers}, service_options);
  api::HttpServerOptions so;
  so.host = a.host;
  so.port = static_cast<uint16_t>(a.port);
  so.threads = a.http_threads;
  so.max_connections = a.max_connections;
  const uint64_t max_body = ParseBytes(a.max_body);
  if (max_body == 0) {
    std::cerr << "error: bad --max-body '" << a.max_body << "'\n";
    return 2;
  }
  so.body_limit = max_body;
  so.route_body_limit = [max_body](const std::string& method, const std::string& path) {
    return api::ApiService::BodyLimit(method, path, max_body);
  };
  so.read_timeout_s = a.read_timeout_s;
  so.write_timeout_s = a.write_timeout_s;
  so.sse_keepalive_ms = a.sse_keepalive_s * 1000;
  so.tls_cert_file = a.tls_cert;
  so.tls_key_file = a.tls_key;
  so.offload = [](const api::HttpRequest& r) { return api::ApiService::Offload(r); };
  so.offload_executor = run_on_workers;
  api::HttpServer server(so, [&service](const api::HttpRequest& r) { return service.Handle(r); });
  if (Status s = server.Start(); !s.ok()) {
    std::cerr << "error: " << s.ToString() << "\n";
    return 1;
  }
  std::cout << "listening on " << (a.tls_cert.empty() ? "http" : "https") << "://" << a.host << ":"
            << server.port() << std::endl;

  int sig = 0;
  while (sigwait(&signals, &sig) == 0 && sig == SIGHUP) {
    if (a.api_keys_file.empty()) continue;
    // A file that does not load keeps the table in force.
    auto reloaded = api::TenantKeys::Load(a.api_keys_file);
    if (!reloaded.ok()) {
      std::cerr << "SIGHUP: " << reloaded.status().message() << " (keeping the keys in force)\n";
      continue;
    }
    std::cerr << "SIGHUP: " << (*reloaded)->size() << " API keys loaded\n";
    service.SetTenants(std::move(reloaded).value());
  }
  std::cerr << "signal " << sig << ": draining\n";
  server.StopAccepting();
  // Drains the engine, flushes the KV tier and stops the engine; replies
  // already produced still reach their clients below.
  api::ModelHost::ShutdownTimes times;
  Status down = host.Shutdown(&times);
  auto t = std::chrono::steady_clock::now();
  const auto deadline = t + std::chrono::seconds(2);
  while (server.connections() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double replies_s = SecondsSince(t);
  t = std::chrono::steady_clock::now();
  // The workers' last tasks may still post replies to the io threads.
  workers.Stop();
  server.Stop();
  const double http_s = SecondsSince(t);
  if (!down.ok()) std::cerr << "store: " << down.ToString() << "\n";
  t = std::chrono::steady_clock::now();
  if (agent_store) {
    if (Status s = agent_store->Flush(); !s.ok()) std::cerr << "store: " << s.ToString() << "\n";
  }
  // Each phase's time, so a slow stop says where it waited.
  std::cerr << std::fixed << std::setprecision(2) << "stopped: drain " << times.drain_s
            << (times.drained ? " s" : " s (deadline: running requests cut off)") << ", KV flush "
            << times.flush_s << " s, engine stop " << times.stop_s << " s, last replies "
            << replies_s << " s, HTTP " << http_s << " s, store flush " << SecondsSince(t)
            << " s\n";
  return 0;
}

Registrar reg("serve", "Serve the HTTP API (OpenAI and Anthropic protocols)",
              [](CLI::App& app) -> Runner {
                auto a = std::make_shared<ServeArgs>();
                a->model.Add(app, /*model_required=*/false);
                app.get_option("--model")->envname("AGENTKV_MODEL")->default_str(DefaultModelDir());
                app.get_option("--device")->envname("AGENTKV_DEVICE");
                app.get_option("--threads")->envname("AGENTKV_THREADS");
                app.add_option("--host", a->host, "Address to listen on")
                    ->capture_default_str()
                    ->envname("AGENTKV_HOST");
                app.add_option("--port", a->port, "Port to listen on (0 = any free port)")
                    ->capture_default_str()
                    ->check(CLI::Range(0, 65535))
                    ->envname("AGENTKV_PORT");
                app.add_option("--max-batch", a->max_batch, "Most sequences running in one step")
                    ->capture_default_str()
                    ->check(CLI::PositiveNumber)
                    ->envname("AGENTKV_MAX_BATCH");
                app.add_option("--max-step-tokens", a->max_step_tokens,
                               "Tokens of one engine step, prompt chunks and decode together "
                               "(0 = the device's default: cpu 2048, cuda 8192)")
                    ->capture_default_str()
                    ->check(CLI::NonNegativeNumber)
                    ->envname("AGENTKV_MAX_STEP_TOKENS");
                app.add_option(
                       "--kv-memory", a->kv_memory,
                       "KV pool: bytes (K/M/G suffixes) or a share of the memory free after "
                       "loading, e.g. 0.8 (default: 0.9 of free GPU memory; 0.25 of "
                       "available RAM on the CPU)")
                    ->envname("AGENTKV_KV_MEMORY");
                app.add_option("--host-kv-memory", a->host_kv_memory,
                               "Host-memory KV tier between the KV pool and the store: bytes "
                               "(K/M/G), a fraction of available RAM (0.25), or 0 = off "
                               "(default a quarter of available RAM, at most 32G)")
                    ->envname("AGENTKV_HOST_KV_MEMORY");
                app.add_option("--drain-seconds", a->drain_seconds,
                               "On a model swap or shutdown, how long running requests may "
                               "finish before they are cut off (their KV is saved first; "
                               "-1 = wait for them)")
                    ->capture_default_str()
                    ->envname("AGENTKV_DRAIN_SECONDS");
                app.add_option("--kv-restore", a->kv_restore,
                               "Agents coming back from the store: auto = recompute a head of "
                               "the prompt while the rest loads when that is faster (timed at "
                               "start-up on a GPU); load = always load all that is stored")
                    ->capture_default_str()
                    ->check(CLI::IsMember({"auto", "load"}))
                    ->envname("AGENTKV_KV_RESTORE");
                app.add_option("--speculative", a->speculative,
                               "Speculative decoding: ngram = draft tokens looked up in each "
                               "request's own prompt and output, verified in one step (same "
                               "output; requests opt out with \"speculative\": false); none = off")
                    ->capture_default_str()
                    ->check(CLI::IsMember({"none", "ngram"}))
                    ->envname("AGENTKV_SPECULATIVE");
                app.add_option("--speculative-max-draft", a->speculative_max_draft,
                               "Longest draft of one request in one step (below the KV block "
                               "size)")
                    ->capture_default_str()
                    ->check(CLI::Range(1, 64))
                    ->envname("AGENTKV_SPECULATIVE_MAX_DRAFT");
                app.add_option("--api-key", a->api_key,
                               "Require this key (Authorization: Bearer or x-api-key)")
                    ->envname("AGENTKV_API_KEY");
                app.add_option("--api-keys", a->api_keys_file,
                               "File of `KEY TENANT [high]` lines: each key's requests see only "
                               "its tenant's agents, histories, content matches and cached KV "
                               "(salted block hashes); `high` allows X-Priority: high. Reloaded "
                               "on SIGHUP")
                    ->envname("AGENTKV_API_KEYS");
                app.add_option("--max-json-depth", a->max_json_depth,
                               "Deepest nesting of arrays and objects a request body may have "
                               "(deeper: 400)")
                    ->capture_default_str()
                    ->check(CLI::Range(1, 1024))
                    ->envname("AGENTKV_MAX_JSON_DEPTH");
                app.add_option("--admin-key", a->admin_key,
                               "Key for /admin/* (x-api-key or Bearer); without it admin "
                               "endpoints work only on loopback without --api-key")
                    ->envname("AGENTKV_ADMIN_KEY");
                app.add_option("--models-dir", a->models_dir,
                               "POST /admin/model loads only directories under this one "
                               "(default: the folder holding --model)")
                    ->envname("AGENTKV_MODELS_DIR");
                app.add_option("--allow-origin", a->allow_origin,
                               "Accept requests from web pages of this origin "
                               "(scheme://host[:port], repeatable; * for any); others get 403")
                    ->envname("AGENTKV_ALLOW_ORIGIN");
                app.add_option("--allow-host", a->allow_host,
                               "Accept this Host name besides the loopback ones when listening "
                               "on loopback (repeatable)")
                    ->envname("AGENTKV_ALLOW_HOST");
                app.add_flag("--insecure-no-key", a->insecure_no_key,
                             "Listen on a non-loopback address without --api-key")
                    ->envname("AGENTKV_INSECURE_NO_KEY");
                app.add_option("--http-threads", a->http_threads,
                               "HTTP I/O threads (0: one per core, 2 to 8)")
                    ->capture_default_str()
                    ->check(CLI::Range(0, 64))
                    ->envname("AGENTKV_HTTP_THREADS");
                app.add_option("--workers", a->workers,
                               "Threads for the blocking work of requests (parsing, rendering "
                               "and tokenizing bodies, history fsyncs, deletes), off the HTTP "
                               "I/O threads (0: two per core, 8 to 64)")
                    ->capture_default_str()
                    ->check(CLI::Range(0, 256))
                    ->envname("AGENTKV_WORKERS");
                app.add_option("--max-connections", a->max_connections,
                               "Open connections past which new ones get 503 (keep it above "
                               "the number of clients: one that reconnects briefly holds two)")
                    ->capture_default_str()
                    ->check(CLI::PositiveNumber)
                    ->envname("AGENTKV_MAX_CONNECTIONS");
                app.add_option("--max-queue", a->max_queue,
                               "Waiting requests past which new ones get 429 / 529 (0 = no limit)")
                    ->capture_default_str()
                    ->check(CLI::NonNegativeNumber)
                    ->envname("AGENTKV_MAX_QUEUE");
                app.add_option("--store", a->store_dir,
                               "Agent store directory (history and persisted KV); 'none' to "
                               "run without one")
                    ->capture_default_str()
                    ->envname("AGENTKV_STORE");
                app.add_option("--store-max-bytes", a->store_max_bytes,
                               "Keep the store under this size by evicting least-recently-used "
                               "KV, never history (K/M/G suffixes; default unlimited)")
                    ->envname("AGENTKV_STORE_MAX_BYTES");
                app.add_option("--history-memory", a->history_memory,
                               "With --store none: memory for agents' histories; past it the "
                               "least recently used agent's history is dropped (K/M/G)")
                    ->capture_default_str()
                    ->envname("AGENTKV_HISTORY_MEMORY");
                app.add_option("--max-body", a->max_body,
                               "Largest request body of the generation endpoints (K/M/G "
                               "suffixes); other endpoints take at most 1M")
                    ->capture_default_str()
                    ->envname("AGENTKV_MAX_BODY");
                app.add_option("--read-timeout", a->read_timeout_s,
                               "Seconds to receive a request's headers and body")
                    ->capture_default_str()
                    ->check(CLI::PositiveNumber)
                    ->envname("AGENTKV_READ_TIMEOUT");
                app.add_option("--write-timeout", a->write_timeout_s,
                               "Seconds a client may take to accept each write before its "
                               "connection and generation are dropped")
                    ->capture_default_str()
                    ->check(CLI::PositiveNumber)
                    ->envname("AGENTKV_WRITE_TIMEOUT");
                app.add_option("--sse-keepalive", a->sse_keepalive_s,
                               "Seconds of quiet before an SSE keep-alive comment (0 = none)")
                    ->capture_default_str()
                    ->check(CLI::NonNegativeNumber)
                    ->envname("AGENTKV_SSE_KEEPALIVE");
                app.add_option("--tls-cert", a->tls_cert,
                               "PEM certificate chain: serve HTTPS (with --tls-key)")
                    ->envname("AGENTKV_TLS_CERT");
                app.add_option("--tls-key", a->tls_key, "PEM private key of --tls-cert")
                    ->envname("AGENTKV_TLS_KEY");
                return [a] { return RunServe(*a); };
              });

}  // namespace
}  // namespace agentkv::cli
