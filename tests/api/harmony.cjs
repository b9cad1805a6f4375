// A GPT-OSS model (random weights, harmony template and output parser)
// behind `agentkv serve`, through the official OpenAI and Anthropic npm
// clients: chat with tools (plain and streamed) and /v1/messages with the
// same tools. The content is noise; checked are the response shapes, that
// the prompt was the harmony rendering (its token count, computed by the
// caller from `agentkv template` + `agentkv tokenize`), and the usage counts.
// Usage: node harmony.cjs PORT NPM_DIR PROMPT_TOKENS REQUEST_JSON
'use strict';
const assert = require('node:assert/strict');
const fs = require('node:fs');
const { connect, step, run } = require('./harness.cjs');

const [port, npmDir, promptTokensArg, requestFile] = process.argv.slice(2);
const promptTokens = Number(promptTokensArg);
const { openai, anthropic } = connect(port, npmDir);
const request = JSON.parse(fs.readFileSync(requestFile, 'utf8'));
const MAX = 8;
// Greedy replies of a random model without an eos bias do not end early:
// every reply must run to max_tokens.
const RUNS_TO_MAX = true;

// Generated tokens, the stop token excluded: all of max_tokens when the
// reply was cut there, fewer when a stop token (<|return|>, <|call|>) ended it.
function checkCount(n, cut, what) {
  assert.ok(Number.isInteger(n) && n >= 0 && n <= MAX, what);
  if (RUNS_TO_MAX) assert.ok(cut, what);
  if (cut) assert.equal(n, MAX, what);
  else assert.ok(n < MAX, what);
}

function checkToolCall(tc) {
  assert.equal(tc.type, 'function');
  assert.equal(typeof tc.id, 'string');
  assert.equal(typeof tc.function.name, 'string');
  assert.equal(typeof JSON.parse(tc.function.arguments), 'object');
}

async function main() {
  assert.ok(promptTokens > 0);

  await step('chat with tools', async () => {
    const r = await openai.chat.completions.create({
      model: 'default', messages: request.messages, tools: request.tools, max_tokens: MAX,
      temperature: 0,
    });
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.choices.length, 1);
    const c = r.choices[0];
    assert.equal(c.message.role, 'assistant');
    assert.ok(['length', 'stop', 'tool_calls'].includes(c.finish_reason), c.finish_reason);
    assert.ok(c.message.content === null || typeof c.message.content === 'string');
    for (const tc of c.message.tool_calls || []) checkToolCall(tc);
    if (c.finish_reason === 'tool_calls') assert.ok(c.message.tool_calls.length >= 1);
    const reasoning = c.message.reasoning_content;
    assert.ok(reasoning === undefined || reasoning === null || typeof reasoning === 'string');
    assert.equal(r.usage.prompt_tokens, promptTokens);
    checkCount(r.usage.completion_tokens, c.finish_reason === 'length', JSON.stringify(r));
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
    return `${c.finish_reason}, ${r.usage.completion_tokens} tokens`;
  });

  await step('chat with tools, streamed', async () => {
    const stream = await openai.chat.completions.create({
      model: 'default', messages: request.messages, tools: request.tools, max_tokens: MAX,
      temperature: 0, stream: true, stream_options: { include_usage: true },
    });
    let finish = null, usage = null, chunks = 0;
    for await (const c of stream) {
      chunks++;
      assert.equal(c.object, 'chat.completion.chunk');
      if (c.choices.length && c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
      if (c.usage) usage = c.usage;
    }
    assert.ok(chunks >= 2);
    assert.ok(['length', 'stop', 'tool_calls'].includes(finish), finish);
    assert.equal(usage.prompt_tokens, promptTokens);
    checkCount(usage.completion_tokens, finish === 'length', JSON.stringify(usage));
    return `${finish}, ${usage.completion_tokens} tokens`;
  });

  // The same conversation and tools in Anthropic's shape render the same
  // harmony prompt.
  const system = request.messages.filter((m) => m.role === 'system').map((m) => m.content).join('');
  const messages = request.messages.filter((m) => m.role !== 'system');
  const tools = request.tools.map((t) => ({
    name: t.function.name, description: t.function.description,
    input_schema: t.function.parameters,
  }));

  await step('messages with tools', async () => {
    const r = await anthropic.messages.create({
      model: 'gpt-oss', max_tokens: MAX, temperature: 0, system, messages, tools,
    });
    assert.equal(r.type, 'message');
    assert.equal(r.role, 'assistant');
    assert.ok(['max_tokens', 'end_turn', 'tool_use'].includes(r.stop_reason), r.stop_reason);
    for (const b of r.content) {
      assert.ok(['text', 'thinking', 'tool_use'].includes(b.type), b.type);
      if (b.type === 'tool_use') assert.equal(typeof b.input, 'object');
    }
    assert.equal(r.usage.input_tokens, promptTokens);
    checkCount(r.usage.output_tokens, r.stop_reason === 'max_tokens', JSON.stringify(r));
    const counted = await anthropic.messages.countTokens({ model: 'gpt-oss', system, messages, tools });
    assert.equal(counted.input_tokens, promptTokens);
    return `${r.stop_reason}, ${r.usage.output_tokens} tokens`;
  });

  await step('messages streamed', async () => {
    const final = await anthropic.messages
      .stream({ model: 'gpt-oss', max_tokens: MAX, temperature: 0, system, messages, tools })
      .finalMessage();
    assert.equal(final.role, 'assistant');
    checkCount(final.usage.output_tokens, final.stop_reason === 'max_tokens', JSON.stringify(final));
    return `${final.stop_reason}, ${final.usage.output_tokens} tokens`;
  });
}

run(main);
