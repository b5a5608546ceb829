#!/usr/bin/env bash
# Installs what is missing (Debian packages and the Python interop environment), builds,
# and runs the whole test suite with ctest. Without arguments it then runs the CPU suite
# under ASan+UBSan, its threaded parts under TSan (scripts/sanitize.sh) and every fuzz
# target for SWITCHYARD_FUZZ_SECONDS (default 20) each (scripts/fuzz.sh; token_shard
# replays its seeds and known findings, see tests/fuzz/README.md); arguments go to ctest
# alone.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --python
scripts/build.sh
(cd build && ctest --output-on-failure -j"$(nproc)" "$@")
if (($# == 0)); then
  scripts/sanitize.sh asan
  scripts/sanitize.sh tsan
  SWITCHYARD_FUZZ_REPLAY="${SWITCHYARD_FUZZ_REPLAY-token_shard}" \
    scripts/fuzz.sh "${SWITCHYARD_FUZZ_SECONDS:-20}"
fi
