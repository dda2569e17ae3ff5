#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) and runs each for FUZZ_SECONDS, starting from
# the seed corpus in agent/fuzz/corpus (copied: the repository's corpus is not modified). A crash,
# a leak, an out-of-bounds access or an uncaught exception fails the run; the input that caused it
# is kept in build/agent-fuzz/artifacts/ and its path printed.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
build=build/agent-fuzz
if ! command -v clang++ >/dev/null 2>&1; then
  echo "fuzz: clang++ is missing (hack/install-deps.sh installs it)" >&2
  exit 1
fi
CC=clang CXX=clang++ hack/quiet.sh "fuzz: cmake configure" -- cmake -S agent -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNUMASTREAM_FUZZ=ON -DNUMASTREAM_TESTS=OFF
hack/quiet.sh "fuzz: build" -- cmake --build "$build" --target frame_fuzzer config_fuzzer stream2_fuzzer
mkdir -p "$build/artifacts"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for target in frame config stream2; do
  cp -r "agent/fuzz/corpus/$target" "$work/$target"
  log="$work/$target.log"
  if ! "$build/${target}_fuzzer" -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$build/artifacts/$target-" "$work/$target" >"$log" 2>&1; then
    grep -E "ERROR|SUMMARY|Test unit written|uncaught" "$log" >&2 || tail -20 "$log" >&2
    echo "fuzz: ${target}_fuzzer FAILED (input kept under $build/artifacts/)" >&2
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  echo "fuzz: ${target}_fuzzer ${seconds}s, $runs inputs, $cov, no failure"
done
