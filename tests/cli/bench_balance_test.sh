#!/usr/bin/env bash
# `switchyard bench balance` on the tiny recipe with synthetic tokens: the table, the
# JSON's keys and a self-contained HTML report; bad input ends with one stderr line.
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
expect_error "unknown path" "nope.textproto" -- "$bin" bench balance "$work/nope.textproto" --synthetic zipf:1.1
expect_error "bad synthetic spec" "zipf:S" -- "$bin" bench balance "$tiny" --synthetic uniform
expect_error "negative zipf exponent" "zipf:-1" -- "$bin" bench balance "$tiny" --synthetic zipf:-1
expect_error "ep not dividing experts" "--ep 3" -- "$bin" bench balance "$tiny" --synthetic zipf:1.1 --ep 3

[[ $failures -eq 0 ]]
