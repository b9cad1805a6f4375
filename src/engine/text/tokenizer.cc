#include "engine/text/tokenizer.h"

#include <deque>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_set>

#include "engine/text/pretokenizer.h"
#include "engine/text/tokenizer_bpe.h"
#include "engine/text/tokenizer_decoder.h"
#include "engine/text/tokenizer_normalizer.h"
#include "engine/text/tokenizer_unicode.h"

namespace agentkv::text {

namespace tu = tokenizer_unicode;
using nlohmann::json;

namespace tokenizer_internal {

struct AddedInfo {
  std::string content;
  int32_t id;
  bool special, lstrip, rstrip;
};

// Byte trie over added-token contents: leftmost, then longest, match.
struct AddedTrie {
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;
    int32_t added = -1;
  };
  std::vector<Node> nodes{1};
  bool first_byte[256] = {};

  void Insert(std::string_view s, int32_t index) {
    if (s.empty()) return;
    first_byte[static_cast<uint8_t>(s[0])] = true;
    int32_t n = 0;
    for (char ch : s) {
      uint8_t c = static_cast<uint8_t>(ch);
      int32_t child = Child(n, c);
      if (child < 0) {
        child = static_cast<int32_t>(nodes.size());
        nodes[n].children.emplace_back(c, child);
        nodes.emplace_back();
      }
      n = child;
    }
    nodes[n].added = index;  // a later duplicate replaces an earlier one
  }
  int32_t Child(int32_t n, uint8_t c) const {
    for (const auto& [k, v] : nodes[n].children)
      if (k == c) return v;
    return -1;
  }
  // Longest added token starting at text[i]: (index, length) or (-1, 0).
  std::pair<int32_t, size_t> Match(std::string_view text, size_t i) const {
    int32_t n = 0, best = -1;
    size_t best_len = 0;
    for (size_t j = i; j < text.size(); ++j) {
      n = Child(n, static_cast<uint8_t>(text[j]));
      if (n < 0) break;
      if (nodes[n].added >= 0) {
        best = nodes[n].added;
        best_len = j + 1 - i;
      }
    }
    return {best, best_len};
  }
};

struct Pipeline {
  std::string name;
  std::vector<AddedInfo> added;
  AddedTrie trie;
  TokenizerDecoder::StringSet added_contents;
  std::unordered_set<std::string> special_tokens;
  std::vector<bool> special_ids;
  std::vector<bool> added_ids;
  std::unique_ptr<TokenizerNormalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<TokenizerDecoder> decoder;
  std::vector<int32_t> prefix_ids, suffix_ids;  // post-processor template
  bool clean_up = true;
  std::optional<int32_t> bos, eos;

  void EncodeSection(std::string_view text, int section_index, std::vector<int32_t>* out) const;
};

void Pipeline::EncodeSection(std::string_view text, int section_index,
                             std::vector<int32_t>* out) const {
  std::string normalized;
  if (!normalizer->is_noop()) {
    normalized = normalizer->Apply(text);
    text = normalized;
  }
  if (text.empty()) return;
  thread_local std::deque<std::string> arena;
  thread_local std::vector<std::string_view> words;
  arena.clear();
  words.clear();
  if (!pre_tokenizer->Run(text, section_index, &arena, &words).ok()) {
    // Only a regex resource failure gets here; encoding the section whole
    // still yields valid ids.
    words.assign(1, text);
  }
  size_t start = out->size();
  bool byte_level = pre_tokenizer->byte_level();
  for (std::string_view w : words) model->EncodeWord(w, byte_level, out);
  model->FuseUnknown(out, start);
}

}  // namespace tokenizer_internal

using tokenizer_internal::AddedInfo;
using tokenizer_internal::Pipeline;

