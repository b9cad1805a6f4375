// SseParser: splits a Server-Sent-Events byte stream into events as the
// bytes arrive, in pieces of any size (a read may end inside a line).
// Handles "event:" and "data:" fields (several data lines are joined with
// '\n'), comments (": keep-alive"), and LF or CRLF line ends; an event ends
// at a blank line.
//
// Thread-safety: none; one parser per stream.
#pragma once

#include <string>
#include <vector>

namespace agentkv::loadgen {

struct SseEvent {
  std::string event;  // the "event:" field; empty when absent
  std::string data;
};

class SseParser {
 public:
  // Appends the events completed by `bytes` to `out`.
  void Feed(std::string_view bytes, std::vector<SseEvent>* out);

 private:
  void Line(std::string_view line, std::vector<SseEvent>* out);

  std::string partial_;  // an unfinished line
  SseEvent current_;
  bool has_data_ = false;
};

}  // namespace agentkv::loadgen
