// Methods of str, dict and list that the sandbox lets templates call.
#include <unordered_set>

#include "engine/text/chat/jinja/builtins.h"
#include "engine/text/chat/jinja/error.h"
#include "engine/text/chat/jinja/interpreter.h"
#include "engine/text/chat/jinja/strings.h"

namespace agentkv::text::chat::jinja {
namespace {

std::optional<std::string> OptStr(const Value& v) {
  if (v.is_none() || v.is_undefined()) return std::nullopt;
  if (!v.is_string()) ThrowRuntime("expected a string argument, got " + std::string(v.TypeName()));
  return v.str();
}

const std::string& StrArg(const Value& v, const char* what) {
  if (!v.is_string())
    ThrowRuntime(std::string(what) + " arg must be str, not " + std::string(v.TypeName()));
  return v.str();
}

int64_t IntArg(const Value& v, int64_t dflt) {
  if (v.is_undefined() || v.is_none()) return dflt;
  if (!v.is_int() && !v.is_bool()) ThrowRuntime("expected an integer argument");
  return v.as_int();
}

Value Bound(const std::string& name, std::function<Value(CallArgs&)> fn) {
  return Value::MakeCallable(name,
                             [fn = std::move(fn)](Interpreter&, CallArgs& a) { return fn(a); });
}

Value Unsafe(const Value& obj, const std::string& name) {
  std::string msg = "access to attribute '" + name + "' of '" + std::string(obj.TypeName()) +
                    "' object is unsafe.";
  return Value::MakeCallable(name, [msg](Interpreter&, CallArgs&) -> Value {
    throw TemplateError(TemplateError::Kind::kSecurity, msg);
  });
}

bool AffixMatch(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& a) {
    const std::string& x = StrArg(a, prefix ? "startswith" : "endswith");
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0
                  : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.kind() == Value::Kind::kTuple) {
    for (const auto& a : affix.list())
      if (one(a)) return true;
    return false;
  }
  return one(affix);
}

// str.format with {} / {0} / {name} fields (no format specs beyond none).
std::string PyFormat(const std::string& fmt, CallArgs& a) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (c == '{') {
      size_t e = fmt.find('}', i);
      if (e == std::string::npos) ThrowRuntime("Single '{' encountered in format string");
      std::string field = fmt.substr(i + 1, e - i - 1);
      Value v;
      if (field.empty()) {
        v = auto_idx < a.args.size() ? a.args[auto_idx++] : Value();
      } else if (std::isdigit(static_cast<unsigned char>(field[0]))) {
        size_t k = std::stoul(field);
        if (k < a.args.size()) v = a.args[k];
      } else {
        for (auto& [n, x] : a.kwargs)
          if (n == field) v = x;
      }
      if (v.is_undefined() && !field.empty() && !std::isdigit(static_cast<unsigned char>(field[0])))
        ThrowRuntime("KeyError: '" + field + "'");
      if (v.is_undefined() && (field.empty() || std::isdigit(static_cast<unsigned char>(field[0]))))
        ThrowRuntime("Replacement index out of range for positional args tuple");
      v.AppendStr(out);
      i = e;
    } else {
      out += c;
    }
  }
  return out;
}

