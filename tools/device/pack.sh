#!/usr/bin/env bash
# Packs a built agentkv binary with the shared libraries it needs that a bare
# GPU machine may lack, into .devcarry/ (git-ignored), so that it can travel
# to the GPU machine and run there: LD_LIBRARY_PATH=.devcarry/lib .devcarry/agentkv
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:-build/agentkv}
rm -rf .devcarry && mkdir -p .devcarry/lib
cp "$BIN" .devcarry/agentkv
ldd "$BIN" | awk '/=> \//{print $3}' | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;
    *) cp -L "$lib" .devcarry/lib/ ;;
  esac
done
du -sh .devcarry
