#!/usr/bin/env bash
# Proves that every toolchain the suite uses can actually produce a working binary on this
# machine, not just that a package name is installed: each check compiles, links and runs a
# one-line program. A failing check names the Debian package that provides what is missing
# (hack/install-deps.sh installs them all) and prints the compiler's own message.
#
#   hack/check-deps.sh            exit 0 when everything works, 1 otherwise (all checks run)
set -uo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
ok=0
run_args=() # arguments for the next built program

# check NAME PACKAGE SOURCE-EXT SOURCE -- BUILD-COMMAND... ; the program is $work/NAME.bin
check() {
  local name=$1 pkg=$2 ext=$3 src=$4; shift 5
  printf '%s\n' "$src" >"$work/$name.$ext"
  local cmd=("${@//@SRC@/$work/$name.$ext}")
  cmd=("${cmd[@]//@OUT@/$work/$name.bin}")
  if ! "${cmd[@]}" >"$work/$name.log" 2>&1; then
    report "$name" "$pkg" "build failed: $(printf '%q ' "${cmd[@]}")"
    return
  fi
  if ! "$work/$name.bin" "${run_args[@]}" >>"$work/$name.log" 2>&1; then
    report "$name" "$pkg" "the built program did not run"
    return
  fi
  ok=$((ok + 1))
}
report() {
  failed=$((failed + 1))
  echo "check-deps: $1: FAILED — install Debian package(s): $2" >&2
  echo "  $3" >&2
  sed 's/^/  | /' "$work/$1.log" | tail -n 12 >&2
}
tool() { # NAME PACKAGE COMMAND...
  local name=$1 pkg=$2; shift 2
  if "$@" >"$work/$name.log" 2>&1; then ok=$((ok + 1)); else report "$name" "$pkg" "$(printf '%q ' "$@")failed"; fi
}

tool cmake cmake cmake --version
tool ninja ninja-build ninja --version
tool pkg-config pkg-config pkg-config --version
tool go "Go 1.26 (https://go.dev/dl)" go version
tool python3 python3 python3 -c 'import json, struct'
tool ip iproute2 ip -V
tool tc iproute2 tc -V
tool nft nftables nft --version
tool curl curl curl --version
tool pgrep procps pgrep --version
tool buildah buildah buildah --version
tool mmdebstrap mmdebstrap mmdebstrap --version
tool ldd libc-bin ldd --version
# The agent for arm64 (make test-arm64): the cross compiler links a program qemu-user runs.
tool arm64 "g++-aarch64-linux-gnu qemu-user" sh -c "printf 'int main() { return 0; }\n' |
  aarch64-linux-gnu-g++ -static -x c++ - -o '$work/arm64.bin' && qemu-aarch64 '$work/arm64.bin'"
# The arm64 images (make release): the kernel runs that program itself (binfmt, qemu-user-static).
tool binfmt-arm64 "qemu-user-static arch-test" sh -c "bash hack/binfmt-arm64.sh && '$work/arm64.bin'"

main='int main() { return 0; }'
check cxx20 "build-essential (g++)" cpp '#include <span>
#include <thread>
int main() { std::thread t([] {}); t.join(); return std::span<int>().size(); }' \
  -- g++ -std=c++20 -pthread @SRC@ -o @OUT@
pc() { pkg-config --cflags --libs "$1" 2>/dev/null || echo "-l$1-not-found-by-pkg-config"; }
check lz4 liblz4-dev cpp '#include <lz4.h>
int main() { return LZ4_compressBound(100) > 0 ? 0 : 1; }' -- g++ @SRC@ -o @OUT@ $(pc liblz4)
check zmq libzmq3-dev cpp '#include <zmq.h>
int main() { void* c = zmq_ctx_new(); return zmq_ctx_term(c); }' -- g++ @SRC@ -o @OUT@ $(pc libzmq)
check xxhash libxxhash-dev cpp '#include <xxhash.h>
int main() { return XXH3_64bits("a", 1) == 0; }' -- g++ @SRC@ -o @OUT@ $(pc libxxhash)
check sodium libsodium-dev cpp '#include <sodium.h>
int main() { return sodium_init() < 0; }' -- g++ @SRC@ -o @OUT@ $(pc libsodium)
check cbor libcbor-dev cpp '#include <cbor.h>
int main() { struct cbor_load_result r; cbor_item_t* i = cbor_load((const unsigned char*)"\xa0", 1, &r); int bad = !i || !cbor_isa_map(i); if (i) cbor_decref(&i); return bad; }' -- g++ @SRC@ -o @OUT@ $(pc libcbor)
check openssl libssl-dev cpp '#include <openssl/ssl.h>
int main() { SSL_CTX* c = SSL_CTX_new(TLS_server_method()); int bad = !c; SSL_CTX_free(c); return bad; }' -- g++ @SRC@ -o @OUT@ $(pc openssl)
check numa libnuma-dev cpp '#include <numa.h>
int main() { (void)numa_available(); return 0; }' -- g++ @SRC@ -o @OUT@ -lnuma
check json nlohmann-json3-dev cpp '#include <nlohmann/json.hpp>
int main() { return nlohmann::json::parse("{\"a\":1}")["a"] == 1 ? 0 : 1; }' -- g++ -std=c++20 @SRC@ -o @OUT@
check gtest "googletest libgtest-dev" cpp '#include <gtest/gtest.h>
TEST(CheckDeps, Links) { EXPECT_EQ(1, 1); }' -- g++ -std=c++20 -pthread @SRC@ -o @OUT@ -lgtest_main -lgtest
check gcc-asan "build-essential (gcc's libasan, libubsan)" cpp "$main" \
  -- g++ -fsanitize=address,undefined @SRC@ -o @OUT@
check gcc-tsan "build-essential (gcc's libtsan)" cpp "$main" \
  -- g++ -fsanitize=thread @SRC@ -o @OUT@
# A libFuzzer program without arguments fuzzes forever: run it on one input.
run_args=(-runs=1)
check clang-fuzzer "clang libclang-rt-14-dev" cpp '#include <cstddef>
#include <cstdint>
extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }' \
  -- clang++ -fsanitize=fuzzer,address,undefined @SRC@ -o @OUT@
run_args=()

if ((failed)); then
  echo "check-deps: $failed check(s) failed, $ok passed; run: bash hack/install-deps.sh" >&2
  exit 1
fi
echo "check-deps: $ok toolchain checks passed (compilers, libraries, sanitizers, libFuzzer, tools)"
