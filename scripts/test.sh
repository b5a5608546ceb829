#!/usr/bin/env bash
# Installs what is missing (Debian packages and the Python interop environment), builds,
# and runs the whole test suite with ctest. Without arguments it then runs the CPU suite
# under ASan+UBSan, its threaded parts under TSan (scripts/sanitize.sh) and every fuzz
# target for SWITCHYARD_FUZZ_SECONDS (default 20) each (scripts/fuzz.sh); arguments go to
# ctest alone. At the end (or at the stage that failed) it prints each stage's time and
# the ten slowest tests.
set -euo pipefail
cd "$(dirname "$0")/.."

stages=()
# Runs "$@" as the stage named $1's remainder, timing it.
stage() {
  local name="$1" start=$SECONDS
  shift
  echo "test.sh: $name"
  "$@"
  stages+=("$(printf '%-28s %5d s' "$name" $((SECONDS - start)))")
}
report() {
  local status=$?
  echo "test.sh: stage times"
  printf '  %s\n' "${stages[@]}"
  # The report reads all of sort's output: a reader that stops early (head) would kill
  # sort with SIGPIPE, and under pipefail that 141 became the script's exit status.
  if [[ -f build/ctest.log ]]; then
    echo "test.sh: the ten slowest tests"
    sed -nE 's/^.*Test +#[0-9]+: ([^ ]+) .*[^0-9]([0-9]+\.[0-9]+) sec$/\2 \1/p' build/ctest.log |
      sort -rn | awk 'NR <= 10 { printf "  %8.1f s  %s\n", $1, $2 }'
  fi
  return "$status"
}
trap report EXIT

stage "install" scripts/setup.sh --python
stage "build" scripts/build.sh
stage "ctest" bash -o pipefail -c \
  'cd build && ctest --output-on-failure -j"$(nproc)" "$@" | tee ctest.log' ctest "$@"
if (($# == 0)); then
  stage "asan+ubsan" scripts/sanitize.sh asan
  stage "tsan" scripts/sanitize.sh tsan
  stage "fuzz" scripts/fuzz.sh "${SWITCHYARD_FUZZ_SECONDS:-20}"
fi
