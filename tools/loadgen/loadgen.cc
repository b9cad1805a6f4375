// agentkv-loadgen: drives an agentkv (or any OpenAI / Anthropic compatible)
// server from a separate process over real sockets, the way agents use it:
// N concurrent agents, each with its own connection and session id, send
// K streamed turns; turn k+1 sends back the reply of turn k plus a new user
// message. Reports output tok/s, TTFT, inter-token latency and the cached
// share of each turn's prompt (see tools/loadgen/README.md).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "http_client.h"
#include "report.h"
#include "sse_parser.h"
#include "workload.h"

namespace agentkv::loadgen {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

struct Args {
  std::string url = "http://127.0.0.1:8080";
  std::string api = "openai";
  std::string model = "default";
  int agents = 64, turns = 3;
  int prompt_tokens = 512, system_tokens = 32, followup_tokens = 64, output_tokens = 128;
  std::optional<float> temperature;
  bool allow_eos = false, no_calibrate = false, no_barrier = false, json = false;
  double timeout_s = 600;
  uint64_t seed = 0;  // 0: a new one each run
  std::string session_prefix;
  std::optional<double> engine_tok_s;
  std::string engine_json;
};

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// One streamed request.
TurnResult RunRequest(HttpClient& client, Api api, const HttpCall& call) {
  TurnResult r;
  SseParser parser;
  StreamReader reader(api);
  std::vector<SseEvent> events;
  std::string raw;  // the start of the body, for error messages
  const auto t0 = Clock::now();
  auto resp = client.Post(call, [&](std::string_view data) {
    const double t = Seconds(Clock::now() - t0);
    if (raw.size() < 512) raw.append(data.substr(0, 512 - raw.size()));
    parser.Feed(data, &events);
    for (const SseEvent& e : events) reader.OnEvent(e, t, &r);
    events.clear();
  });
  r.end_s = Seconds(Clock::now() - t0);
  r.http_status = resp.status;
  if (!resp.error.empty()) {
    r.error = resp.error;
  } else if (resp.status != 200) {
    r.error = "HTTP " + std::to_string(resp.status) + ": " + raw.substr(0, 300);
  } else {
    reader.Finish(&r);
  }
  return r;
}

// Prompt tokens as a function of the first user message's words, measured
// with two one-token requests: tokens = base + slope * words.
struct Calibration {
  double base = 0, slope = 1;
  bool measured = false;
};

bool Calibrate(const Args& a, const Url& url, WorkloadOptions w, const std::string& system,
               Calibration* out, std::string* error) {
  w.output_tokens = 1;
  HttpClient client(url, a.timeout_s);
  const int words[2] = {64, 320};
  int64_t tokens[2];
  for (int i = 0; i < 2; ++i) {
    const std::string session = a.session_prefix + "-calibrate-" + std::to_string(i);
    const std::vector<Message> history = {{"user", Words(a.seed * 7919 + 1000003 + i, words[i])}};
    const TurnResult r = RunRequest(client, w.api, BuildTurn(w, session, system, history));
    if (!r.ok()) {
      *error = "calibration request: " + r.error;
      return false;
    }
    tokens[i] = r.prompt_tokens;
  }
  out->slope = static_cast<double>(tokens[1] - tokens[0]) / (words[1] - words[0]);
  if (out->slope <= 0) {
    *error = "calibration: the prompt did not grow with the message";
    return false;
  }
  out->base = tokens[0] - out->slope * words[0];
  out->measured = true;
  return true;
}

int WordsFor(const Calibration& c, double tokens) {
  return std::max(1, static_cast<int>(std::lround((tokens - c.base) / c.slope)));
}

std::string DefaultSessionPrefix() {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "lg%lx-%d",
                static_cast<unsigned long>(std::chrono::system_clock::now().time_since_epoch() /
                                           std::chrono::seconds(1)),
                static_cast<int>(getpid()));
  return buf;
}

