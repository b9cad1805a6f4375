#!/usr/bin/env bash
# On the GPU machine (run tool), from the repository root, with
# `.devcarry-fuzz` carried (tools/device/pack_fuzz.sh): every libFuzzer
# target at once for SECONDS, on the machine's CPU cores, from the
# committed seed corpora (fuzz/corpus/<target>/), with the options of
# scripts/fuzz.sh. The request-parsing targets (which load the default
# model and run a whole ApiService, ~5x slower per input) get JOBS_API
# forked workers each (-fork), the others one. Prints each target's
# executions and crash/timeout/oom counts; logs and any crashing input go
# to $OUT.
#   bash tools/device/fuzz_device.sh [SECONDS]
set -uo pipefail
cd "$(dirname "$0")/../.."
SECONDS_TOTAL=${1:-540}
OUT=${OUT:-/tmp/fuzz_device}
JOBS_API=${JOBS_API:-2}
DATA=${FUZZ_DATA_DIR:-$PWD/data}
mkdir -p "$OUT/artifacts" "$OUT/corpus"
D=$PWD/.devcarry-fuzz
[ -d $D/bin ] || tar -C $D -xJf $D/pack.txz
export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done
# The targets' data: the tokenizers, and the default model made as
# scripts/setup.sh makes it (same arguments, same seed: the same weights).
mkdir -p "$DATA/models"
[ -e "$DATA/tokenizers" ] || ln -s $D/tokenizers "$DATA/tokenizers"
if [ ! -f "$DATA/models/default/config.json" ]; then
  $D/bin/agentkv model synth --arch qwen3 --tokenizer "$DATA/tokenizers/qwen3" \
    --out "$DATA/models/default" --layers 4 --hidden 192 --heads 6 --kv-heads 2 --head-dim 32 \
    --intermediate 512 --max-position 131072 --eos-bias 1.5 --lm-head-std 0.2 --seed 1 >/dev/null
fi
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
nproc
pids=()
for bin in $D/bin/*_fuzz; do
  t=$(basename "$bin")
  jobs=1
  case $t in openai_*|anthropic_*|agents_*) jobs=$JOBS_API ;; esac
  mkdir -p "$OUT/corpus/$t"
  "$bin" -fork="$jobs" -max_total_time="$SECONDS_TOTAL" -timeout=30 -rss_limit_mb=3072 \
    -max_len=16384 -artifact_prefix="$OUT/artifacts/$t-" "$OUT/corpus/$t" "fuzz/corpus/$t" \
    >"$OUT/$t.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
for bin in $D/bin/*_fuzz; do
  t=$(basename "$bin")
  # Fork mode's progress lines: "#EXECS: cov: ... oom/timeout/crash: a/b/c time: Ns ...".
  last=$(grep -E '^#[0-9]+: ' "$OUT/$t.log" | tail -1)
  printf '%-30s %s\n' "$t" "${last:-no progress line: $(tail -2 "$OUT/$t.log" | tr '\n' ' ')}"
done
ls "$OUT/artifacts"
