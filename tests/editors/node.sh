#!/usr/bin/env bash
# Runs the editor tests (editors/vscode/test) with the machine's Node.js and npm.
#   node.sh install DIR         npm ci in DIR, skipped when node_modules matches package-lock.json
#   node.sh test DIR FILE...    node --test FILE... in DIR
# Without Node.js or npm it fails loudly: these tests are never skipped in silence.
set -euo pipefail
mode=$1
dir=$2
shift 2
for tool in node npm; do
  if ! command -v "$tool" >/dev/null; then
    echo "error: \`$tool\` not found: the editor tests need Node.js and npm (bash tools/setup.sh installs them)" >&2
    exit 1
  fi
done
case $mode in
install)
  stamp=$dir/node_modules/.epl-npm-ci
  want=$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)
  # One install at a time (two build folders may test at once); the lock file is only read.
  exec 9<"$dir/package-lock.json"
  flock 9
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "editors/vscode/node_modules matches package-lock.json"
    exit 0
  fi
  npm ci --prefix "$dir" --no-audit --no-fund --prefer-offline
  echo "$want" >"$stamp"
  ;;
test)
  cd "$dir"
  exec node --test "$@"
  ;;
*)
  echo "usage: node.sh install DIR | node.sh test DIR FILE..." >&2
  exit 2
  ;;
esac
