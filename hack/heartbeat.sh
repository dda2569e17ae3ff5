#!/usr/bin/env bash
# Runs a long step with its own output as it comes and, every HEARTBEAT_EVERY seconds (default
# 60), a line on stderr saying it still runs and for how long: a cold build that compiles for many
# minutes is never silent. Exits with the command's status.
#
#   hack/heartbeat.sh LABEL [--log FILE] -- COMMAND [ARGS...]
#
# --log FILE sends the command's output to FILE instead (the heartbeat stays on stderr).
set -uo pipefail
label=$1; shift
log=""
[[ "${1:-}" == "--log" ]] && { log=$2; shift 2; }
[[ "${1:-}" == "--" ]] && shift
every=${HEARTBEAT_EVERY:-60}
start=$(date +%s)
(
  # Its sleep ends with it: a sleep left behind would keep the caller's files open (a build's lock).
  nap=""
  trap '[[ -n $nap ]] && kill "$nap" 2>/dev/null; exit 0' TERM
  while :; do
    sleep "$every" &
    nap=$!
    wait "$nap"
    echo "[$(date +%H:%M:%S)] $label: still running ($(( $(date +%s) - start )) s so far)" >&2
  done
) &
beat=$!
trap 'kill "$beat" 2>/dev/null' EXIT
if [[ -n "$log" ]]; then "$@" >"$log" 2>&1; else "$@"; fi
rc=$?
kill "$beat" 2>/dev/null
wait "$beat" 2>/dev/null
took=$(( $(date +%s) - start ))
((took >= every)) && echo "[$(date +%H:%M:%S)] $label: finished in $took s (exit $rc)" >&2
exit "$rc"
