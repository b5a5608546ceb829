"""Resuming keeps the learning-rate schedule: a changed schedule is refused naming the
field and the flag that allows it; --extend-schedule continues the rate from the
checkpoint's without a jump, as docs/training.md states, and a second resume of the
extended run reproduces it; elapsed_s counts every start of a run.

Run by ctest with the interop Python; SWITCHYARD names the binary.
"""
import json
import math
import re
import shutil

import numpy as np
import pytest

from sy_testing import SWITCHYARD, TINY_RECIPE as RECIPE, run

STEPS = 8
EXTENDED = 16
LR, MIN_LR, WARMUP = 3e-3, 3e-4, 1  # tiny.textproto's lr and min_lr, cosine decay


def train_args(run_dir, cache, *extra):
    """A tiny model, a checkpoint every 2 steps: a run of STEPS steps takes seconds."""
    return [SWITCHYARD, "train", str(RECIPE), "--run-dir", str(run_dir),
            "--dataset-cache", str(cache),
            "--set", f"train.steps={STEPS}", "--set", f"optimizer.warmup_steps={WARMUP}",
            "--set", "train.log_interval=1", "--set", "train.eval_interval=0",
            "--set", "train.global_batch_size=4", "--set", "train.micro_batch_size=2",
            "--set", "model.num_layers=1", "--set", "train.seq_len=32",
            "--set", "checkpoint.interval_steps=2", "--set", "checkpoint.keep=10",
            "--set", "runtime.threads=1", *extra]


def logged(run_dir, key):
    """step -> `key` of every training line of metrics.jsonl."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {m["step"]: m[key] for m in map(json.loads, lines) if "loss" in m}


def f32(x):
    """The recipe's float field as the engine reads it."""
    return float(np.float32(x))


def cosine(start_lr, step, start, total):
    """docs/training.md's decay from start_lr after step `start` to min_lr at `total`."""
    progress = min(1.0, (step - start) / (total - start))
    return f32(MIN_LR) + 0.5 * (start_lr - f32(MIN_LR)) * (1.0 + math.cos(math.pi * progress))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A run of STEPS steps with checkpoints at steps 2, 4, 6 and 8, and its dataset cache."""
    root = tmp_path_factory.mktemp("finished")
    run(train_args(root / "run", root / "cache"))
    return root / "run", root / "cache"


def copy_of(finished, tmp_path):
    run_dir, cache = finished
    shutil.copytree(run_dir, tmp_path / "run")
    return tmp_path / "run", cache


@pytest.mark.parametrize("change,named", [
    (["--set", f"train.steps={EXTENDED}"],
     rf"train.steps is {EXTENDED} in the recipe but {STEPS} in this checkpoint: .*"
     r"pass --extend-schedule"),
    (["--set", "optimizer.min_lr=0.0001"],
     r"optimizer.min_lr is 0.0001 in the recipe but 0.0003 .*--extend-schedule"),
    (["--set", "optimizer.decay=LINEAR"],
     r"optimizer.decay is LINEAR in the recipe but COSINE .*--extend-schedule"),
    (["--set", "optimizer.router_lr_scale=0.5"],
     r"optimizer.router_lr_scale is 0.5 in the recipe but 1 .*--extend-schedule"),
    (["--set", "optimizer.lr=0.001"],
     r"optimizer.lr is 0.001 in the recipe but 0.003 in this checkpoint: "
     r"it shapes the learning rates the run already had"),
    (["--set", "optimizer.warmup_steps=3", "--extend-schedule"],
     r"optimizer.warmup_steps is 3 in the recipe but 1 .*no resume changes it"),
    (["--set", "optimizer.lr=0.001", "--set", f"train.steps={EXTENDED}", "--extend-schedule"],
     r"optimizer.lr is 0.001 .*--extend-schedule changes train.steps"),
])
def test_a_changed_schedule_is_refused_naming_the_field(finished, tmp_path, change, named):
    run_dir, cache = copy_of(finished, tmp_path)
    before = (run_dir / "metrics.jsonl").read_bytes()
    result = run(train_args(run_dir, cache, *change), expect=1)
    assert result.stderr.count("\n") == 1 and re.search(named, result.stderr), result.stderr
    assert "step_8" in result.stderr, result.stderr
    assert (run_dir / "metrics.jsonl").read_bytes() == before
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_8\n"


@pytest.fixture(scope="module")
def extended(finished, tmp_path_factory):
    """The finished run resumed from its step 4 with train.steps raised to EXTENDED, and
    that resume's output."""
    run_dir = tmp_path_factory.mktemp("extended") / "run"
    shutil.copytree(finished[0], run_dir)
    result = run(train_args(run_dir, finished[1], "--set", f"train.steps={EXTENDED}",
                            "--extend-schedule", "--resume-from",
                            str(run_dir / "checkpoints" / "step_4")))
    return run_dir, finished[1], result.stdout


def test_extend_schedule_restarts_the_decay_from_the_checkpoints_rate(finished, extended):
    run_dir, _, output = extended
    before, after = logged(finished[0], "lr"), logged(run_dir, "lr")
    assert sorted(after) == list(range(1, EXTENDED + 1))
    # The curve up to the checkpoint is the one the run had.
    assert [after[s] for s in range(1, 5)] == [before[s] for s in range(1, 5)]
    assert before[4] == cosine(f32(LR), 4, WARMUP, STEPS)
    # Then a cosine from the rate at step 4 to min_lr at the new end: no jump.
    for step in range(5, EXTENDED + 1):
        assert after[step] == cosine(before[4], step, 4, EXTENDED), step
    assert before[4] > after[5] > after[6] > after[EXTENDED - 1] > after[EXTENDED] == f32(MIN_LR)
    # The resume says so, with the next and the last rates.
    line = re.search(r"learning-rate schedule changed \(--extend-schedule\): (\S+) at step 5, "
                     rf"(\S+) at step {EXTENDED} \(decaying from (\S+), the rate at step 4,",
                     output)
    assert line, output
    assert [float(v) for v in line.groups()] == pytest.approx([after[5], f32(MIN_LR), before[4]],
                                                              rel=1e-5)


def test_a_second_resume_of_the_extended_run_follows_the_same_curve(extended, tmp_path):
    whole, cache, _ = extended
    run_dir = tmp_path / "run"
    shutil.copytree(whole, run_dir)
    # The checkpoint at step 10 records the extended schedule: no flag is needed again.
    result = run(train_args(run_dir, cache, "--set", f"train.steps={EXTENDED}",
                            "--resume-from", str(run_dir / "checkpoints" / "step_10")))
    assert "resuming from" in result.stdout and "schedule changed" not in result.stdout
    assert logged(run_dir, "lr") == logged(whole, "lr")
    assert logged(run_dir, "loss") == logged(whole, "loss")


def test_elapsed_time_continues_across_a_resume(finished, tmp_path):
    run_dir, cache = copy_of(finished, tmp_path)
    first = logged(run_dir, "elapsed_s")
    run(train_args(run_dir, cache, "--resume-from", str(run_dir / "checkpoints" / "step_6")))
    elapsed = logged(run_dir, "elapsed_s")
    assert [elapsed[s] for s in range(1, 7)] == [first[s] for s in range(1, 7)]
    assert first[6] < elapsed[7] < elapsed[8]
