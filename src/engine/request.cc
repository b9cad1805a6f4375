#include "engine/request.h"

#include <algorithm>
#include <cctype>

namespace agentkv::engine {

Result<Priority> ParsePriority(std::string_view text) {
  std::string t(text);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (t == "high") return Priority::kHigh;
  if (t == "normal") return Priority::kNormal;
  if (t == "low") return Priority::kLow;
  return InvalidArgument("priority must be high, normal or low, not '" + std::string(text) + "'");
}

std::string_view PriorityName(Priority p) {
  switch (p) {
    case Priority::kHigh:
      return "high";
    case Priority::kNormal:
      return "normal";
    case Priority::kLow:
      return "low";
  }
  return "normal";
}

std::string_view CacheSourceName(CacheSource s) {
  switch (s) {
    case CacheSource::kNone:
      return "none";
    case CacheSource::kResident:
      return "resident";
    case CacheSource::kHost:
      return "host";
    case CacheSource::kDisk:
      return "disk";
  }
  return "none";
}

}  // namespace agentkv::engine
