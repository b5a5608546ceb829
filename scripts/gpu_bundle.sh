#!/usr/bin/env bash
# Packs the GPU tests and benchmarks for a lent GPU machine that cannot build the project
# (no network, none of the Debian libraries): builds them here with CUDA and copies them,
# with the shared libraries they need beyond the CUDA libraries and the C/C++ runtime,
# into .gpu-bundle/ (ignored by git): tests in bin/, benchmarks in bench/, the
# `switchyard` binary in tools/, the libraries
# packed in lib.tar.gz (OpenBLAS alone is 35 MiB, 10 gzipped, and what travels to the
# device machine must stay under 64 MiB). Carry that folder to the GPU machine (the
# device tool's `carry`), where scripts/gpu_check.sh runs the bundle instead of
# building. The binaries run on another machine's CPU, so they are built for any x86-64
# with AVX2 (the gpu-bundle preset, in build-gpu-bundle/), not with -march=native: code
# for this CPU's AVX-512 would stop with an illegal instruction on a host without it.
# BUILD_DIR names another CUDA build folder configured with SWITCHYARD_NATIVE=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-gpu-bundle}
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
[[ -f $build/CMakeCache.txt ]] || cmake --preset gpu-bundle -B "$build" >/dev/null
grep -q "SWITCHYARD_CUDA:BOOL=ON" "$build/CMakeCache.txt" ||
  { echo "gpu_bundle: $build/ is configured without CUDA" >&2; exit 1; }
grep -q "SWITCHYARD_NATIVE:BOOL=OFF" "$build/CMakeCache.txt" ||
  { echo "gpu_bundle: $build/ is built for this machine's CPU (-march=native); use the" \
      "gpu-bundle preset or configure with -DSWITCHYARD_NATIVE=OFF" >&2; exit 1; }
cmake --build "$build" -j"$(nproc)" --target gpu_tests gpu_benchmarks switchyard

rm -rf .gpu-bundle
mkdir -p .gpu-bundle/bin .gpu-bundle/bench .gpu-bundle/tools
libs=$(mktemp -d)
trap 'rm -rf "$libs"' EXIT
for test in "$build"/tests/gpu_*; do
  [[ -x "$test" && -f "$test" ]] || continue
  cp "$test" .gpu-bundle/bin/
done
cp "$build/bench/gpu_ops" "$build/bench/gpu_step" .gpu-bundle/bench/
cp "$build/engine/cli/switchyard" .gpu-bundle/tools/
strip .gpu-bundle/bin/* .gpu-bundle/bench/* .gpu-bundle/tools/*
# The GPU image has the C and C++ runtime and the CUDA libraries (the toolkit's, and
# NCCL's as a Python wheel); everything else the binaries load travels: OpenBLAS (the
# OpenMP build) with its Fortran runtime, libgomp, Abseil.
provided='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s)\.so|^lib(cuda|cublas|nccl|nv)'
for binary in .gpu-bundle/bin/* .gpu-bundle/bench/* .gpu-bundle/tools/*; do
  ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  [[ $(basename "$lib") =~ $provided ]] || cp -L "$lib" "$libs"/
done
tar -czf .gpu-bundle/lib.tar.gz -C "$libs" .

# The runtime versions the binaries need, to compare with the GPU machine's (ldd there
# names a missing one).
versions=$(for binary in .gpu-bundle/bin/* .gpu-bundle/bench/* .gpu-bundle/tools/* "$libs"/*; do
  objdump -T "$binary" | grep -o 'GLIBC_[0-9.]*\|GLIBCXX_[0-9.]*'
done | sort -uV | awk -F_ '{last[$1] = $0} END {print last["GLIBC"], last["GLIBCXX"]}')
# Everything that travels to the device machine, the bundle included, must stay under
# its 64 MiB.
tree_bytes=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1)
bundle_bytes=$(du -sb .gpu-bundle | cut -f1)
echo "gpu_bundle: $(ls .gpu-bundle/bin | wc -l) tests, $(ls .gpu-bundle/bench | wc -l) benchmarks, switchyard," \
  "$(ls "$libs" | wc -l) libraries, $((bundle_bytes >> 20)) MiB in .gpu-bundle/" \
  "(+ $((tree_bytes >> 20)) MiB of working tree); they need at most $versions"
if ((bundle_bytes + tree_bytes > 64 << 20)); then
  echo "gpu_bundle: the bundle and the working tree exceed the device machine's 64 MiB" >&2
  exit 1
fi
