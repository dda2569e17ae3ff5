#!/usr/bin/env bash
# clang-tidy 14 over the agent's sources with agent/.clang-tidy (bugprone-*, performance-*,
# concurrency-*, and what is left out and why); any finding fails. Configures a build tree of its
# own for the compile commands (nothing is compiled).
#   clang-tidy.sh [FILE-REGEX]     (default: every agent/src .cpp)
set -euo pipefail
cd "$(dirname "$0")/.."
build=build/agent-tidy
command -v run-clang-tidy-14 >/dev/null || { echo "clang-tidy: run-clang-tidy-14 missing (hack/install-deps.sh installs clang-tidy-14)" >&2; exit 1; }
hack/quiet.sh "clang-tidy: cmake configure" -- cmake -S agent -B "$build" -G Ninja -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DCMAKE_BUILD_TYPE=Debug
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# Its diagnostics come coloured (escape codes between the location and "warning:"): plain text
# is what is searched, or no finding is ever seen.
run-clang-tidy-14 -p "$build" -j "$(nproc)" -quiet "${1:-agent/src/.*\.cpp$}" 2>&1 | sed 's/\x1b\[[0-9;]*m//g' >"$out" || true
findings=$(grep -cE ': (warning|error): ' "$out" || true)
if [[ "$findings" -ne 0 ]] || grep -q "^Error while processing" "$out"; then
  grep -E ': (warning|error): |^Error while processing' "$out" | sort -u >&2
  echo "clang-tidy: $findings finding(s) (agent/.clang-tidy)" >&2
  exit 1
fi
echo "clang-tidy: no findings (agent/.clang-tidy)"
