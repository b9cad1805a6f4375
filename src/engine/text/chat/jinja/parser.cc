#include "engine/text/chat/jinja/parser.h"

#include <charconv>
#include <cstdlib>
#include <set>

#include "engine/text/chat/jinja/builtins.h"
#include "engine/text/chat/jinja/error.h"

namespace agentkv::text::chat::jinja {
namespace {

constexpr int kMaxDepth = 200;  // bounds native recursion on hostile input

class Parser {
 public:
  explicit Parser(const std::vector<Token>& t) : t_(t) {}

  NodeList ParseTemplate() {
    NodeList out = ParseBody({});
    if (Cur().type != Token::Type::kEof) Fail("unexpected tag");
    return out;
  }

 private:
  using T = Token::Type;
  const Token& Cur() const { return t_[p_]; }
  const Token& Peek(size_t k = 1) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  void Next() {
    if (p_ + 1 < t_.size()) ++p_;
  }
  [[noreturn]] void Fail(const std::string& msg) const {
    throw TemplateError(TemplateError::Kind::kSyntax, msg, Cur().line);
  }
  bool IsOp(const char* op) const { return Cur().type == T::kOp && Cur().text == op; }
  bool IsName(const char* n) const { return Cur().type == T::kName && Cur().text == n; }
  bool SkipOp(const char* op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(const char* n) {
    if (!IsName(n)) return false;
    Next();
    return true;
  }
  void ExpectOp(const char* op) {
    if (!SkipOp(op)) Fail(std::string("expected '") + op + "', got '" + Cur().text + "'");
  }
  std::string ExpectName() {
    if (Cur().type != T::kName) Fail("expected a name, got '" + Cur().text + "'");
    std::string n = Cur().text;
    Next();
    return n;
  }
  void ExpectBlockEnd() {
    if (Cur().type != T::kBlockEnd)
      Fail("expected end of statement block, got '" + Cur().text + "'");
    Next();
  }
  NodePtr Make(Node::Kind k) { return std::make_unique<Node>(k, Cur().line); }

  struct DepthGuard {
    explicit DepthGuard(Parser* p) : p(p) {
      if (++p->depth_ > kMaxDepth) p->Fail("template nested too deeply");
    }
    ~DepthGuard() { --p->depth_; }
    Parser* p;
  };

  // Parses statements until a block tag whose keyword is in `ends` (left
  // unconsumed, positioned at the keyword) or EOF.
  NodeList ParseBody(const std::set<std::string>& ends) {
    DepthGuard g(this);
    NodeList out;
    while (true) {
      const Token& tok = Cur();
      if (tok.type == T::kEof) {
        if (!ends.empty()) Fail("unexpected end of template, expected " + *ends.begin());
        return out;
      }
      if (tok.type == T::kData) {
        auto n = Make(Node::Kind::kData);
        n->name = tok.text;
        out.push_back(std::move(n));
        Next();
      } else if (tok.type == T::kVarBegin) {
        Next();
        auto n = Make(Node::Kind::kOutput);
        n->a = ParseTupleExpr();
        if (Cur().type != T::kVarEnd)
          Fail("expected end of print statement, got '" + Cur().text + "'");
        Next();
        out.push_back(std::move(n));
      } else if (tok.type == T::kBlockBegin) {
        Next();
        if (Cur().type == T::kName && ends.count(Cur().text)) return out;
        out.push_back(ParseStatement());
      } else {
        Fail("unexpected token");
      }
    }
  }

  NodePtr ParseStatement() {
    if (Cur().type != T::kName) Fail("tag name expected");
    std::string kw = Cur().text;
    if (kw == "if") return ParseIf();
    if (kw == "for") return ParseFor();
    if (kw == "set") return ParseSet();
    if (kw == "macro") return ParseMacro();
    if (kw == "call") return ParseCallBlock();
    if (kw == "filter") return ParseFilterBlock();
    if (kw == "with") return ParseWith();
    if (kw == "generation") {  // transformers' AssistantTracker tag: renders its body
      Next();
      ExpectBlockEnd();
      NodeList body = ParseBody({"endgeneration"});
      Next();
      ExpectBlockEnd();
      auto n = Make(Node::Kind::kIf);
      n->a = Make(Node::Kind::kConst);
      n->a->value = Value::Bool(true);
      n->body = std::move(body);
      return n;
    }
    if (kw == "break" || kw == "continue") {
      if (loop_depth_ == 0) Fail("'" + kw + "' outside of a loop");
      auto n = Make(kw == "break" ? Node::Kind::kBreak : Node::Kind::kContinue);
      Next();
      ExpectBlockEnd();
      return n;
    }
    Fail("Encountered unknown tag '" + kw + "'.");
  }

  NodePtr ParseIf() {
    auto n = Make(Node::Kind::kIf);
    Next();  // if / elif
    n->a = ParseTupleExpr();
    ExpectBlockEnd();
    // jinja2 checks filter and test names at compile time, except inside an
    // if block, where the check waits until the node runs.
    ++if_depth_;
    struct Leave {
      int* d;
      ~Leave() { --*d; }
    } leave{&if_depth_};
    n->body = ParseBody({"elif", "else", "endif"});
    if (IsName("elif")) {
      n->orelse.push_back(ParseIf());
      return n;
    }
    if (SkipName("else")) {
      ExpectBlockEnd();
      n->orelse = ParseBody({"endif"});
    }
    Next();  // endif
    ExpectBlockEnd();
    return n;
  }

  void ParseTargets(std::vector<std::string>& names) {
    bool paren = SkipOp("(");
    names.push_back(ExpectName());
    while (SkipOp(",")) {
      if (IsName("in") || IsOp(")") || IsOp("=")) break;
      names.push_back(ExpectName());
    }
    if (paren) ExpectOp(")");
  }

  NodePtr ParseFor() {
    auto n = Make(Node::Kind::kFor);
    Next();
    ParseTargets(n->names);
    if (!SkipName("in")) Fail("expected 'in'");
    n->a = ParseTupleExpr(/*allow_cond=*/false);
    if (SkipName("if")) n->b = ParseExpr();
    if (SkipName("recursive")) n->flag = true;
    ExpectBlockEnd();
    ++loop_depth_;
    n->body = ParseBody({"endfor", "else"});
    --loop_depth_;
    if (SkipName("else")) {
      ExpectBlockEnd();
      n->orelse = ParseBody({"endfor"});
    }
    Next();
    ExpectBlockEnd();
    return n;
  }

  NodePtr ParseSet() {
    Next();
    std::string first = ExpectName();
    if (SkipOp(".")) {  // namespace attribute
      auto n = Make(Node::Kind::kSet);
      n->flag = true;
      n->names = {first, ExpectName()};
      ExpectOp("=");
      n->a = ParseTupleExpr();
      ExpectBlockEnd();
      return n;
    }
    std::vector<std::string> names{first};
    while (SkipOp(",")) names.push_back(ExpectName());
    if (SkipOp("=")) {
      auto n = Make(Node::Kind::kSet);
      n->names = std::move(names);
      n->a = ParseTupleExpr();
      ExpectBlockEnd();
      return n;
    }
    auto n = Make(Node::Kind::kSetBlock);
    n->names = std::move(names);
    while (SkipOp("|")) n->list.push_back(ParseFilter(nullptr));
    ExpectBlockEnd();
    n->body = ParseBody({"endset"});
    Next();
    ExpectBlockEnd();
    return n;
  }

  void ParseParams(Node& n) {
    ExpectOp("(");
    while (!IsOp(")")) {
      if (!n.names.empty()) ExpectOp(",");
      if (IsOp(")")) break;
      n.names.push_back(ExpectName());
      n.list.push_back(SkipOp("=") ? ParseExpr() : nullptr);
    }
    ExpectOp(")");
  }

  NodePtr ParseMacro() {
    auto n = Make(Node::Kind::kMacro);
    Next();
    n->name = ExpectName();
    ParseParams(*n);
    ExpectBlockEnd();
    int saved = loop_depth_;
    loop_depth_ = 0;
    n->body = ParseBody({"endmacro"});
    loop_depth_ = saved;
    Next();
    ExpectBlockEnd();
    return n;
  }

  NodePtr ParseCallBlock() {
    auto n = Make(Node::Kind::kCallBlock);
    Next();
    if (IsOp("(")) ParseParams(*n);
    n->a = ParseExpr();
    if (n->a->kind != Node::Kind::kCall) Fail("expected call");
    ExpectBlockEnd();
    n->body = ParseBody({"endcall"});
    Next();
    ExpectBlockEnd();
    return n;
  }

  NodePtr ParseFilterBlock() {
    auto n = Make(Node::Kind::kFilterBlock);
    Next();
    n->list.push_back(ParseFilter(nullptr));
    while (SkipOp("|")) n->list.push_back(ParseFilter(nullptr));
    ExpectBlockEnd();
    n->body = ParseBody({"endfilter"});
    Next();
    ExpectBlockEnd();
    return n;
  }

  NodePtr ParseWith() {
    auto n = Make(Node::Kind::kWith);
    Next();
    while (Cur().type != T::kBlockEnd) {
      if (!n->names.empty()) ExpectOp(",");
      n->names.push_back(ExpectName());
      ExpectOp("=");
      n->list.push_back(ParseExpr());
    }
    ExpectBlockEnd();
    n->body = ParseBody({"endwith"});
    Next();
    ExpectBlockEnd();
    return n;
  }

  // ---- expressions ----

  // An expression, or a bare tuple "a, b" as jinja2 allows in {{ }} and set.
  NodePtr ParseTupleExpr(bool allow_cond = true) {
    int line = Cur().line;
    NodePtr first = allow_cond ? ParseExpr() : ParseOr();
    if (!IsOp(",")) return first;
    auto t = std::make_unique<Node>(Node::Kind::kTuple, line);
    t->list.push_back(std::move(first));
    while (SkipOp(",")) {
      if (Cur().type == T::kBlockEnd || Cur().type == T::kVarEnd || IsName("if")) break;
      t->list.push_back(allow_cond ? ParseExpr() : ParseOr());
    }
    return t;
  }

  NodePtr ParseExpr() {
    DepthGuard g(this);
    NodePtr expr = ParseOr();
    while (IsName("if")) {
      auto n = Make(Node::Kind::kCond);
      Next();
      n->a = ParseOr();
      if (SkipName("else")) n->c = ParseExpr();
      n->b = std::move(expr);
      expr = std::move(n);
    }
    return expr;
  }

  NodePtr ParseOr() {
    NodePtr l = ParseAnd();
    while (IsName("or")) {
      auto n = Make(Node::Kind::kOr);
      Next();
      n->a = std::move(l);
      n->b = ParseAnd();
      l = std::move(n);
    }
    return l;
  }

  NodePtr ParseAnd() {
    NodePtr l = ParseNot();
    while (IsName("and")) {
      auto n = Make(Node::Kind::kAnd);
      Next();
      n->a = std::move(l);
      n->b = ParseNot();
      l = std::move(n);
    }
    return l;
  }

  NodePtr ParseNot() {
    if (IsName("not")) {
      DepthGuard g(this);
      auto n = Make(Node::Kind::kNot);
      Next();
      n->a = ParseNot();
      return n;
    }
    return ParseCompare();
  }

  NodePtr ParseCompare() {
    NodePtr l = ParseMath1();
    NodePtr cmp;
    while (true) {
      std::string op;
      if (Cur().type == T::kOp && (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" ||
                                   Cur().text == "<=" || Cur().text == ">" || Cur().text == ">=")) {
        op = Cur().text;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && Peek().type == T::kName && Peek().text == "in") {
        op = "notin";
        Next();
        Next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = std::make_unique<Node>(Node::Kind::kCompare, l->line);
        cmp->a = std::move(l);
      }
      cmp->names.push_back(op);
      cmp->list.push_back(ParseMath1());
    }
    return cmp ? std::move(cmp) : std::move(l);
  }

  NodePtr Binary(const std::string& op, NodePtr l, NodePtr r, int line) {
    auto n = std::make_unique<Node>(Node::Kind::kBinary, line);
    n->name = op;
    n->a = std::move(l);
    n->b = std::move(r);
    return n;
  }

  NodePtr ParseMath1() {
    NodePtr l = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      std::string op = Cur().text;
      int line = Cur().line;
      Next();
      l = Binary(op, std::move(l), ParseConcat(), line);
    }
    return l;
  }

