#!/usr/bin/env bash
# One root filesystem directory as a one-layer docker-archive tarball that `ctr images import`
# takes (no registry is reachable and no container engine daemon runs here).
#
#   image-archive.sh ROOTFS-DIR CONFIG-JSON OUTPUT-TAR TAG...
# CONFIG-JSON is the image configuration with @DIFF@ where the layer's digest goes.
set -euo pipefail
(($# >= 4)) || { echo "usage: $0 ROOTFS-DIR CONFIG-JSON OUTPUT-TAR TAG..." >&2; exit 2; }
dir=$1 config=$2 tarball=$3
shift 3
img=$(mktemp -d)
trap 'rm -rf "$img"' EXIT
tar -C "$dir" --owner=0 --group=0 -cf "$img/layer.tar" .
diff=$(sha256sum "$img/layer.tar" | cut -d' ' -f1)
sed "s/@DIFF@/$diff/" <<<"$config" >"$img/config.json"
tags=$(printf '"%s",' "$@")
printf '[{"Config":"config.json","RepoTags":[%s],"Layers":["layer.tar"]}]' "${tags%,}" >"$img/manifest.json"
tar -C "$img" -cf "$tarball" manifest.json config.json layer.tar