namespace {

Result<std::string> ReadFile(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    return NotFound(path.string() + ": no such file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError(path.string() + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return IoError(path.string() + ": read failed");
  return ss.str();
}

// tokenizer_config.json's bos_token / eos_token: a string or an AddedToken
// object with "content".
std::optional<std::string> ConfigToken(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return std::nullopt;
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return std::nullopt;
}

Status BuildPostProcessor(const json& config, const BpeModel& model, Pipeline* p) {
  if (config.is_null()) return Status::Ok();
  std::string type = config.value("type", std::string());
  if (type == "ByteLevel") return Status::Ok();  // offsets only; ids unchanged
  if (type == "Sequence") {
    for (const auto& sub : config.at("processors"))
      RETURN_IF_ERROR(BuildPostProcessor(sub, model, p));
    return Status::Ok();
  }
  if (type != "TemplateProcessing") {
    return Unimplemented("post-processor type \"" + type + "\" is not supported");
  }
  std::vector<int32_t> before, after;
  bool seen_sequence = false;
  for (const auto& item : config.at("single")) {
    if (item.contains("Sequence")) {
      seen_sequence = true;
    } else if (item.contains("SpecialToken")) {
      // The template names a token string; the reference maps it through
      // the vocabulary, falling back to the unknown token.
      std::string tok = item["SpecialToken"].at("id").get<std::string>();
      auto it = model.token_to_id().find(tok);
      std::optional<int32_t> id;
      if (it != model.token_to_id().end())
        id = it->second;
      else
        id = model.unk_id();
      if (id) (seen_sequence ? after : before).push_back(*id);
    }
  }
  p->prefix_ids.insert(p->prefix_ids.begin(), before.begin(), before.end());
  p->suffix_ids.insert(p->suffix_ids.end(), after.begin(), after.end());
  return Status::Ok();
}

Status BuildPipeline(const json& tj, const json& cj, Pipeline* p) {
  if (!tj.is_object()) return Corruption("top level is not a JSON object");
  if (cj.is_object()) {
    if (cj.value("remove_space", false) || cj.value("do_lowercase_and_remove_accent", false))
      return Unimplemented("remove_space / do_lowercase_and_remove_accent are not supported");
    if (cj.contains("clean_up_tokenization_spaces") &&
        cj["clean_up_tokenization_spaces"].is_boolean())
      p->clean_up = cj["clean_up_tokenization_spaces"].get<bool>();
  }
  std::vector<BpeModel::AddedToken> model_added;
  if (tj.contains("added_tokens") && tj["added_tokens"].is_array()) {
    for (const auto& a : tj["added_tokens"]) {
      AddedInfo info{a.at("content").get<std::string>(), a.at("id").get<int32_t>(),
                     a.value("special", false), a.value("lstrip", false), a.value("rstrip", false)};
      model_added.push_back({info.content, info.id});
      p->added.push_back(std::move(info));
    }
  }
  if (!tj.contains("model")) return Corruption("no \"model\" object");
  auto model = BpeModel::Build(tj["model"], model_added);
  if (!model.ok()) return model.status();
  p->model = std::move(model).value();

  for (size_t i = 0; i < p->added.size(); ++i) {
    p->trie.Insert(p->added[i].content, static_cast<int32_t>(i));
    p->added_contents.insert(p->added[i].content);
    if (p->added[i].special) p->special_tokens.insert(p->added[i].content);
  }
  if (cj.is_object() && cj.contains("additional_special_tokens") &&
      cj["additional_special_tokens"].is_array()) {
    for (const auto& t : cj["additional_special_tokens"]) {
      if (t.is_string())
        p->special_tokens.insert(t.get<std::string>());
      else if (t.is_object() && t.contains("content"))
        p->special_tokens.insert(t["content"].get<std::string>());
    }
  }
  const auto& id_to_token = p->model->id_to_token();
  p->special_ids.assign(id_to_token.size(), false);
  for (size_t id = 0; id < id_to_token.size(); ++id)
    if (p->special_tokens.count(id_to_token[id])) p->special_ids[id] = true;
  p->added_ids.assign(id_to_token.size(), false);
  for (const AddedInfo& a : p->added) {
    if (a.id >= 0 && static_cast<size_t>(a.id) < p->added_ids.size()) p->added_ids[a.id] = true;
  }

  auto norm = TokenizerNormalizer::Build(tj.value("normalizer", json()));
  if (!norm.ok()) return norm.status();
  p->normalizer = std::move(norm).value();
  auto pre = PreTokenizer::Build(tj.value("pre_tokenizer", json()));
  if (!pre.ok()) return pre.status();
  p->pre_tokenizer = std::move(pre).value();
  auto dec = TokenizerDecoder::Build(tj.value("decoder", json()), &p->added_contents);
  if (!dec.ok()) return dec.status();
  p->decoder = std::move(dec).value();
  RETURN_IF_ERROR(BuildPostProcessor(tj.value("post_processor", json()), *p->model, p));

  auto lookup = [&](const std::optional<std::string>& tok) -> std::optional<int32_t> {
    if (!tok) return std::nullopt;
    auto it = p->model->token_to_id().find(*tok);
    if (it == p->model->token_to_id().end()) return std::nullopt;
    return it->second;
  };
  p->bos = lookup(ConfigToken(cj, "bos_token"));
  if (!p->bos && !cj.is_object() && !p->prefix_ids.empty()) p->bos = p->prefix_ids.front();
  p->eos = lookup(ConfigToken(cj, "eos_token"));
  return Status::Ok();
}

void CleanUpTokenization(std::string* s) {
  static constexpr std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    if (s->find(from) == std::string::npos) continue;
    std::string out;
    out.reserve(s->size());
    size_t last = 0;
    for (size_t pos; (pos = s->find(from, last)) != std::string::npos; last = pos + from.size()) {
      out.append(*s, last, pos - last);
      out += to;
    }
    out.append(*s, last, std::string::npos);
    *s = std::move(out);
  }
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Pipeline> p) : p_(std::move(p)) {}
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view tokenizer_json,
                                                       std::string_view config_json,
                                                       std::string_view name) {
  auto p = std::make_unique<Pipeline>();
  p->name = std::string(name);
  json tj, cj;
  try {
    tj = json::parse(tokenizer_json);
  } catch (const json::exception& e) {
    return Corruption(std::string(name) + ": malformed JSON: " + e.what());
  }
  if (!config_json.empty()) {
    try {
      cj = json::parse(config_json);
    } catch (const json::exception& e) {
      return Corruption(std::string(name) + ": malformed tokenizer_config.json: " + e.what());
    }
  }
  try {
    Status st = BuildPipeline(tj, cj, p.get());
    if (!st.ok()) return st.WithContext(name);
  } catch (const json::exception& e) {
    // A field of the wrong type or a missing required field.
    return Corruption(std::string(name) + ": unexpected tokenizer.json content: " + e.what());
  }
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(p)));
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::filesystem::path& tokenizer_json) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(tokenizer_json));
  std::string config;
  auto config_path = tokenizer_json.parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::exists(config_path, ec)) {
    ASSIGN_OR_RETURN(config, ReadFile(config_path));
    // Validate here so a broken config is named as such.
    if (!json::accept(config)) return Corruption(config_path.string() + ": malformed JSON");
  }
  return FromJson(text, config, tokenizer_json.string());
}

