// `epl lsp` driven by a scripted client over stdio: initialize, diagnostics as a broken
// script is opened and fixed, hover, go to definition, document symbols, shutdown and exit.
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('fs');
const os = require('os');
const path = require('path');
const { spawn, spawnSync } = require('child_process');
const h = require('./helpers');

// A minimal LSP client: Content-Length framing, requests by id, notifications kept in order.
class Client {
  constructor(args, cwd) {
    this.proc = spawn(h.eplBinary(), ['lsp', ...args], { cwd, stdio: ['pipe', 'pipe', 'pipe'] });
    this.buffer = Buffer.alloc(0);
    this.nextId = 1;
    this.pending = new Map();
    this.notifications = [];
    this.waiters = [];
    this.stderr = '';
    this.proc.stderr.on('data', (d) => { this.stderr += d; });
    this.proc.stdout.on('data', (d) => this.receive(d));
    this.exited = new Promise((resolve) => this.proc.on('exit', (code) => resolve(code)));
  }

  receive(data) {
    this.buffer = Buffer.concat([this.buffer, data]);
    for (;;) {
      const headerEnd = this.buffer.indexOf('\r\n\r\n');
      if (headerEnd < 0) return;
      const m = /Content-Length: (\d+)/i.exec(this.buffer.slice(0, headerEnd).toString());
      assert.ok(m, 'a message without Content-Length');
      const length = Number(m[1]);
      if (this.buffer.length < headerEnd + 4 + length) return;
      const body = this.buffer.slice(headerEnd + 4, headerEnd + 4 + length).toString('utf8');
      this.buffer = this.buffer.slice(headerEnd + 4 + length);
      this.dispatch(JSON.parse(body));
    }
  }

  dispatch(message) {
    if (message.id !== undefined && message.id !== null && this.pending.has(message.id)) {
      this.pending.get(message.id)(message);
      this.pending.delete(message.id);
    } else if (message.id === null) {
      this.notifications.push({ method: '$error', params: message.error });
    } else {
      this.notifications.push(message);
    }
    this.waiters = this.waiters.filter((w) => !w());
  }

  sendRaw(text) {
    const body = Buffer.from(text, 'utf8');
    this.proc.stdin.write(`Content-Length: ${body.length}\r\n\r\n`);
    this.proc.stdin.write(body);
  }

  send(message) { this.sendRaw(JSON.stringify({ jsonrpc: '2.0', ...message })); }

  // The whole response (result or error).
  call(method, params) {
    const id = this.nextId++;
    const reply = new Promise((resolve) => this.pending.set(id, resolve));
    this.send({ id, method, params });
    return withTimeout(reply, `${method} got no reply`);
  }

  async request(method, params) {
    const reply = await this.call(method, params);
    assert.equal(reply.error, undefined, `${method} failed: ${JSON.stringify(reply.error)}`);
    return reply.result;
  }

  notify(method, params) { this.send({ method, params }); }

  // The next notification of `method` not yet taken.
  next(method) {
    const take = () => {
      const i = this.notifications.findIndex((n) => n.method === method);
      if (i < 0) return null;
      return this.notifications.splice(i, 1)[0];
    };
    return withTimeout(new Promise((resolve) => {
      const found = take();
      if (found) return resolve(found);
      this.waiters.push(() => {
        const n = take();
        if (n) resolve(n);
        return Boolean(n);
      });
    }), `no ${method} notification`);
  }

  async diagnostics(uri) {
    const n = await this.next('textDocument/publishDiagnostics');
    assert.equal(n.params.uri, uri);
    return n.params.diagnostics;
  }
}

function withTimeout(promise, what, ms = 20000) {
  let timer;
  return Promise.race([
    promise.finally(() => clearTimeout(timer)),
    new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(what)), ms); }),
  ]);
}

const uriOf = (p) => 'file://' + p.split(path.sep).map(encodeURIComponent).join('/');
const position = (line, character) => ({ line, character });

// A workspace: a library with a def and a let, and a script whose error sits after a
// string of characters outside the Basic Multilingual Plane (UTF-16 columns differ there).
function workspace() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'epl-lsp-'));
  fs.writeFileSync(path.join(dir, 'lib.epl'), [
    '# A residual feed-forward block.',
    'def block(x: f32[B, T, D], n: int) -> f32[B, T, D] {',
    '  return x + linear(relu(linear(x, n)), D)',
    '}',
    'let hidden = 32',
    '',
  ].join('\n'));
  const lines = [
    'import "lib.epl"',
    'let width = 64, heads = 5',
    'def tag(x: f32[B, T, D], s: str) -> f32[B, T, D] { return x }',
    'model net(x: f32[B, 16, width]) {',
    '  h = block(x, hidden)',
    '  h = tag(h, "𝛼é") a = attention(h, heads)',
    '  split(2) {',
    '    y = linear(a, width)',
    '  }',
    '  return mse(y, x)',
    '}',
    'policy {',
    '  micro_batches = 2',
    '}',
    '',
  ];
  return { dir, main: path.join(dir, 'main.epl'), lib: path.join(dir, 'lib.epl'), lines };
}

