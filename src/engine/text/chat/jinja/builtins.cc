// Filters, tests and globals with jinja2 3.1 semantics (and transformers'
// tojson, raise_exception and strftime_now).
#include "engine/text/chat/jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <unordered_map>

#include "engine/text/chat/jinja/error.h"
#include "engine/text/chat/jinja/interpreter.h"
#include "engine/text/chat/jinja/strings.h"

namespace agentkv::text::chat::jinja {
namespace {

using FilterFn = Value (*)(Interpreter&, const Value&, CallArgs&);
using TestFn = bool (*)(Interpreter&, const Value&, CallArgs&);

[[noreturn]] void ThrowUndefinedValue(const Value& v) {
  throw TemplateError(TemplateError::Kind::kUndefined, v.undefined_hint());
}

std::string SoftStr(const Value& v) { return v.ToStr(); }

int64_t Len(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kString:
      return static_cast<int64_t>(CodepointCount(v.str()));
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return static_cast<int64_t>(v.list().size());
    case Value::Kind::kDict:
      return static_cast<int64_t>(v.dict().items.size());
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kLoop:
      return static_cast<int64_t>(v.loop().items.size());
    default:
      ThrowRuntime("object of type '" + std::string(v.TypeName()) + "' has no len()");
  }
}

// jinja2's make_attrgetter: "a.b.0" looked up item-first, part by part.
Value GetPath(Interpreter& in, Value v, const Value& attr) {
  if (!attr.is_string()) return in.GetItem(v, attr);
  const std::string& path = attr.str();
  size_t pos = 0;
  while (true) {
    size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    v = in.GetItem(v, digits ? Value::Int(std::stoll(part)) : Value::Str(part));
    if (dot == std::string::npos) return v;
    pos = dot + 1;
  }
}

Value SortKey(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::Str(PyLower(v.str()));
  return v;
}

Value F_tojson(Interpreter&, const Value& v, CallArgs& a) {
  bool ensure_ascii = a.Get(0, "ensure_ascii", Value::Bool(false)).Truthy();
  Value indent = a.Get(1, "indent", Value::None());
  Value seps = a.Get(2, "separators", Value::None());
  bool sort_keys = a.Get(3, "sort_keys", Value::Bool(false)).Truthy();
  bool has_indent = !indent.is_none() && !indent.is_undefined();
  std::string item_sep = has_indent ? "," : ", ", key_sep = ": ";
  if (seps.is_list_like()) {
    if (seps.list().size() != 2 || !seps.list()[0].is_string() || !seps.list()[1].is_string())
      ThrowRuntime("separators must be a pair of strings");
    item_sep = seps.list()[0].str();
    key_sep = seps.list()[1].str();
  }
  std::string out;
  DumpJson(v, indent, item_sep, key_sep, sort_keys, ensure_ascii, out);
  return Value::Str(std::move(out));
}

Value F_trim(Interpreter&, const Value& v, CallArgs& a) {
  Value chars = a.Get(0, "chars", Value::None());
  std::optional<std::string> c;
  if (chars.is_string()) c = chars.str();
  return Value::Str(PyStrip(SoftStr(v), c, true, true));
}
Value F_upper(Interpreter&, const Value& v, CallArgs&) { return Value::Str(PyUpper(SoftStr(v))); }
Value F_lower(Interpreter&, const Value& v, CallArgs&) { return Value::Str(PyLower(SoftStr(v))); }
Value F_capitalize(Interpreter&, const Value& v, CallArgs&) {
  return Value::Str(PyCapitalize(SoftStr(v)));
}
Value F_title(Interpreter&, const Value& v, CallArgs&) {
  return Value::Str(JinjaTitle(SoftStr(v)));
}
Value F_length(Interpreter&, const Value& v, CallArgs&) { return Value::Int(Len(v)); }
Value F_string(Interpreter&, const Value& v, CallArgs&) {
  return v.is_string() ? v : Value::Str(SoftStr(v));
}

Value F_escape(Interpreter&, const Value& v, CallArgs&) {
  std::string out;
  for (char c : SoftStr(v)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return Value::Str(std::move(out));
}

Value F_first(Interpreter& in, const Value& v, CallArgs&) {
  ValueList items = in.Iterate(v);
  if (items.empty()) return Value::Undefined("No first item, sequence was empty.");
  return items.front();
}
Value F_last(Interpreter& in, const Value& v, CallArgs&) {
  ValueList items = in.Iterate(v);
  if (items.empty()) return Value::Undefined("No last item, sequence was empty.");
  return items.back();
}

Value F_join(Interpreter& in, const Value& v, CallArgs& a) {
  std::string sep = SoftStr(a.Get(0, "d", Value::Str("")));
  Value attr = a.Get(1, "attribute", Value::None());
  std::string out;
  bool first = true;
  for (auto& item : in.Iterate(v)) {
    if (!first) out += sep;
    first = false;
    (attr.is_none() ? item : GetPath(in, item, attr)).AppendStr(out);
  }
  return Value::Str(std::move(out));
}

Value F_default(Interpreter&, const Value& v, CallArgs& a) {
  Value dflt = a.Get(0, "default_value", Value::Str(""));
  bool boolean = a.Get(1, "boolean", Value::Bool(false)).Truthy();
  if (v.is_undefined() || (boolean && !v.Truthy())) return dflt;
  return v;
}

Value F_list(Interpreter& in, const Value& v, CallArgs&) { return Value::MakeList(in.Iterate(v)); }

Value F_map_Eager(Interpreter& in, const Value& v, CallArgs& a) {
  ValueList out;
  if (!v.Truthy()) return Value::MakeList({});  // jinja2: "if value: for item in value"
  Value attr = a.Get(99, "attribute");
  if (!attr.is_undefined()) {
    Value dflt = a.Get(99, "default");
    for (auto& item : in.Iterate(v)) {
      Value r = GetPath(in, item, attr);
      out.push_back(r.is_undefined() && !dflt.is_undefined() ? dflt : r);
    }
    return Value::MakeList(std::move(out));
  }
  if (a.args.empty()) ThrowRuntime("map requires a filter argument");
  std::string name = SoftStr(a.args[0]);
  CallArgs rest;
  rest.args.assign(a.args.begin() + 1, a.args.end());
  rest.kwargs = a.kwargs;
  for (auto& item : in.Iterate(v)) out.push_back(ApplyFilter(in, name, item, rest));
  return Value::MakeList(std::move(out));
}

// select/reject/selectattr/rejectattr share this.
Value SelectImpl(Interpreter& in, const Value& v, CallArgs& a, bool attr_mode, bool keep) {
  if (!v.Truthy()) return Value::MakeList({});  // jinja2: "if value: for item in value"
  size_t off = 0;
  Value attr;
  if (attr_mode) {
    if (a.args.empty()) ThrowRuntime("Missing parameter for attribute name");
    attr = a.args[0];
    off = 1;
  }
  bool has_test = a.args.size() > off;
  std::string test = has_test ? SoftStr(a.args[off]) : "";
  CallArgs targs;
  if (has_test) targs.args.assign(a.args.begin() + off + 1, a.args.end());
  targs.kwargs = a.kwargs;
  ValueList out;
  for (auto& item : in.Iterate(v)) {
    Value x = attr_mode ? GetPath(in, item, attr) : item;
    bool r = has_test ? ApplyTest(in, test, x, targs) : x.Truthy();
    if (r == keep) out.push_back(item);
  }
  return Value::MakeList(std::move(out));
}
Value F_select_Eager(Interpreter& in, const Value& v, CallArgs& a) {
  return SelectImpl(in, v, a, false, true);
}
Value F_reject_Eager(Interpreter& in, const Value& v, CallArgs& a) {
  return SelectImpl(in, v, a, false, false);
}
Value F_selectattr_Eager(Interpreter& in, const Value& v, CallArgs& a) {
  return SelectImpl(in, v, a, true, true);
}
Value F_rejectattr_Eager(Interpreter& in, const Value& v, CallArgs& a) {
  return SelectImpl(in, v, a, true, false);
}

Value F_items_Eager(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_undefined()) return Value::MakeList({});
  if (!v.is_dict()) ThrowRuntime("Can only get item pairs from a mapping.");
  ValueList out;
  for (const auto& [k, x] : v.dict().items) out.push_back(Value::MakeTuple({k, x}));
  return Value::MakeList(std::move(out));
}

Value F_dictsort(Interpreter&, const Value& v, CallArgs& a) {
  if (!v.is_dict()) ThrowRuntime("dictsort requires a mapping");
  bool cs = a.Get(0, "case_sensitive", Value::Bool(false)).Truthy();
  Value by = a.Get(1, "by", Value::Str("key"));
  bool rev = a.Get(2, "reverse", Value::Bool(false)).Truthy();
  int pos = by.is_string() && by.str() == "value" ? 1 : 0;
  ValueList out;
  for (const auto& [k, x] : v.dict().items) out.push_back(Value::MakeTuple({k, x}));
  std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
    Value kx = SortKey(x.list()[pos], cs), ky = SortKey(y.list()[pos], cs);
    return rev ? LessThan(ky, kx) : LessThan(kx, ky);
  });
  return Value::MakeList(std::move(out));
}

