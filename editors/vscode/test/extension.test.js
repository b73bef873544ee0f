// The extension as VS Code loads it: its manifest, language configuration and snippets, and
// extension.js run against a stand-in `vscode` module (it starts `epl lsp` when an `epl`
// program is found, and stays with highlighting only when none is).
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('fs');
const os = require('os');
const path = require('path');
const Module = require('module');
const h = require('./helpers');

const manifest = JSON.parse(fs.readFileSync(path.join(h.extensionDir, 'package.json'), 'utf8'));
const readJson = (p) => JSON.parse(fs.readFileSync(path.join(h.extensionDir, p), 'utf8'));

test('the manifest names files that exist and agree with each other', () => {
  assert.ok(fs.existsSync(path.join(h.extensionDir, manifest.main)));
  const [language] = manifest.contributes.languages;
  assert.equal(language.id, 'epl');
  assert.deepEqual(language.extensions, ['.epl']);
  const [grammar] = manifest.contributes.grammars;
  assert.equal(grammar.language, 'epl');
  assert.equal(readJson(grammar.path).scopeName, grammar.scopeName);
  readJson(language.configuration);
  readJson(manifest.contributes.snippets[0].path);
  const settings = Object.keys(manifest.contributes.configuration.properties);
  for (const key of ['epl.path', 'epl.np', 'epl.importPath', 'epl.server.enable']) {
    assert.ok(settings.includes(key), `setting ${key}`);
  }
});

test('the language configuration: comments, brackets and indentation', () => {
  const config = readJson('language-configuration.json');
  assert.equal(config.comments.lineComment, '#');
  assert.deepEqual(config.brackets, [['{', '}'], ['[', ']'], ['(', ')']]);
  const increase = new RegExp(config.indentationRules.increaseIndentPattern);
  const decrease = new RegExp(config.indentationRules.decreaseIndentPattern);
  for (const line of ['model m(x: f32[B, 8]) {', '  replicate {   # stage 0', 'policy {',
    '  split(2) {', '  x = linear(', '  checkpoint = { dir = "a}"']) {
    assert.ok(increase.test(line) || line.endsWith('"a}"'), `indents after: ${line}`);
  }
  for (const line of ['  x = linear(x, 8)', '# model m {', 'x = 1  # {', '}', '  data = text("{")']) {
    assert.ok(!increase.test(line), `does not indent after: ${line}`);
  }
  for (const line of ['}', '  }', '  )']) assert.ok(decrease.test(line), `dedents: ${line}`);
  assert.ok(!decrease.test('  x = y }'));
  const word = new RegExp(config.wordPattern, 'g');
  assert.deepEqual('x = 1f1b + 3e-4 * layer_norm / 25MB'.match(word), ['x', '1f1b', '3e-4', 'layer_norm', '25MB']);
});

