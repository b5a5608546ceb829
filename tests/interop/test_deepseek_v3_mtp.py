"""DeepSeek-V3's multi-token prediction module through the engine (model.mtp_depth): a
transformers DeepSeek-V3 of random weights saved with one MTP layer as DeepSeek's
checkpoints hold it (layer num_hidden_layers: enorm, hnorm, eh_proj, a decoder layer,
shared_head.norm, and copies of the embedding and the LM head), imported with `convert
from-hf`, gives the module's loss and every gradient of the whole objective as a
double-precision reference built from transformers' own decoder layer, RMSNorm and
rotary embedding does (DeepSeek-V3's equations 21-25: module 1 at position i reads
[enorm(Emb(t_{i+1})); hnorm(h_i)] and predicts t_{i+2}, its loss summed and divided by the
main loss's T); exported again with `convert to-hf`, every tensor comes back unchanged.
A checkpoint whose module copies another embedding is refused; one that says
num_nextn_predict_layers but holds no module (what transformers saves) imports without
one.

Run by ctest with the interop environment's Python (transformers 5.x). SWITCHYARD names
the binary and MODEL_IO_TOOL the tool that runs the engine's forward and backward.
"""
import itertools
import json

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from sy_testing import SWITCHYARD, run
from test_deepseek_v3_interop import BIAS, make_model, rotary_rows_as_halves
from test_family_interop import (BATCH, SEQ, VOCAB, assert_gradients_match, assert_import_refuses,
                                 engine_forward_backward, to_engine_layout)

MTP_COEF = 0.3  # model.mtp_loss_coef's default


class MtpModule(torch.nn.Module):
    """DeepSeek-V3's MTP module k = 1 with transformers' parts."""

    def __init__(self, config, layer):
        super().__init__()
        modeling = transformers.models.deepseek_v3.modeling_deepseek_v3
        hidden = config.hidden_size
        self.enorm = modeling.DeepseekV3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.hnorm = modeling.DeepseekV3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.eh_proj = torch.nn.Linear(2 * hidden, hidden, bias=False)
        self.block = modeling.DeepseekV3DecoderLayer(config, layer)
        self.head_norm = modeling.DeepseekV3RMSNorm(hidden, eps=config.rms_norm_eps)

    def tensors(self, prefix):
        """The module's parameters and buffers under DeepSeek-V3's checkpoint names."""
        out = {prefix + k: v for k, v in itertools.chain(self.block.named_parameters(),
                                                          self.block.named_buffers())}
        out.update({prefix + "enorm.weight": self.enorm.weight,
                    prefix + "hnorm.weight": self.hnorm.weight,
                    prefix + "eh_proj.weight": self.eh_proj.weight,
                    prefix + "shared_head.norm.weight": self.head_norm.weight})
        return out


def with_mtp(shape):
    """A DeepSeek-V3 model and its MTP module, random weights (norm gains off one, and a
    correction bias in its router), both in double precision."""
    model = make_model(shape).double()
    # Double precision needs the plain loops (torch's grouped products take f32 at most).
    model.config._attn_implementation = "eager"
    model.config._experts_implementation = "eager"
    torch.manual_seed(7)
    module = MtpModule(model.config, model.config.num_hidden_layers).double()
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif "norm" not in name:
                p.copy_(0.2 * torch.randn_like(p))
        for name, buffer in module.named_buffers():
            if name.endswith(BIAS):
                buffer.copy_(0.1 * torch.randn_like(buffer))
    return model, module


def as_saved(tensors):
    """transformers 5.x's fused experts (gate_up_proj (E, 2I, H), down_proj (E, H, I)) as its
    checkpoints hold them, one matrix per expert."""
    out = {}
    for name, value in tensors.items():
        if name.endswith(".experts.gate_up_proj"):
            half = value.shape[1] // 2
            for e in range(value.shape[0]):
                out[f"{name[:-len('gate_up_proj')]}{e}.gate_proj.weight"] = value[e, :half]
                out[f"{name[:-len('gate_up_proj')]}{e}.up_proj.weight"] = value[e, half:]
        elif name.endswith(".experts.down_proj"):
            for e in range(value.shape[0]):
                out[f"{name[:-len('down_proj')]}{e}.down_proj.weight"] = value[e]
        else:
            out[name] = value
    return out


