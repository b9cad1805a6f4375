#!/usr/bin/env bash
# On the GPU machine (run tool), from the repository root, with `.devcarry`
# carried (tools/device/pack_cuda.sh): the disk's own rates, then
# `agentkv bench resume` and/or `agentkv bench server` on the Llama-3.2-1B
# shape.
#   bash tools/device/resume_check.sh [disk] [resume] [resume-warm] [server]
#                                     [server-history] [server-nostore]
# disk:    sequential write (fdatasync) and O_DIRECT read of 2 GiB where the
#          store lives, one stream and 8 streams; fsync latency of small writes
# resume:  bench resume --tokens $TOKENS (default 4096,32768) from a dropped
#          page cache; resume-warm: the same with the page cache kept (a
#          process restart); RESUME_ARGS adds options
# server:  bench server c1,16,64 with the store on; server-history: the store
#          keeps history only (no KV write-behind); server-nostore: no store
#          (SERVER_ARGS adds options)
# Logs and JSON go to $OUT (or /tmp/resume_check).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/resume_check}
STORE_ROOT=${STORE_ROOT:-/tmp/akv}
mkdir -p "$OUT" "$STORE_ROOT"
source tools/device/cuda_env.sh
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(disk resume)

model() {
  [ -d /tmp/llama1b ] && return
  agentkv model synth --arch llama --tokenizer .devcarry/tokenizers/llama3_1 --out /tmp/tpl_llama \
    --layers 1 --hidden 64 --heads 4 --kv-heads 2 >/dev/null
  python3 tools/device/synth_shape.py --template /tmp/tpl_llama --out /tmp/llama1b --layers 16 \
    --hidden 2048 --intermediate 8192 --heads 32 --kv-heads 8 --vocab 128256 --tie >/dev/null
  # The real model's context, so that a 32k-token history fits.
  python3 - <<'EOF'
import json
p = "/tmp/llama1b/config.json"
c = json.load(open(p))
c["max_position_embeddings"] = 131072
json.dump(c, open(p, "w"), indent=1)
EOF
}

for st in "${stages[@]}"; do
  case $st in
  disk)
    df -h "$STORE_ROOT" | tee "$OUT/disk.txt"
    f=$STORE_ROOT/ddtest
    { echo "write 2 GiB, fdatasync:"; dd if=/dev/urandom of=$f.src bs=16M count=8 status=none
      for i in $(seq 16); do cat $f.src; done >/dev/null
      dd if=/dev/zero of=$f bs=16M count=128 conv=fdatasync 2>&1 | tail -1
      echo "read 2 GiB O_DIRECT, 1 stream, 16 MiB requests:"
      dd if=$f of=/dev/null bs=16M iflag=direct 2>&1 | tail -1
      echo "read 2 GiB O_DIRECT, 1 stream, 512 KiB requests:"
      dd if=$f of=/dev/null bs=512K iflag=direct 2>&1 | tail -1
      echo "read 2 GiB O_DIRECT, 8 streams of 256 MiB, 1 MiB requests:"
      t0=$(date +%s.%N)
      for i in $(seq 0 7); do dd if=$f of=/dev/null bs=1M skip=$((i*256)) count=256 iflag=direct status=none & done; wait
      python3 -c "import sys; print('%.2f GB/s' % (2*1024**3/1e9/($(date +%s.%N)-$t0)))"
      echo "fsync latency, 200 x 4 KiB write + fdatasync:"
      python3 - "$STORE_ROOT/fsynctest" <<'EOF'
import os, sys, time
fd = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o644)
ts = []
for i in range(200):
    os.pwrite(fd, os.urandom(4096), i * 4096)
    t = time.perf_counter(); os.fdatasync(fd); ts.append(time.perf_counter() - t)
ts.sort()
print("median %.3f ms, p90 %.3f ms, max %.3f ms" % (ts[100] * 1e3, ts[180] * 1e3, ts[-1] * 1e3))
EOF
    } 2>&1 | tee -a "$OUT/disk.txt"
    rm -f $f $f.src "$STORE_ROOT/fsynctest" ;;
  resume|resume-warm)
    model
    rm -rf "$STORE_ROOT/resume"
    cold=true; [ $st = resume-warm ] && cold=false
    agentkv bench resume --model /tmp/llama1b --device cuda --tokens ${TOKENS:-4096,32768} \
      --cold $cold --store "$STORE_ROOT/resume" --json ${RESUME_ARGS:-} >"$OUT/$st.json" 2>"$OUT/$st.err"
    echo "bench $st rc=$?"; tail -3 "$OUT/$st.err"
    python3 - "$OUT/$st.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
for r in j.get("sizes", [j]):
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})
EOF
    rm -rf "$STORE_ROOT/resume" ;;
  server|server-history|server-nostore)
    model
    rm -rf "$STORE_ROOT/server"
    store=(--store "$STORE_ROOT/server")
    [ $st = server-nostore ] && store=(--store none)
    [ $st = server-history ] && store+=(--store-kv false)
    agentkv bench server --model /tmp/llama1b --device cuda --concurrency ${LEVELS:-1,16,64} \
      --prompt 512 --output 128 --max-batch 64 --http-threads 4 --repeat 3 "${store[@]}" --json \
      ${SERVER_ARGS:-} >"$OUT/$st.json" 2>"$OUT/$st.err"
    echo "bench $st rc=$?"; tail -3 "$OUT/$st.err"
    python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1])), indent=None)[:3000])" "$OUT/$st.json"
    rm -rf "$STORE_ROOT/server" ;;
  esac
done
