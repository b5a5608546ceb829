#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: build with CUDA, run the `gpu`-labelled tests and
# print what the GPU run found, in one command. Its output goes into docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
scripts/setup.sh
cmake --preset release -DSWITCHYARD_CUDA=ON >/dev/null
cmake --build build -j"$(nproc)"
cd build
ctest --output-on-failure -L gpu
