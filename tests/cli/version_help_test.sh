#!/usr/bin/env bash
# `--version` prints one line (version, commit, build type, CUDA) and exits 0; `--help`
# shows each option's default and exits 0.
#   version_help_test.sh SWITCHYARD_BINARY
set -u
bin="$1"
failures=0
err_file="$(mktemp)"
trap 'rm -f "$err_file"' EXIT

# expect NAME PATTERN -- COMMAND...: exit status 0, empty stderr, stdout matching PATTERN.
expect() {
  local name="$1" pattern="$2"
  shift 3
  local out err status
  out=$("$@" 2>"$err_file")
  status=$?
  err=$(cat "$err_file")
  if [[ $status -ne 0 || -n "$err" ]] || ! grep -Eq -- "$pattern" <<<"$out"; then
    echo "FAIL $name: exit status $status, stdout:"; echo "$out"; echo "stderr: $err"
    failures=$((failures + 1)); return
  fi
  echo "ok   $name"
}

version_line='^switchyard [0-9]+\.[0-9]+\.[0-9]+ \(commit ([0-9a-f]{12}|unknown), [A-Za-z]+ build, CUDA (on|off)\)$'
expect "--version" "$version_line" -- "$bin" --version
lines=$("$bin" --version | wc -l)
[[ $lines -eq 1 ]] || { echo "FAIL --version printed $lines lines"; failures=$((failures + 1)); }
expect "train --help shows defaults" '--peak-gflops FLOAT=0 ' -- "$bin" train --help
expect "eval --help shows defaults" '--split TEXT=val ' -- "$bin" eval --help
expect "sample --help shows defaults" '--temperature FLOAT=0\.8' -- "$bin" sample --help
expect "data prepare --help shows defaults" '--val-fraction FLOAT=' -- "$bin" data prepare --help
expect "bench balance --help shows defaults" '--batches INT=8 ' -- "$bin" bench balance --help

[[ $failures -eq 0 ]] || exit 1
