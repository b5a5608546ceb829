#!/usr/bin/env bash
# Packs the GPU tests for a lent GPU machine that cannot build the project (no network,
# none of the Debian libraries): builds them here with CUDA and copies them, with the
# shared libraries they need beyond the CUDA toolkit and the C/C++ runtime, into
# .gpu-bundle/ (ignored by git). Carry that folder to the GPU machine (the device tool's
# `carry`), where scripts/gpu_check.sh runs the bundle instead of building.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
[[ -f build/CMakeCache.txt ]] || cmake --preset release >/dev/null
grep -q "SWITCHYARD_CUDA:BOOL=ON" build/CMakeCache.txt ||
  { echo "gpu_bundle: build/ is configured without CUDA" >&2; exit 1; }
cmake --build build -j"$(nproc)" --target gpu_tests

rm -rf .gpu-bundle
mkdir -p .gpu-bundle/bin .gpu-bundle/lib
for test in build/tests/gpu_*; do
  [[ -x "$test" && -f "$test" ]] || continue
  cp "$test" .gpu-bundle/bin/
  strip .gpu-bundle/bin/"$(basename "$test")"
done
# OpenBLAS (the OpenMP build) and the Fortran runtime it needs are not part of the GPU
# image; libcudart, cuBLAS and the C/C++ runtime are.
ldd .gpu-bundle/bin/gpu_gemm_test | awk '/libopenblas|libgfortran|libquadmath|libgomp/ {print $3}' |
  while read -r lib; do cp -L "$lib" .gpu-bundle/lib/; done
echo "gpu_bundle: $(ls .gpu-bundle/bin | wc -l) tests, $(du -sh .gpu-bundle | cut -f1) in .gpu-bundle/"
