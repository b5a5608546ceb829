#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: build with CUDA, run the `gpu`-labelled tests and
# print what the GPU run found, in one command. Its output goes into docs/benchmarks.md.
# Only the GPU tests and what they link are built (target gpu_tests), to spend the
# machine's time on running them.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
scripts/setup.sh
cmake --preset release -DSWITCHYARD_CUDA=ON >/dev/null
cmake --build build -j"$(nproc)" --target gpu_tests
cd build
ctest --output-on-failure -L gpu
