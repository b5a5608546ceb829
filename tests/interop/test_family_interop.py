"""The engine against transformers' Qwen3-MoE, OLMoE and Qwen2-MoE classes (implementations
nobody here wrote), as test_mixtral_interop.py does for Mixtral: a transformers model of
random weights, saved and imported with `switchyard convert from-hf`, gives in the engine
the same logits, cross-entropy, load-balancing aux loss and gradient for every
parameter. The import exported again with `convert to-hf` loads into transformers with
no missing or unexpected keys and holds exactly the original weights (fp32).

Run by ctest with the interop environment's Python under transformers 5.x and 4.x (4.57;
Qwen3-MoE cases skip under a transformers without the class). SWITCHYARD names
the binary and MODEL_IO_TOOL the tool that runs the engine's forward and backward.
"""
import json
import re

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from sy_testing import SWITCHYARD, binary, run

TOOL = binary("MODEL_IO_TOOL")
VOCAB, BATCH, SEQ, AUX_COEF = 128, 2, 16, 0.02
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=40, num_attention_heads=4,
              num_key_value_heads=2, num_experts_per_tok=2, max_position_embeddings=64,
              rope_theta=10000.0, rms_norm_eps=1e-5, router_aux_loss_coef=AUX_COEF,
              output_router_logits=True,
              # Larger-than-default weights make routing and attention far from uniform.
              initializer_range=0.2)

# name: (transformers class, its config class, the family's own settings)
FAMILIES = {
    # A dense first layer, attention wider than the hidden size (4 heads of 12), the
    # top-k weights renormalised.
    "qwen3_moe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig",
                  dict(num_hidden_layers=3, head_dim=12, num_experts=4, moe_intermediate_size=24,
                       mlp_only_layers=[0], norm_topk_prob=True)),
    # Every other layer MoE (decoder_sparse_step), the top-k weights as the softmax gave them.
    "qwen3_moe_sparse_step": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig",
                              dict(num_hidden_layers=2, num_experts=4, moe_intermediate_size=24,
                                   decoder_sparse_step=2, norm_topk_prob=False)),
    "olmoe": ("OlmoeForCausalLM", "OlmoeConfig",
              dict(num_hidden_layers=2, num_experts=4, norm_topk_prob=False)),
    "qwen2_moe": ("Qwen2MoeForCausalLM", "Qwen2MoeConfig",
                  dict(num_hidden_layers=3, num_experts=4, moe_intermediate_size=24,
                       shared_expert_intermediate_size=40, decoder_sparse_step=1,
                       mlp_only_layers=[0], norm_topk_prob=False)),
}


def make_model(family):
    model_class, config_class, settings = FAMILIES[family]
    if not hasattr(transformers, model_class):
        pytest.skip(f"transformers {transformers.__version__} has no {model_class}")
    torch.manual_seed(5)
    config = getattr(transformers, config_class)(**COMMON, **settings)
    model = getattr(transformers, model_class)(config)
    # Default-initialised norms are all ones; random ones check that each lands where it belongs.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.3 * torch.randn_like(p))
    return model


def to_engine_layout(tensors):
    """transformers names -> engine registry names: per-expert matrices (4.x, and what
    5.x saves) stacked into the fused expert tensors 5.x holds in memory, and every
    dense or shared FFN's gate and up matrices stacked into one gate_up_proj."""
    out, experts, pairs = {}, {}, {}
    for name, value in tensors.items():
        expert = re.fullmatch(r"(.*\.experts\.)(\d+)\.(gate|up|down)_proj\.weight", name)
        dense = re.fullmatch(r"(.*\.)(gate|up)_proj\.weight", name)
        if expert:
            experts.setdefault(expert[1], {}).setdefault(int(expert[2]), {})[expert[3]] = value
        elif dense:
            pairs.setdefault(dense[1], {})[dense[2]] = value
        else:
            out[name] = value
    for prefix, by_expert in experts.items():
        matrices = [by_expert[e] for e in sorted(by_expert)]
        out[prefix + "gate_up_proj"] = np.stack([np.concatenate([m["gate"], m["up"]]) for m in matrices])
        out[prefix + "down_proj"] = np.stack([m["down"] for m in matrices])
    for prefix, pair in pairs.items():
        out[prefix + "gate_up_proj.weight"] = np.stack([pair["gate"], pair["up"]])
    return out


def assert_close(name, ours, ref, rtol):
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert ours.shape == ref.shape, f"{name}: shape {ours.shape} vs {ref.shape}"
    assert np.all(np.isfinite(ours)), f"{name}: non-finite values"
    scale = max(np.abs(ref).max(), 1e-12)
    err = np.abs(ours - ref).max() / scale
    assert err < rtol, f"{name}: max error {err:.3g} relative to max |ref| {scale:.3g}"