test('a session: diagnostics as you type, hover, definition, symbols, shutdown', async (t) => {
  const ws = workspace();
  const broken = ws.lines.join('\n');
  fs.writeFileSync(ws.main, broken);
  const uri = uriOf(ws.main);
  const client = new Client(['-np', '4'], ws.dir);
  // A failed assertion must not leave the server running.
  t.after(() => { client.proc.kill(); fs.rmSync(ws.dir, { recursive: true, force: true }); });

  const init = await client.request('initialize', { processId: null, rootUri: uriOf(ws.dir), capabilities: {} });
  assert.equal(init.capabilities.positionEncoding, 'utf-16');
  assert.equal(init.capabilities.textDocumentSync.change, 1);
  assert.ok(init.capabilities.hoverProvider && init.capabilities.definitionProvider &&
    init.capabilities.documentSymbolProvider);
  assert.equal(init.serverInfo.name, 'epl');
  client.notify('initialized', {});

  // The broken script: the error is the one `epl check` prints, at the `attention` call,
  // in UTF-16 columns (𝛼 is two code units, é one).
  client.notify('textDocument/didOpen', { textDocument: { uri, languageId: 'epl', version: 1, text: broken } });
  const diags = await client.diagnostics(uri);
  assert.equal(diags.length, 1, JSON.stringify(diags));
  const check = spawnSync(h.eplBinary(), ['check', ws.main], { encoding: 'utf8' });
  assert.equal(check.status, 1);
  const firstLine = check.stderr.split('\n')[0];
  assert.equal(`error: ${diags[0].message.split('\n')[0]}`, firstLine);
  assert.equal(diags[0].severity, 1);
  assert.equal(diags[0].source, 'epl');
  const line5 = ws.lines[5];
  const col = line5.indexOf('attention'); // JavaScript indexes strings in UTF-16 code units
  assert.deepEqual(diags[0].range, { start: position(5, col), end: position(5, col + 'attention'.length) });
  assert.ok(check.stderr.includes(`main.epl:6:${[...line5.slice(0, col)].length + 1}`), check.stderr);

  // Fixing it as one types clears the diagnostics.
  const fixedLines = ws.lines.slice();
  fixedLines[1] = 'let width = 64, heads = 4';
  const fixed = fixedLines.join('\n');
  client.notify('textDocument/didChange', {
    textDocument: { uri, version: 2 }, contentChanges: [{ text: fixed }],
  });
  assert.deepEqual(await client.diagnostics(uri), []);

  // Hover on a layer: its signature, shapes, parameters, and where it lands for -np 4.
  const linearAt = position(7, fixedLines[7].indexOf('linear') + 2);
  const hover = await client.request('textDocument/hover', { textDocument: { uri }, position: linearAt });
  const text = hover.contents.value;
  assert.equal(hover.contents.kind, 'markdown');
  assert.match(text, /linear\(x, out, bias = true, tie = none\)/);
  assert.match(text, /x: \[\.\.\., D\] -> \[\.\.\., out\]/);
  assert.match(text, /plan for -np 4: 2 data-parallel × 1 stage × split 2/);
  assert.match(text, /`f32\[B, 16, 64\] -> f32\[B, 16, 64\]`/);
  assert.match(text, /parameters: 4,160 \(`weight f32\[64, 64\]`, `bias f32\[64\]`\)/);
  assert.match(text, /stage 0 \(line 7\): 2 devices, ranks 0-1, 2-3; split\(2\) at line 7: column/);
  assert.deepEqual(hover.range, {
    start: position(7, fixedLines[7].indexOf('linear')),
    end: position(7, fixedLines[7].indexOf('linear') + 6),
  });

  // Hover on a def call: the def as written, its comment, and what the call expanded to.
  const blockHover = await client.request('textDocument/hover',
    { textDocument: { uri }, position: position(4, fixedLines[4].indexOf('block')) });
  assert.match(blockHover.contents.value, /def block\(x: f32\[B, T, D\], n: int\) -> f32\[B, T, D\]/);
  assert.match(blockHover.contents.value, /A residual feed-forward block\./);
  assert.match(blockHover.contents.value, /this call expands to 4 ops/);
  assert.match(blockHover.contents.value, /parameters: 4,192/); // 64*32 + 32 + 32*64 + 64

  // Hover on a policy key: its type, default and meaning.
  const keyHover = await client.request('textDocument/hover',
    { textDocument: { uri }, position: position(12, 4) });
  assert.match(keyHover.contents.value, /\*\*micro_batches\*\* `policy` key/);

  // Go to definition: a def and a let in the imported file, a let and a local here.
  const definition = (line, word, nth = 0) => {
    let character = -1;
    for (let i = 0; i <= nth; ++i) character = fixedLines[line].indexOf(word, character + 1);
    return client.request('textDocument/definition', { textDocument: { uri }, position: position(line, character) });
  };
  assert.deepEqual(await definition(4, 'block'),
    { uri: uriOf(ws.lib), range: { start: position(1, 4), end: position(1, 9) } });
  assert.deepEqual(await definition(4, 'hidden'),
    { uri: uriOf(ws.lib), range: { start: position(4, 4), end: position(4, 10) } });
  assert.deepEqual(await definition(7, 'width'),
    { uri, range: { start: position(1, 4), end: position(1, 9) } });
  assert.deepEqual(await definition(9, 'y'),
    { uri, range: { start: position(7, 4), end: position(7, 5) } });
  assert.deepEqual(await definition(5, 'h', 1),
    { uri, range: { start: position(4, 2), end: position(4, 3) } });
  assert.equal((await definition(0, 'lib.epl')).uri, uriOf(ws.lib));
  assert.equal(await definition(7, 'linear'), null); // a builtin has no definition

  // Document symbols: the outline of the script, with the model's parameters and blocks.
  const symbols = await client.request('textDocument/documentSymbol', { textDocument: { uri } });
  assert.deepEqual(symbols.map((s) => s.name), ['lib.epl', 'width', 'heads', 'tag', 'net', 'policy']);
  const net = symbols.find((s) => s.name === 'net');
  assert.equal(net.kind, 5);
  assert.deepEqual(net.range, { start: position(3, 0), end: position(10, 1) });
  assert.deepEqual(net.selectionRange, { start: position(3, 6), end: position(3, 9) });
  assert.deepEqual(net.children.map((c) => c.name), ['x', 'split(2)']);
  assert.equal(net.children[0].detail, 'f32[B, 16, width]');
  const policy = symbols.find((s) => s.name === 'policy');
  assert.deepEqual(policy.children.map((c) => [c.name, c.detail]), [['micro_batches', '2']]);

  // An unknown request is an error; the server keeps going.
  const unknown = await client.call('textDocument/frobnicate', { textDocument: { uri } });
  assert.equal(unknown.error.code, -32601);

  // Closing the document clears its diagnostics.
  client.notify('textDocument/didClose', { textDocument: { uri } });
  assert.deepEqual(await client.diagnostics(uri), []);

  assert.equal(await client.request('shutdown', null), null);
  const after = await client.call('textDocument/hover', { textDocument: { uri }, position: position(0, 0) });
  assert.equal(after.error.code, -32600);
  client.notify('exit');
  assert.equal(await withTimeout(client.exited, 'the server did not exit'), 0, client.stderr);
});

