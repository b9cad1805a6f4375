// agentkv bench server --model DIR --concurrency 1,8,16 --prompt 128 --output 64 [--json]
//
// Throughput through the HTTP server versus the engine alone. At each
// concurrency level c: (1) engine alone: the very engine `bench engine`
// measures at that level (engine_bench.h: the same options, requests and
// timing), on a backend of its own that is freed before the server loads
// the model; (2) the served model's engine (as `serve` configures it)
// driven directly, to tell its configuration apart from the HTTP layer;
// (3) HTTP: c client threads, each its own agent (session_id), POST
// /v1/completions with fresh random token prompts and stream the reply
// (SSE, usage in the last chunk) from an in-process `serve` stack (ApiService
// + agent layer + store + HttpServer on loopback). Greedy, EOS ignored, so
// each request produces exactly --output tokens. Reports output tokens per
// second of both and their ratio.
#include <unistd.h>

#include <limits>
#include <utility>
// (std::exchange must be declared before Asio's awaitable.hpp)
#include <algorithm>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <thread>

#include "agent/agent_manager.h"
#include "api/api_service.h"
#include "api/http_server.h"
#include "api/metrics.h"
#include "api/model_host.h"
#include "cli/command.h"
#include "cli/engine_bench.h"
#include "cli/model_options.h"
#include "store/agent_store.h"

namespace agentkv::cli {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using nlohmann::json;

struct BenchArgs {
  ModelOptions model;
  EngineBenchOptions engine;  // the baseline's engine; prompt and output of both
  std::string concurrency = "1,8,16";
  int max_batch = 64, http_threads = 0, repeat = 3;
  uint64_t kv_memory = 0;  // the served model's KV pool; 0: as serve
  std::string store = "";  // "" = a temporary store, "none" = no store
  bool store_kv = true;    // false: history only, no KV write-behind
  int store_workers = 0;   // 0: as serve (one per hardware thread, at least 4)
  int store_write_nice = 10;
  bool json = false;
  uint64_t seed = 1;
};

// Where an HTTP run's time went beyond the engine's own work (deltas over
// the run): turns waiting for their history to commit, and the engine
// thread handing finished turns' KV to the store.
struct Diagnostics {
  uint64_t history_appends = 0, history_transactions = 0;
  double history_wait_s = 0, engine_save_s = 0;
  Diagnostics operator-(const Diagnostics& o) const {
    return {history_appends - o.history_appends, history_transactions - o.history_transactions,
            history_wait_s - o.history_wait_s, engine_save_s - o.engine_save_s};
  }
};

Diagnostics Diagnose(store::AgentStore* st, api::ServedModel& m) {
  Diagnostics d;
  if (st != nullptr) {
    const auto h = st->history_stats();
    d.history_appends = h.requests;
    d.history_transactions = h.transactions;
    d.history_wait_s = h.wait_seconds;
  }
  d.engine_save_s = m.engine().Stats().save_seconds;
  return d;
}

struct Level {
  double seconds = 0, output_tok_s = 0, mean_latency_ms = 0;
  int64_t output_tokens = 0;
  std::optional<Diagnostics> diag;
};

json ToJson(const Level& l) {
  json j = {{"seconds", l.seconds},
            {"output_tokens", l.output_tokens},
            {"output_tok_s", l.output_tok_s},
            {"mean_latency_ms", l.mean_latency_ms}};
  if (l.diag) {
    const Diagnostics& d = *l.diag;
    j["history_appends"] = d.history_appends;
    j["history_transactions"] = d.history_transactions;
    j["history_mean_wait_ms"] =
        d.history_appends > 0 ? 1000 * d.history_wait_s / d.history_appends : 0.0;
    j["engine_save_s"] = d.engine_save_s;
  }
  return j;
}

std::vector<std::vector<int32_t>> Prompts(std::mt19937_64& rng, int n, int len, int32_t vocab) {
  std::vector<std::vector<int32_t>> out(n);
  for (auto& p : out) {
    for (int i = 0; i < len; ++i) p.push_back(static_cast<int32_t>(rng() % vocab));
  }
  return out;
}

// The served model's own engine, driven directly (no HTTP): tells the
// engine's configuration as served (KV memory, context, detokenization,
// store) apart from the HTTP layer's cost.
Result<Level> EngineAlone(api::ServedModel& m, const BenchArgs& a,
                          const std::vector<std::vector<int32_t>>& prompts) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<engine::RequestHandle> hs;
  for (const auto& p : prompts) {
    engine::SamplingParams sp;
    sp.temperature = 0;
    sp.ignore_eos = true;
    sp.max_tokens = a.engine.output;
    ASSIGN_OR_RETURN(engine::RequestHandle h, m.Submit(p, sp, engine::Priority::kNormal));
    hs.push_back(std::move(h));
  }
  Level l;
  double latency = 0;
  for (auto& h : hs) {
    while (true) {
      engine::RequestOutput ev = h.stream->Pop();
      if (ev.kind == engine::RequestOutput::Kind::kError) return ev.error;
      if (ev.kind == engine::RequestOutput::Kind::kFinished) {
        l.output_tokens += ev.completion_tokens;
        latency += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        break;
      }
    }
  }
  l.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  l.output_tok_s = l.output_tokens / l.seconds;
  l.mean_latency_ms = 1000 * latency / prompts.size();
  return l;
}

