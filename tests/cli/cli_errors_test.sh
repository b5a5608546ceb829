#!/usr/bin/env bash
# Bad input to the CLI ends with exactly one line on stderr, exit status 1, no abort and
# no half-written run directory.
#   cli_errors_test.sh SWITCHYARD_BINARY REPO_ROOT
set -u
bin="$1"
root="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0
passed=0

# expect_error NAME EXPECTED_SUBSTRING RUN_DIR_THAT_MUST_NOT_EXIST -- COMMAND...
expect_error() {
  local name="$1" want="$2" run_dir="$3"
  shift 4
  "$@" >"$work/out" 2>"$work/err"
  local status=$?
  local lines
  lines=$(wc -l <"$work/err")
  if [[ $status -ne 1 ]]; then
    echo "FAIL $name: exit status $status"; failures=$((failures + 1)); return
  fi
  if [[ $lines -ne 1 ]] || ! grep -q -- "$want" "$work/err"; then
    echo "FAIL $name: stderr was:"; cat "$work/err"; failures=$((failures + 1)); return
  fi
  if [[ -n "$run_dir" && -e "$run_dir" ]]; then
    echo "FAIL $name: left $run_dir behind"; failures=$((failures + 1)); return
  fi
  echo "ok   $name: $(cat "$work/err")"
  passed=$((passed + 1))
}

tiny="$root/recipes/tiny.textproto"
printf 'model { hidden_size: 64 \n' >"$work/syntax.textproto"
printf 'model { hiden_size: 64 }\n' >"$work/unknown.textproto"
sed 's/top_k: 2/top_k: 9/' "$tiny" >"$work/topk.textproto"
sed 's#corpus: .*#corpus: "/nonexistent/corpus.txt"#' "$tiny" >"$work/nocorpus.textproto"
: >"$work/empty.txt"
sed "s#corpus: .*#corpus: \"$work/empty.txt\"#" "$tiny" >"$work/emptycorpus.textproto"

expect_error "syntax error" "syntax.textproto:2" "$work/r1" -- "$bin" train "$work/syntax.textproto" --run-dir "$work/r1"
expect_error "unknown field" "hiden_size" "$work/r2" -- "$bin" train "$work/unknown.textproto" --run-dir "$work/r2"
expect_error "top_k > experts" "moe.top_k" "$work/r3" -- "$bin" train "$work/topk.textproto" --run-dir "$work/r3"
expect_error "heads do not divide hidden" "model.num_heads" "$work/r4" -- "$bin" train "$tiny" --run-dir "$work/r4" --set model.num_heads=3 --set model.num_kv_heads=3
expect_error "kv heads do not divide heads" "model.num_kv_heads" "$work/r5" -- "$bin" train "$tiny" --run-dir "$work/r5" --set model.num_kv_heads=3
expect_error "unknown override" "train.stesp" "$work/r6" -- "$bin" train "$tiny" --run-dir "$work/r6" --set train.stesp=5
expect_error "override of wrong type" "train.steps" "$work/r7" -- "$bin" train "$tiny" --run-dir "$work/r7" --set train.steps=many
expect_error "missing recipe" "nope.textproto" "$work/r8" -- "$bin" train "$work/nope.textproto" --run-dir "$work/r8"
expect_error "missing corpus" "/nonexistent/corpus.txt" "$work/r9" -- "$bin" train "$work/nocorpus.textproto" --run-dir "$work/r9"
expect_error "empty corpus" "empty" "$work/r10" -- "$bin" train "$work/emptycorpus.textproto" --run-dir "$work/r10"
touch "$work/file"
short=(--set train.steps=1 --set optimizer.warmup_steps=0 --set train.eval_interval=0
       --dataset-cache "$work/cache")
expect_error "unwritable run dir" "cannot create the directory" "" -- "$bin" train "$tiny" --run-dir "$work/file/sub" "${short[@]}"
expect_error "missing weights" "recipe.textproto" "" -- "$bin" sample "$work/none" --prompt hi
expect_error "--extend-schedule on a fresh start" "holds no checkpoint to resume: drop the flag" "$work/r14" -- "$bin" train "$tiny" --run-dir "$work/r14" "${short[@]}" --extend-schedule