Value F_sort(Interpreter& in, const Value& v, CallArgs& a) {
  bool rev = a.Get(0, "reverse", Value::Bool(false)).Truthy();
  bool cs = a.Get(1, "case_sensitive", Value::Bool(false)).Truthy();
  Value attr = a.Get(2, "attribute", Value::None());
  ValueList items = in.Iterate(v);
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& it : items)
    keyed.emplace_back(SortKey(attr.is_none() ? it : GetPath(in, it, attr), cs), it);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return rev ? LessThan(y.first, x.first) : LessThan(x.first, y.first);
  });
  ValueList out;
  for (auto& kv : keyed) out.push_back(kv.second);
  return Value::MakeList(std::move(out));
}

Value F_unique_Eager(Interpreter& in, const Value& v, CallArgs& a) {
  bool cs = a.Get(0, "case_sensitive", Value::Bool(false)).Truthy();
  Value attr = a.Get(1, "attribute", Value::None());
  ValueList out, seen;
  for (auto& it : in.Iterate(v)) {
    Value k = SortKey(attr.is_none() ? it : GetPath(in, it, attr), cs);
    bool dup = false;
    for (auto& s : seen)
      if (s.Equals(k)) dup = true;
    if (dup) continue;
    seen.push_back(k);
    out.push_back(it);
  }
  return Value::MakeList(std::move(out));
}

