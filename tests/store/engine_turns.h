// Helpers for store tests that run engine turns: collecting a request's
// output, greedy agent requests and deterministic prompts.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace agentkv::store::testing {

struct Done {
  std::vector<int32_t> tokens;
  engine::RequestOutput finished;
};

// Every token of a request until its last event.
inline Done Collect(const engine::RequestHandle& h) {
  Done d;
  while (true) {
    engine::RequestOutput ev = h.stream->Pop();
    if (ev.kind == engine::RequestOutput::Kind::kDelta) {
      d.tokens.insert(d.tokens.end(), ev.tokens.begin(), ev.tokens.end());
      continue;
    }
    d.finished = std::move(ev);
    return d;
  }
}

// Exactly `max_tokens` greedy tokens, for `agent` (empty: no agent).
inline engine::EngineRequest Greedy(std::vector<int32_t> prompt, int max_tokens,
                                    std::string agent = "") {
  engine::EngineRequest r;
  r.prompt = std::move(prompt);
  r.params.temperature = 0;
  r.params.ignore_eos = true;
  r.params.max_tokens = max_tokens;
  r.agent_key = std::move(agent);
  return r;
}

// n tokens below 97; `salt` shifts them.
inline std::vector<int32_t> Prompt(int n, int salt = 0) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back((3 + salt + 7 * i) % 97);
  return v;
}

}  // namespace agentkv::store::testing
