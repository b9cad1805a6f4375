#!/usr/bin/env bash
# Builds and runs the tests that guard memory and thread safety under
# sanitizers: ASan+UBSan for the block pool, cache manager and store
# (randomised operations, corruption, crashes), the host KV tier, KV
# transfer and reply splicing; TSan for the engine thread, the scheduler,
# KV transfer's loader thread, the agents' strands, the HTTP server and the
# API service (each protocol's turns through the worker pool and strands). Run after scripts/setup.sh (it needs the packages and data).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export CCACHE_BASEDIR=$ROOT CCACHE_NOHASHDIR=true

run_tests() {  # build dir, test executables...
  local dir=$1; shift
  local failed=0
  for t in "$@"; do
    echo "== $t ($(basename "$dir"))"
    if ! "$dir/$t" --gtest_brief=1; then failed=1; fi
  done
  return $failed
}

ASAN_TESTS=(cache_block_pool_test cache_prefix_cache_test cache_kv_cache_manager_test
            cache_block_table_test cache_kv_memory_budget_test cache_kv_cache_random_test
            store_agent_store_test store_kv_write_queue_test store_store_corruption_test
            store_store_capacity_test store_store_kv_tier_test store_group_committer_test
            engine_scheduler_test engine_staging_pool_test engine_host_kv_tier_test
            engine_kv_transfer_test store_split_restore_test engine_reply_splice_test util_zeroed_buffer_test
            util_task_pool_test store_lmdb_env_test)
TSAN_TESTS=(engine_engine_test store_store_kv_tier_test store_group_committer_test
            engine_staging_pool_test util_thread_pool_test engine_kv_transfer_test store_split_restore_test
            store_lmdb_env_test util_task_pool_test agent_agent_strands_test agent_agent_manager_test
            api_http_server_test api_api_service_test)

cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DAGENTKV_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$(nproc)" --target "${ASAN_TESTS[@]}"
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DAGENTKV_TSAN=ON >/dev/null
cmake --build build-tsan -j"$(nproc)" --target "${TSAN_TESTS[@]}"

status=0
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_tests "$ROOT/build-asan" "${ASAN_TESTS[@]}" || status=1
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$ROOT/scripts/tsan.supp \
  run_tests "$ROOT/build-tsan" "${TSAN_TESTS[@]}" || status=1
if [ $status -eq 0 ]; then echo "sanitizer tests: all passed"; else echo "sanitizer tests: FAILED"; fi
exit $status
