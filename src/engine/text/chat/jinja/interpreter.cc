#include "engine/text/chat/jinja/interpreter.h"

#include <algorithm>
#include <cstdint>
#include <memory>

#include "engine/text/chat/jinja/builtins.h"
#include "engine/text/chat/jinja/error.h"
#include "engine/text/chat/jinja/strings.h"

namespace agentkv::text::chat::jinja {
namespace {

[[noreturn]] void ThrowUndefined(const Value& v) {
  throw TemplateError(TemplateError::Kind::kUndefined, v.undefined_hint());
}

std::string TypeObject(const Value& v) { return "'" + std::string(v.TypeName()) + " object'"; }

}  // namespace

Interpreter::Interpreter(const RenderLimits& limits, Clock clock)
    : limits_(limits), clock_(std::move(clock)) {}

void Interpreter::Step() {
  if (++steps_ > limits_.max_steps)
    throw TemplateError(TemplateError::Kind::kLimit, "template exceeded the step limit (" +
                                                         std::to_string(limits_.max_steps) +
                                                         " steps); endless loop?");
}

void Interpreter::CheckSize(const std::string& out) {
  if (out.size() > limits_.max_output_bytes)
    throw TemplateError(TemplateError::Kind::kLimit, "template output exceeded the limit of " +
                                                         std::to_string(limits_.max_output_bytes) +
                                                         " bytes");
}

std::string Interpreter::Render(const NodeList& body, const DictObj& context) {
  auto root = std::make_shared<Frame>();
  DictObj globals;
  AddGlobals(globals);
  for (auto& [k, v] : globals.items) root->vars.emplace_back(k.str(), v);
  for (auto& [k, v] : context.items) {
    if (!k.is_string()) continue;
    bool replaced = false;
    for (auto& kv : root->vars) {
      if (kv.first == k.str()) {
        kv.second = v;
        replaced = true;
      }
    }
    if (!replaced) root->vars.emplace_back(k.str(), v);
  }
  scope_ = {root};
  steps_ = 0;
  call_depth_ = 0;
  struct Cleanup {
    Interpreter* self;
    ~Cleanup() { self->BreakCycles(); }
  } cleanup{this};
  std::string out;
  Exec(body, out);
  return out;
}

namespace {

// Appends `p` to `list`, first dropping expired entries once the list has
// reached `*compact_at` (which then becomes twice the live count).
template <typename T>
void TrackWeak(std::vector<std::weak_ptr<T>>& list, size_t* compact_at,
               const std::shared_ptr<T>& p) {
  if (list.size() >= *compact_at) {
    std::erase_if(list, [](const std::weak_ptr<T>& w) { return w.expired(); });
    *compact_at = std::max<size_t>(64, 2 * list.size());
  }
  list.push_back(p);
}

}  // namespace

void Interpreter::TrackNamespace(std::shared_ptr<DictObj> ns) {
  TrackWeak(namespaces_, &compact_namespaces_at_, ns);
}

void Interpreter::TrackFrame(const std::shared_ptr<Frame>& frame) {
  if (frame->tracked) return;
  frame->tracked = true;
  TrackWeak(captured_frames_, &compact_frames_at_, frame);
}

void Interpreter::BreakCycles() {
  scope_.clear();
  // Emptying one container may free others; those are skipped (expired).
  for (auto& w : captured_frames_) {
    if (auto f = w.lock()) f->vars.clear();
  }
  for (auto& w : namespaces_) {
    if (auto ns = w.lock()) ns->items.clear();
  }
  captured_frames_.clear();
  namespaces_.clear();
}

const Value* Interpreter::Lookup(const std::string& name) const {
  for (auto it = scope_.rbegin(); it != scope_.rend(); ++it)
    for (const auto& kv : (*it)->vars)
      if (kv.first == name) return &kv.second;
  return nullptr;
}

void Interpreter::Assign(const std::string& name, Value v) {
  auto& vars = scope_.back()->vars;
  for (auto& kv : vars) {
    if (kv.first == name) {
      kv.second = std::move(v);
      return;
    }
  }
  vars.emplace_back(name, std::move(v));
}

void Interpreter::AssignTargets(const std::vector<std::string>& names, const Value& v) {
  if (names.size() == 1) {
    Assign(names[0], v);
    return;
  }
  ValueList items = Iterate(v);
  if (items.size() != names.size())
    ThrowRuntime("cannot unpack " + std::to_string(items.size()) + " values into " +
                 std::to_string(names.size()) + " targets");
  for (size_t i = 0; i < names.size(); ++i) Assign(names[i], items[i]);
}

void Interpreter::Append(std::string& out, const Value& v) {
  v.AppendStr(out);
  CheckSize(out);
}

Interpreter::Flow Interpreter::Exec(const NodeList& body, std::string& out) {
  for (const auto& n : body) {
    Flow f = ExecNode(*n, out);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::ExecNode(const Node& n, std::string& out) {
  Step();
  try {
    switch (n.kind) {
      case Node::Kind::kData:
        out += n.name;
        CheckSize(out);
        return Flow::kNormal;
      case Node::Kind::kOutput:
        Append(out, Eval(*n.a));
        return Flow::kNormal;
      case Node::Kind::kIf:
        if (Eval(*n.a).Truthy()) return Exec(n.body, out);
        return Exec(n.orelse, out);
      case Node::Kind::kFor:
        return ExecFor(n, out);
      case Node::Kind::kSet: {
        Value v = Eval(*n.a);
        if (n.flag) {
          const Value* ns = Lookup(n.names[0]);
          if (!ns || !ns->is_namespace())
            throw TemplateError(TemplateError::Kind::kSecurity,
                                "cannot assign attribute on non-namespace object");
          ns->dict().Set(Value::Str(n.names[1]), std::move(v));
        } else {
          AssignTargets(n.names, v);
        }
        return Flow::kNormal;
      }
      case Node::Kind::kSetBlock: {
        std::string buf;
        Exec(n.body, buf);
        Value v = Value::Str(std::move(buf));
        for (const auto& f : n.list) v = EvalFilter(*f, std::move(v));
        AssignTargets(n.names, v);
        return Flow::kNormal;
      }
      case Node::Kind::kMacro:
        Assign(n.name, MakeMacro(n, false));
        return Flow::kNormal;
      case Node::Kind::kCallBlock: {
        const Node& call = *n.a;
        Value callee = Eval(*call.a);
        CallArgs args;
        for (const auto& e : call.list) args.args.push_back(Eval(*e));
        for (const auto& [k, e] : call.kwargs) args.kwargs.emplace_back(k, Eval(*e));
        args.caller = MakeMacro(n, true);
        Append(out, Call(callee, args));
        return Flow::kNormal;
      }
      case Node::Kind::kFilterBlock: {
        std::string buf;
        Exec(n.body, buf);
        Value v = Value::Str(std::move(buf));
        for (const auto& f : n.list) v = EvalFilter(*f, std::move(v));
        Append(out, v);
        return Flow::kNormal;
      }
      case Node::Kind::kBreak:
        return Flow::kBreak;
      case Node::Kind::kContinue:
        return Flow::kContinue;
      case Node::Kind::kWith: {
        std::vector<Value> vals;
        for (const auto& e : n.list) vals.push_back(Eval(*e));
        scope_.push_back(std::make_shared<Frame>());
        for (size_t i = 0; i < n.names.size(); ++i) Assign(n.names[i], vals[i]);
        Flow f = Exec(n.body, out);
        scope_.pop_back();
        return f;
      }
      default:
        ThrowRuntime("internal: expression used as statement");
    }
  } catch (TemplateError& e) {
    e.set_line(n.line);
    throw;
  }
}

Interpreter::Flow Interpreter::ExecFor(const Node& n, std::string& out) {
  Value iterable = Eval(*n.a);
  ExecFor(n, iterable, 1, out);
  return Flow::kNormal;
}

void Interpreter::ExecFor(const Node& n, const Value& iterable, int depth, std::string& out) {
  ValueList items = Iterate(iterable);
  auto frame = std::make_shared<Frame>();
  if (n.b) {  // "for x in y if cond": filter first so loop.length counts the kept items
    ValueList kept;
    scope_.push_back(frame);
    for (auto& item : items) {
      Step();
      frame->vars.clear();
      AssignTargets(n.names, item);
      if (Eval(*n.b).Truthy()) kept.push_back(std::move(item));
    }
    scope_.pop_back();
    items = std::move(kept);
  }
  if (items.empty()) {
    Exec(n.orelse, out);
    return;
  }
  auto loop = std::make_shared<LoopState>();
  loop->items = std::move(items);
  loop->depth = depth;
  if (n.flag) {
    loop->recurse = [&n, depth, this](Interpreter&, const Value& v) {
      if (depth >= limits_.max_call_depth)
        throw TemplateError(TemplateError::Kind::kLimit,
                            "recursive loop nested deeper than " +
                                std::to_string(limits_.max_call_depth) + "; endless recursion?");
      std::string buf;
      ExecFor(n, v, depth + 1, buf);
      return Value::Str(std::move(buf));
    };
  }
  Value loop_value = Value::MakeLoop(loop);
  scope_.push_back(frame);
  for (size_t i = 0; i < loop->items.size(); ++i) {
    Step();
    if (frame.use_count() > 2) {  // a macro captured the old frame; keep it intact
      frame = std::make_shared<Frame>();
      scope_.back() = frame;
    }
    frame->vars.clear();
    loop->index = i;
    AssignTargets(n.names, loop->items[i]);
    frame->vars.emplace_back("loop", loop_value);
    Flow f = Exec(n.body, out);
    if (f == Flow::kBreak) break;
  }
  scope_.pop_back();
}

Value Interpreter::MakeMacro(const Node& n, bool is_caller) {
  Scope captured = scope_;
  for (const auto& f : captured) TrackFrame(f);
  std::string name = is_caller ? "caller" : n.name;
  return Value::MakeCallable(name, [&n, captured, this](Interpreter&, CallArgs& args) {
    if (++call_depth_ > limits_.max_call_depth) {
      --call_depth_;
      throw TemplateError(TemplateError::Kind::kLimit, "macro calls nested deeper than " +
                                                           std::to_string(limits_.max_call_depth) +
                                                           "; endless recursion?");
    }
    Scope saved = std::move(scope_);
    scope_ = captured;
    scope_.push_back(std::make_shared<Frame>());
    struct Restore {
      Interpreter* self;
      Scope* saved;
      ~Restore() {
        self->scope_ = std::move(*saved);
        --self->call_depth_;
      }
    } restore{this, &saved};
    std::vector<bool> bound(n.names.size(), false);
    ValueList varargs;
    for (size_t i = 0; i < args.args.size(); ++i) {
      if (i < n.names.size()) {
        Assign(n.names[i], args.args[i]);
        bound[i] = true;
      } else {
        varargs.push_back(args.args[i]);
      }
    }
    auto kw = std::make_shared<DictObj>();
    for (auto& [k, v] : args.kwargs) {
      bool found = false;
      for (size_t i = 0; i < n.names.size(); ++i) {
        if (n.names[i] == k) {
          Assign(k, v);
          bound[i] = true;
          found = true;
        }
      }
      if (!found) kw->items.emplace_back(Value::Str(k), v);
    }
    for (size_t i = 0; i < n.names.size(); ++i) {
      if (bound[i]) continue;
      if (n.list[i])
        Assign(n.names[i], Eval(*n.list[i]));
      else
        Assign(n.names[i], Value::Undefined("parameter '" + n.names[i] + "' was not provided"));
    }
    Assign("varargs", Value::MakeList(std::move(varargs)));
    Assign("kwargs", Value::MakeDict(kw));
    if (!args.caller.is_undefined()) Assign("caller", args.caller);
    std::string out;
    Exec(n.body, out);
    return Value::Str(std::move(out));
  });
}

Value Interpreter::Call(const Value& callee, CallArgs& args) {
  Step();
  if (callee.is_callable()) return callee.callable().fn(*this, args);
  if (callee.is_undefined()) ThrowUndefined(callee);
  if (callee.is_loop() && callee.loop().recurse) {
    return callee.loop().recurse(*this, args.Get(0, "iterable"));
  }
  ThrowRuntime(TypeObject(callee) + " is not callable");
}

ValueList Interpreter::Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return v.list();
    case Value::Kind::kDict: {
      ValueList keys;
      keys.reserve(v.dict().items.size());
      for (const auto& kv : v.dict().items) keys.push_back(kv.first);
      return keys;
    }
    case Value::Kind::kString: {
      ValueList chars;
      for (auto& c : SplitCodepoints(v.str())) chars.push_back(Value::Str(std::move(c)));
      return chars;
    }
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kGenerator:
      return v.Consume();
    default:
      ThrowRuntime("'" + std::string(v.TypeName()) + "' object is not iterable");
  }
}

Value Interpreter::GetAttr(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      ThrowUndefined(obj);
    case Value::Kind::kDict: {
      Value m = GetMethod(obj, name);
      if (!m.is_undefined()) return m;
      if (const Value* v = obj.dict().Find(std::string_view(name))) return *v;
      break;
    }
    case Value::Kind::kNamespace:
      if (const Value* v = obj.dict().Find(std::string_view(name))) return *v;
      break;
    case Value::Kind::kLoop: {
      const LoopState& l = obj.loop();
      const int64_t n = static_cast<int64_t>(l.items.size());
      const int64_t i = static_cast<int64_t>(l.index);
      if (name == "index") return Value::Int(i + 1);
      if (name == "index0") return Value::Int(i);
      if (name == "revindex") return Value::Int(n - i);
      if (name == "revindex0") return Value::Int(n - i - 1);
      if (name == "first") return Value::Bool(i == 0);
      if (name == "last") return Value::Bool(i == n - 1);
      if (name == "length") return Value::Int(n);
      if (name == "depth") return Value::Int(l.depth);
      if (name == "depth0") return Value::Int(l.depth - 1);
      if (name == "previtem")
        return i > 0 ? l.items[i - 1] : Value::Undefined("there is no previous item");
      if (name == "nextitem")
        return i + 1 < n ? l.items[i + 1] : Value::Undefined("there is no next item");
      if (name == "cycle") {
        return Value::MakeCallable("cycle", [i](Interpreter&, CallArgs& a) {
          if (a.args.empty()) ThrowRuntime("no items for cycling given");
          return a.args[i % a.args.size()];
        });
      }
      break;
    }
    default: {
      Value m = GetMethod(obj, name);
      if (!m.is_undefined()) return m;
    }
  }
  return Value::Undefined(TypeObject(obj) + " has no attribute '" + name + "'");
}

