"""Weak scaling of expert-parallel training: tokens/s at 1, 2 and 4 ranks with the same
work per rank, and the share of step time spent in the all-to-all exchanges.

Every run trains the tiny recipe's model (or the shape given) for a few steps with
`parallel.expert_parallel_size` = ranks, `train.global_batch_size` = ranks x
--batch-per-rank, so each rank processes the same tokens per step whatever the rank
count. Ranks run under mpirun (--oversubscribe), each with --threads-per-rank threads
(default: the machine's cores divided by the largest rank count, at least 1, so that
every run uses the same threads per rank). Tokens/s comes from metrics.jsonl over the
steps after the warmup; all_to_all_share is rank 0's wall time inside all-to-all
divided by its step time, waiting for slower ranks included.

The table prints, per rank count: tokens/s, tokens/s per rank, weak-scaling efficiency
(tokens/s per rank over the 1-rank run's) and the all-to-all share. Efficiency is only
meaningful while ranks x threads-per-rank fits in the machine's cores.

  python3 bench/weak_scaling.py --switchyard build/engine/cli/switchyard
"""

import argparse
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "tiny.textproto"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--switchyard", required=True, help="path to the switchyard binary")
    p.add_argument("--mpirun", default=shutil.which("mpirun") or "mpirun")
    p.add_argument("--ranks", default="1,2,4", help="comma-separated rank counts")
    p.add_argument("--batch-per-rank", type=int, default=4, help="sequences per rank per step")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--ffn", type=int, default=256, help="expert FFN size")
    p.add_argument("--threads-per-rank", type=int, default=0)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=6, help="timed steps after the warmup")
    p.add_argument("--json", help="also write the results here")
    return p.parse_args()


def run(args, ranks, threads, work_dir):
    run_dir = work_dir / f"ranks{ranks}"
    steps = args.warmup + args.steps
    overrides = {
        "train.steps": steps, "train.log_interval": 1, "train.eval_interval": 0,
        "train.seq_len": args.seq, "train.micro_batch_size": args.batch_per_rank,
        "train.global_batch_size": ranks * args.batch_per_rank,
        "model.hidden_size": args.hidden, "model.num_layers": args.layers,
        "moe.num_experts": args.experts, "moe.expert_ffn_hidden_size": args.ffn,
        "parallel.expert_parallel_size": ranks, "runtime.threads": threads,
        "checkpoint.interval_steps": 0, "optimizer.warmup_steps": 1,
    }
    cmd = [args.switchyard, "train", str(RECIPE), "--run-dir", str(run_dir)]
    for key, value in overrides.items():
        cmd += ["--set", f"{key}={value}"]
    if ranks > 1:
        cmd = [args.mpirun, "--oversubscribe", "-np", str(ranks)] + cmd
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{ranks} ranks failed:\n{result.stderr}")
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = [m for m in lines if "tokens_per_s" in m and m["step"] > args.warmup]
    seconds = timed[-1]["elapsed_s"] - [m for m in lines if m.get("step") == args.warmup
                                        and "elapsed_s" in m][0]["elapsed_s"]
    tokens = args.steps * ranks * args.batch_per_rank * args.seq
    share = sum(m["all_to_all_share"] for m in timed) / len(timed)
    return {"ranks": ranks, "threads_per_rank": threads, "tokens_per_s": tokens / seconds,
            "all_to_all_share": share}


def main():
    args = parse_args()
    rank_counts = [int(r) for r in args.ranks.split(",")]
    threads = args.threads_per_rank or max(1, (os.cpu_count() or 1) // max(rank_counts))
    with tempfile.TemporaryDirectory() as tmp:
        results = [run(args, ranks, threads, Path(tmp)) for ranks in rank_counts]
    base = results[0]["tokens_per_s"] / results[0]["ranks"]
    print(f"shape: hidden {args.hidden}, layers {args.layers}, {args.experts} experts "
          f"(ffn {args.ffn}), seq {args.seq}, {args.batch_per_rank} sequences per rank per "
          f"step; expert parallelism over all ranks; {threads} thread(s) per rank; "
          f"{args.warmup} warmup + {args.steps} timed steps; {os.cpu_count()} cores")
    print(f"{'ranks':>5} {'tokens/s':>10} {'per rank':>10} {'efficiency':>10} {'all-to-all':>10}")
    for r in results:
        per_rank = r["tokens_per_s"] / r["ranks"]
        r["efficiency"] = per_rank / base
        print(f"{r['ranks']:>5} {r['tokens_per_s']:>10.0f} {per_rank:>10.0f} "
              f"{r['efficiency']:>9.0%} {r['all_to_all_share']:>9.1%}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
