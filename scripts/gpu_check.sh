#!/usr/bin/env bash
# On a machine with an NVIDIA GPU, in one command: run the `gpu`-labelled tests, then the
# GPU benchmarks (bench/README.md, "GPU benchmarks"): gpu_ops, gpu_step on both expert
# presets, bench/gpu_pytorch_step.py on the same presets in bf16 and fp32, and a summary
# table of engine against PyTorch tokens/s, their ratio and MFU. With a .gpu-bundle/ from
# scripts/gpu_bundle.sh (a lent machine that cannot build the project) it runs the
# bundled binaries; otherwise it installs, builds the GPU tests and benchmarks (targets
# gpu_tests and gpu_benchmarks, to spend the machine's time on running them) and runs
# the tests through ctest. Then it trains the tiny recipe on the GPU for a short run in
# fp32 and in bf16 with the `switchyard` binary (the README's main job: train, save a
# checkpoint, export it to Hugging Face format).
#
# Arguments pick the parts to run (default: tests, bench, train, in this order); e.g.
# `scripts/gpu_check.sh tests train` when one call must stay short. A fourth part,
# `sanitize`, runs only when named: every GPU test under compute-sanitizer's memcheck
# (out-of-bounds and misaligned accesses, leaks of device memory), then the tests of the
# kernels that share memory between threads under racecheck; a test that outlasts its
# time is reported as unchecked, not as passed. Death tests stay out of it: their device
# traps are deliberate, and the sanitizer would report them as errors.
#
# GPU_TEST_TIMEOUT (seconds, default 150) bounds each bundled test, SANITIZE_TIMEOUT
# (default 180) each sanitizer run; SANITIZE_TOOLS (default "memcheck racecheck") picks
# the sanitizer tools and their order.
#
# Everything printed also goes to ${OUT:-/tmp}/gpu_check.log, and each benchmark's JSON
# line to ${OUT:-/tmp}/gpu_bench.jsonl. A failing test does not stop the benchmarks; the
# exit status is non-zero when a test or an engine benchmark failed. PYTHON (default
# python3) runs the PyTorch side; without torch and transformers it is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
out_dir=${OUT:-/tmp}
mkdir -p "$out_dir"
python=${PYTHON:-python3}
# The environment PyTorch runs in: without the bundle's libraries, which are the engine's.
python_ld_path=${LD_LIBRARY_PATH-}
export PYTHONUNBUFFERED=1
failures=0
parts=("$@")
[[ ${#parts[@]} -gt 0 ]] || parts=(tests bench train)
wants() { [[ " ${parts[*]} " == *" $1 "* ]]; }

# Runs the bundled tests, each as its own process (they exit 77 without a GPU).
bundled_tests() {
  local passed=0 failed=0 skipped=0 test name rc missing start took
  for test in .gpu-bundle/bin/gpu_*; do
    name=$(basename "$test")
    missing=$(ldd "$test" | grep "not found" || true)
    if [[ -n "$missing" ]]; then
      failed=$((failed + 1))
      echo "gpu_check: $name FAILED: shared libraries not found on this machine:"
      echo "$missing"
      continue
    fi
    set +e
    start=$SECONDS
    timeout "${GPU_TEST_TIMEOUT:-150}" "$test" --gtest_brief=1
    rc=$?
    set -e
    took="$((SECONDS - start)) s"
    case $rc in
      0) passed=$((passed + 1)); echo "gpu_check: $name passed ($took)" ;;
      77) skipped=$((skipped + 1)); echo "gpu_check: $name skipped (no GPU)" ;;
      124) failed=$((failed + 1)); echo "gpu_check: $name FAILED (over $took)" ;;
      *) failed=$((failed + 1)); echo "gpu_check: $name FAILED (exit $rc, $took)" ;;
    esac
  done
  echo "gpu_check: $passed passed, $failed failed, $skipped skipped"
  [[ $failed -eq 0 ]]
}

