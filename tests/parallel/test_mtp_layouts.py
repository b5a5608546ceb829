"""Multi-token prediction (model.mtp_depth) under data, expert and tensor parallelism and
every ZeRO stage against one process, with tied embeddings, and a resume in the middle
of a run against the run that never stopped: bit for bit under runtime.batch_invariant
where the layout's sums are exact (assert_run_matches).

Run by ctest with the interop Python; SWITCHYARD and MPIEXEC name the binaries.
"""
import json
import re
import shutil

import pytest
from safetensors.numpy import load_file

from sy_testing import SWITCHYARD, TINY_RECIPE as RECIPE, rewind, run
from test_train_equivalence import COMMON, LAYOUTS, assert_run_matches, logged_losses, train

MTP = ["--set", "model.mtp_depth=2", "--set", "model.mtp_loss_coef=0.5"]
TIED = ["--set", "model.tie_embeddings=true"]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    runs = {}

    def run_single(name, extra):
        if name not in runs:
            runs[name] = train(tmp_path_factory.mktemp(name), "single", 1, MTP + extra)
        return runs[name]

    return run_single


@pytest.mark.parametrize("layout, tied", [("dp2-zero1", False), ("ep2", False),
                                          ("dp2xep2-zero3", False), ("tp2xep2", False),
                                          ("dp2-zero2", True), ("dp2xtp2-zero3", True)])
def test_layout_matches_single_process(tmp_path, single, layout, tied):
    extra = TIED if tied else []
    single_losses, single_weights = single("tied" if tied else "untied", extra)
    ranks, overrides = LAYOUTS[layout]
    losses, weights = train(tmp_path, layout, ranks, overrides + MTP + extra)
    assert any(name.endswith(".eh_proj.weight") for name in weights)
    assert_run_matches(losses, weights, single_losses, single_weights, overrides)


def test_a_resumed_run_continues_bit_for_bit(tmp_path, single):
    """The modules' weights and AdamW moments are in the checkpoint: resumed at step 2,
    a run ends with the uninterrupted run's losses and weights, bit for bit."""
    whole_losses, whole_weights = single("untied", [])
    every_two = MTP + ["--set", "checkpoint.interval_steps=2"]
    train(tmp_path, "stopped", 1, every_two)
    run_dir = tmp_path / "stopped"
    rewind(run_dir, 2)
    shutil.rmtree(run_dir / "checkpoints" / "final")
    resumed = run([SWITCHYARD, "train", RECIPE, "--run-dir", run_dir,
                   "--dataset-cache", tmp_path / "datasets", *COMMON, *every_two])
    assert re.search(r"resuming from \S+ \(step 2\)", resumed.stdout), resumed.stdout
    losses = logged_losses(run_dir)
    assert losses.tobytes() == whole_losses.tobytes(), (losses, whole_losses)
    weights = load_file(str(run_dir / "checkpoints" / "final" / "model.safetensors"))
    for name, value in whole_weights.items():
        assert weights[name].tobytes() == value.tobytes(), name
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    mtp = [m["mtp_loss"] for m in lines if "loss" in m]
    assert len(mtp) == len(losses) and all(m > 0 for m in mtp), mtp
