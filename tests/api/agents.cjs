// Agent-layer scenarios against a running `agentkv serve`, driven by the
// official OpenAI client (and fetch for the agents / admin endpoints).
// Usage: node agents.cjs SCENARIO PORT NPM_DIR [ARGS...]. Prints "ALL OK"
// and exits 0 when every check of the scenario passes. The model is random:
// only shapes, token counts, turn numbers and cache sources are checked.
'use strict';
const assert = require('node:assert/strict');
const path = require('node:path');
const { connect, step, runScenario } = require('./harness.cjs');

const [scenario, port, npmDir, ...args] = process.argv.slice(2);
const { OpenAI, Anthropic, base, openai } = connect(port, npmDir);

async function json(method, url, body) {
  const r = await fetch(`${base}${url}`, {
    method, headers: { 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  let j = null;
  try { j = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, body: j, text };
}

async function generate(agent, message, extra = {}) {
  const r = await json('POST', `/v1/agents/${agent}/generate`,
    { message, max_tokens: 8, temperature: 0, ...extra });
  assert.equal(r.status, 200, r.text);
  return r.body;
}

const system = 'You are agent tester. ' + 'Keep every answer short and precise. '.repeat(8);

const scenarios = {
  // Two concurrent requests for one agent run in order; the second sees the
  // first's history and cache.
  async order() {
    await step('agents generate: concurrent turns in order', async () => {
      // Both leave at once; whichever the server got first is turn 1.
      const [a, b] = (await Promise.all([
        generate('order-1', 'First question?', { system }),
        generate('order-1', 'Second question?', { system }),
      ])).sort((x, y) => x.turn - y.turn);
      assert.equal(a.agent_id, 'order-1');
      assert.equal(a.turn, 1);
      assert.equal(b.turn, 2);
      for (const k of ['prompt_tokens', 'completion_tokens', 'cached_tokens']) {
        assert.equal(typeof b.usage[k], 'number');
      }
      assert.ok(['length', 'stop'].includes(a.finish_reason));
      assert.equal(typeof a.text, 'string');
      // The second turn's prompt holds the first turn and its reply.
      assert.ok(b.usage.prompt_tokens > a.usage.prompt_tokens + 2);
      assert.ok(b.usage.cached_tokens > 0, JSON.stringify(b));
      assert.equal(b.usage.cache_source, 'resident');
      assert.equal(a.usage.cache_source, 'none');
      const g = await json('GET', '/v1/agents/order-1');
      assert.equal(g.status, 200);
      assert.equal(g.body.turns, 2);
      assert.equal(g.body.history.length, 2);
      assert.equal(g.body.history[0].messages[0].role, 'system');
      const asked = g.body.history.map((t) => t.messages.find((m) => m.role === 'user').content);
      assert.deepEqual(asked.sort(), ['First question?', 'Second question?']);
      assert.equal(g.body.history[1].messages.at(-1).role, 'assistant');
      assert.equal(g.body.history[1].messages.at(-1).content, b.text);
      assert.equal(g.body.cache.location, 'resident');
    });

    await step('openai chat: one session, concurrent requests in order', async () => {
      const messages = [{ role: 'system', content: system },
                        { role: 'user', content: 'Hello from the session test.' }];
      const opts = { headers: { 'X-Session-Id': 'sess-42' } };
      const rs = await Promise.all([0, 1].map(() => openai.chat.completions.create(
        { model: 'default', messages, max_tokens: 6, temperature: 0 }, opts)));
      const cached = rs.map((r) => r.usage.prompt_tokens_details.cached_tokens);
      assert.ok(Math.max(...cached) > 0, JSON.stringify(cached));
      const g = await json('GET', '/v1/agents/sess-42');
      assert.equal(g.body.turns, 2);
    });

    await step('streamed generate: text events then the reply', async () => {
      const r = await fetch(`${base}/v1/agents/order-1/generate`, {
        method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ message: 'Third?', max_tokens: 5, stream: true }),
      });
      assert.equal(r.status, 200);
      assert.match(r.headers.get('content-type'), /text\/event-stream/);
      const events = (await r.text()).split('\n\n').filter((e) => e.startsWith('data: '))
        .map((e) => JSON.parse(e.slice(6)));
      const last = events[events.length - 1];
      assert.equal(last.turn, 3);
      assert.equal(last.agent_id, 'order-1');
      assert.ok(last.usage.cached_tokens > 0);
      assert.equal(events.slice(0, -1).map((e) => e.text).join(''), last.text);
    });

    await step('list, delete, errors', async () => {
      const l = await json('GET', '/v1/agents');
      assert.equal(l.body.object, 'list');
      assert.ok(l.body.data.some((a) => a.id === 'order-1'));
      const d = await json('DELETE', '/v1/agents/order-1');
      assert.equal(d.status, 200, d.text);
      assert.equal(d.body.deleted, true);
      assert.equal((await json('GET', '/v1/agents/order-1')).status, 404);
      assert.equal((await json('DELETE', '/v1/agents/order-1')).status, 404);
      const after = await generate('order-1', 'Again?');
      assert.equal(after.turn, 1);
      for (const bad of [{}, { message: 3 }, { message: '' }, { message: 'x', max_tokens: 'many' },
                         { message: 'x', stream: 'yes' }, { message: 'x', system: [1] }]) {
        const r = await json('POST', '/v1/agents/e/generate', bad);
        assert.equal(r.status, 400, JSON.stringify(bad));
        assert.equal(r.body.error.type, 'invalid_request_error');
      }
      const long = await json('POST', `/v1/agents/${'x'.repeat(300)}/generate`, { message: 'x' });
      assert.equal(long.status, 400);
      const huge = await json('POST', '/v1/agents/e/generate', { message: 'word '.repeat(140000) });
      assert.equal(huge.status, 400);
      assert.match(huge.body.error.message, /context/);
      // Unknown roles and empty messages, in each protocol's shape.
      await assert.rejects(
        openai.chat.completions.create({ model: 'm', messages: [] }),
        (e) => e.status === 400 && e.error.type === 'invalid_request_error');
      const anthropic = new Anthropic({ baseURL: base, apiKey: 'any', maxRetries: 0 });
      await assert.rejects(
        anthropic.messages.create({ model: 'm', max_tokens: 4,
                                    messages: [{ role: 'wizard', content: 'hi' }] }),
        (e) => e.status === 400 && e.error.error.type === 'invalid_request_error');
      await assert.rejects(
        anthropic.messages.create({ model: 'm', max_tokens: 4, messages: [] }),
        (e) => e.status === 400 && e.error.error.type === 'invalid_request_error');
      // Batch mirror.
      const b = await json('POST', '/v1/batch/agents/batch-1/generate', { message: 'low', max_tokens: 2 });
      assert.equal(b.status, 200, b.text);
      assert.equal(b.body.turn, 1);
      const m = await fetch(`${base}/metrics`);
      const text = await m.text();
      assert.match(text, /agentkv_requests_total\{endpoint="\/v1\/agents\/\{id\}\/generate",status="200"\} \d+/);
      // The batch mirror is counted under the route it mirrors (the job
      // counts itself), and 4xx answers under the batch route.
      const bad = await json('POST', '/v1/batch/agents/b/generate', {});
      assert.equal(bad.status, 400);
      const text2 = await (await fetch(`${base}/metrics`)).text();
      assert.match(text2, /agentkv_requests_total\{endpoint="\/v1\/batch\/agents\/\{id\}\/generate",status="400"\} 1/);
      assert.match(text, /agentkv_time_to_first_token_seconds_count [1-9]/);
      assert.match(text, /agentkv_resume_total\{source="resident"\} [1-9]/);
    });
  },

  // The server runs with --api-key ARGS[0]: wrong keys get each protocol's
  // 401; the right one, in either header, works.
  async apikey() {
    const key = args[0];
    await step('API key', async () => {
      const anthropic = new Anthropic({ baseURL: base, apiKey: 'wrong', maxRetries: 0 });
      await assert.rejects(
        anthropic.messages.create({ model: 'm', max_tokens: 2,
                                    messages: [{ role: 'user', content: 'hi' }] }),
        (e) => e.status === 401 && e.error.type === 'error' &&
               e.error.error.type === 'authentication_error');
      await assert.rejects(
        openai.chat.completions.create({ model: 'm', max_tokens: 2,
                                         messages: [{ role: 'user', content: 'hi' }] }),
        (e) => e.status === 401 && e.error.code === 'invalid_api_key');
      let r = await json('GET', '/v1/agents');
      assert.equal(r.status, 401);
      // A user key opens no admin endpoint: that takes --admin-key.
      r = await json('GET', '/admin/status');
      assert.equal(r.status, 403);
      assert.equal((await json('GET', '/health')).status, 200);
      const good = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0 });
      const c = await good.chat.completions.create(
        { model: 'm', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] });
      assert.equal(c.object, 'chat.completion');
      const goodA = new Anthropic({ baseURL: base, apiKey: key, maxRetries: 0 });
      const m = await goodA.messages.create(
        { model: 'm', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] });
      assert.equal(m.type, 'message');
    });
  },

  // The server speaks TLS (NODE_EXTRA_CA_CERTS trusts its certificate).
  async tls() {
    await step('HTTPS with the official clients', async () => {
      assert.ok(base.startsWith('https://'));
      const c = await openai.chat.completions.create(
        { model: 'm', max_tokens: 3, messages: [{ role: 'user', content: 'hi' }], stream: true });
      let chunks = 0;
      for await (const _ of c) chunks++;
      assert.ok(chunks >= 2);
      const anthropic = new Anthropic({ baseURL: base, apiKey: 'any', maxRetries: 0 });
      const m = await anthropic.messages.create(
        { model: 'm', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] });
      assert.equal(m.type, 'message');
      const g = await generate('tls-1', 'Over TLS.');
      assert.equal(g.turn, 1);
    });
  },

  // 16 agents at once share the engine's batches.
  async parallel() {
    await step('16 agents in one batch', async () => {
      const rs = await Promise.all([...Array(16).keys()].map((i) =>
        generate(`par-${i}`, `Agent ${i} says hello.`, { max_tokens: 24, ignore_eos: true })));
      rs.forEach((r, i) => assert.equal(r.agent_id, `par-${i}`));
      const s = await json('GET', '/admin/status');
      assert.ok(s.body.engine.max_batch_size >= 16, JSON.stringify(s.body.engine));
      const m = await (await fetch(`${base}/metrics`)).text();
      const max = Number(/agentkv_batch_size_max (\d+)/.exec(m)[1]);
      assert.ok(max >= 16, m);
    });
  },

  // First half of the restart scenario: one turn, then the server stops.
  async restart1() {
    const a = await generate('restart-1', 'Remember this conversation.',
                             { system, max_tokens: 40, ignore_eos: true });
    assert.equal(a.turn, 1);
  },
  // After the restart (same --store): the agent's KV is on disk; an OpenAI
  // client continuing the conversation without any id is found by content
  // (the stored chain) and resumes from disk.
  async restart2() {
    await step('resume after restart', async () => {
      const before = await json('GET', '/v1/agents/restart-1');
      assert.equal(before.body.cache.location, 'disk', JSON.stringify(before.body.cache));
      assert.ok(before.body.cache.disk_tokens >= 16);
      assert.equal(before.body.cache.stored.filter((s) => s.current_model).length, 1);
      const turn1 = before.body.history[0].messages;
      const messages = [...turn1, { role: 'user', content: 'Do you remember?' }];
      const r = await openai.chat.completions.create(
        { model: 'default', messages, max_tokens: 4, temperature: 0 });
      assert.ok(r.usage.prompt_tokens_details.cached_tokens >= 16, JSON.stringify(r.usage));
      const after = await json('GET', '/v1/agents/restart-1');
      assert.equal(after.body.turns, 2, JSON.stringify(after.body));
      const s = await json('GET', '/admin/status');
      assert.ok(s.body.agents.resume_sources.disk >= 1, JSON.stringify(s.body.agents));
      const b = await generate('restart-1', 'And now?');
      assert.equal(b.turn, 3);
      assert.ok(b.usage.cached_tokens > 0);
    });
  },

  // A client that disconnects mid-stream has its blocks released promptly.
  async disconnect() {
    await step('disconnect releases blocks within 200 ms', async () => {
      const ac = new AbortController();
      const r = await fetch(`${base}/v1/agents/dc-1/generate`, {
        method: 'POST', signal: ac.signal, headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ message: 'Talk for a long time.', max_tokens: 20000,
                               ignore_eos: true, stream: true }),
      });
      const reader = r.body.getReader();
      await reader.read();  // the first event: generation is running
      const busy = await json('GET', '/admin/status');
      assert.equal(busy.body.engine.running, 1);
      assert.ok(busy.body.pools[0].in_use > 0);
      const t0 = Date.now();
      ac.abort();
      let s;
      for (;;) {
        s = await json('GET', '/admin/status');
        if (s.body.engine.running === 0 && s.body.pools.every((p) => p.in_use === 0)) break;
        if (Date.now() - t0 > 1000) break;
        await new Promise((res) => setTimeout(res, 5));
      }
      const ms = Date.now() - t0;
      console.log(`released after ${ms} ms`);
      assert.equal(s.body.engine.running, 0);
      assert.ok(ms <= 200, `blocks released after ${ms} ms`);
    });
  },

  // Hot-swap to a second model and back: ARGS = modelA modelB.
  async swap() {
    const [modelA, modelB] = args;
    await step('hot-swap and back', async () => {
      const t1 = await generate('swap-1', 'Before the swap.', { system });
      assert.equal(t1.turn, 1);
      let r = await json('POST', '/admin/model', { model: modelB });
      assert.equal(r.status, 200, r.text);
      assert.notEqual(r.body.new_fingerprint, r.body.old_fingerprint);
      const fpA = r.body.old_fingerprint;
      const models = await openai.models.list();
      assert.equal(models.data[0].id, path.basename(modelB));
      const t2 = await generate('swap-1', 'On the other model.');
      assert.equal(t2.turn, 2);  // the history survived
      // Never a cache from another model.
      assert.equal(t2.usage.cached_tokens, 0, JSON.stringify(t2));
      assert.equal(t2.usage.cache_source, 'none');
      r = await json('POST', '/admin/model', { model: modelA });
      assert.equal(r.status, 200, r.text);
      assert.equal(r.body.new_fingerprint, fpA);
      const t3 = await generate('swap-1', 'Back again.');
      assert.equal(t3.turn, 3);
      // The first model's cache, persisted before the swap, is used again.
      assert.equal(t3.usage.cache_source, 'disk', JSON.stringify(t3));
      assert.ok(t3.usage.cached_tokens >= 16);
      const g = await json('GET', '/v1/agents/swap-1');
      assert.equal(g.body.history.length, 3);
      assert.ok(g.body.cache.stored.length >= 2);  // KV under both fingerprints
      // Only directories under --models-dir load.
      const bad = await json('POST', '/admin/model', { model: '/nonexistent/model' });
      assert.equal(bad.status, 403);
      const outside = await json('POST', '/admin/model', { model: '../../' });
      assert.equal(outside.status, 403);
      const still = await generate('swap-1', 'Still serving?');
      assert.equal(still.turn, 4);
    });
  },
};

runScenario(scenarios, scenario);