def assert_gradients_match(ours, reference, rtol=1e-3):
    """The engine's gradients (the tool's "grad:NAME" outputs) against transformers' of the
    same names, each nonzero: the same set of names, each within rtol."""
    grads = {k[len("grad:"):]: v for k, v in ours.items() if k.startswith("grad:")}
    assert set(grads) == set(reference), set(grads) ^ set(reference)
    for name, ref in reference.items():
        assert np.abs(ref).max() > 0, f"{name}: reference gradient is zero"
        assert_close(name, grads[name], ref, rtol)


def assert_import_refuses(model, tmp_path, field, value):
    """`convert from-hf` of `model` saved with config.json's `field` set to `value` fails
    in one line naming the field and writes nothing."""
    model.save_pretrained(tmp_path / "hf")
    config_path = tmp_path / "hf/config.json"
    config = json.loads(config_path.read_text())
    config[field] = value
    config_path.write_text(json.dumps(config))
    result = run([SWITCHYARD, "convert", "from-hf", tmp_path / "hf", tmp_path / "weights"],
                 expect=None, timeout=None)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and field in lines[0], result.stderr
    assert not (tmp_path / "weights").exists()


def engine_forward_backward(weights_dir, ids, tmp):
    """Logits, losses and every gradient of the engine on the imported weights."""
    targets = np.full(ids.shape, -1, dtype=np.int32)
    targets[:, :-1] = ids[:, 1:]
    save_file({"ids": ids.astype(np.int32), "targets": targets}, str(tmp / "batch.safetensors"))
    run([TOOL, weights_dir / "recipe.textproto", weights_dir / "model.safetensors",
         tmp / "batch.safetensors", tmp / "out.safetensors"], timeout=None)
    return load_file(str(tmp / "out.safetensors"))


def load_hf(path):
    from transformers import AutoModelForCausalLM
    # transformers 4.x names the argument torch_dtype; 5.x renamed it dtype.
    dtype_arg = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True,
                                                       **{dtype_arg: torch.float32})
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        assert not info.get(kind), f"{kind}: {info[kind]}"
    return model.eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_import_matches_transformers_losses_and_gradients(tmp_path, family):
    model = make_model(family)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(3))
    out = model(input_ids=ids, labels=ids, output_router_logits=True)
    out.loss.backward()
    model.save_pretrained(tmp_path / "hf")
    run([SWITCHYARD, "convert", "from-hf", tmp_path / "hf", tmp_path / "weights"], timeout=None)
    ours = engine_forward_backward(tmp_path / "weights", ids.numpy(), tmp_path)

    assert_close("logits", ours["logits"], out.logits.detach().reshape(BATCH * SEQ, VOCAB).numpy(), 1e-4)
    total, cross_entropy, aux, _ = ours["losses"]
    assert aux == pytest.approx(out.aux_loss.item(), rel=1e-5)
    assert cross_entropy == pytest.approx(out.loss.item() - AUX_COEF * out.aux_loss.item(), rel=1e-5)
    assert total == pytest.approx(out.loss.item(), rel=1e-5)

    reference = to_engine_layout({k: p.grad.numpy() for k, p in model.named_parameters()})
    assert_gradients_match(ours, reference)


@pytest.mark.parametrize("family", FAMILIES)
def test_import_export_round_trip_is_exact(tmp_path, family):
    model = make_model(family).eval()
    model.save_pretrained(tmp_path / "hf")
    run([SWITCHYARD, "convert", "from-hf", tmp_path / "hf", tmp_path / "weights"], timeout=None)
    run([SWITCHYARD, "convert", "to-hf", tmp_path / "weights", tmp_path / "back"], timeout=None)
    config = json.loads((tmp_path / "back/config.json").read_text())
    assert config["architectures"] == [FAMILIES[family][0]]
    back = load_hf(tmp_path / "back")
    original, exported = model.state_dict(), back.state_dict()
    assert set(exported) == set(original), set(exported) ^ set(original)
    for name, value in original.items():
        assert torch.equal(exported[name], value), name
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(back(input_ids=ids).logits, model(input_ids=ids).logits)


@pytest.mark.parametrize("field,value", [
    ("attention_bias", True), ("use_sliding_window", True), ("mlp_only_layers", [1]),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0})])
def test_qwen3_import_refuses_what_the_engine_cannot_honour(tmp_path, field, value):
    assert_import_refuses(make_model("qwen3_moe"), tmp_path, field, value)