def save_with_module(model, module, hf_dir, embedding_copy=None):
    """model.save_pretrained in fp32 plus the module's tensors, as layer L of the file."""
    model.float().save_pretrained(hf_dir)
    model.double()
    prefix = f"model.layers.{model.config.num_hidden_layers}."
    tensors = load_file(str(hf_dir / "model.safetensors"))
    extra = as_saved(module.tensors(prefix))
    extra[prefix + "embed_tokens.weight"] = (model.model.embed_tokens.weight
                                             if embedding_copy is None else embedding_copy)
    extra[prefix + "shared_head.head.weight"] = model.lm_head.weight
    tensors.update({k: v.detach().float().contiguous() for k, v in extra.items()})
    save_file(tensors, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((hf_dir / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 1


def reference_losses(model, module, ids):
    """The main cross-entropy and module 1's (summed over positions 0..T-3, over the main
    loss's B (T - 1) targets), in double precision."""
    captured = {}
    hook = model.model.layers[-1].register_forward_hook(
        lambda _, __, output: captured.update(h=output[0] if isinstance(output, tuple) else output))
    out = model(input_ids=ids, labels=ids)
    hook.remove()
    h = captured["h"][:, :-1]                       # h_i for i < T - 1
    e = model.model.embed_tokens(ids[:, 1:])         # Emb(t_{i+1})
    x = module.eh_proj(torch.cat([module.enorm(e), module.hnorm(h)], dim=-1))
    positions = torch.arange(x.shape[1]).unsqueeze(0)
    rotary = model.model.rotary_emb(x, positions)
    mask = torch.full((x.shape[1], x.shape[1]), float("-inf"), dtype=x.dtype).triu(1)
    y = module.block(x, attention_mask=mask[None, None], position_ids=positions,
                     position_embeddings=rotary)
    y = y[0] if isinstance(y, tuple) else y
    logits = model.lm_head(module.head_norm(y))[:, :-1]  # positions 0..T-3
    targets = ids[:, 2:]                                 # t_{i+2}
    summed = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                               targets.reshape(-1), reduction="sum")
    return out.loss, summed / (ids.shape[0] * (ids.shape[1] - 1))


def test_module_loss_and_gradients_match_a_double_reference(tmp_path):
    model, module = with_mtp("query_latent")
    save_with_module(model, module, tmp_path / "hf")
    run([SWITCHYARD, "convert", "from-hf", tmp_path / "hf", tmp_path / "weights"], timeout=None)
    assert "mtp_depth: 1" in (tmp_path / "weights" / "recipe.textproto").read_text()
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(3))
    main, mtp = reference_losses(model, module, ids)
    (main + MTP_COEF * mtp).backward()
    ours = engine_forward_backward(tmp_path / "weights", ids.numpy(), tmp_path)

    total, cross_entropy, _, _ = ours["losses"]
    assert cross_entropy == pytest.approx(main.item(), rel=1e-5)
    assert ours["mtp_loss"][0] == pytest.approx(mtp.item(), rel=1e-5)
    assert total == pytest.approx((main + MTP_COEF * mtp).item(), rel=1e-5)

    prefix = f"model.layers.{model.config.num_hidden_layers}."
    params = dict(model.named_parameters())
    params.update({k: v for k, v in module.tensors(prefix).items()
                   if isinstance(v, torch.nn.Parameter)})
    reference = rotary_rows_as_halves(to_engine_layout(
        {k: p.grad.float().numpy() if p.grad is not None else np.zeros(tuple(p.shape), np.float32)
         for k, p in params.items() if not k.endswith(BIAS)}), model.config)
    reference = {k.replace(".shared_experts.", ".shared_expert."): v for k, v in reference.items()}
    assert_gradients_match({k: v for k, v in ours.items() if not k.endswith(BIAS)}, reference)


def test_import_export_round_trip_is_exact(tmp_path):
    model, module = with_mtp("no_query_latent")
    save_with_module(model, module, tmp_path / "hf")
    run([SWITCHYARD, "convert", "from-hf", tmp_path / "hf", tmp_path / "weights"], timeout=None)
    run([SWITCHYARD, "convert", "to-hf", tmp_path / "weights", tmp_path / "back"], timeout=None)
    config = json.loads((tmp_path / "back/config.json").read_text())
    assert config["num_nextn_predict_layers"] == 1
    original = load_file(str(tmp_path / "hf" / "model.safetensors"))
    exported = load_file(str(tmp_path / "back" / "model.safetensors"))
    assert set(exported) == set(original), set(exported) ^ set(original)
    for name, value in original.items():
        assert torch.equal(exported[name], value), name


def test_a_module_with_its_own_embedding_is_refused(tmp_path):
    model, module = with_mtp("query_latent")
    other = torch.randn_like(model.model.embed_tokens.weight)
    save_with_module(model, module, tmp_path / "hf", embedding_copy=other)
    result = run([SWITCHYARD, "convert", "from-hf", tmp_path / "hf", tmp_path / "weights"],
                 expect=1, timeout=None)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "embed_tokens.weight differs from the model's own" in lines[0]
    assert not (tmp_path / "weights").exists()


def test_what_transformers_saves_imports_without_a_module(tmp_path):
    """transformers writes num_nextn_predict_layers 1 and no module: nothing to import."""
    make_model("query_latent").save_pretrained(tmp_path / "hf")
    assert json.loads((tmp_path / "hf/config.json").read_text())["num_nextn_predict_layers"] == 1
    run([SWITCHYARD, "convert", "from-hf", tmp_path / "hf", tmp_path / "weights"], timeout=None)
    assert "mtp_depth" not in (tmp_path / "weights" / "recipe.textproto").read_text()


@pytest.mark.parametrize("value", [9, -1, "1", 1.5])
def test_a_hostile_module_count_is_refused(tmp_path, value):
    assert_import_refuses(make_model("query_latent"), tmp_path, "num_nextn_predict_layers", value)
