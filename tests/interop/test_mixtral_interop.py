"""The engine against transformers' MixtralForCausalLM (an implementation nobody here
wrote): the same random weights and tokens must give the same logits, cross-entropy,
load-balancing aux loss and the same gradient for every parameter.

Run by ctest with the interop environment's Python; MODEL_IO_TOOL names the tool binary.
"""
import os
import tempfile

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file
from transformers import MixtralConfig, MixtralForCausalLM

from sy_testing import binary, run

TOOL = binary("MODEL_IO_TOOL")

VOCAB, HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, EXPERTS, TOP_K = 256, 32, 48, 2, 4, 2, 4, 2
AUX_COEF = 0.02
BATCH, SEQ = 2, 16


def recipe_text(tie):
    return f"""
name: "interop"
model {{ vocab_size: {VOCAB} hidden_size: {HIDDEN} num_layers: {LAYERS} num_heads: {HEADS}
         num_kv_heads: {KV_HEADS} rope_theta: 10000 norm_eps: 1e-5 tie_embeddings: {str(tie).lower()}
         moe_layer_interval: 1 }}
moe {{ num_experts: {EXPERTS} top_k: {TOP_K} gating: TOP_K aux_loss_coef: {AUX_COEF}
       z_loss_coef: 0 expert_ffn_hidden_size: {FFN} }}
optimizer {{ lr: 1e-3 }}
train {{ global_batch_size: {BATCH} seq_len: {SEQ} steps: 1 }}
data {{ dataset: "unused" }}
"""


def to_engine_layout(tensors):
    """transformers parameter names -> engine registry names. transformers 5.x already
    uses the engine's fused expert layout; 4.x per-expert w1/w3/w2 tensors are fused."""
    out = {k.replace(".block_sparse_moe.", ".mlp."): v for k, v in tensors.items()
           if ".block_sparse_moe.experts." not in k}
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}.block_sparse_moe.experts."
        if prefix + "0.w1.weight" in tensors:
            out[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = np.stack(
                [np.concatenate([tensors[f"{prefix}{e}.w1.weight"], tensors[f"{prefix}{e}.w3.weight"]])
                 for e in range(EXPERTS)])
            out[f"model.layers.{layer}.mlp.experts.down_proj"] = np.stack(
                [tensors[f"{prefix}{e}.w2.weight"] for e in range(EXPERTS)])
    return out


def assert_close(name, ours, ref, rtol):
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert ours.shape == ref.shape, f"{name}: shape {ours.shape} vs {ref.shape}"
    assert np.all(np.isfinite(ours)), f"{name}: non-finite values"
    scale = max(np.abs(ref).max(), 1e-12)
    err = np.abs(ours - ref).max() / scale
    assert err < rtol, f"{name}: max error {err:.3g} relative to max |ref| {scale:.3g}"


@pytest.mark.parametrize("tie", [False, True])
def test_logits_losses_and_gradients_match_transformers(tie):
    torch.manual_seed(7)
    config = MixtralConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, num_local_experts=EXPERTS,
        num_experts_per_tok=TOP_K, rope_theta=10000.0, rms_norm_eps=1e-5,
        router_aux_loss_coef=AUX_COEF, output_router_logits=True, tie_word_embeddings=tie,
        # Larger-than-default weights make routing and attention far from uniform.
        max_position_embeddings=64, initializer_range=0.2)
    model = MixtralForCausalLM(config)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(3))

    out = model(input_ids=ids, labels=ids, output_router_logits=True)
    out.loss.backward()

    targets = np.full((BATCH, SEQ), -1, dtype=np.int32)
    targets[:, :-1] = ids[:, 1:].numpy()
    with tempfile.TemporaryDirectory() as tmp:
        recipe = os.path.join(tmp, "recipe.textproto")
        with open(recipe, "w") as f:
            f.write(recipe_text(tie))
        weights = to_engine_layout({k: v.detach().numpy() for k, v in model.named_parameters()})
        save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in weights.items()},
                  os.path.join(tmp, "weights.safetensors"))
        save_file({"ids": ids.numpy().astype(np.int32), "targets": targets},
                  os.path.join(tmp, "batch.safetensors"))
        run([TOOL, recipe, os.path.join(tmp, "weights.safetensors"),
             os.path.join(tmp, "batch.safetensors"), os.path.join(tmp, "out.safetensors")],
            timeout=None)
        ours = load_file(os.path.join(tmp, "out.safetensors"))

    assert_close("logits", ours["logits"], out.logits.detach().reshape(BATCH * SEQ, VOCAB).numpy(), 1e-4)
    total, cross_entropy, aux, z = ours["losses"]
    assert aux == pytest.approx(out.aux_loss.item(), rel=1e-5)
    assert cross_entropy == pytest.approx(out.loss.item() - AUX_COEF * out.aux_loss.item(), rel=1e-5)
    assert total == pytest.approx(out.loss.item(), rel=1e-5)
    assert z > 0

    reference = to_engine_layout({k: p.grad.detach().numpy() for k, p in model.named_parameters()})
    ours_grads = {k[len("grad:"):]: v for k, v in ours.items() if k.startswith("grad:")}
    assert set(ours_grads) == set(reference), set(ours_grads) ^ set(reference)
    for name, ref in reference.items():
        assert np.abs(ref).max() > 0, f"{name}: reference gradient is zero"
        assert_close(name, ours_grads[name], ref, 1e-3)
