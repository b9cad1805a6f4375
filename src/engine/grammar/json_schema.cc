#include "engine/grammar/json_schema.h"

#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <string>

#include "engine/grammar/json_lexical.h"
#include "engine/grammar/json_regex.h"
#include "engine/grammar/text_without.h"

namespace agentkv::grammar {
namespace {

using Json = nlohmann::ordered_json;

constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

const std::set<std::string>& SupportedKeywords() {
  static const std::set<std::string> k = {"type",
                                          "properties",
                                          "required",
                                          "additionalProperties",
                                          "items",
                                          "minItems",
                                          "maxItems",
                                          "enum",
                                          "const",
                                          "pattern",
                                          "minLength",
                                          "maxLength",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum",
                                          "anyOf",
                                          "$ref",
                                          "$defs",
                                          "definitions",
                                          "title",
                                          "description",
                                          "default",
                                          "examples",
                                          "$schema",
                                          "$id",
                                          "$comment"};
  return k;
}

Status Keyword(const std::string& kw, const std::string& why) {
  return InvalidArgument("JSON schema keyword \"" + kw + "\": " + why);
}

std::string Dump(const Json& v) { return v.dump(-1, ' ', false, Json::error_handler_t::replace); }

bool TypeMatches(const Json& v, const std::string& type) {
  if (type == "null") return v.is_null();
  if (type == "boolean") return v.is_boolean();
  if (type == "string") return v.is_string();
  if (type == "integer")
    return v.is_number_integer() ||
           (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  if (type == "number") return v.is_number();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  return false;
}

// A count keyword (minItems, maxLength, ...): a non-negative integer <= kMaxUnroll.
Result<int64_t> Count(const Json& s, const char* kw, int64_t dflt) {
  if (!s.contains(kw)) return dflt;
  const Json& v = s[kw];
  if (!v.is_number_integer() || v.get<int64_t>() < 0)
    return Keyword(kw, "must be a non-negative integer");
  if (v.get<int64_t>() > kMaxUnroll)
    return Keyword(kw, "at most " + std::to_string(kMaxUnroll) + " is supported");
  return v.get<int64_t>();
}

// An integer-valued bound; `up` rounds a fractional one up (else down).
Result<int64_t> IntBound(const Json& v, const char* kw, bool up) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(kI64Max))
      return Keyword(kw, "outside the 64-bit integer range");
    return v.get<int64_t>();
  }
  if (!v.is_number_float()) return Keyword(kw, "must be a number");
  const double d = up ? std::ceil(v.get<double>()) : std::floor(v.get<double>());
  if (!(d >= -9.2e18 && d <= 9.2e18)) return Keyword(kw, "outside the 64-bit integer range");
  return static_cast<int64_t>(d);
}

class Compiler {
 public:
  // Several compilers may share one builder (one per $ref root: each tool's
  // parameters schema).
  Compiler(const Json& root, GrammarBuilder& b) : root_(root), b_(b) {}

  GrammarBuilder& builder() { return b_; }

