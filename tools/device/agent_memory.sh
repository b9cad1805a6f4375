#!/usr/bin/env bash
# On the GPU machine (run tool), from the repository root, with `.devcarry`
# carried (tools/device/pack_cuda.sh): agents over HTTP as users run them.
# `agentkv serve --device cuda` with default flags on the Llama-3.2-1B shape
# (context 131,072), then agentkv-loadgen (a separate process, streaming):
# 64 agents x 3 turns (512-token first prompt, 128 output tokens) greedy and
# at temperature 1, then a restart (SIGTERM flushes the store) and the same
# greedy agents again. ENGINE_TOK_S: `bench engine` c64 on this card, for
# the ratio. Logs and JSON go to $OUT (or /tmp/agent_memory).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/agent_memory}
mkdir -p "$OUT"
source tools/device/cuda_env.sh
ENGINE=${ENGINE_TOK_S:+--engine-tok-s $ENGINE_TOK_S}
# SHAPE=8b: the Qwen3-8B shape instead (made by resume_tiers.sh).
if [ "${SHAPE:-1b}" = 8b ]; then
  [ -d /tmp/qwen3_8b ] || bash tools/device/resume_tiers.sh none
  M=/tmp/qwen3_8b
else
M=/tmp/llama1b
fi
if [ ! -d $M ]; then
  agentkv model synth --arch llama --tokenizer .devcarry/tokenizers/llama3_1 --out /tmp/tpl_llama \
    --layers 1 --hidden 64 --heads 4 --kv-heads 2 >/dev/null
  python3 tools/device/synth_shape.py --template /tmp/tpl_llama --out $M --layers 16 \
    --hidden 2048 --intermediate 8192 --heads 32 --kv-heads 8 --vocab 128256 --tie >/dev/null
fi
python3 - <<'PY'
import json
import os
for p in ("/tmp/llama1b/config.json", "/tmp/qwen3_8b/config.json"):
    if os.path.exists(p):
        c = json.load(open(p)); c["max_position_embeddings"] = 131072; json.dump(c, open(p, "w"), indent=1)
PY
STORE=/tmp/agent_memory_store
rm -rf $STORE
start() {  # $1: log tag
  local t0; t0=$(date +%s.%N)
  agentkv serve --model $M --device cuda --store $STORE --port 8080 >"$OUT/serve_$1.out" 2>"$OUT/serve_$1.err" &
  PID=$!
  for _ in $(seq 900); do grep -q "listening on" "$OUT/serve_$1.out" && break; sleep 0.2; done
  echo "== serve ($1): listening after $(python3 -c "import time;print(round(time.time()-$t0,1))") s"
  cat "$OUT/serve_$1.out"
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
}
stop() { kill -TERM $PID; wait $PID; echo "serve exit $?"; }
lg() {  # $1: tag, rest: loadgen flags
  local tag=$1; shift
  agentkv-loadgen --url http://127.0.0.1:8080 --agents 64 --prompt-tokens 512 --output-tokens 128 \
    --turns 3 $ENGINE "$@" >"$OUT/lg_$tag.txt" 2>&1
  echo "== loadgen $tag ($*): rc=$?"; cat "$OUT/lg_$tag.txt"
}
start first
lg greedy --seed 7 --session-prefix g
lg temp1 --seed 8 --session-prefix t --temperature 1
curl -s http://127.0.0.1:8080/admin/status | python3 -c "import json,sys; j=json.load(sys.stdin); e=j['engine']; print('status:', {k: e[k] for k in ('kv_memory_bytes','sequence_capacity','preemptions')}, 'host_kv', e.get('host_kv'), 'resume', j['agents']['resume_sources'])"
stop
start restart
lg greedy_after_restart --seed 7 --session-prefix g
curl -s http://127.0.0.1:8080/admin/status | python3 -c "import json,sys; j=json.load(sys.stdin); print('resume', j['agents']['resume_sources'])"
stop
