#include "util/system_memory.h"

#include <charconv>
#include <fstream>
#include <sstream>
#include <string>

namespace agentkv {

Result<uint64_t> ParseMemAvailable(std::string_view meminfo) {
  constexpr std::string_view kKey = "MemAvailable:";
  size_t at = 0;
  while (at < meminfo.size()) {
    size_t end = meminfo.find('\n', at);
    if (end == std::string_view::npos) end = meminfo.size();
    std::string_view line = meminfo.substr(at, end - at);
    at = end + 1;
    if (line.substr(0, kKey.size()) != kKey) continue;
    line.remove_prefix(kKey.size());
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    uint64_t kib = 0;
    const auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), kib);
    if (ec != std::errc() || p == line.data()) {
      return InvalidArgument("meminfo: bad MemAvailable line");
    }
    std::string_view unit(p, static_cast<size_t>(line.data() + line.size() - p));
    while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
    if (unit != "kB") return InvalidArgument("meminfo: MemAvailable is not in kB");
    return kib * 1024;
  }
  return NotFound("meminfo: no MemAvailable line");
}

Result<uint64_t> AvailableHostMemoryBytes() {
  std::ifstream in("/proc/meminfo");
  if (!in) return IoError("cannot read /proc/meminfo");
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseMemAvailable(ss.str());
}

}  // namespace agentkv
