#include "engine/text/tokenizer_bpe.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <queue>

#include "engine/text/tokenizer_unicode.h"

namespace agentkv::text {

namespace tu = tokenizer_unicode;

size_t StringHash::operator()(std::string_view s) const {
  return static_cast<size_t>(XXH3_64bits(s.data(), s.size()));
}

// (left symbol, right symbol) -> (rank, merged symbol), open addressing.
struct BpeModel::MergeTable {
  struct Slot {
    uint64_t key = kEmpty;
    int32_t rank = 0;
    int32_t result = 0;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  std::vector<Slot> slots;
  uint64_t mask = 0;
  int shift = 0;

  explicit MergeTable(size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2) cap *= 2;
    slots.resize(cap);
    mask = cap - 1;
  }
  static uint64_t Key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  size_t Home(uint64_t key) const {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
  }
  void Put(uint64_t key, int32_t rank, int32_t result) {
    for (size_t i = Home(key);; i = (i + 1) & mask) {
      if (slots[i].key == kEmpty || slots[i].key == key) {
        slots[i] = {key, rank, result};  // a later duplicate wins, as in the reference
        return;
      }
    }
  }
  const Slot* Find(int32_t a, int32_t b) const {
    uint64_t key = Key(a, b);
    for (size_t i = Home(key);; i = (i + 1) & mask) {
      if (slots[i].key == key) return &slots[i];
      if (slots[i].key == kEmpty) return nullptr;
    }
  }
};

namespace {

std::atomic<uint64_t> g_next_instance{1};

// Per-thread cache of whole-word results. A few slots so that a thread
// alternating between tokenizers keeps each one's cache.
struct WordCache {
  using Map = std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>>;
  struct Slot {
    uint64_t owner = 0;
    uint64_t last_use = 0;
    Map map;
  };
  static constexpr size_t kMaxEntries = 1 << 16;
  static constexpr size_t kMaxWordBytes = 256;
  Slot slots[4];
  uint64_t clock = 0;

  Map& For(uint64_t owner) {
    Slot* victim = &slots[0];
    for (Slot& s : slots) {
      if (s.owner == owner) {
        s.last_use = ++clock;
        return s.map;
      }
      if (s.last_use < victim->last_use) victim = &s;
    }
    victim->owner = owner;
    victim->last_use = ++clock;
    victim->map.clear();
    return victim->map;
  }
};

WordCache& ThreadWordCache() {
  thread_local WordCache cache;
  return cache;
}

}  // namespace

BpeModel::BpeModel() : instance_id_(g_next_instance.fetch_add(1)) {}
BpeModel::~BpeModel() = default;

int32_t BpeModel::SymbolOf(std::string_view s) const {
  if (auto it = token_to_id_.find(s); it != token_to_id_.end()) return it->second;
  if (auto it = extra_symbols_.find(s); it != extra_symbols_.end()) return it->second;
  return -1;
}

int32_t BpeModel::InternSymbol(const std::string& s) {
  int32_t sym = SymbolOf(s);
  if (sym >= 0) return sym;
  sym = num_ids_ + static_cast<int32_t>(extra_strings_.size());
  extra_strings_.push_back(s);
  extra_symbols_.emplace(s, sym);
  return sym;
}

Result<std::unique_ptr<BpeModel>> BpeModel::Build(const nlohmann::json& model,
                                                  const std::vector<AddedToken>& added) {
  std::unique_ptr<BpeModel> m(new BpeModel());
  std::string type = model.value("type", std::string());
  if (type.empty() && model.contains("merges")) type = "BPE";
  if (type != "BPE") {
    return Unimplemented("model type \"" + type + "\" is not supported (only BPE)");
  }
  for (const char* key : {"end_of_word_suffix", "continuing_subword_suffix"}) {
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty())
      return Unimplemented(std::string("BPE option ") + key + " is not supported");
  }
  const auto& vocab = model.at("vocab");
  if (!vocab.is_object()) return Corruption("model.vocab is not an object");
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer())
      return Corruption("vocab id of \"" + it.key() + "\" is not an integer");
    int64_t id = it.value().get<int64_t>();
    if (id < 0 || id > INT32_MAX / 2)
      return Corruption("vocab id out of range: " + std::to_string(id));
    max_id = std::max<int32_t>(max_id, static_cast<int32_t>(id));
  }
  for (const auto& a : added) {
    if (a.id < 0 || a.id > INT32_MAX / 2) return Corruption("added token id out of range");
    max_id = std::max(max_id, a.id);
  }
  m->num_ids_ = max_id + 1;
  m->id_to_token_.resize(static_cast<size_t>(m->num_ids_));
  m->token_to_id_.reserve(vocab.size() + added.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    int32_t id = it.value().get<int32_t>();
    m->id_to_token_[id] = it.key();
    m->token_to_id_[it.key()] = id;
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    if (auto it = m->token_to_id_.find(model["unk_token"].get<std::string>());
        it != m->token_to_id_.end())
      m->unk_id_ = it->second;
  }
  for (const auto& a : added) {
    m->id_to_token_[a.id] = a.content;
    m->token_to_id_[a.content] = a.id;
  }

  const auto& merges = model.at("merges");
  if (!merges.is_array()) return Corruption("model.merges is not an array");
  m->merges_ = std::make_unique<MergeTable>(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& mj = merges[rank];
    std::string a, b;
    if (mj.is_string()) {
      // "a b": JavaScript's split(" ", 2) keeps the first two fields.
      const std::string& s = mj.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos) continue;  // never matches in the reference
      size_t sp2 = s.find(' ', sp + 1);
      a = s.substr(0, sp);
      b = s.substr(sp + 1, sp2 == std::string::npos ? std::string::npos : sp2 - sp - 1);
    } else if (mj.is_array() && mj.size() == 2 && mj[0].is_string() && mj[1].is_string()) {
      a = mj[0].get<std::string>();
      b = mj[1].get<std::string>();
    } else {
      return Corruption("merge #" + std::to_string(rank) + " is neither \"a b\" nor [a, b]");
    }
    int32_t sa = m->InternSymbol(a);
    int32_t sb = m->InternSymbol(b);
    int32_t sr = m->InternSymbol(a + b);
    m->merges_->Put(MergeTable::Key(sa, sb), static_cast<int32_t>(rank), sr);
  }

  std::fill(std::begin(m->ascii_symbol_), std::end(m->ascii_symbol_), -1);
  auto note_code_point = [&](const std::string& s, int32_t sym) {
    size_t pos = 0;
    if (s.empty()) return;
    char32_t cp = tu::NextCodePoint(s, &pos);
    if (pos != s.size()) return;
    if (cp < 128) m->ascii_symbol_[cp] = sym;
    m->code_point_symbol_[cp] = sym;
  };
  for (const auto& [s, id] : m->token_to_id_) note_code_point(s, id);
  for (const auto& [s, sym] : m->extra_symbols_) note_code_point(s, sym);
  const auto& b2u = tu::ByteToUnicode();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    tu::AppendUtf8(b2u[b], &s);
    m->byte_symbol_[b] = m->SymbolOf(s);
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    auto it = m->token_to_id_.find(std::string_view(hex));
    m->byte_fallback_id_[b] = it == m->token_to_id_.end() ? -1 : it->second;
  }
  m->byte_fallback_ = model.value("byte_fallback", false);
  m->ignore_merges_ = model.value("ignore_merges", false);
  m->fuse_unk_ = model.value("fuse_unk", false);
  return m;
}

