#!/usr/bin/env bash
# On the GPU machine (run tool), from the repository root, after
# tools/device/pack_cuda.sh here and with `.devcarry` carried:
#   bash tools/device/cuda_check.sh [tests] [sanitize] [hf] [hf8] [hfmoe] [hfquant] [profile] [moebench] [bench] [bench8b] [spec] [overhead]
# tests:    every CUDA test binary (kernels vs CPU references, backend vs CPU)
# sanitize: the same under compute-sanitizer memcheck (kernel tests whole,
#           backend tests on one architecture: the sanitizer is slow)
# hf:       tests/reference/hf_compare.py --device cuda
# hf8:      the same with agentkv's fp8 KV cache (--kv-dtype fp8; not in the
#           default stages)
# hfmoe:    tests/reference/hf_compare.py --device cpu on the mixture-of-experts
#           architectures (gpt_oss, gpt_oss_fixed, qwen3_moe): the CPU backend,
#           which the CUDA backend tests take as their reference, against
#           transformers (not in the default stages)
# hfquant:  tests/reference/hf_compare.py --device cuda on quantized
#           checkpoints (not in the default stages): --quant fp8 (128x128
#           block scales; the dense architectures and qwen3_moe) and --quant
#           mxfp4 (gpt_oss, gpt_oss_fixed), each against transformers' own
#           loader of the checkpoint (FineGrainedFP8Config / Mxfp4Config with
#           dequantize=True) where it has one, else the dequantized weights
#           in float32 (the log and the table's header say which).
#           HFQUANT="fp8 mxfp4" (default) picks the formats (fp8-channel too)
# bench:    copy bandwidth and bf16 matmul peak, then `agentkv bench engine
#           --device cuda` on a Llama-3.2-1B shape (512 prompt + 128 output;
#           concurrency 1..256; prefill) with graphs, and c1/c64 without;
#           the decode GEMM microbenchmark (dev/cuda/cuda_gemm_bench.cc)
# bench8b:  the same on a Qwen3-8B shape at concurrency 1 and 64
# profile:  per-kernel times of decode steps at c1 and c64 (ncu)
# moebench: mixture-of-experts and quantized shapes of MOE_LAYERS (8)
#           layers (not in the default stages): Qwen3-30B-A3B in bf16
#           (qwen3moe_bf16), in fp8 as published (qwen3moe_fp8: attention and
#           experts, 128x128 blocks) and with fp8 experts only
#           (qwen3moe_fp8x: synth_shape --quant fp8-experts), GPT-OSS-20B with
#           MXFP4 experts (gptoss_mxfp4), and, asked for by name, Qwen3-8B in
#           fp8 (qwen3_8b_fp8, all 36 layers); per shape `bench engine` 512 +
#           128 at c1 and c64, the prefill line, the roofline, and the ncu
#           per-kernel times of decode steps at c1 and c64. MOE_SHAPES picks
#           shapes (qwen3moe_bf16 qwen3moe_fp8 gptoss_mxfp4 by default; one
#           per run call if time is short); the checkpoints stay in /tmp for
#           the next call. MOE_COMPARE=1 adds c1/c64 with
#           AGENTKV_CUDA_MOE_GEMV=0 (no GEMV: the tiles for every step;
#           fp8 dense layers dequantized at every step). DEQUANT_COMPARE=1
#           adds c1/c64 and the prefill line with AGENTKV_CUDA_DENSE_DEQUANT=0
#           (fp8 dense layers of many-token steps on the quantized tiles).
# moegemv:  dev/cuda/cuda_moe_gemv_bench (not in the default stages): the
#           decode GEMMs of the MoE and quantized shapes at 1-16 tokens by
#           path (GEMV, tiles), weight GB/s against the copy rate
# spec:     speculative decoding from the context on the Qwen3-8B shape (not in
#           the default stages): tools/specbench's coding-agent workload (a
#           ~2,000-token file in the prompt, the whole file asked back with a
#           few edits; one stream, 1,024 output tokens) against `serve
#           --speculative none` and `ngram`, on the random model (its reply
#           is not the file: drafts mostly fail, what trying costs) and on
#           its cycle copy (tools/specbench/cycle_model.py: greedy output
#           walks cycles of 32 tokens, so drafts are accepted once it has
#           gone round: the speedup at full acceptance); then `bench engine`
#           512 + 128 at c1 and c64, without and with --speculative,
#           alternating, twice (c64 must stay within 3%). SPEC_PARTS picks
#           the parts: "serve batch" by default (each takes minutes on a
#           fresh machine: one call each if time is short); "sanitize" runs
#           the drafted-step backend tests under compute-sanitizer memcheck;
#           "hf" runs hf_compare --device cuda --speculative (greedy with
#           drafts verified against transformers). SPEC_TEMPERATURE=T makes
#           the specbench requests sampled at T (seeded; drafted rows then
#           verified by the sample kernel, no --expect-accept).
# overhead: what logprobs and a json_object grammar cost on the device (not
#           in the default stages): `bench engine` 512 + 128 at c1 and c64 on
#           the Qwen3-8B shape, plain, with --logprobs 5 (logprobs +
#           top_logprobs 5 on every request) and with --response-format
#           json_object (every request masked on the host), alternating,
#           twice; the summary gives each as a ratio of the plain run.
# Logs and JSON go to $OUT (or /tmp/cuda_check); a summary is printed last,
# then the roofline tables (so that the end of the output holds them). The
# run tool brings back at most eight files: BUNDLE=1 packs everything in
# $OUT into $OUT/check.tgz alone.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/cuda_check}
mkdir -p "$OUT"
source tools/device/cuda_env.sh
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(tests sanitize hf bench bench8b)
summary=()
note() { summary+=("$1"); echo "== $1"; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"

for st in "${stages[@]}"; do
  case $st in
  tests)
    for t in .devcarry/bin/engine_backend_cuda_*_test .devcarry/bin/dev_cuda_*_test; do
      if "$t" --gtest_brief=1 >"$OUT/$(basename "$t").log" 2>&1; then r=pass; else r=FAIL; fi
      # --gtest_brief prints no per-test OK lines: the summary lines count.
      note "$(basename "$t"): $r ($(grep -E -o '^\[==========\] [0-9]+ tests?' "$OUT/$(basename "$t").log" | grep -E -o '[0-9]+ tests?' | head -1) run; $(grep -E -o '^\[  (PASSED|SKIPPED|FAILED)  \] [0-9]+ tests?' "$OUT/$(basename "$t").log" | tr '\n' ' '))"
      grep -E "FAILED|Failure|error" "$OUT/$(basename "$t").log" | head -20
    done ;;
  sanitize)
    for t in .devcarry/bin/engine_backend_cuda_kernels_*_test; do
      log="$OUT/sanitize_$(basename "$t").log"
      if compute-sanitizer --tool memcheck --error-exitcode 9 "$t" --gtest_brief=1 >"$log" 2>&1; then
        r=clean
      elif grep -q "terminated before first instrumented API call" "$log" &&
           grep -q "^\[  PASSED  \]" "$log" && ! grep -q "FAILED" "$log"; then
        r="passed, host code only (no CUDA call to check)"  # the sanitizer's exit is not 0 then
      else r=FAIL; fi
      note "compute-sanitizer memcheck $(basename "$t"): $r"; tail -5 "$log"
    done
    if compute-sanitizer --tool memcheck --error-exitcode 9 .devcarry/bin/engine_backend_cuda_backend_test \
        --gtest_brief=1 --gtest_filter='*qwen3*:*gemma3_c6*:*gpt_oss_c7_b4_fixed*:CudaBackend.*' >"$OUT/sanitize_backend.log" 2>&1; then r=clean; else r=FAIL; fi
    note "compute-sanitizer memcheck backend (qwen3, qwen3_moe, gemma3, gpt_oss, CudaBackend.*): $r"; tail -5 "$OUT/sanitize_backend.log"
    if compute-sanitizer --tool racecheck --error-exitcode 9 .devcarry/bin/engine_backend_cuda_kernels_attention_test \
        --gtest_brief=1 --gtest_filter='Shapes/*' >"$OUT/racecheck.log" 2>&1; then r=clean; else r=FAIL; fi
    note "compute-sanitizer racecheck attention: $r"; tail -3 "$OUT/racecheck.log"
    # The MoE kernels share tiles between warps (the plan's scan, the grouped
    # GEMM's staging).
    if compute-sanitizer --tool racecheck --error-exitcode 9 .devcarry/bin/engine_backend_cuda_kernels_moe_test \
        --gtest_brief=1 >"$OUT/racecheck_moe.log" 2>&1; then r=clean; else r=FAIL; fi
    note "compute-sanitizer racecheck moe: $r"; tail -3 "$OUT/racecheck_moe.log"
    # The GEMV's staged rows and the tiles' two stages (quantized too).
    if compute-sanitizer --tool racecheck --error-exitcode 9 .devcarry/bin/engine_backend_cuda_kernels_moe_gemv_test \
        --gtest_brief=1 >"$OUT/racecheck_moe_gemv.log" 2>&1; then r=clean; else r=FAIL; fi
    note "compute-sanitizer racecheck moe_gemv: $r"; tail -3 "$OUT/racecheck_moe_gemv.log" ;;
  hf)
    PYTHONUNBUFFERED=1 python3 tests/reference/hf_compare.py --agentkv .devcarry/bin/agentkv \
      --device cuda --work /tmp/hfcmp --out "$OUT/hf_compare_cuda.md" >"$OUT/hf_compare.log" 2>&1
    note "hf_compare --device cuda: $(tail -1 "$OUT/hf_compare.log")" ;;
  hf8)
    PYTHONUNBUFFERED=1 python3 tests/reference/hf_compare.py --agentkv .devcarry/bin/agentkv \
      --device cuda --kv-dtype fp8 --work /tmp/hfcmp8 --out "$OUT/hf_compare_cuda_fp8.md" \
      >"$OUT/hf_compare_fp8.log" 2>&1
    note "hf_compare --device cuda --kv-dtype fp8: $(tail -1 "$OUT/hf_compare_fp8.log")" ;;
  hfmoe)
    PYTHONUNBUFFERED=1 python3 tests/reference/hf_compare.py --agentkv .devcarry/bin/agentkv \
      --device cpu --archs gpt_oss,gpt_oss_fixed,qwen3_moe --work /tmp/hfcmpmoe --out "$OUT/hf_compare_moe.md" \
      >"$OUT/hf_compare_moe.log" 2>&1
    note "hf_compare --device cpu gpt_oss,gpt_oss_fixed,qwen3_moe: $(tail -1 "$OUT/hf_compare_moe.log")" ;;
  hfquant)
    for q in ${HFQUANT:-fp8 mxfp4}; do
      PYTHONUNBUFFERED=1 python3 tests/reference/hf_compare.py --agentkv .devcarry/bin/agentkv \
        --device cuda --quant "$q" --work /tmp/hfcmpq --out "$OUT/hf_compare_cuda_$q.md" \
        >"$OUT/hf_compare_$q.log" 2>&1
      note "hf_compare --device cuda --quant $q: $(tail -1 "$OUT/hf_compare_$q.log")"
      grep -E "reference:|skipped|FAIL|Error" "$OUT/hf_compare_$q.log" | head -20
    done ;;
  profile)
    # Kernel times of decode steps (no graphs, so each launch is one kernel)
    # through ncu: c1 and c64 on the Llama-3.2-1B shape.
    [ -d /tmp/llama1b ] || { agentkv model synth --arch llama --tokenizer .devcarry/tokenizers/llama3_1 \
        --out /tmp/tpl_llama --layers 1 --hidden 64 --heads 4 --kv-heads 2 >/dev/null &&
      python3 tools/device/synth_shape.py --template /tmp/tpl_llama --out /tmp/llama1b --layers 16 \
        --hidden 2048 --intermediate 8192 --heads 32 --kv-heads 8 --vocab 128256 --tie; }
    for c in 1 64; do
      # The backend starts the profiler at its 20th decode step of c rows
      # and stops it after the 21st (AGENTKV_CUDA_PROFILE_BATCH).
      AGENTKV_CUDA_PROFILE_BATCH=$c AGENTKV_CUDA_GRAPHS=0 timeout 240 ncu --profile-from-start off \
        --clock-control none --metrics gpu__time_duration.sum --csv \
        agentkv bench engine --model /tmp/llama1b --device cuda --prompt 512 \
        --output 40 --concurrency $c >"$OUT/ncu_c$c.csv" 2>"$OUT/ncu_c$c.err"
      python3 tools/device/kernel_times.py "$OUT/ncu_c$c.csv" --steps 2 | tee "$OUT/kernels_c$c.md" | head -25
      note "profile c$c: $(tail -1 "$OUT/kernels_c$c.md")"
    done ;;
  moebench)
    [ -f "$OUT/peak.json" ] || python3 tools/device/copy_bw.py >"$OUT/peak.json"
    note "peak: $(cat "$OUT/peak.json")"
    # Templates for the configs (the qwen3 tokenizer for both: the bench
    # draws token ids, and the gptoss tokenizer is not in the pack).
    agentkv model synth --arch qwen3_moe --tokenizer .devcarry/tokenizers/qwen3 --out /tmp/tpl_qwen3moe \
      --layers 1 --hidden 64 --heads 4 --kv-heads 2 >/dev/null
    agentkv model synth --arch gpt_oss --tokenizer .devcarry/tokenizers/qwen3 --out /tmp/tpl_gptoss \
      --layers 2 --hidden 64 --heads 4 --kv-heads 2 >/dev/null
    agentkv model synth --arch qwen3 --tokenizer .devcarry/tokenizers/qwen3 --out /tmp/tpl_qwen3 \
      --layers 1 --hidden 64 --heads 4 --kv-heads 2 >/dev/null
    for shape in ${MOE_SHAPES:-qwen3moe_bf16 qwen3moe_fp8 gptoss_mxfp4}; do
      case $shape in
        qwen3moe_bf16) tpl=/tmp/tpl_qwen3moe; args=(--preset qwen3-30b-a3b --quant none) ;;
        qwen3moe_fp8) tpl=/tmp/tpl_qwen3moe; args=(--preset qwen3-30b-a3b --quant fp8) ;;
        qwen3moe_fp8x) tpl=/tmp/tpl_qwen3moe; args=(--preset qwen3-30b-a3b --quant fp8-experts) ;;
        gptoss_mxfp4) tpl=/tmp/tpl_gptoss; args=(--preset gpt-oss-20b --quant mxfp4) ;;
        qwen3_8b_fp8) tpl=/tmp/tpl_qwen3; args=(--preset qwen3-8b --quant fp8) ;;
        *) note "moebench: unknown shape $shape"; continue ;;
      esac
      M=/tmp/moe_$shape
      layers=(--layers "${MOE_LAYERS:-8}")
      [ $shape = qwen3_8b_fp8 ] && layers=()
      if [ ! -f $M/model.safetensors ] && ! python3 tools/device/synth_shape.py --template $tpl \
          --out $M "${layers[@]}" "${args[@]}" >"$OUT/synth_$shape.log" 2>&1; then
        note "moebench $shape: synth failed"; tail -5 "$OUT/synth_$shape.log"; continue
      fi
      agentkv bench engine --model $M --device cuda --prompt 512 --output 128 --concurrency 1,64 \
        --json >"$OUT/bench_$shape.json" 2>"$OUT/bench_$shape.err"; note "bench $shape rc=$?"
      agentkv bench engine --model $M --device cuda --prompt 512 --output 1 --concurrency 64 \
        --max-step-tokens 8192 --json >"$OUT/prefill_$shape.json" 2>>"$OUT/bench_$shape.err"
      if [ -n "${MOE_COMPARE:-}" ]; then  # the tensor cores' tiles in place of the GEMV
        AGENTKV_CUDA_MOE_GEMV=0 agentkv bench engine --model $M --device cuda --prompt 512 \
          --output 128 --concurrency 1,64 --json >"$OUT/bench_${shape}_tiles.json" \
          2>>"$OUT/bench_$shape.err"
        note "bench $shape AGENTKV_CUDA_MOE_GEMV=0 rc=$?"
      fi
      if [ -n "${DEQUANT_COMPARE:-}" ]; then  # fp8 dense layers on the quantized tiles
        AGENTKV_CUDA_DENSE_DEQUANT=0 agentkv bench engine --model $M --device cuda --prompt 512 \
          --output 128 --concurrency 1,64 --json >"$OUT/bench_${shape}_nodequant.json" \
          2>>"$OUT/bench_$shape.err"
        note "bench $shape AGENTKV_CUDA_DENSE_DEQUANT=0 rc=$?"
        AGENTKV_CUDA_DENSE_DEQUANT=0 agentkv bench engine --model $M --device cuda --prompt 512 \
          --output 1 --concurrency 64 --max-step-tokens 8192 --json \
          >"$OUT/prefill_${shape}_nodequant.json" 2>>"$OUT/bench_$shape.err"
      fi
      tail -3 "$OUT/bench_$shape.err"
      python3 tools/device/roofline.py --model $M --peak "$OUT/peak.json" --bench "$OUT/bench_$shape.json" \
        --prefill "$OUT/prefill_$shape.json" | tee "$OUT/roofline_$shape.md"
      for c in 1 64; do  # as the profile stage: decode steps 20 and 21 of c rows, no graphs
        AGENTKV_CUDA_PROFILE_BATCH=$c AGENTKV_CUDA_GRAPHS=0 timeout 240 ncu --profile-from-start off \
          --clock-control none --metrics gpu__time_duration.sum --csv \
          agentkv bench engine --model $M --device cuda --prompt 512 \
          --output 40 --concurrency $c >"$OUT/ncu_${shape}_c$c.csv" 2>"$OUT/ncu_${shape}_c$c.err"
        python3 tools/device/kernel_times.py "$OUT/ncu_${shape}_c$c.csv" --steps 2 |
          tee "$OUT/kernels_${shape}_c$c.md" | head -25
        note "profile $shape c$c: $(tail -1 "$OUT/kernels_${shape}_c$c.md")"
      done
    done ;;
  moegemv)
    [ -f "$OUT/peak.json" ] || python3 tools/device/copy_bw.py >"$OUT/peak.json"
    note "peak: $(cat "$OUT/peak.json")"
    cuda_moe_gemv_bench --benchmark_format=json >"$OUT/moe_gemv_bench.json" 2>"$OUT/moe_gemv_bench.err"
    note "moe gemv bench rc=$?"
    python3 - "$OUT/moe_gemv_bench.json" <<'PY'
