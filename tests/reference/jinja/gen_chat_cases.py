"""Seeded generator of chat conversations, rendered with Python jinja2 the way
transformers' apply_chat_template renders them.

Usage: gen_chat_cases.py DATA_DIR [--seed S] [--count N] [--models a,b]
Prints JSON {"cases": [{model, messages, tools, add_generation_prompt, extra,
output | error}]}. The C++ test renders the same inputs and compares.
"""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_env  # noqa: E402

MODELS = ("qwen3", "llama3_1", "gemma3", "deepseek_v3", "gptoss")

WORDS = [
    "the", "model", "should", "call", "a", "tool", "weather", "in", "Paris", "today", "please",
    "compute", "sum", "of", "42", "and", "3.14", "file", "src/main.cc", "line", "error:",
    "héllo", "naïve", "café", "中文", "日本語", "Привет", "🎉", "👍🏽", "\"quoted\"", "it's",
    "back\\slash", "<tag>", "</tag>", "{{ not_jinja }}", "{% raw %}", "tab\there", "\u00a0nbsp",
    "x\u2028y", "null", "true", "`code`", "```python", "def f():", "  return 1", "```",
    "<tool_call>", "<think>", "#", "*bold*", "%s", "{}", "\\n", "100%",
]

TYPES = ("string", "integer", "number", "boolean", "array", "object")


def text(rng, lo=1, hi=25):
    n = rng.randint(lo, hi)
    parts = []
    for _ in range(n):
        parts.append(rng.choice(WORDS))
        parts.append(rng.choice([" ", " ", " ", " ", "\n", "\n\n", ", "]))
    s = "".join(parts[:-1])
    r = rng.random()
    if r < 0.1:
        s = "  " + s + "\n"
    elif r < 0.15:
        s = "\n\n" + s
    elif r < 0.18:
        s = ""
    return s


def ident(rng):
    return rng.choice(["get", "set", "find", "run", "list", "fetch", "search", "read"]) + "_" + \
        rng.choice(["weather", "file", "user", "docs", "time", "code", "issue", "price"]) + \
        ("_v%d" % rng.randint(2, 9) if rng.random() < 0.2 else "")


def schema(rng, depth=0):
    t = rng.choice(TYPES if depth < 2 else TYPES[:4])
    s = {"type": t}
    if rng.random() < 0.6:
        s["description"] = text(rng, 1, 8)
    if t == "string" and rng.random() < 0.3:
        s["enum"] = [rng.choice(WORDS) for _ in range(rng.randint(1, 4))]
    if t == "number" and rng.random() < 0.5:
        s["default"] = rng.choice([0.5, 1e-9, 3.0, 100.25, -2.5e10, 1e22, 0.1])
    if t == "integer" and rng.random() < 0.5:
        s["minimum"] = rng.randint(-5, 5)
        s["maximum"] = rng.randint(10, 10**12)
    if t == "boolean" and rng.random() < 0.3:
        s["default"] = rng.random() < 0.5
    if t == "array":
        s["items"] = schema(rng, depth + 1)
    if t == "object":
        props = {}
        for _ in range(rng.randint(0, 3)):
            props[ident(rng)] = schema(rng, depth + 1)
        s["properties"] = props
        if props and rng.random() < 0.5:
            s["required"] = list(props)[:1]
    if rng.random() < 0.05:
        s["nullable"] = None
    return s


def tool(rng):
    props = {}
    for _ in range(rng.randint(0, 5)):
        props[ident(rng)] = schema(rng)
    fn = {"name": ident(rng), "description": text(rng, 3, 20),
          "parameters": {"type": "object", "properties": props,
                         "required": [k for k in props if rng.random() < 0.5]}}
    return {"type": "function", "function": fn}


def value_for(rng, s, depth=0):
    t = s.get("type")
    if t == "string":
        return rng.choice(s.get("enum") or [text(rng, 1, 5)])
    if t == "integer":
        return rng.randint(-1000, 10**9)
    if t == "number":
        return rng.choice([0.5, 2.0, -1.25, 1e-7, 123456.789, 1e16, 3.0000000000000004])
    if t == "boolean":
        return rng.random() < 0.5
    if t == "array":
        return [value_for(rng, s["items"], depth + 1) for _ in range(rng.randint(0, 3))]
    if t == "object":
        return {k: value_for(rng, v, depth + 1) for k, v in s.get("properties", {}).items()}
    return None


