#!/usr/bin/env bash
# Configures (once) and builds Switchyard into build/. The CUDA backend is built when
# the CUDA toolkit is found.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
source scripts/compiler_cache.sh
[[ -f build/CMakeCache.txt ]] || cmake --preset release "${launcher[@]}" >/dev/null
cmake --build build -j"$(nproc)"