  Status Emit(const Json& s, int32_t from, int32_t to, int depth) {
    if (depth > kMaxSchemaDepth)
      return InvalidArgument("the JSON schema nests deeper than " +
                             std::to_string(kMaxSchemaDepth));
    RETURN_IF_ERROR(b_.status());
    if (s.is_boolean()) {
      if (!s.get<bool>()) return InvalidArgument("the JSON schema false accepts nothing");
      AnyValue(from, to);
      return Status::Ok();
    }
    if (!s.is_object()) return InvalidArgument("a JSON schema must be an object or a boolean");
    for (const auto& [k, v] : s.items()) {
      (void)v;
      if (!SupportedKeywords().count(k)) return Keyword(k, "not supported");
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const Json& x : t) {
          if (!x.is_string()) return Keyword("type", "must be a string or a list of strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        return Keyword("type", "must be a string or a list of strings");
      }
      for (const std::string& ty : types)
        if (ty != "null" && ty != "boolean" && ty != "string" && ty != "integer" &&
            ty != "number" && ty != "object" && ty != "array")
          return Keyword("type", "unknown type \"" + ty + "\"");
    }
    if (s.contains("enum") || s.contains("const")) return EmitLiterals(s, types, from, to);
    if (s.contains("$ref")) {
      for (const char* kw : {"anyOf", "type", "properties", "items"})
        if (s.contains(kw))
          return Keyword("$ref", std::string("together with \"") + kw + "\" is not supported");
      ASSIGN_OR_RETURN(int32_t start, RefRule(s["$ref"]));
      b_.AddCall(from, start, to);
      return Status::Ok();
    }
    if (s.contains("anyOf")) {
      const Json& alts = s["anyOf"];
      if (!alts.is_array() || alts.empty()) return Keyword("anyOf", "must be a non-empty list");
      if (!types.empty() || s.contains("properties") || s.contains("items"))
        return Keyword("anyOf", "together with type, properties or items is not supported");
      for (const Json& a : alts) RETURN_IF_ERROR(Emit(a, from, to, depth + 1));
      return Status::Ok();
    }
    if (types.empty()) {
      // Inferred from the keywords present; none: any value.
      if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties"))
        types.push_back("object");
      else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems"))
        types.push_back("array");
      else if (s.contains("pattern") || s.contains("minLength") || s.contains("maxLength"))
        types.push_back("string");
      else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
               s.contains("exclusiveMaximum"))
        types.push_back("number");
    }
    if (types.empty()) {
      AnyValue(from, to);
      return Status::Ok();
    }
    for (const std::string& ty : types) RETURN_IF_ERROR(EmitTyped(s, ty, from, to, depth));
    return Status::Ok();
  }

  // Compiles the $ref targets met so far (and those they meet).
  Status FinishRefs() {
    while (!pending_.empty()) {
      auto [schema, start, end] = pending_.front();
      pending_.pop_front();
      RETURN_IF_ERROR(Emit(*schema, start, end, 0));
    }
    return b_.status();
  }

  // Bounded whitespace: a call to the shared whitespace rule.
  int32_t Ws(int32_t from) {
    if (ws_start_ < 0) {
      std::vector<int32_t> w(static_cast<size_t>(kMaxWhitespace) + 1);
      for (int32_t& n : w) n = b_.NewNode();
      for (size_t i = 0; i < w.size(); ++i) {
        b_.MarkEnd(w[i]);
        if (i + 1 < w.size())
          for (char c : std::string(" \t\n\r")) b_.AddByte(w[i], static_cast<uint8_t>(c), w[i + 1]);
      }
      ws_start_ = w[0];
    }
    const int32_t n = b_.NewNode();
    b_.AddCall(from, ws_start_, n);
    return n;
  }

  // Any JSON value: a call to the shared (recursive) value rule.
  void AnyValue(int32_t from, int32_t to) {
    if (value_start_ < 0) BuildValueRule();
    b_.AddCall(from, value_start_, to);
  }

  void AnyObject(int32_t from, int32_t to) {
    if (value_start_ < 0) BuildValueRule();
    b_.AddCall(from, object_start_, to);
  }

 private:
  void BuildValueRule() {
    value_start_ = b_.NewNode();
    object_start_ = b_.NewNode();
    const int32_t end = b_.NewNode(), obj_end = b_.NewNode();
    b_.MarkEnd(end);
    b_.MarkEnd(obj_end);
    b_.AddLiteral(value_start_, "null", end);
    b_.AddLiteral(value_start_, "true", end);
    b_.AddLiteral(value_start_, "false", end);
    PlainString(0, Grammar::kUnboundedChars, value_start_, end);
    NumberAny(value_start_, end);
    b_.AddEps(value_start_, object_start_);
    b_.AddEps(obj_end, end);
    // Object: '{' ws ( '}' | member (',' ws member)* '}' ), member = string ws ':' ws value ws.
    int32_t o = Ws(b_.NewNodeAfter(object_start_, '{'));
    b_.AddByte(o, '}', obj_end);
    const int32_t after = b_.NewNode();
    Member(o, after);
    b_.AddByte(after, '}', obj_end);
    Member(Ws(b_.NewNodeAfter(after, ',')), after);
    // Array: '[' ws ( ']' | value ws (',' ws value ws)* ']' ).
    int32_t a = Ws(b_.NewNodeAfter(value_start_, '['));
    b_.AddByte(a, ']', end);
    const int32_t a_after = b_.NewNode();
    int32_t v = b_.NewNode();
    b_.AddCall(a, value_start_, v);
    b_.AddCall(Ws(v), ws_start_, a_after);
    b_.AddByte(a_after, ']', end);
    const int32_t comma = Ws(b_.NewNodeAfter(a_after, ','));
    v = b_.NewNode();
    b_.AddCall(comma, value_start_, v);
    b_.AddCall(v, ws_start_, a_after);
  }

  void Member(int32_t from, int32_t to) {
    const int32_t key_end = b_.NewNode();
    PlainString(0, Grammar::kUnboundedChars, from, key_end);
    const int32_t colon = Ws(b_.NewNodeAfter(Ws(key_end), ':'));
    const int32_t v = b_.NewNode();
    b_.AddCall(colon, value_start_, v);
    b_.AddCall(v, ws_start_, to);
  }

  // '"' + min..max characters + '"'.
  void PlainString(int64_t min, int64_t max, int32_t from, int32_t to) {
    int32_t cur = b_.NewNodeAfter(from, '"');
    const bool unbounded = max == Grammar::kUnboundedChars;
    const int64_t last = unbounded ? min : max;
    for (int64_t i = 0; i <= last && b_.status().ok(); ++i) {
      b_.SetStringRemaining(cur,
                            unbounded ? Grammar::kUnboundedChars : static_cast<int32_t>(max - i));
      if (i >= min) b_.AddByte(cur, '"', to);
      if (i == last) {
        if (unbounded) EmitJsonStringChar(b_, cur, cur);
        break;
      }
      const int32_t next = b_.NewNode();
      EmitJsonStringChar(b_, cur, next);
      cur = next;
    }
  }

  void IntPart(int32_t from, int32_t to) {
    b_.AddByte(from, '0', to);
    const int32_t d = b_.NewNode();
    b_.AddBytes(from, '1', '9', d);
    EmitDigits(b_, -1, d, to);
  }

  void NumberAny(int32_t from, int32_t to) {
    const int32_t sign = b_.NewNode();
    b_.AddEps(from, sign);
    b_.AddByte(from, '-', sign);
    const int32_t ip = b_.NewNode();
    IntPart(sign, ip);
    const int32_t fp = b_.NewNode();
    Fraction(ip, fp, /*zeros_only=*/false);
    b_.AddEps(fp, to);
    const int32_t e = b_.NewNode(), es = b_.NewNode(), ed = b_.NewNode();
    b_.AddByte(fp, 'e', e);
    b_.AddByte(fp, 'E', e);
    b_.AddEps(e, es);
    b_.AddByte(e, '+', es);
    b_.AddByte(e, '-', es);
    b_.AddBytes(es, '0', '9', ed);
    EmitDigits(b_, -1, ed, to);
  }

  // Optional '.' digits+ (or '.' '0'+).
  void Fraction(int32_t from, int32_t to, bool zeros_only) {
    b_.AddEps(from, to);
    const int32_t dot = b_.NewNodeAfter(from, '.'), d = b_.NewNode();
    const uint8_t hi = zeros_only ? '0' : '9';
    b_.AddBytes(dot, '0', hi, d);
    b_.AddBytes(d, '0', hi, d);
    b_.AddEps(d, to);
  }

  Status EmitLiterals(const Json& s, const std::vector<std::string>& types, int32_t from,
                      int32_t to) {
    const char* kw = s.contains("const") ? "const" : "enum";
    std::vector<Json> values;
    if (s.contains("const")) {
      values.push_back(s["const"]);
    } else {
      if (!s["enum"].is_array() || s["enum"].empty())
        return Keyword("enum", "must be a non-empty list");
      for (const Json& v : s["enum"]) values.push_back(v);
    }
    int n = 0;
    for (const Json& v : values) {
      bool ok = types.empty();
      for (const std::string& t : types) ok = ok || TypeMatches(v, t);
      if (!ok) continue;
      b_.AddLiteral(from, Dump(v), to);
      ++n;
    }
    if (n == 0) return Keyword(kw, "no value matches the schema's type");
    return b_.status();
  }

  Status EmitTyped(const Json& s, const std::string& ty, int32_t from, int32_t to, int depth) {
    if (ty == "null") {
      b_.AddLiteral(from, "null", to);
    } else if (ty == "boolean") {
      b_.AddLiteral(from, "true", to);
      b_.AddLiteral(from, "false", to);
    } else if (ty == "string") {
      return EmitString(s, from, to);
    } else if (ty == "integer") {
      return EmitInteger(s, from, to);
    } else if (ty == "number") {
      return EmitNumber(s, from, to);
    } else if (ty == "object") {
      return EmitObject(s, from, to, depth);
    } else {
      return EmitArray(s, from, to, depth);
    }
    return b_.status();
  }

  Status EmitString(const Json& s, int32_t from, int32_t to) {
    ASSIGN_OR_RETURN(int64_t min, Count(s, "minLength", 0));
    ASSIGN_OR_RETURN(int64_t max, Count(s, "maxLength", Grammar::kUnboundedChars));
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) return Keyword("pattern", "must be a string");
      if (s.contains("minLength") || s.contains("maxLength"))
        return Keyword("pattern", "together with minLength or maxLength is not supported");
      const int32_t open = b_.NewNodeAfter(from, '"'), close = b_.NewNode();
      RETURN_IF_ERROR(EmitJsonRegex(b_, s["pattern"].get<std::string>(), open, close));
      b_.AddByte(close, '"', to);
      return b_.status();
    }
    if (min > max) return Keyword("minLength", "greater than maxLength");
    PlainString(min, max, from, to);
    return b_.status();
  }

  Status EmitInteger(const Json& s, int32_t from, int32_t to) {
    int64_t lo = kI64Min, hi = kI64Max;
    if (s.contains("minimum")) {
      ASSIGN_OR_RETURN(lo, IntBound(s["minimum"], "minimum", true));
    }
    if (s.contains("maximum")) {
      ASSIGN_OR_RETURN(hi, IntBound(s["maximum"], "maximum", false));
    }
    if (s.contains("exclusiveMinimum")) {
      ASSIGN_OR_RETURN(int64_t x, IntBound(s["exclusiveMinimum"], "exclusiveMinimum", false));
      if (x == kI64Max) return Keyword("exclusiveMinimum", "no integer in range");
      lo = std::max(lo, x + 1);
    }
    if (s.contains("exclusiveMaximum")) {
      ASSIGN_OR_RETURN(int64_t x, IntBound(s["exclusiveMaximum"], "exclusiveMaximum", true));
      if (x == kI64Min) return Keyword("exclusiveMaximum", "no integer in range");
      hi = std::min(hi, x - 1);
    }
    if (lo > hi) return Keyword("minimum", "no integer lies within the bounds");
    if (hi >= 0)
      EmitUintRange(b_, static_cast<uint64_t>(std::max<int64_t>(lo, 0)), static_cast<uint64_t>(hi),
                    from, to);
    if (lo < 0) {
      const int32_t neg = b_.NewNodeAfter(from, '-');
      const uint64_t kmin = hi < 0 ? static_cast<uint64_t>(-(hi + 1)) + 1 : 1;
      const uint64_t kmax = static_cast<uint64_t>(-(lo + 1)) + 1;
      EmitUintRange(b_, kmin, kmax, neg, to);
    }
    return b_.status();
  }

  Status EmitNumber(const Json& s, int32_t from, int32_t to) {
    for (const char* kw : {"exclusiveMinimum", "exclusiveMaximum"})
      if (s.contains(kw)) return Keyword(kw, "is supported on integers only");
    std::optional<int64_t> lo, hi;
    for (const char* kw : {"minimum", "maximum"}) {
      if (!s.contains(kw)) continue;
      const Json& v = s[kw];
      if (!v.is_number() || (v.is_number_float() && std::floor(v.get<double>()) != v.get<double>()))
        return Keyword(kw, "on numbers only integer values are supported");
      ASSIGN_OR_RETURN(int64_t x, IntBound(v, kw, true));
      (std::string(kw) == "minimum" ? lo : hi) = x;
    }
    if (!lo && !hi) {
      NumberAny(from, to);
      return b_.status();
    }
    if (lo && hi && *lo > *hi) return Keyword("minimum", "greater than maximum");
    // x >= 0 written "k[.f]": k in [max(lo,0), hi-1] any fraction, k == hi zeros only.
    auto part = [&](int32_t start, uint64_t kmin, std::optional<uint64_t> kmax) {
      const int32_t any = b_.NewNode();
      if (!kmax) {
        EmitUintRange(b_, kmin, static_cast<uint64_t>(kI64Max), start, any);
      } else {
        if (*kmax > kmin) EmitUintRange(b_, kmin, *kmax - 1, start, any);
        if (*kmax >= kmin) {
          const int32_t zero = b_.NewNode();
          EmitUintRange(b_, *kmax, *kmax, start, zero);
          Fraction(zero, to, true);
        }
      }
      Fraction(any, to, false);
    };
    if (!hi || *hi >= 0) {
      const uint64_t kmin = lo ? static_cast<uint64_t>(std::max<int64_t>(*lo, 0)) : 0;
      part(from, kmin, hi ? std::optional<uint64_t>(static_cast<uint64_t>(*hi)) : std::nullopt);
    }
    // x < 0 written "-k[.f]": k in [max(0,-hi), -lo-1] any fraction, k == -lo zeros only.
    if (!lo || *lo < 0) {
      const int32_t neg = b_.NewNodeAfter(from, '-');
      const uint64_t kmin = hi && *hi < 0 ? static_cast<uint64_t>(-(*hi + 1)) + 1 : 0;
      part(neg, kmin,
           lo ? std::optional<uint64_t>(static_cast<uint64_t>(-(*lo + 1)) + 1) : std::nullopt);
    }
    return b_.status();
  }

  Status EmitObject(const Json& s, int32_t from, int32_t to, int depth) {
    bool additional = true;
    if (s.contains("additionalProperties")) {
      const Json& a = s["additionalProperties"];
      if (!a.is_boolean())
        return Keyword("additionalProperties", "only true or false is supported");
      additional = a.get<bool>();
    }
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return Keyword("required", "must be a list of strings");
      for (const Json& r : s["required"]) {
        if (!r.is_string()) return Keyword("required", "must be a list of strings");
        required.insert(r.get<std::string>());
      }
    }
    const bool has_props = s.contains("properties");
    if (has_props && !s["properties"].is_object())
      return Keyword("properties", "must be an object");
    for (const std::string& r : required)
      if (!has_props || !s["properties"].contains(r))
        return Keyword("required", "\"" + r + "\" is not in properties");
    if (!has_props && additional) {
      AnyObject(from, to);
      return b_.status();
    }
    const int32_t open = Ws(b_.NewNodeAfter(from, '{'));
    // first: nothing written yet; rest: a property written (next needs ',').
    int32_t first = open, rest = b_.NewNode();
    bool first_live = true;
    if (has_props) {
      for (const auto& item : s["properties"].items()) {
        // Named copies: a lambda may not capture structured bindings
        // (C++20 before P1091 in clang).
        const std::string& name = item.key();
        const auto& sub = item.value();
        const bool req = required.count(name) > 0;
        const int32_t next_rest = b_.NewNode();
        const int32_t next_first = req ? -1 : b_.NewNode();
        // A property: key ws ':' ws value ws.
        auto prop = [&](int32_t at) -> Status {
          const int32_t key_end = b_.NewNode();
          b_.AddLiteral(at, Dump(Json(name)), key_end);
          const int32_t colon = Ws(b_.NewNodeAfter(Ws(key_end), ':'));
          const int32_t v = b_.NewNode();
          RETURN_IF_ERROR(Emit(sub, colon, v, depth + 1));
          b_.AddCall(v, ws_start_, next_rest);
          return b_.status();
        };
        if (first_live) RETURN_IF_ERROR(prop(first));
        RETURN_IF_ERROR(prop(Ws(b_.NewNodeAfter(rest, ','))));
        if (!req) {
          if (first_live) b_.AddEps(first, next_first);
          b_.AddEps(rest, next_rest);
        }
        first = next_first;
        first_live = !req && first_live;
        rest = next_rest;
      }
    }
    if (first_live) b_.AddByte(first, '}', to);
    b_.AddByte(rest, '}', to);
    return b_.status();
  }

  Status EmitArray(const Json& s, int32_t from, int32_t to, int depth) {
    ASSIGN_OR_RETURN(int64_t min, Count(s, "minItems", 0));
    ASSIGN_OR_RETURN(int64_t max, Count(s, "maxItems", -1));
    if (max >= 0 && min > max) return Keyword("minItems", "greater than maxItems");
    int32_t item = -1;
    if (s.contains("items")) {
      const Json& it = s["items"];
      if (!it.is_object() && !it.is_boolean())
        return Keyword("items", "only a single schema is supported (no tuple form)");
      if (it.is_boolean() && !it.get<bool>()) {
        if (min > 0) return Keyword("items", "false with minItems > 0 accepts nothing");
        max = 0;
      } else {
        item = b_.NewNode();
        const int32_t end = b_.NewNode();
        b_.MarkEnd(end);
        RETURN_IF_ERROR(Emit(it, item, end, depth + 1));
      }
    }
    if (item < 0) {
      if (value_start_ < 0) BuildValueRule();
      item = value_start_;
    }
    // Element k: (k > 0: ',' ws) item ws.
    auto element = [&](int32_t at, int64_t k, int32_t next) {
      const int32_t start = k > 0 ? Ws(b_.NewNodeAfter(at, ',')) : at;
      const int32_t v = b_.NewNode();
      b_.AddCall(start, item, v);
      b_.AddCall(v, ws_start_, next);
    };
    int32_t cur = Ws(b_.NewNodeAfter(from, '['));
    const int64_t unrolled = max >= 0 ? max : std::max<int64_t>(min, 1);
    for (int64_t k = 0; k < unrolled && b_.status().ok(); ++k) {
      if (k >= min) b_.AddByte(cur, ']', to);
      const int32_t next = b_.NewNode();
      element(cur, k, next);
      cur = next;
    }
    if (max < 0) element(cur, 1, cur);  // more elements, each after a ','
    b_.AddByte(cur, ']', to);
    return b_.status();
  }

  Result<int32_t> RefRule(const Json& ref) {
    if (!ref.is_string()) return Keyword("$ref", "must be a string");
    const std::string r = ref.get<std::string>();
    if (auto it = refs_.find(r); it != refs_.end()) return it->second;
    const Json* target = nullptr;
    if (r == "#") {
      target = &root_;
    } else {
      for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
        const std::string p(prefix);
        if (r.compare(0, p.size(), p) != 0) continue;
        std::string name = r.substr(p.size());
        // JSON pointer escapes.
        for (size_t i = 0; (i = name.find('~', i)) != std::string::npos; ++i) {
          if (i + 1 < name.size() && name[i + 1] == '1')
            name.replace(i, 2, "/");
          else if (i + 1 < name.size() && name[i + 1] == '0')
            name.replace(i, 2, "~");
        }
        const std::string section = p.substr(2, p.size() - 3);
        if (root_.contains(section) && root_[section].is_object() && root_[section].contains(name))
          target = &root_[section][name];
      }
    }
    if (target == nullptr)
      return Keyword("$ref", "\"" + r + "\" is not \"#\" or a name under #/$defs or #/definitions");
    const int32_t start = b_.NewNode(), end = b_.NewNode();
    b_.MarkEnd(end);
    refs_[r] = start;
    pending_.push_back({target, start, end});
    return start;
  }

  struct Pending {
    const Json* schema;
    int32_t start, end;
  };

  const Json& root_;
  GrammarBuilder& b_;
  int32_t ws_start_ = -1, value_start_ = -1, object_start_ = -1;
  std::map<std::string, int32_t> refs_;
  std::deque<Pending> pending_;
};

