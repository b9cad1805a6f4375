#include "engine/text/output/harmony_parser.h"

#include <algorithm>
#include <span>
#include <utility>

#include <nlohmann/json.hpp>

#include "engine/text/output/partial_match.h"

namespace agentkv::text::output {
namespace {

using Kind = OutputEvent::Kind;

constexpr std::string_view kStart = "<|start|>";
constexpr std::string_view kChannel = "<|channel|>";
constexpr std::string_view kMessage = "<|message|>";
constexpr std::string_view kConstrain = "<|constrain|>";
constexpr std::string_view kEnd = "<|end|>";
constexpr std::string_view kCall = "<|call|>";
constexpr std::string_view kReturn = "<|return|>";

// What ends a body: the end markers, and the markers that begin a message.
constexpr std::string_view kBodyEnds[] = {kEnd, kCall, kReturn, kStart, kChannel};
constexpr std::string_view kAllMarkers[] = {kStart, kChannel, kMessage, kConstrain,
                                            kEnd,   kCall,    kReturn};
using Markers = std::span<const std::string_view>;

bool IsHeaderByte(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == ' ' ||
         c == '_' || c == '.' || c == '-' || c == '=' || c == ':' || c == '/';
}

bool AllSpace(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return IsJsonSpace(c); });
}

// The earliest of `markers` in `s`: its position and which; npos if none.
std::pair<size_t, std::string_view> FindFirst(std::string_view s, Markers markers) {
  std::pair<size_t, std::string_view> best{std::string_view::npos, {}};
  for (std::string_view m : markers) {
    const size_t p = s.find(m);
    if (p < best.first) best = {p, m};
  }
  return best;
}

// How many bytes at the end of `s` may be the start of one of `markers`.
size_t HeldBack(std::string_view s, Markers markers) {
  size_t keep = 0;
  for (std::string_view m : markers) keep = std::max(keep, PartialSuffixLength(s, m));
  return keep;
}

std::vector<std::string_view> Words(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && s[i] == ' ') ++i;
    size_t j = i;
    while (j < s.size() && s[j] != ' ') ++j;
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

OutputEvent CallEvent(Kind kind, int32_t index) {
  OutputEvent e;
  e.kind = kind;
  e.tool_index = index;
  return e;
}

}  // namespace

HarmonyParser::Header HarmonyParser::ParseHeader(std::string_view text) {
  std::string t(text);
  for (size_t p; (p = t.find(kConstrain)) != std::string::npos;)
    t.replace(p, kConstrain.size(), " ");
  Header h;
  const size_t ch = t.find(kChannel);
  const std::string_view all = t;
  const std::string_view pre = all.substr(0, std::min(ch, all.size()));
  const std::string_view post =
      ch == std::string::npos ? std::string_view() : all.substr(ch + kChannel.size());
  auto add_type = [&](std::string_view w) {
    if (!h.content_type.empty()) h.content_type += ' ';
    h.content_type.append(w);
  };
  for (std::string_view w : Words(pre)) {
    if (w.starts_with("to=")) {
      h.recipient = std::string(w.substr(3));
    } else if (h.role.empty()) {
      h.role = std::string(w);
    } else {
      add_type(w);
    }
  }
  bool first = true;
  for (std::string_view w : Words(post)) {
    if (w.starts_with("to=")) {
      h.recipient = std::string(w.substr(3));
    } else if (first) {
      h.channel = std::string(w);
    } else {
      add_type(w);
    }
    // A channel is the word right after the marker, even if a recipient
    // came first ("<|channel|>to=x" has none).
    first = false;
  }
  return h;
}

HarmonyParser::HarmonyParser(ToolCallParserOptions tools)
    : opts_(std::move(tools)), tools_(opts_.format == ToolCallFormat::kHarmony) {}

void HarmonyParser::Feed(std::string_view text, std::vector<OutputEvent>* out) {
  buf_.append(text);
  Run(/*final=*/false, out);
}

void HarmonyParser::Finish(std::vector<OutputEvent>* out) {
  Run(/*final=*/true, out);
  switch (mode_) {
    case Mode::kHeader:
      if (!header_.empty()) HeaderFailed(out);  // cut off before <|message|>
      if (mode_ == Mode::kBody) EndMessage(out);
      break;
    case Mode::kBody:
      EndMessage(out);
      break;
    case Mode::kBetween:
      break;
  }
  ws_.clear();
  mode_ = Mode::kBetween;
}