Value Interpreter::GetItem(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      ThrowUndefined(obj);
    case Value::Kind::kDict:
    case Value::Kind::kNamespace:
      if (obj.is_dict() || key.is_string()) {
        if (const Value* v = obj.dict().Find(key)) return *v;
      }
      break;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      if (key.is_int() || key.is_bool()) {
        const auto& l = obj.list();
        int64_t i = key.as_int();
        if (i < 0) i += static_cast<int64_t>(l.size());
        if (i >= 0 && i < static_cast<int64_t>(l.size())) return l[i];
        return Value::Undefined(TypeObject(obj) + " has no element " + key.ToStr());
      }
      break;
    case Value::Kind::kString:
      if (key.is_int() || key.is_bool()) {
        auto cps = SplitCodepoints(obj.str());
        int64_t i = key.as_int();
        if (i < 0) i += static_cast<int64_t>(cps.size());
        if (i >= 0 && i < static_cast<int64_t>(cps.size())) return Value::Str(cps[i]);
        return Value::Undefined(TypeObject(obj) + " has no element " + key.ToStr());
      }
      break;
    case Value::Kind::kLoop:
      if (key.is_string()) return GetAttr(obj, key.str());
      break;
    default:
      break;
  }
  if (key.is_string()) {
    Value m = GetMethod(obj, key.str());
    if (!m.is_undefined()) return m;
    return Value::Undefined(TypeObject(obj) + " has no attribute '" + key.str() + "'");
  }
  std::string k;
  key.AppendRepr(k);
  return Value::Undefined(TypeObject(obj) + " has no element " + k);
}