// A snippet body with each placeholder at its default (the first choice of a choice).
function expand(body) {
  let text = body.join('\n').replace(/\t/g, '  ');
  for (let i = 0; i < 10 && /\$\{\d+[:|]/.test(text); ++i) {
    text = text.replace(/\$\{\d+:([^${}]*)\}/g, '$1').replace(/\$\{\d+\|([^,|]*)[^|]*\|\}/g, '$1');
  }
  return text.replace(/\$\d+/g, '');
}

test('the snippets expand to scripts that `epl check` accepts', () => {
  const snippets = readJson('snippets/epl.json');
  for (const name of ['model', 'stage', 'split', 'policy', 'train']) {
    assert.ok(snippets[name], `a ${name} snippet`);
  }
  const s = Object.fromEntries(Object.entries(snippets).map(([k, v]) => [k, expand(v.body)]));
  for (const [name, text] of Object.entries(s)) assert.doesNotMatch(text, /\$/, `${name}: ${text}`);
  // A GPT-like model built from the stage and split snippets, then policy and train.
  const gpt = [
    s.import,
    'let vocab = 256, d = 64, heads = 4, layers = 4',
    'model net(tokens: i32[B, 32]) {',
    '  x = embedding(tokens, vocab, d)',
    s.stage,
    'replicate {',
    '  x = transformer_block(x, heads)',
    s.split,
    '}',
    'return loss',
    '}',
    s.policy,
    s.train,
  ].join('\n');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'epl-snippets-'));
  try {
    const files = {
      'gpt.epl': gpt,
      'mlp.epl': [s.model, s.def, 'train net {', '  data = synthetic(samples = 64)', '  batch = 8', '}'].join('\n'),
    };
    for (const [file, text] of Object.entries(files)) {
      fs.writeFileSync(path.join(dir, file), text);
      try {
        h.epl(['check', path.join(dir, file)], { stdio: 'pipe' });
      } catch (e) {
        assert.fail(`${file} from the snippets does not check:\n${text}\n${e.stderr}`);
      }
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

// extension.js with stand-ins for `vscode` and `vscode-languageclient/node`, which it
// requires when it starts a server (so the stand-ins stay in place for the whole file).
let stubs = {};
const realLoad = Module._load;
Module._load = function (request, ...rest) {
  return request in stubs ? stubs[request] : realLoad.call(this, request, ...rest);
};

function loadExtension(settings) {
  const events = { clients: [], lines: [], listeners: [], commands: {}, messages: [], shown: [], requests: [] };
  const vscode = {
    workspace: {
      workspaceFolders: [{ uri: { fsPath: '/work/space' } }],
      getConfiguration: () => ({ get: (key, fallback) => (key in settings ? settings[key] : fallback) }),
      onDidChangeConfiguration: (listener) => {
        events.listeners.push(listener);
        return { dispose() {} };
      },
    },
    window: {
      createOutputChannel: () => ({ appendLine: (l) => events.lines.push(l), dispose() {} }),
      activeTextEditor: settings.editor,
      showInformationMessage: (m) => events.messages.push(m),
      showWarningMessage: (m) => events.messages.push(m),
      showTextDocument: async (doc, options) => events.shown.push({ doc, options }),
    },
    commands: {
      registerCommand: (name, fn) => {
        events.commands[name] = fn;
        return { dispose() {} };
      },
    },
    ViewColumn: { Beside: -2 },
  };
  vscode.workspace.openTextDocument = async (options) => options;
  class LanguageClient {
    constructor(id, name, serverOptions, clientOptions) {
      Object.assign(this, { id, name, serverOptions, clientOptions, stopped: false });
      events.clients.push(this);
    }
    async start() {}
    async stop() { this.stopped = true; }
    async sendRequest(method, params) {
      events.requests.push({ method, params });
      return settings.planReply;
    }
  }
  stubs = { vscode, 'vscode-languageclient/node': { LanguageClient, TransportKind: { stdio: 0 } } };
  const file = require.resolve(path.join(h.extensionDir, 'extension.js'));
  delete require.cache[file];
  return { extension: require(file), events };
}

// A folder holding an executable named `epl`.
function fakeEpl() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'epl-path-'));
  fs.writeFileSync(path.join(dir, 'epl'), '#!/bin/sh\n', { mode: 0o755 });
  fs.writeFileSync(path.join(dir, 'not-executable'), '', { mode: 0o644 });
  return dir;
}

// PATH holding only a fake `epl`, for the rest of test `t`; returns its folder.
function eplOnPath(t) {
  const dir = fakeEpl();
  const savedPath = process.env.PATH;
  process.env.PATH = dir;
  t.after(() => {
    process.env.PATH = savedPath;
    fs.rmSync(dir, { recursive: true, force: true });
  });
  return dir;
}

test('findEpl looks the program up on PATH or takes a path', (t) => {
  const dir = fakeEpl();
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const { extension } = loadExtension({});
  assert.equal(extension.findEpl('epl', { PATH: `/nonexistent${path.delimiter}${dir}` }), path.join(dir, 'epl'));
  assert.equal(extension.findEpl('', { PATH: dir }), path.join(dir, 'epl'));
  assert.equal(extension.findEpl('epl', { PATH: '/nonexistent' }), null);
  assert.equal(extension.findEpl(path.join(dir, 'epl'), { PATH: '' }), path.join(dir, 'epl'));
  assert.equal(extension.findEpl(path.join(dir, 'not-executable'), { PATH: '' }), null);
});