def tool_call(rng, tools, string_args):
    if tools:
        t = rng.choice(tools)["function"]
        name = t["name"]
        args = {k: value_for(rng, v) for k, v in t["parameters"]["properties"].items()}
    else:
        name = ident(rng)
        args = {"q": text(rng, 1, 4), "n": rng.randint(0, 9)}
    if rng.random() < 0.05:
        args = {}
    if string_args:
        args = json.dumps(args, ensure_ascii=rng.random() < 0.5)
    return {"type": "function", "function": {"name": name, "arguments": args}}


def qwen3_conversation(rng, tools):
    msgs = []
    if rng.random() < 0.6:
        msgs.append({"role": "system", "content": text(rng)})
    for _ in range(rng.randint(1, 5)):
        u = text(rng)
        if rng.random() < 0.1:
            u = "<tool_response>\n" + u + "\n</tool_response>"
        msgs.append({"role": "user", "content": u})
        if rng.random() < 0.15 and len(msgs) > 2:
            break
        a = {"role": "assistant", "content": text(rng)}
        r = rng.random()
        if r < 0.25:
            a["content"] = "<think>\n" + text(rng) + "\n</think>\n\n" + a["content"]
        elif r < 0.45:
            a["reasoning_content"] = text(rng)
        elif r < 0.5:
            a["reasoning_content"] = None
        if rng.random() < 0.4:
            calls = [tool_call(rng, tools, rng.random() < 0.2) for _ in range(rng.randint(1, 3))]
            if rng.random() < 0.15:  # bare {name, arguments} without the "function" wrapper
                calls = [c["function"] for c in calls]
            a["tool_calls"] = calls
            if rng.random() < 0.5:
                a["content"] = ""
            elif rng.random() < 0.03:
                a["content"] = None  # Python fails on this ('in' on None); so must we
            msgs.append(a)
            for _ in range(rng.randint(1, 3)):
                msgs.append({"role": "tool", "content": text(rng)})
            if rng.random() < 0.6:
                msgs.append({"role": "assistant", "content": text(rng)})
        else:
            msgs.append(a)
    if rng.random() < 0.3 and msgs[-1]["role"] == "assistant":
        msgs.pop()
    if rng.random() < 0.05:
        msgs.append({"role": "system", "content": text(rng)})
    return msgs


def llama_conversation(rng, tools):
    msgs = []
    if rng.random() < 0.6:
        msgs.append({"role": "system", "content": text(rng)})
    for _ in range(rng.randint(1, 6)):
        msgs.append({"role": "user", "content": text(rng)})
        if rng.random() < 0.3:
            msgs.append({"role": "assistant", "content": "",
                         "tool_calls": [tool_call(rng, tools, False)]})
            msgs.append({"role": "tool", "content": text(rng)})
        msgs.append({"role": "assistant", "content": text(rng)})
    if rng.random() < 0.5:
        msgs.pop()
    if rng.random() < 0.03:
        msgs[-1]["content"] = None  # Python fails on trim of None? we must match
    return msgs


def gemma_content(rng):
    if rng.random() < 0.2:
        parts = []
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.3:
                parts.append({"type": "image"})
            else:
                parts.append({"type": "text", "text": text(rng)})
        return parts
    return text(rng)


def gemma_conversation(rng, tools):
    msgs = []
    if rng.random() < 0.5:
        c = text(rng)
        if rng.random() < 0.2:
            c = [{"type": "text", "text": c}]
        msgs.append({"role": "system", "content": c})
    for _ in range(rng.randint(1, 6)):
        msgs.append({"role": "user", "content": gemma_content(rng)})
        msgs.append({"role": "assistant", "content": gemma_content(rng)})
    if rng.random() < 0.5:
        msgs.pop()
    r = rng.random()
    if r < 0.05:  # breaks alternation: the template raises
        msgs.append({"role": "user", "content": "again"})
        msgs.append({"role": "user", "content": "and again"})
    elif r < 0.08:
        msgs.append({"role": "tool", "content": text(rng)})
    elif r < 0.1:
        msgs.append({"role": "user", "content": 42})  # neither string nor iterable
    return msgs


def deepseek_conversation(rng, tools):
    msgs = []
    for _ in range(rng.choice([0, 1, 1, 2])):
        msgs.append({"role": "system", "content": text(rng)})
    for _ in range(rng.randint(1, 5)):
        msgs.append({"role": "user", "content": text(rng)})
        if rng.random() < 0.4:
            calls = [tool_call(rng, tools, rng.random() < 0.97) for _ in range(rng.randint(1, 3))]
            msgs.append({"role": "assistant", "content": None, "tool_calls": calls})
            for _ in range(rng.randint(1, 3)):
                msgs.append({"role": "tool", "content": text(rng)})
            if rng.random() < 0.7:
                msgs.append({"role": "assistant", "content": text(rng)})
        else:
            msgs.append({"role": "assistant", "content": text(rng)})
    if rng.random() < 0.4 and msgs[-1]["role"] == "assistant":
        msgs.pop()
    return msgs


