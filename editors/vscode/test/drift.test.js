// Keeps the highlighting in step with the language: every keyword of grammar/Epl.g4 and
// every builtin, key, setting call, type and option word the front end knows (from
// `epl lsp --vocabulary`) is highlighted, and no word the TextMate grammar highlights as
// one of those is unknown to them.
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('fs');
const path = require('path');
const h = require('./helpers');

const vocab = h.vocabulary();
const keywords = h.grammarKeywords();
const units = new Set([...keywords].filter((k) => /^[KMGT]i?B$/.test(k)));
const reserved = new Set([...keywords].filter((k) => !units.has(k)));

// Contexts a word is tried in: a script with `@` where the word goes.
const contexts = {
  alone: '@',
  letValue: 'let v = @',
  sizeUnit: 'let s = 2@',
  modelValue: 'model m(x: f32[B, 4]) {\n  y = @\n}',
  modelCall: 'model m(x: f32[B, 4]) {\n  y = @(x)\n}',
  defCall: 'def f(x: f32[B, 4]) -> f32[B, 4] {\n  return @(x)\n}',
  paramType: 'def f(a: @) -> int {\n  return a\n}',
  resultType: 'def f(a: int) -> @ {\n  return a\n}',
  opWord: 'model m(x: f32[B, 4]) {\n  y = mlp(x, 8, act = @)\n}',
  policyKey: 'policy {\n  @ = 1\n}',
  policyValue: 'policy {\n  schedule = @\n}',
  trainKey: 'train m {\n  @ = 1\n}',
  trainValue: 'train m {\n  lr_schedule = @\n}',
  trainCall: 'train m {\n  data = @(1)\n}',
};

// The scopes of the word placed in a context.
async function scopesIn(context, word) {
  const text = contexts[context].replace('@', word);
  const at = contexts[context].indexOf('@');
  const line = text.slice(0, at).split('\n').length - 1;
  const col = at - (text.lastIndexOf('\n', at - 1) + 1);
  const { lines } = await h.tokenize(text);
  return h.scopesAt(lines[line], col);
}

const has = (scopes, prefix) => scopes.some((s) => s.startsWith(prefix));

async function expectScope(context, word, ok, what) {
  const scopes = await scopesIn(context, word);
  assert.ok(ok(scopes), `\`${word}\` in ${context}: expected ${what}, got ${scopes.join(' ')}`);
}

const keywordClass = (s) =>
  has(s, 'keyword.control') || has(s, 'storage.type') || has(s, 'constant.language') ||
  has(s, 'support.type.dtype');

test('the vocabulary is not empty', () => {
  for (const list of ['builtins', 'policyKeys', 'trainKeys', 'settingCalls', 'scalarTypes',
    'policyWords', 'opWords']) {
    assert.ok(Array.isArray(vocab[list]) && vocab[list].length > 0, `vocabulary lacks ${list}`);
  }
  assert.ok(reserved.has('import') && reserved.has('bf16') && units.has('GiB'));
});

test('every reserved word of the grammar is highlighted as a keyword', async () => {
  for (const k of reserved) {
    for (const context of ['alone', 'letValue', 'modelValue']) {
      await expectScope(context, k, keywordClass, 'a keyword scope');
    }
  }
});

test('every size unit of the grammar is highlighted', async () => {
  for (const u of units) await expectScope('sizeUnit', u, (s) => has(s, 'keyword.other.unit'), 'a unit');
});

test('every builtin layer and op is highlighted where it is called', async () => {
  for (const b of vocab.builtins) {
    await expectScope('modelCall', b, (s) => has(s, 'support.function.builtin'), 'a builtin');
    await expectScope('defCall', b, (s) => has(s, 'support.function.builtin'), 'a builtin');
  }
});

test('every policy key and train key is highlighted in its block', async () => {
  for (const k of vocab.policyKeys) {
    await expectScope('policyKey', k, (s) => has(s, 'support.type.property-name.policy'), 'a policy key');
  }
  for (const k of vocab.trainKeys) {
    await expectScope('trainKey', k, (s) => has(s, 'support.type.property-name.train'), 'a train key');
  }
});

