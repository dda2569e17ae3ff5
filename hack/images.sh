#!/usr/bin/env bash
# Container images for the real nodes, as docker-archive tarballs that `ctr images import` takes
# (no registry is reachable and no container engine daemon runs here):
#   agent     `--target agent` of the project's Dockerfile (the agent and the node daemon)
#   operator  `--target operator` of the Dockerfile
#   sandbox   hack/sandbox-image.sh (not a product image)
# The Dockerfile is built with Debian's buildah (chroot isolation, no daemon) on local stand-ins
# of its base images (hack/base-images.sh), its storage cached in ~/.cache/numastream/buildah, and
# so are the Dockerfile's cache mounts (Go's caches, the agent's ccache): buildah keeps them in
# $TMPDIR/buildah-cache, which it is given there.
#
#   images.sh OUT-DIR [AGENT-TAG [OPERATOR-TAG]]
# IMAGE_FORMAT=oci-archive writes the agent and operator as OCI archives (what a release ships).
# WARM_ONLY=1 builds the base images and the builder stage only, writing nothing to OUT-DIR: its
# layers (the compiling) are then cached for the next build (make warm-tools).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$1
agent_tag=${2:-numastream/agent:facility}
operator_tag=${3:-numastream/operator:facility}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
store=${BUILDAH_ROOT:-$HOME/.cache/numastream/buildah}
# shellcheck source=lib/lock.sh
source hack/lib/lock.sh
hold_lock "$store.lock"
targets="build agent operator"
if [[ ${WARM_ONLY:-0} == 1 ]]; then
  targets=build
else
  mkdir -p "$out"
  bash hack/sandbox-image.sh "$out/sandbox.tar"
fi

B=(buildah --root "$store/storage" --runroot "${BUILDAH_RUNROOT:-/tmp/numastream-buildah-run}" --storage-driver "${STORAGE_DRIVER:-overlay}")
export BUILDAH_ISOLATION=chroot
mkdir -p "$store/tmp"
bash hack/base-images.sh "$store/storage"
# The builder stage is tagged too: its layers (what the Dockerfile installs and compiles) outlive
# the prune below, so the next build starts from them.
for target in $targets; do
  case $target in
    build) tag=numastream/build-stage:cache ;;
    agent) tag=$agent_tag ;;
    operator) tag=$operator_tag ;;
  esac
  log="$work/buildah-$target.log"
  start=$SECONDS
  hack/heartbeat.sh "images: buildah bud --target $target" --log "$log" -- \
    env TMPDIR="$store/tmp" "${B[@]}" bud --layers --pull=false --target "$target" -t "$tag" -f Dockerfile . ||
    { tail -40 "$log"; echo "images: buildah bud --target $target FAILED (last lines above)" >&2; exit 1; }
  if [[ $target == build ]]; then
    echo "images: the Dockerfile's builder stage (the agent and Go binaries compiled) in $((SECONDS - start)) s"
    continue
  fi
  rm -f "$out/$target.tar"
  "${B[@]}" push -q "$tag" "${IMAGE_FORMAT:-docker-archive}:$out/$target.tar:$tag" >>"$log" 2>&1 ||
    { tail -20 "$log"; echo "images: buildah push $tag FAILED" >&2; exit 1; }
  echo "images: $tag from the Dockerfile (--target $target) in $((SECONDS - start)) s"
done
[[ ${WARM_ONLY:-0} == 1 ]] && exit 0
# Layers of earlier builds that no tag uses any more.
"${B[@]}" rmi --prune >/dev/null 2>&1 || true
echo "images: $(cd "$out" && ls -s --block-size=M *.tar | tr '\n' ' ') ($agent_tag, $operator_tag, the sandbox)"
