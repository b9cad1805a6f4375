#include "engine/text/output/output_parser.h"

#include <utility>

namespace agentkv {

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
  }
  if (tools) o.tools.format = format;
  return o;
}

OutputParser::OutputParser(OutputParserOptions options)
    : reasoning_(std::move(options.reasoning)), tools_(std::move(options.tools)) {}

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
  reasoning_.Feed(text, &scratch_);
  Route(out);
}

void OutputParser::Finish(std::vector<OutputEvent>* out) {
  reasoning_.Finish(&scratch_);
  Route(out);
  tools_.Finish(out);
}

}  // namespace agentkv