  NodePtr ParseConcat() {
    NodePtr l = ParseMath2();
    while (IsOp("~")) {
      int line = Cur().line;
      Next();
      l = Binary("~", std::move(l), ParseMath2(), line);
    }
    return l;
  }

  NodePtr ParseMath2() {
    NodePtr l = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      std::string op = Cur().text;
      int line = Cur().line;
      Next();
      l = Binary(op, std::move(l), ParsePow(), line);
    }
    return l;
  }

  NodePtr ParsePow() {
    NodePtr l = ParseUnary(true);
    while (IsOp("**")) {
      int line = Cur().line;
      Next();
      l = Binary("**", std::move(l), ParseUnary(true), line);
    }
    return l;
  }

  NodePtr ParseUnary(bool with_filter) {
    DepthGuard g(this);
    NodePtr node;
    if (IsOp("-") || IsOp("+")) {
      node = Make(IsOp("-") ? Node::Kind::kNeg : Node::Kind::kPos);
      Next();
      node->a = ParseUnary(false);
    } else {
      node = ParsePrimary();
    }
    node = ParsePostfix(std::move(node));
    if (with_filter) node = ParseFilterExpr(std::move(node));
    return node;
  }

  NodePtr ParsePrimary() {
    const Token& tok = Cur();
    auto n = Make(Node::Kind::kConst);
    switch (tok.type) {
      case T::kName: {
        const std::string& s = tok.text;
        if (s == "true" || s == "True") {
          n->value = Value::Bool(true);
        } else if (s == "false" || s == "False") {
          n->value = Value::Bool(false);
        } else if (s == "none" || s == "None") {
          n->value = Value::None();
        } else {
          n->kind = Node::Kind::kName;
          n->name = s;
        }
        Next();
        return n;
      }
      case T::kString: {
        std::string s = tok.text;
        Next();
        while (Cur().type == T::kString) {
          s += Cur().text;
          Next();
        }
        n->value = Value::Str(std::move(s));
        return n;
      }
      case T::kInt: {
        int64_t v = 0;
        auto r = std::from_chars(tok.text.data(), tok.text.data() + tok.text.size(), v);
        if (r.ec != std::errc()) Fail("integer literal out of range");
        n->value = Value::Int(v);
        Next();
        return n;
      }
      case T::kFloat:
        n->value = Value::Float(std::strtod(tok.text.c_str(), nullptr));
        Next();
        return n;
      case T::kOp:
        if (tok.text == "(") {
          Next();
          if (SkipOp(")")) {
            n->kind = Node::Kind::kTuple;
            return n;
          }
          NodePtr e = ParseExpr();
          if (IsOp(",")) {
            auto t = Make(Node::Kind::kTuple);
            t->list.push_back(std::move(e));
            while (SkipOp(",")) {
              if (IsOp(")")) break;
              t->list.push_back(ParseExpr());
            }
            e = std::move(t);
          }
          ExpectOp(")");
          return e;
        }
        if (tok.text == "[") {
          n->kind = Node::Kind::kList;
          Next();
          while (!IsOp("]")) {
            if (!n->list.empty()) ExpectOp(",");
            if (IsOp("]")) break;
            n->list.push_back(ParseExpr());
          }
          Next();
          return n;
        }
        if (tok.text == "{") {
          n->kind = Node::Kind::kDict;
          Next();
          while (!IsOp("}")) {
            if (!n->list.empty()) ExpectOp(",");
            if (IsOp("}")) break;
            n->list.push_back(ParseExpr());
            ExpectOp(":");
            n->list.push_back(ParseExpr());
          }
          Next();
          return n;
        }
        break;
      default:
        break;
    }
    Fail("unexpected '" + tok.text + "'");
  }

