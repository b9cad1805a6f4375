#include "engine/stop_checker.h"

#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace agentkv::engine {
namespace {

constexpr int32_t kEos = 2;
constexpr int32_t kText = 100;  // any ordinary token id

SamplingParams WithStops(std::vector<std::string> stops) {
  SamplingParams p;
  p.stop = std::move(stops);
  return p;
}

struct FedText {
  std::string text;
  StopUpdate last;
  std::vector<std::string> emitted;  // per piece
};

FedText Feed(StopChecker& c, const std::vector<std::string>& pieces) {
  FedText r;
  for (const std::string& piece : pieces) {
    r.last = c.Append(kText, piece);
    r.emitted.push_back(r.last.text);
    r.text += r.last.text;
    if (r.last.finish != FinishReason::kNone) break;
  }
  return r;
}

TEST(StopCheckerTest, StopStringAcrossPiecesIsExcludedAndHeldBack) {
  const std::vector<int32_t> eos = {kEos};
  StopChecker c(WithStops({"</end>"}), eos);
  FedText r = Feed(c, {"Hello ", "wor", "ld</", "en", "d> tail"});
  EXPECT_EQ(r.text, "Hello world");
  EXPECT_EQ(r.emitted, (std::vector<std::string>{"Hello ", "wor", "ld", "", ""}));
  EXPECT_EQ(r.last.finish, FinishReason::kStop);
  EXPECT_EQ(r.last.stop_string_index, 0);
  EXPECT_EQ(r.last.stop_token_id, -1);
  EXPECT_TRUE(c.finished());
  // Later calls keep reporting the finish and emit nothing.
  StopUpdate after = c.Append(kText, "more");
  EXPECT_EQ(after.finish, FinishReason::kStop);
  EXPECT_EQ(after.text, "");
}

TEST(StopCheckerTest, HeldPrefixIsReleasedWhenItIsNotAStop) {
  const std::vector<int32_t> eos = {kEos};
  StopChecker c(WithStops({"STOP"}), eos);
  EXPECT_EQ(c.Append(kText, "a S").text, "a ");
  EXPECT_EQ(c.Append(kText, "T").text, "");
  EXPECT_EQ(c.Append(kText, "OP").finish, FinishReason::kStop);

  StopChecker d(WithStops({"STOP"}), eos);
  EXPECT_EQ(d.Append(kText, "a ST").text, "a ");
  EXPECT_EQ(d.Append(kText, "ORY S").text, "STORY ");  // "STO" was not it; "S" again might be
  StopUpdate u = d.Append(kText, "Sx");
  EXPECT_EQ(u.text, "SSx");
  EXPECT_EQ(u.finish, FinishReason::kNone);
}

TEST(StopCheckerTest, OverlappingPrefixKeepsTheLongestCandidate) {
  const std::vector<int32_t> eos;
  StopChecker c(WithStops({"aab"}), eos);
  EXPECT_EQ(c.Append(kText, "xaa").text, "x");
  EXPECT_EQ(c.Append(kText, "a").text, "a");  // "aaa": only the last "aa" can still start "aab"
  StopUpdate u = c.Append(kText, "b!");
  EXPECT_EQ(u.text, "");
  EXPECT_EQ(u.finish, FinishReason::kStop);
}

TEST(StopCheckerTest, FirstCompletedStopWinsRegardlessOfSplit) {
  const std::vector<int32_t> eos;
  for (auto pieces : std::vector<std::vector<std::string>>{{"xabcd"}, {"x", "a", "b", "c", "d"}}) {
    StopChecker c(WithStops({"abcd", "bc"}), eos);
    FedText r = Feed(c, pieces);
    EXPECT_EQ(r.text, "xa");
    EXPECT_EQ(r.last.stop_string_index, 1);
  }
  // Same end: the one starting first.
  StopChecker c(WithStops({"c", "abc"}), eos);
  FedText r = Feed(c, {"xab", "c"});
  EXPECT_EQ(r.text, "x");
  EXPECT_EQ(r.last.stop_string_index, 1);
}

TEST(StopCheckerTest, EosAndStopTokens) {
  const std::vector<int32_t> eos = {kEos, 7};
  {
    StopChecker c(WithStops({"zz"}), eos);
    EXPECT_EQ(c.Append(kText, "hi z").text, "hi ");
    StopUpdate u = c.Append(7, "<eos>");
    EXPECT_EQ(u.finish, FinishReason::kStop);
    EXPECT_EQ(u.stop_token_id, 7);
    EXPECT_EQ(u.text, "z");  // held text is released, the EOS text is not
  }
  {
    SamplingParams p;
    p.ignore_eos = true;
    p.stop_token_ids = {9};
    StopChecker c(p, eos);
    EXPECT_EQ(c.Append(kEos, "<eos>").finish, FinishReason::kNone);
    StopUpdate u = c.Append(9, "<x>");
    EXPECT_EQ(u.finish, FinishReason::kStop);
    EXPECT_EQ(u.stop_token_id, 9);
  }
}

TEST(StopCheckerTest, MaxTokensReleasesHeldText) {
  SamplingParams p = WithStops({"###"});
  p.max_tokens = 3;
  const std::vector<int32_t> eos = {kEos};
  StopChecker c(p, eos);
  EXPECT_EQ(c.Append(kText, "a").text, "a");
  EXPECT_EQ(c.Append(kText, "b#").text, "b");
  StopUpdate u = c.Append(kText, "#");
  EXPECT_EQ(u.finish, FinishReason::kLength);
  EXPECT_EQ(u.text, "##");
  EXPECT_EQ(c.num_tokens(), 3);
  EXPECT_EQ(FinishReasonName(u.finish), "length");

  // A stop string completed by the last allowed token is a stop.
  StopChecker d(p, eos);
  Feed(d, {"x", "#"});
  StopUpdate v = d.Append(kText, "##");
  EXPECT_EQ(v.finish, FinishReason::kStop);
  EXPECT_EQ(v.text, "");
}

TEST(StopCheckerTest, FlushReturnsHeldText) {
  const std::vector<int32_t> eos;
  StopChecker c(WithStops({"<|im_end|>"}), eos);
  EXPECT_EQ(c.Append(kText, "done <|im").text, "done ");
  EXPECT_EQ(c.Flush(), "<|im");
  EXPECT_EQ(c.Flush(), "");
}

// For random texts, stops and splits: the emitted text is always the text
// up to the first completed stop, never more, and the same for every split.
TEST(StopCheckerTest, RandomSplitsAgreeWithDirectSearch) {
  std::mt19937 g(2024);
  const std::string alphabet = "ab c\xc3\xa9";  // includes a 2-byte UTF-8 char
  auto rand_str = [&](int lo, int hi) {
    std::string s;
    int n = std::uniform_int_distribution<int>(lo, hi)(g);
    for (int i = 0; i < n; ++i) {
      int k = std::uniform_int_distribution<int>(0, 4)(g);
      s += k == 4 ? std::string("\xc3\xa9") : std::string(1, alphabet[static_cast<size_t>(k)]);
    }
    return s;
  };
  const std::vector<int32_t> eos;
  for (int iter = 0; iter < 500; ++iter) {
    std::vector<std::string> stops = {rand_str(1, 3), rand_str(2, 4)};
    std::string text = rand_str(0, 40);
    // Expected: the earliest end of any stop, ties by earliest start.
    size_t cut = text.size();
    bool stopped = false;
    size_t best_end = std::string::npos;
    for (const std::string& s : stops) {
      size_t pos = text.find(s);
      if (pos == std::string::npos) continue;
      size_t end = pos + s.size();
      if (!stopped || end < best_end || (end == best_end && pos < cut)) {
        best_end = end;
        cut = pos;
        stopped = true;
      }
    }
    const std::string expected = text.substr(0, cut);
    for (int split = 0; split < 5; ++split) {
      // Split on UTF-8 character boundaries, as the detokenizer does.
      std::vector<std::string> pieces;
      std::string cur;
      for (size_t i = 0; i < text.size(); ++i) {
        cur += text[i];
        bool boundary = i + 1 == text.size() || (text[i + 1] & 0xC0) != 0x80;
        if (boundary && std::uniform_int_distribution<int>(0, 2)(g) == 0) {
          pieces.push_back(cur);
          cur.clear();
        }
      }
      if (!cur.empty()) pieces.push_back(cur);
      StopChecker c(WithStops(stops), eos);
      FedText r = Feed(c, pieces);
      if (!stopped) r.text += c.Flush();
      ASSERT_EQ(r.text, expected) << "text=" << text << " stops=" << stops[0] << "|" << stops[1];
      EXPECT_EQ(r.last.finish == FinishReason::kStop, stopped);
    }
  }
}

}  // namespace
}  // namespace agentkv::engine
