#!/usr/bin/env bash
# The real nodes' sandbox (pause) image, and a shell image for checks: Debian's static busybox as
# a one-layer archive tagged as containerd's sandbox image and local.numastream/busybox:1 (not a
# product image: assembled here, imported into each node, never pulled).
#
#   sandbox-image.sh OUTPUT-TAR
set -euo pipefail
cd "$(dirname "$0")/.."
(($# == 1)) || { echo "usage: $0 OUTPUT-TAR" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sandbox=$(containerd config default | sed -n 's/^ *sandbox_image = "\(.*\)"/\1/p')
bb="$work/rootfs-busybox"
mkdir -p "$bb/bin"
cp /bin/busybox "$bb/bin/"
for x in sh sleep cat env grep ls ip wc; do ln -sf busybox "$bb/bin/$x"; done
bash hack/image-archive.sh "$bb" '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/bin/sleep","2147483647"],"Env":["PATH=/bin"]},"rootfs":{"type":"layers","diff_ids":["sha256:@DIFF@"]}}' \
  "$1" "$sandbox" local.numastream/busybox:1
