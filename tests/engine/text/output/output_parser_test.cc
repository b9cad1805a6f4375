#include "engine/text/output/output_parser.h"

#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace agentkv::text::output {
namespace {

using Events = std::vector<OutputEvent>;
using Kind = OutputEvent::Kind;
using Json = nlohmann::json;

Events Parse(const OutputParserOptions& o, const std::vector<std::string>& pieces) {
  OutputParser p(o);
  Events out;
  for (const std::string& s : pieces) p.Feed(s, &out);
  p.Finish(&out);
  return out;
}

// One line per event; arguments are normalized through a JSON parse so an
// expectation built from values compares equal to any spacing.
std::vector<std::string> Normalize(const Events& events) {
  std::vector<std::string> v;
  for (const OutputEvent& e : events) {
    switch (e.kind) {
      case Kind::kText:
        v.push_back("text:" + e.text);
        break;
      case Kind::kReasoning:
        v.push_back("reasoning:" + e.text);
        break;
      case Kind::kToolCallBegin:
        v.push_back("begin:" + std::to_string(e.tool_index) + ":" + e.name);
        break;
      case Kind::kToolCallArgs: {
        Json j = Json::parse(e.text, nullptr, false);
        v.push_back("args:" + std::to_string(e.tool_index) + ":" +
                    (j.is_discarded() ? "INVALID " + e.text : j.dump()));
        break;
      }
      case Kind::kToolCallEnd:
        v.push_back("end:" + std::to_string(e.tool_index));
        break;
      case Kind::kToolCallAbort:
        v.push_back("abort:" + std::to_string(e.tool_index));
        break;
    }
  }
  return v;
}

TEST(OutputParserTest, Qwen3ReasoningThenToolCalls) {
  OutputParserOptions o = OutputParserOptions::ForModelType("qwen3", /*tools=*/true,
                                                            /*starts_in_reasoning=*/true);
  Events e = Parse(o, {"I should call <tool_call> here.\n</think>\n\nChecking.\n<tool_call>\n",
                       "{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>"});
  EXPECT_EQ(Normalize(e),
            (std::vector<std::string>{"reasoning:I should call <tool_call> here.", "text:Checking.",
                                      "begin:0:f", "args:0:{\"x\":1}", "end:0"}));
  // Without declared tools the tags are text.
  OutputParserOptions no_tools = OutputParserOptions::ForModelType("qwen3", false, false);
  EXPECT_EQ(Normalize(Parse(no_tools, {"<tool_call>{}</tool_call>"})),
            (std::vector<std::string>{"text:<tool_call>{}</tool_call>"}));
}

// ---- Generated messages: every split gives the same events. ----

class Gen {
 public:
  explicit Gen(uint64_t seed) : g_(seed) {}
  int Int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g_); }
  bool Chance(double p) { return std::bernoulli_distribution(p)(g_); }
  template <typename T>
  const T& Pick(const std::vector<T>& v) {
    return v[static_cast<size_t>(Int(0, static_cast<int>(v.size()) - 1))];
  }

  // Text with markup-like fragments, no leading/trailing whitespace;
  // `no_think` leaves out the reasoning tags.
  std::string Text(bool no_think = false) {
    static const std::vector<std::string> words = {"hello",
                                                   "world",
                                                   "\xc3\xa9t\xc3\xa9",
                                                   "\xe6\x97\xa5\xe6\x9c\xac",
                                                   "<",
                                                   "<tool",
                                                   "<tool_cal",
                                                   "</tool_call>",
                                                   "<think>",
                                                   "</think>",
                                                   "{",
                                                   "}",
                                                   "\"q\"",
                                                   "`",
                                                   "``",
                                                   "```py",
                                                   "```tool",
                                                   ";",
                                                   "x=1",
                                                   "a\nb",
                                                   "<|python",
                                                   "tool_call>"};
    auto word = [&] {
      while (true) {
        const std::string& w = Pick(words);
        if (!no_think || w.find("think>") == std::string::npos) return w;
      }
    };
    std::string s = word();
    for (int n = Int(0, 5); n > 0; --n) {
      s += Pick(std::vector<std::string>{" ", "", "\n"}) + word();
    }
    return s;
  }

  std::string Str() {
    static const std::vector<std::string> parts = {
        "a",  "path/to.txt", "</tool_call>",     "```",     "}", "{", "\"", "\\", "\n",
        "\t", "\xc3\xa9",    "\xf0\x9f\x98\x80", "<think>", " ", "]"};
    std::string s;
    for (int n = Int(0, 4); n > 0; --n) s += Pick(parts);
    return s;
  }

  Json Value(int depth) {
    switch (Int(0, depth > 2 ? 4 : 6)) {
      case 0:
        return Int(-1000, 1000);
      case 1:
        return Int(-100, 100) / 8.0;
      case 2:
        return Str();
      case 3:
        return Chance(0.5);
      case 4:
        return nullptr;
      case 5: {
        Json a = Json::array();
        for (int n = Int(0, 3); n > 0; --n) a.push_back(Value(depth + 1));
        return a;
      }
      default:
        return Object(depth + 1);
    }
  }

  Json Object(int depth) {
    Json o = Json::object();
    for (int n = Int(0, 3); n > 0; --n) o[Str()] = Value(depth);
    return o;
  }

  std::mt19937_64 g_;
};

