#include "engine/text/output/output_parser.h"

#include <utility>

namespace agentkv::text::output {

OutputParserOptions OutputParserOptions::ForModelType(std::string_view model_type, bool tools,
                                                      bool starts_in_reasoning) {
  OutputParserOptions o;
  ToolCallFormat format = ToolCallFormat::kNone;
  if (model_type == "qwen3") {
    o.reasoning.enabled = true;
    o.reasoning.starts_in_reasoning = starts_in_reasoning;
    format = ToolCallFormat::kHermes;
  } else if (model_type == "qwen2") {
    format = ToolCallFormat::kHermes;
  } else if (model_type == "llama") {
    format = ToolCallFormat::kLlama31Json;
  } else if (model_type == "gemma3" || model_type == "gemma3_text") {
    format = ToolCallFormat::kGemmaFenced;
  } else if (model_type == "gpt_oss") {
    o.harmony = true;
    format = ToolCallFormat::kHarmony;
  }
  if (tools) o.tools.format = format;
  return o;
}

OutputParser::OutputParser(OutputParserOptions options)
    : reasoning_(std::move(options.reasoning)),
      tools_(options.harmony ? ToolCallParserOptions{} : options.tools),
      tokenizer_(std::move(options.tokenizer)) {
  if (options.harmony) {
    harmony_.emplace(std::move(options.tools));
    // Markers are special tokens: keep them in the decoded text.
    if (tokenizer_) detok_ = std::make_unique<StreamDetokenizer>(*tokenizer_, false);
  }
}

void OutputParser::Route(std::vector<OutputEvent>* out) {
  for (OutputEvent& e : scratch_) {
    if (e.kind == OutputEvent::Kind::kText) {
      tools_.Feed(e.text, out);
    } else {
      AppendMerged(out, std::move(e));
    }
  }
  scratch_.clear();
}

void OutputParser::Feed(std::string_view text, std::vector<OutputEvent>* out) {
  if (harmony_) return harmony_->Feed(text, out);
  reasoning_.Feed(text, &scratch_);
  Route(out);
}

void OutputParser::Feed(std::span<const int32_t> tokens, std::string_view text,
                        std::vector<OutputEvent>* out) {
  if (!detok_) return Feed(text, out);
  std::string decoded;
  for (int32_t id : tokens) decoded += detok_->Push(id);
  harmony_->Feed(decoded, out);
}

void OutputParser::Finish(std::vector<OutputEvent>* out) {
  if (harmony_) {
    if (detok_) harmony_->Feed(detok_->Flush(), out);
    harmony_->Finish(out);
    return;
  }
  reasoning_.Finish(&scratch_);
  Route(out);
  tools_.Finish(out);
}

}  // namespace agentkv::text::output
