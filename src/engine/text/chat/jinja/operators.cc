// Python operator semantics, JSON encoding and object methods on Values.
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "engine/text/chat/jinja/builtins.h"
#include "engine/text/chat/jinja/error.h"
#include "engine/text/chat/jinja/interpreter.h"
#include "engine/text/chat/jinja/strings.h"

namespace agentkv::text::chat::jinja {
namespace {

std::string Quoted(const Value& v) { return "'" + std::string(v.TypeName()) + "'"; }

[[noreturn]] void Unsupported(const std::string& op, const Value& a, const Value& b) {
  ThrowRuntime("unsupported operand type(s) for " + op + ": " + Quoted(a) + " and " + Quoted(b));
}

// Python's integers never overflow; these are 64-bit, so a result outside
// int64 is a template error rather than undefined behaviour.
[[noreturn]] void Overflow() { ThrowRuntime("integer result out of range (64-bit integers)"); }

int64_t IntAdd(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) Overflow();
  return r;
}

int64_t IntSub(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) Overflow();
  return r;
}

int64_t IntMul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) Overflow();
  return r;
}

// By squaring: O(log e) steps, so `1 ** 10**18` ends too. Squaring the base
// overflows only when a later factor would make the result overflow anyway.
int64_t IntPow(int64_t base, int64_t e) {
  int64_t r = 1;
  while (e > 0) {
    if (e & 1) r = IntMul(r, base);
    e >>= 1;
    if (e > 0) base = IntMul(base, base);
  }
  return r;
}

int64_t FloorDiv(int64_t a, int64_t b) {
  if (a == INT64_MIN && b == -1) Overflow();
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t PyMod(int64_t a, int64_t b) {
  if (b == -1) return 0;  // INT64_MIN % -1 overflows in C++
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

Value Repeat(const Value& seq, int64_t n) {
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value::Str(std::move(out));
  }
  ValueList out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
  return seq.is_list() ? Value::MakeList(std::move(out)) : Value::MakeTuple(std::move(out));
}

// printf-style "%s" % args: flags, width and precision for s, r, d, i, f,
// e, g, x, o and %%.
Value PercentFormat(const std::string& fmt, const Value& arg) {
  ValueList args = arg.kind() == Value::Kind::kTuple ? arg.list() : ValueList{arg};
  std::string out;
  size_t ai = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    size_t start = i++;
    while (i < fmt.size() &&
           std::string_view("-+ #0123456789.").find(fmt[i]) != std::string_view::npos)
      ++i;
    if (i >= fmt.size()) ThrowRuntime("incomplete format");
    std::string spec = fmt.substr(start, i - start);
    char c = fmt[i];
    if (c == '%') {
      out += '%';
      continue;
    }
    if (ai >= args.size()) ThrowRuntime("not enough arguments for format string");
    const Value& v = args[ai++];
    char buf[512];
    if (c == 's' || c == 'r') {
      std::string s;
      if (c == 's')
        v.AppendStr(s);
      else
        v.AppendRepr(s);
      std::snprintf(buf, sizeof buf, (spec + "s").c_str(), s.c_str());
      out += spec.size() > 1 ? std::string(buf) : s;
    } else if (c == 'd' || c == 'i' || c == 'x' || c == 'X' || c == 'o') {
      if (!v.is_number())
        ThrowRuntime(std::string("%") + c + " format: a real number is required, not " +
                     std::string(v.TypeName()));
      long long x = v.is_float() ? static_cast<long long>(v.as_double()) : v.as_int();
      std::snprintf(buf, sizeof buf, (spec + "ll" + (c == 'i' ? 'd' : c)).c_str(), x);
      out += buf;
    } else if (c == 'f' || c == 'F' || c == 'e' || c == 'E' || c == 'g' || c == 'G') {
      if (!v.is_number()) ThrowRuntime("must be real number, not " + std::string(v.TypeName()));
      std::snprintf(buf, sizeof buf, (spec + c).c_str(), v.as_double());
      out += buf;
    } else {
      ThrowRuntime(std::string("unsupported format character '") + c + "'");
    }
  }
  // Python treats objects with __getitem__ (dicts, jinja2's Undefined) as
  // mappings, which may go unused.
  if (ai < args.size() && !arg.is_dict() && !arg.is_undefined())
    ThrowRuntime("not all arguments converted during string formatting");
  return Value::Str(std::move(out));
}

}  // namespace