int Run(Args a) {
  const auto url = ParseUrl(a.url);
  if (!url) {
    std::cerr << "error: --url must look like http://HOST:PORT\n";
    return 2;
  }
  const auto api = ParseApi(a.api);
  if (!api) {
    std::cerr << "error: --api must be openai, anthropic or agents\n";
    return 2;
  }
  if (a.engine_tok_s && *a.engine_tok_s <= 0) {
    std::cerr << "error: --engine-tok-s must be positive\n";
    return 2;
  }
  if (!a.engine_json.empty()) {
    std::ifstream in(a.engine_json);
    std::stringstream text;
    text << in.rdbuf();
    std::string error;
    a.engine_tok_s = EngineTokPerSecond(text.str(), a.agents, &error);
    if (!in || !a.engine_tok_s) {
      std::cerr << "error: --engine-json " << a.engine_json << ": "
                << (in ? error : "cannot read it") << "\n";
      return 2;
    }
  }
  if (a.session_prefix.empty()) a.session_prefix = DefaultSessionPrefix();
  // A server's prefix cache is content-addressed: text repeated from an
  // earlier run would be served from cache, so each run writes new text.
  if (a.seed == 0) {
    a.seed = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) ^
             (static_cast<uint64_t>(getpid()) << 32);
  }
  WorkloadOptions w;
  w.api = *api;
  w.model = a.model;
  w.output_tokens = a.output_tokens;
  w.temperature = a.temperature;
  w.ignore_eos = !a.allow_eos;
  const std::string system =
      a.system_tokens > 0 ? "You are a helpful agent. " + Words(a.seed, a.system_tokens) : "";

  Calibration cal;
  std::string error;
  if (!a.no_calibrate && !Calibrate(a, *url, w, system, &cal, &error)) {
    std::cerr << "error: " << error << "\n";
    return 1;
  }
  const int user_words = cal.measured ? WordsFor(cal, a.prompt_tokens)
                                      : std::max(1, a.prompt_tokens - a.system_tokens);
  const int followup_words =
      std::max(1, static_cast<int>(std::lround(a.followup_tokens / cal.slope)));
  const bool tty = isatty(STDERR_FILENO);
  if (!a.json || tty) {
    std::cerr << a.agents << " agents x " << a.turns << " turns, " << ApiName(w.api) << " API at "
              << a.url << ": first prompt ~" << a.prompt_tokens << " tokens (system "
              << a.system_tokens << " + user " << user_words << " words), follow-ups "
              << followup_words << " words, " << a.output_tokens << " output tokens\n";
  }

  // results[turn][agent]; start[turn][agent] / end: seconds since `epoch`.
  std::vector<std::vector<TurnResult>> results(a.turns, std::vector<TurnResult>(a.agents));
  std::vector<std::vector<double>> starts(a.turns, std::vector<double>(a.agents)),
      ends(a.turns, std::vector<double>(a.agents));
  std::atomic<int> done{0};
  const auto epoch = Clock::now();
  std::barrier sync(a.agents);
  std::vector<std::thread> threads;
  for (int agent = 0; agent < a.agents; ++agent) {
    threads.emplace_back([&, agent] {
      HttpClient client(*url, a.timeout_s);
      const std::string session = a.session_prefix + "-" + std::to_string(agent);
      std::vector<Message> history;
      for (int t = 0; t < a.turns; ++t) {
        if (!a.no_barrier) sync.arrive_and_wait();
        const uint64_t seed = (a.seed * 1000003 + static_cast<uint64_t>(agent)) * 131 + t;
        history.push_back({"user", Words(seed, t == 0 ? user_words : followup_words)});
        starts[t][agent] = Seconds(Clock::now() - epoch);
        TurnResult r = RunRequest(client, w.api, BuildTurn(w, session, system, history));
        ends[t][agent] = Seconds(Clock::now() - epoch);
        r.sent_at_s = starts[t][agent];
        history.push_back({"assistant", r.text});
        results[t][agent] = std::move(r);
        const int n = ++done;
        if (tty && !a.json) {
          std::fprintf(stderr, "\r%d/%d requests", n, a.agents * a.turns);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  if (tty && !a.json) std::fprintf(stderr, "\r\033[K");

  std::vector<TurnSummary> turns;
  double first = 1e300, last = 0;
  for (int t = 0; t < a.turns; ++t) {
    double lo = 1e300, hi = 0;
    for (int agent = 0; agent < a.agents; ++agent) {
      lo = std::min(lo, starts[t][agent]);
      hi = std::max(hi, ends[t][agent]);
    }
    first = std::min(first, lo);
    last = std::max(last, hi);
    turns.push_back(SummarizeTurn(t + 1, results[t], t > 0 ? &results[t - 1] : nullptr, hi - lo,
                                  a.output_tokens));
  }
  const TurnSummary total = SummarizeAll(results, last - first, a.output_tokens);
  bool failed = total.ok < total.requests;

  if (a.json) {
    json out = {
        {"url", a.url},
        {"api", ApiName(w.api)},
        {"agents", a.agents},
        {"turns", a.turns},
        {"prompt_tokens", a.prompt_tokens},
        {"system_words", a.system_tokens},
        {"user_words", user_words},
        {"followup_words", followup_words},
        {"output_tokens", a.output_tokens},
        {"temperature", a.temperature.value_or(0.0f)},
        {"barrier", !a.no_barrier},
        {"calibration", {{"measured", cal.measured}, {"base", cal.base}, {"slope", cal.slope}}},
        {"per_turn", json::array()},
        {"total", ToJson(total)}};
    for (const TurnSummary& s : turns) out["per_turn"].push_back(ToJson(s));
    if (a.engine_tok_s) {
      out["engine_tok_s"] = *a.engine_tok_s;
      out["ratio_turn1"] = turns.front().output_tok_s / *a.engine_tok_s;
      out["ratio_total"] = total.output_tok_s / *a.engine_tok_s;
    }
    std::cout << out.dump(2) << "\n";
  } else {
    std::cout << FormatTable(turns, total, a.engine_tok_s);
  }
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace agentkv::loadgen

int main(int argc, char** argv) {
  agentkv::loadgen::Args a;
  CLI::App app{
      "agentkv-loadgen: concurrent streaming agents against an HTTP server, over real sockets"};
  app.add_option("--url", a.url, "Server address, http://HOST:PORT")->capture_default_str();
  app.add_option("--api", a.api,
                 "openai (/v1/chat/completions), anthropic (/v1/messages) or "
                 "agents (/v1/agents/{id}/generate)")
      ->capture_default_str();
  app.add_option("--model", a.model, "The model name sent in requests")->capture_default_str();
  app.add_option("--agents", a.agents, "Concurrent agents (one connection each)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--turns", a.turns, "Turns per agent")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--prompt-tokens", a.prompt_tokens,
                 "Prompt tokens of the first turn (system + user message + template), sized by "
                 "calibration")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--system-tokens", a.system_tokens,
                 "Words of the system prompt (the same for every agent; 0: none)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--followup-tokens", a.followup_tokens,
                 "Tokens of the new user message of each later turn")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--output-tokens", a.output_tokens,
                 "max_tokens of every request (with ignore_eos, every reply's length)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--temperature", a.temperature, "Sampling temperature (default 0: greedy)");
  app.add_flag("--allow-eos", a.allow_eos,
               "Do not send ignore_eos: replies may end before --output-tokens");
  app.add_flag("--no-calibrate", a.no_calibrate,
               "Take one word for one token instead of measuring the prompt's tokens per word "
               "with two requests first");
  app.add_flag("--no-barrier", a.no_barrier,
               "Agents start their next turn as soon as theirs ends (default: each turn starts "
               "together, like `bench engine`'s requests)");
  app.add_option("--timeout", a.timeout_s, "Seconds any one read or write may wait")
      ->capture_default_str();
  app.add_option("--seed", a.seed,
                 "Seed of the prompt text (0: new text each run, so an earlier run's prompts are "
                 "not in the server's cache)")
      ->capture_default_str();
  app.add_option("--session-prefix", a.session_prefix,
                 "Session ids are PREFIX-<agent> (default: unique to this run)");
  app.add_option("--engine-tok-s", a.engine_tok_s,
                 "Engine-only output tok/s (`agentkv bench engine`) to compare against");
  app.add_option("--engine-json", a.engine_json,
                 "A file holding `agentkv bench engine --json` output to compare against");
  app.add_flag("--json", a.json, "Print one JSON object");
  CLI11_PARSE(app, argc, argv);
  return agentkv::loadgen::Run(std::move(a));
}
