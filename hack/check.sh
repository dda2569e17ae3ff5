#!/usr/bin/env bash
# make check: the fast loop before a commit: formatting (clang-format over the agent, gofmt),
# the user docs (hack/check-docs.py), golangci-lint (.golangci.yml: go vet, staticcheck, errcheck, gosec, revive, ...), clang-tidy over
# the agent (agent/.clang-tidy), the Go unit and table tests (planner, render, Decide, conditions, storage, ...; the envtest
# suites skip here, make test runs them) and the agent's unit tests. No root, no cluster. Prints
# each step's time.
set -uo pipefail
cd "$(dirname "$0")/.."
agent_build=${AGENT_BUILD:-build/agent}
status=0
t0=$(date +%s)
step() {
  local name=$1
  shift
  local s rc
  s=$(date +%s)
  "$@"
  rc=$?
  printf 'check: %-14s %4d s  %s\n' "$name" $(($(date +%s) - s)) "$([ "$rc" -eq 0 ] && echo ok || echo FAILED)"
  [ "$rc" -eq 0 ] || status=1
}
clang_format() {
  command -v clang-format >/dev/null || { echo "check: clang-format missing (hack/install-deps.sh installs it)" >&2; return 1; }
  find agent \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' \) -print0 | xargs -0 clang-format --dry-run -Werror
}
gofmt_clean() {
  local bad
  bad=$(gofmt -l api cmd controllers internal test)
  [ -z "$bad" ] || { echo "check: gofmt would change: $bad" >&2; return 1; }
}
go_unit() {
  go test -count=1 $(go list ./... | grep -vE '/test/(e2e|facility|realnode)$')
}
step docs python3 hack/check-docs.py
step clang-format clang_format
step gofmt gofmt_clean
golangci_lint() {
  local lint
  lint=$(bash hack/build-golangci-lint.sh) || return 1
  "$lint" run ./...
}
step golangci-lint golangci_lint
step clang-tidy bash hack/clang-tidy.sh
step go-unit go_unit
step agent-unit "$agent_build/agent_unit_tests" --gtest_brief=1
echo "check: $(($(date +%s) - t0)) s in all"
exit "$status"
