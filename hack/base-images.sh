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
# For another architecture (ARCH arm64, each architecture in a storage of its own): Debian and
# distroless for that architecture, and golang for this machine's (the Dockerfile's builder runs
# on the build platform and cross-compiles). The arm64 root filesystem is bootstrapped through
# qemu (hack/binfmt-arm64.sh).
#
#   base-images.sh STORAGE-ROOT [ARCH]       (ARCH: amd64 or arm64; default this machine's)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$1
host_arch=$(dpkg --print-architecture)
arch=${2:-$host_arch}
[[ $arch == amd64 || $arch == arm64 ]] || { echo "base-images: architecture '$arch' is not amd64 or arm64" >&2; exit 2; }
run=${BUILDAH_RUNROOT:-/tmp/numastream-buildah-run}
B=(buildah --root "$root" --runroot "$run" --storage-driver "${STORAGE_DRIVER:-overlay}")
export BUILDAH_ISOLATION=chroot

goroot=$(go env GOROOT)
key=$( { echo "$arch"; go version; cat /usr/local/share/ca-certificates/*.crt 2>/dev/null; cat "$0"; } | sha256sum | cut -c1-16)
stamp="$root/base-images.key"
if [[ -f $stamp && $(cat "$stamp") == "$key" ]] && "${B[@]}" inspect --type image gcr.io/distroless/static-debian12:nonroot >/dev/null 2>&1; then
  echo "base-images: up to date ($key)"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$root"

start=$SECONDS
# Slim as the official -slim images: no documentation, manual pages or locales; no apt lists.
bootstrap() { # ARCH TAR
  local log="$work/mmdebstrap-$1.log"
  [[ $1 == "$host_arch" ]] || bash hack/binfmt-arm64.sh
  mmdebstrap --variant=minbase --architectures="$1" --include=ca-certificates \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
  --customize-hook='cp /usr/local/share/ca-certificates/*.crt "$1/usr/local/share/ca-certificates/" 2>/dev/null || true' \
  --customize-hook='chroot "$1" update-ca-certificates >/dev/null' \
  bookworm "$2" http://deb.debian.org/debian >"$log" 2>&1 ||
  { tail -30 "$log"; echo "base-images: mmdebstrap ($1) failed (log above)" >&2; exit 1; }
}
bootstrap "$host_arch" "$work/rootfs.tar"
target_rootfs=$work/rootfs.tar
if [[ $arch != "$host_arch" ]]; then
  target_rootfs=$work/rootfs-$arch.tar
  bootstrap "$arch" "$target_rootfs"
fi

commit() { # container image
  "${B[@]}" commit -q "$1" "$2" >/dev/null
  "${B[@]}" rm "$1" >/dev/null
}
debian() { # ROOTFS-TAR ARCH: a container of it
  c=$("${B[@]}" from scratch)
  "${B[@]}" add "$c" "$1" / >/dev/null
  "${B[@]}" config --os linux --arch "$2" --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /bin/bash "$c"
}
debian "$target_rootfs" "$arch"
commit "$c" docker.io/library/debian:bookworm-slim

debian "$work/rootfs.tar" "$host_arch"
"${B[@]}" copy "$c" "$goroot" /usr/local/go >/dev/null
"${B[@]}" config --env PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --env GOPATH=/go --env GOPROXY="$(go env GOPROXY)" --env GOFLAGS="$(go env GOFLAGS)" --workingdir /go "$c"
commit "$c" docker.io/library/golang:1.26-bookworm

d="$work/distroless"
mkdir -p "$d/etc/ssl/certs" "$d/tmp" "$d/home/nonroot"
echo "root:x:0:0:root:/root:/sbin/nologin" >"$d/etc/passwd"
echo "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin" >>"$d/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$d/etc/group"
tar -xOf "$target_rootfs" ./etc/ssl/certs/ca-certificates.crt >"$d/etc/ssl/certs/ca-certificates.crt"
chmod 1777 "$d/tmp"
chown 65532:65532 "$d/home/nonroot"
c=$("${B[@]}" from scratch)
"${B[@]}" copy "$c" "$d/" / >/dev/null
"${B[@]}" config --os linux --arch "$arch" --user 65532:65532 --workingdir /home/nonroot "$c"
commit "$c" gcr.io/distroless/static-debian12:nonroot
echo "$key" >"$stamp"
echo "base-images: debian:bookworm-slim, distroless/static-debian12:nonroot ($arch), golang:1.26-bookworm ($host_arch) in $((SECONDS - start)) s ($key)"
