// Token ids and decoded text must equal transformers.js's on a seeded corpus
// of varied strings (tests/reference/tokenizer/corpus.js), for every
// tokenizer set-up installed under data/tokenizers.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "engine/text/tokenizer.h"

namespace agentkv::text {
namespace {

namespace fs = std::filesystem;

const fs::path kSource = AGENTKV_SOURCE_DIR;
const fs::path kData = AGENTKV_DATA_DIR;
constexpr int kCount = 5000;

std::string Escape(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\r')
      out += "\\r";
    else if (c < 0x20)
      out += "\\x" + std::string(1, "0123456789abcdef"[c >> 4]) + "0123456789abcdef"[c & 15];
    else
      out.push_back(static_cast<char>(c));
  }
  return out;
}

std::string Ids(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s + "]";
}

bool HaveNode() { return std::system("node --version >/dev/null 2>&1") == 0; }

class TokenizerReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerReferenceTest, MatchesTransformersJs) {
  const fs::path dir = kData / "tokenizers" / GetParam();
  const fs::path modules = kSource / "tools/npm/node_modules/@lenml/tokenizers";
  const fs::path script = kSource / "tests/reference/tokenizer/reference.js";
  if (!HaveNode()) GTEST_SKIP() << "node is not installed: reference test skipped";
  if (!fs::exists(modules)) GTEST_SKIP() << modules << " missing (run scripts/setup.sh)";
  if (!fs::exists(dir / "tokenizer.json")) GTEST_SKIP() << dir << " missing (run scripts/setup.sh)";

  auto tok = Tokenizer::Load(dir / "tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();

  std::string cmd = "node '" + script.string() + "' --tokenizer-dir '" + dir.string() +
                    "' --count " + std::to_string(kCount) + " --seed 1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr) << cmd;
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  int rc = pclose(pipe);
  ASSERT_EQ(rc, 0) << "reference script failed: " << cmd;
  nlohmann::json ref = nlohmann::json::parse(out);
  const auto& cases = ref.at("cases");
  ASSERT_EQ(cases.size(), static_cast<size_t>(kCount));

  int id_mismatches = 0, decode_mismatches = 0, checked_special = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    const std::string text = c.at("text").get<std::string>();
    const auto want = c.at("ids").get<std::vector<int32_t>>();
    const auto got = (*tok)->Encode(text, false);
    if (got != want && ++id_mismatches <= 5) {
      ADD_FAILURE() << GetParam() << " case " << i << " text \"" << Escape(text) << "\"\n  want "
                    << Ids(want) << "\n  got  " << Ids(got);
    }
    const std::string decoded = (*tok)->Decode(want, false);
    if (decoded != c.at("decoded").get<std::string>() && ++decode_mismatches <= 5) {
      ADD_FAILURE() << GetParam() << " case " << i << " decode of " << Ids(want) << "\n  want \""
                    << Escape(c["decoded"].get<std::string>()) << "\"\n  got  \"" << Escape(decoded)
                    << "\"";
    }
    if (c.contains("ids_special")) {
      ++checked_special;
      const auto want_special = c["ids_special"].get<std::vector<int32_t>>();
      const auto got_special = (*tok)->Encode(text, true);
      if (got_special != want_special && ++id_mismatches <= 5) {
        ADD_FAILURE() << GetParam() << " case " << i << " (add_special_tokens) text \""
                      << Escape(text) << "\"\n  want " << Ids(want_special) << "\n  got  "
                      << Ids(got_special);
      }
      const std::string skip = (*tok)->Decode(want_special, true);
      if (skip != c["decoded_skip"].get<std::string>() && ++decode_mismatches <= 5) {
        ADD_FAILURE() << GetParam() << " case " << i << " decode(skip_special) of "
                      << Ids(want_special) << "\n  want \""
                      << Escape(c["decoded_skip"].get<std::string>()) << "\"\n  got  \""
                      << Escape(skip) << "\"";
      }
    }
  }
  EXPECT_EQ(id_mismatches, 0) << "of " << cases.size() << " strings";
  EXPECT_EQ(decode_mismatches, 0) << "of " << cases.size() << " strings";
  EXPECT_GT(checked_special, 0);
}

INSTANTIATE_TEST_SUITE_P(AllTokenizers, TokenizerReferenceTest,
                         ::testing::Values("qwen3", "llama3_1", "gemma3", "deepseek_v3", "gptoss"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace agentkv::text