Value F_reverse_Eager(Interpreter& in, const Value& v, CallArgs&) {
  if (v.is_string()) {
    auto cps = SplitCodepoints(v.str());
    std::string out;
    for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
    return Value::Str(std::move(out));
  }
  ValueList items = in.Iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::MakeList(std::move(items));
}

Value MinMax(Interpreter& in, const Value& v, CallArgs& a, bool want_max) {
  bool cs = a.Get(0, "case_sensitive", Value::Bool(false)).Truthy();
  Value attr = a.Get(1, "attribute", Value::None());
  ValueList items = in.Iterate(v);
  if (items.empty())
    return Value::Undefined(std::string("No aggregated item, sequence was empty."));
  size_t best = 0;
  Value bk = SortKey(attr.is_none() ? items[0] : GetPath(in, items[0], attr), cs);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = SortKey(attr.is_none() ? items[i] : GetPath(in, items[i], attr), cs);
    if (want_max ? LessThan(bk, k) : LessThan(k, bk)) {
      best = i;
      bk = k;
    }
  }
  return items[best];
}
Value F_min(Interpreter& in, const Value& v, CallArgs& a) { return MinMax(in, v, a, false); }
Value F_max(Interpreter& in, const Value& v, CallArgs& a) { return MinMax(in, v, a, true); }

Value F_sum(Interpreter& in, const Value& v, CallArgs& a) {
  Value attr = a.Get(0, "attribute", Value::None());
  Value total = a.Get(1, "start", Value::Int(0));
  for (auto& it : in.Iterate(v))
    total = BinaryOp("+", total, attr.is_none() ? it : GetPath(in, it, attr));
  return total;
}

