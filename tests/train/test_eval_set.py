"""The validation set is a fixed set of windows: the first evaluation of a run is the same
figure for any micro-batch size (exactly) and under a 2-rank layout (to 1e-6), and equals
`switchyard eval` of the same weights; eval reads a checkpoints/step_N of a 2-rank run and
its Hugging Face export to the same figure. Saved recipes hold paths that work from any
working directory and after the run directory moves: eval, bench balance and a resume of
a moved run succeed from another directory.

Run by ctest with the interop Python; SWITCHYARD and MPIEXEC name the binaries.
"""
import json
import os
import shutil
from pathlib import Path

import pytest

from sy_testing import CORPUS, SWITCHYARD, TINY_RECIPE as RECIPE, run

SEQ = 32
EVAL_WINDOWS = 20  # two and a half batches of evaluation windows
SMALL = ["--set", "model.num_layers=2", "--set", f"train.seq_len={SEQ}",
         "--set", "optimizer.warmup_steps=0", "--set", "train.log_interval=1",
         "--set", "train.global_batch_size=4", "--set", "train.micro_batch_size=4",
         "--set", f"train.eval_tokens={EVAL_WINDOWS * SEQ}"]


def val_losses(run_dir):
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return {m["step"]: m["val_loss"] for m in map(json.loads, lines) if "val_loss" in m}


def eval_loss(weights, dataset, *extra):
    report = json.loads(run([SWITCHYARD, "eval", weights, "--data", dataset, *extra],
                            threads=1, timeout=600).stdout)
    assert report["tokens"] == EVAL_WINDOWS * SEQ
    return report["val_loss"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, corpus_tokenizer):
    """The tiny corpus prepared once."""
    cache = tmp_path_factory.mktemp("cache")
    run([SWITCHYARD, "data", "prepare", "--tokenizer", corpus_tokenizer(1024), "--input", CORPUS,
         "--out", cache / "ds"], threads=1, timeout=600)
    return cache / "ds"


def train(run_dir, dataset, *extra, ranks=1, cwd=None):
    return run([SWITCHYARD, "train", RECIPE, "--run-dir", run_dir, *SMALL,
                "--set", "data.corpus=", "--set", f"data.dataset={dataset}",
                "--set", "train.steps=1", "--set", "train.eval_interval=1",
                "--set", "checkpoint.interval_steps=1", *extra],
               ranks=ranks, threads=1, timeout=600, cwd=cwd)


@pytest.fixture(scope="module")
def runs(dataset, tmp_path_factory):
    """One step of the same run with micro-batches of 4 and of 1, and on 2 ranks (expert
    parallel, ZeRO-1)."""
    root = tmp_path_factory.mktemp("runs")
    train(root / "mb4", dataset, "--set", "train.micro_batch_size=4")
    train(root / "mb1", dataset, "--set", "train.micro_batch_size=1")
    train(root / "ep2", dataset, "--set", "train.micro_batch_size=2",
          "--set", "parallel.expert_parallel_size=2", "--set", "parallel.zero_stage=1", ranks=2)
    return root


def test_the_first_evaluation_is_the_same_for_any_batch_and_layout(runs):
    first = val_losses(runs / "mb4")[0]
    assert val_losses(runs / "mb1")[0] == first
    assert val_losses(runs / "ep2")[0] == pytest.approx(first, rel=1e-6)


def test_eval_of_the_weights_gives_the_runs_figure(runs, dataset):
    assert eval_loss(runs / "mb4" / "checkpoints" / "final", dataset) == val_losses(runs / "mb4")[1]
    assert eval_loss(runs / "mb4" / "checkpoints" / "step_1", dataset) == val_losses(runs / "mb4")[1]


