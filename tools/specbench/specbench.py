#!/usr/bin/env python3
"""The coding-agent workload for speculative decoding from the context:
single-stream tok/s of `agentkv serve` (any server speaking OpenAI chat
completions) on a request whose prompt holds a source file of about
--file-tokens tokens and asks for the whole file back with a few edits.

  python3 tools/specbench/specbench.py run --url http://127.0.0.1:8080 \\
      --file src/engine/engine.cc --file-tokens 2000 --json /tmp/base.json
  python3 tools/specbench/specbench.py compare /tmp/base.json /tmp/spec.json

`run` sends --warmup untimed requests, then --repeat timed ones, one at a
time, streamed, greedy (temperature 0) unless --temperature is given (then
sampled with --seed, every request alike: a seeded request repeats itself,
drafts verified by rejection sampling). For each it records the time to the
first token, the decode rate (completion tokens after the first, over the
time from the first token to the last) and the end-to-end rate, and, from
GET /admin/status before and after, the engine's steps and speculative
counters (draft tokens verified and accepted). The medians and every run go
to --json. `compare` prints the second run's rates over the first's.

Run it twice against the same model, once with `serve --speculative none`
and once with `--speculative ngram`: greedy output is the same, so both
produce the same tokens and the rates compare directly.

What the measurement means depends on the model:
- A real model reproduces most of the file, so drafts looked up in the
  prompt are mostly accepted: the speedup a coding agent sees.
- A random model (tools/device/synth_shape.py) does not reproduce the file;
  its reply goes wherever its random weights take it, so drafts mostly
  fail: what drafting costs when the context does not predict the reply
  (use --ignore-eos so that every reply has max_tokens tokens).
- A cycle model (synth_shape.py --cycle N) is a random model whose greedy
  output is a fixed function of the last token, a cycle of N tokens (its
  LM head is its embedding with rows permuted, and its layers add almost
  nothing to the residual stream): after its first N output tokens the
  reply repeats text already in the context, so from then on every draft
  is accepted. Every kernel still runs on full-size weights, so a step
  costs what the shape's costs: the speedup at full acceptance, for any
  shape. --expect-accept checks that acceptance actually happened.

Standard library only.
"""
import argparse
import hashlib
import http.client
import json
import os
import re
import statistics
import sys
import time
import urllib.parse

KEYWORDS = set("""alignas alignof auto bool break case catch char class const constexpr continue
default delete double else enum explicit extern false float for friend goto if inline int long
namespace new noexcept nullptr operator override private protected public return short signed
sizeof static struct switch template this throw true try typedef typename union unsigned using
virtual void volatile while include define ifdef ifndef endif pragma once std size_t int32_t
int64_t uint8_t uint32_t uint64_t self None True False import from def return lambda""".split())


class Server:
    def __init__(self, url, api_key=None, timeout=600):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port or (443 if u.scheme == "https" else 80)
        self.https = u.scheme == "https"
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = "Bearer " + api_key

    def conn(self):
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout)

    def get(self, path):
        c = self.conn()
        try:
            c.request("GET", path, headers=self.headers)
            r = c.getresponse()
            body = r.read()
            if r.status != 200:
                raise RuntimeError(f"GET {path}: HTTP {r.status}: {body[:300]!r}")
            return json.loads(body)
        finally:
            c.close()

    def post(self, path, body):
        c = self.conn()
        try:
            c.request("POST", path, body=json.dumps(body), headers=self.headers)
            r = c.getresponse()
            data = r.read()
            if r.status != 200:
                raise RuntimeError(f"POST {path}: HTTP {r.status}: {data[:300]!r}")
            return json.loads(data)
        finally:
            c.close()

    def stream(self, path, body):
        """Posts a streamed request; returns (t_first_content, t_end, usage,
        text). Times are time.perf_counter() values."""
        c = self.conn()
        try:
            c.request("POST", path, body=json.dumps(body), headers=self.headers)
            r = c.getresponse()
            if r.status != 200:
                raise RuntimeError(f"POST {path}: HTTP {r.status}: {r.read()[:300]!r}")
            t_first, usage, parts = None, None, []
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                ev = json.loads(data)
                if ev.get("usage"):
                    usage = ev["usage"]
                for ch in ev.get("choices", []):
                    piece = (ch.get("delta") or {}).get("content") or ch.get("text") or ""
                    if piece:
                        if t_first is None:
                            t_first = time.perf_counter()
                        parts.append(piece)
            return t_first, time.perf_counter(), usage, "".join(parts)
        finally:
            c.close()