// One streamed /v1/completions request; the completion tokens from the
// usage chunk, or an error.
Result<int64_t> PostCompletion(uint16_t port, const std::string& agent,
                               const std::vector<int32_t>& prompt, int output) {
  net::io_context ioc;
  beast::tcp_stream stream(ioc);
  beast::error_code ec;
  stream.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port), ec);
  if (ec) return IoError("connect: " + ec.message());
  json body = {{"model", "bench"},
               {"prompt", prompt},
               {"max_tokens", output},
               {"temperature", 0},
               {"ignore_eos", true},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}},
               {"session_id", agent}};
  http::request<http::string_body> req(http::verb::post, "/v1/completions", 11);
  req.set(http::field::host, "127.0.0.1");
  req.set(http::field::content_type, "application/json");
  req.body() = body.dump();
  req.prepare_payload();
  http::write(stream, req, ec);
  if (ec) return IoError("write: " + ec.message());
  beast::flat_buffer buf;
  http::response_parser<http::string_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  http::read(stream, buf, parser, ec);
  if (ec) return IoError("read: " + ec.message());
  const auto& res = parser.get();
  if (res.result_int() != 200) return Internal("HTTP " + std::to_string(res.result_int()));
  // The usage chunk is the last "data: {...}" before [DONE].
  const std::string& text = res.body();
  const size_t at = text.rfind("\"usage\"");
  if (at == std::string::npos) return Internal("no usage in the stream");
  const size_t line = text.rfind("data: ", at);
  const size_t end = text.find("\n\n", at);
  json usage = json::parse(text.substr(line + 6, end - line - 6), nullptr, false);
  if (usage.is_discarded()) return Internal("bad usage chunk");
  return usage["usage"]["completion_tokens"].get<int64_t>();
}

