// The TextMate grammar against golden scopes (fixtures/highlight.epl) and against the real
// lexer over every script of the repository: examples/, stdlib/, tests/golden/ and the fixture.
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('fs');
const path = require('path');
const h = require('./helpers');

const fixture = path.join(__dirname, 'fixtures', 'highlight.epl');

function scriptFiles() {
  return [...h.eplFiles('examples'), ...h.eplFiles('stdlib'), ...h.eplFiles('tests/golden'), fixture];
}

// "#   ^^^ scope" / "#   ^^^ - scope" / "#<- scope": [{ col, scope, negated }]
function parseAssertion(line) {
  let m = /^#<-\s+(-\s+)?(\S+)\s*$/.exec(line);
  if (m) return [{ col: 0, negated: Boolean(m[1]), scope: m[2] }];
  m = /^#(\s*)(\^+)\s+(-\s+)?(\S+)\s*$/.exec(line);
  if (!m) return null;
  const first = 1 + m[1].length;
  return [...m[2]].map((_, i) => ({ col: first + i, negated: Boolean(m[3]), scope: m[4] }));
}

const hasScope = (scopes, scope) => scopes.some((s) => s === scope || s.startsWith(scope + '.'));

test('golden scopes of the fixture', async () => {
  const { lines } = await h.tokenize(fs.readFileSync(fixture, 'utf8'));
  let target = null;
  let checked = 0;
  const failures = [];
  lines.forEach((l, i) => {
    const assertions = parseAssertion(l.line);
    if (!assertions) {
      target = { index: i, ...l };
      return;
    }
    assert.ok(target, `assertion on line ${i + 1} has no line above it`);
    for (const a of assertions) {
      const scopes = h.scopesAt(target, a.col);
      checked += 1;
      if (hasScope(scopes, a.scope) === a.negated) {
        failures.push(`line ${target.index + 1} col ${a.col + 1} (\`${target.line[a.col]}\`): ` +
          `${a.negated ? 'unexpected' : 'missing'} ${a.scope}; scopes: ${scopes.join(' ')}`);
      }
    }
  });
  assert.deepEqual(failures, []);
  assert.ok(checked > 150, `only ${checked} golden scopes checked`);
});

test('every script tokenises to the end with every region closed', async () => {
  const files = scriptFiles();
  assert.ok(files.length >= 10, `only ${files.length} scripts found`);
  for (const file of files) {
    const { depth } = await h.tokenize(fs.readFileSync(file, 'utf8'));
    assert.equal(depth, 1, `${path.relative(h.repoRoot, file)} leaves a region open`);
  }
});

// The scope each lexer token kind must carry (a prefix of one of its scopes).
const scopeOfKind = {
  IMPORT: 'keyword.control.import',
  LET: 'storage.type.let',
  DEF: 'storage.type.def',
  MODEL: 'storage.type.model',
  RETURN: 'keyword.control.return',
  REPLICATE: 'keyword.control.replicate',
  SPLIT: 'keyword.control.split',
  REPEAT: 'keyword.control.repeat',
  AUTO: 'constant.language.auto',
  POLICY: 'storage.type.policy',
  TRAIN: 'storage.type.train',
  TRUE: 'constant.language.boolean',
  FALSE: 'constant.language.boolean',
  NONE: 'constant.language.none',
  DTYPE: 'support.type.dtype',
  SIZE: 'constant.numeric.size',
  FLOAT: 'constant.numeric.float',
  INT: 'constant.numeric.integer',
  WORD: 'constant.other.word',
  STRING: 'string.quoted.double',
  "'='": 'keyword.operator.assignment',
  "'->'": 'keyword.operator.arrow',
  "'+'": 'keyword.operator.arithmetic',
  "'-'": 'keyword.operator.arithmetic',
  "'*'": 'keyword.operator.arithmetic',
  "'/'": 'keyword.operator.arithmetic',
  "'//'": 'keyword.operator.arithmetic',
  "'%'": 'keyword.operator.arithmetic',
};

// Scopes a name (ID) never carries: those of keywords, literals, comments and strings.
const notForNames = ['keyword.', 'storage.type.', 'constant.language.', 'constant.numeric.',
  'support.type.dtype', 'string.', 'comment.'];

// What the tokens around an ID say it is: a key of a policy/train block, a call, or other.
function roleOfName(tokens, i, blocks) {
  const next = tokens[i + 1];
  const block = blocks[blocks.length - 1];
  if (next && next[0] === "'='" && block && block.depth === 1) return `${block.kind}-key`;
  if (next && next[0] === "'('") return block && block.kind === 'train' ? 'train-call' : 'call';
  return block && block.kind === 'train' ? 'train-value' : 'name';
}

