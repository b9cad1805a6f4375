// Runs the official OpenAI and Anthropic npm clients against a running
// `agentkv serve`. Usage: node clients.cjs PORT NPM_DIR. The model is random,
// so only shapes, token counts and finish reasons are checked. Exits 0 when
// every check passes.
'use strict';
const assert = require('node:assert/strict');
const { connect, step, run } = require('./harness.cjs');

const port = process.argv[2];
const npmDir = process.argv[3];
const { OpenAI, Anthropic, base, openai, anthropic } = connect(port, npmDir);
const messages = [{ role: 'user', content: 'Say hello.' }];

async function main() {
  await step('models', async () => {
    const list = await openai.models.list();
    assert.equal(list.data.length, 1);
    assert.equal(list.data[0].id, 'default');
  });

  await step('chat non-stream', async () => {
    const r = await openai.chat.completions.create({
      model: 'default', messages, max_tokens: 8, temperature: 0, ignore_eos: true,
    });
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(typeof r.choices[0].message.content, 'string');
    assert.ok(['length', 'stop'].includes(r.choices[0].finish_reason));
    assert.ok(r.usage.prompt_tokens > 0);
    assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 8);
    if (r.choices[0].finish_reason === 'length') assert.equal(r.usage.completion_tokens, 8);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
    assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
  });

  await step('chat stream', async () => {
    const stream = await openai.chat.completions.create({
      model: 'default', messages, max_tokens: 8, temperature: 0, ignore_eos: true, stream: true,
      stream_options: { include_usage: true },
    });
    let finish = null, usage = null, chunks = 0;
    for await (const c of stream) {
      chunks++;
      assert.equal(c.object, 'chat.completion.chunk');
      if (c.choices.length && c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
      if (c.usage) usage = c.usage;
    }
    assert.ok(chunks >= 2);
    assert.ok(['length', 'stop'].includes(finish));
    assert.ok(usage && usage.completion_tokens >= 1 && usage.completion_tokens <= 8);
  });

  await step('completions', async () => {
    const r = await openai.completions.create({
      model: 'default', prompt: 'Once upon a time', max_tokens: 5, temperature: 0, ignore_eos: true,
    });
    assert.equal(r.object, 'text_completion');
    assert.equal(typeof r.choices[0].text, 'string');
    assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 5);
  });

  await step('messages non-stream', async () => {
    const r = await anthropic.messages.create({
      model: 'claude-anything', max_tokens: 8, temperature: 0, ignore_eos: true,
      system: [{ type: 'text', text: 'You are terse.' }], messages,
    });
    assert.equal(r.type, 'message');
    assert.equal(r.role, 'assistant');
    assert.equal(r.content[0].type, 'text');
    assert.ok(['max_tokens', 'end_turn'].includes(r.stop_reason));
    assert.ok(r.usage.input_tokens > 0);
    assert.ok(r.usage.output_tokens >= 1 && r.usage.output_tokens <= 8);
    assert.equal(typeof r.usage.cache_read_input_tokens, 'number');
  });

  await step('messages stream', async () => {
    const stream = await anthropic.messages.create({
      model: 'claude-anything', max_tokens: 8, temperature: 0, ignore_eos: true, stream: true, messages,
    });
    const types = [];
    let stop = null, out = 0;
    for await (const ev of stream) {
      types.push(ev.type);
      if (ev.type === 'content_block_delta') assert.equal(ev.delta.type, 'text_delta');
      if (ev.type === 'message_delta') { stop = ev.delta.stop_reason; out = ev.usage.output_tokens; }
    }
    assert.equal(types[0], 'message_start');
    assert.equal(types[1], 'content_block_start');  // the SDK drops ping events
    assert.equal(types.at(-3), 'content_block_stop');
    assert.equal(types.at(-2), 'message_delta');
    assert.equal(types.at(-1), 'message_stop');
    assert.ok(['max_tokens', 'end_turn'].includes(stop));
    assert.ok(out >= 1 && out <= 8);
  });

  await step('messages stream raw events', async () => {
    const r = await fetch(`${base}/v1/messages?beta=true`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'anthropic-beta': 'x' },
      body: JSON.stringify({ model: 'm', max_tokens: 3, temperature: 0, ignore_eos: true, stream: true, messages }),
    });
    assert.equal(r.status, 200);
    assert.match(r.headers.get('content-type'), /text\/event-stream/);
    const text = await r.text();
    const names = [...text.matchAll(/^event: (\w+)$/gm)].map((m) => m[1]);
    const deltas = names.filter((n) => n === 'content_block_delta').length;
    assert.ok(deltas >= 1 && deltas <= 3, JSON.stringify(text.slice(0, 300)));
    assert.deepEqual(names.filter((n) => n !== 'content_block_delta'), [
      'message_start', 'content_block_start', 'ping', 'content_block_stop', 'message_delta',
      'message_stop',
    ]);
    assert.equal(names[3], 'content_block_delta');
  });

  await step('messages stream helper', async () => {
    const final = await anthropic.messages
      .stream({ model: 'm', max_tokens: 4, temperature: 0, ignore_eos: true, messages })
      .finalMessage();
    assert.equal(final.role, 'assistant');
    assert.ok(final.usage.output_tokens >= 1 && final.usage.output_tokens <= 4);
  });

  await step('count_tokens', async () => {
    const r = await anthropic.messages.countTokens({ model: 'm', messages });
    assert.ok(Number.isInteger(r.input_tokens) && r.input_tokens > 0);
    const longer = await anthropic.messages.countTokens({
      model: 'm', system: 'A much longer system prompt than nothing at all.', messages,
    });
    assert.ok(longer.input_tokens > r.input_tokens);
  });

  await step('errors', async () => {
    let r = await fetch(`${base}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"messages": [',
    });
    assert.equal(r.status, 400);
    let j = await r.json();
    assert.equal(j.error.type, 'invalid_request_error');
    assert.equal(typeof j.error.message, 'string');
    assert.ok('param' in j.error && 'code' in j.error);

    await assert.rejects(
      openai.chat.completions.create({ model: 'default', max_tokens: 4 }),
      (e) => e.status === 400 && e.error && e.error.type === 'invalid_request_error');

    await assert.rejects(
      anthropic.messages.create({ model: 'm', max_tokens: 4, messages: 'nope' }),
      (e) => e.status === 400 && e.error && e.error.type === 'error' &&
             e.error.error.type === 'invalid_request_error');

    // A body a browser could send cross-origin without a preflight.
    r = await fetch(`${base}/v1/messages?beta=true`, { method: 'POST', body: 'not json' });
    assert.equal(r.status, 415);
    j = await r.json();
    assert.equal(j.type, 'error');
    r = await fetch(`${base}/v1/messages?beta=true`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: 'not json',
    });
    assert.equal(r.status, 400);
    j = await r.json();
    assert.equal(j.type, 'error');
    assert.equal(j.error.type, 'invalid_request_error');
    // A web page's request (it carries an Origin) and a rebinding page's
    // (a foreign Host) are refused.
    r = await fetch(`${base}/v1/chat/completions`, {
      method: 'POST', body: '{}',
      headers: { 'content-type': 'application/json', origin: 'https://evil.example' },
    });
    assert.equal(r.status, 403);

    r = await fetch(`${base}/v1/nothing-here`);
    assert.equal(r.status, 404);

    const huge = 'word '.repeat(140000);
    r = await fetch(`${base}/v1/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: huge, max_tokens: 1 }),
    });
    assert.equal(r.status, 400);
    assert.equal((await r.json()).error.type, 'invalid_request_error');

    // Per-route body limits: 1 MiB outside the generation endpoints.
    r = await fetch(`${base}/admin/model`, {
      method: 'POST', body: 'x'.repeat(2 << 20),
    }).catch(() => null);
    if (r) assert.equal(r.status, 413);
    r = await fetch(`${base}/v1/chat/completions`, {
      method: 'POST', body: 'x'.repeat(33 << 20),
    }).catch(() => null);
    if (r) assert.equal(r.status, 413);
  });
}

run(main);
