#!/usr/bin/env bash
# On a machine with an NVIDIA GPU, in one command: run the `gpu`-labelled tests and
# print what they found (recorded in bench/README.md). With a .gpu-bundle/ from
# scripts/gpu_bundle.sh (a lent machine that cannot build the project) it runs the
# bundled tests; otherwise it installs, builds the GPU tests and what they link (target
# gpu_tests, to spend the machine's time on running them) and runs them through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

if [[ -d .gpu-bundle/bin ]]; then
  export LD_LIBRARY_PATH="$PWD/.gpu-bundle/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # CUDA libraries installed as Python wheels (nvidia-cublas-*, ...) also serve.
  wheel_libs=$(python3 -c 'import glob, site; print(":".join(d for p in site.getsitepackages() for d in glob.glob(p + "/nvidia/*/lib")))' 2>/dev/null || true)
  [[ -n "$wheel_libs" ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$wheel_libs"
  missing=$(ldd .gpu-bundle/bin/gpu_gemm_test | grep "not found" || true)
  if [[ -n "$missing" ]]; then
    echo "gpu_check: shared libraries not found on this machine:" >&2
    echo "$missing" >&2
    exit 1
  fi
  passed=0 failed=0 skipped=0
  for test in .gpu-bundle/bin/gpu_*; do
    name=$(basename "$test")
    set +e
    "$test" --gtest_brief=1
    rc=$?
    set -e
    case $rc in
      0) passed=$((passed + 1)); echo "gpu_check: $name passed" ;;
      77) skipped=$((skipped + 1)); echo "gpu_check: $name skipped (no GPU)" ;;
      *) failed=$((failed + 1)); echo "gpu_check: $name FAILED (exit $rc)" ;;
    esac
  done
  echo "gpu_check: $passed passed, $failed failed, $skipped skipped"
  [[ $failed -eq 0 ]]
  exit
fi

scripts/setup.sh
cmake --preset release -DSWITCHYARD_CUDA=ON >/dev/null
cmake --build build -j"$(nproc)" --target gpu_tests
cd build
ctest --output-on-failure -L gpu