Value F_int(Interpreter&, const Value& v, CallArgs& a) {
  Value dflt = a.Get(0, "default", Value::Int(0));
  if (v.is_int()) return v;
  if (v.is_bool()) return Value::Int(v.as_int());
  if (v.is_float()) return Value::Int(static_cast<int64_t>(v.as_double()));
  if (v.is_string()) {
    std::string s = PyStrip(v.str(), std::nullopt, true, true);
    try {
      size_t used = 0;
      int64_t r = std::stoll(s, &used, static_cast<int>(a.Get(1, "base", Value::Int(10)).as_int()));
      if (used == s.size()) return Value::Int(r);
    } catch (...) {
    }
    try {
      size_t used = 0;
      double d = std::stod(s, &used);
      if (used == s.size()) return Value::Int(static_cast<int64_t>(d));
    } catch (...) {
    }
  }
  return dflt;
}

Value F_float(Interpreter&, const Value& v, CallArgs& a) {
  Value dflt = a.Get(0, "default", Value::Float(0.0));
  if (v.is_number()) return Value::Float(v.as_double());
  if (v.is_string()) {
    try {
      std::string s = PyStrip(v.str(), std::nullopt, true, true);
      size_t used = 0;
      double d = std::stod(s, &used);
      if (used == s.size()) return Value::Float(d);
    } catch (...) {
    }
  }
  return dflt;
}

Value F_abs(Interpreter&, const Value& v, CallArgs&) {
  if (v.is_float()) return Value::Float(std::fabs(v.as_double()));
  if (v.is_number()) return Value::Int(std::llabs(v.as_int()));
  ThrowRuntime("bad operand type for abs(): '" + std::string(v.TypeName()) + "'");
}

Value F_round(Interpreter&, const Value& v, CallArgs& a) {
  int64_t prec = a.Get(0, "precision", Value::Int(0)).as_int();
  std::string method = SoftStr(a.Get(1, "method", Value::Str("common")));
  if (!v.is_number()) ThrowRuntime("round requires a number");
  double x = v.as_double(), m = std::pow(10.0, static_cast<double>(prec));
  double r;
  if (method == "ceil")
    r = std::ceil(x * m) / m;
  else if (method == "floor")
    r = std::floor(x * m) / m;
  else if (method == "common") {
    if (!v.is_float()) return Value::Int(v.as_int());
    // Python rounds half to even on the exact binary value.
    r = std::nearbyint(x * m) / m;
  } else
    ThrowRuntime("method must be common, ceil or floor");
  return Value::Float(r);
}

Value F_replace(Interpreter&, const Value& v, CallArgs& a) {
  Value count = a.Get(2, "count", Value::None());
  return Value::Str(PyReplace(SoftStr(v), SoftStr(a.Get(0, "old")), SoftStr(a.Get(1, "new")),
                              count.is_none() ? -1 : count.as_int()));
}

Value F_indent(Interpreter&, const Value& v, CallArgs& a) {
  Value w = a.Get(0, "width", Value::Int(4));
  bool first = a.Get(1, "first", Value::Bool(false)).Truthy();
  bool blank = a.Get(2, "blank", Value::Bool(false)).Truthy();
  std::string ind = w.is_string() ? w.str() : std::string(std::max<int64_t>(0, w.as_int()), ' ');
  // jinja2 3.1 appends "\n" to the input and splits it, which fails for anything but a string.
  if (!v.is_string())
    ThrowRuntime("unsupported operand type(s) for +=: '" + std::string(v.TypeName()) +
                 "' and 'str'");
  std::string s = SoftStr(v) + "\n";
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t e = s.find('\n', pos);
    lines.push_back(s.substr(pos, e - pos));
    pos = e + 1;
  }
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) out += '\n';
    bool do_ind = i == 0 ? first : (blank || !PyStrip(lines[i], std::nullopt, true, true).empty());
    if (do_ind) out += ind;
    out += lines[i];
  }
  return Value::Str(std::move(out));
}

