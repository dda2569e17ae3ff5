#!/usr/bin/env bash
# Runs commands at most N at a time, for suites whose parts mostly wait (paced streams, agents
# killed and restarted, a browser). Each command's output is printed whole once it ends, with its
# wall time; the exit is non-zero when any failed, and the last line names them.
#   side-by-side.sh N 'command' 'command' ...
set -uo pipefail
n=$1
shift
cmds=("$@")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
next=0 running=0 failed=()
launch() {
  local i=$next
  next=$((next + 1)) running=$((running + 1))
  (
    s=$(date +%s)
    bash -c "${cmds[$i]}" >"$dir/$i.log" 2>&1
    rc=$?
    echo "$rc $(($(date +%s) - s))" >"$dir/$i.tmp" && mv "$dir/$i.tmp" "$dir/$i.done"
  ) &
}
while ((next < ${#cmds[@]} && running < n)); do launch; done
while ((running > 0)); do
  wait -n
  for f in "$dir"/*.done; do
    [[ -e $f ]] || continue
    i=$(basename "$f" .done)
    read -r rc secs <"$f"
    rm "$f"
    running=$((running - 1))
    echo "--- ${cmds[$i]}: exit $rc, ${secs} s"
    cat "$dir/$i.log"
    ((rc == 0)) || failed+=("${cmds[$i]}")
  done
  while ((next < ${#cmds[@]} && running < n)); do launch; done
done
if ((${#failed[@]})); then
  printf 'side-by-side: failed: %s\n' "${failed[@]}" >&2
  exit 1
fi
