#!/usr/bin/env bash
# The main job on a fresh machine: install what is missing, build, train the tiny recipe
# on the bundled corpus (checkpointing as it goes), print a generated sample, and export
# the model to Hugging Face format.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh --cuda-if-gpu switchyard
run_dir="${1:-runs/tiny}"
build/engine/cli/switchyard train recipes/tiny.textproto --run-dir "$run_dir"
build/engine/cli/switchyard sample "$run_dir/checkpoints/final" --prompt "ROMEO:" --ignore-eos
build/engine/cli/switchyard convert to-hf "$run_dir/checkpoints/final" "$run_dir/hf" --overwrite
