#include "api/anthropic_api.h"

#include <atomic>
#include <ctime>
#include <nlohmann/json.hpp>

#include "api/generation_job.h"
#include "api/json_fields.h"
#include "api/json_template.h"
#include "api/response_format.h"
#include "engine/finish_reason.h"

namespace agentkv::api {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }
std::string Event(const char* name, const json& j) {
  return std::string("event: ") + name + "\ndata: " + Dump(j) + "\n\n";
}

std::string NewMessageId() {
  static std::atomic<uint64_t> counter{0};
  const uint64_t n = counter.fetch_add(1) + static_cast<uint64_t>(std::time(nullptr)) * 1000003ull;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(n));
  return std::string("msg_") + buf;
}

json ErrorBody(const std::string& type, const std::string& message) {
  return {{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
}

// Text of a string or of a list of blocks' "text".
std::string TextOf(const json& content) {
  if (content.is_string()) return content.get<std::string>();
  std::string text;
  if (content.is_array()) {
    for (const json& b : content) {
      if (b.is_object() && b.contains("type") && b["type"] == "text" && b.contains("text") &&
          b["text"].is_string()) {
        if (!text.empty()) text += "\n";
        text += b["text"].get<std::string>();
      }
    }
  }
  return text;
}

struct Converted {
  ordered_json messages = ordered_json::array();
  ordered_json tools = nullptr;
  // Template variables: enable_thinking follows the request's `thinking`
  // (off unless {"type": "enabled"}), as Claude models only think when asked.
  ordered_json extra = ordered_json::object();
};

Status Convert(const json& body, Converted* out) {
  std::string system;
  if (body.contains("system") && !body["system"].is_null()) {
    const json& s = body["system"];
    if (!s.is_string() && !s.is_array()) {
      return InvalidArgument("system: must be a string or a list of text blocks");
    }
    system = TextOf(s);
  }
  if (!body.contains("messages")) return InvalidArgument("messages: Field required");
  const json& msgs = body["messages"];
  if (!msgs.is_array()) return InvalidArgument("messages: Input should be a valid list");
  ordered_json conv = ordered_json::array();
  for (const json& m : msgs) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return InvalidArgument("messages: each message needs a string 'role'");
    }
    const std::string role = m["role"].get<std::string>();
    const json content = OptionalValue(m, "content", json(""));
    if (!content.is_string() && !content.is_array()) {
      return InvalidArgument("messages: 'content' must be a string or a list of blocks");
    }
    if (role == "system") {
      if (!system.empty()) system += "\n\n";
      system += TextOf(content);
      continue;
    }
    if (role != "user" && role != "assistant") {
      return InvalidArgument("messages: role must be 'user' or 'assistant', got '" + role + "'");
    }
    if (content.is_string()) {
      conv.push_back({{"role", role}, {"content", content.get<std::string>()}});
      continue;
    }
    std::string text;
    ordered_json tool_calls = ordered_json::array();
    for (const json& b : content) {
      if (!b.is_object()) return InvalidArgument("messages: content blocks must be objects");
      ASSIGN_OR_RETURN(const std::string type, OptionalString(b, "type", "messages[].content[]"));
      if (type == "text" && b.contains("text") && b["text"].is_string()) {
        text += b["text"].get<std::string>();
      } else if (type == "tool_use") {
        ordered_json input =
            b.contains("input") ? ordered_json::parse(b["input"].dump()) : ordered_json::object();
        ASSIGN_OR_RETURN(std::string id, OptionalString(b, "id", "tool_use"));
        ASSIGN_OR_RETURN(std::string name, OptionalString(b, "name", "tool_use"));
        tool_calls.push_back({{"id", std::move(id)},
                              {"type", "function"},
                              {"function", {{"name", std::move(name)}, {"arguments", input}}}});
      } else if (type == "tool_result") {
        const json rc = OptionalValue(b, "content", json(""));
        ASSIGN_OR_RETURN(std::string use_id, OptionalString(b, "tool_use_id", "tool_result"));
        conv.push_back(
            {{"role", "tool"}, {"tool_call_id", std::move(use_id)}, {"content", TextOf(rc)}});
      }
      // image, document, thinking and other blocks are ignored.
    }
    if (!text.empty() || !tool_calls.empty() || role == "user") {
      ordered_json msg = {{"role", role}, {"content", text}};
      if (!tool_calls.empty()) msg["tool_calls"] = std::move(tool_calls);
      if (role == "user" && text.empty() && !conv.empty() && conv.back()["role"] == "tool") {
        continue;  // only tool results
      }
      conv.push_back(std::move(msg));
    }
  }
  if (conv.empty()) return InvalidArgument("messages: at least one message is required");
  const json thinking = OptionalValue(body, "thinking", json(nullptr));
  ASSIGN_OR_RETURN(const std::string thinking_type, OptionalString(thinking, "type", "thinking"));
  out->extra["enable_thinking"] = thinking_type == "enabled";
  if (!system.empty()) out->messages.push_back({{"role", "system"}, {"content", system}});
  for (auto& m : conv) out->messages.push_back(std::move(m));
  if (body.contains("tools") && !body["tools"].is_null()) {
    if (!body["tools"].is_array()) return InvalidArgument("tools: Input should be a valid list");
    ordered_json tools = ordered_json::array();
    for (const json& t : body["tools"]) {
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string()) {
        return InvalidArgument("tools: each tool needs a string 'name'");
      }
      if (!t.contains("input_schema")) continue;  // server tools
      ASSIGN_OR_RETURN(std::string description, OptionalString(t, "description", "tools[]"));
      tools.push_back({{"type", "function"},
                       {"function",
                        {{"name", t["name"].get<std::string>()},
                         {"description", std::move(description)},
                         {"parameters", ordered_json::parse(t["input_schema"].dump())}}}});
    }
    if (!tools.empty()) out->tools = std::move(tools);
  }
  return Status::Ok();
}