Result<std::shared_ptr<const Grammar>> Finish(Compiler& c, int32_t root,
                                              std::shared_ptr<const TokenVocabulary> vocab) {
  RETURN_IF_ERROR(c.FinishRefs());
  return c.builder().Finish(root, std::move(vocab));
}

}  // namespace

Result<std::shared_ptr<const Grammar>> CompileJsonSchema(
    const nlohmann::ordered_json& schema, std::shared_ptr<const TokenVocabulary> vocab,
    GrammarLimits limits) {
  if (Dump(schema).size() > kMaxSchemaBytes)
    return InvalidArgument("the JSON schema is longer than " + std::to_string(kMaxSchemaBytes) +
                           " bytes");
  GrammarBuilder b(limits);
  Compiler c(schema, b);
  const int32_t root = c.builder().NewNode(), end = c.builder().NewNode();
  c.builder().MarkEnd(end);
  RETURN_IF_ERROR(c.Emit(schema, root, end, 0));
  return Finish(c, root, std::move(vocab));
}

Result<std::shared_ptr<const Grammar>> CompileJsonSchema(
    const nlohmann::json& schema, std::shared_ptr<const TokenVocabulary> vocab,
    GrammarLimits limits) {
  return CompileJsonSchema(nlohmann::ordered_json(schema), std::move(vocab), limits);
}

