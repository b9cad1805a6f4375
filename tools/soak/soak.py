#!/usr/bin/env python3
"""Soak test: many concurrent streaming clients against a CPU `agentkv serve`.

Starts `agentkv serve` (CPU, a fresh store in a temporary folder unless
--store is given) on the default model, then runs --clients concurrent
clients for --minutes. Each client holds a multi-turn conversation (its own
session) over one of the protocols, streaming: OpenAI chat, OpenAI
completions, Anthropic messages, or the agents API. A third of the clients
disconnect at random points (while sending the body, right after the
headers, or part-way through the stream); about one request in twenty is
malformed (bad JSON, wrong types, nesting past the depth limit, too many
stop strings, a wrong content type, a body shorter than its length).

Checks, printed as PASS/FAIL lines and a JSON summary (exit 1 on any FAIL):
  - no 5xx answer, to any request;
  - every malformed request got a 4xx;
  - every client got its last reply: after the run the drain waits while the
    server still works on requests (engine running or queueing, replies
    arriving) and reports the clients still waiting as stuck once --drain-s
    passed with no reply arriving and nothing running or queued in the
    engine; they are listed with where their request stood and what the
    engine was doing;
  - no leaked KV blocks: once the clients stop and every agent is deleted,
    the engine is idle (nothing running or waiting) and every pool is back to
    the counts it had before the first request (nothing in use or pinned),
    and no agent's KV is resident any more;
  - the server's anonymous RSS (heap; the store's file map is reported
    beside it) is flat after warm-up: the last sample is within
    --rss-slack (default 10%) of the sample at the end of the warm-up (the
    first fifth of the run, and until the KV pool and the host tier, whose
    memory is touched lazily, had handed out all of it), and the trend over
    the rest of the run is below that too;
  - the server exits cleanly on SIGTERM and `agentkv store verify` finds the
    store clean.

Standard library only (asyncio, raw HTTP/1.1), so it runs wherever
scripts/setup.sh ran. Example:
  tools/soak/soak.py --agentkv build/agentkv --minutes 10 --clients 256
"""

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Disconnect(Exception):
    """The client chose to go away; not an error."""


class Stats:
    def __init__(self):
        self.status = Counter()  # HTTP status -> count
        self.by_kind = Counter()  # "chat 200", "malformed 400", ...
        self.five_xx = []  # (kind, status, body excerpt)
        self.malformed_not_4xx = []
        self.disconnects = Counter()  # where the client went away
        self.turns = 0
        self.events = 0
        self.transport_errors = Counter()

    def record(self, kind, status, body=b""):
        self.status[status] += 1
        self.by_kind[f"{kind} {status}"] += 1
        if status >= 500:
            self.five_xx.append((kind, status, body[:300].decode("utf-8", "replace")))


async def read_head(reader):
    line = await reader.readline()
    if not line:
        raise ConnectionError("connection closed before the status line")
    parts = line.decode("latin-1").split(" ", 2)
    status = int(parts[1])
    headers = {}
    while True:
        h = await reader.readline()
        if h in (b"\r\n", b"\n", b""):
            break
        k, _, v = h.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers


