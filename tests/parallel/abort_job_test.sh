#!/bin/sh
# Usage: abort_job_test.sh MPIEXEC HELPER
# Checks that one rank's abort_job ends the whole job quickly with a non-zero status.
mpiexec=$1
helper=$2
limit_s=45
start=$(date +%s)
output=$(timeout "$limit_s" "$mpiexec" -np 4 --oversubscribe --allow-run-as-root "$helper" 2>&1)
status=$?
elapsed=$(($(date +%s) - start))
echo "$output"
fail() {
  echo "FAIL: $1"
  exit 1
}
[ "$status" -eq 124 ] && fail "mpirun still running after ${limit_s}s: the abort left ranks waiting"
[ "$status" -eq 0 ] && fail "mpirun exited 0 although rank 1 aborted"
echo "$output" | grep -q "simulated fatal error" || fail "rank 1's error message is missing"
echo "$output" | grep -q "passed the barrier" && fail "a rank passed a barrier rank 1 never reached"
echo "ok: mpirun exited with status $status after ${elapsed}s"