struct Message {
  std::string text;
  std::vector<std::string> expected;  // Normalize()d; empty when malformed
  bool malformed = false;
};

// The JSON of one call, in varied spacing and key order; `breakage` > 0
// makes it malformed in one of several ways.
std::string CallJson(Gen& g, const std::string& name, const Json& args, const char* args_key,
                     int breakage) {
  const std::string sp = g.Pick(std::vector<std::string>{"", " ", "\n  "});
  const std::string args_text = args.dump(g.Chance(0.3) ? 2 : -1);
  std::string name_member = "\"name\":" + sp + Json(name).dump();
  std::string args_member = std::string("\"") + args_key + "\":" + sp + args_text;
  if (breakage == 3) name_member = "\"nam\": " + Json(name).dump();
  if (breakage == 4) args_member = std::string("\"") + args_key + "\": [1]";
  std::string body =
      g.Chance(0.85) ? name_member + "," + sp + args_member : args_member + "," + sp + name_member;
  if (g.Chance(0.2)) body += ", \"id\": \"x\"";
  std::string j = "{" + sp + body + sp + "}";
  if (breakage == 1) j.pop_back();                 // unclosed
  if (breakage == 2) j.insert(j.size() - 1, ",");  // trailing comma
  if (breakage == 5) j = "{\"name\": " + Json(name).dump() + " oops}";
  return j;
}

Message Tagged(Gen& g, const std::string& open, const std::string& close, bool reasoning,
               bool starts_in_reasoning) {
  Message m;
  int index = 0;
  if (reasoning) {
    std::string r = g.Text(/*no_think=*/true);
    m.text += (starts_in_reasoning ? "" : "<think>") + g.Pick(std::vector<std::string>{"", "\n"}) +
              r + "\n</think>\n\n";
    m.expected.push_back("reasoning:" + r);
  }
  bool prev_text = false;
  const int items = g.Int(1, 5);
  for (int i = 0; i < items; ++i) {
    if (i > 0) m.text += "\n";
    if (g.Chance(0.45)) {
      // A message's first text must not open a reasoning block.
      std::string t = g.Text(/*no_think=*/i == 0);
      while (t.find(open) != std::string::npos) t = g.Text(i == 0);  // words can join into it
      m.text += t;
      if (prev_text) {
        m.expected.back() += "\n" + t;
      } else {
        m.expected.push_back("text:" + t);
      }
      prev_text = true;
      continue;
    }
    const std::string name =
        g.Pick(std::vector<std::string>{"get_weather", "Read", "a.b-c", "\xc3\xa9"});
    const Json args = g.Object(0);
    const int breakage = g.Chance(0.15) ? g.Int(1, 5) : 0;
    m.text += open + g.Pick(std::vector<std::string>{"\n", "", " "}) +
              CallJson(g, name, args, "arguments", breakage) +
              g.Pick(std::vector<std::string>{"\n", ""}) + close;
    if (breakage) m.malformed = true;
    m.expected.push_back("begin:" + std::to_string(index) + ":" + name);
    m.expected.push_back("args:" + std::to_string(index) + ":" + args.dump());
    m.expected.push_back("end:" + std::to_string(index));
    ++index;
    prev_text = false;
  }
  return m;
}

