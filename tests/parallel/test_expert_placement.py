"""Expert placement (parallel.expert_placement): the expert-parallel ranks hold the experts
in the placement's order, the router keeps its logical ids and the dispatcher sends each
token to the rank and local slot holding its expert. A run under a placement trains as one
process and as the contiguous placement; its checkpoints and final weights keep the
experts in logical order, so a run saved under one placement and expert-parallel size
resumes under another.

Run by ctest with the interop Python; SWITCHYARD and MPIEXEC name the binaries.
"""
import h5py
import numpy as np
import pytest
from safetensors.numpy import load_file

from sy_testing import SWITCHYARD, rewind, run
from test_train_equivalence import (COMMON, LAYOUTS, RECIPE, assert_run_matches, logged_losses,
                                    train)

# The tiny recipe's 8 experts: no rank keeps its contiguous share, and under ep 2 rank 0
# holds experts 5, 2, 7, 0 (four slices of each expert tensor in a checkpoint), rank 1
# experts 1, 6, 3, 4 (three: 3-4 is one run).
PLACEMENT = "5,2,7,0,1,6,3,4"
OTHER_PLACEMENT = "3,6,0,1,7,4,2,5"


def placed(placement):
    return ["--set", f"parallel.expert_placement={placement}"]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    return tmp_path_factory.mktemp("datasets")


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return train(tmp_path_factory.mktemp("single"), "single", 1)


@pytest.mark.parametrize("layout", ["ep2", "ep4", "dp2xep2", "dp2xep2-zero3"])
def test_placement_matches_contiguous_and_single_process(tmp_path, single, layout):
    ranks, overrides = LAYOUTS[layout]
    contiguous_losses, contiguous_weights = train(tmp_path, "contiguous", ranks, overrides)
    losses, weights = train(tmp_path, "placed", ranks, overrides + placed(PLACEMENT))
    assert_run_matches(losses, weights, contiguous_losses, contiguous_weights, overrides)
    assert_run_matches(losses, weights, *single, overrides)


def test_capacity_over_a_tensor_parallel_group_follows_the_placement(tmp_path):
    """With a capacity under tensor parallelism every rank plans the group's assignments
    (by position under a placement) and keeps its own."""
    capacity = ["--set", "moe.capacity_factor=1.25"]
    single_losses, single_weights = train(tmp_path, "single", 1, capacity)
    ranks, overrides = LAYOUTS["tp2xep2"]
    losses, weights = train(tmp_path, "placed", ranks, overrides + capacity + placed(PLACEMENT))
    assert_run_matches(losses, weights, single_losses, single_weights)


def train_output(tmp_path, name, ranks, extra):
    """What the run prints; its run directory is tmp_path / name."""
    return run([SWITCHYARD, "train", RECIPE, "--run-dir", tmp_path / name,
                "--dataset-cache", tmp_path / "datasets", *COMMON, *extra], ranks=ranks).stdout


@pytest.mark.parametrize("resumed_by", [
    (4, ["--set", "parallel.expert_parallel_size=4", *placed(OTHER_PLACEMENT)]),
    (1, []),
], ids=["ep4-other-placement", "one-process"])
def test_a_checkpoint_resumes_under_another_placement(tmp_path, single, resumed_by):
    saving = ["--set", "checkpoint.interval_steps=2"]
    train_output(tmp_path, "run", 2, saving + LAYOUTS["ep2"][1] + placed(PLACEMENT))
    rewind(tmp_path / "run", 2)
    gate_up = "param/model.layers.0.mlp.experts.gate_up_proj"
    for rank, runs in [(0, [gate_up, gate_up + ".rows_0", gate_up + ".rows_2",
                            gate_up + ".rows_7"]),
                       (1, [gate_up, gate_up + ".rows_3", gate_up + ".rows_6"])]:
        with h5py.File(tmp_path / "run" / "checkpoints" / "step_2" / f"rank_{rank}.h5") as saved:
            names = []
            saved.visit(names.append)
        assert sorted(n for n in names if n.startswith(gate_up)) == runs, names
    ranks, overrides = resumed_by
    out = train_output(tmp_path, "run", ranks, saving + overrides)
    assert "resuming from" in out and "(step 2)" in out, out
    losses = logged_losses(tmp_path / "run")
    weights = load_file(str(tmp_path / "run" / "checkpoints" / "final" / "model.safetensors"))
    # Resumed on another number of ranks, the run goes on exactly as it would have.
    assert_run_matches(losses, weights, *single, overrides)


def test_final_weights_convert_as_the_contiguous_runs(tmp_path):
    """The Hugging Face export of a placed run's final weights holds each expert under
    its own name, as the contiguous run's does."""
    exports = {}
    for name, placement in [("contiguous", []), ("placed", placed(PLACEMENT))]:
        train_output(tmp_path, name, 2, LAYOUTS["ep2"][1] + placement)
        out = tmp_path / f"{name}-hf"
        run([SWITCHYARD, "convert", "to-hf", tmp_path / name / "checkpoints" / "final", out],
            timeout=120)
        exports[name] = load_file(str(out / "model.safetensors"))
    assert set(exports["placed"]) == set(exports["contiguous"])
    for tensor, value in exports["contiguous"].items():
        diff = np.abs(exports["placed"][tensor] - value)
        assert diff.max() < 1.5e-3, (tensor, diff.max())
        assert np.mean(diff > 1e-5) < 3e-2, (tensor, np.mean(diff > 1e-5))


@pytest.mark.parametrize("placement,ep,message", [
    ("0,1,2,3,4,5,6", 2, "parallel.expert_placement has 7 entries; it must list each of "
                         "the moe.num_experts (8) experts once"),
    ("0,1,2,3,4,5,6,8", 2, "parallel.expert_placement[7] (8) is not an expert: it must be "
                           "in [0, 8)"),
    ("0,1,2,3,4,5,6,6", 2, "parallel.expert_placement[7] (6) lists an expert twice: it must "
                           "be a permutation"),
    ("0,1,2,3,4,5,7,6", 1, "parallel.expert_placement places experts over expert-parallel "
                           "ranks: it needs parallel.expert_parallel_size > 1"),
    ("0,1,x", 2, "parallel.expert_placement[2]: x is not an integer"),
])
def test_a_bad_placement_is_refused_in_one_line(tmp_path, placement, ep, message):
    result = run([SWITCHYARD, "train", RECIPE, "--run-dir", tmp_path / "run", "--dry-run",
                  "--set", f"parallel.expert_parallel_size={ep}", *placed(placement)],
                 expect=None, timeout=60)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