import json, sys
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    moved = f"  moved {b['moved_GBps'] / 1e9:8.1f} GB/s" if 'moved_GBps' in b else ""
    print(f"{b['name']:40s} {b['real_time']:9.2f} us  {b.get('weight_GBps', 0) / 1e9:8.1f} GB/s"
          f"  {b.get('experts_MB', 0):7.1f} MB{moved}")
PY
    ;;
  bench|bench8b)
    [ -f "$OUT/peak.json" ] || python3 tools/device/copy_bw.py >"$OUT/peak.json"
    note "peak: $(cat "$OUT/peak.json")"
    if [ "$st" = bench ]; then
      agentkv model synth --arch llama --tokenizer .devcarry/tokenizers/llama3_1 --out /tmp/tpl_llama \
        --layers 1 --hidden 64 --heads 4 --kv-heads 2 >/dev/null
      python3 tools/device/synth_shape.py --template /tmp/tpl_llama --out /tmp/llama1b --layers 16 \
        --hidden 2048 --intermediate 8192 --heads 32 --kv-heads 8 --vocab 128256 --tie
      M=/tmp/llama1b; LEVELS=${LEVELS:-1,8,32,64,128,256}; tag=llama1b
    else
      agentkv model synth --arch qwen3 --tokenizer .devcarry/tokenizers/qwen3 --out /tmp/tpl_qwen3 \
        --layers 1 --hidden 64 --heads 4 --kv-heads 2 >/dev/null
      python3 tools/device/synth_shape.py --template /tmp/tpl_qwen3 --out /tmp/qwen3_8b --layers 36 \
        --hidden 4096 --intermediate 12288 --heads 32 --kv-heads 8 --head-dim 128 --vocab 151936 --no-tie
      M=/tmp/qwen3_8b; LEVELS=1,64; tag=qwen3_8b
    fi
    agentkv bench engine --model $M --device cuda --prompt 512 --output 128 --concurrency $LEVELS \
      --json >"$OUT/bench_$tag.json" 2>"$OUT/bench_$tag.err"; note "bench $tag rc=$?"
    agentkv bench engine --model $M --device cuda --prompt 512 --output 1 --concurrency 64 \
      --max-step-tokens 8192 --json >"$OUT/prefill_$tag.json" 2>>"$OUT/bench_$tag.err"
    if [ "$st" = bench ] && [ -z "${NO_BASELINE:-}" ]; then
      AGENTKV_CUDA_GRAPHS=0 agentkv bench engine --model $M --device cuda --prompt 512 --output 128 \
        --concurrency 1,64 --json >"$OUT/bench_${tag}_nographs.json" 2>>"$OUT/bench_$tag.err"
    fi
    tail -3 "$OUT/bench_$tag.err"
    if [ "$st" = bench ]; then  # decode GEMMs: skinny kernel vs cuBLAS vs GEMV
      cuda_gemm_bench --benchmark_filter='/m(1|8|16|32|64)/(skinny|cublas|gemv)' --benchmark_format=json \
        >"$OUT/gemm_bench.json" 2>/dev/null; note "gemm bench rc=$?"
    fi
    python3 tools/device/roofline.py --model $M --peak "$OUT/peak.json" --bench "$OUT/bench_$tag.json" \
      --prefill "$OUT/prefill_$tag.json" ${NO_BASELINE:+} \
      $( [ -f "$OUT/bench_${tag}_nographs.json" ] && echo --nographs "$OUT/bench_${tag}_nographs.json") \
      | tee "$OUT/roofline_$tag.md" ;;
  spec)
    M=/tmp/qwen3_8b; C=/tmp/qwen3_8b_cycle; parts=${SPEC_PARTS:-serve batch}
    if [ ! -f $M/model.safetensors ]; then
      agentkv model synth --arch qwen3 --tokenizer .devcarry/tokenizers/qwen3 --out /tmp/tpl_qwen3 \
        --layers 1 --hidden 64 --heads 4 --kv-heads 2 >/dev/null
      python3 tools/device/synth_shape.py --template /tmp/tpl_qwen3 --out $M --layers 36 \
        --hidden 4096 --intermediate 12288 --heads 32 --kv-heads 8 --head-dim 128 --vocab 151936 --no-tie
    fi
    if [[ " $parts " == *" serve "* ]]; then
      if [ ! -f $C/cycle.json ]; then
        rm -rf $C && cp -r $M $C && python3 tools/specbench/cycle_model.py --model $C --cycle 32
      fi
      for m in $M $C; do
        tag=$(basename $m)
        for sp in none ngram; do
          agentkv serve --model $m --device cuda --store none --port 8093 --speculative $sp \
            >"$OUT/serve_${tag}_$sp.out" 2>"$OUT/serve_${tag}_$sp.err" &
          PID=$!
          for _ in $(seq 900); do
            grep -q "listening on" "$OUT/serve_${tag}_$sp.out" && break
            kill -0 $PID 2>/dev/null || break; sleep 0.2
          done
          expect=(); [ $m = $C ] && [ $sp = ngram ] && [ -z "${SPEC_TEMPERATURE:-}" ] &&
            expect=(--expect-accept 0.8)
          [ -n "${SPEC_TEMPERATURE:-}" ] && expect+=(--temperature "$SPEC_TEMPERATURE")
          line=$(python3 tools/specbench/specbench.py run --url http://127.0.0.1:8093 --file-tokens 2000 \
            --max-tokens 1024 --ignore-eos --warmup 1 --repeat 3 --label "$tag $sp" ${expect[@]+"${expect[@]}"} \
            --json "$OUT/spec_${tag}_$sp.json" 2>"$OUT/spec_${tag}_$sp.log")
          note "specbench rc=$?: $line"; tail -2 "$OUT/spec_${tag}_$sp.log"
          kill -TERM $PID; wait $PID
        done
        note "$(python3 tools/specbench/specbench.py compare "$OUT/spec_${tag}_none.json" "$OUT/spec_${tag}_ngram.json")"
      done
    fi
    if [[ " $parts " == *" hf "* ]]; then
      PYTHONUNBUFFERED=1 python3 tests/reference/hf_compare.py --agentkv .devcarry/bin/agentkv \
        --device cuda --speculative --work /tmp/hfcmp --out "$OUT/hf_compare_cuda_spec.md" \
        >"$OUT/hf_compare_spec.log" 2>&1
      note "hf_compare --device cuda --speculative: $(tail -2 "$OUT/hf_compare_spec.log" | tr '\n' ' ')"
    fi
    if [[ " $parts " == *" sanitize "* ]]; then
      for t in backend_logit_rows engine_speculative; do
        log="$OUT/sanitize_$t.log"
        if compute-sanitizer --tool memcheck --error-exitcode 9 .devcarry/bin/engine_backend_cuda_${t}_test \
            --gtest_brief=1 --gtest_filter='*llama*:*qwen3_c0_b16_wide_d4*:*gemma3_c0_b4*:*fp8*:CudaBackend.*:CudaEngine*' \
            >"$log" 2>&1; then r=clean; else r=FAIL; fi
        note "compute-sanitizer memcheck $t: $r"; tail -5 "$log"
      done
    fi
    if [[ " $parts " == *" batch "* ]]; then
      for round in 1 2; do
        for sp in none ngram; do
          flag=(); [ $sp = ngram ] && flag=(--speculative)
          agentkv bench engine --model $M --device cuda --prompt 512 --output 128 --concurrency 1,64 \
            ${flag[@]+"${flag[@]}"} --json >"$OUT/specbatch_${sp}_$round.json" 2>>"$OUT/specbatch.err"
          note "bench engine $sp round $round rc=$?"
        done
      done
      python3 - "$OUT" <<'PY' | tee "$OUT/specbatch.md"
