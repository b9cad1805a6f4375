// `agentkv tokenize` and `agentkv detokenize`: the model's tokenizer from the
// command line, for scripts and for checking ids against other tools.
#include <charconv>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "engine/text/tokenizer.h"

namespace agentkv::cli {
namespace {

namespace fs = std::filesystem;

// --model may name the model directory or its tokenizer.json.
std::unique_ptr<text::Tokenizer> LoadOrReport(const std::string& model) {
  fs::path p = model;
  if (fs::is_directory(p)) p /= "tokenizer.json";
  auto tok = text::Tokenizer::Load(p);
  if (!tok.ok()) {
    std::cerr << "error: " << tok.status().ToString() << "\n";
    return nullptr;
  }
  return std::move(tok).value();
}

struct TokenizeArgs {
  std::string model, text, file;
  bool no_special = false;
};

int RunTokenize(const TokenizeArgs& a, bool have_text, bool have_file) {
  if (have_text == have_file) {
    std::cerr << "error: give exactly one of --text or --file\n";
    return 2;
  }
  std::string input = a.text;
  if (have_file) {
    std::ifstream in(a.file, std::ios::binary);
    if (!in) {
      std::cerr << "error: cannot read " << a.file << "\n";
      return 1;
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    input = ss.str();
  }
  auto tok = LoadOrReport(a.model);
  if (!tok) return 1;
  std::vector<int32_t> ids = tok->Encode(input, !a.no_special);
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ",";
    out += std::to_string(ids[i]);
  }
  out += "]\n";
  std::cout << out;
  return 0;
}

struct DetokenizeArgs {
  std::string model, ids;
  bool skip_special = false;
};

int RunDetokenize(const DetokenizeArgs& a) {
  std::vector<int32_t> ids;
  std::string_view s = a.ids;
  while (!s.empty()) {
    size_t comma = s.find(',');
    std::string_view field = s.substr(0, comma);
    while (!field.empty() && field.front() == ' ') field.remove_prefix(1);
    while (!field.empty() && field.back() == ' ') field.remove_suffix(1);
    int32_t v = 0;
    auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), v);
    if (field.empty() || ec != std::errc() || end != field.data() + field.size() || v < 0) {
      std::cerr << "error: --ids must be comma-separated non-negative integers, got \""
                << std::string(field) << "\"\n";
      return 2;
    }
    ids.push_back(v);
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
  }
  auto tok = LoadOrReport(a.model);
  if (!tok) return 1;
  for (int32_t id : ids) {
    if (id >= tok->vocab_size()) {
      std::cerr << "error: id " << id << " is outside the vocabulary (size " << tok->vocab_size()
                << ")\n";
      return 2;
    }
  }
  std::cout << tok->Decode(ids, a.skip_special) << "\n";
  return 0;
}

Registrar tokenize_reg(
    "tokenize", "Print the token ids of a text as a JSON array", [](CLI::App& app) -> Runner {
      auto a = std::make_shared<TokenizeArgs>();
      app.add_option("--model", a->model, "Model directory holding tokenizer.json")->required();
      auto* text = app.add_option("--text", a->text, "Text to tokenize");
      auto* file = app.add_option("--file", a->file, "File whose bytes to tokenize");
      text->excludes(file);
      app.add_flag("--no-special", a->no_special,
                   "Do not add the post-processor's special tokens such as BOS "
                   "(default: added, like Hugging Face's add_special_tokens=True)");
      return [a, text, file] { return RunTokenize(*a, text->count() > 0, file->count() > 0); };
    });

Registrar detokenize_reg(
    "detokenize", "Print the text of comma-separated token ids", [](CLI::App& app) -> Runner {
      auto a = std::make_shared<DetokenizeArgs>();
      app.add_option("--model", a->model, "Model directory holding tokenizer.json")->required();
      app.add_option("--ids", a->ids, "Token ids, e.g. 1,2,3")->required();
      app.add_flag("--skip-special", a->skip_special,
                   "Leave out special tokens (default: kept); output ends with a newline");
      return [a] { return RunDetokenize(*a); };
    });

}  // namespace
}  // namespace agentkv::cli
