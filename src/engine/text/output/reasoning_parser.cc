#include "engine/text/output/reasoning_parser.h"

#include <utility>

#include "engine/text/output/partial_match.h"

namespace agentkv::text::output {

ReasoningParser::ReasoningParser(ReasoningParserOptions options)
    : opts_(std::move(options)), mode_(opts_.enabled ? Mode::kStart : Mode::kAnswer) {}

void ReasoningParser::EmitReasoning(std::string_view t, std::vector<OutputEvent>* out) {
  if (strip_leading_) {
    while (!t.empty() && IsJsonSpace(t.front())) t.remove_prefix(1);
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
  AppendMerged(out, OutputEvent::Reasoning(std::move(piece)));
}

void ReasoningParser::EmitAnswer(std::string_view t, std::vector<OutputEvent>* out) {
  if (strip_leading_) {
    while (!t.empty() && IsJsonSpace(t.front())) t.remove_prefix(1);
    if (t.empty()) return;
    strip_leading_ = false;
  }
  AppendMerged(out, OutputEvent::Text(std::string(t)));
}

void ReasoningParser::Feed(std::string_view text, std::vector<OutputEvent>* out) {
  if (mode_ == Mode::kAnswer && buf_.empty()) return EmitAnswer(text, out);
  buf_.append(text);
  Run(/*final=*/false, out);
}

void ReasoningParser::Finish(std::vector<OutputEvent>* out) {
  Run(/*final=*/true, out);
  ws_.clear();  // trailing whitespace of reasoning that never closed
}

void ReasoningParser::Run(bool final, std::vector<OutputEvent>* out) {
  std::string_view s = buf_;
  while (true) {
    if (mode_ == Mode::kStart) {
      size_t j = 0;
      while (j < s.size() && IsJsonSpace(s[j])) ++j;
      const std::string_view rest = s.substr(j);
      if (rest.starts_with(opts_.open_tag)) {
        s.remove_prefix(j + opts_.open_tag.size());
        mode_ = Mode::kReasoning;
        strip_leading_ = true;
        continue;
      }
      if (!final && std::string_view(opts_.open_tag).starts_with(rest)) break;  // undecided
      mode_ = opts_.starts_in_reasoning ? Mode::kReasoning : Mode::kAnswer;
      strip_leading_ = opts_.starts_in_reasoning;
      continue;
    }
    if (mode_ == Mode::kReasoning) {
      const size_t p = s.find(opts_.close_tag);
      if (p != std::string_view::npos) {
        EmitReasoning(s.substr(0, p), out);
        ws_.clear();
        s.remove_prefix(p + opts_.close_tag.size());
        mode_ = Mode::kAnswer;
        strip_leading_ = true;
        continue;
      }
      const size_t keep = final ? 0 : PartialSuffixLength(s, opts_.close_tag);
      EmitReasoning(s.substr(0, s.size() - keep), out);
      s.remove_prefix(s.size() - keep);
      break;
    }
    EmitAnswer(s, out);
    s = {};
    break;
  }
  buf_.erase(0, buf_.size() - s.size());
}

}  // namespace agentkv::text::output
