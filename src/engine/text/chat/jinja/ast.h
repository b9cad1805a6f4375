// AST of a parsed template. One Node type with a kind tag keeps the parser and
// interpreter small; which fields a kind uses is listed next to the kind.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/text/chat/jinja/value.h"

namespace agentkv::text::chat::jinja {

struct Node;
using NodePtr = std::unique_ptr<Node>;
using NodeList = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    // Expressions.
    kConst,    // value
    kName,     // name
    kGetAttr,  // a.name
    kGetItem,  // a[b]
    kSlice,    // a[b:c:d]; missing parts are null
    kCall,     // a(list..., kwargs...)
    kFilter,   // a|name(list..., kwargs...); a is null inside a filter block
    kTest,     // a is [not] name(list...); flag = negated
    kNeg,      // -a
    kPos,      // +a
    kNot,      // not a
    kBinary,   // a <name> b: + - * / // % ** ~
    kAnd,      // a and b
    kOr,       // a or b
    kCompare,  // a, then (names[i], list[i]) pairs: == != < <= > >= in notin
    kCond,     // b if a else c (c may be null)
    kList,     // [list...]
    kTuple,    // (list...)
    kDict,     // {list[2i]: list[2i+1]}
    // Statements.
    kData,         // literal text in name
    kOutput,       // {{ a }}
    kIf,           // a: cond, body, orelse (elif is a nested kIf in orelse)
    kFor,          // names: targets; a: iterable; b: filter; body; orelse; flag: recursive
    kSet,          // names: targets (or names={ns, attr} with flag); a: value
    kSetBlock,     // names[0]: target; list: filters (kFilter with a=null); body
    kMacro,        // name; names: params; list: defaults (null = required); body
    kCallBlock,    // a: the call; names: caller params; list: defaults; body
    kFilterBlock,  // list: filters; body
    kBreak,
    kContinue,
    kWith,  // names/list: assignments; body
  };

  Kind kind;
  int line = 0;
  bool flag = false;
  std::string name;
  Value value;
  NodePtr a, b, c, d;
  NodeList list;
  std::vector<std::pair<std::string, NodePtr>> kwargs;
  std::vector<std::string> names;
  NodeList body, orelse;

  Node(Kind k, int l) : kind(k), line(l) {}
};

}  // namespace agentkv::text::chat::jinja
