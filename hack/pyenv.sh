#!/usr/bin/env bash
# A Python environment with the reference libraries the tests use as oracles (the bitshuffle
# package, h5py + hdf5plugin, cbor2) and the NeXus definitions: pinned wheels from PyPI, in a
# virtualenv cached under ~/.cache/numastream keyed by the requirements files. Prints the
# environment's python.
#   hack/pyenv.sh            create it if missing, print its python
set -euo pipefail
cd "$(dirname "$0")/.."
req=hack/requirements-oracle.txt
nxdl=hack/requirements-nxdl.txt  # a package for its data only: installed without its dependencies
sdist=hack/requirements-sdist.txt  # published as source only: built here (a C compiler, PyPI's build tools)
key=$(cat "$req" "$nxdl" "$sdist" | sha256sum | cut -c1-12)
dir=${NUMASTREAM_PYENV:-$HOME/.cache/numastream/pyenv-$key}
# shellcheck source=lib/lock.sh
source hack/lib/lock.sh
hold_lock "$dir.lock"
if [ ! -x "$dir/bin/python" ] || [ ! -f "$dir/.complete" ]; then
  rm -rf "$dir"
  export QUIET_LOG_DIR=${QUIET_LOG_DIR:-/tmp/numastream-pyenv}
  hack/quiet.sh "pyenv: /usr/bin/python3 -m venv $dir" -- /usr/bin/python3 -m venv "$dir" >&2
  hack/quiet.sh "pyenv: pip install (wheels: $(grep -v '^#' "$req" | tr '\n' ' '))" -- \
    "$dir/bin/pip" install --disable-pip-version-check --no-input --only-binary=:all: -r "$req" >&2
  hack/quiet.sh "pyenv: pip install --no-deps (data: $(grep -v '^#' "$nxdl" | tr '\n' ' '))" -- \
    "$dir/bin/pip" install --disable-pip-version-check --no-input --only-binary=:all: --no-deps -r "$nxdl" >&2
  hack/quiet.sh "pyenv: pip install (built from source: $(grep -v '^#' "$sdist" | tr '\n' ' '))" -- \
    "$dir/bin/pip" install --disable-pip-version-check --no-input -r "$sdist" >&2
  touch "$dir/.complete"
fi
echo "$dir/bin/python"
