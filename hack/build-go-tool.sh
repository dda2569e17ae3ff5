#!/usr/bin/env bash
# Builds a Go command from the Go module proxy (no release downloads here), cached under
# ~/.cache/numastream/NAME-VERSION keyed by its version and Go's. Prints the binary's path.
#   build-go-tool.sh NAME MODULE VERSION PACKAGE
# `go install pkg@version` asks the proxy for a version list (refused here): a wrapper module
# requires the exact version instead.
set -euo pipefail
NAME="$1" MODULE="$2" VERSION="$3" PACKAGE="$4"
GO="${GO:-go}"
hack="$(cd "$(dirname "$0")" && pwd)"
BIN_DIR="${BIN_DIR:-$HOME/.cache/numastream/$NAME-$VERSION}"
want="$NAME=$VERSION go=$($GO env GOVERSION)"
# shellcheck source=lib/lock.sh
source "$hack/lib/lock.sh"
hold_lock "$BIN_DIR/.lock"
if [[ -x "$BIN_DIR/$NAME" && -f "$BIN_DIR/.versions" && "$(cat "$BIN_DIR/.versions")" == "$want" ]]; then
  echo "$BIN_DIR/$NAME"
  exit 0
fi
wrap="$BIN_DIR/.wrapper"
rm -rf "$wrap"
mkdir -p "$wrap"
printf 'module local.build/%s\n\ngo 1.25\n\nrequire %s v%s\n' "$NAME" "$MODULE" "$VERSION" >"$wrap/go.mod"
printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$PACKAGE" >"$wrap/tools.go"
(
  cd "$wrap"
  $GO mod tidy >&2
  "$hack/heartbeat.sh" "go build $NAME v$VERSION" -- \
    env CGO_ENABLED=0 $GO build -trimpath -o "$BIN_DIR/$NAME" "$PACKAGE" >&2
)
echo "$want" >"$BIN_DIR/.versions"
echo "$BIN_DIR/$NAME"
