"""Loss-free balancing (moe.score_function SIGMOID with moe.bias_update_rate): the experts'
bias moves once per optimizer step from the load of the whole global batch, so it is the
same whatever the layout (data, expert, tensor parallel, ZeRO-3) and however the batch is
cut into micro-batches; it is state, saved in checkpoints and restored on resume.

Run by ctest with the interop Python; SWITCHYARD and MPIEXEC name the binaries.
"""
import re

import numpy as np
import pytest
from safetensors.numpy import load_file

from sy_testing import SWITCHYARD, run
from test_train_equivalence import (COMMON, LAYOUTS, RECIPE, assert_run_matches, routed_alike,
                                    train)

RATE = 0.01
SIGMOID = ["--set", "moe.score_function=SIGMOID", "--set", "moe.aux_loss_coef=0",
           "--set", f"moe.bias_update_rate={RATE}", "--set", "moe.renormalize=true",
           "--set", "moe.routed_scaling_factor=1.5", "--set", "moe.num_groups=4",
           "--set", "moe.top_groups=2"]
BIAS = re.compile(r"model\.layers\.\d+\.mlp\.gate\.e_score_correction_bias")


def biases(weights):
    found = {name: value for name, value in weights.items() if BIAS.fullmatch(name)}
    assert len(found) == 2, sorted(weights)  # the runs have two MoE layers
    return found


def assert_moved_in_steps(bias, steps):
    """Each step moves each bias by -RATE, 0 or +RATE."""
    assert np.any(bias != 0), bias
    assert np.all(np.abs(bias) <= steps * RATE * (1 + 1e-6)), bias


@pytest.fixture(scope="module")
def single_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("sigmoid")


@pytest.fixture(scope="module")
def single(single_dir):
    return train(single_dir, "single", 1, SIGMOID)


@pytest.mark.parametrize("layout", ["dp2xep2", "tp2xep2", "dp2xep2-zero3"])
def test_bias_matches_single_process(tmp_path, single, layout):
    single_losses, single_weights = single
    ranks, overrides = LAYOUTS[layout]
    losses, weights = train(tmp_path, layout, ranks, overrides + SIGMOID)
    assert_run_matches(losses, weights, single_losses, single_weights)
    for name, bias in biases(weights).items():
        assert_moved_in_steps(bias, len(losses))
        # The bias follows the loads: once a near-tie routed a token elsewhere (the
        # digests differ), it may move otherwise.
        if routed_alike(losses, single_losses) == len(losses):
            np.testing.assert_array_equal(bias, single_weights[name], err_msg=name)


def test_bias_is_the_same_for_one_micro_batch_or_eight(tmp_path, single):
    """Each token's forward is the same bits in any micro-batch (runtime.batch_invariant),
    so step 1 routes alike; the bias then matches while the routing does."""
    four_losses, cut_in_four = single  # micro-batches of 2 of the 8 sequences
    one_losses, whole = train(tmp_path, "one", 1, SIGMOID + ["--set", "train.micro_batch_size=8"])
    eight_losses, cut_in_eight = train(tmp_path, "eight", 1,
                                       SIGMOID + ["--set", "train.micro_batch_size=1"])
    for losses, weights in [(eight_losses, cut_in_eight), (four_losses, cut_in_four)]:
        assert routed_alike(losses, one_losses) >= 1, (losses.routing, one_losses.routing)
        if routed_alike(losses, one_losses) == len(losses):
            for name, bias in biases(whole).items():
                np.testing.assert_array_equal(weights[name], bias, err_msg=name)


def test_resume_restores_the_bias(tmp_path, single, single_dir):
    """A run resumed from the last checkpoint, with no step left to train, saves as its
    final weights exactly the bias the checkpoint holds; under another layout too."""
    _, saved = single
    checkpoint = single_dir / "single" / "checkpoints" / "step_4"
    for ranks, overrides in [(1, []), LAYOUTS["dp2xep2-zero3"]]:
        run_dir = tmp_path / f"resumed_on_{ranks}"
        result = run([SWITCHYARD, "train", RECIPE, "--run-dir", run_dir,
                      "--dataset-cache", single_dir / "datasets", *COMMON, *SIGMOID, *overrides,
                      "--resume-from", checkpoint], ranks=ranks)
        assert f"resuming from {checkpoint} (step 4)" in result.stdout, result.stdout
        resumed = load_file(str(run_dir / "checkpoints" / "final" / "model.safetensors"))
        for name, bias in biases(saved).items():
            assert_moved_in_steps(bias, 4)
            np.testing.assert_array_equal(resumed[name], bias, err_msg=name)