class MessagesJob : public GenerationJob {
 public:
  MessagesJob(ApiContext ctx, std::shared_ptr<agent::AgentTurn> turn,
              text::output::OutputParserOptions parser, bool stream, ordered_json new_messages,
              std::string model, std::shared_ptr<const ServedModel> served,
              std::vector<std::string> stops)
      : GenerationJob(ctx, std::move(turn), std::move(parser), stream, std::move(new_messages),
                      "/v1/messages"),
        model_(std::move(model)),
        served_(std::move(served)),
        stops_(std::move(stops)),
        id_(NewMessageId()) {}

 protected:
  void OnBegin(std::string* out) override {
    if (!stream_) return;
    json msg = {{"id", id_},
                {"type", "message"},
                {"role", "assistant"},
                {"content", json::array()},
                {"model", model_},
                {"stop_reason", nullptr},
                {"stop_sequence", nullptr},
                {"usage",
                 {{"input_tokens", prompt_tokens_},
                  {"output_tokens", 0},
                  {"cache_creation_input_tokens", 0},
                  {"cache_read_input_tokens", 0}}}};
    *out += Event("message_start", {{"type", "message_start"}, {"message", msg}});
  }

  // Opens a block of `kind` ("text", "thinking", "tool_use") unless it is
  // the current one.
  void Open(const std::string& kind, const text::output::OutputEvent& e, std::string* out) {
    if (open_ && kind == kind_ && kind != "tool_use") return;
    Close(out);
    json block;
    if (kind == "text") block = {{"type", "text"}, {"text", ""}};
    if (kind == "thinking") block = {{"type", "thinking"}, {"thinking", ""}};
    if (kind == "tool_use") {
      block = {{"type", "tool_use"}, {"id", e.id}, {"name", e.name}, {"input", json::object()}};
    }
    blocks_.push_back(block);
    args_.emplace_back();
    open_ = true;
    kind_ = kind;
    if (stream_) {
      *out += Event("content_block_start", {{"type", "content_block_start"},
                                            {"index", blocks_.size() - 1},
                                            {"content_block", block}});
      if (!pinged_) {
        pinged_ = true;
        *out += Event("ping", {{"type", "ping"}});
      }
    }
  }

