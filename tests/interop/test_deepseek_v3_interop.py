"""The engine against transformers' DeepSeek-V3 (DeepseekV3ForCausalLM, an implementation
nobody here wrote), as test_family_interop.py does for the other families: a transformers
model of random weights (and a random correction bias in every router, and in one shape
YaRN rope scaling), saved and
imported with `switchyard convert from-hf`, gives in the engine the same logits,
cross-entropy and gradient for every parameter; the import exported again with `convert
to-hf` loads with no missing or unexpected keys and holds exactly the original weights
(fp32), the rotary rows interleaved back as DeepSeek lays them out. Config features the
engine does not implement, and hostile rope_scaling values, are refused in one line
naming the field.

Run by ctest with the interop environment's Python under transformers 5.x and 4.x (4.57).
SWITCHYARD names the binary and MODEL_IO_TOOL the tool that runs the engine's forward and
backward.
"""
import json

import numpy as np
import pytest
import torch
import transformers

from sy_testing import SWITCHYARD, run
from test_family_interop import (BATCH, SEQ, VOCAB, assert_close, assert_gradients_match,
                                 assert_import_refuses, engine_forward_backward, load_hf,
                                 to_engine_layout)

BASE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=40, num_attention_heads=4,
            num_key_value_heads=4, num_experts_per_tok=2, max_position_embeddings=64,
            rope_theta=10000.0, rms_norm_eps=1e-5, initializer_range=0.2, n_routed_experts=8,
            moe_intermediate_size=24, routed_scaling_factor=2.5, norm_topk_prob=True)
SHAPES = {
    # A query latent, a dense first layer, one shared expert, the best 1 of 2 groups.
    "query_latent": dict(num_hidden_layers=3, first_k_dense_replace=1, q_lora_rank=12,
                         kv_lora_rank=10, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=8,
                         n_shared_experts=1, n_group=2, topk_group=1),
    # Queries from the hidden state, values wider than the query/key heads, every layer
    # MoE with two shared experts, weights not renormalised.
    "no_query_latent": dict(num_hidden_layers=2, first_k_dense_replace=0, q_lora_rank=None,
                            kv_lora_rank=12, qk_nope_head_dim=4, qk_rope_head_dim=6,
                            v_head_dim=12, n_shared_experts=2, n_group=4, topk_group=2,
                            norm_topk_prob=False),
    # YaRN: positions past the 8 the model was pretrained at, a cos/sin factor off one
    # (mscale 0.7 against mscale_all_dim 1) and the softmax scale times m(8, 1)^2; the
    # ramp interpolates the rotary pairs from the second on.
    "yarn": dict(num_hidden_layers=2, first_k_dense_replace=1, q_lora_rank=12,
                 kv_lora_rank=10, qk_nope_head_dim=6, qk_rope_head_dim=8, v_head_dim=8,
                 n_shared_experts=1, n_group=2, topk_group=1,
                 rope_scaling={"rope_type": "yarn", "factor": 8.0,
                               "original_max_position_embeddings": 8, "beta_fast": 32.0,
                               "beta_slow": 1.0, "mscale": 0.7, "mscale_all_dim": 1.0}),
}
BIAS = "e_score_correction_bias"


def rotary_rows_as_halves(grads, config):
    """DeepSeek's interleaved rotary rows (x0, x1), (x2, x3), ... of q_b_proj (or q_proj)
    and kv_a_proj_with_mqa, reordered as the engine holds them (x0, x2, ..., x1, x3, ...)."""
    nope, rope, rank = config.qk_nope_head_dim, config.qk_rope_head_dim, config.kv_lora_rank
    order = np.concatenate([np.arange(0, rope, 2), np.arange(1, rope, 2)])
    out = {}
    for name, g in grads.items():
        block, offset = {"q_b_proj": (nope + rope, nope), "q_proj": (nope + rope, nope),
                         "kv_a_proj_with_mqa": (rank + rope, rank)}.get(name.split(".")[-2], (0, 0))
        if block:
            g = g.reshape(-1, block, g.shape[-1]).copy()
            g[:, offset:] = g[:, offset + order]
            g = g.reshape(-1, g.shape[-1])
        out[name] = g
    return out


