#!/usr/bin/env bash
# Packs the CUDA build for the GPU machine into .devcarry/ (git-ignored):
# the agentkv binary, the load generator, the CUDA test and benchmark binaries (stripped), the shared
# libraries they need that a bare machine may lack (not the CUDA libraries:
# cuBLAS and NCCL are hundreds of MB and the GPU machine's toolkit has them; see
# tools/device/cuda_env.sh), and the Llama 3.1 and Qwen3 tokenizers.
#   tools/device/pack_cuda.sh [build-cuda]
# Carry `.devcarry` in the run call; there: source tools/device/cuda_env.sh
# (which unpacks it).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build-cuda}
rm -rf .devcarry && mkdir -p .devcarry/lib .devcarry/bin .devcarry/tokenizers
bins=("$BUILD/agentkv" "$BUILD"/engine_backend_cuda_*_test "$BUILD"/dev_cuda_*_test "$BUILD"/cuda_*_bench
      "$BUILD/tools/loadgen/agentkv-loadgen")
# PACK_TESTS="a b": only the test/bench binaries whose names contain one of
# the words (the agentkv binary and the load generator always): every CUDA
# test together passes the carry limit.
if [ -n "${PACK_TESTS:-}" ]; then
  keep=()
  for b in "${bins[@]}"; do
    case "$(basename "$b")" in agentkv|agentkv-loadgen) keep+=("$b"); continue ;; esac
    for w in $PACK_TESTS; do [[ "$(basename "$b")" == *"$w"* ]] && { keep+=("$b"); break; }; done
  done
  bins=("${keep[@]}")
fi
for b in "${bins[@]}"; do
  strip -o ".devcarry/bin/$(basename "$b")" "$b"
  ldd "$b" | awk '/=> \//{print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;
      libcublas*|libcuda.so*|libcudart*|libnccl*) ;;  # from the GPU machine's toolkit
      *) [ -e ".devcarry/lib/$(basename "$lib")" ] || cp -L "$lib" .devcarry/lib/ ;;
    esac
  done
done
for t in llama3_1 qwen3; do cp -r "data/tokenizers/$t" .devcarry/tokenizers/; done
# One compressed archive: the carry limit is 64 MiB with the working tree.
tar -C .devcarry -czf /tmp/agentkv-devcarry.tgz bin lib tokenizers
rm -rf .devcarry/bin .devcarry/lib .devcarry/tokenizers
mv /tmp/agentkv-devcarry.tgz .devcarry/pack.tgz
du -sh .devcarry
