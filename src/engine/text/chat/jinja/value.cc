#include "engine/text/chat/jinja/value.h"

#include <utf8proc.h>

#include <charconv>
#include <cmath>
#include <cstdio>

#include "engine/text/chat/jinja/error.h"

namespace agentkv::text::chat::jinja {

Value Value::Undefined(std::string hint) {
  Value v(Kind::kUndefined);
  if (!hint.empty()) v.p_ = std::make_shared<std::string>(std::move(hint));
  return v;
}
Value Value::Bool(bool b) {
  Value v(Kind::kBool);
  v.b_ = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v(Kind::kInt);
  v.i_ = i;
  return v;
}
Value Value::Float(double f) {
  Value v(Kind::kFloat);
  v.f_ = f;
  return v;
}
Value Value::Str(std::string s) {
  Value v(Kind::kString);
  v.p_ = std::make_shared<std::string>(std::move(s));
  return v;
}
Value Value::MakeList(ValueList items) {
  Value v(Kind::kList);
  v.p_ = std::make_shared<ValueList>(std::move(items));
  return v;
}
Value Value::MakeTuple(ValueList items) {
  Value v(Kind::kTuple);
  v.p_ = std::make_shared<ValueList>(std::move(items));
  return v;
}
Value Value::MakeDict(std::shared_ptr<DictObj> dict) {
  Value v(Kind::kDict);
  v.p_ = std::move(dict);
  return v;
}
Value Value::MakeNamespace(std::shared_ptr<DictObj> dict) {
  Value v(Kind::kNamespace);
  v.p_ = std::move(dict);
  return v;
}
Value Value::MakeCallable(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn) {
  Value v(Kind::kCallable);
  v.p_ = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}
namespace {
struct GeneratorObj {
  std::function<ValueList()> produce;
  bool consumed = false;
  std::string name;  // what Python's repr names, e.g. "generator object do_batch"
};
}  // namespace

Value Value::MakeGenerator(std::function<ValueList()> produce, std::string name) {
  Value v(Kind::kGenerator);
  v.p_ = std::make_shared<GeneratorObj>(GeneratorObj{std::move(produce), false, std::move(name)});
  return v;
}

ValueList Value::Consume() const {
  auto& g = *std::static_pointer_cast<GeneratorObj>(p_);
  if (g.consumed) return {};
  g.consumed = true;
  return g.produce();
}

Value Value::MakeLoop(std::shared_ptr<LoopState> loop) {
  Value v(Kind::kLoop);
  v.p_ = std::move(loop);
  return v;
}

namespace {
template <typename J>
Value FromJsonImpl(const J& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::None();
    case nlohmann::json::value_t::boolean:
      return Value::Bool(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::Int(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned:
      return Value::Int(static_cast<int64_t>(j.template get<uint64_t>()));
    case nlohmann::json::value_t::number_float:
      return Value::Float(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value::Str(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(FromJsonImpl(e));
      return Value::MakeList(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      auto d = std::make_shared<DictObj>();
      d->items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it)
        d->items.emplace_back(Value::Str(it.key()), FromJsonImpl(it.value()));
      return Value::MakeDict(std::move(d));
    }
    default:
      return Value::None();
  }
}
}  // namespace

Value Value::FromJson(const nlohmann::ordered_json& j) { return FromJsonImpl(j); }
Value Value::FromJson(const nlohmann::json& j) { return FromJsonImpl(j); }

std::string Value::undefined_hint() const {
  if (kind_ == Kind::kUndefined && p_) return str();
  return "value is undefined";
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0.0;
    case Kind::kString:
      return !str().empty();
    case Kind::kList:
    case Kind::kTuple:
      return !list().empty();
    case Kind::kDict:
      return !dict().items.empty();
    default:
      return true;
  }
}

std::string_view Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kTuple:
      return "tuple";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kCallable:
      return "function";
    case Kind::kLoop:
      return "LoopContext";
    case Kind::kGenerator:
      return "generator";
  }
  return "object";
}

void AppendPyFloat(double f, std::string& out) {
  if (std::isnan(f)) {
    out += "nan";
    return;
  }
  if (std::isinf(f)) {
    out += f < 0 ? "-inf" : "inf";
    return;
  }
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
  std::string_view sci(buf, res.ptr - buf);
  bool neg = false;
  if (sci[0] == '-') {
    neg = true;
    sci.remove_prefix(1);
  }
  size_t epos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, epos))
    if (c != '.') digits += c;
  int exp = std::atoi(std::string(sci.substr(epos + 1)).c_str());
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  if (neg) out += '-';
  int decpt = exp + 1;
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (digits.size() > 1) {
      out += '.';
      out.append(digits, 1, std::string::npos);
    }
    char ebuf[16];
    std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += ebuf;
  } else if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-decpt), '0');
    out += digits;
  } else if (static_cast<size_t>(decpt) >= digits.size()) {
    out += digits;
    out.append(decpt - digits.size(), '0');
    out += ".0";
  } else {
    out.append(digits, 0, decpt);
    out += '.';
    out.append(digits, decpt, std::string::npos);
  }
}

namespace {
// Python's str.isprintable for one code point.
bool PyPrintable(int32_t cp) {
  if (cp < 0x80) return cp >= 0x20 && cp != 0x7f;
  switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}
}  // namespace