std::vector<int32_t> Tokenizer::Encode(std::string_view raw, bool add_special_tokens) const {
  const Pipeline& p = *p_;
  std::string sanitized;
  std::string_view text = raw;
  if (!tu::IsValidUtf8(raw)) {
    sanitized = tu::SanitizeUtf8(raw);
    text = sanitized;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special_tokens) out = p.prefix_ids;

  // Split out added tokens: (section, added index or -1).
  thread_local std::vector<std::pair<std::string_view, int32_t>> sections;
  sections.clear();
  size_t start = 0;
  for (size_t i = 0; i < text.size();) {
    if (!p.trie.first_byte[static_cast<uint8_t>(text[i])]) {
      ++i;
      continue;
    }
    auto [idx, len] = p.trie.Match(text, i);
    if (idx < 0) {
      ++i;
      continue;
    }
    if (i > start) sections.emplace_back(text.substr(start, i - start), -1);
    sections.emplace_back(text.substr(i, len), idx);
    i += len;
    start = i;
  }
  if (start < text.size()) sections.emplace_back(text.substr(start), -1);
  for (size_t i = 0; i < sections.size(); ++i) {
    int32_t a = sections[i].second;
    if (a < 0) continue;
    if (p.added[a].lstrip && i > 0 && sections[i - 1].second < 0)
      sections[i - 1].first = tu::JsTrimEnd(sections[i - 1].first);
    if (p.added[a].rstrip && i + 1 < sections.size() && sections[i + 1].second < 0)
      sections[i + 1].first = tu::JsTrimStart(sections[i + 1].first);
  }
  for (size_t i = 0; i < sections.size(); ++i) {
    auto [view, a] = sections[i];
    if (a >= 0) {
      out.push_back(p.added[a].id);
    } else if (!view.empty()) {
      p.EncodeSection(view, static_cast<int>(i), &out);
    }
  }
  if (add_special_tokens) out.insert(out.end(), p.suffix_ids.begin(), p.suffix_ids.end());
  return out;
}

std::string Tokenizer::DecodeFragment(std::span<const int32_t> ids, bool skip_special_tokens,
                                      bool is_sequence_start) const {
  const Pipeline& p = *p_;
  const auto& id_to_token = p.model->id_to_token();
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= id_to_token.size()) continue;
    const std::string& t = id_to_token[id];
    if (t.empty()) continue;  // a hole in the id space
    if (skip_special_tokens && p.special_ids[id]) continue;
    tokens.push_back(t);
  }
  std::string text = p.decoder->Decode(std::move(tokens), is_sequence_start);
  if (p.clean_up) CleanUpTokenization(&text);
  return text;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  return DecodeFragment(ids, skip_special_tokens, true);
}

std::optional<std::string> Tokenizer::TokenBytes(int32_t id) const {
  const auto& id_to_token = p_->model->id_to_token();
  if (id < 0 || static_cast<size_t>(id) >= id_to_token.size()) return std::nullopt;
  const std::string& t = id_to_token[id];
  if (t.empty()) return std::nullopt;  // a hole in the id space
  return p_->decoder->TokenBytes(t);
}

bool Tokenizer::cleans_up_tokenization_spaces() const { return p_->clean_up; }

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  const auto& m = p_->model->token_to_id();
  auto it = m.find(token);
  if (it == m.end()) return std::nullopt;
  return it->second;
}

std::string Tokenizer::IdToToken(int32_t id) const {
  const auto& v = p_->model->id_to_token();
  if (id < 0 || static_cast<size_t>(id) >= v.size()) return {};
  return v[id];
}

int32_t Tokenizer::vocab_size() const {
  return static_cast<int32_t>(p_->model->id_to_token().size());
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < p_->special_ids.size() && p_->special_ids[id];
}

bool Tokenizer::IsAdded(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < p_->added_ids.size() && p_->added_ids[id];
}

std::optional<int32_t> Tokenizer::bos_id() const { return p_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return p_->eos; }

}  // namespace agentkv::text