def harmony_content(rng):
    r = rng.random()
    if r < 0.1:
        return [{"type": "text", "text": text(rng)} for _ in range(rng.randint(1, 3))]
    if r < 0.103:
        return [{"type": "image"}]  # not text: the template raises
    return text(rng)


def harmony_conversation(rng, tools):
    msgs = []
    if rng.random() < 0.6:
        msgs.append({"role": rng.choice(["system", "system", "developer"]),
                     "content": harmony_content(rng)})
    for _ in range(rng.randint(1, 5)):
        msgs.append({"role": "user", "content": harmony_content(rng)})
        if rng.random() < 0.45:
            a = {"role": "assistant", "content": rng.choice(["", "", None, text(rng)])}
            r = rng.random()
            if r < 0.5:
                a["reasoning_content"] = text(rng)
            elif r < 0.7:
                a["thinking"] = text(rng)
            calls = [tool_call(rng, tools, rng.random() < 0.3) for _ in range(rng.randint(1, 3))]
            if rng.random() < 0.15:
                calls = [c["function"] for c in calls]
            a["tool_calls"] = calls
            msgs.append(a)
            for i in range(len(calls) + (1 if rng.random() < 0.05 else 0)):
                res = {"role": "tool", "content": rng.choice(
                    [text(rng), text(rng), {"ok": True, "n": rng.randint(0, 99)}])}
                if rng.random() < 0.3:
                    res["name"] = ident(rng)
                msgs.append(res)
        a = {"role": "assistant", "content": harmony_content(rng)}
        if rng.random() < 0.4:
            a["reasoning_content"] = text(rng)
        msgs.append(a)
        if rng.random() < 0.05:
            msgs.append({"role": "system", "content": text(rng)})
    if rng.random() < 0.4 and msgs[-1]["role"] == "assistant":
        msgs.pop()
    r = rng.random()
    if r < 0.03:
        msgs.append({"role": "critic", "content": text(rng)})  # unknown role: raises
    elif r < 0.05:
        msgs.insert(0, {"role": "tool", "content": "orphan"})  # no call before it: raises
    return msgs


def harmony_extra(rng):
    extra = {}
    if rng.random() < 0.5:
        extra["reasoning_effort"] = rng.choice(["low", "medium", "high"] * 5 + ["extreme"])
    if rng.random() < 0.2:
        extra["model_identity"] = text(rng, 1, 8)
    if rng.random() < 0.2:
        extra["builtin_tools"] = rng.choice([["browser"], ["python"], ["browser", "python"],
                                             ["python", "browser"], []] * 3 + [["calculator"]])
    return extra


GENERATORS = {"qwen3": qwen3_conversation, "llama3_1": llama_conversation,
              "gemma3": gemma_conversation, "deepseek_v3": deepseek_conversation,
              "gptoss": harmony_conversation}


def template_source(data_dir, model, config):
    """chat_template.jinja beside tokenizer_config.json wins, as in transformers."""
    path = os.path.join(data_dir, "tokenizers", model, "chat_template.jinja")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    return config["chat_template"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data_dir")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--count", type=int, default=220)
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args()
    env = hf_env.make_env()
    cases = []
    for model in args.models.split(","):
        with open(os.path.join(args.data_dir, "tokenizers", model, "tokenizer_config.json"),
                  encoding="utf-8") as f:
            config = json.load(f)
        source = template_source(args.data_dir, model, config)
        specials = hf_env.special_tokens(config)
        rng = random.Random("%s:%d" % (model, args.seed))
        for _ in range(args.count):
            tools = [tool(rng) for _ in range(rng.randint(1, 5))] if rng.random() < 0.5 else None
            messages = GENERATORS[model](rng, tools)
            agp = rng.random() < 0.6
            extra = {}
            if model == "qwen3" and rng.random() < 0.2:
                extra["enable_thinking"] = rng.random() < 0.5
            if model == "gptoss":
                extra = harmony_extra(rng)
            ctx = dict(specials)
            ctx.update(messages=messages, tools=tools, documents=None, add_generation_prompt=agp)
            ctx.update(extra)
            case = {"model": model, "messages": messages, "tools": tools,
                    "add_generation_prompt": agp, "extra": extra}
            case.update(hf_env.render(env, source, ctx))
            cases.append(case)
    json.dump({"cases": cases}, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