Value BinaryOp(const std::string& op, const Value& a, const Value& b) {
  const bool nums = a.is_number() && b.is_number();
  const bool flt = nums && (a.is_float() || b.is_float());
  switch (op[0]) {
    case '+':
      if (nums)
        return flt ? Value::Float(a.as_double() + b.as_double())
                   : Value::Int(IntAdd(a.as_int(), b.as_int()));
      if (a.is_string() && b.is_string()) return Value::Str(a.str() + b.str());
      if (a.kind() == b.kind() && a.is_list_like()) {
        ValueList out = a.list();
        out.insert(out.end(), b.list().begin(), b.list().end());
        return a.is_list() ? Value::MakeList(std::move(out)) : Value::MakeTuple(std::move(out));
      }
      if (a.is_string())
        ThrowRuntime("can only concatenate str (not " + std::string("\"") +
                     std::string(b.TypeName()) + "\") to str");
      if (a.is_list())
        ThrowRuntime("can only concatenate list (not \"" + std::string(b.TypeName()) +
                     "\") to list");
      Unsupported("+", a, b);
    case '-':
      if (nums)
        return flt ? Value::Float(a.as_double() - b.as_double())
                   : Value::Int(IntSub(a.as_int(), b.as_int()));
      Unsupported("-", a, b);
    case '*':
      if (op == "**") {
        if (!nums) Unsupported("** or pow()", a, b);
        if (!flt && b.as_int() >= 0) return Value::Int(IntPow(a.as_int(), b.as_int()));
        return Value::Float(std::pow(a.as_double(), b.as_double()));
      }
      if (nums)
        return flt ? Value::Float(a.as_double() * b.as_double())
                   : Value::Int(IntMul(a.as_int(), b.as_int()));
      if ((a.is_string() || a.is_list_like()) && (b.is_int() || b.is_bool()))
        return Repeat(a, b.as_int());
      if ((b.is_string() || b.is_list_like()) && (a.is_int() || a.is_bool()))
        return Repeat(b, a.as_int());
      Unsupported("*", a, b);
    case '/':
      if (!nums) Unsupported(op, a, b);
      if (b.as_double() == 0) ThrowRuntime(flt ? "float division by zero" : "division by zero");
      if (op == "//") {
        if (flt) return Value::Float(std::floor(a.as_double() / b.as_double()));
        return Value::Int(FloorDiv(a.as_int(), b.as_int()));
      }
      return Value::Float(a.as_double() / b.as_double());
    case '%':
      if (a.is_string()) return PercentFormat(a.str(), b);
      if (!nums) Unsupported("%", a, b);
      if (b.as_double() == 0) ThrowRuntime("modulo by zero");
      if (flt) {
        double r = std::fmod(a.as_double(), b.as_double());
        if (r != 0 && ((r < 0) != (b.as_double() < 0))) r += b.as_double();
        return Value::Float(r);
      }
      return Value::Int(PyMod(a.as_int(), b.as_int()));
    default:
      ThrowRuntime("unknown operator " + op);
  }
}

