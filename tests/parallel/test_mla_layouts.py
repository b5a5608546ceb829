"""Multi-head latent attention (`model.mla`) under tensor parallelism against one process:
each rank holds its heads of q_b_proj (or q_proj), kv_b_proj and o_proj, computes the
replicated latents whole and sums their gradients over the group. With and without a
query latent, values wider than the query/key heads, alone and with data parallelism and
ZeRO-3. Losses and final weights must match as test_train_equivalence.py's layouts do.

Run by ctest with the interop Python; SWITCHYARD and MPIEXEC name the binaries.
"""
import pytest

from test_train_equivalence import LAYOUTS, assert_run_matches, train

MLA = ["--set", "model.num_kv_heads=4", "--set", "model.mla.kv_lora_rank=24",
       "--set", "model.mla.qk_nope_head_dim=16", "--set", "model.mla.qk_rope_head_dim=8"]
SHAPES = {
    "query_latent": MLA + ["--set", "model.mla.q_lora_rank=48", "--set", "model.mla.v_head_dim=16"],
    "no_query_latent": MLA + ["--set", "model.mla.v_head_dim=32"],
}


@pytest.mark.parametrize("layout", ["tp2", "dp2xtp2-zero3"])
@pytest.mark.parametrize("shape", SHAPES)
def test_latent_attention_under_tensor_parallelism_matches_single_process(tmp_path, shape, layout):
    single_losses, single_weights = train(tmp_path, "single", 1, SHAPES[shape])
    ranks, overrides = LAYOUTS[layout]
    losses, weights = train(tmp_path, layout, ranks, overrides + SHAPES[shape])
    assert any(name.endswith("kv_a_proj_with_mqa.weight") for name in weights)
    assert_run_matches(losses, weights, single_losses, single_weights)
