#!/usr/bin/env bash
# Builds golangci-lint from the Go module proxy, cached in ~/.cache/numastream keyed by its version
# and Go's. Prints the binary's path.
set -euo pipefail
VERSION="${GOLANGCI_LINT_VERSION:-2.15.0}"
exec bash "$(dirname "$0")/build-go-tool.sh" golangci-lint github.com/golangci/golangci-lint/v2 "$VERSION" \
  github.com/golangci/golangci-lint/v2/cmd/golangci-lint
