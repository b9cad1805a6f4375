#include "api/openai_api.h"

#include <algorithm>
#include <atomic>
#include <ctime>
#include <nlohmann/json.hpp>

#include "api/generation_job.h"
#include "api/json_fields.h"
#include "api/json_template.h"
#include "api/openai_logprobs.h"
#include "api/response_format.h"
#include "engine/finish_reason.h"

namespace agentkv::api {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }
std::string Sse(const json& j) { return "data: " + Dump(j) + "\n\n"; }

std::string NewId(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  const uint64_t n = counter.fetch_add(1) + static_cast<uint64_t>(std::time(nullptr)) * 1000003ull;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(n));
  return std::string(prefix) + buf;
}

json Usage(const engine::RequestOutput& f) {
  return {{"prompt_tokens", f.prompt_tokens},
          {"completion_tokens", f.completion_tokens},
          {"total_tokens", f.prompt_tokens + f.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", f.cached_tokens}}}};
}

json ErrorBody(const std::string& message, const std::string& param, const std::string& code) {
  return {{"error",
           {{"message", message},
            {"type", "invalid_request_error"},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

// Chat and completions: collects or streams text, reasoning, tool calls
// and logprobs, for one choice or several (GenerationJob's extra choices).
class ChatJob : public GenerationJob {
 public:
  struct Options {
    std::string model;
    bool include_usage = false;
    bool chat = true;
    int n = 1;
    bool logprobs = false;
    // Decodes the logprobs' tokens; kept alive by `keep_alive`.
    const text::Tokenizer* tokenizer = nullptr;
    std::shared_ptr<const void> keep_alive;
    std::shared_ptr<ChoiceSource> source;  // with n > 1
  };

  ChatJob(ApiContext ctx, std::shared_ptr<agent::AgentTurn> turn,
          text::output::OutputParserOptions parser, bool stream, ordered_json new_messages,
          Options o)
      : GenerationJob(ctx, std::move(turn), std::move(parser), stream, std::move(new_messages),
                      o.chat ? "/v1/chat/completions" : "/v1/completions"),
        o_(std::move(o)),
        id_(NewId(o_.chat ? "chatcmpl-" : "cmpl-")),
        created_(std::time(nullptr)) {
    for (int i = 0; i < o_.n; ++i) choices_.emplace_back(o_.tokenizer, o_.chat);
    if (o_.n > 1) SetChoices(o_.n, o_.source);
  }

 protected:
  // One chunk of choice `index`; `logprobs` is left out of chat chunks of a
  // request without logprobs (completions chunks always carry the key).
  json Chunk(int index, json delta_or_text, json finish, json logprobs = nullptr) const {
    json choice = {{"index", index}};
    if (o_.chat) {
      choice["delta"] = std::move(delta_or_text);
      if (o_.logprobs) choice["logprobs"] = std::move(logprobs);
    } else {
      choice["text"] = std::move(delta_or_text);
      choice["logprobs"] = std::move(logprobs);
    }
    choice["finish_reason"] = std::move(finish);
    return {{"id", id_},
            {"object", o_.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created_},
            {"model", o_.model},
            {"choices", json::array({std::move(choice)})}};
  }

  void OnBegin(std::string* out) override {
    if (!stream_ || !o_.chat) return;
    for (int i = 0; i < o_.n; ++i)
      *out += Sse(Chunk(i, {{"role", "assistant"}, {"content", ""}}, nullptr));
  }

  void OnEvents(const std::vector<text::output::OutputEvent>& events, std::string* out) override {
    Handle(0, events, out);
  }

  void OnEngineEvent(int index, const std::vector<text::output::OutputEvent>& events,
                     const engine::RequestOutput& ev, std::string* out) override {
    Choice& c = choices_[static_cast<size_t>(index)];
    if (o_.logprobs && !ev.logprobs.empty()) {
      json entries = c.lp.Entries(ev.tokens, ev.logprobs);
      if (stream_) {
        c.pending = std::move(entries);
      } else {
        c.lp.Append(entries, &c.lp_all);
      }
    }
    Handle(index, events, out);
    // Logprobs of tokens whose text the parser held back (or that made
    // none) go out in a chunk of their own.
    if (!c.pending.is_null()) {
      *out += Sse(Chunk(index, o_.chat ? json::object() : json(""), nullptr, c.lp.Wrap(c.pending)));
      c.pending = nullptr;
    }
  }

  void OnChoiceFinished(int index, const engine::RequestOutput& f, std::string* out) override {
    Choice& c = choices_[static_cast<size_t>(index)];
    c.finish = f.finish;
    if (stream_) *out += Sse(Chunk(index, o_.chat ? json::object() : json(""), FinishName(c)));
  }

  void OnFinish(const engine::RequestOutput& f, std::string* out) override {
    choices_[0].finish = f.finish;
    json usage = Usage(f);
    const int64_t completion = f.completion_tokens + extra_completion_tokens();
    usage["completion_tokens"] = completion;
    usage["total_tokens"] = f.prompt_tokens + completion;
    if (stream_) {
      *out += Sse(Chunk(0, o_.chat ? json::object() : json(""), FinishName(choices_[0])));
      if (o_.include_usage) {
        json u = Chunk(0, json::object(), nullptr);
        u["choices"] = json::array();
        u["usage"] = std::move(usage);
        *out += Sse(u);
      }
      *out += "data: [DONE]\n\n";
      return;
    }
    json list = json::array();
    for (int i = 0; i < o_.n; ++i) {
      const Choice& c = choices_[static_cast<size_t>(i)];
      json choice = {{"index", i}};
      if (o_.chat) {
        json msg = {
            {"role", "assistant"},
            {"content", c.content.empty() && !c.calls.empty() ? json(nullptr) : json(c.content)}};
        if (!c.reasoning.empty()) msg["reasoning_content"] = c.reasoning;
        if (!c.calls.empty()) msg["tool_calls"] = ToolCalls<json>(c);
        choice["message"] = std::move(msg);
      } else {
        choice["text"] = c.content;
      }
      choice["logprobs"] = o_.logprobs ? c.lp.Wrap(c.lp_all) : json(nullptr);
      choice["finish_reason"] = FinishName(c);
      list.push_back(std::move(choice));
    }
    json reply = {{"id", id_},
                  {"object", o_.chat ? "chat.completion" : "text_completion"},
                  {"created", created_},
                  {"model", o_.model},
                  {"choices", std::move(list)},
                  {"usage", std::move(usage)}};
    *out = Dump(reply);
  }

  void OnError(const Status& error, std::string* out) override {
    json body = ErrorBody(error.message(), "", "");
    if (status_ >= 500) body["error"]["type"] = "server_error";
    if (stream_) {
      *out += Sse(body) + "data: [DONE]\n\n";
    } else {
      *out = Dump(body);
    }
  }

  // Choice 0's message: the one the agent's history keeps.
  ordered_json ReplyMessage() const override {
    const Choice& c = choices_[0];
    ordered_json msg = {{"role", "assistant"}, {"content", c.content}};
    if (!c.calls.empty()) msg["tool_calls"] = ToolCalls<ordered_json>(c);
    return msg;
  }

 private:
  struct Call {
    std::string id, name, args;
  };
  struct Choice {
    Choice(const text::Tokenizer* t, bool chat) : lp(t, chat) {}
    std::string content, reasoning;
    std::map<int32_t, Call> calls;
    engine::FinishReason finish = engine::FinishReason::kNone;
    OpenAiLogprobs lp;
    json lp_all;   // every entry (whole replies)
    json pending;  // this engine event's entries, not streamed yet
    // The per-token chunks, serialized once (the id, model and time are
    // the same in every chunk of a response).
    JsonTemplate text_chunk, reasoning_chunk;
  };

  template <typename J>
  static J ToolCalls(const Choice& c) {
    J tcs = J::array();
    for (const auto& [i, call] : c.calls) {
      tcs.push_back({{"id", call.id},
                     {"type", "function"},
                     {"function", {{"name", call.name}, {"arguments", call.args}}}});
    }
    return tcs;
  }

  static std::string FinishName(const Choice& c) {
    std::string finish(engine::FinishReasonName(c.finish));
    if (finish.empty()) finish = "stop";
    if (!c.calls.empty()) finish = "tool_calls";
    return finish;
  }

  // Streams one delta of choice `index`, carrying its pending logprobs if
  // any (the fast template path otherwise).
  void Send(Choice& c, int index, json delta_or_text, std::string* out) {
    json lp = c.pending.is_null() ? json(nullptr) : c.lp.Wrap(c.pending);
    c.pending = nullptr;
    *out += Sse(Chunk(index, std::move(delta_or_text), nullptr, std::move(lp)));
  }

  void Handle(int index, const std::vector<text::output::OutputEvent>& events, std::string* out) {
    Choice& c = choices_[static_cast<size_t>(index)];
    for (const text::output::OutputEvent& e : events) {
      switch (e.kind) {
        case text::output::OutputEvent::Kind::kText:
          c.content += e.text;
          if (!stream_) break;
          if (!c.pending.is_null()) {
            Send(c, index, o_.chat ? json{{"content", e.text}} : json(e.text), out);
            break;
          }
          if (c.text_chunk.empty()) {
            const json hole(JsonTemplate::kHole);
            c.text_chunk = JsonTemplate(
                "data: ", Dump(Chunk(index, o_.chat ? json{{"content", hole}} : hole, nullptr)),
                "\n\n");
          }
          c.text_chunk.Render(e.text, out);
          break;
        case text::output::OutputEvent::Kind::kReasoning:
          c.reasoning += e.text;
          if (!stream_) break;
          if (!c.pending.is_null()) {
            Send(c, index, {{"reasoning_content", e.text}}, out);
            break;
          }
          if (c.reasoning_chunk.empty()) {
            c.reasoning_chunk = JsonTemplate(
                "data: ", Dump(Chunk(index, {{"reasoning_content", JsonTemplate::kHole}}, nullptr)),
                "\n\n");
          }
          c.reasoning_chunk.Render(e.text, out);
          break;
        case text::output::OutputEvent::Kind::kToolCallBegin:
          c.calls[e.tool_index] = {e.id, e.name, ""};
          if (stream_) {
            json tc = {{"index", e.tool_index},
                       {"id", e.id},
                       {"type", "function"},
                       {"function", {{"name", e.name}, {"arguments", ""}}}};
            Send(c, index, {{"tool_calls", json::array({tc})}}, out);
          }
          break;
        case text::output::OutputEvent::Kind::kToolCallArgs:
          c.calls[e.tool_index].args += e.text;
          if (stream_) {
            json tc = {{"index", e.tool_index}, {"function", {{"arguments", e.text}}}};
            Send(c, index, {{"tool_calls", json::array({tc})}}, out);
          }
          break;
        case text::output::OutputEvent::Kind::kToolCallEnd:
          break;
        case text::output::OutputEvent::Kind::kToolCallAbort:
          c.calls.erase(e.tool_index);
          break;
      }
    }
  }

  Options o_;
  std::string id_;
  int64_t created_;
  std::vector<Choice> choices_;
};

// Flattens OpenAI content parts ([{type: text, text}]) to a string.
Status NormalizeMessages(const json& in, ordered_json* out) {
  if (!in.is_array() || in.empty()) {
    return InvalidArgument("'messages' must be a non-empty array");
  }
  *out = ordered_json::array();
  for (const json& m : in) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return InvalidArgument("each message must be an object with a string 'role'");
    }
    ordered_json msg = ordered_json::parse(m.dump());
    if (m.contains("content") && m["content"].is_array()) {
      std::string text;
      for (const json& part : m["content"]) {
        if (part.is_string()) {
          text += part.get<std::string>();
        } else if (part.is_object() && part.contains("text") && part["text"].is_string()) {
          text += part["text"].get<std::string>();
        }
      }
      msg["content"] = text;
    } else if (m.contains("content") && !m["content"].is_string() && !m["content"].is_null()) {
      return InvalidArgument("message 'content' must be a string or a list of parts");
    }
    if (!msg.contains("content") || msg["content"].is_null()) msg["content"] = "";
    out->push_back(std::move(msg));
  }
  return Status::Ok();
}

struct Common {
  engine::SamplingParams params;
  engine::Priority priority = engine::Priority::kNormal;
  bool stream = false;
  bool include_usage = false;
  int n = 1;
};

Status ParseCommon(const HttpRequest& req, const json& body, bool chat, Common* c) {
  c->params.temperature = 1.0f;
  RETURN_IF_ERROR(ParseSampling(body, "stop", &c->params));
  std::optional<int64_t> max_tokens;
  RETURN_IF_ERROR(GetOptionalInt(body, "max_tokens", &max_tokens));
  RETURN_IF_ERROR(GetOptionalInt(body, "max_completion_tokens", &max_tokens));
  if (max_tokens)
    c->params.max_tokens = static_cast<int32_t>(std::min<int64_t>(*max_tokens, INT32_MAX));
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean()) return InvalidArgument("'stream' must be a boolean");
    c->stream = body["stream"].get<bool>();
  }
  if (body.contains("stream_options") && body["stream_options"].is_object()) {
    ASSIGN_OR_RETURN(c->include_usage,
                     OptionalBool(body["stream_options"], "include_usage", "stream_options"));
  }
  ASSIGN_OR_RETURN(c->n, ParseChoiceCount(body));
  ASSIGN_OR_RETURN(c->params.logprobs, ParseLogprobs(body, chat));
  ASSIGN_OR_RETURN(c->priority, ServedModel::RequestPriority(req, body));
  return Status::Ok();
}

ChatJob::Options JobOptions(const std::shared_ptr<ServedModel>& model, const Common& c, bool chat) {
  ChatJob::Options o;
  o.model = model->name();
  o.include_usage = c.include_usage;
  o.chat = chat;
  o.n = c.n;
  o.logprobs = c.params.logprobs.has_value();
  o.tokenizer = &model->tokenizer();
  o.keep_alive = model;
  if (c.n > 1) o.source = std::make_shared<GenerationJob::ChoiceSource>();
  return o;
}

// With several choices the turn's PrepareFn records the engine request the
// other choices copy.
agent::PrepareFn WithChoices(const ChatJob::Options& o, agent::PrepareFn prepare) {
  if (!o.source) return prepare;
  return GenerationJob::WithChoices(std::move(prepare), o.source);
}

HttpResponse FromStatus(const Status& s, const std::string& param = "") {
  const int status = HttpStatusFor(s);
  HttpResponse r = OpenAiApi::Error(status, s.message(), param);
  if (status == 429 || status == 503) r.headers["retry-after"] = "1";
  return r;
}

}  // namespace

HttpResponse OpenAiApi::Error(int status, const std::string& message, const std::string& param,
                              const std::string& code) {
  HttpResponse r;
  r.status = status;
  r.body = Dump(ErrorBody(message, param, code));
  return r;
}

Reply OpenAiApi::ChatCompletions(const HttpRequest& req) const {
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded()) return Error(400, "the request body is not valid JSON");
  if (!body.is_object()) return Error(400, "the request body must be a JSON object");
  if (!body.contains("messages")) return Error(400, "'messages' is required", "messages");
  ordered_json messages;
  if (Status s = NormalizeMessages(body["messages"], &messages); !s.ok()) {
    return FromStatus(s, "messages");
  }
  ordered_json tools = nullptr;
  if (body.contains("tools") && !body["tools"].is_null()) {
    if (!body["tools"].is_array()) return Error(400, "'tools' must be an array", "tools");
    tools = ordered_json::parse(body["tools"].dump());
    if (body.contains("tool_choice") && body["tool_choice"] == "none") tools = nullptr;
  }
  Common c;
  if (Status s = ParseCommon(req, body, /*chat=*/true, &c); !s.ok()) return FromStatus(s);
  auto salt = AgentBinding::CacheSalt(req, body);
  if (!salt.ok()) return FromStatus(salt.status(), "cache_salt");
  ordered_json extra = ordered_json::object();
  if (body.contains("chat_template_kwargs") && !body["chat_template_kwargs"].is_null()) {
    if (!body["chat_template_kwargs"].is_object()) {
      return Error(400, "'chat_template_kwargs' must be an object", "chat_template_kwargs");
    }
    extra = ordered_json::parse(body["chat_template_kwargs"].dump());
  }
  // OpenAI's reasoning_effort reaches templates that read it (GPT-OSS's
  // harmony template); chat_template_kwargs wins.
  if (body.contains("reasoning_effort") && !body["reasoning_effort"].is_null()) {
    if (!body["reasoning_effort"].is_string()) {
      return Error(400, "'reasoning_effort' must be a string", "reasoning_effort");
    }
    if (!extra.contains("reasoning_effort")) extra["reasoning_effort"] = body["reasoning_effort"];
  }
  std::shared_ptr<ServedModel> model = ctx_.host->Current();
  if (!model) return FromStatus(AgentBinding::SwapInProgress());
  const agent::ContentKey key = AgentBinding::NormalizeSystem(&messages);
  std::string text;  // the rendered prompt, for reusing the agent's own reply
  auto prompt = model->EncodeChat(messages, tools, extra, true, &text);
  if (!prompt.ok()) return FromStatus(prompt.status(), "messages");
  if (auto g = ParseResponseFormat(req.body, body, *model, /*chat=*/true, &text); !g.ok()) {
    return FromStatus(g.status(), "response_format");
  } else {
    c.params.grammar = *g;
  }
  if (auto g = ToolCallGrammar(ToolProtocol::kOpenAi, tools, body, *model, &text); !g.ok()) {
    return FromStatus(g.status(), "tools");
  } else if (*g) {
    c.params.grammar = *g;
  }
  if (auto r = model->MakeRequest(*prompt, c.params, c.priority); !r.ok()) {
    return FromStatus(r.status());
  }
  auto id = AgentBinding::Identify(*model, *ctx_.agents, AgentBinding::Hints(req, body), key,
                                   messages, tools, extra, *prompt);
  if (!id.ok()) return FromStatus(id.status());
  auto reencode = [messages, tools, extra](const ServedModel& m) {
    return m.EncodeChat(messages, tools, extra);
  };
  ChatJob::Options o = JobOptions(model, c, /*chat=*/true);
  // (Before `text` moves into the turn.)
  auto parser = ServedModel::ParserOptions(model, !tools.is_null(), text);
  auto turn = ctx_.agents->NewTurn(
      id->agent_id,
      WithChoices(o, AgentBinding::Prepare(ctx_.host, model, std::move(prompt).value(), c.params,
                                           c.priority, std::move(salt).value(), reencode,
                                           {ctx_.agents, id->agent_id, std::move(text)})));
  return std::unique_ptr<AsyncBody>(new ChatJob(ctx_, std::move(turn), parser, c.stream,
                                                AgentBinding::NewMessages(messages), std::move(o)));
}