# sanitize TEST...: the tests under memcheck, then those of kernels with shared-memory
# staging (grouped GEMM, attention, the fused router) under racecheck: of the op table,
# only these entries' CUDA comparisons.
sanitize() {
  local tool test name rc clean=0 found=0 unchecked=0 extra filter
  if ! command -v compute-sanitizer >/dev/null 2>&1; then
    echo "gpu_check: compute-sanitizer is not on this machine: sanitize skipped"
    return 0
  fi
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
    for test in "$@"; do
      name=$(basename "$test")
      if [[ $tool == racecheck && ! $name =~ ^gpu_(grouped_gemm|grouped_batched_gemm|op_table)_test$ ]]; then
        continue
      fi
      filter='-*DeathTest*'
      if [[ $tool == racecheck && $name == gpu_op_table_test ]]; then
        filter='*CudaMatchesCpu/attention:*CudaMatchesCpu/*gating:*CudaMatchesCpu/*router*:*CudaMatchesCpu/grouped_matmul'
      fi
      # API errors are not reported: the engine checks every CUDA call's status itself,
      # and NCCL probes for kernel images it does not have (cudaFuncGetAttributes ->
      # cudaErrorNoKernelImageForDevice) as part of its normal start.
      extra=(--report-api-errors no)
      [[ $tool == memcheck ]] && extra+=(--leak-check full)
      set +e
      timeout "${SANITIZE_TIMEOUT:-180}" compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 10 \
        "${extra[@]}" "$test" --gtest_brief=1 --gtest_filter="$filter" \
        >"$out_dir/sanitize.tmp" 2>&1
      rc=$?
      set -e
      grep -E "^=========|FAILED|rror" "$out_dir/sanitize.tmp" | head -40 || true
      case $rc in
        0) clean=$((clean + 1)); echo "gpu_check: $tool $name clean" ;;
        77) echo "gpu_check: $tool $name skipped (no GPU)" ;;
        124) unchecked=$((unchecked + 1)); echo "gpu_check: $tool $name UNCHECKED (over ${SANITIZE_TIMEOUT:-180} s)" ;;
        *) found=$((found + 1)); echo "gpu_check: $tool $name FOUND ERRORS (exit $rc)" ;;
      esac
    done
  done
  rm -f "$out_dir/sanitize.tmp"
  echo "gpu_check: sanitize: $clean clean, $found with errors, $unchecked unchecked"
  [[ $found -eq 0 ]]
}

# bench LABEL COMMAND...: runs one benchmark and appends its JSON line (the last line of
# its output that is a JSON object) to gpu_bench.jsonl; fails when the benchmark failed
# (exit 77, no GPU, is a skip).
bench() {
  local label=$1 log rc
  shift
  echo
  echo "== $label: $*"
  log=$(mktemp)
  set +e
  timeout 240 "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  set -e
  case $rc in
    0) grep '^{' "$log" | tail -1 >>"$out_dir/gpu_bench.jsonl" ;;
    77) echo "gpu_check: $label skipped (no GPU)" ;;
    *) echo "gpu_check: $label FAILED (exit $rc)" ;;
  esac
  rm -f "$log"
  [[ $rc -eq 0 || $rc -eq 77 ]]
}

# The value of `key` in the last JSON line of gpu_bench.jsonl that has bench == name
# (and preset == preset when given); empty when there is none.
json_value() {
  "$python" - "$out_dir/gpu_bench.jsonl" "$@" <<'EOF'
import json, sys
path, name, key = sys.argv[1:4]
preset = sys.argv[4] if len(sys.argv) > 4 else None
rows = [json.loads(line) for line in open(path)]
rows = [r for r in rows if r["bench"] == name and (preset is None or r["preset"] == preset)]
print(rows[-1].get(key, "") if rows else "")
EOF
}

# Runs the benchmarks from folder $1 (gpu_ops and gpu_step in it).
benchmarks() {
  local bin=$1 bf16_measured flops spec preset precision with_pytorch=true
  : >"$out_dir/gpu_bench.jsonl"
  if ! "$python" -c 'import torch, transformers' 2>/dev/null; then
    with_pytorch=false
    echo "gpu_check: $python has no torch and transformers: PyTorch runs skipped"
  fi
  bench gpu_ops "$bin/gpu_ops" --reps 10 || failures=$((failures + 1))
  bf16_measured=$(json_value gpu_ops bf16_gemm_tflops)
  for preset in coarse fine; do
    for precision in bf16 fp32; do
      bench "gpu_step $preset $precision" "$bin/gpu_step" --preset "$preset" \
        --precision "$precision" --warmup 2 --steps 5 \
        ${bf16_measured:+--bf16-peak-tflops "$bf16_measured"} || failures=$((failures + 1))
    done
    $with_pytorch || continue
    flops=$(json_value gpu_step train_flops_per_token "$preset")
    spec=$(json_value gpu_step bf16_spec_tflops "$preset")
    for precision in bf16 fp32; do
      bench "pytorch $preset $precision" env LD_LIBRARY_PATH="$python_ld_path" "$python" \
        bench/gpu_pytorch_step.py --preset "$preset" --precision "$precision" --warmup 2 \
        --steps 5 ${flops:+--flops-per-token "$flops"} ${spec:+--peak-tflops "$spec"} \
        ${bf16_measured:+--measured-peak-tflops "$bf16_measured"} || true
    done
  done
  summary || echo "gpu_check: the summary failed"
}

