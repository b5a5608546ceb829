#!/usr/bin/env bash
# `switchyard plan`: every shipped recipe gets a ranked answer on 80 GiB devices, 64 of
# them for the full-size ones, fewer for the small ones whose batch 64 ranks cannot split
# (the layouts that fit first, each other one with the term that needs the most), one
# layout can be asked for, --json writes the plans, and bad flags are one line, exit 1.
#   plan_test.sh SWITCHYARD_BINARY REPO_ROOT
set -u
bin="$1"
root="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL $1"; failures=$((failures + 1)); }

number='[0-9.]+(e[-+][0-9]+)?'
for recipe in "$root"/recipes/*.textproto; do
  name=$(basename "$recipe" .textproto)
  world=64
  [[ $name == switch-base-8 ]] && world=8
  [[ $name == tiny* || $name == *-tiny ]] && world=2
  if ! "$bin" plan "$recipe" --world $world --device-memory 80GiB >"$work/out" 2>"$work/err"; then
    fail "$name: exit status"; cat "$work/err"; continue
  fi
  # A recipe that names no device trains on the CPU where no GPU is visible, and plan
  # then takes this CPU's measured peak.
  peak="989 TFLOP/s a rank: H100 dense bf16 \(--gpu\)"
  if ! grep -q 'device: "cuda"' "$recipe" && ! nvidia-smi -L >/dev/null 2>&1; then
    peak="$number TFLOP/s a rank: .+ measured \(sgemm, [0-9]+ threads.*\), as the recipe trains on the CPU \(--gpu for a GPU\)"
  fi
  if ! head -n 1 "$work/out" | grep -qE "^$name on $world ranks of 80.00 GiB each: [0-9]+ of [0-9]+ layouts fit$" ||
     ! sed -n 2p "$work/out" | grep -qE "^compute at $peak; collectives at 50 GB/s a rank$" ||
     ! sed -n 3p "$work/out" | grep -qE "^  #  layout +step s = +compute \+ +recompute \+ +all-to-all \+ +tp \+ +pipeline \+ +bubble \+ +gradients   fullest rank's memory$" ||
     ! grep -qE "^  1\. pp [0-9]+, dp [0-9]+, tp [0-9]+, ep [0-9]+, zero [0-3](, recompute (selective|full))? +($number( +$number){7}   [0-9.]+ [KMGT]?i?B on rank [0-9]+|does not fit)" "$work/out"; then
    fail "$name: output"; cat "$work/out"; continue
  fi
  echo "ok   $name: $(head -n 1 "$work/out")"
done

# A CPU recipe planned for a GPU: --gpu names the GPU whose peak is used.
"$bin" plan "$root/recipes/tiny.textproto" --world 2 --device-memory 80GiB --gpu H100 | sed -n 2p |
  grep -qE "^compute at 989 TFLOP/s a rank: H100 dense bf16 \(--gpu\); " || fail "tiny with --gpu H100"

# Mixtral 8x7B fits on 64 H100s only with its experts spread and its state sharded; its
# recipe ships the layout ranked first among those of one stage (train runs pipeline
# stages on the CPU only so far); the layouts that do not fit even with every layer
# recomputed name the term that needs the most. Its aux loss over all layers together
# pipelines (the stage messages carry its sums): a pipeline layout ranks first.
mixtral="$root/recipes/mixtral-8x7b.textproto"
"$bin" plan "$mixtral" --world 64 --device-memory 80GiB --json "$work/plan.json" >"$work/out"
shipped=$(sed -n 's/^  tensor_parallel_size: \([0-9]*\)$/tp \1/p; s/^  expert_parallel_size: \([0-9]*\)$/ep \1/p; s/^  zero_stage: \([0-9]\)$/zero \1/p; s/^  recompute: \([A-Z]*\).*/recompute \1/p' "$mixtral" |
  tr 'A-Z' 'a-z' | paste -sd, | sed 's/,/, /g')
