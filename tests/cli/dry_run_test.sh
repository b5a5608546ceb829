#!/usr/bin/env bash
# `train --dry-run` on every shipped recipe plans the layout the recipe gives (the fewest
# ranks its tensor and expert parallel sizes both divide, their least common multiple)
# without launching it: exit 0, one memory line per rank, as many as the JSON's
# world_size, and --world plans another; the header names the layout, stages included.
#   dry_run_test.sh SWITCHYARD_BINARY REPO_ROOT
set -u
bin="$1"
root="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0

# check_plan NAME RANKS -- COMMAND...
check_plan() {
  local name="$1" ranks="$2"
  shift 3
  if ! "$@" >"$work/out" 2>"$work/err"; then
    echo "FAIL $name: exit status $?"; cat "$work/err"; failures=$((failures + 1)); return
  fi
  local lines world
  lines=$(grep -cE '^  rank [0-9]+ \(stage [0-9]+, tp [0-9]+, ep [0-9]+\): at least [0-9.]+ [MG]iB: ' "$work/out")
  world=$(tail -n 1 "$work/out" | python3 -c 'import json, sys; print(json.load(sys.stdin)["world_size"])')
  if ! grep -q '^memory per rank before the first step, ' "$work/out" || [[ $lines -ne $ranks ]] ||
     [[ $world -ne $ranks ]]; then
    echo "FAIL $name: want $ranks rank lines; stdout was:"; cat "$work/out"
    failures=$((failures + 1)); return
  fi
  echo "ok   $name: $(grep '^memory per rank' "$work/out")"
}

for recipe in "$root"/recipes/*.textproto; do
  name=$(basename "$recipe" .textproto)
  tp=$(sed -n 's/^ *tensor_parallel_size: *\([0-9]*\).*/\1/p' "$recipe")
  ep=$(sed -n 's/^ *expert_parallel_size: *\([0-9]*\).*/\1/p' "$recipe")
  tp=${tp:-1} ep=${ep:-1}
  a=$tp b=$ep
  while ((b)); do t=$((a % b)); a=$b; b=$t; done
  check_plan "$name" $((tp * ep / a)) -- "$bin" train "$recipe" --dry-run
done
check_plan "mixtral on 16 ranks" 16 -- "$bin" train "$root/recipes/mixtral-8x7b.textproto" \
  --dry-run --world 16
# The header names the whole layout, pipeline stages and their chunks included.
check_plan "tiny in 2 stages of 2 chunks" 4 -- "$bin" train "$root/recipes/tiny.textproto" \
  --dry-run --world 4 --set parallel.pipeline_parallel_size=2 \
  --set parallel.virtual_pipeline_size=2 --set parallel.expert_parallel_size=2 \
  --set train.micro_batch_size=4
if ! grep -q '^memory per rank before the first step, 4 ranks (dp 2, tp 1, ep 2, pp 2, V 2, zero 0) ' \
     "$work/out"; then
  echo "FAIL the header names the layout as dp 2, tp 1, ep 2, pp 2, V 2, zero 0"; cat "$work/out"
  failures=$((failures + 1))
fi
exit $((failures > 0))
