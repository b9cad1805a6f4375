#!/usr/bin/env bash
# On the GPU machine (run tool), from the repository root, with `.devcarry`
# carried (tools/device/pack_cuda.sh): FP8 KV against bf16 KV, no rebuild.
#   bash tools/device/fp8_compare.sh [tests] [sanitize] [sass] [kernels] [1b] [8b] [profile]
# tests:    the fp8 CUDA tests (the mma.sync kernel's fp8 loader and the
#           portable kernel against the dequantized reference, quantize and
#           store bit for bit, the routing, the backend's fp8 cache against
#           the CPU's) and the bf16 attention tests beside them
# sanitize: the fp8 attention tests under compute-sanitizer memcheck (an
#           illegal instruction or address is reported with its kernel,
#           SASS offset and source line: the build has -lineinfo)
# sass:     per mma.sync attention kernel (cuobjdump of the fp8 tile test
#           binary): its trap (BPT) count and each form of its cp.async
#           (LDGSTS) instructions with how many there are (the CPU test
#           engine_backend_cuda_kernels_flash_attention_sass_test checks the encodings)
# kernels:  bench/cuda_attention_bench.cc: one layer's attention at a 32k
#           context, bf16 against fp8, decode (K/V GB/s) and the last 2k
#           chunk of a 32k prompt (TFLOP/s), 1b and 8b head shapes
# 1b, 8b:   for each model shape (1b: Llama-3.2-1B, 8b: Qwen3-8B; made by
#           tools/device/resume_tiers.sh or here): `bench engine` with default
#           flags but --kv-dtype, at 64 agents (512 + 128 tokens), decode at a
#           32k-token context (one agent, 32768 + 256), and the KV pool
#           `serve` sizes with no memory flag (tokens resident at once);
#           fp8 runs the lean decode form (the default); fp8old: fp8 with
#           AGENTKV_CUDA_FP8_DECODE_LEAN=0 (the old form, at most 32
#           splits), benches only.
# profile:  per-kernel times (ncu) of two decode steps at a 32k-token
#           context, 1b shape, bf16 and fp8 (no graphs): the attention and
#           combine kernels against the roofline of docs/kv-fp8.md (KV bytes
#           of a step: 1.07 GB bf16, 0.57 GB fp8).
# No stage named: tests kernels 1b 8b. Logs and JSON go to $OUT (or /tmp/fp8_compare).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/fp8_compare}
mkdir -p "$OUT"
source tools/device/cuda_env.sh
stages=("$@"); [ ${#stages[@]} -eq 0 ] && stages=(tests kernels 1b 8b)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
# name filter: test binary and gtest filter.
fp8_tests=("engine_backend_cuda_kernels_fp8_kv_tile_test:*"
           "engine_backend_cuda_kernels_fp8_kv_test:*"
           "engine_backend_cuda_kernels_mma_attention_layout_test:*"
           "engine_backend_cuda_kernels_flash_attention_sass_test:*"
           "engine_backend_cuda_kernels_kv_route_test:*" "engine_backend_cuda_backend_fp8_test:*"
           "engine_backend_cuda_kernels_attention_test:*Attention*")
for st in "${stages[@]}"; do
  case $st in
  tests|sanitize)
    for tf in "${fp8_tests[@]}"; do
      t=${tf%%:*} f=${tf#*:}
      [ "$st" = sanitize ] && case $t in *fp8_kv*) ;; *) continue ;; esac
      run=(".devcarry/bin/$t" --gtest_filter="$f")
      [ "$st" = sanitize ] && run=(compute-sanitizer --tool memcheck --error-exitcode 9 "${run[@]}")
      if "${run[@]}" >"$OUT/${st}_$t.log" 2>&1; then r=pass; else r=FAIL; fi
      echo "== $st $t ($f): $r: $(grep -E -o '^\[  (PASSED|SKIPPED|FAILED)  \] [0-9]+ tests?' "$OUT/${st}_$t.log" | tr '\n' ' ')"
      grep -E "rel err|FAILED|Failure|ERROR SUMMARY|error|Illegal|Invalid|Misaligned|Out of range|^=+ +at " \
        "$OUT/${st}_$t.log" | head -40
    done
    continue ;;
  sass)
    cuobjdump -sass .devcarry/bin/engine_backend_cuda_kernels_fp8_kv_tile_test >"$OUT/sass_fp8_tile.txt" 2>&1
    awk '/Function :/ {f = $3} f ~ /MmaAttention/ && /BPT|TRAP/ {print f, "TRAP"}
         f ~ /MmaAttention/ && /LDGSTS/ {l = $0; sub(/.*LDGSTS/, "LDGSTS", l); sub(/ *;.*/, "", l);
           gsub(/R[0-9]+/, "R", l); gsub(/0x[0-9a-f]+/, "imm", l); print f, l}' \
      "$OUT/sass_fp8_tile.txt" | sort | uniq -c | tee "$OUT/sass_ldgsts.txt"
    continue ;;
  kernels)
    .devcarry/bin/cuda_attention_bench --benchmark_out="$OUT/attention_bench.json" \
      --benchmark_out_format=json 2>&1 | tee "$OUT/attention_bench.txt" | grep -E "decode|prefill"
    continue ;;
  profile)
    [ -d /tmp/llama1b ] || bash tools/device/resume_tiers.sh none
    for dt in bf16 fp8; do
      # The backend profiles its 20th and 21st decode steps of one row.
      AGENTKV_CUDA_PROFILE_BATCH=1 AGENTKV_CUDA_GRAPHS=0 timeout 400 ncu --profile-from-start off \
        --clock-control none --metrics gpu__time_duration.sum --csv \
        agentkv bench engine --model /tmp/llama1b --device cuda --kv-dtype $dt --prompt 32768 \
        --output 40 --concurrency 1 >"$OUT/ncu32k_$dt.csv" 2>"$OUT/ncu32k_$dt.err"
      echo "== profile 32k $dt rc=$?"
      python3 tools/device/kernel_times.py "$OUT/ncu32k_$dt.csv" --steps 2 | tee "$OUT/kernels32k_$dt.md" | head -12
    done
    continue ;;
  esac
  case $st in 1b) M=/tmp/llama1b ;; 8b) M=/tmp/qwen3_8b ;; *) echo "unknown stage $st"; continue ;; esac
  [ -d /tmp/llama1b ] && [ -d /tmp/qwen3_8b ] || bash tools/device/resume_tiers.sh none
  for dt in bf16 fp8 fp8old; do
    kv=${dt%old} lean=1
    [ "$dt" = fp8old ] && lean=0
    export AGENTKV_CUDA_FP8_DECODE_LEAN=$lean
    agentkv bench engine --model $M --device cuda --kv-dtype $kv --prompt 512 --output 128 \
      --concurrency 64 --json >"$OUT/c64_${st}_$dt.json" 2>"$OUT/c64_${st}_$dt.err"
    echo "== $st $dt c64 rc=$?: $(python3 -c "import json,sys; j=json.load(open('$OUT/c64_${st}_$dt.json')); print([(l.get('concurrency'), round(l.get('output_tok_s', 0))) for l in j.get('levels', [])])" 2>&1 | tail -1)"
    agentkv bench engine --model $M --device cuda --kv-dtype $kv --prompt 32768 --output 256 \
      --concurrency 1 --json >"$OUT/ctx32k_${st}_$dt.json" 2>"$OUT/ctx32k_${st}_$dt.err"
    echo "== $st $dt 32k rc=$?: $(python3 -c "import json; l=json.load(open('$OUT/ctx32k_${st}_$dt.json'))['levels'][0]; print('ttft %.3f s, decode %.1f tok/s at 32k' % (l['mean_ttft_ms']/1e3, l['output_tokens']/(l['seconds']-l['mean_ttft_ms']/1e3)))" 2>&1 | tail -1)"
    [ "$dt" = fp8old ] && continue  # (the pool is the fp8 one)
    agentkv serve --model $M --device cuda --kv-dtype $kv --store none --port 8181 >"$OUT/serve_${st}_$dt.out" 2>&1 &
    pid=$!
    for _ in $(seq 600); do grep -q "listening on" "$OUT/serve_${st}_$dt.out" && break; sleep 0.2; done
    grep -E "KV pool|group" "$OUT/serve_${st}_$dt.out"
    kill -TERM $pid; wait $pid
  done
  unset AGENTKV_CUDA_FP8_DECODE_LEAN
done
