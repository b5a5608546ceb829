"""A corrupt newest checkpoint: train refuses to resume it, naming the newest complete
one and the --resume-from that resumes from it; that command continues from that step
and `latest` then moves forward. A complete step directory without `latest` resumes. A metrics.jsonl line torn by a kill is dropped. Ranks
that find different resume steps end the job instead of training on mixed steps.

Run by ctest with the interop Python; SWITCHYARD and MPIEXEC name the binaries.
"""
from pathlib import Path

import pytest

from sy_testing import SWITCHYARD, TINY_RECIPE as RECIPE, mpirun, run


def train_argv(run_dir, cache, steps, *extra):
    # Resumes raise train.steps past the checkpoint's, which --extend-schedule allows (and
    # a fresh start refuses: it has no schedule to continue).
    resuming = (Path(run_dir) / "checkpoints").is_dir()
    return [SWITCHYARD, "train", str(RECIPE), "--run-dir", str(run_dir),
            *(["--extend-schedule"] if resuming else []),
            "--dataset-cache", str(cache), "--set", f"train.steps={steps}",
            "--set", "optimizer.warmup_steps=0", "--set", "train.eval_interval=0",
            "--set", "train.log_interval=1", "--set", "checkpoint.interval_steps=1",
            "--set", "checkpoint.keep=5", "--set", "model.num_layers=2",
            "--set", "train.global_batch_size=4", "--set", "train.micro_batch_size=4",
            "--set", "train.seq_len=32", *extra]


def train(run_dir, cache, steps, *extra, expect=0):
    return run(train_argv(run_dir, cache, steps, *extra), expect=expect, threads=1, timeout=600)


@pytest.fixture
def trained(tmp_path):
    """tmp_path with a run of 2 steps in run/ and its dataset cache in cache/."""
    train(tmp_path / "run", tmp_path / "cache", 2)
    return tmp_path


def latest(run_dir):
    return (run_dir / "checkpoints" / "latest").read_text()


def test_corrupt_newest_checkpoint_names_the_older_one_and_resumes_from_it(trained):
    run_dir, cache = trained / "run", trained / "cache"
    step_1 = run_dir / "checkpoints" / "step_1"
    (run_dir / "checkpoints" / "step_2" / "manifest.pb").write_bytes(b"\xff" * 64)

    refused = train(run_dir, cache, 3, expect=1)
    assert refused.stderr.splitlines() == [refused.stderr.strip()]
    assert f"--resume-from {step_1}`" in refused.stderr
    assert latest(run_dir) == "step_2\n"

    resumed = train(run_dir, cache, 3, "--resume-from", str(step_1))
    assert f"resuming from {step_1} (step 1)" in resumed.stdout
    assert latest(run_dir) == "step_3\n"
    steps = [line for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if '"step"' in line]
    assert [int(line.split('"step":')[1].split(",")[0]) for line in steps] == [1, 2, 3]


def test_a_kill_before_the_first_latest_resumes_from_the_complete_step(trained):
    # What a kill between the first checkpoint's rename and `latest` leaves behind.
    run_dir, cache = trained / "run", trained / "cache"
    (run_dir / "checkpoints" / "latest").unlink()
    resumed = train(run_dir, cache, 3)
    assert f"resuming from {run_dir / 'checkpoints' / 'step_2'} (step 2)" in resumed.stdout
    assert latest(run_dir) == "step_3\n"


def test_torn_last_metrics_line_is_dropped(trained):
    run_dir, cache = trained / "run", trained / "cache"
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "loss": 6.9')
    resumed = train(run_dir, cache, 3)
    assert "resuming from" in resumed.stdout and "(step 2)" in resumed.stdout
    text = (run_dir / "metrics.jsonl").read_text()
    assert '"loss": 6.9' not in text and text.count('{"step":3,') == 1


def test_ranks_that_find_different_steps_end_the_job(trained):
    # Rank 0 sees the run at step 2, rank 1 an empty run directory.
    cache = trained / "cache"
    argv = [*mpirun(1), *train_argv(trained / "run", cache, 3, "--set", "train.micro_batch_size=2"),
            ":", "-np", "1",
            *train_argv(trained / "empty", cache, 3, "--set", "train.micro_batch_size=2")]
    result = run(argv, expect=None, threads=1, timeout=120)
    assert result.returncode != 0
    assert "rank 1 starts afresh but rank 0 resumes from step 2" in result.stderr
    assert (trained / "run" / "checkpoints" / "latest").read_text() == "step_2\n"