Value StrMethod(const Value& obj, const std::string& name) {
  const std::string s = obj.str();
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool l = name != "rstrip", r = name != "lstrip";
    return Bound(name, [s, l, r](CallArgs& a) {
      return Value::Str(PyStrip(s, OptStr(a.Get(0, "chars")), l, r));
    });
  }
  if (name == "split" || name == "rsplit") {
    return Bound(name, [s](CallArgs& a) {
      auto sep = OptStr(a.Get(0, "sep"));
      if (sep && sep->empty()) ThrowRuntime("empty separator");
      ValueList out;
      for (auto& p : PySplit(s, sep, IntArg(a.Get(1, "maxsplit"), -1)))
        out.push_back(Value::Str(std::move(p)));
      return Value::MakeList(std::move(out));
    });
  }
  if (name == "splitlines") {
    return Bound(name, [s](CallArgs&) {
      ValueList out;
      size_t pos = 0;
      while (pos < s.size()) {
        size_t e = s.find_first_of("\r\n", pos);
        if (e == std::string::npos) {
          out.push_back(Value::Str(s.substr(pos)));
          break;
        }
        out.push_back(Value::Str(s.substr(pos, e - pos)));
        pos = e + ((s[e] == '\r' && e + 1 < s.size() && s[e + 1] == '\n') ? 2 : 1);
      }
      return Value::MakeList(std::move(out));
    });
  }
  if (name == "startswith" || name == "endswith") {
    bool prefix = name == "startswith";
    return Bound(name, [s, prefix](CallArgs& a) {
      return Value::Bool(AffixMatch(s, a.Get(0, "prefix"), prefix));
    });
  }
  if (name == "upper") return Bound(name, [s](CallArgs&) { return Value::Str(PyUpper(s)); });
  if (name == "lower") return Bound(name, [s](CallArgs&) { return Value::Str(PyLower(s)); });
  if (name == "title") return Bound(name, [s](CallArgs&) { return Value::Str(PyTitle(s)); });
  if (name == "capitalize")
    return Bound(name, [s](CallArgs&) { return Value::Str(PyCapitalize(s)); });
  if (name == "replace") {
    return Bound(name, [s](CallArgs& a) {
      return Value::Str(PyReplace(s, StrArg(a.Get(0, "old"), "replace"),
                                  StrArg(a.Get(1, "new"), "replace"),
                                  IntArg(a.Get(2, "count"), -1)));
    });
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    return Bound(name, [s, name](CallArgs& a) {
      const std::string& sub = StrArg(a.Get(0, "sub"), name.c_str());
      if (name == "count") {
        if (sub.empty()) return Value::Int(CodepointCount(s) + 1);
        int64_t n = 0;
        for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
        return Value::Int(n);
      }
      size_t p = (name[0] == 'r') ? s.rfind(sub) : s.find(sub);
      if (p == std::string::npos) {
        if (name == "index" || name == "rindex") ThrowRuntime("substring not found");
        return Value::Int(-1);
      }
      return Value::Int(static_cast<int64_t>(CodepointCount(std::string_view(s).substr(0, p))));
    });
  }
  if (name == "join") {
    return Bound(name, [s](CallArgs& a) {
      Value it = a.Get(0, "iterable");
      std::string out;
      ValueList items;
      if (it.is_list_like())
        items = it.list();
      else if (it.is_string())
        for (auto& c : SplitCodepoints(it.str())) items.push_back(Value::Str(c));
      else if (it.is_dict())
        for (auto& kv : it.dict().items) items.push_back(kv.first);
      else
        ThrowRuntime("can only join an iterable");
      for (size_t i = 0; i < items.size(); ++i) {
        if (!items[i].is_string())
          ThrowRuntime("sequence item " + std::to_string(i) + ": expected str instance, " +
                       std::string(items[i].TypeName()) + " found");
        if (i) out += s;
        out += items[i].str();
      }
      return Value::Str(std::move(out));
    });
  }
  if (name == "format") return Bound(name, [s](CallArgs& a) { return Value::Str(PyFormat(s, a)); });
  if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum" ||
      name == "isupper" || name == "islower") {
    return Bound(name, [s, name](CallArgs&) {
      if (s.empty()) return Value::Bool(false);
      bool any_cased = false;
      for (unsigned char c : s) {
        bool ok = true;
        if (name == "isdigit")
          ok = std::isdigit(c);
        else if (name == "isalpha")
          ok = std::isalpha(c) || c >= 0x80;
        else if (name == "isspace")
          ok = std::isspace(c);
        else if (name == "isalnum")
          ok = std::isalnum(c) || c >= 0x80;
        else if (name == "isupper") {
          if (std::islower(c)) return Value::Bool(false);
          any_cased |= std::isupper(c) != 0;
        } else {
          if (std::isupper(c)) return Value::Bool(false);
          any_cased |= std::islower(c) != 0;
        }
        if (!ok) return Value::Bool(false);
      }
      if (name == "isupper" || name == "islower") return Value::Bool(any_cased);
      return Value::Bool(true);
    });
  }
  return Value();
}

}  // namespace

Value GetMethod(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::kString:
      return StrMethod(obj, name);
    case Value::Kind::kDict: {
      if (name == "items") {
        return Bound(name, [obj](CallArgs&) {
          ValueList out;
          for (const auto& [k, v] : obj.dict().items) out.push_back(Value::MakeTuple({k, v}));
          return Value::MakeList(std::move(out));
        });
      }
      if (name == "keys" || name == "values") {
        bool keys = name == "keys";
        return Bound(name, [obj, keys](CallArgs&) {
          ValueList out;
          for (const auto& [k, v] : obj.dict().items) out.push_back(keys ? k : v);
          return Value::MakeList(std::move(out));
        });
      }
      if (name == "get") {
        return Bound(name, [obj](CallArgs& a) {
          const Value* v = obj.dict().Find(a.Get(0, "key"));
          return v ? *v : a.Get(1, "default", Value::None());
        });
      }
      if (name == "copy")
        return Bound(name, [obj](CallArgs&) {
          return Value::MakeDict(std::make_shared<DictObj>(obj.dict()));
        });
      if (name == "pop" || name == "popitem" || name == "setdefault" || name == "update" ||
          name == "clear" || name == "fromkeys")
        return Unsafe(obj, name);
      return Value();
    }
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      if (name == "index" || name == "count") {
        bool count = name == "count";
        return Bound(name, [obj, count](CallArgs& a) {
          Value x = a.Get(0, "value");
          int64_t n = 0;
          const auto& l = obj.list();
          for (size_t i = 0; i < l.size(); ++i) {
            if (!l[i].Equals(x)) continue;
            if (!count) return Value::Int(static_cast<int64_t>(i));
            ++n;
          }
          if (!count) ThrowRuntime("value is not in list");
          return Value::Int(n);
        });
      }
      if (obj.is_list() &&
          (name == "append" || name == "extend" || name == "insert" || name == "remove" ||
           name == "pop" || name == "clear" || name == "sort" || name == "reverse"))
        return Unsafe(obj, name);
      if (obj.is_list() && name == "copy")
        return Bound(name, [obj](CallArgs&) { return Value::MakeList(obj.list()); });
      return Value();
    }
    default:
      return Value();
  }
}

}  // namespace agentkv::text::chat::jinja