import json, sys
out = sys.argv[1]
rate = {}
for sp in ("none", "ngram"):
    for r in (1, 2):
        for lv in json.load(open(f"{out}/specbatch_{sp}_{r}.json"))["levels"]:
            rate.setdefault((sp, lv["concurrency"]), []).append(lv)
for c in (1, 64):
    base = [l["output_tok_s"] for l in rate[("none", c)]]
    spec = [l["output_tok_s"] for l in rate[("ngram", c)]]
    drafts = sum(l.get("draft_tokens", 0) for l in rate[("ngram", c)])
    acc = sum(l.get("draft_accepted_tokens", 0) for l in rate[("ngram", c)])
    ratio = (sum(spec) / len(spec)) / (sum(base) / len(base))
    verdict = "" if c != 64 else ("; within 3%" if ratio >= 0.97 else "; MORE THAN 3% BELOW")
    print(f"bench engine c{c} 512+128: without {', '.join(f'{x:.0f}' for x in base)} tok/s, "
          f"with --speculative {', '.join(f'{x:.0f}' for x in spec)} tok/s: x{ratio:.3f}"
          f" ({drafts} draft tokens, {acc} accepted){verdict}")
PY
      while read -r l; do note "$l"; done <"$OUT/specbatch.md"
    fi ;;
  overhead)
    M=/tmp/qwen3_8b
    if [ ! -f $M/model.safetensors ]; then
      agentkv model synth --arch qwen3 --tokenizer .devcarry/tokenizers/qwen3 --out /tmp/tpl_qwen3 \
        --layers 1 --hidden 64 --heads 4 --kv-heads 2 >/dev/null
      python3 tools/device/synth_shape.py --template /tmp/tpl_qwen3 --out $M --layers 36 \
        --hidden 4096 --intermediate 12288 --heads 32 --kv-heads 8 --head-dim 128 --vocab 151936 --no-tie
    fi
    for round in 1 2; do
      for mode in plain logprobs json; do
        flag=()
        [ $mode = logprobs ] && flag=(--logprobs 5)
        [ $mode = json ] && flag=(--response-format json_object)
        agentkv bench engine --model $M --device cuda --prompt 512 --output 128 --concurrency 1,64 \
          ${flag[@]+"${flag[@]}"} --json >"$OUT/overhead_${mode}_$round.json" 2>>"$OUT/overhead.err"
        note "bench engine $mode round $round rc=$?"
      done
    done
    python3 - "$OUT" <<'PY' | tee "$OUT/overhead.md"