test('every setting call is highlighted in a train block, called or bare', async () => {
  for (const { name } of vocab.settingCalls) {
    await expectScope('trainCall', name, (s) => has(s, 'support.function.setting'), 'a setting call');
    await expectScope('trainValue', name, (s) => has(s, 'support.function.setting'), 'a setting call');
  }
});

test('every scalar type is highlighted in a signature', async () => {
  for (const t of vocab.scalarTypes) {
    await expectScope('paramType', t, (s) => has(s, 'support.type.primitive'), 'a type');
    await expectScope('resultType', t, (s) => has(s, 'support.type.primitive'), 'a type');
  }
});

test('every option word is highlighted where it is a value', async () => {
  // A word the lexer reads as a keyword (`bf16`, `none`) or as a WORD (`1f1b`) keeps that scope.
  const asValue = (w) => (s) =>
    has(s, 'constant.other.option') || (reserved.has(w) && keywordClass(s)) ||
    (/^[0-9]/.test(w) && has(s, 'constant.other.word'));
  for (const w of vocab.policyWords) await expectScope('policyValue', w, asValue(w), 'an option');
  for (const w of vocab.opWords) await expectScope('opWord', w, asValue(w), 'an option');
});

// Every word that appears in a regular expression of the TextMate grammar.
function wordsOfGrammar() {
  const g = JSON.parse(fs.readFileSync(path.join(h.extensionDir, 'syntaxes', 'epl.tmLanguage.json'), 'utf8'));
  const words = new Set();
  const visit = (node) => {
    if (Array.isArray(node)) return node.forEach(visit);
    if (!node || typeof node !== 'object') return;
    for (const [key, value] of Object.entries(node)) {
      if (['match', 'begin', 'end'].includes(key) && typeof value === 'string') {
        for (const w of value.replace(/\\[A-Za-z]/g, ' ').match(/[A-Za-z_][A-Za-z0-9_]*/g) || []) {
          words.add(w);
        }
      } else {
        visit(value);
      }
    }
  };
  visit(g);
  return words;
}

test('nothing is highlighted as a keyword, builtin, key, type or option that the language does not know', async () => {
  const known = {
    keyword: reserved,
    unit: units,
    builtin: new Set(vocab.builtins),
    setting: new Set(vocab.settingCalls.map((c) => c.name)),
    policyKey: new Set(vocab.policyKeys),
    trainKey: new Set(vocab.trainKeys),
    type: new Set(vocab.scalarTypes),
    option: new Set([...vocab.policyWords, ...vocab.opWords]),
  };
  // Which list a scope claims its word is in.
  const claims = (s) => [
    keywordClass(s) && 'keyword',
    has(s, 'keyword.other.unit') && 'unit',
    has(s, 'support.function.builtin') && 'builtin',
    has(s, 'support.function.setting') && 'setting',
    has(s, 'support.type.property-name.policy') && 'policyKey',
    has(s, 'support.type.property-name.train') && 'trainKey',
    has(s, 'support.type.primitive') && 'type',
    has(s, 'constant.other.option') && 'option',
  ].filter(Boolean);
  const candidates = new Set([...wordsOfGrammar(), ...Object.values(known).flatMap((s) => [...s]),
    'foo', 'int32', 'float64', 'string', 'layers', 'schedules', 'Linear', 'adamax']);
  assert.ok(candidates.size > 100, `only ${candidates.size} candidate words`);
  const failures = [];
  for (const w of candidates) {
    for (const context of Object.keys(contexts)) {
      const text = contexts[context].replace('@', w);
      const scopes = await scopesIn(context, w);
      for (const list of claims(scopes)) {
        if (!known[list].has(w)) failures.push(`\`${w}\` in ${context} is highlighted as a ${list}: ${text}`);
      }
    }
  }
  assert.deepEqual(failures, []);
});
