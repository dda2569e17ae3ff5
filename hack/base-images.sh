#!/usr/bin/env bash
# Local stand-ins for the Dockerfile's base images, in buildah's storage, since no registry is
# reachable here:
#   docker.io/library/debian:bookworm-slim      Debian bookworm minbase, bootstrapped by mmdebstrap
#                                               from the Debian archive (+ ca-certificates)
#   docker.io/library/golang:1.26-bookworm      that, plus the host's Go toolchain (/usr/local/go),
#                                               GOPATH=/go and the host's GOPROXY, as the official image
#   gcr.io/distroless/static-debian12:nonroot   passwd/group with nonroot (65532), CA bundle, /tmp
# The host's extra CA certificates (/usr/local/share/ca-certificates) are trusted in all three, so
# that a build behind the same TLS-inspecting proxy as the host reaches the archive and the module
# proxy. Rebuilt only when the key (Go version, CA files, this script) changes.
#
#   base-images.sh STORAGE-ROOT
set -euo pipefail
cd "$(dirname "$0")/.."
root=$1
run=${BUILDAH_RUNROOT:-/tmp/numastream-buildah-run}
B=(buildah --root "$root" --runroot "$run" --storage-driver "${STORAGE_DRIVER:-overlay}")
export BUILDAH_ISOLATION=chroot

goroot=$(go env GOROOT)
key=$( { go version; cat /usr/local/share/ca-certificates/*.crt 2>/dev/null; cat "$0"; } | sha256sum | cut -c1-16)
stamp="$root/base-images.key"
if [[ -f $stamp && $(cat "$stamp") == "$key" ]] && "${B[@]}" inspect --type image gcr.io/distroless/static-debian12:nonroot >/dev/null 2>&1; then
  echo "base-images: up to date ($key)"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$root"

log="$work/mmdebstrap.log"
start=$SECONDS
# Slim as the official -slim images: no documentation, manual pages or locales; no apt lists.
mmdebstrap --variant=minbase --include=ca-certificates \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
  --customize-hook='cp /usr/local/share/ca-certificates/*.crt "$1/usr/local/share/ca-certificates/" 2>/dev/null || true' \
  --customize-hook='chroot "$1" update-ca-certificates >/dev/null' \
  bookworm "$work/rootfs.tar" http://deb.debian.org/debian >"$log" 2>&1 ||
  { tail -30 "$log"; echo "base-images: mmdebstrap failed (log above)" >&2; exit 1; }

commit() { # container image
  "${B[@]}" commit -q "$1" "$2" >/dev/null
  "${B[@]}" rm "$1" >/dev/null
}
c=$("${B[@]}" from scratch)
"${B[@]}" add "$c" "$work/rootfs.tar" / >/dev/null
"${B[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /bin/bash "$c"
commit "$c" docker.io/library/debian:bookworm-slim

c=$("${B[@]}" from docker.io/library/debian:bookworm-slim)
"${B[@]}" copy "$c" "$goroot" /usr/local/go >/dev/null
"${B[@]}" config --env PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --env GOPATH=/go --env GOPROXY="$(go env GOPROXY)" --env GOFLAGS="$(go env GOFLAGS)" --workingdir /go "$c"
commit "$c" docker.io/library/golang:1.26-bookworm

d="$work/distroless"
mkdir -p "$d/etc/ssl/certs" "$d/tmp" "$d/home/nonroot"
echo "root:x:0:0:root:/root:/sbin/nologin" >"$d/etc/passwd"
echo "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin" >>"$d/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$d/etc/group"
tar -xOf "$work/rootfs.tar" ./etc/ssl/certs/ca-certificates.crt >"$d/etc/ssl/certs/ca-certificates.crt"
chmod 1777 "$d/tmp"
chown 65532:65532 "$d/home/nonroot"
c=$("${B[@]}" from scratch)
"${B[@]}" copy "$c" "$d/" / >/dev/null
"${B[@]}" config --user 65532:65532 --workingdir /home/nonroot "$c"
commit "$c" gcr.io/distroless/static-debian12:nonroot
echo "$key" >"$stamp"
echo "base-images: debian:bookworm-slim, golang:1.26-bookworm, distroless/static-debian12:nonroot in $((SECONDS - start)) s ($key)"
