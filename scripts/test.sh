#!/usr/bin/env bash
# Installs what is missing (Debian packages and the Python interop environment), builds,
# and runs the whole test suite with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --python
scripts/build.sh
cd build
ctest --output-on-failure -j"$(nproc)" "$@"
