#!/usr/bin/env bash
# On the GPU machine (run tool), with `.devcarry` carried: where HTTP loses
# throughput against the engine at 64 agents. `bench engine` c64 (512 + 128)
# on the Llama-3.2-1B shape, then `agentkv serve` (default flags; with and
# without --store) and agentkv-loadgen 64 agents x 1 turn (the engine's
# shape), three times each, with /admin/status engine.timing before and
# after (steps, host step seconds, device seconds). Logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/http_gap}
mkdir -p "$OUT"
source tools/device/cuda_env.sh
[ -d /tmp/llama1b ] || bash tools/device/resume_tiers.sh none
M=/tmp/llama1b
agentkv bench engine --model $M --device cuda --prompt 512 --output 128 --concurrency 64 \
  --json >"$OUT/engine.json" 2>"$OUT/engine.err"
python3 - "$OUT/engine.json" <<'PY'
import json, sys
l = json.load(open(sys.argv[1]))["levels"][0]
print("bench engine c64:", {k: l[k] for k in ("output_tok_s", "mean_ttft_ms", "steps", "mean_step_ms", "mean_forward_ms", "mean_device_ms")})
PY
ENG=$(python3 -c "import json; print(json.load(open('$OUT/engine.json'))['levels'][0]['output_tok_s'])")
timing() { curl -s http://127.0.0.1:8080/admin/status | python3 -c "import json,sys; j=json.load(sys.stdin); t=j['engine']['timing']; h=j.get('store', {}).get('history', {}); t.update({'hist_' + k: v for k, v in h.items()}); t['kv_write_yields'] = j.get('store', {}).get('kv_write_yields', 0); print(json.dumps(t))"; }
for store in /tmp/http_gap_store none; do
  rm -rf /tmp/http_gap_store
  agentkv serve --model $M --device cuda --store $store --port 8080 >"$OUT/serve.out" 2>"$OUT/serve.err" &
  PID=$!
  for _ in $(seq 900); do grep -q "listening on" "$OUT/serve.out" && break; sleep 0.2; done
  for i in 1 2 3; do
    t0=$(timing)
    agentkv-loadgen --url http://127.0.0.1:8080 --agents 64 --prompt-tokens 512 --output-tokens 128 \
      --turns 1 --engine-tok-s $ENG --json >"$OUT/lg_${i}.json" 2>"$OUT/lg_${i}.err"
    t1=$(timing)
    python3 - "$OUT/lg_${i}.json" "$t0" "$t1" "$store" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); a = json.loads(sys.argv[2]); b = json.loads(sys.argv[3])
d = {k: b[k] - a[k] for k in a}
t = j["per_turn"][0]
print("store", sys.argv[4], {k: t[k] for k in ("wall_s", "output_tok_s", "ttft_ms", "itl_ms", "errors")}, "ratio", round(j.get("ratio_turn1", 0), 3))
print("   phases ms:", {k: round(v, 1) for k, v in t["phases_ms"].items()}, "engine step time %.1f ms" % (1e3 * d["step_seconds"]))
if d["steps"]:
    print("   engine per step: host %.3f ms, backend calls %.3f ms, device %.3f ms over %d steps" % (
        1e3 * d["step_seconds"] / d["steps"], 1e3 * d["forward_seconds"] / d["steps"],
        1e3 * d["device_seconds"] / d["steps"], d["steps"]))
    print("   engine thread between steps: %.1f ms" % (1e3 * d["between_steps_seconds"]))
if d.get("hist_requests"):
    print("   history: %d appends in %d transactions, mean wait %.1f ms, max so far %.1f ms; KV writes that yielded %d" % (
        d["hist_requests"], d["hist_transactions"], 1e3 * d["hist_wait_seconds"] / d["hist_requests"],
        1e3 * b["hist_max_wait_seconds"], d["kv_write_yields"]))
PY
  done
  kill -TERM $PID; wait $PID
done
