#!/usr/bin/env bash
# Runs a command with its output kept in a log instead of the terminal. When the command fails,
# prints the last lines of that log and the command to run it again, then exits with its status.
#
#   hack/quiet.sh LABEL -- COMMAND [ARGS...]
#
# LABEL names the step in the failure message ("fuzz: cmake build"). The log stays under
# ${QUIET_LOG_DIR:-build/logs} so a failure can be read in full.
set -uo pipefail
label=$1; shift
[[ "${1:-}" == "--" ]] && shift
dir=${QUIET_LOG_DIR:-build/logs}
mkdir -p "$dir"
log="$dir/$(tr -c 'A-Za-z0-9._-' '_' <<<"$label" | sed 's/_*$//').log"
"$@" >"$log" 2>&1
rc=$?
if ((rc != 0)); then
  {
    echo "---- $label FAILED (exit $rc); last lines of $log:"
    tail -n "${QUIET_TAIL:-40}" "$log"
    printf -- '---- to reproduce:'; printf ' %q' "$@"; echo
  } >&2
fi
exit "$rc"
