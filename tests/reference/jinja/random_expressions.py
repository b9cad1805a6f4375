"""Seeded random Jinja expressions and statements over a fixed context,
rendered with Python jinja2 (configured like transformers). Prints the same
JSON shape as render_snippets.py; the C++ test compares each one.

Usage: random_expressions.py [--seed S] [--count N]
"""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_env  # noqa: E402
from render_snippets import CTX  # noqa: E402

ATOMS = ["n", "f", "neg", "big", "small", "t", "nil", "missing", "lst", "words", "d", "msgs",
         "esc", "u", "s", "nested", "0", "1", "2", "-1", "2.5", "0.1", "1e3", "'a'", "''",
         "'Hello'", "\"x y\"", "true", "false", "none", "[1, 'b', none]", "{'k': 1, 'j': [2]}",
         "(1, 2)", "msgs[0]", "d.a", "d.c", "lst[0]", "words[-1]", "u[2:]"]
BINOPS = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">", "<=", ">=", "and", "or",
          "in", "not in"]
FILTERS = ["length", "first", "last", "list", "string", "upper", "lower", "trim", "title",
           "capitalize", "tojson", "sort", "reverse", "unique", "min", "max", "sum", "abs", "int",
           "float", "join(', ')", "default('dv')", "d(0, true)", "items", "dictsort",
           "map('string')", "select('odd')", "reject('none')", "tojson(indent=2)", "round(1)",
           "replace('a', 'A')", "indent(2)", "count", "wordcount", "batch(2)",
           "selectattr('role', 'equalto', 'user')", "map(attribute='role')"]
# Left out on purpose: printing dict views (dict_keys([...])) and Markup
# inside containers (Markup('...')), which this engine renders as list / str.
TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping",
         "iterable", "sequence", "boolean", "true", "false", "odd", "even", "divisibleby 2",
         "in lst", "eq 1", "lower", "upper"]
METHODS = ["strip()", "upper()", "split()", "split(',')", "startswith('H')", "endswith('o')",
           "replace('l', 'L')", "lstrip('H ')", "title()", "items()|list", "get('a')",
           "get('zz', 5)", "count('l')", "find('o')"]


def expr(rng, depth=0):
    r = rng.random()
    if depth > 2 or r < 0.3:
        return rng.choice(ATOMS)
    if r < 0.5:
        return "(%s %s %s)" % (expr(rng, depth + 1), rng.choice(BINOPS), expr(rng, depth + 1))
    if r < 0.65:
        return "(%s | %s)" % (expr(rng, depth + 1), rng.choice(FILTERS))
    if r < 0.75:
        return "(%s is %s%s)" % (expr(rng, depth + 1), rng.choice(["", "not "]), rng.choice(TESTS))
    if r < 0.85:
        return "%s.%s" % (rng.choice(["s", "u", "esc", "'a,b'", "d", "words[0]"]), rng.choice(METHODS))
    if r < 0.9:
        return "(not %s)" % expr(rng, depth + 1)
    if r < 0.95:
        return "(%s if %s else %s)" % (expr(rng, depth + 1), expr(rng, depth + 1), expr(rng, depth + 1))
    return "[%s, %s]" % (expr(rng, depth + 1), expr(rng, depth + 1))


def statement(rng):
    r = rng.random()
    e = expr(rng)
    if r < 0.6:
        return "{{ %s }}" % e
    if r < 0.8:
        return "{%% for x in %s %%}{{ loop.index }}:{{ x }};{%% else %%}E{%% endfor %%}" % e
    return "{%% if %s %%}Y{%% else %%}N{%% endif %%}" % e


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=99)
    ap.add_argument("--count", type=int, default=1500)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    env = hf_env.make_env()
    out = []
    while len(out) < args.count:
        src = statement(rng)
        case = {"template": src, "context": CTX}
        case.update(hf_env.render(env, src, CTX))
        # Python prints generators and methods with their memory address; no
        # other renderer can reproduce that, so such cases are drawn again.
        if " at 0x" in case.get("output", "").lower():
            continue
        out.append(case)
    json.dump(out, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