def make_model(shape):
    if not hasattr(transformers, "DeepseekV3ForCausalLM"):
        pytest.skip(f"transformers {transformers.__version__} has no DeepseekV3ForCausalLM")
    torch.manual_seed(5)
    settings = {k: dict(v) if isinstance(v, dict) else v for k, v in SHAPES[shape].items()}
    config = transformers.DeepseekV3Config(**{**BASE, **settings})
    model = transformers.DeepseekV3ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
        for name, buffer in model.named_buffers():
            if name.endswith(BIAS):
                buffer.copy_(0.1 * torch.randn_like(buffer))
    return model


@pytest.mark.parametrize("shape", SHAPES)
def test_import_matches_transformers_losses_and_gradients(tmp_path, shape):
    model = make_model(shape)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(3))
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    model.save_pretrained(tmp_path / "hf")
    run([SWITCHYARD, "convert", "from-hf", tmp_path / "hf", tmp_path / "weights"], timeout=None)
    ours = engine_forward_backward(tmp_path / "weights", ids.numpy(), tmp_path)

    assert_close("logits", ours["logits"], out.logits.detach().reshape(BATCH * SEQ, VOCAB).numpy(), 1e-4)
    # No aux loss enters the total: DeepSeek-V3 balances by the correction bias.
    total, cross_entropy, _, _ = ours["losses"]
    assert cross_entropy == pytest.approx(out.loss.item(), rel=1e-5)
    assert total == pytest.approx(out.loss.item(), rel=1e-5)

    # The correction bias is state, not a parameter: it has no gradient on either side.
    # (transformers 4.x holds the bias as a parameter without a gradient, 5.x as a buffer;
    # 4.x leaves the gradient of an expert no token reached unset, the engine's is zero.)
    reference = rotary_rows_as_halves(to_engine_layout(
        {k: p.grad.numpy() if p.grad is not None else np.zeros(tuple(p.shape), np.float32)
         for k, p in model.named_parameters() if not k.endswith(BIAS)}), model.config)
    reference = {k.replace(".shared_experts.", ".shared_expert."): v for k, v in reference.items()}
    assert_gradients_match({k: v for k, v in ours.items() if not k.endswith(BIAS)}, reference)


@pytest.mark.parametrize("shape", SHAPES)
def test_import_export_round_trip_is_exact(tmp_path, shape):
    model = make_model(shape).eval()
    model.save_pretrained(tmp_path / "hf")
    run([SWITCHYARD, "convert", "from-hf", tmp_path / "hf", tmp_path / "weights"], timeout=None)
    run([SWITCHYARD, "convert", "to-hf", tmp_path / "weights", tmp_path / "back"], timeout=None)
    config = json.loads((tmp_path / "back/config.json").read_text())
    assert config["architectures"] == ["DeepseekV3ForCausalLM"]
    yarn = SHAPES[shape].get("rope_scaling")
    assert config["rope_scaling"] == (yarn and {**yarn, "mscale": pytest.approx(yarn["mscale"])})
    back = load_hf(tmp_path / "back")
    original, exported = model.state_dict(), back.state_dict()
    assert set(exported) == set(original), set(exported) ^ set(original)
    for name, value in original.items():
        assert torch.equal(exported[name], value), name
    assert any(name.endswith(BIAS) and value.abs().max() > 0 for name, value in exported.items())
    # Against the original as transformers loads it: under 4.57 a loaded model's logits
    # differ from the one built in memory by a rounding (8e-7 here), whatever was saved.
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(back(input_ids=ids).logits, load_hf(tmp_path / "hf")(input_ids=ids).logits)


@pytest.mark.parametrize("field,value", [
    ("rope_scaling", {"rope_type": "dynamic", "factor": 2.0}),
    ("rope_scaling", {"type": "linear", "factor": 2.0}),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.5}),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0, "truncate": False}),
    ("rope_scaling", {"rope_type": "yarn"}),
    ("rope_scaling", {"rope_type": "yarn", "factor": -1.0}),
    ("rope_scaling", {"rope_type": "yarn", "factor": 1e30}),
    ("rope_scaling", {"rope_type": "yarn", "factor": "4"}),
    ("rope_scaling", {"rope_type": "yarn", "factor": 0.0}),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 0}),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0, "mscale_all_dim": -1.0}),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0, "beta_fast": 1e300}),
    ("topk_method", "greedy"),
    ("scoring_func", "softmax"),
    ("moe_layer_freq", 2),
    ("attention_bias", True),
    ("quantization_config", {"quant_method": "fp8"}),
    ("hidden_act", "gelu")])
def test_import_refuses_what_the_engine_cannot_honour(tmp_path, field, value):
    assert_import_refuses(make_model("query_latent"), tmp_path, field, value)