import json, sys
out = sys.argv[1]
rate = {}
for mode in ("plain", "logprobs", "json"):
    for r in (1, 2):
        for lv in json.load(open(f"{out}/overhead_{mode}_{r}.json"))["levels"]:
            rate.setdefault((mode, lv["concurrency"]), []).append(lv["output_tok_s"])
for c in (1, 64):
    base = sum(rate[("plain", c)]) / 2
    parts = [f"plain {', '.join(f'{x:.0f}' for x in rate[('plain', c)])} tok/s"]
    for mode, what in (("logprobs", "--logprobs 5"), ("json", "json_object")):
        xs = rate[(mode, c)]
        parts.append(f"{what} {', '.join(f'{x:.0f}' for x in xs)} tok/s (x{sum(xs) / 2 / base:.3f})")
    print(f"bench engine c{c} 512+128: " + "; ".join(parts))
PY
    while read -r l; do note "$l"; done <"$OUT/overhead.md" ;;
  esac
done
echo; echo "SUMMARY"; printf '%s\n' "${summary[@]}"
for f in "$OUT"/roofline_*.md; do
  [ -f "$f" ] && { echo; echo "== $(basename "$f")"; cat "$f"; }
done
if [ -n "${BUNDLE:-}" ]; then
  tar -C "$OUT" -czf /tmp/cuda_check_bundle.tgz . && find "$OUT" -mindepth 1 -delete &&
    mv /tmp/cuda_check_bundle.tgz "$OUT/check.tgz"
fi
