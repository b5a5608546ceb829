"""A run that the recipe or its checkpoint refuses writes nothing into the run directory:
a train.freeze entry that names no parameter leaves a fresh run directory without
metrics.jsonl or a TensorBoard file, and a resumed one exactly as it was.

Run by ctest with the interop Python; SWITCHYARD names the binary.
"""
import os
import subprocess
from pathlib import Path

import pytest

SWITCHYARD = os.environ["SWITCHYARD"]
RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "tiny.textproto"
ENV = dict(os.environ, OMP_NUM_THREADS="1")
SMALL = ["--set", "model.num_layers=2", "--set", "train.seq_len=32",
         "--set", "optimizer.warmup_steps=0", "--set", "train.log_interval=1",
         "--set", "train.global_batch_size=2", "--set", "train.micro_batch_size=2",
         "--set", "train.eval_interval=0", "--set", "train.steps=2"]
REFUSED = ["--set", "train.freeze=routers"]


def train(run_dir, cache, *extra):
    return subprocess.run([SWITCHYARD, "train", str(RECIPE), "--run-dir", str(run_dir),
                           "--dataset-cache", str(cache), *SMALL, *extra],
                          capture_output=True, text=True, timeout=600, env=ENV)


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
    assert_refused(train(run_dir, cache, *REFUSED))
    assert not (run_dir / "metrics.jsonl").exists()
    assert not run_dir.exists() or contents(run_dir) == {}


def test_a_refused_resume_leaves_the_run_directory_as_it_was(cache, tmp_path):
    run_dir = tmp_path / "run"
    first = train(run_dir, cache)
    assert first.returncode == 0, first.stderr
    before = contents(run_dir)
    assert Path("metrics.jsonl") in before
    assert_refused(train(run_dir, cache, *REFUSED))
    assert contents(run_dir) == before