Reply OpenAiApi::Completions(const HttpRequest& req) const {
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded()) return Error(400, "the request body is not valid JSON");
  if (!body.is_object()) return Error(400, "the request body must be a JSON object");
  if (!body.contains("prompt")) return Error(400, "'prompt' is required", "prompt");
  std::shared_ptr<ServedModel> model = ctx_.host->Current();
  if (!model) return FromStatus(AgentBinding::SwapInProgress());
  const json& p = body["prompt"];
  std::vector<int32_t> prompt;
  std::string text;
  if (p.is_string()) {
    text = p.get<std::string>();
  } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
    text = p[0].get<std::string>();
  } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
    for (const json& t : p) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
          t.get<int64_t>() >= model->tokenizer().vocab_size()) {
        return Error(400, "'prompt' token ids must be integers in the vocabulary", "prompt");
      }
      prompt.push_back(t.get<int32_t>());
    }
    text = model->tokenizer().Decode(prompt, false);
  } else {
    return Error(400, "'prompt' must be a string, a list of one string, or a list of token ids",
                 "prompt");
  }
  const bool from_text = prompt.empty();
  if (from_text) prompt = model->tokenizer().Encode(text, true);
  Common c;
  c.params.max_tokens = 16;  // OpenAI's default for completions
  if (Status s = ParseCommon(req, body, /*chat=*/false, &c); !s.ok()) return FromStatus(s);
  if (!body.contains("max_tokens") || body["max_tokens"].is_null()) c.params.max_tokens = 16;
  auto salt = AgentBinding::CacheSalt(req, body);
  if (!salt.ok()) return FromStatus(salt.status(), "cache_salt");
  if (auto g = ParseResponseFormat(req.body, body, *model, /*chat=*/false); !g.ok()) {
    return FromStatus(g.status(), "response_format");
  } else {
    c.params.grammar = *g;
  }
  if (auto r = model->MakeRequest(prompt, c.params, c.priority); !r.ok()) {
    return FromStatus(r.status(), "prompt");
  }
  // A raw prompt has no turns: content matching needs half of it to match.
  const size_t half = std::max<size_t>(1, prompt.size() / 2);
  auto id = ctx_.agents->identifier().Identify(AgentBinding::Hints(req, body), {"", text}, prompt,
                                               [half] { return half; });
  if (!id.ok()) return FromStatus(id.status());
  AgentBinding::Reencode reencode;
  if (from_text) {
    reencode = [text](const ServedModel& m) -> Result<std::vector<int32_t>> {
      return m.tokenizer().Encode(text, true);
    };
  }
  ChatJob::Options o = JobOptions(model, c, /*chat=*/false);
  auto turn = ctx_.agents->NewTurn(
      id->agent_id,
      WithChoices(o, AgentBinding::Prepare(ctx_.host, model, std::move(prompt), c.params,
                                           c.priority, std::move(salt).value(), reencode)));
  auto parser = text::output::OutputParserOptions::ForModelType("", false, false);
  ordered_json record = ordered_json::array({{{"role", "user"}, {"content", text}}});
  return std::unique_ptr<AsyncBody>(
      new ChatJob(ctx_, std::move(turn), parser, c.stream, std::move(record), std::move(o)));
}

}  // namespace agentkv::api