void HarmonyParser::Run(bool final, std::vector<OutputEvent>* out) {
  std::string_view s = buf_;
  while (!s.empty()) {
    bool progressed = false;
    switch (mode_) {
      case Mode::kHeader:
        progressed = StepHeader(s, final, out);
        break;
      case Mode::kBody:
        progressed = StepBody(s, final, out);
        break;
      case Mode::kBetween:
        progressed = StepBetween(s, final, out);
        break;
    }
    if (!progressed) break;
  }
  buf_.erase(0, buf_.size() - s.size());
}

void HarmonyParser::StartHeader() {
  header_.clear();
  mode_ = Mode::kHeader;
}

bool HarmonyParser::StepHeader(std::string_view& s, bool final, std::vector<OutputEvent>* out) {
  size_t i = 0;
  for (; i < s.size(); ++i) {
    if (header_.size() + i > kMaxHeaderBytes) break;  // too long to be a header
    if (s[i] == '<') {
      const std::string_view rest = s.substr(i);
      std::string_view marker;
      for (std::string_view m : kAllMarkers) {
        if (rest.starts_with(m)) marker = m;
      }
      if (marker.empty()) {
        bool partial = false;
        for (std::string_view m : kAllMarkers) partial = partial || m.starts_with(rest);
        if (partial && !final) {
          header_.append(s.substr(0, i));
          s.remove_prefix(i);
          return false;  // the next piece decides
        }
        break;  // a '<' that starts no marker
      }
      if (marker == kChannel || marker == kConstrain) {
        i += marker.size() - 1;
        continue;
      }
      header_.append(s.substr(0, i));
      s.remove_prefix(i);
      if (marker == kMessage) {
        s.remove_prefix(kMessage.size());
        StartBody(out);
      } else {
        HeaderFailed(out);  // an end marker: StepBody ends the message on it
      }
      return true;
    }
    if (!IsHeaderByte(s[i])) break;
  }
  header_.append(s.substr(0, i));
  s.remove_prefix(i);
  if (s.empty()) return false;
  HeaderFailed(out);
  return true;
}

void HarmonyParser::HeaderFailed(std::vector<OutputEvent>* out) {
  AppendMerged(out, OutputEvent::Text(std::exchange(header_, {})));
  dest_ = Dest::kText;
  mode_ = Mode::kBody;
}

void HarmonyParser::StartBody(std::vector<OutputEvent>* out) {
  const Header h = ParseHeader(header_);
  mode_ = Mode::kBody;
  args_.clear();
  args_begun_ = begun_ = false;
  std::string recipient = h.recipient == "assistant" ? std::string() : h.recipient;
  const bool foreign = !h.role.empty() && h.role != "assistant";
  if (foreign || (!recipient.empty() && !tools_)) {
    // Not something the API can report: the raw text, markers included.
    AppendMerged(out, OutputEvent::Text(std::exchange(header_, {}) + std::string(kMessage)));
    dest_ = Dest::kText;
    return;
  }
  if (!recipient.empty()) {
    name_ = recipient.starts_with("functions.") ? recipient.substr(10) : recipient;
    if (name_.empty()) {
      AppendMerged(out, OutputEvent::Text(std::exchange(header_, {}) + std::string(kMessage)));
      dest_ = Dest::kText;
      return;
    }
    dest_ = Dest::kToolCall;
    if (opts_.stream_arguments) {
      begun_ = true;
      index_ = next_index_++;
      OutputEvent e = CallEvent(Kind::kToolCallBegin, index_);
      e.id = ToolCallId(opts_.id_prefix, opts_.id_seed, index_);
      e.name = name_;
      AppendMerged(out, std::move(e));
    }
    return;  // header_ is kept: a failed call comes back raw
  }
  header_.clear();
  dest_ = h.channel == "analysis" ? Dest::kReasoning : Dest::kText;
}

bool HarmonyParser::StepBody(std::string_view& s, bool final, std::vector<OutputEvent>* out) {
  const auto [p, marker] = FindFirst(s, kBodyEnds);
  if (p == std::string_view::npos) {
    const size_t keep = final ? 0 : HeldBack(s, kBodyEnds);
    EmitBody(s.substr(0, s.size() - keep), out);
    s.remove_prefix(s.size() - keep);
    return false;
  }
  EmitBody(s.substr(0, p), out);
  s.remove_prefix(p);
  EndMessage(out);
  if (marker == kChannel) {
    StartHeader();  // a new message without <|end|><|start|>: the marker is its header's
  } else {
    s.remove_prefix(marker.size());
    if (marker == kStart) {
      StartHeader();
    } else {
      mode_ = Mode::kBetween;
    }
  }
  return true;
}