void AppendPyStrRepr(std::string_view s, std::string& out) {
  char quote = '\'';
  if (s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos) quote = '"';
  out += quote;
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      if (c == '\\') {
        out += "\\\\";
      } else if (c == static_cast<unsigned char>(quote)) {
        out += '\\';
        out += quote;
      } else if (c == '\n') {
        out += "\\n";
      } else if (c == '\r') {
        out += "\\r";
      } else if (c == '\t') {
        out += "\\t";
      } else if (c < 0x20 || c == 0x7f) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\x%02x", c);
        out += buf;
      } else {
        out += static_cast<char>(c);
      }
      continue;
    }
    int32_t cp = 0;
    auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                              static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    if (n <= 0) {  // invalid UTF-8: pass the byte through
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    if (PyPrintable(cp)) {
      out.append(s.substr(i, n));
    } else {
      char buf[16];
      if (cp < 0x100)
        std::snprintf(buf, sizeof buf, "\\x%02x", cp);
      else if (cp < 0x10000)
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      else
        std::snprintf(buf, sizeof buf, "\\U%08x", cp);
      out += buf;
    }
    i += n;
  }
  out += quote;
}

void Value::AppendRepr(std::string& out) const {
  switch (kind_) {
    case Kind::kString:
      AppendPyStrRepr(str(), out);
      return;
    case Kind::kUndefined:
      out += "Undefined";
      return;
    default:
      AppendStr(out);
  }
}

void Value::AppendStr(std::string& out) const {
  switch (kind_) {
    case Kind::kUndefined:
      return;
    case Kind::kNone:
      out += "None";
      return;
    case Kind::kBool:
      out += b_ ? "True" : "False";
      return;
    case Kind::kInt: {
      char buf[24];
      auto r = std::to_chars(buf, buf + sizeof buf, i_);
      out.append(buf, r.ptr);
      return;
    }
    case Kind::kFloat:
      AppendPyFloat(f_, out);
      return;
    case Kind::kString:
      out += str();
      return;
    case Kind::kList:
    case Kind::kTuple: {
      bool tuple = kind_ == Kind::kTuple;
      out += tuple ? '(' : '[';
      const auto& l = list();
      for (size_t i = 0; i < l.size(); ++i) {
        if (i) out += ", ";
        l[i].AppendRepr(out);
      }
      if (tuple && l.size() == 1) out += ',';
      out += tuple ? ')' : ']';
      return;
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      if (kind_ == Kind::kNamespace) out += "<Namespace ";
      out += '{';
      bool first = true;
      for (const auto& [k, v] : dict().items) {
        if (!first) out += ", ";
        first = false;
        k.AppendRepr(out);
        out += ": ";
        v.AppendRepr(out);
      }
      out += '}';
      if (kind_ == Kind::kNamespace) out += '>';
      return;
    }
    case Kind::kCallable:
      out += "<function " + callable().name + ">";
      return;
    case Kind::kLoop:
      out += "<LoopContext>";
      return;
    case Kind::kGenerator:
      // Python adds a memory address; a fixed one keeps the word shape.
      out += "<" + std::static_pointer_cast<GeneratorObj>(p_)->name + " at 0x7f0000000000>";
      return;
  }
}

std::string Value::ToStr() const {
  if (kind_ == Kind::kString) return str();
  std::string out;
  AppendStr(out);
  return out;
}

bool Value::Equals(const Value& o) const {
  if (is_number() && o.is_number()) {
    if (kind_ == Kind::kFloat || o.kind_ == Kind::kFloat) return as_double() == o.as_double();
    return as_int() == o.as_int();
  }
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return str() == o.str();
    case Kind::kList:
    case Kind::kTuple: {
      const auto& a = list();
      const auto& b = o.list();
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i)
        if (!a[i].Equals(b[i])) return false;
      return true;
    }
    case Kind::kDict: {
      const auto& a = dict().items;
      if (a.size() != o.dict().items.size()) return false;
      for (const auto& [k, v] : a) {
        const Value* ov = o.dict().Find(k);
        if (!ov || !v.Equals(*ov)) return false;
      }
      return true;
    }
    default:
      return p_ == o.p_;
  }
}

const Value* DictObj::Find(std::string_view key) const {
  for (const auto& kv : items)
    if (kv.first.is_string() && kv.first.str() == key) return &kv.second;
  return nullptr;
}

const Value* DictObj::Find(const Value& key) const {
  if (key.is_string()) return Find(std::string_view(key.str()));
  for (const auto& kv : items)
    if (kv.first.Equals(key)) return &kv.second;
  return nullptr;
}

void DictObj::Set(const Value& key, Value value) {
  for (auto& kv : items) {
    if (kv.first.Equals(key)) {
      kv.second = std::move(value);
      return;
    }
  }
  items.emplace_back(key, std::move(value));
}

Value CallArgs::Get(size_t pos, std::string_view name) const { return Get(pos, name, Value()); }

Value CallArgs::Get(size_t pos, std::string_view name, Value dflt) const {
  if (pos < args.size()) return args[pos];
  for (const auto& [k, v] : kwargs)
    if (k == name) return v;
  return dflt;
}

}  // namespace agentkv::text::chat::jinja