  void Close(std::string* out) {
    if (!open_) return;
    open_ = false;
    if (kind_ == "tool_use") {
      json input = json::parse(args_.back().empty() ? "{}" : args_.back(), nullptr, false);
      blocks_.back()["input"] = input.is_object() ? input : json::object();
    }
    if (stream_) {
      *out += Event("content_block_stop",
                    {{"type", "content_block_stop"}, {"index", blocks_.size() - 1}});
    }
  }

  void Delta(const json& delta, std::string* out) {
    if (stream_) {
      *out +=
          Event("content_block_delta",
                {{"type", "content_block_delta"}, {"index", blocks_.size() - 1}, {"delta", delta}});
    }
  }

  // Delta({"type": "text_delta", "text": text}) from a template made once
  // per block.
  void TextDelta(const std::string& text, std::string* out) {
    const size_t index = blocks_.size() - 1;
    if (text_delta_.empty() || text_delta_index_ != index) {
      text_delta_index_ = index;
      text_delta_ =
          JsonTemplate("event: content_block_delta\ndata: ",
                       Dump({{"type", "content_block_delta"},
                             {"index", index},
                             {"delta", {{"type", "text_delta"}, {"text", JsonTemplate::kHole}}}}),
                       "\n\n");
    }
    text_delta_.Render(text, out);
  }

  void OnEvents(const std::vector<text::output::OutputEvent>& events, std::string* out) override {
    for (const text::output::OutputEvent& e : events) {
      switch (e.kind) {
        case text::output::OutputEvent::Kind::kText:
          Open("text", e, out);
          // In place: a copy of the block's text per token is quadratic.
          blocks_.back()["text"].get_ref<std::string&>() += e.text;
          if (stream_) TextDelta(e.text, out);
          break;
        case text::output::OutputEvent::Kind::kReasoning:
          Open("thinking", e, out);
          blocks_.back()["thinking"].get_ref<std::string&>() += e.text;
          Delta({{"type", "thinking_delta"}, {"thinking", e.text}}, out);
          break;
        case text::output::OutputEvent::Kind::kToolCallBegin:
          Open("tool_use", e, out);
          ++tool_uses_;
          break;
        case text::output::OutputEvent::Kind::kToolCallArgs:
          if (open_ && kind_ == "tool_use") {
            args_.back() += e.text;
            Delta({{"type", "input_json_delta"}, {"partial_json", e.text}}, out);
          }
          break;
        case text::output::OutputEvent::Kind::kToolCallEnd:
          Close(out);
          break;
        case text::output::OutputEvent::Kind::kToolCallAbort:
          if (open_ && kind_ == "tool_use") {
            Close(out);
            --tool_uses_;
            if (!stream_) {
              blocks_.erase(blocks_.size() - 1);
              args_.pop_back();
            }
          }
          break;
      }
    }
  }

  // The stop sequence that ended the generation: the earliest of the
  // request's stop_sequences in the whole decoded output (the engine cuts
  // it from the text; an EOS stop leaves none in it).
  json MatchedStop(const engine::RequestOutput& f) const {
    if (f.finish != engine::FinishReason::kStop || stops_.empty() || !served_) return nullptr;
    const std::string text = served_->tokenizer().Decode(generated(), false);
    size_t best = std::string::npos;
    json which = nullptr;
    for (const std::string& s : stops_) {
      const size_t at = text.find(s);
      if (at != std::string::npos && (best == std::string::npos || at < best)) {
        best = at;
        which = s;
      }
    }
    return which;
  }