Value F_wordcount(Interpreter&, const Value& v, CallArgs&) {
  int64_t n = 0;
  bool in_word = false;
  for (unsigned char c : SoftStr(v)) {
    bool w = std::isalnum(c) || c == '_' || c >= 0x80;
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::Int(n);
}

Value F_batch_Eager(Interpreter& in, const Value& v, CallArgs& a) {
  int64_t n = a.Get(0, "linecount").as_int();
  if (n <= 0) ThrowRuntime("batch size must be positive");
  Value fill = a.Get(1, "fill_with", Value::None());
  ValueList out, cur;
  for (auto& it : in.Iterate(v)) {
    cur.push_back(it);
    if (static_cast<int64_t>(cur.size()) == n) {
      out.push_back(Value::MakeList(std::move(cur)));
      cur.clear();
    }
  }
  if (!cur.empty()) {
    if (!fill.is_none())
      while (static_cast<int64_t>(cur.size()) < n) cur.push_back(fill);
    out.push_back(Value::MakeList(std::move(cur)));
  }
  return Value::MakeList(std::move(out));
}

Value F_attr(Interpreter& in, const Value& v, CallArgs& a) {
  return in.GetAttr(v, SoftStr(a.Get(0, "name")));
}

Value F_center(Interpreter&, const Value& v, CallArgs& a) {
  std::string s = SoftStr(v);
  int64_t width = a.Get(0, "width", Value::Int(80)).as_int();
  int64_t len = static_cast<int64_t>(CodepointCount(s));
  if (width <= len) return Value::Str(s);
  int64_t total = width - len, left = total / 2 + (total & width & 1);
  return Value::Str(std::string(left, ' ') + s + std::string(total - left, ' '));
}

Value F_format(Interpreter&, const Value& v, CallArgs& a) {
  Value args = a.args.size() == 1 ? a.args[0] : Value::MakeTuple(a.args);
  return BinaryOp("%", Value::Str(SoftStr(v)), args);
}

Value F_map(Interpreter& in, const Value& v, CallArgs& a) {
  return Value::MakeGenerator([&in, v, a]() mutable { return F_map_Eager(in, v, a).list(); },
                              "generator object sync_do_map");
}

Value F_select(Interpreter& in, const Value& v, CallArgs& a) {
  return Value::MakeGenerator([&in, v, a]() mutable { return F_select_Eager(in, v, a).list(); },
                              "generator object select_or_reject");
}

Value F_reject(Interpreter& in, const Value& v, CallArgs& a) {
  return Value::MakeGenerator([&in, v, a]() mutable { return F_reject_Eager(in, v, a).list(); },
                              "generator object select_or_reject");
}

Value F_selectattr(Interpreter& in, const Value& v, CallArgs& a) {
  return Value::MakeGenerator([&in, v, a]() mutable { return F_selectattr_Eager(in, v, a).list(); },
                              "generator object select_or_reject");
}

Value F_rejectattr(Interpreter& in, const Value& v, CallArgs& a) {
  return Value::MakeGenerator([&in, v, a]() mutable { return F_rejectattr_Eager(in, v, a).list(); },
                              "generator object select_or_reject");
}

Value F_batch(Interpreter& in, const Value& v, CallArgs& a) {
  return Value::MakeGenerator([&in, v, a]() mutable { return F_batch_Eager(in, v, a).list(); },
                              "generator object do_batch");
}

Value F_unique(Interpreter& in, const Value& v, CallArgs& a) {
  return Value::MakeGenerator([&in, v, a]() mutable { return F_unique_Eager(in, v, a).list(); },
                              "generator object do_unique");
}

// jinja2's items filter is a generator function: errors wait for iteration.
Value F_items(Interpreter& in, const Value& v, CallArgs& a) {
  return Value::MakeGenerator([&in, v, a]() mutable { return F_items_Eager(in, v, a).list(); },
                              "generator object do_items");
}

// reversed() of a sequence is a lazy iterator; of a string, a string.
Value F_reverse(Interpreter& in, const Value& v, CallArgs& a) {
  Value items = F_reverse_Eager(in, v, a);  // non-iterables fail now, as in jinja2
  if (v.is_string()) return items;
  return Value::MakeGenerator([items] { return items.list(); }, "list_reverseiterator object");
}

const std::unordered_map<std::string, FilterFn>& Filters() {
  static const auto* m = new std::unordered_map<std::string, FilterFn>{
      {"tojson", F_tojson},
      {"trim", F_trim},
      {"upper", F_upper},
      {"lower", F_lower},
      {"capitalize", F_capitalize},
      {"title", F_title},
      {"length", F_length},
      {"count", F_length},
      {"string", F_string},
      {"safe", F_string},
      {"escape", F_escape},
      {"e", F_escape},
      {"forceescape", F_escape},
      {"first", F_first},
      {"last", F_last},
      {"join", F_join},
      {"default", F_default},
      {"d", F_default},
      {"list", F_list},
      {"map", F_map},
      {"select", F_select},
      {"reject", F_reject},
      {"selectattr", F_selectattr},
      {"rejectattr", F_rejectattr},
      {"items", F_items},
      {"dictsort", F_dictsort},
      {"sort", F_sort},
      {"unique", F_unique},
      {"reverse", F_reverse},
      {"min", F_min},
      {"max", F_max},
      {"sum", F_sum},
      {"int", F_int},
      {"float", F_float},
      {"abs", F_abs},
      {"round", F_round},
      {"replace", F_replace},
      {"indent", F_indent},
      {"wordcount", F_wordcount},
      {"batch", F_batch},
      {"attr", F_attr},
      {"center", F_center},
      {"format", F_format},
  };
  return *m;
}

// ---- tests ----

bool T_defined(Interpreter&, const Value& v, CallArgs&) { return !v.is_undefined(); }
bool T_undefined(Interpreter&, const Value& v, CallArgs&) { return v.is_undefined(); }
bool T_none(Interpreter&, const Value& v, CallArgs&) { return v.is_none(); }
bool T_boolean(Interpreter&, const Value& v, CallArgs&) { return v.is_bool(); }
bool T_false(Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && !v.as_bool(); }
bool T_true(Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && v.as_bool(); }
bool T_integer(Interpreter&, const Value& v, CallArgs&) { return v.is_int(); }
bool T_float(Interpreter&, const Value& v, CallArgs&) { return v.is_float(); }
bool T_number(Interpreter&, const Value& v, CallArgs&) { return v.is_number(); }
bool T_string(Interpreter&, const Value& v, CallArgs&) { return v.is_string(); }
bool T_mapping(Interpreter&, const Value& v, CallArgs&) { return v.is_dict(); }
bool T_iterable(Interpreter&, const Value& v, CallArgs&) {
  return v.is_generator() || v.is_string() || v.is_list_like() || v.is_dict() || v.is_undefined() ||
         v.is_loop();
}
bool T_sequence(Interpreter&, const Value& v, CallArgs&) {
  return v.is_string() || v.is_list_like() || v.is_dict() || v.is_undefined();
}
bool T_callable(Interpreter&, const Value& v, CallArgs&) {
  return v.is_callable() || v.is_loop() || v.is_undefined();  // Undefined defines __call__
}
bool T_escaped(Interpreter&, const Value&, CallArgs&) { return false; }
bool T_sameas(Interpreter&, const Value& v, CallArgs& a) {
  Value o = a.Get(0, "other");
  if (v.kind() != o.kind()) return false;
  if (v.is_none() || v.is_bool() || v.is_undefined() || v.is_int() || v.is_float())
    return v.Equals(o);
  return v.Equals(o) && (v.is_string() ? &v.str() == &o.str() : true);
}
bool T_in(Interpreter&, const Value& v, CallArgs& a) { return Contains(a.Get(0, "seq"), v); }
bool T_eq(Interpreter&, const Value& v, CallArgs& a) { return v.Equals(a.Get(0, "other")); }
bool T_ne(Interpreter&, const Value& v, CallArgs& a) { return !v.Equals(a.Get(0, "other")); }
bool T_lt(Interpreter&, const Value& v, CallArgs& a) { return LessThan(v, a.Get(0, "other")); }
bool T_gt(Interpreter&, const Value& v, CallArgs& a) { return LessThan(a.Get(0, "other"), v); }
bool T_le(Interpreter&, const Value& v, CallArgs& a) {
  return LessThan(v, a.Get(0, "other")) || v.Equals(a.Get(0, "other"));
}
bool T_ge(Interpreter&, const Value& v, CallArgs& a) {
  return LessThan(a.Get(0, "other"), v) || v.Equals(a.Get(0, "other"));
}
int64_t IntOf(const Value& v) {
  if (v.is_undefined()) ThrowUndefinedValue(v);
  if (!v.is_int() && !v.is_bool()) ThrowRuntime("expected an integer");
  return v.as_int();
}
// value % n as Python computes it, floats included.
Value Mod(const Value& v, const Value& n) {
  if (v.is_undefined()) ThrowUndefinedValue(v);
  if (n.is_undefined()) ThrowUndefinedValue(n);
  return BinaryOp("%", v, n);
}
bool T_odd(Interpreter&, const Value& v, CallArgs&) {
  return Mod(v, Value::Int(2)).Equals(Value::Int(1));
}
bool T_even(Interpreter&, const Value& v, CallArgs&) {
  return Mod(v, Value::Int(2)).Equals(Value::Int(0));
}
bool T_divisibleby(Interpreter&, const Value& v, CallArgs& a) {
  return Mod(v, a.Get(0, "num")).Equals(Value::Int(0));
}
// str.islower / str.isupper: at least one cased character, none of the other case.
bool T_lower(Interpreter&, const Value& v, CallArgs&) {
  std::string s = v.ToStr();
  return PyLower(s) == s && PyUpper(s) != s;
}
bool T_upper(Interpreter&, const Value& v, CallArgs&) {
  std::string s = v.ToStr();
  return PyUpper(s) == s && PyLower(s) != s;
}
bool T_filter(Interpreter&, const Value& v, CallArgs&) {
  return v.is_string() && HasFilter(v.str());
}

const std::unordered_map<std::string, TestFn>& Tests() {
  static const auto* m = new std::unordered_map<std::string, TestFn>{
      {"defined", T_defined},
      {"undefined", T_undefined},
      {"none", T_none},
      {"boolean", T_boolean},
      {"false", T_false},
      {"true", T_true},
      {"integer", T_integer},
      {"float", T_float},
      {"number", T_number},
      {"string", T_string},
      {"mapping", T_mapping},
      {"iterable", T_iterable},
      {"sequence", T_sequence},
      {"callable", T_callable},
      {"escaped", T_escaped},
      {"sameas", T_sameas},
      {"in", T_in},
      {"eq", T_eq},
      {"equalto", T_eq},
      {"==", T_eq},
      {"ne", T_ne},
      {"!=", T_ne},
      {"lt", T_lt},
      {"lessthan", T_lt},
      {"<", T_lt},
      {"le", T_le},
      {"<=", T_le},
      {"gt", T_gt},
      {"greaterthan", T_gt},
      {">", T_gt},
      {"ge", T_ge},
      {">=", T_ge},
      {"odd", T_odd},
      {"even", T_even},
      {"divisibleby", T_divisibleby},
      {"lower", T_lower},
      {"upper", T_upper},
      {"filter", T_filter},
  };
  return *m;
}

// ---- globals ----

Value G_range(Interpreter&, CallArgs& a) {
  int64_t start = 0, stop, step = 1;
  if (a.args.size() == 1) {
    stop = IntOf(a.args[0]);
  } else if (a.args.size() >= 2) {
    start = IntOf(a.args[0]);
    stop = IntOf(a.args[1]);
    if (a.args.size() > 2) step = IntOf(a.args[2]);
  } else {
    ThrowRuntime("range expected at least 1 argument, got 0");
  }
  if (step == 0) ThrowRuntime("range() arg 3 must not be zero");
  int64_t n = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0)
                       : (start > stop ? (start - stop - step - 1) / -step : 0);
  // jinja2's sandbox caps ranges at MAX_RANGE.
  if (n > 100000)
    ThrowRuntime("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  ValueList out;
  out.reserve(n);
  for (int64_t i = 0; i < n; ++i) out.push_back(Value::Int(start + i * step));
  return Value::MakeList(std::move(out));
}

std::shared_ptr<DictObj> DictFromArgs(CallArgs& a) {
  auto d = std::make_shared<DictObj>();
  if (!a.args.empty()) {
    if (a.args[0].is_dict() || a.args[0].is_namespace()) {
      d->items = a.args[0].dict().items;
    } else {
      for (auto& kv : a.args[0].is_list_like() ? a.args[0].list() : ValueList{}) {
        if (!kv.is_list_like() || kv.list().size() != 2)
          ThrowRuntime("dictionary update sequence element has wrong length");
        d->Set(kv.list()[0], kv.list()[1]);
      }
    }
  }
  for (auto& [k, v] : a.kwargs) d->Set(Value::Str(k), v);
  return d;
}

}  // namespace