[[ $shipped == tp* ]] || shipped="tp 1, $shipped"  # tensor_parallel_size unset: 1
grep -E '^ *[0-9]+\. pp 1, ' "$work/out" | head -n 1 |
  grep -qE "^ *[0-9]+\. pp 1, dp [0-9]+, $shipped +$number " ||
  { fail "mixtral: best layout of one stage ($shipped)"; cat "$work/out"; }
grep -qE 'ep 1, zero 0, recompute full +does not fit: rank [0-9]+ needs .* the most for optimizer state' "$work/out" ||
  { fail "mixtral: refusal reason"; cat "$work/out"; }
grep -qE '^  1\. pp ([2-9]|[1-9][0-9]+), ' "$work/out" && ! grep -q '^no layout with pp > 1' "$work/out" ||
  { fail "mixtral: pipeline layouts"; cat "$work/out"; }
python3 - "$work/plan.json" <<'PY' || fail "mixtral: json"
import json, sys
j = json.load(open(sys.argv[1]))
fit = [l for l in j["layouts"] if l["fits"]]
assert fit and all(l["largest_rank"]["total"] <= j["device_memory_bytes"] for l in fit)
# Those with a tenth of the device to spare first, each group by step time.
assert [l["tight"] for l in fit] == sorted(l["tight"] for l in fit)
for tight in (False, True):
    group = [l["step_s"] for l in fit if l["tight"] == tight]
    assert group == sorted(group)
assert all(l["tight"] == (l["largest_rank"]["total"] >= 0.9 * j["device_memory_bytes"]) for l in fit)
assert all(l["step_s"] >= l["compute_s"] > 0 for l in fit)
PY

# The recipe's own layout, after --set.
"$bin" plan "$mixtral" --world 64 --device-memory 80GiB --layout recipe --set parallel.zero_stage=1 |
  grep -qE '^  1\. pp 1, dp 64, tp 1, ep 8, zero 1, recompute full +[0-9]' || fail "--layout recipe"

# One layout.
"$bin" plan "$mixtral" --world 64 --device-memory 80GiB --layout tp=4,ep=8,zero=1 >"$work/out" &&
  [[ $(grep -cE '^  1\. pp 1, dp 16, tp 4, ep 8, zero 1(,| )' "$work/out") -eq 1 ]] &&
  [[ $(wc -l <"$work/out") -eq 4 ]] || { fail "one layout"; cat "$work/out"; }

# Pipeline layouts are ranked with their bubble, and one that does not fit names the
# micro-batches its fullest stage holds.
"$bin" plan "$mixtral" --world 64 --device-memory 80GiB \
  --json "$work/pp.json" >"$work/out" || fail "mixtral pipelines: exit status"
grep -qE "^ *[0-9]+\. pp 8, dp [0-9]+, .* does not fit: .*, stage 0 holding 8 micro-batches' activations\$" "$work/out" ||
  { fail "mixtral: pipeline layout that does not fit"; cat "$work/out"; }
python3 - "$work/pp.json" <<'PY' || fail "mixtral: pipeline json"
import json, sys
j = json.load(open(sys.argv[1]))
pp = [l for l in j["layouts"] if l["pipeline_parallel_size"] > 1 and l["fits"]]
assert pp and all(l["bubble_s"] > 0 and l["pipeline_s"] > 0 for l in pp)
assert all(l["bubble_s"] == 0 for l in j["layouts"] if l["pipeline_parallel_size"] == 1)
PY
# The bubble is (P - 1) / (m + P - 1) of the pipelined work and bubble together: 7 / (m + 7)
# with pp 8, m = 1024 sequences / (8 replicas x micro-batch 1).
"$bin" plan "$mixtral" --world 64 --device-memory 80GiB \
  --layout pp=8,tp=1,ep=8,zero=1 --json "$work/one_pp.json" >/dev/null &&
  python3 - "$work/one_pp.json" <<'PY' || fail "pipeline bubble"
import json, sys
l = json.load(open(sys.argv[1]))["layouts"][0]
m = 1024 // l["data_parallel_size"]
work = l["step_s"] - l["bubble_s"] - l["gradient_s"]
assert abs(l["bubble_s"] / (work + l["bubble_s"]) - 7 / (m + 7)) < 1e-9, l
PY