test('with epl on PATH the extension starts `epl lsp` with the settings', async (t) => {
  const dir = eplOnPath(t);
  const { extension, events } = loadExtension({ np: 8, importPath: ['lib', '/abs/more'] });
  const context = { subscriptions: [] };
  await extension.activate(context);
  assert.equal(events.clients.length, 1);
  const [client] = events.clients;
  assert.equal(client.serverOptions.command, path.join(dir, 'epl'));
  // Relative import folders are taken from the workspace folder.
  assert.deepEqual(client.serverOptions.args, ['lsp', '-np', '8', '-I', '/work/space/lib', '-I', '/abs/more']);
  assert.equal(client.serverOptions.options.cwd, '/work/space');
  assert.deepEqual(client.clientOptions.documentSelector.map((d) => d.language), ['epl', 'epl']);
  // A change of an `epl.` setting restarts the server.
  for (const listener of events.listeners) await listener({ affectsConfiguration: (s) => s === 'epl' });
  assert.ok(client.stopped);
  assert.equal(events.clients.length, 2);
  await extension.deactivate();
  assert.ok(events.clients[1].stopped);
});

test('without epl the extension activates with highlighting only', async (t) => {
  const savedPath = process.env.PATH;
  process.env.PATH = '/nonexistent';
  t.after(() => { process.env.PATH = savedPath; });
  const { extension, events } = loadExtension({});
  await extension.activate({ subscriptions: [] });
  assert.equal(events.clients.length, 0);
  assert.ok(events.lines.some((l) => l.includes('highlighting and snippets only')), events.lines.join('\n'));
  await extension.deactivate();
});

test('epl.server.enable = false starts no server', async () => {
  const { extension, events } = loadExtension({ 'server.enable': false });
  await extension.activate({ subscriptions: [] });
  assert.equal(events.clients.length, 0);
});

test('EPL: show plan opens the server\'s plan of the active script beside it', async (t) => {
  eplOnPath(t);
  const editor = { document: { languageId: 'epl', uri: { toString: () => 'file:///w/train.epl' } } };
  const planReply = { text: 'plan for model `m` on 8 devices\n', json: { np: 8 } };
  const { extension, events } = loadExtension({ editor, planReply });
  await extension.activate({ subscriptions: [] });
  assert.equal(typeof events.commands['epl.showPlan'], 'function');
  assert.ok(manifest.contributes.commands.some((c) => c.command === 'epl.showPlan' && c.title === 'EPL: show plan'));
  await events.commands['epl.showPlan']();
  assert.deepEqual(events.requests, [{ method: 'epl/plan', params: { textDocument: { uri: 'file:///w/train.epl' } } }]);
  assert.equal(events.shown.length, 1);
  assert.equal(events.shown[0].doc.content, planReply.text);
  assert.equal(events.shown[0].options.viewColumn, -2);
  await extension.deactivate();
});

test('EPL: show plan says why when there is no plan', async (t) => {
  eplOnPath(t);
  const editor = { document: { languageId: 'epl', uri: { toString: () => 'file:///w/bad.epl' } } };
  const planReply = { text: null, json: null, reason: 'the script has errors: fix them first (the Problems panel)' };
  const { extension, events } = loadExtension({ editor, planReply });
  await extension.activate({ subscriptions: [] });
  await events.commands['epl.showPlan']();
  assert.equal(events.shown.length, 0);
  assert.ok(events.messages.some((m) => m.includes('the script has errors')), events.messages.join('\n'));
  await extension.deactivate();
  // Without a server, the command says what is missing.
  const without = loadExtension({ editor, 'server.enable': false });
  await without.extension.activate({ subscriptions: [] });
  await without.events.commands['epl.showPlan']();
  assert.ok(without.events.messages.some((m) => m.includes('epl.path')), without.events.messages.join('\n'));
});
