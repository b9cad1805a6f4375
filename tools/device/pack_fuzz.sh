#!/usr/bin/env bash
# Packs the libFuzzer targets (built by scripts/fuzz.sh, clang + ASan +
# UBSan) for a long fuzzing run on the GPU machine's CPU cores
# (tools/device/fuzz_device.sh) into .devcarry-fuzz/ (git-ignored): the
# stripped targets, an agentkv binary (to synthesize the default model
# there, as scripts/setup.sh does), the shared libraries they need that a
# bare machine may lack, and every tokenizer under data/tokenizers.
#   tools/device/pack_fuzz.sh [fuzz-build-dir] [agentkv-binary]
# The targets read data from the AGENTKV_DATA_DIR they were built with:
# give it to fuzz_device.sh as FUZZ_DATA_DIR when it is not this checkout's.
set -euo pipefail
cd "$(dirname "$0")/../.."
FUZZ=${1:-build-fuzz}
AGENTKV=${2:-build/agentkv}
D=.devcarry-fuzz
rm -rf $D && mkdir -p $D/bin $D/lib
for b in "$FUZZ"/fuzz/*_fuzz "$AGENTKV"; do
  strip -o "$D/bin/$(basename "$b")" "$b"
  ldd "$b" | awk '/=> \//{print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;
      libcublas*|libcuda.so*|libcudart*|libnccl*) ;;  # from the GPU machine's toolkit
      *) [ -e "$D/lib/$(basename "$lib")" ] || cp -L "$lib" $D/lib/ ;;
    esac
  done
done
cp -rL data/tokenizers $D/tokenizers
# xz with a large dictionary: the five request-parsing targets are nearly
# the same binary, so the pack fits the carry limit (~28 MB from ~240 MB).
tar -C $D -cf - bin lib tokenizers | xz -9 -T2 >/tmp/agentkv-devfuzz.txz
rm -rf $D/bin $D/lib $D/tokenizers
mv /tmp/agentkv-devfuzz.txz $D/pack.txz
du -sh $D
