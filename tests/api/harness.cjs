// What the end-to-end scripts under tests/api share: the official npm
// clients loaded from NPM_DIR (tools/npm), pointed at a running
// `agentkv serve`; timed steps; and the scenario runner that prints
// "ALL OK" (what the C++ tests look for) or exits 1.
'use strict';
const path = require('node:path');
const { createRequire } = require('node:module');

// The server at PORT (https when AGENTKV_TEST_TLS is set) with the OpenAI
// and Anthropic clients the npm packages in `npmDir` provide.
function connect(port, npmDir) {
  const req = createRequire(path.join(npmDir, 'package.json'));
  const openaiMod = req('openai');
  const OpenAI = openaiMod.OpenAI || openaiMod.default || openaiMod;
  const anthropicMod = req('@anthropic-ai/sdk');
  const Anthropic = anthropicMod.Anthropic || anthropicMod.default || anthropicMod;
  const base = `${process.env.AGENTKV_TEST_TLS ? 'https' : 'http'}://127.0.0.1:${port}`;
  return {
    OpenAI, Anthropic, base,
    openai: new OpenAI({ baseURL: `${base}/v1`, apiKey: 'any', maxRetries: 0 }),
    anthropic: new Anthropic({ baseURL: base, apiKey: 'any', maxRetries: 0 }),
  };
}

// Runs `fn` and prints its name, time and (when it returns one) a summary.
async function step(name, fn) {
  const t = Date.now();
  const what = await fn();
  console.log(`ok ${name} (${Date.now() - t} ms)${what ? ': ' + what : ''}`);
}

// Runs `main`; "ALL OK" when it resolves, the error and exit 1 when not.
function run(main) {
  main().then(() => console.log('ALL OK')).catch((e) => {
    console.error('FAILED:', e);
    process.exit(1);
  });
}

// Runs the scenario `name` of `scenarios` (an object of async functions).
function runScenario(scenarios, name) {
  run(async () => {
    const fn = scenarios[name];
    if (!fn) throw new Error(`unknown scenario ${name}`);
    await fn();
  });
}

module.exports = { connect, step, run, runScenario };
