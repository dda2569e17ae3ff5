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
# PLATFORMS="amd64 arm64" (with oci-archive) builds each image for both and writes it as one image
# index (multi-arch): the arm64 build cross-compiles in the builder and runs the agent image's
# RUN through qemu (hack/binfmt-arm64.sh); each architecture has a buildah storage of its own.
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

host_arch=$(dpkg --print-architecture)
read -r -a platforms <<<"${PLATFORMS:-$host_arch}"
if ((${#platforms[@]} > 1)) && [[ ${IMAGE_FORMAT:-} != oci-archive && ${WARM_ONLY:-0} != 1 ]]; then
  echo "images: PLATFORMS='${platforms[*]}' needs IMAGE_FORMAT=oci-archive (one image index per image)" >&2
  exit 2
fi
export BUILDAH_ISOLATION=chroot
mkdir -p "$store/tmp"
for arch in "${platforms[@]}"; do
  # This machine's architecture in the storage the facility's images always used; another in its own.
  storage=$store/storage runroot=${BUILDAH_RUNROOT:-/tmp/numastream-buildah-run}
  if [[ $arch != "$host_arch" ]]; then
    storage=$store/storage-$arch runroot=$runroot-$arch
    bash hack/binfmt-arm64.sh
  fi
  B=(buildah --root "$storage" --runroot "$runroot" --storage-driver "${STORAGE_DRIVER:-overlay}")
  BUILDAH_RUNROOT=$runroot bash hack/base-images.sh "$storage" "$arch"
  # The target architecture as build arguments, not --platform: with --platform, Debian's buildah
  # (1.28) looks every base up for the target, the builder's too (FROM --platform=$BUILDPLATFORM
  # is not honoured), and this storage holds that one for this machine. Each image takes its
  # base's architecture (hack/oci-index.py checks it).
  platform_args=(--build-arg "TARGETARCH=$arch" --build-arg "TARGETPLATFORM=linux/$arch")
  # The builder stage is tagged too: its layers (what the Dockerfile installs and compiles) outlive
  # the prune below, so the next build starts from them.
  for target in $targets; do
    case $target in
      build) tag=numastream/build-stage:cache ;;
      agent) tag=$agent_tag ;;
      operator) tag=$operator_tag ;;
    esac
    log="$work/buildah-$target-$arch.log"
    start=$SECONDS
    hack/heartbeat.sh "images: buildah bud --target $target (linux/$arch)" --log "$log" -- \
      env TMPDIR="$store/tmp" "${B[@]}" bud --layers --pull=false "${platform_args[@]}" --target "$target" -t "$tag" -f Dockerfile . ||
      { tail -40 "$log"; echo "images: buildah bud --target $target (linux/$arch) FAILED (last lines above)" >&2; exit 1; }
    if [[ $target == build ]]; then
      echo "images: the Dockerfile's builder stage for linux/$arch (the agent and Go binaries compiled) in $((SECONDS - start)) s"
      continue
    fi
    if ((${#platforms[@]} == 1)); then
      rm -f "$out/$target.tar"
      "${B[@]}" push -q "$tag" "${IMAGE_FORMAT:-docker-archive}:$out/$target.tar:$tag" >>"$log" 2>&1 ||
        { tail -20 "$log"; echo "images: buildah push $tag FAILED" >&2; exit 1; }
    else
      "${B[@]}" push -q "$tag" "oci:$work/layout-$target:$arch" >>"$log" 2>&1 ||
        { tail -20 "$log"; echo "images: buildah push $tag ($arch) FAILED" >&2; exit 1; }
    fi
    echo "images: $tag for linux/$arch from the Dockerfile (--target $target) in $((SECONDS - start)) s"
  done
  [[ ${WARM_ONLY:-0} == 1 ]] && continue
  # Layers of earlier builds that no tag uses any more.
  "${B[@]}" rmi --prune >/dev/null 2>&1 || true
done
[[ ${WARM_ONLY:-0} == 1 ]] && exit 0
if ((${#platforms[@]} > 1)); then
  for target in agent operator; do
    tag=$agent_tag
    [[ $target == operator ]] && tag=$operator_tag
    python3 hack/oci-index.py "$work/layout-$target" "$tag" "$out/$target.tar" "${platforms[@]}" ||
      { echo "images: could not make the $tag image index" >&2; exit 1; }
  done
fi
echo "images: $(cd "$out" && ls -s --block-size=M *.tar | tr '\n' ' ') ($agent_tag, $operator_tag for ${platforms[*]}, the sandbox)"
