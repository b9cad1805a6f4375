// Interpreter: walks the AST with jinja2's runtime semantics (scoping of for
// bodies and macros, loop variables, Undefined, sandboxed attribute access).
// Throws TemplateError; Template turns that into a Status.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/text/chat/jinja/ast.h"
#include "engine/text/chat/jinja/value.h"

namespace agentkv::text::chat::jinja {

// Bounds that stop a runaway template; exceeding one is an error, never a crash.
struct RenderLimits {
  size_t max_output_bytes = 64u << 20;
  uint64_t max_steps = 50'000'000;  // statements, loop iterations and calls
  int max_call_depth = 256;         // nested macro calls
};

// The `loop` variable of a for loop.
struct LoopState {
  ValueList items;
  size_t index = 0;  // 0-based position of the current item
  int depth = 1;
  std::function<Value(Interpreter&, const Value&)> recurse;  // for "recursive" loops
};

class Interpreter {
 public:
  using Clock = std::function<std::chrono::system_clock::time_point()>;

  Interpreter(const RenderLimits& limits, Clock clock);

  // Renders `body` with `context` as the template's variables.
  std::string Render(const NodeList& body, const DictObj& context);

  // Python getattr / subscript with jinja2's sandboxed rules: a.b tries the
  // attribute (methods such as dict.items) before the item; a[b] the reverse.
  Value GetAttr(const Value& obj, const std::string& name);
  Value GetItem(const Value& obj, const Value& key);
  Value Call(const Value& callee, CallArgs& args);
  // Iterates a value as Python's iter() would (dict -> keys, str -> chars);
  // Undefined iterates empty.
  ValueList Iterate(const Value& v);
  const Clock& clock() const { return clock_; }
  void Step();
  // A namespace() the template created. Namespaces and the frames macros
  // capture are the only containers a template can change after creating
  // them, so every reference cycle of a render (a macro stored in the frame
  // it captured, a namespace holding itself or a loop over it) runs through
  // one of them: Render empties both kinds when it ends, error or not, so
  // nothing a render made outlives it.
  void TrackNamespace(std::shared_ptr<DictObj> ns);

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  struct Frame {
    std::vector<std::pair<std::string, Value>> vars;
    bool tracked = false;  // in captured_frames_
  };
  using Scope = std::vector<std::shared_ptr<Frame>>;

  Flow Exec(const NodeList& body, std::string& out);
  Flow ExecNode(const Node& n, std::string& out);
  Flow ExecFor(const Node& n, std::string& out);
  void ExecFor(const Node& n, const Value& iterable, int depth, std::string& out);
  Value Eval(const Node& n);
  Value EvalBinary(const Node& n);
  Value EvalFilter(const Node& n, Value input);
  Value MakeMacro(const Node& n, bool is_caller);
  void TrackFrame(const std::shared_ptr<Frame>& frame);
  // Empties the tracked frames and namespaces still alive (see TrackNamespace).
  void BreakCycles();
  void Append(std::string& out, const Value& v);
  void CheckSize(const std::string& out);

  const Value* Lookup(const std::string& name) const;
  void Assign(const std::string& name, Value v);
  void AssignTargets(const std::vector<std::string>& names, const Value& v);

  RenderLimits limits_;
  Clock clock_;
  Scope scope_;
  // Weak: a container nothing else holds is freed as usual. Expired entries
  // are dropped whenever a list doubles, so a template that makes many
  // (a macro defined in a long loop) keeps memory bounded by the live ones.
  std::vector<std::weak_ptr<Frame>> captured_frames_;  // by macros, each once
  std::vector<std::weak_ptr<DictObj>> namespaces_;
  size_t compact_frames_at_ = 64, compact_namespaces_at_ = 64;
  uint64_t steps_ = 0;
  int call_depth_ = 0;
};

}  // namespace agentkv::text::chat::jinja