test('a syntax error, an error in an imported file, and exit without shutdown', async (t) => {
  const ws = workspace();
  const uri = uriOf(ws.main);
  const client = new Client([], ws.dir);
  t.after(() => { client.proc.kill(); fs.rmSync(ws.dir, { recursive: true, force: true }); });
  await client.request('initialize', { processId: null, capabilities: {} });
  client.notify('initialized', {});

  // One syntax error, at the token that is wrong.
  const broken = 'let a = 1\nmodel m(x: f32[B, 4]) {\n  return mse(x x)\n}\n';
  client.notify('textDocument/didOpen', { textDocument: { uri, languageId: 'epl', version: 1, text: broken } });
  let diags = await client.diagnostics(uri);
  assert.equal(diags.length, 1);
  assert.match(diags[0].message, /^expected `,` or `\)`, found a name|^expected/);
  assert.deepEqual(diags[0].range.start, position(2, 15));
  // While the script does not parse, the outline of its last good text stays.
  client.notify('textDocument/didChange', {
    textDocument: { uri, version: 2 }, contentChanges: [{ text: 'let a = 1\nmodel m(x: f32[B, 4]) {\n  return mse(x, x)\n}\n' }],
  });
  assert.deepEqual(await client.diagnostics(uri), []);
  client.notify('textDocument/didChange', { textDocument: { uri, version: 3 }, contentChanges: [{ text: broken }] });
  assert.equal((await client.diagnostics(uri)).length, 1);
  const symbols = await client.request('textDocument/documentSymbol', { textDocument: { uri } });
  assert.deepEqual(symbols.map((s) => s.name), ['a', 'm']);

  // An error inside an imported file is shown on the `import` that brings it in.
  fs.writeFileSync(ws.lib, 'def block(x: f32[B, D]) -> f32[B, D] {\n  return x +\n}\n');
  const importer = 'import "lib.epl"\nmodel m(x: f32[B, 4]) {\n  return mse(block(x), x)\n}\n';
  client.notify('textDocument/didChange', { textDocument: { uri, version: 4 }, contentChanges: [{ text: importer }] });
  diags = await client.diagnostics(uri);
  assert.equal(diags.length, 1);
  assert.deepEqual(diags[0].range, { start: position(0, 7), end: position(0, 16) });
  assert.equal(diags[0].relatedInformation[0].location.uri, uriOf(ws.lib));
  assert.deepEqual(diags[0].relatedInformation[0].location.range.start, position(2, 0));

  // A library (defs, no model) opened on its own is not an error.
  fs.writeFileSync(ws.lib, 'def block(x: f32[B, D]) -> f32[B, D] {\n  return x\n}\n');
  const libUri = uriOf(ws.lib);
  client.notify('textDocument/didOpen', {
    textDocument: { uri: libUri, languageId: 'epl', version: 1, text: fs.readFileSync(ws.lib, 'utf8') },
  });
  assert.deepEqual(await client.diagnostics(libUri), []);

  // A body that is not JSON is answered with a parse error; the server keeps serving.
  client.sendRaw('{not json');
  const parseError = await client.next('$error');
  assert.equal(parseError.params.code, -32700);
  assert.ok(await client.request('textDocument/documentSymbol', { textDocument: { uri } }));

  client.notify('exit');
  assert.equal(await withTimeout(client.exited, 'the server did not exit'), 1);
});

