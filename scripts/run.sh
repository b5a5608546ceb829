#!/usr/bin/env bash
# The main job on a fresh machine: install what is missing, build, train the tiny recipe
# on the bundled corpus, and print a generated sample.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
run_dir="${1:-runs/tiny}"
build/engine/cli/switchyard train recipes/tiny.textproto --run-dir "$run_dir"
build/engine/cli/switchyard sample "$run_dir/checkpoints/final" --prompt "ROMEO:" --tokens 300
