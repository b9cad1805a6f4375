// ServedModel's pure helpers: the host-memory KV tier's default size and
// the --host-kv-memory syntax, from made-up MemAvailable numbers.
#include "api/served_model.h"

#include <gtest/gtest.h>

namespace agentkv::api {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;

TEST(HostKvMemoryTest, DefaultIsAQuarterOfAvailableCapped) {
  EXPECT_EQ(DefaultHostKvMemoryBytes(16 * kGiB), 4 * kGiB);
  EXPECT_EQ(DefaultHostKvMemoryBytes(100 * kGiB), 25 * kGiB);
  EXPECT_EQ(DefaultHostKvMemoryBytes(2000 * kGiB), 32 * kGiB);  // the cap
  EXPECT_EQ(DefaultHostKvMemoryBytes(1 * kGiB), 256 * kMiB);
  // Too little to be worth it (or MemAvailable unknown): off.
  EXPECT_EQ(DefaultHostKvMemoryBytes(1 * kGiB - 1), 0u);
  EXPECT_EQ(DefaultHostKvMemoryBytes(0), 0u);
}

TEST(HostKvMemoryTest, ParsesBytesFractionsAndOff) {
  const uint64_t avail = 64 * kGiB;
  EXPECT_EQ(*ParseHostKvMemory("0", avail), 0u);
  EXPECT_EQ(*ParseHostKvMemory("512M", avail), 512 * kMiB);
  EXPECT_EQ(*ParseHostKvMemory("8G", avail), 8 * kGiB);
  EXPECT_EQ(*ParseHostKvMemory("64k", avail), 64 * 1024u);
  EXPECT_EQ(*ParseHostKvMemory("1048576", avail), kMiB);
  EXPECT_EQ(*ParseHostKvMemory("0.25", avail), 16 * kGiB);
  EXPECT_EQ(*ParseHostKvMemory("0.5", 10 * kGiB), 5 * kGiB);
  EXPECT_EQ(*ParseHostKvMemory("1.5G", avail), 3 * kGiB / 2);
}

TEST(HostKvMemoryTest, RefusesWhatIsNotASize) {
  for (const char* bad : {"", "x", "-1", "-0.5", "12X", "1.5", "4GBs", "G"}) {
    auto r = ParseHostKvMemory(bad, 64 * kGiB);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    }
  }
}

TEST(RequestFieldsTest, IntegersOutOfRangeAre400NotConverted) {
  using nlohmann::json;
  std::optional<int64_t> v;
  for (const char* body : {R"({"max_tokens":1e300})", R"({"max_tokens":18446744073709551615})",
                           R"({"max_tokens":9.3e18})", R"({"max_tokens":-1e300})"}) {
    v.reset();
    const Status s = GetOptionalInt(json::parse(body), "max_tokens", &v);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << body;
    EXPECT_FALSE(v.has_value()) << body;
  }
  EXPECT_EQ(GetOptionalInt(json::parse(R"({"max_tokens":-2})"), "max_tokens", &v).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(GetOptionalInt(json::parse(R"({"max_tokens":2.5})"), "max_tokens", &v).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(GetOptionalInt(json::parse(R"({"max_tokens":64.0})"), "max_tokens", &v).ok());
  EXPECT_EQ(v, 64);
  ASSERT_TRUE(
      GetOptionalInt(json::parse(R"({"max_tokens":9223372036854775807})"), "max_tokens", &v).ok());
  EXPECT_EQ(v, std::numeric_limits<int64_t>::max());  // in range: callers clamp it

  engine::SamplingParams p;
  EXPECT_EQ(ParseSampling(json::parse(R"({"top_k":10000000000})"), "stop", &p).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseSampling(json::parse(R"({"top_k":-2})"), "stop", &p).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseSampling(json::parse(R"({"top_k":1e300})"), "stop", &p).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(
      ParseSampling(json::parse(R"({"top_k":-1,"seed":18446744073709551615})"), "stop", &p).ok());
  EXPECT_EQ(p.top_k, -1);
  EXPECT_EQ(p.seed, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(ParseSampling(json::parse(R"({"temperature":1e300})"), "stop", &p).code(),
            StatusCode::kInvalidArgument);
  // The speculative-decoding opt-out: a boolean, on unless false.
  engine::SamplingParams q;
  EXPECT_TRUE(q.speculative);
  ASSERT_TRUE(ParseSampling(json::parse(R"({"speculative":false})"), "stop", &q).ok());
  EXPECT_FALSE(q.speculative);
  EXPECT_EQ(ParseSampling(json::parse(R"({"speculative":"no"})"), "stop", &q).code(),
            StatusCode::kInvalidArgument);
}

TEST(RequestFieldsTest, HighPriorityOnlyForTenantsAllowedIt) {
  HttpRequest req;
  req.headers["x-priority"] = "high";
  EXPECT_EQ(*ServedModel::RequestPriority(req, nlohmann::json::object()), engine::Priority::kHigh);
  req.high_priority_allowed = false;
  EXPECT_EQ(*ServedModel::RequestPriority(req, nlohmann::json::object()),
            engine::Priority::kNormal);
  req.headers.clear();
  EXPECT_EQ(*ServedModel::RequestPriority(req, nlohmann::json{{"priority", "high"}}),
            engine::Priority::kNormal);
  EXPECT_EQ(*ServedModel::RequestPriority(req, nlohmann::json{{"priority", "low"}}),
            engine::Priority::kLow);
}

}  // namespace
}  // namespace agentkv::api
