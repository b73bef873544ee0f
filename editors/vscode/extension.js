// The EPL extension: highlighting and snippets come from package.json; this file starts
// `epl lsp` (diagnostics, hover, go to definition, outline, completion, and the plan behind
// `EPL: show plan`) when an `epl` program is found, and leaves the editor with highlighting
// only when it is not.
'use strict';

const fs = require('fs');
const path = require('path');
const vscode = require('vscode');

let client = null;
let output = null;

// The `epl` program to run: `setting` as a path when it names a folder, else looked up on
// PATH (as a shell would). null when there is none.
function findEpl(setting, env = process.env) {
  const name = setting && setting.trim() ? setting.trim() : 'epl';
  const executable = (p) => {
    try {
      return fs.statSync(p).isFile() && (fs.accessSync(p, fs.constants.X_OK), true);
    } catch {
      return false;
    }
  };
  if (name.includes('/') || name.includes(path.sep)) return executable(name) ? name : null;
  for (const dir of (env.PATH || '').split(path.delimiter)) {
    if (!dir) continue;
    const candidate = path.join(dir, name);
    if (executable(candidate)) return candidate;
  }
  return null;
}

// The command line of the server for the `epl.*` settings. A relative import folder is
// taken from `root` (the first workspace folder), as a terminal there would.
function serverArgs(config, root) {
  const args = ['lsp'];
  const np = config.get('np', 0);
  if (Number.isInteger(np) && np > 0) args.push('-np', String(np));
  for (const dir of config.get('importPath', [])) {
    args.push('-I', root && !path.isAbsolute(dir) ? path.resolve(root, dir) : dir);
  }
  return args;
}

function workspaceRoot() {
  const folders = vscode.workspace.workspaceFolders;
  return folders && folders.length ? folders[0].uri.fsPath : undefined;
}

async function start(context) {
  const config = vscode.workspace.getConfiguration('epl');
  if (!config.get('server.enable', true)) return;
  const epl = findEpl(config.get('path', 'epl'));
  if (!epl) {
    output.appendLine(
      `epl lsp: no \`${config.get('path', 'epl')}\` on PATH; highlighting and snippets only. ` +
        'Set `epl.path` to the epl program for diagnostics, hover and go to definition.');
    return;
  }
  const { LanguageClient, TransportKind } = require('vscode-languageclient/node');
  const root = workspaceRoot();
  const args = serverArgs(config, root);
  const serverOptions = { command: epl, args, transport: TransportKind.stdio, options: { cwd: root } };
  const clientOptions = {
    documentSelector: [
      { scheme: 'file', language: 'epl' },
      { scheme: 'untitled', language: 'epl' },
    ],
    outputChannel: output,
  };
  client = new LanguageClient('epl', 'EPL', serverOptions, clientOptions);
  output.appendLine(`epl lsp: starting ${epl} ${args.join(' ')}`);
  try {
    await client.start();
  } catch (e) {
    output.appendLine(`epl lsp: could not start: ${e && e.message ? e.message : e}`);
    client = null;
  }
}

async function stop() {
  if (!client) return;
  const c = client;
  client = null;
  try {
    await c.stop();
  } catch {
    // already gone
  }
}

// `EPL: show plan`: the plan of the script in the active editor, as `epl plan` prints it for
// the `epl.np` devices, from the server, in an editor beside it.
async function showPlan() {
  const editor = vscode.window.activeTextEditor;
  if (!editor || editor.document.languageId !== 'epl') {
    vscode.window.showInformationMessage('EPL: open an .epl script to see its plan.');
    return;
  }
  if (!client) {
    vscode.window.showWarningMessage(
      'EPL: the plan comes from `epl lsp`, which is not running; set `epl.path` to the epl program.');
    return;
  }
  const reply = await client.sendRequest('epl/plan', {
    textDocument: { uri: editor.document.uri.toString() },
  });
  if (!reply || typeof reply.text !== 'string') {
    vscode.window.showWarningMessage(`EPL: no plan: ${reply && reply.reason ? reply.reason : 'the server gave none'}.`);
    return;
  }
  const doc = await vscode.workspace.openTextDocument({ content: reply.text, language: 'plaintext' });
  await vscode.window.showTextDocument(doc, { viewColumn: vscode.ViewColumn.Beside, preview: true });
}

async function activate(context) {
  output = vscode.window.createOutputChannel('EPL');
  context.subscriptions.push(output);
  context.subscriptions.push(vscode.commands.registerCommand('epl.showPlan', showPlan));
  // A change of epl.path, epl.np or epl.importPath restarts the server with the new command line.
  context.subscriptions.push(
    vscode.workspace.onDidChangeConfiguration(async (e) => {
      if (!e.affectsConfiguration('epl')) return;
      await stop();
      await start(context);
    }));
  await start(context);
}

function deactivate() {
  return stop();
}

module.exports = { activate, deactivate, findEpl, serverArgs, showPlan };