async def body_chunks(reader, headers):
    """Yields the body as it arrives (chunked or content-length)."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size_line = await reader.readline()
            if not size_line:
                raise ConnectionError("connection closed inside a chunked body")
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                await reader.readline()
                return
            data = await reader.readexactly(size)
            await reader.readexactly(2)
            yield data
    elif "content-length" in headers:
        n = int(headers["content-length"])
        if n:
            yield await reader.readexactly(n)
    else:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            yield data


class Client:
    def __init__(self, args, idx, stats, deadline, rng):
        self.args = args
        self.idx = idx
        self.stats = stats
        self.deadline = deadline
        self.rng = rng
        self.disconnector = idx % 3 == 2  # a third of the clients
        self.protocol = ["chat", "chat", "messages", "agents", "completions"][idx % 5]
        self.session = f"soak-{args.run_id}-{idx}"
        # Where the current request is, for a client that never gets its
        # reply: "connecting", "sending", "waiting for headers", or
        # "streaming, N chunks read", with the request's kind and start.
        self.phase = "idle"
        self.phase_kind = ""
        self.phase_since = time.monotonic()
        self.reset()

    def reset(self):
        self.history = []  # OpenAI-shape messages
        self.turn = 0

    async def request(self, method, path, body, headers=None, kind="", cut=None):
        """One request on its own connection. `cut`: where to disconnect
        (None, "body", "headers", or ("stream", n_chunks))."""
        host, port = "127.0.0.1", self.args.port
        self.phase, self.phase_kind, self.phase_since = "connecting", kind, time.monotonic()
        reader, writer = await asyncio.open_connection(host, port)
        try:
            self.phase = "sending"
            if isinstance(body, str):
                body = body.encode()
            hdrs = {"host": f"{host}:{port}", "content-type": "application/json",
                    "content-length": str(len(body))}
            hdrs.update(headers or {})
            head = f"{method} {path} HTTP/1.1\r\n" + "".join(
                f"{k}: {v}\r\n" for k, v in hdrs.items() if v is not None) + "\r\n"
            if cut == "body":
                writer.write(head.encode() + body[: max(0, len(body) // 2)])
                await writer.drain()
                self.stats.disconnects["while sending the body"] += 1
                raise Disconnect()
            writer.write(head.encode() + body)
            await writer.drain()
            self.phase = "waiting for headers"
            status, rh = await read_head(reader)
            self.phase = "streaming, 0 chunks read"
            if cut == "headers":
                self.stats.disconnects["after the response headers"] += 1
                self.stats.record(kind, status)
                raise Disconnect()
            data = b""
            n = 0
            async for chunk in body_chunks(reader, rh):
                data += chunk
                n += 1
                self.phase = f"streaming, {n} chunks read"
                self.stats.events += chunk.count(b"data:")
                if isinstance(cut, tuple) and n >= cut[1]:
                    self.stats.disconnects["part-way through the stream"] += 1
                    self.stats.record(kind, status)
                    raise Disconnect()
            self.stats.record(kind, status, data)
            return status, data
        finally:
            self.phase = "idle"
            writer.close()
            try:
                await writer.wait_closed()
            except Exception:  # the peer may have reset it already
                pass

    def pick_cut(self):
        if not self.disconnector or self.rng.random() < 0.4:
            return None
        r = self.rng.random()
        if r < 0.2:
            return "body"
        if r < 0.4:
            return "headers"
        return ("stream", self.rng.randint(1, 12))

    def user_text(self):
        words = ["build", "the", "cache", "agent", "why", "test", "stream", "token", "block",
                 "store", "python", "server", "fix", "a", "bug", "in", "parser", "please"]
        return " ".join(self.rng.choice(words) for _ in range(self.rng.randint(3, 30)))

    def generation(self):
        """(path, body, headers) of the next turn of this client's protocol."""
        max_tokens = self.rng.randint(4, self.args.max_tokens)
        text = self.user_text()
        common = {"max_tokens": max_tokens, "stream": True, "temperature": 1.0}
        if self.protocol == "chat":
            msgs = [{"role": "system", "content": "You are a coding agent."}] + self.history + [
                {"role": "user", "content": text}]
            body = dict(common, model="default", messages=msgs, prompt_cache_key=self.session)
            if self.rng.random() < 0.5:
                body["stream_options"] = {"include_usage": True}
            return "/v1/chat/completions", body, {}, text
        if self.protocol == "messages":
            msgs = self.history + [{"role": "user", "content": [{"type": "text", "text": text}]}]
            body = dict(common, model="default", system="You are a coding agent.", messages=msgs)
            return "/v1/messages", body, {"x-claude-code-session-id": self.session}, text
        if self.protocol == "agents":
            body = {"message": text, "max_tokens": max_tokens, "stream": True}
            return f"/v1/agents/{self.session}/generate", body, {}, text
        prompt = " ".join(m["content"] for m in self.history if isinstance(m["content"], str))
        body = dict(common, prompt=(prompt + " " + text).strip(), session_id=self.session)
        return "/v1/completions", body, {}, text

    def malformed(self):
        """(path, raw body, headers, what) of a request the server must refuse with a 4xx."""
        path = self.rng.choice(["/v1/chat/completions", "/v1/messages", "/v1/completions",
                                f"/v1/agents/{self.session}/generate"])
        kind = self.rng.randint(0, 6)
        if kind == 0:
            return path, '{"messages": [{"role": "user", "content": "hi"}', {}, "truncated json"
        if kind == 1:
            return path, '{"messages": 5, "prompt": 7, "message": 9, "max_tokens": "x"}', {}, \
                "wrong types"
        if kind == 2:
            depth = self.rng.randint(65, 5000)
            return path, '{"messages": ' + "[" * depth + "]" * depth + "}", {}, "too deep"
        if kind == 3:
            body = {"messages": [{"role": "user", "content": "hi"}], "prompt": "hi",
                    "message": "hi", "max_tokens": 4,
                    "stop": [f"s{i}" for i in range(200)],
                    "stop_sequences": [f"s{i}" for i in range(200)]}
            return path, json.dumps(body), {}, "too many stop strings"
        if kind == 4:
            return path, '{"messages": [{"role": "user", "content": "hi"}]}', \
                {"content-type": "text/plain"}, "wrong content type"
        if kind == 5:
            return path, "\xff\xfe not json at all", {}, "not json"
        return path, '{"messages": [], "prompt": [], "message": null, "max_tokens": -3}', {}, \
            "empty / negative"

    async def run(self):
        # Spread the start over a few seconds, as real clients arrive.
        await asyncio.sleep(self.rng.random() * 5)
        while time.monotonic() < self.deadline:
            try:
                if self.rng.random() < self.args.malformed_share:
                    path, body, headers, what = self.malformed()
                    status, data = await self.request("POST", path, body, headers, "malformed")
                    if not 400 <= status < 500:
                        self.stats.malformed_not_4xx.append(
                            (what, path, status, data[:200].decode("utf-8", "replace")))
                    continue
                path, body, headers, text = self.generation()
                status, data = await self.request("POST", path, json.dumps(body), headers,
                                                  self.protocol, self.pick_cut())
                if status == 200:
                    self.stats.turns += 1
                    reply = self.reply_text(data)
                    self.history += [{"role": "user", "content": text},
                                     {"role": "assistant", "content": reply}]
                    self.turn += 1
                    if self.turn >= self.args.turns_per_conversation:
                        self.reset()
                        self.session = f"soak-{self.args.run_id}-{self.idx}-{self.rng.random():.9f}"
                elif status == 429:
                    await asyncio.sleep(1)
            except Disconnect:
                pass
            except (ConnectionError, asyncio.IncompleteReadError, OSError) as e:
                self.stats.transport_errors[type(e).__name__] += 1
                await asyncio.sleep(0.5)

    def reply_text(self, data):
        """The assistant text of an SSE reply (best effort, for the next turn)."""
        out = []
        for line in data.split(b"\n"):
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            try:
                ev = json.loads(line[6:])
            except ValueError:
                continue
            if self.protocol == "chat":
                for c in ev.get("choices", []):
                    out.append((c.get("delta") or {}).get("content") or "")
            elif self.protocol == "completions":
                for c in ev.get("choices", []):
                    out.append(c.get("text") or "")
            elif self.protocol == "messages":
                if ev.get("type") == "content_block_delta":
                    out.append(ev.get("delta", {}).get("text", ""))
            elif "text" in ev and "finish_reason" not in ev:
                out.append(ev["text"])
        return "".join(out)