if "$bin" train "$tiny" --run-dir "$work/run" "${short[@]}" >/dev/null; then
  # The same flag on a resume is taken: the run goes on from its checkpoint.
  if "$bin" train "$tiny" --run-dir "$work/run" "${short[@]}" --set train.steps=2 --extend-schedule \
      >"$work/out" 2>&1 && grep -q "^resuming from .*/step_1 (step 1)" "$work/out"; then
    echo "ok   --extend-schedule on a resume: $(grep '^resuming from' "$work/out")"; passed=$((passed + 1))
  else
    echo "FAIL --extend-schedule on a resume; output was:"; cat "$work/out"; failures=$((failures + 1))
  fi
  weights="$work/run/checkpoints/final"
  expect_error "eval of missing data" "missing.txt" "" -- "$bin" eval "$weights" --data "$work/missing.txt"
  head -c 1000 "$weights/model.safetensors" >"$work/short" && mv "$work/short" "$weights/model.safetensors"
  expect_error "truncated weights" "model.safetensors" "" -- "$bin" sample "$weights" --prompt hi
else
  echo "FAIL a one-step training run failed"; failures=$((failures + 1))
fi

printf 'not a sentencepiece model\n' >"$work/bad.model"
printf 'some text\n\nmore text\n' >"$work/text.txt"
expect_error "tokenizer of missing input" "missing.txt" "" -- "$bin" data tokenizer --input "$work/missing.txt" --vocab-size 400 --out "$work/t.model"
expect_error "tokenizer vocabulary too small" "--vocab-size: 100 is out of range \[300, 16777216\]" "" -- "$bin" data tokenizer --input "$work/text.txt" --vocab-size 100 --out "$work/t.model"
expect_error "prepare with a bad tokenizer" "bad.model" "$work/ds" -- "$bin" data prepare --tokenizer "$work/bad.model" --input "$work/text.txt" --out "$work/ds"
expect_error "inspect of a missing path" "nothing.h5" "" -- "$bin" inspect "$work/nothing.h5"
if [[ -d "$work/cache" ]]; then
  dataset=$(ls -d "$work"/cache/*/ | head -1)
  shard="$dataset/train-00000-of-00001.h5"
  head -c 5000 "$shard" >"$work/short.h5" && cp "$work/short.h5" "$shard"
  expect_error "inspect of a truncated shard" "train-00000-of-00001.h5" "" -- "$bin" inspect "$dataset"
  expect_error "prepare holding out no validation document" "2 documents are too few to hold out" "$work/ds2" -- "$bin" data prepare --tokenizer "$dataset/tokenizer.model" --input "$work/text.txt" --out "$work/ds2"
  expect_error "training on a truncated shard" "train-00000-of-00001.h5" "$work/r11" -- "$bin" train "$tiny" --run-dir "$work/r11" "${short[@]}"
fi

# Command-line values: refused by the parser in one line, exit status 1 like any error.
expect_error "no subcommand" "subcommand is required" "" -- "$bin"
expect_error "unknown flag" "--bogus" "" -- "$bin" train "$tiny" --bogus
expect_error "nan peak GFLOP/s" "--peak-gflops: nan is not a finite number" "$work/r12" -- "$bin" train "$tiny" --run-dir "$work/r12" --peak-gflops nan
expect_error "negative peak GFLOP/s" "--peak-gflops: -1 is out of range \[0, 1e+12\]" "$work/r13" -- "$bin" train "$tiny" --run-dir "$work/r13" --peak-gflops -1
expect_error "dry run of too many ranks" "--world: 5000 is out of range \[0, 4096\]" "" -- "$bin" train "$tiny" --dry-run --world 5000
expect_error "dry run of a layout the recipe refuses" "must be divisible by data-parallel size (3)" "" -- "$bin" train "$tiny" --dry-run --world 3
expect_error "negative eval windows" "--windows" "" -- "$bin" eval "$work/none" --data "$work/none" --windows -3
expect_error "bench batches beyond the cap" "--batches: 100000000000 is out of range \[1, 268435456\]" "" -- "$bin" bench balance "$tiny" --synthetic zipf:1.1 --batches 100000000000

echo "$passed passed, $failures failed"
[[ $failures -eq 0 ]]