Message Llama(Gen& g) {
  Message m;
  if (g.Chance(0.3)) {
    // A text answer; it must not look like JSON at its start.
    std::string t = "Answer: " + g.Text();
    m.text = t;
    m.expected.push_back("text:" + t);
    return m;
  }
  if (g.Chance(0.3)) m.text += "<|python_tag|>";
  const int calls = g.Int(1, 3);
  for (int i = 0; i < calls; ++i) {
    if (i > 0) m.text += g.Pick(std::vector<std::string>{"; ", "\n", ";"});
    const std::string name = g.Pick(std::vector<std::string>{"search", "x"});
    const Json args = g.Object(0);
    const int breakage = g.Chance(0.15) ? g.Int(1, 5) : 0;
    m.text += CallJson(g, name, args, g.Chance(0.7) ? "parameters" : "arguments", breakage);
    if (breakage) m.malformed = true;
    m.expected.push_back("begin:" + std::to_string(i) + ":" + name);
    m.expected.push_back("args:" + std::to_string(i) + ":" + args.dump());
    m.expected.push_back("end:" + std::to_string(i));
  }
  return m;
}

// GPT-OSS output as the tokens decode with their markers: reasoning,
// answers, preambles and tool calls (with the recipient before or after the
// channel), after a prompt that ends with <|start|>assistant.
Message Harmony(Gen& g) {
  Message m;
  int index = 0;
  std::string last;  // kind of the last expected delta ("" after a call)
  const int items = g.Int(1, 4);
  for (int i = 0; i < items; ++i) {
    if (i > 0) m.text += "<|start|>assistant";
    if (g.Chance(0.6)) {
      const std::string channel =
          g.Pick(std::vector<std::string>{"analysis", "final", "commentary"});
      const std::string body = g.Text();
      const std::string kind = channel == "analysis" ? "reasoning" : "text";
      m.text += "<|channel|>" + channel + "<|message|>" + body +
                (channel == "final" && g.Chance(0.5) ? "<|return|>" : "<|end|>");
      if (last == kind) {
        m.expected.back() += body;
      } else {
        m.expected.push_back(kind + ":" + body);
      }
      last = kind;
      continue;
    }
    const std::string name = g.Pick(std::vector<std::string>{"get_weather", "Read", "a.b-c", "x1"});
    const Json args = g.Object(0);
    std::string body =
        g.Pick(std::vector<std::string>{"", " ", "\n"}) + args.dump(g.Chance(0.3) ? 2 : -1);
    const int breakage = g.Chance(0.15) ? g.Int(1, 3) : 0;
    if (breakage == 1) body.pop_back();
    if (breakage == 2) body = "[1]";
    if (breakage == 3) body = "{\"a\": oops}";
    m.text +=
        (g.Chance(0.5) ? " to=functions." + name + "<|channel|>commentary json"
                       : "<|channel|>commentary to=functions." + name + " <|constrain|>json") +
        "<|message|>" + body + "<|call|>";
    if (breakage) m.malformed = true;
    m.expected.push_back("begin:" + std::to_string(index) + ":" + name);
    m.expected.push_back("args:" + std::to_string(index) + ":" + args.dump());
    m.expected.push_back("end:" + std::to_string(index));
    ++index;
    last.clear();
  }
  // Generation stops on <|return|> / <|call|>, which the text then lacks.
  for (std::string_view end : {"<|return|>", "<|call|>"}) {
    if (m.text.ends_with(end) && g.Chance(0.5)) m.text.resize(m.text.size() - end.size());
  }
  return m;
}

std::vector<std::vector<std::string>> Splits(Gen& g, const std::string& text) {
  std::vector<std::vector<std::string>> splits;
  splits.push_back({text});
  std::vector<std::string> bytes;
  for (char c : text) bytes.push_back(std::string(1, c));
  splits.push_back(bytes);
  for (int k = 0; k < 6; ++k) {
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size();) {
      const size_t n = static_cast<size_t>(g.Int(1, k < 3 ? 4 : 16));
      pieces.push_back(text.substr(i, n));
      i += n;
    }
    splits.push_back(pieces);
  }
  return splits;
}

void CheckGenerated(const char* family, const OutputParserOptions& o,
                    const std::function<Message(Gen&)>& make) {
  Gen g(0x5eed ^ std::hash<std::string>()(family));
  int malformed = 0, valid = 0;
  for (int iter = 0; iter < 300; ++iter) {
    const Message m = make(g);
    const Events whole = Parse(o, {m.text});
    for (const auto& pieces : Splits(g, m.text)) {
      const Events split = Parse(o, pieces);
      ASSERT_EQ(Normalize(split), Normalize(whole)) << family << " text:\n" << m.text;
      ASSERT_EQ(split, whole) << family;  // ids and raw argument text too
    }
    std::string all_text;
    for (const OutputEvent& e : whole) {
      if (e.kind == Kind::kText) all_text += e.text;
    }
    if (m.malformed) {
      ++malformed;
      // Some part of the message came back as text; nothing crashed.
      EXPECT_FALSE(all_text.empty()) << m.text;
    } else {
      ++valid;
      ASSERT_EQ(Normalize(whole), m.expected) << family << " text:\n" << m.text;
    }
  }
  EXPECT_GT(malformed, 10) << family;
  EXPECT_GT(valid, 100) << family;
}

