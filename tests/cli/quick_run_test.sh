#!/usr/bin/env bash
# A quick run of the tiny recipe: --set train.steps=5 (below its 50 warmup steps, its
# eval and checkpoint intervals) trains with exactly one warning line and exits 0.
#   quick_run_test.sh SWITCHYARD_BINARY REPO_ROOT
set -u
bin="$1"
root="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$bin" train "$root/recipes/tiny.textproto" --run-dir "$work/run" --set train.steps=5 \
  --set train.eval_tokens=4096 >"$work/out" 2>"$work/err"
status=$?
if [[ $status -ne 0 ]]; then
  echo "FAIL quick run: exit status $status"; cat "$work/err"; exit 1
fi
want="warning: train.steps (5) is shorter than the recipe's schedule: optimizer.warmup_steps (50) is clamped to 5; train.eval_interval (200) means one evaluation, at step 5; checkpoint.interval_steps (100) means one checkpoint, at step 5"
if [[ $(grep -c '^warning:' "$work/out") -ne 1 ]] || ! grep -qxF "$want" "$work/out"; then
  echo "FAIL quick run: no single warning line; stdout was:"; cat "$work/out"; exit 1
fi
if ! grep -q 'warmup_steps: 5$' "$work/run/checkpoints/final/recipe.textproto"; then
  echo "FAIL quick run: the saved recipe does not record the warmup that ran"; exit 1
fi
grep -q "^eval step 5 " "$work/out" || { echo "FAIL quick run: no evaluation at step 5"; exit 1; }
[[ -d "$work/run/checkpoints/step_5" ]] || { echo "FAIL quick run: no checkpoint at step 5"; exit 1; }
echo "ok   quick run: $want"
