"""A corrupt newest checkpoint: train refuses to resume it, naming the newest complete
one and the --resume-from that resumes from it; that command continues from that step
and `latest` then moves forward. A complete step directory without `latest` resumes. A metrics.jsonl line torn by a kill is dropped. Ranks
that find different resume steps end the job instead of training on mixed steps.

Run by ctest with the interop Python; SWITCHYARD and MPIEXEC name the binaries.
"""
import os
import subprocess
from pathlib import Path

import pytest

SWITCHYARD = os.environ["SWITCHYARD"]
RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "tiny.textproto"


MPIEXEC = os.environ.get("MPIEXEC", "mpirun")
ENV = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
           OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


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


def train(run_dir, cache, steps, *extra):
    return subprocess.run(train_argv(run_dir, cache, steps, *extra), capture_output=True,
                          text=True, timeout=600, env=ENV)


@pytest.fixture
def run(tmp_path):
    result = train(tmp_path / "run", tmp_path / "cache", 2)
    assert result.returncode == 0, result.stderr
    return tmp_path


def latest(run_dir):
    return (run_dir / "checkpoints" / "latest").read_text()


def test_corrupt_newest_checkpoint_names_the_older_one_and_resumes_from_it(run):
    run_dir, cache = run / "run", run / "cache"
    step_1 = run_dir / "checkpoints" / "step_1"
    (run_dir / "checkpoints" / "step_2" / "manifest.pb").write_bytes(b"\xff" * 64)

    refused = train(run_dir, cache, 3)
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [refused.stderr.strip()]
    assert f"--resume-from {step_1}`" in refused.stderr
    assert latest(run_dir) == "step_2\n"

    resumed = train(run_dir, cache, 3, "--resume-from", str(step_1))
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from {step_1} (step 1)" in resumed.stdout
    assert latest(run_dir) == "step_3\n"
    steps = [line for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if '"step"' in line]
    assert [int(line.split('"step":')[1].split(",")[0]) for line in steps] == [1, 2, 3]


def test_a_kill_before_the_first_latest_resumes_from_the_complete_step(run):
    # What a kill between the first checkpoint's rename and `latest` leaves behind.
    run_dir, cache = run / "run", run / "cache"
    (run_dir / "checkpoints" / "latest").unlink()
    resumed = train(run_dir, cache, 3)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from {run_dir / 'checkpoints' / 'step_2'} (step 2)" in resumed.stdout
    assert latest(run_dir) == "step_3\n"


def test_torn_last_metrics_line_is_dropped(run):
    run_dir, cache = run / "run", run / "cache"
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "loss": 6.9')
    resumed = train(run_dir, cache, 3)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stdout and "(step 2)" in resumed.stdout
    text = (run_dir / "metrics.jsonl").read_text()
    assert '"loss": 6.9' not in text and text.count('{"step":3,') == 1


def test_ranks_that_find_different_steps_end_the_job(run):
    # Rank 0 sees the run at step 2, rank 1 an empty run directory.
    cache = run / "cache"
    argv = [MPIEXEC, "--oversubscribe",
            "-np", "1", *train_argv(run / "run", cache, 3, "--set", "train.micro_batch_size=2"),
            ":", "-np", "1", *train_argv(run / "empty", cache, 3, "--set", "train.micro_batch_size=2")]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=ENV)
    assert result.returncode != 0
    assert "rank 1 starts afresh but rank 0 resumes from step 2" in result.stderr
    assert (run / "run" / "checkpoints" / "latest").read_text() == "step_2\n"