Result<Level> ThroughHttp(uint16_t port, const BenchArgs& a,
                          const std::vector<std::vector<int32_t>>& prompts, int level) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  std::vector<Result<int64_t>> results(prompts.size(), Internal("not run"));
  std::vector<double> latency(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back([&, i] {
      const std::string agent = "bench-" + std::to_string(level) + "-" + std::to_string(i);
      results[i] = PostCompletion(port, agent, prompts[i], a.engine.output);
      latency[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
  }
  for (auto& t : threads) t.join();
  Level l;
  double total = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    if (!results[i].ok()) return results[i].status();
    l.output_tokens += *results[i];
    total += latency[i];
  }
  l.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  l.output_tok_s = l.output_tokens / l.seconds;
  l.mean_latency_ms = 1000 * total / prompts.size();
  return l;
}

int RunBench(const BenchArgs& a) {
  std::vector<int32_t> levels;
  std::string err;
  if (!ParseIds(a.concurrency, levels, err) ||
      std::any_of(levels.begin(), levels.end(), [](int32_t c) { return c <= 0; })) {
    std::cerr << "error: bad --concurrency '" << a.concurrency << "'\n";
    return 2;
  }
  if (a.engine.prompt <= 0 || a.engine.output <= 0) {
    std::cerr << "error: need --prompt > 0 and --output > 0\n";
    return 2;
  }
  const std::string model_dir = a.model.model_dir.empty() ? DefaultModelDir() : a.model.model_dir;
  // (1) The engine alone, as `bench engine` runs it, first: its backend is
  // freed before the served model takes the device's memory.
  std::mt19937_64 rng(a.seed);
  std::vector<std::vector<EngineRunResult>> engines(levels.size());
  {
    auto created = backend::CreateBackend(model_dir, a.model.backend);
    if (!created.ok()) {
      std::cerr << "error: " << created.status().ToString() << "\n";
      return 1;
    }
    std::unique_ptr<backend::Backend> backend = std::move(created).value();
    const int32_t vocab = backend->config().vocab_size;
    for (size_t l = 0; l < levels.size(); ++l) {
      const int c = levels[l];
      for (int r = 0; r < a.repeat; ++r) {
        auto e = RunEngineOnce(backend, a.engine, BenchRequests(rng, c, {}, a.engine, vocab), c,
                               true, "concurrency " + std::to_string(c) + ": engine alone");
        if (!e.ok()) {
          std::cerr << "error: engine alone: " << e.status().ToString() << "\n";
          return 1;
        }
        engines[l].push_back(*e);
      }
    }
  }
  // (2) The served stack. The store: history is fsynced on every turn, KV
  // written behind.
  std::string store_dir = a.store;
  bool temp_store = false;
  if (store_dir.empty()) {
    char tmpl[] = "/tmp/agentkv-bench-server-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      std::cerr << "error: cannot make a temporary store\n";
      return 1;
    }
    store_dir = tmpl;
    temp_store = true;
  }
  std::unique_ptr<store::AgentStore> st;
  if (store_dir != "none") {
    std::filesystem::create_directories(store_dir);
    store::StoreOptions so;  // as `serve` opens it
    so.worker_threads = a.store_workers > 0
                            ? a.store_workers
                            : std::max(4, static_cast<int>(std::thread::hardware_concurrency()));
    so.write_nice = a.store_write_nice;
    auto opened = store::AgentStore::Open(store_dir, so);
    if (!opened.ok()) {
      std::cerr << "error: store: " << opened.status().ToString() << "\n";
      return 1;
    }
    st = std::move(opened).value();
  }
  api::ServedModelOptions mo;
  mo.model_dir = model_dir;
  mo.backend = a.model.backend;
  mo.max_batch = a.max_batch;
  mo.max_step_tokens = a.engine.max_step_tokens;
  mo.kv_memory_bytes = a.kv_memory;
  mo.max_waiting = 0;
  mo.store = st.get();
  mo.persist_kv = a.store_kv;
  auto loaded = api::ServedModel::Load(mo);
  if (!loaded.ok()) {
    std::cerr << "error: " << loaded.status().ToString() << "\n";
    return 1;
  }
  api::ModelHost host(mo, std::move(loaded).value());
  agent::AgentManager agents(st.get());
  api::Metrics metrics;
  api::ApiService service({&host, &agents, &metrics}, {});
  api::HttpServerOptions so;
  so.port = 0;
  if (a.http_threads > 0) so.threads = a.http_threads;
  so.max_connections = 4096;
  api::HttpServer server(so, [&service](const api::HttpRequest& r) { return service.Handle(r); });
  if (Status s = server.Start(); !s.ok()) {
    std::cerr << "error: " << s.ToString() << "\n";
    return 1;
  }
  std::shared_ptr<api::ServedModel> m = host.Current();
  const int32_t vocab = m->engine().config().vocab_size;
  json out = {{"model", mo.model_dir},
              {"store", st ? (a.store_kv ? "on" : "history only") : "none"},
              {"prompt_tokens", a.engine.prompt},
              {"output_tokens", a.engine.output},
              {"http_threads", so.threads},
              {"repeat", a.repeat},
              {"levels", json::array()}};
  // Warm-up outside the timing.
  {
    auto warm = ThroughHttp(server.port(), a, Prompts(rng, 1, a.engine.prompt, vocab), 0);
    if (!warm.ok()) {
      std::cerr << "error: warm-up: " << warm.status().ToString() << "\n";
      return 1;
    }
  }
  const bool tty = isatty(STDERR_FILENO);
  int rc = 0;
  for (size_t l = 0; l < levels.size(); ++l) {
    const int c = levels[l];
    std::vector<Level> served, https;
    Status failed;
    for (int r = 0; r < a.repeat; ++r) {
      // Alternating, the median of each: a shared machine's load drifts.
      if (tty) std::cerr << "\rconcurrency " << c << ": served engine, run " << r + 1 << std::flush;
      auto e = EngineAlone(*m, a, Prompts(rng, c, a.engine.prompt, vocab));
      if (!e.ok()) {
        failed = e.status();
        break;
      }
      served.push_back(*e);
      if (tty) std::cerr << "\rconcurrency " << c << ": through HTTP, run " << r + 1 << std::flush;
      const Diagnostics d0 = Diagnose(st.get(), *m);
      auto h = ThroughHttp(server.port(), a, Prompts(rng, c, a.engine.prompt, vocab), c * 100 + r);
      if (!h.ok()) {
        failed = h.status();
        break;
      }
      h->diag = Diagnose(st.get(), *m) - d0;
      https.push_back(*h);
    }
    if (tty) std::cerr << "\r\033[K";
    if (!failed.ok()) {
      std::cerr << "error: " << failed.ToString() << "\n";
      rc = 1;
      break;
    }
    // The median run of each.
    std::vector<EngineRunResult> es = engines[l];
    std::sort(es.begin(), es.end(), [](const EngineRunResult& x, const EngineRunResult& y) {
      return x.output_tok_s < y.output_tok_s;
    });
    auto by_speed = [](const Level& x, const Level& y) { return x.output_tok_s < y.output_tok_s; };
    std::sort(served.begin(), served.end(), by_speed);
    std::sort(https.begin(), https.end(), by_speed);
    const EngineRunResult& engine = es[es.size() / 2];
    const Level& own = served[served.size() / 2];
    const Level& http = https[https.size() / 2];
    const double ratio = http.output_tok_s / engine.output_tok_s;
    out["levels"].push_back({{"concurrency", c},
                             {"engine", ToJson(engine)},
                             {"served_engine", ToJson(own)},
                             {"http", ToJson(http)},
                             {"ratio", ratio},
                             {"served_engine_ratio", own.output_tok_s / engine.output_tok_s},
                             {"http_over_served_engine", http.output_tok_s / own.output_tok_s}});
    if (!a.json) {
      std::cout << "concurrency " << c << ": engine " << engine.output_tok_s
                << " output tok/s, HTTP " << http.output_tok_s << " output tok/s, ratio " << ratio
                << " (the served model's engine alone: " << own.output_tok_s << " output tok/s)\n";
    }
  }
  server.Stop();
  (void)host.Shutdown();
  if (a.json && rc == 0) std::cout << out.dump() << "\n";
  if (temp_store) {
    st.reset();
    std::filesystem::remove_all(store_dir);
  }
  return rc;
}

