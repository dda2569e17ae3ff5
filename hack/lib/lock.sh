# Sourced by the scripts that build into a shared cache (~/.cache/numastream): one build at a time
# per cache, a second caller waiting for the first and then finding it built. `make test` builds
# the tools in the background beside the first suites (make warm-tools); a suite that needs one
# still being built waits for it instead of building it a second time.
#   hold_lock FILE   (held on fd 9 until the script exits)
hold_lock() {
  mkdir -p "$(dirname "$1")"
  exec 9>"$1"
  if ! flock -n 9; then
    local since=$SECONDS
    echo "[$(date +%H:%M:%S)] waiting for $1: another build of it is under way" >&2
    flock 9
    echo "[$(date +%H:%M:%S)] $1: the other build ended after $((SECONDS - since)) s of waiting" >&2
  fi
}
