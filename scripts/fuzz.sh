#!/usr/bin/env bash
# Builds the libFuzzer targets under fuzz/ (clang, ASan + UBSan, in
# build-fuzz/) and runs each for a bounded time, starting from its committed
# seed corpus (fuzz/corpus/<target>/; new inputs go to build-fuzz/corpus/).
#   scripts/fuzz.sh [seconds-per-target] [target...]
#   scripts/fuzz.sh --runs N [--max-seconds S] [target...]
# Default: 15 seconds for each target (CI runs 12). With --runs, each target
# runs until N executions (libFuzzer -runs=N), or S seconds if given
# (whichever comes first); the summary says which. A crash, leak,
# sanitizer report, timeout or out-of-memory fails the run; the input is
# saved as build-fuzz/artifacts/<target>-crash-* (replay it with
# `build-fuzz/fuzz/<target> FILE`). Prints each target's executions.
# Run after scripts/setup.sh (it needs the packages and the default model).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RUNS=""
MAX_SECONDS=""
if [ "${1:-}" = "--runs" ]; then
  RUNS=${2:?--runs needs a count}
  shift 2
  if [ "${1:-}" = "--max-seconds" ]; then
    MAX_SECONDS=${2:?--max-seconds needs a count}
    shift 2
  fi
  SECONDS_PER_TARGET=0
else
  SECONDS_PER_TARGET=${1:-15}
  [ $# -gt 0 ] && shift
fi
BUILD=${AGENTKV_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}
export CCACHE_BASEDIR=$ROOT CCACHE_NOHASHDIR=true

# clang with libFuzzer and the sanitizer runtimes, and clang's OpenMP.
missing=()
for p in clang libclang-rt-dev libomp-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in fuzz/*_fuzz.cc; do targets+=("$(basename "$f" .cc)"); done
fi

# -O1 with line tables: fast enough to fuzz, quick to build; asserts stay on.
CC=clang CXX=clang++ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" \
  -DAGENTKV_CUDA=OFF -DAGENTKV_FUZZ=ON >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target "${targets[@]}"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# Seconds a target needs to start (loading, under ASan), on top of its
# fuzzing time: libFuzzer counts them in -max_total_time.
declare -A STARTUP_S=([tokenizer_fuzz]=30)
mkdir -p "$BUILD/artifacts" "$BUILD/logs"
status=0
summary=()
for t in "${targets[@]}"; do
  mkdir -p "$BUILD/corpus/$t"
  log=$BUILD/logs/$t.log
  if [ -n "$RUNS" ]; then
    limit=(-runs="$RUNS")
    [ -n "$MAX_SECONDS" ] && limit+=(-max_total_time="$MAX_SECONDS")
    echo "== $t ($RUNS executions${MAX_SECONDS:+, at most ${MAX_SECONDS}s})"
  else
    limit=(-max_total_time=$((SECONDS_PER_TARGET + ${STARTUP_S[$t]:-5})))
    echo "== $t (${SECONDS_PER_TARGET}s + ${STARTUP_S[$t]:-5}s to start)"
  fi
  # The work corpus first: libFuzzer adds new inputs to the first folder, so
  # the committed seeds stay as they are.
  if "$BUILD/fuzz/$t" "${limit[@]}" -timeout=30 -rss_limit_mb=3072 \
       -max_len=16384 -print_final_stats=1 -artifact_prefix="$BUILD/artifacts/$t-" \
       "$BUILD/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1; then
    result=ok
  else
    result=FAILED
    status=1
    tail -n 60 "$log"
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -E '^#[0-9]+.*(DONE|pulse|NEW|REDUCE)' "$log" | tail -1 | sed -n 's/.* cov: \([0-9]*\) .*/\1/p')
  reached=""
  if [ -n "$RUNS" ] && [ -n "$execs" ] && [ "$execs" -lt "$RUNS" ]; then reached=" (time limit)"; fi
  summary+=("$(printf '%-30s %-7s %12s executions %7s exec/s  cov %s%s' "$t" "$result" \
    "${execs:-?}" "${rate:-?}" "${cov:-?}" "$reached")")
done
printf '%s\n' "${summary[@]}"
if [ $status -eq 0 ]; then echo "fuzzing: no findings"; else echo "fuzzing: FAILED (inputs in $BUILD/artifacts)"; fi
exit $status
