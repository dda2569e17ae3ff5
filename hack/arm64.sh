#!/usr/bin/env bash
# The agent on arm64 (aarch64), from this x86-64 machine: cross-compiled with Debian's
# g++-aarch64-linux-gnu against a root filesystem of Debian's arm64 packages (mmdebstrap's extract
# variant: nothing of it runs here, so no emulator is needed to make it; cached in
# ~/.cache/numastream/arm64-sysroot-<key of its package list>), then run under qemu-aarch64:
#   1. the agent's unit tests (every codec kernel this CPU has: on arm64 the portable ones);
#   2. streams across the two architectures, each way, each codec (none, lz4, bslz4): a sender on
#      one and a receiver on the other, every chunk's checksum verified by the receiver, and the
#      receivers' files byte-identical to the ones this machine's own pair writes;
#   3. the Go programs (operator, node daemon, kubectl plugin) built for arm64, each saying its
#      version, and the unit tests of the Go packages they are made of.
#
#   arm64.sh [BUILD-DIR]       (default build/arm64; the native agent in bin/; GO_LDFLAGS as the
#                              Makefile builds the Go programs with: their version)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/arm64}
native=${NUMASTREAM_AGENT:-bin/numastream-agent}
for tool in aarch64-linux-gnu-g++ qemu-aarch64 mmdebstrap readelf; do
  command -v "$tool" >/dev/null ||
    { echo "arm64: $tool is missing (hack/install-deps.sh installs it)" >&2; exit 1; }
done
[[ -x $native ]] || { echo "arm64: the native agent $native is missing (make agent)" >&2; exit 1; }
native=$(realpath "$native")
export NUMASTREAM_AGENT=$native # the Go tests that check configs with the agent run this one

# The arm64 packages the agent builds and runs against: those hack/install-deps.sh installs for
# this machine (build group), as the arm64 libraries.
packages=libc6-dev,libstdc++6,libgcc-s1,libzmq3-dev,liblz4-dev,libnuma-dev,libsodium-dev,libxxhash-dev,libhdf5-dev,libcbor-dev,zlib1g-dev,libssl-dev,libgtest-dev,nlohmann-json3-dev
key=$(echo "bookworm $packages" | sha256sum | cut -c1-16)
sysroot=$HOME/.cache/numastream/arm64-sysroot-$key
if [[ ! -f $sysroot/.complete ]]; then
  rm -rf "$sysroot" "$sysroot.tmp"
  mmdebstrap --quiet --variant=extract --architectures=arm64 --include="$packages" bookworm "$sysroot.tmp" \
    http://deb.debian.org/debian >"$sysroot.log" 2>&1 ||
    { tail -20 "$sysroot.log"; echo "arm64: mmdebstrap could not make the arm64 sysroot" >&2; exit 1; }
  # What the packages' maintainer scripts would have made (they do not run in an extract): HDF5's
  # pkg-config name, an alternative of the serial build's.
  ln -sf hdf5-serial.pc "$sysroot.tmp/usr/lib/aarch64-linux-gnu/pkgconfig/hdf5.pc"
  touch "$sysroot.tmp/.complete"
  mv "$sysroot.tmp" "$sysroot"
fi

start=$SECONDS
export ARM64_SYSROOT=$sysroot PKG_CONFIG_SYSROOT_DIR=$sysroot
export PKG_CONFIG_LIBDIR=$sysroot/usr/lib/aarch64-linux-gnu/pkgconfig:$sysroot/usr/share/pkgconfig
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
hack/quiet.sh "arm64: cmake configure" -- cmake -S agent -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_TOOLCHAIN_FILE="$PWD/agent/cmake/aarch64-linux-gnu.cmake" -DNUMASTREAM_E2E=OFF "${launcher[@]}"
hack/quiet.sh "arm64: cross-compile the agent and its unit tests" -- \
  cmake --build "$build" -j "${JOBS:-$(nproc)}" --target numastream-agent agent_unit_tests
machine=$(readelf -h "$build/numastream-agent" | awk -F: '/Machine:/ { gsub(/^ +/, "", $2); print $2 }')
[[ $machine == AArch64 ]] || { echo "arm64: $build/numastream-agent is a program for '$machine', not AArch64" >&2; exit 1; }
echo "arm64: agent and unit tests cross-compiled in $((SECONDS - start)) s"
arm=(qemu-aarch64 -L "$sysroot" "$build/numastream-agent")

# 1. The unit tests, as arm64 runs them.
start=$SECONDS
log=$(mktemp)
work=$(mktemp -d)
trap 'rm -rf "$log" "$work"; jobs -p | xargs -r kill 2>/dev/null' EXIT
# Left out, for what qemu-user cannot do (not arm64's): a test that traces a child (ptrace) and one
# that binds memory to a NUMA node (qemu-user reports no NUMA); both run natively in test-agent.
emulator_cannot='SeriesSink.AGatewayKilledAtEveryWriteOfItsFilesPublishesEachImageOnceWhenStartedAgain'
emulator_cannot+=':BufferPool.AKernelThatRefusesBindingIsReportedOnceAndThePoolIsNotOnItsNode'
if ! qemu-aarch64 -L "$sysroot" "$build/agent_unit_tests" --gtest_brief=1 --gtest_filter="-$emulator_cannot" >"$log" 2>&1; then
  tail -60 "$log"
  echo "arm64: the agent's unit tests FAILED on arm64 (qemu-aarch64)" >&2
  exit 1
