#include "engine/grammar/think_grammar.h"

#include "engine/grammar/text_without.h"

namespace agentkv::grammar {
namespace {

constexpr std::string_view kOpenTag = "<think>";
constexpr std::string_view kCloseTag = "</think>";
constexpr int kMaxGapWhitespace = 4;

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

}  // namespace

ThinkStart ThinkStartOf(std::string_view prompt) {
  while (!prompt.empty() && IsSpace(prompt.back())) prompt.remove_suffix(1);
  if (prompt.ends_with(kCloseTag)) return ThinkStart::kNone;
  if (prompt.ends_with(kOpenTag)) return ThinkStart::kOpen;
  return ThinkStart::kMayOpen;
}

Result<std::shared_ptr<const Grammar>> CompileThinkThenGrammar(
    const Grammar& content, ThinkStart start, std::shared_ptr<const TokenVocabulary> vocab,
    GrammarLimits limits) {
  if (start == ThinkStart::kNone)
    return InvalidArgument("a reasoning block needs a prompt that leaves room for one");
  GrammarBuilder b(limits);
  const int32_t root = b.NewNode(), answer = b.NewNode(), end = b.NewNode();
  b.MarkEnd(end);
  // The reasoning text, then the closing tag, whitespace and the answer.
  const int32_t body = b.NewNode(), close = b.NewNode(), after = b.NewNode();
  TextWithout(b, kCloseTag, body, close, /*reasoning=*/true);
  b.AddLiteral(close, kCloseTag, after);
  // Up to kMaxGapWhitespace bytes of whitespace (Qwen3 writes "\n\n"):
  // bounded, so that a sampled reply cannot spend its tokens there.
  int32_t gap = after;
  for (int i = 0; i <= kMaxGapWhitespace; ++i) {
    b.AddEps(gap, answer);
    if (i == kMaxGapWhitespace) break;
    const int32_t next = b.NewNode();
    for (char c : {' ', '\n', '\t', '\r'}) b.AddByte(gap, static_cast<uint8_t>(c), next);
    gap = next;
  }
  if (start == ThinkStart::kOpen) {
    b.AddEps(root, body);
  } else {
    // The gate is a reasoning node: a spent budget opens no block.
    const int32_t gate = b.NewNode();
    b.MarkReasoning(gate);
    b.AddEps(root, gate);
    b.AddLiteral(gate, kOpenTag, body);
    b.AddEps(root, answer);
  }
  b.AddCall(answer, b.Splice(content), end);
  return b.Finish(root, std::move(vocab));
}

}  // namespace agentkv::grammar
