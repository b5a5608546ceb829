"""A run that the recipe or its checkpoint refuses writes nothing into the run directory:
a train.freeze entry that names no parameter leaves a fresh run directory without
metrics.jsonl or a TensorBoard file, and a resumed one exactly as it was.

Run by ctest with the interop Python; SWITCHYARD names the binary.
"""
from pathlib import Path

import pytest

from sy_testing import SWITCHYARD, TINY_RECIPE as RECIPE, run

SMALL = ["--set", "model.num_layers=2", "--set", "train.seq_len=32",
         "--set", "optimizer.warmup_steps=0", "--set", "train.log_interval=1",
         "--set", "train.global_batch_size=2", "--set", "train.micro_batch_size=2",
         "--set", "train.eval_interval=0", "--set", "train.steps=2"]
REFUSED = ["--set", "train.freeze=routers"]


def train(run_dir, cache, *extra, expect=0):
    return run([SWITCHYARD, "train", RECIPE, "--run-dir", run_dir, "--dataset-cache", cache,
                *SMALL, *extra], expect=expect, threads=1, timeout=600)


def contents(run_dir):
    """Every file under run_dir with its bytes."""
    return {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def assert_refused(result):
    assert result.returncode == 1, result.stdout + result.stderr
    assert 'train.freeze "routers" names no parameter' in result.stderr, result.stderr


def test_a_refused_fresh_run_creates_no_records(cache, tmp_path):
    run_dir = tmp_path / "run"
    assert_refused(train(run_dir, cache, *REFUSED, expect=None))
    assert not (run_dir / "metrics.jsonl").exists()
    assert not run_dir.exists() or contents(run_dir) == {}


def test_a_refused_resume_leaves_the_run_directory_as_it_was(cache, tmp_path):
    run_dir = tmp_path / "run"
    train(run_dir, cache)
    before = contents(run_dir)
    assert Path("metrics.jsonl") in before
    assert_refused(train(run_dir, cache, *REFUSED, expect=None))
    assert contents(run_dir) == before
