#!/usr/bin/env bash
# Builds the libFuzzer targets of the file readers (tests/fuzz/, the `fuzz` preset: clang,
# CUDA off, every library compiled with ASan+UBSan and fuzzer coverage) into build-fuzz/
# and runs each for SECONDS from its seed corpus (tests/fuzz/corpus/<target>) plus what
# earlier runs found (build-fuzz/corpus/<target>), as many targets at a time as the
# machine has cores. Prints the execs and crashes of each
# target; exits 1 when any target crashed (the inputs are in build-fuzz/crashes/<target>).
#   scripts/fuzz.sh [SECONDS] [TARGET...]     default: 60 s each, every target
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true

source scripts/compiler_cache.sh
if [[ ! -f build-fuzz/CMakeCache.txt ]]; then
  cmake --preset fuzz "${launcher[@]}" >/dev/null
fi
cmake --build build-fuzz -j"$(nproc)" --target fuzzers >/dev/null

targets=("$@")
if ((${#targets[@]} == 0)); then
  for seeds in tests/fuzz/corpus/*/; do targets+=("$(basename "$seeds")"); done
fi

# One run of target $1: its libFuzzer log goes to build-fuzz/logs/$1.log. Files the
# readers write go to a scratch directory of its own under /dev/shm, removed after.
run_target() {
  local target="$1" corpus="build-fuzz/corpus/$1" crashes="build-fuzz/crashes/$1"
  local scratch
  mkdir -p "$corpus" "$crashes" build-fuzz/logs
  scratch="$(mktemp -d /dev/shm/sy-fuzz-"$target".XXXXXX)"
  local status=0
  # No sanitizer report is suppressed: every reader is the engine's own code (libhdf5 only
  # writes, and no target writes HDF5). An allocation of an impossible size aborts (ASan's
  # default), one over 1 GiB is a finding by -malloc_limit_mb.
  TMPDIR="$scratch" UBSAN_OPTIONS=print_stacktrace=1 \
    "build-fuzz/tests/fuzz/${target}_fuzz" -max_total_time="$seconds" -print_final_stats=1 \
    -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -artifact_prefix="$crashes/" \
    "$corpus" "tests/fuzz/corpus/$target" >"build-fuzz/logs/$target.log" 2>&1 || status=$?
  rm -rf "$scratch"
  return "$status"
}

printf '%-14s %12s %8s %8s\n' target execs crashes corpus
failed=0
for target in "${targets[@]}"; do
  if [[ ! -x "build-fuzz/tests/fuzz/${target}_fuzz" ]]; then
    echo "fuzz: no target ${target}_fuzz (tests/fuzz/CMakeLists.txt)" >&2
    exit 1
  fi
done

# The row of target $1, whose run ended with status $2; a crash's first line and where
# its input is go to stderr.
report() {
  local target="$1" crashed=0 execs
  (($2 == 0)) || crashed=1
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "build-fuzz/logs/$target.log")"
  printf '%-14s %12s %8s %8s\n' "$target" "${execs:-?}" "$crashed" \
    "$(find "build-fuzz/corpus/$target" -type f | wc -l)"
  if ((crashed)); then
    failed=1
    grep -m1 -E '^(==[0-9]+==ERROR|.*runtime error|.*deadly signal|not a one-line)' \
      "build-fuzz/logs/$target.log" >&2 || true
    echo "fuzz: $target crashed; log build-fuzz/logs/$target.log, input in build-fuzz/crashes/$target/" >&2
  fi
}

# As many targets at a time as the machine has cores, each for SECONDS.
at_once="$(nproc)"
for ((first = 0; first < ${#targets[@]}; first += at_once)); do
  batch=("${targets[@]:first:at_once}")
  pids=()
  for target in "${batch[@]}"; do
    run_target "$target" &
    pids+=($!)
  done
  for k in "${!batch[@]}"; do
    status=0
    wait "${pids[k]}" || status=$?
    report "${batch[k]}" "$status"
  done
done
exit "$failed"
