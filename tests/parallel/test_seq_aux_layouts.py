"""The sequence-wise aux loss (moe.seq_aux_loss_coef) under tensor, expert and data
parallelism against one process: tensor parallelism splits a sequence's tokens over the
ranks, whose per-sequence sums are added over the group, so the losses (with the term
reported apart in metrics.jsonl) and the final weights must match the single run. Each
run accumulates micro-batches; a mean over sequences is also the same whether the
global batch is one micro-batch or four.

Run by ctest with the interop Python; SWITCHYARD and MPIEXEC name the binaries.
"""
import json

import numpy as np
import pytest

from test_train_equivalence import LAYOUTS, assert_run_matches, assert_weights_match, train

# A coefficient far above DeepSeek-V3's 0.0001, so that the term moves the router.
SEQ_AUX = ["--set", "moe.seq_aux_loss_coef=0.5"]
GATINGS = {
    "softmax": ["--set", "moe.score_function=SOFTMAX"],
    "sigmoid": ["--set", "moe.score_function=SIGMOID", "--set", "moe.aux_loss_coef=0",
                "--set", "moe.renormalize=true"],
}


def seq_aux_losses(tmp_path, name):
    lines = [json.loads(l) for l in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return np.array([m["seq_aux_loss"] for m in lines if "loss" in m])


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    runs = {}

    def run_single(gating):
        if gating not in runs:
            where = tmp_path_factory.mktemp(gating)
            runs[gating] = (train(where, "single", 1, SEQ_AUX + GATINGS[gating]),
                            seq_aux_losses(where, "single"))
        return runs[gating]

    return run_single


@pytest.mark.parametrize("gating", GATINGS)
@pytest.mark.parametrize("layout", ["tp2xep2", "dp2xep2", "tp2"])
def test_layout_matches_single_process(tmp_path, single, layout, gating):
    (single_losses, single_weights), single_seq_aux = single(gating)
    # Two MoE layers, each at most E / k = 4 (every token of a sequence on the same k).
    assert np.all((single_seq_aux > 1) & (single_seq_aux < 8)), single_seq_aux
    ranks, overrides = LAYOUTS[layout]
    losses, weights = train(tmp_path, layout, ranks, overrides + SEQ_AUX + GATINGS[gating])
    assert_run_matches(losses, weights, single_losses, single_weights, overrides)
    np.testing.assert_allclose(seq_aux_losses(tmp_path, layout), single_seq_aux, rtol=2e-4)


def test_one_micro_batch_or_four(tmp_path):
    """Without the all-layers aux loss (a product of whole-batch means, which depends on
    how the batch is cut, so its reported value differs too), every term of the loss is a
    mean over sequences or tokens."""
    no_aux = SEQ_AUX + ["--set", "moe.aux_loss_coef=0"]
    four, four_weights = train(tmp_path, "four", 1, no_aux)
    one, one_weights = train(tmp_path, "one", 1, no_aux + ["--set", "train.micro_batch_size=8"])
    loss_z_norm = [0, 2, 3]
    np.testing.assert_allclose(one[0, loss_z_norm], four[0, loss_z_norm], rtol=1e-6)
    np.testing.assert_allclose(one[:, loss_z_norm], four[:, loss_z_norm], rtol=2e-4)
    assert_weights_match(one_weights, four_weights)
    np.testing.assert_allclose(seq_aux_losses(tmp_path, "one"), seq_aux_losses(tmp_path, "four"),
                               rtol=2e-4)
