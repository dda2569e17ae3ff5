#!/usr/bin/env bash
# Runs a GoogleTest binary as N shards side by side (GTEST_TOTAL_SHARDS), for suites whose tests
# mostly wait on paced streams. Each shard's output is printed whole once it ends; the exit is
# non-zero when any shard failed, naming it.
#   gtest-shards.sh N BINARY [ARGS...]
set -uo pipefail
n=$1 bin=$2
shift 2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pids=()
for ((i = 0; i < n; i++)); do
  GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i "$bin" "$@" >"$dir/$i.log" 2>&1 &
  pids+=($!)
done
failed=()
for ((i = 0; i < n; i++)); do
  wait "${pids[$i]}" || failed+=("$i (exit $?)")
  echo "--- $(basename "$bin") shard $((i + 1)) of $n"
  cat "$dir/$i.log"
done
if ((${#failed[@]})); then
  echo "$(basename "$bin"): shard(s) failed: ${failed[*]}" >&2
  exit 1
fi