fi
echo "arm64: unit tests under qemu-aarch64: $(grep -E '^\[  PASSED  \]' "$log" | sed 's/^\[  PASSED  \] //') in $((SECONDS - start)) s"

# 2. Streams across the two architectures. A free port pair on the loopback.
port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
# stream NAME CODEC SENDER... -- RECEIVER...: 40 chunks of 1 MiB, two connections; the receiver's
# summary must say 40 chunks, none lost or corrupt; its file is $work/NAME.raw.
stream() {
  local name=$1 codec=$2 p
  shift 2
  local tx=() rx=()
  while [[ $1 != -- ]]; do tx+=("$1"); shift; done
  shift
  rx=("$@")
  # The port is free when chosen, but the suites beside this one pick ports too: a receiver that
  # finds its port taken before it binds is started again on another (at most 5 tries).
  local rx_pid tries
  for tries in 1 2 3 4 5; do
    p=$(port)
    "${rx[@]}" receive --endpoint "tcp://127.0.0.1:$p" --connections 2 --chunk-bytes 1048576 --idle-timeout 60 \
      --sink file --sink-path "$work/$name.raw" >"$work/$name.rx" 2>"$work/$name.rx.err" &
    rx_pid=$!
    local waited=0
    until ss -ltn "sport = :$p" | grep -q ":$p " || ! kill -0 "$rx_pid" 2>/dev/null || ((waited >= 100)); do
      sleep 0.1
      waited=$((waited + 1))
    done
    kill -0 "$rx_pid" 2>/dev/null && break
    wait "$rx_pid" || true
    echo "arm64: $name: the receiver did not start on port $p (try $tries): $(tail -1 "$work/$name.rx.err")" >&2
  done
  if ! "${tx[@]}" send --endpoint "tcp://127.0.0.1:$p" --connections 2 --chunk-bytes 1048576 --connect-timeout 60 \
    --chunks 40 --codec "$codec" --seed 11 >"$work/$name.tx" 2>"$work/$name.tx.err"; then
    tail -20 "$work/$name.tx.err"
    echo "arm64: $name: the sender failed; the receiver said:" >&2
    tail -20 "$work/$name.rx.err" >&2
    return 1
  fi
  if ! wait "$rx_pid"; then
    tail -20 "$work/$name.rx.err"
    echo "arm64: $name: the receiver failed" >&2
    return 1
  fi
  python3 - "$name" "$work/$name.rx" <<'EOF'
import json, sys
name, path = sys.argv[1:]
s = json.loads(open(path).read().strip().splitlines()[-1])
bad = {k: s[k] for k in ("chunks", "lost", "corrupt", "duplicates", "complete") if s[k] != {"chunks": 40, "complete": True}.get(k, 0)}
if bad:
    sys.exit(f"arm64: {name}: the receiver's summary says {bad}")
EOF
}
start=$SECONDS
for codec in none lz4 bslz4; do
  stream "x86-$codec" "$codec" "$native" -- "$native"
  stream "arm64-to-x86-$codec" "$codec" "${arm[@]}" -- "$native"
  stream "x86-to-arm64-$codec" "$codec" "$native" -- "${arm[@]}"
  for pair in arm64-to-x86 x86-to-arm64; do
    cmp -s "$work/x86-$codec.raw" "$work/$pair-$codec.raw" ||
      { echo "arm64: $pair ($codec): the receiver's file differs from the one x86-64 alone writes" >&2; exit 1; }
  done
done
echo "arm64: streams arm64 -> x86-64 and x86-64 -> arm64 (codecs none, lz4, bslz4; 40 MiB each): every chunk verified," \
  "each file byte-identical to x86-64's own, in $((SECONDS - start)) s"

# 3. The Go programs for arm64 (static: CGO_ENABLED=0, as the images carry them), and the unit
# tests of every package of theirs, under qemu-aarch64. Not internal/version's: it runs the
# programs it builds as this machine runs programs (qemu-user only runs what it is handed). The
# tests that need a kube-apiserver (envtest) skip here, as they do outside make test-operator,
# which runs them.
start=$SECONDS
export GOARCH=arm64 CGO_ENABLED=0
go build -ldflags "${GO_LDFLAGS:-}" -o "$build/go/" ./cmd/...
version=$(cat VERSION)
for program in operator node-daemon kubectl-numastream; do
  said=$(qemu-aarch64 "$build/go/$program" --version 2>&1) ||
    { echo "arm64: $program --version failed: $said" >&2; exit 1; }
  [[ $said == *" $version ("* ]] || { echo "arm64: $program --version says '$said', not $version" >&2; exit 1; }
done
packages=$(go list ./api/... ./internal/... | grep -v '/internal/version$')
# shellcheck disable=SC2086 # one argument per package
if ! go test -count=1 -exec qemu-aarch64 $packages >"$log" 2>&1; then
  grep -v '^ok ' "$log" | tail -60
  echo "arm64: the Go packages' unit tests FAILED on arm64 (qemu-aarch64)" >&2
  exit 1
fi
echo "arm64: operator, node-daemon and kubectl-numastream built for arm64, each saying $version; the unit tests of" \
  "$(grep -c '^ok ' "$log") Go packages pass under qemu-aarch64, in $((SECONDS - start)) s"
