#!/usr/bin/env bash
# Installs the Debian packages the project builds against. Idempotent: when everything is
# present it only checks (well under a second) and installs nothing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  liblz4-dev libnuma-dev libzmq3-dev libsodium-dev libxxhash-dev nlohmann-json3-dev
  googletest libgtest-dev
  curl
  clang iproute2 nftables
)

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
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
