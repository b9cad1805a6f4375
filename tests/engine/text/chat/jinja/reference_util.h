// Helpers for tests that compare against Python jinja2: run a reference script
// with /usr/bin/python3 and read its JSON output; show where two strings differ.
#pragma once

#include <cstdio>
#include <string>

namespace agentkv::text::chat::jinja::testing {

inline constexpr const char* kPython = "/usr/bin/python3";

// True when Debian's python3 with jinja2 is installed.
inline bool HaveReferenceJinja() {
  std::string cmd = std::string(kPython) + " -c 'import jinja2' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

// Runs `args` with the reference python; returns stdout, or "" on failure.
inline std::string RunPython(const std::string& args) {
  std::string cmd = std::string(kPython) + " " + args;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "";
  std::string out;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  if (pclose(p) != 0) return "";
  return out;
}

// A readable account of the first difference between two renderings.
inline std::string FirstDiff(const std::string& want, const std::string& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  size_t from = i > 60 ? i - 60 : 0;
  auto show = [&](const std::string& s) {
    std::string part = s.substr(from, 120);
    std::string out;
    for (char c : part) {
      if (c == '\n')
        out += "\\n";
      else if (c == '\t')
        out += "\\t";
      else
        out += c;
    }
    return out;
  };
  return "first difference at byte " + std::to_string(i) + " (python " +
         std::to_string(want.size()) + " bytes, C++ " + std::to_string(got.size()) +
         " bytes)\n  python: ..." + show(want) + "\n  C++:    ..." + show(got);
}

}  // namespace agentkv::text::chat::jinja::testing
