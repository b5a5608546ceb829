#!/usr/bin/env bash
# Installs what Switchyard needs on a fresh Debian machine. Idempotent and quiet
# when everything is already there.
#   scripts/setup.sh            Debian packages that build and run the engine (scripts/run.sh)
#   scripts/setup.sh --python   also those the test suite uses, and the Python environment
#                               of its interop tests (scripts/test.sh)
set -euo pipefail

packages=(
  cmake g++ make pkg-config ccache
  libabsl-dev libprotobuf-dev protobuf-compiler
  libopenblas-openmp-dev
  libgtest-dev libgmock-dev libbenchmark-dev  # configured with the tests
  libhdf5-dev
  libopenmpi-dev openmpi-bin
  libsentencepiece-dev
  nlohmann-json3-dev libcli11-dev
)
if [[ "${1:-}" == "--python" ]]; then
  packages+=(
    hdf5-tools
    slurmctld slurmd slurm-client munge  # tests/launch/test_slurm.py: a Slurm on localhost
    clang libclang-rt-14-dev libomp-dev  # scripts/fuzz.sh and scripts/sanitize.sh tsan
    python3-venv
    chromium  # renders the bench balance HTML report in a test
  )
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [[ "${1:-}" == "--python" ]]; then
  # Kept outside the clone so that every run (and CI) reuses it. transformers 4.x goes
  # into a folder of its own (put first on PYTHONPATH by the tests that check exports
  # against both release lines); the venv's packages serve it otherwise.
  here="$(dirname "$0")"
  venv="${SWITCHYARD_PYENV:-${XDG_CACHE_HOME:-$HOME/.cache}/switchyard/pyenv}"
  stamp="$venv/.switchyard-requirements"
  want="$(cat "$here/requirements-interop.txt" "$here/requirements-interop-transformers4.txt")"
  if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    echo "setup: preparing the Python interop environment in $venv (first run only)"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q -r "$here/requirements-interop.txt"
    rm -rf "$venv/transformers4"
    "$venv/bin/pip" install -q --no-deps --target "$venv/transformers4" \
      -r "$here/requirements-interop-transformers4.txt"
    printf '%s' "$want" > "$stamp"
  fi
fi
