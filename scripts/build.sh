#!/usr/bin/env bash
# Configures and builds Switchyard into build/: the targets named, else all of it. The
# CUDA backend is built when the CUDA toolkit is found, so that the CUDA code compiles
# and links wherever the tests run; with --cuda-if-gpu (scripts/run.sh) only when a GPU
# is visible too, so that a CPU machine's first run skips the CUDA compile. A build/ that
# has no CUDA backend gets it at the next build without --cuda-if-gpu.
#   scripts/build.sh                              everything: the CLI, tests, benchmarks
#   scripts/build.sh --cuda-if-gpu switchyard     the CLI alone (what scripts/run.sh runs)
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
cuda=()
if [[ "${1:-}" == "--cuda-if-gpu" ]]; then
  shift
  nvidia-smi -L >/dev/null 2>&1 || cuda=(-DSWITCHYARD_CUDA=OFF)
elif command -v nvcc >/dev/null 2>&1; then
  cuda=(-DSWITCHYARD_CUDA=ON)
fi
source scripts/compiler_cache.sh
if [[ ! -f build/CMakeCache.txt ]]; then
  cmake --preset release "${launcher[@]}" "${cuda[@]}" >/dev/null
elif [[ "${cuda[*]}" == "-DSWITCHYARD_CUDA=ON" ]] &&
     grep -q '^SWITCHYARD_CUDA:BOOL=OFF' build/CMakeCache.txt; then
  cmake build "${cuda[@]}" >/dev/null
fi
targets=()
for target in "$@"; do targets+=(--target "$target"); done
cmake --build build -j"$(nproc)" "${targets[@]}"