bool HarmonyParser::StepBetween(std::string_view& s, bool final, std::vector<OutputEvent>* out) {
  const auto [p, marker] = FindFirst(s, kAllMarkers);
  const size_t n =
      p != std::string_view::npos ? p : s.size() - (final ? 0 : HeldBack(s, kAllMarkers));
  // Stray text: whitespace is held until other text shows it is part of it.
  const std::string_view text = s.substr(0, n);
  if (!text.empty()) {
    if (AllSpace(text)) {
      ws_.append(text);
    } else {
      size_t end = text.size();
      while (end > 0 && IsJsonSpace(text[end - 1])) --end;
      std::string piece = std::exchange(ws_, std::string(text.substr(end)));
      piece.append(text.substr(0, end));
      AppendMerged(out, OutputEvent::Text(std::move(piece)));
    }
  }
  s.remove_prefix(n);
  if (p == std::string_view::npos) return false;
  ws_.clear();
  if (marker == kStart) {
    s.remove_prefix(kStart.size());
    StartHeader();
  } else if (marker == kChannel || marker == kConstrain) {
    StartHeader();  // a header without <|start|>: the marker is part of it
  } else if (marker == kMessage) {
    s.remove_prefix(kMessage.size());
    header_.clear();
    StartBody(out);  // a body without a header: text
  } else {
    s.remove_prefix(marker.size());  // a stray end marker carries no text
  }
  return true;
}

void HarmonyParser::EmitBody(std::string_view t, std::vector<OutputEvent>* out) {
  if (t.empty()) return;
  switch (dest_) {
    case Dest::kText:
      AppendMerged(out, OutputEvent::Text(std::string(t)));
      return;
    case Dest::kReasoning:
      AppendMerged(out, OutputEvent::Reasoning(std::string(t)));
      return;
    case Dest::kToolCall: {
      args_.append(t);
      if (!begun_) return;
      if (!args_begun_) {
        // Leading whitespace is not sent: an empty body's arguments are {}.
        size_t i = 0;
        while (i < t.size() && IsJsonSpace(t[i])) ++i;
        t.remove_prefix(i);
        if (t.empty()) return;
        args_begun_ = true;
      }
      OutputEvent e = CallEvent(Kind::kToolCallArgs, index_);
      e.text = std::string(t);
      AppendMerged(out, std::move(e));
      return;
    }
  }
}

void HarmonyParser::EndMessage(std::vector<OutputEvent>* out) {
  if (dest_ != Dest::kToolCall) {
    dest_ = Dest::kText;
    return;
  }
  dest_ = Dest::kText;
  const bool empty = AllSpace(args_);
  const nlohmann::json j =
      empty ? nlohmann::json::object() : nlohmann::json::parse(args_, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    if (begun_) AppendMerged(out, CallEvent(Kind::kToolCallAbort, index_));
    AppendMerged(out, OutputEvent::Text(std::exchange(header_, {}) + std::string(kMessage) +
                                        std::exchange(args_, {})));
    begun_ = false;
    return;
  }
  if (!begun_) {
    index_ = next_index_++;
    OutputEvent e = CallEvent(Kind::kToolCallBegin, index_);
    e.id = ToolCallId(opts_.id_prefix, opts_.id_seed, index_);
    e.name = name_;
    AppendMerged(out, std::move(e));
    OutputEvent a = CallEvent(Kind::kToolCallArgs, index_);
    size_t i = 0;
    while (i < args_.size() && IsJsonSpace(args_[i])) ++i;
    a.text = empty ? "{}" : args_.substr(i);
    AppendMerged(out, std::move(a));
  } else if (empty) {
    OutputEvent a = CallEvent(Kind::kToolCallArgs, index_);
    a.text = "{}";
    AppendMerged(out, std::move(a));
  }
  AppendMerged(out, CallEvent(Kind::kToolCallEnd, index_));
  ++num_calls_;
  header_.clear();
  args_.clear();
  begun_ = false;
}

}  // namespace agentkv::text::output
