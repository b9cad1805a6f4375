#include "engine/text/output/tool_call_parser.h"

#include <algorithm>
#include <utility>

#include <nlohmann/json.hpp>

#include "engine/text/output/partial_match.h"

namespace agentkv::text::output {
namespace {

using Kind = OutputEvent::Kind;
using Json = nlohmann::json;

constexpr std::string_view kPythonTag = "<|python_tag|>";

std::optional<std::string> DecodeString(std::string_view raw) {
  Json j = Json::parse(raw, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_string()) return std::nullopt;
  return j.get<std::string>();
}

uint64_t SplitMix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

OutputEvent CallEvent(Kind kind, int32_t index) {
  OutputEvent e;
  e.kind = kind;
  e.tool_index = index;
  return e;
}

}  // namespace

ToolCallParser::ToolCallParser(ToolCallParserOptions options) : opts_(std::move(options)) {
  switch (opts_.format) {
    case ToolCallFormat::kHermes:
      open_tag_ = "<tool_call>";
      close_tag_ = "</tool_call>";
      mode_ = Mode::kText;
      break;
    case ToolCallFormat::kGemmaFenced:
      open_tag_ = "```tool_call";
      close_tag_ = "```";
      mode_ = Mode::kText;
      break;
    case ToolCallFormat::kLlama31Json:
      mode_ = Mode::kLlamaStart;
      break;
    case ToolCallFormat::kNone:
    case ToolCallFormat::kHarmony:
      mode_ = Mode::kPassThrough;
      break;
  }
}

bool ToolCallParser::tagged() const { return !open_tag_.empty(); }

std::string ToolCallId(std::string_view prefix, uint64_t seed, int32_t index) {
  static constexpr char kAlphabet[] =
      "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  uint64_t x = seed ^ (0xd1b54a32d192ed03ull * static_cast<uint64_t>(index + 1));
  std::string id(prefix);
  uint64_t r = 0;
  for (int i = 0; i < 24; ++i) {
    if (i % 10 == 0) r = SplitMix64(x);
    id += kAlphabet[r % 62];
    r /= 62;
  }
  return id;
}

void ToolCallParser::EmitText(std::string_view t, std::vector<OutputEvent>* out) {
  if (strip_leading_) {
    size_t i = 0;
    while (i < t.size() && IsJsonSpace(t[i])) ++i;
    t.remove_prefix(i);
    if (t.empty()) return;
    strip_leading_ = false;
  }
  size_t end = t.size();
  while (end > 0 && IsJsonSpace(t[end - 1])) --end;
  if (end == 0) {
    ws_.append(t);
    return;
  }
  std::string piece = std::exchange(ws_, std::string(t.substr(end)));
  piece.append(t.substr(0, end));
  AppendMerged(out, OutputEvent::Text(std::move(piece)));
}

void ToolCallParser::ResetCall() {
  raw_.clear();
  json_start_ = 0;
  scanner_.Reset();
  key_.clear();
  key_start_ = 0;
  role_ = Role::kOther;
  name_start_ = 0;
  name_seen_ = false;
  name_.reset();
  args_ = Args::kNone;
  args_start_ = args_end_ = 0;
  args_open_ = false;
  args_unsent_.clear();
  begun_ = false;
  index_ = -1;
  search_from_ = 0;
}

void ToolCallParser::BeginCall(std::string prefix) {
  ResetCall();
  raw_ = std::move(prefix);
  ws_before_ = std::exchange(ws_, {});
  mode_ = Mode::kCallJson;
}

void ToolCallParser::LlamaToText(std::vector<OutputEvent>* out) {
  EmitText(raw_prefix_, out);
  raw_prefix_.clear();
  mode_ = Mode::kPassThrough;
}

void ToolCallParser::Feed(std::string_view text, std::vector<OutputEvent>* out) {
  buf_.append(text);
  size_t pos = 0;
  while (pos < buf_.size()) {
    const size_t used = Step(std::string_view(buf_).substr(pos), /*final=*/false, out);
    if (used == kNeedMore) break;
    pos += used;
  }
  buf_.erase(0, pos);
  FlushArgs(out);
}

void ToolCallParser::Finish(std::vector<OutputEvent>* out) {
  size_t pos = 0;
  while (pos < buf_.size()) {
    const size_t used = Step(std::string_view(buf_).substr(pos), /*final=*/true, out);
    pos += used == kNeedMore ? buf_.size() - pos : used;  // final never holds
  }
  buf_.clear();
  if (mode_ == Mode::kCallJson) {
    if (scanner_.Finish() && scanner_.done()) {
      CompleteCall(out);
    } else {
      FailCall(raw_.size(), out);  // cut off mid-call
    }
  }
  if (mode_ == Mode::kCallError) {
    EmitText(ws_before_ + raw_, out);
    ResetCall();
  }
  if (mode_ == Mode::kLlamaStart || mode_ == Mode::kLlamaTagged) LlamaToText(out);
  mode_ = Mode::kPassThrough;
  if (!ws_.empty()) AppendMerged(out, OutputEvent::Text(std::exchange(ws_, {})));
}

size_t ToolCallParser::Step(std::string_view s, bool final, std::vector<OutputEvent>* out) {
  switch (mode_) {
    case Mode::kPassThrough:
      EmitText(s, out);
      return s.size();

    case Mode::kText: {
      const size_t p = s.find(open_tag_);
      if (p != std::string_view::npos) {
        EmitText(s.substr(0, p), out);
        BeginCall(open_tag_);
        return p + open_tag_.size();
      }
      const size_t keep = final ? 0 : PartialSuffixLength(s, open_tag_);
      if (keep == s.size()) return kNeedMore;
      EmitText(s.substr(0, s.size() - keep), out);
      return s.size() - keep;
    }

    case Mode::kLlamaStart:
    case Mode::kLlamaTagged:
    case Mode::kLlamaNext: {
      size_t j = 0;
      while (j < s.size() && (IsJsonSpace(s[j]) || (mode_ == Mode::kLlamaNext && s[j] == ';'))) {
        ++j;
      }
      if (j == s.size() && !final) return kNeedMore;
      const std::string_view rest = s.substr(j);
      if (mode_ == Mode::kLlamaStart) {
        if (rest.starts_with(kPythonTag)) {
          raw_prefix_.assign(s.substr(0, j + kPythonTag.size()));
          mode_ = Mode::kLlamaTagged;
          return j + kPythonTag.size();
        }
        if (!final && kPythonTag.starts_with(rest)) return kNeedMore;
      }
      if (!rest.empty() && rest[0] == '{') {
        BeginCall(raw_prefix_ + std::string(s.substr(0, j)));
        raw_prefix_.clear();
        return j;
      }
      LlamaToText(out);  // not a call: s is re-read as text
      return 0;
    }

    case Mode::kCallJson:
      return StepJson(s, out);

    case Mode::kCallClose: {
      size_t j = 0;
      while (j < s.size() && IsJsonSpace(s[j])) ++j;
      if (j == s.size()) return final ? s.size() : kNeedMore;
      const std::string_view rest = s.substr(j);
      if (rest.starts_with(close_tag_)) {
        mode_ = Mode::kText;
        return j + close_tag_.size();
      }
      if (std::string_view(close_tag_).starts_with(rest)) {
        if (!final) return kNeedMore;
        return s.size();  // a cut-off close tag is still framing
      }
      mode_ = Mode::kText;  // no close tag: the call stands, the rest is text
      return j;
    }

    case Mode::kCallError: {
      const size_t old = raw_.size();
      raw_.append(s);
      const size_t p = raw_.find(close_tag_, search_from_);
      if (p == std::string::npos) {
        if (raw_.size() >= close_tag_.size()) {
          search_from_ = std::max(search_from_, raw_.size() - close_tag_.size() + 1);
        }
        return s.size();
      }
      const size_t end = p + close_tag_.size();
      raw_.resize(end);
      EmitText(ws_before_ + raw_, out);
      ResetCall();
      mode_ = Mode::kText;
      return end > old ? end - old : 0;
    }
  }
  return s.size();
}

size_t ToolCallParser::StepJson(std::string_view s, std::vector<OutputEvent>* out) {
  for (size_t i = 0; i < s.size(); ++i) {
    const size_t pos = raw_.size();
    raw_.push_back(s[i]);
    if (!scanner_.Feed(s[i])) {
      FailCall(pos, out);
      return i + 1;
    }
    OnMarks(pos, out);
    if (mode_ != Mode::kCallJson) return i + 1;
  }
  return s.size();
}

void ToolCallParser::OnMarks(size_t pos, std::vector<OutputEvent>* out) {
  using Event = JsonStreamScanner::Event;
  bool close_args_after = false;
  for (const JsonStreamScanner::Mark& m : scanner_.marks()) {
    const size_t end = m.before_byte ? pos : pos + 1;
    if (m.depth == 0) {
      if (m.event == Event::kValueBegin) {
        if (raw_[pos] != '{') return FailCall(pos, out);
        json_start_ = pos;
      } else if (m.event == Event::kValueEnd) {
        return CompleteCall(out);
      }
      continue;
    }
    if (m.depth != 1) continue;
    switch (m.event) {
      case Event::kKeyBegin:
        key_start_ = pos;
        break;
      case Event::kKeyEnd:
        key_ = DecodeString(std::string_view(raw_).substr(key_start_, end - key_start_))
                   .value_or(std::string());
        break;
      case Event::kValueBegin:
        role_ = Role::kOther;
        if (key_ == "name" && !name_seen_) {
          role_ = Role::kName;
          name_seen_ = true;
          name_start_ = pos;
        } else if ((key_ == "arguments" || key_ == "parameters") && args_ == Args::kNone) {
          role_ = Role::kArgs;
          args_start_ = pos;
          switch (raw_[pos]) {
            case '{':
              args_ = Args::kObject;
              args_open_ = true;
              break;
            case '"':
              args_ = Args::kString;
              break;
            case 'n':
              args_ = Args::kNull;
              break;
            default:
              return FailCall(pos, out);  // arguments must be an object
          }
        }
        break;
      case Event::kValueEnd:
        if (role_ == Role::kName) {
          name_ = DecodeString(std::string_view(raw_).substr(name_start_, end - name_start_));
          if (!name_ || name_->empty()) return FailCall(pos, out);
          TryBegin(out);
        } else if (role_ == Role::kArgs) {
          args_end_ = end;
          close_args_after = args_open_;
        }
        role_ = Role::kOther;
        break;
    }
  }
  if (args_open_) {
    args_unsent_.push_back(raw_[pos]);
    if (close_args_after) args_open_ = false;
    TryBegin(out);
  }
}

void ToolCallParser::TryBegin(std::vector<OutputEvent>* out) {
  if (!opts_.stream_arguments || begun_ || !name_ || args_ != Args::kObject) return;
  begun_ = true;
  index_ = next_index_++;
  OutputEvent e = CallEvent(Kind::kToolCallBegin, index_);
  e.id = ToolCallId(opts_.id_prefix, opts_.id_seed, index_);
  e.name = *name_;
  AppendMerged(out, std::move(e));
}

void ToolCallParser::FlushArgs(std::vector<OutputEvent>* out) {
  if (!begun_ || args_unsent_.empty()) return;
  OutputEvent e = CallEvent(Kind::kToolCallArgs, index_);
  e.text = std::exchange(args_unsent_, {});
  AppendMerged(out, std::move(e));
}

void ToolCallParser::CompleteCall(std::vector<OutputEvent>* out) {
  const Json j =
      Json::parse(std::string_view(raw_).substr(json_start_), nullptr, /*allow_exceptions=*/false);
  bool ok = !j.is_discarded() && j.is_object() && name_.has_value();
  std::string args;
  if (ok) {
    switch (args_) {
      case Args::kNone:
        // A bare Llama message {"name": ...} without parameters is more
        // likely an answer in JSON than a call.
        ok = opts_.format != ToolCallFormat::kLlama31Json;
        args = "{}";
        break;
      case Args::kNull:
        args = "{}";
        break;
      case Args::kObject:
        args = raw_.substr(args_start_, args_end_ - args_start_);
        break;
      case Args::kString: {
        // Arguments given as a JSON-encoded string, OpenAI style.
        std::optional<std::string> s =
            DecodeString(std::string_view(raw_).substr(args_start_, args_end_ - args_start_));
        ok = s && Json::parse(*s, nullptr, false).is_object();
        if (ok) args = std::move(*s);
        break;
      }
    }
  }
  if (!ok) return FailCall(raw_.size(), out);
  if (!begun_) {
    index_ = next_index_++;
    OutputEvent e = CallEvent(Kind::kToolCallBegin, index_);
    e.id = ToolCallId(opts_.id_prefix, opts_.id_seed, index_);
    e.name = *name_;
    AppendMerged(out, std::move(e));
    begun_ = true;
    args_unsent_ = std::move(args);
  }
  FlushArgs(out);
  AppendMerged(out, CallEvent(Kind::kToolCallEnd, index_));
  ++num_calls_;
  ResetCall();
  ws_before_.clear();
  strip_leading_ = true;
  mode_ = tagged() ? Mode::kCallClose : Mode::kLlamaNext;
}

void ToolCallParser::FailCall(size_t search_from, std::vector<OutputEvent>* out) {
  if (begun_) {
    FlushArgs(out);  // what arrived before the break, whatever the split
    AppendMerged(out, CallEvent(Kind::kToolCallAbort, index_));
  }
  begun_ = false;
  args_unsent_.clear();
  args_open_ = false;
  if (tagged()) {
    mode_ = Mode::kCallError;
    search_from_ = search_from;
    return;
  }
  EmitText(ws_before_ + raw_, out);
  ResetCall();
  mode_ = Mode::kPassThrough;
}

}  // namespace agentkv::text::output