test('every token of every script has the scope of its lexer token', async () => {
  const vocab = h.vocabulary();
  const builtins = new Set(vocab.builtins);
  const settingCalls = new Set(vocab.settingCalls.map((c) => c.name));
  const files = scriptFiles();
  const lexed = h.lexerTokens(files);
  const failures = [];
  let checked = 0;
  for (const file of files) {
    const { lines } = await h.tokenize(fs.readFileSync(file, 'utf8'));
    const tokens = lexed[file];
    assert.ok(tokens && tokens.length > 0, `no lexer tokens for ${file}`);
    const covered = lines.map((l) => new Array(l.line.length).fill(false));
    const blocks = []; // open policy/train blocks: { kind, depth }
    let pending = null; // `policy` or `train` seen, its `{` not yet
    const where = (t) => `${path.relative(h.repoRoot, file)}:${t[1]}:${t[2]} \`${t[3]}\``;
    tokens.forEach((t, i) => {
      const [kind, line, col, text] = t;
      const l = lines[line - 1];
      const start = h.utf16Column(l.line, col);
      for (let c = start; c < start + text.length && c < covered[line - 1].length; ++c) {
        covered[line - 1][c] = true;
      }
      const scopes = h.scopesAt(l, start);
      const has = (prefix) => scopes.some((s) => s.startsWith(prefix));
      checked += 1;
      if (kind === 'POLICY' || kind === 'TRAIN') pending = kind.toLowerCase();
      if (kind === "'{'") {
        if (pending) blocks.push({ kind: pending, depth: 0 });
        pending = null;
        if (blocks.length) blocks[blocks.length - 1].depth += 1;
      }
      if (kind === "'}'" && blocks.length && --blocks[blocks.length - 1].depth === 0) blocks.pop();
      if (scopeOfKind[kind]) {
        // Every code unit of the token, not only its first.
        for (let c = start; c < start + text.length; ++c) {
          if (!h.scopesAt(l, c).some((s) => s.startsWith(scopeOfKind[kind]))) {
            failures.push(`${where(t)} (${kind}) lacks ${scopeOfKind[kind]} at column ${c + 1}: ` +
              h.scopesAt(l, c).join(' '));
            return;
          }
        }
        return;
      }
      if (kind !== 'ID') return;
      const bad = notForNames.find((p) => has(p));
      if (bad) failures.push(`${where(t)} is a name but has ${bad}: ${scopes.join(' ')}`);
      const role = roleOfName(tokens, i, blocks);
      const expect = (ok, what) => {
        if (!ok) failures.push(`${where(t)} (${role}) should be ${what}: ${scopes.join(' ')}`);
      };
      if (role === 'call') {
        expect(has(builtins.has(text) ? 'support.function.builtin' : 'entity.name'),
          builtins.has(text) ? 'a builtin' : 'a function name');
      } else if (role === 'train-call' || role === 'train-value') {
        if (settingCalls.has(text)) expect(has('support.function.setting'), 'a setting call');
      } else if (role === 'policy-key' || role === 'train-key') {
        const known = new Set(role === 'policy-key' ? vocab.policyKeys : vocab.trainKeys);
        expect(has('support.type.property-name') === known.has(text),
          known.has(text) ? 'a known key' : 'not a known key');
      }
    });
    // What the lexer skipped is white space or comments: every other character is a comment.
    lines.forEach((l, li) => {
      for (let c = 0; c < l.line.length; ++c) {
        if (covered[li][c] || /\s/.test(l.line[c])) continue;
        if (!h.scopesAt(l, c).some((s) => s.startsWith('comment.line'))) {
          failures.push(`${path.relative(h.repoRoot, file)}:${li + 1}:${c + 1} is skipped by the ` +
            `lexer but not highlighted as a comment`);
          break;
        }
      }
      for (let c = 0; c < l.line.length; ++c) {
        if (covered[li][c] && h.scopesAt(l, c).some((s) => s.startsWith('comment.'))) {
          failures.push(`${path.relative(h.repoRoot, file)}:${li + 1}:${c + 1} is code but ` +
            `highlighted as a comment`);
          break;
        }
      }
    });
  }
  assert.deepEqual(failures, []);
  assert.ok(checked > 1000, `only ${checked} tokens checked`);
});
