#!/usr/bin/env bash
# On the GPU machine (run tool), from the repository root, with `.devcarry`
# carried (tools/device/pack_cuda.sh): where a returning agent's KV comes
# from and what each way costs. `agentkv bench resume` (default flags but
# the sizes) on the Llama-3.2-1B shape (4k and 32k tokens) and the Qwen3-8B
# shape (32k tokens): TTFT resident, from the host tier, from the store with
# the page cache dropped (load everything; restore-or-recompute) and
# re-prefilled; host-to-device GB/s. KV_DTYPE=fp8 runs the same on FP8 KV.
# Logs and JSON go to $OUT (or /tmp/resume_tiers).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/resume_tiers}
mkdir -p "$OUT"
source tools/device/cuda_env.sh
DT=${KV_DTYPE:-bf16}
if [ ! -d /tmp/llama1b ]; then
  agentkv model synth --arch llama --tokenizer .devcarry/tokenizers/llama3_1 --out /tmp/tpl_llama \
    --layers 1 --hidden 64 --heads 4 --kv-heads 2 >/dev/null
  python3 tools/device/synth_shape.py --template /tmp/tpl_llama --out /tmp/llama1b --layers 16 \
    --hidden 2048 --intermediate 8192 --heads 32 --kv-heads 8 --vocab 128256 --tie >/dev/null
fi
if [ ! -d /tmp/qwen3_8b ]; then
  agentkv model synth --arch qwen3 --tokenizer .devcarry/tokenizers/qwen3 --out /tmp/tpl_qwen3 \
    --layers 1 --hidden 64 --heads 4 --kv-heads 2 >/dev/null
  python3 tools/device/synth_shape.py --template /tmp/tpl_qwen3 --out /tmp/qwen3_8b --layers 36 \
    --hidden 4096 --intermediate 12288 --heads 32 --kv-heads 8 --head-dim 128 --vocab 151936 \
    --no-tie >/dev/null
fi
python3 - <<'PY'
import json
for p in ("/tmp/llama1b/config.json", "/tmp/qwen3_8b/config.json"):
    c = json.load(open(p)); c["max_position_embeddings"] = 131072; json.dump(c, open(p, "w"), indent=1)
PY
run() {  # $1: tag, $2: model, $3: sizes
  local t0; t0=$(date +%s)
  agentkv bench resume --model $2 --device cuda --kv-dtype $DT --tokens $3 --store /tmp/akv_resume_$1 \
    --json >"$OUT/resume_$1_$DT.json" 2>"$OUT/resume_$1_$DT.err"
  echo "== $1 $DT ($3): rc=$? in $(( $(date +%s) - t0 )) s"
  rm -rf /tmp/akv_resume_$1
  python3 - "$OUT/resume_$1_$DT.json" <<'PY'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception as e:
    print("no json:", e); sys.exit()
for s in j["sizes"]:
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in s.items()})
PY
  tail -3 "$OUT/resume_$1_$DT.err"
}
stages=("$@"); [ ${#stages[@]} -eq 0 ] && stages=(1b 8b)
for stage in "${stages[@]}"; do
  case $stage in
  1b) run llama1b /tmp/llama1b 4096,32768 ;;
  8b) run qwen3_8b /tmp/qwen3_8b 32768 ;;
  none) ;;
  esac
done