TEST(OutputParserTest, GeneratedQwen3MessagesAreSplitInvariant) {
  for (bool starts_in_reasoning : {false, true}) {
    for (bool stream : {true, false}) {
      OutputParserOptions o =
          OutputParserOptions::ForModelType("qwen3", /*tools=*/true, starts_in_reasoning);
      o.tools.stream_arguments = stream;
      CheckGenerated(starts_in_reasoning ? "qwen3-in-think" : "qwen3", o, [&](Gen& g) {
        return Tagged(g, "<tool_call>", "</tool_call>", starts_in_reasoning || g.Chance(0.5),
                      starts_in_reasoning);
      });
    }
  }
}

TEST(OutputParserTest, GeneratedGemmaMessagesAreSplitInvariant) {
  OutputParserOptions o = OutputParserOptions::ForModelType("gemma3_text", true, false);
  CheckGenerated("gemma3", o,
                 [](Gen& g) { return Tagged(g, "```tool_call", "```", false, false); });
}

TEST(OutputParserTest, GeneratedLlamaMessagesAreSplitInvariant) {
  for (bool stream : {true, false}) {
    OutputParserOptions o = OutputParserOptions::ForModelType("llama", true, false);
    o.tools.stream_arguments = stream;
    CheckGenerated("llama", o, Llama);
  }
}

}  // namespace
}  // namespace agentkv::text::output

namespace agentkv::text::output {
namespace {

TEST(OutputParserTest, GeneratedHarmonyMessagesAreSplitInvariant) {
  for (bool stream : {true, false}) {
    OutputParserOptions o = OutputParserOptions::ForModelType("gpt_oss", /*tools=*/true, false);
    EXPECT_TRUE(o.harmony);
    o.tools.stream_arguments = stream;
    CheckGenerated("gpt_oss", o, Harmony);
  }
}

TEST(OutputParserTest, HarmonyReadsTokenIdsWithItsMarkers) {
  const auto path = std::filesystem::path(AGENTKV_DATA_DIR) / "tokenizers/gptoss/tokenizer.json";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " missing (run scripts/setup.sh)";
  auto tok = Tokenizer::Load(path);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  std::shared_ptr<const Tokenizer> shared = std::move(tok).value();
  const std::string text =
      "<|channel|>analysis<|message|>Weather needed; caf\xC3\xA9 \xF0\x9F\x98\x80.<|end|>"
      "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
      "<|message|>{\"city\": \"Z\xC3\xBCrich\"}";
  const std::vector<int32_t> ids = shared->Encode(text, false);
  OutputParserOptions o = OutputParserOptions::ForModelType("gpt_oss", true, false);
  const Events want = Parse(o, {text});
  EXPECT_EQ(Normalize(want),
            (std::vector<std::string>{"reasoning:Weather needed; caf\xC3\xA9 \xF0\x9F\x98\x80.",
                                      "begin:0:get_weather", "args:0:{\"city\":\"Z\xC3\xBCrich\"}",
                                      "end:0"}));
  // One id at a time, as the engine streams them; the engine's text (no
  // markers) is ignored.
  o.tokenizer = shared;
  OutputParser p(o);
  Events got;
  for (int32_t id : ids) p.Feed(std::span<const int32_t>(&id, 1), "ignored", &got);
  p.Finish(&got);
  EXPECT_EQ(got, want);
  EXPECT_EQ(p.num_tool_calls(), 1);
  // Without a tokenizer the engine's text is read: no markers, all text.
  OutputParserOptions bare = OutputParserOptions::ForModelType("gpt_oss", true, false);
  OutputParser q(bare);
  Events plain;
  q.Feed(ids, "analysisWeather needed.", &plain);
  q.Finish(&plain);
  EXPECT_EQ(Normalize(plain), (std::vector<std::string>{"text:analysisWeather needed."}));
  // Other formats read the text, not the ids.
  OutputParser qwen(OutputParserOptions::ForModelType("qwen3", false, false));
  Events qe;
  qwen.Feed(ids, "<think>r</think>answer", &qe);
  qwen.Finish(&qe);
  EXPECT_EQ(Normalize(qe), (std::vector<std::string>{"reasoning:r", "text:answer"}));
}

}  // namespace
}  // namespace agentkv::text::output