def edits_for(text):
    """A few edits a coding agent is typically asked for, chosen from the
    file itself: a comment at the top, one identifier renamed everywhere,
    one number changed."""
    words = re.findall(r"\b[A-Za-z_][A-Za-z0-9_]{5,}\b", text)
    counts = {}
    for w in words:
        if w not in KEYWORDS:
            counts[w] = counts.get(w, 0) + 1
    edits = ["Add the comment line `// Reviewed: speculative decoding workload.` as the first "
             "line of the file."]
    if counts:
        ident = max(sorted(counts), key=lambda w: counts[w])
        edits.append(f"Rename `{ident}` to `{ident}2` everywhere ({counts[ident]} places).")
    m = re.search(r"(?<![\w.])([2-9]|[1-9][0-9]+)(?![\w.])", text)
    if m:
        edits.append(f"Change the first number `{m.group(1)}` to `{int(m.group(1)) + 1}`.")
    return edits


def messages_for(name, text, edits):
    lang = os.path.splitext(name)[1].lstrip(".") or "text"
    return [
        {"role": "system", "content": "You are a coding assistant. When asked to edit a file, "
                                      "reply with the complete edited file and nothing else."},
        {"role": "user", "content": f"Here is `{name}`:\n\n```{lang}\n{text}\n```\n\n"
                                    "Make these edits and reply with the whole file:\n" +
                                    "\n".join(f"{i + 1}. {e}" for i, e in enumerate(edits))},
    ]


# Chat template variables: no thinking block before the reply (Qwen3's
# template; others ignore it), so a real model starts on the file at once.
TEMPLATE_KWARGS = {"enable_thinking": False}


def prompt_tokens(server, model, messages):
    """The prompt's token count as the server renders it (a one-token reply's
    usage)."""
    r = server.post("/v1/chat/completions", {"model": model, "messages": messages,
                                              "max_tokens": 1, "temperature": 0,
                                              "speculative": False,
                                              "chat_template_kwargs": TEMPLATE_KWARGS})
    return r["usage"]["prompt_tokens"]


