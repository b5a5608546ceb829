"""Expert choice (moe.gating EXPERT_CHOICE): each expert chooses among the tokens of one
micro-batch, which data and expert parallelism keep whole on one rank, so those layouts
train as one process does.

Run by ctest with the interop Python; SWITCHYARD and MPIEXEC name the binaries.
"""
import pytest

from test_train_equivalence import LAYOUTS, assert_run_matches, train

EXPERT_CHOICE = ["--set", "moe.gating=EXPERT_CHOICE", "--set", "moe.capacity_factor=1.25"]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return train(tmp_path_factory.mktemp("expert_choice"), "single", 1, EXPERT_CHOICE)


@pytest.mark.parametrize("layout", ["dp2xep2", "dp2-zero3"])
def test_expert_choice_matches_single_process(tmp_path, single, layout):
    single_losses, single_weights = single
    ranks, overrides = LAYOUTS[layout]
    losses, weights = train(tmp_path, layout, ranks, overrides + EXPERT_CHOICE)
    assert_run_matches(losses, weights, single_losses, single_weights, overrides)