def test_eval_reads_a_two_rank_checkpoint_and_its_hugging_face_export(runs, dataset, tmp_path):
    step = runs / "ep2" / "checkpoints" / "step_1"
    from_checkpoint = eval_loss(step, dataset)
    assert from_checkpoint == pytest.approx(val_losses(runs / "ep2")[1], rel=1e-6)
    run([SWITCHYARD, "convert", "to-hf", step, tmp_path / "hf"], threads=1, timeout=600)
    # A Hugging Face directory does not record the run's evaluation set: name it.
    hf_loss = eval_loss(tmp_path / "hf", dataset, "--windows", EVAL_WINDOWS)
    assert hf_loss == pytest.approx(from_checkpoint, rel=1e-6)


def test_a_damaged_checkpoint_is_refused_naming_the_file(runs, dataset, tmp_path):
    step = tmp_path / "step_1"
    shutil.copytree(runs / "ep2" / "checkpoints" / "step_1", step)
    rank_file = step / "rank_0.h5"
    with open(rank_file, "r+b") as f:
        f.truncate(rank_file.stat().st_size // 2)
    result = run([SWITCHYARD, "eval", step, "--data", dataset], expect=1, threads=1, timeout=120)
    assert len(result.stderr.splitlines()) == 1 and str(rank_file) in result.stderr


def test_a_run_directory_works_from_anywhere_and_after_a_move(dataset, tmp_path):
    """Relative --run-dir and data.dataset from one directory; then the run directory
    moves and is used from another."""
    here = tmp_path / "here"
    here.mkdir()
    shutil.copytree(dataset, here / "run" / "data")  # a dataset inside the run directory
    train("run", "run/data", "--set", "train.steps=2", cwd=here)
    saved = (here / "run" / "checkpoints" / "final" / "recipe.textproto").read_text()
    assert 'dataset: "../../data"' in saved
    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    shutil.move(here / "run", moved)
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    final = moved / "checkpoints" / "final"
    assert eval_loss(moved / "checkpoints" / "step_1", moved / "data") != eval_loss(final, moved / "data")
    run([SWITCHYARD, "bench", "balance", final, "--batches", "1"], threads=1, timeout=600,
        cwd=elsewhere)
    resumed = elsewhere / "resumed"
    run([SWITCHYARD, "train", final / "recipe.textproto", "--run-dir", resumed,
         "--resume-from", moved / "checkpoints" / "step_1"], threads=1, timeout=600,
        cwd=elsewhere)
    assert val_losses(resumed)[2] == val_losses(moved)[2]


def test_a_relative_dataset_is_saved_absolute(dataset, tmp_path):
    run_dir = tmp_path / "run"
    train(run_dir, os.path.relpath(dataset, tmp_path), cwd=tmp_path)
    saved = (run_dir / "checkpoints" / "final" / "recipe.textproto").read_text()
    assert f'dataset: "{dataset}"' in saved
    run([SWITCHYARD, "bench", "balance", run_dir / "checkpoints" / "final", "--batches", "1"],
        threads=1, timeout=600, cwd=dataset)


def memory_bytes(run_dir):
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return next(m["memory_bytes"] for m in map(json.loads, lines) if "memory_bytes" in m)


@pytest.mark.parametrize("recompute", ["NONE", "FULL"])
def test_an_evaluation_keeps_nothing_for_a_backward(dataset, tmp_path, recompute):
    """The evaluation at step 0 runs batches of 8 windows, as large as these micro-batches:
    freeing each layer's tensors as the next layer has its input, it stays under the
    training step's peak of activations (under FULL recomputation it had kept every layer's,
    2.5 times the step's)."""
    shape = ["--set", "train.micro_batch_size=8", "--set", "train.global_batch_size=8",
             "--set", f"train.recompute={recompute}"]
    train(tmp_path / "with", dataset, *shape)
    train(tmp_path / "without", dataset, *shape, "--set", "train.eval_interval=0")
    assert val_losses(tmp_path / "with")
    assert memory_bytes(tmp_path / "with") == memory_bytes(tmp_path / "without")