def build_prompt(server, model, path, target):
    """The file's first lines, as many as make about `target` prompt tokens
    (two rounds of measuring and rescaling the line count)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    name = os.path.basename(path)
    n = len(lines)
    chars = 0
    for i, l in enumerate(lines):  # a first guess: ~3.5 characters per token
        chars += len(l) + 1
        if chars >= 3.5 * target:
            n = i + 1
            break
    for _ in range(2):
        text = "\n".join(lines[:n])
        messages = messages_for(name, text, edits_for(text))
        got = prompt_tokens(server, model, messages)
        if abs(got - target) <= 0.05 * target or (got < target and n == len(lines)):
            break
        n = max(1, min(len(lines), int(n * target / max(got, 1))))
    text = "\n".join(lines[:n])
    messages = messages_for(name, text, edits_for(text))
    return messages, prompt_tokens(server, model, messages), n


def engine_counters(server):
    e = server.get("/admin/status").get("engine", {})
    sp = e.get("speculative", {})
    return {"steps": e.get("steps", 0), "generated_tokens": e.get("generated_tokens", 0),
            "draft_steps": sp.get("draft_steps", 0), "draft_tokens": sp.get("draft_tokens", 0),
            "accepted_tokens": sp.get("accepted_tokens", 0)}


def cmd_run(a):
    server = Server(a.url, a.api_key)
    model = a.model
    if not model:
        model = server.get("/v1/models")["data"][0]["id"]
    messages, ptoks, lines = build_prompt(server, model, a.file, a.file_tokens)
    max_tokens = a.max_tokens or ptoks + 64
    body = {"model": model, "messages": messages, "max_tokens": max_tokens,
            "temperature": a.temperature, "seed": a.seed,
            "stream": True, "stream_options": {"include_usage": True},
            "chat_template_kwargs": TEMPLATE_KWARGS}
    if a.ignore_eos:
        body["ignore_eos"] = True
    print(f"prompt: {lines} lines of {a.file}, {ptoks} tokens; max_tokens {max_tokens}",
          file=sys.stderr)
    runs = []
    text0 = None
    for i in range(a.warmup + a.repeat):
        c0 = engine_counters(server)
        t0 = time.perf_counter()
        t_first, t_end, usage, text = server.stream("/v1/chat/completions", body)
        c1 = engine_counters(server)
        if usage is None or t_first is None:
            raise RuntimeError("no usage or no content in the streamed reply")
        n = usage["completion_tokens"]
        d = {k: c1[k] - c0[k] for k in c0}
        run = {
            "completion_tokens": n,
            "ttft_s": t_first - t0,
            "decode_tok_s": (n - 1) / (t_end - t_first) if n > 1 and t_end > t_first else 0.0,
            "e2e_tok_s": n / (t_end - t0),
            "steps": d["steps"],
            "tokens_per_step": d["generated_tokens"] / d["steps"] if d["steps"] else 0.0,
            "draft_steps": d["draft_steps"],
            "draft_tokens": d["draft_tokens"],
            "accepted_tokens": d["accepted_tokens"],
            "acceptance": d["accepted_tokens"] / d["draft_tokens"] if d["draft_tokens"] else 0.0,
            "warmup": i < a.warmup,
        }
        # Greedy or seeded: every reply the same (a check that the runs compare).
        run["same_text"] = text0 is None or text == text0
        text0 = text0 if text0 is not None else text
        runs.append(run)
        print(("warmup " if run["warmup"] else "run ") +
              " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in run.items() if k != "warmup"), file=sys.stderr)
    timed = [r for r in runs if not r["warmup"]]
    med = {k: statistics.median(r[k] for r in timed)
           for k in ("completion_tokens", "ttft_s", "decode_tok_s", "e2e_tok_s", "steps",
                     "tokens_per_step", "draft_tokens", "accepted_tokens", "acceptance")}
    out = {"url": a.url, "model": model, "file": a.file, "file_lines": lines,
           "prompt_tokens": ptoks, "max_tokens": max_tokens, "ignore_eos": a.ignore_eos,
           "label": a.label, "median": med, "runs": runs,
           "reply_sha256": hashlib.sha256((text0 or "").encode()).hexdigest(),
           "reply_head": (text0 or "")[:400]}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    print(f"{a.label or 'run'}: decode {med['decode_tok_s']:.1f} tok/s, end to end "
          f"{med['e2e_tok_s']:.1f} tok/s, ttft {1000 * med['ttft_s']:.0f} ms, "
          f"{med['completion_tokens']:.0f} tokens in {med['steps']:.0f} steps "
          f"({med['tokens_per_step']:.2f}/step), drafts {med['draft_tokens']:.0f} of which "
          f"{med['accepted_tokens']:.0f} accepted ({100 * med['acceptance']:.0f}%)")
    ok = all(r["same_text"] for r in runs)
    if not ok:
        print("error: replies differ between runs (greedy or seeded)", file=sys.stderr)
    if a.expect_accept is not None and med["acceptance"] < a.expect_accept:
        print(f"error: acceptance {med['acceptance']:.2f} below --expect-accept "
              f"{a.expect_accept}", file=sys.stderr)
        ok = False
    return 0 if ok else 1


def cmd_compare(a):
    base, other = (json.load(open(p)) for p in (a.base, a.other))
    b, o = base["median"], other["median"]
    # Greedy output is the same with and without drafts: the same reply.
    same = base.get("reply_sha256") == other.get("reply_sha256")
    line = (f"{other.get('label') or a.other} over {base.get('label') or a.base}: decode "
            f"{o['decode_tok_s']:.1f} / {b['decode_tok_s']:.1f} tok/s = "
            f"{o['decode_tok_s'] / max(b['decode_tok_s'], 1e-9):.2f}x, end to end "
            f"{o['e2e_tok_s'] / max(b['e2e_tok_s'], 1e-9):.2f}x; acceptance "
            f"{100 * o['acceptance']:.0f}%, {o['tokens_per_step']:.2f} tokens/step"
            + ("" if same else "; NOTE: the replies differ (a bug, or on a GPU a near tie "
                               "that the verification path's bf16 rounding broke the other "
                               "way: compare where they part)"))
    print(line)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure one server")
    r.add_argument("--url", default="http://127.0.0.1:8080")
    r.add_argument("--api-key")
    r.add_argument("--model", help="model id (default: the first of /v1/models)")
    r.add_argument("--file", default=os.path.join(os.path.dirname(__file__), "..", "..", "src",
                                                  "engine", "engine.cc"),
                   help="source file the prompt holds (default src/engine/engine.cc)")
    r.add_argument("--file-tokens", type=int, default=2000,
                   help="prompt size to aim for, in tokens (the file is cut to fit)")
    r.add_argument("--max-tokens", type=int, default=0,
                   help="reply limit (default: the prompt's tokens + 64, room for the file)")
    r.add_argument("--ignore-eos", action="store_true",
                   help="every reply max_tokens long (random models)")
    r.add_argument("--temperature", type=float, default=0.0,
                   help="0: greedy; above: sampled (with --seed)")
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--warmup", type=int, default=1)
    r.add_argument("--repeat", type=int, default=3)
    r.add_argument("--label", default="")
    r.add_argument("--expect-accept", type=float,
                   help="fail unless the median acceptance reaches this fraction")
    r.add_argument("--json", help="write the results here")
    c = sub.add_parser("compare", help="rates of OTHER over BASE")
    c.add_argument("base")
    c.add_argument("other")
    a = ap.parse_args()
    return cmd_run(a) if a.cmd == "run" else cmd_compare(a)


if __name__ == "__main__":
    sys.exit(main())
