"""Activation recomputation in parallel layouts: under tensor, expert and data parallelism
and ZeRO-3 (whose parameter hooks gather each layer again for its recomputed forward),
SELECTIVE and FULL (every layer, and the first of two) train exactly as NONE in the same
layout: the same losses, aux and z losses and gradient norms at every step and the same
final weights, bit for bit. GShard's sampled second expert is replayed by the recomputed
forward, and its expert-parallel exchange sends the same rows again.

Run by ctest with the interop Python; SWITCHYARD and MPIEXEC name the binaries.
"""
import numpy as np
import pytest

from test_train_equivalence import LAYOUTS, train

MODES = {
    "selective": ["--set", "train.recompute=SELECTIVE"],
    "full": ["--set", "train.recompute=FULL"],
    "full-first-layer": ["--set", "train.recompute=FULL", "--set", "train.recompute_layers=1"],
}
GSHARD = ["--set", "moe.gating=GSHARD_TOP2", "--set", "moe.capacity_factor=1.0"]
CASES = {  # name: (layout, routing overrides)
    "tp2xep2": ("tp2xep2", []),
    "dp2xtp2-zero3": ("dp2xtp2-zero3", []),
    "dp2xep2-zero3-gshard": ("dp2xep2-zero3", GSHARD),
}


@pytest.fixture(scope="module")
def none_runs(tmp_path_factory):
    runs = {}

    def run_none(case):
        if case not in runs:
            layout, routing = CASES[case]
            ranks, overrides = LAYOUTS[layout]
            runs[case] = train(tmp_path_factory.mktemp(case), "none", ranks, overrides + routing)
        return runs[case]

    return run_none


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES)
def test_recompute_matches_none_in_the_layout(tmp_path, none_runs, case, mode):
    none_losses, none_weights = none_runs(case)
    layout, routing = CASES[case]
    ranks, overrides = LAYOUTS[layout]
    losses, weights = train(tmp_path, mode, ranks, overrides + routing + MODES[mode])
    assert np.array_equal(losses, none_losses), (losses, none_losses)
    assert weights.keys() == none_weights.keys()
    for name, value in none_weights.items():
        assert np.array_equal(weights[name], value), name
