#!/usr/bin/env bash
# make test: runs the suites (make targets) one after another and ends with a table of each one's
# wall time and the total, against the budget in docs/development.md. A suite that fails does not
# stop the others (as make -k); the table names every one that failed and the exit is non-zero.
#   test-suites.sh TARGET...
set -uo pipefail
budget_min=45
make_cmd=${MAKE:-make}
names=() secs=() states=() failed=()
status=0
t0=$(date +%s)
for target in "$@"; do
  s=$(date +%s)
  "$make_cmd" --no-print-directory "$target"
  rc=$?
  names+=("$target") secs+=($(($(date +%s) - s)))
  if [ "$rc" -ne 0 ]; then
    states+=("FAILED (exit $rc)")
    failed+=("$target")
    status=$rc
  else
    states+=("ok")
  fi
done
total=$(($(date +%s) - t0))
echo
echo "make test: wall time per suite (budget: ${budget_min} min for all, docs/development.md)"
printf '  %-18s %8s  %s\n' suite seconds result
for i in "${!names[@]}"; do
  printf '  %-18s %8d  %s\n' "${names[$i]}" "${secs[$i]}" "${states[$i]}"
done
printf '  %-18s %8d  %s\n' total "$total" "$(awk -v t="$total" -v b="$budget_min" 'BEGIN { printf "%.1f min of %d", t / 60, b }')"
if [ "$status" -ne 0 ]; then
  echo "make test: failed: ${failed[*]}" >&2
  exit "$status"
fi
echo "make test: all suites passed"