# Engine against PyTorch per preset, from gpu_bench.jsonl.
summary() {
  echo
  "$python" - "$out_dir/gpu_bench.jsonl" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
steps = [r for r in rows if r["bench"] in ("gpu_step", "gpu_pytorch_step")]
if not steps:
    print("gpu_check summary: no training-step results")
    sys.exit()
peaks = [r for r in rows if r["bench"] == "gpu_step"][:1]
measured = next((r["bf16_gemm_tflops"] for r in rows if r["bench"] == "gpu_ops"), None)
print("gpu_check summary: engine vs PyTorch training steps "
      "(MFU: train FLOPs/token x tokens/s / bf16 peak"
      + (f" {peaks[0]['bf16_spec_tflops']:.0f} TFLOP/s, the trainer's" if peaks else "")
      + (f"; measured: cuBLAS bf16 GEMM {measured:.0f} TFLOP/s" if measured else "") + ")")
print(f"{'preset':<8}{'run':<14}{'tokens/s':>10}{'MFU':>8}{'measured':>10}{'engine/run':>12}")
def pct(r, key):
    return f"{100 * r[key]:.1f}%" if r.get(key) else "-"
for preset in ("coarse", "fine"):
    engine = next((r for r in steps if r["bench"] == "gpu_step" and r["preset"] == preset
                   and r["precision"] == "bf16"), None)
    for r in (x for x in steps if x["preset"] == preset):
        run = f"engine {r['precision']}" if r["bench"] == "gpu_step" else f"pytorch {r['precision']}"
        ratio = f"{engine['tokens_per_s'] / r['tokens_per_s']:.2f}" if engine else "-"
        print(f"{preset:<8}{run:<14}{r['tokens_per_s']:>10.0f}{pct(r, 'mfu'):>8}"
              f"{pct(r, 'mfu_measured'):>10}{ratio:>12}")
EOF
}

# train SWITCHYARD: the tiny recipe on the GPU, 150 steps in fp32 and in bf16 from the
# bundled corpus, then the Hugging Face export of the final weights.
train() {
  local switchyard=$1 precision run_dir
  for precision in fp32 bf16; do
    run_dir=$(mktemp -d)
    echo
    echo "== switchyard train recipes/tiny.textproto, cuda, $precision"
    if timeout 240 "$switchyard" train recipes/tiny.textproto --run-dir "$run_dir" \
      --set runtime.device=cuda --set runtime.precision="$precision" --set train.steps=150 \
      --set optimizer.warmup_steps=15 --set train.log_interval=50 \
      --set train.eval_interval=150 &&
      timeout 120 "$switchyard" convert to-hf "$run_dir/checkpoints/final" "$run_dir/hf"; then
      echo "gpu_check: training on the GPU ($precision) passed"
    else
      echo "gpu_check: training on the GPU ($precision) FAILED"
      failures=$((failures + 1))
    fi
    rm -rf "$run_dir"
  done
}

main() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  local tests_ok=true
  if [[ -d .gpu-bundle/bin ]]; then
    bundle_libs=$(mktemp -d)
    trap 'rm -rf "$bundle_libs"' EXIT
    tar -xzf .gpu-bundle/lib.tar.gz -C "$bundle_libs"
    export LD_LIBRARY_PATH="$bundle_libs:/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    # CUDA libraries installed as Python wheels (nvidia-cublas-*, ...) also serve.
    local wheel_libs
    wheel_libs=$("$python" -c 'import glob, site; print(":".join(d for p in site.getsitepackages() for d in glob.glob(p + "/nvidia/*/lib")))' 2>/dev/null || true)
    [[ -n "$wheel_libs" ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$wheel_libs"
    if wants tests; then bundled_tests || tests_ok=false; fi
    if wants sanitize; then sanitize .gpu-bundle/bin/gpu_* || tests_ok=false; fi
    if wants bench; then benchmarks .gpu-bundle/bench; fi
    if wants train; then train .gpu-bundle/tools/switchyard; fi
  else
    scripts/setup.sh
    cmake --preset release -DSWITCHYARD_CUDA=ON >/dev/null
    cmake --build build -j"$(nproc)" --target gpu_tests gpu_benchmarks switchyard
    if wants tests; then (cd build && ctest --output-on-failure -L gpu) || tests_ok=false; fi
    if wants sanitize; then sanitize build/tests/gpu_* || tests_ok=false; fi
    if wants bench; then benchmarks build/bench; fi
    if wants train; then train build/engine/cli/switchyard; fi
  fi
  $tests_ok || echo "gpu_check: GPU tests FAILED"
  [[ $failures -eq 0 ]] || echo "gpu_check: $failures engine benchmark or training run(s) FAILED"
  $tests_ok && [[ $failures -eq 0 ]]
}

main 2>&1 | tee "$out_dir/gpu_check.log"
