// ProposeNgramDraft: drafts looked up in the sequence's own tokens.
#include "engine/ngram_draft.h"

#include <gtest/gtest.h>

#include <vector>

namespace agentkv::engine {
namespace {

using V = std::vector<int32_t>;

TEST(NgramDraftTest, ProposesWhatFollowedTheLastOccurrenceOfTheSuffix) {
  // "1 2 3 4 5 6 ... 1 2 3": the suffix 1 2 3 was followed by 4 5 6.
  const V t = {1, 2, 3, 4, 5, 6, 9, 9, 1, 2, 3};
  EXPECT_EQ(ProposeNgramDraft(t, 3), (V{4, 5, 6}));
  EXPECT_EQ(ProposeNgramDraft(t, 1), (V{4}));
  EXPECT_EQ(ProposeNgramDraft(t, 0), V{});
}

TEST(NgramDraftTest, ARepeatingPatternIsDraftedPastTheEnd) {
  // Suffix 8 7 8 last occurs at 1..3; then 7 8 follow, then (reading on
  // into the draft) 7 8 7.
  const V t = {7, 8, 7, 8, 7, 8};
  EXPECT_EQ(ProposeNgramDraft(t, 5), (V{7, 8, 7, 8, 7}));
  // A run of one token: the match just before the end, drafted on.
  EXPECT_EQ(ProposeNgramDraft(V{1, 2, 5, 5, 5, 5}, 4), (V{5, 5, 5, 5}));
}

TEST(NgramDraftTest, PrefersTheLongestSuffixThenTheMostRecentMatch) {
  // Suffix "5 6": the 2-gram 5 6 occurs at 0 (followed by 1) and the
  // 1-gram 6 more recently (followed by 2); the 3-gram 4 5 6 nowhere else.
  const V t = {5, 6, 1, 6, 2, 4, 5, 6};
  EXPECT_EQ(ProposeNgramDraft(t, 2), (V{1, 6}));
  // With 1-grams only, the most recent 6 (at 3) wins.
  NgramDraftOptions o;
  o.max_ngram = 1;
  EXPECT_EQ(ProposeNgramDraft(t, 2, o), (V{2, 4}));
  // Two earlier occurrences of the 2-gram: the later one wins.
  const V u = {5, 6, 1, 5, 6, 2, 5, 6};
  EXPECT_EQ(ProposeNgramDraft(u, 1), (V{2}));
}

TEST(NgramDraftTest, NothingWithoutAMatchOrTooFewTokens) {
  EXPECT_EQ(ProposeNgramDraft(V{1, 2, 3, 4}, 4), V{});
  EXPECT_EQ(ProposeNgramDraft(V{1}, 4), V{});
  EXPECT_EQ(ProposeNgramDraft(V{}, 4), V{});
  NgramDraftOptions o;
  o.min_ngram = 2;  // 1-grams are not looked up
  EXPECT_EQ(ProposeNgramDraft(V{3, 9, 1, 3}, 4, o), V{});
  EXPECT_EQ(ProposeNgramDraft(V{3, 9, 1, 3}, 4), (V{9, 1, 3, 9}));
}

TEST(NgramDraftTest, OnlyTheLookbackWindowIsSearched) {
  V t = {1, 2, 42};
  for (int i = 0; i < 100; ++i) t.push_back(7);
  t.push_back(1);
  t.push_back(2);
  NgramDraftOptions o;
  EXPECT_EQ(ProposeNgramDraft(t, 1, o), (V{42}));
  o.max_lookback = 50;  // the match at 0 is outside
  EXPECT_EQ(ProposeNgramDraft(t, 1, o), V{});
}

}  // namespace
}  // namespace agentkv::engine
