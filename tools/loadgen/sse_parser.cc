#include "sse_parser.h"

namespace agentkv::loadgen {

void SseParser::Feed(std::string_view bytes, std::vector<SseEvent>* out) {
  size_t start = 0;
  while (start < bytes.size()) {
    const size_t nl = bytes.find('\n', start);
    if (nl == std::string_view::npos) {
      partial_.append(bytes.substr(start));
      return;
    }
    std::string_view line = bytes.substr(start, nl - start);
    start = nl + 1;
    if (!partial_.empty()) {
      partial_.append(line);
      const std::string whole = std::move(partial_);
      partial_.clear();
      Line(whole, out);
    } else {
      Line(line, out);
    }
  }
}

void SseParser::Line(std::string_view line, std::vector<SseEvent>* out) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.empty()) {
    // A blank line dispatches the event, if it carried anything.
    if (has_data_ || !current_.event.empty()) out->push_back(std::move(current_));
    current_ = SseEvent();
    has_data_ = false;
    return;
  }
  if (line.front() == ':') return;  // a comment
  const size_t colon = line.find(':');
  std::string_view field = line.substr(0, colon);
  std::string_view value =
      colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (field == "data") {
    if (has_data_) current_.data += '\n';
    current_.data.append(value);
    has_data_ = true;
  } else if (field == "event") {
    current_.event = std::string(value);
  }
}

}  // namespace agentkv::loadgen
