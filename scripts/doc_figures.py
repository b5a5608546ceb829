#!/usr/bin/env python3
"""Reruns the commands behind the figures that README.md and docs/training.md quote (the
tiny run's time and throughput, its validation losses, its last progress line and the
sample after it) and prints them in the form the docs use, with the CPU and the date
they were measured on.

    scripts/doc_figures.py [--switchyard build/engine/cli/switchyard] [--run-dir DIR]
                           [--set field.path=value ...]

The run directory (a fresh temporary one by default) must not hold a run already: the
figures are those of one uninterrupted run. The full tiny run takes about 3 minutes on
a 2-core machine; `--set train.steps=20` tries the script in seconds.
"""
import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "recipes/tiny.textproto"
SAMPLE = '--prompt "ROMEO:" --tokens 80 --ignore-eos --seed 1'


def cpu_model():
    """The CPU's model name as /proc/cpuinfo gives it, and the logical CPUs."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "an unknown CPU", os.cpu_count()
    names = re.findall(r"^model name\s*:\s*(.+)$", text, re.M)
    return (names[0].strip() if names else "an unknown CPU"), os.cpu_count()


def train(switchyard, run_dir, overrides):
    """The run's output (echoed to stderr as it comes) and its wall time in seconds."""
    command = [switchyard, "train", RECIPE, "--run-dir", str(run_dir)]
    for override in overrides:
        command += ["--set", override]
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in process.stdout:
        sys.stderr.write(line)
        lines.append(line.rstrip("\n"))
    if process.wait() != 0:
        sys.exit(f"doc_figures: `{' '.join(command)}` exited {process.returncode}")
    return lines, time.monotonic() - started


def last(lines, pattern, what):
    found = [line for line in lines if re.match(pattern, line)]
    if not found:
        sys.exit(f"doc_figures: the run printed no {what}")
    return found[-1]


def minutes(seconds):
    return f"{int(seconds) // 60}m{int(seconds) % 60:02d}s"


def report(run_dir, lines, wall_s, sample_text):
    cpu, logical = cpu_model()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "tokens_per_s" in r]
    evals = [r for r in records if "val_loss" in r]
    speeds = sorted(r["tokens_per_s"] for r in steps[1:] or steps)
    mfus = sorted(100 * r["mfu"] for r in steps[1:] or steps)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    print(f"Measured on {cpu} ({logical} logical CPUs), {date}, `switchyard train {RECIPE}`:")
    print()
    print(f"- wall time {minutes(wall_s)} ({wall_s:.0f} s), {speeds[0] / 1e3:.1f}-"
          f"{speeds[-1] / 1e3:.1f}k tokens/s, MFU {mfus[0]:.0f}-{mfus[-1]:.0f}% "
          f"({last(lines, r'^peak ', 'peak line')})")
    print(f"- validation loss from {evals[0]['val_loss']:.2f} (untrained) to "
          f"{evals[-1]['val_loss']:.2f} nats per token")
    print()
    print("| step | " + " | ".join(str(r["step"]) for r in evals) + " |")
    print("|---|" + "---|" * len(evals))
    print("| val_loss | " + " | ".join(f"{r['val_loss']:.2f}" for r in evals) + " |")
    print()
    print("```")
    print(last(lines, r"^step\s+\d+/\d+ ", "progress line"))
    print(last(lines, r"^eval step \d+ ", "evaluation line"))
    print("```")
    print()
    print(f"`switchyard sample DIR/checkpoints/final {SAMPLE}`:")
    print()
    print("```")
    print(sample_text.rstrip("\n"))
    print("```")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--switchyard", default=str(ROOT / "build/engine/cli/switchyard"))
    parser.add_argument("--run-dir", help="where the run goes (default: a temporary directory)")
    parser.add_argument("--set", action="append", default=[], dest="overrides",
                        help="a recipe override passed on to train (field.path=value)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="doc_figures.") as scratch:
        run_dir = Path(args.run_dir or Path(scratch) / "tiny").absolute()
        if (run_dir / "checkpoints").exists():
            sys.exit(f"doc_figures: {run_dir} already holds a run; give a new --run-dir")
        lines, wall_s = train(args.switchyard, run_dir, args.overrides)
        sample = subprocess.run(
            [args.switchyard, "sample", str(run_dir / "checkpoints/final"), *shlex.split(SAMPLE)],
            cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True).stdout
        report(run_dir, lines, wall_s, sample)


if __name__ == "__main__":
    main()
