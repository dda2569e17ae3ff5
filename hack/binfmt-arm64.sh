#!/usr/bin/env bash
# Lets this machine's kernel run arm64 programs through qemu-aarch64-static (binfmt_misc), as
# docker's setup-qemu does for buildx: what building the arm64 images needs for the Dockerfile's
# RUN steps on an arm64 base. Registered with the F flag (the kernel keeps the emulator open), so it
# works inside the build's chroot. Idempotent; needs root the first time.
set -euo pipefail
entry=/proc/sys/fs/binfmt_misc/qemu-aarch64
conf=/usr/lib/binfmt.d/qemu-aarch64.conf # from Debian's qemu-user-static
if [[ -f $entry ]] && grep -qx enabled "$entry" && grep -q '^flags: .*F' "$entry"; then
  exit 0
fi
[[ -f $conf ]] || { echo "binfmt-arm64: $conf is missing (install qemu-user-static: hack/install-deps.sh)" >&2; exit 1; }
if [[ ! -w /proc/sys/fs/binfmt_misc/register ]]; then
  mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null ||
    { echo "binfmt-arm64: binfmt_misc is not mounted and cannot be (need root): arm64 images cannot be built here" >&2; exit 1; }
fi
[[ -f $entry ]] && echo -1 >"$entry" # registered without F: replace it
grep -v '^#' "$conf" >/proc/sys/fs/binfmt_misc/register ||
  { echo "binfmt-arm64: the kernel refused the qemu-aarch64 entry of $conf" >&2; exit 1; }
echo "binfmt-arm64: arm64 programs run through $(sed -n 's/^interpreter //p' "$entry")"
