#include "engine/grammar/harmony_grammar.h"

#include <string>

namespace agentkv::grammar {
namespace {

// Text without "<|" from `from`, ending anywhere at `to`: state s0 (the last
// byte was not '<') and s1 (it was).
void FreeText(GrammarBuilder& b, int32_t from, int32_t to) {
  const int32_t s0 = b.NewNode(), s1 = b.NewNode();
  b.AddEps(from, s0);
  b.AddEps(s0, to);
  b.AddEps(s1, to);
  b.AddBytes(s0, 0x00, '<' - 1, s0);
  b.AddByte(s0, '<', s1);
  b.AddBytes(s0, '<' + 1, 0xFF, s0);
  b.AddByte(s1, '<', s1);
  b.AddBytes(s1, 0x00, '<' - 1, s0);
  b.AddBytes(s1, '<' + 1, '|' - 1, s0);
  b.AddBytes(s1, '|' + 1, 0xFF, s0);
}

struct Frame {
  GrammarBuilder& b;
  const HarmonyTokens& t;
  int32_t header;   // inside an assistant header, before anything
  int32_t channel;  // after <|channel|>
  int32_t end;      // accepting

  // <|channel|>NAME<|message|>TEXT<|end|><|start|>assistant, back to header.
  void LoopMessage(const std::string& name) {
    const int32_t n = b.NewNode(), body = b.NewNode(), text_end = b.NewNode();
    b.AddLiteral(channel, name, n);
    b.AddToken(n, t.message, body);
    FreeText(b, body, text_end);
    const int32_t e = b.NewNode(), s = b.NewNode();
    b.AddToken(text_end, t.end, e);
    b.AddToken(e, t.start, s);
    b.AddLiteral(s, "assistant", header);
  }
};

Frame NewFrame(GrammarBuilder& b, const HarmonyTokens& t) {
  Frame f{b, t, b.NewNode(), b.NewNode(), b.NewNode()};
  b.MarkEnd(f.end);
  b.AddToken(f.header, t.channel, f.channel);
  return f;
}

Status CheckTokens(const HarmonyTokens& t) {
  for (int32_t id : {t.start, t.end, t.message, t.channel, t.constrain, t.call})
    if (id < 0) return InvalidArgument("the tokenizer lacks the harmony format's special tokens");
  return Status::Ok();
}

}  // namespace

Result<HarmonyTokens> HarmonyTokens::Find(const text::Tokenizer& tok) {
  HarmonyTokens t;
  auto id = [&](const char* s) { return tok.TokenToId(s).value_or(-1); };
  t.start = id("<|start|>");
  t.end = id("<|end|>");
  t.message = id("<|message|>");
  t.channel = id("<|channel|>");
  t.constrain = id("<|constrain|>");
  t.call = id("<|call|>");
  RETURN_IF_ERROR(CheckTokens(t));
  return t;
}

Result<std::shared_ptr<const Grammar>> CompileHarmonyToolCallGrammar(
    const std::vector<ToolGrammarSpec>& tools, bool required, const HarmonyTokens& tokens,
    std::shared_ptr<const TokenVocabulary> vocab, GrammarLimits limits) {
  RETURN_IF_ERROR(CheckTokens(tokens));
  if (tools.empty()) return InvalidArgument("tool_choice: no tools to call");
  size_t bytes = 0;
  for (const ToolGrammarSpec& t : tools) bytes += t.parameters.dump().size();
  if (bytes > kMaxSchemaBytes)
    return InvalidArgument("the tools' parameters are longer than " +
                           std::to_string(kMaxSchemaBytes) + " bytes");
  GrammarBuilder b(limits);
  Frame f = NewFrame(b, tokens);
  f.LoopMessage("analysis");
  if (!required) {
    f.LoopMessage("commentary");
    const int32_t n = b.NewNode(), body = b.NewNode();
    b.AddLiteral(f.channel, "final", n);
    b.AddToken(n, tokens.message, body);
    FreeText(b, body, f.end);
  }
  // The two header forms share their prefixes across tools.
  const int32_t a = b.NewNode(), bf = b.NewNode();
  b.AddLiteral(f.channel, "commentary to=functions.", a);
  b.AddLiteral(f.header, " to=functions.", bf);
  for (const ToolGrammarSpec& tool : tools) {
    if (tool.name.empty() || tool.name.find_first_of(" \t\r\n<") != std::string::npos)
      return InvalidArgument("tools: the name \"" + tool.name +
                             "\" cannot be written in a harmony header");
    auto args = tool.constrain_arguments ? CompileJsonSchema(tool.parameters, vocab, limits)
                                         : CompileAnyJsonObject(vocab, limits);
    if (!args.ok()) return args.status().WithContext("tool \"" + tool.name + "\" parameters");
    const int32_t args_root = b.Splice(**args);
    const int32_t args_start = b.NewNode(), args_end = b.NewNode();
    b.AddCall(args_start, args_root, args_end);
    b.AddToken(args_end, tokens.call, f.end);
    // <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>
    const int32_t a1 = b.NewNode(), a2 = b.NewNode(), a3 = b.NewNode();
    b.AddLiteral(a, tool.name + " ", a1);
    b.AddToken(a1, tokens.constrain, a2);
    b.AddLiteral(a2, "json", a3);
    b.AddToken(a3, tokens.message, args_start);
    //  to=functions.NAME<|channel|>commentary json<|message|>
    const int32_t b1 = b.NewNode(), b2 = b.NewNode(), b3 = b.NewNode();
    b.AddLiteral(bf, tool.name, b1);
    b.AddToken(b1, tokens.channel, b2);
    b.AddLiteral(b2, "commentary json", b3);
    b.AddToken(b3, tokens.message, args_start);
  }
  return b.Finish(f.header, std::move(vocab));
}

Result<std::shared_ptr<const Grammar>> CompileHarmonyFinalGrammar(
    const Grammar& content, const HarmonyTokens& tokens,
    std::shared_ptr<const TokenVocabulary> vocab, GrammarLimits limits) {
  RETURN_IF_ERROR(CheckTokens(tokens));
  GrammarBuilder b(limits);
  Frame f = NewFrame(b, tokens);
  f.LoopMessage("analysis");
  const int32_t n = b.NewNode(), body = b.NewNode();
  b.AddLiteral(f.channel, "final", n);
  b.AddToken(n, tokens.message, body);
  b.AddCall(body, b.Splice(content), f.end);
  return b.Finish(f.header, std::move(vocab));
}

}  // namespace agentkv::grammar