  void OnFinish(const engine::RequestOutput& f, std::string* out) override {
    std::string stop_reason = f.finish == engine::FinishReason::kLength ? "max_tokens" : "end_turn";
    const json stop_sequence = MatchedStop(f);
    if (!stop_sequence.is_null()) stop_reason = "stop_sequence";
    if (tool_uses_ > 0 && f.finish != engine::FinishReason::kLength) stop_reason = "tool_use";
    const int64_t input = f.prompt_tokens - f.cached_tokens;
    json usage = {{"input_tokens", input},
                  {"output_tokens", f.completion_tokens},
                  {"cache_creation_input_tokens", 0},
                  {"cache_read_input_tokens", f.cached_tokens}};
    if (stream_) {
      if (blocks_.empty()) Open("text", text::output::OutputEvent{}, out);
      Close(out);
      *out += Event("message_delta",
                    {{"type", "message_delta"},
                     {"delta", {{"stop_reason", stop_reason}, {"stop_sequence", stop_sequence}}},
                     {"usage", usage}});
      *out += Event("message_stop", {{"type", "message_stop"}});
      return;
    }
    Close(out);
    if (blocks_.empty()) blocks_.push_back({{"type", "text"}, {"text", ""}});
    json msg = {{"id", id_},
                {"type", "message"},
                {"role", "assistant"},
                {"model", model_},
                {"content", blocks_},
                {"stop_reason", stop_reason},
                {"stop_sequence", stop_sequence},
                {"usage", usage}};
    *out = Dump(msg);
  }

  void OnError(const Status& error, std::string* out) override {
    const char* type = "api_error";
    if (status_ == 400) type = "invalid_request_error";
    if (status_ == 413) type = "request_too_large";
    if (status_ == 429 || status_ == 503) {
      status_ = 529;
      type = "overloaded_error";
    }
    json body = ErrorBody(type, error.message());
    if (stream_) {
      *out += Event("error", body);
    } else {
      *out = Dump(body);
    }
  }

  ordered_json ReplyMessage() const override {
    std::string text;
    ordered_json calls = ordered_json::array();
    for (const json& b : blocks_) {
      const std::string type = b.value("type", "");
      if (type == "text") text += b.value("text", "");
      if (type == "tool_use") {
        calls.push_back({{"id", b.value("id", "")},
                         {"type", "function"},
                         {"function",
                          {{"name", b.value("name", "")},
                           {"arguments", ordered_json::parse(b["input"].dump())}}}});
      }
    }
    ordered_json msg = {{"role", "assistant"}, {"content", text}};
    if (!calls.empty()) msg["tool_calls"] = std::move(calls);
    return msg;
  }

 private:
  std::string model_;
  std::shared_ptr<const ServedModel> served_;
  std::vector<std::string> stops_;
  std::string id_;
  json blocks_ = json::array();
  std::vector<std::string> args_;
  bool open_ = false;
  bool pinged_ = false;
  std::string kind_;
  int tool_uses_ = 0;
  JsonTemplate text_delta_;
  size_t text_delta_index_ = 0;
};

HttpResponse FromStatus(const Status& s) {
  if (s.code() == StatusCode::kResourceExhausted || s.code() == StatusCode::kCancelled) {
    HttpResponse r = AnthropicApi::Error(529, s.message(), "overloaded_error");
    r.headers["retry-after"] = "1";
    return r;
  }
  return AnthropicApi::Error(HttpStatusFor(s), s.message());
}

Result<json> ParseBody(const HttpRequest& req) {
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded()) return InvalidArgument("the request body is not valid JSON");
  if (!body.is_object()) return InvalidArgument("the request body must be a JSON object");
  return body;
}

}  // namespace

HttpResponse AnthropicApi::Error(int status, const std::string& message, const std::string& type) {
  HttpResponse r;
  r.status = status;
  r.body = Dump(ErrorBody(type, message));
  return r;
}

