#!/usr/bin/env bash
# Builds golangci-lint from the Go module proxy (no release downloads here), cached in $BIN_DIR
# keyed by its version and Go's. Prints the binary's path.
#   build-golangci-lint.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${GOLANGCI_LINT_VERSION:-2.15.0}"
GO="${GO:-go}"
BIN_DIR="${BIN_DIR:-$HOME/.cache/numastream/golangci-lint-$VERSION}"
want="golangci-lint=$VERSION go=$($GO env GOVERSION)"
if [[ -x "$BIN_DIR/golangci-lint" && -f "$BIN_DIR/.versions" && "$(cat "$BIN_DIR/.versions")" == "$want" ]]; then
  echo "$BIN_DIR/golangci-lint"
  exit 0
fi
# `go install pkg@version` asks the proxy for a version list (refused here): a wrapper module
# requires the exact version instead.
wrap="$BIN_DIR/.wrapper"
rm -rf "$wrap"
mkdir -p "$wrap"
printf 'module local.build/golangci-lint\n\ngo 1.25\n\nrequire github.com/golangci/golangci-lint/v2 v%s\n' "$VERSION" >"$wrap/go.mod"
printf '//go:build tools\n\npackage tools\n\nimport _ "github.com/golangci/golangci-lint/v2/cmd/golangci-lint"\n' >"$wrap/tools.go"
(
  cd "$wrap"
  $GO mod tidy >&2
  hack=$(cd "$OLDPWD" && pwd)/hack
  "$hack/heartbeat.sh" "go build golangci-lint v$VERSION" -- \
    env CGO_ENABLED=0 $GO build -trimpath -o "$BIN_DIR/golangci-lint" github.com/golangci/golangci-lint/v2/cmd/golangci-lint >&2
)
echo "$want" >"$BIN_DIR/.versions"
echo "$BIN_DIR/golangci-lint"
