// The jinja engine against Python jinja2 (configured as transformers does) on
// a catalogue of snippets, plus the limits that stop runaway templates.
#include "engine/text/chat/jinja/template.h"

#include <gtest/gtest.h>

#include "reference_util.h"

namespace agentkv::text::chat::jinja {
namespace {

constexpr int64_t kFixedTimestamp = 1722001506;  // hf_env.FIXED_TIMESTAMP

RenderOptions FixedClock() {
  RenderOptions o;
  o.clock = [] { return std::chrono::system_clock::from_time_t(kFixedTimestamp); };
  return o;
}

// Runs a reference script that prints [{template, context, output|error}] and
// renders every case here; reports the first mismatches.
void CompareWithReference(const std::string& script_and_args, size_t min_cases) {
  if (!testing::HaveReferenceJinja()) GTEST_SKIP() << "python3-jinja2 is not installed";
  std::string out = testing::RunPython(std::string(AGENTKV_SOURCE_DIR) + "/tests/reference/jinja/" +
                                       script_and_args);
  ASSERT_FALSE(out.empty()) << script_and_args << " failed";
  auto cases = nlohmann::ordered_json::parse(out);
  ASSERT_GE(cases.size(), min_cases);
  int failures = 0;
  for (const auto& c : cases) {
    if (failures >= 15) break;
    const std::string src = c["template"];
    Result<std::string> got = [&]() -> Result<std::string> {
      auto t = Template::Parse(src);
      if (!t.ok()) return t.status();
      return t->Render(c["context"], FixedClock());
    }();
    if (c.contains("output")) {
      const std::string want = c["output"];
      if (!got.ok()) {
        ADD_FAILURE() << "template: " << src
                      << "\npython rendered it, C++ failed: " << got.status().ToString();
        ++failures;
      } else if (*got != want) {
        ADD_FAILURE() << "template: " << src << "\n" << testing::FirstDiff(want, *got);
        ++failures;
      }
    } else if (got.ok()) {
      ADD_FAILURE() << "template: " << src << "\npython failed (" << c["error"].get<std::string>()
                    << ") but C++ rendered: " << *got;
      ++failures;
    }
  }
  EXPECT_EQ(failures, 0) << "of " << cases.size() << " cases";
}

TEST(TemplateTest, SnippetsMatchPythonJinja2) { CompareWithReference("render_snippets.py", 100); }

TEST(TemplateTest, RandomExpressionsMatchPythonJinja2) {
  CompareWithReference("random_expressions.py --seed 99 --count 1500", 1500);
}

Result<std::string> RenderSource(const std::string& src, const RenderOptions& opts = {}) {
  auto t = Template::Parse(src);
  if (!t.ok()) return t.status();
  return t->Render(nlohmann::ordered_json::object(), opts);
}

TEST(TemplateTest, SyntaxErrorNamesTheLine) {
  auto r = RenderSource("line one\n{% if true %}\n{{ 1 + }}\n{% endif %}");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("line 3"), std::string::npos) << r.status().ToString();
}

TEST(TemplateTest, UnknownFilterNamesTheLine) {
  auto r = RenderSource("a\nb\n{{ 'x' | frobnicate }}");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("line 3"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("frobnicate"), std::string::npos);
}

TEST(TemplateTest, RaiseExceptionCarriesMessageAndLine) {
  auto r = RenderSource("\n\n\n{{ raise_exception('roles must alternate') }}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("roles must alternate"), std::string::npos);
  EXPECT_NE(r.status().message().find("line 4"), std::string::npos) << r.status().ToString();
}

TEST(TemplateTest, EndlessRecursionIsStopped) {
  auto r = RenderSource("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
}

TEST(TemplateTest, HugeOutputIsStopped) {
  RenderOptions opts;
  opts.limits.max_output_bytes = 1 << 20;
  auto r = RenderSource(
      "{% for i in range(100000) %}{% for j in range(100) %}xxxxxxxxxxxxxxxx{% endfor %}{% endfor "
      "%}",
      opts);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
}

TEST(TemplateTest, StepLimitStopsLongLoops) {
  RenderOptions opts;
  opts.limits.max_steps = 10000;
  auto r = RenderSource("{% for i in range(100000) %}{% endfor %}", opts);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
}

TEST(TemplateTest, DeeplyNestedSourceIsRejectedNotCrashed) {
  std::string src = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  auto r = RenderSource(src);
  EXPECT_FALSE(r.ok());
}

TEST(TemplateTest, ParseOnceRenderMany) {
  auto t = Template::Parse("{{ greeting }}, {{ name }}!");
  ASSERT_TRUE(t.ok());
  for (std::string name : {"a", "b"}) {
    auto r = t->Render(nlohmann::ordered_json{{"greeting", "hi"}, {"name", name}});
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(*r, "hi, " + name + "!");
  }
}

}  // namespace
}  // namespace agentkv::text::chat::jinja
