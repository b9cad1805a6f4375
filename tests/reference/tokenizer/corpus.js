// Deterministic (seeded) corpus of varied strings for tokenizer reference
// tests: prose, code, whitespace runs, digits, CJK, emoji, combining marks,
// special-token spellings and near misses, random code points.
'use strict';

function mulberry32(seed) {
  let a = seed >>> 0;
  return function () {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const WORDS = (
  'the of and to in is was he for it with as his on be at by had are but from or ' +
  'have an they which one you were her all she there would their we him been has when ' +
  'who will more no if out so said what up its about into than them can only other new ' +
  'some could time these two may then do first any my now such like our over man me even ' +
  'most made after also did many before must through back years where much your way well ' +
  'tokenizer server cache agent session persistent batching accelerator kv-cache LLM GPU ' +
  'Hello World JavaScript TypeScript Python naïve café résumé coöperate façade jalapeño ' +
  'Straße Ærøskøbing Ελληνικά русский язык العربية עברית हिन्दी ไทย Tiếng Việt 한국어'
).split(' ');
const CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE",
  "'M", "'LL", "'D", "n't", "'", "’s", "'x"];
const PUNCT = ['.', ',', '!', '?', ';', ':', '...', ' - ', ' — ', '(', ')', '"', "'", '«', '»',
  '“', '”', '¿', '¡', '…', '·'];
const SPACES = [' ', '  ', '   ', '\t', '\n', '\n\n', '\r\n', '\r', ' \n', '\n ', '\u00a0',
  '\u3000', '\u2003', '\u2028', '\u2029', '\ufeff', '\u0085', '\u000b', '\u000c', '\u200b',
  '\u202f', '\u205f', '\u1680', '    ', '\t\t', '\n\n\n', ' \t ', '\u2009'];
const EMOJI = ['😀', '👍', '👍🏽', '👨‍👩‍👧‍👦', '🇫🇷', '🏳️‍🌈', '❤️', '✅', '🚀', '🤖', '🧑🏿‍💻',
  '☕', '⚡', '🎉', '1️⃣', '#️⃣', '🫠', '🪐'];
const COMBINING = ['\u0301', '\u0300', '\u0308', '\u0327', '\u0303', '\u030a', '\u0323',
  '\u0342', '\u0345', '\u20dd', '\u0651', '\u05b4', '\u093f', '\u0e31', '\u302a'];
const SCRIPTS = [
  [0x4e00, 0x9fa5], [0x3040, 0x309f], [0x30a0, 0x30ff], [0xac00, 0xd7a3], [0x0400, 0x04ff],
  [0x0370, 0x03ff], [0x0600, 0x06ff], [0x0590, 0x05ff], [0x0900, 0x097f], [0x0e00, 0x0e7f],
  [0x1100, 0x11ff], [0x2000, 0x206f], [0x2190, 0x21ff], [0x2200, 0x22ff], [0x2500, 0x257f],
  [0xff00, 0xffef], [0x1f300, 0x1f5ff], [0x1d400, 0x1d7ff], [0x20000, 0x2a6df], [0x0080, 0x00ff],
  [0x0100, 0x024f], [0x1e00, 0x1eff], [0xe000, 0xe0ff], [0x10a0, 0x10ff], [0x3400, 0x4dbf],
];
const CODE = [
  'def {id}({id}, {id}=None):\n    return {id} + {num}\n',
  'for (int {id} = 0; {id} < {num}; ++{id}) {\n\t{id}[{id}] = {id} * 2;\n}\n',
  'const {id} = await fetch(`/api/{id}?q=${{id}}`);\n',
  'if ({id} != nullptr && {id}->{id}() >= {num}) { return -1; }\n',
  '#include <{id}.h>\n#define {ID} 0x{hex}\n',
  'SELECT {id}, COUNT(*) FROM {id} WHERE {id} = \'{id}\' GROUP BY 1;\n',
  '  "{id}": [{num}, {num}.{num}, true, null],\n',
  '<div class="{id}">{id}</div>\n',
  '$ ./{id} --{id}={num} 2>&1 | grep -v "{id}"\n',
  'fn {id}(&self) -> Result<Vec<u8>, Error> {\n        Ok(vec![])\n    }\n',
  '// TODO({id}): {id} {id}\n',
  'x = {num}e-{num}; y = .{num}; z = {num}_{num}_{num};\n',
  '    \n\t\n  \n',
  'import {id} from \'./{id}.js\';  // {id}\r\n',
];

function makeSpecials(model) {
  const common = ['<|im_start|>', '<|im_end|>', '<|endoftext|>', '<|begin_of_text|>',
    '<|end_of_text|>', '<|eot_id|>', '<|start_header_id|>', '<|end_header_id|>',
    '<start_of_turn>', '<end_of_turn>', '<bos>', '<eos>', '<pad>', '<unk>', '<mask>', '<s>', '</s>',
    '<think>', '</think>', '<tool_call>', '</tool_call>', '<|fim_prefix|>',
    '<|reserved_special_token_5|>', '<unused0>', '<unused99>', '<start_of_image>',
    '<｜begin▁of▁sentence｜>', '<｜end▁of▁sentence｜>', '<0x41>', '<0xE2>', '<b>', '</b>',
    '<table>', '<h1>', '[multimodal]', '▁', '▁▁', '▁▁▁▁', '\u2581hello'];
  const near = ['<|im_start', '<|im_start|', 'im_start|>', '<| im_start |>', '<|IM_START|>',
    '<|im_start|><|im_start|>', '<|im_start|>|>', '<<|im_start|>>', '<start_of_turn >',
    '< start_of_turn>', '<start_of_turn', '<bos', 'bos>', '<<bos>>', '<|begin_of_text|',
    '<|begin_of_tex|>', '<|reserved_special_token_999|>', '<unused>', '<0x4>', '<0xZZ>',
    '<0x41', '<|endoftext|>x', 'x<|endoftext|>', ' <|im_end|> ', '\n<|im_end|>\n', '< b>',
    '<|start', '<|channel|', 'channel|>', '<|Start|>', '<|end|>>', '<|return|>x', '<|call |>',
    ' to=functions.x', '<|constrain|>json'];
  const extra = (model.added || []).map((a) => a.content);
  return { list: common.concat(extra), near };
}

function generate(seed, count, model) {
  const rnd = mulberry32(seed);
  const pick = (arr) => arr[Math.floor(rnd() * arr.length)];
  const int = (n) => Math.floor(rnd() * n);
  const specials = makeSpecials(model);
  const cp = () => {
    const [lo, hi] = pick(SCRIPTS);
    return String.fromCodePoint(lo + int(hi - lo + 1));
  };
  const ident = () => {
    const parts = ['x', 'i', 'n', 'tmp', 'value', 'getUser', 'HTTPServer', 'kv_cache', 'ptr',
      'self', 'data2', '_private', '__init__', 'camelCase', 'snake_case_name', 'MAX_LEN', 'α'];
    return pick(parts) + (rnd() < 0.2 ? String(int(100)) : '');
  };
  const number = () => {
    switch (int(6)) {
      case 0: return String(int(10));
      case 1: return String(int(1000));
      case 2: return String(int(1e9)) + String(int(1e9));
      case 3: return (rnd() * 1000).toFixed(int(5));
      case 4: return int(1e6).toLocaleString('en-US');
      default: return '٣٤٥' + String(int(100)) + '１２３';
    }
  };
  const fill = (tpl) => tpl.replace(/\{id\}/g, ident).replace(/\{ID\}/g, () => ident().toUpperCase())
    .replace(/\{num\}/g, number).replace(/\{hex\}/g, () => int(0xffffff).toString(16));
  const prose = () => {
    let s = '';
    const n = 1 + int(25);
    for (let i = 0; i < n; i++) {
      let w = pick(WORDS);
      if (rnd() < 0.1) w = w[0].toUpperCase() + w.slice(1);
      if (rnd() < 0.05) w = w.toUpperCase();
      s += w;
      if (rnd() < 0.08) s += pick(CONTRACTIONS);
      if (rnd() < 0.12) s += pick(PUNCT);
      s += rnd() < 0.9 ? ' ' : pick(SPACES);
    }
    return rnd() < 0.5 ? s.trim() : s;
  };
  const pieces = [
    prose,
    () => fill(pick(CODE)),
    () => { let s = ''; for (let i = 0, n = 1 + int(8); i < n; i++) s += pick(SPACES); return s; },
    () => { let s = ''; for (let i = 0, n = 1 + int(6); i < n; i++) s += (rnd() < 0.5 ? pick(SPACES) : '') + (rnd() < 0.5 ? pick(WORDS) : number()); return s; },
    number,
    () => { let s = ''; for (let i = 0, n = 1 + int(12); i < n; i++) s += cp(); return s; },
    () => { let s = ''; for (let i = 0, n = 1 + int(5); i < n; i++) s += pick(EMOJI) + (rnd() < 0.3 ? ' ' : ''); return s; },
    () => { let s = ''; for (let i = 0, n = 1 + int(5); i < n; i++) s += pick('aeiouAEOnNcCsShHkKzZ') + pick(COMBINING) + (rnd() < 0.3 ? pick(COMBINING) : ''); return s; },
    () => pick(specials.list),
    () => pick(specials.near),
    () => String.fromCodePoint(0x1100 + int(19), 0x1161 + int(21)) + (rnd() < 0.5 ? String.fromCodePoint(0x11a8 + int(27)) : ''),
    () => pick(['', ' ', '\n', 'a', '\t', '  a', 'a  ', '\u00e9', 'e\u0301', '\u212b', '\ufb01', '\u2126', 'A\u030a']),
  ];
  const out = [];
  const fixed = ['', ' ', '  ', '\n', '\n\n\n', '\t', 'a', 'Hello world', ' Hello', 'hello\n',
    "I'm here, it's fine, we'll see, they've gone, you're right, I'd say", "DON'T SHOUT",
    '<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n',
    '<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n',
    '<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>',
    '1234567890', '3.14159', ' 42 ', '日本語のテキストです。', '中文测试，包括标点。',
    '한국어 텍스트', '😀😀😀', 'naïve café', 'e\u0301e\u0301', '    def f():\n        pass\n',
    ' .', 'a . b , c ! d ? e', " ' ", " n't", 'x ' + '.'.repeat(5), ' ' + ' '.repeat(300),
    '\u2581\u2581 hi \u2581', '<0x41><0x42>', '\ufeffBOM', 'tab\tsep\tvalues\n',
    '<|start|>system<|message|>Reasoning: high<|end|><|start|>assistant<|channel|>analysis' +
    '<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Done.<|return|>',
    '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>' +
    '{"city": "Paris"}<|call|>', "HELLO'S World'S can'T We'LL", '\u01c5ungla \u02b0ello \u0915\u093f',
    'ABCdef DEFghi xyzABC'];
  for (const f of fixed) out.push(f);
  while (out.length < count) {
    const r = rnd();
    let s = '';
    if (r < 0.01) {
      // A long text: many pieces.
      for (let i = 0; i < 200; i++) s += pick(pieces)();
    } else {
      const n = 1 + int(r < 0.5 ? 2 : 6);
      for (let i = 0; i < n; i++) s += pick(pieces)();
    }
    out.push(s);
  }
  return out.slice(0, count);
}

module.exports = { generate, mulberry32 };
