#!/usr/bin/env bash
# On the GPU machine: two packed builds (tools/device/pack_cuda.sh, each
# carried as its own folder) run the same `agentkv bench engine` command in
# turn, ROUNDS times, on the Llama-3.2-1B shape, so that the comparison is
# made on one machine in one call:
#   ROUNDS=3 ARGS='--concurrency 1,64' bash tools/device/ab_bench.sh .devcarry-base .devcarry
# (OUTPUT=1 ARGS='--concurrency 64 --max-step-tokens 8192' for the prefill
# bench.)
# A variant may also be the same build with environment settings:
# `.devcarry:AGENTKV_CUDA_GEMM_TUNE=0` (settings separated by commas) runs
# .devcarry's binary with them, so a switch is compared against its default
# without a second pack:
#   bash tools/device/ab_bench.sh .devcarry .devcarry:AGENTKV_CUDA_GEMM_TUNE=0
# Prints per run each level's output tok/s and mean device ms a step; the
# JSON goes to $OUT/ab_<label>_<round>.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ab}
mkdir -p "$OUT"
ROUNDS=${ROUNDS:-3}
ARGS=${ARGS:---concurrency 1,64}
OUTPUT=${OUTPUT:-128}
variants=("$@")
packs=()
for v in "${variants[@]}"; do
  p=${v%%:*}
  packs+=("$p")
  [ -d "$p/bin" ] || tar -C "$p" -xzf "$p/pack.tgz"
done
source tools/device/cuda_env.sh
if [ ! -d /tmp/llama1b ]; then
  "${packs[0]}/bin/agentkv" model synth --arch llama --tokenizer "${packs[0]}/tokenizers/llama3_1" \
    --out /tmp/tpl_llama --layers 1 --hidden 64 --heads 4 --kv-heads 2 >/dev/null
  python3 tools/device/synth_shape.py --template /tmp/tpl_llama --out /tmp/llama1b --layers 16 \
    --hidden 2048 --intermediate 8192 --heads 32 --kv-heads 8 --vocab 128256 --tie >/dev/null
fi
for r in $(seq 1 "$ROUNDS"); do
  for v in "${variants[@]}"; do
    p=${v%%:*}
    settings=()
    label=$(basename "$p")
    if [ "$v" != "$p" ]; then
      IFS=, read -r -a settings <<<"${v#*:}"
      label="$label-$(printf '%s' "${v#*:}" | tr -c 'A-Za-z0-9_=.-' '_')"
    fi
    # shellcheck disable=SC2086
    env "${settings[@]}" LD_LIBRARY_PATH="$PWD/$p/lib:$LD_LIBRARY_PATH" "$p/bin/agentkv" bench engine \
      --model /tmp/llama1b --device cuda --prompt 512 --output "$OUTPUT" $ARGS --json \
      >"$OUT/ab_${label}_$r.json" 2>"$OUT/ab_${label}_$r.err"
    python3 - "$OUT/ab_${label}_$r.json" "$label" "$r" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
levels = d.get("levels", d) if isinstance(d, dict) else d
out = []
for lv in (levels if isinstance(levels, list) else []):
    b = lv.get("batched", lv)
    prompt = d.get("prompt_tokens", 0) * lv.get("requests", 0) / b["seconds"]
    out.append(f"c{lv.get('concurrency')} {b['output_tok_s']:.0f} tok/s {b['mean_device_ms']:.3f} ms"
               f" (prompt {prompt:.0f} tok/s)")
print(f"round {sys.argv[3]} {sys.argv[2]}: " + "; ".join(out))
PY
  done
done
