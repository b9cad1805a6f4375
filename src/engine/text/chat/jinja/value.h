// Value: the dynamic type the Jinja interpreter computes with. It mirrors the
// Python objects jinja2 sees when transformers renders a chat template
// (None, bool, int, float, str, list, tuple, dict with insertion order,
// callables, namespaces) plus jinja2's Undefined, so that printing, equality,
// truthiness and JSON encoding come out byte-identical to Python.
//
// Containers are shared by reference (like Python objects); copying a Value is
// a refcount bump. Lists and dicts are treated as immutable once built, as in
// jinja2's ImmutableSandboxedEnvironment; only namespaces are mutated.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace agentkv::text::chat::jinja {

class Value;
struct DictObj;
struct CallArgs;
class Interpreter;
struct LoopState;

using ValueList = std::vector<Value>;

// A Python callable: builtin function, bound method or macro. Throws
// TemplateError (see error.h) on failure.
struct Callable {
  std::string name;
  std::function<Value(Interpreter&, CallArgs&)> fn;
};

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kTuple,
    kDict,
    kNamespace,
    kCallable,
    kLoop,
    kGenerator,  // a lazy, single-use iterator (what map/select/... return)
  };

  Value() = default;  // Undefined with no hint
  static Value Undefined(std::string hint);
  static Value None() { return Value(Kind::kNone); }
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value Str(std::string s);
  static Value MakeList(ValueList items);
  static Value MakeTuple(ValueList items);
  static Value MakeDict(std::shared_ptr<DictObj> dict);
  static Value MakeNamespace(std::shared_ptr<DictObj> dict);
  static Value MakeCallable(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn);
  static Value MakeLoop(std::shared_ptr<LoopState> loop);
  // A Python generator: `produce` runs on first iteration; later iterations
  // see it exhausted, as in Python.
  static Value MakeGenerator(std::function<ValueList()> produce, std::string name = "");

  // Converts parsed JSON (ordered_json keeps key order, which tojson needs for
  // byte-identical output; plain json sorts keys as Python would not).
  static Value FromJson(const nlohmann::ordered_json& j);
  static Value FromJson(const nlohmann::json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  // Python numbers.Number: bool counts, as in Python.
  bool is_number() const {
    return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool;
  }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_list_like() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }
  bool is_loop() const { return kind_ == Kind::kLoop; }
  bool is_generator() const { return kind_ == Kind::kGenerator; }
  // Runs a generator (once; then it is empty).
  ValueList Consume() const;

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::kBool ? (b_ ? 1 : 0) : i_; }
  double as_double() const { return kind_ == Kind::kFloat ? f_ : static_cast<double>(as_int()); }
  const std::string& str() const { return *std::static_pointer_cast<std::string>(p_); }
  const ValueList& list() const { return *std::static_pointer_cast<ValueList>(p_); }
  DictObj& dict() const { return *std::static_pointer_cast<DictObj>(p_); }
  const Callable& callable() const { return *std::static_pointer_cast<Callable>(p_); }
  LoopState& loop() const { return *std::static_pointer_cast<LoopState>(p_); }
  // Hint for UndefinedError messages ("'x' is undefined").
  std::string undefined_hint() const;

  // Python truthiness.
  bool Truthy() const;
  // str(value) as jinja2 prints it ("" for Undefined, "None", "True", "[1, 'a']").
  std::string ToStr() const;
  void AppendStr(std::string& out) const;
  // repr(value).
  void AppendRepr(std::string& out) const;
  // Python type name for error messages ("str", "dict", "NoneType").
  std::string_view TypeName() const;

  // Python ==.
  bool Equals(const Value& other) const;

 private:
  explicit Value(Kind k) : kind_(k) {}
  Kind kind_ = Kind::kUndefined;
  union {
    bool b_;
    int64_t i_ = 0;
    double f_;
  };
  std::shared_ptr<void> p_;
};

// A dict that keeps insertion order, like Python's.
struct DictObj {
  std::vector<std::pair<Value, Value>> items;

  const Value* Find(const Value& key) const;
  const Value* Find(std::string_view key) const;
  void Set(const Value& key, Value value);
};

// Arguments of a call: positional then keyword, in source order.
struct CallArgs {
  ValueList args;
  std::vector<std::pair<std::string, Value>> kwargs;
  Value caller;  // the {% call %} body, if any

  // Takes the argument at `pos` or named `name`; Undefined if absent.
  Value Get(size_t pos, std::string_view name) const;
  Value Get(size_t pos, std::string_view name, Value dflt) const;
};

// Python repr of a float ("1.0", "1e+20", "0.30000000000000004", "inf").
void AppendPyFloat(double f, std::string& out);
// Python repr of a string, with its quote choice and escapes.
void AppendPyStrRepr(std::string_view s, std::string& out);

}  // namespace agentkv::text::chat::jinja
