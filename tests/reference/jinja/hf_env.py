"""A jinja2 environment configured the way transformers renders chat templates.

transformers compiles chat templates with
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
extensions=[loopcontrols]) and registers its own tojson filter (json.dumps with
ensure_ascii=False) and the raise_exception / strftime_now globals. The clock
is fixed here so that strftime_now is deterministic; the C++ side injects the
same instant.
"""
import copy
import datetime
import json

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

# 2024-07-26 13:45:06 UTC; the C++ tests inject the same instant.
FIXED_TIMESTAMP = 1722001506

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                      "cls_token", "mask_token")


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.fromtimestamp(FIXED_TIMESTAMP).strftime(format)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def special_tokens(config):
    """What tokenizer.special_tokens_map contributes to the template variables."""
    out = {}
    for key in SPECIAL_TOKEN_KEYS:
        tok = config.get(key)
        if isinstance(tok, dict):
            tok = tok.get("content")
        if tok:
            out[key] = tok
    extra = config.get("additional_special_tokens")
    if extra:
        out["additional_special_tokens"] = [t.get("content") if isinstance(t, dict) else t
                                            for t in extra]
    return out


_COMPILED = {}


def _compile(env, source):
    key = (id(env), source)
    if key not in _COMPILED:
        _COMPILED[key] = env.from_string(source)
    return _COMPILED[key]


def render(env, source, context):
    """Returns {"output": str} or {"error": "<Type>: <message>"}."""
    try:
        # A copy: some jinja2 filters mutate their input (indent on a list
        # appends to it), and the case must record the context as given.
        return {"output": _compile(env, source).render(**copy.deepcopy(context))}
    except Exception as e:  # any failure is an expected-error case
        return {"error": "%s: %s" % (type(e).__name__, e)}
