#include "workload.h"

#include <nlohmann/json.hpp>

namespace agentkv::loadgen {
namespace {

using nlohmann::json;

// Common English words that byte-level BPE vocabularies (Llama 3, Qwen)
// keep as one token each when preceded by a space.
constexpr const char* kWords[] = {
    "the",     "of",     "and",    "to",     "in",     "is",    "that",    "for",    "it",
    "as",      "was",    "with",   "be",     "by",     "on",    "not",     "he",     "this",
    "are",     "or",     "his",    "from",   "at",     "which", "but",     "have",   "an",
    "had",     "they",   "you",    "were",   "their",  "one",   "all",     "we",     "can",
    "her",     "has",    "there",  "been",   "if",     "more",  "when",    "will",   "would",
    "who",     "so",     "no",     "she",    "other",  "its",   "may",     "these",  "what",
    "them",    "than",   "some",   "him",    "time",   "into",  "only",    "do",     "could",
    "new",     "about",  "two",    "first",  "then",   "also",  "after",   "any",    "made",
    "like",    "should", "our",    "over",   "such",   "where", "most",    "way",    "must",
    "years",   "work",   "before", "each",   "people", "very",  "through", "well",   "long",
    "because", "many",   "world",  "water",  "state",  "day",   "back",    "good",   "great",
    "house",   "small",  "large",  "number", "city",   "place", "system",  "still",  "part",
    "under",   "again",  "never",  "same",   "last",   "point", "found",   "right",  "name",
    "high",    "line",   "group",  "life",   "school", "light", "power",   "hand",   "river",
    "three",   "story",  "order",  "field",  "music",  "table", "market",  "change", "family"};
constexpr size_t kNumWords = sizeof(kWords) / sizeof(kWords[0]);

// splitmix64: a small, fixed generator (the text must not depend on the
// standard library's distributions).
uint64_t Next(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

int64_t IntOr(const json& j, const char* key, int64_t fallback) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number_integer()) return fallback;
  return j[key].get<int64_t>();
}

std::string ErrorText(const json& j) {
  if (j.contains("error")) {
    const json& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string()) {
      return e["message"].get<std::string>();
    }
    return e.dump();
  }
  return j.dump();
}

}  // namespace

std::optional<Api> ParseApi(const std::string& name) {
  if (name == "openai") return Api::kOpenAi;
  if (name == "anthropic") return Api::kAnthropic;
  if (name == "agents") return Api::kAgents;
  return std::nullopt;
}

const char* ApiName(Api api) {
  switch (api) {
    case Api::kOpenAi:
      return "openai";
    case Api::kAnthropic:
      return "anthropic";
    case Api::kAgents:
      return "agents";
  }
  return "?";
}

std::string Words(uint64_t seed, int words) {
  std::string out;
  uint64_t s = seed;
  for (int i = 0; i < words; ++i) {
    if (i > 0) out += ' ';
    out += kWords[Next(s) % kNumWords];
  }
  return out;
}

HttpCall BuildTurn(const WorkloadOptions& o, const std::string& session_id,
                   const std::string& system, const std::vector<Message>& history) {
  HttpCall call;
  call.headers.push_back({"content-type", "application/json"});
  call.headers.push_back({"x-session-id", session_id});
  json body = json::object();
  const float temperature = o.temperature.value_or(0.0f);
  switch (o.api) {
    case Api::kOpenAi: {
      call.path = "/v1/chat/completions";
      json messages = json::array();
      if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
      for (const Message& m : history)
        messages.push_back({{"role", m.role}, {"content", m.content}});
      body = {{"model", o.model},
              {"messages", std::move(messages)},
              {"max_tokens", o.output_tokens},
              {"temperature", temperature},
              {"stream", true},
              {"stream_options", {{"include_usage", true}}},
              {"session_id", session_id}};
      break;
    }
    case Api::kAnthropic: {
      call.path = "/v1/messages";
      call.headers.push_back({"anthropic-version", "2023-06-01"});
      json messages = json::array();
      for (const Message& m : history)
        messages.push_back({{"role", m.role}, {"content", m.content}});
      body = {{"model", o.model},
              {"messages", std::move(messages)},
              {"max_tokens", o.output_tokens},
              {"temperature", temperature},
              {"stream", true},
              {"metadata", {{"user_id", session_id}}}};
      if (!system.empty()) body["system"] = system;
      break;
    }
    case Api::kAgents: {
      call.path = "/v1/agents/" + session_id + "/generate";
      body = {{"message", history.empty() ? std::string() : history.back().content},
              {"max_tokens", o.output_tokens},
              {"temperature", temperature},
              {"stream", true}};
      if (!system.empty()) body["system"] = system;
      break;
    }
  }
  if (o.ignore_eos) body["ignore_eos"] = true;
  call.body = body.dump();
  return call;
}