# One accounting: plan's fullest rank is the dry run's, term by term, with the recipe's
# recomputation.
"$bin" plan "$mixtral" --world 64 --device-memory 80GiB --layout tp=4,ep=8,zero=2,recompute=full \
  --json "$work/one.json" >/dev/null &&
  "$bin" train "$mixtral" --dry-run --world 64 --set parallel.tensor_parallel_size=4 \
    --set parallel.zero_stage=2 | tail -n 1 >"$work/dry.json" &&
  python3 - "$work/one.json" "$work/dry.json" <<'PY' || fail "plan and dry run disagree"
import json, sys
plan = json.load(open(sys.argv[1]))["layouts"][0]["largest_rank"]
ranks = json.load(open(sys.argv[2]))["ranks"]
assert plan == max(ranks, key=lambda r: r["total"]), (plan, ranks[0])
PY

# expect_error NAME MESSAGE -- ARGS...: exit 1 and one stderr line containing MESSAGE.
expect_error() {
  local name="$1" message="$2"
  shift 3
  "$bin" plan "$@" >"$work/out" 2>"$work/err"
  local status=$?
  if [[ $status -ne 1 || $(wc -l <"$work/err") -ne 1 ]] || ! grep -qF -- "$message" "$work/err"; then
    fail "$name: status $status"; cat "$work/err"
  else
    echo "ok   $name"
  fi
}
tiny="$root/recipes/tiny.textproto"
expect_error "memory without a number" "--device-memory: GB is not a size" -- "$tiny" --world 2 --device-memory GB
expect_error "negative memory" "--device-memory: -5GB is below one byte" -- "$tiny" --world 2 --device-memory -5GB
expect_error "nan memory" "--device-memory: nan is not a size" -- "$tiny" --world 2 --device-memory nan
expect_error "huge memory" "--device-memory: 1e30 is more than 1152921504606846976 bytes" -- "$tiny" --world 2 --device-memory 1e30
expect_error "no world" "--world is required" -- "$tiny" --device-memory 80GB
expect_error "world too large" "--world: 5000 is out of range [1, 4096]" -- "$tiny" --world 5000 --device-memory 80GB
expect_error "unknown layout key" "--layout: want pp=N,tp=N,ep=N,zero=0..3" -- "$tiny" --world 2 --device-memory 80GB --layout vp=2
expect_error "pipeline the world refuses" "parallel.pipeline_parallel_size (3) must divide the world size (2)" -- "$tiny" --world 2 --device-memory 80GB --layout pp=3
expect_error "repeated layout key" "--layout: want pp=N,tp=N,ep=N,zero=0..3" -- "$tiny" --world 2 --device-memory 80GB --layout tp=1,tp=2
expect_error "zero stage 4" "--layout zero: 4 is out of range [0, 3]" -- "$tiny" --world 2 --device-memory 80GB --layout zero=4
expect_error "unknown recomputation" "recompute=none|selective|full" -- "$tiny" --world 2 --device-memory 80GB --layout recompute=some
expect_error "layout the recipe refuses" "must be divisible by parallel.tensor_parallel_size (4)" -- "$tiny" --world 4 --device-memory 80GB --layout tp=4
expect_error "layout the world refuses" "(3)" -- "$tiny" --world 2 --device-memory 80GB --layout ep=3
expect_error "unknown gpu" "--gpu: no known peak for" -- "$tiny" --world 2 --device-memory 80GB --gpu abacus
expect_error "zero bandwidth" "--bandwidth" -- "$tiny" --world 2 --device-memory 80GB --bandwidth 0
expect_error "nan bandwidth" "--bandwidth: nan is not a finite number" -- "$tiny" --world 2 --device-memory 80GB --bandwidth nan
expect_error "nan peak" "--peak-tflops: nan is not a finite number" -- "$tiny" --world 2 --device-memory 80GB --peak-tflops nan
expect_error "json into a missing directory" "$work/none/p.json" -- "$tiny" --world 2 --device-memory 80GB --json "$work/none/p.json"
exit $((failures > 0))
