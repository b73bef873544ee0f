// Shared by the editor tests: the repository's files, the `epl` binary under test, and
// the TextMate grammar loaded with vscode-textmate and its Oniguruma (WebAssembly) regexes.
'use strict';

const fs = require('fs');
const path = require('path');
const { execFileSync } = require('child_process');

const extensionDir = path.resolve(__dirname, '..');
const repoRoot = path.resolve(extensionDir, '..', '..');

// The `epl` program the tests drive: $EPL_BINARY (CTest sets it) or build/epl.
function eplBinary() {
  const candidate = process.env.EPL_BINARY || path.join(repoRoot, 'build', 'epl');
  if (!fs.existsSync(candidate)) {
    throw new Error(`no epl binary at ${candidate}: build it, or set EPL_BINARY`);
  }
  return candidate;
}

function epl(args, options = {}) {
  return execFileSync(eplBinary(), args, { encoding: 'utf8', maxBuffer: 64 << 20, ...options });
}

// What the front end knows: builtins, policy and train keys, setting calls, types, words.
function vocabulary() {
  return JSON.parse(epl(['lsp', '--vocabulary']));
}

// The real lexer's tokens of files: { file: [[kind, line, col, text], ...] }.
function lexerTokens(files) {
  return JSON.parse(epl(['lsp', '--tokens', ...files]));
}

// The keywords of the grammar: word-like literals of its lexer rules (upper-case names),
// such as 'import', 'f32' and the size units 'KB'.
function grammarKeywords() {
  const g = fs.readFileSync(path.join(repoRoot, 'grammar', 'Epl.g4'), 'utf8')
    .replace(/\/\/[^\n]*/g, '')
    .replace(/\/\*[\s\S]*?\*\//g, '');
  const keywords = new Set();
  for (const rule of g.split(';')) {
    const m = /^\s*(?:fragment\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*:([\s\S]*)$/.exec(rule);
    if (!m || !/^[A-Z]/.test(m[1])) continue;
    const body = m[2].replace(/\[(?:\\.|[^\]\\])*\]/g, ''); // character sets hold no literals
    for (const lit of body.matchAll(/'((?:\\.|[^'\\])*)'/g)) {
      if (/^[A-Za-z_][A-Za-z0-9_]*$/.test(lit[1])) keywords.add(lit[1]);
    }
  }
  return keywords;
}

let grammarPromise = null;

function loadGrammar() {
  if (grammarPromise) return grammarPromise;
  const vsctm = require('vscode-textmate');
  const oniguruma = require('vscode-oniguruma');
  const wasm = fs.readFileSync(require.resolve('vscode-oniguruma/release/onig.wasm')).buffer;
  const onigLib = oniguruma.loadWASM(wasm).then(() => ({
    createOnigScanner: (patterns) => new oniguruma.OnigScanner(patterns),
    createOnigString: (s) => new oniguruma.OnigString(s),
  }));
  const grammarPath = path.join(extensionDir, 'syntaxes', 'epl.tmLanguage.json');
  const registry = new vsctm.Registry({
    onigLib,
    loadGrammar: async (scopeName) =>
      scopeName === 'source.epl'
        ? vsctm.parseRawGrammar(fs.readFileSync(grammarPath, 'utf8'), grammarPath)
        : null,
  });
  grammarPromise = registry.loadGrammar('source.epl');
  return grammarPromise;
}

// Tokenises a text line by line: [{ line, tokens: [{ startIndex, endIndex, scopes }] }],
// plus the rule stack depth after the last line (1 when every region was closed).
async function tokenize(text) {
  const vsctm = require('vscode-textmate');
  const grammar = await loadGrammar();
  let stack = vsctm.INITIAL;
  const lines = text.split('\n').map((l) => l.replace(/\r$/, ''));
  const out = [];
  for (const line of lines) {
    const r = grammar.tokenizeLine(line, stack);
    out.push({ line, tokens: r.tokens });
    stack = r.ruleStack;
  }
  return { lines: out, depth: stack.depth };
}

// The scopes of the token covering UTF-16 column `col` of a tokenised line.
function scopesAt(tokenizedLine, col) {
  for (const t of tokenizedLine.tokens) {
    if (t.startIndex <= col && col < t.endIndex) return t.scopes;
  }
  return [];
}

// UTF-16 column of a 1-based code-point column (the lexer counts code points).
function utf16Column(line, codePointCol) {
  let units = 0;
  let n = 1;
  for (const ch of line) {
    if (n === codePointCol) return units;
    units += ch.length;
    n += 1;
  }
  return units;
}

// Every .epl file below a folder of the repository.
function eplFiles(relativeDir) {
  const dir = path.join(repoRoot, relativeDir);
  const out = [];
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, entry.name);
    if (entry.isDirectory()) out.push(...eplFiles(path.relative(repoRoot, p)));
    else if (entry.name.endsWith('.epl')) out.push(p);
  }
  return out.sort();
}

module.exports = {
  extensionDir,
  repoRoot,
  eplBinary,
  epl,
  vocabulary,
  lexerTokens,
  grammarKeywords,
  loadGrammar,
  tokenize,
  scopesAt,
  utf16Column,
  eplFiles,
};
