// FinishReasonName: the strings the OpenAI-style APIs send as finish_reason.
#include "engine/finish_reason.h"

#include <gtest/gtest.h>

namespace agentkv::engine {
namespace {

TEST(FinishReasonTest, NamesAreTheOpenAiStrings) {
  EXPECT_EQ(FinishReasonName(FinishReason::kStop), "stop");
  EXPECT_EQ(FinishReasonName(FinishReason::kLength), "length");
}

TEST(FinishReasonTest, NotFinishedHasNoName) {
  EXPECT_EQ(FinishReasonName(FinishReason::kNone), "");
}

}  // namespace
}  // namespace agentkv::engine
