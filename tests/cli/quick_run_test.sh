#!/usr/bin/env bash
# A quick run of the tiny recipe: --set train.steps=5 (below its 50 warmup steps, its
# eval and checkpoint intervals) trains with exactly one warning line and exits 0; the
# MFU it prints and logs is tokens/s x training FLOPs per token (--dry-run) over the
# peak it names, here the CPU's sgemm calibration (cached under HOME, a fresh one here).
#   quick_run_test.sh SWITCHYARD_BINARY REPO_ROOT
set -u
bin="$1"
root="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

datasets="$HOME/.cache/switchyard/datasets"
HOME="$work/home" "$bin" train "$root/recipes/tiny.textproto" --run-dir "$work/run" \
  --set train.steps=5 --set train.log_interval=1 --set train.eval_tokens=4096 \
  --dataset-cache "$datasets" >"$work/out" 2>"$work/err"
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

# A calibration is cached unless other work loaded the machine meanwhile (ctest -j).
source_re='measured \(sgemm, [0-9]+ threads(; other work took [0-9]+% of the CPUs meanwhile: not cached)?\)'
if ! grep -qE "^peak [0-9]+ GFLOP/s $source_re\$" "$work/out"; then
  echo "FAIL mfu: no measured peak; stdout was:"; cat "$work/out"; exit 1
fi
if ! grep -q 'not cached' "$work/out" && [[ ! -s "$work/home/.cache/switchyard/peak.json" ]]; then
  echo "FAIL mfu: the calibration was not cached"; exit 1
fi
"$bin" train "$root/recipes/tiny.textproto" --dry-run | tail -n 1 >"$work/dry.json"
python3 - "$work/run/metrics.jsonl" "$work/dry.json" "$work/out" "$source_re" <<'PY' || exit 1
import json, re, sys
flops = json.load(open(sys.argv[2]))["train_flops_per_token"]
steps = [m for m in map(json.loads, open(sys.argv[1])) if "mfu" in m]
printed = re.findall(r"^step +\d+/5 .* mfu ([0-9.]+)%", open(sys.argv[3]).read(), re.M)
assert len(steps) == 5 and len(printed) == 5, (len(steps), printed)
for m, shown in zip(steps, printed):
    assert re.fullmatch(sys.argv[4], m["peak_source"]), m
    expected = m["tokens_per_s"] * flops / (m["peak_gflops"] * 1e9)
    assert abs(m["mfu"] - expected) <= 1e-9 * expected, (m, expected)
    assert abs(float(shown) - 100 * m["mfu"]) <= 0.05 + 1e-9, (shown, m["mfu"])
print("ok   mfu: %s; step 5: %.0f tok/s x %.4g FLOPs/token / %.1f GFLOP/s = %.2f%%"
      % (steps[-1]["peak_source"], steps[-1]["tokens_per_s"], flops, steps[-1]["peak_gflops"],
         100 * steps[-1]["mfu"]))
PY