Registrar reg(
    "bench server",
    "Throughput of concurrent agents through the HTTP server versus the engine alone",
    [](CLI::App& app) -> Runner {
      auto a = std::make_shared<BenchArgs>();
      a->model.Add(app, /*model_required=*/false);
      app.add_option("--concurrency", a->concurrency, "Comma-separated levels (agents)")
          ->capture_default_str();
      a->engine.Add(app);
      app.add_option("--max-batch", a->max_batch, "Most sequences in one step of the server")
          ->capture_default_str();
      app.add_option("--http-threads", a->http_threads, "HTTP I/O threads (0: as serve)")
          ->capture_default_str();
      app.add_option("--kv-memory", a->kv_memory,
                     "KV pool of the served model, e.g. 40G (0: serve's default)")
          ->transform(CLI::AsSizeValue(false))
          ->capture_default_str();
      app.add_option("--store", a->store,
                     "Agent store directory (default: a temporary one; 'none': "
                     "no store)");
      app.add_option("--store-kv", a->store_kv,
                     "Persist KV behind each turn (false: the store keeps history only)")
          ->capture_default_str();
      app.add_option("--store-workers", a->store_workers,
                     "Store compression/decompression threads (0: as serve)")
          ->capture_default_str();
      app.add_option("--store-write-nice", a->store_write_nice,
                     "Nice of the KV write-behind's compression threads")
          ->capture_default_str();
      app.add_option("--repeat", a->repeat,
                     "Alternating runs per level; the median of each is reported")
          ->capture_default_str()
          ->check(CLI::PositiveNumber);
      app.add_option("--seed", a->seed, "Seed of the random prompts")->capture_default_str();
      app.add_flag("--json", a->json, "Print one JSON object");
      return [a] { return RunBench(*a); };
    });

}  // namespace
}  // namespace agentkv::cli
