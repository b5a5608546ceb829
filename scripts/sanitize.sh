#!/usr/bin/env bash
# The CPU tests under sanitizers, each build in a folder of its own that holds only what
# its tests run (tests/fuzz/README.md says what each covers):
#   scripts/sanitize.sh asan [ctest args]   build-asan/ (gcc, ASan+UBSan): the CPU suite
#                                           but the tests in asan_skip below
#   scripts/sanitize.sh tsan [ctest args]   build-tsan/ (gcc, TSan; OpenMP served by
#                                           libomp and its Archer tool): the threaded parts
set -euo pipefail
cd "$(dirname "$0")/.."
kind="${1:?usage: scripts/sanitize.sh asan|tsan [ctest args]}"
shift

case "$kind" in
  asan)
    # Whole multi-rank training runs against transformers and each other: tens of
    # minutes under ASan, and the same code paths run single-rank in the other tests
    # (launch.slurm: the same runs again, under a Slurm the test starts; the docs' commands
    # and the planner's 20 validation runs: 6.5 minutes under ASan). The same holds for
    # the layout suites of pipeline stages (12 minutes under ASan; the stages' exchange,
    # executor and schedule run under it in parallel.pipeline_*_test on 1, 2 and 4 ranks),
    # expert placements and the sequence-wise aux loss (2 minutes each; moe.placement_test
    # and moe.seq_aux_loss_test). cli.plan ranks every layout of every shipped recipe
    # (5 minutes under ASan) with the arithmetic train.memory_plan_test runs under it;
    # data.instruction_blend and data.document_attention train on what they prepare
    # (2.5 minutes each), whose readers and kernels data.blend_test,
    # model.document_attention_test and the fuzzers cover. The bias
    # layouts' runs also route by sign(mean load - load), a discrete choice that ASan's
    # code generation can flip at a near tie, so they diverge there by design; so can
    # parallel.pad_layouts' capacity decisions (a 5e-5 loss difference at step 3 under
    # ASan), whose padding paths the unit tests (moe.padding_test) run under ASan.
    # The hostile-input harness caps address space at 8 GiB, below the shadow memory
    # ASan reserves; the fuzzers run those readers under ASan instead. The interop tests
    # against transformers 4.x run the engine exactly as their 5.x twins do (only the
    # Python side differs), and train.train_learns_test's 2.5 ASan minutes are steps that
    # the shorter training tests take too. data.prepare_memory measures resident memory,
    # which under ASan is its shadow and its quarantine of freed blocks (256 MiB).
    asan_skip='^(parallel\.train_equivalence|parallel\.pipeline_matrix|parallel\.pipeline_train|parallel\.expert_placement|parallel\.seq_aux_layouts|cli\.plan|data\.instruction_blend|data\.document_attention|parallel\.bias_balance|parallel\.pad_layouts|train\.checkpoint_resume|train\.memory_plan_validation|train\.train_learns_test|data\.prepare_memory|docs\.commands|security\.hostile_inputs|launch\.slurm|interop\..*_transformers4)$'
    select=(-LE gpu -E "$asan_skip")
    # Open MPI and HDF5 keep global allocations until exit; leaks are the fuzzers' job.
    export ASAN_OPTIONS=detect_leaks=0:abort_on_error=0
    export UBSAN_OPTIONS=print_stacktrace=1
    ;;
  tsan)
    # The loader's read-ahead thread, the gradient reduction overlapped with backward (one
    # process and two ranks), and a run stopped by SIGTERM and resumed: checkpoint slices
    # hashed in parallel as they are saved and as they are loaded.
    select=(-R '^(data\.loader_test|parallel\.grad_reducer_test(\.np2)?|train\.checkpoint_resume)$')
    export PYTEST_ADDOPTS="-k sigterm"
    # libgomp is not instrumented: the build links libomp ahead of it, whose Archer tool
    # tells TSan where OpenMP's barriers, tasks and locks order memory.
    archers=(/usr/lib/llvm-*/lib/libarcher.so)
    export OMP_TOOL_LIBRARIES="${archers[-1]}"
    export TSAN_OPTIONS="ignore_noninstrumented_modules=1 halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/fuzz/tsan.supp"
    ;;
  *)
    echo "usage: scripts/sanitize.sh asan|tsan [ctest args]" >&2
    exit 2
    ;;
esac

build="build-$kind"
source scripts/compiler_cache.sh
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake --preset "$kind" "${launcher[@]}" >/dev/null
fi

# The targets the selected tests run: every build-folder path in their commands and
# environments. ctest gives no command for an executable not built yet; tests/CMakeLists.txt
# names those tests after their target (area.name[.npN] runs area_name).
targets="$(cd "$build" && ctest --show-only=json-v1 "${select[@]}" | python3 -c '
import json, os, re, sys
build = os.getcwd() + "/"
words = []
for test in json.load(sys.stdin)["tests"]:
    words += test.get("command") or [build + re.sub(r"\.np[0-9]+$", "", test["name"]).replace(".", "_", 1)]
    for prop in test.get("properties", []):
        if prop["name"] == "ENVIRONMENT":
            words += [v.split("=", 1)[-1] for v in prop["value"]]
print(" ".join(sorted({os.path.basename(w) for w in words if w.startswith(build)})))')"
cmake --build "$build" -j"$(nproc)" --target $targets
cd "$build"
ctest --output-on-failure -j"$(nproc)" "${select[@]}" "$@"
