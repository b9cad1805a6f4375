// What a render leaves behind: nothing. Macros capture the frame they are
// defined in (and are stored in it), namespaces can hold themselves, and a
// loop variable stored in a namespace holds the loop's items; each is a
// reference cycle the interpreter must break when the render ends, or every
// request rendered with such a template leaks (found by fuzz/jinja_template_fuzz).
// A context value the template references must be released with the
// context: its use count tells whether anything of the render survived.
#include "engine/text/chat/jinja/interpreter.h"

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "engine/text/chat/jinja/template.h"

namespace agentkv::text::chat::jinja {
namespace {

struct Outcome {
  Result<std::string> rendered;
  long leftover_refs;  // references to the context value after the render
};

// Renders `source` with a context {"d": <a dict>} and reports how many
// references to that dict remain once the context is gone (0: none).
Outcome RenderAndCount(const std::string& source) {
  auto t = Template::Parse(source);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  auto d = std::make_shared<DictObj>();
  d->Set(Value::Str("k"), Value::Str("v"));
  Result<std::string> out = InvalidArgument("not rendered");
  {
    auto ctx = std::make_shared<DictObj>();
    ctx->Set(Value::Str("d"), Value::MakeDict(d));
    out = t->Render(Value::MakeDict(ctx));
  }
  return {std::move(out), d.use_count() - 1};
}

TEST(InterpreterTest, MacroCapturingItsFrameIsFreed) {
  auto r = RenderAndCount("{% macro f(x) %}{{ x }}{{ d.k }}{% endmacro %}{{ f(1) }}");
  ASSERT_TRUE(r.rendered.ok()) << r.rendered.status().ToString();
  EXPECT_EQ(*r.rendered, "1v");
  EXPECT_EQ(r.leftover_refs, 0);
}

TEST(InterpreterTest, CallerBlockIsFreed) {
  auto r = RenderAndCount(
      "{% macro m() %}[{{ caller() }}]{% endmacro %}{% call m() %}{{ d.k }}{% endcall %}");
  ASSERT_TRUE(r.rendered.ok()) << r.rendered.status().ToString();
  EXPECT_EQ(*r.rendered, "[v]");
  EXPECT_EQ(r.leftover_refs, 0);
}

TEST(InterpreterTest, NamespaceHoldingItselfIsFreed) {
  auto r = RenderAndCount("{% set ns = namespace() %}{% set ns.me = ns %}{% set ns.d = d %}ok");
  ASSERT_TRUE(r.rendered.ok()) << r.rendered.status().ToString();
  EXPECT_EQ(*r.rendered, "ok");
  EXPECT_EQ(r.leftover_refs, 0);
}

TEST(InterpreterTest, LoopStoredInTheNamespaceItIteratesIsFreed) {
  auto r = RenderAndCount(
      "{% set ns = namespace(d=d) %}{% for x in [ns] %}{% set ns.l = loop %}{% endfor %}ok");
  ASSERT_TRUE(r.rendered.ok()) << r.rendered.status().ToString();
  EXPECT_EQ(r.leftover_refs, 0);
}

TEST(InterpreterTest, FailedRenderIsFreedToo) {
  auto r = RenderAndCount(
      "{% macro f() %}{{ d.k }}{% endmacro %}{% set ns = namespace(me=none) %}"
      "{% set ns.me = ns %}{{ raise_exception('stop') }}");
  EXPECT_FALSE(r.rendered.ok());
  EXPECT_EQ(r.leftover_refs, 0);
}

// Breaking cycles happens only when the render ends: a macro that outlives
// the loop frame it captured still sees that frame's variables.
TEST(InterpreterTest, MacroKeepsItsFrameForTheWholeRender) {
  auto r = RenderAndCount(
      "{% set ns = namespace() %}{% for i in [1, 2] %}{% macro g() %}{{ i }}{{ d.k }}"
      "{% endmacro %}{% set ns.g = g %}{% endfor %}{{ ns.g() }}");
  ASSERT_TRUE(r.rendered.ok()) << r.rendered.status().ToString();
  EXPECT_EQ(*r.rendered, "2v");
  EXPECT_EQ(r.leftover_refs, 0);
}

// Many macros defined in a loop: each iteration's frame is captured once;
// the tracking list stays bounded (expired frames are dropped) and the
// output is unchanged.
TEST(InterpreterTest, ManyMacroDefinitionsRender) {
  auto r = RenderAndCount(
      "{% for i in range(5000) %}{% macro g() %}{{ i }}{% endmacro %}{% endfor %}{{ g is defined "
      "}}");
  ASSERT_TRUE(r.rendered.ok()) << r.rendered.status().ToString();
  EXPECT_EQ(r.leftover_refs, 0);
}

}  // namespace
}  // namespace agentkv::text::chat::jinja
