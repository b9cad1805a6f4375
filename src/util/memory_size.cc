#include "util/memory_size.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace agentkv {

Result<MemorySize> ParseMemorySize(std::string_view text, std::string_view flag) {
  const std::string s(text);
  auto bad = [&] {
    return InvalidArgument("bad " + std::string(flag) + " '" + s +
                           "': give bytes (K/M/G/T suffixes) or a share such as 0.9");
  };
  if (s.empty()) return bad();
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !std::isfinite(v) || v < 0) return bad();
  double mult = 1;
  bool suffix = true;
  switch (*end) {
    case 'k':
    case 'K':
      mult = 1024.0;
      break;
    case 'm':
    case 'M':
      mult = 1024.0 * 1024;
      break;
    case 'g':
    case 'G':
      mult = 1024.0 * 1024 * 1024;
      break;
    case 't':
    case 'T':
      mult = 1024.0 * 1024 * 1024 * 1024;
      break;
    case '\0':
      suffix = false;
      break;
    default:
      return bad();
  }
  if (suffix) {
    ++end;
    if (*end == 'i' || *end == 'I') ++end;
    if (*end == 'b' || *end == 'B') ++end;
  }
  if (*end != '\0') return bad();
  MemorySize out;
  if (v == 0) {
    out.is_zero = true;
    return out;
  }
  // Without a suffix, a number with a point is a share; one without is bytes.
  if (!suffix && s.find('.') != std::string::npos) {
    if (v > 1) return bad();
    out.fraction = v;
    return out;
  }
  const long double bytes = static_cast<long double>(v) * mult;
  if (bytes >= 18446744073709551615.0L) return bad();
  out.bytes = static_cast<uint64_t>(bytes);
  if (out.bytes == 0) return bad();
  return out;
}

std::string FormatBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f %s", v, units[u]);
  }
  return buf;
}

}  // namespace agentkv