void BpeModel::MergeSymbols(std::vector<int32_t>* syms_p, std::vector<uint32_t>* starts_p) const {
  auto& syms = *syms_p;
  auto& starts = *starts_p;
  const size_t n = syms.size();
  if (n < 2) return;
  auto lookup = [&](int32_t a, int32_t b) -> const MergeTable::Slot* {
    if (a < 0 || b < 0) return nullptr;
    return merges_->Find(a, b);
  };
  if (n <= 48) {
    // Short words: keep each adjacent pair's rank and scan for the minimum;
    // only the two pairs around a merge are looked up again.
    thread_local std::vector<int32_t> rank, result;
    rank.resize(n - 1);
    result.resize(n - 1);
    for (size_t i = 0; i + 1 < n; ++i) {
      const auto* s = lookup(syms[i], syms[i + 1]);
      rank[i] = s ? s->rank : INT_MAX;
      result[i] = s ? s->result : -1;
    }
    size_t len = n;
    while (len > 1) {
      size_t best = 0;
      for (size_t i = 1; i + 1 < len; ++i)
        if (rank[i] < rank[best]) best = i;
      if (rank[best] == INT_MAX) break;
      syms[best] = result[best];
      syms.erase(syms.begin() + best + 1);
      starts.erase(starts.begin() + best + 1);
      rank.erase(rank.begin() + best);
      result.erase(result.begin() + best);
      --len;
      if (best > 0) {
        const auto* s = lookup(syms[best - 1], syms[best]);
        rank[best - 1] = s ? s->rank : INT_MAX;
        result[best - 1] = s ? s->result : -1;
      }
      if (best + 1 < len) {
        const auto* s = lookup(syms[best], syms[best + 1]);
        rank[best] = s ? s->rank : INT_MAX;
        result[best] = s ? s->result : -1;
      }
    }
    return;
  }
  // Long words: linked list plus a heap ordered by (rank, left position);
  // stale entries are recognised and skipped when popped.
  struct Entry {
    int32_t rank;
    int32_t left;
    int32_t right;
    int32_t left_sym;
    int32_t right_sym;
    bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::vector<int32_t> next(n), prev(n);
  for (size_t i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
    prev[i] = static_cast<int32_t>(i) - 1;
  }
  std::vector<Entry> heap_storage;
  heap_storage.reserve(n);
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap(std::greater<>(),
                                                                      std::move(heap_storage));
  auto push = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    if (const auto* s = lookup(syms[l], syms[r])) heap.push({s->rank, l, r, syms[l], syms[r]});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i), static_cast<int32_t>(i + 1));
  std::vector<bool> alive(n, true);
  while (!heap.empty()) {
    Entry e = heap.top();
    heap.pop();
    if (!alive[e.left] || next[e.left] != e.right || syms[e.left] != e.left_sym ||
        syms[e.right] != e.right_sym)
      continue;
    syms[e.left] = lookup(e.left_sym, e.right_sym)->result;
    alive[e.right] = false;
    next[e.left] = next[e.right];
    if (next[e.right] >= 0) prev[next[e.right]] = e.left;
    push(prev[e.left], e.left);
    push(e.left, next[e.left]);
  }
  size_t w = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) {
    syms[w] = syms[i];
    starts[w] = starts[i];
    ++w;
  }
  syms.resize(w);
  starts.resize(w);
}