def rss_kib(pid):
    """(anonymous, file-backed) resident KiB: the store's memory map counts as
    file-backed and grows with the store, so leaks show in the anonymous part."""
    anon = file = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                anon = int(line.split()[1])
            elif line.startswith("RssFile:"):
                file = int(line.split()[1])
    return anon, file


async def http(port, method, path, body=None):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode() if body is not None else b""
    head = (f"{method} {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(data)}\r\n"
            "connection: close\r\n\r\n")
    writer.write(head.encode() + data)
    await writer.drain()
    status, headers = await read_head(reader)
    out = b""
    async for c in body_chunks(reader, headers):
        out += c
    writer.close()
    return status, out


async def admin_status(port):
    status, body = await http(port, "GET", "/admin/status")
    if status != 200:
        raise RuntimeError(f"/admin/status answered {status}: {body[:200]!r}")
    return json.loads(body)


def pools_full(st):
    """Whether every pool block and the host tier's memory have been used
    at least once (the pool hands out free blocks last-freed first, so no
    free block left, or an eviction, means all were touched)."""
    e = st.get("engine", {})
    pools = st.get("pools", [])
    host = e.get("host_kv", {})
    pool_full = bool(pools) and all(p.get("free", 1) == 0 or p.get("evictions", 0) > 0
                                    for p in pools)
    host_full = (host.get("capacity_bytes", 0) == 0 or host.get("evictions", 0) > 0
                 or host.get("bytes", 0) >= host.get("capacity_bytes", 0))
    return pool_full and host_full


