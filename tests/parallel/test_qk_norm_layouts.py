"""q/k norms under tensor parallelism against one process: the whole-projection norm
(OLMoE, `model.qk_norm`: each rank normalises the projection gathered over the group)
and the per-head norm (Qwen3-MoE, `model.qk_head_norm`: each rank normalises its own
heads and sums the weight gradient over the group), alone and with data parallelism and
ZeRO-3. Losses and final weights must match as test_train_equivalence.py's layouts do.

Run by ctest with the interop Python; SWITCHYARD and MPIEXEC name the binaries.
"""
import pytest

from test_train_equivalence import LAYOUTS, assert_run_matches, train

NORMS = {
    "whole": ["--set", "model.qk_norm=true"],
    # Attention narrower than the hidden size, as in Qwen3-MoE's shapes.
    "per_head": ["--set", "model.qk_head_norm=true", "--set", "model.head_dim=16"],
}


@pytest.mark.parametrize("layout", ["tp2", "dp2xtp2-zero3"])
@pytest.mark.parametrize("norm", NORMS)
def test_qk_norm_under_tensor_parallelism_matches_single_process(tmp_path, norm, layout):
    single_losses, single_weights = train(tmp_path, "single", 1, NORMS[norm])
    ranks, overrides = LAYOUTS[layout]
    losses, weights = train(tmp_path, layout, ranks, overrides + NORMS[norm])
    assert any(name.endswith("q_norm.weight") for name in weights)
    assert_run_matches(losses, weights, single_losses, single_weights)
