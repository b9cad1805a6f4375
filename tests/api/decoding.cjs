// Decoding-feature scenarios (logprobs, n > 1) against a running
// `agentkv serve`, driven by the official OpenAI client.
// Usage: node decoding.cjs SCENARIO PORT NPM_DIR [ARGS...]. Prints "ALL OK"
// and exits 0 when every check of the scenario passes. The model is random:
// shapes, counts, reproducibility and values recomputed from `agentkv
// logits` are checked, never particular texts.
'use strict';
const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const { connect, step, runScenario } = require('./harness.cjs');

const [scenario, port, npmDir, ...args] = process.argv.slice(2);
const { base, openai } = connect(port, npmDir);
const messages = [{ role: 'user', content: 'Say hello.' }];

async function adminStatus() {
  const r = await fetch(`${base}/admin/status`);
  assert.equal(r.status, 200);
  return r.json();
}

async function expect400(fn, field) {
  let err = null;
  try { await fn(); } catch (e) { err = e; }
  assert.ok(err, `expected a 400 naming ${field}`);
  assert.equal(err.status, 400);
  assert.match(String(err.message), new RegExp(field));
}

// One chat logprobs entry as OpenAI documents it.
function checkChatEntry(e, top) {
  assert.equal(typeof e.token, 'string');
  assert.equal(typeof e.logprob, 'number');
  assert.ok(e.logprob <= 0);
  assert.ok(Array.isArray(e.bytes));
  for (const b of e.bytes) assert.ok(Number.isInteger(b) && b >= 0 && b < 256);
  // Whole characters: the string is the UTF-8 decoding of the bytes.
  const decoded = Buffer.from(e.bytes).toString('utf8');
  if (!decoded.includes('\ufffd')) assert.equal(e.token, decoded);
  assert.equal(e.top_logprobs.length, top);
  for (let i = 0; i < e.top_logprobs.length; i++) {
    const t = e.top_logprobs[i];
    assert.equal(typeof t.token, 'string');
    assert.ok(Array.isArray(t.bytes));
    assert.ok(t.logprob <= 0);
    if (i > 0) assert.ok(t.logprob <= e.top_logprobs[i - 1].logprob);
  }
}

function checkCompletionLogprobs(lp, n, top) {
  for (const k of ['tokens', 'token_logprobs', 'top_logprobs', 'text_offset'])
    assert.equal(lp[k].length, n, k);
  for (let i = 0; i < n; i++) {
    assert.equal(typeof lp.tokens[i], 'string');
    assert.ok(lp.token_logprobs[i] <= 0);
    const keys = Object.keys(lp.top_logprobs[i]);
    assert.ok(keys.length >= 1 && keys.length <= top + 1);
    assert.ok(keys.includes(lp.tokens[i]));  // the sampled token is always there
    if (i > 0) assert.ok(lp.text_offset[i] >= lp.text_offset[i - 1]);
  }
}

function logSoftmax(v) {
  let m = -Infinity;
  for (const x of v) m = Math.max(m, x);
  let s = 0;
  for (const x of v) s += Math.exp(x - m);
  const lse = m + Math.log(s);
  return v.map((x) => x - lse);
}

// Ids of the `k` largest values, largest first, lowest id on ties.
function topIds(v, k) {
  const ids = [...v.keys()];
  ids.sort((a, b) => (v[b] - v[a]) || (a - b));
  return ids.slice(0, k);
}