void StreamReader::Text(const std::string& text, double t, TurnResult* r) {
  if (text.empty()) return;
  r->text += text;
  if (r->ttft_s < 0) r->ttft_s = t;
  if (last_text_ >= 0) r->gaps_s.push_back(t - last_text_);
  last_text_ = t;
  r->last_text_s = t;
}

void StreamReader::OnEvent(const SseEvent& ev, double t, TurnResult* r) {
  if (ev.data.empty()) return;
  if (api_ == Api::kOpenAi && ev.data == "[DONE]") {
    done_ = true;
    return;
  }
  const json j = json::parse(ev.data, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    if (r->error.empty()) r->error = "unparsable event: " + ev.data.substr(0, 200);
    return;
  }
  if (j.contains("error") || ev.event == "error") {
    if (r->error.empty()) r->error = "stream error: " + ErrorText(j);
    return;
  }
  switch (api_) {
    case Api::kOpenAi: {
      if (j.contains("choices") && j["choices"].is_array()) {
        for (const json& c : j["choices"]) {
          if (!c.is_object() || !c.contains("delta")) continue;
          const json& d = c["delta"];
          if (d.is_object() && d.contains("content") && d["content"].is_string()) {
            Text(d["content"].get<std::string>(), t, r);
          }
        }
      }
      if (j.contains("usage") && j["usage"].is_object()) {
        const json& u = j["usage"];
        r->prompt_tokens = IntOr(u, "prompt_tokens", -1);
        r->completion_tokens = IntOr(u, "completion_tokens", -1);
        r->cached_tokens = u.contains("prompt_tokens_details")
                               ? IntOr(u["prompt_tokens_details"], "cached_tokens", 0)
                               : 0;
      }
      break;
    }
    case Api::kAnthropic: {
      const std::string type = j.value("type", "");
      if (type == "content_block_delta" && j.contains("delta") && j["delta"].is_object()) {
        const json& d = j["delta"];
        if (d.value("type", "") == "text_delta" && d.contains("text") && d["text"].is_string()) {
          Text(d["text"].get<std::string>(), t, r);
        }
      } else if (type == "message_delta" && j.contains("usage")) {
        const json& u = j["usage"];
        const int64_t input = IntOr(u, "input_tokens", -1);
        const int64_t read = IntOr(u, "cache_read_input_tokens", 0);
        r->cached_tokens = read;
        r->prompt_tokens = input < 0 ? -1 : input + read;
        r->completion_tokens = IntOr(u, "output_tokens", -1);
      } else if (type == "message_stop") {
        done_ = true;
      }
      break;
    }
    case Api::kAgents: {
      if (j.contains("usage") && j["usage"].is_object()) {
        const json& u = j["usage"];
        r->prompt_tokens = IntOr(u, "prompt_tokens", -1);
        r->completion_tokens = IntOr(u, "completion_tokens", -1);
        r->cached_tokens = IntOr(u, "cached_tokens", 0);
        done_ = true;
      } else if (j.contains("text") && j["text"].is_string()) {
        Text(j["text"].get<std::string>(), t, r);
      }
      break;
    }
  }
}

void StreamReader::Finish(TurnResult* r) const {
  if (!r->error.empty()) return;
  if (!done_) {
    r->error = "the stream ended before its last event";
  } else if (r->prompt_tokens < 0 || r->completion_tokens < 0) {
    r->error = "the stream carried no usage";
  }
}

}  // namespace agentkv::loadgen