def pool_counts(st):
    return [{k: p[k] for k in ("total", "in_use", "pinned")} for p in st["pools"]]


async def wait_idle(port, timeout):
    end = time.monotonic() + timeout
    while True:
        st = await admin_status(port)
        e = st["engine"]
        if e["running"] == 0 and e["waiting"] == 0 and not st["agents"].get("busy"):
            return st
        if time.monotonic() > end:
            return st
        await asyncio.sleep(1)


async def delete_all_agents(port):
    deleted, failed = 0, 0
    after = None
    ids = []
    while True:
        path = "/v1/agents?limit=1000" + (f"&after={after}" if after else "")
        status, body = await http(port, "GET", path)
        if status != 200:
            raise RuntimeError(f"GET /v1/agents answered {status}")
        j = json.loads(body)
        page = [a["id"] for a in j.get("data", [])]
        ids += page
        if not j.get("has_more") or not page:
            break
        after = page[-1]
    for aid in ids:
        status, _ = await http(port, "DELETE", f"/v1/agents/{aid}")
        if status in (200, 204):
            deleted += 1
        else:
            failed += 1
    return deleted, failed


async def soak(args, server):
    stats = Stats()
    await asyncio.sleep(0)
    before = await admin_status(args.port)
    start = time.monotonic()
    deadline = start + args.minutes * 60
    rng = random.Random(args.seed)
    clients = [Client(args, i, stats, deadline, random.Random(rng.random()))
               for i in range(args.clients)]
    tasks = [asyncio.create_task(c.run()) for c in clients]
    rss = []  # (seconds since start, anonymous KiB, file-backed KiB)
    # When the KV pool and the host tier had first handed out all their
    # memory: they are touched lazily, so until then RSS grows by design.
    pools_full_at = None
    last_print = 0
    while time.monotonic() < deadline:
        await asyncio.sleep(min(args.sample_s, max(0.1, deadline - time.monotonic())))
        t = time.monotonic() - start
        rss.append((round(t, 1), *rss_kib(server.pid)))
        if pools_full_at is None and pools_full(await admin_status(args.port)):
            pools_full_at = t
            print(f"[{t:6.0f}s] the KV pool and host tier are full (every block touched)",
                  flush=True)
        if t - last_print >= 30:
            last_print = t
            print(f"[{t:6.0f}s] rss anon {rss[-1][1] / 1024:.0f} MiB file {rss[-1][2] / 1024:.0f} "
                  f"MiB, turns {stats.turns}, "
                  f"statuses {dict(stats.status)}, disconnects {sum(stats.disconnects.values())}",
                  flush=True)
    # Let the clients finish their last request (each ends at the deadline).
    # On a slow (shared, loaded) machine the last requests can take longer
    # than --drain-s to be served: the drain goes on while the server is
    # still working on requests (the engine running or queueing some) or
    # clients are still getting their replies, up to --drain-max-s. A client
    # is stuck when it waits --drain-s with neither happening.
    drain_start = time.monotonic()
    pending = set(tasks)
    last_progress = last_print = drain_start
    while pending:
        done, pending = await asyncio.wait(pending, timeout=min(10, args.drain_s))
        now = time.monotonic()
        if done:
            last_progress = now
        if not pending or now - drain_start >= args.drain_max_s:
            break
        e = (await admin_status(args.port)).get("engine", {})
        if e.get("running", 0) or e.get("waiting", 0) or e.get("loading", 0):
            last_progress = now
        if now - last_print >= 30:
            last_print = now
            print(f"[drain {now - drain_start:4.0f}s] {len(pending)} clients waiting; engine "
                  f"running {e.get('running')}, waiting {e.get('waiting')}, loading "
                  f"{e.get('loading')}", flush=True)
        if now - last_progress >= args.drain_s:
            break
    drain_s = time.monotonic() - drain_start
    print(f"drain: {drain_s:.0f} s, {len(pending)} clients still waiting", flush=True)
    if pending:
        # Which clients never got their last reply: their protocol and
        # whether they meant to disconnect, to tell where a request hangs.
        stuck = Counter(f"{c.protocol}{' (disconnector)' if c.disconnector else ''}"
                        for c, t in zip(clients, tasks) if t in pending)
        print(f"stuck clients by protocol: {dict(stuck)}", flush=True)
        now = time.monotonic()
        phases = Counter(f"{c.phase_kind} {c.phase.split(',')[0]}"
                         for c, t in zip(clients, tasks) if t in pending)
        print(f"stuck clients by phase: {dict(phases)}", flush=True)
        for c, t in zip(clients, tasks):
            if t in pending:
                print(f"  client {c.idx} ({c.protocol}, session {c.session}): {c.phase_kind} "
                      f"{c.phase} for {now - c.phase_since:.0f} s", flush=True)
        # The server's state while they wait: a running or waiting engine
        # means the drain was too short; an idle one, that requests are held
        # between HTTP and the engine.
        st = await admin_status(args.port)
        e = st.get("engine", {})
        print(f"server while they wait: engine running {e.get('running')}, waiting "
              f"{e.get('waiting')}, loading {e.get('loading')}; agents busy "
              f"{st.get('agents', {}).get('busy')}", flush=True)
        if args.hold_on_stuck_s > 0:
            print(f"holding the stuck clients for {args.hold_on_stuck_s:.0f} s (serve pid "
                  f"{server.pid}) for a look at the server", flush=True)
            await asyncio.sleep(args.hold_on_stuck_s)
    for p in pending:
        p.cancel()
    idle = await wait_idle(args.port, args.drain_s)
    deleted, delete_failed = await delete_all_agents(args.port)
    after_delete = await wait_idle(args.port, 30)
    return (stats, before, idle, after_delete, rss, deleted, delete_failed, len(pending),
            drain_s, pools_full_at)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agentkv", default=os.path.join(ROOT, "build", "agentkv"))
    ap.add_argument("--model", default=os.path.join(ROOT, "data", "models", "default"))
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--clients", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=48, help="largest max_tokens a turn asks")
    ap.add_argument("--turns-per-conversation", type=int, default=6)
    ap.add_argument("--malformed-share", type=float, default=0.05)
    ap.add_argument("--store", default="", help="store folder (default: a new temporary one)")
    ap.add_argument("--threads", type=int, default=0, help="serve --threads (0: its default)")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra serve argument")
    ap.add_argument("--rss-slack", type=float, default=0.10)
    ap.add_argument("--sample-s", type=float, default=5)
    ap.add_argument("--drain-s", type=float, default=120,
                    help="after the run, how long clients may wait for their last reply while "
                         "the server does nothing for them (the engine idle, no reply arriving)")
    ap.add_argument("--drain-max-s", type=float, default=900,
                    help="the longest drain, progress or not")
    ap.add_argument("--hold-on-stuck-s", type=float, default=0,
                    help="when clients are stuck after the drain, keep them waiting this long "
                         "before cancelling them (to inspect the server)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default="", help="also write the summary here")
    args = ap.parse_args()
    args.port = free_port()
    args.run_id = f"{os.getpid()}"

    tmp = None
    store = args.store
    if not store:
        tmp = tempfile.mkdtemp(prefix="agentkv-soak-")
        store = os.path.join(tmp, "store")
    cmd = [args.agentkv, "serve", "--model", args.model, "--device", "cpu", "--host",
           "127.0.0.1", "--port", str(args.port), "--store", store] + args.serve_arg
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    log_path = os.path.join(tmp or store, "serve.log") if tmp else store + ".serve.log"
    log = open(log_path, "w")
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            if server.poll() is not None:
                raise RuntimeError(f"serve exited with {server.returncode}; see {log_path}")
            try:
                with socket.create_connection(("127.0.0.1", args.port), timeout=1):
                    break
            except OSError:
                time.sleep(0.5)
        print(f"serve pid {server.pid} on port {args.port}, store {store}, log {log_path}",
              flush=True)
        (stats, before, idle, after_delete, rss, deleted, delete_failed, stuck,
         drain_s, pools_full_at) = asyncio.run(soak(args, server))
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=120)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    verify = subprocess.run([args.agentkv, "store", "verify", "--store", store],
                            capture_output=True, text=True)

    checks = []

    def check(name, ok, detail):
        checks.append({"check": name, "ok": bool(ok), "detail": detail})

    check("no 5xx", not stats.five_xx,
          f"{len(stats.five_xx)} 5xx" + (f", first: {stats.five_xx[0]}" if stats.five_xx else ""))
    check("malformed requests get a 4xx", not stats.malformed_not_4xx,
          f"{len(stats.malformed_not_4xx)} not 4xx" +
          (f", first: {stats.malformed_not_4xx[0]}" if stats.malformed_not_4xx else ""))
    check("clients finished", stuck == 0,
          f"{stuck} clients still waiting after the drain ({drain_s:.0f} s)")
    e = after_delete["engine"]
    check("engine idle at the end", e["running"] == 0 and e["waiting"] == 0,
          f"running {e['running']}, waiting {e['waiting']}")
    check("agents deleted", delete_failed == 0, f"{deleted} deleted, {delete_failed} failed")
    b, a = pool_counts(before), pool_counts(after_delete)
    check("no leaked KV blocks (pools back to their idle counts)", a == b,
          f"before {b}, after {a}")
    # KV the engine keeps for an agent that the API cannot list (so nothing
    # deletes it) shows here even once its pins went stale.
    check("no resident agents left", e.get("resident_agents", 0) == 0,
          f"{e.get('resident_agents')} agents' KV still resident in the engine")
    # Warm-up: the first fifth of the run, and until the pools were full.
    warm_end = max(args.minutes * 60 / 5,
                   pools_full_at if pools_full_at is not None else float("inf"))
    warm = [anon for t, anon, _ in rss if t >= warm_end]
    if len(warm) >= 2:
        base, last, peak = warm[0], warm[-1], max(warm)
        # Least-squares slope over the post-warm-up samples, as growth over
        # that window relative to the warm-up sample.
        ts = [t for t, _, _ in rss if t >= warm_end]
        mt, mk = sum(ts) / len(ts), sum(warm) / len(warm)
        den = sum((t - mt) ** 2 for t in ts) or 1
        slope = sum((t - mt) * (k - mk) for t, k in zip(ts, warm)) / den
        trend = slope * (ts[-1] - ts[0]) / base
        check("RSS (anonymous) flat after warm-up",
              last <= base * (1 + args.rss_slack) and trend <= args.rss_slack,
              f"after warm-up ({ts[0]:.0f} s) {base / 1024:.0f} MiB, "
              f"end {last / 1024:.0f} MiB, "
              f"peak {peak / 1024:.0f} MiB, fitted growth {trend * 100:+.1f}%")
    else:
        check("RSS (anonymous) flat after warm-up", False,
              "not judged: the KV pool and host tier were still filling at the end"
              if pools_full_at is None else "too few samples after the warm-up")
    check("serve exits cleanly on SIGTERM", server.returncode == 0,
          f"exit status {server.returncode}")
    check("store verify clean", verify.returncode == 0,
          (verify.stdout + verify.stderr).strip().splitlines()[-1:] or "")

    summary = {
        "clients": args.clients, "minutes": args.minutes, "turns_completed": stats.turns,
        "sse_events": stats.events, "statuses": dict(stats.status),
        "by_kind": dict(stats.by_kind), "disconnects": dict(stats.disconnects),
        "transport_errors": dict(stats.transport_errors),
        "five_xx_by_body": dict(Counter(f"{k} {st} {b[:120]}" for k, st, b in stats.five_xx)),
        "rss_mib_anon_file": [(t, round(a / 1024), round(f / 1024))
                              for t, a, f in rss[:: max(1, len(rss) // 20)]],
        "pools_before": b, "pools_after": a, "pools_full_at_s": pools_full_at,
        "drain_s": round(drain_s), "checks": checks,
    }
    for c in checks:
        print(f"{'PASS' if c['ok'] else 'FAIL'}  {c['check']}: {c['detail']}")
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    sys.exit(0 if all(c["ok"] for c in checks) else 1)


if __name__ == "__main__":
    main()