const scenarios = {
  // The documented shapes, whole and streamed, chat and completions.
  async logprobs() {
    await step('chat logprobs', async () => {
      const r = await openai.chat.completions.create({
        model: 'default', messages, max_tokens: 6, temperature: 0, ignore_eos: true,
        logprobs: true, top_logprobs: 4,
      });
      const c = r.choices[0];
      assert.equal(c.logprobs.content.length, r.usage.completion_tokens);
      assert.equal(c.logprobs.refusal, null);
      for (const e of c.logprobs.content) {
        checkChatEntry(e, 4);
        // Greedy: the chosen token is the most likely one.
        assert.equal(e.token, e.top_logprobs[0].token);
        assert.ok(Math.abs(e.logprob - e.top_logprobs[0].logprob) < 1e-6);
      }
      const none = await openai.chat.completions.create({
        model: 'default', messages, max_tokens: 2, temperature: 0, ignore_eos: true,
      });
      assert.equal(none.choices[0].logprobs ?? null, null);
      const zero = await openai.chat.completions.create({
        model: 'default', messages, max_tokens: 3, temperature: 0.8, seed: 5, ignore_eos: true,
        logprobs: true,
      });
      assert.equal(zero.choices[0].logprobs.content.length, 3);
      for (const e of zero.choices[0].logprobs.content) checkChatEntry(e, 0);
    });

    await step('chat logprobs stream', async () => {
      const stream = await openai.chat.completions.create({
        model: 'default', messages, max_tokens: 6, temperature: 0, ignore_eos: true,
        logprobs: true, top_logprobs: 2, stream: true, stream_options: { include_usage: true },
      });
      const entries = [];
      let usage = null;
      for await (const c of stream) {
        if (c.usage) usage = c.usage;
        for (const ch of c.choices) {
          assert.equal(ch.index, 0);
          if (ch.logprobs && ch.logprobs.content) entries.push(...ch.logprobs.content);
        }
      }
      assert.equal(entries.length, usage.completion_tokens);
      for (const e of entries) checkChatEntry(e, 2);
    });

    await step('completions logprobs', async () => {
      const r = await openai.completions.create({
        model: 'default', prompt: 'Once upon a time', max_tokens: 5, temperature: 0,
        ignore_eos: true, logprobs: 3,
      });
      checkCompletionLogprobs(r.choices[0].logprobs, r.usage.completion_tokens, 3);
      const stream = await openai.completions.create({
        model: 'default', prompt: 'Once upon a time', max_tokens: 5, temperature: 0,
        ignore_eos: true, logprobs: 3, stream: true,
      });
      const tokens = [], values = [];
      for await (const c of stream) {
        const lp = c.choices[0] && c.choices[0].logprobs;
        if (lp) {
          tokens.push(...lp.tokens);
          values.push(...lp.token_logprobs);
        }
      }
      assert.deepEqual(tokens, r.choices[0].logprobs.tokens);
      for (let i = 0; i < values.length; i++)
        assert.ok(Math.abs(values[i] - r.choices[0].logprobs.token_logprobs[i]) < 1e-6);
    });

    await step('logprobs bad input', async () => {
      await expect400(() => openai.chat.completions.create({
        model: 'default', messages, max_tokens: 1, logprobs: true, top_logprobs: 21,
      }), 'top_logprobs');
      await expect400(() => openai.chat.completions.create({
        model: 'default', messages, max_tokens: 1, top_logprobs: 2,
      }), 'top_logprobs');
      await expect400(() => openai.completions.create({
        model: 'default', prompt: 'x', max_tokens: 1, logprobs: 21,
      }), 'logprobs');
    });
  },

  // Greedy steps' logprobs are log-softmax of `agentkv logits` over the
  // prompt and the tokens before them. ARGS: the agentkv binary, the model.
  async logits() {
    const [bin, model] = args;
    const prompt = [9707, 11, 1879, 0, 3555, 264, 882];
    const top = 5;
    const r = await openai.completions.create({
      model: 'default', prompt, max_tokens: 3, temperature: 0, ignore_eos: true, logprobs: top,
    });
    const lp = r.choices[0].logprobs;
    assert.equal(lp.token_logprobs.length, 3);
    const ids = [...prompt];
    for (let k = 0; k < 3; k++) {
      const out = execFileSync(bin, ['logits', '--model', model, '--ids', ids.join(',')],
        { maxBuffer: 64 << 20 }).toString();
      const ref = logSoftmax(JSON.parse(out));
      const best = topIds(ref, top);
      assert.ok(Math.abs(lp.token_logprobs[k] - ref[best[0]]) < 1e-3,
        `step ${k}: ${lp.token_logprobs[k]} vs ${ref[best[0]]}`);
      const got = Object.values(lp.top_logprobs[k]).sort((a, b) => b - a);
      assert.ok(got.length >= 1);
      // Token strings may collide (two ids, one string): compare the values
      // the response kept with the reference's leading ones.
      for (let i = 0; i < Math.min(got.length, top); i++) {
        assert.ok(best.some((id) => Math.abs(ref[id] - got[i]) < 1e-3),
          `step ${k} entry ${i}: ${got[i]}`);
      }
      ids.push(best[0]);
    }
    await step('logits match', async () => {});
  },

  // n > 1: one prompt, n choices sharing its KV; usage counts the prompt
  // once; seeds make choices reproducible.
  async choices() {
    await step('chat n=3', async () => {
      const body = {
        model: 'default', messages, max_tokens: 5, temperature: 1, seed: 42, ignore_eos: true,
        n: 3, logprobs: true, top_logprobs: 1,
      };
      const r = await openai.chat.completions.create(body);
      assert.equal(r.choices.length, 3);
      let completion = 0;
      r.choices.forEach((c, i) => {
        assert.equal(c.index, i);
        assert.equal(c.finish_reason, 'length');
        assert.equal(typeof c.message.content, 'string');
        assert.equal(c.logprobs.content.length, 5);
        completion += c.logprobs.content.length;
      });
      assert.equal(r.usage.completion_tokens, completion);
      const one = await openai.chat.completions.create({ ...body, n: 1 });
      assert.equal(r.usage.prompt_tokens, one.usage.prompt_tokens);
      // Choice 0 uses the seed itself; the others derived seeds.
      const toks = (c) => c.logprobs.content.map((e) => e.token).join('\u0001');
      assert.equal(toks(one.choices[0]), toks(r.choices[0]));
      assert.ok(toks(r.choices[1]) !== toks(r.choices[0]) || toks(r.choices[2]) !== toks(r.choices[0]));
      const again = await openai.chat.completions.create(body);
      assert.deepEqual(again.choices.map(toks), r.choices.map(toks));
    });

    await step('chat n=3 stream', async () => {
      const stream = await openai.chat.completions.create({
        model: 'default', messages, max_tokens: 4, temperature: 1, seed: 7, ignore_eos: true,
        n: 3, stream: true, stream_options: { include_usage: true },
      });
      const finish = {}, roles = {};
      let usage = null;
      for await (const c of stream) {
        if (c.usage) usage = c.usage;
        for (const ch of c.choices) {
          assert.ok(ch.index >= 0 && ch.index < 3);
          if (ch.delta && ch.delta.role) roles[ch.index] = ch.delta.role;
          if (ch.finish_reason) finish[ch.index] = ch.finish_reason;
        }
      }
      assert.deepEqual(Object.keys(finish).sort(), ['0', '1', '2']);
      assert.deepEqual(Object.keys(roles).sort(), ['0', '1', '2']);
      assert.equal(usage.completion_tokens, 12);
    });

    await step('completions n=2', async () => {
      const r = await openai.completions.create({
        model: 'default', prompt: 'Once upon a time', max_tokens: 3, temperature: 0,
        ignore_eos: true, n: 2,
      });
      assert.equal(r.choices.length, 2);
      // Greedy: every choice is the same text.
      assert.equal(r.choices[0].text, r.choices[1].text);
      assert.equal(r.usage.completion_tokens, 6);
    });

    await step('n shares the prompt', async () => {
      const s0 = await adminStatus();
      const pool = s0.pools ? s0.pools[0] : null;
      const long = 'The prompt repeats a unique line. '.repeat(40) + `${Date.now()}`;
      const r = await openai.chat.completions.create({
        model: 'default', messages: [{ role: 'user', content: long }], max_tokens: 2,
        temperature: 1, ignore_eos: true, n: 4,
      });
      const s1 = await adminStatus();
      const prefilled = s1.engine.prompt_tokens - s0.engine.prompt_tokens;
      const p = r.usage.prompt_tokens;
      const bs = pool && pool.total ? pool.tokens / pool.total : 64;
      // Computing the prompt four times would prefill 4 * p.
      assert.ok(p > 4 * bs, `prompt ${p} too short for block size ${bs}`);
      assert.ok(prefilled <= p + 3 * bs, `prefilled ${prefilled} for a prompt of ${p}`);
    });

    await step('n=4 disconnect cancels every choice', async () => {
      const ac = new AbortController();
      const r = await fetch(`${base}/v1/chat/completions`, {
        method: 'POST', signal: ac.signal, headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ messages: [{ role: 'user', content: 'Talk for long.' }], n: 4,
                               max_tokens: 20000, ignore_eos: true, stream: true }),
      });
      const reader = r.body.getReader();
      const seen = new Set();
      let text = '';
      // Until every choice has streamed text (not just its role chunk).
      const re = /"delta":\{"content":"[^"]+"\},"finish_reason":null,"index":(\d)/g;
      while (seen.size < 4) {
        const { value, done } = await reader.read();
        assert.ok(!done);
        text += Buffer.from(value).toString();
        for (const m of text.matchAll(re)) seen.add(m[1]);
      }
      const busy = await adminStatus();
      assert.equal(busy.engine.running, 4);
      const t0 = Date.now();
      ac.abort();
      let s;
      for (;;) {
        s = await adminStatus();
        if (s.engine.running === 0 || Date.now() - t0 > 2000) break;
        await new Promise((res) => setTimeout(res, 5));
      }
      assert.equal(s.engine.running, 0, 'choices still running after the client left');
    });

    await step('n bad input', async () => {
      await expect400(() => openai.chat.completions.create({
        model: 'default', messages, max_tokens: 1, n: 17,
      }), "'n'");
      await expect400(() => openai.completions.create({
        model: 'default', prompt: 'x', max_tokens: 1, n: 0,
      }), "'n'");
      const r = await fetch(`${base}/v1/agents/n-agent/generate`, {
        method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ message: 'hi', max_tokens: 1, n: 2 }),
      });
      assert.equal(r.status, 400);
    });
  },
};

runScenario(scenarios, scenario);