bool HasFilter(const std::string& name) { return Filters().count(name) > 0; }
bool HasTest(const std::string& name) { return Tests().count(name) > 0; }

Value ApplyFilter(Interpreter& in, const std::string& name, const Value& input, CallArgs& args) {
  auto it = Filters().find(name);
  if (it == Filters().end())
    throw TemplateError(TemplateError::Kind::kSyntax, "No filter named '" + name + "'.");
  in.Step();
  // Like jinja2, most filters reject Undefined input except those made for it.
  if (input.is_undefined() && name != "default" && name != "d" && name != "length" &&
      name != "count" && name != "string" && name != "list" && name != "first" && name != "last" &&
      name != "join" && name != "items" && name != "trim" && name != "upper" && name != "lower" &&
      name != "capitalize" && name != "title" && name != "safe" && name != "e" &&
      name != "escape" && name != "select" && name != "reject" && name != "selectattr" &&
      name != "rejectattr" && name != "map" && name != "unique" && name != "reverse" &&
      name != "sort" && name != "wordcount" && name != "indent" && name != "replace" &&
      name != "center")
    ThrowUndefinedValue(input);
  return it->second(in, input, args);
}

bool ApplyTest(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  auto it = Tests().find(name);
  if (it == Tests().end())
    throw TemplateError(TemplateError::Kind::kSyntax, "No test named '" + name + "'.");
  return it->second(in, v, args);
}

