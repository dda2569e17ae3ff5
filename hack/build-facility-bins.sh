#!/usr/bin/env bash
# Builds the facility's third-party parts from the Go module proxy (no GitHub releases, no
# registries), cached in $BIN_DIR keyed by version:
#   nfd-master   sigs.k8s.io/node-feature-discovery  (turns NodeFeature objects into node labels)
#   multus       gopkg.in/k8snetworkplumbingwg/multus-cni.v4, the thin CNI plugin
#   nfd-crds.yaml  NFD's own CRDs, copied from its module
#   kube-network-policies, and kube-network-policies.tar (an image of it, for its DaemonSet)
#                sigs.k8s.io/kube-network-policies, the NetworkPolicy enforcer of the pod network
# NFD's go.mod pins k8s.io/* through replace directives, so `go install` refuses it: a wrapper
# module requires it and repeats those replace lines (generated from its go.mod, then tidied).
set -euo pipefail
cd "$(dirname "$0")/.."
NFD_VERSION="${NFD_VERSION:-0.17.3}"
MULTUS_VERSION="${MULTUS_VERSION:-4.2.2}"
KNP_VERSION="${KNP_VERSION:-0.8.0}"
BIN_DIR="${BIN_DIR:-$HOME/.cache/numastream/facility-nfd$NFD_VERSION-multus$MULTUS_VERSION}"
GO="${GO:-go}"
export CGO_ENABLED=0
# shellcheck source=lib/lock.sh
source hack/lib/lock.sh
hold_lock "$BIN_DIR/.lock"
log() { echo "[$(date +%H:%M:%S)] $*"; }
HB="$(cd "$(dirname "$0")" && pwd)/heartbeat.sh"  # a line a minute while a step compiles
moddir() { $GO mod download -json "$1" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'; }

# `go install pkg@version` asks the proxy for the module's version list (refused here), so
# the tools are built from small wrapper modules that require the exact version.
wrapper() { # dir module version package
  local dir=$1 mod=$2 ver=$3 pkg=$4
  rm -rf "$dir"; mkdir -p "$dir"
  printf 'module local.build/%s\n\ngo 1.24\n\nrequire %s %s\n' "$(basename "$dir")" "$mod" "$ver" >"$dir/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$pkg" >"$dir/tools.go"
}

nfd_and_multus() {
  local STAMP="$BIN_DIR/.versions" WANT
  WANT="nfd=$NFD_VERSION multus=$MULTUS_VERSION go=$($GO env GOVERSION)"
  if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    echo "build-facility-bins: nfd-master and multus up to date in $BIN_DIR ($WANT)"
    return
  fi
  log "go build gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus v$MULTUS_VERSION"
  wrapper "$BIN_DIR/.wrapper-multus" gopkg.in/k8snetworkplumbingwg/multus-cni.v4 "v$MULTUS_VERSION" \
    gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus
  (cd "$BIN_DIR/.wrapper-multus" && $GO mod tidy && "$HB" "go build" -- $GO build -trimpath -ldflags "-s -w" -o "$BIN_DIR/multus" \
    gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus)

  local nfd wrap
  nfd=$(moddir "sigs.k8s.io/node-feature-discovery@v$NFD_VERSION")
  [[ -d "$nfd" ]] || { echo "could not download sigs.k8s.io/node-feature-discovery@v$NFD_VERSION" >&2; exit 1; }
  wrap="$BIN_DIR/.wrapper-nfd"
  rm -rf "$wrap"; mkdir -p "$wrap"
  {
    echo "module local.build/nfd-bins"
    echo
    grep -m1 '^go ' "$nfd/go.mod"
    echo
    echo "require sigs.k8s.io/node-feature-discovery v$NFD_VERSION"
    echo
    # NFD's own replace block, verbatim in meaning: the k8s.io/* versions it is built and tested with.
    # Its own nested API module is replaced with a local directory the module zip lacks: take the
    # published module of the same version instead.
    sed -n '/^replace (/,/^)/p' "$nfd/go.mod" |
      sed "s#^\(\s*\)\(sigs.k8s.io/node-feature-discovery/[a-z/]*\) => \./.*#\1\2 => \2 v$NFD_VERSION#"
  } >"$wrap/go.mod"
  cat >"$wrap/tools.go" <<'GO'
//go:build tools

package tools

import _ "sigs.k8s.io/node-feature-discovery/cmd/nfd-master"
GO
  log "go mod tidy (NFD wrapper module in $wrap)"
  (cd "$wrap" && $GO mod tidy)
  log "go build nfd-master v$NFD_VERSION"
  (cd "$wrap" && "$HB" "go build" -- $GO build -trimpath -ldflags "-s -w -X sigs.k8s.io/node-feature-discovery/pkg/version.version=v$NFD_VERSION" \
    -o "$BIN_DIR/nfd-master" sigs.k8s.io/node-feature-discovery/cmd/nfd-master)
  cp "$nfd/deployment/base/nfd-crds/nfd-api-crds.yaml" "$BIN_DIR/nfd-crds.yaml"
  chmod u+w "$BIN_DIR/nfd-crds.yaml"
  echo "$WANT" >"$STAMP"
}

# kube-network-policies decides each new connection of the pod network against the
# NetworkPolicies (its nfqueue handler); its image is the static binary alone.
network_policies() {
  local STAMP="$BIN_DIR/.version-knp" WANT
  WANT="kube-network-policies=$KNP_VERSION go=$($GO env GOVERSION) image=$(sha256sum hack/image-archive.sh | cut -c1-12)"
  if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" && -f "$BIN_DIR/kube-network-policies.tar" ]]; then
    echo "build-facility-bins: kube-network-policies up to date in $BIN_DIR ($WANT)"
    return
  fi
  log "go build sigs.k8s.io/kube-network-policies/cmd v$KNP_VERSION"
  wrapper "$BIN_DIR/.wrapper-knp" sigs.k8s.io/kube-network-policies "v$KNP_VERSION" sigs.k8s.io/kube-network-policies/cmd
  (cd "$BIN_DIR/.wrapper-knp" && $GO mod tidy && "$HB" "go build" -- $GO build -trimpath -ldflags "-s -w" -o "$BIN_DIR/kube-network-policies" \
    sigs.k8s.io/kube-network-policies/cmd)
  local root; root=$(mktemp -d)
  install -m 0755 "$BIN_DIR/kube-network-policies" "$root/kube-network-policies"
  bash hack/image-archive.sh "$root" \
    '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/kube-network-policies"]},"rootfs":{"type":"layers","diff_ids":["sha256:@DIFF@"]}}' \
    "$BIN_DIR/kube-network-policies.tar" "local.numastream/kube-network-policies:v$KNP_VERSION"
  rm -rf "$root"
  echo "$WANT" >"$STAMP"
}

nfd_and_multus
network_policies
log "done: $BIN_DIR ($(ls "$BIN_DIR" | tr '\n' ' '))"
