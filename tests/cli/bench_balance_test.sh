#!/usr/bin/env bash
# `switchyard bench balance` on the tiny recipe with synthetic tokens: the table, the
# JSON's keys and a self-contained HTML report; --compare on the recipe and on a trained
# checkpoint; --replica-slots on a 64-expert variant; bad input ends with one stderr line.
#   bench_balance_test.sh SWITCHYARD_BINARY REPO_ROOT
set -u
bin="$1"
root="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0

fail() { echo "FAIL $*"; failures=$((failures + 1)); }

if "$bin" bench balance "$root/recipes/tiny.textproto" --synthetic zipf:1.1 --batches 2 --ep 2 \
    --json "$work/b.json" --report "$work/b.html" >"$work/out" 2>"$work/err"; then
  grep -q "overall" "$work/out" || fail "table: no overall row"
  python3 - "$work/b.json" <<'PY' || fail "json keys"
import json, sys
j = json.load(open(sys.argv[1]))
assert len(j["layers"]) == 4, len(j["layers"])
for s in j["layers"] + [j["overall"]]:
    for key in ("tokens_per_expert", "share", "imbalance", "cv", "entropy", "dropped",
                "aux_loss", "z_loss", "all_to_all"):
        assert key in s, key
    assert len(s["tokens_per_expert"]) == 8 and abs(sum(s["share"]) - 1) < 1e-9
    assert set(s["dropped"]) == {"1.0", "1.25", "1.5", "2.0"}, s["dropped"]
    assert s["imbalance"] >= 1
    a = s["all_to_all"]
    assert len(a["sent_bytes"]) == 2 and len(a["received_bytes"]) == 2
    assert sum(a["sent_bytes"]) == sum(a["received_bytes"])
# 2 batches x 8 x 128 tokens x top-2 per layer.
assert sum(j["layers"][0]["tokens_per_expert"]) == 2 * 8 * 128 * 2
PY
  grep -q "<svg" "$work/b.html" || fail "report: no <svg"
  grep -Eq "(src|href)=\"(http|//)" "$work/b.html" && fail "report: external resource"
  echo "ok   bench balance output"
else
  fail "bench balance exited $?: $(cat "$work/err")"
fi

# --compare: one block per variant on the same tokens and weights; the variant that
# matches the recipe gives exactly the plain run's statistics.
if "$bin" bench balance "$root/recipes/tiny.textproto" --synthetic zipf:1.1 --batches 2 --ep 2 \
    --compare top_k=1,2,4 --json "$work/c.json" --report "$work/c.html" >"$work/out" 2>"$work/err"; then
  for v in top_k=1 top_k=2 top_k=4; do
    grep -q "^$v " "$work/out" || fail "compare table: no block for $v"
  done
  [[ $(grep -c "overall" "$work/out") -eq 3 ]] || fail "compare table: expected 3 overall rows"
  python3 - "$work/c.json" "$work/b.json" <<'PY' || fail "compare json"
import json, sys
c, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert c["compare"] == "top_k=1,2,4" and "layers" not in c
assert [v["name"] for v in c["variants"]] == ["top_k=1", "top_k=2", "top_k=4"]
for v, k in zip(c["variants"], (1, 2, 4)):
    assert v["top_k"] == k and v["gating"] == "TOP_K" and v["renormalize"], v
    assert len(v["layers"]) == 4
    for s in v["layers"]:
        assert sum(s["tokens_per_expert"]) == 2 * 8 * 128 * k
        assert "all_to_all" in s
same = c["variants"][1]
assert same["layers"] == b["layers"] and same["overall"] == b["overall"]
# More experts per token spread the load: top-4 is more even than top-1.
assert c["variants"][2]["overall"]["imbalance"] <= c["variants"][0]["overall"]["imbalance"]
PY
  # A heatmap, an all-to-all and a rank-load figure per variant.
  [[ $(grep -c "<figure>" "$work/c.html") -eq 9 ]] || fail "compare report: expected 9 figures"
  echo "ok   bench balance --compare top_k"
