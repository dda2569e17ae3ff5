#!/usr/bin/env bash
# Installs the Debian packages the project builds and tests against, each named explicitly
# (installed with --no-install-recommends, so nothing arrives through Recommends). Idempotent:
# when everything is present it only checks (well under a second) and installs nothing.
#
#   install-deps.sh [build|test|all]     (default all)
#     build  what `make agent` and `make operator` need
#     build-ARCH  the same to build for ARCH (amd64, arm64): this machine's architecture is
#            build; another is its cross compiler and its libraries (Debian multiarch), what the
#            Dockerfile's builder uses for a target platform other than its own
#     test   + what `make test` and `make demo` need on top: clang's libFuzzer/ASan runtime,
#            network namespaces and shaping, the real nodes' container runtime and CNI plugins
#
# hack/check-deps.sh then proves that each toolchain links and runs a program.
set -euo pipefail
cd "$(dirname "$0")/.."
group=${1:-all}

tools=(
  build-essential cmake ninja-build pkg-config
  # a compiler cache: a fresh clone recompiles only what changed (the Makefile's CCACHE_DIR)
  ccache
  nlohmann-json3-dev ca-certificates git
)
libs=(
  liblz4-dev libnuma-dev libzmq3-dev libsodium-dev libxxhash-dev
  # HDF5 files in and out (direct chunk I/O)
  libhdf5-dev
  # CBOR: DECTRIS Stream V2 messages
  libcbor-dev
  # zlib: the live preview's PNG pictures
  zlib1g-dev
  # OpenSSL: the metrics port's HTTPS
  libssl-dev
)
build=("${tools[@]}" "${libs[@]}")
test=(
  googletest libgtest-dev
  # libFuzzer + ASan/UBSan with clang: the runtimes are in libclang-rt-14-dev, which clang only
  # Recommends.
  clang libclang-rt-14-dev
  # make check: the agent's formatting and clang-tidy (agent/.clang-tidy)
  clang-format clang-tidy-14
  # fault tests and the facility in a box: namespaces, veth, tc, nftables drop rules; a stalled
  # filesystem (an ext4 image on a loop device, frozen with fsfreeze)
  iproute2 nftables procps util-linux e2fsprogs
  # the facility's NetworkPolicy enforcer: its NFQUEUE diversion rules (iptables-legacy)
  iptables
  # real kubelet nodes: container runtime, CNI plugins, a static busybox for the sandbox image
  containerd runc containernetworking-plugins busybox-static
  # images from the Dockerfile without a daemon or a registry: buildah, base root filesystems
  buildah golang-github-containers-common mmdebstrap
  # a release's images into a private registry, as a facility installs them: the facility in a
  # box runs Debian's distribution registry (TLS, htpasswd) and pushes with skopeo
  docker-registry skopeo apache2-utils openssl
  python3 curl tar
  # the agent on arm64 (make test-arm64): a cross compiler, and qemu-user to run what it
  # builds (the arm64 libraries come from mmdebstrap, above, into a cached sysroot)
  g++-aarch64-linux-gnu qemu-user
  # the arm64 images (make release): the Dockerfile's RUN on an arm64 base, through binfmt
  # (hack/binfmt-arm64.sh), and mmdebstrap bootstrapping an arm64 Debian
  qemu-user-static arch-test
  # the reference libraries the oracle tests use live in a virtualenv (hack/pyenv.sh)
  python3-venv
  # h5dump, to read back the files the gateway writes; LZ4/bz2 filters for datasets we read as pixels
  hdf5-tools hdf5-filter-plugin
  # a real browser (headless) for the gateway's live preview page
  chromium
  # the field's own programs that open the NXmx series the gateway writes: DIALS (dials.import,
  # dxtbx), and the bitshuffle filter its HDF5 reads bslz4 images with
  python3-dials bitshuffle
  # headers for the reference decoder pyenv.sh builds from source (dectris-compression)
  python3-dev
)
host_arch=$(dpkg --print-architecture)
cross=
[[ $group == "build-$host_arch" ]] && group=build
case "$group" in
  build) packages=("${build[@]}") ;;
  build-arm64) cross=arm64 packages=("${tools[@]}" g++-aarch64-linux-gnu "${libs[@]/%/:arm64}") ;;
  test | all) packages=("${build[@]}" "${test[@]}") ;;
  *) echo "install-deps: unknown group '$group' (build, build-amd64, build-arm64, test or all)" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO=sudo
  else
    echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
else
  SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
if [[ -n $cross ]] && ! dpkg --print-foreign-architectures | grep -qx "$cross"; then
  $SUDO dpkg --add-architecture "$cross"
fi
export QUIET_LOG_DIR=${QUIET_LOG_DIR:-/tmp/numastream-install-deps}
hack/quiet.sh "apt-get update" -- $SUDO apt-get update -qq
hack/quiet.sh "apt-get install" -- $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: done"