Value Interpreter::EvalFilter(const Node& n, Value input) {
  CallArgs args;
  args.args.reserve(n.list.size());
  for (const auto& e : n.list) args.args.push_back(Eval(*e));
  for (const auto& [k, e] : n.kwargs) args.kwargs.emplace_back(k, Eval(*e));
  return ApplyFilter(*this, n.name, input, args);
}

Value Interpreter::Eval(const Node& n) {
  try {
    switch (n.kind) {
      case Node::Kind::kConst:
        return n.value;
      case Node::Kind::kName: {
        if (const Value* v = Lookup(n.name)) return *v;
        return Value::Undefined("'" + n.name + "' is undefined");
      }
      case Node::Kind::kGetAttr:
        return GetAttr(Eval(*n.a), n.name);
      case Node::Kind::kGetItem:
        return GetItem(Eval(*n.a), Eval(*n.b));
      case Node::Kind::kSlice: {
        Value obj = Eval(*n.a);
        if (obj.is_undefined()) ThrowUndefined(obj);
        auto part = [&](const NodePtr& p) -> std::optional<int64_t> {
          if (!p) return std::nullopt;
          Value v = Eval(*p);
          if (v.is_none()) return std::nullopt;
          if (!v.is_int() && !v.is_bool()) ThrowRuntime("slice indices must be integers or None");
          return v.as_int();
        };
        auto start = part(n.b), stop = part(n.c), step = part(n.d);
        if (obj.is_list_like()) {
          ValueList r = PySlice(obj.list(), start, stop, step);
          return obj.is_list() ? Value::MakeList(std::move(r)) : Value::MakeTuple(std::move(r));
        }
        if (obj.is_string()) {
          auto parts = PySlice(SplitCodepoints(obj.str()), start, stop, step);
          std::string s;
          for (auto& p : parts) s += p;
          return Value::Str(std::move(s));
        }
        return Value::Undefined(TypeObject(obj) + " is not subscriptable");
      }
      case Node::Kind::kCall: {
        Value callee = Eval(*n.a);
        CallArgs args;
        args.args.reserve(n.list.size());
        for (const auto& e : n.list) args.args.push_back(Eval(*e));
        for (const auto& [k, e] : n.kwargs) args.kwargs.emplace_back(k, Eval(*e));
        return Call(callee, args);
      }
      case Node::Kind::kFilter:
        return EvalFilter(n, Eval(*n.a));
      case Node::Kind::kTest: {
        Value v = Eval(*n.a);
        CallArgs args;
        for (const auto& e : n.list) args.args.push_back(Eval(*e));
        for (const auto& [k, e] : n.kwargs) args.kwargs.emplace_back(k, Eval(*e));
        bool r = ApplyTest(*this, n.name, v, args);
        return Value::Bool(n.flag ? !r : r);
      }
      case Node::Kind::kNeg:
      case Node::Kind::kPos: {
        Value v = Eval(*n.a);
        if (v.is_undefined()) ThrowUndefined(v);
        if (!v.is_number())
          ThrowRuntime("bad operand type for unary " +
                       std::string(n.kind == Node::Kind::kNeg ? "-" : "+") + ": '" +
                       std::string(v.TypeName()) + "'");
        if (n.kind == Node::Kind::kPos) return v.is_bool() ? Value::Int(v.as_int()) : v;
        if (v.is_float()) return Value::Float(-v.as_double());
        if (v.as_int() == INT64_MIN) ThrowRuntime("integer result out of range (64-bit integers)");
        return Value::Int(-v.as_int());
      }
      case Node::Kind::kNot:
        return Value::Bool(!Eval(*n.a).Truthy());
      case Node::Kind::kBinary: {
        Value a = Eval(*n.a);
        Value b = Eval(*n.b);
        if (n.name == "~") {
          std::string s = a.ToStr();
          b.AppendStr(s);
          return Value::Str(std::move(s));
        }
        if (a.is_undefined()) ThrowUndefined(a);
        if (b.is_undefined() && !(n.name == "%" && a.is_string())) ThrowUndefined(b);
        return BinaryOp(n.name, a, b);
      }
      case Node::Kind::kAnd: {
        Value a = Eval(*n.a);
        return a.Truthy() ? Eval(*n.b) : a;
      }
      case Node::Kind::kOr: {
        Value a = Eval(*n.a);
        return a.Truthy() ? a : Eval(*n.b);
      }
      case Node::Kind::kCompare: {
        Value left = Eval(*n.a);
        for (size_t i = 0; i < n.names.size(); ++i) {
          Value right = Eval(*n.list[i]);
          const std::string& op = n.names[i];
          bool r;
          if (op == "==")
            r = left.Equals(right);
          else if (op == "!=")
            r = !left.Equals(right);
          else if (op == "<")
            r = LessThan(left, right);
          else if (op == ">")
            r = LessThan(right, left);
          else if (op == "<=")
            r = LessThan(left, right) || left.Equals(right);
          else if (op == ">=")
            r = LessThan(right, left) || left.Equals(right);
          else if (op == "in")
            r = Contains(right, left);
          else
            r = !Contains(right, left);
          if (!r) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case Node::Kind::kCond:
        if (Eval(*n.a).Truthy()) return Eval(*n.b);
        if (n.c) return Eval(*n.c);
        return Value::Undefined("the inline if-expression on line " + std::to_string(n.line) +
                                " evaluated to false and no else section was defined.");
      case Node::Kind::kList:
      case Node::Kind::kTuple: {
        ValueList items;
        items.reserve(n.list.size());
        for (const auto& e : n.list) items.push_back(Eval(*e));
        return n.kind == Node::Kind::kList ? Value::MakeList(std::move(items))
                                           : Value::MakeTuple(std::move(items));
      }
      case Node::Kind::kDict: {
        auto d = std::make_shared<DictObj>();
        for (size_t i = 0; i + 1 < n.list.size(); i += 2) {
          Value k = Eval(*n.list[i]);
          d->Set(k, Eval(*n.list[i + 1]));
        }
        return Value::MakeDict(std::move(d));
      }
      default:
        ThrowRuntime("internal: statement used as expression");
    }
  } catch (TemplateError& e) {
    e.set_line(n.line);
    throw;
  }
}

}  // namespace agentkv::text::chat::jinja
