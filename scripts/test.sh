#!/usr/bin/env bash
# Installs what is missing (Debian packages and the Python interop environment), builds,
# and runs the whole test suite with ctest. Without arguments it then runs the CPU suite
# under ASan+UBSan, its threaded parts under TSan (scripts/sanitize.sh) and every fuzz
# target for SWITCHYARD_FUZZ_SECONDS (default 20) each (scripts/fuzz.sh); arguments go to
# ctest alone.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --python
scripts/build.sh
(cd build && ctest --output-on-failure -j"$(nproc)" "$@")
if (($# == 0)); then
  scripts/sanitize.sh asan
  scripts/sanitize.sh tsan
  scripts/fuzz.sh "${SWITCHYARD_FUZZ_SECONDS:-20}"
fi