else
  fail "bench balance --compare exited $?: $(cat "$work/err")"
fi
if "$bin" bench balance "$root/recipes/tiny.textproto" --synthetic zipf:1.1 --batches 1 \
    --compare "renormalize=true, false" --json "$work/g.json" >"$work/out" 2>"$work/err"; then
  python3 - "$work/g.json" <<'PY' || fail "renormalize compare json"
import json, sys
v = json.load(open(sys.argv[1]))["variants"]
assert [x["renormalize"] for x in v] == [True, False], v
# The same router picks the same experts in the first layer; only the weights differ.
assert v[0]["layers"][0]["tokens_per_expert"] == v[1]["layers"][0]["tokens_per_expert"]
PY
  echo "ok   bench balance --compare renormalize"
else
  fail "bench balance --compare renormalize exited $?: $(cat "$work/err")"
fi

# gating=all: every gating of the recipe schema, in its order, on the same tokens, each
# with the expert placement advice of --ep 2.
if "$bin" bench balance "$root/recipes/tiny.textproto" --synthetic zipf:1.1 --batches 1 --ep 2 \
    --compare gating=all --json "$work/a.json" --report "$work/a.html" >"$work/out" 2>"$work/err"; then
  python3 - "$work/a.json" <<'PY' || fail "gating=all json"
import json, sys
v = json.load(open(sys.argv[1]))["variants"]
assert [x["gating"] for x in v] == ["TOP_K", "GSHARD_TOP2", "EXPERT_CHOICE"], v
# GShard renormalises its two weights, expert choice never.
assert [x["renormalize"] for x in v] == [True, True, False], v
for x in v:
    p = x["placement"]
    assert sorted(p["advised"]) == list(range(8)), p
    total = sum(x["overall"]["tokens_per_expert"])
    assert sum(p["contiguous_rank_tokens"]) == total == sum(p["advised_rank_tokens"]), p
    assert p["lower_bound"] <= p["advised_max"] <= p["contiguous_max"], p
    assert p["advised_max"] == max(p["advised_rank_tokens"]), p
    t = x["overall"]["tokens_per_expert"]
    assert p["advised_rank_tokens"][0] == sum(t[e] for e in p["advised"][:4]), p
# Every expert of expert choice takes its capacity: 8 x 128 x 2 / 8 tokens per layer.
assert v[2]["layers"][0]["tokens_per_expert"] == [256] * 8, v[2]["layers"][0]
PY
  grep -q "parallel.expert_placement: \[" "$work/out" || fail "gating=all: no placement line"
  grep -q "1/E = 12.5% (uniform)" "$work/a.html" || fail "gating=all report: no colour legend"
  grep -q "Tokens per expert-parallel rank" "$work/a.html" || fail "gating=all report: no rank load"
  echo "ok   bench balance --compare gating=all with placement advice"
else
  fail "bench balance --compare gating=all exited $?: $(cat "$work/err")"
fi

# --replica-slots: on zipf 1.2 tokens, 64 experts of the tiny recipe on ep 8, one replica
# slot per rank brings the busiest rank from far over the mean (1.80 measured) to within
# 1.10 of it, all layers together and in each layer.
if "$bin" bench balance "$root/recipes/tiny.textproto" --set moe.num_experts=64 \
    --synthetic zipf:1.2 --ep 8 --replica-slots 1 --json "$work/rep.json" >"$work/out" \
    2>"$work/err"; then
  python3 - "$work/rep.json" <<'PY' || fail "replica json"