bool LessThan(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();
  if (a.kind() == b.kind() && a.is_list_like()) {
    const auto& x = a.list();
    const auto& y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (x[i].Equals(y[i])) continue;
      return LessThan(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  ThrowRuntime("'<' not supported between instances of " + Quoted(a) + " and " + Quoted(b));
}

bool Contains(const Value& c, const Value& item) {
  switch (c.kind()) {
    case Value::Kind::kString:
      if (!item.is_string())
        ThrowRuntime("'in <string>' requires string as left operand, not " +
                     std::string(item.TypeName()));
      return c.str().find(item.str()) != std::string::npos;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      for (const auto& v : c.list())
        if (v.Equals(item)) return true;
      return false;
    case Value::Kind::kDict:
      return c.dict().Find(item) != nullptr;
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kGenerator:
      for (const auto& v : c.Consume())
        if (v.Equals(item)) return true;
      return false;
    default:
      ThrowRuntime("argument of type " + Quoted(c) + " is not iterable");
  }
}

// ---- JSON ----

namespace {

void JsonString(std::string_view s, bool ensure_ascii, std::string& out) {
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    char buf[16];
    if (c >= 0x80 && ensure_ascii) {
      auto cps = SplitCodepoints(s.substr(i, 4));
      std::string_view one = cps[0];
      uint32_t cp = 0;
      int extra = one.size() - 1;
      cp = extra == 0 ? c : (c & (0x3F >> extra));
      for (size_t k = 1; k < one.size(); ++k) cp = (cp << 6) | (one[k] & 0x3F);
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (cp >> 10),
                      0xDC00 + (cp & 0x3FF));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      }
      out += buf;
      i += one.size();
      continue;
    }
    ++i;
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

struct JsonWriter {
  std::string indent;  // empty with has_indent=false means compact
  bool has_indent;
  std::string item_sep, key_sep;
  bool sort_keys, ensure_ascii;
  std::string& out;

  void Newline(int level) {
    out += '\n';
    for (int i = 0; i < level; ++i) out += indent;
  }

  void Write(const Value& v, int level) {
    switch (v.kind()) {
      case Value::Kind::kNone:
        out += "null";
        return;
      case Value::Kind::kBool:
        out += v.as_bool() ? "true" : "false";
        return;
      case Value::Kind::kInt:
        out += std::to_string(v.as_int());
        return;
      case Value::Kind::kFloat: {
        double f = v.as_double();
        if (std::isnan(f))
          out += "NaN";
        else if (std::isinf(f))
          out += f < 0 ? "-Infinity" : "Infinity";
        else
          AppendPyFloat(f, out);
        return;
      }
      case Value::Kind::kString:
        JsonString(v.str(), ensure_ascii, out);
        return;
      case Value::Kind::kList:
      case Value::Kind::kTuple: {
        const auto& l = v.list();
        if (l.empty()) {
          out += "[]";
          return;
        }
        out += '[';
        for (size_t i = 0; i < l.size(); ++i) {
          if (i) out += item_sep;
          if (has_indent) Newline(level + 1);
          Write(l[i], level + 1);
        }
        if (has_indent) Newline(level);
        out += ']';
        return;
      }
      case Value::Kind::kDict: {
        std::vector<const std::pair<Value, Value>*> items;
        for (const auto& kv : v.dict().items) items.push_back(&kv);
        if (items.empty()) {
          out += "{}";
          return;
        }
        if (sort_keys)
          std::stable_sort(items.begin(), items.end(),
                           [](auto* x, auto* y) { return LessThan(x->first, y->first); });
        out += '{';
        bool first = true;
        for (auto* kv : items) {
          if (!first) out += item_sep;
          first = false;
          if (has_indent) Newline(level + 1);
          const Value& k = kv->first;
          if (k.is_string()) {
            JsonString(k.str(), ensure_ascii, out);
          } else if (k.is_none() || k.is_bool() || k.is_int() || k.is_float()) {
            out += '"';
            Write(k, level);
            out += '"';
          } else {
            ThrowRuntime("keys must be str, int, float, bool or None, not " +
                         std::string(k.TypeName()));
          }
          out += key_sep;
          Write(kv->second, level + 1);
        }
        if (has_indent) Newline(level);
        out += '}';
        return;
      }
      default:
        ThrowRuntime("Object of type " + std::string(v.TypeName()) + " is not JSON serializable");
    }
  }
};

}  // namespace

void DumpJson(const Value& v, const Value& indent, const std::string& item_sep,
              const std::string& key_sep, bool sort_keys, bool ensure_ascii, std::string& out) {
  JsonWriter w{"", false, item_sep, key_sep, sort_keys, ensure_ascii, out};
  if (!indent.is_none() && !indent.is_undefined()) {
    w.has_indent = true;
    if (indent.is_string())
      w.indent = indent.str();
    else
      w.indent = std::string(std::max<int64_t>(0, indent.as_int()), ' ');
  }
  w.Write(v, 0);
}

}  // namespace agentkv::text::chat::jinja
