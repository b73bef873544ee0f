// The extension packs into a .vsix with @vscode/vsce: the manifest, grammar, snippets,
// language configuration, extension.js and the language client, and no tests.
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('fs');
const os = require('os');
const path = require('path');
const { execFileSync } = require('child_process');
const h = require('./helpers');

// The names in a zip file's central directory.
function zipEntries(file) {
  const zip = fs.readFileSync(file);
  const end = zip.lastIndexOf(Buffer.from([0x50, 0x4b, 0x05, 0x06]));
  assert.ok(end >= 0, 'not a zip file');
  const count = zip.readUInt16LE(end + 10);
  let at = zip.readUInt32LE(end + 16);
  const names = [];
  for (let i = 0; i < count; ++i) {
    assert.equal(zip.readUInt32LE(at), 0x02014b50, 'a broken central directory');
    const nameLength = zip.readUInt16LE(at + 28);
    const extra = zip.readUInt16LE(at + 30) + zip.readUInt16LE(at + 32);
    names.push(zip.slice(at + 46, at + 46 + nameLength).toString('utf8'));
    at += 46 + nameLength + extra;
  }
  return names;
}

test('vsce packages the extension', (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'epl-vsix-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const out = path.join(dir, 'epl.vsix');
  const vsce = path.join(h.extensionDir, 'node_modules', '@vscode', 'vsce', 'vsce');
  execFileSync(process.execPath, [vsce, 'package', '--skip-license', '--allow-missing-repository',
    '--out', out], { cwd: h.extensionDir, stdio: 'pipe' });
  const size = fs.statSync(out).size;
  assert.ok(size < 2 << 20, `the .vsix is ${size} bytes`);
  const names = zipEntries(out);
  for (const want of ['extension/package.json', 'extension/extension.js', 'extension/readme.md',
    'extension/language-configuration.json', 'extension/syntaxes/epl.tmLanguage.json',
    'extension/snippets/epl.json', 'extension/node_modules/vscode-languageclient/node.js',
    'extension/node_modules/vscode-languageclient/lib/node/main.js']) {
    assert.ok(names.includes(want), `${want} is not in the .vsix`);
  }
  for (const name of names) {
    assert.ok(!name.startsWith('extension/test/'), `${name} should not be packaged`);
    assert.ok(!name.includes('node_modules/vscode-textmate/') && !name.includes('node_modules/@vscode/vsce/'),
      `${name}: development packages should not be packaged`);
  }
});