import json, sys
j = json.load(open(sys.argv[1]))
r = j["replicas"]
assert r["slots_per_rank"] == 1
assert j["ep_rank_max_over_mean"] == r["ep_rank_max_over_mean"] >= 1.5, j["ep_rank_max_over_mean"]
assert j["ep_rank_max_over_mean_replicated"] == r["ep_rank_max_over_mean_replicated"] <= 1.10, r
assert r["rank_tokens"] == j["placement"]["contiguous_rank_tokens"]
total = sum(j["overall"]["tokens_per_expert"])
assert sum(r["rank_tokens"]) == total == sum(r["rank_tokens_replicated"])
# The rows sent without replicas are the all-to-all's: hidden 128 bf16 values a row.
assert r["exchange_rows"] * 128 * 2 == sum(j["overall"]["all_to_all"]["sent_bytes"]), r
assert 0 < r["exchange_rows_replicated"] <= total
assert len(r["layers"]) == 4
for layer, stats in zip(r["layers"], j["layers"]):
    assert layer["ep_rank_max_over_mean_replicated"] <= 1.10, layer
    assert layer["ep_rank_max_over_mean_replicated"] <= layer["ep_rank_max_over_mean"], layer
    assert sum(layer["rank_tokens_replicated"]) == sum(stats["tokens_per_expert"])
    held = layer["replicated_experts"]
    assert len(held) == 8 and all(len(experts) <= 1 for experts in held), held
    # No rank holds a replica of its own experts (rank p owns [8p, 8p + 8)).
    assert all(e // 8 != p for p, experts in enumerate(held) for e in experts), held
PY
  grep -q "^replicas, 1 slot per rank in each layer, all layers: busiest rank" "$work/out" ||
    fail "replica line"
  [[ $(grep -c "^  layer [0-3]: busiest rank .*; replicated by rank: " "$work/out") -eq 4 ]] ||
    fail "replica layer lines"
  echo "ok   bench balance --replica-slots: $(grep "^replicas" "$work/out")"
else
  fail "bench balance --replica-slots exited $?: $(cat "$work/err")"
fi

# A trained checkpoint: its router, routed with another top-k.
if "$bin" train "$root/recipes/tiny.textproto" --run-dir "$work/run" --set train.steps=3 \
    --set optimizer.warmup_steps=0 --set train.eval_interval=0 --set train.log_interval=1 \
    --dataset-cache "$work/cache" >/dev/null 2>"$work/err"; then
  weights="$work/run/checkpoints/final"
  if "$bin" bench balance "$weights" --synthetic zipf:1.1 --batches 1 --compare top_k=1,2 \
      --json "$work/t.json" >"$work/out" 2>"$work/err" &&
     "$bin" bench balance "$weights" --synthetic zipf:1.1 --batches 1 --json "$work/t2.json" >/dev/null 2>>"$work/err"; then
    python3 - "$work/t.json" "$work/t2.json" <<'PY' || fail "checkpoint compare json"
import json, sys
c, plain = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert [v["top_k"] for v in c["variants"]] == [1, 2]
assert c["variants"][1]["layers"] == plain["layers"]
assert sum(c["variants"][0]["layers"][0]["tokens_per_expert"]) == 8 * 128
PY
    echo "ok   bench balance --compare on a checkpoint"
    # A recorded run's routing, planned with replica slots as a recipe's is.
    if "$bin" bench balance "$weights" --synthetic zipf:1.1 --batches 1 --ep 4 --replica-slots 1 \
        --json "$work/tr.json" >/dev/null 2>"$work/err"; then
      python3 - "$work/tr.json" <<'PY' || fail "checkpoint replica json"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["ep_rank_max_over_mean_replicated"] <= j["ep_rank_max_over_mean"], j
assert len(j["replicas"]["layers"]) == 4 and j["replicas"]["slots_per_rank"] == 1
PY
      echo "ok   bench balance --replica-slots on a checkpoint"
    else
      fail "bench balance --replica-slots on a checkpoint: $(cat "$work/err")"
    fi
    # The sigmoid router adds its bias (at 0) to the trained weights; softmax keeps them.
    if "$bin" bench balance "$weights" --synthetic zipf:1.1 --batches 1 \
        --compare score_function=SIGMOID,SOFTMAX --json "$work/s.json" >/dev/null \
        2>"$work/err"; then
      python3 - "$work/s.json" "$work/t2.json" <<'PY' || fail "checkpoint sigmoid compare json"
import json, sys
c, plain = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert [v["score_function"] for v in c["variants"]] == ["SIGMOID", "SOFTMAX"]
assert c["variants"][1]["layers"] == plain["layers"]
PY
      echo "ok   bench balance --compare score_function on a checkpoint"
    else
      fail "bench balance --compare score_function on a checkpoint: $(cat "$work/err")"
    fi
    # --run-dir: each layer's imbalance over the run, from its metrics.jsonl.
    if "$bin" bench balance "$weights" --synthetic zipf:1.1 --batches 1 --run-dir "$work/run" \
        --report "$work/r.html" --json "$work/r.json" >"$work/out" 2>"$work/err"; then
      python3 - "$work/r.json" <<'PY' || fail "--run-dir json"
import json, sys
h = json.load(open(sys.argv[1]))["run_history"]
assert h["steps"] == [1, 2, 3], h
assert len(h["layer_imbalance"]) == 4 and all(len(l) == 3 for l in h["layer_imbalance"]), h
assert all(1 <= v <= 8 for l in h["layer_imbalance"] for v in l), h
PY
      grep -q "^run .*: 3 logged steps" "$work/out" || fail "--run-dir: no history summary"
      [[ $(grep -c "^  layer [0-3]: " "$work/out") -eq 4 ]] || fail "--run-dir: expected 4 layers"
      grep -q "over training" "$work/r.html" || fail "--run-dir report: no history chart"
      grep -c "<polyline" "$work/r.html" | grep -qx 4 || fail "--run-dir report: expected 4 lines"
      echo "ok   bench balance --run-dir"
    else
      fail "bench balance --compare gating on a checkpoint: $(cat "$work/err")"
    fi
  else
    fail "bench balance --compare on a checkpoint: $(cat "$work/err")"
  fi
else
  fail "a 3-step training run failed: $(cat "$work/err")"
fi

# expect_error NAME EXPECTED_SUBSTRING -- COMMAND...
expect_error() {
  local name="$1" want="$2"
  shift 3
  "$@" >"$work/out" 2>"$work/err"
  local status=$?
  if [[ $status -ne 1 || $(wc -l <"$work/err") -ne 1 ]] || ! grep -q -- "$want" "$work/err"; then
    fail "$name: exit $status, stderr:"; cat "$work/err"; return
  fi
  echo "ok   $name: $(cat "$work/err")"
}

tiny="$root/recipes/tiny.textproto"
mkdir -p "$work/badrun" "$work/emptyrun"
printf '{"step":1,"layer_imbalance":[1.5,2]}\n{"step":2,"layer_imbalance":[1.5]}\n' >"$work/badrun/metrics.jsonl"
printf '{"step":1,"loss":2}\n' >"$work/emptyrun/metrics.jsonl"
expect_error "unknown path" "nope.textproto" -- "$bin" bench balance "$work/nope.textproto" --synthetic zipf:1.1
expect_error "run dir that is not one" "no such directory" -- "$bin" bench balance "$tiny" --synthetic zipf:1.1 --batches 1 --run-dir "$work/nope"
expect_error "run dir without metrics" "metrics.jsonl" -- "$bin" bench balance "$tiny" --synthetic zipf:1.1 --batches 1 --run-dir "$work/cache"
expect_error "run dir with a short line" "line 2 lists 1 layers" -- "$bin" bench balance "$tiny" --synthetic zipf:1.1 --batches 1 --run-dir "$work/badrun"
expect_error "run dir without the field" "no line has layer_imbalance" -- "$bin" bench balance "$tiny" --synthetic zipf:1.1 --batches 1 --run-dir "$work/emptyrun"
expect_error "bad synthetic spec" "zipf:S" -- "$bin" bench balance "$tiny" --synthetic uniform
expect_error "negative zipf exponent" "--synthetic zipf:S: -1 is out of range (0, 64]" -- "$bin" bench balance "$tiny" --synthetic zipf:-1
expect_error "ep not dividing experts" "--ep 3" -- "$bin" bench balance "$tiny" --synthetic zipf:1.1 --ep 3
# K 0 (the default) plans no replica.
if "$bin" bench balance "$tiny" --synthetic zipf:1.1 --batches 1 --ep 2 --replica-slots 0 \
    >"$work/none" 2>"$work/err"; then
  if grep -q "^replicas" "$work/none"; then
    fail "bench balance --replica-slots 0 planned replicas"
  else
    echo "ok   bench balance --replica-slots 0 plans none"
  fi
else
  fail "bench balance --replica-slots 0 exited $?: $(cat "$work/err")"
fi
expect_error "replica slots without --ep" "needs --ep 2 or more" -- "$bin" bench balance "$tiny" --synthetic zipf:1.1 --batches 1 --replica-slots 1
expect_error "replica slots past a rank's experts" "--replica-slots 5 is out of range \[1, 4\] for 8 experts on --ep 2" -- "$bin" bench balance "$tiny" --synthetic zipf:1.1 --batches 1 --ep 2 --replica-slots 5
expect_error "--set on weights" "--set overrides a recipe file" -- "$bin" bench balance "$work/run/checkpoints/final" --synthetic zipf:1.1 --batches 1 --set moe.num_experts=64
expect_error "--set of a bad value" "moe.num_experts: x is not an integer" -- "$bin" bench balance "$tiny" --synthetic zipf:1.1 --batches 1 --set moe.num_experts=x
z=(--synthetic zipf:1.1 --batches 1)
expect_error "compare without =" "expected top_k=K1,K2" -- "$bin" bench balance "$tiny" "${z[@]}" --compare top_k
expect_error "compare of an unknown setting" "unknown setting 'experts'" -- "$bin" bench balance "$tiny" "${z[@]}" --compare experts=4,8
expect_error "compare with an empty value" "empty value" -- "$bin" bench balance "$tiny" "${z[@]}" --compare top_k=1,,2
expect_error "compare top_k beyond the experts" "moe.top_k (9) must be <= moe.num_experts" -- "$bin" bench balance "$tiny" "${z[@]}" --compare top_k=1,9
expect_error "compare top_k not a number" "moe.top_k" -- "$bin" bench balance "$tiny" "${z[@]}" --compare top_k=two
expect_error "compare of an unknown gating names the schema's" "TOP_K, GSHARD_TOP2, EXPERT_CHOICE, score_function" -- "$bin" bench balance "$tiny" "${z[@]}" --compare gating=sparsemax
expect_error "compare of an unknown gating" "SPARSEMAX" -- "$bin" bench balance "$tiny" "${z[@]}" --compare gating=TOP_K,sparsemax
expect_error "compare of a gating by its old name" "moe.gating: SOFTMAX_TOPK is now moe.gating: TOP_K" -- "$bin" bench balance "$tiny" "${z[@]}" --compare gating=SOFTMAX_TOPK
expect_error "compare with a value twice" "listed twice" -- "$bin" bench balance "$tiny" "${z[@]}" --compare top_k=2,2
sed -e 's/top_k: 2/top_k: 1/' -e "s#corpus: .*#corpus: \"$root/data/corpus/tinyshakespeare.txt\"#" "$tiny" >"$work/top1.textproto"
expect_error "compare GShard on a top-1 recipe" "must be 2 with moe.gating GSHARD_TOP2" -- "$bin" bench balance "$work/top1.textproto" "${z[@]}" --compare gating=TOP_K,GSHARD_TOP2

[[ $failures -eq 0 ]]
