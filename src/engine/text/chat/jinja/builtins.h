// Builtin filters, tests, methods and globals of the jinja dialect that
// Hugging Face chat templates use, with jinja2 3.1 semantics.
#pragma once

#include <string>

#include "engine/text/chat/jinja/value.h"

namespace agentkv::text::chat::jinja {

// Applies filter `name`; throws TemplateError for an unknown filter.
Value ApplyFilter(Interpreter& in, const std::string& name, const Value& input, CallArgs& args);
bool HasFilter(const std::string& name);
bool HasTest(const std::string& name);
// Evaluates test `name` ("defined", "string", "divisibleby", ...).
bool ApplyTest(Interpreter& in, const std::string& name, const Value& v, CallArgs& args);
// A bound method such as "abc".startswith, or Undefined when `obj` has no
// such attribute; unsafe (mutating) methods yield a callable that throws.
Value GetMethod(const Value& obj, const std::string& name);
// Globals every template sees: range, dict, namespace, raise_exception,
// strftime_now, joiner-free subset.
void AddGlobals(DictObj& globals);
// json.dumps(v, ensure_ascii=False, indent=..., separators=..., sort_keys=...).
void DumpJson(const Value& v, const Value& indent, const std::string& item_sep,
              const std::string& key_sep, bool sort_keys, bool ensure_ascii, std::string& out);
// Python's binary operators on Values; throws TypeError-like errors.
Value BinaryOp(const std::string& op, const Value& a, const Value& b);
// Python ordering (<) for numbers, strings and sequences.
bool LessThan(const Value& a, const Value& b);
bool Contains(const Value& container, const Value& item);

}  // namespace agentkv::text::chat::jinja
