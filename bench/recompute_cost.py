"""What activation recomputation (train.recompute) costs and saves, measured in one run.

Trains the train_step.py shape on the engine with NONE, SELECTIVE and FULL in
alternating rounds and prints, for each mode, the best tokens/s over the rounds, its step
time over NONE's, and the activation peak its first step records (metrics.jsonl's
memory_bytes) over NONE's. Ratios from the same run only; nothing here is asserted.

Run with the project Python environment, e.g.
  ~/.cache/switchyard/pyenv/bin/python bench/recompute_cost.py \
      --switchyard build/engine/cli/switchyard
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_step import RECIPE, REPO, add_shape_args, engine_overrides  # noqa: E402

MODES = ["NONE", "SELECTIVE", "FULL"]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--switchyard", required=True, help="path to the switchyard binary")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--warmup", type=int, default=1, help="untimed steps before the timed ones")
    p.add_argument("--steps", type=int, default=3, help="timed steps")
    add_shape_args(p)
    p.add_argument("--rounds", type=int, default=3, help="alternate the modes this many times")
    p.add_argument("--json", type=Path, help="also write the results to this file")
    return p.parse_args()


def measure(args, mode):
    """Tokens/s over the timed steps and the first step's activation peak in bytes."""
    with tempfile.TemporaryDirectory(prefix="switchyard-recompute-") as run_dir:
        cmd = [args.switchyard, "train", str(RECIPE), "--run-dir", run_dir,
               *engine_overrides(args), "--set", f"train.recompute={mode}"]
        subprocess.run(cmd, check=True, capture_output=True, cwd=REPO)
        lines = [json.loads(l) for l in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    elapsed = {l["step"]: l["elapsed_s"] for l in lines if "elapsed_s" in l}
    seconds = elapsed[args.warmup + args.steps] - elapsed[args.warmup]
    peak = next(l["memory_bytes"]["activations"] for l in lines if "memory_bytes" in l)
    return args.steps * args.batch * args.seq / seconds, peak


def main():
    args = parse_args()
    best = {m: (0.0, 0) for m in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            tokens_per_s, peak = measure(args, mode)
            best[mode] = (max(best[mode][0], tokens_per_s), peak)
    base_speed, base_peak = best["NONE"]
    print(f"shape: hidden {args.hidden}, layers {args.layers}, heads {args.heads} "
          f"(kv {args.kv_heads}), {args.experts} experts top-{args.top_k}, expert ffn "
          f"{args.ffn}, seq {args.seq}, batch {args.batch}; threads {args.threads}, "
          f"{args.warmup} warmup + {args.steps} timed steps, best of {args.rounds} rounds")
    print(f"{'mode':<10} {'tokens/s':>9} {'step time / NONE':>17} {'activations MiB':>16} "
          f"{'activations / NONE':>19}")
    results = {}
    for mode in MODES:
        speed, peak = best[mode]
        results[mode] = {"tokens_per_s": speed, "step_time_ratio": base_speed / speed,
                         "activation_bytes": peak, "activation_ratio": peak / base_peak}
        print(f"{mode:<10} {speed:9.1f} {base_speed / speed:17.3f} {peak / 2**20:16.2f} "
              f"{peak / base_peak:19.3f}")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "modes": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