void AddGlobals(DictObj& g) {
  g.items.emplace_back(Value::Str("range"), Value::MakeCallable("range", G_range));
  g.items.emplace_back(Value::Str("dict"),
                       Value::MakeCallable("dict", [](Interpreter&, CallArgs& a) {
                         return Value::MakeDict(DictFromArgs(a));
                       }));
  g.items.emplace_back(Value::Str("namespace"),
                       Value::MakeCallable("namespace", [](Interpreter& in, CallArgs& a) {
                         auto ns = DictFromArgs(a);
                         in.TrackNamespace(ns);
                         return Value::MakeNamespace(std::move(ns));
                       }));
  g.items.emplace_back(
      Value::Str("raise_exception"),
      Value::MakeCallable("raise_exception", [](Interpreter&, CallArgs& a) -> Value {
        throw TemplateError(TemplateError::Kind::kRaised, a.Get(0, "message").ToStr());
      }));
  g.items.emplace_back(
      Value::Str("strftime_now"),
      Value::MakeCallable("strftime_now", [](Interpreter& in, CallArgs& a) {
        std::string fmt = a.Get(0, "format").ToStr();
        std::time_t t = std::chrono::system_clock::to_time_t(in.clock()());
        std::tm tm{};
        localtime_r(&t, &tm);
        std::string buf(fmt.size() * 4 + 64, '\0');
        size_t n = fmt.empty() ? 0 : std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
        buf.resize(n);
        return Value::Str(buf);
      }));
}

}  // namespace agentkv::text::chat::jinja