Reply AnthropicApi::Messages(const HttpRequest& req) const {
  auto body = ParseBody(req);
  if (!body.ok()) return FromStatus(body.status());
  Converted c;
  if (Status s = Convert(*body, &c); !s.ok()) return FromStatus(s);
  engine::SamplingParams params;
  if (Status s = ParseSampling(*body, "stop_sequences", &params); !s.ok()) return FromStatus(s);
  std::optional<int64_t> max_tokens;
  if (Status s = GetOptionalInt(*body, "max_tokens", &max_tokens); !s.ok()) return FromStatus(s);
  if (max_tokens)
    params.max_tokens = static_cast<int32_t>(std::min<int64_t>(*max_tokens, INT32_MAX));
  // Extended thinking's budget bounds a constrained reply's reasoning.
  if (body->contains("thinking") && (*body)["thinking"].is_object() &&
      (*body)["thinking"].value("type", "") == "enabled") {
    std::optional<int64_t> budget;
    if (Status s = GetOptionalInt((*body)["thinking"], "budget_tokens", &budget); !s.ok())
      return FromStatus(s.WithContext("thinking"));
    if (budget)
      params.reasoning_budget = static_cast<int32_t>(std::min<int64_t>(*budget, INT32_MAX));
  }
  bool stream = false;
  if (body->contains("stream") && !(*body)["stream"].is_null()) {
    if (!(*body)["stream"].is_boolean()) return Error(400, "stream: must be a boolean");
    stream = (*body)["stream"].get<bool>();
  }
  auto priority = ServedModel::RequestPriority(req, *body);
  if (!priority.ok()) return FromStatus(priority.status());
  auto salt = AgentBinding::CacheSalt(req, *body);
  if (!salt.ok()) return FromStatus(salt.status());
  std::shared_ptr<ServedModel> served = ctx_.host->Current();
  if (!served) return FromStatus(AgentBinding::SwapInProgress());
  const agent::ContentKey key = AgentBinding::NormalizeSystem(&c.messages);
  std::string text;  // the rendered prompt, for reusing the agent's own reply
  auto prompt = served->EncodeChat(c.messages, c.tools, c.extra, true, &text);
  if (!prompt.ok()) return FromStatus(prompt.status());
  if (auto g = ToolCallGrammar(ToolProtocol::kAnthropic, c.tools, *body, *served, &text); !g.ok()) {
    return FromStatus(g.status());
  } else {
    params.grammar = *g;
  }
  if (auto r = served->MakeRequest(*prompt, params, *priority); !r.ok()) {
    return FromStatus(r.status());
  }
  auto id = AgentBinding::Identify(*served, *ctx_.agents, AgentBinding::Hints(req, *body), key,
                                   c.messages, c.tools, c.extra, *prompt);
  if (!id.ok()) return FromStatus(id.status());
  std::string model = served->name();
  if (body->contains("model") && (*body)["model"].is_string()) model = (*body)["model"];
  auto parser = ServedModel::ParserOptions(served, !c.tools.is_null(), text);
  auto reencode = [c](const ServedModel& m) { return m.EncodeChat(c.messages, c.tools, c.extra); };
  std::vector<std::string> stops = params.stop;
  auto turn = ctx_.agents->NewTurn(
      id->agent_id, AgentBinding::Prepare(ctx_.host, served, std::move(prompt).value(), params,
                                          *priority, std::move(salt).value(), reencode,
                                          {ctx_.agents, id->agent_id, std::move(text)}));
  return std::unique_ptr<AsyncBody>(new MessagesJob(ctx_, std::move(turn), parser, stream,
                                                    AgentBinding::NewMessages(c.messages), model,
                                                    served, std::move(stops)));
}

Reply AnthropicApi::CountTokens(const HttpRequest& req) const {
  auto body = ParseBody(req);
  if (!body.ok()) return FromStatus(body.status());
  Converted c;
  if (Status s = Convert(*body, &c); !s.ok()) return FromStatus(s);
  std::shared_ptr<ServedModel> served = ctx_.host->Current();
  if (!served) return FromStatus(AgentBinding::SwapInProgress());
  AgentBinding::NormalizeSystem(&c.messages);
  auto prompt = served->EncodeChat(c.messages, c.tools, c.extra);
  if (!prompt.ok()) return FromStatus(prompt.status());
  HttpResponse r;
  r.body = Dump({{"input_tokens", prompt->size()}});
  return r;
}

}  // namespace agentkv::api
