#!/usr/bin/env bash
# Configures (once) and builds Switchyard into build/: the targets named, else all of it.
# The CUDA backend is built when the CUDA toolkit is found.
#   scripts/build.sh              everything: the CLI, the tests, the benchmarks
#   scripts/build.sh switchyard   the CLI alone (what scripts/run.sh runs)
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
source scripts/compiler_cache.sh
[[ -f build/CMakeCache.txt ]] || cmake --preset release "${launcher[@]}" >/dev/null
targets=()
for target in "$@"; do targets+=(--target "$target"); done
cmake --build build -j"$(nproc)" "${targets[@]}"
