// Encodes a seeded corpus with transformers.js (@lenml/tokenizers) and
// prints the expected results as JSON for tests/engine/tokenizer_reference_test.cc.
//
//   node reference.js --tokenizer-dir DIR --count N --seed S [--node-modules DIR]
//
// Output: {"cases": [{"text", "ids" (add_special_tokens=false),
//   "decoded" (decode(ids)), and on every 7th case "ids_special"
//   (add_special_tokens=true) and "decoded_skip" (skip_special_tokens)}]}
'use strict';
const fs = require('fs');
const path = require('path');
const { createRequire } = require('module');
const { generate } = require('./corpus.js');

function arg(name, def) {
  const i = process.argv.indexOf('--' + name);
  return i >= 0 ? process.argv[i + 1] : def;
}

const dir = arg('tokenizer-dir');
const count = Number(arg('count', '5000'));
const seed = Number(arg('seed', '1'));
const modules = arg('node-modules', path.join(__dirname, '../../../tools/npm/node_modules'));
const req = createRequire(path.join(modules, 'x.js'));
const { TokenizerLoader } = req('@lenml/tokenizers');

const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8'));
const configPath = path.join(dir, 'tokenizer_config.json');
const tokenizerConfig = fs.existsSync(configPath)
  ? JSON.parse(fs.readFileSync(configPath, 'utf8')) : {};
const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });

const added = tokenizerJSON.added_tokens || [];
const model = { added: added.filter((a, i) => a.special || i % 50 === 0) };
const texts = generate(seed, count, model);
const cases = texts.map((text, i) => {
  const ids = tok.encode(text, { add_special_tokens: false });
  const c = { text, ids, decoded: ids.length ? tok.decode(ids) : '' };
  if (i % 7 === 0) {
    c.ids_special = tok.encode(text, { add_special_tokens: true });
    c.decoded_skip = c.ids_special.length
      ? tok.decode(c.ids_special, { skip_special_tokens: true }) : '';
  }
  return c;
});
process.stdout.write(JSON.stringify({ cases }));
