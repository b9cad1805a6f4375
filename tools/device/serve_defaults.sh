#!/usr/bin/env bash
# On the GPU machine (run tool), from the repository root, with `.devcarry`
# carried (tools/device/pack_cuda.sh): `agentkv serve --device cuda` as a
# new user starts it (no memory flags) on the Llama-3.2-1B and Qwen3-8B
# shapes, then, over HTTP from a separate process: the start-up pool lines,
# /admin/status's pool, a prompt of PROMPT tokens (default 20,000; the old
# 256 MiB pool refused it) and one larger than the pool (400 before any
# streaming).
#   bash tools/device/serve_defaults.sh [llama1b] [qwen3_8b]
# Logs go to $OUT (or /tmp/serve_defaults).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/serve_defaults}
mkdir -p "$OUT"
source tools/device/cuda_env.sh
shapes=("$@")
[ ${#shapes[@]} -eq 0 ] && shapes=(llama1b)
PROMPT=${PROMPT:-20000}

make_shape() {
  case $1 in
  llama1b)
    [ -d /tmp/llama1b ] && return
    agentkv model synth --arch llama --tokenizer .devcarry/tokenizers/llama3_1 --out /tmp/tpl_llama \
      --layers 1 --hidden 64 --heads 4 --kv-heads 2 >/dev/null
    python3 tools/device/synth_shape.py --template /tmp/tpl_llama --out /tmp/llama1b --layers 16 \
      --hidden 2048 --intermediate 8192 --heads 32 --kv-heads 8 --vocab 128256 --tie >/dev/null ;;
  qwen3_8b)
    [ -d /tmp/qwen3_8b ] && return
    agentkv model synth --arch qwen3 --tokenizer .devcarry/tokenizers/qwen3 --out /tmp/tpl_qwen3 \
      --layers 1 --hidden 64 --heads 4 --kv-heads 2 >/dev/null
    python3 tools/device/synth_shape.py --template /tmp/tpl_qwen3 --out /tmp/qwen3_8b --layers 36 \
      --hidden 4096 --intermediate 12288 --heads 32 --kv-heads 8 --head-dim 128 --vocab 151936 \
      --no-tie >/dev/null ;;
  esac
  # The real models' context (the synthesized template's is smaller).
  python3 - "/tmp/$1/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["max_position_embeddings"] = 131072
json.dump(c, open(sys.argv[1], "w"), indent=1)
PY
}

for shape in "${shapes[@]}"; do
  make_shape "$shape"
  rm -rf "/tmp/store_$shape"
  t0=$(date +%s.%N)
  agentkv serve --model "/tmp/$shape" --device cuda --store "/tmp/store_$shape" --port 8080 \
    >"$OUT/serve_$shape.out" 2>"$OUT/serve_$shape.err" &
  pid=$!
  for _ in $(seq 600); do grep -q "listening on" "$OUT/serve_$shape.out" && break; sleep 0.2; done
  t1=$(date +%s.%N)
  echo "== $shape: listening after $(python3 -c "print(round($t1-$t0,1))") s"
  cat "$OUT/serve_$shape.out"
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
  PYTHONUNBUFFERED=1 python3 - "$PROMPT" <<'PY' 2>&1 | tee "$OUT/requests_$shape.txt"
import json, sys, time, urllib.request, urllib.error
base = "http://127.0.0.1:8080"
def call(method, path, body=None):
    req = urllib.request.Request(base + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
st, body = call("GET", "/admin/status")
eng = json.loads(body)["engine"]
print("admin/status: kv_memory_bytes", eng["kv_memory_bytes"], "sequence_capacity",
      eng["sequence_capacity"], "groups", [(g["attention"], g["total"], g["tokens"]) for g in eng["groups"]])
n = int(sys.argv[1])
words = " ".join("w%d" % (i % 997) for i in range(n // 3))
t = time.time()
st, body = call("POST", "/v1/chat/completions", {"model": "m", "max_tokens": 16, "stream": False,
    "messages": [{"role": "user", "content": words}]})
u = json.loads(body).get("usage", body[:300]) if st == 200 else body[:300]
print("prompt of ~%d tokens: HTTP %d in %.2f s, usage %s" % (n, st, time.time() - t, u))
cap = eng["sequence_capacity"]
if cap < 3_000_000:
    huge = " ".join("w%d" % (i % 997) for i in range(min(cap, 130000)))
    st, body = call("POST", "/v1/chat/completions", {"model": "m", "max_tokens": 4, "stream": True,
        "messages": [{"role": "user", "content": huge}]})
    print("prompt beyond the pool or context: HTTP %d %s" % (st, body[:200]))
PY
  kill -TERM $pid; wait $pid; echo "serve exit $?"
done