Result<std::shared_ptr<const Grammar>> CompileAnyJsonObject(
    std::shared_ptr<const TokenVocabulary> vocab, GrammarLimits limits) {
  const Json schema = Json::object();
  GrammarBuilder b(limits);
  Compiler c(schema, b);
  const int32_t root = c.builder().NewNode(), end = c.builder().NewNode();
  c.builder().MarkEnd(end);
  c.AnyObject(root, end);
  return Finish(c, root, std::move(vocab));
}

Result<std::shared_ptr<const Grammar>> CompileJsonObjectStream(
    std::shared_ptr<const TokenVocabulary> vocab, GrammarLimits limits) {
  ASSIGN_OR_RETURN(std::shared_ptr<const Grammar> object, CompileAnyJsonObject(vocab, limits));
  GrammarBuilder b(limits);
  // loop: an object, then back to loop; no node of `b`'s own ends, so the
  // whole never accepts.
  const int32_t loop = b.NewNode();
  b.AddCall(loop, b.Splice(*object), loop);
  return b.Finish(loop, std::move(vocab));
}

Result<std::shared_ptr<const Grammar>> CompileToolCallGrammar(
    const std::vector<ToolGrammarSpec>& tools, const ToolGrammarOptions& options,
    std::shared_ptr<const TokenVocabulary> vocab, GrammarLimits limits) {
  if (tools.empty()) return InvalidArgument("tool_choice: no tools to call");
  std::string open, close, args_key = "arguments", marker;
  switch (options.syntax) {
    case ToolCallSyntax::kHermes:
      open = "<tool_call>\n", close = "\n</tool_call>", marker = "<tool_call>";
      break;
    case ToolCallSyntax::kLlama31Json:
      args_key = "parameters";
      if (!options.required)
        return InvalidArgument(
            "strict tool arguments without tool_choice required are not "
            "supported for this model's tool-call format");
      break;
    case ToolCallSyntax::kGemmaFenced:
      open = "```tool_call\n", close = "\n```", marker = "```tool_call";
      break;
  }
  size_t bytes = 0;
  for (const auto& t : tools) bytes += t.parameters.dump().size();
  if (bytes > kMaxSchemaBytes)
    return InvalidArgument("the tools' parameters are longer than " +
                           std::to_string(kMaxSchemaBytes) + " bytes");
  GrammarBuilder b(limits);
  const Json empty = Json::object();
  Compiler shared(empty, b);
  const int32_t root = b.NewNode(), end = b.NewNode();
  b.MarkEnd(end);
  // One call: open {"name": "<name>", "<args_key>": <arguments>} close.
  const int32_t call = b.NewNode(), call_end = b.NewNode();
  b.MarkEnd(call_end);
  const int32_t body = b.NewNode(), body_end = b.NewNode();
  b.AddLiteral(call, open, body);
  b.AddLiteral(body_end, close, call_end);
  std::vector<std::unique_ptr<Compiler>> compilers;
  for (const auto& t : tools) {
    compilers.push_back(std::make_unique<Compiler>(t.parameters, b));
    Compiler& c = *compilers.back();
    int32_t n = shared.Ws(b.NewNodeAfter(body, '{'));
    const int32_t key = b.NewNode();
    b.AddLiteral(n, "\"name\"", key);
    n = shared.Ws(b.NewNodeAfter(shared.Ws(key), ':'));
    const int32_t name_end = b.NewNode();
    b.AddLiteral(n, Dump(Json(t.name)), name_end);
    n = shared.Ws(b.NewNodeAfter(shared.Ws(name_end), ','));
    const int32_t key2 = b.NewNode();
    b.AddLiteral(n, Dump(Json(args_key)), key2);
    n = shared.Ws(b.NewNodeAfter(shared.Ws(key2), ':'));
    const int32_t args_end = b.NewNode();
    if (t.constrain_arguments) {
      Status s = c.Emit(t.parameters, n, args_end, 0);
      if (!s.ok()) return s.WithContext("tool \"" + t.name + "\" parameters");
      RETURN_IF_ERROR(c.FinishRefs());
    } else {
      shared.AnyObject(n, args_end);
    }
    b.AddByte(shared.Ws(args_end), '}', body_end);
  }
  int32_t start = root;
  if (options.starts_in_reasoning) {
    // The rest of the reasoning, then its end marker.
    start = b.NewNode();
    const int32_t text = b.NewNode(), after = b.NewNode();
    b.AddEps(root, text);
    b.AddBytes(text, 0x00, 0xFF, text);
    b.AddLiteral(text, "</think>", after);
    b.AddEps(shared.Ws(after), start);
  }
  if (options.required) {
    b.AddCall(start, call, end);
  } else {
    // Text without the call marker, then any number of (call, text).
    const int32_t loop = b.NewNode();
    TextWithout(b, marker, start, loop);
    b.AddEps(loop, end);
    const int32_t after_call = b.NewNode();
    b.AddCall(loop, call, after_call);
    TextWithout(b, marker, after_call, loop);
  }
  RETURN_IF_ERROR(shared.FinishRefs());
  return b.Finish(root, std::move(vocab));
}

}  // namespace agentkv::grammar