void BpeModel::EmitSymbols(std::string_view word, bool byte_level, const std::vector<int32_t>& syms,
                           const std::vector<uint32_t>& starts, std::vector<int32_t>* out) const {
  for (size_t k = 0; k < syms.size(); ++k) {
    int32_t sym = syms[k];
    if (sym >= 0 && sym < num_ids_) {
      out->push_back(sym);
      continue;
    }
    if (byte_fallback_ && !byte_level) {
      size_t end = k + 1 < syms.size() ? starts[k + 1] : word.size();
      bool all = true;
      for (size_t i = starts[k]; i < end; ++i)
        all &= byte_fallback_id_[static_cast<unsigned char>(word[i])] >= 0;
      if (all) {
        for (size_t i = starts[k]; i < end; ++i)
          out->push_back(byte_fallback_id_[static_cast<unsigned char>(word[i])]);
        continue;
      }
    }
    // No unknown token (byte-level vocabularies): the piece is dropped,
    // where the reference would produce an undefined id.
    if (unk_id_) out->push_back(*unk_id_);
  }
}

void BpeModel::EncodeUncached(std::string_view word, bool byte_level,
                              std::vector<int32_t>* out) const {
  thread_local std::vector<int32_t> syms;
  thread_local std::vector<uint32_t> starts;
  syms.clear();
  starts.clear();
  if (byte_level) {
    for (size_t i = 0; i < word.size(); ++i) {
      syms.push_back(byte_symbol_[static_cast<unsigned char>(word[i])]);
      starts.push_back(static_cast<uint32_t>(i));
    }
  } else {
    for (size_t pos = 0; pos < word.size();) {
      starts.push_back(static_cast<uint32_t>(pos));
      char32_t cp = tu::NextCodePoint(word, &pos);
      if (cp < 128) {
        syms.push_back(ascii_symbol_[cp]);
      } else {
        auto it = code_point_symbol_.find(cp);
        syms.push_back(it == code_point_symbol_.end() ? -1 : it->second);
      }
    }
  }
  if (ignore_merges_) {
    if (byte_level) {
      thread_local std::string mapped;
      mapped.clear();
      const auto& b2u = tu::ByteToUnicode();
      for (char c : word) tu::AppendUtf8(b2u[static_cast<unsigned char>(c)], &mapped);
      if (auto it = token_to_id_.find(std::string_view(mapped)); it != token_to_id_.end()) {
        out->push_back(it->second);
        return;
      }
    } else if (auto it = token_to_id_.find(word); it != token_to_id_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  MergeSymbols(&syms, &starts);
  EmitSymbols(word, byte_level, syms, starts, out);
}

void BpeModel::EncodeWord(std::string_view word, bool byte_level, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (word.size() >= WordCache::kMaxWordBytes) {
    EncodeUncached(word, byte_level, out);
    return;
  }
  auto& cache = ThreadWordCache().For(instance_id_ * 2 + (byte_level ? 1 : 0));
  if (auto it = cache.find(word); it != cache.end()) {
    out->insert(out->end(), it->second.begin(), it->second.end());
    return;
  }
  size_t before = out->size();
  EncodeUncached(word, byte_level, out);
  if (cache.size() >= WordCache::kMaxEntries) cache.clear();
  cache.emplace(std::string(word), std::vector<int32_t>(out->begin() + before, out->end()));
}

void BpeModel::FuseUnknown(std::vector<int32_t>* ids, size_t from) const {
  if (!fuse_unk_ || !unk_id_) return;
  size_t w = from;
  for (size_t r = from; r < ids->size(); ++r) {
    if ((*ids)[r] == *unk_id_ && w > from && (*ids)[w - 1] == *unk_id_) continue;
    (*ids)[w++] = (*ids)[r];
  }
  ids->resize(w);
}

}  // namespace agentkv::text
