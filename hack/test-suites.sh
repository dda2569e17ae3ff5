#!/usr/bin/env bash
# make test: runs the suites (make targets) one after another and ends with a table of each one's
# wall time and the total, against the budget in docs/development.md. A suite that fails does not
# stop the others (as make -k); the table names every one that failed and the exit is non-zero.
# Suites joined by "+" run side by side (one of them mostly waits, or runs for a fixed time), each
# one's output printed whole once both ended. A target written @TARGET starts in the background at
# its place, at the lowest CPU and I/O priority, and runs beside the suites after it (its output
# printed at the end): the tool builds, which take only the CPU the tests leave idle, and which a
# suite that needs a tool still being built waits for (hack/lib/lock.sh).
#   test-suites.sh [@]TARGET[+TARGET]...
set -uo pipefail
budget_min=45
make_cmd=${MAKE:-make}
names=() secs=() states=() failed=()
status=0
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# record TARGET SECONDS RC [BESIDE]: a row of the table.
record() {
  names+=("$1") secs+=("$2")
  if [ "$3" -ne 0 ]; then
    states+=("FAILED (exit $3)${4:+ beside $4}")
    failed+=("$1")
    status=$3
  else
    states+=("ok${4:+ beside $4}")
  fi
}

bg_names=() bg_pids=()
t0=$(date +%s)
for group in "$@"; do
  if [[ $group == @* ]]; then
    target=${group#@}
    prio=(nice -n 19)
    command -v ionice >/dev/null && prio+=(ionice -c 3)
    s=$(date +%s)
    (
      "${prio[@]}" "$make_cmd" --no-print-directory "$target" >"$logs/$target.log" 2>&1
      echo "$? $(($(date +%s) - s))" >"$logs/$target.rc"
    ) &
    bg_names+=("$target") bg_pids+=($!)
    echo "make test: $target runs in the background (its output at the end)"
    continue
  fi
  IFS=+ read -ra targets <<<"$group"
  if [ "${#targets[@]}" -eq 1 ]; then
    s=$(date +%s)
    "$make_cmd" --no-print-directory "$group"
    rc=$?
    record "$group" $(($(date +%s) - s)) "$rc"
    continue
  fi
  pids=()
  for target in "${targets[@]}"; do
    (
      s=$(date +%s)
      "$make_cmd" --no-print-directory "$target" >"$logs/$target.log" 2>&1
      echo "$? $(($(date +%s) - s))" >"$logs/$target.rc"
    ) &
    pids+=($!)
  done
  wait "${pids[@]}"  # not the background targets
  for target in "${targets[@]}"; do
    cat "$logs/$target.log"
    read -r rc sec <"$logs/$target.rc"
    others=$(printf '%s\n' "${targets[@]}" | grep -vx "$target" | paste -sd, -)
    record "$target" "$sec" "$rc" "$others"
  done
done
for i in "${!bg_names[@]}"; do
  wait "${bg_pids[$i]}"
  echo "--- ${bg_names[$i]} (in the background) ---"
  cat "$logs/${bg_names[$i]}.log"
  read -r rc sec <"$logs/${bg_names[$i]}.rc"
  record "${bg_names[$i]}" "$sec" "$rc" "the suites after it, niced"
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
