#!/usr/bin/env bash
# Installs what EPL needs from Debian (as root, idempotent), then configures and builds.
# Usage: tools/setup.sh [build-dir] [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential cmake ninja-build ccache pkg-config
      antlr4 libantlr4-runtime-dev libfmt-dev libcli11-dev nlohmann-json3-dev catch2
      libopenmpi-dev openmpi-bin libopenblas-dev zlib1g-dev
      libdnnl-dev                      # oneDNN: the CPU GEMMs (OpenBLAS's without it)
      libedit-dev                      # `epl repl`'s line editing
      clang libclang-rt-14-dev         # the fuzz harnesses (tools/fuzz.sh): libFuzzer
      python3-torch                    # the oracle of the kernel and training tests
      python3-jsonschema librsvg2-bin  # `epl plan --json` against its schema; SVGs rendered
      python3-protobuf protobuf-compiler # `--tensorboard`'s event files read back
      dataset-fashion-mnist fortunes)  # the examples' data: images and English text
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm run the editor tests (editors/vscode); any install that provides them will do.
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

build=${1:-build}
shift || true
# -g1: line tables and function names, enough for profiles and backtraces; full -g (local
# variables' types and places) took 40% more compile time for nothing the build uses.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" "$@" >/dev/null
cmake --build "$build"
