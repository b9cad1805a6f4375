#!/usr/bin/env bash
# On the GPU machine (run tool), from the repository root, with `.devcarry`
# carried (tools/device/pack_cuda.sh): FP8 KV against bf16 KV with default
# flags but the dtype. For each model shape (1b: Llama-3.2-1B, 8b:
# Qwen3-8B; made by tools/device/resume_tiers.sh or here): `bench engine`
# at 64 agents (512 + 128 tokens), decode at a 32k-token context (one agent,
# 32768 + 256), and the KV pool `serve` sizes with no memory flag (tokens
# resident at once). Logs and JSON go to $OUT (or /tmp/fp8_compare).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/fp8_compare}
mkdir -p "$OUT"
source tools/device/cuda_env.sh
[ -d /tmp/llama1b ] && [ -d /tmp/qwen3_8b ] || bash tools/device/resume_tiers.sh none
stages=("$@"); [ ${#stages[@]} -eq 0 ] && stages=(1b 8b)
for st in "${stages[@]}"; do
  case $st in 1b) M=/tmp/llama1b ;; 8b) M=/tmp/qwen3_8b ;; *) continue ;; esac
  for dt in bf16 fp8; do
    agentkv bench engine --model $M --device cuda --kv-dtype $dt --prompt 512 --output 128 \
      --concurrency 64 --json >"$OUT/c64_${st}_$dt.json" 2>"$OUT/c64_${st}_$dt.err"
    echo "== $st $dt c64 rc=$?: $(python3 -c "import json,sys; j=json.load(open('$OUT/c64_${st}_$dt.json')); print([(l.get('concurrency'), round(l.get('output_tok_s', 0))) for l in j.get('levels', [])])" 2>&1 | tail -1)"
    agentkv bench engine --model $M --device cuda --kv-dtype $dt --prompt 32768 --output 256 \
      --concurrency 1 --json >"$OUT/ctx32k_${st}_$dt.json" 2>"$OUT/ctx32k_${st}_$dt.err"
    echo "== $st $dt 32k rc=$?: $(python3 -c "import json; l=json.load(open('$OUT/ctx32k_${st}_$dt.json'))['levels'][0]; print('ttft %.3f s, decode %.1f tok/s at 32k' % (l['mean_ttft_ms']/1e3, l['output_tokens']/(l['seconds']-l['mean_ttft_ms']/1e3)))" 2>&1 | tail -1)"
    agentkv serve --model $M --device cuda --kv-dtype $dt --store none --port 8181 >"$OUT/serve_${st}_$dt.out" 2>&1 &
    pid=$!
    for _ in $(seq 600); do grep -q "listening on" "$OUT/serve_${st}_$dt.out" && break; sleep 0.2; done
    grep -E "KV pool|group" "$OUT/serve_${st}_$dt.out"
    kill -TERM $pid; wait $pid
  done
done