  NodePtr ParsePostfix(NodePtr node) {
    while (true) {
      if (IsOp(".")) {
        Next();
        auto n = Make(Node::Kind::kGetAttr);
        if (Cur().type == T::kName) {
          n->name = Cur().text;
        } else if (Cur().type == T::kInt) {  // foo.0 is foo[0]
          n->kind = Node::Kind::kGetItem;
          n->b = Make(Node::Kind::kConst);
          n->b->value = Value::Int(std::atoll(Cur().text.c_str()));
        } else {
          Fail("expected name after '.'");
        }
        Next();
        n->a = std::move(node);
        node = std::move(n);
      } else if (IsOp("[")) {
        Next();
        node = ParseSubscript(std::move(node));
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  NodePtr ParseSubscript(NodePtr obj) {
    int line = Cur().line;
    NodePtr parts[3];
    bool slice = false;
    int i = 0;
    while (true) {
      if (IsOp(":")) {
        slice = true;
        if (++i > 2) Fail("invalid slice");
        Next();
        continue;
      }
      if (IsOp("]")) break;
      if (parts[i]) Fail("expected ']'");
      parts[i] = ParseExpr();
    }
    Next();
    auto n = std::make_unique<Node>(slice ? Node::Kind::kSlice : Node::Kind::kGetItem, line);
    n->a = std::move(obj);
    n->b = std::move(parts[0]);
    n->c = std::move(parts[1]);
    n->d = std::move(parts[2]);
    if (!slice && !n->b) Fail("expected subscript");
    return n;
  }

  void ParseArgs(Node& n) {
    ExpectOp("(");
    bool first = true;
    while (!IsOp(")")) {
      if (!first) ExpectOp(",");
      first = false;
      if (IsOp(")")) break;
      if (Cur().type == T::kName && Peek().type == T::kOp && Peek().text == "=") {
        std::string key = Cur().text;
        Next();
        Next();
        n.kwargs.emplace_back(key, ParseExpr());
      } else {
        if (!n.kwargs.empty()) Fail("positional argument after keyword argument");
        n.list.push_back(ParseExpr());
      }
    }
    Next();
  }

  NodePtr ParseCall(NodePtr callee) {
    auto n = Make(Node::Kind::kCall);
    n->a = std::move(callee);
    ParseArgs(*n);
    return n;
  }

  NodePtr ParseFilter(NodePtr input) {
    auto n = Make(Node::Kind::kFilter);
    n->name = ExpectName();
    while (IsOp(".")) {
      Next();
      n->name += "." + ExpectName();
    }
    if (if_depth_ == 0 && !HasFilter(n->name)) Fail("No filter named '" + n->name + "'.");
    n->a = std::move(input);
    if (IsOp("(")) ParseArgs(*n);
    return n;
  }

  NodePtr ParseFilterExpr(NodePtr node) {
    while (true) {
      if (SkipOp("|")) {
        node = ParseFilter(std::move(node));
      } else if (IsName("is")) {
        Next();
        auto n = Make(Node::Kind::kTest);
        if (SkipName("not")) n->flag = true;
        n->name = ExpectName();
        while (IsOp(".")) {
          Next();
          n->name += "." + ExpectName();
        }
        if (if_depth_ == 0 && !HasTest(n->name)) Fail("No test named '" + n->name + "'.");
        n->a = std::move(node);
        if (IsOp("(")) {
          ParseArgs(*n);
        } else if ((Cur().type == T::kName || Cur().type == T::kString || Cur().type == T::kInt ||
                    Cur().type == T::kFloat || IsOp("[") || IsOp("{")) &&
                   !IsName("else") && !IsName("or") && !IsName("and")) {
          if (IsName("is")) Fail("You cannot chain multiple tests with is");
          n->list.push_back(ParsePostfix(ParsePrimary()));
        }
        node = std::move(n);
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  const std::vector<Token>& t_;
  size_t p_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  int if_depth_ = 0;
};

}  // namespace

NodeList Parse(const std::vector<Token>& tokens) { return Parser(tokens).ParseTemplate(); }

}  // namespace agentkv::text::chat::jinja
