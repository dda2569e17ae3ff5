#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) and runs each for FUZZ_SECONDS.
#
# Corpora are kept between runs, outside the repository: FUZZ_CORPUS_DIR (default
# ~/.cache/numastream/fuzz-corpus/<target>) is seeded from agent/fuzz/corpus/<target> (files it
# lacks are copied in; the repository's corpus is never modified) and grows with every run, so a
# long run (make fuzz-long) and every short one after it start from what earlier runs found.
# A crash, a leak, an out-of-bounds access, a timeout or an uncaught exception fails the run; the
# input that caused it is kept in build/agent-fuzz/artifacts/ and its path printed.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
corpora=${FUZZ_CORPUS_DIR:-$HOME/.cache/numastream/fuzz-corpus}
build=build/agent-fuzz
if ! command -v clang++ >/dev/null 2>&1; then
  echo "fuzz: clang++ is missing (hack/install-deps.sh installs it)" >&2
  exit 1
fi
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
CC=clang CXX=clang++ hack/quiet.sh "fuzz: cmake configure" -- cmake -S agent -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNUMASTREAM_FUZZ=ON -DNUMASTREAM_TESTS=OFF "${launcher[@]}"
hack/quiet.sh "fuzz: build" -- cmake --build "$build" --target frame_fuzzer config_fuzzer stream2_fuzzer receiver_fuzzer state_fuzzer
mkdir -p "$build/artifacts"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for target in frame config stream2 receiver state; do
  corpus="$corpora/$target"
  mkdir -p "$corpus"
  cp -rn "agent/fuzz/corpus/$target/." "$corpus/"
  before=$(find "$corpus" -type f | wc -l)
  log="$work/$target.log"
  if ! "$build/${target}_fuzzer" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
      -artifact_prefix="$build/artifacts/$target-" "$corpus" >"$log" 2>&1; then
    grep -E "ERROR|SUMMARY|Test unit written|uncaught|timeout|receiver_fuzzer:" "$log" >&2 || tail -20 "$log" >&2
    echo "fuzz: ${target}_fuzzer FAILED (input kept under $build/artifacts/)" >&2
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  after=$(find "$corpus" -type f | wc -l)
  echo "fuzz: ${target}_fuzzer ${seconds}s, $runs inputs, $cov, corpus $before -> $after ($corpus), no failure"
done