test('typing a script character by character, and hovering every token of every example', async (t) => {
  const ws = workspace();
  const client = new Client([], ws.dir); // one replica of each model: every example plans
  t.after(() => { client.proc.kill(); fs.rmSync(ws.dir, { recursive: true, force: true }); });
  await client.request('initialize', { processId: null, capabilities: {} });
  client.notify('initialized', {});

  // Every prefix of an example, as if typed (in steps of a few characters): the server
  // publishes diagnostics for each and never stops answering.
  const example = fs.readFileSync(path.join(h.repoRoot, 'examples', 'gpt_char.epl'), 'utf8');
  const uri = uriOf(path.join(h.repoRoot, 'examples', 'typed.epl'));
  client.notify('textDocument/didOpen', { textDocument: { uri, languageId: 'epl', version: 0, text: '' } });
  await client.diagnostics(uri);
  let version = 1;
  let diags = null;
  for (let end = 7; end < example.length + 7; end += 7) {
    const text = example.slice(0, end);
    client.notify('textDocument/didChange', { textDocument: { uri, version: version++ }, contentChanges: [{ text }] });
    diags = await client.diagnostics(uri);
    for (const d of diags) assert.ok(d.range.start.line < text.split('\n').length, JSON.stringify(d));
  }
  assert.deepEqual(diags, []); // the whole text is fine

  // Hover, definition and symbols at every token of every example and library file.
  const files = [...h.eplFiles('examples'), ...h.eplFiles('stdlib')];
  const lexed = h.lexerTokens(files);
  const builtins = new Set(h.vocabulary().builtins);
  let hovers = 0;
  for (const file of files) {
    const fileUri = uriOf(file);
    const text = fs.readFileSync(file, 'utf8');
    client.notify('textDocument/didOpen', { textDocument: { uri: fileUri, languageId: 'epl', version: 1, text } });
    assert.deepEqual(await client.diagnostics(fileUri), [], file);
    const lines = text.split('\n');
    const tokens = lexed[file];
    for (const [i, [kind, line, col, word]] of tokens.entries()) {
      const position = { line: line - 1, character: h.utf16Column(lines[line - 1], col) };
      const hover = await client.request('textDocument/hover', { textDocument: { uri: fileUri }, position });
      if (hover) hovers += 1;
      // A call of a builtin always has its signature; in a model that plans, also its plan.
      if (kind === 'ID' && builtins.has(word) && tokens[i + 1] && tokens[i + 1][0] === "'('") {
        assert.ok(hover && hover.contents.value.includes(`${word}(`), `${file}:${line}:${col} ${word}`);
        if (!file.includes('stdlib')) assert.match(hover.contents.value, /plan for one replica/);
      }
      await client.request('textDocument/definition', { textDocument: { uri: fileUri }, position });
    }
    const symbols = await client.request('textDocument/documentSymbol', { textDocument: { uri: fileUri } });
    assert.ok(symbols.length > 0, file);
    client.notify('textDocument/didClose', { textDocument: { uri: fileUri } });
    await client.diagnostics(fileUri);
  }
  assert.ok(hovers > 300, `only ${hovers} hovers answered`);
  assert.equal(await client.request('shutdown', null), null);
  client.notify('exit');
  assert.equal(await withTimeout(client.exited, 'the server did not exit'), 0, client.stderr);
});
